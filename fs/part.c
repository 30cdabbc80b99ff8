// SPDX-License-Identifier: MIT
/*
 * Part reads: a small random read of a folio that is not cached, served
 * from its bytes alone where the data is raw.  (Why, and what it checks,
 * below.)
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/*
 * Part reads (cache/read.c: a random small read of a folio not cached).
 * Raw data has nothing to decode: a plain file's bytes are its content,
 * and a frame of raw blocks (zstd's choice for incompressible data) holds
 * its content as it is, after a header per block.  Such a read fetches
 * just its bytes from the backing file, at their computed offset.  What it
 * verifies: the frame header (its content size) and the header of the
 * block read (raw, of the right size); the frame's checksum only when the
 * frame is read whole.  It reads the frame's first ZSEEK_RAW_PROBE bytes,
 * the block's header and the bytes asked for at once; a frame with
 * compressed blocks is then filled as usual.  A folio whose frame passed
 * those checks remembers where its first block's bytes start (raw_at): its
 * next part reads of its first block read just their bytes, one read and
 * no probe.  That trusts no more than every read does: the index gives the
 * frame's place, and an open file keeps the index it was opened with.
 *
 * A folio read in part again soon is filled instead: it is being reused,
 * and belongs in the cache.  "Soon" is the refault distance of
 * mm/workingset.c counted in folios filled since (ds->fill_clock): if more
 * were filled than the budget holds, the folio would have been evicted in
 * between had it been cached, so caching it now would not pay either, and
 * it is read in part again.
 */

/* The reads of a part read, at most: the probe, a block header, the bytes */
#define PART_READS 3

/*
 * Wait for the n reads queued on ring (NULL: all were done by pread): 0,
 * or -EIO if the ring failed with some in flight, and then buf, where they
 * land, is the kernel's and is kept, never freed.
 */
static int part_wait(struct ring *ring, struct ring_read *rr, int n, void *buf)
{
	bool orphaned = false;

	for (int i = 0; ring && i < n; i++) {
		if (!rr[i].done)
			ring_wait(ring, &rr[i]);
		orphaned |= rr[i].orphaned || !rr[i].done;
	}
	if (!orphaned)
		return 0;
	backing_keep_orphaned(buf, NULL);
	return -EIO;
}

static int part_io(struct zfile *f, void *io_ctx, struct ring_read *rr, int n,
		   void *block);

/*
 * part_io() O_DIRECT: each read widened to DIO_ALIGN into an aligned
 * scratch buffer, and its bytes copied out (a few KiB).  A refusal turns
 * O_DIRECT off for the file and the reads are done again without it.
 */
static int part_io_direct(struct zfile *f, void *io_ctx, struct ring_read *rr,
			  int n, void *block)
{
	struct cache *c = f->mapping->cache;
	struct ring *ring = n > 1 ? worker_ring(io_ctx) : NULL;
	struct ring_read wr[PART_READS];
	uint64_t lead[PART_READS];
	size_t total = DIO_ALIGN, pos;
	bool refused = false;
	uint8_t *scratch;

	for (int i = 0; i < n; i++) {
		lead[i] = rr[i].off & (DIO_ALIGN - 1);
		wr[i].len = (lead[i] + rr[i].len + DIO_ALIGN - 1) &
			    ~(uint64_t)(DIO_ALIGN - 1);
		total += wr[i].len;
	}
	scratch = cache_buf_get(c, total);
	if (!scratch) {
		atomic_store(&f->direct, false);
		return part_io(f, io_ctx, rr, n, block);
	}
	pos = (size_t)(-(uintptr_t)scratch & (DIO_ALIGN - 1));
	for (int i = 0; i < n; i++) {
		wr[i].off = rr[i].off - lead[i];
		wr[i].dst = scratch + pos;
		wr[i].done = false;
		wr[i].orphaned = false;
		pos += wr[i].len;
		if (!ring || ring_queue(ring, f->dfd, &wr[i], 0)) {
			ssize_t got = pread(f->dfd, wr[i].dst, wr[i].len,
					    (off_t)wr[i].off);

			wr[i].res =
			    got < 0 ? -errno : (int)fault_apply(got, wr[i].len);
			wr[i].done = true;
		}
	}
	if (part_wait(ring, wr, n, scratch))
		return -EIO;
	for (int i = 0; i < n; i++) {
		wr[i].res = (int)fault_direct(wr[i].res);
		refused |= wr[i].res == -EINVAL;
	}
	for (int i = 0; i < n && !refused; i++) {
		uint64_t got = wr[i].res > (int)lead[i]
				   ? (uint64_t)wr[i].res - lead[i]
				   : 0;

		if (wr[i].res < 0) {
			rr[i].res = wr[i].res;
			continue;
		}
		if (got > rr[i].len)
			got = rr[i].len;
		memcpy(rr[i].dst, wr[i].dst + lead[i], got);
		rr[i].res = (int)got;
		if (got < rr[i].len) { /* short: the rest by pread */
			ssize_t more =
			    backing_pread(f, rr[i].dst + got, rr[i].len - got,
					  rr[i].off + got);

			rr[i].res =
			    more < 0 ? (int)more : (int)(got + (uint64_t)more);
		}
	}
	cache_buf_put(c, scratch, total);
	if (refused) {
		atomic_store(&f->direct, false);
		return part_io(f, io_ctx, rr, n, block);
	}
	return 0;
}

