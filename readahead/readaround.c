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
 *   - grows when readers get to its edge: a fault just past it, or a used
 *     edge folio of a centred window (a folio used inside the window says
 *     it was long enough, not that it was short).  It grows by a folio
 *     while below SMALL folios, so runs of 64 pages get windows of 64
 *     pages, not of 128 with the last half unread; from there it doubles,
 *     up to ra_pages;
 *   - shrinks (by a folio below SMALL, else by half, down to one frame)
 *     once half a window's worth went unused,
 *   - stops after READAROUND_LOTSAMISS unused folios in a row: faults then
 *     read just their folio, with a small probe now and then, until a
 *     read-around folio is used again.
 * Used folios are counted when they are read; unused ones when the next
 * miss finds them still unread (judge_last_window), or else when they are
 * evicted.  Growing back to a size that was just shrunk needs GROW_BACK
 * edges, so a reader whose runs fit between two sizes does not swing
 * between them.  A fault just past a window that is no stream reads just
 * its folio (and grows the window): a whole window there would read mostly
 * past the run's end.
 *
 * The window is centred on the fault, as the kernel's is, until what was
 * read around *behind* faults has mostly gone unused (BEHIND_MIN folios
 * judged, fewer than 1 in 5 used): readers that run forward from random
 * points then get windows that start at the fault, with a centred one
 * every PROBE_EVERY windows to see whether that still holds.  A miss in
 * the middle of a run of reads (the ones before it were hits) counts its
 * window from the run's first page: what the run read already is not
 * read again past its end.  Folios that fills took wholly to the kernel's
 * page cache before they were evicted are left out (mapping_in_kernel):
 * faults do not reach what the kernel holds.
 *
 * From four frames up the window carries the kernel's marker a quarter
 * from its end, so faults that walk forward start asynchronous windows
 * that ramp up as read()'s do; a fault on a marker the file's state does
 * not expect (an old window's) starts nothing while the file's faults
 * come in short runs (ra_async in window.c).  A fault just past the last
 * window is a stream, and gets the on-demand algorithm, once the window
 * has grown that far, or at the STREAM_AFTER-th such fault in a row
 * (windows that cannot grow: ra_kb of one frame).
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
/* below this many folios a window grows and shrinks by one folio, above
 * it doubles and halves: short runs of faults (a few frames) get windows
 * their length, not the power of two above it, read mostly past their end */
#define SMALL 8
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
	s->last_centred = false;
	s->ceiling = 0;
}

/*
 * One read-around folio's fate: used before eviction, or not.  edge: the
 * reader got to the window's edge (its edge folio was used, or a fault
 * came just past it), so a longer window would have been used too; a
 * folio used inside the window says only that the window was not too long.
 */
