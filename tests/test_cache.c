// SPDX-License-Identifier: MIT
/*
 * The engine (cache + readahead + accounting) with a fake mapping whose
 * folios hold a known pattern: reads return the right bytes under a budget
 * far below the data, from several threads; the budget is never passed;
 * LRU promotion keeps what is read again; a read is still served from a
 * bounce buffer when everything is pinned; hot folios are read without
 * references and their data waits for a grace period.
 */
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake.h"

static void test_sequential(void)
{
	struct cache c;
	struct mapping *m;
	struct file_ra_state ra;
	struct sink s = {.buf = malloc(1 << 20)};
	uint64_t size = 10 * FOLIO + 12345;

	cache_thread_register();
	setup(&c, 1024, true);
	m = fake_mapping(&c, size);
	file_ra_init(&ra, 32);
	for (uint64_t pos = 0; pos < size; pos += 65536) {
		CHECK_EQ(read_at(m, &ra, &c.budget.root, pos, 65536, &s), 0);
		CHECK_EQ(s.len, pos + 65536 <= size ? 65536 : size - pos);
		CHECK(bytes_ok(&s, pos));
	}
	/* every folio read once, most of them ahead of the reader */
	CHECK_EQ(atomic_load(&fills), 11);
	CHECK(stat_read(&c.budget.root, STAT_RA_WINDOWS) >= 9);
	CHECK_EQ(stat_read(&c.budget.root, STAT_FILE), 10 * 32 + 4);
	/* a read past the end returns nothing */
	CHECK_EQ(read_at(m, &ra, &c.budget.root, size, 100, &s), 0);
	CHECK_EQ(s.len, 0);
	file_ra_destroy(&ra);
	mapping_put(m);
	CHECK_EQ(counter_read(&c.budget.root.mem), stock_pages(&c.budget));
	cache_thread_unregister(); /* destroy waits for a grace period */
	cache_destroy(&c);
	free(s.buf);
}

struct storm {
	struct cache *c;
	struct mapping *m;
	uint64_t size;
	atomic_bool stop;
	atomic_int bad;
	size_t base;         /* heap in use before the storm */
	atomic_size_t peak;  /* the most in use above base, seen */
};

static void *storm_reader(void *arg)
{
	struct storm *st = arg;
	struct sink s = {.buf = malloc(1 << 20)};
	struct file_ra_state ra;
	unsigned long long seed = (unsigned long long)pthread_self() | 1;

	cache_thread_register();
	file_ra_init(&ra, 32);
	for (int i = 0; i < 3000; i++) {
		uint64_t pos = test_rand(&seed) % st->size;
		size_t len = 1 + test_rand(&seed) % (300 << 10);

		if (read_at(st->m, &ra, &st->c->budget.root, pos, len, &s) ||
		    !bytes_ok(&s, pos))
			atomic_fetch_add(&st->bad, 1);
	}
	file_ra_destroy(&ra);
	cache_thread_unregister();
	free(s.buf);
	read_at_done();
	return NULL;
}

/* What the process has allocated: heap and mmapped chunks (from the
 * sanitizer's allocator when it replaces malloc). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
size_t __sanitizer_get_current_allocated_bytes(void);
static size_t heap_in_use(void)
{
	return __sanitizer_get_current_allocated_bytes();
}
#else
static size_t heap_in_use(void)
{
	struct mallinfo2 mi = mallinfo2();

	return mi.uordblks + mi.hblkhd;
}
#endif

/*
 * The budget measured from outside the counters: the process's allocated
 * memory above what it held before the storm.  Folio data dominates it;
 * nothing else the storm allocates is bigger than a few MiB.
 */
static void *storm_watch(void *arg)
{
	struct storm *st = arg;

	while (!atomic_load(&st->stop)) {
		size_t used = heap_in_use();

		if (used > st->base && used - st->base > atomic_load(&st->peak))
			atomic_store(&st->peak, used - st->base);
		usleep(200);
	}
	return NULL;
}

