// SPDX-License-Identifier: MIT
/*
 * FUSE over io_uring: the kernel hands requests to registered buffers
 * instead of read(/dev/fuse), and one submission sends a reply and takes
 * the next request (Linux 6.14+, module parameter enable_uring).
 *
 * The kernel keeps one queue per possible CPU and gives a request to the
 * queue of the CPU its caller runs on; the ring is used only once every
 * queue has an entry registered, and until then (and for forgets,
 * interrupts and notifications always) requests come over /dev/fuse.
 *
 * One entry per worker thread, each thread with its own small io_uring:
 * a request blocked on backing I/O holds only its own thread, and the
 * kernel hands the queue's next request to another free entry (or queues
 * it until one is free), so several workers per queue keep a slow read
 * from stalling the others, as the /dev/fuse pool does.  An entry with
 * several requests in flight on one thread would need the engine's reads
 * to complete asynchronously, which they do not.
 *
 * A request is served by libfuse's own dispatch: the entry's buffer keeps
 * room before the payload, so the in-header and the op header are copied
 * in front of it (at most 168 bytes) and fuse_session_process_buf sees
 * the request as /dev/fuse would have given it.  The reply reaches
 * furing_reply() through the session's custom writev (initio.c), which
 * copies its pieces (a read's folio bytes, once) into the entry's payload
 * buffer; the next submission commits it.
 *
 * libfuse 3.14 and the installed kernel headers know nothing of this, so
 * the wire layouts are declared here (include/uapi/linux/fuse.h, 7.42).
 */
#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define FUSE_IO_URING_CMD_REGISTER 1
#define FUSE_IO_URING_CMD_COMMIT_AND_FETCH 2

struct fuse_uring_ent_in_out {
	uint64_t flags;
	uint64_t commit_id; /* the request's unique: name it in the commit */
	uint32_t payload_sz;
	uint32_t padding;
	uint64_t reserved;
};

/* the header buffer: in_out holds fuse_in_header, then fuse_out_header */
struct fuse_uring_req_header {
	char in_out[128];
	char op_in[128]; /* the first argument of a request (its op header) */
	struct fuse_uring_ent_in_out ring_ent_in_out;
};

/* in the SQE's command area (an SQE128 ring) */
struct fuse_uring_cmd_req {
	uint64_t flags;
	uint64_t commit_id;
	uint16_t qid;
	uint8_t padding[6];
};

/* fuse_in_header: len u32, opcode u32, unique u64, ... */
#define IN_HEADER 40
/* fuse_out_header: len u32, error i32, unique u64 */
#define OUT_HEADER 16
/* room kept before the payload for the in-header and the op header */
#define REQ_FRONT (IN_HEADER + 128)

/* what the CQE's user_data says */
enum { CQE_FETCH = 1 };

struct furing_ent {
	struct io_uring ring;
	struct fuse_session *se;
	struct fuse_uring_req_header *hdr;
	char *buf;   /* REQ_FRONT bytes, then the payload buffer */
	size_t payload_size;
	unsigned int qid;
	uint64_t commit_id;
	uint64_t unique; /* the request being served, or 0 */
	bool replied;
	bool commit_due; /* a reply to commit with the next submission */
	bool request_waits; /* delivered as it registered */
	struct furing_ent *retired; /* on reg.retired once freed */
};

/* What every entry shares. */
static struct {
	pthread_mutex_t lock; /* of retired */
	struct furing_ent *retired;
	size_t payload_size; /* from the INIT reply */
	atomic_ulong requests; /* served over the ring */
	/* set by the main thread when the rings serve, read by workers
	 * answering the control file */
	atomic_bool serving; /* every queue has an entry */
	atomic_uint queues, entries;
} reg = {.lock = PTHREAD_MUTEX_INITIALIZER};

static __thread struct furing_ent *cur_ent;
/* A ring's memory is mapped from the kernel (by a raw mmap that TSan does
 * not see), and a ring set up after another is gone may get its addresses:
 * its unmapping comes before the new mapping. */
static char ring_token;
static long spin_ns; /* uring_poll_us */

