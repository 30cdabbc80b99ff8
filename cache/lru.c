// SPDX-License-Identifier: MIT
/*
 * LRU lists and the reclaim scan: mirrors mm/vmscan.c for file folios.
 *
 * Each budget group has an active and an inactive list.  New folios enter
 * the inactive list; folio_mark_accessed() promotes a folio read twice.  A
 * reclaim pass scans the inactive list from its tail, and never evicts a
 * folio referenced since the scan last saw it (folio_check_references()):
 * referenced and already spared once, it is promoted to the active list;
 * referenced for the first time, its bit is cleared and it gets a second
 * trip round the inactive list.  A locked folio or one with readers is
 * rotated; anything else is frozen (refcount 1 -> 0), taken out of its slot
 * and freed.  When the inactive list is low against the active one (the kernel's
 * inactive_is_low() ratio, 1:1 below 1 GiB, sqrt(10 * GiB) above) folios move
 * from the active tail to the inactive head, losing their referenced bit.
 *
 * Invariant: a folio is in its mapping slot exactly when it is on an LRU
 * list, and both change only under the group's lru->lock.  So whoever takes a
 * folio off the list under the lock also owns clearing its slot.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "internal.h"

struct lru {
	pthread_mutex_t lock;
	struct cds_list_head active, inactive;
	unsigned long nr_active, nr_inactive; /* pages */
};

int lru_group_init(struct group *g, void *priv)
{
	struct lru *l = calloc(1, sizeof(*l));

	(void)priv;
	if (!l)
		return -ENOMEM;
	pthread_mutex_init(&l->lock, NULL);
	CDS_INIT_LIST_HEAD(&l->active);
	CDS_INIT_LIST_HEAD(&l->inactive);
	g->lru = l;
	return 0;
}

void lru_group_fini(struct group *g, void *priv)
{
	struct lru *l = g->lru;

	(void)priv;
	if (!l)
		return;
	pthread_mutex_destroy(&l->lock);
	free(l);
	g->lru = NULL;
}

/* The group's folio pages, for cache_shrink()'s proportion. */
unsigned long lru_pages(struct group *g)
{
	struct lru *l = g->lru;
	unsigned long n;

	pthread_mutex_lock(&l->lock);
	n = l->nr_active + l->nr_inactive;
	pthread_mutex_unlock(&l->lock);
	return n;
}

static void lru_account(struct folio *f, bool active, long sign)
{
	struct lru *l = f->group->lru;
	long n = sign * (long)f->nr_pages;

	if (active)
		l->nr_active += (unsigned long)n;
	else
		l->nr_inactive += (unsigned long)n;
	stat_mod(f->group, active ? STAT_ACTIVE_FILE : STAT_INACTIVE_FILE, n);
}

/* Insert f in its slot and on the inactive list, under the LRU lock. */
int lru_insert(struct folio *f)
{
	struct lru *l = f->group->lru;
	struct folio *expected = NULL;
	int err = 0;

	pthread_mutex_lock(&l->lock);
	/* release: the struct's fields are visible to lock-free lookups */
	if (atomic_compare_exchange_strong_explicit(
		    &f->mapping->slots[f->index], &expected, f,
		    memory_order_release, memory_order_relaxed)) {
		cds_list_add(&f->lru, &l->inactive);
		folio_set(f, FOLIO_ON_LRU);
		lru_account(f, false, 1);
	} else {
		err = -EEXIST;
	}
	pthread_mutex_unlock(&l->lock);
	return err;
}

void lru_activate(struct folio *f)
{
	struct lru *l = f->group->lru;

	pthread_mutex_lock(&l->lock);
	if (folio_test(f, FOLIO_ON_LRU) && !folio_test(f, FOLIO_ACTIVE)) {
		cds_list_move(&f->lru, &l->active);
		lru_account(f, false, -1);
		folio_set(f, FOLIO_ACTIVE);
		lru_account(f, true, 1);
		stat_mod(f->group, STAT_PGACTIVATE, f->nr_pages);
	}
	folio_clear(f, FOLIO_REFERENCED);
	pthread_mutex_unlock(&l->lock);
}

/* Take f off its list and out of its slot; false if someone else did. */
static bool lru_unlink_locked(struct folio *f)
{
	struct folio *expected = f;

	if (!folio_test(f, FOLIO_ON_LRU))
		return false;
	cds_list_del_init(&f->lru);
	folio_clear(f, FOLIO_ON_LRU);
	lru_account(f, folio_test(f, FOLIO_ACTIVE), -1);
	atomic_compare_exchange_strong(&f->mapping->slots[f->index], &expected,
				       NULL);
	atomic_fetch_sub(&f->mapping->nr_cached, 1);
	return true;
}

bool lru_remove(struct folio *f)
{
	struct lru *l = f->group->lru;
	bool ok;

	pthread_mutex_lock(&l->lock);
	ok = lru_unlink_locked(f);
	pthread_mutex_unlock(&l->lock);
	return ok;
}

