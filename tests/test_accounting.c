// SPDX-License-Identifier: MIT
/*
 * accounting: hierarchical counters under concurrency, the charge stock,
 * reclaim_for_batch's choice of ancestor and its two passes, the decaying
 * batch of proactive reclaim, and a demand charge that gives up when
 * everything is pinned.  Reclaim is a fake: each group has a pool of
 * reclaimable pages that shrink() frees and uncharges.
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "../accounting/accounting.h"
#include "check.h"

#define MAX_GROUPS 16

struct fake {
	atomic_long pool[MAX_GROUPS + 2]; /* reclaimable pages, by group id */
	atomic_int calls[MAX_GROUPS + 2];
	unsigned long asked[64];
	atomic_int nasked;
	bool pinned; /* shrink frees nothing */
};

static unsigned long fake_shrink(struct group *g, unsigned long nr,
				 unsigned long *scanned, void *priv)
{
	struct fake *f = priv;
	long have, take;
	int k = atomic_fetch_add(&f->nasked, 1);

	if (k < 64)
		f->asked[k] = nr;
	atomic_fetch_add(&f->calls[g->id], 1);
	*scanned += nr;
	if (f->pinned)
		return 0;
	have = atomic_load(&f->pool[g->id]);
	do {
		take = have < (long)nr ? have : (long)nr;
	} while (!atomic_compare_exchange_weak(&f->pool[g->id], &have,
					       have - take));
	uncharge(g, (unsigned long)take);
	return (unsigned long)take;
}

static const struct budget_ops fake_ops = {.shrink = fake_shrink};

static void budget_fake(struct budget *b, struct fake *f, long max)
{
	struct budget_config cfg = {
		.max_pages = (unsigned long)max,
		.high_pages = COUNTER_MAX,
		.group_max_pages = COUNTER_MAX,
		.group_high_pages = COUNTER_MAX,
	};

	memset(f, 0, sizeof(*f));
	CHECK_EQ(budget_init(b, &cfg, &fake_ops, f), 0);
}

/* Fill g with n reclaimable pages (charged, in the fake pool). */
static void fill(struct fake *f, struct group *g, long n)
{
	CHECK_EQ(counter_try_charge(&g->mem, n, NULL), 1);
	atomic_fetch_add(&f->pool[g->id], n);
}

struct storm {
	struct budget *b;
	struct group *leaves[4];
	atomic_long live[4];   /* pages held by leaf, by the threads' tally */
	atomic_long live_mid[2], live_root; /* the same, by a, b and root */
	atomic_long refused;
	atomic_bool stop;
	unsigned long long seed;
};

/* After a charge succeeds (n > 0), or before its uncharge (n < 0). */
static void live_add(struct storm *s, int leaf, long n)
{
	atomic_fetch_add(&s->live[leaf], n);
	atomic_fetch_add(&s->live_mid[leaf / 2], n);
	atomic_fetch_add(&s->live_root, n);
}

static void *storm_thread(void *arg)
{
	struct storm *s = arg;
	unsigned long long seed = s->seed + (unsigned long long)pthread_self();
	long held[4][64] = {{0}};
	int nheld[4] = {0};

	for (int i = 0; i < 50000; i++) {
		int l = (int)(test_rand(&seed) % 4);
		struct group *g = s->leaves[l];

		if (nheld[l] < 64 && test_rand(&seed) % 3) {
			long n = 1 + (long)(test_rand(&seed) % 40);

			if (counter_try_charge(&g->mem, n, NULL)) {
				held[l][nheld[l]++] = n;
				live_add(s, l, n);
			} else {
				atomic_fetch_add(&s->refused, 1);
			}
		} else if (nheld[l]) {
			long n = held[l][--nheld[l]];

			live_add(s, l, -n);
			counter_uncharge(&g->mem, n);
		}
	}
	for (int l = 0; l < 4; l++)
		while (nheld[l]) {
			long n = held[l][--nheld[l]];

			live_add(s, l, -n);
			counter_uncharge(&s->leaves[l]->mem, n);
		}
	return NULL;
}

