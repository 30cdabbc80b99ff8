// SPDX-License-Identifier: MIT
/*
 * The FUSE operations on files: opens, reads and releases of dataset
 * files and control files.  File data goes through the cache (cache_read),
 * which replies with iovecs that point into folios.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

/*
 * Whether a read is for a reader (direct I/O: a read() of a direct_io file,
 * or of any file opened O_DIRECT), not a fill of the kernel's page cache
 * (readahead, a fault).  The kernel sends direct I/O with the reader's lock
 * owner (FUSE_READ_LOCKOWNER, which libfuse hands on as fi->lock_owner), a
 * page-cache fill with none.
 */
static bool read_for_reader(const struct fuse_file_info *fi)
{
	return fi->lock_owner != 0;
}

/* Whether req's sender may write control files: root, or the mount's
 * owner. */
static bool may_write_ctl(fuse_req_t req, struct dataset *ds)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);

	return ctx->uid == 0 || ctx->uid == ds->owner;
}

static void open_ctl(fuse_req_t req, struct dataset *ds, struct znode *n,
		     struct fuse_file_info *fi)
{
	struct ctl_handle *h = calloc(1, sizeof(*h));
	int acc = fi->flags & O_ACCMODE, err = 0;

	if (!h) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (acc != O_RDONLY && !may_write_ctl(req, ds))
		err = -EACCES;
	else if (acc != O_WRONLY)
		err = ctl_read(ds, n, &h->buf, &h->len);
	if (err) {
		free(h);
		fuse_reply_err(req, -err);
		return;
	}
	handle_track(ds, &h->hdr, H_CTL);
	fi->fh = (uint64_t)(uintptr_t)h;
	fi->direct_io = 1;
	fuse_reply_open(req, fi);
}

/*
 * The open file: f's content [base, base + size) (f NULL: empty).  With
 * cache=kernel the page cache is kept across opens, unless the backing
 * file changed since it was filled: then the kernel drops it at this open
 * (no keep_cache), and the kernel tier stops counting it.
 */
static void open_data(fuse_req_t req, struct dataset *ds,
		      struct fuse_file_info *fi, struct znode *n,
		      struct zfile *f, uint64_t base, uint64_t size)
{
	struct zfile_handle *h = NULL;

	/* its seek table was caught lying (backing.c): no new opens */
	if (f && atomic_load(&f->table_lies)) {
		zfile_put(f);
		fuse_reply_err(req, EIO);
		return;
	}
	h = calloc(1, sizeof(*h));
	if (!h) {
		if (f)
			zfile_put(f);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	h->h.node = n;
	h->h.file = f;
	h->h.base = base;
	h->h.size = size;
	file_ra_init(&h->h.ra, ds->opt->ra_kb / 4);
	handle_track(ds, &h->hdr, H_FILE);
	fi->fh = (uint64_t)(uintptr_t)h;
	if (ds->opt->cache == CACHE_ENGINE) {
		fi->direct_io = 1;
		/* no keep_cache: the kernel drops the file's pages now */
		if (f)
			mapping_forget_kernel(f->mapping);
	} else if (n && atomic_exchange(&n->file_changed, false)) {
		ktier_forget(&ds->cache, n->nodeid);
	} else {
		fi->keep_cache = 1;
	}
	fuse_reply_open(req, fi);
}

void zf_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct dataset *ds = ds_of(req);
	struct znode *n;
	struct zfile *f;
	uint64_t base, size;
	struct file_ra_state *pack_ra; /* unused: a handle has its own */
	int err;

	/* the kernel opens files itself from now on: see zf_init() */
	if (atomic_load(&ds->kernel_opens)) {
		fuse_reply_err(req, ENOSYS);
		return;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
		n = manifest_ino(ds, ino) ? NULL : znode_of(ds, ino);
		if (n && n->kind == ZN_CTL_FILE)
			open_ctl(req, ds, n, fi);
		else
			fuse_reply_err(req, EROFS);
		return;
	}
	if (manifest_ino(ds, ino)) {
		err = manifest_open_file(ds, ino, &f, &base, &size, &pack_ra);
		if (err)
			fuse_reply_err(req, -err);
		else
			open_data(req, ds, fi, NULL, f, base, size);
		return;
	}
	n = znode_of(ds, ino);
	if (n->kind == ZN_CTL_FILE) {
		open_ctl(req, ds, n, fi);
		return;
	}
	if (n->kind != ZN_FILE) {
		fuse_reply_err(req, n->kind == ZN_DIR ? EISDIR : EACCES);
		return;
	}
	err = znode_file(ds, n, true, &f);
	if (err)
		fuse_reply_err(req, -err);
	else
		open_data(req, ds, fi, n, f, 0, f->mapping->size);
}

