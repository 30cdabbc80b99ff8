// SPDX-License-Identifier: MIT
/*
 * The compressed cache: frames' compressed bytes kept in the budget, as
 * zswap keeps compressed pages in memory instead of writing them out.
 *
 * A folio evicted and wanted again is read from backing again: a read of
 * the local disk, or, for a dataset in a store, a request (1.5-2 ms to a
 * gateway here, against tens of microseconds to decode a frame).  Random
 * readers of a working set bigger than the budget fetch the same frames
 * over and over: a 90 MB SQLite database at budget=32M sent its 15 MB of
 * frames 70 times over.  Compressed, the same working set takes a third
 * of the room or less, so its frames are kept here and decoded again.
 *
 * What is kept: a frame read from backing a second time (admission by
 * refault, as mm/workingset.c activates a page that comes back soon): a
 * file streamed once, or a scan bigger than everything, leaves a bit per
 * folio and nothing else, and does not push out what random readers need
 * again.  The bit is set by the first read and stays.
 *
 * How much: at most ccache_pct percent of the budget (the kernel's
 * zswap.max_pool_percent), charged to the root group like the folios, by
 * the byte: the entries' bytes together in whole pages, as the kernel's
 * obj_cgroup charges zswap's and slab's objects (a 10 KiB entry takes 2.5
 * pages, not 3).  Entries leave oldest first when
 * the share is full, and to reclaim after the folios of both tiers
 * (cache_shrink): a hit saves a backing read, and an entry is a third of
 * its folio.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct ccache_entry {
	struct ccache_entry *next;  /* in its hash bucket */
	struct cds_list_head lru;   /* the cache's, oldest first */
	struct cds_list_head mlink; /* its mapping's */
	const struct mapping *mapping;
	unsigned long index;
	size_t len;
	uint8_t data[];
};

/* What an entry takes, in bytes: its part of the charge. */
static size_t entry_size(size_t len)
{
	return sizeof(struct ccache_entry) + len;
}

#define CCACHE_MIN_BUCKETS 64
#define CCACHE_MAX_BUCKETS (1u << 20)

static size_t bucket_of(const struct ccache *cc, const struct mapping *m,
			unsigned long index)
{
	uint64_t h = (uint64_t)(uintptr_t)m * 0x9e3779b97f4a7c15ull ^
		     (uint64_t)index * 0xc2b2ae3d27d4eb4full;

	return (size_t)(h ^ h >> 29) & (cc->nbuckets - 1);
}

int ccache_init(struct cache *c, unsigned int pct)
{
	struct ccache *cc = &c->cc;
	unsigned long max = (unsigned long)counter_max(&c->budget.root.mem);
	unsigned int n = CCACHE_MIN_BUCKETS;

	pthread_mutex_init(&cc->lock, NULL);
	CDS_INIT_LIST_HEAD(&cc->lru);
	cc->pct = pct > 90 ? 90 : pct;
	cc->pages = 0;
	cc->bytes = 0;
	cc->buckets = NULL;
	cc->nbuckets = 0;
	if (!cc->pct)
		return 0;
	/* a bucket per 8 KiB the share may hold (frames of 32 KiB at 3:1) */
	while (n < CCACHE_MAX_BUCKETS &&
	       (unsigned long)n * 2 < max * cc->pct / 100)
		n *= 2;
	cc->buckets = calloc(n, sizeof(*cc->buckets));
	if (!cc->buckets)
		return -1;
	cc->nbuckets = n;
	return 0;
}

bool ccache_enabled(const struct cache *c)
{
	return c->cc.nbuckets != 0;
}

/* The most the entries may be charged: pct of memory.max now. */
static unsigned long share_pages(struct cache *c)
{
	return (unsigned long)counter_max(&c->budget.root.mem) * c->cc.pct /
	       100;
}

static void unlink_entry(struct ccache *cc, struct ccache_entry *e)
{
	struct ccache_entry **p =
	    &cc->buckets[bucket_of(cc, e->mapping, e->index)];

	while (*p != e)
		p = &(*p)->next;
	*p = e->next;
	cds_list_del(&e->lru);
	cds_list_del(&e->mlink);
	cc->bytes -= entry_size(e->len);
}

/* The pages the entries left no longer fill, off cc->pages: to give back. */
static unsigned long pages_freed(struct ccache *cc)
{
	unsigned long keep = pages_of_bytes(cc->bytes), freed = cc->pages - keep;

	cc->pages = keep;
	return freed;
}

/* Free the entries unlinked onto list (left empty), and give back the
 * pages they freed. */
static void free_list(struct cache *c, struct cds_list_head *list,
		      unsigned long pages)
{
	struct ccache_entry *e, *tmp;

	cds_list_for_each_entry_safe(e, tmp, list, lru)
		free(e);
	CDS_INIT_LIST_HEAD(list);
	if (pages) {
		stat_mod(&c->budget.root, STAT_CCACHE, -(long)pages);
		uncharge(&c->budget.root, pages);
	}
}

/* Unlink the oldest entries onto list until at most bytes_max are left;
 * the pages that frees. */
static unsigned long evict_to(struct ccache *cc, uint64_t bytes_max,
			      struct cds_list_head *list)
{
	while (cc->bytes > bytes_max && !cds_list_empty(&cc->lru)) {
		struct ccache_entry *e =
		    cds_list_entry(cc->lru.next, struct ccache_entry, lru);

		unlink_entry(cc, e);
		cds_list_add(&e->lru, list);
	}
	return pages_freed(cc);
}

