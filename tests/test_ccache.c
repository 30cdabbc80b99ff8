// SPDX-License-Identifier: MIT
/*
 * The compressed cache (cache/ccache.c): a frame's bytes are kept from its
 * second read from backing on, never the first; they come back exact; its
 * share of the budget holds, oldest out first; reclaim takes them after
 * every group's folios; a lower memory.max, an invalidated mapping and the
 * mapping's end give everything back; and
 * readers, writers and reclaim at once under TSan.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fake.h"

#define ENTRY_LEN 10000 /* a 32 KiB frame at ~3:1 */

static void setup_cc(struct cache *c, unsigned long budget_pages,
		     unsigned int pct)
{
	struct cache_config cfg = fake_config(budget_pages);

	cfg.ccache_pct = pct;
	setup_config(c, &cfg, 32, RA_RECLAIM_BATCH);
}

static void frame_bytes(uint8_t *b, unsigned long index, size_t len)
{
	for (size_t i = 0; i < len; i++)
		b[i] = (uint8_t)(index * 131 + i * 7 + (i >> 9));
}

/* index offered as read from backing (once or again) */
static void offer(struct mapping *m, unsigned long index)
{
	uint8_t b[ENTRY_LEN];

	frame_bytes(b, index, sizeof(b));
	ccache_offer(m, index, b, sizeof(b), &m->cache->budget.root);
}

static bool got_right(struct mapping *m, unsigned long index)
{
	uint8_t b[ENTRY_LEN], want[ENTRY_LEN];

	if (!ccache_get(m, index, b, sizeof(b), &m->cache->budget.root))
		return false;
	frame_bytes(want, index, sizeof(want));
	CHECK(memcmp(b, want, sizeof(b)) == 0);
	return true;
}

static long held(struct cache *c)
{
	return stat_read(&c->budget.root, STAT_CCACHE);
}

/* what the root is charged for, less the threads' stocks */
static long charged(struct cache *c)
{
	return counter_read(&c->budget.root.mem) - stock_pages(&c->budget);
}

static void test_second_read_kept(void)
{
	struct cache c;
	struct mapping *m;
	uint8_t b[ENTRY_LEN];

	cache_thread_register();
	setup_cc(&c, 1024, 50);
	m = fake_mapping(&c, 64 * FOLIO);
	CHECK(ccache_enabled(&c));
	offer(m, 3); /* the first read: only seen */
	CHECK(!ccache_has(m, 3));
	CHECK(!got_right(m, 3));
	CHECK_EQ(held(&c), 0);
	CHECK_EQ(stat_read(&c.budget.root, STAT_CCACHE_STORES), 0);
	offer(m, 3); /* read again: kept, its bytes in whole pages */
	CHECK(ccache_has(m, 3));
	CHECK_EQ(held(&c), 3);
	CHECK_EQ(charged(&c), 3);
	CHECK(got_right(m, 3));
	CHECK(got_right(m, 3)); /* a hit leaves it there */
	CHECK_EQ(stat_read(&c.budget.root, STAT_CCACHE_HITS), 2);
	CHECK_EQ(stat_read(&c.budget.root, STAT_CCACHE_STORES), 1);
	/* another length is not this entry */
	CHECK(!ccache_get(m, 3, b, ENTRY_LEN - 1, &c.budget.root));
	offer(m, 3); /* kept once */
	CHECK_EQ(held(&c), 3);
	/* invalidated (the backing file changed): gone, and first reads
	 * again */
	mapping_invalidate(m);
	CHECK_EQ(held(&c), 0);
	CHECK_EQ(charged(&c), 0);
	offer(m, 3);
	CHECK(!ccache_has(m, 3));
	offer(m, 3);
	offer(m, 4);
	offer(m, 4);
	/* charged by the byte: two entries of 2.5 pages share their third */
	CHECK_EQ(held(&c), 5);
	CHECK_EQ(charged(&c), 5);
	ccache_shrink(&c, 1); /* the oldest goes, and the page it left */
	CHECK(!ccache_has(m, 3));
	CHECK(ccache_has(m, 4));
	CHECK_EQ(held(&c), 3);
	CHECK_EQ(charged(&c), 3);
	offer(m, 3);
	CHECK_EQ(held(&c), 5);
	CHECK_EQ(charged(&c), 5);
	/* the mapping's end takes its entries */
	mapping_put(m);
	CHECK_EQ(held(&c), 0);
	CHECK_EQ(charged(&c), 0);
	cache_thread_unregister();
	cache_destroy(&c);
}

