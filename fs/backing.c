// SPDX-License-Identifier: MIT
/*
 * Backing reads and decoding: the mapping operations of a dataset file.
 *
 * Folio geometry.  A folio is one frame's content.  A raw (not zstd) file
 * is cut into ZSEEK_DEFAULT_FRAME folios.  A frame bigger than
 * ZSEEK_SPLIT_ABOVE (a foreign file written as one big frame) is served in
 * ZSEEK_SUBFOLIO folios, streamed from the frame's start: slowly for random
 * access, at full speed for a sequential reader, whose stream continues.
 *
 * submit() reads the compressed bytes of a batch's frames: adjacent frames
 * make one read, and all the reads of a window go out as one io_uring
 * submission on the worker's ring.  fill() waits for the read that holds
 * its frame (reaping whatever completions come first), decodes the folio
 * and verifies its checksum.  A frame that fails to decode or verify is
 * -EBADMSG, and EIO for the reader of that range only.  Without a ring
 * (a thread that is not a worker), the reads are plain preads.
 *
 * Backing reads are uncached (RWF_DONTCACHE) unless backing_cache=keep:
 * the compressed bytes are decoded once into a folio and not needed again,
 * and kept in the kernel's page cache they would be memory outside the
 * budget (and, in a memory cgroup, charged to the daemon).  A filesystem
 * or kernel without the flag gets plain reads, from the first refusal on.
 * With backing_cache=direct (the default) the reads of a batch go through
 * the file's O_DIRECT fd instead, widened to DIO_ALIGN at both ends into
 * an aligned buffer: the device writes the bytes straight into it, where
 * an uncached read puts them in page-cache pages first, copies them and
 * drops the pages (about 70 us of CPU against 45 for 40 KiB, on ext4 on a
 * loop device).  A refusal (EINVAL) turns it off for the file, and that
 * read is done again the uncached way; short reads are finished so too.
 * A plain (raw) file's folios are read straight into their buffers so,
 * but for a file's last folio when it is not a multiple of DIO_ALIGN long.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "internal.h"

#ifndef RWF_DONTCACHE
#define RWF_DONTCACHE 0x00000080 /* Linux 6.14: read, then drop the pages */
#endif

__thread struct worker *current_worker;

/* Reads in flight per worker: windows of up to 32 frames, a few pending;
 * deeper rings cost locked memory per worker */
#define RING_DEPTH 256

struct worker *worker_create(int id, bool ring)
{
	struct worker *w = calloc(1, sizeof(*w));

	if (!w)
		return NULL;
	w->id = id;
	w->dctx = ZSTD_createDCtx();
	if (!w->dctx) {
		free(w);
		return NULL;
	}
	/* no ring (backing_io=pread, old kernel, seccomp): pread instead */
	if (ring)
		ring_init(&w->ring, RING_DEPTH);
	return w;
}

void worker_reply_out(void)
{
	struct worker *w = current_worker;
	struct tier_fill *t = w ? &w->fill_due : NULL;

	if (!t || !t->cache)
		return;
	ktier_fill_end(t->cache, t->id, t->pos, t->len);
	t->cache = NULL;
}

void worker_destroy(struct worker *w)
{
	if (!w)
		return;
	ring_exit(&w->ring);
	ZSTD_freeDCtx(w->dctx);
	free(w);
}

static bool frame_split(const struct zseek_frame *fr)
{
	return fr->d_size > ZSEEK_SPLIT_ABOVE;
}

int zfile_build_geometry(struct zfile *f)
{
	const struct zseek_index *idx = &f->idx;
	/* a raw file has no frames */
	uint64_t first = idx->nframes ? zseek_frame_at(idx, 0).d_size : 0;
	unsigned long n = 0, k = 0;
	bool split = false, fixed = true;

	if (idx->kind == ZSEEK_RAW) {
		f->folio_size = ZSEEK_DEFAULT_FRAME;
		f->nslots = (unsigned long)((idx->content_size +
					     ZSEEK_DEFAULT_FRAME - 1) /
					    ZSEEK_DEFAULT_FRAME);
		f->parts = calloc(f->nslots ? f->nslots : 1, sizeof(*f->parts));
		return f->parts ? 0 : -ENOMEM;
	}
	for (uint32_t i = 0; i < idx->nframes; i++) {
		struct zseek_frame fr = zseek_frame_at(idx, i);

		if (frame_split(&fr)) {
			split = true;
			n += (unsigned long)((fr.d_size + ZSEEK_SUBFOLIO - 1) /
					     ZSEEK_SUBFOLIO);
		} else {
			n++;
		}
		if (i + 1 < idx->nframes && fr.d_size != first)
			fixed = false;
	}
	f->nslots = n;
	f->parts = calloc(n ? n : 1, sizeof(*f->parts));
	f->raw_at = calloc(n ? n : 1, sizeof(*f->raw_at));
	if (!f->parts || !f->raw_at)
		return -ENOMEM;
	/* frames of one size: a folio's place is its index times that */
	if (!split && fixed && idx->nframes) {
		f->folio_size = (uint32_t)first;
		return 0;
	}
	f->starts = calloc(n + 1, sizeof(*f->starts));
	if (split) {
		f->slot_frame = calloc(n ? n : 1, sizeof(*f->slot_frame));
		f->slot_skip = calloc(n ? n : 1, sizeof(*f->slot_skip));
	}
	if (!f->starts || (split && (!f->slot_frame || !f->slot_skip)))
		return -ENOMEM;
	for (uint32_t i = 0; i < idx->nframes; i++) {
		struct zseek_frame fr = zseek_frame_at(idx, i);
		uint64_t step = frame_split(&fr) ? ZSEEK_SUBFOLIO : fr.d_size;

		for (uint64_t off = 0; off < fr.d_size; off += step, k++) {
			f->starts[k] = fr.d_off + off;
			if (split) {
				f->slot_frame[k] = i;
				f->slot_skip[k] = off;
			}
		}
	}
	f->starts[n] = idx->content_size;
	return 0;
}

