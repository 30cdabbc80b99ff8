// SPDX-License-Identifier: MIT
/*
 * The FUSE low-level operations: translate requests, do nothing else.
 *
 * Errors inside zfolio are negative errno values; here they become replies.
 * Every operation that would change the tree gets EROFS.  File data goes
 * through the cache (cache_read), which replies with iovecs that point into
 * folios, so userspace copies nothing.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "internal.h"

enum handle_kind { H_FILE, H_DIR, H_CTL };

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

/*
 * Every handle starts with its kind and a link on the dataset's list of
 * open handles: a lazily unmounted mount may end without the kernel
 * sending their releases, and the daemon frees what is left at exit.
 */
struct handle_hdr {
	enum handle_kind kind;
	struct cds_list_head link;
};

/* A directory: of the manifest (read as it is listed), or listed at open. */
struct dir_handle {
	struct handle_hdr hdr;
	bool in_manifest;
	struct mf_dir md;
	struct dir_entry *e;
	size_t n;
};

struct ctl_handle {
	struct handle_hdr hdr;
	char *buf;
	size_t len;
};

struct zfile_handle {
	struct handle_hdr hdr;
	struct zhandle h;
};

/* What a listing of ino reads from: the manifest, or the names now. */
static int dir_list(struct dataset *ds, fuse_ino_t ino, struct dir_handle *h)
{
	h->in_manifest =
		ds->mf && (ino == FUSE_ROOT_ID || manifest_ino(ds, ino));
	if (h->in_manifest)
		return manifest_opendir(ds, ino, &h->md);
	return dataset_list(ds, znode_of(ds, ino), &h->e, &h->n);
}

static void dir_unlist(struct dir_handle *h)
{
	if (h->in_manifest)
		manifest_closedir(&h->md);
	else
		dataset_list_free(h->e, h->n);
}

static void handle_track(struct dataset *ds, struct handle_hdr *h,
			 enum handle_kind kind)
{
	h->kind = kind;
	pthread_mutex_lock(&ds->handles_lock);
	cds_list_add(&h->link, &ds->handles);
	pthread_mutex_unlock(&ds->handles_lock);
}

static void handle_free(struct dataset *ds, struct handle_hdr *h)
{
	pthread_mutex_lock(&ds->handles_lock);
	cds_list_del(&h->link);
	pthread_mutex_unlock(&ds->handles_lock);
	switch (h->kind) {
	case H_DIR: {
		struct dir_handle *d = (struct dir_handle *)h;

		dir_unlist(d);
		break;
	}
	case H_CTL:
		free(((struct ctl_handle *)h)->buf);
		break;
	case H_FILE: {
		struct zfile_handle *f = (struct zfile_handle *)h;

		file_ra_destroy(&f->h.ra);
		if (f->h.file)
			zfile_put(f->h.file);
		break;
	}
	}
	free(h);
}

/* At exit: the handles the kernel never released. */
void handles_free_all(struct dataset *ds)
{
	while (!cds_list_empty(&ds->handles))
		handle_free(ds, cds_list_entry(ds->handles.next,
					       struct handle_hdr, link));
}

static struct dataset *ds_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

static bool is_ctl(const struct znode *n)
{
	return n->kind == ZN_CTL_DIR || n->kind == ZN_CTL_FILE;
}

static void fill_entry(struct dataset *ds, struct znode *n,
		       struct fuse_entry_param *e, const struct stat *st)
{
	memset(e, 0, sizeof(*e));
	e->ino = n->nodeid;
	e->attr = *st;
	e->attr_timeout = is_ctl(n) ? 0 : ds->attr_timeout;
	e->entry_timeout = is_ctl(n) ? 0 : ds->attr_timeout;
}

/*
 * A manifest never changes under the mount: the kernel may keep its names
 * and attributes as long as it likes (a tree's inodes may change, 1 s).
 */
#define MANIFEST_TIMEOUT (24 * 3600.0)