static struct ccache_entry *find(struct ccache *cc, const struct mapping *m,
				 unsigned long index)
{
	struct ccache_entry *e = cc->buckets[bucket_of(cc, m, index)];

	while (e && (e->mapping != m || e->index != index))
		e = e->next;
	return e;
}

bool ccache_has(struct mapping *m, unsigned long index)
{
	struct ccache *cc = &m->cache->cc;
	bool has;

	if (!ccache_enabled(m->cache) || !mapping_seen(m, index))
		return false;
	pthread_mutex_lock(&cc->lock);
	has = find(cc, m, index) != NULL;
	pthread_mutex_unlock(&cc->lock);
	return has;
}

bool ccache_get(struct mapping *m, unsigned long index, void *dst, size_t len,
		struct group *g)
{
	struct ccache *cc = &m->cache->cc;
	struct ccache_entry *e;
	bool hit = false;

	if (!ccache_enabled(m->cache) || !mapping_seen(m, index))
		return false;
	pthread_mutex_lock(&cc->lock);
	e = find(cc, m, index);
	if (e && e->len == len) {
		memcpy(dst, e->data, len);
		cds_list_del(&e->lru); /* the youngest now */
		cds_list_add_tail(&e->lru, &cc->lru);
		hit = true;
	}
	pthread_mutex_unlock(&cc->lock);
	if (hit)
		stat_inc(g, STAT_CCACHE_HITS);
	return hit;
}

void ccache_offer(struct mapping *m, unsigned long index, const void *src,
		  size_t len, struct group *g)
{
	struct cache *c = m->cache;
	struct ccache *cc = &c->cc;
	struct ccache_entry *e;
	/* the most it can add to the charge, charged before it goes in */
	size_t size = entry_size(len);
	unsigned long pages = pages_of_bytes(size), grow, freed;
	uint64_t room;
	CDS_LIST_HEAD(gone);

	if (!ccache_enabled(c) || !mapping_see(m, index))
		return; /* off, or the first read of the frame */
	room = (uint64_t)share_pages(c) << ZF_PAGE_SHIFT;
	if (size > room)
		return;
	pthread_mutex_lock(&cc->lock);
	if (find(cc, m, index)) {
		pthread_mutex_unlock(&cc->lock);
		return;
	}
	freed = evict_to(cc, room - size, &gone);
	pthread_mutex_unlock(&cc->lock);
	free_list(c, &gone, freed);
	/* never under the lock: reclaim ends here (ccache_shrink).  An entry
	 * is worth one reclaim pass, not a demand charge's retries and waits
	 * (the fill's folio is locked meanwhile, and a bounce read came from a
	 * demand charge that just failed) */
	e = malloc(size);
	if (!e)
		return;
	if (charge_nowait(&c->budget.root, pages) &&
	    (reclaim_pass(&c->budget.root, pages, false),
	     charge_nowait(&c->budget.root, pages))) {
		free(e);
		return;
	}
	e->mapping = m;
	e->index = index;
	e->len = len;
	memcpy(e->data, src, len);
	pthread_mutex_lock(&cc->lock);
	if (find(cc, m, index)) { /* another reader's, meanwhile */
		pthread_mutex_unlock(&cc->lock);
		uncharge(&c->budget.root, pages);
		free(e);
		return;
	}
	/* others may have filled the share meanwhile */
	freed = evict_to(cc, room - size, &gone);
	e->next = cc->buckets[bucket_of(cc, m, index)];
	cc->buckets[bucket_of(cc, m, index)] = e;
	cds_list_add_tail(&e->lru, &cc->lru);
	cds_list_add(&e->mlink, &m->ccache);
	cc->bytes += size;
	grow = pages_of_bytes(cc->bytes) - cc->pages; /* at most pages */
	cc->pages += grow;
	pthread_mutex_unlock(&cc->lock);
	stat_mod(&c->budget.root, STAT_CCACHE, (long)grow);
	if (pages > grow) /* it went partly into a page already charged */
		uncharge(&c->budget.root, pages - grow);
	stat_inc(g, STAT_CCACHE_STORES);
	free_list(c, &gone, freed);
}

unsigned long ccache_shrink(struct cache *c, unsigned long nr)
{
	struct ccache *cc = &c->cc;
	unsigned long freed;
	CDS_LIST_HEAD(gone);

	if (!ccache_enabled(c) || !nr)
		return 0;
	pthread_mutex_lock(&cc->lock);
	freed = evict_to(cc,
			 nr < cc->pages ? (uint64_t)(cc->pages - nr)
					      << ZF_PAGE_SHIFT
					: 0,
			 &gone);
	pthread_mutex_unlock(&cc->lock);
	free_list(c, &gone, freed);
	return freed;
}

void ccache_forget(struct mapping *m)
{
	struct ccache *cc = &m->cache->cc;
	struct ccache_entry *e, *tmp;
	unsigned long freed;
	CDS_LIST_HEAD(gone);

	if (!ccache_enabled(m->cache))
		return;
	pthread_mutex_lock(&cc->lock);
	cds_list_for_each_entry_safe(e, tmp, &m->ccache, mlink) {
		unlink_entry(cc, e);
		cds_list_add(&e->lru, &gone);
	}
	freed = pages_freed(cc);
	pthread_mutex_unlock(&cc->lock);
	free_list(m->cache, &gone, freed);
}

void ccache_destroy(struct cache *c)
{
	ccache_shrink(c, ULONG_MAX);
	free(c->cc.buckets);
	c->cc.buckets = NULL;
	c->cc.nbuckets = 0;
	pthread_mutex_destroy(&c->cc.lock);
}
