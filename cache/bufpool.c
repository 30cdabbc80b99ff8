// SPDX-License-Identifier: MIT
/*
 * Buffers kept for reuse: folio data and the compressed bytes of windows.
 *
 * A folio's data and a window's read buffer are big (a frame, 128 KiB by
 * default; a window, up to megabytes) and come and go with every frame the
 * cache takes in and evicts.  Had from malloc they would be mapped and
 * faulted in page by page each time (and unmapped, with a TLB shootdown on
 * every core, when freed); from the heap, they would fragment it.  So they
 * are mapped once, in size classes from 16 KiB to 4 MiB, and a freed one
 * goes to its class's free list instead of back to the kernel, already
 * faulted in.
 *
 * Idle buffers are few, memory of the daemon's fixed overhead like its
 * threads' stacks, shown as the buffer_pool line of memory.stat: as much as
 * one reclaim pass frees at once (a 16th of the budget's memory.max, at
 * most 8 MiB), so that the folios taken in after a pass reuse what it
 * evicted, plus room for the read buffers of the windows in flight, each
 * as big as the compressed bytes of its window (1.25 MiB for a 1 MiB window
 * of incompressible data; five or six in flight at once): 8 MiB, or half
 * the budget if that is less (windows are no bigger than the budget).
 * With a 16th in all, those read buffers took the room, and a stream at
 * the limit mapped and faulted in its buffers afresh: 94,000 page faults
 * for the 49,152 pages of 192 MiB of incompressible data at a 32 MiB
 * budget, and half the daemon's CPU.  Idle buffers are not charged to the
 * budget: at its limit the cache evicts a frame to take in the next one,
 * and a charged idle buffer would take the very room the next folio needs,
 * so reclaim would have to unmap it and the new folio map a fresh one,
 * which is what the pool is for avoiding.  Smaller buffers come from
 * malloc; bigger ones than the largest class are mapped each time.
 */
#include <stdlib.h>
#include <sys/mman.h>

#include "internal.h"

#define POOL_MIN_SHIFT 14 /* 16 KiB */

/*
 * Size classes: four per power of two (16, 20, 24, 28, 32, 40 KiB ...), so
 * that a buffer is at most a quarter bigger than asked for: an odd frame
 * size or a file's last frame keeps little more memory than it is charged.
 */
static size_t class_bytes(int k)
{
	size_t base = (size_t)1 << (POOL_MIN_SHIFT + k / 4);

	return base + (size_t)(k % 4) * (base >> 2);
}

/* The size class of len bytes, or -1 for malloc, NR for a one-off map. */
static int buf_class(size_t len)
{
	int k = 0;

	if (len < (1u << POOL_MIN_SHIFT))
		return -1;
	while (k < BUF_POOL_CLASSES && class_bytes(k) < len)
		k++;
	return k;
}

static size_t map_bytes(size_t len, int k)
{
	return k < BUF_POOL_CLASSES
		       ? class_bytes(k)
		       : (len + ZF_PAGE_SIZE - 1) & ~(size_t)(ZF_PAGE_SIZE - 1);
}

void buf_pool_init(struct buf_pool *p)
{
	pthread_mutex_init(&p->lock, NULL);
	for (int k = 0; k < BUF_POOL_CLASSES; k++)
		p->free[k] = NULL;
	p->idle_pages = 0;
}

void *cache_buf_get(struct cache *c, size_t len)
{
	struct buf_pool *p = &c->bufs;
	int k = buf_class(len);
	void *b = NULL;

	if (k < 0)
		return malloc(len ? len : 1);
	if (k < BUF_POOL_CLASSES) {
		pthread_mutex_lock(&p->lock);
		b = p->free[k];
		if (b) {
			p->free[k] = *(void **)b;
			p->idle_pages -= class_bytes(k) >> ZF_PAGE_SHIFT;
		}
		pthread_mutex_unlock(&p->lock);
		if (b) {
			stat_mod(&c->budget.root, STAT_BUF_POOL,
				 -(long)(class_bytes(k) >> ZF_PAGE_SHIFT));
			return b;
		}
	}
	b = mmap(NULL, map_bytes(len, k), PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (b == MAP_FAILED)
		return NULL;
	/*
	 * Faulted in at once, the pages it will use: a fault a page costs an
	 * exception each (dearest in a virtual machine: a cold mount's reads
	 * spent a fifth of the daemon's CPU there), one call costs one.
	 * Where the kernel cannot (before 5.14), the pages fault in as used.
	 */
	(void)madvise(b, (len + ZF_PAGE_SIZE - 1) & ~(size_t)(ZF_PAGE_SIZE - 1),
		      MADV_POPULATE_WRITE);
	return b;
}

/* Keep b if the pool has room. */
static bool buf_keep(struct cache *c, void *b, int k)
{
	struct buf_pool *p = &c->bufs;
	unsigned long pages = class_bytes(k) >> ZF_PAGE_SHIFT;
	unsigned long io = (unsigned long)counter_max(&c->budget.root.mem) / 2;
	unsigned long cap;
	bool kept = false;

	if (io > BUF_POOL_IO >> ZF_PAGE_SHIFT)
		io = BUF_POOL_IO >> ZF_PAGE_SHIFT;
	cap = reclaim_headroom_pages(&c->budget.root) + io;
	pthread_mutex_lock(&p->lock);
	if (p->idle_pages + pages <= cap) {
		*(void **)b = p->free[k];
		p->free[k] = b;
		p->idle_pages += pages;
		kept = true;
	}
	pthread_mutex_unlock(&p->lock);
	if (kept)
		stat_mod(&c->budget.root, STAT_BUF_POOL, (long)pages);
	return kept;
}

void cache_buf_put(struct cache *c, void *b, size_t len)
{
	int k = buf_class(len);

	if (!b)
		return;
	if (k < 0) {
		free(b);
		return;
	}
	if (k < BUF_POOL_CLASSES && buf_keep(c, b, k))
		return;
	munmap(b, map_bytes(len, k));
}

void buf_pool_drain(struct cache *c)
{
	struct buf_pool *p = &c->bufs;

	pthread_mutex_lock(&p->lock);
	for (int k = 0; k < BUF_POOL_CLASSES; k++)
		while (p->free[k]) {
			void *b = p->free[k];

			p->free[k] = *(void **)b;
			munmap(b, class_bytes(k));
			stat_mod(&c->budget.root, STAT_BUF_POOL,
				 -(long)(class_bytes(k) >> ZF_PAGE_SHIFT));
		}
	p->idle_pages = 0;
	pthread_mutex_unlock(&p->lock);
}
