// SPDX-License-Identifier: MIT
/*
 * Fill threads: a window's folios decoded on every core.
 *
 * A worker that read a window's backing data has its folios to fill, one
 * frame each.  It shares them as a struct fill_work: a list of the folios,
 * the request's own first, from which whoever has a core to spare claims
 * the next one, the worker and the cache's fill threads alike.  The worker
 * claims the request's own folios and replies once they are filled (the
 * ones a fill thread claimed it waits for, as it waits for any folio in
 * flight); after the reply it claims what is left, beside the fill threads.
 * So one sequential reader keeps all cores decoding.
 *
 * Only while the cores have room: a work is shared while no more windows
 * than there are fill threads (the cores) are being filled.  More at once
 * keep their workers busy on every core, and a shared window then only
 * adds wakeups and lock traffic (four readers of 32K frames on the kernel
 * tier: 467-564 MiB/s shared, 574-732 not).  And only a work big enough
 * to pay for the wakeups (SHARE_MIN_COST).
 *
 * A fill never waits for another folio, for backing I/O (the worker waited
 * for the window's reads before sharing it) or for a request: fill threads
 * always make progress, which is what lets a worker sleep on a folio that a
 * fill thread has claimed, or that sits unclaimed in the queue.
 *
 * Lifetime: a work's count is its unfilled folios plus one for the worker
 * that owns it; the last to bring it to zero takes it off the queue and
 * calls its done().  Fill threads claim under the queue's lock, so a work
 * they find there is alive.  A fill thread is RCU-offline except while it
 * fills: it holds no pointer across fills.
 */
#include <errno.h>
#include <stdlib.h>

#include "internal.h"

void fill_work_init(struct fill_work *w, struct fill_batch *b,
		    unsigned int *order, unsigned int nr, unsigned int ndemand,
		    void (*done)(struct fill_work *w))
{
	w->b = b;
	w->order = order;
	w->nr = nr;
	w->ndemand = ndemand;
	atomic_init(&w->next, 0);
	atomic_init(&w->left, nr + 1);
	w->done = done;
	w->queued = false;
	w->shared = false;
	CDS_INIT_LIST_HEAD(&w->link);
	atomic_fetch_add_explicit(&b->mapping->cache->fills.active, 1,
				  memory_order_relaxed);
}

/* Claim the next folio below limit: its place in order, or -1. */
static int claim(struct fill_work *w, unsigned int limit)
{
	unsigned int n = atomic_load_explicit(&w->next, memory_order_relaxed);

	while (n < limit)
		if (atomic_compare_exchange_weak_explicit(
			    &w->next, &n, n + 1, memory_order_relaxed,
			    memory_order_relaxed))
			return (int)n;
	return -1;
}

/* The count's last reference: off the queue, and gone. */
static void work_release(struct fill_work *w)
{
	struct fill_pool *p = &w->b->mapping->cache->fills;

	atomic_fetch_sub_explicit(&p->active, 1, memory_order_relaxed);
	if (w->shared) {
		pthread_mutex_lock(&p->lock);
		if (w->queued)
			cds_list_del(&w->link);
		w->queued = false;
		pthread_mutex_unlock(&p->lock);
	}
	w->done(w);
}

static void work_fill(struct fill_work *w, unsigned int k)
{
	cache_fill_batch(w->b, w->order[k]);
	if (atomic_fetch_sub_explicit(&w->left, 1, memory_order_acq_rel) == 1)
		work_release(w);
}

bool fill_work_run(struct fill_work *w, bool demand_only)
{
	int k = claim(w, demand_only ? w->ndemand : w->nr);

	if (k < 0)
		return false;
	work_fill(w, (unsigned int)k);
	return true;
}

void fill_work_put(struct fill_work *w)
{
	if (atomic_fetch_sub_explicit(&w->left, 1, memory_order_acq_rel) == 1)
		work_release(w);
}

