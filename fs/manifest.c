// SPDX-License-Identifier: MIT
/*
 * A dataset with a manifest (format/manifest.c): the tree is served from
 * the manifest alone.  lookup, getattr, readdir and statfs read its lines
 * through the cache like any file (its frames are folios, charged to the
 * budget and reclaimed like the rest), and open nothing else; a file's
 * data file is opened when the file is, and read at the file's offset in
 * it.
 *
 * Inodes cost nothing: a manifest inode's FUSE node id is its inode number
 * (entry index + 2), so nothing is allocated per inode the kernel looks up
 * and forgets are no-ops.  Entry i is line i % ZMF_FRAME_ENTRIES of frame
 * i / ZMF_FRAME_ENTRIES; the header is the last frame.  A lookup by name
 * is a binary search over the
 * frames' first keys (each found once, when first needed, and kept) and a
 * scan of one frame.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* --- the header and the mount --- */

/* A text field of the header: true with where it is, up to the next tab. */
static bool header_text(const char *line, size_t len, const char *key,
			const char **v, size_t *vlen)
{
	char pat[32];
	size_t n = (size_t)snprintf(pat, sizeof(pat), "\t%s=", key);
	const char *p = memmem(line, len, pat, n), *tab;

	if (!p)
		return false;
	p += n;
	tab = memchr(p, '\t', len - (size_t)(p - line));
	*v = p;
	*vlen = (size_t)((tab ? tab : line + len) - p);
	return true;
}

static int header_value(const char *line, size_t len, const char *key,
			uint64_t *v)
{
	const char *p;
	char *end;
	size_t n;

	if (!header_text(line, len, key, &p, &n))
		return -EBADMSG;
	errno = 0;
	*v = strtoull(p, &end, 10);
	return errno || end == p ? -EBADMSG : 0;
}

struct header_call {
	struct manifest *mf;
};

/* The header's holes=, if there: 0, or -EBADMSG for one that does not
 * parse, whose ids do not ascend, or name no data file. */
static int read_holes(struct manifest *mf, const char *line, size_t len)
{
	const char *p, *end;
	size_t n, cap;
	char *next;

	if (!header_text(line, len, "holes", &p, &n) || !n)
		return 0;
	end = p + n;
	cap = 1;
	for (const char *c = p; c < end; c++)
		cap += *c == ',';
	if (cap > mf->ndata) /* ids ascend, below ndata */
		return -EBADMSG;
	mf->hole_ids = malloc(cap * sizeof(*mf->hole_ids));
	mf->hole_bytes = malloc(cap * sizeof(*mf->hole_bytes));
	if (!mf->hole_ids || !mf->hole_bytes)
		return -ENOMEM;
	while (p < end) {
		uint64_t id, bytes;

		/* digits only: strtoull would take a sign or spaces too */
		if (*p < '0' || *p > '9')
			return -EBADMSG;
		errno = 0;
		id = strtoull(p, &next, 10);
		if (errno || next + 1 >= end || *next != ':' || next[1] < '0' ||
		    next[1] > '9')
			return -EBADMSG;
		bytes = strtoull(next + 1, &next, 10);
		if (errno || next > end || (next < end && *next != ',') ||
		    id >= mf->ndata ||
		    (mf->nholes && id <= mf->hole_ids[mf->nholes - 1]))
			return -EBADMSG;
		mf->hole_ids[mf->nholes] = id;
		mf->hole_bytes[mf->nholes++] = bytes;
		p = next < end ? next + 1 : end;
	}
	return 0;
}

