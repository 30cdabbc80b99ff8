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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* A frame's first key, unescaped: parent then name. */
struct mf_key {
	size_t plen, nlen;
	char s[]; /* plen bytes of parent, nlen of name */
};

/* One data file's state: opened when one of its files is. */
struct mf_data {
	pthread_mutex_t lock;
	struct zfile *f;
	struct cds_list_head lru; /* on mf->lru while f is set */
};

struct manifest {
	struct zfile *zf;        /* manifest.zst */
	uint64_t nentries;
	uint32_t nframes;        /* the entries', then the header's */
	uint32_t ndata;
	uint64_t bytes;          /* content served, for statfs */
	struct stat root;        /* the root's attributes */
	struct mf_key *_Atomic *keys; /* per frame, NULL until read */
	struct mf_data *data;
	pthread_mutex_t lru_lock;
	struct cds_list_head lru;     /* open data files, oldest use first */
};

/* What a frame callback gets: one frame's text, pinned while it runs. */
typedef int (*mf_frame_fn)(const char *p, size_t len, void *arg);

struct frame_call {
	mf_frame_fn fn;
	void *arg;
	int ret;
};

static int frame_reply(void *arg, const struct iovec *iov, int cnt)
{
	struct frame_call *c = arg;

	if (!iov)
		c->ret = cnt ? cnt : -EBADMSG; /* an error, or empty */
	else if (cnt != 1)
		c->ret = -EBADMSG; /* a manifest frame is one folio */
	else
		c->ret = c->fn(iov[0].iov_base, iov[0].iov_len, c->arg);
	return 0;
}

/* Hand frame f's text to fn, through the cache. */
static int mf_frame(struct dataset *ds, uint32_t frame, mf_frame_fn fn,
		    void *arg)
{
	struct manifest *mf = ds->mf;
	struct mapping *m = mf->zf->mapping;
	struct worker *w = current_worker;
	struct frame_call c = {fn, arg, -EIO};
	struct ra_request *r;

	if (frame >= m->nr_folios)
		return -ENOENT;
	r = w ? &w->rq : malloc(sizeof(*r));
	if (!r)
		return -ENOMEM;
	ra_request_init(r, m, NULL, &ds->cache.budget.root, w,
			mapping_folio_pos(m, frame), mapping_folio_len(m, frame),
			false);
	r->rq.internal = true;
	cache_read(&r->rq, frame_reply, &c);
	if (!w)
		free(r);
	return c.ret;
}

/* Line k of a frame's text: its start and length (without the newline). */
static bool nth_line(const char *p, size_t len, unsigned int k,
		     const char **line, size_t *n)
{
	const char *end = p + len, *nl;

	for (; k; k--) {
		nl = memchr(p, '\n', (size_t)(end - p));
		if (!nl)
			return false;
		p = nl + 1;
	}
	nl = memchr(p, '\n', (size_t)(end - p));
	if (!nl)
		return false;
	*line = p;
	*n = (size_t)(nl - p);
	return true;
}

/* An entry, parsed: what the ops need. */
struct mf_entry {
	uint64_t index;
	struct stat st;
	uint64_t data_id, data_off; /* regular files with data */
	bool has_data;
	char name[NAME_MAX + 1];
	char target[PATH_MAX];      /* symlinks */
	char parent[PATH_MAX];      /* the directory's path */
	size_t plen, nlen;
};

static mode_t type_mode(char t)
{
	switch (t) {
	case 'f': return S_IFREG;
	case 'd': return S_IFDIR;
	case 'l': return S_IFLNK;
	case 'c': return S_IFCHR;
	case 'b': return S_IFBLK;
	case 'p': return S_IFIFO;
	case 's': return S_IFSOCK;
	default: return 0;
	}
}

static int field_octal(const struct zmf_line *l, enum zmf_field f,
		       uint64_t *v)
{
	uint64_t x = 0;

	if (!l->len[f] || l->len[f] > 8)
		return -EBADMSG;
	for (size_t i = 0; i < l->len[f]; i++) {
		if (l->f[f][i] < '0' || l->f[f][i] > '7')
			return -EBADMSG;
		x = x * 8 + (uint64_t)(l->f[f][i] - '0');
	}
	*v = x;
	return 0;
}

