// SPDX-License-Identifier: MIT
/*
 * A readahead window: allocate, charge, submit, fill.
 *
 * For each folio of the window that is not cached (cached ones are skipped
 * and never charged), allocate it and charge it: the folios the request
 * needs with charge_demand(), which reclaims; the others, speculative, with
 * charge_speculative(), which never does.  When a speculative charge fails:
 *
 *  - batch (seed 000, patch 3): reclaim_for_batch() for the rest of the
 *    window at once and retry the folio, at most READAHEAD_MAX_RECLAIMS
 *    times per request; after that, stop the window early;
 *  - per_folio (the unpatched kernel): one reclaim pass for this folio and
 *    retry; stop the window if that fails too.
 *
 * Every new folio enters its slot locked, and the whole window's backing
 * reads go out in one batch (ops->submit).  Once they are in, the window's
 * folios are shared with the cache's fill threads (cache/fillpool.c): the
 * worker fills the ones the request needs and replies; the others are
 * filled by the fill threads and, after the reply, by the worker too
 * (ra_finish).  With no fill threads the worker fills them all, the rest
 * after the reply.  Another reader that needs a folio in flight waits for
 * it, so no frame is ever read twice at the same time.
 */
#include <errno.h>
#include <stdlib.h>

#include "internal.h"

/* A window's folios in flight, filled after the reply. */
struct ra_pending {
	struct fill_batch b;
	struct fill_work work;
	unsigned long demand_first, demand_last;
	unsigned long spec_pages; /* speculative pages brought in */
	struct ra_pending *next;
	unsigned int *order; /* the work's list, after folios[] */
	struct folio *folios[];
};

static enum ra_reclaim_mode reclaim_mode = RA_RECLAIM_BATCH;
void (*ra_trace_hook)(unsigned long first, unsigned long last,
		      unsigned long marker);

void ra_set_reclaim_mode(enum ra_reclaim_mode mode)
{
	reclaim_mode = mode;
}

void ra_request_init(struct ra_request *r, struct mapping *m,
		     struct file_ra_state *ra, struct group *g, void *io_ctx,
		     uint64_t pos, size_t len, bool fault)
{
	read_req_init(&r->rq, m, ra ? &ra->pos : NULL, g, io_ctx, pos, len);
	r->rq.fault = fault;
	r->ra = ra;
	r->readaround = false;
	r->pending = NULL;
	r->reclaims = 0;
}

static bool in_demand(const struct ra_pending *p, unsigned long i)
{
	return i >= p->demand_first && i <= p->demand_last;
}

/* Pages of folios [from, to] of m: what the rest of the window needs. */
static unsigned long window_pages(const struct mapping *m, unsigned long from,
				  unsigned long to)
{
	unsigned long n = 0;

	for (unsigned long i = from; i <= to; i++)
		if (!mapping_cached(m, i))
			n += mapping_folio_pages(m, i);
	return n;
}

/* Charge a speculative folio, reclaiming as the mode says. */
static int charge_ra_folio(struct ra_request *r, struct folio *f,
			   unsigned long rest_pages)
{
	struct group *g = r->rq.group;

	if (charge_speculative(g, f->nr_pages) == 0)
		return 0;
	if (reclaim_mode == RA_RECLAIM_PER_FOLIO) {
		struct group *over = group_over_limit(g, f->nr_pages);

		reclaim_pass(over ? over : g, f->nr_pages, true);
		return charge_speculative(g, f->nr_pages);
	}
	while (r->reclaims < READAHEAD_MAX_RECLAIMS) {
		r->reclaims++;
		if (rest_pages < f->nr_pages)
			rest_pages = f->nr_pages;
		if (!reclaim_for_batch(g, rest_pages, true))
			break;
		if (charge_speculative(g, f->nr_pages) == 0)
			return 0;
	}
	return -ENOMEM;
}

static void pending_free(struct ra_pending *p)
{
	struct mapping *m = p->b.mapping;

	if (m->ops->finish)
		m->ops->finish(&p->b);
	for (unsigned int i = 0; i < p->b.nr; i++)
		if (p->folios[i])
			folio_put(p->folios[i]); /* the window's reference */
	mapping_put(m);
	free(p);
}