static void test_share_and_reclaim(void)
{
	struct cache c;
	struct mapping *m;
	unsigned long n = 200;

	cache_thread_register();
	setup_cc(&c, 400, 25); /* a share of 100 pages: 40 entries */
	m = fake_mapping(&c, n * FOLIO);
	for (unsigned long i = 0; i < n; i++) {
		offer(m, i);
		offer(m, i);
		CHECK(held(&c) <= 100);
		CHECK(charged(&c) <= 400);
	}
	CHECK(held(&c) >= 97);
	/* oldest out first: the last ones are there, the first not */
	CHECK(!ccache_has(m, 0));
	CHECK(!ccache_has(m, n - 41));
	for (unsigned long i = n - 40; i < n; i++)
		CHECK(got_right(m, i));
	/* reclaim takes them when nothing else is left to take */
	CHECK_EQ(reclaim_proactive(&c.budget.root, 30), 0);
	CHECK(held(&c) <= 70);
	/* a lower memory.max: the share follows it, reclaim makes room */
	CHECK_EQ(group_set_max(&c.budget.root, 40), 0);
	CHECK(charged(&c) <= 40);
	for (unsigned long i = 0; i < n; i++) {
		offer(m, i);
		CHECK(held(&c) <= 10);
	}
	CHECK(held(&c) >= 6);
	/* an entry bigger than the share is not kept */
	CHECK_EQ(group_set_max(&c.budget.root, 8), 0);
	offer(m, 7);
	CHECK(!ccache_has(m, 7));
	CHECK_EQ(ccache_shrink(&c, 1000), (unsigned long)held(&c) + 0);
	CHECK_EQ(held(&c), 0);
	mapping_put(m);
	CHECK_EQ(charged(&c), 0);
	cache_thread_unregister();
	cache_destroy(&c);
}

/*
 * With child groups the root's own lists are empty, but its turn in a
 * reclaim walk still comes: entries go only once the children's folios
 * cannot give what is asked.
 */
static void test_children_first(void)
{
	struct cache c;
	struct mapping *m, *data;
	struct group *child;
	struct file_ra_state ra;
	struct sink s = {.buf = malloc(1 << 20)};
	long kept, before;

	cache_thread_register();
	setup_cc(&c, 800, 25); /* a share of 200 pages */
	m = fake_mapping(&c, 64 * FOLIO);
	for (unsigned long i = 0; i < 40; i++) {
		offer(m, i);
		offer(m, i);
	}
	kept = held(&c);
	CHECK(kept >= 95); /* 40 entries of 2.5 pages */
	child = group_lookup_or_create(&c.budget, &c.budget.root, "reader");
	CHECK(child != NULL);
	data = fake_mapping(&c, 64 * FOLIO);
	file_ra_init(&ra, 32);
	for (uint64_t pos = 0; pos < 16 * FOLIO; pos += 65536)
		CHECK_EQ(read_at(data, &ra, child, pos, 65536, &s), 0);
	before = stat_read(child, STAT_FILE);
	CHECK(before >= 200);
	/* passes that start at each group in turn: the child's folios go */
	for (int i = 0; i < 6; i++)
		CHECK_EQ(reclaim_proactive(&c.budget.root, 20), 0);
	CHECK_EQ(held(&c), kept);
	CHECK(stat_read(child, STAT_FILE) <= before - 100);
	/* more than the folios hold: then the entries too */
	reclaim_proactive(&c.budget.root, 800);
	CHECK(held(&c) < kept);
	file_ra_destroy(&ra);
	mapping_put(data);
	mapping_put(m);
	cache_thread_unregister();
	cache_destroy(&c);
	free(s.buf);
}

static void test_off(void)
{
	struct cache c;
	struct mapping *m;

	cache_thread_register();
	setup_cc(&c, 1024, 0);
	m = fake_mapping(&c, 8 * FOLIO);
	CHECK(!ccache_enabled(&c));
	offer(m, 1);
	offer(m, 1);
	CHECK(!ccache_has(m, 1));
	CHECK(!got_right(m, 1));
	CHECK_EQ(held(&c), 0);
	mapping_put(m);
	cache_thread_unregister();
	cache_destroy(&c);
}

struct storm {
	struct mapping *m;
	atomic_bool stop;
	unsigned int seed;
};

static void *storm_user(void *arg)
{
	struct storm *s = arg;
	unsigned int seed = __atomic_add_fetch(&s->seed, 7, __ATOMIC_RELAXED);

	cache_thread_register();
	for (int i = 0; i < 20000; i++) {
		unsigned long index = (unsigned long)rand_r(&seed) % 128;

		if (!got_right(s->m, index))
			offer(s->m, index);
	}
	cache_thread_unregister();
	return NULL;
}

static void *storm_reclaim(void *arg)
{
	struct storm *s = arg;
	struct cache *c = s->m->cache;

	cache_thread_register();
	while (!atomic_load(&s->stop)) {
		ccache_shrink(c, 10);
		reclaim_proactive(&c->budget.root, 20);
	}
	cache_thread_unregister();
	return NULL;
}

static void test_storm(void)
{
	struct cache c;
	struct storm s = {.seed = 1};
	pthread_t t[4];

	cache_thread_register();
	setup_cc(&c, 600, 50);
	s.m = fake_mapping(&c, 128 * FOLIO);
	for (int i = 0; i < 3; i++)
		CHECK_EQ(pthread_create(&t[i], NULL, storm_user, &s), 0);
	CHECK_EQ(pthread_create(&t[3], NULL, storm_reclaim, &s), 0);
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	atomic_store(&s.stop, true);
	pthread_join(t[3], NULL);
	CHECK(held(&c) <= 300);
	CHECK(stat_read(&c.budget.root, STAT_CCACHE_HITS) > 0);
	mapping_put(s.m);
	CHECK_EQ(held(&c), 0);
	drain_all_stock(&c.budget);
	CHECK_EQ(counter_read(&c.budget.root.mem), 0);
	cache_thread_unregister();
	cache_destroy(&c);
}

int main(void)
{
	RUN(test_second_read_kept);
	RUN(test_share_and_reclaim);
	RUN(test_children_first);
	RUN(test_off);
	RUN(test_storm);
	return check_done();
}
