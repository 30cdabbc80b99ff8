// SPDX-License-Identifier: MIT
/*
 * The kernel tier (cache/ktier.c) with a fake page cache: the invalidate
 * callback drops ranges from a per-file bitmap of resident pages, as the
 * kernel would.  Fills are charged once per page and never above the
 * budget; reclaim evicts the oldest chunks and drops them on the tier's
 * own thread, never the caller's; a re-read working set is activated by
 * its refaults and a scan is not; forget uncharges; fills handed over whole
 * leave the folio cache; and under threads that fill, lower the limit and
 * reclaim at once, the budget holds and nothing is lost.
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "fake.h"

#define NFILES 4
#define FILE_PAGES (64u << 20 >> ZF_PAGE_SHIFT) /* 64 MiB files */

/* What the "kernel" holds: resident pages per file, and who dropped them. */
static struct fake_kernel {
	pthread_mutex_t lock;
	unsigned char resident[NFILES + 1][FILE_PAGES];
	unsigned long invalidations;
	bool on_caller; /* an invalidation ran on a filling thread */
} fk = {.lock = PTHREAD_MUTEX_INITIALIZER};
static __thread bool filling;

static void fake_invalidate(uint64_t id, uint64_t off, uint64_t len,
			    void *priv)
{
	(void)priv;
	pthread_mutex_lock(&fk.lock);
	for (uint64_t p = off >> ZF_PAGE_SHIFT;
	     p < (off + len) >> ZF_PAGE_SHIFT && p < FILE_PAGES; p++)
		fk.resident[id][p] = 0;
	fk.invalidations++;
	if (filling)
		fk.on_caller = true;
	pthread_mutex_unlock(&fk.lock);
}

/* The kernel filled [pos, pos + len) of file id and told the tier. */
static void fill(struct cache *c, struct group *g, uint64_t id, uint64_t pos,
		 size_t len)
{
	pthread_mutex_lock(&fk.lock);
	for (uint64_t p = pos >> ZF_PAGE_SHIFT;
	     p < (pos + len + ZF_PAGE_SIZE - 1) >> ZF_PAGE_SHIFT; p++)
		fk.resident[id][p] = 1;
	pthread_mutex_unlock(&fk.lock);
	filling = true;
	ktier_fill_begin(c, g, id, (uint64_t)FILE_PAGES << ZF_PAGE_SHIFT, pos,
			 len);
	ktier_fill_end(c, id, pos, len);
	filling = false;
}

static unsigned long resident_pages(void)
{
	unsigned long n = 0;

	pthread_mutex_lock(&fk.lock);
	for (int f = 0; f <= NFILES; f++)
		for (unsigned int p = 0; p < FILE_PAGES; p++)
			n += fk.resident[f][p];
	pthread_mutex_unlock(&fk.lock);
	return n;
}

/* Wait until the tier's thread has dropped everything queued. */
static void settle(struct cache *c)
{
	for (int i = 0; i < 5000 && ktier_queued(c); i++)
		usleep(1000);
	CHECK_EQ(ktier_queued(c), 0);
}

static void start(struct cache *c, unsigned long budget_pages)
{
	memset(fk.resident, 0, sizeof(fk.resident));
	fk.invalidations = 0;
	fk.on_caller = false;
	setup(c, budget_pages, true);
	CHECK_EQ(ktier_enable(c, fake_invalidate, NULL), 0);
}

static void stop(struct cache *c)
{
	ktier_disable(c);
	CHECK_EQ(counter_read(&c->budget.root.mem), stock_pages(&c->budget));
	cache_destroy(c);
}

