// SPDX-License-Identifier: MIT
/*
 * Hierarchical page counters: mirrors mm/page_counter.c.
 *
 * Charging walks from the group to the root; each level takes the pages
 * with a compare-and-swap of its (max, usage) word that refuses to pass its
 * max.  If a level refuses, the levels below it are given back, so a
 * refused charge leaves no trace.  Unlike the kernel's speculative add,
 * usage is never above max, not even for an instant, and a lower limit set
 * at the same moment as a charge sees it or refuses it: one word, one CAS.
 */
#include <errno.h>

#include "accounting.h"

static inline uint64_t cstate(uint64_t max, uint64_t usage)
{
	return max << 32 | usage;
}

static inline long cusage(uint64_t st)
{
	return (long)(uint32_t)st;
}

static inline long cmax(uint64_t st)
{
	return (long)(st >> 32);
}

void counter_init(struct counter *c, struct counter *parent, long max,
		  long high)
{
	if (max > COUNTER_MAX)
		max = COUNTER_MAX;
	atomic_init(&c->state, cstate((uint64_t)max, 0));
	atomic_init(&c->high, high);
	atomic_init(&c->peak, 0);
	atomic_init(&c->failcnt, 0);
	c->parent = parent;
}

static void counter_raise_peak(struct counter *c, long usage)
{
	/* racy raise, accepted like the kernel's watermark */
	long peak = atomic_load_explicit(&c->peak, memory_order_relaxed);

	while (usage > peak &&
	       !atomic_compare_exchange_weak_explicit(&c->peak, &peak, usage,
						      memory_order_relaxed,
						      memory_order_relaxed))
		;
}

/* Give back nr pages: usage >= nr, so the borrow never reaches max. */
static void counter_sub(struct counter *c, long nr)
{
	uint64_t old = atomic_fetch_sub(&c->state, (uint64_t)nr);

	/* an underflow is a bug in the caller: undo it, like the kernel */
	if (cusage(old) < nr)
		atomic_fetch_add(&c->state, (uint64_t)nr);
}

bool counter_try_charge(struct counter *c, long nr, struct counter **fail)
{
	struct counter *i;

	for (i = c; i; i = i->parent) {
		uint64_t st = atomic_load_explicit(&i->state,
						   memory_order_relaxed);

		do {
			if (cusage(st) + nr > cmax(st)) {
				atomic_fetch_add_explicit(&i->failcnt, 1,
							  memory_order_relaxed);
				if (fail)
					*fail = i;
				for (struct counter *j = c; j != i;
				     j = j->parent)
					counter_sub(j, nr);
				return false;
			}
		} while (!atomic_compare_exchange_weak(&i->state, &st,
						       st + (uint64_t)nr));
		counter_raise_peak(i, cusage(st) + nr);
	}
	return true;
}

void counter_uncharge(struct counter *c, long nr)
{
	for (struct counter *i = c; i; i = i->parent)
		counter_sub(i, nr);
}

long counter_read(const struct counter *c)
{
	return cusage(atomic_load_explicit(&c->state, memory_order_relaxed));
}

long counter_max(const struct counter *c)
{
	return cmax(atomic_load_explicit(&c->state, memory_order_relaxed));
}

/* usage and max at one instant: what memory.current <= memory.max means */
void counter_snapshot(const struct counter *c, long *usage, long *max)
{
	uint64_t st = atomic_load(&c->state);

	*usage = cusage(st);
	*max = cmax(st);
}

long counter_margin(const struct counter *c)
{
	uint64_t st = atomic_load_explicit(&c->state, memory_order_relaxed);

	return cusage(st) < cmax(st) ? cmax(st) - cusage(st) : 0;
}

/* -EBUSY if usage is above the new limit: reclaim first, then retry. */
int counter_set_max(struct counter *c, long max)
{
	uint64_t st = atomic_load(&c->state);

	if (max > COUNTER_MAX)
		max = COUNTER_MAX;
	do {
		if (cusage(st) > max)
			return -EBUSY;
	} while (!atomic_compare_exchange_weak(
		&c->state, &st, cstate((uint64_t)max, (uint64_t)cusage(st))));
	return 0;
}

void counter_set_high(struct counter *c, long high)
{
	atomic_store(&c->high, high);
}

void counter_reset_peak(struct counter *c)
{
	atomic_store(&c->peak, counter_read(c));
}