static int reply_iov(void *arg, const struct iovec *iov, int cnt)
{
	fuse_req_t req = arg;

	if (!iov)
		return cnt < 0 ? fuse_reply_err(req, -cnt)
			       : fuse_reply_buf(req, NULL, 0);
	return fuse_reply_iov(req, iov, cnt);
}

/*
 * A read from a store that the reader interrupts (Ctrl-C: the kernel sends
 * FUSE_INTERRUPT, and waits for the reply even for a fatal signal) stops
 * waiting for its requests, and fails: it is not held up by a stalled
 * server's timeout and retries.  libfuse calls this under the request's
 * lock, never after read_unwatch() has returned.
 */
static void read_interrupted(fuse_req_t req, void *data)
{
	struct worker *w = data;

	if (atomic_load(&w->watched) == req)
		atomic_store(&w->interrupted, true);
}

static void read_watch(fuse_req_t req, struct worker *w)
{
	atomic_store(&w->interrupted, false);
	atomic_store(&w->watched, req);
	fuse_req_interrupt_func(req, read_interrupted, w);
	store_wait_abort = &w->interrupted;
}

/* Before the reply, which frees the request. */
static void read_unwatch(fuse_req_t req, struct worker *w)
{
	fuse_req_interrupt_func(req, NULL, NULL);
	atomic_store(&w->watched, NULL);
	store_wait_abort = NULL;
}

static int reply_watched(void *arg, const struct iovec *iov, int cnt)
{
	fuse_req_t req = arg;

	read_unwatch(req, current_worker);
	return reply_iov(arg, iov, cnt);
}

static void read_ctl(fuse_req_t req, struct ctl_handle *h, size_t size,
		     off_t off)
{
	char *copy;

	if (!h->buf) {
		fuse_reply_err(req, EBADF);
		return;
	}
	if ((size_t)off >= h->len) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	if (size > h->len - (size_t)off)
		size = h->len - (size_t)off;
	/*
	 * Reply from a copy this request owns: once the kernel has the
	 * reply, the reader may close and release the handle at once, while
	 * writev has not returned yet (and sanitizers look at the buffer
	 * after it has).
	 */
	copy = malloc(size);
	if (!copy) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	memcpy(copy, h->buf + off, size);
	fuse_reply_buf(req, copy, size);
	free(copy);
}

/*
 * cache=kernel: every read is a page-cache fill for the kernel tier (but
 * direct I/O, which read_data() serves from zfolio's cache), sized
 * by the kernel's own readahead (kernel_ra_kb): zfolio reads just what it
 * asks for, with no second readahead on top.  But the small files of a
 * pack read without opens (kernel_opens) share their pack's readahead,
 * since the kernel's window ends with each file: a scan of them reads the
 * pack ahead as a stream (fs/push.c pushes what it brings in).  And for a
 * dataset in a store,
 * where each read is a request, zfolio's readahead runs on the fills too,
 * so that a stream's frames come in windows of ra_kb (4 MiB by default),
 * one request each, into zfolio's cache, and leave it as the kernel's
 * fills take them whole.  The kernel has put the
 * fill's pages in its page cache before sending the request, so they are
 * charged first: the budget counts fills in flight too.  The fill ends
 * when the kernel has the reply (worker_reply_out(): after the writev on
 * /dev/fuse, after the next submission over io_uring), never before: until
 * then its pages are locked, and must not be dropped (cache/ktier.c).
 */
static void read_tiered(fuse_req_t req, struct dataset *ds,
			struct zfile_handle *h, struct group *g,
			struct worker *w, fuse_ino_t ino, size_t size,
			off_t off)
{
	ktier_fill_begin(&ds->cache, g, ino, h->h.size, (uint64_t)off, size);
	w->fill_due = (struct tier_fill){&ds->cache, ino, (uint64_t)off, size};
	/* caught lying (or a frame of it failed) since read_data() looked:
	 * its ktier_evict_all() may have come before this fill began, and
	 * would not drop it; this one drops it at its end */
	if (zfile_range_refused(h->h.file, h->h.base + (uint64_t)off, size)) {
		zfile_refused(h->h.file);
		fuse_reply_err(req, EIO);
		return;
	}
	fault_hold_fill(ds->se, ino, off, size);
	ra_request_init(&w->rq, h->h.file->mapping,
			h->h.pack_ra ? h->h.pack_ra
				     : ds->store ? &h->h.ra : NULL,
			g, w,
			h->h.base + (uint64_t)off, size, false);
	w->rq.rq.fill = true;
	w->rq.rq.tiered = true;
	w->rq.rq.tier_id = ino;
	w->rq.rq.tier_base = h->h.base;
	w->rq.rq.tier_size = h->h.size;
	cache_read(&w->rq.rq, reply_iov, req);
}

