// SPDX-License-Identifier: MIT
/*
 * Reading the manifest: its frames through the cache, its lines, its
 * entries by index, and the binary search by key over the frames' first
 * keys (each read once, when first needed, kept and charged); and the
 * walk over the files packed after a file, for pushes.  What the ops make
 * of it is in manifest.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

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
int mf_frame(struct dataset *ds, uint32_t frame, mf_frame_fn fn,
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
	/* text that does not parse in a manifest that opened (its header
	 * did): damaged, it reads as EIO, as damaged data does, and is said
	 * (once per frame) */
	if (c.ret != -EBADMSG || !mf->keys)
		return c.ret;
	zlog_file(ZMF_NAME, "frame %u holds an entry that does not parse, or "
			    "out of order: the manifest is damaged, and what "
			    "needs that entry reads as EIO", frame);
	return -EIO;
}

/* Line k of a frame's text: its start and length (without the newline). */
bool nth_line(const char *p, size_t len, unsigned int k,
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
int parse_entry(const char *line, size_t len, struct mf_entry *e)
{
	struct zmf_line l;
	size_t tn;
	int r = zmf_split(line, len, &l);

	if (!r)
		r = parse_stat(&l, &e->st);
	if (!r)
		r = unescape_into(&l, ZMF_NAME_F, e->name, sizeof(e->name),
				  &e->nlen);
	/* a name no directory holds: none, ".", "..", or with '/' or NUL */
	if (!r && (!e->nlen || memchr(e->name, '/', e->nlen) ||
		   memchr(e->name, '\0', e->nlen) ||
		   !strcmp(e->name, ".") || !strcmp(e->name, "..")))
		r = -EBADMSG;
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

/* Only the directory of an entry's line, into e->parent: a walk over a
 * directory stops at the first entry of another without parsing the rest
 * of it (which may be damaged, and is not the walk's). */
int parse_parent(const char *line, size_t len, struct mf_entry *e)
{
	struct zmf_line l;
	int r = zmf_split(line, len, &l);

	return r ? r
		 : unescape_into(&l, ZMF_PARENT, e->parent, sizeof(e->parent),
				 &e->plen);
}

struct line_call {
	unsigned int k;
	mf_line_fn fn;
	void *arg;
};

static int line_in_frame(const char *p, size_t len, void *arg)
{
	struct line_call *c = arg;
	const char *line;
	size_t n;

	if (!nth_line(p, len, c->k, &line, &n))
		return -EBADMSG;
	return c->fn(line, n, c->arg);
}

/* Hand the line of entry index i to fn, through the cache. */
int mf_line_at(struct dataset *ds, uint64_t i, mf_line_fn fn, void *arg)
{
	struct line_call c = {(unsigned int)(i % ZMF_FRAME_ENTRIES), fn, arg};

	if (i >= ds->mf->nentries)
		return -ENOENT;
	return mf_frame(ds, (uint32_t)(i / ZMF_FRAME_ENTRIES), line_in_frame,
			&c);
}

static int entry_of_line(const char *line, size_t n, void *arg)
{
	return parse_entry(line, n, arg);
}

/*
 * An entry's inode number against its place: mkzfolio numbers the entry of
 * index i as i + 2 (1 is the root), and gives a later name of a hard link
 * its first name's number (a file's, a symlink's or a special file's: never
 * a directory's).  Any other (an edited manifest) would hand the
 * kernel node 0 (taken as "no such name"), the root's, or one directory
 * under two names: the entry is damaged, and said so (once per entry).
 * An earlier number that is a directory's is caught when the kernel opens
 * it as a file (manifest_open_file): telling here would read a second
 * manifest frame from inside the walk of the first.
 */
int mf_entry_placed(const struct mf_entry *e, uint64_t i)
{
	uint64_t ino = (uint64_t)e->st.st_ino;

	if (ino == i + 2 || (!S_ISDIR(e->st.st_mode) && ino >= 2 && ino < i + 2))
		return 0;
	zlog_file(ZMF_NAME, "entry %llu (%.*s%s%.*s) has inode number %llu, "
			    "not %llu%s: the manifest is damaged, and the "
			    "entry reads as EIO",
		  (unsigned long long)i, (int)e->plen, e->parent,
		  e->plen ? "/" : "", (int)e->nlen, e->name,
		  (unsigned long long)ino, (unsigned long long)i + 2,
		  S_ISDIR(e->st.st_mode) ? "" : " or an earlier entry's");
	return -EIO;
}

/* Entry index i of the manifest. */
void mf_entry_blocks(struct dataset *ds, struct mf_entry *e)
{
	uint64_t zeros;

	if (S_ISREG(e->st.st_mode) && e->has_data && !e->data_off &&
	    (zeros = manifest_holes(ds->mf, e->data_id)) &&
	    zeros <= (uint64_t)e->st.st_size)
		e->st.st_blocks = (blkcnt_t)(((uint64_t)e->st.st_size - zeros +
					      511) / 512);
}

int mf_entry_at(struct dataset *ds, uint64_t i, struct mf_entry *e)
{
	int r;

	e->index = i;
	r = mf_line_at(ds, i, entry_of_line, e);
	if (r)
		return r;
	mf_entry_blocks(ds, e);
	return mf_entry_placed(e, i);
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

/*
 * Whether the line after the one at p (whose key is kp/kn) keeps the
 * order: a key edited to a bigger one stops a search before the names it
 * passes over, which would be said not to be there.  kp2/kn2: room.
 */
static bool next_in_order(const char *p, const char *end, const char *kp,
			  size_t plen, const char *kn, size_t nlen, char *kp2,
			  char *kn2)
{
	const char *line;
	size_t n, plen2, nlen2;

	if (!nth_line(p, (size_t)(end - p), 1, &line, &n))
		return true; /* the frame's last */
	return !line_key(line, n, kp2, &plen2, kn2, &nlen2) &&
	       zmf_key_cmp(kp, plen, kn, nlen, kp2, plen2, kn2, nlen2) < 0;
}

static int seek_in_frame(const char *p, size_t len, void *arg)
{
	struct seek_call *c = arg;
	/* escapes at most quadruple: room for the escaped forms' worst, for
	 * a line's key and the next's */
	char *kp = malloc(8 * PATH_MAX), *kn = malloc(8 * (NAME_MAX + 1));
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
		if (cmp > 0 && !next_in_order(line, end, kp, plen, kn, nlen,
					      kp + 4 * PATH_MAX,
					      kn + 4 * (NAME_MAX + 1)))
			r = -EBADMSG; /* the name may be further on */
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
int mf_seek(struct dataset *ds, const char *parent, size_t plen,
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

/* --- the files packed after a file, for pushes --- */

/* Entries passed over at most in all, and in a row in other data files
 * (big files of their own, data shared with another pack's file): past
 * those, the pack has ended. */
#define MF_NEIGHBOUR_SCAN 1024
#define MF_NEIGHBOUR_FOREIGN 32

/* A walk for manifest_neighbours(), a frame at a time. */
struct neighbour_walk {
	uint64_t index, end; /* the next entry, and where to give up */
	struct mf_entry *e;
	uint64_t data_id, next, hi;
	struct mf_neighbour *out;
	unsigned int n, max, foreign;
	bool done;
};

/* Entry e, the walk's index-th: on, or done (false). */
static bool neighbour_step(struct neighbour_walk *w, const struct mf_entry *e)
{
	if (!S_ISREG(e->st.st_mode) || !e->has_data ||
	    e->st.st_ino != w->index + 2)
		return true;
	if (e->data_id != w->data_id)
		return ++w->foreign < MF_NEIGHBOUR_FOREIGN;
	w->foreign = 0;
	if (e->data_off < w->next)
		return true; /* data shared with an earlier file */
	if (e->data_off + (uint64_t)e->st.st_size > w->hi)
		return false;
	w->out[w->n++] = (struct mf_neighbour){e->st.st_ino, e->data_off,
					       (uint64_t)e->st.st_size};
	w->next = e->data_off + (uint64_t)e->st.st_size;
	return w->n < w->max;
}

static int neighbours_in_frame(const char *p, size_t len, void *arg)
{
	struct neighbour_walk *w = arg;
	unsigned int k = (unsigned int)(w->index % ZMF_FRAME_ENTRIES);
	const char *line, *end = p + len;
	size_t n;

	if (!nth_line(p, len, k, &line, &n))
		return -EBADMSG;
	for (; line < end && !w->done; line += n + 1, w->index++) {
		if (!nth_line(line, (size_t)(end - line), 0, &line, &n))
			break;
		if (w->index >= w->end || parse_entry(line, n, w->e) ||
		    !neighbour_step(w, w->e))
			w->done = true;
	}
	return 0;
}

/*
 * The files packed after inode ino whose data lies wholly in [lo, hi) of
 * ino's data file (mkzfolio writes small files in manifest order, each
 * whole in one frame): up to max of them, in data order, into out.  Their
 * count; 0 when there is none or ino is no such file.  Entries that are no
 * file with data of its own in this pack (directories, links, empty files,
 * later names of a hard link, data shared with an earlier file, big files)
 * are passed over.  The manifest is read a frame at a time, through the
 * cache.
 */
unsigned int manifest_neighbours(struct dataset *ds, fuse_ino_t ino,
				 uint64_t lo, uint64_t hi,
				 struct mf_neighbour *out, unsigned int max)
{
	struct neighbour_walk w = {.next = lo, .hi = hi, .out = out,
				   .max = max};

	if (!max || !manifest_ino(ds, ino) || !(w.e = malloc(sizeof(*w.e))))
		return 0;
	if (mf_entry_at(ds, ino - 2, w.e) || !w.e->has_data) {
		free(w.e);
		return 0;
	}
	w.data_id = w.e->data_id;
	w.index = ino - 1; /* the entry after ino's */
	w.end = w.index + MF_NEIGHBOUR_SCAN;
	if (w.end > ds->mf->nentries) /* a frame may hold more lines */
		w.end = ds->mf->nentries;
	while (!w.done && w.index < ds->mf->nentries &&
	       !mf_frame(ds, (uint32_t)(w.index / ZMF_FRAME_ENTRIES),
			 neighbours_in_frame, &w))
		;
	free(w.e);
	return w.n;
}
