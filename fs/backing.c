// SPDX-License-Identifier: MIT
/*
 * Backing reads and decoding: the mapping operations of a dataset file.
 *
 * A folio is one frame's content, or part of a big frame's (geometry.c);
 * a big frame is streamed (stream.c), and a small read of a folio not
 * cached may take just its bytes (part.c).
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
 * A folio read for one reader and not cached (a bounce read, when the
 * budget has no room for it) is read so too.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <unistd.h>

#include "internal.h"

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

/* The compressed bytes of a batch, read in as few reads as it takes. */
struct batch_io {
	uint8_t *buf; /* from the cache's buffer pool */
	size_t buf_len;
	size_t *off;		/* per folio: where its frame starts in buf */
	unsigned int *run;	/* per folio: its read, or NO_RUN: its frame
				 * was in the compressed cache */
	int *err;		/* raw files: per folio, the read's result */
	struct ring_read *runs; /* reads of adjacent frames */
	bool *dontcache;	/* per run: it was asked uncached */
	bool *direct;		/* per run: it was asked O_DIRECT, widened */
	uint64_t *need; /* per run: the bytes it must get (len if not direct) */
	unsigned int nruns;
	struct ring *ring; /* NULL: the reads were done by pread */
	bool fd_held;	   /* zfile_fd_get() succeeded: put at finish */
	/* in a store: run k is sreads[k], sent by client (this thread's) */
	struct store_read *sreads;
	struct store_client *client;
};

#define NO_RUN UINT_MAX

