/* SPDX-License-Identifier: MIT */
/*
 * The kernel tier's internals, shared by ktier.c (what fills hand over,
 * reclaim's share, refaults) and ktthread.c (the thread that drops what
 * reclaim evicted from the page cache).  The deadlock rules are ktier.c's
 * opening comment.
 */
#ifndef ZF_CACHE_KTIER_INTERNAL_H
#define ZF_CACHE_KTIER_INTERNAL_H

#include <urcu/hlist.h>

#include "internal.h"

/* A chunk: 32 pages, one readahead window of the kernel's default size.
 * Smaller means more bookkeeping per byte, larger coarser evictions. */
#define CHUNK_SHIFT 17
#define CHUNK_BYTES (1ull << CHUNK_SHIFT)
#define CHUNK_PAGES (CHUNK_BYTES >> ZF_PAGE_SHIFT)
#define KT_HASH_BITS 13
/* Times a fill reclaims for one chunk before it gives that chunk up. */
#define KT_CHARGE_TRIES 3
/* The longest a fill waits for what its reclaim queued (rule 2): dropping
 * a few MiB takes tens of microseconds when nothing is locked. */
#define KT_WAIT_US 2000

struct kt_file;

struct kt_chunk {
	struct cds_list_head lru; /* on its group's lists, or the queue */
	struct kt_file *file;     /* NULL once queued for invalidation */
	struct group *group;      /* charged for its pages */
	uint64_t id;              /* the file's id (queued: still valid) */
	uint64_t index;           /* chunk index in the file */
	uint32_t pages;           /* bitmap of the pages charged */
	uint32_t pending;         /* of them, pages with a fill in flight */
	bool active;
	bool doomed; /* to go once no fill is in flight (ktier_evict_all) */
};

struct kt_file {
	struct cds_hlist_node hnode;
	uint64_t id;
	uint64_t nchunks;
	struct kt_chunk **chunks; /* nchunks slots */
	uint32_t *shadow;         /* eviction clock + 1 per chunk, or 0 */
};

/* A group's lists (group->ktier), under the tier's lock. */
struct kt_lists {
	struct cds_list_head active, inactive; /* newest at the head */
	unsigned long nr_active, nr_inactive;  /* pages */
	/* pages of its shares of reclaim not given yet (below zero: given
	 * ahead, as a chunk goes whole) */
	long owed;
};

struct ktier {
	pthread_mutex_t lock;
	struct cds_hlist_head hash[1u << KT_HASH_BITS];
	uint32_t clock; /* the non-resident age: pages evicted or activated */
	struct cds_list_head queue; /* chunks to invalidate, oldest first */
	unsigned long queued;       /* their pages */
	pthread_cond_t cond;        /* queue not empty, or stop */
	pthread_cond_t drained;     /* the thread dropped a batch */
	bool stop, running;
	bool halt; /* stop without dropping what is queued */
	pthread_t thread;
	ktier_invalidate_fn invalidate;
	void *priv;
};

static inline unsigned int pages_in(uint32_t mask)
{
	return (unsigned int)__builtin_popcount(mask);
}

/* Every chunk of f leaves the tier, uncharged, and f is freed (its hash
 * node is already unlinked); under the lock. */
void kt_file_drop(struct kt_file *f);

#endif