static int unescape_into(const struct zmf_line *l, enum zmf_field f,
			 char *out, size_t cap, size_t *n)
{
	ssize_t r;

	if (l->len[f] >= cap * 4) /* escapes at most quadruple */
		return -EBADMSG;
	if (l->len[f] >= cap) {
		char *tmp = malloc(l->len[f]);

		if (!tmp)
			return -ENOMEM;
		r = zmf_unescape(l->f[f], l->len[f], tmp);
		if (r >= 0 && (size_t)r < cap)
			memcpy(out, tmp, (size_t)r);
		free(tmp);
		if (r >= 0 && (size_t)r >= cap)
			return -EBADMSG;
	} else {
		r = zmf_unescape(l->f[f], l->len[f], out);
	}
	if (r < 0)
		return (int)r;
	out[r] = '\0';
	*n = (size_t)r;
	return 0;
}

/* The numbers of a line into st. */
static int parse_stat(const struct zmf_line *l, struct stat *st)
{
	uint64_t mode, uid, gid, size, ino, nlink, rdev;
	int64_t ms, as;
	long mns, ans;
	mode_t type;

	if (l->len[ZMF_TYPE] != 1 || !(type = type_mode(l->f[ZMF_TYPE][0])) ||
	    field_octal(l, ZMF_MODE, &mode) || zmf_number(l, ZMF_UID, &uid) ||
	    zmf_number(l, ZMF_GID, &gid) || zmf_number(l, ZMF_SIZE, &size) ||
	    zmf_time(l, ZMF_MTIME, &ms, &mns) ||
	    zmf_time(l, ZMF_ATIME, &as, &ans) ||
	    zmf_number(l, ZMF_INO, &ino) || zmf_number(l, ZMF_NLINK, &nlink) ||
	    zmf_number(l, ZMF_RDEV, &rdev) || size > ZSEEK_MAX_CONTENT)
		return -EBADMSG;
	memset(st, 0, sizeof(*st));
	st->st_mode = type | (mode_t)(mode & 07777);
	st->st_uid = (uid_t)uid;
	st->st_gid = (gid_t)gid;
	st->st_size = (off_t)size;
	st->st_mtim.tv_sec = ms;
	st->st_mtim.tv_nsec = mns;
	st->st_atim.tv_sec = as;
	st->st_atim.tv_nsec = ans;
	st->st_ctim = st->st_mtim;
	st->st_ino = ino;
	st->st_nlink = nlink;
	st->st_rdev = rdev;
	st->st_blksize = ZSEEK_DEFAULT_FRAME;
	st->st_blocks = (blkcnt_t)((size + 511) / 512);
	return 0;
}

/* A whole entry line into e. */
static int parse_entry(const char *line, size_t len, struct mf_entry *e)
{
	struct zmf_line l;
	size_t tn;
	int r = zmf_split(line, len, &l);

	if (!r)
		r = parse_stat(&l, &e->st);
	if (!r)
		r = unescape_into(&l, ZMF_NAME_F, e->name, sizeof(e->name),
				  &e->nlen);
	if (!r)
		r = unescape_into(&l, ZMF_PARENT, e->parent, sizeof(e->parent),
				  &e->plen);
	if (!r)
		r = unescape_into(&l, ZMF_TARGET, e->target, sizeof(e->target),
				  &tn);
	if (r)
		return r;
	r = zmf_data(&l, &e->data_id, &e->data_off);
	e->has_data = r == 0;
	return r < 0 ? r : 0;
}

struct line_call {
	unsigned int k;
	struct mf_entry *e;
};

static int entry_in_frame(const char *p, size_t len, void *arg)
{
	struct line_call *c = arg;
	const char *line;
	size_t n;

	if (!nth_line(p, len, c->k, &line, &n))
		return -EBADMSG;
	return parse_entry(line, n, c->e);
}

/* Entry index i of the manifest. */
static int mf_entry_at(struct dataset *ds, uint64_t i, struct mf_entry *e)
{
	struct line_call c = {(unsigned int)(i % ZMF_FRAME_ENTRIES), e};

	if (i >= ds->mf->nentries)
		return -ENOENT;
	e->index = i;
	return mf_frame(ds, (uint32_t)(i / ZMF_FRAME_ENTRIES), entry_in_frame,
			&c);
}