static void test_charge_once(void)
{
	struct cache c;
	struct group *g = &c.budget.root;

	cache_thread_register();
	start(&c, 4096);
	fill(&c, g, 1, 0, 128 << 10);
	CHECK_EQ(stat_read(g, STAT_KERNEL_FILE), 32);
	/* the same pages again (the kernel dropped them on its own): no
	 * second charge */
	fill(&c, g, 1, 0, 64 << 10);
	CHECK_EQ(stat_read(g, STAT_KERNEL_FILE), 32);
	/* a page in the middle of a chunk, and a short tail: whole pages */
	fill(&c, g, 1, 1 << 20, 4096);
	fill(&c, g, 1, (2 << 20) + 8192, 100);
	CHECK_EQ(stat_read(g, STAT_KERNEL_FILE), 34);
	CHECK_EQ(stat_read(g, STAT_KERNEL_FILLS), 34);
	CHECK_EQ(ktier_pages(g), 34);
	CHECK(counter_read(&g->mem) >= 34);
	/* the kernel forgot the inode: all of it uncharged at once */
	ktier_forget(&c, 1);
	CHECK_EQ(stat_read(g, STAT_KERNEL_FILE), 0);
	CHECK_EQ(ktier_pages(g), 0);
	CHECK_EQ(counter_read(&g->mem), stock_pages(&c.budget));
	stop(&c);
	cache_thread_unregister();
}

/* ktier_tracks(): a file is tracked from its fill's begin (pages pending)
 * until the kernel forgets it or every page of it is evicted (a push of
 * it passes over it in between: push.c).  ktier_evict_all() drops a fill
 * in flight at its end. */
static void test_tracks(void)
{
	struct cache c;
	struct group *g = &c.budget.root;

	cache_thread_register();
	start(&c, 4096);
	CHECK(!ktier_tracks(&c, 3));
	ktier_fill_begin(&c, g, 3, 8192, 0, 8192); /* in flight */
	CHECK_EQ(ktier_tracks(&c, 3), 2);
	CHECK(!ktier_tracks(&c, 4));
	ktier_fill_end(&c, 3, 0, 8192);
	CHECK(ktier_tracks(&c, 3));
	ktier_forget(&c, 3);
	CHECK(!ktier_tracks(&c, 3));
	/* every page dropped (ktier_evict_all(), as for a lying table) */
	fill(&c, g, 3, 0, 8192);
	CHECK(ktier_tracks(&c, 3));
	ktier_evict_all(&c);
	settle(&c);
	CHECK(!ktier_tracks(&c, 3));
	/* a fill in flight then (its pages locked: rule 1) stays until it
	 * ends, and goes then, without another ktier_evict_all() */
	fk.resident[3][0] = fk.resident[3][1] = 1;
	ktier_fill_begin(&c, g, 3, 8192, 0, 8192);
	ktier_evict_all(&c);
	settle(&c);
	CHECK(fk.resident[3][0]);
	CHECK_EQ(ktier_tracks(&c, 3), 2);
	ktier_fill_end(&c, 3, 0, 8192);
	settle(&c);
	CHECK(!fk.resident[3][0] && !fk.resident[3][1]);
	CHECK(!ktier_tracks(&c, 3));
	CHECK_EQ(ktier_pages(g), 0);
	stop(&c);
	cache_thread_unregister();
}

static void test_evict_oldest(void)
{
	struct cache c;
	struct group *g = &c.budget.root;
	unsigned long max = 1024; /* 4 MiB */

	cache_thread_register();
	start(&c, max);
	/* 16 MiB read through, in the kernel's 128 KiB windows */
	for (uint64_t pos = 0; pos < (16 << 20); pos += 128 << 10) {
		fill(&c, g, 2, pos, 128 << 10);
		CHECK(counter_read(&g->mem) <= (long)max);
	}
	settle(&c);
	CHECK(!fk.on_caller);
	CHECK(fk.invalidations > 0);
	CHECK_EQ(stat_read(g, STAT_KERNEL_FILLS), 4096);
	CHECK_EQ(stat_read(g, STAT_KERNEL_FILE) +
			 stat_read(g, STAT_KERNEL_EVICTED),
		 4096);
	/* what the kernel still holds is what is charged, and the newest */
	CHECK_EQ(resident_pages(), (unsigned long)stat_read(g, STAT_KERNEL_FILE));
	CHECK(stat_read(g, STAT_KERNEL_FILE) <= (long)max);
	CHECK(stat_read(g, STAT_KERNEL_FILE) > (long)max / 2);
	CHECK(fk.resident[2][(16 << 20 >> ZF_PAGE_SHIFT) - 1]);
	CHECK(!fk.resident[2][0]);
	/* a scan never refaults what it did not read twice */
	CHECK_EQ(stat_read(g, STAT_WORKINGSET_REFAULT), 0);
	/* memory.reclaim frees from the tier as well */
	CHECK_EQ(reclaim_proactive(g, 512), 0);
	settle(&c);
	CHECK(stat_read(g, STAT_KERNEL_FILE) <= (long)max - 512);
	CHECK_EQ(resident_pages(), (unsigned long)stat_read(g, STAT_KERNEL_FILE));
	/* and a lower memory.max brings it under */
	CHECK_EQ(group_set_max(g, 100), 0);
	settle(&c);
	CHECK(stat_read(g, STAT_KERNEL_FILE) <= 100);
	CHECK(resident_pages() <= 100);
	stop(&c);
	cache_thread_unregister();
}

