/* SPDX-License-Identifier: MIT */
/*
 * readahead internals: shared by the files of readahead/ only.  The pure
 * sizing steps are here so that tests can pin them.
 */
#ifndef ZF_READAHEAD_INTERNAL_H
#define ZF_READAHEAD_INTERNAL_H

#include "readahead.h"

/* What one FUSE request carries at most (1 MiB): the bdi's io_pages */
#define RA_IO_PAGES 256

/* READAHEAD_MAX_MEMCG_RECLAIMS of seed 000: at most two reclaims for the
 * windows of one request; more buys few pages for much reclaim. */
#define READAHEAD_MAX_RECLAIMS 2

/* MMAP_LOTSAMISS: unused read-around folios in a row that stop it */
#define READAROUND_LOTSAMISS 100

static inline struct ra_request *ra_req(struct read_req *rq)
{
	return caa_container_of(rq, struct ra_request, rq);
}

static inline unsigned long page_of(uint64_t pos)
{
	return (unsigned long)(pos >> ZF_PAGE_SHIFT);
}

/* A window to read, in pages; decided by the plans below. */
struct ra_plan {
	unsigned long start, size, async_size;
};

/* ra.c: the on-demand algorithm, mirrors of mm/readahead.c */
unsigned long get_init_ra_size(unsigned long size, unsigned long max);
unsigned long get_next_ra_size(unsigned long cur, unsigned long max);
bool ra_sync_plan(struct file_ra_state *ra, const struct mapping *m,
		  unsigned long index, unsigned long req, struct ra_plan *p);
/* own_only: only the state's own marker starts a window */
bool ra_async_plan(struct file_ra_state *ra, const struct mapping *m,
		   unsigned long folio, unsigned long req, bool own_only,
		   struct ra_plan *p);

/* window.c: reading a window */
extern void (*ra_trace_hook)(unsigned long first, unsigned long last,
			     unsigned long marker);
unsigned long ra_request_pages(const struct read_req *rq, unsigned long index,
			       unsigned long *req);
int ra_sync_read(struct read_req *rq, unsigned long index,
		 unsigned long last);
int ra_window(struct read_req *rq, const struct ra_plan *p,
	      unsigned long demand_first, unsigned long demand_last);
void ra_finish(struct read_req *rq);
void ra_set_reclaim_mode(enum ra_reclaim_mode mode);

/* readaround.c: read-around for faults, sized by use */
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
	bool last_centred;          /* and it was centred on its fault */
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
void readaround_feedback(struct readaround_state *s, bool used, bool edge,
			 bool behind, unsigned long folio_pages);
bool readaround_streaming(struct readaround_state *s);
bool readaround_plan(struct readaround_state *s, unsigned long pg,
		     unsigned long req, struct ra_plan *p);

#endif