static bool inactive_is_low(const struct lru *l)
{
	unsigned long gb = (l->nr_active + l->nr_inactive) >>
			   (30 - ZF_PAGE_SHIFT);
	unsigned long ratio = gb ? (unsigned long)sqrt(10.0 * (double)gb) : 1;

	return l->nr_inactive * ratio < l->nr_active;
}

/* shrink_active_list() for one folio: active tail -> inactive head. */
static bool deactivate_one(struct lru *l, struct group *g)
{
	struct folio *f;

	if (cds_list_empty(&l->active))
		return false;
	f = cds_list_entry(l->active.prev, struct folio, lru);
	cds_list_move(&f->lru, &l->inactive);
	lru_account(f, true, -1);
	folio_clear(f, FOLIO_ACTIVE);
	folio_clear(f, FOLIO_REFERENCED);
	folio_set(f, FOLIO_WORKINGSET);
	lru_account(f, false, 1);
	stat_mod(g, STAT_PGDEACTIVATE, f->nr_pages);
	stat_mod(g, STAT_PGREFILL, f->nr_pages);
	return true;
}

/* Freeze the slot's reference: succeeds only if nobody else holds one. */
static bool folio_freeze(struct folio *f)
{
	int one = 1;

	return atomic_compare_exchange_strong(&f->refcount, &one, 0);
}

/* inactive tail -> active head, for a folio referenced again (promote) */
static void promote_one(struct lru *l, struct group *g, struct folio *f)
{
	cds_list_move(&f->lru, &l->active);
	lru_account(f, false, -1);
	folio_set(f, FOLIO_ACTIVE);
	lru_account(f, true, 1);
	stat_mod(g, STAT_PGACTIVATE, f->nr_pages);
}

/*
 * folio_check_references() for the folio at the inactive tail: true if it
 * stays (spared once, or promoted on its second reference).
 */
static bool keep_referenced(struct lru *l, struct group *g, struct folio *f)
{
	if (!folio_test_clear(f, FOLIO_REFERENCED))
		return false;
	if (!folio_test_clear(f, FOLIO_SPARED)) {
		/* referenced once: a second trip, not eviction */
		folio_set(f, FOLIO_SPARED);
		cds_list_move(&f->lru, &l->inactive);
	} else {
		promote_one(l, g, f); /* referenced again after its chance */
	}
	return true;
}

/* A speculative folio evicted unread: readahead hears it. */
static void note_unused(struct group *g, struct folio *f)
{
	const struct cache_ra_ops *ops = cache_of_group(g)->ra_ops;

	if (folio_test(f, FOLIO_SPECULATIVE) && !folio_test(f, FOLIO_ACCESSED) &&
	    ops && ops->folio_unused)
		ops->folio_unused(f);
}

/*
 * The inactive list is empty or low, or went round once with nothing to
 * evict (every folio locked or in use): refill it from the active list;
 * false if nothing can.
 */
static bool inactive_ready(struct lru *l, struct group *g, bool stuck)
{
	if (!cds_list_empty(&l->inactive) && !inactive_is_low(l) && !stuck)
		return true;
	return deactivate_one(l, g) || !cds_list_empty(&l->inactive);
}

/*
 * Evict up to nr pages from the inactive tail; spare passes over readahead
 * not read yet and pieces of frames decodable only from their start
 * (rotated like a locked folio), for a caller that has another tier to
 * take from first.
 */
unsigned long lru_shrink(struct group *g, unsigned long nr,
			 unsigned long *scanned, bool spare)
{
	struct lru *l = g->lru;
	struct folio *freed = NULL, *f;
	unsigned long got = 0, limit, rotated = 0;

	pthread_mutex_lock(&l->lock);
	/* every folio may be seen twice: once promoted, once evicted */
	limit = 2 * (l->nr_active + l->nr_inactive) + SWAP_CLUSTER_MAX;
	while (got < nr && *scanned < limit &&
	       inactive_ready(l, g, rotated >= l->nr_inactive)) {
		f = cds_list_entry(l->inactive.prev, struct folio, lru);
		*scanned += f->nr_pages;
		if (keep_referenced(l, g, f))
			continue;
		if ((spare && ((folio_test(f, FOLIO_SPECULATIVE) &&
				!folio_test(f, FOLIO_ACCESSED)) ||
			       folio_test(f, FOLIO_PIECE))) ||
		    folio_test(f, FOLIO_LOCKED) || !folio_freeze(f)) {
			cds_list_move(&f->lru, &l->inactive); /* rotate */
			rotated += f->nr_pages;
			continue;
		}
		rotated = 0;
		note_unused(g, f);
		mapping_note_evicted(f);
		lru_unlink_locked(f);
		f->evict_next = freed;
		freed = f;
		got += f->nr_pages;
	}
	pthread_mutex_unlock(&l->lock);
	/* outside the lock: freeing may wait on the allocator */
	while ((f = freed)) {
		freed = f->evict_next;
		folio_release_evicted(f);
	}
	return got;
}
