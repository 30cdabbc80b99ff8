// SPDX-License-Identifier: MIT
/*
 * The kernel tier: the kernel page cache in front of the mount, inside its
 * budget (DESIGN 10).
 *
 * With cache=kernel every FUSE_READ is a page-cache fill, and a hit in the
 * kernel's page cache never reaches the daemon.  So the daemon counts what
 * it hands over: each fill's pages are charged to the budget group that
 * asked for them, as "kernel_file", and kept on that group's two lists of
 * chunks (CHUNK_BYTES of a file each, with a bitmap of the pages charged).
 * That is an upper bound of what the kernel holds: it may drop pages on its
 * own, and when it forgets an inode its pages are gone and uncharged.
 *
 * Reclaim shrinks this tier beside the folio LRU (cache_shrink()): a chunk
 * is evicted from the inactive tail, uncharged at once and queued; the
 * tier's own thread (ktthread.c) then drops it from the page cache (for
 * FUSE, FUSE_NOTIFY_INVAL_INODE through the invalidate() callback).  The
 * pages stay in the kernel for the few milliseconds in between, which is
 * part of the slack of one readahead window per reader the budget allows
 * here.
 *
 * The deadlock rules.  Invalidating a range locks each of its pages, and
 * waits (uninterruptibly) for any fill of those pages in flight; that fill
 * waits for a worker to answer it, and if the daemon is killed, for ever:
 * the stuck thread keeps /dev/fuse open, so the kernel never aborts the
 * fills, and readers and daemon hang (until the daemon's watchdog aborts
 * the connection, fs/watchdog.c).  So:
 *  1. A range is dropped only when each of its pages was filled and its
 *     fill answered: a fill marks its chunks' pages pending from
 *     ktier_fill_begin() (on arrival: the kernel has the pages, so they
 *     are charged then) to ktier_fill_end() (after the reply), and reclaim
 *     passes over a chunk with pages pending.  What a fill could not be
 *     charged for is dropped after its end.  Pages the kernel locks for a
 *     fill the daemon has not received yet are pages it does not hold, so
 *     not in a chunk's bitmap: unless the kernel dropped them on its own
 *     and is filling them again, which is the one case left.
 *  2. Invalidation runs on the tier's own thread, never a worker (a
 *     request handler), holding no lock; a worker waits for it at most
 *     KT_WAIT_US after a fill (so that the pages its reclaim uncharged are
 *     gone before more come in), a delay and never a deadlock.
 *  3. The tier's lock is never held while charging with reclaim: a charge
 *     that needs reclaim drops the lock first (reclaim takes it to evict).
 *  4. At unmount the thread halts while the workers still answer
 *     (ktier_halt()): no drop then waits on a fill no worker will answer,
 *     and none is written to /dev/fuse after it closes.
 *
 * Refaults (mm/workingset.c): hits are invisible, so what is hot is learnt
 * from evictions.  An evicted chunk leaves a shadow, the tier's eviction
 * clock (pages evicted or activated, ever).  A fill that finds a shadow is
 * a refault (workingset_refault); if fewer pages were evicted since than
 * the group's tier now holds, the chunk would have stayed had the tier been
 * that much bigger: it was part of the working set, so it goes on the
 * active list (workingset_activate), protected from the next evictions.
 * A scan through more than the tier holds refaults at a distance larger
 * than that, and stays inactive.  Active chunks are never referenced again
 * (hits are invisible), so the active list is kept no larger than the
 * inactive one, as inactive_is_low() does below 1 GiB: its oldest go back
 * to the inactive head.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <urcu/hlist.h>

#include "ktier_internal.h"

static struct kt_lists *kt_lists_of(struct group *g)
{
	return g->ktier;
}

int ktier_group_init(struct group *g)
{
	struct kt_lists *l = calloc(1, sizeof(*l));

	if (!l)
		return -ENOMEM;
	CDS_INIT_LIST_HEAD(&l->active);
	CDS_INIT_LIST_HEAD(&l->inactive);
	g->ktier = l;
	return 0;
}

void ktier_group_fini(struct group *g)
{
	free(g->ktier);
	g->ktier = NULL;
}

static unsigned long kt_lists_pages(const struct kt_lists *l)
{
	return l->nr_active + l->nr_inactive;
}

unsigned long ktier_pages(struct group *g)
{
	struct ktier *kt = cache_of_group(g)->kt;
	unsigned long n;

	if (!kt || !g->ktier)
		return 0;
	pthread_mutex_lock(&kt->lock);
	n = kt_lists_pages(kt_lists_of(g));
	pthread_mutex_unlock(&kt->lock);
	return n;
}

static struct cds_hlist_head *kt_bucket(struct ktier *kt, uint64_t id)
{
	uint64_t h = id * 0x9E3779B97F4A7C15ull;

	return &kt->hash[h >> (64 - KT_HASH_BITS)];
}

static struct kt_file *kt_file_find(struct ktier *kt, uint64_t id)
{
	struct kt_file *f;

	cds_hlist_for_each_entry_2(f, kt_bucket(kt, id), hnode)
		if (f->id == id)
			return f;
	return NULL;
}

static struct kt_file *kt_file_get(struct ktier *kt, uint64_t id,
				   uint64_t size)
{
	struct kt_file *f = kt_file_find(kt, id);

	if (f)
		return f;
	f = calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	f->id = id;
	f->nchunks = (size + CHUNK_BYTES - 1) >> CHUNK_SHIFT;
	f->chunks = calloc(f->nchunks ? f->nchunks : 1, sizeof(*f->chunks));
	if (!f->chunks) {
		free(f);
		return NULL;
	}
	cds_hlist_add_head(&f->hnode, kt_bucket(kt, id));
	return f;
}

static void kt_list_account(struct kt_chunk *c, long sign)
{
	struct kt_lists *l = kt_lists_of(c->group);
	long n = sign * (long)pages_in(c->pages);

	if (c->active)
		l->nr_active += (unsigned long)n;
	else
		l->nr_inactive += (unsigned long)n;
	stat_mod(c->group, STAT_KERNEL_FILE, n);
}

static void kt_unlink(struct kt_chunk *c)
{
	cds_list_del_init(&c->lru);
	kt_list_account(c, -1);
	c->file->chunks[c->index] = NULL;
}

/*
 * workingset_refault() for a chunk filled again: whether its shadow says
 * it was evicted recently enough to be part of the working set.
 */
