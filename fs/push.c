// SPDX-License-Identifier: MIT
/*
 * Pushing a scan's next files into the kernel page cache.
 *
 * A tree of small files read whole, one after another (tar, cp -r, grep
 * -r, a build reading its sources), costs one FUSE_READ per file even when
 * kernel_opens leaves the opens to the kernel.  mkzfolio packs small files
 * in manifest order, each whole in one frame, so the read that decoded a
 * frame has the next files' bytes at hand.  When reads come in that
 * order, the files after the one read are handed to the kernel with
 * FUSE_NOTIFY_STORE, and the scan's reads of them are page-cache hits: the
 * rest of the frame just read, then the pack's next frame, decoded for
 * it.  It is readahead across files, as page_cache_async_ra() reads ahead
 * within one: the scan's next read that reaches the daemon is the first
 * file after what was pushed, and it pushes the next two frames' worth.
 *
 * When: a read from the start of a packed file whose inode is at most
 * PUSH_GAP entries past the last one read or pushed (a directory's files
 * and then its subdirectories' come in the manifest's order, with jumps
 * only over entries that hold no data), and not among the files a push is
 * already under way for.  Only on mounts where the kernel opens files
 * (ro, packed, cache=kernel): there the kernel keeps a file's pages from
 * one open to the next.
 *
 * The kernel takes a store only for an inode it has: a file of a directory
 * not listed yet is refused (ENOENT), and the push stops there; the
 * scan's read of it, once it gets there, goes on from it.
 *
 * The stores run on a thread of their own, never on a worker: a store
 * locks the file's pages, and a page the kernel locked for a fill stays
 * locked until a worker answers that fill (the kernel tier's deadlock rule
 * 2, ktier.c).  A worker only queues, at most PUSH_QUEUE_JOBS reads.  A
 * file the tier already tracks (filled, or being filled) is not pushed:
 * its reader got there first.  Pushed pages are charged to the kernel tier
 * like a fill's, to the group of the read that found the scan, once the
 * kernel has them, and are evicted like them.  The folios they came from
 * stay in zfolio's cache, not marked handed over (a push may be passed
 * over), and age out as any other.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Entries a scan may skip between two files read (directories, links,
 * files it does not read). */
#define PUSH_GAP 256
/* Frames of a pack pushed past the one read (measured on the Linux
 * source tree, 128K frames: 0, 1, 2 and 4 left 50k, 44k, 45-49k and 56k
 * of 78.5k files to reads), and files at most (two 128 KiB frames of
 * files of 1 KiB) */
#define PUSH_FRAMES 1
#define PUSH_MAX_FILES 256
/* Scans followed at once (directory depth a walk comes back through). */
#define PUSH_CURSORS 8
/* Reads queued for the thread, at most; a worker drops one beyond. */
#define PUSH_QUEUE_JOBS 16

/* A scan's read: the file after which to push, and what was read of it. */
struct push_job {
	struct push_job *next;
	struct group *group;
	fuse_ino_t ino;
	unsigned int cursor; /* the scan's */
	struct zfile *file; /* a reference */
	uint64_t base, size;
};

struct pusher {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct push_job *head, **tail;
	unsigned int queued; /* jobs */
	bool stop;
	pthread_t thread;
	struct dataset *ds;
	/*
	 * Relaxed, all: a stale value costs a push done twice (the tier
	 * check passes over its files) or one not done.  cursor[]: where
	 * scans go on, the inode after the last one read or pushed, one per
	 * scan (a walk that goes down into a directory and back out is two:
	 * the manifest holds a directory's files before its
	 * subdirectories'), the oldest replaced by a read that is no scan's;
	 * [planned_lo, planned_hi): the inodes a queued or running push
	 * covers (a guess of PUSH_GAP until the thread knows).
	 */
	atomic_ulong cursor[PUSH_CURSORS];
	atomic_uint victim;
	atomic_ulong planned_lo, planned_hi;
	struct mf_neighbour files[PUSH_MAX_FILES]; /* the thread's */
};

static void job_free(struct push_job *j)
{
	zfile_put(j->file);
	free(j);
}

/* Store one file's bytes in the kernel's page cache, charged to the tier
 * once there; the store's result. */
