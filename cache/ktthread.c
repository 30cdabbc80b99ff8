// SPDX-License-Identifier: MIT
/*
 * The kernel tier's thread: what reclaim evicted from the tier (ktier.c)
 * is queued, already uncharged, and this thread drops it from the kernel's
 * page cache through the invalidate() callback (FUSE_NOTIFY_INVAL_INODE),
 * serving no request and holding no lock meanwhile (ktier.c's deadlock
 * rules 2 and 4); and the tier's start and end.
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "ktier_internal.h"

/* Ranges to drop, adjacent ones of one file merged into one call. */
struct kt_run {
	uint64_t id, from, to; /* bytes; empty when from == to */
};

static void kt_run_add(struct ktier *kt, struct kt_run *r, uint64_t id,
		       uint64_t from, uint64_t to)
{
	if (r->from != r->to && (r->id != id || r->to != from)) {
		kt->invalidate(r->id, r->from, r->to - r->from, kt->priv);
		r->from = r->to;
	}
	if (r->from == r->to) {
		r->id = id;
		r->from = from;
	}
	r->to = to;
}

/*
 * The queue, oldest first: exactly the pages each chunk counted, all of
 * them filled (rule 1: a page with a fill in flight is never in a queued
 * chunk, so no invalidation waits for a fill).  Returns the pages.
 */
static unsigned long kt_invalidate_all(struct ktier *kt,
				       struct cds_list_head *todo)
{
	struct kt_chunk *c, *next;
	struct kt_run run = {0, 0, 0};
	unsigned long pages = 0;

	cds_list_for_each_entry_safe(c, next, todo, lru) {
		uint64_t base = c->index << CHUNK_SHIFT;
		uint32_t m = c->pages;

		pages += pages_in(m);
		while (m) {
			unsigned int p0 = (unsigned int)__builtin_ctz(m);
			unsigned int p1 = p0;

			while (p1 < CHUNK_PAGES && (m >> p1 & 1))
				p1++;
			kt_run_add(kt, &run, c->id,
				   base + ((uint64_t)p0 << ZF_PAGE_SHIFT),
				   base + ((uint64_t)p1 << ZF_PAGE_SHIFT));
			m &= p1 < 32 ? ~((1u << p1) - 1) : 0;
		}
		cds_list_del(&c->lru);
		free(c);
	}
	if (run.from != run.to)
		kt->invalidate(run.id, run.from, run.to - run.from, kt->priv);
	return pages;
}

/* The tier's thread: serves no request, holds no lock while it drops
 * pages (rule 2). */
static void *kt_thread(void *arg)
{
	struct ktier *kt = arg;
	struct cds_list_head todo;
	unsigned long done;

	pthread_mutex_lock(&kt->lock);
	for (;;) {
		while (cds_list_empty(&kt->queue) && !kt->stop)
			pthread_cond_wait(&kt->cond, &kt->lock);
		if (cds_list_empty(&kt->queue) || kt->halt)
			break;
		CDS_INIT_LIST_HEAD(&todo);
		cds_list_splice(&kt->queue, &todo);
		CDS_INIT_LIST_HEAD(&kt->queue);
		pthread_mutex_unlock(&kt->lock);
		done = kt_invalidate_all(kt, &todo);
		pthread_mutex_lock(&kt->lock);
		kt->queued -= done;
		pthread_cond_broadcast(&kt->drained);
	}
	pthread_mutex_unlock(&kt->lock);
	return NULL;
}

int ktier_enable(struct cache *cache, ktier_invalidate_fn invalidate,
		 void *priv)
{
	struct ktier *kt = calloc(1, sizeof(*kt));
	pthread_condattr_t ca;
	int err;

	if (!kt)
		return -ENOMEM;
	pthread_mutex_init(&kt->lock, NULL);
	pthread_cond_init(&kt->cond, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&kt->drained, &ca);
	pthread_condattr_destroy(&ca);
	CDS_INIT_LIST_HEAD(&kt->queue);
	kt->invalidate = invalidate;
	kt->priv = priv;
	err = pthread_create(&kt->thread, NULL, kt_thread, kt);
	if (err) {
		free(kt);
		return -err;
	}
	kt->running = true;
	cache->kt = kt;
	return 0;
}

static void kt_stop_thread(struct ktier *kt, bool halt)
{
	if (!kt->running)
		return;
	pthread_mutex_lock(&kt->lock);
	kt->stop = true;
	kt->halt = halt;
	pthread_cond_signal(&kt->cond);
	pthread_mutex_unlock(&kt->lock);
	pthread_join(kt->thread, NULL);
	kt->running = false;
}

/*
 * At unmount, while the workers still serve (rule 4): the thread ends the
 * batch it is dropping and stops, leaving the rest (the kernel's cache
 * goes with the mount).  Fills go on being counted; what they queue stays.
 * The thread writes to /dev/fuse, which closes after the workers stop, and
 * a fill the kernel queued after a chunk was (rule 1's case left) holds
 * pages an invalidation would wait on until a worker answers.
 */
void ktier_halt(struct cache *cache)
{
	if (cache->kt)
		kt_stop_thread(cache->kt, true);
}

/* Stop the thread once the queue is empty (unless halted: then what is
 * queued is freed); the tier keeps counting nothing more (fills after it
 * are not tracked). */
void ktier_disable(struct cache *cache)
{
	struct ktier *kt = cache->kt;
	struct kt_file *f;
	struct kt_chunk *c, *next;
	struct cds_hlist_node *pos, *tmp;

	if (!kt)
		return;
	kt_stop_thread(kt, false);
	cache->kt = NULL;
	/* uncharged when they were queued */
	cds_list_for_each_entry_safe(c, next, &kt->queue, lru) {
		cds_list_del(&c->lru);
		free(c);
	}
	for (unsigned int b = 0; b < (1u << KT_HASH_BITS); b++)
		cds_hlist_for_each_entry_safe(f, pos, tmp, &kt->hash[b], hnode)
			kt_file_drop(f);
	pthread_mutex_destroy(&kt->lock);
	pthread_cond_destroy(&kt->cond);
	pthread_cond_destroy(&kt->drained);
	free(kt);
}

unsigned long ktier_queued(struct cache *cache)
{
	struct ktier *kt = cache->kt;
	unsigned long n;

	if (!kt)
		return 0;
	pthread_mutex_lock(&kt->lock);
	n = kt->queued;
	pthread_mutex_unlock(&kt->lock);
	return n;
}
