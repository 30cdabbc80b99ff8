// SPDX-License-Identifier: MIT
/*
 * readahead: the window state machine, pinned.  A fake mapping of 128 KiB
 * folios; every window read is traced (first folio, last folio, marker).
 * Then window charging at the budget's limit: per_folio reclaims once per
 * failing folio; batch at most twice per request and then stops early;
 * cached frames are skipped and not charged.
 */
#include <pthread.h>

#include "fake.h"

#define NONE ULONG_MAX
#define MAXW 64

static unsigned long tw[MAXW][3];
static int ntw;

static void trace(unsigned long first, unsigned long last,
		  unsigned long marker)
{
	if (ntw < MAXW) {
		tw[ntw][0] = first;
		tw[ntw][1] = last;
		tw[ntw][2] = marker;
	}
	ntw++;
}

static void expect_windows(const unsigned long (*want)[3], int n,
			   const char *what)
{
	bool ok = ntw == n;

	for (int i = 0; ok && i < n; i++)
		ok = tw[i][0] == want[i][0] && tw[i][1] == want[i][1] &&
		     tw[i][2] == want[i][2];
	if (!ok) {
		fprintf(stderr, "%s: windows (first,last,marker):", what);
		for (int i = 0; i < ntw && i < MAXW; i++)
			fprintf(stderr, " (%lu,%lu,%ld)", tw[i][0], tw[i][1],
				tw[i][2] == NONE ? -1L : (long)tw[i][2]);
		fprintf(stderr, "\n");
		check_failures++;
	}
}

struct env {
	struct cache c;
	struct mapping *m;
	struct file_ra_state ra;
	struct sink s;
};

static void env_open(struct env *e, unsigned long ra_pages,
		     unsigned long folios, unsigned long budget_pages,
		     enum ra_reclaim_mode mode)
{
	setup_ra(&e->c, budget_pages, false, ra_pages, mode);
	e->m = fake_mapping(&e->c, folios * FOLIO);
	file_ra_init(&e->ra, ra_pages);
	e->s.buf = malloc(4 << 20);
	ntw = 0;
	ra_trace_hook = trace;
}

static void env_close(struct env *e)
{
	ra_trace_hook = NULL;
	file_ra_destroy(&e->ra);
	mapping_put(e->m);
	cache_thread_offline();
	cache_destroy(&e->c);
	cache_thread_online();
	free(e->s.buf);
}

static void seq_read(struct env *e, uint64_t from, uint64_t to, size_t req)
{
	for (uint64_t pos = from; pos < to; pos += req) {
		CHECK_EQ(read_at(e->m, &e->ra, &e->c.budget.root, pos, req,
				 &e->s),
			 0);
		CHECK(bytes_ok(&e->s, pos));
	}
}

/* ra 128K, 128K reads: each read starts the window one folio ahead. */
static void test_seq_128k(void)
{
	static const unsigned long want[][3] = {
		{0, 0, 0}, {1, 1, 1}, {2, 2, 2}, {3, 3, 3}, {4, 4, 4},
		{5, 5, 5}, {6, 6, 6}, {7, 7, 7}};
	struct env e;

	env_open(&e, 32, 8, 4096, RA_RECLAIM_BATCH);
	seq_read(&e, 0, 8 * FOLIO, FOLIO);
	expect_windows(want, 8, "ra 128K, 128K reads");
	/* every read after the first found its folio already read ahead */
	CHECK_EQ(stat_read(&e.c.budget.root, STAT_CACHE_MISSES), 1);
	env_close(&e);
}

/* 4 KiB reads: the window rounds up to whole folios, same pipeline. */
static void test_seq_4k(void)
{
	static const unsigned long want[][3] = {
		{0, 0, 0}, {1, 1, 1}, {2, 2, 2}, {3, 3, 3}};
	struct env e;

	env_open(&e, 32, 4, 4096, RA_RECLAIM_BATCH);
	seq_read(&e, 0, 4 * FOLIO, 4096);
	expect_windows(want, 4, "ra 128K, 4K reads");
	CHECK_EQ(stat_read(&e.c.budget.root, STAT_CACHE_MISSES), 1);
	env_close(&e);
}