static uint32_t slot_frame(const struct zfile *f, unsigned long i)
{
	return f->slot_frame ? f->slot_frame[i] : (uint32_t)i;
}

static bool slot_split(const struct zfile *f, unsigned long i)
{
	struct zseek_frame fr;

	if (!f->slot_frame)
		return false;
	fr = zseek_frame_at(&f->idx, f->slot_frame[i]);
	return frame_split(&fr);
}

/* The compressed bytes of a batch, read in as few reads as it takes. */
struct batch_io {
	uint8_t *buf;      /* from the cache's buffer pool */
	size_t buf_len;
	size_t *off;       /* per folio: where its frame starts in buf */
	unsigned int *run; /* per folio: its read */
	int *err;          /* raw files: per folio, the read's result */
	struct ring_read *runs; /* reads of adjacent frames */
	bool *dontcache;   /* per run: it was asked uncached */
	bool *direct;      /* per run: it was asked O_DIRECT, widened */
	uint64_t *need;    /* per run: the bytes it must get (len if not direct) */
	unsigned int nruns;
	struct ring *ring; /* NULL: the reads were done by pread */
	bool fd_held;      /* zfile_fd_get() succeeded: put at finish */
	/* in a store: run k is sreads[k], sent by client (this thread's) */
	struct store_read *sreads;
	struct store_client *client;
};

