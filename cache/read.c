// SPDX-License-Identifier: MIT
/*
 * The read path: mirrors filemap_read(), and seed 002's lockless copy.
 *
 * For each folio the request covers, look it up under RCU.  A miss goes to
 * readahead (cache_ra_ops->sync_ra), which brings in at least the folios the
 * request needs and, after the reply, the rest of its window.  A folio with
 * the readahead marker starts the next window (async_ra).
 *
 * Then, for a hot, uptodate, referenced folio (with lockless reads on), the
 * reply points straight into its data with no reference taken: the worker
 * is RCU-online until its reply is written (it announces its quiescent state
 * only after), and hot data is freed only after a grace period.  Any other
 * folio is pinned with folio_try_get() until the reply is written, then put.
 * Either way the kernel copies from the folio and userspace copies nothing.
 *
 * A folio that cannot be charged even after reclaim (everything pinned) is
 * read into a bounce buffer and not cached: the read is still served.
 *
 * A random small read of a folio that is not cached may be served from the
 * filesystem's bytes alone (read_part), when they are stored as they are:
 * raw data has nothing to decode, and a whole frame would be read, copied
 * and checksummed for a few KiB.  The filesystem decides when to fill the
 * folio instead (fs/backing.c: the second such read of a frame).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* How read_get_folio() got its folio. */
enum read_got {
	GOT_PINNED,   /* a reference, put after the reply */
	GOT_LOCKLESS, /* hot: no reference, valid while RCU-online */
	GOT_BOUNCE,   /* a private, uncached copy */
	GOT_PART,     /* a private copy of just the bytes asked for */
};

/* read_get_folio()'s "look the slot up again", never returned further. */
#define LOOK_AGAIN 1

void read_req_init(struct read_req *rq, struct mapping *m,
		   struct file_read_state *file, struct group *g,
		   void *io_ctx, uint64_t pos, size_t len)
{
	rq->mapping = m;
	rq->file = file;
	rq->group = g;
	rq->io_ctx = io_ctx;
	rq->pos = pos;
	rq->len = len;
	rq->fault = false;
	rq->fill = false;
	rq->internal = false;
	rq->no_touch = false;
	rq->tiered = false;
	rq->tier_id = rq->tier_base = rq->tier_size = 0;
	rq->niov = 0;
	rq->bytes = 0;
	rq->waited_io = false;
	rq->nheld = 0;
	rq->nbounce = 0;
	rq->nlockless = 0;
	rq->no_lockless = false;
}

void file_read_state_init(struct file_read_state *file)
{
	atomic_init(&file->prev_pos, -1);
	atomic_init(&file->run_start, 0);
}

/*
 * Around a long wait inside a request (backing I/O, a decode): the worker
 * goes RCU-offline, so that no grace period waits for it, after pinning
 * the hot folios it holds without references.  If one of them is already
 * being evicted it stays online: it must not wait for the grace period
 * that frees it.  Returns whether it went offline, for long_wait_end().
 */
static bool long_wait_begin(void)
{
	bool offline = read_pin_lockless();

	if (offline)
		cache_thread_offline();
	return offline;
}

static void long_wait_end(bool offline)
{
	if (offline)
		cache_thread_online();
}

/* Wait for batch b's backing reads (ops->wait_io) before its fills are
 * shared, as a long wait. */
void cache_wait_io(struct fill_batch *b)
{
	bool offline;

	if (!b->mapping->ops->wait_io)
		return;
	offline = long_wait_begin();
	b->mapping->ops->wait_io(b);
	long_wait_end(offline);
}

/*
 * Fill folio i of batch b and publish the result to its waiters.  A fill
 * may wait for I/O or decode for long (a frame streamed from its start):
 * a long wait.
 */
int cache_fill_batch(struct fill_batch *b, unsigned int i)
{
	struct folio *f = b->folios[i];
	bool offline = long_wait_begin();
	int err;

	err = b->mapping->ops->fill(b, i);
	long_wait_end(offline);

	if (err) {
		stat_inc(f->group, err == -EBADMSG ? STAT_CORRUPT_FRAMES
						   : STAT_IO_ERRORS);
	} else {
		stat_inc(f->group, STAT_FOLIOS_READ);
		stat_mod(f->group, STAT_DECOMP_BYTES, f->len);
	}
	folio_fill_done(f, err);
	return err;
}