/* At unmount the thread halts while fills go on: nothing more is dropped
 * (its /dev/fuse is about to close), the budget still holds, fills never
 * wait for a thread that is gone, and what stays queued is freed. */
static void test_halt(void)
{
	struct cache c;
	struct group *g = &c.budget.root;
	unsigned long max = 256, dropped;

	cache_thread_register();
	start(&c, max);
	for (uint64_t pos = 0; pos < (4 << 20); pos += 128 << 10)
		fill(&c, g, 2, pos, 128 << 10);
	settle(&c);
	ktier_halt(&c);
	dropped = fk.invalidations;
	for (uint64_t pos = 4 << 20; pos < (8 << 20); pos += 128 << 10) {
		fill(&c, g, 2, pos, 128 << 10);
		CHECK(counter_read(&g->mem) <= (long)max);
	}
	CHECK_EQ(fk.invalidations, dropped);
	CHECK(ktier_queued(&c) > 0);
	ktier_halt(&c); /* twice: nothing */
	stop(&c); /* frees the queue (ASan's leak check) */
	CHECK_EQ(fk.invalidations, dropped);
	cache_thread_unregister();
}

/*
 * A fill in flight (its pages locked in the kernel) is never dropped: the
 * invalidation would wait for the fill, and if the daemon died meanwhile,
 * for ever.  What a fill could not be charged for is dropped after it.
 */
static void test_in_flight(void)
{
	struct cache c;
	struct group *g = &c.budget.root;
	uint64_t size = (uint64_t)FILE_PAGES << ZF_PAGE_SHIFT;

	cache_thread_register();
	start(&c, 256); /* 1 MiB */
	fk.resident[1][0] = 1;
	ktier_fill_begin(&c, g, 1, size, 0, 128 << 10); /* in flight */
	for (uint64_t pos = 1 << 20; pos < (8 << 20); pos += 128 << 10)
		fill(&c, g, 2, pos, 128 << 10);
	settle(&c);
	CHECK(fk.resident[1][0]); /* the oldest, but not dropped */
	CHECK(counter_read(&g->mem) <= 256);
	ktier_fill_end(&c, 1, 0, 128 << 10);
	for (uint64_t pos = 8 << 20; pos < (10 << 20); pos += 128 << 10)
		fill(&c, g, 2, pos, 128 << 10);
	settle(&c);
	CHECK(!fk.resident[1][0]); /* done, then evicted */
	/* a fill bigger than the whole budget: what is not counted is
	 * dropped once the fill is done, and only then */
	CHECK_EQ(group_set_max(g, 8), 0);
	pthread_mutex_lock(&fk.lock);
	for (unsigned int p = 0; p < 64; p++)
		fk.resident[3][p] = 1;
	pthread_mutex_unlock(&fk.lock);
	ktier_fill_begin(&c, g, 3, size, 0, 256 << 10);
	settle(&c);
	CHECK(fk.resident[3][63]);
	ktier_fill_end(&c, 3, 0, 256 << 10);
	settle(&c);
	CHECK(!fk.resident[3][63]);
	CHECK(stat_read(g, STAT_KERNEL_FILE) <= 8);
	stop(&c);
	cache_thread_unregister();
}

/* Read [0, bytes) of file id through, as the kernel's readahead does. */
static void read_through(struct cache *c, uint64_t id, uint64_t bytes)
{
	for (uint64_t pos = 0; pos < bytes; pos += 128 << 10) {
		bool hit;

		pthread_mutex_lock(&fk.lock);
		hit = fk.resident[id][pos >> ZF_PAGE_SHIFT];
		pthread_mutex_unlock(&fk.lock);
		if (!hit) /* a hit never reaches the daemon */
			fill(c, &c->budget.root, id, pos, 128 << 10);
	}
}

