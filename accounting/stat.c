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
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accounting.h"

const struct stat_desc stat_descs[NR_STATS] = {
#define ZF_STAT_DESC(id, n, k, d) [STAT_##id] = {n, STAT_##k, d},
#define STAT_gauge STAT_GAUGE
#define STAT_event STAT_EVENT
	ZF_STAT_LIST(ZF_STAT_DESC)
#undef ZF_STAT_DESC
};

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

/* Appends to buf at *off; keeps *off within len and NUL-terminated. */
static void buf_printf(char *buf, size_t len, size_t *off, const char *fmt,
		       ...) __attribute__((format(printf, 4, 5)));

static void buf_printf(char *buf, size_t len, size_t *off, const char *fmt,
		       ...)
{
	va_list ap;
	int n;

	if (*off >= len)
		return;
	va_start(ap, fmt);
	n = vsnprintf(buf + *off, len - *off, fmt, ap);
	va_end(ap);
	if (n > 0)
		*off = *off + (size_t)n < len ? *off + (size_t)n : len - 1;
}

static long stat_value_printed(enum stat_item i, long v)
{
	/* gauges count pages and print bytes, like memory.stat */
	if (v < 0)
		v = 0;
	return stat_descs[i].kind == STAT_GAUGE ? v * (long)ZF_PAGE_SIZE : v;
}

int stat_format(const struct group *g, char *buf, size_t len)
{
	long v[NR_STATS];
	size_t off = 0;

	stat_read_all(g, v);
	for (int i = 0; i < NR_STATS; i++)
		buf_printf(buf, len, &off, "%s %ld\n", stat_descs[i].name,
			   stat_value_printed(i, v[i]));
	/* derived: the average read-around window so far */
	buf_printf(buf, len, &off, "readaround_window_pages %ld\n",
		   v[STAT_READAROUND_WINDOWS]
			   ? v[STAT_READAROUND_PAGES] /
				     v[STAT_READAROUND_WINDOWS]
			   : 0);
	return (int)off;
}

int events_format(const struct group *g, char *buf, size_t len)
{
	size_t off = 0;

	buf_printf(buf, len, &off, "low 0\n");
	buf_printf(buf, len, &off, "high %ld\n", group_event_read(g, EV_HIGH));
	buf_printf(buf, len, &off, "max %ld\n", group_event_read(g, EV_MAX));
	buf_printf(buf, len, &off, "oom 0\noom_kill 0\n");
	buf_printf(buf, len, &off, "failcnt %ld\n",
		   atomic_load(&g->mem.failcnt));
	buf_printf(buf, len, &off, "reclaim_passes %ld\n",
		   stat_read(g, STAT_RECLAIM_PASSES));
	buf_printf(buf, len, &off, "bounce_reads %ld\n",
		   stat_read(g, STAT_BOUNCE_READS));
	return (int)off;
}

int stat_format_json(const struct group *g, char *buf, size_t len)
{
	long v[NR_STATS], cur, max, high = atomic_load(&g->mem.high);
	size_t off = 0;

	/* current and max from one instant: a reader may compare them */
	counter_snapshot(&g->mem, &cur, &max);
	stat_read_all(g, v);
	buf_printf(buf, len, &off, "{\"current\": %ld, \"peak\": %ld",
		   cur * (long)ZF_PAGE_SIZE,
		   atomic_load(&g->mem.peak) * (long)ZF_PAGE_SIZE);
	if (max >= COUNTER_MAX)
		buf_printf(buf, len, &off, ", \"max\": null");
	else
		buf_printf(buf, len, &off, ", \"max\": %ld",
			   max * (long)ZF_PAGE_SIZE);
	if (high >= COUNTER_MAX)
		buf_printf(buf, len, &off, ", \"high\": null");
	else
		buf_printf(buf, len, &off, ", \"high\": %ld",
			   high * (long)ZF_PAGE_SIZE);
	for (int e = 0; e < NR_GROUP_EVENTS; e++)
		buf_printf(buf, len, &off, ", \"events.%s\": %ld",
			   group_event_names[e], group_event_read(g, e));
	for (int i = 0; i < NR_STATS; i++)
		buf_printf(buf, len, &off, ", \"%s\": %ld", stat_descs[i].name,
			   stat_value_printed(i, v[i]));
	buf_printf(buf, len, &off, "}\n");
	return (int)off;
}

int parse_size(const char *s, uint64_t *bytes, bool allow_max)
{
	char *end;
	double v;
	double mult = 1;

	if (!s)
		return -EINVAL;
	while (*s == ' ' || *s == '\t')
		s++;
	if (allow_max && (strcmp(s, "max") == 0 || strcmp(s, "max\n") == 0)) {
		*bytes = UINT64_MAX;
		return 0;
	}
	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || v < 0)
		return -EINVAL;
	switch (*end) {
	case 'k': case 'K': mult = 1024.0; end++; break;
	case 'm': case 'M': mult = 1024.0 * 1024; end++; break;
	case 'g': case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
	case 't': case 'T': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
	default: break;
	}
	if ((mult > 1 && (*end == 'i' || *end == 'I')) )
		end++;
	if ((mult > 1 && (*end == 'b' || *end == 'B')))
		end++;
	while (*end == ' ' || *end == '\n' || *end == '\t')
		end++;
	if (*end != '\0')
		return -EINVAL;
	v *= mult;
	/* a named bound: nothing above 2^60 bytes is a real size */
	if (v > (double)(1ULL << 60))
		return -ERANGE;
	*bytes = (uint64_t)v;
	return 0;
}
