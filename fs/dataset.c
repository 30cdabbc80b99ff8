// SPDX-License-Identifier: MIT
/*
 * The dataset: the backing tree and its inodes.
 *
 * Every backing path is opened relative to the dataset root with openat2()
 * and RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS: the daemon never follows a
 * symlink, and never leaves the root, whatever the tree holds.  Symlinks
 * are served as links (readlink returns their target as it is stored);
 * device nodes, FIFOs and sockets are served as their type and never
 * opened.
 *
 * Names: a regular file "name.zst" is served decoded as "name", unless the
 * same directory also holds "name"; then both appear as they are.
 *
 * Inodes are keyed by the backing (device, inode, decoded) and their FUSE
 * node id is their address; the kernel's lookup count decides their life.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

static const char zst_suffix[] = ".zst";
#define ZST_LEN (sizeof(zst_suffix) - 1)

int dataset_open_backing(struct dataset *ds, const char *path, int flags)
{
	struct open_how how = {
		.flags = (uint64_t)(flags | O_NOFOLLOW | O_CLOEXEC),
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
			   RESOLVE_NO_MAGICLINKS,
	};
	long fd = syscall(SYS_openat2, ds->rootfd, path, &how, sizeof(how));

	if (fd < 0 && errno == ENOSYS) /* before Linux 5.6 */
		fd = openat(ds->rootfd, path, flags | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? -errno : (int)fd;
}

static bool ends_with_zst(const char *name)
{
	size_t n = strlen(name);

	return n > ZST_LEN && strcmp(name + n - ZST_LEN, zst_suffix) == 0;
}

static enum znode_kind kind_of(mode_t mode)
{
	if (S_ISDIR(mode))
		return ZN_DIR;
	if (S_ISREG(mode))
		return ZN_FILE;
	if (S_ISLNK(mode))
		return ZN_SYMLINK;
	return ZN_SPECIAL;
}

static size_t node_hash(struct dataset *ds, dev_t dev, ino_t ino)
{
	uint64_t h = (uint64_t)ino * 0x9E3779B97F4A7C15ull ^ (uint64_t)dev;

	return (size_t)(h ^ (h >> 29)) & (ds->table_size - 1);
}

static int table_grow(struct dataset *ds)
{
	size_t nsize = ds->table_size * 2;
	struct znode **nt = calloc(nsize, sizeof(*nt));

	if (!nt)
		return -ENOMEM;
	for (size_t i = 0; i < ds->table_size; i++) {
		struct znode *n = ds->table[i], *next;

		for (; n; n = next) {
			uint64_t h = (uint64_t)n->ino * 0x9E3779B97F4A7C15ull ^
				     (uint64_t)n->dev;
			size_t b = (size_t)(h ^ (h >> 29)) & (nsize - 1);

			next = n->hash_next;
			n->hash_next = nt[b];
			nt[b] = n;
		}
	}
	free(ds->table);
	ds->table = nt;
	ds->table_size = nsize;
	return 0;
}

struct znode *znode_new(enum znode_kind kind, const char *path)
{
	struct znode *n = calloc(1, sizeof(*n));

	if (!n)
		return NULL;
	n->kind = kind;
	n->path = path ? strdup(path) : NULL;
	if (path && !n->path) {
		free(n);
		return NULL;
	}
	n->nodeid = (uint64_t)(uintptr_t)n;
	pthread_mutex_init(&n->lock, NULL);
	atomic_init(&n->nlookup, 0);
	return n;
}

void znode_free(struct znode *n)
{
	if (n->file)
		zfile_put(n->file);
	pthread_mutex_destroy(&n->lock);
	free(n->path);
	free(n);
}

struct znode *znode_of(struct dataset *ds, fuse_ino_t ino)
{
	if (ino == FUSE_ROOT_ID)
		return ds->root;
	return (struct znode *)(uintptr_t)ino;
}

/* Split "a/b/c" into the parent's fd and "c". */
static int open_parent(struct dataset *ds, const char *path, const char **leaf)
{
	const char *slash = strrchr(path, '/');
	char *dir;
	int fd;

	if (!slash) {
		*leaf = path;
		return dataset_open_backing(ds, ".", O_PATH | O_DIRECTORY);
	}
	dir = strndup(path, (size_t)(slash - path));
	if (!dir)
		return -ENOMEM;
	*leaf = slash + 1;
	fd = dataset_open_backing(ds, dir, O_PATH | O_DIRECTORY);
	free(dir);
	return fd;
}

static int lstat_at(int dirfd, const char *name, struct stat *st)
{
	return fstatat(dirfd, name, st, AT_SYMLINK_NOFOLLOW) ? -errno : 0;
}