void furing_set_poll(unsigned int us)
{
	spin_ns = (long)us * 1000;
}

void furing_set_payload(size_t max_write, unsigned int max_pages)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = 8192;

	if (max_write > n)
		n = max_write;
	if (max_pages * pg > n)
		n = max_pages * pg;
	reg.payload_size = n;
}

void furing_set_state(bool serving, unsigned int queues,
		      unsigned int entries)
{
	atomic_store(&reg.queues, queues);
	atomic_store(&reg.entries, entries);
	atomic_store(&reg.serving, serving); /* last: it says the rest holds */
}

/* The control file "transport": which, and what went over io_uring. */
int furing_describe(char *buf, size_t len)
{
	bool on = atomic_load(&reg.serving);

	return snprintf(buf, len,
			"transport %s\nuring_queues %u\nuring_entries %u\n"
			"uring_requests %lu\n",
			on ? "uring" : "dev", on ? atomic_load(&reg.queues) : 0,
			on ? atomic_load(&reg.entries) : 0,
			atomic_load(&reg.requests));
}

unsigned int furing_queues(void)
{
	/* the kernel's num_possible_cpus(): "0-1", "0-3,5", ... */
	FILE *f = fopen("/sys/devices/system/cpu/possible", "re");
	unsigned int n = 0, a, b;
	int c;

	if (f) {
		do {
			if (fscanf(f, "%u", &a) != 1)
				break;
			b = a;
			if ((c = fgetc(f)) == '-') {
				if (fscanf(f, "%u", &b) != 1)
					break;
				c = fgetc(f);
			}
			n += b - a + 1;
		} while (c == ',');
		fclose(f);
	}
	if (!n) {
		long k = sysconf(_SC_NPROCESSORS_CONF);

		n = k > 0 ? (unsigned int)k : 1;
	}
	return n;
}

static void prep_cmd(struct furing_ent *e, struct io_uring_sqe *sqe,
		     uint32_t op)
{
	struct fuse_uring_cmd_req cr = {.qid = (uint16_t)e->qid,
					.commit_id = e->commit_id};
	/* an SQE128 ring: the command area is the SQE's second half */
	char *cmd = (char *)sqe + offsetof(struct io_uring_sqe, cmd);

	io_uring_prep_rw(IORING_OP_URING_CMD, sqe, fuse_session_fd(e->se),
			 NULL, 0, 0);
	sqe->cmd_op = op;
	sqe->user_data = CQE_FETCH;
	memset(cmd, 0, 80);
	memcpy(cmd, &cr, sizeof(cr));
}

/*
 * An entry on queue qid, for the calling thread, registered with the
 * kernel.  0, or why the kernel (or this machine) refused.
 */
int furing_ent_new(struct fuse_session *se, unsigned int qid, bool refuse,
		   struct furing_ent **out)
{
	struct io_uring_params p = {.flags = IORING_SETUP_SQE128};
	struct furing_ent *e = calloc(1, sizeof(*e));
	struct iovec iov[2];
	struct io_uring_cqe *cqe;
	struct io_uring_sqe *sqe;
	int err = -ENOMEM;

	if (!e)
		return err;
	e->se = se;
	e->qid = qid;
	e->payload_size = reg.payload_size;
	e->hdr = calloc(1, sizeof(*e->hdr));
	e->buf = malloc(REQ_FRONT + e->payload_size);
	if (!e->hdr || !e->buf || !e->payload_size)
		goto fail;
	err = io_uring_queue_init_params(4, &e->ring, &p);
	if (err)
		goto fail;
	tsan_acquire(&ring_token);
	iov[0] = (struct iovec){e->hdr, sizeof(*e->hdr)};
	iov[1] = (struct iovec){e->buf + REQ_FRONT, e->payload_size};
	if (refuse) /* the test hook: a header the kernel must refuse */
		iov[0].iov_len = 8;
	sqe = io_uring_get_sqe(&e->ring);
	prep_cmd(e, sqe, FUSE_IO_URING_CMD_REGISTER);
	sqe->addr = (uint64_t)(uintptr_t)iov;
	sqe->len = 2;
	do
		err = io_uring_submit(&e->ring);
	while (err == -EINTR);
	if (err == 1)
		err = 0;
	else if (err >= 0)
		err = -EAGAIN;
	/*
	 * A refusal completes at once; a registered entry waits, unless the
	 * kernel handed it a request already (the ring became ready with it):
	 * that one is served first.
	 */
	if (!err && io_uring_peek_cqe(&e->ring, &cqe) == 0) {
		if (cqe->res < 0)
			err = cqe->res;
		else
			e->request_waits = true;
		io_uring_cqe_seen(&e->ring, cqe);
	}
	if (!err) {
		cur_ent = e;
		*out = e;
		return 0;
	}
	tsan_release(&ring_token);
	io_uring_queue_exit(&e->ring);
fail:
	free(e->hdr);
	free(e->buf);
	free(e);
	return err;
}

