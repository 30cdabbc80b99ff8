/* SPDX-License-Identifier: MIT */
/*
 * readahead: when and how much to read ahead, the API of readahead/.
 *
 * readahead_init() plugs the on-demand algorithm (ra.c), read-around for
 * page-cache fills (readaround.c) and the window machinery (window.c) into
 * a cache's read path.  Readahead owns its state: per open file (struct
 * file_ra_state, which embeds the cache's struct file_read_state), per file
 * (read-around, behind mapping->ra_private), per request (struct
 * ra_request, which embeds the cache's struct read_req), and the folio
 * flags below.  A filesystem serves every read through an ra_request.
 */
#ifndef ZF_READAHEAD_H
#define ZF_READAHEAD_H

#include <pthread.h>

#include "../cache/cache.h"

/* How speculative folios are charged at the budget's limit. */
enum ra_reclaim_mode {
	RA_RECLAIM_BATCH,     /* reclaim_for_batch for the rest of the window */
	RA_RECLAIM_PER_FOLIO, /* one reclaim pass per failing folio (old way) */
};

/* How a page-cache fill (an mmap fault) that misses reads around. */
enum readaround_mode {
	READAROUND_ADAPTIVE, /* sized by whether its pages get used */
	READAROUND_FIXED,    /* always ra_pages, as the kernel does */
	READAROUND_OFF,      /* just the faulting folio */
};

/* VM_READAHEAD_PAGES: 128 KiB */
#define RA_DEFAULT_PAGES 32
/* Largest ra_kb accepted: 64 MiB */
#define RA_MAX_PAGES (64u << 20 >> ZF_PAGE_SHIFT)

/* readahead/'s folio flags, stored above the cache's own. */
enum ra_folio_flag {
	FOLIO_READAROUND = FOLIO_NR_CACHE_FLAGS, /* brought in by read-around */
	FOLIO_BEHIND, /* read around, before the fault that read it */
	FOLIO_JUDGED, /* read-around judged unused at the next miss */
};

/*
 * Per open file readahead state: mirrors struct file_ra_state.  Positions
 * in 4 KiB pages.  Readers sharing a file description race on it as in the
 * kernel; the lock keeps each decision whole.
 */
struct file_ra_state {
	struct file_read_state pos; /* prev_pos, shared with the cache */
	pthread_mutex_t lock;
	unsigned long start;      /* first page of the current window */
	unsigned long size;       /* pages in it */
	unsigned long async_size; /* pages ahead of the marker */
	unsigned long ra_pages;   /* the most a window may hold */
	unsigned int walkoffs;    /* faults in a row just past the window */
};

struct ra_pending;

/* A read request as readahead sees it. */
struct ra_request {
	struct read_req rq;
	struct file_ra_state *ra;    /* the open file's, or NULL */
	bool readaround;             /* the window being read is read-around */
	struct ra_pending *pending;  /* windows to fill after the reply */
	unsigned int reclaims;       /* reclaim_for_batch calls so far */
};

struct ra_config {
	unsigned long ra_pages;
	enum ra_reclaim_mode reclaim;
	enum readaround_mode readaround;
};

int readahead_init(struct cache *c, const struct ra_config *cfg);
void file_ra_init(struct file_ra_state *ra, unsigned long ra_pages);
void file_ra_destroy(struct file_ra_state *ra);
/* A read of [pos, pos + len) of m; fault: a page-cache fill (mmap). */
void ra_request_init(struct ra_request *r, struct mapping *m,
		     struct file_ra_state *ra, struct group *g, void *io_ctx,
		     uint64_t pos, size_t len, bool fault);

#endif
