// SPDX-License-Identifier: MIT
/*
 * Charging: how a folio's pages get into a budget, and reclaim when they
 * don't fit.  Mirrors try_charge_memcg() and the seed's (000) split of it.
 *
 * A charge first tries the thread's stock.  Otherwise it charges a batch of
 * CHARGE_BATCH pages on the counters, keeps the surplus in the stock, and is
 * done.  When a counter is at its max, what happens depends on the caller:
 *
 *  - charge_demand(): the folio a read needs.  Reclaim at least
 *    SWAP_CLUSTER_MAX pages from the group that refused, retry; drain the
 *    stocks once; wait for deferred frees when they would help; at most
 *    MAX_RECLAIM_RETRIES reclaim passes.  If it still fails the caller
 *    serves the read from a bounce buffer: a read never fails for lack of
 *    budget and the budget is never passed.
 *  - charge_speculative(): a readahead folio.  Never reclaims.  The window
 *    calls reclaim_for_batch() for the rest of itself instead (seed 000,
 *    patch 2), so one pass makes room for many folios.
 *  - charge_nowait(): never reclaims and counts no failure; for a caller
 *    that holds a lock reclaim takes (the kernel tier) and reclaims itself
 *    after dropping it.
 *
 * Every reclaim pass is counted (reclaim_passes): it is the unit the seed
 * measures, and the one thing batching is meant to reduce.
 */
#include <errno.h>
#include <stdlib.h>

#include "accounting.h"

static inline uint64_t stock_word(unsigned int id, unsigned long nr)
{
	return (uint64_t)id << 32 | (uint32_t)nr;
}

static inline unsigned int stock_id(uint64_t w)
{
	return (unsigned int)(w >> 32);
}

static inline unsigned long stock_nr(uint64_t w)
{
	return (uint32_t)w;
}

static struct stock *this_stock(struct budget *b)
{
	int slot = stat_thread_slot();

	/* the shared slot 0 gets no stock: its threads charge directly */
	return slot ? &b->stocks[slot] : NULL;
}

static void stock_uncharge(struct budget *b, uint64_t w)
{
	if (stock_id(w) && stock_nr(w))
		counter_uncharge(&b->by_id[stock_id(w)]->mem,
				 (long)stock_nr(w));
}

/* consume_stock(): take nr pre-charged pages if the stock holds g's. */
static bool consume_stock(struct group *g, unsigned long nr)
{
	struct stock *s = this_stock(g->budget);
	uint64_t w;

	if (!s || nr > CHARGE_BATCH)
		return false;
	w = atomic_load_explicit(&s->word, memory_order_relaxed);
	/* CAS, not a store: a drainer may exchange the word to 0 under us */
	while (stock_id(w) == g->id && stock_nr(w) >= nr)
		if (atomic_compare_exchange_weak(&s->word, &w, w - nr))
			return true;
	return false;
}

/* refill_stock(): keep nr charged pages of g; over the batch, give back. */
static void refill_stock(struct group *g, unsigned long nr)
{
	struct stock *s = this_stock(g->budget);
	uint64_t w;

	if (!s) {
		counter_uncharge(&g->mem, (long)nr);
		return;
	}
	w = atomic_load_explicit(&s->word, memory_order_relaxed);
	for (;;) {
		uint64_t next;

		if (stock_id(w) == g->id) {
			next = w + nr;
			if (stock_nr(next) > CHARGE_BATCH)
				next = 0;
		} else {
			next = stock_word(g->id, nr);
		}
		if (atomic_compare_exchange_weak(&s->word, &w, next))
			break;
	}
	if (stock_id(w) == g->id && stock_nr(w + nr) > CHARGE_BATCH)
		counter_uncharge(&g->mem, (long)(stock_nr(w) + nr));
	else if (stock_id(w) != g->id)
		stock_uncharge(g->budget, w);
}

void drain_all_stock(struct budget *b)
{
	for (int i = 0; i < STAT_SLOTS; i++)
		stock_uncharge(b, atomic_exchange(&b->stocks[i].word, 0));
}

long stock_pages(struct budget *b)
{
	long n = 0;

	for (int i = 0; i < STAT_SLOTS; i++)
		n += (long)stock_nr(atomic_load(&b->stocks[i].word));
	return n;
}

