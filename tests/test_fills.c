// SPDX-License-Identifier: MIT
/*
 * Fill threads: a window's folios filled on every core (cache/fillpool.c).
 * On a fake mapping, with 1, 2 and 8 fill threads: sequential readers get
 * every byte right and every frame is filled once; a reader that needs a
 * folio a fill thread has claimed (held back on purpose) waits for it; a
 * damaged frame in the speculative part is EIO for its reader only; random
 * readers on a budget much smaller than the data never see it exceeded and
 * get every byte right; a cache stopped with work in the queue finishes it;
 * a window is not shared while more are being filled than there are fill
 * threads, nor when its filesystem says it costs too little to share.
 */
#include <pthread.h>

#include "fake.h"

static void setup_fills(struct cache *c, unsigned long budget_pages,
			unsigned int threads)
{
	struct cache_config cfg = fake_config(budget_pages);

	cfg.budget.reclaim_headroom = true;
	cfg.lockless = true;
	cfg.fill_threads = threads;
	setup_config(c, &cfg, 1024, RA_RECLAIM_BATCH);
}

static void teardown(struct cache *c)
{
	cache_thread_offline();
	cache_destroy(c);
	cache_thread_online();
}

struct seq_arg {
	struct mapping *m;
	struct group *g;
	uint64_t size;
	size_t req;
	int bad;
};

static void *seq_reader(void *arg)
{
	struct seq_arg *a = arg;
	struct file_ra_state ra;
	struct sink s = {malloc(1 << 20), 0, 0};

	cache_thread_register();
	file_ra_init(&ra, 1024);
	for (uint64_t pos = 0; pos < a->size; pos += a->req) {
		read_at(a->m, &ra, a->g, pos, a->req, &s);
		if (s.err || s.len != a->req || !bytes_ok(&s, pos))
			a->bad++;
	}
	file_ra_destroy(&ra);
	read_at_done();
	free(s.buf);
	cache_thread_unregister();
	return NULL;
}

/* Two readers of one 32 MiB file, 1 MiB reads, windows up to 4 MiB. */
static void seq_with(unsigned int threads)
{
	struct cache c;
	struct mapping *m;
	struct seq_arg a[2];
	pthread_t t[2];
	const uint64_t size = 256ull * FOLIO;

	setup_fills(&c, 1 << 16, threads);
	m = fake_mapping(&c, size);
	atomic_store(&fills, 0);
	for (int i = 0; i < 2; i++) {
		a[i] = (struct seq_arg){m, &c.budget.root, size, 1 << 20, 0};
		pthread_create(&t[i], NULL, seq_reader, &a[i]);
	}
	cache_thread_offline(); /* while it waits: see test_storm */
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	cache_thread_online();
	for (int i = 0; i < 2; i++)
		CHECK_EQ(a[i].bad, 0);
	/* the budget holds the file: no frame is read twice */
	CHECK_EQ(atomic_load(&fills), 256);
	/* and the fill threads took their part */
	CHECK(stat_read(&c.budget.root, STAT_SHARED_FILLS) > 0);
	fprintf(stderr, "  %u fill thread(s): %ld of 256 folios shared\n",
		threads, stat_read(&c.budget.root, STAT_SHARED_FILLS));
	mapping_put(m);
	teardown(&c);
}

static void test_seq_1_thread(void)
{
	seq_with(1);
}

static void test_seq_2_threads(void)
{
	seq_with(2);
}

static void test_seq_8_threads(void)
{
	seq_with(8);
}

struct waiter_arg {
	struct mapping *m;
	struct group *g;
	atomic_bool done;
	int err;
	bool ok;
};

static void *folio20_reader(void *arg)
{
	struct waiter_arg *a = arg;
	struct sink s = {malloc(4096), 0, 0};

	cache_thread_register();
	a->err = read_at(a->m, NULL, a->g, 20ull * FOLIO + 100, 4096, &s);
	a->ok = s.len == 4096 && bytes_ok(&s, 20ull * FOLIO + 100);
	atomic_store(&a->done, true);
	read_at_done();
	free(s.buf);
	cache_thread_unregister();
	return NULL;
}

