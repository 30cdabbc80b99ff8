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
 * file after what was pushed (or one the pusher has not stored yet), and
 * it starts the next push.
 *
 * When: a read from the start of a packed small file whose inode is at
 * most PUSH_GAP entries past where a scan stands (the last one read or
 * pushed: a directory's files and then its subdirectories' come in the
 * manifest's order, with jumps only over entries that hold no data), and
 * not among the files that scan's push is already under way for.  Only on
 * mounts where the kernel opens files (ro, packed, cache=kernel, not in a
 * store): there the kernel keeps a file's pages from one open to the next.
 *
 * The kernel takes a store only for an inode it has: a file of a directory
 * not listed yet is refused (ENOENT), the push stops there, and the scan's
 * read of that file, once it gets there, starts the next.
 *
 * The rules, beside the kernel tier's (ktier.c):
 *  1. A store locks the file's pages, and a page the kernel locked for a
 *     fill stays locked until a worker answers that fill.  So stores run on
 *     a thread of their own, never on a worker (which queues, at most
 *     PUSH_QUEUE_JOBS reads, and may wait a bounded time: rule 4), and the
 *     thread is stopped while the workers
 *     still answer fills (mount.c, loop_wait()).  A file the tier tracks
 *     (filled, or being filled: its fill reached a worker) is not pushed.
 *     Left: a fill the kernel has queued and no worker has read yet.  If
 *     the daemon is SIGKILLed while a store waits on such a fill, the
 *     thread keeps /dev/fuse open, and the watchdog aborts the connection
 *     (watchdog.c; as for an eviction, ktier.c rule 1).
 *  2. A push is charged to the tier before its store, as a fill is, and
 *     ends after it; a store refused with ENOENT uncharges the inode (the
 *     kernel has none).  A seek table caught lying is checked for before
 *     each store and after it (what was stored is dropped again).
 *  3. Copying the bytes out is no access: the folios keep their place on
 *     the LRU (a scan's frames are not made active by it), and they are
 *     not marked handed over either, so they age out of zfolio's cache as
 *     any other (handing over the frames a push stored whole cost more in
 *     decoding again than it saved: doc/BENCHMARKS.md).  The copies go
 *     through the pack's readahead, as the scan's reads would: a copy that
 *     opens a window (a miss, or a readahead marker) reads and decodes it
 *     before it returns, with the fill threads' help where they are idle,
 *     so a disk's reads of a pack come in windows; the copies also move
 *     the pack's read position ahead of the scan's.
 *  4. The read that starts a push, when the next file is in its frame and
 *     the thread is idle (so that the push starts at once: behind another
 *     one the wait would mostly run out), waits for the push's first store
 *     before it is served, so the scan
 *     goes on behind the pusher instead of racing it for the files just
 *     after (each one it reaches first is a read of its own).  The wait is
 *     offline and bounded (PUSH_WAIT_US), since the thread may itself wait
 *     on a fill only a worker answers (rule 1); it ends at once on stop.
 *     The thread copies the frame from the read's own file on, decoding it
 *     if need be, so the read finds it in the cache.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Frames of a pack pushed past the one read: more is further ahead of the
 * scan, but one thread decodes them in turn, and the scan overtakes it
 * (doc/BENCHMARKS.md, "A scan's next files pushed") */
#define PUSH_FRAMES 1
/* Files pushed after one read, at most: two 128 KiB frames of 1 KiB
 * files. */
#define PUSH_MAX_FILES 256
/* Reads queued for the thread, at most; a worker drops one beyond. */
#define PUSH_QUEUE_JOBS 16
/* How long a read that starts a push waits for it to start, at most
 * (rule 4): a cold frame's decode, and more if its backing is slow. */
#define PUSH_WAIT_US 2000
/* The copy buffer is kept for the next push up to this size. */
#define PUSH_BUF_KEEP (1u << 20)

/* A scan's read: the file after which to push.  group and pack_ra (the
 * pack's readahead) stay valid: groups are freed with the budget, pack_ra
 * with the manifest, both after push_free(). */
struct push_job {
	struct push_job *next;
	struct group *group;
	fuse_ino_t ino;
	struct scan *scan;
	struct zfile *file; /* a reference */
	struct file_ra_state *pack_ra;
	uint64_t base, size;
	atomic_int refs;     /* the queue's or the thread's, a waiting read's */
	atomic_bool started; /* its first file is stored or passed over, or
			      * it ended: its read may be answered */
};

struct pusher {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct push_job *head, **tail;
	unsigned int queued; /* jobs */
	bool busy;           /* the thread is on a job */
	atomic_bool stop;
	pthread_cond_t started; /* a job started (on CLOCK_MONOTONIC) */
	bool can_wait;          /* ... if that clock could be set */
	pthread_t thread;
	struct dataset *ds;
	struct push_scans scans;
	/* the thread's: the files of a push, the cache request copying them
	 * out, and the copy */
	struct mf_neighbour files[PUSH_MAX_FILES];
	struct ra_request rq;
	uint8_t *buf;
	size_t cap;
};

static void job_put(struct push_job *j)
{
	if (atomic_fetch_sub(&j->refs, 1) != 1)
		return;
	zfile_put(j->file);
	free(j);
}

/* Job j's read may be answered now (rule 4). */
static void job_started(struct pusher *p, struct push_job *j)
{
	if (atomic_exchange(&j->started, true))
		return;
	pthread_mutex_lock(&p->lock);
	pthread_cond_broadcast(&p->started);
	pthread_mutex_unlock(&p->lock);
}

static void scan_set(atomic_ulong *v, unsigned long x)
{
	atomic_store_explicit(v, x, memory_order_relaxed);
}

static unsigned long scan_get(atomic_ulong *v)
{
	return atomic_load_explicit(v, memory_order_relaxed);
}

/* Store one file's bytes in the kernel's page cache (rules 1 and 2): 0, or
 * the store's error, or -EIO for a lying seek table. */
static int push_one(struct pusher *p, const struct push_job *j,
		    const struct mf_neighbour *f, uint8_t *bytes)
{
	struct cache *c = &p->ds->cache;
	struct fuse_bufvec bv = FUSE_BUFVEC_INIT(f->size);
	int r;

	if (ktier_tracks(c, f->ino))
		return 0; /* filled or being filled: its reader came first */
	if (atomic_load(&j->file->table_lies))
		return -EIO;
	bv.buf[0].mem = bytes;
	ktier_fill_begin(c, j->group, f->ino, f->size, 0, f->size);
	/* offline while the store may wait on a page a fill has locked */
	cache_thread_offline();
	r = fuse_lowlevel_notify_store(p->ds->se, f->ino, 0, &bv, 0);
	cache_thread_online();
	ktier_fill_end(c, f->ino, 0, f->size);
	if (r == -ENOENT)
		ktier_forget(c, f->ino); /* the kernel has no such inode */
	if (atomic_load(&j->file->table_lies)) {
		ktier_evict_all(c); /* caught meanwhile: this one too */
		return -EIO;
	}
	if (!r) /* what the budget took of it */
		stat_mod(j->group, STAT_KERNEL_PUSHES,
			 (long)ktier_tracks(c, f->ino));
	return r;
}

struct copy_call {
	struct pusher *p;
	size_t len;
	bool done;
};

static int copy_reply(void *arg, const struct iovec *iov, int cnt)
{
	struct copy_call *c = arg;
	struct pusher *p = c->p;
	size_t done = 0;

	if (!iov)
		return 0; /* an error: no copy */
	for (int k = 0; k < cnt; k++)
		done += iov[k].iov_len;
	if (done != c->len)
		return 0;
	if (done > p->cap) {
		uint8_t *b = realloc(p->buf, done);

		if (!b)
			return 0;
		p->buf = b;
		p->cap = done;
	}
	done = 0;
	for (int k = 0; k < cnt; k++) {
		memcpy(p->buf + done, iov[k].iov_base, iov[k].iov_len);
		done += iov[k].iov_len;
	}
	c->done = true;
	return 0;
}

/* The bytes [lo, hi) of data file m for group g, through the cache and
 * the pack's readahead ra (a frame not there is decoded here, with plain
 * reads; rule 3), copied to p->buf: false if they could not be. */
static bool copy_out(struct pusher *p, struct group *g, struct mapping *m,
		     struct file_ra_state *ra, uint64_t lo, uint64_t hi)
{
	struct copy_call c = {p, hi - lo, false};

	ra_request_init(&p->rq, m, ra, g, NULL, lo, hi - lo, false);
	p->rq.rq.internal = true; /* not a reader's request */
	p->rq.rq.no_touch = true;
	cache_read(&p->rq.rq, copy_reply, &c);
	return c.done;
}

/* Push files f[0, n), of one frame; false once one was not stored (the
 * kernel refused it: a directory it has not listed yet), or on stop.  The
 * copy of the frame of job j's own file starts with that file, the bytes
 * its read takes, so that the pack's readahead sees the scan's order. */
static bool push_run(struct pusher *p, struct push_job *j,
		     const struct mf_neighbour *f, unsigned int n)
{
	struct mapping *m = j->file->mapping;
	unsigned long i = mapping_index(m, f[0].data_off);
	uint64_t lo = f[0].data_off, hi = f[n - 1].data_off + f[n - 1].size;
	bool on;

	if (mapping_index(m, j->base) == i && j->base < lo)
		lo = j->base;
	on = copy_out(p, j->group, m, j->pack_ra, lo, hi);
	for (unsigned int k = 0; on && k < n; k++) {
		if (atomic_load(&p->stop) ||
		    push_one(p, j, &f[k], p->buf + (f[k].data_off - lo))) {
			/* the scan's read of it goes on from there */
			scan_set(&j->scan->at, f[k].ino);
			scan_set(&j->scan->planned_hi, f[k].ino);
			on = false;
		}
		job_started(p, j);
	}
	if (p->cap > PUSH_BUF_KEEP) { /* a frame bigger than most */
		free(p->buf);
		p->buf = NULL;
		p->cap = 0;
	}
	return on;
}

/*
 * The files after job j's in its frame, then those of the pack's next
 * PUSH_FRAMES frames, frame by frame, into the page cache.  The scan's
 * reads of files in the last of them, if it gets there first, start the
 * next push (the async marker of page_cache_async_ra()).
 */
static void push_ahead(struct pusher *p, struct push_job *j)
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
		scan_set(&j->scan->planned_hi, 0);
		return;
	}
	last = mapping_index(m, f[n - 1].data_off);
	for (run = n; run && mapping_index(m, f[run - 1].data_off) == last;)
		run--;
	/* planned: up to the last frame's files, if there are others */
	scan_set(&j->scan->planned_hi, f[run ? run : n - 1].ino);
	scan_set(&j->scan->at, f[n - 1].ino + 1);
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
		while (!p->head && !atomic_load(&p->stop))
			pthread_cond_wait(&p->cond, &p->lock);
		j = p->head;
		if (!j || atomic_load(&p->stop))
			break;
		p->head = j->next;
		if (!p->head)
			p->tail = &p->head;
		p->queued--;
		p->busy = true;
		pthread_mutex_unlock(&p->lock);
		/* online as a worker is: it reads the cache, charges and may
		 * reclaim (which frees folios through call_rcu()) */
		cache_thread_online();
		push_ahead(p, j);
		job_started(p, j);
		job_put(j);
		cache_thread_offline();
		pthread_mutex_lock(&p->lock);
		p->busy = false;
	}
	pthread_mutex_unlock(&p->lock);
	cache_thread_online();
	cache_thread_unregister();
	return NULL;
}