static struct ra_pending *pending_alloc(struct read_req *rq,
					unsigned long first,
					unsigned long last,
					unsigned long demand_first,
					unsigned long demand_last)
{
	unsigned int nr = (unsigned int)(last - first + 1);
	struct ra_pending *p = calloc(1, sizeof(*p) + nr * (sizeof(p->folios[0]) +
							 sizeof(p->order[0])));

	if (!p)
		return NULL;
	p->order = (unsigned int *)&p->folios[nr];
	p->b.mapping = rq->mapping;
	p->b.io_ctx = rq->io_ctx;
	p->b.start = first;
	p->b.nr = nr;
	p->b.folios = p->folios;
	p->demand_first = demand_first;
	p->demand_last = demand_last;
	return p;
}

/* The flags a new folio of the window carries. */
static void window_mark(struct ra_request *r, struct ra_pending *p,
			struct folio *f, unsigned long marker)
{
	if (!in_demand(p, f->index)) {
		folio_set(f, FOLIO_SPECULATIVE);
		stat_mod(f->group, STAT_RA_UNREAD, f->nr_pages);
		if (r->readaround)
			folio_set(f, FOLIO_READAROUND);
		if (r->readaround && f->index < p->demand_first)
			folio_set(f, FOLIO_BEHIND);
	}
	if (f->index == marker)
		folio_set(f, FOLIO_READAHEAD);
}

/*
 * Allocate and charge folio i of the window and put it in its slot.
 * 1: added; 0: skipped (cached, or another reader's got there); -ENOMEM:
 * no folio or no charge, the window stops here.
 */
static int window_add(struct ra_request *r, struct ra_pending *p,
		      unsigned long i, unsigned long last, unsigned long marker)
{
	struct mapping *m = r->rq.mapping;
	struct folio *f;
	int err;

	if (mapping_cached(m, i) ||
	    (r->readaround && !in_demand(p, i) && mapping_in_kernel(m, i)))
		return 0;
	f = folio_alloc(m, i);
	if (!f)
		return -ENOMEM;
	if (in_demand(p, i))
		err = charge_demand(r->rq.group, f->nr_pages);
	else
		err = charge_ra_folio(r, f, window_pages(m, i, last));
	if (err) {
		folio_free_unused(f);
		if (!in_demand(p, i))
			stat_inc(r->rq.group, STAT_RA_EARLY_STOPS);
		return -ENOMEM;
	}
	f->group = r->rq.group;
	window_mark(r, p, f, marker);
	if (folio_insert(m, f)) {
		folio_free_unused(f); /* another reader's is there */
		return 0;
	}
	p->folios[i - p->b.start] = f;
	if (!in_demand(p, i))
		p->spec_pages += f->nr_pages;
	return 1;
}

/*
 * Folios [first, last] into their slots, up to the first that cannot be
 * had; how many were added.  *nomem: the demand folio had no room (the
 * caller bounces it).
 */
static int window_populate(struct ra_request *r, struct ra_pending *p,
			   unsigned long last, unsigned long marker,
			   bool *nomem)
{
	int added = 0;

	*nomem = false;
	for (unsigned long i = p->b.start; i <= last; i++) {
		int got = window_add(r, p, i, last, marker);

		if (got < 0) {
			*nomem = i == p->demand_first;
			break;
		}
		added += got;
	}
	return added;
}

static void window_count(struct ra_request *r, const struct ra_pending *p)
{
	struct group *g = r->rq.group;

	if (!p->spec_pages)
		return;
	stat_inc(g, r->readaround ? STAT_READAROUND_WINDOWS : STAT_RA_WINDOWS);
	stat_mod(g, r->readaround ? STAT_READAROUND_PAGES : STAT_RA_PAGES,
		 (long)p->spec_pages);
}

static void pending_done(struct fill_work *w)
{
	pending_free(caa_container_of(w, struct ra_pending, work));
}

/*
 * The window's folios as a fill work, the request's own first; shared with
 * the fill threads unless the filesystem must fill them in order.
 */