static void test_refaults(void)
{
	struct cache c;
	struct group *g = &c.budget.root;

	/* a scan of 4x the tier, twice: refaults, none of them recent */
	cache_thread_register();
	start(&c, 2048); /* 8 MiB */
	read_through(&c, 1, 32 << 20);
	settle(&c);
	read_through(&c, 1, 32 << 20);
	CHECK(stat_read(g, STAT_WORKINGSET_REFAULT) > 0);
	CHECK_EQ(stat_read(g, STAT_WORKINGSET_ACTIVATE), 0);
	stop(&c);

	/*
	 * A working set of 3 MiB read again and again while a stream of
	 * 2 MiB goes by between its reads: pushed out at first, its
	 * refaults are recent, so it is activated and then stays while
	 * the streams are evicted.
	 */
	start(&c, 2048);
	for (int round = 0; round < 12; round++) {
		read_through(&c, 3, 3 << 20);
		settle(&c);
		for (uint64_t pos = 0; pos < (2 << 20); pos += 128 << 10)
			fill(&c, g, 4, (uint64_t)round * (2 << 20) + pos,
			     128 << 10);
		settle(&c);
	}
	CHECK(stat_read(g, STAT_WORKINGSET_ACTIVATE) > 0);
	{
		long refaults = stat_read(g, STAT_WORKINGSET_REFAULT);

		/* protected now: another round brings no refault */
		read_through(&c, 3, 3 << 20);
		settle(&c);
		for (uint64_t pos = 0; pos < (2 << 20); pos += 128 << 10)
			fill(&c, g, 4, (30u << 20) + pos, 128 << 10);
		settle(&c);
		read_through(&c, 3, 3 << 20);
		CHECK_EQ(stat_read(g, STAT_WORKINGSET_REFAULT), refaults);
	}
	stop(&c);
	cache_thread_unregister();
}

/* A fill that takes a whole folio hands it over; a partial one keeps it. */
/* A fill of the kernel tier: [pos, pos + len) of m, every byte checked. */
static void tiered_fill(struct ra_request *r, struct mapping *m, uint64_t pos,
			size_t len, struct sink *s)
{
	if (pos + len > m->size)
		len = m->size - pos;
	s->len = 0;
	ra_request_init(r, m, NULL, &m->cache->budget.root, NULL, pos, len,
			false);
	r->rq.fill = r->rq.tiered = true;
	CHECK_EQ(cache_read(&r->rq, sink_reply, s), 0);
	CHECK_EQ(s->len, len);
	CHECK(bytes_ok(s, pos));
	cache_quiescent();
}

