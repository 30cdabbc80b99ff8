// SPDX-License-Identifier: MIT
/*
 * Statistics: hierarchical per-thread counters (design B of seed 004).
 *
 * Every thread that updates a statistic owns a slot, a row of NR_STATS
 * longs in every group.  An update adds to the thread's slot in its group
 * and in every ancestor: depth plain stores, no atomics, no shared cache
 * lines between threads.  A read sums one item over the slots.  So a read
 * is exact at the moment it is made and nothing is ever flushed, on a timer
 * or otherwise; seed 001 measured what a forced flush before every limit
 * check costs, and seed 004 what stale stats cause (premature OOM).  Limit
 * checks never look here: they use the page counters.
 *
 * Slot 0 is shared by the threads beyond STAT_SLOTS - 1 and is updated with
 * atomic adds.  A slot is written by its owner only (relaxed load + store),
 * and read by anyone with relaxed loads; a 64-bit aligned long never tears.
 */
#include <string.h>

#include "accounting.h"

const char *const group_event_names[NR_GROUP_EVENTS] = {
	[EV_HIGH] = "high",
	[EV_MAX] = "max",
};

static atomic_int next_slot = 1;
static __thread int this_slot = -1;

int stat_thread_slot(void)
{
	if (this_slot < 0) {
		int s = atomic_fetch_add_explicit(&next_slot, 1,
						  memory_order_relaxed);
		this_slot = s < STAT_SLOTS ? s : 0;
	}
	return this_slot;
}

void stat_mod(struct group *g, enum stat_item item, long delta)
{
	int slot = stat_thread_slot();

	for (; g; g = g->parent) {
		long *p = &g->stats[slot][item];

		if (slot == 0) {
			__atomic_fetch_add(p, delta, __ATOMIC_RELAXED);
		} else {
			/* single writer: a plain add the readers may race */
			long v = __atomic_load_n(p, __ATOMIC_RELAXED);
			__atomic_store_n(p, v + delta, __ATOMIC_RELAXED);
		}
	}
}

long stat_read(const struct group *g, enum stat_item item)
{
	long sum = 0;

	for (int s = 0; s < STAT_SLOTS; s++)
		sum += __atomic_load_n(&g->stats[s][item], __ATOMIC_RELAXED);
	return sum;
}

void stat_read_all(const struct group *g, long out[NR_STATS])
{
	memset(out, 0, sizeof(long) * NR_STATS);
	for (int s = 0; s < STAT_SLOTS; s++)
		for (int i = 0; i < NR_STATS; i++)
			out[i] += __atomic_load_n(&g->stats[s][i],
						  __ATOMIC_RELAXED);
}

void group_event(struct group *g, enum group_event ev)
{
	for (; g; g = g->parent)
		atomic_fetch_add_explicit(&g->events[ev], 1,
					  memory_order_relaxed);
}

long group_event_read(const struct group *g, enum group_event ev)
{
	return atomic_load_explicit(&g->events[ev], memory_order_relaxed);
}

static long stat_value_printed(enum stat_item i, const long v[NR_STATS])
{
	long x = v[i] < 0 ? 0 : v[i];

	switch (stat_descs[i].kind) {
	case STAT_GAUGE: /* pages, printed in bytes like memory.stat */
		return x * (long)ZF_PAGE_SIZE;
	case STAT_EVENT:
		return x;
	case STAT_DERIVED:
		break;
	}
	switch (i) {
	case STAT_READAROUND_WINDOW_PAGES:
		return v[STAT_READAROUND_WINDOWS]
			       ? v[STAT_READAROUND_PAGES] /
					 v[STAT_READAROUND_WINDOWS]
			       : 0;
	default:
		return 0;
	}
}

int stat_format(const struct group *g, char *buf, size_t len)
{
	struct text t = {buf, len, 0};
	long v[NR_STATS];

	stat_read_all(g, v);
	for (int i = 0; i < NR_STATS; i++)
		text_printf(&t, "%s %ld\n", stat_descs[i].name,
			    stat_value_printed(i, v));
	return (int)t.off;
}

int events_format(const struct group *g, char *buf, size_t len)
{
	struct text t = {buf, len, 0};

	text_printf(&t, "low 0\n");
	text_printf(&t, "high %ld\n", group_event_read(g, EV_HIGH));
	text_printf(&t, "max %ld\n", group_event_read(g, EV_MAX));
	text_printf(&t, "oom 0\noom_kill 0\n");
	text_printf(&t, "failcnt %ld\n", atomic_load(&g->mem.failcnt));
	text_printf(&t, "reclaim_passes %ld\n",
		    stat_read(g, STAT_RECLAIM_PASSES));
	text_printf(&t, "bounce_reads %ld\n", stat_read(g, STAT_BOUNCE_READS));
	return (int)t.off;
}

/* A limit in bytes, or null for "max". */
static void json_limit(struct text *t, const char *key, long pages)
{
	if (pages >= COUNTER_MAX)
		text_printf(t, ", \"%s\": null", key);
	else
		text_printf(t, ", \"%s\": %ld", key, pages * (long)ZF_PAGE_SIZE);
}

int stat_format_json(const struct group *g, char *buf, size_t len)
{
	struct text t = {buf, len, 0};
	long v[NR_STATS], cur, max;

	/* current and max from one instant: a reader may compare them */
	counter_snapshot(&g->mem, &cur, &max);
	stat_read_all(g, v);
	text_printf(&t, "{\"current\": %ld, \"peak\": %ld",
		    cur * (long)ZF_PAGE_SIZE,
		    atomic_load(&g->mem.peak) * (long)ZF_PAGE_SIZE);
	json_limit(&t, "max", max);
	json_limit(&t, "high", atomic_load(&g->mem.high));
	for (int e = 0; e < NR_GROUP_EVENTS; e++)
		text_printf(&t, ", \"events.%s\": %ld", group_event_names[e],
			    group_event_read(g, e));
	for (int i = 0; i < NR_STATS; i++)
		text_printf(&t, ", \"%s\": %ld", stat_descs[i].name,
			    stat_value_printed(i, v));
	text_printf(&t, "}\n");
	return (int)t.off;
}
