/* SPDX-License-Identifier: MIT */
/*
 * cache: folios and the page cache proper, the API of cache/.
 *
 * A folio is one frame's decompressed content.  A mapping is one file's
 * index of folios (slot i holds folio i or NULL), looked up without locks
 * under RCU.  Folios are charged to the budget group that brought them in and
 * sit on that group's LRU lists.  The cache knows nothing of FUSE or of the
 * file format: a mapping's operations table (struct mapping_ops, the mirror
 * of address_space_operations) fills folios.  Readahead plugs into the read
 * path through struct cache_ra_ops, as the kernel's filemap_read calls
 * page_cache_sync_ra; what readahead keeps (per-file windows, per-request
 * state, its own folio flags) is readahead/'s, reached through the opaque
 * mapping->ra_private and by embedding struct read_req.
 *
 * Fields other folders may read: folio->index, ->len, ->data, ->mapping,
 * ->group, ->flags (through folio_test); mapping->host, ->size, ->nr_folios;
 * the read_req fields marked "in".
 */
#ifndef ZF_CACHE_H
#define ZF_CACHE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <urcu-qsbr.h>
#include <urcu/list.h>

#include "../accounting/accounting.h"

/*
 * Folio flags: bits of folio->flags, mirrors of the kernel's page flags.
 * Bits from FOLIO_NR_CACHE_FLAGS up belong to readahead/ (readahead.h):
 * the cache stores them and never looks at them.
 */
enum folio_flag {
	FOLIO_UPTODATE,   /* data is filled and verified */
	FOLIO_LOCKED,     /* I/O in flight; waiters sleep on it */
	FOLIO_ERROR,      /* the fill failed: EIO for readers */
	FOLIO_READAHEAD,  /* the async readahead marker (PG_readahead) */
	FOLIO_REFERENCED, /* accessed once since it entered its list */
	FOLIO_ACTIVE,     /* on the active list */
	FOLIO_WORKINGSET, /* was active before (deactivated or refaulted) */
	FOLIO_HOT,        /* read without references, freed after a GP */
	FOLIO_ACCESSED,   /* ever read since it came in */
	FOLIO_SPECULATIVE,/* brought in by readahead, not by a demand read */
	FOLIO_ON_LRU,     /* on its group's LRU lists */
	FOLIO_SPARED,     /* reclaim gave it a second chance (referenced) */
	FOLIO_PIECE,      /* a piece of a frame decodable only from its start
			   * (set by the fill): evicted, the frame is decoded
			   * again up to it, so the kernel tier gives first */
	FOLIO_NR_CACHE_FLAGS
};

struct mapping;

struct folio {
	atomic_uint flags;
	/* 1 for the mapping slot while the folio is in it, 1 per reader */
	atomic_int refcount;
	uint32_t len;      /* bytes of content */
	uint32_t nr_pages; /* pages charged */
	unsigned long index;
	void *data;
	struct mapping *mapping;
	struct group *group;
	struct cds_list_head lru; /* under the group's LRU lock */
	/* pages engine-mode fills handed to the kernel's page cache, a bit
	 * each (folios of up to 64 pages; larger ones are not tracked) */
	atomic_ullong filled;
	union {
		struct folio *evict_next; /* on a reclaim pass's free list */
		struct rcu_head rcu;      /* freed after a grace period */
	};
};

static inline bool folio_test(const struct folio *f, unsigned int b)
{
	return atomic_load_explicit(&f->flags, memory_order_acquire) &
	       (1u << b);
}

static inline void folio_set(struct folio *f, unsigned int b)
{
	atomic_fetch_or_explicit(&f->flags, 1u << b, memory_order_release);
}

static inline void folio_clear(struct folio *f, unsigned int b)
{
	atomic_fetch_and_explicit(&f->flags, ~(1u << b), memory_order_release);
}

/* Returns whether the flag was set before. */
static inline bool folio_test_clear(struct folio *f, unsigned int b)
{
	return atomic_fetch_and_explicit(&f->flags, ~(1u << b),
					 memory_order_acq_rel) &
	       (1u << b);
}