static void test_hand_over(void)
{
	struct cache c;
	struct group *g = &c.budget.root;
	struct sink s = {.buf = malloc(1 << 20)};

	cache_thread_register();
	start(&c, 4096);
	struct mapping *m = fake_mapping(&c, 8 * FOLIO);
	struct ra_request *r = calloc(1, sizeof(*r));

	ra_request_init(r, m, NULL, g, NULL, 0, 2 * FOLIO, false);
	r->rq.fill = r->rq.tiered = true;
	CHECK_EQ(cache_read(&r->rq, sink_reply, &s), 0);
	CHECK(bytes_ok(&s, 0));
	CHECK_EQ(stat_read(g, STAT_KERNEL_HANDOVERS), 2);
	CHECK_EQ(stat_read(g, STAT_FILE), 0);
	s.len = 0;
	ra_request_init(r, m, NULL, g, NULL, 3 * FOLIO + 4096, 8192, false);
	r->rq.fill = r->rq.tiered = true;
	CHECK_EQ(cache_read(&r->rq, sink_reply, &s), 0);
	CHECK(bytes_ok(&s, 3 * FOLIO + 4096));
	CHECK_EQ(stat_read(g, STAT_KERNEL_HANDOVERS), 2);
	CHECK_EQ(stat_read(g, STAT_FILE), 32);
	/* the rest of that folio, in two fills: the last of it leaves */
	tiered_fill(r, m, 3 * FOLIO, 4096, &s);
	CHECK_EQ(stat_read(g, STAT_KERNEL_HANDOVERS), 2);
	tiered_fill(r, m, 3 * FOLIO + 12288, FOLIO - 12288, &s);
	CHECK_EQ(stat_read(g, STAT_KERNEL_HANDOVERS), 3);
	CHECK_EQ(stat_read(g, STAT_FILE), 0);
	/* frames of 1 MiB (a zstd CLI file's pieces) in the kernel's 128 KiB
	 * fills, out of order and overlapping: each leaves with its last
	 * part, hot or not, and never before */
	struct mapping *big = mapping_create(&c, &fake_ops, NULL, 4 << 20, 4,
					     1 << 20, NULL);
	for (int round = 0; round < 3; round++) /* makes them hot */
		tiered_fill(r, big, (1 << 20) + 65536, 4096, &s);
	for (uint64_t f = 0; f < 4; f++)
		for (uint64_t k = 0; k < 8; k++) {
			uint64_t pos = (f << 20) + ((k * 5) % 8) * FOLIO;

			CHECK_EQ(stat_read(g, STAT_KERNEL_HANDOVERS), 3 + f);
			tiered_fill(r, big, pos, k == 3 ? 2 * FOLIO : FOLIO, &s);
		}
	CHECK_EQ(stat_read(g, STAT_KERNEL_HANDOVERS), 7);
	CHECK_EQ(stat_read(g, STAT_FILE), 0);
	CHECK(stat_read(g, STAT_LOCKLESS_READS) > 0);
	cache_quiescent();
	cache_expedite(&c); /* the hot ones' data waited for a grace period */
	mapping_put(big);
	free(r);
	mapping_put(m);
	stop(&c);
	cache_thread_unregister();
	free(s.buf);
}

/*
 * A fill of the kernel tier as fs/ops.c makes it: [pos, pos + len) of
 * file id, which is [base, base + size) of m, charged to the tier before
 * it is read and ended after.
 */
static void file_fill(struct ra_request *r, struct mapping *m, uint64_t id,
		      uint64_t base, uint64_t size, uint64_t pos, size_t len,
		      struct sink *s)
{
	struct cache *c = m->cache;

	ktier_fill_begin(c, &c->budget.root, id,
			 (uint64_t)FILE_PAGES << ZF_PAGE_SHIFT, pos, len);
	s->len = 0;
	ra_request_init(r, m, NULL, &c->budget.root, NULL, base + pos, len,
			false);
	r->rq.fill = r->rq.tiered = true;
	r->rq.tier_id = id;
	r->rq.tier_base = base;
	r->rq.tier_size = size;
	CHECK_EQ(cache_read(&r->rq, sink_reply, s), 0);
	CHECK_EQ(s->len, len);
	CHECK(bytes_ok(s, base + pos));
	cache_quiescent();
	ktier_fill_end(c, id, pos, len);
}

/*
 * A fill of part of a folio whose other pages the tier holds already
 * (filled before, from a folio of the same frame since evicted) hands it
 * over: kept, it would only double them.  Not while a page of it is
 * missing from the tier or still being filled; the part of a folio that
 * is another file's counts for nothing.
 */
