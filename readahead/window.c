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
 * reads go out in one batch (ops->submit).  The folios the request needs are
 * filled at once; the others after the reply (ra_finish), when their
 * waiters, if any, are woken.  Another reader that needs a folio in flight
 * waits for it, so no frame is ever read twice at the same time.
 */
#include <errno.h>
#include <stdlib.h>

#include "readahead.h"

struct ra_pending {
	struct fill_batch b;
	unsigned long demand_first, demand_last;
	struct ra_pending *next;
	struct folio *folios[];
};

static enum ra_reclaim_mode reclaim_mode_default = RA_RECLAIM_BATCH;
void (*ra_trace_hook)(unsigned long first, unsigned long last,
		      unsigned long marker);

enum ra_reclaim_mode ra_reclaim_mode(void)
{
	return reclaim_mode_default;
}

void ra_set_reclaim_mode(enum ra_reclaim_mode mode)
{
	reclaim_mode_default = mode;
}

static bool in_demand(unsigned long i, unsigned long first, unsigned long last)
{
	return i >= first && i <= last;
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
static int charge_ra_folio(struct read_req *rq, struct folio *f,
			   unsigned long rest_pages)
{
	struct group *g = rq->group;

	if (charge_speculative(g, f->nr_pages) == 0)
		return 0;
	if (ra_reclaim_mode() == RA_RECLAIM_PER_FOLIO) {
		struct group *over = group_over_limit(g, f->nr_pages);

		reclaim_pass(over ? over : g, f->nr_pages, true);
		return charge_speculative(g, f->nr_pages);
	}
	while (rq->ra_reclaims < READAHEAD_MAX_RECLAIMS) {
		rq->ra_reclaims++;
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

/*
 * Read folios [first, last] of the request's mapping, the marker on folio
 * marker (or none if ULONG_MAX).  Folios in [demand_first, demand_last] are
 * the request's own.  Returns -ENOMEM if a demand folio could not be
 * charged (the caller bounces it), else 0.
 */
static int window_read(struct read_req *rq, unsigned long first,
		       unsigned long last, unsigned long marker,
		       unsigned long demand_first, unsigned long demand_last)
{
	struct mapping *m = rq->mapping;
	unsigned int nr = (unsigned int)(last - first + 1), added = 0;
	unsigned long spec_pages = 0;
	struct ra_pending *p;
	int ret = 0;

	p = calloc(1, sizeof(*p) + nr * sizeof(p->folios[0]));
	if (!p)
		return -ENOMEM;
	for (unsigned long i = first; i <= last; i++) {
		bool demand = in_demand(i, demand_first, demand_last);
		struct folio *f;
		int err;

		if (mapping_cached(m, i))
			continue;
		f = folio_alloc(m, i, rq->group);
		if (!f) {
			ret = i == demand_first ? -ENOMEM : 0;
			break;
		}
		if (demand)
			err = charge_demand(rq->group, f->nr_pages);
		else
			err = charge_ra_folio(rq, f, window_pages(m, i, last));
		if (err) {
			folio_free_unused(f);
			if (i == demand_first)
				ret = -ENOMEM; /* the caller bounces it */
			else if (!demand)
				stat_inc(rq->group, STAT_RA_EARLY_STOPS);
			break;
		}
		f->group = rq->group;
		if (!demand)
			folio_set(f, FOLIO_SPECULATIVE);
		if (!demand && rq->readaround)
			folio_set(f, FOLIO_READAROUND);
		if (!demand && rq->readaround && i < demand_first)
			folio_set(f, FOLIO_BEHIND);
		if (i == marker)
			folio_set(f, FOLIO_READAHEAD);
		if (folio_insert(m, f)) {
			folio_free_unused(f); /* another reader's is there */
			continue;
		}
		p->folios[i - first] = f;
		added++;
		if (!demand)
			spec_pages += f->nr_pages;
	}
	if (!added) {
		free(p);
		return ret;
	}
	if (spec_pages && rq->readaround) {
		stat_inc(rq->group, STAT_READAROUND_WINDOWS);
		stat_mod(rq->group, STAT_READAROUND_PAGES, (long)spec_pages);
	} else if (spec_pages) {
		stat_inc(rq->group, STAT_RA_WINDOWS);
		stat_mod(rq->group, STAT_RA_PAGES, (long)spec_pages);
	}
	mapping_get(m);
	p->b.mapping = m;
	p->b.io_ctx = rq->io_ctx;
	p->b.start = first;
	p->b.nr = nr;
	p->b.folios = p->folios;
	p->demand_first = demand_first;
	p->demand_last = demand_last;
	if (m->ops->submit(&p->b)) {
		/* nothing was read: every folio fails, readers see EIO */
		for (unsigned int i = 0; i < nr; i++)
			if (p->folios[i])
				folio_fill_done(p->folios[i], -EIO);
		pending_free(p);
		return ret;
	}
	/* the request's own folios first, then reply, then the rest */
	for (unsigned int i = 0; i < nr; i++)
		if (p->folios[i] &&
		    in_demand(first + i, demand_first, demand_last)) {
			int err = cache_fill_batch(&p->b, i);

			/* the folio the request waits for failed: say so */
			if (err && first + i == demand_first)
				ret = -EIO;
			folio_put(p->folios[i]);
			p->folios[i] = NULL;
		}
	if (spec_pages) {
		p->next = rq->pending;
		rq->pending = p;
	} else {
		pending_free(p);
	}
	return ret;
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
		end = (unsigned long)((m->size + ZF_PAGE_SIZE - 1) >>
				      ZF_PAGE_SHIFT);
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
	return window_read(rq, first, last, marker, demand_first, demand_last);
}

/* After the reply: fill the speculative folios and wake their waiters. */
void ra_finish(struct read_req *rq)
{
	struct ra_pending *p = rq->pending;

	rq->pending = NULL;
	while (p) {
		struct ra_pending *next = p->next;

		for (unsigned int i = 0; i < p->b.nr; i++)
			if (p->folios[i])
				cache_fill_batch(&p->b, i);
		pending_free(p);
		p = next;
	}
}

/* The hooks the cache's read path calls: page_cache_sync/async_ra. */
static int ra_sync(struct read_req *rq, unsigned long index,
		   unsigned long last)
{
	if (rq->fault)
		return readaround_sync(rq, index, last);
	return ra_sync_read(rq, index, last);
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
	unsigned long pg = (unsigned long)(pos >> ZF_PAGE_SHIFT);
	unsigned long n = (unsigned long)((end + ZF_PAGE_SIZE - 1) >>
					  ZF_PAGE_SHIFT) - pg;

	*req = n ? n : 1;
	return pg;
}

/* page_cache_sync_ra() for a read(): the on-demand algorithm. */
int ra_sync_read(struct read_req *rq, unsigned long index, unsigned long last)
{
	const struct mapping *m = rq->mapping;
	unsigned long req, pg = ra_request_pages(rq, index, &req);
	struct ra_plan p;

	if (!rq->ra || !ra_sync_plan(rq->ra, m, pg, req, &p)) {
		/* random, or readahead off: exactly what the request needs */
		p.start = pg;
		p.size = req;
		p.async_size = 0;
	}
	return ra_window(rq, &p, index, last);
}

static void ra_async(struct read_req *rq, struct folio *f, unsigned long last)
{
	const struct mapping *m = rq->mapping;
	uint64_t end = rq->pos + rq->len < m->size ? rq->pos + rq->len
						   : m->size;
	unsigned long pg = (unsigned long)(mapping_folio_pos(m, f->index) >>
					   ZF_PAGE_SHIFT);
	unsigned long req = (unsigned long)((end + ZF_PAGE_SIZE - 1) >>
					    ZF_PAGE_SHIFT);
	unsigned long first;
	struct ra_plan p;

	if (!rq->ra)
		return;
	req = req > pg ? req - pg : 1;
	if (!ra_async_plan(rq->ra, m, f->index, req, &p))
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