/*
 * The pages the threads hold, by their own tally (added after a charge
 * succeeds, taken off before the uncharge), never pass a limit: at every
 * instant held <= usage <= max, whatever the counter's representation.
 */
static void *storm_watch(void *arg)
{
	struct storm *s = arg;

	while (!atomic_load(&s->stop)) {
		for (int l = 0; l < 3; l++)
			CHECK(atomic_load(&s->live[l]) <= 500);
		CHECK(atomic_load(&s->live_mid[0]) <= 1200);
		CHECK(atomic_load(&s->live_mid[1]) <= 1200);
		CHECK(atomic_load(&s->live_root) <= 3000);
	}
	return NULL;
}

/* 8 threads charge and uncharge at random on a two-level tree. */
static void test_counter_storm(void)
{
	struct budget b;
	struct fake f;
	struct storm s = {.b = &b, .seed = 42};
	pthread_t t[8], w;
	struct group *a, *bb;

	budget_fake(&b, &f, 3000);
	b.cfg.group_max_pages = 1200;
	a = group_lookup_or_create(&b, &b.root, "a");
	bb = group_lookup_or_create(&b, &b.root, "b");
	b.cfg.group_max_pages = 500;
	s.leaves[0] = group_lookup_or_create(&b, a, "a1");
	s.leaves[1] = group_lookup_or_create(&b, a, "a2");
	s.leaves[2] = group_lookup_or_create(&b, bb, "b1");
	b.cfg.group_max_pages = COUNTER_MAX;
	s.leaves[3] = group_lookup_or_create(&b, bb, "b2");
	pthread_create(&w, NULL, storm_watch, &s);
	for (int i = 0; i < 8; i++)
		pthread_create(&t[i], NULL, storm_thread, &s);
	for (int i = 0; i < 8; i++)
		pthread_join(t[i], NULL);
	atomic_store(&s.stop, true);
	pthread_join(w, NULL);
	for (int l = 0; l < 4; l++)
		CHECK_EQ(counter_read(&s.leaves[l]->mem), 0);
	CHECK_EQ(counter_read(&a->mem), 0);
	CHECK_EQ(counter_read(&b.root.mem), 0);
	CHECK(atomic_load(&s.refused) > 0);
	/* refusals are counted where they happened */
	CHECK(atomic_load(&b.root.mem.failcnt) +
		      atomic_load(&a->mem.failcnt) +
		      atomic_load(&bb->mem.failcnt) +
		      atomic_load(&s.leaves[0]->mem.failcnt) +
		      atomic_load(&s.leaves[1]->mem.failcnt) +
		      atomic_load(&s.leaves[2]->mem.failcnt) ==
	      atomic_load(&s.refused));
	CHECK(atomic_load(&b.root.mem.peak) > 0);
	CHECK(atomic_load(&b.root.mem.peak) <= 3000);
	CHECK(atomic_load(&a->mem.peak) <= 1200);
	CHECK(atomic_load(&s.leaves[0]->mem.peak) <= 500);
	budget_destroy(&b);
}

/* A refused charge leaves every level as it was. */
static void test_counter_undo(void)
{
	struct budget b;
	struct fake f;
	struct group *c;
	struct counter *fail = NULL;

	budget_fake(&b, &f, 100);
	b.cfg.group_max_pages = 50;
	c = group_lookup_or_create(&b, &b.root, "c");
	CHECK(counter_try_charge(&c->mem, 40, NULL));
	CHECK(!counter_try_charge(&c->mem, 20, &fail));
	CHECK(fail == &c->mem);
	CHECK_EQ(counter_read(&c->mem), 40);
	CHECK_EQ(counter_read(&b.root.mem), 40);
	CHECK(counter_try_charge(&b.root.mem, 55, NULL));
	CHECK(!counter_try_charge(&c->mem, 10, &fail));
	CHECK(fail == &b.root.mem);
	CHECK_EQ(counter_read(&c->mem), 40);
	CHECK_EQ(atomic_load(&c->mem.failcnt), 1);
	CHECK_EQ(atomic_load(&b.root.mem.failcnt), 1);
	budget_destroy(&b);
}