/*
 * Folios a fill passes over: a frame that can only be decoded from its
 * start (a big frame served in pieces, fs/backing.c) yields every piece
 * before the one asked for, and those are kept while the budget is not
 * full: a locked, charged folio for index, in its slot and marked
 * speculative like readahead's, which the caller fills and hands to
 * cache_pass_over_end(); NULL if the folio is cached, or if it would take
 * the budget to within a reclaim pass of its limit.  At the limit, pieces
 * kept in passing would push out the ones readers asked for, and each
 * read that misses starts the frame over: with a 64 MiB budget, a scan of
 * a 143 MB file (`PRAGMA integrity_check`) decoded 14 times as much.
 */
struct folio *cache_pass_over_begin(struct mapping *m, unsigned long index,
				    struct group *g)
{
	struct folio *f;

	if (!g || mapping_cached(m, index) ||
	    group_over_limit(g, pages_of_bytes(mapping_folio_len(m, index)) +
				    reclaim_headroom_pages(g)))
		return NULL;
	f = folio_alloc(m, index);
	if (!f)
		return NULL;
	if (charge_speculative(g, f->nr_pages)) {
		folio_free_unused(f);
		return NULL;
	}
	f->group = g;
	folio_set(f, FOLIO_SPECULATIVE);
	stat_mod(g, STAT_RA_UNREAD, f->nr_pages);
	if (folio_insert(m, f)) {
		stat_mod(g, STAT_RA_UNREAD, -(long)f->nr_pages);
		folio_free_unused(f); /* another reader's is there */
		return NULL;
	}
	return f;
}

void cache_pass_over_end(struct folio *f, int err)
{
	if (!err) {
		stat_inc(f->group, STAT_FOLIOS_READ);
		stat_mod(f->group, STAT_DECOMP_BYTES, f->len);
	}
	folio_fill_done(f, err);
	folio_put(f);
}

static void bounce_free(struct folio *f)
{
	cache_buf_put(f->mapping->cache, f->data, f->len);
	free(f);
}

/*
 * The uncached path: a private copy of folio index's content.  Errors
 * (EBADMSG for a damaged frame, ...) reach readers as EIO.
 */
static int read_bounce(struct read_req *rq, unsigned long index,
		       struct folio **out)
{
	struct mapping *m = rq->mapping;
	struct folio *f;
	int err;

	if (rq->nbounce >= READ_REQ_MAX_FOLIOS)
		return -ENOMEM;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->len = mapping_folio_len(m, index);
	f->index = index;
	f->mapping = m;
	f->data = cache_buf_get(m->cache, f->len);
	err = -ENOMEM;
	if (f->data) {
		bool offline = long_wait_begin(); /* backing I/O, a decode */

		err = m->ops->read_into(m, rq->io_ctx, index, f->data,
					rq->group);
		long_wait_end(offline);
	}
	if (err) {
		if (err != -ENOMEM)
			stat_inc(rq->group, err == -EBADMSG
						    ? STAT_CORRUPT_FRAMES
						    : STAT_IO_ERRORS);
		bounce_free(f);
		return err == -ENOMEM ? err : -EIO;
	}
	stat_inc(rq->group, STAT_BOUNCE_READS);
	stat_mod(rq->group, STAT_DECOMP_BYTES, f->len);
	rq->waited_io = true;
	rq->bounce[rq->nbounce++] = f;
	*out = f;
	return GOT_BOUNCE;
}

/*
 * Whether folio i's part [from, to) may be read on its own: a read of less
 * than the folio, all in it, that does not continue the previous read of
 * its file (so no readahead is due), for a reader or a fill of the kernel
 * tier (whole pages, which read_part gives whole) but not an mmap fault
 * (read around instead), of a folio not cached.
 */