/*
 * A batch of folios to fill, contiguous in the file: what ops->submit gets
 * (struct readahead_control's counterpart).  folios[i] is the folio for
 * index start + i, or NULL where nothing is to be read.  The filesystem
 * reads all of them and decodes each one when asked; decoding marks
 * nothing, the engine does.
 */
struct fill_batch {
	struct mapping *mapping;
	void *io_ctx; /* the worker's I/O context, from the request */
	unsigned long start;
	unsigned int nr;
	struct folio **folios;
	void *fs_priv; /* the filesystem's state for this batch */
	bool serial;   /* set by submit(): fill in order, on one thread */
	/* set by submit() if it can tell: what the fill()s of the batch cost,
	 * in bytes decoded by zstd, a byte copied (raw data) counting a
	 * quarter; when not, the folios' length stands for it */
	bool costed;
	uint64_t cost;
};

/*
 * The mirror of address_space_operations.
 *  - submit(): start reading the backing data of every folio in the batch
 *    (one batch of I/O, adjacent frames coalesced).
 *  - wait_io(): wait for every backing read of the batch (optional).
 *    Called by the thread that submitted it; after it, fill() does no I/O
 *    on that thread's context and may run on any thread, several at once
 *    for different folios (unless submit() set b->serial).
 *  - fill(): wait for folio i's data, decode it into folio->data (len
 *    bytes); 0 or a negative errno.  Called once per folio, any order.
 *  - finish(): release what submit() took.
 *  - read_into(): fill one folio's content into a plain buffer (the bounce
 *    path: the data is not cached), for group g (its backing reads are
 *    counted there).
 *  - read_part(): bytes [off, off + len) of folio index into buf, when the
 *    filesystem has them without filling the folio (data stored as it is):
 *    0, -EAGAIN (fill the folio as usual), or a negative errno.  Optional.
 *  - release(): the mapping's last reference went.
 */
struct mapping_ops {
	int (*submit)(struct fill_batch *b);
	void (*wait_io)(struct fill_batch *b);
	int (*fill)(struct fill_batch *b, unsigned int i);
	void (*finish)(struct fill_batch *b);
	int (*read_into)(struct mapping *m, void *io_ctx, unsigned long index,
			 void *buf, struct group *g);
	int (*read_part)(struct mapping *m, void *io_ctx, unsigned long index,
			 uint32_t off, uint32_t len, void *buf);
	void (*release)(struct mapping *m);
};

struct cache;

struct mapping {
	const struct mapping_ops *ops;
	void *host; /* the filesystem's inode */
	struct cache *cache;
	uint64_t size;           /* content bytes */
	unsigned long nr_folios;
	uint32_t folio_size;     /* size of every folio but the last, or 0 */
	const uint64_t *starts;  /* nr_folios + 1 offsets when folio_size 0 */
	_Atomic(struct folio *) *slots;
	atomic_long nr_cached;   /* folios in slots */
	atomic_int refcount;
	void *_Atomic ra_private; /* readahead/'s per-file state, or NULL */
	/* a bit per folio: evicted after fills had handed all its pages to
	 * the kernel's page cache, and no fill of it came since */
	atomic_ulong *in_kernel;
	/* with the compressed cache: a bit per folio read from backing once
	 * (ccache.c's admission), and its entries of this mapping */
	atomic_ulong *seen;
	struct cds_list_head ccache;
};

/*
 * What the cache keeps per open file: where its last read ended (the
 * kernel's file_ra_state.prev_pos), so that small reads that stay in one
 * folio count as one access, and where the run of reads each starting at
 * the last one's end began (read-around sizes windows by runs).
 * readahead/'s per-file state embeds it.
 */
struct file_read_state {
	atomic_llong prev_pos;  /* byte just past the last read, or -1 */
	atomic_llong run_start; /* where the reads that end there began */
};

#define READ_REQ_MAX_FOLIOS 512

