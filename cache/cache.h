/* SPDX-License-Identifier: MIT */
/*
 * cache: folios and the page cache proper, the API of cache/.
 *
 * A folio is one frame's decompressed content.  A mapping is one file's
 * index of folios (slot i holds folio i or NULL), looked up without locks
 * under RCU.  Folios are charged to the budget group that brought them in and
 * sit on that group's LRU lists.  The cache knows nothing of FUSE or of the
 * file format: a mapping's operations table (struct mapping_ops, the mirror
 * of address_space_operations) fills folios, and readahead/ plugs into the
 * read path through struct cache_ra_ops, as the kernel's filemap_read calls
 * page_cache_sync_ra.
 *
 * Fields other folders may read: folio->index, folio->len, folio->data,
 * folio->mapping, mapping->host, mapping->size, mapping->nr_folios,
 * read_req fields marked "in".
 */
#ifndef ZF_CACHE_H
#define ZF_CACHE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <urcu/list.h>

#include "../accounting/accounting.h"

/* Folio flags: bits of folio->flags, mirrors of the kernel's page flags. */
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
	FOLIO_READAROUND, /* brought in by read-around */
	FOLIO_BEHIND,     /* read around, before the fault that read it */
	FOLIO_JUDGED,     /* read-around judged unused at the next miss */
	FOLIO_ON_LRU,     /* on its group's LRU lists */
	FOLIO_SPARED,     /* reclaim gave it a second chance (referenced) */
};

#define FOLIO_MAX_BYTES (16u << 20) /* largest folio the cache holds */

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
	struct folio *defer_next; /* on the deferred-free list */
};

static inline bool folio_test(const struct folio *f, enum folio_flag b)
{
	return atomic_load_explicit(&f->flags, memory_order_acquire) &
	       (1u << b);
}

static inline void folio_set(struct folio *f, enum folio_flag b)
{
	atomic_fetch_or_explicit(&f->flags, 1u << b, memory_order_release);
}

static inline void folio_clear(struct folio *f, enum folio_flag b)
{
	atomic_fetch_and_explicit(&f->flags, ~(1u << b), memory_order_release);
}

/* Returns whether the flag was set before. */
static inline bool folio_test_clear(struct folio *f, enum folio_flag b)
{
	return atomic_fetch_and_explicit(&f->flags, ~(1u << b),
					 memory_order_acq_rel) &
	       (1u << b);
}

/*
 * A batch of folios to fill, contiguous in the file: what ops->readahead
 * gets (struct readahead_control's counterpart).  folios[i] is the folio
 * for index start + i.  The filesystem reads all of them and decodes each
 * one when asked; decoding marks nothing, the engine does.
 */
struct fill_batch {
	struct mapping *mapping;
	void *io_ctx; /* the worker's I/O context, from the request */
	unsigned long start;
	unsigned int nr;
	struct folio **folios;
	void *fs_priv; /* the filesystem's state for this batch */
};

/*
 * The mirror of address_space_operations.
 *  - submit(): start reading the backing data of every folio in the batch
 *    (one batch of I/O, adjacent frames coalesced).
 *  - fill(): wait for folio i's data, decode it into folio->data (len
 *    bytes); 0 or a negative errno.  Called once per folio, any order.
 *  - finish(): release what submit() took.
 *  - read_into(): fill one folio's content into a plain buffer (the bounce
 *    path: the data is not cached).
 */
struct mapping_ops {
	int (*submit)(struct fill_batch *b);
	int (*fill)(struct fill_batch *b, unsigned int i);
	void (*finish)(struct fill_batch *b);
	int (*read_into)(struct mapping *m, void *io_ctx, unsigned long index,
			 void *buf);
	void (*release)(struct mapping *m); /* the last reference went */
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
};

/*
 * Per open file readahead state: mirrors struct file_ra_state.  Positions in
 * 4 KiB pages.  The cache reads and writes prev_pos; readahead/ owns the
 * rest.  Readers sharing a file description race on it as in the kernel;
 * the lock keeps each decision whole.
 */
struct file_ra_state {
	pthread_mutex_t lock;
	unsigned long start;      /* first page of the current window */
	unsigned long size;       /* pages in it */
	unsigned long async_size; /* pages ahead of the marker */
	unsigned long ra_pages;   /* the most a window may hold */
	atomic_llong prev_pos;    /* byte just past the last read, or -1 */
	unsigned int walkoffs;    /* faults in a row just past the window */
	void *owner;              /* readahead/'s per-file extras */
};