static bool read_part_wanted(const struct read_req *rq, unsigned long i,
			     bool single, uint64_t from, uint64_t to)
{
	const struct mapping *m = rq->mapping;

	if (!m->ops->read_part || !single || (rq->fill && !rq->tiered) ||
	    rq->fault ||
	    rq->internal || rq->nbounce >= READ_REQ_MAX_FOLIOS ||
	    to - from >= mapping_folio_len(m, i))
		return false;
	if (rq->file && atomic_load_explicit(&rq->file->prev_pos,
					     memory_order_relaxed) ==
				(long long)rq->pos)
		return false;
	return !mapping_cached(m, i);
}

/*
 * The bytes [from, to) of folio i alone, when the filesystem has them as
 * they are (raw data): no folio, no decode, nothing cached.  GOT_PART, or
 * -EAGAIN (fill the folio as usual), or -EIO.
 */
static int read_part(struct read_req *rq, unsigned long i, uint64_t from,
		     uint64_t to, struct folio **out)
{
	struct mapping *m = rq->mapping;
	struct folio *f = calloc(1, sizeof(*f));
	int err;

	if (!f)
		return -EAGAIN;
	f->len = (uint32_t)(to - from);
	f->index = i;
	f->mapping = m;
	f->data = cache_buf_get(m->cache, f->len);
	if (f->data) {
		bool offline = long_wait_begin(); /* backing I/O */

		err = m->ops->read_part(m, rq->io_ctx, i, (uint32_t)from,
					f->len, f->data);
		long_wait_end(offline);
	} else {
		err = -EAGAIN;
	}
	if (err) {
		bounce_free(f);
		if (err == -EAGAIN || err == -ENOMEM)
			return -EAGAIN; /* the usual way, then */
		stat_inc(rq->group, STAT_IO_ERRORS);
		return -EIO;
	}
	stat_inc(rq->group, STAT_CACHE_MISSES);
	stat_inc(rq->group, STAT_PART_READS);
	stat_mod(rq->group, STAT_BACKING_BYTES, f->len);
	rq->waited_io = true;
	rq->bounce[rq->nbounce++] = f;
	*out = f;
	return GOT_PART;
}

static bool folio_lockless_ok(const struct folio *f)
{
	const unsigned int need = 1u << FOLIO_HOT | 1u << FOLIO_UPTODATE |
				  1u << FOLIO_REFERENCED;
	unsigned int fl = atomic_load_explicit(&f->flags, memory_order_acquire);

	/* the marker must reach the slow path, which starts readahead */
	return (fl & need) == need && !(fl & (1u << FOLIO_READAHEAD));
}

/* A hot, uptodate folio: reply from it with no reference (seed 002). */
static bool read_lockless(struct read_req *rq, struct folio *f)
{
	if (!rq->mapping->cache->lockless || rq->no_lockless ||
	    !folio_lockless_ok(f))
		return false;
	rq->lockless[rq->nlockless++] = f;
	stat_inc(rq->group, STAT_LOCKLESS_READS);
	return true;
}

/* What read_get_folio() remembers across its lookups of one folio. */
struct get_state {
	bool tried_ra; /* readahead ran for this folio */
	bool retried;  /* a failed speculative fill was read again */
};

/*
 * The folio is not cached: readahead brings it in (filemap_get_pages'
 * page_cache_sync_ra), or after that, a bounce copy serves the read.
 */
static int read_miss(struct read_req *rq, unsigned long index,
		     unsigned long last, struct get_state *st,
		     struct folio **out)
{
	const struct cache_ra_ops *ops = rq->mapping->cache->ra_ops;
	int err;

	if (st->tried_ra || !ops)
		return read_bounce(rq, index, out);
	stat_inc(rq->group, STAT_CACHE_MISSES);
	st->tried_ra = true;
	rq->waited_io = true; /* a major fault: it reads */
	err = ops->sync_ra(rq, index, last);
	if (err == -ENOMEM) /* no room even after reclaim */
		return read_bounce(rq, index, out);
	return err ? -EIO : LOOK_AGAIN; /* the backing read or its frame */
}

/*
 * filemap_update_page(): a pinned folio whose fill is in flight; wait for
 * it.  -EAGAIN: the request must start over, taking references only.
 */