/* One read request's state on the worker that serves it. */
struct read_req {
	/* in */
	struct mapping *mapping;
	struct file_read_state *file; /* the open file's, or NULL */
	struct group *group;
	void *io_ctx;
	uint64_t pos;
	size_t len;
	bool fault;      /* an mmap fault, not a read() */
	bool fill;       /* a page-cache fill: the kernel takes a short reply
			  * for the end of the file, so it gets all or an
			  * error, never a part */
	bool internal;   /* the daemon's own read (metadata), not a
			  * reader's request: not counted as one */
	bool no_touch;   /* a copy that is no access: the folios' LRU state
			  * stays as it is (fs/push.c) */
	bool tiered;     /* a fill for the kernel tier: a folio handed over
			  * whole leaves the cache (ktier.c) */
	/* tiered: the file the fill is for, in the tier (ktier_fill_begin's
	 * id), and where it lies in the mapping: [tier_base, + tier_size) */
	uint64_t tier_id, tier_base, tier_size;
	/* out, for the reply */
	struct iovec iov[READ_REQ_MAX_FOLIOS];
	int niov;
	size_t bytes;
	bool waited_io; /* pgmajfault */
	/* pinned until after the reply */
	struct folio *held[READ_REQ_MAX_FOLIOS];
	int nheld;
	/* uncached copies (bounce folios), freed after the reply */
	struct folio *bounce[READ_REQ_MAX_FOLIOS];
	int nbounce;
	/* hot folios in the reply without a reference: valid only while
	 * this worker stays RCU-online */
	struct folio *lockless[READ_REQ_MAX_FOLIOS];
	int nlockless;
	bool no_lockless; /* restarted: take references only */
};

/* What the cache calls in readahead/ (registered by readahead_init). */
struct cache_ra_ops {
	/* A miss at index: bring in at least [index, last] (demand) and
	 * whatever the readahead state says. 0, or a negative errno. */
	int (*sync_ra)(struct read_req *rq, unsigned long index,
		       unsigned long last);
	/* The reader reached a folio with the readahead marker. */
	void (*async_ra)(struct read_req *rq, struct folio *f,
			 unsigned long last);
	/* Complete the request's deferred window work, after the reply. */
	void (*finish)(struct read_req *rq);
	/* The request is about to sleep on another's folio: fill what only
	 * it would fill (its deferred folios no fill thread can take). */
	void (*unblock)(struct read_req *rq);
	/* A speculative folio read for the first time. */
	void (*folio_used)(struct folio *f);
	/* A speculative folio evicted unread (called under the LRU lock,
	 * while f->mapping is alive). */
	void (*folio_unused)(struct folio *f);
	/* The mapping is going away: free what readahead hung on it. */
	void (*mapping_gone)(struct mapping *m);
};

typedef int (*cache_reply_fn)(void *arg, const struct iovec *iov, int cnt);

/*
 * A batch's folios to fill, claimed one by one by the worker that read
 * them and by the cache's fill threads (fillpool.c).  order[] lists batch
 * positions, the request's own (ndemand of them) first.
 */
struct fill_work {
	struct fill_batch *b;
	unsigned int *order;
	unsigned int nr, ndemand;
	atomic_uint next;  /* order[next] is the next to claim */
	atomic_uint left;  /* folios not filled, + 1 for the owner */
	void (*done)(struct fill_work *w); /* all filled, owner gone */
	struct cds_list_head link; /* on the pool's queue (under its lock) */
	bool queued;       /* on the queue (under its lock) */
	bool shared;       /* the fill threads may claim from it */
};

struct fill_pool {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct cds_list_head queue; /* works with folios left to claim */
	atomic_uint active;         /* works alive: windows being filled */
	unsigned int want, nthreads;
	pthread_t *threads;
	bool stop;
};

/* Idle buffers by size class, 16 KiB to 4 MiB, four per power of two. */
#define BUF_POOL_CLASSES 33
/* idle bytes kept for the read buffers of the windows in flight, at most
 * (and at most half of memory.max), beside what one reclaim pass frees */
