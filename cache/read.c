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
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"

void read_req_init(struct read_req *rq, struct mapping *m,
		   struct file_ra_state *ra, struct group *g, void *io_ctx,
		   uint64_t pos, size_t len)
{
	rq->mapping = m;
	rq->ra = ra;
	rq->group = g;
	rq->io_ctx = io_ctx;
	rq->pos = pos;
	rq->len = len;
	rq->fault = false;
	rq->readaround = false;
	rq->niov = 0;
	rq->bytes = 0;
	rq->nheld = 0;
	rq->nbounce = 0;
	rq->nlockless = 0;
	rq->lockless_used = false;
	rq->no_lockless = false;
	rq->waited_io = false;
	rq->pending = NULL;
	rq->ra_reclaims = 0;
}

/* Fill folio i of batch b and publish the result to its waiters. */
int cache_fill_batch(struct fill_batch *b, unsigned int i)
{
	struct folio *f = b->folios[i];
	int err = b->mapping->ops->fill(b, i);

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

/* The uncached path: a private copy of folio index's content. */
int cache_bounce_folio(struct read_req *rq, unsigned long index,
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
	f->data = malloc(f->len ? f->len : 1);
	if (!f->data) {
		free(f);
		return -ENOMEM;
	}
	err = m->ops->read_into(m, rq->io_ctx, index, f->data);
	if (err) {
		stat_inc(rq->group, err == -EBADMSG ? STAT_CORRUPT_FRAMES
						    : STAT_IO_ERRORS);
		free(f->data);
		free(f);
		return err;
	}
	stat_inc(rq->group, STAT_BOUNCE_READS);
	stat_mod(rq->group, STAT_DECOMP_BYTES, f->len);
	rq->waited_io = true;
	rq->bounce[rq->nbounce++] = f;
	*out = f;
	return 0;
}

/* Errors below (EBADMSG for a damaged frame, ...) reach readers as EIO. */
static int read_bounce(struct read_req *rq, unsigned long index,
		       struct folio **out)
{
	int err = cache_bounce_folio(rq, index, out);

	return err == -ENOMEM || !err ? err : -EIO;
}

static bool folio_lockless_ok(const struct folio *f)
{
	const unsigned int need = 1u << FOLIO_HOT | 1u << FOLIO_UPTODATE |
				  1u << FOLIO_REFERENCED;
	unsigned int fl = atomic_load_explicit(&f->flags, memory_order_acquire);

	/* the marker must reach the slow path, which starts readahead */
	return (fl & need) == need && !(fl & (1u << FOLIO_READAHEAD));
}

/*
 * Get folio index for the request, pinned (or hot: *lockless), waiting for
 * its fill if it is in flight.  Returns 0, or -EIO.
 */
static int read_get_folio(struct read_req *rq, unsigned long index,
			  unsigned long last, struct folio **out,
			  bool *lockless)
{
	struct mapping *m = rq->mapping;
	struct cache *c = m->cache;
	bool tried_ra = false, retried = false;
	struct folio *f;
	int err;

	*lockless = false;
	for (;;) {
		f = folio_lookup(m, index);
		if (!f) {
			if (tried_ra || !c->ra_ops)
				return read_bounce(rq, index, out);
			stat_inc(rq->group, STAT_CACHE_MISSES);
			tried_ra = true;
			rq->waited_io = true; /* a major fault: it reads */
			err = c->ra_ops->sync_ra(rq, index, last);
			if (err == -ENOMEM) /* no room even after reclaim */
				return read_bounce(rq, index, out);
			if (err)
				return -EIO; /* the backing read or its frame */
			continue;
		}
		if (!tried_ra)
			stat_inc(rq->group, STAT_CACHE_HITS);
		if (c->lockless && !rq->no_lockless && folio_lockless_ok(f)) {
			*lockless = true;
			*out = f;
			rq->lockless[rq->nlockless++] = f;
			stat_inc(rq->group, STAT_LOCKLESS_READS);
			return 0;
		}
		if (!folio_try_get(f))
			continue; /* reclaim is taking it out: look again */
		/*
		 * Pinned first: readahead may reclaim and wait for a grace
		 * period, after which an unpinned f could be gone.
		 */
		if (folio_test(f, FOLIO_READAHEAD) && c->ra_ops &&
		    folio_test_clear(f, FOLIO_READAHEAD))
			c->ra_ops->async_ra(rq, f, last);
		if (folio_test(f, FOLIO_LOCKED)) {
			/*
			 * Fill our own deferred folios before sleeping on
			 * someone else's: they may be waiting for ours.
			 */
			if (rq->pending && c->ra_ops)
				c->ra_ops->finish(rq);
			/*
			 * And sleep RCU-offline, never holding up a grace
			 * period that the folio's filler may be waiting for:
			 * so the lockless folios must be pinned first.
			 */
			if (!read_pin_lockless()) {
				folio_put(f);
				return -EAGAIN; /* start over, with references */
			}
			rq->waited_io = true;
			folio_wait_locked(f);
		}
		if (!folio_test(f, FOLIO_UPTODATE)) {
			/*
			 * A failed speculative read is dropped quietly: read
			 * the frame again, now as this request's own.
			 */
			bool again = folio_test(f, FOLIO_SPECULATIVE) &&
				     !retried;

			folio_put(f);
			if (again) {
				retried = true;
				tried_ra = false;
				continue;
			}
			return -EIO;
		}
		rq->held[rq->nheld++] = f;
		*out = f;
		return 0;
	}
}

/*
 * Mark the folio accessed, unless the previous read of this file ended in
 * it: repeated small reads of one folio count once (filemap_read's rule).
 */
static void read_mark_accessed(struct read_req *rq, struct folio *f,
			       bool first)
{
	if (first && rq->ra) {
		long long prev = atomic_load_explicit(&rq->ra->prev_pos,
						      memory_order_relaxed);

		if (prev > 0 &&
		    mapping_index(rq->mapping, (uint64_t)prev - 1) == f->index)
			return;
	}
	folio_mark_accessed(f);
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
	rq->lockless_used = false;
	return true;
}

static void read_release(struct read_req *rq)
{
	for (int i = 0; i < rq->nheld; i++)
		folio_put(rq->held[i]);
	for (int i = 0; i < rq->nbounce; i++) {
		struct folio *f = rq->bounce[i];

		free(f->data);
		free(f);
	}
	rq->nheld = rq->nbounce = rq->nlockless = 0;
	rq->lockless_used = false;
}

int cache_read(struct read_req *rq, cache_reply_fn reply, void *arg)
{
	struct mapping *m = rq->mapping;
	struct cache *c = m->cache;
	uint64_t end = rq->pos + rq->len;
	unsigned long first, last;
	int err = 0, rc;

	if (end > m->size || end < rq->pos)
		end = m->size;
	if (rq->pos >= end)
		return reply(arg, NULL, 0);
	stat_inc(rq->group, STAT_PGFAULT);
	if (rq->fault)
		stat_inc(rq->group, STAT_FAULT_FILLS);
	current_rq = rq;
	first = mapping_index(m, rq->pos);
	last = mapping_index(m, end - 1);
restart:
	for (unsigned long i = first; i <= last; i++) {
		uint64_t fpos = mapping_folio_pos(m, i);
		uint64_t from = i == first ? rq->pos - fpos : 0;
		uint64_t to = i == last ? end - fpos : mapping_folio_len(m, i);
		struct folio *f;
		bool lockless;

		if (rq->niov == READ_REQ_MAX_FOLIOS ||
		    rq->nheld == READ_REQ_MAX_FOLIOS)
			break; /* a short read: the caller asks for the rest */
		err = read_get_folio(rq, i, last, &f, &lockless);
		if (err == -EAGAIN) {
			/* a lockless folio went away: again, with refs only */
			read_release(rq);
			rq->niov = 0;
			rq->bytes = 0;
			rq->no_lockless = true;
			goto restart;
		}
		if (err)
			break;
		if (lockless)
			rq->lockless_used = true;
		else if (f->group) /* bounce folios have no LRU state */
			read_mark_accessed(rq, f, i == first);
		rq->iov[rq->niov].iov_base = (char *)f->data + from;
		rq->iov[rq->niov].iov_len = to - from;
		rq->niov++;
		rq->bytes += to - from;
	}
	if (rq->waited_io)
		stat_inc(rq->group, STAT_PGMAJFAULT);
	if (rq->ra)
		atomic_store_explicit(&rq->ra->prev_pos,
				      (long long)(rq->pos + rq->bytes),
				      memory_order_relaxed);
	/*
	 * After the reply the reader may close the file at once: from here
	 * on, nothing of the open file may be touched, and the mapping only
	 * through references (folios, pending windows).
	 */
	if (err && rq->bytes == 0)
		rc = reply(arg, NULL, err);
	else
		rc = reply(arg, rq->iov, rq->niov); /* an error after data: short */
	read_release(rq);
	current_rq = NULL;
	if (c->ra_ops)
		c->ra_ops->finish(rq);
	return rc;
}