/* A manifest inode's entry: its node id is its inode number. */
static void fill_manifest_entry(struct fuse_entry_param *e,
				const struct stat *st)
{
	memset(e, 0, sizeof(*e));
	e->ino = st->st_ino;
	e->attr = *st;
	e->attr_timeout = MANIFEST_TIMEOUT;
	e->entry_timeout = MANIFEST_TIMEOUT;
}

/*
 * A lookup that failed with err.  A name that is not there (-ENOENT) is a
 * negative entry (node id 0) the kernel remembers for timeout seconds, as
 * long as names that are there: a program that looks for a file along a
 * path (a compiler's include path, a shell's PATH) asks the daemon once,
 * not every time.  Other errors, and timeout 0, are not remembered.
 */
static void lookup_failed(fuse_req_t req, int err, double timeout)
{
	struct fuse_entry_param e;

	if (err != -ENOENT || timeout <= 0) {
		fuse_reply_err(req, -err);
		return;
	}
	memset(&e, 0, sizeof(e));
	e.entry_timeout = timeout;
	fuse_reply_entry(req, &e);
}

/* Is this lookup the manifest's (not the control directory's)? */
static bool manifest_parent(struct dataset *ds, fuse_ino_t parent,
			    const char *name)
{
	if (!ds->mf)
		return false;
	if (parent == FUSE_ROOT_ID)
		return !ds->ctl_root || strcmp(name, ds->opt->ctl);
	return manifest_ino(ds, parent);
}

static void zf_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct dataset *ds = ds_of(req);
	struct fuse_entry_param e;
	struct znode *n, *dir;
	struct stat st;
	int err;

	if (manifest_parent(ds, parent, name)) {
		err = manifest_lookup(ds, parent, name, &st);
		if (err) {
			lookup_failed(req, err, MANIFEST_TIMEOUT);
			return;
		}
		fill_manifest_entry(&e, &st);
		fuse_reply_entry(req, &e);
		return;
	}
	dir = znode_of(ds, parent);
	n = dataset_lookup(ds, dir, name, &st, &err);
	if (!n) {
		lookup_failed(req, err, is_ctl(dir) ? 0 : ds->attr_timeout);
		return;
	}
	fill_entry(ds, n, &e, &st);
	fuse_reply_entry(req, &e);
}

/* Manifest inodes are not allocated: nothing to forget but what the
 * kernel tier counted (the kernel's pages went with its inode). */
static void forget_one(struct dataset *ds, fuse_ino_t ino, uint64_t nlookup)
{
	if (!manifest_ino(ds, ino))
		znode_forget(ds, znode_of(ds, ino), nlookup);
	else
		ktier_forget(&ds->cache, ino);
}

static void zf_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	forget_one(ds_of(req), ino, nlookup);
	fuse_reply_none(req);
}

static void zf_forget_multi(fuse_req_t req, size_t count,
			    struct fuse_forget_data *forgets)
{
	struct dataset *ds = ds_of(req);

	for (size_t i = 0; i < count; i++)
		forget_one(ds, forgets[i].ino, forgets[i].nlookup);
	fuse_reply_none(req);
}

static void zf_getattr(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	struct dataset *ds = ds_of(req);
	struct znode *n;
	struct stat st;
	int err;

	(void)fi;
	if (ds->mf && (ino == FUSE_ROOT_ID || manifest_ino(ds, ino))) {
		err = manifest_stat(ds, ino, &st);
		if (err)
			fuse_reply_err(req, -err);
		else
			fuse_reply_attr(req, &st, MANIFEST_TIMEOUT);
		return;
	}
	n = znode_of(ds, ino);
	err = znode_stat(ds, n, &st);
	if (err)
		fuse_reply_err(req, -err);
	else
		fuse_reply_attr(req, &st, is_ctl(n) ? 0 : ds->attr_timeout);
}