static bool kt_refault(struct ktier *kt, struct kt_file *f, uint64_t ci,
		       struct group *g, unsigned long pages)
{
	uint32_t s = f->shadow ? f->shadow[ci] : 0, distance;

	if (!s)
		return false;
	f->shadow[ci] = 0;
	distance = kt->clock - (s - 1);
	stat_mod(g, STAT_WORKINGSET_REFAULT, (long)pages);
	if (distance > kt_lists_pages(kt_lists_of(g)))
		return false;
	kt->clock += (uint32_t)pages;
	stat_mod(g, STAT_WORKINGSET_ACTIVATE, (long)pages);
	return true;
}

/* Pages [p0, p1) of chunk ci enter the tier, charged to g: n of them are
 * new (the caller charged n); a new chunk goes on a list. */
static void kt_commit(struct ktier *kt, struct kt_file *f, uint64_t ci,
		      struct group *g, uint32_t newmask)
{
	struct kt_chunk *c = f->chunks[ci];
	struct kt_lists *l;

	if (c) {
		kt_list_account(c, -1);
		c->pages |= newmask;
		kt_list_account(c, 1);
	} else {
		c = calloc(1, sizeof(*c));
		if (!c)
			return; /* untracked: the caller invalidates it */
		c->file = f;
		c->group = g;
		c->id = f->id;
		c->index = ci;
		c->pages = newmask;
		c->active = kt_refault(kt, f, ci, g, pages_in(newmask));
		l = kt_lists_of(g);
		cds_list_add(&c->lru, c->active ? &l->active : &l->inactive);
		f->chunks[ci] = c;
		kt_list_account(c, 1);
	}
	stat_mod(g, STAT_KERNEL_FILLS, pages_in(newmask));
}