static int backing_lstat(struct dataset *ds, const char *path, struct stat *st)
{
	const char *leaf;
	int fd, r;

	if (strcmp(path, ".") == 0)
		return fstat(ds->rootfd, st) ? -errno : 0;
	fd = open_parent(ds, path, &leaf);
	if (fd < 0)
		return fd;
	r = lstat_at(fd, leaf, st);
	close(fd);
	return r;
}

static char *join_path(const char *dir, const char *name)
{
	char *p;

	if (strcmp(dir, ".") == 0)
		return strdup(name);
	if (asprintf(&p, "%s/%s", dir, name) < 0)
		return NULL;
	return p;
}

/* Which backing entry is served as name in dirfd; 0 or -ENOENT. */
static int resolve_name(int dirfd, const char *name, char **bname,
			struct stat *st, bool *decode)
{
	struct stat plain;
	bool has_plain = lstat_at(dirfd, name, &plain) == 0;
	char *zname;

	if (asprintf(&zname, "%s%s", name, zst_suffix) < 0)
		return -ENOMEM;
	if (!has_plain && lstat_at(dirfd, zname, st) == 0 &&
	    S_ISREG(st->st_mode)) {
		*bname = zname;
		*decode = true;
		return 0;
	}
	free(zname);
	if (!has_plain)
		return -ENOENT;
	if (ends_with_zst(name) && S_ISREG(plain.st_mode)) {
		/* served stripped, unless the stripped name is taken */
		char *stripped = strndup(name, strlen(name) - ZST_LEN);
		struct stat tmp;
		bool taken = stripped && lstat_at(dirfd, stripped, &tmp) == 0;

		free(stripped);
		if (!taken)
			return -ENOENT;
	}
	*bname = strdup(name);
	*st = plain;
	*decode = false;
	return *bname ? 0 : -ENOMEM;
}

static struct znode *table_find(struct dataset *ds, dev_t dev, ino_t ino,
				bool decode)
{
	struct znode *n = ds->table[node_hash(ds, dev, ino)];

	for (; n; n = n->hash_next)
		if (n->dev == dev && n->ino == ino && n->decode == decode)
			return n;
	return NULL;
}

struct znode *dataset_lookup(struct dataset *ds, struct znode *parent,
			     const char *name, int *err)
{
	struct stat st;
	struct znode *n;
	bool decode = false;
	char *bname = NULL, *path;
	int dirfd;

	if (parent->kind == ZN_CTL_DIR) {
		*err = ctl_lookup(ds, parent, name, &n);
		return *err ? NULL : n;
	}
	if (parent == ds->root && ds->ctl_root &&
	    strcmp(name, ds->opt->ctl) == 0) {
		atomic_fetch_add(&ds->ctl_root->nlookup, 1);
		*err = 0;
		return ds->ctl_root;
	}
	if (parent->kind != ZN_DIR) {
		*err = -ENOTDIR;
		return NULL;
	}
	if (ds->single) {
		size_t n1 = strlen(ds->single);
		bool match = strcmp(name, ds->single) == 0 ||
			     (ends_with_zst(ds->single) &&
			      strlen(name) == n1 - ZST_LEN &&
			      strncmp(name, ds->single, n1 - ZST_LEN) == 0);

		if (!match) {
			*err = -ENOENT;
			return NULL;
		}
		*err = lstat_at(ds->rootfd, ds->single, &st);
		if (*err)
			return NULL;
		decode = strcmp(name, ds->single) != 0;
		bname = strdup(ds->single);
	} else {
		dirfd = dataset_open_backing(ds, parent->path,
					     O_PATH | O_DIRECTORY);
		if (dirfd < 0) {
			*err = dirfd;
			return NULL;
		}
		*err = resolve_name(dirfd, name, &bname, &st, &decode);
		close(dirfd);
		if (*err)
			return NULL;
	}
	path = ds->single ? strdup(bname) : join_path(parent->path, bname);
	free(bname);
	if (!path) {
		*err = -ENOMEM;
		return NULL;
	}
	pthread_mutex_lock(&ds->table_lock);
	n = table_find(ds, st.st_dev, st.st_ino, decode);
	if (!n) {
		n = znode_new(kind_of(st.st_mode), path);
		if (n) {
			n->dev = st.st_dev;
			n->ino = st.st_ino;
			n->decode = decode;
			if (ds->nnodes >= ds->table_size)
				table_grow(ds);
			size_t b = node_hash(ds, n->dev, n->ino);

			n->hash_next = ds->table[b];
			ds->table[b] = n;
			ds->nnodes++;
		}
	}
	if (n) {
		n->st = st;
		atomic_fetch_add(&n->nlookup, 1);
	}
	pthread_mutex_unlock(&ds->table_lock);
	free(path);
	*err = n ? 0 : -ENOMEM;
	return n;
}