static void zf_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
		       int to_set, struct fuse_file_info *fi)
{
	struct dataset *ds = ds_of(req);
	struct znode *n = manifest_ino(ds, ino) ? NULL : znode_of(ds, ino);
	struct stat st;

	(void)attr;
	(void)fi;
	/* "echo 1G > memory.max" truncates first: that is not a change */
	if (n && n->kind == ZN_CTL_FILE && !(to_set & ~(FUSE_SET_ATTR_SIZE |
						  FUSE_SET_ATTR_ATIME_NOW |
						  FUSE_SET_ATTR_MTIME_NOW))) {
		ctl_stat(ds, n, &st);
		fuse_reply_attr(req, &st, 0);
		return;
	}
	fuse_reply_err(req, EROFS);
}

static void zf_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct dataset *ds = ds_of(req);
	char buf[PATH_MAX + 1];
	int err = manifest_ino(ds, ino)
			  ? manifest_readlink(ds, ino, buf, sizeof(buf))
			  : dataset_readlink(ds, znode_of(ds, ino), buf,
					     sizeof(buf));

	if (err)
		fuse_reply_err(req, -err);
	else
		fuse_reply_readlink(req, buf);
}

static void zf_opendir(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	struct dataset *ds = ds_of(req);
	struct dir_handle *h;
	int err;

	/* as for files (zf_init): the kernel keeps listings itself, and a
	 * listing is read by inode (readdir_common()) */
	if (atomic_load(&ds->kernel_opens)) {
		fuse_reply_err(req, ENOSYS);
		return;
	}
	h = calloc(1, sizeof(*h));
	if (!h) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	err = dir_list(ds, ino, h);
	if (err) {
		free(h);
		fuse_reply_err(req, -err);
		return;
	}
	handle_track(ds, &h->hdr, H_DIR);
	fi->fh = (uint64_t)(uintptr_t)h;
	fi->cache_readdir = manifest_ino(ds, ino) || !is_ctl(znode_of(ds, ino));
	/* a manifest's directory never changes: its listing stays cached
	 * across opens (without keep_cache each open drops it) */
	fi->keep_cache = h->in_manifest;
	fuse_reply_open(req, fi);
}

/* readdirplus's attributes for an entry of a tree's directory: a lookup. */
static void plus_entry(struct dataset *ds, fuse_ino_t dir,
		       const struct dir_entry *d, struct fuse_entry_param *e)
{
	struct znode *n;
	struct stat st;
	int err;

	n = dataset_lookup(ds, znode_of(ds, dir), d->name, &st, &err);
	if (n)
		fill_entry(ds, n, e, &st);
}

/* A readdir reply being filled. */
struct dir_reply {
	fuse_req_t req;
	struct dataset *ds;
	fuse_ino_t ino;
	bool plus;
	char *p;
	size_t rem;
};

/*
 * One entry into the reply (the next at offset next): false if it does
 * not fit.  readdirplus's attributes are st, else d's (plus_entry()).
 */
static bool reply_entry(struct dir_reply *r, const char *name, mode_t type,
			ino_t ino, const struct stat *st,
			const struct dir_entry *d, off_t next)
{
	struct fuse_entry_param e = {0};
	size_t need;

	e.attr.st_mode = type;
	/* readdir(3) skips entries whose inode number is 0 */
	e.attr.st_ino = ino ? ino : r->ino;
	if (!r->plus) {
		need = fuse_add_direntry(r->req, r->p, r->rem, name, &e.attr,
					 next);
		if (need > r->rem)
			return false;
	} else {
		need = fuse_add_direntry_plus(r->req, NULL, 0, name, NULL, 0);
		if (need > r->rem)
			return false;
		if (st)
			fill_manifest_entry(&e, st);
		else if (d)
			plus_entry(r->ds, r->ino, d, &e);
		fuse_add_direntry_plus(r->req, r->p, r->rem, name, &e, next);
	}
	r->p += need;
	r->rem -= need;
	return true;
}

