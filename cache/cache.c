// SPDX-License-Identifier: MIT
/*
 * The cache of a mount, and the lifetime and geometry of mappings.
 *
 * A mapping's folios are the file's frames: folio i holds the content
 * [starts[i], starts[i + 1]), or with a fixed folio_size, [i * size, ...).
 * The files are read-only, so the count is fixed and the index is a plain
 * array of atomic pointers, looked up under RCU without locks (DESIGN 4).
 */
#include <errno.h>
#include <stdlib.h>

#include "internal.h"

/*
 * Reclaim from both tiers in proportion to what each holds, weighed (see
 * below): folios (lru.c) and, with cache=kernel, the page cache's chunks
 * (ktier.c).  A folio whose every byte the kernel holds has left
 * (read.c), so what the folio LRU keeps is frames still serving
 * neighbouring fills, and readahead not read yet (a dataset in a store
 * reads ahead of the fills): the youngest pages of all, and the next a
 * stream needs, so they count for no share; a tier's ages are not the
 * other's, and the kernel's one LRU would take the old fills first.
 * Whatever one tier cannot give, the other is asked for, and readahead not
 * read yet goes last of all: it is a stream's next windows, and when the
 * tier cannot give because its chunks are fills still in flight, those
 * must not push the windows out.  So do the pieces of a frame decodable
 * only from its start (a plain `zstd FILE`): the kernel's fills take such a
 * 1 MiB piece in 128 KiB parts, and one evicted before its last part is
 * taken starts the frame over from its first byte (a 1.3 GB file read
 * through once at budget=256M: 51 restarts, 37 GB decoded to get back).
 *
 * A folio page weighs FOLIO_TIER_WEIGHT tier pages in the proportion.  A
 * page in the kernel tier serves every read of it with no round trip; a
 * page of a folio only serves a fill, once, and then is in the tier too.
 * Weighed alike, random fills of a working set that just fits took the
 * budget over: each kept its frame for the one page it handed over, and
 * each such folio pushed tier pages out, which came back as more such
 * fills.  Pressed harder, folios live a fraction of a tier page's time,
 * still long enough for their neighbours' fills; much harder, and cold
 * mmap readers decode frames again (doc/BENCHMARKS.md has the weights
 * measured).  The tier gives whole chunks, more than a small pass's
 * share: what it gives beyond its share counts for its next shares
 * (ktier_shrink()).
 */
#define FOLIO_TIER_WEIGHT 32

/*
 * The root's own part of a pass at g, after the folios of both tiers gave
 * got of nr: the compressed cache's entries, then, for reclaim the user
 * asked for, the user's idle decoders (shrink_other).  Both are charged to the root, so only its turn takes
 * them, and only what the groups below it could not give (their folios
 * come first, and their turns in the same walk take them).
 */
static unsigned long root_turn(struct cache *c, struct group *g,
			       unsigned long nr, unsigned long got)
{
	unsigned long more;
	long below;

	if (g != &c->budget.root || got >= nr)
		return 0;
	/* the subtree's pages (the root's counts are hierarchical) less its
	 * own lists' */
	below = stat_read(g, STAT_FILE) + stat_read(g, STAT_KERNEL_FILE) -
		(long)lru_pages(g) - (long)ktier_pages(g);
	if (below > (long)(nr - got))
		return 0;
	more = ccache_shrink(c, nr - got);
	if (got + more < nr && c->shrink_other && reclaim_user_asked())
		more += c->shrink_other(c->shrink_other_arg, nr - got - more);
	return more;
}