static void test_tier_holds_rest(void)
{
	struct cache c;
	struct group *g = &c.budget.root;
	struct sink s = {.buf = malloc(1 << 20)};

	cache_thread_register();
	start(&c, 4096);
	struct mapping *m = fake_mapping(&c, 8 * FOLIO);
	struct ra_request *r = calloc(1, sizeof(*r));

	/* file 1 is all of m: the tier holds folio 2 but its second page,
	 * and folio 4 but its second and third */
	fill(&c, g, 1, 2 * FOLIO, 4096);
	fill(&c, g, 1, 2 * FOLIO + 8192, FOLIO - 8192);
	fill(&c, g, 1, 4 * FOLIO, 4096);
	fill(&c, g, 1, 4 * FOLIO + 12288, FOLIO - 12288);
	file_fill(r, m, 1, 0, m->size, 2 * FOLIO + 4096, 4096, &s);
	CHECK_EQ(stat_read(g, STAT_KERNEL_HANDOVERS), 1);
	CHECK_EQ(stat_read(g, STAT_FILE), 0);
	file_fill(r, m, 1, 0, m->size, 4 * FOLIO + 4096, 4096, &s);
	CHECK_EQ(stat_read(g, STAT_KERNEL_HANDOVERS), 1);
	CHECK_EQ(stat_read(g, STAT_FILE), 32);
	file_fill(r, m, 1, 0, m->size, 4 * FOLIO + 8192, 4096, &s);
	CHECK_EQ(stat_read(g, STAT_KERNEL_HANDOVERS), 2);
	CHECK_EQ(stat_read(g, STAT_FILE), 0);
	/* file 2 is [5 folios, 6.5 folios) of m: all of its half of folio 6
	 * is in the tier, the other half is another file's */
	fill(&c, g, 2, FOLIO, FOLIO / 2);
	file_fill(r, m, 2, 5 * FOLIO, FOLIO + FOLIO / 2, FOLIO + 4096, 4096,
		  &s);
	CHECK_EQ(stat_read(g, STAT_KERNEL_HANDOVERS), 2);
	CHECK_EQ(stat_read(g, STAT_FILE), 32);
	/* file 3 starts 100 bytes before folio 7: its page 0 holds the first
	 * 3996 bytes of the folio, its page 32 the last 100; held whole,
	 * pages count for the folio's part of them */
	fill(&c, g, 3, 0, FOLIO);
	file_fill(r, m, 3, 7 * FOLIO - 100, FOLIO + 100, 8192, 4096, &s);
	CHECK_EQ(stat_read(g, STAT_KERNEL_HANDOVERS), 2);
	fill(&c, g, 3, FOLIO, 100);
	file_fill(r, m, 3, 7 * FOLIO - 100, FOLIO + 100, 12288, 4096, &s);
	CHECK_EQ(stat_read(g, STAT_KERNEL_HANDOVERS), 3);
	/* a fill still in flight is not the kernel's yet: all of folio 6 of
	 * file 1 but its first page is being filled, and a fill of that page
	 * keeps the folio until the other ends */
	ktier_fill_begin(&c, g, 1, (uint64_t)FILE_PAGES << ZF_PAGE_SHIFT,
			 6 * FOLIO + 4096, FOLIO - 4096);
	file_fill(r, m, 1, 0, m->size, 6 * FOLIO, 4096, &s);
	CHECK_EQ(stat_read(g, STAT_KERNEL_HANDOVERS), 3);
	ktier_fill_end(&c, 1, 6 * FOLIO + 4096, FOLIO - 4096);
	file_fill(r, m, 1, 0, m->size, 6 * FOLIO, 4096, &s);
	CHECK_EQ(stat_read(g, STAT_KERNEL_HANDOVERS), 4);
	/* a folio of 1 MiB (a zstd CLI file's piece), 256 pages: the tier
	 * holds all of it but page 100, runs across its 64-page windows; the
	 * fill of page 100 hands it over */
	struct mapping *big = mapping_create(&c, &fake_ops, NULL, 2 << 20, 2,
					     1 << 20, NULL);
	fill(&c, g, 4, 1 << 20, 100 * 4096);
	fill(&c, g, 4, (1 << 20) + 101 * 4096, (1 << 20) - 101 * 4096);
	file_fill(r, big, 4, 0, big->size, (1 << 20) + 100 * 4096, 4096, &s);
	CHECK_EQ(stat_read(g, STAT_KERNEL_HANDOVERS), 5);
	/* a folio of 768 KiB, 192 pages, covered a bit per 3 pages: bits
	 * that straddle the windows' edges (pages 63-65, 126-128) are set
	 * only by runs noted whole across them */
	struct mapping *odd = mapping_create(&c, &fake_ops, NULL, 768 << 10, 1,
					     768 << 10, NULL);
	fill(&c, g, 3, 0, 150 * 4096); /* file 3 again: all of odd */
	fill(&c, g, 3, 151 * 4096, 41 * 4096);
	file_fill(r, odd, 3, 0, odd->size, 150 * 4096, 4096, &s);
	CHECK_EQ(stat_read(g, STAT_KERNEL_HANDOVERS), 6);
	cache_quiescent();
	cache_expedite(&c);
	mapping_put(odd);
	mapping_put(big);
	mapping_put(m);
	free(r);
	stop(&c);
	cache_thread_unregister();
	free(s.buf);
}