/*
 * Send the reply just made (if any) and wait for the next request, at most
 * timeout_ms (-1: for ever).  1: a request waits in the entry; -ETIME,
 * -EINTR; or the kernel's error (-ENOTCONN: the connection is over).
 */
int furing_ent_next(struct furing_ent *e, int timeout_ms)
{
	struct __kernel_timespec ts = {timeout_ms / 1000,
				       (long long)(timeout_ms % 1000) * 1000000};
	struct io_uring_cqe *cqe = NULL;
	bool replied;
	int res;

	if (e->request_waits) {
		e->request_waits = false;
		return 1;
	}
	replied = e->commit_due;
	if (e->commit_due) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);

		if (!sqe)
			return -EBUSY; /* one command in flight: cannot be */
		prep_cmd(e, sqe, FUSE_IO_URING_CMD_COMMIT_AND_FETCH);
		e->commit_due = false;
		/* a fill's reply: its end waits until the kernel has it */
		if (current_worker && current_worker->fill_due.cache &&
		    (!spin_ns || timeout_ms >= 0)) {
			while (io_uring_submit(&e->ring) == -EINTR)
				;
			worker_reply_out();
		}
	}
	if (spin_ns && timeout_ms < 0 && replied) {
		/*
		 * Just replied: the same caller's next request often follows
		 * within microseconds, so look for it a moment (uring_poll_us)
		 * before sleeping; the kernel interrupts the running thread to
		 * hand it over, which saves the sleep and the wakeup, the larger
		 * part of a small request's cost.
		 */
		struct timespec t0, t;

		if (io_uring_submit(&e->ring) < 0)
			goto wait;
		worker_reply_out();
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (unsigned int i = 1;; i++) {
			if (io_uring_peek_cqe(&e->ring, &cqe) == 0 && cqe)
				goto got;
			if (i % 32)
				continue; /* the clock costs more than a look */
			clock_gettime(CLOCK_MONOTONIC, &t);
			if ((t.tv_sec - t0.tv_sec) * 1000000000L +
			    (t.tv_nsec - t0.tv_nsec) >= spin_ns)
				break;
		}
	}
wait:
	res = io_uring_submit_and_wait_timeout(&e->ring, &cqe, 1,
					       timeout_ms < 0 ? NULL : &ts,
					       NULL);
	if (res < 0)
		return res;
	if (!cqe) /* submitted, then the wait was interrupted */
		return -EINTR;
got:
	res = cqe->res;
	io_uring_cqe_seen(&e->ring, cqe);
	return res < 0 ? res : 1;
}

static void furing_reply_error(struct furing_ent *e, uint64_t unique,
			       int err);

