// SPDX-License-Identifier: MIT
/*
 * Folios: allocation, the reference protocol, waiting, access marking.
 *
 * References.  A folio in a mapping slot holds one reference for the slot.
 * A reader takes one more with folio_try_get(), which increments unless the
 * count is zero: zero means reclaim froze it (1 -> 0 with compare-and-swap,
 * possible only when the slot's reference is the only one) and is taking it
 * out.  Struct folio is freed only after an RCU grace period, so a reader
 * that loaded a slot may always look at the struct and try; on failure it
 * looks the slot up again.  Hot folios are read with no reference at all;
 * their data waits for a grace period too (cache/rcu.c).
 *
 * Waiting.  A folio is inserted LOCKED and unlocked once its fill is done
 * or failed.  Waiters sleep on a hashed table of condition variables, like
 * the kernel's folio_wait_table.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* 256 wait queues: more means fewer false wakeups between folios, more
 * memory; the kernel uses the same size */
#define WAIT_TABLE_BITS 8

struct wait_bucket {
	pthread_mutex_t lock;
	pthread_cond_t cond;
} __attribute__((aligned(64)));

static struct wait_bucket wait_table[1 << WAIT_TABLE_BITS];
static pthread_once_t wait_once = PTHREAD_ONCE_INIT;

static void wait_table_init(void)
{
	for (int i = 0; i < (1 << WAIT_TABLE_BITS); i++) {
		pthread_mutex_init(&wait_table[i].lock, NULL);
		pthread_cond_init(&wait_table[i].cond, NULL);
	}
}

static struct wait_bucket *folio_waitqueue(const struct folio *f)
{
	uintptr_t h = (uintptr_t)f;

	h ^= h >> 17;
	h *= 0x9E3779B97F4A7C15ull;
	return &wait_table[h >> (64 - WAIT_TABLE_BITS)];
}

/* A locked, uncharged folio for slot index of m; the caller charges it. */
struct folio *folio_alloc(struct mapping *m, unsigned long index)
{
	struct folio *f = calloc(1, sizeof(*f));

	pthread_once(&wait_once, wait_table_init);
	if (!f)
		return NULL;
	f->len = mapping_folio_len(m, index);
	f->nr_pages = (uint32_t)pages_of_bytes(f->len);
	f->index = index;
	f->mapping = m;
	f->data = cache_buf_get(m->cache, f->len);
	if (!f->data) {
		free(f);
		return NULL;
	}
	atomic_init(&f->flags, 1u << FOLIO_LOCKED);
	atomic_init(&f->refcount, 1);
	CDS_INIT_LIST_HEAD(&f->lru);
	return f;
}

/* A folio that never entered a mapping: nobody else has seen it. */
void folio_free_unused(struct folio *f)
{
	if (f->group)
		uncharge(f->group, f->nr_pages);
	cache_buf_put(f->mapping->cache, f->data, f->len);
	free(f);
}

struct folio *folio_lookup(struct mapping *m, unsigned long index)
{
	if (index >= m->nr_folios)
		return NULL;
	/* acquire pairs with the release CAS that publishes f in lru_insert */
	return atomic_load_explicit(&m->slots[index], memory_order_acquire);
}

bool folio_try_get(struct folio *f)
{
	int r = atomic_load_explicit(&f->refcount, memory_order_relaxed);

	/* increment unless zero; acquire: see what the freezer saw */
	while (r > 0)
		if (atomic_compare_exchange_weak_explicit(
			    &f->refcount, &r, r + 1, memory_order_acquire,
			    memory_order_relaxed))
			return true;
	return false;
}

void folio_put(struct folio *f)
{
	/* release: our reads of the data happen before whoever frees it */
	if (atomic_fetch_sub_explicit(&f->refcount, 1, memory_order_acq_rel) ==
	    1)
		folio_release_evicted(f);
}

/*
 * Publish f in its slot and on its group's LRU: -EEXIST if another reader
 * got there first.  f must be charged (f->group set).
 */