/* The first 2 MiB of a file, 1 MiB at a time: windows [0, 15], [16, 47]. */
static void *two_reads(void *arg)
{
	struct seq_arg *a = arg;

	a->size = 2 << 20;
	a->req = 1 << 20;
	return seq_reader(a);
}

/*
 * A reader that needs a folio being filled (held back in its fill, by a
 * fill thread or by the worker after its reply) sleeps until the fill is
 * done, and does not read the frame again.
 */
static void test_waiter_sleeps(void)
{
	struct cache c;
	struct mapping *m;
	struct seq_arg first;
	struct waiter_arg a = {0};
	pthread_t t1, t2;

	setup_fills(&c, 1 << 16, 2);
	m = fake_mapping(&c, 64ull * FOLIO);
	fake_slow_index = 20;
	atomic_store(&fake_hold, true);
	atomic_store(&fills, 0);
	first = (struct seq_arg){m, &c.budget.root, 0, 0, 0};
	pthread_create(&t1, NULL, two_reads, &first);
	while (!atomic_load(&fake_held))
		usleep(1000);
	a.m = m;
	a.g = &c.budget.root;
	pthread_create(&t2, NULL, folio20_reader, &a);
	usleep(50000);
	CHECK(!atomic_load(&a.done)); /* waiting, not reading it again */
	atomic_store(&fake_hold, false);
	pthread_join(t2, NULL);
	pthread_join(t1, NULL);
	CHECK_EQ(first.bad, 0);
	CHECK_EQ(a.err, 0);
	CHECK(a.ok);
	CHECK_EQ(atomic_load(&fills), 48); /* each frame once */
	mapping_put(m);
	teardown(&c); /* the fill threads are gone */
	fake_slow_index = -1;
}

/* A damaged frame in a shared window: EIO there, right bytes around it. */
static void test_bad_frame(void)
{
	struct cache c;
	struct mapping *m;
	struct file_ra_state ra;
	struct sink s = {malloc(1 << 20), 0, 0};

	setup_fills(&c, 1 << 16, 2);
	m = fake_mapping(&c, 64ull * FOLIO);
	file_ra_init(&ra, 1024);
	fake_bad_index = 21;
	for (uint64_t pos = 0; pos < 64ull * FOLIO; pos += FOLIO) {
		int err = read_at(m, &ra, &c.budget.root, pos, FOLIO, &s);

		if (pos / FOLIO == 21) {
			CHECK_EQ(err, -EIO);
		} else {
			CHECK_EQ(err, 0);
			CHECK(s.len == FOLIO && bytes_ok(&s, pos));
		}
	}
	file_ra_destroy(&ra);
	read_at_done();
	free(s.buf);
	mapping_put(m);
	teardown(&c);
	fake_bad_index = -1;
}

struct storm {
	struct mapping *m;
	struct group *g;
	uint64_t size;
	atomic_bool stop;
	atomic_long reads, bad, over;
	unsigned long max;
};

static void *storm_reader(void *arg)
{
	struct storm *st = arg;
	struct file_ra_state ra;
	struct sink s = {malloc(1 << 20), 0, 0};
	unsigned long long seed = (unsigned long long)(uintptr_t)&ra | 1;

	cache_thread_register();
	file_ra_init(&ra, 1024);
	while (!atomic_load(&st->stop)) {
		uint64_t pos = test_rand(&seed) % st->size;
		size_t len = 1 + test_rand(&seed) % (512 << 10);
		int err;

		if (test_rand(&seed) % 4 == 0) /* runs: readahead windows */
			for (int k = 0; k < 8 && pos < st->size; k++) {
				err = read_at(st->m, &ra, st->g, pos, len, &s);
				if (err || !bytes_ok(&s, pos))
					atomic_fetch_add(&st->bad, 1);
				pos += len;
			}
		err = read_at(st->m, &ra, st->g, pos, len, &s);
		if (err || !bytes_ok(&s, pos))
			atomic_fetch_add(&st->bad, 1);
		if (counter_read(&st->g->mem) > (long)st->max)
			atomic_fetch_add(&st->over, 1);
		atomic_fetch_add(&st->reads, 1);
	}
	file_ra_destroy(&ra);
	read_at_done();
	free(s.buf);
	cache_thread_unregister();
	return NULL;
}