/* ra 4M: the window ramps x4, x2, x2 to 32 folios, marker on its start. */
static void test_seq_4m(void)
{
	static const unsigned long want[][3] = {
		{0, 3, 1},   {4, 11, 4},   {12, 27, 12},
		{28, 59, 28}, {60, 91, 60}, {92, 99, 92}};
	struct env e;

	/* 100 folios: the last window is cut at the end of the file */
	env_open(&e, 1024, 100, 1 << 16, RA_RECLAIM_BATCH);
	seq_read(&e, 0, 100 * FOLIO, FOLIO);
	expect_windows(want, 6, "ra 4M, 128K reads");
	CHECK_EQ(stat_read(&e.c.budget.root, STAT_CACHE_MISSES), 1);
	CHECK_EQ(stat_read(&e.c.budget.root, STAT_RA_WINDOWS), 6);
	env_close(&e);
}

/* 1 MiB reads with ra 4M: the first window covers the request and more. */
static void test_seq_1m(void)
{
	static const unsigned long want[][3] = {
		{0, 15, 8}, {16, 47, 16}, {48, 79, 48}};
	struct env e;

	env_open(&e, 1024, 100, 1 << 16, RA_RECLAIM_BATCH);
	seq_read(&e, 0, 40 * FOLIO, 8 * FOLIO);
	expect_windows(want, 3, "ra 4M, 1M reads");
	env_close(&e);
}

/* Random reads: exactly the folios the request needs, no marker. */
static void test_random(void)
{
	static const unsigned long want[][3] = {
		{10, 10, NONE}, {3, 4, NONE}, {50, 50, NONE}, {20, 20, NONE}};
	struct env e;
	static const uint64_t at[][2] = {{10 * FOLIO + 100, 4096},
					 {3 * FOLIO + 5, FOLIO + 10},
					 {50 * FOLIO, 100},
					 {20 * FOLIO + 4096, 8192}};

	env_open(&e, 1024, 64, 1 << 16, RA_RECLAIM_BATCH);
	for (int i = 0; i < 4; i++) {
		CHECK_EQ(read_at(e.m, &e.ra, &e.c.budget.root, at[i][0],
				 at[i][1], &e.s),
			 0);
		CHECK(bytes_ok(&e.s, at[i][0]));
	}
	expect_windows(want, 4, "random");
	CHECK_EQ(stat_read(&e.c.budget.root, STAT_RA_PAGES), 0);
	env_close(&e);
}

/*
 * Two streams on one open file, interleaved: A from folio 0 in 128 KiB
 * reads, B from folio 40 in 4 KiB reads.  B's misses find history behind
 * them (context readahead) and get windows; A's marker, though B moved the
 * state, starts A's next window (the "not our marker" path).  After the
 * first folio each, neither stream waits for a sync miss.
 */
static void test_interleaved(void)
{
	struct env e;
	long misses_a = 0, misses_b = 0, before;

	env_open(&e, 32, 80, 1 << 16, RA_RECLAIM_BATCH);
	for (int step = 0; step < 12; step++) {
		uint64_t a = (uint64_t)step * FOLIO;

		before = stat_read(&e.c.budget.root, STAT_CACHE_MISSES);
		CHECK_EQ(read_at(e.m, &e.ra, &e.c.budget.root, a, FOLIO, &e.s),
			 0);
		CHECK(bytes_ok(&e.s, a));
		misses_a += stat_read(&e.c.budget.root, STAT_CACHE_MISSES) -
			    before;
		for (int k = 0; k < 32; k++) {
			uint64_t b = 40 * FOLIO + (uint64_t)step * FOLIO +
				     (uint64_t)k * 4096;

			before = stat_read(&e.c.budget.root, STAT_CACHE_MISSES);
			CHECK_EQ(read_at(e.m, &e.ra, &e.c.budget.root, b, 4096,
					 &e.s),
				 0);
			CHECK(bytes_ok(&e.s, b));
			misses_b += stat_read(&e.c.budget.root,
					      STAT_CACHE_MISSES) -
				    before;
		}
	}
	if (misses_a > 1 || misses_b > 2) {
		fprintf(stderr, "interleaved: misses A %ld, B %ld\n", misses_a,
			misses_b);
		check_failures++;
	}
	env_close(&e);
}