static uint32_t chunk_mask(uint64_t ci, uint64_t pos, uint64_t end)
{
	uint64_t c0 = ci << CHUNK_SHIFT, from = pos > c0 ? pos - c0 : 0;
	uint64_t to = end - c0 < CHUNK_BYTES ? end - c0 : CHUNK_BYTES;
	unsigned int p0 = (unsigned int)(from >> ZF_PAGE_SHIFT);
	unsigned int p1 = (unsigned int)((to + ZF_PAGE_SIZE - 1) >>
					 ZF_PAGE_SHIFT);
	uint64_t bits = ((1ull << (p1 - p0)) - 1) << p0;

	return (uint32_t)bits;
}

static void kt_queue(struct ktier *kt, struct kt_chunk *c)
{
	c->file = NULL;
	cds_list_add_tail(&c->lru, &kt->queue);
	kt->queued += pages_in(c->pages);
	pthread_cond_signal(&kt->cond);
}

/* Queue an untracked range for invalidation (a fill that could not be
 * charged: the kernel must not keep what the budget does not count). */
static void kt_queue_range(struct ktier *kt, uint64_t id, uint64_t ci,
			   uint32_t mask)
{
	struct kt_chunk *c = calloc(1, sizeof(*c));

	if (!c)
		return; /* nothing better to do */
	c->id = id;
	c->index = ci;
	c->pages = mask;
	kt_queue(kt, c);
}

enum kt_step { KT_DONE, KT_RECLAIM, KT_GIVE_UP };

/*
 * One chunk's part of a fill, under the lock: charge its new pages without
 * reclaim and commit them.  KT_RECLAIM: *owner needs *need pages first.
 */
static enum kt_step kt_fill_chunk(struct ktier *kt, struct group *g,
				  uint64_t id, uint64_t size, uint64_t ci,
				  uint32_t mask, struct group **owner,
				  unsigned long *need)
{
	struct kt_file *f = kt_file_get(kt, id, size);
	struct kt_chunk *c;
	uint32_t newmask;

	if (!f || ci >= f->nchunks)
		return KT_GIVE_UP;
	c = f->chunks[ci];
	*owner = c ? c->group : g;
	newmask = mask & ~(c ? c->pages : 0);
	if (newmask) {
		*need = pages_in(newmask);
		if (charge_nowait(*owner, *need))
			return KT_RECLAIM;
		kt_commit(kt, f, ci, *owner, newmask);
		c = f->chunks[ci];
		if (!c) {
			uncharge(*owner, *need);
			return KT_GIVE_UP;
		}
	}
	c->pending |= mask; /* not evicted until ktier_fill_end() */
	return KT_DONE;
}

/* Give what is queued up to us microseconds to leave the page cache. */
static void kt_wait_drained(struct ktier *kt, unsigned int us)
{
	struct timespec until = deadline_after_us(CLOCK_MONOTONIC, us);

	pthread_mutex_lock(&kt->lock);
	while (kt->queued && !kt->stop &&
	       pthread_cond_timedwait(&kt->drained, &kt->lock, &until) == 0)
		;
	pthread_mutex_unlock(&kt->lock);
}

void ktier_fill_begin(struct cache *cache, struct group *g, uint64_t id,
		      uint64_t size, uint64_t pos, size_t len)
{
	struct ktier *kt = cache->kt;
	uint64_t end = pos + len;

	if (!kt || !len)
		return;
	for (uint64_t ci = pos >> CHUNK_SHIFT; ci <= (end - 1) >> CHUNK_SHIFT;
	     ci++) {
		uint32_t mask = chunk_mask(ci, pos, end);
		enum kt_step st = KT_RECLAIM;
		struct group *owner = g;
		unsigned long need = 0;

		for (int tries = 0; st == KT_RECLAIM; tries++) {
			pthread_mutex_lock(&kt->lock);
			st = kt_fill_chunk(kt, g, id, size, ci, mask, &owner,
					   &need);
			/* given up: not counted, so dropped after the fill */
			if (st == KT_RECLAIM && tries == KT_CHARGE_TRIES)
				st = KT_GIVE_UP;
			pthread_mutex_unlock(&kt->lock);
			/* rule 3: reclaim (which evicts chunks) unlocked;
			 * what it made room for is charged on the next try */
			if (st == KT_RECLAIM && charge_demand(owner, need) == 0)
				uncharge(owner, need);
		}
	}
}

/* Chunk c leaves the tier and the page cache, with no shadow (it is
 * not evicted for want of room); under the lock, no fill in flight. */