static void test_stock(void)
{
	struct budget b;
	struct fake f;

	budget_fake(&b, &f, 1000);
	CHECK_EQ(charge_demand(&b.root, 1), 0);
	/* one page used, the rest of the batch in this thread's stock */
	CHECK_EQ(counter_read(&b.root.mem), CHARGE_BATCH);
	CHECK_EQ(stock_pages(&b), CHARGE_BATCH - 1);
	/* consumed without touching the counters */
	CHECK_EQ(charge_demand(&b.root, 10), 0);
	CHECK_EQ(counter_read(&b.root.mem), CHARGE_BATCH);
	CHECK_EQ(stock_pages(&b), CHARGE_BATCH - 11);
	drain_all_stock(&b);
	CHECK_EQ(stock_pages(&b), 0);
	CHECK_EQ(counter_read(&b.root.mem), 11);
	uncharge(&b.root, 11);
	CHECK_EQ(counter_read(&b.root.mem), 0);
	budget_destroy(&b);
}

struct drain_arg {
	struct budget *b;
	pthread_barrier_t *bar;
};

static void *stock_filler(void *arg)
{
	struct drain_arg *d = arg;

	CHECK_EQ(charge_demand(&d->b->root, 1), 0);
	pthread_barrier_wait(d->bar); /* stock filled */
	pthread_barrier_wait(d->bar); /* drained by the main thread */
	return NULL;
}

/* Another thread's stock is drained by an atomic exchange. */
static void test_stock_drain_remote(void)
{
	struct budget b;
	struct fake f;
	pthread_barrier_t bar;
	struct drain_arg d = {&b, &bar};
	pthread_t t;

	budget_fake(&b, &f, 1000);
	pthread_barrier_init(&bar, NULL, 2);
	pthread_create(&t, NULL, stock_filler, &d);
	pthread_barrier_wait(&bar);
	CHECK_EQ(stock_pages(&b), CHARGE_BATCH - 1);
	drain_all_stock(&b);
	CHECK_EQ(counter_read(&b.root.mem), 1);
	pthread_barrier_wait(&bar);
	pthread_join(t, NULL);
	pthread_barrier_destroy(&bar);
	budget_destroy(&b);
}

/* reclaim_for_batch reclaims at the nearest ancestor short of room. */
static void test_reclaim_for_batch(void)
{
	struct budget b;
	struct fake f;
	struct group *mid, *leaf, *other;

	budget_fake(&b, &f, 10000);
	b.cfg.group_max_pages = 1000;
	mid = group_lookup_or_create(&b, &b.root, "mid");
	b.cfg.group_max_pages = COUNTER_MAX;
	leaf = group_lookup_or_create(&b, mid, "leaf");

	/* plenty of room everywhere: no reclaim, false */
	CHECK(!reclaim_for_batch(leaf, 100, true));
	CHECK_EQ(stat_read(&b.root, STAT_RECLAIM_PASSES), 0);

	/* mid nearly full: reclaim there, once, for the whole batch */
	fill(&f, leaf, 950);
	CHECK(reclaim_for_batch(leaf, 100, true));
	CHECK_EQ(atomic_load(&f.calls[leaf->id]), 1);
	CHECK_EQ(f.asked[0], 100);
	CHECK_EQ(stat_read(mid, STAT_RECLAIM_PASSES), 1);
	CHECK_EQ(stat_read(mid, STAT_RECLAIM_PASSES_RA), 1);
	CHECK_EQ(stat_read(leaf, STAT_RECLAIM_PASSES), 0);
	CHECK(counter_margin(&mid->mem) >= 100);

	/* nothing reclaimable: two passes, then it stops */
	f.pinned = true;
	fill(&f, leaf, (long)counter_margin(&mid->mem) - 10);
	CHECK(reclaim_for_batch(leaf, 100, true));
	CHECK_EQ(stat_read(mid, STAT_RECLAIM_PASSES), 3);
	budget_destroy(&b);

	/* the root short of room while mid is not: the root is chosen */
	budget_fake(&b, &f, 1000);
	b.cfg.group_max_pages = 800;
	mid = group_lookup_or_create(&b, &b.root, "mid");
	leaf = group_lookup_or_create(&b, mid, "leaf");
	other = group_lookup_or_create(&b, &b.root, "other");
	fill(&f, leaf, 300);
	fill(&f, other, 680);
	CHECK(reclaim_for_batch(leaf, 50, true));
	CHECK_EQ(stat_read(&b.root, STAT_RECLAIM_PASSES), 1);
	CHECK_EQ(stat_read(mid, STAT_RECLAIM_PASSES), 0);
	CHECK(counter_margin(&b.root.mem) >= 50);
	budget_destroy(&b);
}