/* 4 threads, random ranges, a budget of 16 folios for 200 of data. */
static void test_storm(void)
{
	struct cache c;
	struct storm st = {.c = &c, .size = 200 * (uint64_t)FOLIO - 777};
	pthread_t t[4], w;

	setup(&c, 16 * 32, true);
	st.m = fake_mapping(&c, st.size);
	st.base = heap_in_use();
	pthread_create(&w, NULL, storm_watch, &st);
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, storm_reader, &st);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	atomic_store(&st.stop, true);
	pthread_join(w, NULL);
	CHECK_EQ(atomic_load(&st.bad), 0);
	/* 16 folios of budget, and per reader its sink (1 MiB), request and
	 * a few bounce or in-flight folios: far below 200 folios of data */
	CHECK(atomic_load(&st.peak) <= 16 * FOLIO + 4 * (1 << 20) + (4 << 20));
	CHECK(atomic_load(&st.peak) >= 8 * FOLIO); /* it did cache */
	CHECK(stat_read(&c.budget.root, STAT_RECLAIM_PASSES) > 0);
	CHECK(atomic_load(&c.budget.root.mem.peak) <= 16 * 32);
	mapping_put(st.m);
	cache_destroy(&c);
}

/* Everything pinned: the read is served, uncached, from a bounce buffer. */
static void test_bounce(void)
{
	struct cache c;
	struct mapping *m;
	struct sink s = {.buf = malloc(1 << 20)};
	struct folio *pinned[4];

	cache_thread_register();
	setup(&c, 4 * 32, true);
	m = fake_mapping(&c, 10 * FOLIO);
	for (unsigned long i = 0; i < 4; i++)
		CHECK_EQ(read_at(m, NULL, &c.budget.root, i * FOLIO, 10, &s), 0);
	for (unsigned long i = 0; i < 4; i++) {
		pinned[i] = folio_lookup(m, i);
		CHECK(pinned[i] && folio_try_get(pinned[i]));
	}
	CHECK_EQ(read_at(m, NULL, &c.budget.root, 7 * FOLIO + 5, 5000, &s), 0);
	CHECK_EQ(s.len, 5000);
	CHECK(bytes_ok(&s, 7 * FOLIO + 5));
	CHECK_EQ(stat_read(&c.budget.root, STAT_BOUNCE_READS), 1);
	CHECK(!mapping_cached(m, 7));
	CHECK(counter_read(&c.budget.root.mem) <= 4 * 32);
	for (int i = 0; i < 4; i++)
		folio_put(pinned[i]);
	/* unpinned, the next read is cached again */
	CHECK_EQ(read_at(m, NULL, &c.budget.root, 7 * FOLIO, 10, &s), 0);
	CHECK(mapping_cached(m, 7));
	mapping_put(m);
	cache_thread_unregister(); /* destroy waits for a grace period */
	cache_destroy(&c);
	free(s.buf);
}

/* A folio read again is promoted and survives a stream of others. */
static void test_lru_promotion(void)
{
	struct cache c;
	struct mapping *m;
	struct sink s = {.buf = malloc(1 << 20)};

	cache_thread_register();
	setup(&c, 8 * 32, false);
	m = fake_mapping(&c, 100 * FOLIO);
	CHECK_EQ(read_at(m, NULL, &c.budget.root, 0, 10, &s), 0);
	CHECK_EQ(read_at(m, NULL, &c.budget.root, 0, 10, &s), 0);
	CHECK(folio_test(folio_lookup(m, 0), FOLIO_ACTIVE));
	for (uint64_t i = 10; i < 100; i++)
		CHECK_EQ(read_at(m, NULL, &c.budget.root, i * FOLIO, 10, &s),
			 0);
	CHECK(mapping_cached(m, 0));
	CHECK(!mapping_cached(m, 10));
	CHECK(stat_read(&c.budget.root, STAT_PGSTEAL) >= 80 * 32);
	mapping_put(m);
	cache_thread_unregister(); /* destroy waits for a grace period */
	cache_destroy(&c);
	free(s.buf);
}