/* Fill the whole budget with folios of another file, evictable. */
static struct mapping *fill_budget(struct env *e, unsigned long folios)
{
	struct mapping *x = fake_mapping(&e->c, folios * FOLIO);

	for (unsigned long i = 0; i < folios; i++)
		CHECK_EQ(read_at(x, NULL, &e->c.budget.root, i * FOLIO, 1,
				 &e->s),
			 0);
	drain_all_stock(&e->c.budget);
	return x;
}

/* At the limit, one window of 4 folios (1 demand + 3 speculative). */
static void charge_one_window(enum ra_reclaim_mode mode, long *passes_ra,
			      long *passes)
{
	struct env e;
	struct mapping *x;

	env_open(&e, 1024, 16, 64 * 32, mode); /* first window: 4 folios */
	x = fill_budget(&e, 64);
	ntw = 0;
	CHECK_EQ(counter_margin(&e.c.budget.root.mem), 0);
	long ra0 = stat_read(&e.c.budget.root, STAT_RECLAIM_PASSES_RA);
	long all0 = stat_read(&e.c.budget.root, STAT_RECLAIM_PASSES);

	CHECK_EQ(read_at(e.m, &e.ra, &e.c.budget.root, 0, FOLIO, &e.s), 0);
	CHECK(bytes_ok(&e.s, 0));
	*passes_ra = stat_read(&e.c.budget.root, STAT_RECLAIM_PASSES_RA) - ra0;
	*passes = stat_read(&e.c.budget.root, STAT_RECLAIM_PASSES) - all0;
	CHECK(ntw >= 1 && tw[0][0] == 0 && tw[0][1] == 3);
	for (unsigned long i = 0; i < 4; i++)
		CHECK(mapping_cached(e.m, i));
	CHECK(counter_read(&e.c.budget.root.mem) <= 64 * 32);
	mapping_put(x);
	env_close(&e);
}

static void test_charge_per_folio_vs_batch(void)
{
	long pf_ra, pf_all, b_ra, b_all;

	charge_one_window(RA_RECLAIM_PER_FOLIO, &pf_ra, &pf_all);
	charge_one_window(RA_RECLAIM_BATCH, &b_ra, &b_all);
	/* per_folio: the demand folio's pass, then one per speculative folio */
	CHECK_EQ(pf_ra, 3);
	CHECK_EQ(pf_all, 4);
	/* batch: the demand pass makes headroom; at most one for the rest */
	CHECK(b_ra <= 1);
	CHECK(b_all <= 2);
	fprintf(stderr, "  one 4-folio window at the limit: per_folio %ld "
			"passes, batch %ld\n",
		pf_all, b_all);
}

/* Everything but one folio pinned: batch reclaims twice, then stops. */
static void test_charge_batch_stops_early(void)
{
	struct env e;
	struct mapping *x;
	struct folio *pin[7];

	env_open(&e, 1024, 16, 8 * 32, RA_RECLAIM_BATCH);
	x = fill_budget(&e, 8);
	for (unsigned long i = 0; i < 7; i++) {
		pin[i] = folio_lookup(x, i);
		CHECK(pin[i] && folio_try_get(pin[i]));
	}
	long before = stat_read(&e.c.budget.root, STAT_RECLAIM_PASSES_RA);

	CHECK_EQ(read_at(e.m, &e.ra, &e.c.budget.root, 0, FOLIO, &e.s), 0);
	CHECK(bytes_ok(&e.s, 0));
	/* two reclaim_for_batch calls of at most two passes each */
	long passes = stat_read(&e.c.budget.root, STAT_RECLAIM_PASSES_RA) -
		      before;
	CHECK(passes >= 2 && passes <= 2 * READAHEAD_MAX_RECLAIMS);
	CHECK_EQ(stat_read(&e.c.budget.root, STAT_RA_EARLY_STOPS), 1);
	CHECK(mapping_cached(e.m, 0));
	CHECK(!mapping_cached(e.m, 2));
	CHECK(counter_read(&e.c.budget.root.mem) <= 8 * 32);
	for (int i = 0; i < 7; i++)
		folio_put(pin[i]);
	mapping_put(x);
	env_close(&e);
}

