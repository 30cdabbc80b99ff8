/* SPDX-License-Identifier: MIT */
/*
 * readahead: when and how much to read ahead, the API of readahead/.
 *
 * readahead_init() plugs the on-demand algorithm (ra.c) and the window
 * machinery (window.c) into a cache's read path.  The pure sizing steps are
 * exported so tests can pin them.
 */
#ifndef ZF_READAHEAD_H
#define ZF_READAHEAD_H

#include "../cache/cache.h"

/* How speculative folios are charged at the budget's limit. */
enum ra_reclaim_mode {
	RA_RECLAIM_BATCH,     /* reclaim_for_batch for the rest of the window */
	RA_RECLAIM_PER_FOLIO, /* one reclaim pass per failing folio (old way) */
};

/* VM_READAHEAD_PAGES: 128 KiB */
#define RA_DEFAULT_PAGES 32
/* What one FUSE request carries at most (1 MiB): bdi io_pages */
#define RA_IO_PAGES 256
/* Largest ra_kb accepted: 64 MiB */
#define RA_MAX_PAGES (64u << 20 >> ZF_PAGE_SHIFT)

/*
 * READAHEAD_MAX_MEMCG_RECLAIMS of seed 000: at most two reclaims for the
 * windows of one request.  The first makes room for the rest of the window;
 * if other readers of the same budget used that room before the window was
 * whole, one more try.  One alone stopped 10x more windows early at 52
 * readers; four bought 14% more pages for 8% more reclaim, within noise.
 */
#define READAHEAD_MAX_RECLAIMS 2

/* How a page-cache fill (an mmap fault) that misses reads around. */
enum readaround_mode {
	READAROUND_ADAPTIVE, /* sized by whether its pages get used */
	READAROUND_FIXED,    /* always ra_pages, as the kernel does */
	READAROUND_OFF,      /* just the faulting folio */
};

/* MMAP_LOTSAMISS: unused read-around folios in a row that stop it */
#define READAROUND_LOTSAMISS 100

struct ra_config {
	unsigned long ra_pages;
	enum ra_reclaim_mode reclaim;
	enum readaround_mode readaround;
};

int readahead_init(struct cache *c, const struct ra_config *cfg);
void file_ra_init(struct file_ra_state *ra, unsigned long ra_pages);
void file_ra_destroy(struct file_ra_state *ra);

/* ra.c: the sizing steps, mirrors of mm/readahead.c */
unsigned long get_init_ra_size(unsigned long size, unsigned long max);
unsigned long get_next_ra_size(unsigned long cur, unsigned long max);

/* A window to read, in pages; decided by ra_sync_plan/ra_async_plan. */
struct ra_plan {
	unsigned long start, size, async_size;
};
bool ra_sync_plan(struct file_ra_state *ra, const struct mapping *m,
		  unsigned long index, unsigned long req, struct ra_plan *p);
bool ra_async_plan(struct file_ra_state *ra, const struct mapping *m,
		   unsigned long folio, unsigned long req, struct ra_plan *p);

/* For tests: called with every window read (marker ULONG_MAX: none). */
extern void (*ra_trace_hook)(unsigned long first, unsigned long last,
			     unsigned long marker);

/* readaround.c */
struct readaround_state {
	pthread_mutex_t lock;
	unsigned long window;       /* pages read around a miss */
	unsigned long min, max;     /* one folio .. ra_pages */
	unsigned int used, unused;  /* folios since the last resize */
	unsigned int unused_streak; /* unused folios in a row */
	unsigned long probes;       /* misses while stopped */
	unsigned int behind_used, behind_unused; /* folios before faults */
	unsigned long plans;        /* windows planned */
	unsigned long last_first, last_end; /* the last window's folios */
	unsigned long ceiling;      /* the last window size that shrank */
};
int readaround_sync(struct read_req *rq, unsigned long index,
		    unsigned long last);
void readaround_used(struct folio *f);
void readaround_unused(struct folio *f);
void readaround_free(struct mapping *m);
void readaround_set_mode(enum readaround_mode mode);
void readaround_init_state(struct readaround_state *s, unsigned long min,
			   unsigned long max);
void readaround_feedback(struct readaround_state *s, bool used,
			 bool behind, unsigned long folio_pages);
bool readaround_streaming(struct readaround_state *s);
bool readaround_plan(struct readaround_state *s, unsigned long pg,
		     unsigned long req, struct ra_plan *p);

/* window.c */
unsigned long ra_request_pages(const struct read_req *rq, unsigned long index,
			       unsigned long *req);
int ra_sync_read(struct read_req *rq, unsigned long index,
		 unsigned long last);
int ra_window(struct read_req *rq, const struct ra_plan *p,
	      unsigned long demand_first, unsigned long demand_last);
void ra_finish(struct read_req *rq);
enum ra_reclaim_mode ra_reclaim_mode(void);
void ra_set_reclaim_mode(enum ra_reclaim_mode mode);

#endif
