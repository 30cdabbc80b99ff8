// SPDX-License-Identifier: MIT
/*
 * Hierarchical page counters: mirrors mm/page_counter.c.
 *
 * Charging walks from the group to the root; each level takes the pages
 * with a compare-and-swap that refuses to pass its max.  If a level refuses,
 * the levels below it are given back, so a refused charge leaves no trace.
 * Unlike the kernel's speculative add, usage is never above max, not even
 * for an instant, which is what memory.current readers are promised.
 *
 * max and usage pair up in counter_set_max(): the new max is stored first,
 * then usage is re-read, so a charge that slipped in between is seen and the
 * old limit restored (try_charge adds first, then reads max).
 */
#include <errno.h>

#include "accounting.h"

void counter_init(struct counter *c, struct counter *parent, long max,
		  long high)
{
	atomic_init(&c->usage, 0);
	atomic_init(&c->max, max);
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

bool counter_try_charge(struct counter *c, long nr, struct counter **fail)
{
	struct counter *i;

	for (i = c; i; i = i->parent) {
		long usage = atomic_load_explicit(&i->usage,
						  memory_order_relaxed);

		/*
		 * Compare-and-swap, not the kernel's add-then-undo: usage
		 * never exceeds max even for an instant, so a sampler of
		 * memory.current never sees it above memory.max.  seq_cst
		 * pairs with the exchange and re-read in counter_set_max.
		 */
		do {
			if (usage + nr > atomic_load(&i->max)) {
				atomic_fetch_add_explicit(&i->failcnt, 1,
							  memory_order_relaxed);
				if (fail)
					*fail = i;
				for (struct counter *j = c; j != i;
				     j = j->parent)
					atomic_fetch_sub(&j->usage, nr);
				return false;
			}
		} while (!atomic_compare_exchange_weak(&i->usage, &usage,
						       usage + nr));
		counter_raise_peak(i, usage + nr);
	}
	return true;
}

void counter_charge(struct counter *c, long nr)
{
	for (struct counter *i = c; i; i = i->parent)
		counter_raise_peak(i, atomic_fetch_add(&i->usage, nr) + nr);
}

void counter_uncharge(struct counter *c, long nr)
{
	for (struct counter *i = c; i; i = i->parent) {
		long old = atomic_fetch_sub(&i->usage, nr);

		/* an underflow is a bug in the caller: clamp, like the kernel */
		if (old < nr)
			atomic_fetch_add(&i->usage, nr - old);
	}
}

long counter_read(const struct counter *c)
{
	return atomic_load_explicit(&c->usage, memory_order_relaxed);
}

long counter_margin(const struct counter *c)
{
	long max = atomic_load_explicit(&c->max, memory_order_relaxed);
	long usage = counter_read(c);

	return usage < max ? max - usage : 0;
}

int counter_set_max(struct counter *c, long max)
{
	for (;;) {
		long usage = atomic_load(&c->usage);
		long old;

		if (usage > max)
			return -EBUSY;
		old = atomic_exchange(&c->max, max);
		if (atomic_load(&c->usage) <= max)
			return 0;
		/* a charge slipped in under the old limit: put it back, retry */
		atomic_store(&c->max, old);
	}
}

void counter_set_high(struct counter *c, long high)
{
	atomic_store(&c->high, high);
}

void counter_reset_peak(struct counter *c)
{
	atomic_store(&c->peak, counter_read(c));
}