/* --- the first keys of frames, for binary search --- */

static int key_of_frame(const char *p, size_t len, void *arg)
{
	struct mf_key **out = arg;
	struct mf_entry *e = malloc(sizeof(*e));
	const char *line;
	size_t n;
	int r = -EBADMSG;

	if (!e)
		return -ENOMEM;
	if (nth_line(p, len, 0, &line, &n) && parse_entry(line, n, e) == 0) {
		*out = malloc(sizeof(**out) + e->plen + e->nlen);
		r = *out ? 0 : -ENOMEM;
		if (*out) {
			(*out)->plen = e->plen;
			(*out)->nlen = e->nlen;
			memcpy((*out)->s, e->parent, e->plen);
			memcpy((*out)->s + e->plen, e->name, e->nlen);
		}
	}
	free(e);
	return r;
}

/* Frame f's first key, read once and kept (charged as metadata). */
static const struct mf_key *frame_key(struct dataset *ds, uint32_t f)
{
	struct manifest *mf = ds->mf;
	struct mf_key *k = atomic_load_explicit(&mf->keys[f],
						 memory_order_acquire);
	struct mf_key *expected = NULL;

	if (k)
		return k;
	if (mf_frame(ds, f, key_of_frame, &k))
		return NULL;
	/* release: the key's bytes before its pointer; a loser frees its own */
	if (!atomic_compare_exchange_strong_explicit(
		    &mf->keys[f], &expected, k, memory_order_acq_rel,
		    memory_order_acquire)) {
		free(k);
		return expected;
	}
	meta_charge(ds, (long)(sizeof(*k) + k->plen + k->nlen));
	return k;
}

static int key_cmp(const struct mf_key *k, const char *parent, size_t plen,
		   const char *name, size_t nlen)
{
	return zmf_key_cmp(k->s, k->plen, k->s + k->plen, k->nlen, parent,
			   plen, name, nlen);
}

/*
 * The last entry frame whose first key is <= (parent, name): 0, 1 if the
 * key is before every frame, or -EIO.
 */
static int frame_of_key(struct dataset *ds, const char *parent, size_t plen,
			const char *name, size_t nlen, uint32_t *frame)
{
	uint32_t lo = 0, hi = ds->mf->nframes - 1; /* [lo, hi): entry frames */
	bool found = false;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		const struct mf_key *k = frame_key(ds, mid);

		if (!k)
			return -EIO;
		if (key_cmp(k, parent, plen, name, nlen) <= 0) {
			*frame = mid;
			found = true;
			lo = mid + 1;
		} else {
			hi = mid;
		}
	}
	return found ? 0 : 1;
}

/* The first entry at or after (parent, name) in frame f: its line number,
 * or ZMF_FRAME_ENTRIES if every entry of f is before it. */
struct seek_call {
	const char *parent, *name;
	size_t plen, nlen;
	unsigned int k;
	bool exact;
};

/* A line's key, unescaped into kp/kn (PATH_MAX and NAME_MAX + 1 bytes). */
static int line_key(const char *line, size_t n, char *kp, size_t *plen,
		    char *kn, size_t *nlen)
{
	const char *t1 = memchr(line, '\t', n), *t2;
	ssize_t a, b;

	if (!t1 || !(t2 = memchr(t1 + 1, '\t', n - (size_t)(t1 + 1 - line))))
		return -EBADMSG;
	if ((size_t)(t1 - line) >= 4 * PATH_MAX ||
	    (size_t)(t2 - t1 - 1) >= 4 * (NAME_MAX + 1))
		return -EBADMSG;
	a = zmf_unescape(line, (size_t)(t1 - line), kp);
	b = zmf_unescape(t1 + 1, (size_t)(t2 - t1 - 1), kn);
	if (a < 0 || b < 0 || (size_t)a >= PATH_MAX || (size_t)b > NAME_MAX)
		return -EBADMSG;
	*plen = (size_t)a;
	*nlen = (size_t)b;
	return 0;
}

