// SPDX-License-Identifier: MIT
/*
 * On-demand readahead: mirrors mm/readahead.c.
 *
 * A file's readahead state is a window [start, start + size) in pages with
 * an async tail of async_size pages.  The folio holding page
 * start + size - async_size carries the marker (FOLIO_READAHEAD).
 *
 * - A miss (ra_sync_plan) at the start of the file, or right after the
 *   previous read, or bigger than the window, opens a window sized from the
 *   request: get_init_ra_size() rounds it up to a power of two and takes x4
 *   while small, x2 while medium, else the maximum, ra_pages.  The part
 *   beyond the request is asynchronous.
 * - A miss elsewhere looks back: if more pages just before it are cached
 *   than the request asks for, it is a stream we lost track of (interleaved
 *   readers of one file) and gets a window of that history plus the request;
 *   otherwise it is random and reads exactly the request, leaving the state
 *   alone.
 * - A reader that reaches the marker (ra_async_plan) starts the next window
 *   right after the current one, get_next_ra_size() bigger (x4 while below
 *   ra_pages/16, then x2, capped), entirely asynchronous with its marker on
 *   its first folio, so the next one starts as soon as the reader gets there.
 *   A marker that is not where the state expects it (another stream's)
 *   starts a window at the first uncached page after it.
 *
 * A folio holds a whole frame (32 pages at 128 KiB), so windows cover whole
 * folios: a window ends at the end of the folio that holds its last page,
 * and the state records that, as the kernel does with large folios.
 */
#include <stdint.h>

#include "internal.h"

static unsigned long roundup_pow2(unsigned long x)
{
	unsigned long p = 1;

	while (p < x)
		p <<= 1;
	return p;
}

unsigned long get_init_ra_size(unsigned long size, unsigned long max)
{
	unsigned long newsize = roundup_pow2(size);

	if (newsize <= max / 32)
		newsize = newsize * 4;
	else if (newsize <= max / 4)
		newsize = newsize * 2;
	else
		newsize = max;
	return newsize;
}

unsigned long get_next_ra_size(unsigned long cur, unsigned long max)
{
	if (cur < max / 16)
		return 4 * cur;
	if (cur <= max / 2)
		return 2 * cur;
	return max;
}

static unsigned long folio_of_page(const struct mapping *m, unsigned long pg)
{
	return mapping_index(m, (uint64_t)pg << ZF_PAGE_SHIFT);
}

/* First page past folio i. */
static unsigned long folio_end_page(const struct mapping *m, unsigned long i)
{
	uint64_t end = mapping_folio_pos(m, i) + mapping_folio_len(m, i);

	return page_of(end + ZF_PAGE_SIZE - 1);
}

static unsigned long file_pages(const struct mapping *m)
{
	return page_of(m->size + ZF_PAGE_SIZE - 1);
}

/* Extend the window to the end of the folio holding its last page. */
static void ra_round_to_folios(struct file_ra_state *ra,
			       const struct mapping *m)
{
	unsigned long last = ra->start + ra->size - 1;
	unsigned long end;

	if (last >= file_pages(m))
		last = file_pages(m) - 1;
	end = folio_end_page(m, folio_of_page(m, last));
	if (end > ra->start + ra->size)
		ra->size = end - ra->start;
	if (ra->async_size > ra->size)
		ra->async_size = ra->size;
}

/*
 * page_cache_prev_miss(): how many pages right before index are cached, up
 * to max; *to_zero says whether the run reaches the start of the file.
 */
static unsigned long cached_before(const struct mapping *m,
				   unsigned long index, unsigned long max,
				   bool *to_zero)
{
	unsigned long folio = folio_of_page(m, index), count = 0;

	*to_zero = false;
	if (mapping_folio_pos(m, folio) < ((uint64_t)index << ZF_PAGE_SHIFT))
		return 0; /* index is inside an uncached folio */
	while (folio > 0 && count < max) {
		folio--;
		if (!mapping_cached(m, folio))
			return count;
		count += mapping_folio_pages(m, folio);
	}
	*to_zero = folio == 0;
	return count;
}

/*
 * ractl_max_pages(): a request bigger than the window may read ahead as
 * much as itself, up to what one FUSE request carries (RA_IO_PAGES).
 */