#define BUF_POOL_IO (8u << 20)
struct buf_pool {
	pthread_mutex_t lock;
	void *free[BUF_POOL_CLASSES]; /* lists linked through the first word */
	unsigned long idle_pages;
};

struct cache_config {
	struct budget_config budget;
	bool lockless;
	unsigned int fill_threads; /* 0: every fill on the worker */
	unsigned int ccache_pct;   /* the compressed cache's share, or 0 */
};

/* Compressed frames kept in the budget (ccache.c), under lock. */
struct ccache_entry;
struct ccache {
	pthread_mutex_t lock;
	struct ccache_entry **buckets; /* NULL: off */
	unsigned int nbuckets;
	struct cds_list_head lru; /* oldest first */
	unsigned long pages;      /* charged to the root group */
	uint64_t bytes;           /* the entries', in those pages */
	unsigned int pct;         /* of memory.max, at most */
};

struct ktier;

struct cache {
	struct budget budget;
	struct ktier *kt; /* the kernel tier, or NULL (ktier.c) */
	const struct cache_ra_ops *ra_ops;
	bool lockless;
	atomic_long deferred_pages; /* hot data waiting for a grace period */
	struct fill_pool fills;
	struct buf_pool bufs;
	struct ccache cc;
	/* memory the cache's user holds in the budget and can give back (the
	 * daemon's idle decoders), as the kernel's shrinkers: asked last, in
	 * the root's turn of a reclaim walk the user asked for
	 * (reclaim_user_asked); the pages it freed */
	unsigned long (*shrink_other)(void *arg, unsigned long nr);
	void *shrink_other_arg;
};

static inline struct cache *cache_of_group(struct group *g)
{
	return (struct cache *)((char *)g->budget -
				offsetof(struct cache, budget));
}

/* cache.c: lifetime of the cache and of mappings, and their geometry */
int cache_init(struct cache *c, const struct cache_config *cfg);
int cache_start(struct cache *c);
void cache_stop(struct cache *c);
void cache_destroy(struct cache *c);
struct mapping *mapping_create(struct cache *c, const struct mapping_ops *ops,
			       void *host, uint64_t size,
			       unsigned long nr_folios, uint32_t folio_size,
			       const uint64_t *starts);
void mapping_get(struct mapping *m);
void mapping_put(struct mapping *m);
void mapping_invalidate(struct mapping *m);
unsigned long mapping_index(const struct mapping *m, uint64_t pos);
uint64_t mapping_folio_pos(const struct mapping *m, unsigned long index);
uint32_t mapping_folio_len(const struct mapping *m, unsigned long index);
unsigned int mapping_folio_pages(const struct mapping *m, unsigned long i);
bool mapping_cached(const struct mapping *m, unsigned long index);
/* Folio index of m is being filled (its filler holds it locked); the
 * caller may be RCU-offline. */
bool mapping_in_flight(const struct mapping *m, unsigned long index);
/*
 * Folio index of m is most likely in the kernel's page cache (engine mode,
 * mmap): every page of it went there by fills before zfolio evicted it,
 * and no fill of it came since (one would say the kernel dropped a page).
 * Read-around passes over such folios: a fault would not reach them.
 */
bool mapping_in_kernel(const struct mapping *m, unsigned long index);
/* Folio index of m was read from backing before (the compressed cache's
 * admission); mapping_see() sets that and says whether it was so. */
bool mapping_seen(const struct mapping *m, unsigned long index);
bool mapping_see(struct mapping *m, unsigned long index);

/*
 * ccache.c: the compressed cache.  ccache_offer() is given a frame's
 * compressed bytes when its folio was read from backing, and keeps them
 * from the second time on; ccache_get() copies them out (len must be what
 * was kept), counted for g; ccache_has() says whether it would.  Off
 * unless cache_config.ccache_pct is set.
 */
int ccache_init(struct cache *c, unsigned int pct);
void ccache_destroy(struct cache *c);
bool ccache_enabled(const struct cache *c);
bool ccache_has(struct mapping *m, unsigned long index);
bool ccache_get(struct mapping *m, unsigned long index, void *dst,
		size_t len, struct group *g);