/* A manifest directory's k-th entry, at offset k + 2 ("." and ".." first). */
static int reply_mf_entry(void *arg, const struct mf_entry *e, uint64_t k)
{
	struct dir_reply *r = arg;

	/* the control directory shadows it, as in a tree */
	if (r->ino == FUSE_ROOT_ID && r->ds->ctl_root &&
	    !strcmp(e->name, r->ds->opt->ctl))
		return 0;
	return !reply_entry(arg, e->name, e->st.st_mode & S_IFMT,
			    e->st.st_ino, &e->st, NULL, (off_t)k + 3);
}

static void readdir_common(fuse_req_t req, fuse_ino_t ino, size_t size,
			   off_t off, struct fuse_file_info *fi, bool plus)
{
	struct dataset *ds = ds_of(req);
	struct dir_handle *h = (struct dir_handle *)(uintptr_t)fi->fh;
	struct dir_handle unopened = {0};
	char *buf = malloc(size);
	struct dir_reply r = {req, ds, ino, plus, buf, size};
	size_t i = off < 0 ? 0 : (size_t)off;
	int err = 0;

	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	/* opened by the kernel itself (kernel_opens): listed for this part */
	if (!h) {
		h = &unopened;
		err = dir_list(ds, ino, h);
		if (err) {
			free(buf);
			fuse_reply_err(req, -err);
			return;
		}
	}
	for (; i < 2; i++)
		if (!reply_entry(&r, i ? ".." : ".", S_IFDIR, ino, NULL, NULL,
				 (off_t)i + 1))
			goto out;
	if (h->in_manifest)
		err = manifest_readdir(ds, &h->md, i - 2, reply_mf_entry, &r);
	for (; !h->in_manifest && i < h->n + 2; i++) {
		const struct dir_entry *d = &h->e[i - 2];

		if (!reply_entry(&r, d->name, d->type, d->ino, NULL, d,
				 (off_t)i + 1))
			break;
	}
out:
	/* what fitted goes; an error only if nothing did */
	if (err && r.rem == size)
		fuse_reply_err(req, -err);
	else
		fuse_reply_buf(req, buf, size - r.rem);
	free(buf);
	if (h == &unopened)
		dir_unlist(h);
}

static void zf_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	readdir_common(req, ino, size, off, fi, false);
}

static void zf_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size,
			   off_t off, struct fuse_file_info *fi)
{
	readdir_common(req, ino, size, off, fi, true);
}

static void zf_releasedir(fuse_req_t req, fuse_ino_t ino,
			  struct fuse_file_info *fi)
{
	struct dir_handle *h = (struct dir_handle *)(uintptr_t)fi->fh;

	(void)ino;
	handle_free(ds_of(req), &h->hdr);
	fuse_reply_err(req, 0);
}

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

static void zf_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
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
	cache_read(&w->rq.rq, reply_iov, req);
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

static void zf_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
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

static void zf_write(fuse_req_t req, fuse_ino_t ino, const char *buf,
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
static void zf_ioctl(fuse_req_t req, fuse_ino_t ino, int cmd, void *arg,
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

static void zf_release(fuse_req_t req, fuse_ino_t ino,
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
static void zf_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, ENOSYS);
}

/* The dataset's size and entries, nothing free: see usage.c. */
static void zf_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct dataset *ds = ds_of(req);
	struct statvfs sv = {0};
	uint64_t bytes, entries;

	(void)ino;
	dataset_usage(ds, &bytes, &entries);
	sv.f_bsize = sv.f_frsize = ZF_PAGE_SIZE;
	sv.f_blocks = (fsblkcnt_t)pages_of_bytes(bytes);
	sv.f_files = (fsfilcnt_t)entries;
	sv.f_namemax = 255;
	fuse_reply_statfs(req, &sv);
}

/*
 * Extended attributes, from the manifest of a dataset that has some.  Any
 * other answers ENOSYS, once, and the kernel answers EOPNOTSUPP itself
 * from then on (ls -l asks for ACLs of every file otherwise).
 */