static unsigned long ra_max_pages(const struct file_ra_state *ra,
				  unsigned long req)
{
	unsigned long max = ra->ra_pages;

	if (max && req > max)
		max = req < RA_IO_PAGES ? req : RA_IO_PAGES;
	return max > ra->ra_pages ? max : ra->ra_pages;
}

/* mirrors page_cache_sync_ra(): false means "just the request". */
bool ra_sync_plan(struct file_ra_state *ra, const struct mapping *m,
		  unsigned long index, unsigned long req, struct ra_plan *p)
{
	unsigned long max = ra_max_pages(ra, req);
	long long prev = atomic_load_explicit(&ra->pos.prev_pos,
					      memory_order_relaxed);
	unsigned long prev_index = (unsigned long)(prev >> ZF_PAGE_SHIFT);
	bool to_zero;

	p->start = index;
	p->size = req;
	p->async_size = 0;
	if (ra->ra_pages == 0)
		return false;
	pthread_mutex_lock(&ra->lock);
	if (index == 0 || req > ra->ra_pages || index - prev_index <= 1) {
		/* a new stream: the initial window */
		ra->start = index;
		ra->size = get_init_ra_size(req, max);
		ra->async_size = ra->size > req ? ra->size - req
						 : ra->size / 2;
	} else {
		/* context readahead: does cached history say "stream"? */
		unsigned long contig = cached_before(m, index, max, &to_zero);

		if (contig <= req) {
			pthread_mutex_unlock(&ra->lock);
			return false; /* random: read the request only */
		}
		if (to_zero)
			contig *= 2;
		ra->start = index;
		ra->size = contig + req < max ? contig + req : max;
		ra->async_size = 1;
	}
	ra_round_to_folios(ra, m);
	p->start = ra->start;
	p->size = ra->size;
	p->async_size = ra->async_size;
	pthread_mutex_unlock(&ra->lock);
	return true;
}

/* page_cache_next_miss(): the first uncached page after folio, or 0. */
static unsigned long next_miss(const struct mapping *m, unsigned long folio,
			       unsigned long max)
{
	unsigned long base = page_of(mapping_folio_pos(m, folio));

	for (unsigned long i = folio + 1; i < m->nr_folios; i++) {
		unsigned long pg = page_of(mapping_folio_pos(m, i));

		if (pg - base > max)
			return 0;
		if (!mapping_cached(m, i))
			return pg;
	}
	return 0;
}

/* mirrors page_cache_async_ra(): the reader reached a marked folio. */
bool ra_async_plan(struct file_ra_state *ra, const struct mapping *m,
		   unsigned long folio, unsigned long req, bool own_only,
		   struct ra_plan *p)
{
	unsigned long max = ra_max_pages(ra, req);
	bool own, ok = true;

	if (ra->ra_pages == 0)
		return false;
	pthread_mutex_lock(&ra->lock);
	own = ra->size && folio_of_page(m, ra->start + ra->size -
						   ra->async_size) == folio;
	if (!own && own_only) {
		ok = false;
	} else if (own) {
		/* our own marker: the next window follows this one */
		unsigned long next = get_next_ra_size(ra->size, max);

		ra->start += ra->size;
		ra->size = next > ra->size ? next : ra->size;
	} else {
		/* someone else's marker, or state lost: probe forward */
		unsigned long start = next_miss(m, folio, max);
		unsigned long index = page_of(mapping_folio_pos(m, folio));

		if (!start) {
			ok = false;
		} else {
			ra->start = start;
			ra->size = get_next_ra_size(start - index + req, max);
		}
	}
	if (ok) {
		ra->async_size = ra->size;
		ra_round_to_folios(ra, m);
		ra->async_size = ra->size;
		p->start = ra->start;
		p->size = ra->size;
		p->async_size = ra->async_size;
	}
	pthread_mutex_unlock(&ra->lock);
	return ok && p->start < file_pages(m);
}

void file_ra_init(struct file_ra_state *ra, unsigned long ra_pages)
{
	file_read_state_init(&ra->pos);
	pthread_mutex_init(&ra->lock, NULL);
	ra->start = ra->size = ra->async_size = 0;
	ra->ra_pages = ra_pages;
	ra->walkoffs = 0;
}

void file_ra_destroy(struct file_ra_state *ra)
{
	pthread_mutex_destroy(&ra->lock);
}