void ccache_offer(struct mapping *m, unsigned long index, const void *src,
		  size_t len, struct group *g);
unsigned long ccache_shrink(struct cache *c, unsigned long nr);
void ccache_forget(struct mapping *m);
void mapping_note_fill(struct mapping *m, struct folio *f, uint64_t from,
		       uint64_t to);
void mapping_note_evicted(struct folio *f);
bool folio_note_tiered_fill(struct folio *f, uint64_t from, uint64_t to);
void mapping_forget_kernel(struct mapping *m);

/* folio.c: what a window does with the folios it brings in */
struct folio *folio_alloc(struct mapping *m, unsigned long index);
void folio_free_unused(struct folio *f);
struct folio *folio_lookup(struct mapping *m, unsigned long index);
void folio_put(struct folio *f);
int folio_insert(struct mapping *m, struct folio *f);
void folio_fill_done(struct folio *f, int err);

/* bufpool.c: buffers for folio data and backing reads, reused */
void *cache_buf_get(struct cache *c, size_t len);
void cache_buf_put(struct cache *c, void *buf, size_t len);

/* fillpool.c: a batch's fills on every core */
void fill_work_init(struct fill_work *w, struct fill_batch *b,
		    unsigned int *order, unsigned int nr, unsigned int ndemand,
		    void (*done)(struct fill_work *w));
/* Let the fill threads claim from w: false if there are none (or w has
 * only one folio), and the owner fills everything itself. */
bool fill_work_share(struct cache *c, struct fill_work *w);
/* Claim one folio (of the request's own only, or any) and fill it: false
 * if none was left to claim. */
bool fill_work_run(struct fill_work *w, bool demand_only);
/* The owner is done with w: done() runs once nothing is left to fill. */
void fill_work_put(struct fill_work *w);

/*
 * ktier.c: the kernel page cache as the first tier, inside the budget.
 * Files are named by an id (the FUSE inode); offsets are the file's.
 * invalidate() drops a range from the kernel's page cache; it is called
 * on the tier's own thread only, never while a lock is held.
 */
typedef void (*ktier_invalidate_fn)(uint64_t id, uint64_t off, uint64_t len,
				    void *priv);
int ktier_enable(struct cache *c, ktier_invalidate_fn invalidate,
		 void *priv);
void ktier_halt(struct cache *c);
void ktier_disable(struct cache *c);
/* [pos, pos + len) of file id (of size bytes) is being filled into the
 * page cache (the kernel has its pages): charged; and that fill is done,
 * replied to or failed */
void ktier_fill_begin(struct cache *c, struct group *g, uint64_t id,
		      uint64_t size, uint64_t pos, size_t len);
void ktier_fill_end(struct cache *c, uint64_t id, uint64_t pos, size_t len);
void ktier_forget(struct cache *c, uint64_t id);
unsigned long ktier_tracks(struct cache *c, uint64_t id);
void ktier_evict_all(struct cache *c);
/* Wait up to us microseconds for what is queued to leave the page cache
 * (rule 2: a bounded wait, never on a fill). */
void ktier_drain(struct cache *c, unsigned int us);
unsigned long ktier_pages(struct group *g);
unsigned long ktier_queued(struct cache *c);

/* rcu.c: workers' grace-period states (liburcu QSBR) */
void cache_thread_register(void);
void cache_thread_unregister(void);
void cache_thread_online(void);
void cache_thread_offline(void);
void cache_quiescent(void);

/* read.c: the read path */
void read_req_init(struct read_req *rq, struct mapping *m,
		   struct file_read_state *file, struct group *g,
		   void *io_ctx, uint64_t pos, size_t len);
int cache_read(struct read_req *rq, cache_reply_fn reply, void *arg);
int cache_fill_batch(struct fill_batch *b, unsigned int i);
void cache_wait_io(struct fill_batch *b);
struct folio *cache_pass_over_begin(struct mapping *m, unsigned long index,
				    struct group *g);
void cache_pass_over_end(struct folio *f, int err);
void file_read_state_init(struct file_read_state *file);

#endif