ssize_t backing_pread(struct zfile *f, void *buf, size_t len, uint64_t off)
{
	size_t done = 0;

	if (f->obj) {
		ssize_t n = remote_pread(f, buf, len, off);

		return n < 0 ? n : fault_apply(n, len);
	}

	while (done < len) {
		struct iovec v = {(char *)buf + done, len - done};
		int flags =
		    atomic_load_explicit(&f->dontcache, memory_order_relaxed)
			? RWF_DONTCACHE
			: 0;
		ssize_t n = preadv2(f->fd, &v, 1, (off_t)(off + done), flags);

		if (n < 0 && flags &&
		    (errno == EOPNOTSUPP || errno == EINVAL)) {
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
 * len bytes of a raw file at pos straight into dst with O_DIRECT: the bytes
 * read, or -errno; a refusal turns O_DIRECT off for the file and returns
 * -EAGAIN.  pos, len and dst are aligned.
 */
static ssize_t raw_direct(struct zfile *f, uint8_t *dst, size_t len,
			  uint64_t pos)
{
	size_t done = 0;
	ssize_t n, more;

	while (done < len) {
		n = pread(f->dfd, dst + done, len - done, (off_t)(pos + done));
		n = n < 0 ? -errno : fault_direct(fault_apply(n, len - done));
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
	if (done == len)
		return (ssize_t)done;
	done += (size_t)n;
	more = backing_pread(f, dst + done, len - done, pos + done);
	return more < 0 ? more : (ssize_t)(done + (size_t)more);
}

/*
 * A raw file's folio at pos (len bytes) into dst, for g: O_DIRECT when its
 * place, length and buffer are aligned (all but a file's last folio), else
 * uncached.  0 or -errno.
 */
static int raw_folio_read(struct zfile *f, void *dst, size_t len,
			  uint64_t pos, struct group *g)
{
	ssize_t n = -EAGAIN;

	if (f->dfd >= 0 &&
	    atomic_load_explicit(&f->direct, memory_order_relaxed) &&
	    !(pos % DIO_ALIGN) && !(len % DIO_ALIGN) &&
	    !((uintptr_t)dst % DIO_ALIGN)) {
		n = raw_direct(f, dst, len, pos);
		if (n > 0)
			stat_mod(g, STAT_BACKING_DIRECT, n);
	}
	if (n == -EAGAIN)
		n = backing_pread(f, dst, len, pos);
	if (n > 0)
		stat_mod(g, STAT_BACKING_BYTES, n);
	return n < 0 ? (int)n : (size_t)n == len ? 0 : -EIO;
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

		if (fo)
			io->err[i] = raw_folio_read(
				f, fo->data, fo->len,
				mapping_folio_pos(b->mapping, fo->index),
				fo->group);
	}
	return 0;
}

struct ring *worker_ring(void *io_ctx)
{
	struct worker *w = io_ctx;

	return w && w->ring.ok ? &w->ring : NULL;
}

/* Queue run k on the ring (or the store), or read it now (no ring, or
 * it is full). */
static void queue_run(struct zfile *f, struct batch_io *io, unsigned int k)
{
	struct ring_read *r = &io->runs[k];
	bool dontcache =
	    atomic_load_explicit(&f->dontcache, memory_order_relaxed);
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
	if (io->ring &&
	    ring_queue(io->ring, f->fd, r, dontcache ? RWF_DONTCACHE : 0) == 0)
		return;
	n = backing_pread(f, r->dst, r->len, r->off);
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
	if (!b->folios[i] || zfile_slot_split(f, b->start + i))
		return false;
	*fr = zseek_frame_at(&f->idx, zfile_slot_frame(f, b->start + i));
	return true;
}

/* Folios from i on whose frames follow each other in the file, up to one
 * the compressed cache holds: run k. */
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
		if (fr.c_off != r->off + r->len ||
		    (j > i && ccache_has(f->mapping, b->start + j)))
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
		b->serial = b->folios[i] && zfile_slot_split(f, b->start + i);
	b->costed = true;
	for (unsigned int i = 0; i < b->nr; i++)
		if (batch_frame(b, f, i, &fr)) {
			total += fr.c_size;
			frames++;
			/* raw blocks (c_size over d_size) are a copy */
			b->cost +=
			    fr.c_size < fr.d_size ? fr.d_size : fr.d_size / 4;
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
	io->ring = f->obj ? NULL : worker_ring(b->io_ctx);
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
		if (ccache_get(f->mapping, b->start + i, io->buf + pos,
			       fr.c_size, b->folios[i]->group)) {
			io->off[i] = pos;
			io->run[i] = NO_RUN;
			pos += fr.c_size;
			if (direct) /* the next run's place stays aligned */
				pos += -(uintptr_t)(io->buf + pos) &
				       (DIO_ALIGN - 1);
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
void backing_read_complete(struct zfile *f, struct ring_read *r,
			   bool *dontcache)
{
	uint64_t got;
	ssize_t n;

	if (r->res < 0 && *dontcache &&
	    (r->res == -EOPNOTSUPP || r->res == -EINVAL)) {
		atomic_store(&f->dontcache, false);
		r->res = 0;
	}
	if (*dontcache) /* a failed run is final, and read by the fills after */
		*dontcache = false;
	if (r->res < 0 || (uint64_t)r->res >= r->len)
		return;
	got = (uint64_t)r->res;
	n = backing_pread(f, r->dst + got, r->len - got, r->off + got);
	r->res = n < 0 ? (int)n : (int)(got + (uint64_t)n);
}

/*
 * An O_DIRECT read that completed, made final: refused (EINVAL), the file
 * reads without O_DIRECT from now on, and this read is done again so;
 * short of need (the widened tail past the end of the file is fine), the
 * rest is read by pread.
 */
static void direct_complete(struct zfile *f, struct ring_read *r, uint64_t need)
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
	n = backing_pread(f, r->dst + got, need - got, r->off + got);
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
	backing_read_complete(f, r, &io->dontcache[k]);
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
	if (zfile_slot_split(f, slot)) {
		folio_set(fo, FOLIO_PIECE);
		err = zfile_read_split(f, slot, fo->data, fo->len, fo->group);
	} else {
		err = io->run[i] == NO_RUN ? 0 : run_wait(f, io, io->run[i]);
		if (err)
			return err;
		dctx = dctx_of();
		if (!dctx)
			return -ENOMEM;
		fr = zseek_frame_at(&f->idx, zfile_slot_frame(f, slot));
		err = zseek_decode_frame(dctx, &fr, f->idx.has_checksum,
					 io->buf + io->off[i], fo->data);
		if (!err && io->run[i] != NO_RUN)
			ccache_offer(f->mapping, slot, io->buf + io->off[i],
				     fr.c_size, fo->group);
	}
	return zfile_said_if_corrupt(f, slot, err);
}

/*
 * Buffers of reads that failed with their ring: the kernel may still write
 * them, so they are never freed.  They stay listed (reachable) here.
 */
static struct orphan {
	struct orphan *next;
	void *buf, *runs;
} * orphans;
static pthread_mutex_t orphans_lock = PTHREAD_MUTEX_INITIALIZER;

void backing_keep_orphaned(void *buf, void *runs)
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
		backing_keep_orphaned(io->buf, io->runs);
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

/*
 * Frame fr's compressed bytes into a buffer of the cache's pool (*buf, of
 * *buf_len bytes, set even on failure), for g: O_DIRECT where the file is
 * read so (widened to DIO_ALIGN at both ends, *src where the frame starts
 * in it), else uncached.  0 or -errno.
 */
static int frame_read(struct zfile *f, const struct zseek_frame *fr,
		      struct group *g, uint8_t **buf, size_t *buf_len,
		      uint8_t **src)
{
	bool direct = !f->obj && f->dfd >= 0 &&
		      atomic_load_explicit(&f->direct, memory_order_relaxed);
	uint64_t lead = direct ? fr->c_off & (DIO_ALIGN - 1) : 0;
	struct ring_read r = {.off = fr->c_off - lead, .len = fr->c_size};
	ssize_t n;

	if (direct)
		r.len = (lead + fr->c_size + DIO_ALIGN - 1) &
			~(uint64_t)(DIO_ALIGN - 1);
	*buf_len = r.len + (direct ? DIO_ALIGN : 0);
	*buf = cache_buf_get(f->mapping->cache, *buf_len);
	if (!*buf)
		return -ENOMEM;
	r.dst = *buf + (direct ? -(uintptr_t)*buf & (DIO_ALIGN - 1) : 0);
	*src = r.dst + lead;
	if (direct) {
		/* counted when asked, as a batch's runs are */
		stat_mod(g, STAT_BACKING_DIRECT, (long)fr->c_size);
		n = pread(f->dfd, r.dst, r.len, (off_t)r.off);
		r.res = n < 0 ? -errno : (int)fault_apply(n, r.len);
		r.res = (int)fault_direct(r.res);
		direct_complete(f, &r, lead + fr->c_size);
	} else {
		n = backing_pread(f, r.dst, r.len, r.off);
		r.res = (int)n;
	}
	stat_mod(g, STAT_BACKING_BYTES, (long)fr->c_size);
	if (r.res < 0)
		return r.res;
	return (uint64_t)r.res >= lead + fr->c_size ? 0 : -EIO;
}

/* One folio's content into buf for g, its file's fd held. */
static int read_one_folio(struct zfile *f, struct mapping *m,
			  unsigned long index, void *buf, struct group *g)
{
	uint32_t len = mapping_folio_len(m, index);
	struct zseek_frame fr;
	ZSTD_DCtx *dctx;
	uint8_t *io = NULL, *src;
	size_t io_len = 0;
	int r;

	if (f->idx.kind == ZSEEK_RAW)
		return raw_folio_read(f, buf, len, mapping_folio_pos(m, index),
				      g);
	if (atomic_load(&f->table_lies))
		return -EBADMSG;
	if (zfile_slot_split(f, index))
		return zfile_read_split(f, index, buf, len, NULL);
	fr = zseek_frame_at(&f->idx, zfile_slot_frame(f, index));
	dctx = dctx_of();
	if (!dctx)
		return -ENOMEM;
	if (ccache_has(m, index)) {
		io_len = fr.c_size;
		io = src = cache_buf_get(m->cache, io_len);
		if (io && ccache_get(m, index, src, fr.c_size, g)) {
			r = zseek_decode_frame(dctx, &fr, f->idx.has_checksum,
					       src, buf);
			cache_buf_put(m->cache, io, io_len);
			return r;
		}
		cache_buf_put(m->cache, io, io_len);
		io = NULL;
		io_len = 0;
	}
	r = frame_read(f, &fr, g, &io, &io_len, &src);
	if (!r)
		r = zseek_decode_frame(dctx, &fr, f->idx.has_checksum, src,
				       buf);
	if (!r)
		ccache_offer(m, index, src, fr.c_size, g);
	cache_buf_put(m->cache, io, io_len);
	return r;
}

static int zfile_read_into(struct mapping *m, void *io_ctx, unsigned long index,
			   void *buf, struct group *g)
{
	struct zfile *f = m->host;
	int r = zfile_fd_get(f);

	(void)io_ctx; /* every thread decodes with its own context */
	if (r)
		return r;
	r = zfile_said_if_corrupt(f, index,
				  read_one_folio(f, m, index, buf, g));
	zfile_fd_put(f);
	return r;
}

/* The mapping's last reference: the zfile goes with it. */
static void zfile_release(struct mapping *m)
{
	struct zfile *f = m->host;

	meta_charge(f->ds, -f->meta_bytes);
	zfile_streams_release(f);
	zseek_index_free(&f->idx);
	free(f->starts);
	free(f->slot_frame);
	free(f->slot_skip);
	free(f->parts);
	free(f->raw_at);
	free((void *)atomic_load(&f->failed));
	zfile_zero_sig_free(f);
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