static unsigned long cache_shrink(struct group *g, unsigned long nr,
				  unsigned long *scanned, void *priv)
{
	struct cache *c = priv;
	unsigned long k = ktier_pages(g), e, nk, got, kscanned = 0, lscanned = 0;
	long unread;

	if (!k) {
		got = lru_shrink(g, nr, scanned, false);
		return got + root_turn(c, g, nr, got);
	}
	e = lru_pages(g);
	unread = stat_read(g, STAT_RA_UNREAD);
	e -= unread <= 0 ? 0 : (unsigned long)unread < e ? (unsigned long)unread
							  : e;
	e *= FOLIO_TIER_WEIGHT;
	nk = (unsigned long)(((unsigned long long)nr * k + (k + e) / 2) /
			     (k + e));
	got = ktier_shrink(g, nk, &kscanned, true);
	/* lru_shrink bounds its scan by its count: the tier's apart */
	got += lru_shrink(g, nr > got ? nr - got : 0, &lscanned, true);
	if (got < nr)
		got += ktier_shrink(g, nr - got, &kscanned, false);
	if (got < nr) /* the budget holds whatever it costs */
		got += lru_shrink(g, nr - got, scanned, false);
	got += root_turn(c, g, nr, got);
	*scanned += kscanned + lscanned;
	return got;
}

static int cache_group_init(struct group *g, void *priv)
{
	int err = lru_group_init(g, priv);

	if (!err && (err = ktier_group_init(g)))
		lru_group_fini(g, priv);
	return err;
}

static void cache_group_fini(struct group *g, void *priv)
{
	ktier_group_fini(g);
	lru_group_fini(g, priv);
}

static const struct budget_ops cache_budget_ops = {
	.thread_state = cache_thread_state,
	.shrink = cache_shrink,
	.expedite = cache_expedite,
	.deferred = cache_deferred_pages,
	.group_init = cache_group_init,
	.group_fini = cache_group_fini,
};

int cache_init(struct cache *c, const struct cache_config *cfg)
{
	int err;

	c->ra_ops = NULL;
	c->kt = NULL;
	c->shrink_other = NULL;
	c->shrink_other_arg = NULL;
	c->lockless = cfg->lockless;
	atomic_init(&c->deferred_pages, 0);
	fill_pool_init(&c->fills, cfg->fill_threads);
	buf_pool_init(&c->bufs);
	err = budget_init(&c->budget, &cfg->budget, &cache_budget_ops, c);
	if (!err && ccache_init(c, cfg->ccache_pct)) {
		budget_destroy(&c->budget);
		err = -ENOMEM;
	}
	return err;
}

/* The cache's own threads: the budget's reclaimer (memory.high), fills. */
int cache_start(struct cache *c)
{
	int r = budget_start_reclaimer(&c->budget);

	return r ? r : fill_pool_start(&c->fills);
}

/* No request is left: the fill threads finish what they claimed, and go. */
void cache_stop(struct cache *c)
{
	fill_pool_stop(&c->fills);
}

/*
 * No reader and no mapping is left.  What still waits for a grace period
 * (folio structs, hot data) is freed before the groups it is charged to.
 */
void cache_destroy(struct cache *c)
{
	cache_stop(c);
	share_leave(&c->budget); /* its thread reclaims: first */
	budget_stop_reclaimer(&c->budget);
	cache_barrier();
	buf_pool_drain(c);
	ccache_destroy(c);
	budget_destroy(&c->budget);
}

#define BITS_PER_WORD (8 * sizeof(unsigned long))
#define BIT_OF(i) (1ul << ((i) % BITS_PER_WORD))

/* The n lowest bits of a 64-bit mask, n <= 64. */
static unsigned long long low_bits(unsigned int n)
{
	return n >= 64 ? ~0ull : (1ull << n) - 1;
}

struct mapping *mapping_create(struct cache *c, const struct mapping_ops *ops,
			       void *host, uint64_t size,
			       unsigned long nr_folios, uint32_t folio_size,
			       const uint64_t *starts)
{
	struct mapping *m = calloc(1, sizeof(*m));

	if (!m)
		return NULL;
	m->slots = calloc(nr_folios ? nr_folios : 1, sizeof(*m->slots));
	m->in_kernel = calloc(nr_folios / BITS_PER_WORD + 1,
			      sizeof(*m->in_kernel));
	if (ccache_enabled(c))
		m->seen = calloc(nr_folios / BITS_PER_WORD + 1,
				 sizeof(*m->seen));
	if (!m->slots || !m->in_kernel || (ccache_enabled(c) && !m->seen)) {
		free(m->slots);
		free(m->in_kernel);
		free(m->seen);
		free(m);
		return NULL;
	}
	m->ops = ops;
	m->host = host;
	m->cache = c;
	m->size = size;
	m->nr_folios = nr_folios;
	m->folio_size = folio_size;
	m->starts = starts;
	atomic_init(&m->nr_cached, 0);
	atomic_init(&m->refcount, 1);
	atomic_init(&m->ra_private, NULL);
	CDS_INIT_LIST_HEAD(&m->ccache);
	return m;
}