static int seek_in_frame(const char *p, size_t len, void *arg)
{
	struct seek_call *c = arg;
	/* escapes at most quadruple: room for the escaped forms' worst */
	char *kp = malloc(4 * PATH_MAX), *kn = malloc(4 * (NAME_MAX + 1));
	const char *line, *end = p + len;
	size_t n, plen, nlen;
	int r = kp && kn ? 0 : -ENOMEM;

	for (c->k = 0; !r && p < end; c->k++, p = line + n + 1) {
		int cmp;

		if (!nth_line(p, (size_t)(end - p), 0, &line, &n) ||
		    line_key(line, n, kp, &plen, kn, &nlen)) {
			r = -EBADMSG;
			break;
		}
		cmp = zmf_key_cmp(kp, plen, kn, nlen, c->parent, c->plen,
				  c->name, c->nlen);
		if (cmp >= 0) {
			c->exact = cmp == 0;
			break;
		}
	}
	free(kp);
	free(kn);
	return r;
}

/*
 * The index of the first entry at or after (parent, name): *exact if it
 * is that entry.  nentries if there is none.
 */
static int mf_seek(struct dataset *ds, const char *parent, size_t plen,
		   const char *name, size_t nlen, uint64_t *index, bool *exact)
{
	struct seek_call c = {parent, name, plen, nlen, 0, false};
	uint32_t f = 0;
	int r = frame_of_key(ds, parent, plen, name, nlen, &f);

	*exact = false;
	if (r) { /* before the first entry, or an error */
		*index = 0;
		return r < 0 ? r : 0;
	}
	r = mf_frame(ds, f, seek_in_frame, &c);
	if (r)
		return r;
	*index = (uint64_t)f * ZMF_FRAME_ENTRIES + c.k;
	if (*index > ds->mf->nentries)
		*index = ds->mf->nentries;
	*exact = c.exact;
	return 0;
}

/* --- the header and the mount --- */

static int header_value(const char *line, size_t len, const char *key,
			uint64_t *v)
{
	char pat[32];
	const char *p;
	size_t n = (size_t)snprintf(pat, sizeof(pat), "\t%s=", key);

	for (p = line; (p = memmem(p, len - (size_t)(p - line), pat, n));
	     p += n) {
		char *end;

		errno = 0;
		*v = strtoull(p + n, &end, 10);
		return errno || end == p + n ? -EBADMSG : 0;
	}
	return -EBADMSG;
}

struct header_call {
	struct manifest *mf;
};

static int read_header(const char *p, size_t len, void *arg)
{
	struct manifest *mf = ((struct header_call *)arg)->mf;
	uint64_t v[9];
	static const char *const keys[] = {"version", "entries", "data",
					   "bytes",   "mode",    "uid",
					   "gid",     "mtime",   "mtime_ns"};
	const char *line;
	size_t n;

	if (!nth_line(p, len, 0, &line, &n) || n < strlen(ZMF_MAGIC) ||
	    memcmp(line, ZMF_MAGIC, strlen(ZMF_MAGIC)))
		return -EBADMSG;
	for (int i = 0; i < 9; i++)
		if (header_value(line, n, keys[i], &v[i]))
			return -EBADMSG;
	if (v[0] != ZMF_VERSION || v[2] > UINT32_MAX)
		return -EPROTO;
	mf->nentries = v[1];
	mf->ndata = (uint32_t)v[2];
	mf->bytes = v[3];
	mf->root.st_mode = S_IFDIR | (mode_t)(v[4] & 07777);
	mf->root.st_uid = (uid_t)v[5];
	mf->root.st_gid = (gid_t)v[6];
	mf->root.st_mtim.tv_sec = (time_t)v[7];
	mf->root.st_mtim.tv_nsec = (long)(v[8] % 1000000000);
	mf->root.st_atim = mf->root.st_ctim = mf->root.st_mtim;
	mf->root.st_nlink = 2;
	return 0;
}

/* The frames the entries need, against what the file has. */
static int check_shape(struct manifest *mf)
{
	uint64_t want = (mf->nentries + ZMF_FRAME_ENTRIES - 1) /
				ZMF_FRAME_ENTRIES + 1;

	if (want != mf->zf->mapping->nr_folios || want > UINT32_MAX)
		return -EBADMSG;
	mf->nframes = (uint32_t)want;
	return 0;
}