/*
 * The reads of one part read, at once on the worker's ring when there are
 * several (one I/O's latency, not two or three), else by pread; O_DIRECT
 * where the file is read so.  0, or -EIO if the ring failed with reads in
 * flight: then block, where they land, is the kernel's and is never freed.
 */
static int part_io(struct zfile *f, void *io_ctx, struct ring_read *rr, int n,
		   void *block)
{
	struct ring *ring = n > 1 ? worker_ring(io_ctx) : NULL;
	bool dc = atomic_load_explicit(&f->dontcache, memory_order_relaxed);

	if (f->dfd >= 0 &&
	    atomic_load_explicit(&f->direct, memory_order_relaxed))
		return part_io_direct(f, io_ctx, rr, n, block);

	for (int i = 0; i < n; i++) {
		rr[i].done = false;
		if (!ring ||
		    ring_queue(ring, f->fd, &rr[i], dc ? RWF_DONTCACHE : 0)) {
			rr[i].res = (int)backing_pread(f, rr[i].dst, rr[i].len,
						       rr[i].off);
			rr[i].done = true;
		}
	}
	if (part_wait(ring, rr, n, block))
		return -EIO;
	for (int i = 0; i < n; i++) {
		bool asked_dc = dc;

		backing_read_complete(f, &rr[i], &asked_dc);
	}
	return 0;
}

/* Frame header sizes a frame may have: where a raw block may start */
#define HDR_MIN	 ZSTD_FRAMEHEADERSIZE_MIN(ZSTD_f_zstd1)
#define HDR_SPAN (ZSTD_FRAMEHEADERSIZE_MAX - HDR_MIN)

/* len bytes at off of f, where a frame checked before has them, into buf:
 * one read, with no probe. */
static int part_read_known(struct zfile *f, uint64_t off, uint32_t len,
			   void *buf)
{
	struct ring_read rr = {.off = off, .len = len, .dst = buf};

	if (part_io(f, NULL, &rr, 1, buf))
		return -EIO;
	if (rr.res < 0)
		return rr.res;
	return (uint32_t)rr.res == len ? 0 : -EIO;
}

/*
 * Content [x, x + len) of frame fr into buf, if the frame is raw blocks:
 * 0, -EAGAIN if it is not (or the range crosses a block header), or an
 * error.  Its first bytes (the probe), the header of block k (past the
 * first: block 0's is in the probe) and the bytes asked for are read at
 * once, the last two over every place the frame header's size may put
 * them (HDR_SPAN bytes more each), into a scratch buffer.
 */