/* Read four times (inactive, referenced, active, active+referenced), a
 * folio turns hot on the next read; then it is read without a reference
 * and, once evicted, its data waits for a grace period. */
static void test_hot_lockless(void)
{
	struct cache c;
	struct mapping *m;
	struct sink s = {.buf = malloc(1 << 20)};
	struct folio *f;

	cache_thread_register();
	setup(&c, 64 * 32, true);
	m = fake_mapping(&c, 4 * FOLIO);
	for (int i = 0; i < 4; i++) /* no ra state: every read counts */
		CHECK_EQ(read_at(m, NULL, &c.budget.root, 100, 16, &s), 0);
	f = folio_lookup(m, 0);
	CHECK(f && folio_test(f, FOLIO_HOT));
	CHECK_EQ(stat_read(&c.budget.root, STAT_HOT_FOLIOS), 1);
	CHECK_EQ(read_at(m, NULL, &c.budget.root, 100, 16, &s), 0);
	CHECK(bytes_ok(&s, 100));
	CHECK(stat_read(&c.budget.root, STAT_LOCKLESS_READS) >= 1);
	CHECK_EQ(atomic_load(&f->refcount), 1); /* no reference held */
	/* evict everything: the hot folio's data is deferred, still charged */
	cache_thread_offline();
	CHECK_EQ(reclaim_proactive(&c.budget.root, 32), 0);
	cache_thread_online();
	CHECK(!mapping_cached(m, 0));
	CHECK_EQ(stat_read(&c.budget.root, STAT_DEFERRED_FREE) +
			 stat_read(&c.budget.root, STAT_DEFERRED_FREES) * 32,
		 32);
	cache_thread_offline();
	cache_expedite(&c); /* every deferred free queued so far has run */
	cache_thread_online();
	CHECK_EQ(stat_read(&c.budget.root, STAT_DEFERRED_FREE), 0);
	CHECK_EQ(stat_read(&c.budget.root, STAT_DEFERRED_FREES), 1);
	mapping_put(m);
	drain_all_stock(&c.budget);
	CHECK_EQ(counter_read(&c.budget.root.mem), 0);
	cache_thread_unregister(); /* destroy waits for a grace period */
	cache_destroy(&c);
	free(s.buf);
}

struct lockless_stress {
	struct cache *c;
	struct mapping *m;
	atomic_bool stop;
	atomic_int bad;
	atomic_long reads;
};

static void *hot_reader(void *arg)
{
	struct lockless_stress *st = arg;
	struct sink s = {.buf = malloc(1 << 20)};
	unsigned long long seed = (unsigned long long)pthread_self() | 1;

	cache_thread_register();
	while (!atomic_load(&st->stop)) {
		/* a few hot spots: the first 4 KiB of 8 folios */
		uint64_t pos = (test_rand(&seed) % 8) * FOLIO +
			       test_rand(&seed) % 4000;
		size_t len = 1 + test_rand(&seed) % 96;

		if (read_at(st->m, NULL, &st->c->budget.root, pos, len, &s) ||
		    s.len != len || !bytes_ok(&s, pos))
			atomic_fetch_add(&st->bad, 1);
		atomic_fetch_add(&st->reads, 1);
	}
	cache_thread_unregister();
	free(s.buf);
	read_at_done();
	return NULL;
}

static void *limit_shaker(void *arg)
{
	struct lockless_stress *st = arg;
	struct group *g = &st->c->budget.root;
	long sizes[] = {4 * 32, 2 * 32, 16 * 32, 3 * 32, 64 * 32};

	/* like a worker serving control writes: online, quiescent after each */
	cache_thread_register();
	for (int i = 0; !atomic_load(&st->stop); i++) {
		group_set_max(g, sizes[i % 5]);
		cache_quiescent();
		reclaim_proactive(g, 32);
		cache_quiescent();
	}
	group_set_max(g, 64 * 32);
	cache_thread_unregister();
	return NULL;
}

