/* SPDX-License-Identifier: MIT */
/*
 * cache internals: shared by the files of cache/ only.
 *
 * The LRU lists and the reclaim scan (lru.c), grace periods and deferred
 * frees (rcu.c), the folio reference protocol and waiting (folio.c), and
 * the read path's bounce and pinning steps (read.c).  Tests may include it.
 */
#ifndef ZF_CACHE_INTERNAL_H
#define ZF_CACHE_INTERNAL_H

#include "cache.h"

/* bufpool.c */
void buf_pool_init(struct buf_pool *p);
void buf_pool_drain(struct cache *c);

/* fillpool.c */
void fill_pool_init(struct fill_pool *p, unsigned int nthreads);
int fill_pool_start(struct fill_pool *p);
void fill_pool_stop(struct fill_pool *p);

/* folio.c */
bool folio_try_get(struct folio *f);
void folio_unlock(struct folio *f);
void folio_wait_locked(struct folio *f);
bool folio_mark_accessed(struct folio *f);
void folio_mark_read(struct folio *f);

/* lru.c: each group's active and inactive lists (the budget's shrinker) */
int lru_group_init(struct group *g, void *priv);
void lru_group_fini(struct group *g, void *priv);
int lru_insert(struct folio *f);
void lru_activate(struct folio *f);
unsigned long lru_shrink(struct group *g, unsigned long nr,
			 unsigned long *scanned, bool spare);
bool lru_remove(struct folio *f);
unsigned long lru_pages(struct group *g);

/* ktier.c: the kernel tier's share of reclaim, and what it holds of a
 * file (read.c's handovers) */
int ktier_group_init(struct group *g);
void ktier_group_fini(struct group *g);
unsigned long ktier_shrink(struct group *g, unsigned long nr,
			   unsigned long *scanned, bool share);
uint64_t ktier_resident(struct cache *c, uint64_t id, uint64_t pos,
			unsigned int n);

/* rcu.c: what waits for a grace period */
void cache_thread_state(enum thread_state st, void *priv);
unsigned long cache_expedite(void *cache);
unsigned long cache_deferred_pages(void *cache);
void cache_barrier(void);
void folio_release_evicted(struct folio *f);
void folio_free_now(struct folio *f);

/* read.c */
bool read_pin_lockless(void);

#endif