static int push_one(struct pusher *p, struct group *g,
		    const struct mf_neighbour *f, const uint8_t *bytes)
{
	struct cache *c = &p->ds->cache;
	struct fuse_bufvec bv = FUSE_BUFVEC_INIT(f->size);
	int r;

	if (ktier_tracks(c, f->ino))
		return 0; /* filled or being filled: its reader came first */
	bv.buf[0].mem = (void *)bytes;
	/* offline while the store may wait on a page a fill has locked */
	cache_thread_offline();
	r = fuse_lowlevel_notify_store(p->ds->se, f->ino, 0, &bv, 0);
	cache_thread_online();
	if (r)
		return r;
	/* uncharged for that long: an eviction meanwhile finds nothing to
	 * drop, and the pages are within the slack of one window */
	ktier_fill_begin(c, g, f->ino, f->size, 0, f->size);
	ktier_fill_end(c, f->ino, 0, f->size);
	stat_mod(g, STAT_KERNEL_PUSHES, (long)pages_of_bytes(f->size));
	return 0;
}

struct copy_call {
	uint8_t *buf;
	size_t len;
};

static int copy_reply(void *arg, const struct iovec *iov, int cnt)
{
	struct copy_call *c = arg;
	size_t done = 0;

	if (!iov)
		return 0; /* an error: no copy */
	for (int k = 0; k < cnt; k++)
		done += iov[k].iov_len;
	if (done != c->len || !(c->buf = malloc(done)))
		return 0;
	done = 0;
	for (int k = 0; k < cnt; k++) {
		memcpy(c->buf + done, iov[k].iov_base, iov[k].iov_len);
		done += iov[k].iov_len;
	}
	return 0;
}

/* The bytes [lo, hi) of data file m for group g, through the cache (a
 * frame not there is decoded here, with plain reads): a copy, or NULL. */
static uint8_t *copy_out(struct group *g, struct mapping *m, uint64_t lo,
			 uint64_t hi)
{
	struct copy_call c = {NULL, hi - lo};
	struct ra_request *r = malloc(sizeof(*r));

	if (!r)
		return NULL;
	ra_request_init(r, m, NULL, g, NULL, lo, hi - lo, false);
	r->rq.internal = true; /* not a reader's request */
	cache_read(&r->rq, copy_reply, &c);
	free(r);
	return c.buf;
}

/* Push files f[0, n), of one frame of m; false once the kernel refused
 * one (a directory it has not listed yet). */
static bool push_run(struct pusher *p, const struct push_job *j,
		     const struct mf_neighbour *f, unsigned int n)
{
	struct mapping *m = j->file->mapping;
	struct group *g = j->group;
	uint64_t lo = f[0].data_off, hi = f[n - 1].data_off + f[n - 1].size;
	uint8_t *bytes = copy_out(g, m, lo, hi);
	bool on = bytes != NULL;

	for (unsigned int k = 0; on && k < n; k++) {
		if (push_one(p, g, &f[k], bytes + (f[k].data_off - lo))) {
			atomic_store_explicit(&p->cursor[j->cursor], f[k].ino,
					      memory_order_relaxed);
			on = false;
		}
	}
	free(bytes);
	return on;
}

/*
 * The files after job j's in its frame, then those of the pack's next
 * PUSH_FRAMES frames, frame by frame, into the page cache.  The scan's
 * reads of files in the last of them, if it gets there first, start the
 * next push (the async marker of page_cache_async_ra()).
 */
static void push_ahead(struct pusher *p, const struct push_job *j)
{
	struct mapping *m = j->file->mapping;
	unsigned long i = mapping_index(m, j->base), last = i + PUSH_FRAMES;
	struct mf_neighbour *f = p->files;
	unsigned int n, k = 0, run;

	if (last >= m->nr_folios)
		last = m->nr_folios - 1;
	n = atomic_load(&j->file->table_lies)
		    ? 0
		    : manifest_neighbours(p->ds, j->ino, j->base + j->size,
					  mapping_folio_pos(m, last) +
						  mapping_folio_len(m, last),
					  f, PUSH_MAX_FILES);
	if (!n) {
		atomic_store_explicit(&p->planned_hi, 0, memory_order_relaxed);
		return;
	}
	last = mapping_index(m, f[n - 1].data_off);
	for (run = n; run && mapping_index(m, f[run - 1].data_off) == last;)
		run--;
	/* planned: up to the last frame's files, if there are others */
	atomic_store_explicit(&p->planned_hi, f[run ? run : n - 1].ino,
			      memory_order_relaxed);
	atomic_store_explicit(&p->cursor[j->cursor], f[n - 1].ino + 1,
			      memory_order_relaxed);
	for (; k < n; k += run) {
		i = mapping_index(m, f[k].data_off);
		for (run = 1; k + run < n &&
			      mapping_index(m, f[k + run].data_off) == i;)
			run++;
		if (!push_run(p, j, f + k, run))
			return;
	}
}

