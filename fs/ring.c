// SPDX-License-Identifier: MIT
/*
 * A worker's io_uring for backing reads: every result handled.
 *
 * Reads are queued (ring_queue), submitted in one go per window
 * (ring_submit) and waited for one by one (ring_wait), reaping whatever
 * completes first.  The completion queue never overflows: no more reads
 * are in flight than it has entries, and a read that would pass that
 * waits for an earlier one to complete first.  A submit that takes fewer
 * than were queued is repeated until all are in; EINTR, EAGAIN and EBUSY
 * reap a completion and try again.  Any other error breaks the ring: the
 * reads on it fail with that error, the worker reads with pread from then
 * on, and the buffers of reads that were in flight are never freed (the
 * kernel may still write them; see ring_orphaned).
 *
 * A test hook (ZFOLIO_TEST_FAULT, backing.c) can make submits refuse and
 * waits fail, so the tests reach these paths on a real ring.
 */
#include <errno.h>
#include <stdlib.h>

#include "internal.h"

int ring_init(struct ring *r, unsigned int depth)
{
	int err = io_uring_queue_init(depth, &r->uring, 0);

	if (err)
		return err;
	r->ok = true;
	r->inflight = 0;
	r->cq_entries = r->uring.cq.ring_entries;
	CDS_INIT_LIST_HEAD(&r->reads);
	return 0;
}

/* Only when nothing is in flight: the kernel writes no buffer after it. */
void ring_exit(struct ring *r)
{
	while (r->ok && r->inflight && ring_submit(r) == 0 && ring_reap(r) == 0)
		;
	if (r->ok || r->broken)
		io_uring_queue_exit(&r->uring);
	r->ok = false;
}

static void read_done(struct ring_read *rr, int res)
{
	rr->res = res;
	rr->done = true;
	cds_list_del_init(&rr->link);
}

/* The ring cannot be trusted any more: fail what it carries. */
static int ring_break(struct ring *r, int err)
{
	struct ring_read *rr, *tmp;

	cds_list_for_each_entry_safe(rr, tmp, &r->reads, link) {
		rr->orphaned = true;
		read_done(rr, err);
	}
	r->ok = false;
	r->broken = true;
	return err;
}

/* Wait for one completion and finish its read: 0, or the ring broke. */
int ring_reap(struct ring *r)
{
	struct io_uring_cqe *cqe;
	struct ring_read *rr;
	int err;

	for (;;) {
		err = fault_uring_wait();
		if (!err)
			err = io_uring_wait_cqe(&r->uring, &cqe);
		if (!err)
			break;
		if (err != -EINTR && err != -EAGAIN)
			return ring_break(r, err);
	}
	rr = io_uring_cqe_get_data(cqe);
	r->inflight--;
	read_done(rr, (int)fault_apply(cqe->res, rr->len));
	io_uring_cqe_seen(&r->uring, cqe);
	return 0;
}

/* Submits in a row that make no progress before the ring is given up. */
#define RING_STALLS 1000

/* Reads the kernel has (submitted, not reaped). */
static unsigned int ring_submitted(struct ring *r)
{
	return r->inflight - io_uring_sq_ready(&r->uring);
}

/* Submit everything queued: 0, or the ring broke. */
int ring_submit(struct ring *r)
{
	unsigned int stalls = 0;

	while (r->ok && io_uring_sq_ready(&r->uring)) {
		int n = fault_uring_submit();

		if (!n)
			n = io_uring_submit(&r->uring);
		if (n > 0) {
			stalls = 0;
			continue;
		}
		if (n < 0 && n != -EINTR && n != -EAGAIN && n != -EBUSY)
			return ring_break(r, n);
		/* no progress: the kernel wants completions reaped first */
		if (++stalls > RING_STALLS)
			return ring_break(r, -EIO);
		if (ring_submitted(r) && ring_reap(r))
			return -EIO;
	}
	return r->ok ? 0 : -EIO;
}

/*
 * Queue a read of rr->len bytes at rr->off of fd into rr->dst.  -EAGAIN:
 * the ring cannot take it (broken, or no room even after waiting): the
 * caller reads it with pread.
 */
int ring_queue(struct ring *r, int fd, struct ring_read *rr, int rw_flags)
{
	struct io_uring_sqe *sqe;

	/* room in the completion queue for every read in flight */
	while (r->ok && r->inflight >= r->cq_entries)
		if (ring_submit(r) || ring_reap(r))
			break;
	sqe = r->ok ? io_uring_get_sqe(&r->uring) : NULL;
	if (!sqe && r->ok && ring_submit(r) == 0)
		sqe = io_uring_get_sqe(&r->uring);
	if (!sqe)
		return -EAGAIN;
	io_uring_prep_read(sqe, fd, rr->dst, (unsigned int)rr->len, rr->off);
	sqe->rw_flags = rw_flags;
	io_uring_sqe_set_data(sqe, rr);
	rr->done = false;
	rr->orphaned = false;
	cds_list_add(&rr->link, &r->reads);
	r->inflight++;
	return 0;
}

/* Until rr is done: 0, or the error that broke the ring. */
int ring_wait(struct ring *r, struct ring_read *rr)
{
	int err = ring_submit(r);

	while (!rr->done && !err)
		err = ring_reap(r);
	return rr->done ? 0 : err;
}