/* Open the manifest of the dataset, if it has one: 0, 1 without, or an
 * error (with its reason in err). */
int manifest_open(struct dataset *ds, char *err, size_t errlen)
{
	struct manifest *mf;
	struct header_call hc;
	int fd, r;

	fd = dataset_open_backing(ds, ZMF_NAME, O_RDONLY);
	if (fd < 0)
		return fd == -ENOENT ? 1 : fd;
	mf = calloc(1, sizeof(*mf));
	if (!mf) {
		close(fd);
		return -ENOMEM;
	}
	ds->mf = mf;
	hc.mf = mf;
	cache_thread_register(); /* reads through the cache */
	r = zfile_create(ds, fd, true, ZMF_NAME, &mf->zf);
	if (!r && !mf->zf->mapping->nr_folios)
		r = -EBADMSG;
	if (!r)
		r = mf_frame(ds, (uint32_t)mf->zf->mapping->nr_folios - 1,
			     read_header, &hc);
	if (!r)
		r = check_shape(mf);
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
		snprintf(err, errlen, "%s: %s", ZMF_NAME,
			 r == -EPROTO ? "a manifest of another version"
				      : "not a valid manifest");
	mf->root.st_ino = FUSE_ROOT_ID;
	return r;
}

void manifest_close(struct dataset *ds)
{
	struct manifest *mf = ds->mf;

	if (!mf)
		return;
	for (uint32_t i = 0; mf->data && i < mf->ndata; i++)
		if (mf->data[i].f)
			zfile_put(mf->data[i].f);
	for (uint32_t i = 0; mf->keys && i < mf->nframes; i++)
		free(mf->keys[i]);
	if (mf->zf)
		zfile_put(mf->zf);
	free(mf->keys);
	free(mf->data);
	free(mf);
	ds->mf = NULL;
}

/* --- what the ops ask --- */

bool manifest_ino(const struct dataset *ds, fuse_ino_t ino)
{
	return ds->mf && ino >= 2 && ino - 2 < ds->mf->nentries;
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
	if (!manifest_ino(ds, ino))
		return -ENOENT;
	e = malloc(sizeof(*e));
	if (!e)
		return -ENOMEM;
	r = mf_entry_at(ds, ino - 2, e);
	if (!r && !S_ISDIR(e->st.st_mode))
		r = -ENOTDIR;
	if (!r && e->plen + 1 + e->nlen + 1 > cap)
		r = -ENAMETOOLONG;
	if (!r) {
		*len = (size_t)snprintf(out, cap, "%.*s%s%s", (int)e->plen,
					e->parent, e->plen ? "/" : "",
					e->name);
	}
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
	if (!manifest_ino(ds, ino))
		return -ENOENT;
	e = malloc(sizeof(*e));
	if (!e)
		return -ENOMEM;
	r = mf_entry_at(ds, ino - 2, e);
	if (!r)
		*st = e->st;
	free(e);
	return r;
}

int manifest_lookup(struct dataset *ds, fuse_ino_t parent, const char *name,
		    struct stat *st)
{
	char *path = malloc(PATH_MAX);
	struct mf_entry *e = malloc(sizeof(*e));
	size_t plen;
	uint64_t i;
	bool exact;
	int r = path && e ? dir_path(ds, parent, path, PATH_MAX, &plen)
			  : -ENOMEM;