void readaround_feedback(struct readaround_state *s, bool used, bool edge,
			 bool behind, unsigned long folio_pages)
{
	unsigned long next;
	unsigned int need;

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
		next = s->window < SMALL * s->min ? s->window + s->min
		       : s->window * 2 < s->max   ? s->window * 2
						  : s->max;
		need = s->ceiling && next >= s->ceiling ? GROW_BACK : 1;
		if (edge && ++s->used >= need) {
			s->window = next;
			s->used = s->unused = 0;
			s->ceiling = 0;
		}
	} else {
		if (s->unused_streak < 10 * READAROUND_LOTSAMISS)
			s->unused_streak++;
		if (++s->unused * folio_pages * 2 >= s->window) {
			s->ceiling = s->window;
			s->window = s->window <= SMALL * s->min
					    ? s->window - s->min
				    : s->window / 2;
			if (s->window < s->min)
				s->window = s->min;
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
	s->last_centred = centred;
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
			readaround_feedback(s, false, false,
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
static bool fault_is_stream(unsigned int walkoffs, struct readaround_state *s)
{
	if (!walkoffs)
		return false;
	return mode == READAROUND_FIXED ||
	       (s && (walkoffs >= STREAM_AFTER || readaround_streaming(s)));
}

/*
 * Pages of the run of reads that page pg continues (each read starting
 * where the last ended, by this open file), 0 if it starts none.
 */
static unsigned long run_before(const struct file_ra_state *ra,
				unsigned long pg)
{
	long long prev, start;

	if (!ra)
		return 0;
	prev = atomic_load_explicit(&ra->pos.prev_pos, memory_order_relaxed);
	start = atomic_load_explicit(&ra->pos.run_start, memory_order_relaxed);
	if (prev <= 0 || page_of((uint64_t)prev) != pg || start >= prev)
		return 0;
	return pg - page_of((uint64_t)start);
}

/*
 * A window for a miss run pages into a forward run: the window is the
 * length the file's runs get, counted from this run's first page, so what
 * the run has read already is not read again past its end (a run's third
 * frame, missed after two hits, would read two frames past it).
 */
static void readaround_trim(const struct readaround_state *s,
			    unsigned long pg, unsigned long req,
			    unsigned long run, struct ra_plan *p)
{
	unsigned long end = pg - run + p->size; /* as planned, from the run */

	p->start = pg;
	p->size = end > pg + req ? end - pg : req;
	p->async_size = p->size >= 4 * s->min ? p->size / 4 : 0;
}

/* The window around page pg for a request of req pages, by the mode. */
static struct ra_plan readaround_window(struct read_req *rq,
					struct readaround_state *s,
					unsigned long pg, unsigned long req,
					unsigned long ra_pages)
{
	struct ra_plan p = {pg, req, 0};
	unsigned long run;

	if (!ra_pages || mode == READAROUND_OFF)
		return p;
	if (mode == READAROUND_FIXED) {
		p.start = pg > ra_pages / 2 ? pg - ra_pages / 2 : 0;
		p.size = ra_pages;
		p.async_size = ra_pages / 4;
	} else if (!s || !readaround_plan(s, pg, req, &p)) {
		stat_inc(rq->group, STAT_READAROUND_STOPPED);
		p = (struct ra_plan){pg, req, 0};
	} else if ((run = run_before(ra_req(rq)->ra, pg))) {
		readaround_trim(s, pg, req, run, &p);
		/* it starts at the fault now: the next fault tells its edge */
		pthread_mutex_lock(&s->lock);
		s->last_centred = false;
		pthread_mutex_unlock(&s->lock);
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
	unsigned int walkoffs;
	struct ra_plan p;
	int err;

	if (mode == READAROUND_ADAPTIVE && ra_pages)
		s = state_of(m, index, ra_pages);
	if (s)
		judge_last_window(s, m);
	walkoffs = r->ra ? walked_off_window(r->ra, pg) : 0;
	if (fault_is_stream(walkoffs, s))
		return ra_sync_read(rq, index, last);
	/*
	 * Just past a window that is no stream (yet): the run went on a
	 * little beyond it.  A whole new window here would read mostly past
	 * the run's end (a 3-frame run in 2-frame windows wasted half of what
	 * was read around), so read just the fault's folio.
	 */
	if (walkoffs && s) {
		/* it would have been used: a longer window next time */
		readaround_feedback(s, true, true, false,
				    mapping_folio_pages(m, index));
		p = (struct ra_plan){pg, req, 0};
	} else
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

/*
 * Folio i is an edge of the last window, and that window was centred (one
 * that starts at the fault learns of runs past it by the next fault).
 */
static bool readaround_edge(struct readaround_state *s, unsigned long i)
{
	bool yes;

	pthread_mutex_lock(&s->lock);
	yes = s->last_centred && s->last_end &&
	      (i == s->last_first || i + 1 == s->last_end);
	pthread_mutex_unlock(&s->lock);
	return yes;
}

/* A speculative folio read: if read around at an edge, the window grows. */
void readaround_used(struct folio *f)
{
	struct readaround_state *s;

	if (!folio_test(f, FOLIO_READAROUND))
		return;
	stat_mod(f->group, STAT_READAROUND_USED, f->nr_pages);
	s = atomic_load(&f->mapping->ra_private);
	if (s)
		readaround_feedback(s, true, readaround_edge(s, f->index),
				    folio_test(f, FOLIO_BEHIND), f->nr_pages);
}

/* A speculative folio evicted unread: if read around, and not judged. */
void readaround_unused(struct folio *f)
{
	struct readaround_state *s = atomic_load(&f->mapping->ra_private);

	if (s && folio_test(f, FOLIO_READAROUND) &&
	    !folio_test(f, FOLIO_JUDGED))
		readaround_feedback(s, false, false,
				    folio_test(f, FOLIO_BEHIND), f->nr_pages);
}

void readaround_free(struct mapping *m)
{
	struct readaround_state *s = atomic_exchange(&m->ra_private, NULL);

	if (s) {
		pthread_mutex_destroy(&s->lock);
		free(s);
	}
}