void mapping_get(struct mapping *m)
{
	atomic_fetch_add_explicit(&m->refcount, 1, memory_order_relaxed);
}

/*
 * Drop every folio of m whose slot still holds it.  With now (the mapping
 * is going away), a folio nobody else holds is freed at once, data and
 * struct: no reader can reach it.  One a reader still holds (it replied
 * and is putting its references) goes with that reader's last put.
 */
static void mapping_drop_folios(struct mapping *m, bool now)
{
	for (unsigned long i = 0; i < m->nr_folios; i++) {
		struct folio *f = atomic_load(&m->slots[i]);
		int one = 1;

		if (!f || !lru_remove(f))
			continue;
		if (now && atomic_compare_exchange_strong(&f->refcount, &one,
							  0))
			folio_free_now(f);
		else
			folio_put(f); /* the slot's reference */
	}
}

/*
 * The last reference: no reader, no window in flight.  Its folios are freed
 * at once, hot or not, since nobody can reach them (seed 002, patch 12).
 */
void mapping_put(struct mapping *m)
{
	if (atomic_fetch_sub_explicit(&m->refcount, 1, memory_order_acq_rel) !=
	    1)
		return;
	mapping_drop_folios(m, true);
	ccache_forget(m);
	if (m->cache->ra_ops && m->cache->ra_ops->mapping_gone)
		m->cache->ra_ops->mapping_gone(m);
	if (m->ops && m->ops->release)
		m->ops->release(m);
	free(m->slots);
	free(m->in_kernel);
	free(m->seen);
	free(m);
}

/* The backing data changed: drop the folios; readers holding one finish. */
void mapping_invalidate(struct mapping *m)
{
	mapping_drop_folios(m, false);
	mapping_forget_kernel(m);
	ccache_forget(m);
	for (unsigned long w = 0; m->seen && w <= m->nr_folios / BITS_PER_WORD;
	     w++)
		atomic_store_explicit(&m->seen[w], 0, memory_order_relaxed);
}