static struct group *group_of_counter(struct counter *c)
{
	return (struct group *)((char *)c - offsetof(struct group, mem));
}

static void kick_reclaimer(struct budget *b)
{
	pthread_mutex_lock(&b->reclaimer_lock);
	if (!b->reclaimer_kick) {
		b->reclaimer_kick = true;
		pthread_cond_signal(&b->reclaimer_cond);
	}
	pthread_mutex_unlock(&b->reclaimer_lock);
}

/* memory.high: the charge stands, the reclaimer pays the debt. */
static void check_high(struct group *g)
{
	for (struct group *i = g; i; i = i->parent) {
		if (counter_read(&i->mem) > atomic_load(&i->mem.high)) {
			group_event(i, EV_HIGH);
			if (g->budget->reclaimer_running)
				kick_reclaimer(g->budget);
			return;
		}
	}
}

/*
 * One reclaim pass on g: walk g's subtree round-robin, starting after the
 * group the previous pass started at, and shrink each group's LRU until nr
 * pages are freed or every group was visited once.
 */
struct walk_ctx {
	struct group **v;
	size_t n, cap;
};

static void collect_group(struct group *g, void *arg)
{
	struct walk_ctx *w = arg;

	if (w->n == w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 16;
		struct group **v = realloc(w->v, cap * sizeof(*v));

		if (!v)
			return;
		w->v = v;
		w->cap = cap;
	}
	w->v[w->n++] = g;
}

static unsigned long shrink_one(struct group *g, unsigned long nr)
{
	const struct budget_ops *ops = g->budget->ops;
	unsigned long scanned = 0, got;

	if (!ops || !ops->shrink)
		return 0;
	got = ops->shrink(g, nr, &scanned, g->budget->ops_priv);
	stat_mod(g, STAT_PGSCAN, (long)scanned);
	stat_mod(g, STAT_PGSTEAL, (long)got);
	return got;
}

unsigned long reclaim_pass(struct group *g, unsigned long nr, bool for_ra)
{
	struct walk_ctx w = {0};
	unsigned long got = 0;
	unsigned int start;

	if (nr < SWAP_CLUSTER_MAX)
		nr = SWAP_CLUSTER_MAX;
	stat_inc(g, STAT_RECLAIM_PASSES);
	if (for_ra)
		stat_inc(g, STAT_RECLAIM_PASSES_RA);

	pthread_mutex_lock(&g->budget->groups_lock);
	bool leaf = cds_list_empty(&g->children);
	pthread_mutex_unlock(&g->budget->groups_lock);
	if (leaf)
		return shrink_one(g, nr);

	group_walk(g, collect_group, &w);
	start = atomic_fetch_add_explicit(&g->reclaim_cursor, 1,
					  memory_order_relaxed);
	for (size_t i = 0; i < w.n && got < nr; i++)
		got += shrink_one(w.v[(start + i) % w.n], nr - got);
	free(w.v);
	return got;
}

static unsigned long deferred_pages(struct budget *b)
{
	return b->ops && b->ops->deferred ? b->ops->deferred(b->ops_priv) : 0;
}

/* Wait for a grace period and free the hot folio data that waits for it. */
static void expedite(struct group *g)
{
	struct budget *b = g->budget;

	if (b->ops && b->ops->expedite && deferred_pages(b)) {
		b->ops->expedite(b->ops_priv);
		stat_inc(g, STAT_EXPEDITED_GPS);
	}
}

/*
 * How much a foreground reclaim pass frees.  The kernel frees what the
 * charge needs (at least SWAP_CLUSTER_MAX); at the limit that means one pass
 * per readahead window, or per folio, for as long as the readers run.  With
 * headroom on (ra_reclaim=batch), a pass also frees 1/2^RECLAIM_HEADROOM_SHIFT
 * of the limit it hit (at most RECLAIM_HEADROOM_MAX pages), the way kswapd
 * reclaims up to a watermark: the charges that follow fit without another
 * pass, and reclaim passes become rare instead of per window.
 */
/* headroom: 1/16 of the limit; more means fewer passes, each evicting
 * more that may still be wanted */
#define RECLAIM_HEADROOM_SHIFT 4
/* at most 8 MiB a pass, so a big budget does not evict a lot at once */
#define RECLAIM_HEADROOM_MAX 2048