/*
 * The least work worth sharing, in bytes decoded (struct fill_batch's
 * cost): handing folios over costs wakeups and lock traffic, and a small
 * window is done about as soon by its worker alone, while the kernel's
 * readahead keeps several such windows in flight on the other cores.  One
 * reader of 256 MiB by 1 MiB read()s, cache=kernel, 32K frames, medians
 * of 5 (bench/seqread), MB/s shared / not: z3 128 KiB fills 581 / 605,
 * 256 KiB 696 / 605, 1 MiB 794 / 703; incompressible 128 KiB 1079 / 1385,
 * 256 KiB 1548 / 1738; cache=engine 1 MiB windows, z3 416 / 336.
 */
#define SHARE_MIN_COST (256u << 10)

/* What filling w's folios costs: the batch's cost, else their length. */
static uint64_t work_cost(const struct fill_work *w)
{
	uint64_t n = 0;

	if (w->b->costed)
		return w->b->cost;
	for (unsigned int k = 0; k < w->nr; k++)
		n += w->b->folios[w->order[k]]->len;
	return n;
}

bool fill_work_share(struct cache *c, struct fill_work *w)
{
	struct fill_pool *p = &c->fills;

	if (!p->nthreads || w->nr <= 1 ||
	    atomic_load_explicit(&p->active, memory_order_relaxed) >
		    p->nthreads ||
	    work_cost(w) < SHARE_MIN_COST)
		return false;
	w->shared = true;
	pthread_mutex_lock(&p->lock);
	cds_list_add_tail(&w->link, &p->queue);
	w->queued = true;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	return true;
}

/*
 * The next folio of the queue's first work, claimed: false once the queue
 * is empty and the pool stops.  Called and returns with the lock held.
 */
static bool pool_claim(struct fill_pool *p, struct fill_work **wp, int *kp)
{
	for (;;) {
		struct fill_work *w;
		int k;

		while (cds_list_empty(&p->queue) && !p->stop)
			pthread_cond_wait(&p->cond, &p->lock);
		if (cds_list_empty(&p->queue))
			return false;
		w = cds_list_first_entry(&p->queue, struct fill_work, link);
		k = claim(w, w->nr);
		if (k < 0 || (unsigned int)k + 1 >= w->nr) {
			/* nothing more to claim: the work leaves the queue */
			cds_list_del(&w->link);
			w->queued = false;
		}
		if (k >= 0) {
			*wp = w;
			*kp = k;
			return true;
		}
	}
}

static void *fill_thread(void *arg)
{
	struct fill_pool *p = arg;
	struct fill_work *w;
	int k;

	cache_thread_register();
	cache_thread_offline();
	pthread_mutex_lock(&p->lock);
	while (pool_claim(p, &w, &k)) {
		struct folio *f = w->b->folios[w->order[k]];

		pthread_mutex_unlock(&p->lock);
		cache_thread_online();
		stat_inc(f->group, STAT_SHARED_FILLS);
		work_fill(w, (unsigned int)k);
		cache_thread_offline();
		pthread_mutex_lock(&p->lock);
	}
	pthread_mutex_unlock(&p->lock);
	cache_thread_online();
	cache_thread_unregister();
	return NULL;
}

void fill_pool_init(struct fill_pool *p, unsigned int nthreads)
{
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	CDS_INIT_LIST_HEAD(&p->queue);
	atomic_init(&p->active, 0);
	p->want = nthreads;
	p->nthreads = 0;
	p->threads = NULL;
	p->stop = false;
}

int fill_pool_start(struct fill_pool *p)
{
	if (!p->want)
		return 0;
	p->threads = calloc(p->want, sizeof(*p->threads));
	if (!p->threads)
		return -ENOMEM;
	for (; p->nthreads < p->want; p->nthreads++)
		if (pthread_create(&p->threads[p->nthreads], NULL, fill_thread,
				   p)) {
			fill_pool_stop(p);
			return -EAGAIN;
		}
	return 0;
}

/* The queue drained, the threads gone; works shared from now on are not. */
void fill_pool_stop(struct fill_pool *p)
{
	unsigned int n = p->nthreads;

	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	for (unsigned int i = 0; i < n; i++)
		pthread_join(p->threads[i], NULL);
	p->nthreads = 0;
	free(p->threads);
	p->threads = NULL;
}