static void read_data(fuse_req_t req, struct dataset *ds,
		      struct zfile_handle *h, fuse_ino_t ino, size_t size,
		      off_t off, struct fuse_file_info *fi)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct worker *w = current_worker;
	struct group *g;

	if (off < 0 || !w) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	/* the file is [base, base + size) of its data */
	if (!h->h.file || (uint64_t)off >= h->h.size) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	if (size > h->h.size - (uint64_t)off)
		size = (size_t)(h->h.size - (uint64_t)off);
	/* not even what zfolio's cache holds: it may hold bytes filled from
	 * the wrong place before the table was caught */
	if (zfile_range_refused(h->h.file, h->h.base + (uint64_t)off, size)) {
		zfile_refused(h->h.file);
		fuse_reply_err(req, EIO);
		return;
	}
	g = group_for_request(&ds->cache.budget, ctx->uid, ctx->pid);
	/* an O_DIRECT read puts nothing in the page cache: not a fill */
	if (ds->opt->cache == CACHE_KERNEL && !read_for_reader(fi)) {
		read_tiered(req, ds, h, g, w, ino, size, off);
		return;
	}
	/* in engine mode a page-cache fill is an mmap fault; a file the
	 * kernel opened itself (no handle: its h is made for this read, and
	 * its ra never set up) reads ahead with its pack, or not at all (as
	 * O_DIRECT reads do on the kernel's filesystems) */
	ra_request_init(&w->rq, h->h.file->mapping,
			h->h.pack_ra ? h->h.pack_ra
				     : fi->fh ? &h->h.ra : NULL,
			g, w, h->h.base + (uint64_t)off, size,
			!read_for_reader(fi));
	w->rq.rq.fill = w->rq.rq.fault;
	if (!ds->store) {
		cache_read(&w->rq.rq, reply_iov, req);
		return;
	}
	read_watch(req, w);
	cache_read(&w->rq.rq, reply_watched, req);
}

/*
 * A read of a file the kernel opened itself (kernel_opens): no handle, the
 * file is found by its inode, and holds a reference for this read only.
 */
static void read_unopened(fuse_req_t req, struct dataset *ds, fuse_ino_t ino,
			  size_t size, off_t off, struct fuse_file_info *fi)
{
	struct zfile_handle h = {0};
	struct znode *n;
	size_t len;
	char *copy;
	int err;

	if (off < 0) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	if (manifest_ino(ds, ino)) {
		err = manifest_open_file(ds, ino, &h.h.file, &h.h.base,
					 &h.h.size, &h.h.pack_ra);
		if (err) {
			fuse_reply_err(req, -err);
			return;
		}
		push_on_read(ds, fuse_req_ctx(req)->uid, fuse_req_ctx(req)->pid,
			     ino, h.h.file, h.h.pack_ra, h.h.base,
			     h.h.size, (uint64_t)off);
		read_data(req, ds, &h, ino, size, off, fi);
		if (h.h.file)
			zfile_put(h.h.file);
		return;
	}
	n = znode_of(ds, ino);
	if (n->kind != ZN_CTL_FILE) {
		fuse_reply_err(req, EIO);
		return;
	}
	err = ctl_text_read(ds, n, (uint64_t)off, size, &copy, &len);
	if (err)
		fuse_reply_err(req, -err);
	else
		fuse_reply_buf(req, copy, len);
	free(copy);
}

void zf_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct dataset *ds = ds_of(req);
	struct zfile_handle *h = (struct zfile_handle *)(uintptr_t)fi->fh;

	if (!h) {
		read_unopened(req, ds, ino, size, off, fi);
		return;
	}
	if (h->hdr.kind == H_CTL) {
		read_ctl(req, (struct ctl_handle *)h, size, off);
		return;
	}
	read_data(req, ds, h, ino, size, off, fi);
}

