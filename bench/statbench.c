// SPDX-License-Identifier: MIT
/*
 * zfolio-statbench: the cost of the accounting itself, like seed 004's
 * tables.  ns per statistic update for a group at depth 1, 4, 8, 16, and
 * ns per full read of every statistic (memory.stat), with 1 and 2 threads.
 * Beside it, the same updates done as one shared atomic add per level (what
 * a "global atomic" design pays), to show what per-thread slots save.
 *
 *   zfolio-statbench [iterations]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../accounting/accounting.h"

static const struct budget_ops no_ops;

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

struct job {
	struct group *g;
	long iters;
	int mode; /* 0 update, 1 shared atomic, 2 full read */
	pthread_barrier_t *bar;
	double ns;
};

static long sink;

static void *run(void *arg)
{
	struct job *j = arg;
	long v[NR_STATS];
	double t;

	pthread_barrier_wait(j->bar);
	t = now();
	for (long i = 0; i < j->iters; i++) {
		switch (j->mode) {
		case 0:
			stat_mod(j->g, STAT_PGFAULT, 1);
			break;
		case 1:
			for (struct group *g = j->g; g; g = g->parent)
				atomic_fetch_add_explicit(&g->events[EV_HIGH],
							  1,
							  memory_order_relaxed);
			break;
		case 2:
			stat_read_all(j->g, v);
			sink += v[STAT_PGFAULT];
			break;
		}
	}
	j->ns = (now() - t) / (double)j->iters;
	return NULL;
}

static double measure(struct group *g, int mode, int threads, long iters)
{
	pthread_t t[2];
	struct job j[2];
	pthread_barrier_t bar;
	double worst = 0;

	pthread_barrier_init(&bar, NULL, (unsigned)threads);
	for (int i = 0; i < threads; i++) {
		j[i] = (struct job){g, iters, mode, &bar, 0};
		pthread_create(&t[i], NULL, run, &j[i]);
	}
	for (int i = 0; i < threads; i++) {
		pthread_join(t[i], NULL);
		if (j[i].ns > worst)
			worst = j[i].ns;
	}
	pthread_barrier_destroy(&bar);
	return worst;
}

int main(int argc, char **argv)
{
	long iters = argc > 1 ? atol(argv[1]) : 20000000;
	struct budget_config cfg = {.max_pages = 1 << 20,
				    .high_pages = COUNTER_MAX,
				    .group_max_pages = COUNTER_MAX,
				    .group_high_pages = COUNTER_MAX};
	struct budget b;
	struct group *chain[17];
	static const int depths[] = {1, 4, 8, 16};

	if (budget_init(&b, &cfg, &no_ops, NULL))
		return 1;
	chain[0] = &b.root;
	for (int d = 1; d <= 16; d++) {
		char name[16];

		snprintf(name, sizeof(name), "d%d", d);
		chain[d] = group_lookup_or_create(&b, chain[d - 1], name);
	}
	printf("zfolio-statbench: %ld iterations per thread, %d statistics, "
	       "%d thread slots\n\n",
	       iters, NR_STATS, STAT_SLOTS);
	printf("%-32s %10s %10s\n", "ns per operation", "1 thread",
	       "2 threads");
	for (int i = 0; i < 4; i++) {
		int d = depths[i];

		printf("update, depth %-2d (per-thread)   %10.2f %10.2f\n", d,
		       measure(chain[d - 1], 0, 1, iters),
		       measure(chain[d - 1], 0, 2, iters));
	}
	for (int i = 0; i < 4; i++) {
		int d = depths[i];

		printf("update, depth %-2d (shared atomic)%10.2f %10.2f\n", d,
		       measure(chain[d - 1], 1, 1, iters / 4),
		       measure(chain[d - 1], 1, 2, iters / 4));
	}
	printf("full read of memory.stat         %10.1f %10.1f\n",
	       measure(&b.root, 2, 1, iters / 1000),
	       measure(&b.root, 2, 2, iters / 1000));
	printf("\nexact: root pgfault = %ld (expected %ld)\n",
	       stat_read(&b.root, STAT_PGFAULT), 3 * 4 * iters);
	budget_destroy(&b);
	return sink == -1;
}