static void window_share(struct ra_pending *p)
{
	struct mapping *m = p->b.mapping;
	unsigned int n = 0, ndemand;

	for (unsigned int i = 0; i < p->b.nr; i++)
		if (p->folios[i] && in_demand(p, p->b.start + i))
			p->order[n++] = i;
	ndemand = n;
	for (unsigned int i = 0; i < p->b.nr; i++)
		if (p->folios[i] && !in_demand(p, p->b.start + i))
			p->order[n++] = i;
	fill_work_init(&p->work, &p->b, p->order, n, ndemand, pending_done);
	if (p->b.serial)
		return;
	cache_wait_io(&p->b);
	fill_work_share(m->cache, &p->work);
}

/*
 * Fill the request's own folios now (those a fill thread took, readers
 * wait for); -EIO if the one it needs failed.
 */
static int window_fill_demand(struct ra_pending *p)
{
	struct folio *f = NULL;

	while (fill_work_run(&p->work, true))
		;
	if (p->demand_first >= p->b.start &&
	    p->demand_first - p->b.start < p->b.nr)
		f = p->folios[p->demand_first - p->b.start];
	return f && folio_test(f, FOLIO_ERROR) ? -EIO : 0;
}

/*
 * Read folios [first, last] of the request's mapping, the marker on folio
 * marker (or none if ULONG_MAX).  Folios in [demand_first, demand_last] are
 * the request's own: filled now; the rest after the reply.  Returns -ENOMEM
 * if a demand folio could not be charged (the caller bounces it), -EIO if
 * the one it needs failed, else 0.
 */
static int window_read(struct ra_request *r, unsigned long first,
		       unsigned long last, unsigned long marker,
		       unsigned long demand_first, unsigned long demand_last)
{
	struct ra_pending *p = pending_alloc(&r->rq, first, last, demand_first,
					     demand_last);
	bool nomem;
	int ret;

	if (!p)
		return -ENOMEM;
	if (!window_populate(r, p, last, marker, &nomem)) {
		free(p);
		return nomem ? -ENOMEM : 0;
	}
	window_count(r, p);
	mapping_get(p->b.mapping);
	if (p->b.mapping->ops->submit(&p->b)) {
		/* nothing was read: every folio fails, readers see EIO */
		for (unsigned int i = 0; i < p->b.nr; i++)
			if (p->folios[i])
				folio_fill_done(p->folios[i], -EIO);
		pending_free(p);
		return nomem ? -ENOMEM : 0;
	}
	window_share(p);
	ret = window_fill_demand(p);
	p->next = r->pending;
	r->pending = p;
	return nomem ? -ENOMEM : ret;
}

int ra_window(struct read_req *rq, const struct ra_plan *pl,
	      unsigned long demand_first, unsigned long demand_last)
{
	const struct mapping *m = rq->mapping;
	unsigned long first, last, marker = ULONG_MAX, end;

	if (!m->nr_folios)
		return 0;
	end = pl->start + pl->size;
	/* the marker page, before the window is cut at the end of the file */
	if (pl->async_size)
		marker = end - pl->async_size;
	if (((uint64_t)end << ZF_PAGE_SHIFT) > m->size)
		end = (unsigned long)pages_of_bytes(m->size);
	first = mapping_index(m, (uint64_t)pl->start << ZF_PAGE_SHIFT);
	last = end ? mapping_index(m, ((uint64_t)end << ZF_PAGE_SHIFT) - 1)
		   : first;
	if (demand_last != ULONG_MAX && last < demand_last)
		last = demand_last;
	if (demand_last != ULONG_MAX && first > demand_first)
		first = demand_first;
	/* no marker past the end of the file: nothing is left to read ahead */
	if (marker != ULONG_MAX)
		marker = marker < end ? mapping_index(m, (uint64_t)marker
							      << ZF_PAGE_SHIFT)
				      : ULONG_MAX;
	if (ra_trace_hook)
		ra_trace_hook(first, last, marker);
	return window_read(ra_req(rq), first, last, marker, demand_first,
			   demand_last);
}

/*
 * After the reply: fill what is left of the request's windows, beside the
 * fill threads, and let the windows go.
 */