static void pusher_free(struct pusher *p)
{
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->cond);
	pthread_cond_destroy(&p->started);
	free(p->buf);
	free(p);
}

int push_start(struct dataset *ds)
{
	struct pusher *p = calloc(1, sizeof(*p));
	pthread_condattr_t a;
	int err;

	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	pthread_condattr_init(&a);
	/* without it, deadlines would be read on the realtime clock, and
	 * every wait would end at once: no harm, and no use */
	p->can_wait = !pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&p->started, &a);
	pthread_condattr_destroy(&a);
	p->tail = &p->head;
	p->ds = ds;
	err = pthread_create(&p->thread, NULL, push_thread, p);
	if (err) {
		pusher_free(p);
		return -err;
	}
	ds->push = p;
	return 0;
}

/* Before the workers stop (rule 1): the store under way ends (a worker
 * answers the fill it may wait on), what is queued is dropped, and reads
 * waiting for a job go on.  Workers still serving may call push_on_read()
 * until they are joined: it queues nothing now, and the pusher stays
 * allocated until push_free(). */
void push_stop(struct dataset *ds)
{
	struct pusher *p = ds->push;
	struct push_job *j, *next;

	if (!p || atomic_load(&p->stop))
		return;
	pthread_mutex_lock(&p->lock);
	atomic_store(&p->stop, true);
	pthread_cond_signal(&p->cond);
	pthread_cond_broadcast(&p->started);
	pthread_mutex_unlock(&p->lock);
	pthread_join(p->thread, NULL);
	pthread_mutex_lock(&p->lock);
	next = p->head;
	p->head = NULL;
	p->tail = &p->head;
	p->queued = 0;
	pthread_mutex_unlock(&p->lock);
	while ((j = next)) {
		next = j->next;
		atomic_store(&j->started, true);
		job_put(j);
	}
}