unsigned long mapping_index(const struct mapping *m, uint64_t pos)
{
	unsigned long lo = 0, hi;

	if (!m->nr_folios)
		return 0;
	if (m->folio_size) {
		uint64_t i = pos / m->folio_size;

		return i < m->nr_folios ? (unsigned long)i : m->nr_folios - 1;
	}
	/* the last folio whose start is <= pos */
	hi = m->nr_folios - 1;
	while (lo < hi) {
		unsigned long mid = lo + (hi - lo + 1) / 2;

		if (m->starts[mid] <= pos)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

uint64_t mapping_folio_pos(const struct mapping *m, unsigned long index)
{
	if (m->folio_size)
		return (uint64_t)index * m->folio_size;
	return m->starts[index];
}

uint32_t mapping_folio_len(const struct mapping *m, unsigned long index)
{
	uint64_t start = mapping_folio_pos(m, index), end;

	if (index + 1 >= m->nr_folios)
		end = m->size;
	else
		end = mapping_folio_pos(m, index + 1);
	return (uint32_t)(end - start);
}

unsigned int mapping_folio_pages(const struct mapping *m, unsigned long i)
{
	return (unsigned int)pages_of_bytes(mapping_folio_len(m, i));
}

bool mapping_cached(const struct mapping *m, unsigned long index)
{
	return index < m->nr_folios &&
	       atomic_load_explicit(&m->slots[index], memory_order_acquire);
}

bool mapping_in_flight(const struct mapping *m, unsigned long index)
{
	/* a fill may run RCU-offline (a long wait): online for the look,
	 * so that the folio is not freed under it */
	bool offline = !rcu_read_ongoing();
	struct folio *f;
	bool r;

	if (index >= m->nr_folios)
		return false;
	if (offline)
		cache_thread_online();
	f = atomic_load_explicit(&m->slots[index], memory_order_acquire);
	r = f && folio_test(f, FOLIO_LOCKED);
	if (offline)
		cache_thread_offline();
	return r;
}

bool mapping_seen(const struct mapping *m, unsigned long index)
{
	return m->seen && index < m->nr_folios &&
	       (atomic_load_explicit(&m->seen[index / BITS_PER_WORD],
				     memory_order_relaxed) &
		BIT_OF(index));
}

bool mapping_see(struct mapping *m, unsigned long index)
{
	return m->seen && index < m->nr_folios &&
	       (atomic_fetch_or_explicit(&m->seen[index / BITS_PER_WORD],
					 BIT_OF(index), memory_order_relaxed) &
		BIT_OF(index));
}

bool mapping_in_kernel(const struct mapping *m, unsigned long index)
{
	return index < m->nr_folios &&
	       (atomic_load_explicit(&m->in_kernel[index / BITS_PER_WORD],
				     memory_order_relaxed) &
		BIT_OF(index));
}

/* A fill took bytes [from, to) of folio f to the kernel's page cache. */
void mapping_note_fill(struct mapping *m, struct folio *f, uint64_t from,
		       uint64_t to)
{
	unsigned long i = f->index;
	unsigned int p0 = (unsigned int)(from >> ZF_PAGE_SHIFT);
	unsigned int p1 = (unsigned int)pages_of_bytes(to);

	/* the kernel asks again: it no longer holds all of the folio */
	if (mapping_in_kernel(m, i))
		atomic_fetch_and_explicit(&m->in_kernel[i / BITS_PER_WORD],
					  ~BIT_OF(i), memory_order_relaxed);
	/* by len: a bounce copy has no nr_pages */
	if (pages_of_bytes(f->len) > 64 || p1 <= p0)
		return;
	atomic_fetch_or_explicit(&f->filled, low_bits(p1 - p0) << p0,
				 memory_order_relaxed);
}

/*
 * A fill of the kernel tier took bytes [from, to) of folio f: true when
 * that completes the folio, every byte of it now handed over by one fill
 * or another (each once, whatever their order or size).  Coverage is kept
 * in f->filled, a bit a page for folios of up to 64 pages and a bit per
 * 64th for bigger ones (a piece of a big frame, or frames bigger than the
 * kernel's fills), a bit set only when a fill covers all of its part.
 */
bool folio_note_tiered_fill(struct folio *f, uint64_t from, uint64_t to)
{
	unsigned long pages = pages_of_bytes(f->len);
	unsigned int n = pages < 64 ? (unsigned int)pages : 64;
	uint64_t part = (uint64_t)((pages + n - 1) / n) << ZF_PAGE_SHIFT;
	unsigned long long all = low_bits(n), bits, old;
	unsigned int c0, c1;

	if (!n || to <= from)
		return false;
	c0 = (unsigned int)((from + part - 1) / part);
	c1 = to >= f->len ? n : (unsigned int)(to / part);
	if (c1 > n)
		c1 = n;
	if (c1 <= c0)
		return false;
	bits = low_bits(c1 - c0) << c0;
	old = atomic_fetch_or_explicit(&f->filled, bits, memory_order_relaxed);
	return old != all && (old | bits) == all;
}

/* The kernel dropped m's pages (an open without keep_cache, the backing
 * changed): it holds none of them now. */
void mapping_forget_kernel(struct mapping *m)
{
	for (unsigned long w = 0; w <= m->nr_folios / BITS_PER_WORD; w++)
		atomic_store_explicit(&m->in_kernel[w], 0,
				      memory_order_relaxed);
}

/* Folio f is being evicted: all of it in the kernel's page cache? */
void mapping_note_evicted(struct folio *f)
{
	unsigned long long all;

	if (f->nr_pages > 64)
		return; /* not tracked */
	all = low_bits(f->nr_pages);
	if (atomic_load_explicit(&f->filled, memory_order_relaxed) == all)
		atomic_fetch_or_explicit(
			&f->mapping->in_kernel[f->index / BITS_PER_WORD],
			BIT_OF(f->index), memory_order_relaxed);
}