void ra_finish(struct read_req *rq)
{
	struct ra_request *r = ra_req(rq);
	struct ra_pending *p = r->pending;

	r->pending = NULL;
	while (p) {
		struct ra_pending *next = p->next;

		while (fill_work_run(&p->work, false))
			;
		fill_work_put(&p->work);
		p = next;
	}
}

/*
 * Before the request sleeps on another's folio: fill the folios of its
 * windows that no fill thread will take, which that folio's filler may be
 * waiting for.  Shared windows are left to the fill threads.
 */
static void ra_unblock(struct read_req *rq)
{
	for (struct ra_pending *p = ra_req(rq)->pending; p; p = p->next)
		if (!p->work.shared)
			while (fill_work_run(&p->work, false))
				;
}

/*
 * The pages rq asks for from folio index on: returns the first, and sets
 * *req to how many (at least one).
 */
unsigned long ra_request_pages(const struct read_req *rq, unsigned long index,
			       unsigned long *req)
{
	const struct mapping *m = rq->mapping;
	uint64_t fpos = mapping_folio_pos(m, index);
	uint64_t pos = rq->pos > fpos ? rq->pos : fpos;
	uint64_t end = rq->pos + rq->len < m->size ? rq->pos + rq->len
						   : m->size;
	unsigned long pg = page_of(pos);
	unsigned long n = pages_of_bytes(end) - pg;

	*req = n ? n : 1;
	return pg;
}

/* page_cache_sync_ra() for a read(): the on-demand algorithm. */
int ra_sync_read(struct read_req *rq, unsigned long index, unsigned long last)
{
	struct file_ra_state *ra = ra_req(rq)->ra;
	unsigned long req, pg = ra_request_pages(rq, index, &req);
	struct ra_plan p;

	if (!ra || !ra_sync_plan(ra, rq->mapping, pg, req, &p)) {
		/* random, or readahead off: exactly what the request needs */
		p.start = pg;
		p.size = req;
		p.async_size = 0;
	}
	return ra_window(rq, &p, index, last);
}

/* The hooks the cache's read path calls: page_cache_sync/async_ra. */
static int ra_sync(struct read_req *rq, unsigned long index,
		   unsigned long last)
{
	if (rq->fault)
		return readaround_sync(rq, index, last);
	return ra_sync_read(rq, index, last);
}

static void ra_async(struct read_req *rq, struct folio *f, unsigned long last)
{
	const struct mapping *m = rq->mapping;
	struct file_ra_state *ra = ra_req(rq)->ra;
	struct readaround_state *s;
	unsigned long req, first;
	struct ra_plan p;

	if (!ra)
		return;
	/* from the marked folio's start to the end of the request */
	req = pages_of_bytes(rq->pos + rq->len < m->size ? rq->pos + rq->len
							 : m->size);
	first = page_of(mapping_folio_pos(m, f->index));
	req = req > first ? req - first : 1;
	/*
	 * A fault on a marker the state does not expect, in a file whose
	 * faults come in short runs, is a cold burst crossing what an old
	 * window left behind: a stream's ramp from there reads far past the
	 * burst, so only read-around (at the next miss) decides.
	 */
	s = rq->fault ? atomic_load(&m->ra_private) : NULL;
	if (!ra_async_plan(ra, m, f->index, req, s && !readaround_streaming(s),
			   &p))
		return;
	first = mapping_index(m, (uint64_t)p.start << ZF_PAGE_SHIFT);
	if (first <= last) /* the request itself reaches into the window */
		ra_window(rq, &p, first, last);
	else
		ra_window(rq, &p, ULONG_MAX, ULONG_MAX);
}

static const struct cache_ra_ops ra_ops = {
	.sync_ra = ra_sync,
	.async_ra = ra_async,
	.finish = ra_finish,
	.unblock = ra_unblock,
	.folio_used = readaround_used,
	.folio_unused = readaround_unused,
	.mapping_gone = readaround_free,
};

int readahead_init(struct cache *c, const struct ra_config *cfg)
{
	ra_set_reclaim_mode(cfg->reclaim);
	readaround_set_mode(cfg->readaround);
	c->ra_ops = &ra_ops;
	return 0;
}