/* After the workers are joined. */
void push_free(struct dataset *ds)
{
	if (!ds->push)
		return;
	push_stop(ds);
	pusher_free(ds->push);
	ds->push = NULL;
}

/* Is a read of ino from its start a scan's next step that its push does
 * not cover?  *s: the scan, whose place it takes either way. */
bool push_scan_step(struct push_scans *sc, fuse_ino_t ino, struct scan **s)
{
	unsigned long at = 0;
	unsigned int c;

	for (c = 0; c < PUSH_CURSORS; c++) {
		at = scan_get(&sc->s[c].at);
		if (at && ino >= at && ino - at < PUSH_GAP)
			break;
	}
	if (c == PUSH_CURSORS) { /* no scan's: a new one, maybe */
		c = atomic_fetch_add_explicit(&sc->victim, 1,
					      memory_order_relaxed) %
		    PUSH_CURSORS;
		*s = &sc->s[c];
		scan_set(&(*s)->at, ino + 1);
		scan_set(&(*s)->planned_hi, 0);
		return false;
	}
	*s = &sc->s[c];
	scan_set(&(*s)->at, ino + 1);
	if (ino >= scan_get(&(*s)->planned_lo) &&
	    ino < scan_get(&(*s)->planned_hi))
		return false;
	scan_set(&(*s)->planned_lo, ino + 1);
	scan_set(&(*s)->planned_hi, ino + 1 + PUSH_GAP);
	return true;
}