/* The pages a pass with headroom frees at a limit of max, at the least. */
unsigned long reclaim_headroom_of(unsigned long max)
{
	unsigned long room = max >> RECLAIM_HEADROOM_SHIFT;

	return room > RECLAIM_HEADROOM_MAX ? RECLAIM_HEADROOM_MAX : room;
}

unsigned long reclaim_headroom_pages(const struct group *g)
{
	return reclaim_headroom_of((unsigned long)counter_max(&g->mem));
}

static unsigned long reclaim_size(struct group *over, unsigned long nr)
{
	unsigned long room;

	if (!over->budget->cfg.reclaim_headroom)
		return nr;
	room = reclaim_headroom_pages(over);
	return nr > room ? nr : room;
}

enum charge_mode { CHARGE_DEMAND, CHARGE_SPECULATIVE, CHARGE_NOWAIT };

static int try_charge(struct group *g, unsigned long nr, enum charge_mode mode)
{
	unsigned long batch = nr > CHARGE_BATCH ? nr : CHARGE_BATCH;
	unsigned int passes = 0;
	bool drained = false, max_event = false;
	struct counter *fail;
	struct group *over;

	if (consume_stock(g, nr))
		return 0;
	if (mode == CHARGE_SPECULATIVE && g->budget->share &&
	    share_over(g->budget->share, counter_read(&g->budget->root.mem),
		       nr)) {
		stat_inc(g, STAT_CHARGE_FAIL_SPEC);
		return -ENOMEM;
	}
retry:
	if (counter_try_charge(&g->mem, (long)batch, &fail)) {
		if (batch > nr)
			refill_stock(g, batch - nr);
		check_high(g);
		if (g->budget->share)
			share_kick(g->budget->share,
				   counter_read(&g->budget->root.mem));
		return 0;
	}
	if (batch > nr) {
		batch = nr; /* retry with the exact size before reclaiming */
		goto retry;
	}
	over = group_of_counter(fail);
	if (mode == CHARGE_NOWAIT)
		return -ENOMEM;
	if (mode == CHARGE_SPECULATIVE) {
		stat_inc(g, STAT_CHARGE_FAIL_SPEC);
		return -ENOMEM;
	}
	if (!max_event) {
		group_event(over, EV_MAX);
		max_event = true;
	}
	if (passes < MAX_RECLAIM_RETRIES) {
		passes++;
		reclaim_pass(over, reclaim_size(over, nr), false);
		if ((unsigned long)counter_margin(&over->mem) >= nr)
			goto retry;
		/* pages waiting for a grace period are as good as free */
		if (deferred_pages(g->budget)) {
			expedite(over);
			if ((unsigned long)counter_margin(&over->mem) >= nr)
				goto retry;
		}
		if (!drained) {
			drain_all_stock(g->budget);
			drained = true;
		}
		goto retry;
	}
	stat_inc(g, STAT_CHARGE_FAIL_DEMAND);
	return -ENOMEM;
}

int charge_demand(struct group *g, unsigned long nr)
{
	return try_charge(g, nr, CHARGE_DEMAND);
}

int charge_speculative(struct group *g, unsigned long nr)
{
	return try_charge(g, nr, CHARGE_SPECULATIVE);
}

int charge_nowait(struct group *g, unsigned long nr)
{
	return try_charge(g, nr, CHARGE_NOWAIT);
}

void uncharge(struct group *g, unsigned long nr)
{
	/*
	 * Straight to the counters, not the stock: the stock is for charges
	 * about to happen on this thread, and frees come from any thread.
	 */
	counter_uncharge(&g->mem, (long)nr);
}

/* The nearest group from g up whose margin is below nr, or NULL. */
struct group *group_over_limit(struct group *g, unsigned long nr)
{
	for (; g; g = g->parent)
		if ((unsigned long)counter_margin(&g->mem) < nr)
			return g;
	return NULL;
}

/*
 * mem_cgroup_reclaim_for_batch(): make room for the rest of a window at
 * once.  Reclaim nr at the nearest ancestor short of room; if others took
 * that room already, drain the stocks, and if still short reclaim nr once
 * more.  At most two passes; false when no reclaim was needed.
 */