static void kt_drop_now(struct ktier *kt, struct kt_chunk *c)
{
	unsigned int n = pages_in(c->pages);

	kt_unlink(c);
	stat_mod(c->group, STAT_KERNEL_EVICTED, n);
	uncharge(c->group, n);
	kt_queue(kt, c);
}

void ktier_fill_end(struct cache *cache, uint64_t id, uint64_t pos,
		    size_t len)
{
	struct ktier *kt = cache->kt;
	uint64_t end = pos + len;
	struct kt_file *f;

	if (!kt || !len)
		return;
	pthread_mutex_lock(&kt->lock);
	f = kt_file_find(kt, id);
	for (uint64_t ci = pos >> CHUNK_SHIFT; ci <= (end - 1) >> CHUNK_SHIFT;
	     ci++) {
		uint32_t mask = chunk_mask(ci, pos, end);
		struct kt_chunk *c = f && ci < f->nchunks ? f->chunks[ci] : NULL;

		if (c)
			c->pending &= ~mask;
		/* what the budget could not take leaves the page cache now
		 * that it is filled (rule 1) */
		if (mask & ~(c ? c->pages : 0))
			kt_queue_range(kt, id, ci, mask & ~(c ? c->pages : 0));
		if (c && c->doomed && !c->pending)
			kt_drop_now(kt, c);
	}
	pthread_mutex_unlock(&kt->lock);
	kt_wait_drained(kt, KT_WAIT_US);
}

/*
 * Which of the n pages (n <= 64) from pos (page-aligned) of file id the
 * tier holds, a bit each: an upper bound, as the tier's count is, of
 * pages filled; a page whose fill is in flight is not the kernel's yet.
 */
uint64_t ktier_resident(struct cache *cache, uint64_t id, uint64_t pos,
			unsigned int n)
{
	struct ktier *kt = cache->kt;
	uint64_t mask = 0, p = pos >> ZF_PAGE_SHIFT;
	struct kt_file *f;

	if (!kt || !n || n > 64)
		return 0;
	pthread_mutex_lock(&kt->lock);
	f = kt_file_find(kt, id);
	for (unsigned int i = 0, take; f && i < n; i += take, p += take) {
		uint64_t ci = p / CHUNK_PAGES;
		unsigned int b = (unsigned int)(p % CHUNK_PAGES);
		struct kt_chunk *c = ci < f->nchunks ? f->chunks[ci] : NULL;
		uint64_t held = c ? (uint64_t)(c->pages & ~c->pending) >> b : 0;

		take = (unsigned int)CHUNK_PAGES - b < n - i
			       ? (unsigned int)CHUNK_PAGES - b
			       : n - i;
		mask |= (held & (take < 64 ? (1ull << take) - 1 : ~0ull)) << i;
	}
	pthread_mutex_unlock(&kt->lock);
	return mask;
}

/* Move the active list's oldest to the inactive head (shrink_active_list) */
static bool kt_deactivate_one(struct kt_lists *l, struct group *g)
{
	struct kt_chunk *c;

	if (cds_list_empty(&l->active))
		return false;
	c = cds_list_entry(l->active.prev, struct kt_chunk, lru);
	kt_list_account(c, -1);
	c->active = false;
	kt_list_account(c, 1);
	cds_list_move(&c->lru, &l->inactive);
	stat_mod(g, STAT_PGDEACTIVATE, pages_in(c->pages));
	return true;
}

/* workingset_eviction(): the chunk leaves a shadow and ages the clock. */
static void kt_evict(struct ktier *kt, struct kt_chunk *c)
{
	struct kt_file *f = c->file;
	unsigned int n = pages_in(c->pages);

	if (!f->shadow)
		f->shadow = calloc(f->nchunks, sizeof(*f->shadow));
	if (f->shadow)
		f->shadow[c->index] = kt->clock + 1 ? kt->clock + 1 : 1;
	kt->clock += n;
	kt_unlink(c);
	stat_mod(c->group, STAT_KERNEL_EVICTED, n);
	kt_queue(kt, c);
}

/*
 * Evict nr pages from the inactive tail, in whole chunks.  A share (of a
 * pass split between the tiers) is kept to over passes: a chunk given for
 * a share smaller than itself counts for the next shares, so that small
 * passes do not take a chunk each and leave the folios alone.
 */