static void xattr_request(fuse_req_t req, fuse_ino_t ino, const char *name,
			  size_t size)
{
	struct dataset *ds = ds_of(req);
	char *buf;
	ssize_t n;

	if (!ds->mf || !ds->mf->xattrs) {
		fuse_reply_err(req, ENOSYS);
		return;
	}
	buf = size ? malloc(size) : NULL;
	if (size && !buf)
		n = -ENOMEM;
	else if (name)
		n = manifest_getxattr(ds, ino, name, buf, size);
	else
		n = manifest_listxattr(ds, ino, buf, size);
	if (n < 0)
		fuse_reply_err(req, (int)-n);
	else if (!size)
		fuse_reply_xattr(req, (size_t)n);
	else
		fuse_reply_buf(req, buf, (size_t)n);
	free(buf);
}

static void zf_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			size_t size)
{
	xattr_request(req, ino, name, size);
}

static void zf_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	xattr_request(req, ino, NULL, size);
}

/* Everything that would change the tree. */
static void erofs_mknod(fuse_req_t req, fuse_ino_t p, const char *n, mode_t m,
			dev_t d)
{
	(void)p, (void)n, (void)m, (void)d;
	fuse_reply_err(req, EROFS);
}

static void erofs_mkdir(fuse_req_t req, fuse_ino_t p, const char *n, mode_t m)
{
	(void)p, (void)n, (void)m;
	fuse_reply_err(req, EROFS);
}

static void erofs_unlink(fuse_req_t req, fuse_ino_t p, const char *n)
{
	(void)p, (void)n;
	fuse_reply_err(req, EROFS);
}

static void erofs_symlink(fuse_req_t req, const char *l, fuse_ino_t p,
			  const char *n)
{
	(void)l, (void)p, (void)n;
	fuse_reply_err(req, EROFS);
}

static void erofs_rename(fuse_req_t req, fuse_ino_t p, const char *n,
			 fuse_ino_t np, const char *nn, unsigned int f)
{
	(void)p, (void)n, (void)np, (void)nn, (void)f;
	fuse_reply_err(req, EROFS);
}

static void erofs_link(fuse_req_t req, fuse_ino_t i, fuse_ino_t p,
		       const char *n)
{
	(void)i, (void)p, (void)n;
	fuse_reply_err(req, EROFS);
}

static void erofs_create(fuse_req_t req, fuse_ino_t p, const char *n,
			 mode_t m, struct fuse_file_info *fi)
{
	(void)p, (void)n, (void)m, (void)fi;
	fuse_reply_err(req, EROFS);
}

static void erofs_setxattr(fuse_req_t req, fuse_ino_t i, const char *n,
			   const char *v, size_t s, int f)
{
	(void)i, (void)n, (void)v, (void)s, (void)f;
	fuse_reply_err(req, EROFS);
}

static void erofs_removexattr(fuse_req_t req, fuse_ino_t i, const char *n)
{
	(void)i, (void)n;
	fuse_reply_err(req, EROFS);
}

static void erofs_fallocate(fuse_req_t req, fuse_ino_t i, int m, off_t o,
			    off_t l, struct fuse_file_info *fi)
{
	(void)i, (void)m, (void)o, (void)l, (void)fi;
	fuse_reply_err(req, EROFS);
}