/*
 * 4 MiB in the tier and 1 MiB of folios partly handed over (as pieces of a
 * frame decodable only from its start, or not), then reclaim.
 *
 * Reclaim presses a folio page FOLIO_TIER_WEIGHT times harder than a tier
 * page: a pass of 64 pages takes at most a chunk from the tier and the
 * rest from the folios (weighed alike, it took two chunks and no folio).
 *
 * Pieces are pressed after the tier: a pass of 64 pages takes them all
 * from the tier; with the tier gone, the budget still holds, and the
 * pieces go too.
 */
static void tier_and_folios(bool pieces)
{
	struct cache c;
	struct group *g = &c.budget.root;
	struct sink s = {.buf = malloc(1 << 20)};
	unsigned long kt;

	cache_thread_register();
	start(&c, 4096);
	struct mapping *m = fake_mapping(&c, 8 * FOLIO);
	struct ra_request *r = calloc(1, sizeof(*r));

	for (uint64_t pos = 0; pos < (4 << 20); pos += 128 << 10)
		fill(&c, g, 1, pos, 128 << 10);
	for (uint64_t i = 0; i < 8; i++) {
		tiered_fill(r, m, i * FOLIO + 4096, 4096, &s);
		if (pieces)
			folio_set(folio_lookup(m, i), FOLIO_PIECE);
	}
	CHECK_EQ(stat_read(g, STAT_FILE), 8 * 32);
	kt = ktier_pages(g);
	CHECK_EQ(kt, 1024);
	CHECK_EQ(reclaim_proactive(g, 64), 0);
	if (!pieces) {
		CHECK(ktier_pages(g) >= kt - 32);
		CHECK(stat_read(g, STAT_FILE) <= 8 * 32 - 32);
	} else {
		CHECK_EQ(stat_read(g, STAT_FILE), 8 * 32);
		CHECK(ktier_pages(g) <= kt - 64);
		kt = ktier_pages(g);
		CHECK_EQ(reclaim_proactive(g, kt + 32), 0);
		CHECK_EQ(ktier_pages(g), 0);
		CHECK(stat_read(g, STAT_FILE) <= 8 * 32 - 32);
	}
	cache_quiescent();
	mapping_put(m);
	free(r);
	stop(&c);
	cache_thread_unregister();
	free(s.buf);
}

static void test_folios_pressed(void)
{
	tier_and_folios(false);
}

static void test_pieces_spared(void)
{
	tier_and_folios(true);
}

/*
 * Readahead not read yet goes last when the tier cannot give (its fills in
 * flight): a folio read twice is spared once by its reference, and the
 * folio behind it on the LRU was a stream's next window, evicted unread.
 */
static void test_unread_spared(void)
{
	struct cache c;
	struct group *g = &c.budget.root;
	struct sink s = {.buf = malloc(1 << 20)};
	struct file_ra_state ra;
	uint64_t size = (uint64_t)FILE_PAGES << ZF_PAGE_SHIFT;

	cache_thread_register();
	start(&c, 4096);
	file_ra_init(&ra, 32);
	struct mapping *m = fake_mapping(&c, 8 * FOLIO);

	/* a stream: its next window comes in unread */
	for (uint64_t pos = 0; pos < FOLIO; pos += 16384) {
		s.len = 0;
		CHECK_EQ(read_at(m, &ra, g, pos, 16384, &s), 0);
		CHECK(bytes_ok(&s, pos));
	}
	long unread = stat_read(g, STAT_RA_UNREAD);
	CHECK(unread > 0);
	/* the read folio read again: referenced */
	s.len = 0;
	CHECK_EQ(read_at(m, &ra, g, 0, 4096, &s), 0);
	/* the kernel tier holds only a fill in flight, which cannot go */
	ktier_fill_begin(&c, g, 1, size, 0, 256 << 10);
	CHECK_EQ(reclaim_proactive(g, 32), 0);
	CHECK_EQ(stat_read(g, STAT_RA_UNUSED_EVICTED), 0);
	CHECK_EQ(stat_read(g, STAT_RA_UNREAD), unread);
	CHECK(!mapping_cached(m, 0));
	/* with nothing else left, the budget still holds: unread goes too */
	CHECK_EQ(reclaim_proactive(g, (unsigned long)unread), 0);
	CHECK(stat_read(g, STAT_RA_UNUSED_EVICTED) > 0);
	ktier_fill_end(&c, 1, 0, 256 << 10);
	read_at_done();
	file_ra_destroy(&ra);
	cache_quiescent();
	mapping_put(m);
	stop(&c);
	cache_thread_unregister();
	free(s.buf);
}