/* Four readers at random on 64 MiB with a 4 MiB budget, for two seconds. */
static void test_storm(void)
{
	struct cache c;
	struct storm st = {0};
	pthread_t t[4];

	setup_fills(&c, 1024, 8);
	st.size = 512ull * FOLIO;
	st.m = fake_mapping(&c, st.size);
	st.g = &c.budget.root;
	st.max = 1024;
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, storm_reader, &st);
	/* offline while it waits: a reader's reclaim may wait for a grace
	 * period, which an online thread that never passes one would hold up
	 * for ever */
	cache_thread_offline();
	usleep(2000000);
	atomic_store(&st.stop, true);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	cache_thread_online();
	CHECK(atomic_load(&st.reads) > 0);
	CHECK_EQ(atomic_load(&st.bad), 0);
	CHECK_EQ(atomic_load(&st.over), 0);
	mapping_put(st.m);
	teardown(&c);
	fprintf(stderr, "  %ld reads\n", atomic_load(&st.reads));
}

static void no_done(struct fill_work *w)
{
	(void)w;
}

/* Three windows being filled on two fill threads: the third is not shared. */
static void test_busy_not_shared(void)
{
	struct cache c;
	struct mapping *m;
	struct fill_batch b = {0};
	struct fill_work w[3];
	unsigned int order[2] = {0, 1};

	setup_fills(&c, 1 << 16, 2);
	m = fake_mapping(&c, 16ull * FOLIO);
	b.mapping = m;
	/* two windows with nothing left to claim, still owned */
	for (int i = 0; i < 2; i++)
		fill_work_init(&w[i], &b, order, 0, 0, no_done);
	fill_work_init(&w[2], &b, order, 2, 2, no_done);
	CHECK_EQ(atomic_load(&c.fills.active), 3u);
	CHECK(!fill_work_share(&c, &w[2]));
	CHECK(!w[2].shared);
	for (int i = 0; i < 2; i++)
		fill_work_put(&w[i]);
	/* w[2]'s folios were never there: let it go as if filled */
	atomic_store(&w[2].left, 1);
	fill_work_put(&w[2]);
	CHECK_EQ(atomic_load(&c.fills.active), 0u);
	mapping_put(m);
	teardown(&c);
}

/* A window whose decoding costs less than a wakeup is worth is not shared,
 * however many folios it has; the cost the filesystem gives is what
 * counts, not their length. */
static void test_cheap_not_shared(void)
{
	struct cache c;
	struct mapping *m;
	struct fill_batch b = {0};
	struct fill_work w;
	struct folio f[8] = {0};
	struct folio *folios[8];
	unsigned int order[8];

	setup_fills(&c, 1 << 16, 2);
	m = fake_mapping(&c, 16ull * FOLIO);
	for (unsigned int i = 0; i < 8; i++) {
		f[i].len = 128 << 10;
		folios[i] = &f[i];
		order[i] = i;
	}
	b.mapping = m;
	b.folios = folios;
	b.nr = 8;
	/* eight raw frames of 32 KiB: a quarter of their bytes */
	b.costed = true;
	b.cost = 8 * (32 << 10) / 4;
	fill_work_init(&w, &b, order, 8, 1, no_done);
	CHECK(!fill_work_share(&c, &w));
	CHECK(!w.shared);
	/* the folios were never there: let it go as if filled */
	atomic_store(&w.left, 1);
	fill_work_put(&w);
	CHECK_EQ(atomic_load(&c.fills.active), 0u);
	mapping_put(m);
	teardown(&c);
}

int main(void)
{
	cache_thread_register();
	RUN(test_seq_1_thread);
	RUN(test_seq_2_threads);
	RUN(test_seq_8_threads);
	RUN(test_waiter_sleeps);
	RUN(test_bad_frame);
	RUN(test_storm);
	RUN(test_busy_not_shared);
	RUN(test_cheap_not_shared);
	cache_thread_unregister();
	return check_done();
}