bool reclaim_for_batch(struct group *g, unsigned long nr, bool for_ra)
{
	struct group *m = group_over_limit(g, nr);

	if (!m)
		return false;
	reclaim_pass(m, reclaim_size(m, nr), for_ra);
	if ((unsigned long)counter_margin(&m->mem) < nr) {
		drain_all_stock(g->budget);
		if ((unsigned long)counter_margin(&m->mem) < nr)
			reclaim_pass(m, reclaim_size(m, nr), for_ra);
	}
	return true;
}

/* Seed 003: a decaying batch, a quarter of what remains, at least 32. */
unsigned long reclaim_batch_size(unsigned long target, unsigned long reclaimed)
{
	unsigned long batch = (target - reclaimed) / 4;

	return batch < SWAP_CLUSTER_MAX ? SWAP_CLUSTER_MAX : batch;
}

/*
 * Whether this thread's reclaim was asked for by the user (a write to
 * memory.reclaim or memory.max, between reclaim_user_begin() and _end()),
 * as the kernel's scan_control.proactive: only such reclaim takes what the
 * cache's user holds beyond its folios (the cache's shrink_other).  A
 * charge's reclaim, or a share's, leaves that alone: its owner gives it
 * back on its own terms when a charge of its needs room.
 */
static __thread bool user_asked;

bool reclaim_user_asked(void)
{
	return user_asked;
}

bool reclaim_user_begin(void)
{
	bool was = user_asked;

	user_asked = true;
	return was;
}

void reclaim_user_end(bool was)
{
	user_asked = was;
}

/*
 * memory.reclaim: free nr_pages from g.  -EAGAIN after MAX_RECLAIM_RETRIES
 * passes that freed nothing.  The stocks are drained before the last try,
 * as the kernel drains its per-CPU LRU batches.
 */
int reclaim_proactive(struct group *g, unsigned long nr_pages)
{
	unsigned long reclaimed = 0;
	unsigned int zero_passes = 0;

	while (reclaimed < nr_pages) {
		unsigned long batch = reclaim_batch_size(nr_pages, reclaimed);
		unsigned long got;

		if (zero_passes == MAX_RECLAIM_RETRIES - 1)
			drain_all_stock(g->budget);
		got = reclaim_pass(g, batch, false);
		if (!got && deferred_pages(g->budget)) {
			unsigned long before = (unsigned long)counter_read(&g->mem);

			expedite(g);
			long after = counter_read(&g->mem);
			if ((long)before > after)
				got = before - (unsigned long)after;
		}
		if (!got && ++zero_passes >= MAX_RECLAIM_RETRIES)
			return -EAGAIN;
		reclaimed += got;
	}
	/* hot folios wait for a grace period: free them before returning */
	expedite(g);
	return 0;
}

/*
 * memory.max: usage never exceeds max, so a lower limit is reached by
 * ratcheting: set max to the current usage (new charges then fail or
 * reclaim), reclaim, lower it to the new usage, until it reaches the target.
 * If the pages are pinned and nothing can be freed, the old limit comes back
 * and the write fails with -EBUSY (mem_cgroup_resize_max() of cgroup v1).
 */
int group_set_max(struct group *g, long max_pages)
{
	long old = counter_max(&g->mem);
	unsigned int zero_passes = 0;
	bool drained = false;

	if (max_pages < 0)
		return -EINVAL;
	if (max_pages > COUNTER_MAX)
		max_pages = COUNTER_MAX;
	for (;;) {
		long usage = counter_read(&g->mem);
		long target = usage > max_pages ? usage : max_pages;

		if (counter_set_max(&g->mem, target) != 0)
			continue; /* usage grew past target meanwhile */
		if (target == max_pages)
			return 0;
		if (!drained) {
			drain_all_stock(g->budget);
			drained = true;
			continue;
		}
		if (!reclaim_pass(g, (unsigned long)(usage - max_pages),
				  false)) {
			expedite(g);
			if (++zero_passes >= MAX_RECLAIM_RETRIES) {
				counter_set_max(&g->mem, old);
				return -EBUSY;
			}
		}
	}
}

int group_set_high(struct group *g, long high_pages)
{
	if (high_pages < 0)
		return -EINVAL;
	if (high_pages > COUNTER_MAX)
		high_pages = COUNTER_MAX;
	counter_set_high(&g->mem, high_pages);
	if (counter_read(&g->mem) > high_pages && g->budget->reclaimer_running)
		kick_reclaimer(g->budget);
	return 0;
}