/* The decaying batch of seed 003: a quarter of what remains, at least 32. */
static void test_decaying_batch(void)
{
	struct budget b;
	struct fake f;
	unsigned long want[] = {250, 187, 140, 105, 79, 59, 45, 33, 32};
	unsigned long reclaimed = 0;

	for (int i = 0; i < 9; i++) {
		CHECK_EQ(reclaim_batch_size(1000, reclaimed), want[i]);
		reclaimed += want[i];
	}
	CHECK_EQ(reclaim_batch_size(1000, 990), 32);

	budget_fake(&b, &f, 100000);
	fill(&f, &b.root, 5000);
	CHECK_EQ(reclaim_proactive(&b.root, 1000), 0);
	/* the requests follow the sequence: each pass frees what it asks */
	for (int i = 0; i < 8; i++)
		CHECK_EQ(f.asked[i], want[i]);
	/* the 32-page floor overshoots a little, as the kernel's does */
	CHECK_EQ(counter_read(&b.root.mem), 5000 - 1026);
	/* nothing to free: EAGAIN after 16 passes that freed nothing */
	f.pinned = true;
	atomic_store(&f.nasked, 0);
	CHECK_EQ(reclaim_proactive(&b.root, 1000), -EAGAIN);
	CHECK_EQ(atomic_load(&f.nasked), MAX_RECLAIM_RETRIES);
	budget_destroy(&b);
}

/* Demand charges reclaim; when all is pinned they fail after 16 passes. */
static void test_charge_demand(void)
{
	struct budget b;
	struct fake f;

	budget_fake(&b, &f, 200);
	fill(&f, &b.root, 190);
	CHECK_EQ(charge_demand(&b.root, 32), 0);
	CHECK(stat_read(&b.root, STAT_RECLAIM_PASSES) >= 1);
	CHECK(counter_read(&b.root.mem) <= 200);
	drain_all_stock(&b);
	/* speculative charges never reclaim */
	fill(&f, &b.root, (long)counter_margin(&b.root.mem));
	atomic_store(&f.nasked, 0);
	CHECK_EQ(charge_speculative(&b.root, 8), -ENOMEM);
	CHECK_EQ(atomic_load(&f.nasked), 0);
	CHECK_EQ(stat_read(&b.root, STAT_CHARGE_FAIL_SPEC), 1);
	/* pinned: at most MAX_RECLAIM_RETRIES passes, then -ENOMEM */
	f.pinned = true;
	CHECK_EQ(charge_demand(&b.root, 8), -ENOMEM);
	CHECK_EQ(atomic_load(&f.nasked), MAX_RECLAIM_RETRIES);
	CHECK_EQ(stat_read(&b.root, STAT_CHARGE_FAIL_DEMAND), 1);
	CHECK_EQ(group_event_read(&b.root, EV_MAX), 2);
	CHECK(counter_read(&b.root.mem) <= 200);
	budget_destroy(&b);
}

