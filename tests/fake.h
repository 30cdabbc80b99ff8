/* SPDX-License-Identifier: MIT */
/*
 * A fake mapping for engine tests: folio i of a file holds a known pattern,
 * filled without any I/O, so tests can check every byte and count fills.
 */
#ifndef ZF_TESTS_FAKE_H
#define ZF_TESTS_FAKE_H

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "../cache/internal.h"
#include "../readahead/internal.h"
#include "check.h"

#define FOLIO 131072u

static inline unsigned char pattern(uint64_t pos)
{
	return (unsigned char)((pos * 2654435761u) >> 13);
}

static atomic_int fills;

static inline int fake_submit(struct fill_batch *b)
{
	(void)b;
	return 0;
}

static inline void fill_pattern(struct mapping *m, unsigned long index, void *buf)
{
	uint64_t pos = mapping_folio_pos(m, index);
	uint32_t len = mapping_folio_len(m, index);

	for (uint32_t i = 0; i < len; i++)
		((unsigned char *)buf)[i] = pattern(pos + i);
}

/* The folio whose fills fail (-EBADMSG, a damaged frame), or -1. */
static long fake_bad_index = -1;
/* While set, fills of fake_slow_index wait for it to be cleared. */
static atomic_bool fake_hold;
static long fake_slow_index = -1;
static atomic_int fake_held; /* fills waiting on fake_hold now */

static inline int fake_fill(struct fill_batch *b, unsigned int i)
{
	struct folio *f = b->folios[i];

	atomic_fetch_add(&fills, 1);
	if ((long)f->index == fake_bad_index)
		return -EBADMSG;
	if ((long)f->index == fake_slow_index) {
		atomic_fetch_add(&fake_held, 1);
		while (atomic_load(&fake_hold))
			usleep(1000);
		atomic_fetch_sub(&fake_held, 1);
	}
	fill_pattern(b->mapping, f->index, f->data);
	return 0;
}

static inline void fake_finish(struct fill_batch *b)
{
	(void)b;
}

static inline int fake_read_into(struct mapping *m, void *ctx,
				 unsigned long index, void *buf, struct group *g)
{
	(void)ctx;
	(void)g;
	if ((long)index == fake_bad_index)
		return -EBADMSG;
	fill_pattern(m, index, buf);
	return 0;
}

static const struct mapping_ops fake_ops = {
	.submit = fake_submit,
	.fill = fake_fill,
	.finish = fake_finish,
	.read_into = fake_read_into,
};

struct sink {
	unsigned char *buf;
	size_t len;
	int err;
};

static inline int sink_reply(void *arg, const struct iovec *iov, int cnt)
{
	struct sink *s = arg;

	s->len = 0;
	s->err = 0;
	if (!iov) {
		s->err = cnt;
		return 0;
	}
	for (int i = 0; i < cnt; i++) {
		memcpy(s->buf + s->len, iov[i].iov_base, iov[i].iov_len);
		s->len += iov[i].iov_len;
	}
	return 0;
}

/* A cache of budget_pages and no other limit, for the setups below. */
static inline struct cache_config fake_config(unsigned long budget_pages)
{
	struct cache_config cfg = {
		.budget = {.max_pages = budget_pages,
			   .high_pages = COUNTER_MAX,
			   .group_max_pages = COUNTER_MAX,
			   .group_high_pages = COUNTER_MAX},
	};

	return cfg;
}

/* The cache as cfg says, started, with readahead of ra_pages. */
static inline void setup_config(struct cache *c,
				const struct cache_config *cfg,
				unsigned long ra_pages,
				enum ra_reclaim_mode mode)
{
	struct ra_config rc = {.ra_pages = ra_pages, .reclaim = mode};

	CHECK_EQ(cache_init(c, cfg), 0);
	CHECK_EQ(cache_start(c), 0);
	readahead_init(c, &rc);
}

static inline void setup_ra(struct cache *c, unsigned long budget_pages,
		     bool lockless, unsigned long ra_pages,
		     enum ra_reclaim_mode mode)
{
	struct cache_config cfg = fake_config(budget_pages);

	cfg.lockless = lockless;
	cfg.budget.reclaim_headroom = mode == RA_RECLAIM_BATCH;
	setup_config(c, &cfg, ra_pages, mode);
}

static inline struct mapping *fake_mapping(struct cache *c, uint64_t size)
{
	return mapping_create(c, &fake_ops, NULL, size,
			      (unsigned long)((size + FOLIO - 1) / FOLIO), FOLIO,
			      NULL);
}

static __thread struct ra_request *rq;

static inline void read_at_done(void)
{
	free(rq);
	rq = NULL;
}

/* One request of the cache's read path, as a worker serves it. */
static inline int read_req_at(struct mapping *m, struct file_ra_state *ra,
			      struct group *g, uint64_t pos, size_t len,
			      bool fault, struct sink *s)
{
	if (!rq)
		rq = malloc(sizeof(*rq));
	ra_request_init(rq, m, ra, g, NULL, pos, len, fault);
	rq->rq.fill = fault; /* a fault is a page-cache fill, as in fs/ops.c */
	cache_read(&rq->rq, sink_reply, s);
	cache_quiescent();
	return s->err;
}

static inline int read_at(struct mapping *m, struct file_ra_state *ra,
		   struct group *g, uint64_t pos, size_t len, struct sink *s)
{
	return read_req_at(m, ra, g, pos, len, false, s);
}

static inline bool bytes_ok(const struct sink *s, uint64_t pos)
{
	for (size_t i = 0; i < s->len; i++)
		if (s->buf[i] != pattern(pos + i))
			return false;
	return true;
}

static inline void setup(struct cache *c, unsigned long budget_pages,
			 bool lockless)
{
	setup_ra(c, budget_pages, lockless, 32, RA_RECLAIM_BATCH);
}

#endif