static int read_wait_fill(struct read_req *rq, struct folio *f)
{
	const struct cache_ra_ops *ops = rq->mapping->cache->ra_ops;

	if (!folio_test(f, FOLIO_LOCKED))
		return 0;
	/*
	 * Fill our own deferred folios before sleeping on someone else's:
	 * they may be waiting for ours.
	 */
	if (ops)
		ops->unblock(rq);
	/*
	 * And sleep RCU-offline, never holding up a grace period that the
	 * folio's filler may be waiting for: so the lockless folios must be
	 * pinned first.
	 */
	if (!read_pin_lockless())
		return -EAGAIN;
	rq->waited_io = true;
	folio_wait_locked(f);
	return 0;
}

/*
 * Get folio index for the request, pinned, hot (lockless) or bounced,
 * waiting for its fill if it is in flight: an enum read_got, -EIO, or
 * -EAGAIN (start the request over with references only).
 */
static int read_get_folio(struct read_req *rq, unsigned long index,
			  unsigned long last, struct folio **out)
{
	const struct cache_ra_ops *ops = rq->mapping->cache->ra_ops;
	struct get_state st = {false, false};
	struct folio *f;
	bool again;
	int r;

	for (;;) {
		f = folio_lookup(rq->mapping, index);
		if (!f) {
			r = read_miss(rq, index, last, &st, out);
			if (r == LOOK_AGAIN)
				continue;
			return r;
		}
		if (!st.tried_ra)
			stat_inc(rq->group, STAT_CACHE_HITS);
		*out = f;
		if (read_lockless(rq, f))
			return GOT_LOCKLESS;
		if (!folio_try_get(f))
			continue; /* reclaim is taking it out: look again */
		/*
		 * Pinned first: readahead may reclaim and wait for a grace
		 * period, after which an unpinned f could be gone.
		 */
		if (ops && folio_test(f, FOLIO_READAHEAD) &&
		    folio_test_clear(f, FOLIO_READAHEAD))
			ops->async_ra(rq, f, last);
		r = read_wait_fill(rq, f);
		if (!r && folio_test(f, FOLIO_UPTODATE)) {
			rq->held[rq->nheld++] = f;
			return GOT_PINNED;
		}
		/* a failed speculative fill is dropped quietly: read the
		 * frame again, now as this request's own */
		again = !r && folio_test(f, FOLIO_SPECULATIVE) && !st.retried;
		folio_put(f);
		if (!again)
			return r ? r : -EIO;
		st.retried = true;
		st.tried_ra = false;
	}
}

/*
 * Mark the folio accessed, unless the previous read of this file ended in
 * it: repeated small reads of one folio count once (filemap_read's rule).
 */
static void read_mark_accessed(struct read_req *rq, struct folio *f,
			       bool first)
{
	if (rq->no_touch)
		return;
	if (first && rq->file) {
		long long prev = atomic_load_explicit(&rq->file->prev_pos,
						      memory_order_relaxed);

		if (prev > 0 &&
		    mapping_index(rq->mapping, (uint64_t)prev - 1) == f->index)
			return;
	}
	folio_mark_accessed(f);
}

/*
 * A fill that takes the whole folio, or the last of it, to the kernel
 * tier: the kernel now holds the same bytes, so the folio leaves the cache
 * (its slot's reference goes now, the request's after the reply).  A
 * folio partly handed over stays, for the fills of its other parts.
 */
static void read_hand_over(struct read_req *rq, struct folio *f)
{
	folio_mark_read(f); /* read, if it was read ahead: a hit */
	if (!lru_remove(f))
		return;
	folio_put(f);
	stat_inc(rq->group, STAT_KERNEL_HANDOVERS);
}

/* The request this worker is serving, for read_pin_lockless(). */
static __thread struct read_req *current_rq;

/*
 * Before this worker waits for a grace period in the middle of a request
 * (reclaim expediting deferred frees), turn its lockless folios into pinned
 * ones.  False if one of them is already being evicted: then the worker
 * must not wait for the grace period that would free it.
 */
bool read_pin_lockless(void)
{
	struct read_req *rq = current_rq;

	if (!rq)
		return true;
	while (rq->nlockless) {
		struct folio *f = rq->lockless[rq->nlockless - 1];

		if (rq->nheld == READ_REQ_MAX_FOLIOS || !folio_try_get(f))
			return false;
		rq->held[rq->nheld++] = f;
		rq->nlockless--;
	}
	return true;
}