struct storm {
	struct cache *c;
	atomic_bool stop;
	atomic_long over; /* times usage was seen above the limit */
	atomic_int next_id;
};

/* The kernel evicts inode id: its pages go, then FORGET. */
static void forget(struct cache *c, uint64_t id)
{
	pthread_mutex_lock(&fk.lock);
	memset(fk.resident[id], 0, sizeof(fk.resident[id]));
	pthread_mutex_unlock(&fk.lock);
	ktier_forget(c, id);
}

/* Each filler reads its own file (an open file holds its inode). */
static void *storm_filler(void *arg)
{
	struct storm *st = arg;
	unsigned long long seed = (unsigned long long)pthread_self() | 1;
	uint64_t id = (uint64_t)atomic_fetch_add(&st->next_id, 1) + 1;

	cache_thread_register();
	for (int i = 0; i < 20000 && !atomic_load(&st->stop); i++) {
		uint64_t pos = (test_rand(&seed) % (FILE_PAGES - 64))
			       << ZF_PAGE_SHIFT;
		size_t len = (1 + test_rand(&seed) % 64) << ZF_PAGE_SHIFT;

		fill(st->c, &st->c->budget.root, id, pos, len);
		if (i % 997 == 0)
			forget(st->c, id);
		cache_quiescent();
	}
	cache_thread_unregister();
	return NULL;
}

static void *storm_limits(void *arg)
{
	struct storm *st = arg;
	struct group *g = &st->c->budget.root;
	long limits[] = {2048, 512, 4096, 256, 1024};

	cache_thread_register();
	for (int i = 0; !atomic_load(&st->stop); i++) {
		long usage, max;

		group_set_max(g, limits[i % 5]);
		reclaim_proactive(g, 64);
		counter_snapshot(&g->mem, &usage, &max);
		if (usage > max)
			atomic_fetch_add(&st->over, 1);
		cache_quiescent();
		usleep(500);
	}
	cache_thread_unregister();
	return NULL;
}

static void test_storm(void)
{
	struct cache c;
	struct storm st = {.c = &c};
	pthread_t fillers[4], limits;
	struct group *g = &c.budget.root;

	start(&c, 2048);
	pthread_create(&limits, NULL, storm_limits, &st);
	for (int i = 0; i < 4; i++)
		pthread_create(&fillers[i], NULL, storm_filler, &st);
	for (int i = 0; i < 4; i++)
		pthread_join(fillers[i], NULL);
	atomic_store(&st.stop, true);
	pthread_join(limits, NULL);
	CHECK_EQ(atomic_load(&st.over), 0);
	CHECK(!fk.on_caller);
	settle(&c);
	CHECK_EQ(stat_read(g, STAT_KERNEL_FILE), (long)ktier_pages(g));
	CHECK(stat_read(g, STAT_KERNEL_FILE) <= 4096);
	/* what the kernel holds is never more than the tier counts */
	CHECK(resident_pages() <= (unsigned long)stat_read(g, STAT_KERNEL_FILE));
	stop(&c);
}

int main(void)
{
	RUN(test_charge_once);
	RUN(test_tracks);
	RUN(test_evict_oldest);
	RUN(test_halt);
	RUN(test_in_flight);
	RUN(test_refaults);
	RUN(test_hand_over);
	RUN(test_tier_holds_rest);
	RUN(test_folios_pressed);
	RUN(test_pieces_spared);
	RUN(test_unread_spared);
	RUN(test_storm);
	return check_done();
}