/*
 * 4 threads read hot folios in a loop while another shrinks and grows
 * memory.max and reclaims: every byte right, the budget never passed, and
 * no deferred page left once the readers stop and a grace period passes.
 */
static void test_lockless_stress(void)
{
	struct cache c;
	struct lockless_stress st = {.c = &c};
	pthread_t r[4], shaker;
	const char *env = getenv("ZF_STRESS_SECONDS");
	int seconds = env ? atoi(env) : 10;

	setup(&c, 64 * 32, true);
	st.m = fake_mapping(&c, 64 * FOLIO);
	for (int i = 0; i < 4; i++)
		pthread_create(&r[i], NULL, hot_reader, &st);
	pthread_create(&shaker, NULL, limit_shaker, &st);
	sleep((unsigned)seconds);
	atomic_store(&st.stop, true);
	for (int i = 0; i < 4; i++)
		pthread_join(r[i], NULL);
	pthread_join(shaker, NULL);
	CHECK_EQ(atomic_load(&st.bad), 0);
	CHECK(stat_read(&c.budget.root, STAT_LOCKLESS_READS) > 0);
	CHECK(stat_read(&c.budget.root, STAT_DEFERRED_FREES) > 0);
	cache_expedite(&c); /* every deferred free queued so far has run */
	CHECK_EQ(stat_read(&c.budget.root, STAT_DEFERRED_FREE), 0);
	fprintf(stderr, "  %ld reads, %ld lockless, %ld hot, %ld deferred "
			"frees, %ld expedited\n",
		atomic_load(&st.reads),
		stat_read(&c.budget.root, STAT_LOCKLESS_READS),
		stat_read(&c.budget.root, STAT_HOT_FOLIOS),
		stat_read(&c.budget.root, STAT_DEFERRED_FREES),
		stat_read(&c.budget.root, STAT_EXPEDITED_GPS));
	mapping_put(st.m);
	cache_destroy(&c);
}

/*
 * A page-cache fill that runs into a damaged folio gets the error, never
 * the bytes before it: the kernel would take a short fill for the end of
 * the file.  A read() gets the bytes before the damage, then EIO.
 */
static void test_fill_never_short(void)
{
	struct cache c;
	struct mapping *m;
	struct sink s = {.buf = malloc(1 << 20)};

	cache_thread_register();
	setup(&c, 64 * 32, true);
	m = fake_mapping(&c, 8 * FOLIO);
	fake_bad_index = 3;
	CHECK_EQ(read_req_at(m, NULL, &c.budget.root, 2 * FOLIO, 2 * FOLIO,
			     false, &s), 0);
	CHECK_EQ(s.len, FOLIO); /* read(): folio 2, then short */
	CHECK(bytes_ok(&s, 2 * FOLIO));
	ra_request_init(rq, m, NULL, &c.budget.root, NULL, 2 * FOLIO,
			2 * FOLIO, false);
	rq->rq.fill = true;
	cache_read(&rq->rq, sink_reply, &s);
	cache_quiescent();
	CHECK_EQ(s.err, -EIO); /* a fill: all or an error */
	CHECK_EQ(s.len, 0);
	fake_bad_index = -1;
	mapping_put(m);
	cache_thread_unregister();
	cache_destroy(&c);
	free(s.buf);
	read_at_done();
}

struct long_fill {
	struct cache *c;
	struct mapping *m;
	atomic_bool done, reclaimed;
};

static void *reclaim_hot(void *arg)
{
	struct long_fill *lf = arg;

	cache_thread_register();
	cache_thread_offline();
	CHECK_EQ(reclaim_proactive(&lf->c->budget.root, 32), 0);
	cache_thread_online();
	atomic_store(&lf->reclaimed, true);
	cache_thread_unregister();
	return NULL;
}

static void *long_fill_reader(void *arg)
{
	struct long_fill *lf = arg;
	struct sink s = {.buf = malloc(1 << 20)};

	cache_thread_register();
	CHECK_EQ(read_at(lf->m, NULL, &lf->c->budget.root, 5 * FOLIO, 100, &s),
		 0);
	CHECK(bytes_ok(&s, 5 * FOLIO));
	atomic_store(&lf->done, true);
	cache_thread_unregister();
	free(s.buf);
	read_at_done();
	return NULL;
}