static void read_release(struct read_req *rq)
{
	for (int i = 0; i < rq->nheld; i++)
		folio_put(rq->held[i]);
	for (int i = 0; i < rq->nbounce; i++)
		bounce_free(rq->bounce[i]);
	rq->nheld = rq->nbounce = rq->nlockless = 0;
}

/* Bytes [s, e) of the file, which the kernel tier holds, as handed over
 * from folio f: clipped to f's bytes of the file, [from, to) of m. */
static bool tier_note_run(const struct read_req *rq, struct folio *f,
			  uint64_t fpos, uint64_t from, uint64_t to, uint64_t s,
			  uint64_t e)
{
	s = rq->tier_base + s > from ? rq->tier_base + s : from;
	e = rq->tier_base + e < to ? rq->tier_base + e : to;
	return s < e && folio_note_tiered_fill(f, s - fpos, e - fpos);
}

/*
 * Folio f, partly taken by a tiered fill: its bytes of the fill's file in
 * pages the kernel tier already holds (from earlier fills, of f or of a
 * folio of the same frame evicted before) count as handed over too, a
 * page the kernel holds being all of it.  True if that leaves nothing of
 * f to hand over: then f would only double what the kernel holds (a
 * random reader of a file read once, whose chunks come back one page at a
 * time).  Bytes of f outside the file (a frame holding several small
 * files) never count.  The pages of this fill, [fill_from, fill_to) of f,
 * count with them (ktier_resident() leaves them out until it ends).  The
 * tier is asked 64 pages at a time; a run of held pages is noted whole,
 * across those windows, as a big folio's coverage is a bit per 64th.
 */
static bool tier_holds_rest(const struct read_req *rq, struct folio *f,
			    uint64_t fill_from, uint64_t fill_to)
{
	uint64_t fpos = mapping_folio_pos(rq->mapping, f->index);
	uint64_t base = rq->tier_base, end = base + rq->tier_size;
	uint64_t from = fpos > base ? fpos : base;
	uint64_t to = fpos + f->len < end ? fpos + f->len : end;
	uint64_t p0, p1, q0, q1, run = UINT64_MAX, p;
	bool done = false;

	if (from >= to)
		return false;
	p0 = (from - base) >> ZF_PAGE_SHIFT;
	p1 = (to - base + ZF_PAGE_SIZE - 1) >> ZF_PAGE_SHIFT;
	q0 = (fpos + fill_from - base) >> ZF_PAGE_SHIFT;
	q1 = (fpos + fill_to - base + ZF_PAGE_SIZE - 1) >> ZF_PAGE_SHIFT;
	for (p = p0; p < p1; p += 64) {
		unsigned int n = p1 - p < 64 ? (unsigned int)(p1 - p) : 64;
		uint64_t held = ktier_resident(rq->mapping->cache, rq->tier_id,
					       p << ZF_PAGE_SHIFT, n);

		for (unsigned int i = 0; i < n; i++) {
			if ((held >> i & 1) || (p + i >= q0 && p + i < q1)) {
				run = run == UINT64_MAX ? p + i : run;
			} else if (run != UINT64_MAX) {
				done |= tier_note_run(rq, f, fpos, from, to,
						      run << ZF_PAGE_SHIFT,
						      (p + i) << ZF_PAGE_SHIFT);
				run = UINT64_MAX;
			}
		}
	}
	if (run != UINT64_MAX)
		done |= tier_note_run(rq, f, fpos, from, to,
				      run << ZF_PAGE_SHIFT, p1 << ZF_PAGE_SHIFT);
	return done;
}