uint64_t manifest_holes(const struct manifest *mf, uint64_t id)
{
	size_t lo = 0, hi = mf->nholes;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (mf->hole_ids[mid] == id)
			return mf->hole_bytes[mid];
		if (mf->hole_ids[mid] < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return 0;
}

static int read_header(const char *p, size_t len, void *arg)
{
	struct manifest *mf = ((struct header_call *)arg)->mf;
	uint64_t v[9];
	const char *xattrs;
	size_t xlen = 0;
	static const char *const keys[] = {"version", "entries", "data",
					   "bytes",   "mode",    "uid",
					   "gid",     "mtime",   "mtime_ns"};
	const char *line;
	size_t n;

	if (!nth_line(p, len, 0, &line, &n) || n < strlen(ZMF_MAGIC) ||
	    memcmp(line, ZMF_MAGIC, strlen(ZMF_MAGIC)) ||
	    (n > strlen(ZMF_MAGIC) && line[strlen(ZMF_MAGIC)] != '\t'))
		return -EBADMSG;
	for (int i = 0; i < 9; i++)
		if (header_value(line, n, keys[i], &v[i]))
			return -EBADMSG;
	if ((v[0] != ZMF_VERSION && v[0] != ZMF_VERSION_XATTRS) ||
	    v[2] > UINT32_MAX)
		return -EPROTO;
	/* every data file holds a file's bytes: no more than the entries
	 * (a header that says more would have them all allocated) */
	if (v[2] > v[1])
		return -EBADMSG;
	mf->xattrs = v[0] == ZMF_VERSION_XATTRS;
	/* its bytes as they are, a NUL among them too (strndup would stop
	 * there, short of xlen): the field's parser judges them */
	if (mf->xattrs && header_text(line, n, "xattrs", &xattrs, &xlen)) {
		mf->root_xattrs = malloc(xlen + 1);
		if (!mf->root_xattrs)
			return -ENOMEM;
		memcpy(mf->root_xattrs, xattrs, xlen);
		mf->root_xattrs[xlen] = '\0';
	}
	mf->root_xlen = mf->root_xattrs ? xlen : 0;
	mf->nentries = v[1];
	mf->ndata = (uint32_t)v[2];
	mf->bytes = v[3];
	mf->root.st_mode = S_IFDIR | (mode_t)(v[4] & 07777);
	mf->root.st_uid = (uid_t)v[5];
	mf->root.st_gid = (gid_t)v[6];
	mf->root.st_mtim.tv_sec = (time_t)v[7];
	mf->root.st_mtim.tv_nsec = (long)(v[8] % 1000000000);
	mf->root.st_atim = mf->root.st_ctim = mf->root.st_mtim;
	/* the root's links: a manifest without them (an older mkzfolio's)
	 * gets the 2 of a root without subdirectories */
	if (header_value(line, n, "nlink", &v[0]) || !v[0] || v[0] > UINT32_MAX)
		v[0] = 2;
	mf->root.st_nlink = (nlink_t)v[0];
	/* its size as the source's showed; 0 from an older mkzfolio */
	if (!header_value(line, n, "size", &v[0]) && v[0] <= INT32_MAX) {
		mf->root.st_size = (off_t)v[0];
		mf->root.st_blocks = (blkcnt_t)((v[0] + 511) / 512);
	}
	return read_holes(mf, line, n);
}

/* The frames the entries need, against what the file has (why not, in
 * why). */
static int check_shape(struct manifest *mf, char *why, size_t whylen)
{
	uint64_t want = (mf->nentries + ZMF_FRAME_ENTRIES - 1) /
				ZMF_FRAME_ENTRIES + 1;

	if (want != mf->zf->mapping->nr_folios || want > UINT32_MAX) {
		snprintf(why, whylen, ": its header counts %llu entries, "
				      "which take %llu frames with the "
				      "header's, and the file has %lu",
			 (unsigned long long)mf->nentries,
			 (unsigned long long)want,
			 mf->zf->mapping->nr_folios);
		return -EBADMSG;
	}
	mf->nframes = (uint32_t)want;
	return 0;
}

/* Open the manifest of the dataset, if it has one: 0, 1 without, or an
 * error (with its reason in err). */
int manifest_open(struct dataset *ds, char *err, size_t errlen)
{
	struct manifest *mf = calloc(1, sizeof(*mf));
	struct header_call hc;
	char why[384] = "";
	int r;

	if (!mf)
		return -ENOMEM;
	cache_thread_register(); /* reads through the cache */
	r = zfile_open_path(ds, ZMF_NAME, &mf->zf, why, sizeof(why));
	if (r == -ENOENT && !ds->store) { /* a tree without one */
		cache_thread_unregister();
		free(mf);
		return 1;
	}
	ds->mf = mf;
	hc.mf = mf;
	if (r && why[0]) { /* it could not be opened */
		cache_thread_unregister();
		if (r == -ENOENT)
			snprintf(err, errlen, "%s: no %s there: a dataset in "
					      "a store must be one mkzfolio "
					      "packed",
				 store_name(ds->store), ZMF_NAME);
		else if (r == -EACCES && ds->store)
			snprintf(err, errlen, "%s: the store refused access "
					      "(%s): check the credentials",
				 store_name(ds->store), why);
		else
			snprintf(err, errlen, "%s", why);
		return r;
	}
	why[0] = '\0';
	if (!r && !mf->zf->mapping->nr_folios) {
		snprintf(why, sizeof(why), ": it holds no frame");
		r = -EBADMSG;
	}
	if (!r) {
		r = mf_frame(ds, (uint32_t)mf->zf->mapping->nr_folios - 1,
			     read_header, &hc);
		if (r == -EBADMSG)
			snprintf(why, sizeof(why), ": its last frame is not "
				 "a %s header line", ZMF_MAGIC);
	}
	if (!r)
		r = check_shape(mf, why, sizeof(why));
	cache_thread_unregister();
	if (!r) {
		mf->keys = calloc(mf->nframes, sizeof(*mf->keys));
		mf->data = calloc(mf->ndata ? mf->ndata : 1, sizeof(*mf->data));
		r = mf->keys && mf->data ? 0 : -ENOMEM;
	}
	pthread_mutex_init(&mf->lru_lock, NULL);
	CDS_INIT_LIST_HEAD(&mf->lru);
	for (uint32_t i = 0; !r && i < mf->ndata; i++) {
		pthread_mutex_init(&mf->data[i].lock, NULL);
		CDS_INIT_LIST_HEAD(&mf->data[i].lru);
	}
	if (r)
		snprintf(err, errlen, "%s: %s%s", ZMF_NAME,
			 r == -EPROTO ? "a manifest of another version"
				      : "not a valid manifest",
			 r == -EPROTO ? "" : why);
	mf->root.st_ino = FUSE_ROOT_ID;
	return r;
}

void manifest_close(struct dataset *ds)
{
	struct manifest *mf = ds->mf;

	if (!mf)
		return;
	for (uint32_t i = 0; mf->data && i < mf->ndata; i++) {
		if (mf->data[i].f)
			zfile_put(mf->data[i].f);
		if (mf->data[i].ra) {
			file_ra_destroy(mf->data[i].ra);
			free(mf->data[i].ra);
		}
	}
	for (uint32_t i = 0; mf->keys && i < mf->nframes; i++)
		free(mf->keys[i]);
	if (mf->zf)
		zfile_put(mf->zf);
	free(mf->keys);
	free(mf->data);
	free(mf->root_xattrs);
	free(mf->hole_ids);
	free(mf->hole_bytes);
	free(mf);
	ds->mf = NULL;
}

/* --- what the ops ask --- */

bool manifest_ino(const struct dataset *ds, fuse_ino_t ino)
{
	return ds->mf && ino >= 2 && ino - 2 < ds->mf->nentries;
}

/* The entry of inode ino (not the root), allocated: 0 or -errno. */
static int entry_of(struct dataset *ds, fuse_ino_t ino, struct mf_entry **out)
{
	struct mf_entry *e;
	int r;

	if (!manifest_ino(ds, ino))
		return -ENOENT;
	e = malloc(sizeof(*e));
	if (!e)
		return -ENOMEM;
	r = mf_entry_at(ds, ino - 2, e);
	if (r) {
		free(e);
		return r;
	}
	*out = e;
	return 0;
}

/* The path of directory inode ino: "" for the root. */
static int dir_path(struct dataset *ds, fuse_ino_t ino, char *out,
		    size_t cap, size_t *len)
{
	struct mf_entry *e;
	int r;

	if (ino == FUSE_ROOT_ID) {
		out[0] = '\0';
		*len = 0;
		return 0;
	}
	r = entry_of(ds, ino, &e);
	if (r)
		return r;
	if (!S_ISDIR(e->st.st_mode))
		r = -ENOTDIR;
	else if (e->plen + 1 + e->nlen + 1 > cap)
		r = -ENAMETOOLONG;
	else
		*len = (size_t)snprintf(out, cap, "%.*s%s%s", (int)e->plen,
					e->parent, e->plen ? "/" : "",
					e->name);
	free(e);
	return r;
}

int manifest_stat(struct dataset *ds, fuse_ino_t ino, struct stat *st)
{
	struct mf_entry *e;
	int r;

	if (ino == FUSE_ROOT_ID) {
		*st = ds->mf->root;
		return 0;
	}
	r = entry_of(ds, ino, &e);
	if (r)
		return r;
	*st = e->st;
	free(e);
	return 0;
}

int manifest_lookup(struct dataset *ds, fuse_ino_t parent, const char *name,
		    struct stat *st)
{
	char *path = malloc(PATH_MAX);
	struct mf_entry *e = malloc(sizeof(*e));
	size_t plen;
	uint64_t i;
	bool exact = false;
	int r = path && e ? dir_path(ds, parent, path, PATH_MAX, &plen)
			  : -ENOMEM;

	if (!r)
		r = mf_seek(ds, path, plen, name, strlen(name), &i, &exact);
	if (!r && exact)
		r = mf_entry_at(ds, i, e);
	/* -ENOENT says the name is not there (a negative entry the kernel
	 * keeps); one from below is a frame or an object that should be */
	if (r == -ENOENT)
		r = -EIO;
	else if (!r && !exact)
		r = -ENOENT;
	if (!r)
		*st = e->st;
	free(path);
	free(e);
	return r;
}

/* --- extended attributes --- */

struct xattr_call {
	const char *name; /* the one asked for, or NULL for the list */
	char *buf;
	size_t size;
	ssize_t ret;
};

/* What an xattrs field answers to c. */
static ssize_t xattr_answer(const char *field, size_t flen,
			    struct xattr_call *c)
{
	/* none (a root without, a line without the field): empty */
	const char *pos = field ? field : "", *end = pos + (field ? flen : 0);
	char name[4 * XATTR_NAME_MAX + 1];
	struct zmf_xattr x;
	size_t total = 0;
	ssize_t n;
	int r;

	while ((r = zmf_xattr_next(&pos, end, &x)) > 0) {
		if (x.nlen > sizeof(name) - 1)
			return -EBADMSG;
		n = zmf_unescape(x.name, x.nlen, name);
		if (n <= 0 || memchr(name, '\0', (size_t)n))
			return -EBADMSG;
		name[n] = '\0';
		if (!c->name) { /* the list: every name and its NUL */
			if (c->size && total + (size_t)n + 1 > c->size)
				return -ERANGE;
			if (c->size)
				memcpy(c->buf + total, name, (size_t)n + 1);
			total += (size_t)n + 1;
		} else if (!strcmp(name, c->name)) {
			char *v = malloc(x.vlen + 1);

			if (!v)
				return -ENOMEM;
			n = zmf_unescape(x.value, x.vlen, v);
			if (n >= 0 && c->size && (size_t)n > c->size)
				n = -ERANGE;
			else if (n > 0 && c->size)
				memcpy(c->buf, v, (size_t)n);
			free(v);
			return n;
		}
	}
	if (r < 0)
		return r;
	return c->name ? -ENODATA : (ssize_t)total;
}

static int xattrs_of_line(const char *line, size_t n, void *arg)
{
	struct xattr_call *c = arg;
	struct zmf_line l;

	if (zmf_split(line, n, &l))
		return -EBADMSG;
	c->ret = xattr_answer(l.f[ZMF_XATTRS], l.len[ZMF_XATTRS], c);
	return 0;
}

static ssize_t entry_xattrs(struct dataset *ds, fuse_ino_t ino,
			    struct xattr_call *c)
{
	ssize_t r;

	if (ino == FUSE_ROOT_ID) {
		r = xattr_answer(ds->mf->root_xattrs, ds->mf->root_xlen, c);
	} else if (!manifest_ino(ds, ino)) { /* a control file */
		return c->name ? -ENODATA : 0;
	} else {
		r = mf_line_at(ds, ino - 2, xattrs_of_line, c);
		if (!r)
			r = c->ret;
	}
	if (r != -EBADMSG)
		return r;
	/* a field that does not parse: damaged, as an entry that does not */
	zlog_file(ZMF_NAME, "the extended attributes of inode %llu do not "
			    "parse: the manifest is damaged, and they read as "
			    "EIO", (unsigned long long)ino);
	return -EIO;
}

ssize_t manifest_getxattr(struct dataset *ds, fuse_ino_t ino,
			  const char *name, char *buf, size_t size)
{
	struct xattr_call c = {name, buf, size, 0};

	return entry_xattrs(ds, ino, &c);
}

ssize_t manifest_listxattr(struct dataset *ds, fuse_ino_t ino, char *buf,
			   size_t size)
{
	struct xattr_call c = {NULL, buf, size, 0};

	return entry_xattrs(ds, ino, &c);
}

int manifest_readlink(struct dataset *ds, fuse_ino_t ino, char *buf,
		      size_t len)
{
	struct mf_entry *e = malloc(sizeof(*e));
	int r = e ? mf_entry_at(ds, ino - 2, e) : -ENOMEM;

	if (!r && !S_ISLNK(e->st.st_mode))
		r = -EINVAL;
	if (!r)
		snprintf(buf, len, "%s", e->target);
	free(e);
	return r;
}

int manifest_opendir(struct dataset *ds, fuse_ino_t ino, struct mf_dir *d)
{
	bool exact;
	int r;

	d->path = malloc(PATH_MAX);
	if (!d->path)
		return -ENOMEM;
	r = dir_path(ds, ino, d->path, PATH_MAX, &d->plen);
	if (!r)
		r = mf_seek(ds, d->path, d->plen, "", 0, &d->first, &exact);
	if (r) {
		free(d->path);
		d->path = NULL;
	}
	return r;
}

void manifest_closedir(struct mf_dir *d)
{
	free(d->path);
	d->path = NULL;
}

/* A walk over a directory's entries, from one of them on. */
struct dir_walk {
	struct dataset *ds;
	const struct mf_dir *dir;
	uint64_t index;   /* the next entry of the manifest to look at */
	uint64_t end;     /* the manifest's entries: a frame may hold more */
	uint64_t k;       /* its number in the directory */
	bool done;        /* met an entry of another directory, or fn said */
	struct mf_entry *e;
	mf_dirent_fn fn;
	void *arg;
};

/* The walk's entries in one frame, from w->index on. */
static int walk_in_frame(const char *p, size_t len, void *arg)
{
	struct dir_walk *w = arg;
	unsigned int k = (unsigned int)(w->index % ZMF_FRAME_ENTRIES);
	const char *line, *end = p + len;
	size_t n;
	int r;

	if (!nth_line(p, len, k, &line, &n))
		return -EBADMSG;
	for (; line < end && w->index < w->end;
	     line += n + 1, w->index++, w->k++) {
		if (!nth_line(line, (size_t)(end - line), 0, &line, &n))
			break;
		r = parse_parent(line, n, w->e);
		if (!r && zmf_path_cmp(w->e->parent, w->e->plen, w->dir->path,
				       w->dir->plen)) {
			w->done = true; /* the next directory's */
			return 0;
		}
		if (!r)
			r = parse_entry(line, n, w->e);
		if (!r) {
			mf_entry_blocks(w->ds, w->e);
			r = mf_entry_placed(w->e, w->index);
		}
		if (r)
			return r;
		if (w->fn(w->arg, w->e, w->k)) {
			w->done = true;
			return 0;
		}
	}
	return 0;
}

/*
 * The entries of an open directory from its k-th on, to fn, a frame at a
 * time: no listing is kept, so a directory of any size costs only the
 * manifest frames it is read from, in the cache, under the budget.
 */
int manifest_readdir(struct dataset *ds, const struct mf_dir *d, uint64_t k,
		     mf_dirent_fn fn, void *arg)
{
	struct dir_walk w = {.ds = ds, .dir = d, .index = d->first + k,
			     .end = ds->mf->nentries, .k = k, .fn = fn,
			     .arg = arg};
	int r = 0;

	if (w.index < d->first) /* k past any directory */
		return 0;
	w.e = malloc(sizeof(*w.e));
	if (!w.e)
		return -ENOMEM;
	while (!r && !w.done && w.index < ds->mf->nentries)
		r = mf_frame(ds, (uint32_t)(w.index / ZMF_FRAME_ENTRIES),
			     walk_in_frame, &w);
	free(w.e);
	return r;
}

/*
 * Whether the dataset on disk is still the one mounted.  mkzfolio --force
 * removes manifest.zst first and writes it last, so a data file opened
 * while manifest.zst is the one the mount read belongs to the mount's
 * manifest.  A dataset packed again under the mount is said once: its
 * entries would be read at their old places in the new data files.
 */
static bool dataset_unchanged(struct dataset *ds)
{
	struct stat st;

	if (ds->store) /* objects are checked one by one (ETag) */
		return true;
	if (!backing_lstat(ds, ZMF_NAME, &st) &&
	    same_backing(&st, &ds->mf->zf->st))
		return true;
	manifest_say_changed(ds, ZMF_NAME);
	return false;
}

/*
 * Why a data file (path) of a packed dataset is not the manifest's, said
 * once: the dataset directory removed; manifest.zst gone (mkzfolio removes
 * it first when it packs again) or replaced; or, manifest.zst as the mount
 * read it, the data file itself gone or replaced.
 */
void manifest_say_changed(struct dataset *ds, const char *path)
{
	struct stat st;
	int r;

	if (!fstat(ds->rootfd, &st) && st.st_nlink == 0) {
		zlog_file(ZMF_NAME, "the dataset was removed under the mount: "
				    "what must be read from disk again fails; "
				    "unmount it");
		return;
	}
	r = backing_lstat(ds, ZMF_NAME, &st);
	if (r == -ENOENT)
		zlog_file(ZMF_NAME, "gone while mounted (the dataset is being "
				    "packed again, or was damaged): what must "
				    "be read from disk again fails; remount it "
				    "once it is whole");
	else if (r || !same_backing(&st, &ds->mf->zf->st))
		zlog_file(ZMF_NAME, "the dataset was packed again under the "
				    "mount: remount it to see the new one "
				    "(until then, what must be read from disk "
				    "again fails)");
	else
		zlog_file(path, "gone or replaced while mounted, but not "
				"manifest.zst: the dataset is damaged, and "
				"what the mount must read from this file "
				"fails");
}

/*
 * The data file id, opened when first needed, with a reference.  A data
 * file in a store that was seen to change is indexed again (its cached
 * folios go with the old index).  A local one opened after the dataset
 * was packed again is not the manifest's: EIO.
 */
static int data_file(struct dataset *ds, uint64_t id, struct zfile **out)
{
	struct mf_data *d;
	char path[64], why[384];
	int r = 0;

	if (id >= ds->mf->ndata)
		return -EIO;
	d = &ds->mf->data[id];
	pthread_mutex_lock(&d->lock);
	if (d->f && d->f->obj && store_obj_changed(d->f->obj)) {
		mapping_invalidate(d->f->mapping);
		zfile_put(d->f);
		d->f = NULL;
	}
	if (!d->f) {
		snprintf(path, sizeof(path), ZMF_DATA_DIR "/%08llu.zst",
			 (unsigned long long)id);
		/* before (a data file being written is not indexed) and
		 * after (it was not replaced meanwhile) */
		r = dataset_unchanged(ds) ? zfile_open_path(ds, path, &d->f,
							    why, sizeof(why))
					  : -EIO;
		if (r && ds->store)
			zlog_file(path, "%s", why);
		if (!dataset_unchanged(ds)) {
			if (!r)
				zfile_put(d->f);
			d->f = NULL;
			r = -EIO;
		} else if (r == -ENOENT || r == -EACCES || r == -EPERM) {
			/* the manifest names it: missing or unreadable (a
			 * store's 404 or 403, said above), the dataset is
			 * damaged, which a reader should not take for a file
			 * removed under it (ENOENT) */
			if (!ds->store)
				zlog_file(path, "%s: the dataset is damaged, "
						"and the files stored in it "
						"read as EIO",
					  strerror(-r));
			r = -EIO;
		}
	}
	if (!r) {
		mapping_get(d->f->mapping);
		*out = d->f;
	}
	pthread_mutex_unlock(&d->lock);
	if (!r) { /* the most recently used goes last */
		pthread_mutex_lock(&ds->mf->lru_lock);
		cds_list_del(&d->lru);
		cds_list_add_tail(&d->lru, &ds->mf->lru);
		pthread_mutex_unlock(&ds->mf->lru_lock);
	}
	return r;
}

/*
 * The inode shrinker's counterpart: drop the indexes (and cached data) of
 * data files nobody has open, least recently used first, until metadata is
 * down to target bytes.  They are indexed again when next opened.
 */
void manifest_shrink(struct dataset *ds, long target)
{
	struct manifest *mf = ds->mf;
	struct mf_data *d, *tmp;

	pthread_mutex_lock(&mf->lru_lock);
	cds_list_for_each_entry_safe(d, tmp, &mf->lru, lru) {
		if (atomic_load(&ds->meta_bytes) <= target)
			break;
		if (pthread_mutex_trylock(&d->lock))
			continue;
		/* only the slot holds it: no handle is open on it */
		if (d->f && atomic_load(&d->f->mapping->refcount) == 1) {
			struct zfile *f = d->f;

			d->f = NULL;
			cds_list_del_init(&d->lru);
			pthread_mutex_unlock(&d->lock);
			pthread_mutex_unlock(&mf->lru_lock);
			zfile_put(f); /* uncharges its metadata */
			pthread_mutex_lock(&mf->lru_lock);
			tmp = cds_list_entry(mf->lru.next, struct mf_data, lru);
			continue;
		}
		pthread_mutex_unlock(&d->lock);
	}
	pthread_mutex_unlock(&mf->lru_lock);
}

/* Data file id's readahead for its packed files, made at the first call;
 * NULL if it cannot be. */
static struct file_ra_state *pack_ra_of(struct dataset *ds, uint64_t id)
{
	struct mf_data *d = &ds->mf->data[id];
	struct file_ra_state *ra;

	pthread_mutex_lock(&d->lock);
	if (!d->ra && (d->ra = malloc(sizeof(*d->ra))))
		file_ra_init(d->ra, ds->opt->ra_kb / 4);
	ra = d->ra;
	pthread_mutex_unlock(&d->lock);
	return ra;
}

/*
 * A regular file's data: its data file (with a reference), where it
 * starts in it, and its size; and for a file packed with others, its
 * pack's readahead.  A file without data (empty) gets none.
 */
int manifest_open_file(struct dataset *ds, fuse_ino_t ino, struct zfile **f,
		       uint64_t *base, uint64_t *size,
		       struct file_ra_state **pack_ra)
{
	struct mf_entry *e = malloc(sizeof(*e));
	int r = e ? mf_entry_at(ds, ino - 2, e) : -ENOMEM;

	*f = NULL;
	*pack_ra = NULL;
	if (!r && S_ISDIR(e->st.st_mode)) {
		/*
		 * The kernel opens a node as a file only when a name gave it
		 * as one: a later name of a hard link numbered as a directory.
		 */
		zlog_file(ZMF_NAME, "inode %llu (%.*s%s%.*s) is a directory, "
				    "but a file's name gives its number: the "
				    "manifest is damaged, and that name reads "
				    "as EIO",
			  (unsigned long long)ino, (int)e->plen, e->parent,
			  e->plen ? "/" : "", (int)e->nlen, e->name);
		r = -EIO;
	} else if (!r && !S_ISREG(e->st.st_mode)) {
		r = -EACCES;
	}
	if (!r && e->has_data)
		r = data_file(ds, e->data_id, f);
	if (!r && *f && e->data_off + (uint64_t)e->st.st_size >
				 (*f)->mapping->size) {
		/* the manifest points past the data: a data file replaced by
		 * another's, or cut short */
		zlog_file(ZMF_NAME, "%.*s%s%.*s ends at byte %llu of data "
				    "file %llu, which holds %llu: the dataset "
				    "is damaged (a data file replaced or cut "
				    "short), and the file reads as EIO",
			  (int)e->plen, e->parent, e->plen ? "/" : "",
			  (int)e->nlen, e->name,
			  (unsigned long long)(e->data_off +
					       (uint64_t)e->st.st_size),
			  (unsigned long long)e->data_id,
			  (unsigned long long)(*f)->mapping->size);
		zfile_put(*f);
		*f = NULL;
		r = -EIO;
	}
	if (!r) {
		*base = e->has_data ? e->data_off : 0;
		*size = (uint64_t)e->st.st_size;
	}
	if (!r && *f && *size < (*f)->mapping->size)
		*pack_ra = pack_ra_of(ds, e->data_id);
	free(e);
	return r;
}

void manifest_usage(struct dataset *ds, uint64_t *bytes, uint64_t *entries)
{
	*bytes = ds->mf->bytes;
	*entries = ds->mf->nentries + 1;
}