static void zf_init(void *userdata, struct fuse_conn_info *conn)
{
	struct dataset *ds = userdata;
	unsigned int kra = options_kernel_ra_kb(ds->opt);

	/*
	 * The kernel's own readahead and read-around: kept to a page with
	 * cache=engine, so that zfolio reads around into its cache, under its
	 * budget.  With cache=kernel it sizes the fills of the kernel tier;
	 * INIT can only lower it, mount.c raises it past 128 KiB.
	 */
	if (kra * 1024u < conn->max_readahead)
		conn->max_readahead = kra * 1024u;
	/* read-only data never changes under the kernel's page cache */
	if (conn->capable & FUSE_CAP_CACHE_SYMLINKS)
		conn->want |= FUSE_CAP_CACHE_SYMLINKS;
	conn->want &= ~(unsigned)FUSE_CAP_AUTO_INVAL_DATA;
	/* a dataset with extended attributes may have ACLs: the kernel then
	 * asks for them and checks access by them, as on the source */
	if (ds->mf && ds->mf->xattrs && (conn->capable & FUSE_CAP_POSIX_ACL))
		conn->want |= FUSE_CAP_POSIX_ACL;
	/*
	 * A packed dataset on a read-only mount with the kernel tier: files
	 * need no open of zfolio's.  OPEN answered ENOSYS (zf_open) tells the
	 * kernel to open files itself from then on, keeping their page cache,
	 * and to send neither OPEN nor RELEASE: two round trips less for
	 * every file opened, and a warm file is read with none
	 * (doc/BENCHMARKS.md, section 8).  A read finds its file by inode.
	 * On a rw mount an open for writing must still be refused; a tree's
	 * files are checked for change at open; a store's are read ahead per
	 * open file: they all keep their opens.  Control files then have no
	 * handle either: ctl.c makes their text at lookup, and their time
	 * changes with it, which drops their cached pages (auto_inval_data;
	 * a manifest's attributes never change).
	 */
	atomic_store(&ds->kernel_opens,
		     ds->mf && !ds->store && ds->opt->read_only &&
		     ds->opt->cache == CACHE_KERNEL &&
		     (conn->capable & FUSE_CAP_NO_OPEN_SUPPORT) &&
		     (conn->capable & FUSE_CAP_NO_OPENDIR_SUPPORT) &&
		     (conn->capable & FUSE_CAP_AUTO_INVAL_DATA));
	if (atomic_load(&ds->kernel_opens))
		conn->want |= FUSE_CAP_AUTO_INVAL_DATA;
	/*
	 * A manifest has every entry's attributes at hand: readdirplus for
	 * every part of a listing, not the kernel's guess (plus for the first
	 * part, then only after a lookup in between), which left find, du
	 * and tar a LOOKUP per entry past the first part; a bare `ls -f`
	 * pays for attributes it does not use (doc/BENCHMARKS.md, section
	 * 8).  A tree's attributes cost a look into each .zst: there the
	 * kernel guesses.
	 */
	if (ds->mf)
		conn->want &= ~(unsigned)FUSE_CAP_READDIRPLUS_AUTO;
	/* zfolioctl writes control files by an ioctl on their directory */
	if (conn->capable & FUSE_CAP_IOCTL_DIR)
		conn->want |= FUSE_CAP_IOCTL_DIR;
}

const struct fuse_lowlevel_ops zfolio_ops = {
	.init = zf_init,
	.lookup = zf_lookup,
	.forget = zf_forget,
	.forget_multi = zf_forget_multi,
	.getattr = zf_getattr,
	.setattr = zf_setattr,
	.readlink = zf_readlink,
	.mknod = erofs_mknod,
	.mkdir = erofs_mkdir,
	.unlink = erofs_unlink,
	.rmdir = erofs_unlink,
	.symlink = erofs_symlink,
	.rename = erofs_rename,
	.link = erofs_link,
	.open = zf_open,
	.read = zf_read,
	.write = zf_write,
	.ioctl = zf_ioctl,
	.flush = zf_flush,
	.release = zf_release,
	.opendir = zf_opendir,
	.readdir = zf_readdir,
	.readdirplus = zf_readdirplus,
	.releasedir = zf_releasedir,
	.statfs = zf_statfs,
	.setxattr = erofs_setxattr,
	.getxattr = zf_getxattr,
	.listxattr = zf_listxattr,
	.removexattr = erofs_removexattr,
	.create = erofs_create,
	.fallocate = erofs_fallocate,
};