int folio_insert(struct mapping *m, struct folio *f)
{
	(void)m;
	atomic_fetch_add_explicit(&f->refcount, 1, memory_order_relaxed);
	if (lru_insert(f)) {
		atomic_fetch_sub_explicit(&f->refcount, 1,
					  memory_order_relaxed);
		return -EEXIST;
	}
	atomic_fetch_add_explicit(&m->nr_cached, 1, memory_order_relaxed);
	stat_mod(f->group, STAT_FILE, f->nr_pages);
	return 0;
}

void folio_unlock(struct folio *f)
{
	struct wait_bucket *wq = folio_waitqueue(f);

	folio_clear(f, FOLIO_LOCKED);
	pthread_mutex_lock(&wq->lock);
	pthread_cond_broadcast(&wq->cond);
	pthread_mutex_unlock(&wq->lock);
}

/*
 * Sleep until f is unlocked.  The caller holds a reference on f and no
 * pointer that needs RCU: it sleeps RCU-offline, so that no grace period
 * (which f's filler may be waiting for, to make room) waits for it.
 */
void folio_wait_locked(struct folio *f)
{
	struct wait_bucket *wq;

	if (!folio_test(f, FOLIO_LOCKED))
		return;
	wq = folio_waitqueue(f);
	cache_thread_offline();
	pthread_mutex_lock(&wq->lock);
	while (folio_test(f, FOLIO_LOCKED))
		pthread_cond_wait(&wq->cond, &wq->lock);
	pthread_mutex_unlock(&wq->lock);
	cache_thread_online();
}

/* Remove f from its mapping after a failed fill; readers will retry. */
static void folio_remove_failed(struct folio *f)
{
	if (lru_remove(f))
		folio_put(f); /* the slot's reference */
}

void folio_fill_done(struct folio *f, int err)
{
	if (err)
		folio_set(f, FOLIO_ERROR);
	else
		folio_set(f, FOLIO_UPTODATE);
	folio_unlock(f);
	if (err)
		folio_remove_failed(f);
}

/*
 * The first read of a folio readahead brought in: a readahead hit, and
 * readahead hears which of its folios get used.
 */
static void folio_first_access(struct folio *f, unsigned int old_flags)
{
	const struct cache_ra_ops *ops;

	if (!(old_flags & (1u << FOLIO_SPECULATIVE)))
		return;
	stat_mod(f->group, STAT_RA_HITS, f->nr_pages);
	stat_mod(f->group, STAT_RA_UNREAD, -(long)f->nr_pages);
	ops = cache_of_group(f->group)->ra_ops;
	if (ops && ops->folio_used)
		ops->folio_used(f);
}

/* The folio was read (once is enough): a readahead hit if it was one. */
void folio_mark_read(struct folio *f)
{
	unsigned int old = atomic_fetch_or(&f->flags, 1u << FOLIO_ACCESSED);

	if (!(old & (1u << FOLIO_ACCESSED)))
		folio_first_access(f, old);
}

/*
 * Mirrors folio_mark_accessed(): the first access sets referenced, the
 * second activates, and (seed 002) a read of an active, referenced folio
 * makes it hot and returns true.
 */
bool folio_mark_accessed(struct folio *f)
{
	unsigned int fl = atomic_load_explicit(&f->flags, memory_order_acquire);

	if (!(fl & (1u << FOLIO_ACCESSED)))
		folio_mark_read(f);
	if (!(fl & (1u << FOLIO_REFERENCED))) {
		folio_set(f, FOLIO_REFERENCED);
		return false;
	}
	if (!(fl & (1u << FOLIO_ACTIVE))) {
		lru_activate(f);
		return false;
	}
	/* with lockless reads off, nothing needs a grace period */
	if (!f->mapping->cache->lockless)
		return false;
	if (!(fl & (1u << FOLIO_HOT)) &&
	    !(atomic_fetch_or(&f->flags, 1u << FOLIO_HOT) & (1u << FOLIO_HOT)))
		stat_inc(f->group, STAT_HOT_FOLIOS);
	return true;
}