/* memory.max below usage reclaims down to it; usage never passes max. */
static void test_set_max(void)
{
	struct budget b;
	struct fake f;

	budget_fake(&b, &f, 1000);
	fill(&f, &b.root, 900);
	CHECK_EQ(group_set_max(&b.root, 500), 0);
	CHECK(counter_read(&b.root.mem) <= 500);
	CHECK_EQ(counter_max(&b.root.mem), 500);
	f.pinned = true;
	CHECK_EQ(group_set_max(&b.root, 100), -EBUSY);
	CHECK_EQ(counter_max(&b.root.mem), 500);
	CHECK_EQ(group_set_max(&b.root, COUNTER_MAX), 0);
	budget_destroy(&b);
}

/* Stats: every update lands in the group and all its ancestors. */
static void *stat_thread(void *arg)
{
	struct group *g = arg;

	for (int i = 0; i < 100000; i++)
		stat_inc(g, STAT_PGFAULT);
	return NULL;
}

static void test_stats_hierarchy(void)
{
	struct budget b;
	struct fake f;
	struct group *g[4];
	pthread_t t[8];
	char buf[8192];

	budget_fake(&b, &f, 1000);
	g[0] = group_lookup_or_create(&b, &b.root, "x");
	g[1] = group_lookup_or_create(&b, g[0], "y");
	g[2] = group_lookup_or_create(&b, g[1], "z");
	g[3] = group_lookup_or_create(&b, &b.root, "w");
	for (int i = 0; i < 8; i++)
		pthread_create(&t[i], NULL, stat_thread, g[i % 4]);
	for (int i = 0; i < 8; i++)
		pthread_join(t[i], NULL);
	CHECK_EQ(stat_read(g[2], STAT_PGFAULT), 200000);
	CHECK_EQ(stat_read(g[1], STAT_PGFAULT), 400000);
	CHECK_EQ(stat_read(g[0], STAT_PGFAULT), 600000);
	CHECK_EQ(stat_read(g[3], STAT_PGFAULT), 200000);
	CHECK_EQ(stat_read(&b.root, STAT_PGFAULT), 800000);
	stat_format(&b.root, buf, sizeof(buf));
	CHECK(strstr(buf, "pgfault 800000\n") != NULL);
	CHECK(group_find(&b, "x/y/z") == g[2]);
	CHECK(group_find(&b, "x/q") == NULL);
	group_path(g[2], buf, sizeof(buf));
	CHECK(strcmp(buf, "x/y/z") == 0);
	budget_destroy(&b);
}

static void test_parse_size(void)
{
	uint64_t v;

	CHECK_EQ(parse_size("64M", &v, false), 0);
	CHECK_EQ(v, 64ull << 20);
	CHECK_EQ(parse_size("1.5G", &v, false), 0);
	CHECK_EQ(v, 3ull << 29);
	CHECK_EQ(parse_size("4096\n", &v, false), 0);
	CHECK_EQ(v, 4096);
	CHECK_EQ(parse_size("128KiB", &v, false), 0);
	CHECK_EQ(v, 128 << 10);
	CHECK_EQ(parse_size("max", &v, true), 0);
	CHECK(v == UINT64_MAX);
	CHECK_EQ(parse_size("max", &v, false), -EINVAL);
	CHECK_EQ(parse_size("-1", &v, false), -EINVAL);
	CHECK_EQ(parse_size("12Q", &v, false), -EINVAL);
	CHECK_EQ(parse_size("", &v, false), -EINVAL);
	CHECK_EQ(parse_size("99999999T", &v, false), -ERANGE);
}

int main(void)
{
	RUN(test_counter_undo);
	RUN(test_counter_storm);
	RUN(test_stock);
	RUN(test_stock_drain_remote);
	RUN(test_reclaim_for_batch);
	RUN(test_decaying_batch);
	RUN(test_charge_demand);
	RUN(test_set_max);
	RUN(test_stats_hierarchy);
	RUN(test_parse_size);
	return check_done();
}