void znode_forget(struct dataset *ds, struct znode *n, uint64_t nlookup)
{
	struct znode **pp;

	if (n == ds->root || n->kind == ZN_CTL_DIR || n->kind == ZN_CTL_FILE)
		return; /* these live as long as the mount */
	pthread_mutex_lock(&ds->table_lock);
	if (atomic_fetch_sub(&n->nlookup, nlookup) != nlookup) {
		pthread_mutex_unlock(&ds->table_lock);
		return;
	}
	for (pp = &ds->table[node_hash(ds, n->dev, n->ino)]; *pp;
	     pp = &(*pp)->hash_next)
		if (*pp == n) {
			*pp = n->hash_next;
			ds->nnodes--;
			break;
		}
	pthread_mutex_unlock(&ds->table_lock);
	znode_free(n);
}

/* --- files: index, geometry, mapping --- */

void zfile_put(struct zfile *f)
{
	mapping_put(f->mapping);
}

static bool same_backing(const struct stat *a, const struct stat *b)
{
	return a->st_ino == b->st_ino && a->st_dev == b->st_dev &&
	       a->st_size == b->st_size &&
	       a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
	       a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

static int zfile_open(struct dataset *ds, struct znode *n, struct zfile **out)
{
	struct zfile *f = calloc(1, sizeof(*f));
	char err[256] = "";
	int r;

	if (!f)
		return -ENOMEM;
	f->decode = n->decode;
	atomic_init(&f->dontcache, ds->opt->backing_cache == BACKING_DROP);
	f->fd = dataset_open_backing(ds, n->path, O_RDONLY);
	if (f->fd < 0) {
		r = f->fd;
		free(f);
		return r;
	}
	if (fstat(f->fd, &f->st) || !S_ISREG(f->st.st_mode)) {
		r = -EIO;
		goto fail;
	}
	/*
	 * zfolio reads whole windows of frames itself: the kernel's readahead
	 * of the backing file would only bring pages it does not want, into a
	 * page cache outside the budget.
	 */
	posix_fadvise(f->fd, 0, 0, POSIX_FADV_RANDOM);
	r = zseek_index_build(zseek_pread_fd, &f->fd, (uint64_t)f->st.st_size,
			      f->decode, &f->idx, err, sizeof(err));
	if (r) {
		fprintf(stderr, "zfolio: %s: %s\n", n->path, err);
		r = r == -ENOMEM ? r : -EIO;
		goto fail;
	}
	r = zfile_build_geometry(f);
	if (r)
		goto fail;
	pthread_mutex_init(&f->stream_lock, NULL);
	f->mapping = mapping_create(&ds->cache, &zfile_mapping_ops, f,
				    f->idx.content_size, f->nslots,
				    f->folio_size, f->starts);
	if (!f->mapping) {
		pthread_mutex_destroy(&f->stream_lock);
		r = -ENOMEM;
		goto fail;
	}
	if (f->idx.nunsized) /* counted once per file: a slow file */
		stat_mod(&ds->cache.budget.root, STAT_SLOW_FRAMES,
			 f->idx.nunsized);
	*out = f;
	return 0;
fail:
	zseek_index_free(&f->idx);
	free(f->starts);
	free(f->slot_frame);
	free(f->slot_skip);
	close(f->fd);
	free(f);
	return r;
}

/*
 * The node's current zfile, with a reference for the caller.  With reopen
 * (an open), a backing file that changed since it was indexed is indexed
 * again and the old folios are dropped.
 */
int znode_file(struct dataset *ds, struct znode *n, bool reopen,
	       struct zfile **out)
{
	struct stat st;
	struct zfile *f = NULL;
	int r = 0;

	if (n->kind != ZN_FILE)
		return -EISDIR;
	pthread_mutex_lock(&n->lock);
	if (n->file && reopen &&
	    (backing_lstat(ds, n->path, &st) || !same_backing(&st,
							       &n->file->st))) {
		mapping_invalidate(n->file->mapping);
		zfile_put(n->file);
		n->file = NULL;
	}
	if (!n->file)
		r = zfile_open(ds, n, &n->file);
	if (!r) {
		f = n->file;
		mapping_get(f->mapping);
	}
	pthread_mutex_unlock(&n->lock);
	*out = f;
	return r;
}

int znode_stat(struct dataset *ds, struct znode *n, struct stat *st)
{
	struct zfile *f;
	int r;

	if (n->kind == ZN_CTL_DIR || n->kind == ZN_CTL_FILE) {
		ctl_stat(ds, n, st);
		return 0;
	}
	if (n == ds->root) {
		*st = ds->root_st;
		if (ds->single) {
			st->st_mode = S_IFDIR | 0555;
			st->st_nlink = 2;
		}
		st->st_ino = FUSE_ROOT_ID;
		return 0;
	}
	r = backing_lstat(ds, n->path, st);
	if (r)
		return r;
	n->st = *st;
	if (n->kind == ZN_FILE && n->decode) {
		/* decoded: the size is the content's; blocks stay on disk */
		if (znode_file(ds, n, true, &f) == 0) {
			st->st_size = (off_t)f->idx.content_size;
			zfile_put(f);
		}
	}
	st->st_blksize = ZSEEK_DEFAULT_FRAME;
	return 0;
}

int dataset_readlink(struct dataset *ds, struct znode *n, char *buf,
		     size_t len)
{
	const char *leaf;
	ssize_t r;
	int fd;

	if (n->kind != ZN_SYMLINK)
		return -EINVAL;
	fd = open_parent(ds, n->path, &leaf);
	if (fd < 0)
		return fd;
	r = readlinkat(fd, leaf, buf, len - 1);
	close(fd);
	if (r < 0)
		return -errno;
	buf[r] = '\0';
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool name_in(char **sorted, size_t n, const char *name)
{
	return n && bsearch(&name, sorted, n, sizeof(char *), cmp_str);
}

static mode_t dtype_mode(unsigned char t)
{
	switch (t) {
	case DT_DIR: return S_IFDIR;
	case DT_REG: return S_IFREG;
	case DT_LNK: return S_IFLNK;
	case DT_CHR: return S_IFCHR;
	case DT_BLK: return S_IFBLK;
	case DT_FIFO: return S_IFIFO;
	case DT_SOCK: return S_IFSOCK;
	default: return 0;
	}
}

int dataset_list(struct dataset *ds, struct znode *dir, struct dir_entry **out,
		 size_t *count)
{
	struct dir_entry *e = NULL;
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *d;
	DIR *dp;
	int fd;

	if (dir->kind == ZN_CTL_DIR)
		return ctl_list(ds, dir, out, count);
	if (ds->single) {
		e = calloc(1, sizeof(*e));
		if (!e)
			return -ENOMEM;
		e->name = ends_with_zst(ds->single)
				  ? strndup(ds->single,
					    strlen(ds->single) - ZST_LEN)
				  : strdup(ds->single);
		e->type = S_IFREG;
		*out = e;
		*count = 1;
		return 0;
	}
	fd = dataset_open_backing(ds, dir->path, O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		return fd;
	dp = fdopendir(fd);
	if (!dp) {
		close(fd);
		return -errno;
	}
	while ((d = readdir(dp))) {
		if (strcmp(d->d_name, ".") == 0 || strcmp(d->d_name, "..") == 0)
			continue;
		if (dir == ds->root && strcmp(d->d_name, ds->opt->ctl) == 0)
			continue; /* the control directory shadows it */
		if (n == cap) {
			size_t ncap = cap ? cap * 2 : 32;
			struct dir_entry *ne = realloc(e, ncap * sizeof(*e));
			char **nn = realloc(names, ncap * sizeof(*nn));

			if (ne)
				e = ne;
			if (nn)
				names = nn;
			if (!ne || !nn)
				break;
			cap = ncap;
		}
		e[n].name = strdup(d->d_name);
		e[n].type = dtype_mode(d->d_type);
		e[n].ino = d->d_ino;
		if (!e[n].type) {
			struct stat st;

			if (lstat_at(fd, d->d_name, &st) == 0)
				e[n].type = st.st_mode & S_IFMT;
		}
		names[n] = e[n].name;
		n++;
	}
	closedir(dp);
	if (n)
		qsort(names, n, sizeof(*names), cmp_str);
	/* decide every rename against the original names, then apply */
	char **renamed = calloc(n ? n : 1, sizeof(*renamed));

	for (size_t i = 0; renamed && i < n; i++) {
		size_t len = strlen(e[i].name);

		if (S_ISREG(e[i].type) && ends_with_zst(e[i].name)) {
			char *stripped = strndup(e[i].name, len - ZST_LEN);

			if (stripped && !name_in(names, n, stripped))
				renamed[i] = stripped;
			else
				free(stripped);
		}
	}
	for (size_t i = 0; renamed && i < n; i++)
		if (renamed[i]) {
			free(e[i].name);
			e[i].name = renamed[i];
		}
	free(renamed);
	free(names);
	*out = e;
	*count = n;
	return 0;
}

void dataset_list_free(struct dir_entry *e, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(e[i].name);
	free(e);
}

static void free_all_nodes(struct dataset *ds)
{
	for (size_t i = 0; i < ds->table_size; i++) {
		struct znode *n = ds->table[i], *next;

		for (; n; n = next) {
			next = n->hash_next;
			znode_free(n);
		}
	}
	free(ds->table);
	ds->table = NULL;
}

int dataset_open(struct dataset *ds, struct options *opt, char *err,
		 size_t errlen)
{
	struct cache_config cc = {0};
	struct ra_config rc = {0};
	struct stat st;
	int r;

	memset(ds, 0, sizeof(*ds));
	ds->opt = opt;
	ds->rootfd = -1;
	ds->owner = getuid();
	ds->attr_timeout = 1.0;
	if (stat(opt->dataset, &st)) {
		snprintf(err, errlen, "%s: %s", opt->dataset, strerror(errno));
		return -errno;
	}
	if (S_ISDIR(st.st_mode)) {
		ds->rootfd = open(opt->dataset, O_PATH | O_DIRECTORY | O_CLOEXEC);
		ds->root_st = st;
	} else if (S_ISREG(st.st_mode)) {
		char *copy = strdup(opt->dataset), *slash;

		if (!copy)
			return -ENOMEM;
		slash = strrchr(copy, '/');
		ds->single = strdup(slash ? slash + 1 : copy);
		if (slash)
			*slash = '\0';
		ds->rootfd = open(slash ? (*copy ? copy : "/") : ".",
				  O_PATH | O_DIRECTORY | O_CLOEXEC);
		free(copy);
		ds->root_st = st;
	} else {
		snprintf(err, errlen, "%s: not a directory or a file",
			 opt->dataset);
		return -EINVAL;
	}
	if (ds->rootfd < 0) {
		snprintf(err, errlen, "%s: %s", opt->dataset, strerror(errno));
		return -errno;
	}
	pthread_mutex_init(&ds->table_lock, NULL);
	pthread_mutex_init(&ds->handles_lock, NULL);
	CDS_INIT_LIST_HEAD(&ds->handles);
	ds->table_size = 1024;
	ds->table = calloc(ds->table_size, sizeof(*ds->table));
	ds->root = znode_new(ZN_DIR, ".");
	if (!ds->table || !ds->root) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	ds->root->nodeid = FUSE_ROOT_ID;
	cc.budget.max_pages = opt->budget >> ZF_PAGE_SHIFT;
	cc.budget.high_pages = opt->high == UINT64_MAX
				       ? (unsigned long)COUNTER_MAX
				       : opt->high >> ZF_PAGE_SHIFT;
	cc.budget.group_max_pages = opt->group_max == UINT64_MAX
					    ? (unsigned long)COUNTER_MAX
					    : opt->group_max >> ZF_PAGE_SHIFT;
	cc.budget.group_high_pages =
		opt->group_high == UINT64_MAX
			? (unsigned long)COUNTER_MAX
			: opt->group_high >> ZF_PAGE_SHIFT;
	cc.budget.group_by = opt->group_by;
	cc.budget.reclaim_headroom = opt->ra_reclaim == RA_RECLAIM_BATCH;
	cc.lockless = opt->lockless;
	r = cache_init(&ds->cache, &cc);
	if (r) {
		snprintf(err, errlen, "cannot start the cache: %s",
			 strerror(-r));
		return r;
	}
	rc.ra_pages = opt->ra_kb / 4;
	rc.reclaim = opt->ra_reclaim;
	rc.readaround = opt->readaround;
	readahead_init(&ds->cache, &rc);
	if (opt->ctl && *opt->ctl) {
		ds->ctl_root = znode_ctl(ds, &ds->cache.budget.root, CTL_DIR_ID,
					 ZN_CTL_DIR);
		if (!ds->ctl_root) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
	}
	return 0;
}

void dataset_close(struct dataset *ds)
{
	if (ds->handles.next)
		handles_free_all(ds);
	if (ds->table)
		free_all_nodes(ds);
	while (ds->ctl_nodes) {
		struct znode *n = ds->ctl_nodes;

		ds->ctl_nodes = n->hash_next;
		znode_free(n);
	}
	if (ds->root)
		znode_free(ds->root);
	ds->root = NULL;
	cache_destroy(&ds->cache);
	if (ds->rootfd >= 0)
		close(ds->rootfd);
	free(ds->single);
}