	if (!r)
		r = mf_seek(ds, path, plen, name, strlen(name), &i, &exact);
	if (!r && !exact)
		r = -ENOENT;
	if (!r)
		r = mf_entry_at(ds, i, e);
	if (!r)
		*st = e->st;
	free(path);
	free(e);
	return r;
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

/* A growing listing. */
struct listing {
	const char *path;
	size_t plen;
	struct dir_entry *v;
	size_t n, cap;
	uint64_t index;   /* the next entry to look at */
	bool done;        /* met an entry of another directory */
	struct mf_entry *e;
};

static int listing_add(struct listing *l, const struct mf_entry *e)
{
	struct dir_entry *d;

	if (l->n == l->cap) {
		struct dir_entry *nv;

		l->cap = l->cap ? l->cap * 2 : 64;
		nv = realloc(l->v, l->cap * sizeof(*l->v));
		if (!nv)
			return -ENOMEM;
		l->v = nv;
	}
	d = &l->v[l->n];
	d->name = strdup(e->name);
	d->st = malloc(sizeof(*d->st));
	if (!d->name || !d->st) {
		free(d->name);
		free(d->st);
		return -ENOMEM;
	}
	d->type = e->st.st_mode & S_IFMT;
	d->ino = e->st.st_ino;
	d->decode = false;
	*d->st = e->st;
	l->n++;
	return 0;
}

/* The listing's entries in one frame, from l->index on. */
static int list_in_frame(const char *p, size_t len, void *arg)
{
	struct listing *l = arg;
	unsigned int k = (unsigned int)(l->index % ZMF_FRAME_ENTRIES);
	const char *line, *end = p + len;
	size_t n;
	int r;

	if (!nth_line(p, len, k, &line, &n))
		return -EBADMSG;
	for (; line < end; line += n + 1, l->index++) {
		if (!nth_line(line, (size_t)(end - line), 0, &line, &n))
			break;
		r = parse_entry(line, n, l->e);
		if (r)
			return r;
		if (zmf_path_cmp(l->e->parent, l->e->plen, l->path, l->plen)) {
			l->done = true;
			return 0;
		}
		r = listing_add(l, l->e);
		if (r)
			return r;
	}
	return 0;
}

/* Every entry of directory ino, with its attributes: one pass a frame. */
int manifest_list(struct dataset *ds, fuse_ino_t ino, struct dir_entry **out,
		  size_t *count)
{
	char *path = malloc(PATH_MAX);
	struct listing l = {.path = path, .e = malloc(sizeof(struct mf_entry))};
	bool exact;
	int r = path && l.e ? dir_path(ds, ino, path, PATH_MAX, &l.plen)
			    : -ENOMEM;

	if (!r)
		r = mf_seek(ds, path, l.plen, "", 0, &l.index, &exact);
	while (!r && !l.done && l.index < ds->mf->nentries)
		r = mf_frame(ds, (uint32_t)(l.index / ZMF_FRAME_ENTRIES),
			     list_in_frame, &l);
	free(path);
	free(l.e);
	if (r) {
		dataset_list_free(l.v, l.n);
		return r;
	}
	*out = l.v;
	*count = l.n;
	return 0;
}

/* The data file id, opened when first needed, with a reference. */
static int data_file(struct dataset *ds, uint64_t id, struct zfile **out)
{
	struct mf_data *d;
	char path[64];
	int fd, r = 0;

	if (id >= ds->mf->ndata)
		return -EIO;
	d = &ds->mf->data[id];
	pthread_mutex_lock(&d->lock);
	if (!d->f) {
		snprintf(path, sizeof(path), ZMF_DATA_DIR "/%08llu.zst",
			 (unsigned long long)id);
		fd = dataset_open_backing(ds, path, O_RDONLY);
		r = fd < 0 ? fd : zfile_create(ds, fd, true, path, &d->f);
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

/*
 * A regular file's data: its data file (with a reference), where it
 * starts in it, and its size.  A file without data (empty) gets none.
 */
int manifest_open_file(struct dataset *ds, fuse_ino_t ino, struct zfile **f,
		       uint64_t *base, uint64_t *size)
{
	struct mf_entry *e = malloc(sizeof(*e));
	int r = e ? mf_entry_at(ds, ino - 2, e) : -ENOMEM;

	*f = NULL;
	if (!r && !S_ISREG(e->st.st_mode))
		r = S_ISDIR(e->st.st_mode) ? -EISDIR : -EACCES;
	if (!r && e->has_data)
		r = data_file(ds, e->data_id, f);
	if (!r && *f && e->data_off + (uint64_t)e->st.st_size >
				 (*f)->mapping->size) {
		zfile_put(*f); /* the manifest points past the data */
		*f = NULL;
		r = -EIO;
	}
	if (!r) {
		*base = e->has_data ? e->data_off : 0;
		*size = (uint64_t)e->st.st_size;
	}
	free(e);
	return r;
}

void manifest_usage(struct dataset *ds, uint64_t *bytes, uint64_t *entries)
{
	*bytes = ds->mf->bytes;
	*entries = ds->mf->nentries + 1;
}
