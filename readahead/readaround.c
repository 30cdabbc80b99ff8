// SPDX-License-Identifier: MIT
/*
 * Read-around for mmap faults, sized by whether its pages get used.
 *
 * The kernel reads ra_pages around every mmap fault that misses (4 MiB on
 * btrfs) and backs off only when its miss counter passes MMAP_LOTSAMISS;
 * that counter counts hits at fault time, up to 16 per fault and again for
 * every process mapping the page, so it almost never backs off (seed 000).
 *
 * zfolio sees both ends: what it read around, and what reclaim evicts
 * unread.  So each file keeps a read-around window that starts at one
 * frame and
 *   - doubles (up to ra_pages) once a window's worth of read-around
 *     folios has been used (read before eviction),
 *   - halves (down to one frame) once half a window's worth went unused,
 *   - stops after READAROUND_LOTSAMISS unused folios in a row: faults then
 *     read just their folio, with a small probe now and then, until a
 *     read-around folio is used again.
 * Used folios are counted when they are read; unused ones when the next
 * miss finds them still unread (judge_last_window), or else when they are
 * evicted.  Growing back to a size that was just shrunk needs GROW_BACK
 * windows' worth used, so a reader whose runs fit between two sizes does
 * not swing between them.
 *
 * The window is centred on the fault, as the kernel's is, until what was
 * read around *behind* faults has mostly gone unused (BEHIND_MIN folios
 * judged, fewer than 1 in 5 used): readers that run forward from random
 * points then get windows that start at the fault, with a centred one
 * every PROBE_EVERY windows to see whether that still holds.  From four
 * frames up the window carries the kernel's marker a quarter from its
 * end, so faults that walk forward start asynchronous windows that ramp
 * up as read()'s do.  A fault just past the last window is a stream, and
 * gets the on-demand algorithm, once the window has grown that far, or at
 * the STREAM_AFTER-th such fault in a row (windows that cannot grow:
 * ra_kb of one frame).
 *
 * The state is per file (per mapping), not per open file: a page mapped by
 * many processes is one page, used or not.
 */
#include <stdlib.h>

#include "internal.h"

static enum readaround_mode mode = READAROUND_ADAPTIVE;

/* misses while stopped per probe, and windows per centred check: more
 * probes notice a change of pattern sooner and waste more when it holds */
#define PROBE_EVERY 16
/* folios of history on reading behind faults: a longer span is steadier,
 * a shorter one follows a changing reader faster */
#define BEHIND_SPAN 64
/* folios judged before the window may stop reading behind faults */
#define BEHIND_MIN 8
/* faults in a row just past the window that make a stream: fewer start
 * streams sooner, and mistake bursts that cross a frame for streams */
#define STREAM_AFTER 3
/* windows' worth used to grow back to a size that was shrunk: damps
 * swinging between two sizes, at the cost of slower regrowth */
#define GROW_BACK 4

void readaround_set_mode(enum readaround_mode m)
{
	mode = m;
}

void readaround_init_state(struct readaround_state *s, unsigned long min,
			   unsigned long max)
{
	pthread_mutex_init(&s->lock, NULL);
	s->min = min ? min : 1;
	s->max = max > s->min ? max : s->min;
	s->window = s->min;
	s->used = s->unused = s->unused_streak = 0;
	s->probes = 0;
	s->behind_used = s->behind_unused = 0;
	s->plans = 0;
	s->last_first = s->last_end = 0;
	s->ceiling = 0;
}

/* One read-around folio's fate: used before eviction, or not. */
void readaround_feedback(struct readaround_state *s, bool used,
			 bool behind, unsigned long folio_pages)
{
	unsigned long need;

	pthread_mutex_lock(&s->lock);
	if (behind) {
		if (used)
			s->behind_used++;
		else
			s->behind_unused++;
		/* a moving average: old evidence halves every BEHIND_SPAN */
		if (s->behind_used + s->behind_unused >= BEHIND_SPAN) {
			s->behind_used /= 2;
			s->behind_unused /= 2;
		}
	}
	if (used) {
		s->unused_streak = 0;
		/* back to a size that wasted: on GROW_BACK times the evidence */
		need = s->ceiling && s->window * 2 >= s->ceiling
			       ? GROW_BACK * s->window
			       : s->window;
		if (++s->used * folio_pages >= need) {
			s->window = s->window * 2 < s->max ? s->window * 2
							   : s->max;
			s->used = s->unused = 0;
			s->ceiling = 0;
		}
	} else {
		if (s->unused_streak < 10 * READAROUND_LOTSAMISS)
			s->unused_streak++;
		if (++s->unused * folio_pages * 2 >= s->window) {
			s->ceiling = s->window;
			s->window = s->window / 2 > s->min ? s->window / 2
							   : s->min;
			s->used = s->unused = 0;
		}
	}
	pthread_mutex_unlock(&s->lock);
}