/* Folios already cached are skipped and never charged twice. */
static void test_charge_skips_cached(void)
{
	struct env e;
	long file0, ra0;

	env_open(&e, 1024, 16, 1 << 16, RA_RECLAIM_BATCH);
	CHECK_EQ(read_at(e.m, NULL, &e.c.budget.root, 1 * FOLIO, 1, &e.s), 0);
	CHECK_EQ(read_at(e.m, NULL, &e.c.budget.root, 3 * FOLIO, 1, &e.s), 0);
	file0 = stat_read(&e.c.budget.root, STAT_FILE);
	ra0 = stat_read(&e.c.budget.root, STAT_RA_PAGES);
	ntw = 0;
	CHECK_EQ(read_at(e.m, &e.ra, &e.c.budget.root, 0, FOLIO, &e.s), 0);
	CHECK(ntw >= 1 && tw[0][0] == 0 && tw[0][1] == 3);
	/* only folios 0 (demand) and 2 (speculative) were new */
	CHECK_EQ(stat_read(&e.c.budget.root, STAT_FILE) - file0, 2 * 32);
	CHECK_EQ(stat_read(&e.c.budget.root, STAT_RA_PAGES) - ra0, 32);
	env_close(&e);
}

/* n read-around folios (of 32 pages) used at the window's edge */
static void edges(struct readaround_state *s, int n)
{
	while (n--)
		readaround_feedback(s, true, true, false, 32);
}

/* n read-around folios (of 32 pages) evicted unread */
static void unused(struct readaround_state *s, int n)
{
	while (n--)
		readaround_feedback(s, false, false, false, 32);
}

/*
 * Read-around sizing: grows while readers get to its edges, by a folio
 * while small and x2 from SMALL folios on; shrinks and stops; recovers.
 */
static void test_readaround_sizing(void)
{
	struct readaround_state s;
	struct ra_plan p;

	readaround_init_state(&s, 32, 1024);
	CHECK_EQ(s.window, 32);
	CHECK(readaround_plan(&s, 1000, 1, &p));
	CHECK_EQ(p.start, 1000 - 16);
	CHECK_EQ(p.size, 32);
	CHECK_EQ(p.async_size, 0); /* no marker in a small window */
	/* used inside the window: the window was long enough */
	for (int i = 0; i < 10; i++)
		readaround_feedback(&s, true, false, false, 32);
	CHECK_EQ(s.window, 32);
	/* the reader got to its edge: a folio longer each time up to 8 */
	edges(&s, 1);
	CHECK_EQ(s.window, 64);
	edges(&s, 1);
	CHECK_EQ(s.window, 96);
	edges(&s, 5);
	CHECK_EQ(s.window, 256);
	/* then x2, up to ra_pages */
	edges(&s, 1);
	CHECK_EQ(s.window, 512);
	edges(&s, 3);
	CHECK_EQ(s.window, 1024);
	CHECK(readaround_plan(&s, 5000, 1, &p));
	CHECK_EQ(p.start, 5000 - 512);
	CHECK_EQ(p.size, 1024);
	CHECK_EQ(p.async_size, 256); /* the kernel's marker, 1/4 from the end */
	CHECK(readaround_plan(&s, 100, 1, &p));
	CHECK_EQ(p.start, 0); /* clamped at the start of the file */
	/* unused: /2 each time half a window's worth is evicted unread */
	unused(&s, 16);
	CHECK_EQ(s.window, 512);
	/* back to the size that just shrank (1024): on GROW_BACK edges */
	edges(&s, 3);
	CHECK_EQ(s.window, 512);
	edges(&s, 1);
	CHECK_EQ(s.window, 1024);
	unused(&s, 16);
	CHECK_EQ(s.window, 512);
	unused(&s, 8);
	CHECK_EQ(s.window, 256);
	/* and by a folio from SMALL folios down */
	unused(&s, 4);
	CHECK_EQ(s.window, 224);
	unused(&s, 100);
	CHECK_EQ(s.window, 32);
	/* 100 unused in a row: stopped, but for a probe now and then */
	int plans = 0;

	for (int i = 0; i < 64; i++)
		plans += readaround_plan(&s, 1000, 1, &p);
	CHECK_EQ(plans, 4);
	/* one used read-around folio and it reads around again */
	edges(&s, 1);
	CHECK(readaround_plan(&s, 1000, 1, &p));
	CHECK(s.window >= 32);
	/* back to the size that last shrank (64): on GROW_BACK edges */
	edges(&s, 2);
	CHECK_EQ(s.window, 32);
	edges(&s, 1);
	CHECK_EQ(s.window, 64);
	edges(&s, 1); /* on as before */
	CHECK_EQ(s.window, 96);
}