static void *push_thread(void *arg)
{
	struct pusher *p = arg;
	struct push_job *j;

	cache_thread_register();
	cache_thread_offline();
	pthread_mutex_lock(&p->lock);
	for (;;) {
		while (!p->head && !p->stop)
			pthread_cond_wait(&p->cond, &p->lock);
		j = p->head;
		if (!j)
			break;
		p->head = j->next;
		if (!p->head)
			p->tail = &p->head;
		p->queued--;
		pthread_mutex_unlock(&p->lock);
		/* online as a worker is: it reads the cache, charges and may
		 * reclaim (which frees folios through call_rcu()) */
		cache_thread_online();
		push_ahead(p, j);
		job_free(j);
		cache_thread_offline();
		pthread_mutex_lock(&p->lock);
	}
	pthread_mutex_unlock(&p->lock);
	cache_thread_online();
	cache_thread_unregister();
	return NULL;
}

int push_start(struct dataset *ds)
{
	struct pusher *p = calloc(1, sizeof(*p));
	int err;

	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	p->tail = &p->head;
	p->ds = ds;
	err = pthread_create(&p->thread, NULL, push_thread, p);
	if (err) {
		pthread_mutex_destroy(&p->lock);
		pthread_cond_destroy(&p->cond);
		free(p);
		return -err;
	}
	ds->push = p;
	return 0;
}

/* After the workers: the thread ends its queue (a store to a mount gone
 * fails at once) and stops. */
void push_stop(struct dataset *ds)
{
	struct pusher *p = ds->push;

	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_signal(&p->cond);
	pthread_mutex_unlock(&p->lock);
	pthread_join(p->thread, NULL);
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->cond);
	ds->push = NULL;
	free(p);
}

/* Is a read of ino from its start a scan's next step (of scan *c) that
 * no push covers? */
static bool scan_step(struct pusher *p, fuse_ino_t ino, uint64_t off,
		      unsigned int *c)
{
	unsigned long want, lo, hi;
	bool scan;

	if (off)
		return false;
	for (*c = 0; *c < PUSH_CURSORS; (*c)++) {
		want = atomic_load_explicit(&p->cursor[*c],
					    memory_order_relaxed);
		if (want && ino >= want && ino - want < PUSH_GAP)
			break;
	}
	scan = *c < PUSH_CURSORS;
	if (!scan) /* a new scan, maybe */
		*c = atomic_fetch_add_explicit(&p->victim, 1,
					       memory_order_relaxed) %
		     PUSH_CURSORS;
	atomic_store_explicit(&p->cursor[*c], ino + 1, memory_order_relaxed);
	lo = atomic_load_explicit(&p->planned_lo, memory_order_relaxed);
	hi = atomic_load_explicit(&p->planned_hi, memory_order_relaxed);
	if (!scan || (ino >= lo && ino < hi))
		return false;
	atomic_store_explicit(&p->planned_lo, ino + 1, memory_order_relaxed);
	atomic_store_explicit(&p->planned_hi, ino + 1 + PUSH_GAP,
			      memory_order_relaxed);
	return true;
}

static void queue_job(struct pusher *p, struct push_job *j)
{
	pthread_mutex_lock(&p->lock);
	if (p->stop || p->queued >= PUSH_QUEUE_JOBS) {
		pthread_mutex_unlock(&p->lock);
		job_free(j);
		return;
	}
	p->queued++;
	*p->tail = j;
	p->tail = &j->next;
	pthread_cond_signal(&p->cond);
	pthread_mutex_unlock(&p->lock);
}

/*
 * A read of [off, ...) of ino, the file [base, base + size) of data file
 * f, by (uid, pid), is about to be served: if it is a scan's, the push of
 * the files after it is queued for the thread, which works beside the
 * reply (the frame it copies from is the one the read fills; it waits for
 * it, or fills it first and the read waits).  The worker only queues.
 */
void push_on_read(struct dataset *ds, unsigned int uid, int pid,
		  fuse_ino_t ino, struct zfile *f, uint64_t base,
		  uint64_t size, uint64_t off)
{
	struct pusher *p = ds->push;
	struct push_job *j;
	struct group *g;
	unsigned int c;

	if (!p || !f || !size || off >= size || !scan_step(p, ino, off, &c) ||
	    !(j = calloc(1, sizeof(*j))))
		return;
	g = group_for_request(&ds->cache.budget, uid, pid);
	mapping_get(f->mapping); /* a zfile's reference (zfile_put) */
	*j = (struct push_job){.group = g, .ino = ino, .cursor = c, .file = f,
			       .base = base, .size = size};
	queue_job(p, j);
}