/* Faults of this file come in runs: its window grew past three frames. */
bool readaround_streaming(struct readaround_state *s)
{
	bool yes;

	pthread_mutex_lock(&s->lock);
	yes = s->window >= 4 * s->min;
	pthread_mutex_unlock(&s->lock);
	return yes;
}

/* The window around page pg; false: stopped, read just the request. */
bool readaround_plan(struct readaround_state *s, unsigned long pg,
		     unsigned long req, struct ra_plan *p)
{
	unsigned long size;
	bool centred;

	pthread_mutex_lock(&s->lock);
	size = s->window;
	if (s->unused_streak >= READAROUND_LOTSAMISS) {
		if (++s->probes % PROBE_EVERY) {
			pthread_mutex_unlock(&s->lock);
			return false;
		}
		size = s->min; /* a probe: is anything used again? */
	}
	/*
	 * Centred, as the kernel does, unless what was read around behind
	 * faults has mostly gone unused (runs that walk forward from random
	 * points): then the window starts at the fault, with a centred one
	 * now and then to see whether that still holds.
	 */
	centred = ++s->plans % PROBE_EVERY == 0 ||
		 s->behind_used + s->behind_unused < BEHIND_MIN ||
		 s->behind_used * 4 >= s->behind_unused;
	pthread_mutex_unlock(&s->lock);
	p->start = !centred ? pg : pg > size / 2 ? pg - size / 2 : 0;
	p->size = size;
	if (p->start + p->size < pg + req)
		p->size = pg + req - p->start;
	/* the kernel's marker, a quarter from the end, for big windows */
	p->async_size = size >= 4 * s->min ? size / 4 : 0;
	return true;
}

static struct readaround_state *state_of(struct mapping *m,
					 unsigned long index,
					 unsigned long ra_pages)
{
	struct readaround_state *s = atomic_load(&m->ra_private), *mine;
	void *expected = NULL;

	if (s)
		return s;
	mine = malloc(sizeof(*mine));
	if (!mine)
		return NULL;
	readaround_init_state(mine, mapping_folio_pages(m, index), ra_pages);
	if (!atomic_compare_exchange_strong(&m->ra_private, &expected, mine)) {
		free(mine);
		return expected;
	}
	return mine;
}

/*
 * At the next miss, the last window's read-around folios not read by now
 * count as unused, at once: eviction would say so much later, and until it
 * did, used folios (counted when read) kept growing the window.  Each
 * folio is judged once (FOLIO_JUDGED; its eviction is then not counted
 * again); one read after all still counts as used.
 */
static void judge_last_window(struct readaround_state *s, struct mapping *m)
{
	const unsigned int unread = 1u << FOLIO_READAROUND,
			   seen = 1u << FOLIO_ACCESSED | 1u << FOLIO_JUDGED;
	unsigned long first, end;

	pthread_mutex_lock(&s->lock);
	first = s->last_first;
	end = s->last_end;
	s->last_end = 0;
	pthread_mutex_unlock(&s->lock);
	for (unsigned long i = first; i < end; i++) {
		struct folio *f = folio_lookup(m, i);
		unsigned int fl;

		if (!f || !folio_test(f, FOLIO_UPTODATE))
			continue;
		fl = atomic_fetch_or_explicit(&f->flags, 1u << FOLIO_JUDGED,
					      memory_order_acq_rel);
		if ((fl & unread) && !(fl & seen))
			readaround_feedback(s, false,
					    fl & (1u << FOLIO_BEHIND),
					    f->nr_pages);
	}
}

/* A fault just past the last window: how many in a row, 0 if not one. */
static unsigned int walked_off_window(struct file_ra_state *ra,
				      unsigned long pg)
{
	unsigned int n;

	pthread_mutex_lock(&ra->lock);
	if (ra->size && pg == ra->start + ra->size)
		n = ++ra->walkoffs;
	else
		n = ra->walkoffs = 0;
	pthread_mutex_unlock(&ra->lock);
	return n;
}

/*
 * A fault just past the last window is a stream once read-around has
 * shown the file is read in runs (its window grew past three frames), or
 * at the STREAM_AFTER-th such fault in a row (a window that cannot grow,
 * ra_kb of one frame): cold bursts that merely cross a frame or two keep
 * reading around.
 */