/* mmap faults over 4 KiB of rq's file at pos: page-cache fills. */
static void fault_burst(struct env *e, uint64_t pos, int pages)
{
	for (int i = 0; i < pages; i++, pos += 4096) {
		read_req_at(e->m, &e->ra, &e->c.budget.root, pos, 4096, true,
			    &e->s);
		CHECK_EQ(e->s.err, 0);
		CHECK(bytes_ok(&e->s, pos));
	}
}

/*
 * Cold bursts (64 pages forward from random points) with nothing evicted:
 * what the last window brought and nobody read is judged at the next
 * miss, so the window settles small instead of growing to ra_pages on
 * the used folios alone.
 */
static void test_readaround_judged(void)
{
	struct env e;
	struct readaround_state *s;
	unsigned long seed = 7, most = 0;

	env_open(&e, 1024, 512, 1 << 20, RA_RECLAIM_BATCH);
	for (int b = 0; b < 60; b++) {
		seed = seed * 6364136223846793005ul + 1442695040888963407ul;
		fault_burst(&e, (seed >> 20) % (500 * FOLIO / 4096) * 4096,
			    64);
		s = atomic_load(&e.m->ra_private);
		if (b >= 20 && s && s->window > most)
			most = s->window;
	}
	CHECK(s != NULL);
	CHECK(most >= 32);
	CHECK(most <= 256); /* 8 folios; without judging it reaches 1024 */
	env_close(&e);
}

/*
 * The seed's cold readers at a 4 MiB window: 64 pages forward from random
 * points, in a budget that holds a quarter of the file.  Of what was read
 * ahead or around, under a quarter may go unread (the goal; 25.3% when
 * windows doubled on any used folio and a fault just past a window read a
 * whole new one), and the window stays near the runs' length, not the
 * power of two above it.
 */
static void test_readaround_cold_unused(void)
{
	struct env e;
	struct group *g;
	struct readaround_state *s;
	unsigned long seed = 11, spec, used;

	env_open(&e, 1024, 2048, 2048 * 32 / 4, RA_RECLAIM_BATCH);
	g = &e.c.budget.root;
	for (int b = 0; b < 400; b++) {
		seed = seed * 6364136223846793005ul + 1442695040888963407ul;
		fault_burst(&e, (seed >> 20) % (2000 * FOLIO / 4096) * 4096,
			    64);
	}
	spec = stat_read(g, STAT_RA_PAGES) + stat_read(g, STAT_READAROUND_PAGES);
	used = stat_read(g, STAT_RA_HITS);
	fprintf(stderr, "  read ahead or around %lu pages, %lu used\n", spec,
		used);
	CHECK(spec > 0);
	CHECK((spec - (used < spec ? used : spec)) * 4 < spec);
	s = atomic_load(&e.m->ra_private);
	CHECK(s && s->window <= 128);
	env_close(&e);
}

/*
 * Engine mode, mmap: a folio whose every page fills took to the kernel's
 * page cache, then evicted, is left by read-around (no fault would reach
 * it) until a fill of it says the kernel dropped a page of it.
 */