static ssize_t fd_read(struct zfile *f, void *buf, size_t len, uint64_t off)
{
	size_t done = 0;

	if (f->obj) {
		ssize_t n = remote_pread(f, buf, len, off);

		return n < 0 ? n : fault_apply(n, len);
	}

	while (done < len) {
		struct iovec v = {(char *)buf + done, len - done};
		int flags = atomic_load_explicit(&f->dontcache,
						 memory_order_relaxed)
				    ? RWF_DONTCACHE
				    : 0;
		ssize_t n = preadv2(f->fd, &v, 1, (off_t)(off + done), flags);

		if (n < 0 && flags && (errno == EOPNOTSUPP || errno == EINVAL)) {
			atomic_store(&f->dontcache, false);
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		n = fault_apply(n, len - done);
		if (n < 0)
			return n;
		if (n == 0)
			break;
		done += (size_t)n;
	}
	return (ssize_t)done;
}

/*
 * A raw file's folio straight into its buffer with O_DIRECT, when its place,
 * length and buffer are aligned (all but a file's last folio): the bytes
 * read, or -errno; a refusal turns O_DIRECT off for the file and returns
 * -EAGAIN.
 */
static ssize_t raw_direct(struct zfile *f, struct folio *fo, uint64_t pos)
{
	uint8_t *dst = fo->data;
	size_t done = 0;
	ssize_t n, more;

	while (done < fo->len) {
		n = pread(f->dfd, dst + done, fo->len - done,
			  (off_t)(pos + done));
		n = n < 0 ? -errno
			  : fault_direct(fault_apply(n, fo->len - done));
		if (n == -EINVAL) {
			atomic_store(&f->direct, false);
			return -EAGAIN;
		}
		if (n == -EINTR)
			continue;
		if (n < 0)
			return n;
		if (n == 0 || n % DIO_ALIGN)
			break; /* short: the rest, if any, by pread */
		done += (size_t)n;
	}
	if (done == fo->len)
		return (ssize_t)done;
	done += (size_t)n;
	more = fd_read(f, dst + done, fo->len - done, pos + done);
	return more < 0 ? more : (ssize_t)(done + (size_t)more);
}

/* Raw files: the folio's bytes are the file's; read them straight in
 * (here: fill() has nothing left to do). */
static int submit_raw(struct fill_batch *b, struct zfile *f,
		      struct batch_io *io)
{
	b->costed = true;
	b->cost = 0;
	for (unsigned int i = 0; i < b->nr; i++) {
		struct folio *fo = b->folios[i];
		uint64_t pos;
		ssize_t n = -EAGAIN;

		if (!fo)
			continue;
		pos = mapping_folio_pos(b->mapping, fo->index);
		if (f->dfd >= 0 &&
		    atomic_load_explicit(&f->direct, memory_order_relaxed) &&
		    !(pos % DIO_ALIGN) && !(fo->len % DIO_ALIGN) &&
		    !((uintptr_t)fo->data % DIO_ALIGN)) {
			n = raw_direct(f, fo, pos);
			if (n > 0)
				stat_mod(fo->group, STAT_BACKING_DIRECT, n);
		}
		if (n == -EAGAIN)
			n = fd_read(f, fo->data, fo->len, pos);
		io->err[i] = n < 0 ? (int)n : (size_t)n == fo->len ? 0 : -EIO;
		if (n > 0)
			stat_mod(fo->group, STAT_BACKING_BYTES, n);
	}
	return 0;
}

static struct ring *ring_of(void *io_ctx)
{
	struct worker *w = io_ctx;

	return w && w->ring.ok ? &w->ring : NULL;
}

/* Queue run k on the ring (or the store), or read it now (no ring, or
 * it is full). */
static void queue_run(struct zfile *f, struct batch_io *io, unsigned int k)
{
	struct ring_read *r = &io->runs[k];
	bool dontcache = atomic_load_explicit(&f->dontcache,
					      memory_order_relaxed);
	ssize_t n;

	if (io->direct[k]) {
		if (io->ring && ring_queue(io->ring, f->dfd, r, 0) == 0)
			return;
		n = pread(f->dfd, r->dst, r->len, (off_t)r->off);
		r->res = n < 0 ? -errno : (int)fault_apply(n, r->len);
		r->done = true;
		return;
	}
	if (io->sreads) {
		io->sreads[k] = (struct store_read){
			.off = r->off, .len = r->len, .dst = r->dst};
		store_read_start(io->client, f->obj, &io->sreads[k]);
		r->done = false;
		return;
	}

	io->dontcache[k] = dontcache;
	if (io->ring && ring_queue(io->ring, f->fd, r,
				   dontcache ? RWF_DONTCACHE : 0) == 0)
		return;
	n = fd_read(f, r->dst, r->len, r->off);
	r->res = (int)n;
	r->done = true;
}

static int batch_alloc(struct fill_batch *b, struct batch_io **out)
{
	struct batch_io *io = calloc(1, sizeof(*io));

	*out = io;
	b->fs_priv = io;
	if (!io)
		return -ENOMEM;
	io->off = calloc(b->nr, sizeof(*io->off));
	io->run = calloc(b->nr, sizeof(*io->run));
	io->err = calloc(b->nr, sizeof(*io->err));
	io->runs = calloc(b->nr, sizeof(*io->runs));
	io->dontcache = calloc(b->nr, sizeof(*io->dontcache));
	io->direct = calloc(b->nr, sizeof(*io->direct));
	io->need = calloc(b->nr, sizeof(*io->need));
	if (!io->off || !io->run || !io->err || !io->runs || !io->dontcache ||
	    !io->direct || !io->need)
		return -ENOMEM;
	for (unsigned int i = 0; i < b->nr; i++)
		io->runs[i].done = true; /* until queued */
	return 0;
}

/* The frame of batch folio i into *fr, when it is read as a whole (not
 * split): false if not. */
static bool batch_frame(struct fill_batch *b, struct zfile *f, unsigned int i,
			struct zseek_frame *fr)
{
	if (!b->folios[i] || slot_split(f, b->start + i))
		return false;
	*fr = zseek_frame_at(&f->idx, slot_frame(f, b->start + i));
	return true;
}

/* Folios from i on whose frames follow each other in the file: run k. */
static unsigned int batch_run(struct fill_batch *b, struct zfile *f,
			      struct batch_io *io, unsigned int i,
			      unsigned int k, size_t pos)
{
	struct ring_read *r = &io->runs[k];
	struct zseek_frame fr = {0}; /* set: the caller checked folio i */
	unsigned int j;

	batch_frame(b, f, i, &fr);
	r->off = fr.c_off;
	r->dst = io->buf + pos;
	r->len = 0;
	for (j = i; j < b->nr && batch_frame(b, f, j, &fr); j++) {
		if (fr.c_off != r->off + r->len)
			break;
		io->off[j] = pos + r->len;
		io->run[j] = k;
		r->len += fr.c_size;
	}
	return j;
}

/*
 * Run k, just made, read O_DIRECT: widened to DIO_ALIGN at both ends (its
 * place in the buffer is aligned), its folios' frames lead bytes further
 * in.
 */
static void run_widen(struct batch_io *io, unsigned int k, unsigned int i,
		      unsigned int end)
{
	struct ring_read *r = &io->runs[k];
	uint64_t lead = r->off & (DIO_ALIGN - 1);

	for (; i < end; i++)
		if (io->run[i] == k)
			io->off[i] += lead;
	r->off -= lead;
	io->need[k] = lead + r->len;
	r->len = (io->need[k] + DIO_ALIGN - 1) & ~(uint64_t)(DIO_ALIGN - 1);
	io->direct[k] = true;
}

static int zfile_submit(struct fill_batch *b)
{
	struct zfile *f = b->mapping->host;
	struct batch_io *io;
	struct zseek_frame fr;
	size_t total = 0, pos = 0, frames = 0;
	bool direct;
	int err = batch_alloc(b, &io);

	if (!err)
		err = zfile_fd_get(f);
	if (err)
		return err;
	io->fd_held = true;
	if (f->idx.kind == ZSEEK_RAW)
		return submit_raw(b, f, io);
	/* split frames are streamed: one stream per file, read forwards */
	for (unsigned int i = 0; i < b->nr && !b->serial; i++)
		b->serial = b->folios[i] && slot_split(f, b->start + i);
	b->costed = true;
	for (unsigned int i = 0; i < b->nr; i++)
		if (batch_frame(b, f, i, &fr)) {
			total += fr.c_size;
			frames++;
			/* raw blocks (c_size over d_size) are a copy */
			b->cost += fr.c_size < fr.d_size ? fr.d_size
							 : fr.d_size / 4;
		}
	if (!total)
		return 0;
	/* each run widened by up to two blocks; the buffer aligned in it */
	direct = !f->obj && f->dfd >= 0 &&
		 atomic_load_explicit(&f->direct, memory_order_relaxed);
	if (direct)
		total += (2 * frames + 1) * DIO_ALIGN;
	io->buf = cache_buf_get(b->mapping->cache, total);
	if (!io->buf)
		return -ENOMEM;
	io->buf_len = total;
	if (direct)
		pos = (size_t)(-(uintptr_t)io->buf & (DIO_ALIGN - 1));
	io->ring = f->obj ? NULL : ring_of(b->io_ctx);
	if (f->obj) {
		io->client = remote_client();
		io->sreads = calloc(b->nr, sizeof(*io->sreads));
		if (!io->client || !io->sreads)
			return -ENOMEM;
	}
	for (unsigned int i = 0, j; i < b->nr; i = j) {
		if (!batch_frame(b, f, i, &fr)) {
			j = i + 1;
			continue;
		}
		j = batch_run(b, f, io, i, io->nruns, pos);
		stat_mod(b->folios[i]->group, STAT_BACKING_BYTES,
			 (long)io->runs[io->nruns].len);
		io->need[io->nruns] = io->runs[io->nruns].len;
		if (direct) {
			stat_mod(b->folios[i]->group, STAT_BACKING_DIRECT,
				 (long)io->runs[io->nruns].len);
			run_widen(io, io->nruns, i, j);
		}
		pos += io->runs[io->nruns].len;
		queue_run(f, io, io->nruns++);
	}
	/* a ring that fails here fails its reads: fill() sees it */
	if (io->ring)
		ring_submit(io->ring);
	return 0;
}

/*
 * A read that completed, made final: refused as uncached, it is read
 * plainly (and so is every read of f from now on); short, the rest is read
 * by pread.  r->res: the bytes read (fewer only at the end of the file), or
 * -errno.  *dontcache says whether it was asked uncached, and is cleared:
 * a result made final stays as it is.
 */
static void read_complete(struct zfile *f, struct ring_read *r,
			  bool *dontcache)
{
	uint64_t got;
	ssize_t n;

	if (r->res < 0 && *dontcache &&
	    (r->res == -EOPNOTSUPP || r->res == -EINVAL)) {
		atomic_store(&f->dontcache, false);
		r->res = 0;
	}
	*dontcache = false;
	if (r->res < 0 || (uint64_t)r->res >= r->len)
		return;
	got = (uint64_t)r->res;
	n = fd_read(f, r->dst + got, r->len - got, r->off + got);
	r->res = n < 0 ? (int)n : (int)(got + (uint64_t)n);
}

/*
 * An O_DIRECT read that completed, made final: refused (EINVAL), the file
 * reads without O_DIRECT from now on, and this read is done again so;
 * short of need (the widened tail past the end of the file is fine), the
 * rest is read by pread.
 */
static void direct_complete(struct zfile *f, struct ring_read *r,
			    uint64_t need)
{
	uint64_t got;
	ssize_t n;

	if (r->res == -EINVAL) {
		atomic_store(&f->direct, false);
		r->res = 0;
	}
	if (r->res < 0 || (uint64_t)r->res >= need)
		return;
	got = (uint64_t)r->res;
	n = fd_read(f, r->dst + got, need - got, r->off + got);
	r->res = n < 0 ? (int)n : (int)(got + (uint64_t)n);
}

/*
 * Wait until run k has completed, and make its result final (the length,
 * or -errno): later calls, from any thread, only read it.
 */
static int run_wait(struct zfile *f, struct batch_io *io, unsigned int k)
{
	struct ring_read *r = &io->runs[k];

	if (io->sreads && !r->done) { /* carried by the store's fetcher */
		r->res = store_read_wait(io->client, &io->sreads[k]);
		if (r->res < 0)
			remote_log(f, r->res);
		r->res = (int)fault_apply(r->res, r->len);
		r->done = true;
	}

	if (!r->done && io->ring)
		ring_wait(io->ring, r);
	if (!r->done)
		return -EIO;
	if (io->direct[k]) {
		r->res = (int)fault_direct(r->res);
		direct_complete(f, r, io->need[k]);
		io->direct[k] = false; /* final: later calls only read it */
	}
	if (r->res >= 0 && (uint64_t)r->res >= io->need[k])
		return 0;
	read_complete(f, r, &io->dontcache[k]);
	if (r->res >= 0 && (uint64_t)r->res < io->need[k])
		r->res = -EIO; /* the file is shorter than its index */
	return r->res < 0 ? r->res : 0;
}

/* Every read of the batch in, by the worker whose ring they are on. */
static void zfile_wait_io(struct fill_batch *b)
{
	struct batch_io *io = b->fs_priv;

	for (unsigned int k = 0; io && k < io->nruns; k++)
		run_wait(b->mapping->host, io, k);
}

/*
 * A thread that is not a worker (the main one at mount, the cache's fill
 * threads) has a decoder of its own, freed when the thread ends.
 */
static pthread_key_t dctx_key;
static pthread_once_t dctx_once = PTHREAD_ONCE_INIT;

static void dctx_free(void *d)
{
	ZSTD_freeDCtx(d);
}

static bool dctx_key_ok;

static void dctx_key_init(void)
{
	dctx_key_ok = pthread_key_create(&dctx_key, dctx_free) == 0;
}

/* This thread's decoder: a fill may run on a fill thread, not the worker's. */
static ZSTD_DCtx *dctx_of(void)
{
	struct worker *w = current_worker;
	ZSTD_DCtx *d;

	if (w)
		return w->dctx;
	pthread_once(&dctx_once, dctx_key_init);
	if (!dctx_key_ok)
		return NULL;
	d = pthread_getspecific(dctx_key);
	if (!d && (d = ZSTD_createDCtx()))
		pthread_setspecific(dctx_key, d);
	return d;
}

/* Free z's decoder and give back its window; z's lock is held. */
static void stream_drop(struct zstream *z)
{
	struct group *root = &z->owner->mapping->cache->budget.root;

	if (z->ready)
		zseek_stream_free(&z->s);
	z->ready = false;
	if (!z->pages)
		return;
	uncharge(root, z->pages);
	stat_mod(root, STAT_DECODER_WINDOWS, -(long)z->pages);
	z->pages = 0;
}

/*
 * Free the least recently used idle stream of another file: false if none.
 * Never another of mine's own file: the reader that one follows would
 * start over and take a window back in turn (read_split shares one
 * instead).
 */
static bool stream_evict_one(struct stream_pool *pool, struct zstream *mine)
{
	struct zstream *z;
	bool freed = false;

	pthread_mutex_lock(&pool->lock);
	cds_list_for_each_entry(z, &pool->lru, link) {
		/* trylock: a stream in use is not idle, and the lock order
		 * (stream, then pool) must not be reversed */
		if (z->owner == mine->owner || pthread_mutex_trylock(&z->lock))
			continue;
		cds_list_del_init(&z->link);
		stream_drop(z);
		pthread_mutex_unlock(&z->lock);
		freed = true;
		break;
	}
	pthread_mutex_unlock(&pool->lock);
	return freed;
}

/*
 * Charge the stream's window to the budget before it is allocated: up to
 * 128 MiB for frames the zstd CLI wrote with --long or --ultra.  Idle
 * streams of other files give their windows back when windows would take
 * more than a quarter of the budget, or when there is no room; -ENOSPC if
 * the budget still cannot hold it.  z's lock is held.  (A window stays
 * with its stream after the read: 40 files of 6 MiB read in turn at
 * budget=64M left 62.6 MiB of idle windows, and the files' pieces 1 MiB.)
 */
static int stream_charge(struct zstream *z, const struct zseek_frame *fr)
{
	struct zfile *f = z->owner;
	struct group *root = &f->mapping->cache->budget.root;
	unsigned long pages;
	uint64_t need;
	int r = zseek_stream_need(zfile_read_cb, f, fr, &need);

	if (r)
		return r;
	pages = pages_of_bytes(need);
	/* windows, idle ones of files read before included, never take more
	 * than a quarter of the budget while one can be given back: the
	 * pieces they decode need the room */
	while (pages > z->pages &&
	       (unsigned long)stat_read(root, STAT_DECODER_WINDOWS) + pages -
			       z->pages >
		       (unsigned long)counter_max(&root->mem) / 4 &&
	       stream_evict_one(f->pool, z))
		;
	while (pages > z->pages && charge_demand(root, pages - z->pages)) {
		if (stream_evict_one(f->pool, z))
			continue;
		return -ENOSPC;
	}
	if (pages > z->pages) {
		stat_mod(root, STAT_DECODER_WINDOWS, (long)(pages - z->pages));
		z->pages = pages;
	}
	/* the most recently used goes last */
	pthread_mutex_lock(&f->pool->lock);
	cds_list_del(&z->link);
	cds_list_add_tail(&z->link, &f->pool->lru);
	pthread_mutex_unlock(&f->pool->lock);
	return 0;
}

/*
 * The stream to read [at, ...) of frame with: the one with least to decode
 * to get there (from where it stands, or from the frame's start if it is
 * past that point or elsewhere); of equals, the least recently chosen.  A
 * stream another reader is using still counts: its read takes it forwards,
 * and the next piece of a sequential reader is right behind the last.  A
 * stream without a window is taken only while all the mount's windows
 * stay within an eighth of the budget: at a small budget a second window
 * would take the room of the pieces both readers need, and a piece
 * evicted before its reader is done with it starts the frame over.
 */
static struct zstream *stream_choose(struct zfile *f, uint32_t frame,
				     uint64_t at)
{
	struct group *root = &f->mapping->cache->budget.root;
	struct zstream *best = NULL;
	uint64_t best_cost = 0;
	unsigned long most = 0;
	bool room;

	pthread_mutex_lock(&f->stream_lock);
	for (int i = 0; i < ZFILE_STREAMS; i++)
		if (f->streams[i].win > most)
			most = f->streams[i].win;
	room = (unsigned long)stat_read(root, STAT_DECODER_WINDOWS) + most <=
	       (unsigned long)counter_max(&root->mem) / 8;
	for (int i = 0; i < ZFILE_STREAMS; i++) {
		struct zstream *z = &f->streams[i];
		uint64_t cost = z->frame == frame && z->pos <= at ? at - z->pos
								  : at;

		if (!z->win && most && !room)
			continue;
		if (!best || cost < best_cost ||
		    (cost == best_cost && z->used < best->used)) {
			best = z;
			best_cost = cost;
		}
	}
	best->used = ++f->stream_clock;
	/* it is on its way there, with a window: the next reader counts
	 * from there */
	best->frame = frame;
	best->pos = at;
	if (!best->win)
		best->win = most ? most : 1;
	pthread_mutex_unlock(&f->stream_lock);
	return best;
}

/*
 * The pieces of slot's frame that stream z must decode to reach slot:
 * those from where it stands (or the frame's start, if it must start
 * over), kept in the cache for g as they pass where the budget has room,
 * instead of decoded into scratch and dropped.  A random reader of a big
 * frame (a plain `zstd` file) then pays for the frame's start once, not at
 * every read.  z's lock is held.
 */
static void split_pass_over(struct zfile *f, struct zstream *z,
			    unsigned long slot, struct group *g)
{
	uint32_t frame = f->slot_frame[slot];
	uint64_t from = 0;
	unsigned long j = slot;

	if (!g)
		return;
	if (z->s.frame == frame && z->s.out_pos <= f->slot_skip[slot])
		from = z->s.out_pos;
	while (j > 0 && f->slot_frame[j - 1] == frame &&
	       f->slot_skip[j - 1] >= from)
		j--;
	for (; j < slot; j++) {
		struct folio *p = cache_pass_over_begin(f->mapping, j, g);
		int r;

		if (!p)
			continue; /* cached, or no room: decoded in passing */
		r = zseek_stream_read(&z->s, zfile_read_cb, f, &f->idx, frame,
				      f->slot_skip[j], p->data, p->len);
		cache_pass_over_end(p, r);
		if (r)
			return; /* the read asked for starts over, and says */
	}
}

/* The longest a read that finds a frame damaged waits for the page cache
 * to let go of the mount's pages (a few MiB take microseconds, but the
 * whole tier may be queued) */
#define FAILED_DRAIN_US 100000

/*
 * A frame decoded in pieces (over ZSEEK_SPLIT_ABOVE: a plain `zstd FILE`)
 * is checked only when its decoder reaches the frame's end, so its pieces
 * before were served unchecked.  Once it fails there (or anywhere), none
 * of it is served again: every read of its range fails (zfile_range_refused,
 * before the cache is looked at), and what the kernel's page cache holds
 * of the mount is dropped, as for a lying table.  Without memory for the
 * bits, the whole file fails.
 */
static void frame_failed(struct zfile *f, uint32_t frame)
{
	_Atomic uint8_t *bits = atomic_load(&f->failed), *none = NULL;

	if (!bits) {
		bits = calloc(f->idx.nframes / 8 + 1, 1);
		if (!bits) {
			atomic_store(&f->table_lies, true);
			ktier_evict_all(f->mapping->cache);
			return;
		}
		if (!atomic_compare_exchange_strong(&f->failed, &none, bits)) {
			free((void *)bits);
			bits = none;
		}
	}
	atomic_fetch_or(&bits[frame / 8], (uint8_t)(1u << (frame % 8)));
	ktier_evict_all(f->mapping->cache);
	/* gone before this read's reader hears of it, and reads again */
	ktier_drain(f->mapping->cache, FAILED_DRAIN_US);
}

/*
 * A read that zfile_range_refused() refuses: what the kernel's page cache
 * holds of the mount goes before its reader hears of it, as when the frame
 * failed.  The read that found the frame failing may still be dropping it
 * (frame_failed() marks the frame first), and this one, refused at once,
 * would otherwise let its reader's next call find those pages.
 */
void zfile_refused(struct zfile *f)
{
	ktier_evict_all(f->mapping->cache);
	ktier_drain(f->mapping->cache, FAILED_DRAIN_US);
}

bool zfile_range_refused(struct zfile *f, uint64_t pos, uint64_t len)
{
	_Atomic uint8_t *bits = atomic_load(&f->failed);
	unsigned long i, last;

	if (atomic_load(&f->table_lies))
		return true;
	if (!bits || !len || !f->nslots)
		return false;
	last = mapping_index(f->mapping, pos + len - 1);
	for (i = mapping_index(f->mapping, pos); i <= last && i < f->nslots;
	     i++) {
		uint32_t fr = slot_frame(f, i);

		if (atomic_load_explicit(&bits[fr / 8], memory_order_relaxed) &
		    (1u << (fr % 8)))
			return true;
	}
	return false;
}

/* Content of slot (a piece of a big frame) into dst, for g's fill (or
 * NULL: a bounce read, which keeps nothing). */
static int read_split(struct zfile *f, unsigned long slot, void *dst,
		      size_t len, struct group *g)
{
	uint32_t frame = f->slot_frame[slot];
	const struct zseek_frame frame_v = zseek_frame_at(&f->idx, frame);
	const struct zseek_frame *fr = &frame_v;
	struct zstream *z = stream_choose(f, frame, f->slot_skip[slot]);
	int r;

	pthread_mutex_lock(&z->lock);
	r = stream_charge(z, fr);
	/*
	 * No room for another window: share one this file has (busy, or it
	 * would have been freed), waiting for its reader.  With none, the
	 * budget cannot hold a decoder for this frame: EIO, said in the log.
	 */
	for (int i = 0; r == -ENOSPC && i < ZFILE_STREAMS; i++) {
		struct zstream *o = &f->streams[i];

		if (o == z)
			continue;
		pthread_mutex_lock(&f->stream_lock);
		z->frame = UINT32_MAX; /* not moved: it has no decoder */
		z->win = z->pages;
		pthread_mutex_unlock(&f->stream_lock);
		pthread_mutex_unlock(&z->lock);
		pthread_mutex_lock(&o->lock);
		z = o;
		r = o->pages ? stream_charge(o, fr) : -ENOSPC;
	}
	if (r == -ENOSPC) {
		uint64_t need = 0;

		zseek_stream_need(zfile_read_cb, f, fr, &need);
		zlog_file(f->path, "the budget cannot hold a %llu MiB decoder "
				   "window for a frame at offset %llu (a "
				   "bigger budget= reads it)",
			  (unsigned long long)(need >> 20),
			  (unsigned long long)fr->c_off);
		stat_inc(g ? g : &f->mapping->cache->budget.root,
			 STAT_WINDOWS_REFUSED);
		r = -EIO;
	}
	if (!r && !z->ready) {
		r = zseek_stream_init(&z->s);
		z->ready = r == 0;
	}
	if (!r) {
		struct group *root = &f->mapping->cache->budget.root;
		uint64_t skipped = z->s.skipped;

		if (f->slot_skip[slot] && (z->s.frame != frame ||
					   z->s.out_pos > f->slot_skip[slot]))
			stat_inc(root, STAT_DECODER_RESTARTS);
		split_pass_over(f, z, slot, g);
		r = zseek_stream_read(&z->s, zfile_read_cb, f, &f->idx, frame,
				      f->slot_skip[slot], dst, len);
		stat_mod(root, STAT_DECODER_SKIPPED,
			 (long)(z->s.skipped - skipped));
	}
	/* where it stands now (the choice never holds a stream's lock) */
	pthread_mutex_lock(&f->stream_lock);
	z->frame = z->ready ? z->s.frame : UINT32_MAX;
	z->pos = z->ready ? z->s.out_pos : 0;
	z->win = z->pages;
	pthread_mutex_unlock(&f->stream_lock);
	pthread_mutex_unlock(&z->lock);
	if (r == -EBADMSG)
		frame_failed(f, frame);
	return r;
}

/*
 * A frame that does not decode is said in the log, once per frame (with
 * the file's name), besides being counted in corrupt_frames: a reader gets
 * EIO, and whoever looks must learn which file and where.
 */
static int said_if_corrupt(struct zfile *f, unsigned long slot, int r)
{
	if (r == -EUCLEAN) {
		atomic_store(&f->table_lies, true);
		/* pages filled from the wrong place may be in the page cache,
		 * which a read of a file the kernel opened itself reaches
		 * without asking (kernel_opens): none stays */
		ktier_evict_all(f->mapping->cache);
		zlog_file(f->path, "the seek table gives the frame at offset "
				   "%llu a size its header does not: the "
				   "table is damaged, and the whole file "
				   "reads as EIO",
			  (unsigned long long)zseek_frame_at(
				  &f->idx, slot_frame(f, slot)).c_off);
		return -EBADMSG;
	}
	if (r == -EBADMSG)
		zlog_file(f->path, "the frame at offset %llu does not decode%s",
			  (unsigned long long)zseek_frame_at(
				  &f->idx, slot_frame(f, slot)).c_off,
			  f->idx.has_checksum || f->idx.frame_checksums
				  ? ", or fails its checksum"
					      : "");
	return r;
}

static int zfile_fill(struct fill_batch *b, unsigned int i)
{
	struct zfile *f = b->mapping->host;
	struct batch_io *io = b->fs_priv;
	struct folio *fo = b->folios[i];
	unsigned long slot = b->start + i;
	struct zseek_frame fr;
	ZSTD_DCtx *dctx;

	int err;

	atomic_fetch_add_explicit(&f->ds->fill_clock, 1, memory_order_relaxed);
	if (f->idx.kind == ZSEEK_RAW)
		return io->err[i];
	if (atomic_load(&f->table_lies))
		return -EBADMSG;
	if (slot_split(f, slot)) {
		err = read_split(f, slot, fo->data, fo->len, fo->group);
	} else {
		err = run_wait(f, io, io->run[i]);
		if (err)
			return err;
		dctx = dctx_of();
		if (!dctx)
			return -ENOMEM;
		fr = zseek_frame_at(&f->idx, slot_frame(f, slot));
		err = zseek_decode_frame(dctx, &fr, f->idx.has_checksum,
					 io->buf + io->off[i], fo->data);
	}
	return said_if_corrupt(f, slot, err);
}

/*
 * Buffers of reads that failed with their ring: the kernel may still write
 * them, so they are never freed.  They stay listed (reachable) here.
 */
static struct orphan {
	struct orphan *next;
	void *buf, *runs;
} *orphans;
static pthread_mutex_t orphans_lock = PTHREAD_MUTEX_INITIALIZER;

static void keep_orphaned(void *buf, void *runs)
{
	struct orphan *o = malloc(sizeof(*o));

	if (!o)
		return; /* then it is merely unreachable: still never freed */
	o->buf = buf;
	o->runs = runs;
	pthread_mutex_lock(&orphans_lock);
	o->next = orphans;
	orphans = o;
	pthread_mutex_unlock(&orphans_lock);
}

static void zfile_finish(struct fill_batch *b)
{
	struct batch_io *io = b->fs_priv;
	bool orphaned = false;

	if (!io)
		return;
	/* no completion may arrive after its buffer is gone */
	for (unsigned int k = 0; io->sreads && k < io->nruns; k++)
		if (!io->runs[k].done) { /* never waited for: stopped now */
			store_read_cancel(&io->sreads[k]);
			io->runs[k].done = true;
		}
	for (unsigned int k = 0; k < io->nruns; k++) {
		if (!io->runs[k].done && io->ring)
			ring_wait(io->ring, &io->runs[k]);
		orphaned |= io->runs[k].orphaned || !io->runs[k].done;
	}
	if (orphaned) { /* the kernel may still write them: keep them */
		keep_orphaned(io->buf, io->runs);
	} else {
		cache_buf_put(b->mapping->cache, io->buf, io->buf_len);
		free(io->runs);
	}
	free(io->off);
	free(io->run);
	free(io->err);
	free(io->dontcache);
	free(io->direct);
	free(io->need);
	free(io->sreads);
	if (io->fd_held)
		zfile_fd_put(b->mapping->host);
	free(io);
	b->fs_priv = NULL;
}

/* One folio's content into buf, its file's fd held. */
static int read_one_folio(struct zfile *f, struct mapping *m,
			  unsigned long index, void *buf)
{
	uint32_t len = mapping_folio_len(m, index);
	struct zseek_frame frame_v;
	const struct zseek_frame *fr = &frame_v;
	ZSTD_DCtx *dctx;
	void *src;
	ssize_t n;
	int r;

	if (f->idx.kind == ZSEEK_RAW) {
		n = fd_read(f, buf, len, mapping_folio_pos(m, index));
		return n < 0 ? (int)n : (size_t)n == len ? 0 : -EIO;
	}
	if (atomic_load(&f->table_lies))
		return -EBADMSG;
	if (slot_split(f, index))
		return read_split(f, index, buf, len, NULL);
	frame_v = zseek_frame_at(&f->idx, slot_frame(f, index));
	dctx = dctx_of();
	src = cache_buf_get(m->cache, fr->c_size);
	if (!src || !dctx) {
		cache_buf_put(m->cache, src, fr->c_size);
		return -ENOMEM;
	}
	n = fd_read(f, src, fr->c_size, fr->c_off);
	if (n < 0 || (uint64_t)n != fr->c_size)
		r = n < 0 ? (int)n : -EIO;
	else
		r = zseek_decode_frame(dctx, fr, f->idx.has_checksum, src,
				       buf);
	cache_buf_put(m->cache, src, fr->c_size);
	return r;
}

static int zfile_read_into(struct mapping *m, void *io_ctx,
			   unsigned long index, void *buf)
{
	struct zfile *f = m->host;
	int r = zfile_fd_get(f);

	(void)io_ctx; /* every thread decodes with its own context */
	if (r)
		return r;
	r = said_if_corrupt(f, index, read_one_folio(f, m, index, buf));
	zfile_fd_put(f);
	return r;
}

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
static int part_wait(struct ring *ring, struct ring_read *rr, int n,
		     void *buf)
{
	bool orphaned = false;

	for (int i = 0; ring && i < n; i++) {
		if (!rr[i].done)
			ring_wait(ring, &rr[i]);
		orphaned |= rr[i].orphaned || !rr[i].done;
	}
	if (!orphaned)
		return 0;
	keep_orphaned(buf, NULL);
	return -EIO;
}

static int part_io(struct zfile *f, void *io_ctx, struct ring_read *rr,
		   int n, void *block);

/*
 * part_io() O_DIRECT: each read widened to DIO_ALIGN into an aligned
 * scratch buffer, and its bytes copied out (a few KiB).  A refusal turns
 * O_DIRECT off for the file and the reads are done again without it.
 */
static int part_io_direct(struct zfile *f, void *io_ctx, struct ring_read *rr,
			  int n, void *block)
{
	struct cache *c = f->mapping->cache;
	struct ring *ring = n > 1 ? ring_of(io_ctx) : NULL;
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

			wr[i].res = got < 0 ? -errno
					    : (int)fault_apply(got, wr[i].len);
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
			ssize_t more = fd_read(f, rr[i].dst + got,
					       rr[i].len - got, rr[i].off + got);

			rr[i].res = more < 0 ? (int)more
					     : (int)(got + (uint64_t)more);
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
static int part_io(struct zfile *f, void *io_ctx, struct ring_read *rr,
		   int n, void *block)
{
	struct ring *ring = n > 1 ? ring_of(io_ctx) : NULL;
	bool dc = atomic_load_explicit(&f->dontcache, memory_order_relaxed);

	if (f->dfd >= 0 &&
	    atomic_load_explicit(&f->direct, memory_order_relaxed))
		return part_io_direct(f, io_ctx, rr, n, block);

	for (int i = 0; i < n; i++) {
		rr[i].done = false;
		if (!ring || ring_queue(ring, f->fd, &rr[i],
					dc ? RWF_DONTCACHE : 0)) {
			rr[i].res = (int)fd_read(f, rr[i].dst, rr[i].len,
						 rr[i].off);
			rr[i].done = true;
		}
	}
	if (part_wait(ring, rr, n, block))
		return -EIO;
	for (int i = 0; i < n; i++) {
		bool asked_dc = dc;

		read_complete(f, &rr[i], &asked_dc);
	}
	return 0;
}

/* Frame header sizes a frame may have: where a raw block may start */
#define HDR_MIN ZSTD_FRAMEHEADERSIZE_MIN(ZSTD_f_zstd1)
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
	uint64_t hdr0 = fr->c_off +
			zseek_raw_block_pos(HDR_MIN + ZSEEK_BLOCK_HEADER, k);
	size_t probe_len = fr->c_size < ZSEEK_RAW_PROBE ? fr->c_size
							: ZSEEK_RAW_PROBE;
	size_t hdr_at = ZSEEK_RAW_PROBE, data_at = hdr_at + HDR_SPAN +
						  ZSEEK_BLOCK_HEADER;
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
	rr[n++] = (struct ring_read){.off = fr->c_off, .len = probe_len,
				     .dst = block};
	if (k)
		rr[n++] = (struct ring_read){
			.off = hdr0, .len = HDR_SPAN + ZSEEK_BLOCK_HEADER,
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
		/* the frame header's real size picks the bytes out of the spans */
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
	uint32_t now = atomic_load_explicit(&f->ds->fill_clock,
					    memory_order_relaxed) + 1;
	uint32_t last = atomic_exchange_explicit(&f->parts[index], now ? now : 1,
						 memory_order_relaxed);
	long fits = counter_max(&m->cache->budget.root.mem) /
		    (long)mapping_folio_pages(m, index);

	return !last || (long)(uint32_t)(now - last) > fits;
}

static int part_read(struct zfile *f, struct mapping *m, void *io_ctx,
		     unsigned long index, uint32_t off, uint32_t len,
		     void *buf)
{
	struct zseek_frame fr;
	ssize_t n;

	if (f->idx.kind == ZSEEK_RAW) {
		n = fd_read(f, buf, len, mapping_folio_pos(m, index) + off);
		return n < 0 ? (int)n : (size_t)n == len ? 0 : -EIO;
	}
	/* a slot of a split frame starts slot_skip into it */
	fr = zseek_frame_at(&f->idx, slot_frame(f, index));
	return part_read_frame(f, io_ctx, &fr,
			       off + (f->slot_skip ? f->slot_skip[index] : 0),
			       len, buf, f->raw_at ? &f->raw_at[index] : NULL);
}

static int zfile_read_part(struct mapping *m, void *io_ctx,
			   unsigned long index, uint32_t off, uint32_t len,
			   void *buf)
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
		fr = zseek_frame_at(&f->idx, slot_frame(f, index));
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

/* The mapping's last reference: the zfile goes with it. */
static void zfile_release(struct mapping *m)
{
	struct zfile *f = m->host;

	meta_charge(f->ds, -f->meta_bytes);
	for (int i = 0; i < ZFILE_STREAMS; i++) {
		struct zstream *z = &f->streams[i];

		pthread_mutex_lock(&f->pool->lock);
		cds_list_del_init(&z->link);
		pthread_mutex_unlock(&f->pool->lock);
		stream_drop(z);
		pthread_mutex_destroy(&z->lock);
	}
	pthread_mutex_destroy(&f->stream_lock);
	zseek_index_free(&f->idx);
	free(f->starts);
	free(f->slot_frame);
	free(f->slot_skip);
	free(f->parts);
	free(f->raw_at);
	free((void *)atomic_load(&f->failed));
	zfile_fd_release(f);
	store_obj_free(f->obj);
	free(f->path);
	free(f);
}

const struct mapping_ops zfile_mapping_ops = {
	.submit = zfile_submit,
	.wait_io = zfile_wait_io,
	.fill = zfile_fill,
	.finish = zfile_finish,
	.read_into = zfile_read_into,
	.read_part = zfile_read_part,
	.release = zfile_release,
};