/* Add folio i's part of the request to the reply. */
static int read_add_folio(struct read_req *rq, unsigned long i,
			  unsigned long first, unsigned long last, uint64_t end)
{
	const struct mapping *m = rq->mapping;
	uint64_t fpos = mapping_folio_pos(m, i);
	uint64_t from = i == first ? rq->pos - fpos : 0;
	uint64_t to = i == last ? end - fpos : mapping_folio_len(m, i);
	struct folio *f;
	int got = -EAGAIN;

	if (read_part_wanted(rq, i, first == last, from, to))
		got = read_part(rq, i, from, to, &f);
	if (got == -EAGAIN)
		got = read_get_folio(rq, i, last, &f);
	if (got < 0)
		return got;
	if (got == GOT_PINNED && rq->tiered &&
	    ((from == 0 && to == f->len) || folio_note_tiered_fill(f, from, to) ||
	     tier_holds_rest(rq, f, from, to)))
		read_hand_over(rq, f);
	else if (got == GOT_LOCKLESS && rq->tiered &&
		 (folio_note_tiered_fill(f, from, to) ||
		  tier_holds_rest(rq, f, from, to)) &&
		 folio_try_get(f)) {
		/* the last of a hot folio: pinned, to leave like the others */
		rq->nlockless--; /* f, just added */
		rq->held[rq->nheld++] = f;
		read_hand_over(rq, f);
	} else if (got == GOT_PINNED)
		read_mark_accessed(rq, f, i == first);
	if (got != GOT_PART && rq->fill && !rq->tiered)
		mapping_note_fill(rq->mapping, f, from, to);
	rq->iov[rq->niov].iov_base = (char *)f->data + (got == GOT_PART ? 0
								      : from);
	rq->iov[rq->niov].iov_len = to - from;
	rq->niov++;
	rq->bytes += to - from;
	return 0;
}

/*
 * filemap_read()'s loop: the folios of [pos, end), until an error or the
 * reply is full (a short read: the caller asks for the rest).
 */
static int read_folios(struct read_req *rq, uint64_t end)
{
	const struct mapping *m = rq->mapping;
	unsigned long first = mapping_index(m, rq->pos);
	unsigned long last = mapping_index(m, end - 1), i = first;
	int err;

	while (i <= last && rq->niov < READ_REQ_MAX_FOLIOS &&
	       rq->nheld < READ_REQ_MAX_FOLIOS) {
		err = read_add_folio(rq, i, first, last, end);
		if (err == -EAGAIN) {
			/* a lockless folio went away: again, with refs only */
			read_release(rq);
			rq->niov = 0;
			rq->bytes = 0;
			rq->no_lockless = true;
			i = first;
			continue;
		}
		if (err)
			return err;
		i++;
	}
	/* the reply is full: a read() asks for the rest, a fill cannot */
	return i <= last && rq->fill ? -EIO : 0;
}

int cache_read(struct read_req *rq, cache_reply_fn reply, void *arg)
{
	const struct cache_ra_ops *ops = rq->mapping->cache->ra_ops;
	uint64_t end = rq->pos + rq->len;
	int err, rc;

	if (end > rq->mapping->size || end < rq->pos)
		end = rq->mapping->size;
	if (rq->pos >= end)
		return reply(arg, NULL, 0);
	if (!rq->internal)
		stat_inc(rq->group, STAT_PGFAULT);
	if (rq->fault)
		stat_inc(rq->group, STAT_FAULT_FILLS);
	current_rq = rq;
	err = read_folios(rq, end);
	if (rq->waited_io && !rq->internal)
		stat_inc(rq->group, STAT_PGMAJFAULT);
	if (rq->file) {
		if (atomic_load_explicit(&rq->file->prev_pos,
					 memory_order_relaxed) !=
		    (long long)rq->pos)
			atomic_store_explicit(&rq->file->run_start,
					      (long long)rq->pos,
					      memory_order_relaxed);
		atomic_store_explicit(&rq->file->prev_pos,
				      (long long)(rq->pos + rq->bytes),
				      memory_order_relaxed);
	}
	/*
	 * After the reply the reader may close the file at once: from here
	 * on, nothing of the open file may be touched, and the mapping only
	 * through references (folios, pending windows).
	 */
	if (err && (rq->bytes == 0 || rq->fill))
		rc = reply(arg, NULL, err);
	else
		rc = reply(arg, rq->iov, rq->niov); /* an error after data: short */
	read_release(rq);
	current_rq = NULL;
	if (ops)
		ops->finish(rq);
	return rc;
}