static void test_readaround_skips_kernel(void)
{
	struct env e;

	env_open(&e, 1024, 64, 1 << 20, RA_RECLAIM_BATCH);
	readaround_set_mode(READAROUND_FIXED);
	fault_burst(&e, 20 * FOLIO, 2 * FOLIO / 4096); /* all of 20 and 21 */
	fault_burst(&e, 23 * FOLIO, 1);                /* a page of 23 */
	CHECK(mapping_cached(e.m, 22));
	CHECK(!mapping_in_kernel(e.m, 20));
	CHECK_EQ(reclaim_proactive(&e.c.budget.root, 64 * 32), -EAGAIN);
	CHECK(!mapping_cached(e.m, 20) && !mapping_cached(e.m, 22));
	CHECK(mapping_in_kernel(e.m, 20) && mapping_in_kernel(e.m, 21));
	CHECK(!mapping_in_kernel(e.m, 22) && !mapping_in_kernel(e.m, 23));
	/* a fault at 30: its window, 14..45, reads all but 20 and 21 */
	file_ra_destroy(&e.ra);
	file_ra_init(&e.ra, 1024);
	fault_burst(&e, 30 * FOLIO, 1);
	CHECK(mapping_cached(e.m, 19) && mapping_cached(e.m, 22));
	CHECK(!mapping_cached(e.m, 20) && !mapping_cached(e.m, 21));
	/* a fill of 21: the kernel lost a page of it, and asks */
	fault_burst(&e, 21 * FOLIO + 4096, 1);
	CHECK(!mapping_in_kernel(e.m, 21) && mapping_in_kernel(e.m, 20));
	CHECK(mapping_cached(e.m, 21));
	/* an open without keep_cache: the kernel dropped the file's pages */
	mapping_forget_kernel(e.m);
	CHECK(!mapping_in_kernel(e.m, 20));
	readaround_set_mode(READAROUND_ADAPTIVE);
	env_close(&e);
}

/* Read-around behind faults that goes unused moves windows to the fault. */
static void test_readaround_forward(void)
{
	struct readaround_state s;
	struct ra_plan p;
	int centred = 0;

	readaround_init_state(&s, 32, 1024);
	for (int i = 0; i < 7; i++)
		readaround_feedback(&s, true, true, false, 32);
	CHECK_EQ(s.window, 256);
	/* too little evidence yet: centred, as the kernel's */
	for (int i = 0; i < 7; i++)
		readaround_feedback(&s, false, false, true, 32);
	CHECK(readaround_plan(&s, 1000, 1, &p));
	CHECK_EQ(p.start, 1000 - p.size / 2);
	/* 8 behind, none used: from the fault on, a centred probe in 16 */
	readaround_feedback(&s, false, false, true, 32);
	for (int i = 0; i < 64; i++) {
		CHECK(readaround_plan(&s, 1000, 1, &p));
		/* from the fault, or centred */
		CHECK(p.start == 1000 || p.start == 1000 - p.size / 2);
		centred += p.start != 1000;
	}
	CHECK_EQ(centred, 4);
	/* behind folios used again (1 in 4 or more): centred again */
	for (int i = 0; i < 3; i++)
		readaround_feedback(&s, true, true, true, 32);
	for (int i = 0; i < 8; i++) {
		CHECK(readaround_plan(&s, 1000, 1, &p));
		CHECK_EQ(p.start, 1000 - p.size / 2);
	}
}

int main(void)
{
	cache_thread_register();
	RUN(test_seq_128k);
	RUN(test_seq_4k);
	RUN(test_seq_4m);
	RUN(test_seq_1m);
	RUN(test_random);
	RUN(test_interleaved);
	RUN(test_charge_per_folio_vs_batch);
	RUN(test_charge_batch_stops_early);
	RUN(test_charge_skips_cached);
	RUN(test_readaround_sizing);
	RUN(test_readaround_forward);
	RUN(test_readaround_judged);
	RUN(test_readaround_cold_unused);
	RUN(test_readaround_skips_kernel);
	cache_thread_unregister();
	read_at_done();
	return check_done();
}