static bool fault_is_stream(struct file_ra_state *ra,
			    struct readaround_state *s, unsigned long pg)
{
	unsigned int walkoffs = ra ? walked_off_window(ra, pg) : 0;

	if (!walkoffs)
		return false;
	return mode == READAROUND_FIXED ||
	       (s && (walkoffs >= STREAM_AFTER || readaround_streaming(s)));
}

/* The window around page pg for a request of req pages, by the mode. */
static struct ra_plan readaround_window(struct read_req *rq,
					struct readaround_state *s,
					unsigned long pg, unsigned long req,
					unsigned long ra_pages)
{
	struct ra_plan p = {pg, req, 0};

	if (!ra_pages || mode == READAROUND_OFF)
		return p;
	if (mode == READAROUND_FIXED) {
		p.start = pg > ra_pages / 2 ? pg - ra_pages / 2 : 0;
		p.size = ra_pages;
		p.async_size = ra_pages / 4;
	} else if (!s || !readaround_plan(s, pg, req, &p)) {
		stat_inc(rq->group, STAT_READAROUND_STOPPED);
		p = (struct ra_plan){pg, req, 0};
	}
	return p;
}

/*
 * Like the kernel, read-around sets the file's window, whole folios
 * [f0, f1]: its marker is then "ours", and a fault just past it is a
 * stream.  Read-around remembers the window too, to judge it at the next
 * miss.
 */
static void readaround_record(struct read_req *rq, struct readaround_state *s,
			      const struct ra_plan *p, unsigned long f0,
			      unsigned long f1)
{
	const struct mapping *m = rq->mapping;
	struct file_ra_state *ra = ra_req(rq)->ra;
	uint64_t end = mapping_folio_pos(m, f1) + mapping_folio_len(m, f1);

	if (s) {
		pthread_mutex_lock(&s->lock);
		s->last_first = f0;
		s->last_end = f1 + 1;
		pthread_mutex_unlock(&s->lock);
	}
	if (!ra)
		return;
	pthread_mutex_lock(&ra->lock);
	ra->start = page_of(mapping_folio_pos(m, f0));
	ra->size = pages_of_bytes(end) - ra->start;
	ra->async_size = p->async_size < ra->size ? p->async_size : ra->size;
	pthread_mutex_unlock(&ra->lock);
}

/* A page-cache fill missed: read around it (do_sync_mmap_readahead). */
int readaround_sync(struct read_req *rq, unsigned long index,
		    unsigned long last)
{
	struct ra_request *r = ra_req(rq);
	struct mapping *m = rq->mapping;
	unsigned long req, pg = ra_request_pages(rq, index, &req);
	unsigned long ra_pages = r->ra ? r->ra->ra_pages : RA_DEFAULT_PAGES;
	struct readaround_state *s = NULL;
	struct ra_plan p;
	int err;

	if (mode == READAROUND_ADAPTIVE && ra_pages)
		s = state_of(m, index, ra_pages);
	if (s)
		judge_last_window(s, m);
	if (fault_is_stream(r->ra, s, pg))
		return ra_sync_read(rq, index, last);
	p = readaround_window(rq, s, pg, req, ra_pages);
	readaround_record(rq, s, &p,
			  mapping_index(m, (uint64_t)p.start << ZF_PAGE_SHIFT),
			  mapping_index(m, ((uint64_t)(p.start + p.size)
					    << ZF_PAGE_SHIFT) - 1));
	r->readaround = true;
	err = ra_window(rq, &p, index, last);
	r->readaround = false;
	return err;
}

/* A speculative folio read: if it was read around, the window grows. */
void readaround_used(struct folio *f)
{
	struct readaround_state *s;

	if (!folio_test(f, FOLIO_READAROUND))
		return;
	stat_mod(f->group, STAT_READAROUND_USED, f->nr_pages);
	s = atomic_load(&f->mapping->ra_private);
	if (s)
		readaround_feedback(s, true, folio_test(f, FOLIO_BEHIND),
				    f->nr_pages);
}

/* A speculative folio evicted unread: if read around, and not judged. */
void readaround_unused(struct folio *f)
{
	struct readaround_state *s = atomic_load(&f->mapping->ra_private);

	if (s && folio_test(f, FOLIO_READAROUND) &&
	    !folio_test(f, FOLIO_JUDGED))
		readaround_feedback(s, false, folio_test(f, FOLIO_BEHIND),
				    f->nr_pages);
}

void readaround_free(struct mapping *m)
{
	struct readaround_state *s = atomic_exchange(&m->ra_private, NULL);

	if (s) {
		pthread_mutex_destroy(&s->lock);
		free(s);
	}
}
