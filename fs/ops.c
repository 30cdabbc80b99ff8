// SPDX-License-Identifier: MIT
/*
 * The FUSE low-level operations: translate requests, do nothing else.
 *
 * Errors inside zfolio are negative errno values; here they become replies.
 * Every operation that would change the tree gets EROFS.  Opens, reads
 * and releases of files are in fileops.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "ops.h"

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

void handle_track(struct dataset *ds, struct handle_hdr *h,
			 enum handle_kind kind)
{
	h->kind = kind;
	pthread_mutex_lock(&ds->handles_lock);
	cds_list_add(&h->link, &ds->handles);
	pthread_mutex_unlock(&ds->handles_lock);
}

void handle_free(struct dataset *ds, struct handle_hdr *h)
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
	.lseek = zf_lseek,
};