unsigned long ktier_shrink(struct group *g, unsigned long nr,
			   unsigned long *scanned, bool share)
{
	struct ktier *kt = cache_of_group(g)->kt;
	struct kt_lists *l = kt_lists_of(g);
	unsigned long got = 0, rotated = 0;
	struct kt_chunk *c;

	if (!kt || !l)
		return 0;
	pthread_mutex_lock(&kt->lock);
	if (share) {
		l->owed += (long)nr;
		nr = l->owed > 0 ? (unsigned long)l->owed : 0;
	}
	while (got < nr && rotated <= l->nr_inactive) {
		if (cds_list_empty(&l->inactive) ||
		    l->nr_inactive < l->nr_active)
			if (!kt_deactivate_one(l, g) &&
			    cds_list_empty(&l->inactive))
				break;
		c = cds_list_entry(l->inactive.prev, struct kt_chunk, lru);
		if (c->pending) { /* a fill in flight (rule 1) */
			cds_list_move(&c->lru, &l->inactive);
			rotated += pages_in(c->pages);
			continue;
		}
		got += pages_in(c->pages);
		kt_evict(kt, c);
	}
	/* what could not be given now is owed for one chunk at most */
	if (share)
		l->owed = l->owed - (long)got < (long)CHUNK_PAGES
				  ? l->owed - (long)got
				  : (long)CHUNK_PAGES;
	pthread_mutex_unlock(&kt->lock);
	*scanned += got;
	if (got)
		uncharge(g, got);
	return got;
}

void kt_file_drop(struct kt_file *f)
{
	for (uint64_t i = 0; i < f->nchunks; i++) {
		struct kt_chunk *c = f->chunks[i];

		if (!c)
			continue;
		kt_unlink(c);
		uncharge(c->group, pages_in(c->pages));
		free(c);
	}
	free(f->chunks);
	free(f->shadow);
	free(f);
}

/* The kernel forgot the inode: its pages went with it. */
void ktier_forget(struct cache *cache, uint64_t id)
{
	struct ktier *kt = cache->kt;
	struct kt_file *f;

	if (!kt)
		return;
	pthread_mutex_lock(&kt->lock);
	f = kt_file_find(kt, id);
	if (f) {
		cds_hlist_del(&f->hnode);
		kt_file_drop(f);
	}
	pthread_mutex_unlock(&kt->lock);
}

/* The pages of file id the tier holds or is filling (0: none). */
unsigned long ktier_tracks(struct cache *cache, uint64_t id)
{
	struct ktier *kt = cache->kt;
	unsigned long n = 0;
	struct kt_file *f;

	if (!kt)
		return 0;
	pthread_mutex_lock(&kt->lock);
	f = kt_file_find(kt, id);
	for (uint64_t i = 0; f && i < f->nchunks; i++)
		if (f->chunks[i])
			n += pages_in(f->chunks[i]->pages |
				      f->chunks[i]->pending);
	pthread_mutex_unlock(&kt->lock);
	return n;
}

/*
 * Every chunk leaves the page cache (queued for the thread to invalidate,
 * uncharged); one with a fill in flight, whose pages the fill has locked
 * (rule 1), when its last fill ends (ktier_fill_end()): for when what the
 * kernel holds may be wrong bytes (a seek table caught lying,
 * fs/backing.c).  A file's chunks are not told apart from another's: it
 * is rare, and cheap to fill again.
 */
void ktier_evict_all(struct cache *cache)
{
	struct ktier *kt = cache->kt;
	struct kt_file *f;

	if (!kt)
		return;
	pthread_mutex_lock(&kt->lock);
	for (size_t b = 0; b < (1u << KT_HASH_BITS); b++)
		cds_hlist_for_each_entry_2(f, &kt->hash[b], hnode)
			for (uint64_t i = 0; i < f->nchunks; i++) {
				struct kt_chunk *c = f->chunks[i];

				if (c && c->pending)
					c->doomed = true; /* at its end */
				else if (c)
					kt_drop_now(kt, c);
			}
	pthread_mutex_unlock(&kt->lock);
}

void ktier_drain(struct cache *cache, unsigned int us)
{
	if (cache->kt)
		kt_wait_drained(cache->kt, us);
}