/*
 * A fill that takes long (a frame streamed from its start, a slow disk)
 * holds up no grace period: a charge that needs one (it must expedite the
 * hot folios' deferred data) completes while the fill still runs.
 */
static void test_long_fill_no_gp_stall(void)
{
	struct long_fill lf = {0};
	struct sink s = {.buf = malloc(1 << 20)};
	struct cache c;
	pthread_t t, r;

	lf.c = &c;
	cache_thread_register();
	setup(&c, 4 * 32, true);
	lf.m = fake_mapping(&c, 16 * FOLIO);
	for (int i = 0; i < 4; i++) /* folio 0 hot */
		CHECK_EQ(read_at(lf.m, NULL, &c.budget.root, 100, 16, &s), 0);
	CHECK(folio_test(folio_lookup(lf.m, 0), FOLIO_HOT));
	fake_slow_index = 5;
	atomic_store(&fake_hold, true);
	cache_thread_offline(); /* while it waits, as a worker between requests */
	pthread_create(&t, NULL, long_fill_reader, &lf);
	while (!atomic_load(&fake_held))
		usleep(1000);
	/* evict the hot folio: its data waits for a grace period, which
	 * reclaim waits for (from another thread: the test must not hang) */
	pthread_create(&r, NULL, reclaim_hot, &lf);
	for (int ms = 0; ms < 10000 && !atomic_load(&lf.reclaimed); ms++)
		usleep(1000);
	/* the fill is still held, yet the grace period has passed */
	CHECK(atomic_load(&lf.reclaimed));
	CHECK(!atomic_load(&lf.done));
	atomic_store(&fake_hold, false);
	pthread_join(t, NULL);
	pthread_join(r, NULL);
	cache_thread_online();
	CHECK_EQ(stat_read(&c.budget.root, STAT_DEFERRED_FREE), 0);
	CHECK(atomic_load(&lf.done));
	fake_slow_index = -1;
	mapping_put(lf.m);
	cache_thread_unregister();
	cache_destroy(&c);
	free(s.buf);
	read_at_done();
}

/* Whether this kernel fills pages in on request (Linux 5.14+). */
static bool populate_works(void)
{
	void *p = mmap(NULL, ZF_PAGE_SIZE, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	bool ok = p != MAP_FAILED &&
		  madvise(p, ZF_PAGE_SIZE, MADV_POPULATE_WRITE) == 0;

	if (p != MAP_FAILED)
		munmap(p, ZF_PAGE_SIZE);
	return ok;
}

/* A buffer the pool does not have comes with its pages in (one call, not
 * a fault per page as it is written); what the pool keeps comes back. */
static void test_buffers_populated(void)
{
	struct cache c;
	size_t len = 5 * ZF_PAGE_SIZE + 100, pages = 6;
	unsigned char vec[8];
	void *b, *again;

	cache_thread_register();
	setup(&c, 1024, true);
	b = cache_buf_get(&c, len);
	CHECK(b != NULL);
	CHECK_EQ(mincore(b, pages * ZF_PAGE_SIZE, vec), 0);
	if (populate_works())
		for (size_t i = 0; i < pages; i++)
			CHECK(vec[i] & 1);
	cache_buf_put(&c, b, len);
	again = cache_buf_get(&c, len);
	CHECK(again == b);
	cache_buf_put(&c, again, len);
	cache_destroy(&c);
	cache_thread_unregister();
}

int main(void)
{
	RUN(test_sequential);
	RUN(test_buffers_populated);
	RUN(test_storm);
	RUN(test_bounce);
	RUN(test_lru_promotion);
	RUN(test_fill_never_short);
	RUN(test_long_fill_no_gp_stall);
	RUN(test_hot_lockless);
	RUN(test_lockless_stress);
	read_at_done();
	return check_done();
}
