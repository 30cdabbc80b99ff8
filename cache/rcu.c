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
 * Those frees go on one list.  The reaper thread takes the list, waits for a
 * grace period (synchronize_rcu) and frees it; the list is short because
 * grace periods are short (about one request).  Deferred data stays charged
 * to its group until it is really freed, so the budget never lies, and the
 * deferred pages are a statistic.  When reclaim is short of room while pages
 * wait, cache_expedite() does the same on the spot (expedited_gps).
 *
 * ThreadSanitizer cannot see QSBR's ordering (plain stores and membarrier),
 * so under TSan each quiescent state is a release and each grace period an
 * acquire on one address: the happens-before that QSBR really provides.
 */
#include <stdlib.h>
#include <urcu-qsbr.h>

#include "cache.h"

#if defined(__SANITIZE_THREAD__)
#define ZF_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ZF_TSAN 1
#endif
#endif

#ifdef ZF_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
static char gp_token;
static inline void tsan_qs(void)
{
	__tsan_release(&gp_token);
}
static inline void tsan_gp(void)
{
	__tsan_acquire(&gp_token);
}
#else
static inline void tsan_qs(void)
{
}
static inline void tsan_gp(void)
{
}
#endif

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

static void synchronize(void)
{
	synchronize_rcu();
	tsan_gp();
}

/* The end of a folio after a grace period: its data if deferred, then it. */
static unsigned long folio_free_deferred(struct cache *c, struct folio *f)
{
	unsigned long pages = 0;

	if (f->data) {
		pages = f->nr_pages;
		free(f->data);
		uncharge(f->group, f->nr_pages);
		stat_mod(f->group, STAT_DEFERRED_FREE, -(long)pages);
		stat_inc(f->group, STAT_DEFERRED_FREES);
		atomic_fetch_sub(&c->deferred_pages, (long)pages);
	}
	free(f);
	return pages;
}

void cache_defer_free(struct cache *c, struct folio *f)
{
	bool was_empty;

	pthread_mutex_lock(&c->defer_lock);
	was_empty = !c->defer_head;
	f->defer_next = c->defer_head;
	c->defer_head = f;
	if (was_empty)
		pthread_cond_signal(&c->defer_cond);
	pthread_mutex_unlock(&c->defer_lock);
}

static struct folio *defer_take(struct cache *c)
{
	struct folio *list;

	pthread_mutex_lock(&c->defer_lock);
	list = c->defer_head;
	c->defer_head = NULL;
	pthread_mutex_unlock(&c->defer_lock);
	return list;
}

static unsigned long defer_free_list(struct cache *c, struct folio *list)
{
	unsigned long pages = 0;

	while (list) {
		struct folio *next = list->defer_next;

		pages += folio_free_deferred(c, list);
		list = next;
	}
	return pages;
}

/*
 * Wait for a grace period now and free what waited for it.  A worker in
 * the middle of a request first pins the hot folios it is about to reply
 * from; if it cannot, it does not wait (that grace period could free them).
 */
unsigned long cache_expedite(void *cache)
{
	struct cache *c = cache;
	struct folio *list;

	if (!read_pin_lockless())
		return 0;
	list = defer_take(c);
	if (!list)
		return 0;
	synchronize();
	return defer_free_list(c, list);
}

unsigned long cache_deferred_pages(void *cache)
{
	struct cache *c = cache;
	long n = atomic_load(&c->deferred_pages);

	return n > 0 ? (unsigned long)n : 0;
}

static void *reaper_main(void *arg)
{
	struct cache *c = arg;

	pthread_mutex_lock(&c->defer_lock);
	for (;;) {
		struct folio *list;

		while (!c->defer_head && !c->reaper_stop)
			pthread_cond_wait(&c->defer_cond, &c->defer_lock);
		list = c->defer_head;
		c->defer_head = NULL;
		if (!list && c->reaper_stop)
			break;
		pthread_mutex_unlock(&c->defer_lock);
		synchronize();
		defer_free_list(c, list);
		pthread_mutex_lock(&c->defer_lock);
	}
	pthread_mutex_unlock(&c->defer_lock);
	return NULL;
}

int cache_reaper_start(struct cache *c)
{
	int err;

	c->reaper_stop = false;
	err = pthread_create(&c->reaper, NULL, reaper_main, c);
	if (err)
		return -err;
	c->reaper_running = true;
	return 0;
}

void cache_reaper_stop(struct cache *c)
{
	if (c->reaper_running) {
		pthread_mutex_lock(&c->defer_lock);
		c->reaper_stop = true;
		pthread_cond_signal(&c->defer_cond);
		pthread_mutex_unlock(&c->defer_lock);
		pthread_join(c->reaper, NULL);
		c->reaper_running = false;
	}
	/* whatever is left: no reader remains */
	defer_free_list(c, defer_take(c));
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
	if ((fl & (1u << FOLIO_SPECULATIVE)) && !(fl & (1u << FOLIO_ACCESSED)))
		stat_mod(f->group, STAT_RA_UNUSED_EVICTED, f->nr_pages);
	if (fl & (1u << FOLIO_HOT)) {
		atomic_fetch_add(&c->deferred_pages, f->nr_pages);
		stat_mod(f->group, STAT_DEFERRED_FREE, f->nr_pages);
	} else {
		free(f->data);
		f->data = NULL;
		uncharge(f->group, f->nr_pages);
	}
	if (c->reaper_running)
		cache_defer_free(c, f);
	else
		folio_free_deferred(c, f); /* no readers: tests, teardown */
}

/* A folio of a mapping going away: nobody can reach it any more. */
void folio_free_now(struct folio *f)
{
	stat_mod(f->group, STAT_FILE, -(long)f->nr_pages);
	free(f->data);
	uncharge(f->group, f->nr_pages);
	free(f);
}