/* Serve the request in the entry; its reply goes with the next submit. */
void furing_ent_process(struct furing_ent *e)
{
	struct fuse_uring_ent_in_out *io = &e->hdr->ring_ent_in_out;
	char *payload = e->buf + REQ_FRONT;
	uint32_t len, pay = io->payload_sz;
	struct fuse_buf fb = {.mem = NULL};
	uint64_t unique;
	size_t op;

	memcpy(&len, e->hdr->in_out, 4);
	memcpy(&unique, e->hdr->in_out + 8, 8);
	e->commit_id = io->commit_id;
	e->replied = false;
	e->commit_due = true;
	atomic_fetch_add_explicit(&reg.requests, 1, memory_order_relaxed);
	op = (size_t)len - IN_HEADER - pay;
	if (len < IN_HEADER || pay > e->payload_size ||
	    (size_t)len < IN_HEADER + (size_t)pay || op > sizeof(e->hdr->op_in)) {
		furing_reply_error(e, unique, -EPROTO);
		return;
	}
	memcpy(payload - op, e->hdr->op_in, op);
	memcpy(payload - op - IN_HEADER, e->hdr->in_out, IN_HEADER);
	fb.mem = payload - op - IN_HEADER;
	fb.size = len;
	e->unique = unique;
	fuse_session_process_buf(e->se, &fb);
	e->unique = 0;
	if (!e->replied) /* every request on the ring has a reply */
		furing_reply_error(e, unique, -EIO);
}

static void put_reply(struct furing_ent *e, const struct iovec *iov,
		      int count, size_t total)
{
	char *out = e->hdr->in_out, *p = e->buf + REQ_FRONT;
	size_t skip = OUT_HEADER, done = 0;

	memcpy(out, iov[0].iov_base, OUT_HEADER);
	for (int i = 0; i < count; i++) {
		size_t k = iov[i].iov_len;
		const char *src = iov[i].iov_base;

		if (skip) { /* the out header may span pieces */
			size_t s = k < skip ? k : skip;

			src += s;
			k -= s;
			skip -= s;
		}
		memcpy(p + done, src, k);
		done += k;
	}
	e->hdr->ring_ent_in_out.payload_sz = (uint32_t)(total - OUT_HEADER);
	e->replied = true;
}

static void furing_reply_error(struct furing_ent *e, uint64_t unique, int err)
{
	char h[OUT_HEADER];
	uint32_t len = OUT_HEADER;
	struct iovec iov = {h, OUT_HEADER};

	memcpy(h, &len, 4);
	memcpy(h + 4, &err, 4);
	memcpy(h + 8, &unique, 8);
	put_reply(e, &iov, 1, OUT_HEADER);
}

/*
 * The session's writev, for a reply: the entry whose request it answers
 * takes it.  zfolio replies on the thread that serves the request, so
 * that is the calling thread's entry, if any.  Returns the bytes taken, or
 * -ENOENT for a reply (or a notification) that goes to /dev/fuse.
 */
ssize_t furing_reply(const struct iovec *iov, int count)
{
	struct furing_ent *e = cur_ent;
	uint64_t unique;
	size_t total = 0;

	if (!e || !e->unique || count < 1 || iov[0].iov_len < OUT_HEADER)
		return -ENOENT;
	memcpy(&unique, (char *)iov[0].iov_base + 8, 8);
	if (unique != e->unique)
		return -ENOENT; /* a notification, or not this request's */
	for (int i = 0; i < count; i++)
		total += iov[i].iov_len;
	if (total - OUT_HEADER > e->payload_size)
		furing_reply_error(e, unique, -EIO);
	else
		put_reply(e, iov, count, total);
	return (ssize_t)total;
}

/* The reply just made goes out; the ring then cancels the entry. */
void furing_ent_free(struct furing_ent *e)
{
	if (!e)
		return;
	if (e->commit_due) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);

		if (sqe) {
			prep_cmd(e, sqe, FUSE_IO_URING_CMD_COMMIT_AND_FETCH);
			while (io_uring_submit(&e->ring) == -EINTR)
				;
		}
	}
	worker_reply_out();
	if (cur_ent == e)
		cur_ent = NULL;
	tsan_release(&ring_token);
	io_uring_queue_exit(&e->ring);
	/*
	 * The kernel tears its side of the entry down after the ring is gone
	 * (and may copy a request it had already handed to the entry into
	 * these buffers as it does), so they are never freed: the entry is
	 * kept on a list, reachable, until the daemon exits.
	 */
	pthread_mutex_lock(&reg.lock);
	e->retired = reg.retired;
	reg.retired = e;
	pthread_mutex_unlock(&reg.lock);
}
