// SPDX-License-Identifier: MIT
/*
 * Grace periods for what lockless readers may look at (seed 002).
 *
 * Workers use liburcu's QSBR flavour: a worker is online while it serves a
 * request and announces a quiescent state after each reply; it is offline
 * while it waits for the next request.  A pointer it loaded during a request
 * stays valid until that request ends, which is what lets the lockless read
 * path reply from a hot folio's data without a reference.
 *
 * So nothing a reader may have loaded is freed before a grace period:
 *  - every struct folio (a reader may have loaded its slot and try a get);
 *  - the data of hot folios (lockless readers copy from it).
 * Other folio data is freed at once, when its last reference drops.
 *
 * Those frees go to liburcu's call_rcu(), whose thread waits for a grace
 * period and runs them in batches; grace periods are short (about one
 * request).  Deferred data stays charged to its group until it is really
 * freed, so the budget never lies, and the deferred pages are a statistic.
 * When reclaim is short of room while pages wait, cache_expedite() waits
 * for the callbacks queued so far (rcu_barrier) on the spot (expedited_gps).
 * call_rcu() wants a registered caller: every thread that frees folios
 * (the workers, the fill and push threads, the reclaimer, tests) is
 * registered with cache_thread_register().  It may be offline (a fill
 * evicts to make room while offline for its backing I/O): the queue it
 * uses is the default one, never freed.
 *
 * ThreadSanitizer cannot see QSBR's ordering (plain stores and membarrier),
 * so under TSan each quiescent state is a release and each deferred free an
 * acquire on one address: the happens-before that QSBR really provides.
 * And each folio queued is a release and its callback an acquire on the
 * folio, for what an offline caller wrote before queueing it.
 */
#include <stdlib.h>

#include "internal.h"

static char gp_token, barrier_token;

static inline void tsan_qs(void)
{
	tsan_release(&gp_token);
}
static inline void tsan_gp(void)
{
	tsan_acquire(&gp_token);
}
/* a deferred free is done: what rcu_barrier() waits for */
static inline void tsan_freed(void)
{
	tsan_release(&barrier_token);
}
static inline void tsan_barrier(void)
{
	tsan_acquire(&barrier_token);
}
/* call_rcu()'s queue orders what its caller did before with the callback,
 * even when the caller is offline (a fill evicting to make room): then no
 * quiescent state of it comes between them */
static inline void tsan_queued(void *obj)
{
	tsan_release(obj);
}
static inline void tsan_dequeued(void *obj)
{
	tsan_acquire(obj);
}

void cache_thread_register(void)
{
	rcu_register_thread();
}

void cache_thread_unregister(void)
{
	tsan_qs();
	rcu_unregister_thread();
}

void cache_thread_online(void)
{
	rcu_thread_online();
}

void cache_thread_offline(void)
{
	tsan_qs();
	rcu_thread_offline();
}

void cache_quiescent(void)
{
	tsan_qs();
	rcu_quiescent_state();
}

/* The budget's own threads (the reclaimer) in the same states. */
void cache_thread_state(enum thread_state st, void *priv)
{
	(void)priv;
	switch (st) {
	case THREAD_REGISTER:
		cache_thread_register();
		break;
	case THREAD_ONLINE:
		cache_thread_online();
		break;
	case THREAD_OFFLINE:
		cache_thread_offline();
		break;
	case THREAD_UNREGISTER:
		cache_thread_unregister();
		break;
	}
}

/* A grace period after folio_release_evicted(): its data if hot, then it. */
static void folio_free_rcu(struct rcu_head *head)
{
	struct folio *f = caa_container_of(head, struct folio, rcu);

	tsan_gp();
	tsan_dequeued(f);
	if (f->data) {
		struct cache *c = cache_of_group(f->group);

		uncharge(f->group, f->nr_pages);
		cache_buf_put(c, f->data, f->len);
		stat_mod(f->group, STAT_DEFERRED_FREE, -(long)f->nr_pages);
		stat_inc(f->group, STAT_DEFERRED_FREES);
		atomic_fetch_sub(&c->deferred_pages, (long)f->nr_pages);
	}
	free(f);
	tsan_freed();
}

unsigned long cache_deferred_pages(void *cache)
{
	struct cache *c = cache;
	long n = atomic_load(&c->deferred_pages);

	return n > 0 ? (unsigned long)n : 0;
}

/*
 * Wait until what waited for a grace period so far is freed, and return
 * the pages that freed.  A worker in the middle of a request first pins
 * the hot folios it is about to reply from; if it cannot, it does not wait
 * (that grace period could free them).  rcu_barrier() takes a QSBR caller
 * offline while it waits.
 */
unsigned long cache_expedite(void *cache)
{
	unsigned long before = cache_deferred_pages(cache), after;

	if (!before || !read_pin_lockless())
		return 0;
	tsan_qs(); /* rcu_barrier() takes this thread offline while it waits */
	rcu_barrier();
	tsan_barrier();
	after = cache_deferred_pages(cache);
	return before > after ? before - after : 0;
}

/* Teardown: every deferred free has run. */
void cache_barrier(void)
{
	tsan_qs();
	rcu_barrier();
	tsan_barrier();
}

/*
 * A folio out of its slot and off its LRU, with no references left: its
 * data goes now unless lockless readers may be copying from it; the struct
 * always waits for a grace period.
 */
void folio_release_evicted(struct folio *f)
{
	/* not f->mapping: a reader's last put may come after it is gone */
	struct cache *c = cache_of_group(f->group);
	unsigned int fl = atomic_load(&f->flags);

	stat_mod(f->group, STAT_FILE, -(long)f->nr_pages);
	if ((fl & (1u << FOLIO_SPECULATIVE)) && !(fl & (1u << FOLIO_ACCESSED))) {
		stat_mod(f->group, STAT_RA_UNUSED_EVICTED, f->nr_pages);
		stat_mod(f->group, STAT_RA_UNREAD, -(long)f->nr_pages);
	}
	if (fl & (1u << FOLIO_HOT)) {
		atomic_fetch_add(&c->deferred_pages, f->nr_pages);
		stat_mod(f->group, STAT_DEFERRED_FREE, f->nr_pages);
	} else {
		uncharge(f->group, f->nr_pages);
		cache_buf_put(c, f->data, f->len);
		f->data = NULL;
	}
	tsan_queued(f);
	call_rcu(&f->rcu, folio_free_rcu);
}

/* A folio of a mapping going away: nobody can reach it any more. */
void folio_free_now(struct folio *f)
{
	stat_mod(f->group, STAT_FILE, -(long)f->nr_pages);
	uncharge(f->group, f->nr_pages);
	cache_buf_put(cache_of_group(f->group), f->data, f->len);
	free(f);
}