/* What the cache calls in readahead/ (registered by readahead_init). */
struct read_req;
struct cache_ra_ops {
	/* A miss at index: bring in at least [index, last] (demand) and
	 * whatever the readahead state says. 0, or a negative errno. */
	int (*sync_ra)(struct read_req *rq, unsigned long index,
		       unsigned long last);
	/* The reader reached a folio with the readahead marker. */
	void (*async_ra)(struct read_req *rq, struct folio *f,
			 unsigned long last);
	/* After the reply: complete the deferred part of windows. */
	void (*finish)(struct read_req *rq);
	/* A read-around folio read for the first time. */
	void (*folio_used)(struct folio *f);
	/* A read-around folio evicted unread (called under the LRU lock,
	 * while f->mapping is alive). */
	void (*folio_unused)(struct folio *f);
	/* The mapping is going away: free what readahead hung on it. */
	void (*mapping_gone)(struct mapping *m);
};

#define READ_REQ_MAX_FOLIOS 512

/* One read request's state on the worker that serves it. */
struct read_req {
	/* in */
	struct mapping *mapping;
	struct file_ra_state *ra; /* the open file's, or NULL */
	struct group *group;
	void *io_ctx;
	uint64_t pos;
	size_t len;
	bool fault;      /* a page-cache fill (mmap), not a read() */
	bool readaround; /* the window being read is read-around */
	/* out, for the reply */
	struct iovec iov[READ_REQ_MAX_FOLIOS];
	int niov;
	size_t bytes;
	/* held until after the reply */
	struct folio *held[READ_REQ_MAX_FOLIOS];
	int nheld;
	void *bounce[READ_REQ_MAX_FOLIOS];
	int nbounce;
	/* hot folios in the reply without a reference: valid only while
	 * this worker stays RCU-online */
	struct folio *lockless[READ_REQ_MAX_FOLIOS];
	int nlockless;
	bool lockless_used;
	bool no_lockless; /* restarted: take references only */
	bool waited_io; /* pgmajfault */
	/* deferred work of readahead windows, for cache_ra_ops->finish */
	void *pending;
	unsigned int ra_reclaims; /* reclaim_for_batch calls so far */
};

typedef int (*cache_reply_fn)(void *arg, const struct iovec *iov, int cnt);

struct cache_config {
	struct budget_config budget;
	bool lockless;
};

struct cache {
	struct budget budget;
	const struct cache_ra_ops *ra_ops;
	bool lockless;
	/* deferred frees (cache/rcu.c) */
	pthread_mutex_t defer_lock;
	pthread_cond_t defer_cond;
	struct folio *defer_head;
	atomic_long deferred_pages;
	pthread_t reaper;
	bool reaper_running, reaper_stop;
};

static inline struct cache *cache_of_group(struct group *g)
{
	return (struct cache *)((char *)g->budget -
				offsetof(struct cache, budget));
}

/* cache.c: lifetime of the cache and of mappings */
int cache_init(struct cache *c, const struct cache_config *cfg);
int cache_start(struct cache *c);
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

/* folio.c */
struct folio *folio_alloc(struct mapping *m, unsigned long index,
			  struct group *g);
void folio_free_unused(struct folio *f);
struct folio *folio_lookup(struct mapping *m, unsigned long index);
bool folio_try_get(struct folio *f);
void folio_put(struct folio *f);
int folio_insert(struct mapping *m, struct folio *f);
void folio_unlock(struct folio *f);
void folio_wait_locked(struct folio *f);
void folio_fill_done(struct folio *f, int err);
bool folio_mark_accessed(struct folio *f);

/* lru.c */
int lru_group_init(struct group *g, void *priv);
void lru_group_fini(struct group *g, void *priv);
int lru_insert(struct folio *f);
void lru_activate(struct folio *f);
unsigned long lru_shrink(struct group *g, unsigned long nr,
			 unsigned long *scanned, void *priv);
bool lru_remove(struct folio *f);

/* rcu.c: grace periods for the folios lockless readers may look at */
void cache_thread_register(void);
void cache_thread_unregister(void);
void cache_thread_online(void);
void cache_thread_offline(void);
void cache_quiescent(void);
void cache_defer_free(struct cache *c, struct folio *f);
unsigned long cache_expedite(void *cache);
unsigned long cache_deferred_pages(void *cache);
int cache_reaper_start(struct cache *c);
void cache_reaper_stop(struct cache *c);
void folio_free_now(struct folio *f);
void folio_release_evicted(struct folio *f);

/* read.c */
int cache_read(struct read_req *rq, cache_reply_fn reply, void *arg);
void read_req_init(struct read_req *rq, struct mapping *m,
		   struct file_ra_state *ra,
		   struct group *g, void *io_ctx, uint64_t pos, size_t len);
int cache_fill_batch(struct fill_batch *b, unsigned int i);
int cache_bounce_folio(struct read_req *rq, unsigned long index,
		       struct folio **out);
bool read_pin_lockless(void);

#endif