void zf_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
		     size_t size, off_t off, struct fuse_file_info *fi)
{
	struct dataset *ds = ds_of(req);
	struct znode *n = manifest_ino(ds, ino) ? NULL : znode_of(ds, ino);
	int err;

	(void)off;
	(void)fi;
	if (!n || n->kind != ZN_CTL_FILE) {
		fuse_reply_err(req, EROFS);
		return;
	}
	if (!may_write_ctl(req, ds)) {
		fuse_reply_err(req, EACCES);
		return;
	}
	err = ctl_write(ds, n, buf, size);
	if (err)
		fuse_reply_err(req, -err);
	else
		fuse_reply_write(req, size);
}

/* ZF_IOC_CTL_WRITE on a control directory: the write of one of its files. */
void zf_ioctl(fuse_req_t req, fuse_ino_t ino, int cmd, void *arg,
		     struct fuse_file_info *fi, unsigned int flags,
		     const void *in, size_t in_size, size_t out_size)
{
	struct dataset *ds = ds_of(req);
	struct znode *dir = manifest_ino(ds, ino) ? NULL : znode_of(ds, ino);
	struct zf_ctl_write w;
	int err;

	(void)arg;
	(void)fi;
	(void)out_size;
	if ((unsigned int)cmd != ZF_IOC_CTL_WRITE || !dir ||
	    dir->kind != ZN_CTL_DIR || !(flags & FUSE_IOCTL_DIR) ||
	    in_size != sizeof(w)) {
		fuse_reply_err(req, ENOTTY);
		return;
	}
	if (!may_write_ctl(req, ds)) {
		fuse_reply_err(req, EACCES);
		return;
	}
	memcpy(&w, in, sizeof(w));
	w.name[sizeof(w.name) - 1] = '\0';
	w.value[sizeof(w.value) - 1] = '\0';
	err = ctl_write_named(ds, dir, w.name, w.value);
	if (err)
		fuse_reply_err(req, -err);
	else
		fuse_reply_ioctl(req, 0, NULL, 0);
}

void zf_release(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	struct handle_hdr *h = (struct handle_hdr *)(uintptr_t)fi->fh;

	(void)ino;
	handle_free(ds_of(req), h);
	fuse_reply_err(req, 0);
}

/*
 * Nothing is ever dirty, so nothing to flush: ENOSYS tells the kernel so
 * once, and it sends no more FLUSH at close (one round trip less a file).
 */
void zf_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, ENOSYS);
}


/* The answer of a file without holes of size bytes. */
static int seek_dense(uint64_t size, off_t off, int whence, uint64_t *out)
{
	if ((uint64_t)off >= size)
		return -ENXIO;
	*out = whence == SEEK_DATA ? (uint64_t)off : size;
	return 0;
}

/*
 * SEEK_DATA and SEEK_HOLE: the holes are the frames of zeros (holes.c),
 * where mkzfolio packed the holes of a sparse file.  A file the kernel
 * opened itself (kernel_opens) is found by its inode.
 */
void zf_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
	      struct fuse_file_info *fi)
{
	struct dataset *ds = ds_of(req);
	struct handle_hdr *hdr = (struct handle_hdr *)(uintptr_t)fi->fh;
	struct zhandle h = {0};
	struct ctl_handle *ch;
	struct file_ra_state *pack_ra;
	struct stat st;
	uint64_t out = 0;
	int err;

	if (off < 0) {
		err = -ENXIO;
	} else if (hdr && hdr->kind == H_CTL) {
		ch = (struct ctl_handle *)hdr;
		err = seek_dense(ch->len, off, whence, &out);
	} else if (hdr) {
		h = ((struct zfile_handle *)hdr)->h;
		err = zfile_seek(h.file, h.base, h.size, (uint64_t)off, whence,
				 &out);
	} else if (manifest_ino(ds, ino)) {
		err = manifest_open_file(ds, ino, &h.file, &h.base, &h.size,
					 &pack_ra);
		if (!err)
			err = zfile_seek(h.file, h.base, h.size,
					 (uint64_t)off, whence, &out);
		if (h.file)
			zfile_put(h.file);
	} else {
		err = znode_stat(ds, znode_of(ds, ino), &st);
		if (!err)
			err = seek_dense((uint64_t)st.st_size, off, whence,
					 &out);
	}
	if (err)
		fuse_reply_err(req, -err);
	else
		fuse_reply_lseek(req, (off_t)out);
}