/* Queue job j.  *wait in: the caller would wait for j to start (j holds
 * its reference too); out: it may (the thread is idle, so j starts at
 * once), else that reference is given back.  False if the queue refused
 * j (stopped, or full) and freed it. */
static bool queue_job(struct pusher *p, struct push_job *j, bool *wait)
{
	pthread_mutex_lock(&p->lock);
	if (atomic_load(&p->stop) || p->queued >= PUSH_QUEUE_JOBS) {
		pthread_mutex_unlock(&p->lock);
		scan_set(&j->scan->planned_hi, 0); /* nothing covers it */
		job_put(j);
		if (*wait)
			job_put(j);
		return false;
	}
	if (*wait && (p->busy || p->queued)) {
		*wait = false;
		atomic_fetch_sub(&j->refs, 1);
	}
	p->queued++;
	*p->tail = j;
	p->tail = &j->next;
	pthread_cond_signal(&p->cond);
	pthread_mutex_unlock(&p->lock);
	return true;
}

/* Rule 4: until job j has started, or PUSH_WAIT_US, offline. */
static void wait_started(struct pusher *p, struct push_job *j)
{
	struct timespec until = deadline_after_us(CLOCK_MONOTONIC, PUSH_WAIT_US);

	cache_thread_offline();
	pthread_mutex_lock(&p->lock);
	while (!atomic_load(&j->started) && !atomic_load(&p->stop))
		if (pthread_cond_timedwait(&p->started, &p->lock, &until))
			break; /* ETIMEDOUT */
	pthread_mutex_unlock(&p->lock);
	cache_thread_online();
	job_put(j);
}

/* Does the frame of [base, base + size) of m go on past it, with the next
 * file packed there? */
static bool frame_goes_on(const struct mapping *m, uint64_t base,
			  uint64_t size)
{
	unsigned long i = mapping_index(m, base);

	return mapping_index(m, base + size - 1) == i &&
	       base + size < mapping_folio_pos(m, i) + mapping_folio_len(m, i);
}

/*
 * A read of [off, ...) of ino, the file [base, base + size) of data file
 * f (packed with others in the pack whose readahead is pack_ra, or not),
 * by (uid, pid), is about to be served: if it is a scan's, the push of
 * the files after it is queued for the thread.  The worker only queues,
 * and when the next file is in the same frame and the thread is idle,
 * waits for the push to start (rule 4): the thread copies from the frame
 * this read takes, decoding it first if need be, and the read finds it
 * there.
 */
void push_on_read(struct dataset *ds, unsigned int uid, int pid,
		  fuse_ino_t ino, struct zfile *f,
		  struct file_ra_state *pack_ra, uint64_t base, uint64_t size,
		  uint64_t off)
{
	struct pusher *p = ds->push;
	struct push_job *j;
	struct scan *s;
	bool wait;

	if (!p || !f || !pack_ra || off || !size || !push_scan_step(&p->scans, ino, &s))
		return;
	j = malloc(sizeof(*j));
	if (!j) {
		scan_set(&s->planned_hi, 0);
		return;
	}
	mapping_get(f->mapping); /* a zfile's reference (zfile_put) */
	wait = p->can_wait && frame_goes_on(f->mapping, base, size);
	*j = (struct push_job){
		.group = group_for_request(&ds->cache.budget, uid, pid),
		.ino = ino,
		.scan = s,
		.file = f,
		.pack_ra = pack_ra,
		.base = base,
		.size = size,
		.refs = wait ? 2 : 1};
	if (queue_job(p, j, &wait) && wait)
		wait_started(p, j);
}