static int part_read_frame(struct zfile *f, void *io_ctx,
			   const struct zseek_frame *fr, uint64_t x,
			   uint32_t len, void *buf, _Atomic uint8_t *raw_at)
{
	struct cache *c = f->mapping->cache;
	uint64_t k = x / ZSEEK_BLOCK, xk = x % ZSEEK_BLOCK;
	/* where block k's header is, for the smallest frame header */
	uint64_t hdr0 =
	    fr->c_off + zseek_raw_block_pos(HDR_MIN + ZSEEK_BLOCK_HEADER, k);
	size_t probe_len =
	    fr->c_size < ZSEEK_RAW_PROBE ? fr->c_size : ZSEEK_RAW_PROBE;
	size_t hdr_at = ZSEEK_RAW_PROBE,
	       data_at = hdr_at + HDR_SPAN + ZSEEK_BLOCK_HEADER;
	size_t total = data_at + HDR_SPAN + len;
	struct ring_read rr[PART_READS];
	unsigned int off, h;
	uint8_t *block;
	int n = 0, r = 0;

	if ((x + len - 1) / ZSEEK_BLOCK != k)
		return -EAGAIN; /* across a block header */
	off = raw_at ? atomic_load_explicit(raw_at, memory_order_relaxed) : 0;
	if (off && !k) /* checked before: the bytes alone */
		return part_read_known(f, fr->c_off + off + x, len, buf);
	block = cache_buf_get(c, total);
	if (!block)
		return -EAGAIN;
	rr[n++] = (struct ring_read){
	    .off = fr->c_off, .len = probe_len, .dst = block};
	if (k)
		rr[n++] =
		    (struct ring_read){.off = hdr0,
				       .len = HDR_SPAN + ZSEEK_BLOCK_HEADER,
				       .dst = block + hdr_at};
	rr[n++] = (struct ring_read){.off = hdr0 + ZSEEK_BLOCK_HEADER + xk,
				     .len = HDR_SPAN + len,
				     .dst = block + data_at};
	if (part_io(f, io_ctx, rr, n, block))
		return -EIO; /* block is kept: the kernel may write it */
	for (int i = 0; i < n && !r; i++)
		if (rr[i].res < 0)
			r = rr[i].res;
	if (!r && (rr[0].res <= 0 ||
		   !zseek_raw_frame(block, (size_t)rr[0].res, fr, &off)))
		r = -EAGAIN;
	if (!r) {
		/* the frame header's real size picks the bytes out of the spans
		 */
		h = off - ZSEEK_BLOCK_HEADER - HDR_MIN;
		if (k && (rr[1].res < (int)(h + ZSEEK_BLOCK_HEADER) ||
			  !zseek_raw_block_ok(block + hdr_at + h, fr, k)))
			r = -EAGAIN;
		else if (rr[n - 1].res < (int)(h + len))
			r = -EIO; /* the file is shorter than its index */
		else
			memcpy(buf, block + data_at + h, len);
		/* relaxed: whoever stores it stores the same value */
		if (!r && raw_at)
			atomic_store_explicit(raw_at, (uint8_t)off,
					      memory_order_relaxed);
	}
	cache_buf_put(c, block, total);
	return r;
}

/* Whether folio index is read in part this time (see above); marks it. */
static bool part_due(struct zfile *f, struct mapping *m, unsigned long index)
{
	uint32_t now =
	    atomic_load_explicit(&f->ds->fill_clock, memory_order_relaxed) + 1;
	uint32_t last = atomic_exchange_explicit(
	    &f->parts[index], now ? now : 1, memory_order_relaxed);
	long fits = counter_max(&m->cache->budget.root.mem) /
		    (long)mapping_folio_pages(m, index);

	return !last || (long)(uint32_t)(now - last) > fits;
}

static int part_read(struct zfile *f, struct mapping *m, void *io_ctx,
		     unsigned long index, uint32_t off, uint32_t len, void *buf)
{
	struct zseek_frame fr;
	ssize_t n;

	if (f->idx.kind == ZSEEK_RAW) {
		n = backing_pread(f, buf, len,
				  mapping_folio_pos(m, index) + off);
		return n < 0 ? (int)n : (size_t)n == len ? 0 : -EIO;
	}
	/* a slot of a split frame starts slot_skip into it */
	fr = zseek_frame_at(&f->idx, zfile_slot_frame(f, index));
	return part_read_frame(f, io_ctx, &fr,
			       off + (f->slot_skip ? f->slot_skip[index] : 0),
			       len, buf, f->raw_at ? &f->raw_at[index] : NULL);
}

int zfile_read_part(struct mapping *m, void *io_ctx, unsigned long index,
		    uint32_t off, uint32_t len, void *buf)
{
	struct zfile *f = m->host;
	struct zseek_frame fr;
	int r;

	/* in a store a request costs more than a frame's bytes: one request
	 * for the frame, not three for its pieces */
	if (!f->parts || index >= f->nslots || f->obj)
		return -EAGAIN;
	/* a compressed frame (never smaller than its content if raw) */
	if (f->idx.kind != ZSEEK_RAW) {
		fr = zseek_frame_at(&f->idx, zfile_slot_frame(f, index));
		if (fr.c_size <= fr.d_size)
			return -EAGAIN;
	}
	if (!part_due(f, m, index))
		return -EAGAIN;
	r = zfile_fd_get(f);
	if (r)
		return r;
	r = part_read(f, m, io_ctx, index, off, len, buf);
	zfile_fd_put(f);
	return r;
}
