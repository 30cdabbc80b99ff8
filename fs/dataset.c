// SPDX-License-Identifier: MIT
/*
 * The dataset: the backing tree, its names and its listing.
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

/* "name.zst" -> "name" (a new string), or NULL. */
static char *strip_zst(const char *name)
{
	return strndup(name, strlen(name) - ZST_LEN);
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

int backing_lstat(struct dataset *ds, const char *path, struct stat *st)
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

/* The backing entry served as name: a resolved name and its lstat. */
struct backing_name {
	char *bname; /* backing name in its directory */
	struct stat st;
	bool decode; /* a .zst served decoded */
};

/* An lstat's error that says the name is not there (a name too long for
 * the backing file system cannot be there). */
static bool not_there(int err)
{
	return err == -ENOENT || err == -ENOTDIR || err == -ENAMETOOLONG;
}

/* Which entry of dirfd is served as name; -ENOENT only when none is (a
 * negative entry the kernel keeps), another error when lstat failed. */
static int resolve_name(int dirfd, const char *name, struct backing_name *b)
{
	struct stat plain;
	int perr = lstat_at(dirfd, name, &plain), zerr;
	char *zname;

	if (perr && !not_there(perr))
		return perr;
	if (asprintf(&zname, "%s%s", name, zst_suffix) < 0)
		return -ENOMEM;
	zerr = perr ? lstat_at(dirfd, zname, &b->st) : -ENOENT;
	if (!zerr && S_ISREG(b->st.st_mode)) {
		b->bname = zname;
		b->decode = true;
		return 0;
	}
	free(zname);
	if (perr)
		return zerr && !not_there(zerr) ? zerr : -ENOENT;
	b->decode = false;
	if (ends_with_zst(name) && S_ISREG(plain.st_mode)) {
		/* served stripped, unless the stripped name is taken: then
		 * the name on disk is the same file (a symlink to it works) */
		char *stripped = strip_zst(name);
		struct stat tmp;
		bool taken = stripped && lstat_at(dirfd, stripped, &tmp) == 0;

		free(stripped);
		b->decode = !taken;
	}
	b->bname = strdup(name);
	b->st = plain;
	return b->bname ? 0 : -ENOMEM;
}

/* A single mounted file: name is it, or it without ".zst". */
static int resolve_single(struct dataset *ds, const char *name,
			  struct backing_name *b)
{
	const char *one = ds->single;
	bool decoded = ends_with_zst(one) &&
		       strlen(name) == strlen(one) - ZST_LEN &&
		       strncmp(name, one, strlen(name)) == 0;
	int r;

	if (strcmp(name, one) != 0 && !decoded)
		return -ENOENT;
	r = lstat_at(ds->rootfd, one, &b->st);
	if (r)
		return r;
	b->decode = decoded;
	b->bname = strdup(one);
	return b->bname ? 0 : -ENOMEM;
}

/* The control directory and its files, which shadow the backing tree. */
static bool lookup_ctl(struct dataset *ds, struct znode *parent,
		       const char *name, struct znode **out, int *err)
{
	if (parent->kind == ZN_CTL_DIR) {
		*err = ctl_lookup(ds, parent, name, out);
		return true;
	}
	if (parent == ds->root && ds->ctl_root &&
	    strcmp(name, ds->opt->ctl) == 0) {
		atomic_fetch_add(&ds->ctl_root->nlookup, 1);
		*out = ds->ctl_root;
		*err = 0;
		return true;
	}
	return false;
}

/* The backing entry that parent/name serves, and its dataset path. */
static int resolve_backing(struct dataset *ds, struct znode *parent,
			   const char *name, struct backing_name *b,
			   char **path)
{
	int dirfd, r;

	if (ds->single) {
		r = resolve_single(ds, name, b);
	} else {
		dirfd = dataset_open_backing(ds, parent->path,
					     O_PATH | O_DIRECTORY);
		if (dirfd < 0)
			return dirfd;
		r = resolve_name(dirfd, name, b);
		close(dirfd);
	}
	if (r)
		return r;
	*path = ds->single ? strdup(b->bname) : join_path(parent->path,
							   b->bname);
	free(b->bname);
	return *path ? 0 : -ENOMEM;
}

/*
 * The node parent/name serves, with one more kernel lookup counted, and
 * its attributes in st (as znode_stat() gives them, from the lstat that
 * found it); NULL with *err.
 */
struct znode *dataset_lookup(struct dataset *ds, struct znode *parent,
			     const char *name, struct stat *st, int *err)
{
	struct backing_name b;
	struct znode *n = NULL;
	char *path;

	if (lookup_ctl(ds, parent, name, &n, err)) {
		if (!*err && n->kind == ZN_CTL_FILE &&
		    atomic_load(&ds->kernel_opens))
			ctl_text_new(ds, n); /* an open by path: see ctl.c */
		if (!*err)
			ctl_stat(ds, n, st);
		return *err ? NULL : n;
	}
	if (parent->kind != ZN_DIR) {
		*err = -ENOTDIR;
		return NULL;
	}
	*err = resolve_backing(ds, parent, name, &b, &path);
	if (*err)
		return NULL;
	n = inode_get(ds, &b.st, b.decode, path);
	free(path);
	*err = n ? 0 : -ENOMEM;
	if (n) {
		*st = b.st;
		znode_stat_from(ds, n, st);
	}
	return n;
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

/* --- listing --- */

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

/* A growing array of entries. */
struct entries {
	struct dir_entry *e;
	size_t n, cap;
};

static int entries_add(struct entries *v, const char *name, mode_t type,
		       ino_t ino)
{
	if (v->n == v->cap) {
		size_t ncap = v->cap ? v->cap * 2 : 32;
		struct dir_entry *ne = realloc(v->e, ncap * sizeof(*ne));

		if (!ne)
			return -ENOMEM;
		v->e = ne;
		v->cap = ncap;
	}
	v->e[v->n].name = strdup(name);
	if (!v->e[v->n].name)
		return -ENOMEM;
	v->e[v->n].type = type;
	v->e[v->n].ino = ino;
	v->e[v->n].decode = false;
	v->n++;
	return 0;
}

/* Every backing entry of dir as it is named on disk. */
static int read_backing_dir(struct dataset *ds, struct znode *dir,
			    struct entries *v)
{
	int fd = dataset_open_backing(ds, dir->path, O_RDONLY | O_DIRECTORY);
	struct dirent *d;
	struct stat st;
	DIR *dp;
	int r = 0;

	if (fd < 0)
		return fd;
	dp = fdopendir(fd);
	if (!dp) {
		close(fd);
		return -errno;
	}
	while (!r && (d = readdir(dp))) {
		mode_t type = dtype_mode(d->d_type);

		if (strcmp(d->d_name, ".") == 0 || strcmp(d->d_name, "..") == 0)
			continue;
		if (dir == ds->root && strcmp(d->d_name, ds->opt->ctl) == 0)
			continue; /* the control directory shadows it */
		if (!type && lstat_at(fd, d->d_name, &st) == 0)
			type = st.st_mode & S_IFMT;
		r = entries_add(v, d->d_name, type, d->d_ino);
	}
	closedir(dp);
	return r;
}

/*
 * Serve "name.zst" as "name" where the directory holds no "name": every
 * rename is decided against the names on disk, then applied.
 */
static int serve_names(struct entries *v)
{
	size_t n = v->n ? v->n : 1;
	char **sorted = calloc(n, sizeof(*sorted));
	char **old = calloc(n, sizeof(*old));

	if (!sorted || !old) {
		free(sorted);
		free(old);
		return -ENOMEM;
	}
	for (size_t i = 0; i < v->n; i++)
		sorted[i] = v->e[i].name;
	qsort(sorted, v->n, sizeof(*sorted), cmp_str);
	for (size_t i = 0; i < v->n; i++) {
		char *stripped;

		if (!S_ISREG(v->e[i].type) || !ends_with_zst(v->e[i].name))
			continue;
		stripped = strip_zst(v->e[i].name);
		if (stripped && !name_in(sorted, v->n, stripped)) {
			old[i] = v->e[i].name;
			v->e[i].name = stripped;
			v->e[i].decode = true;
		} else {
			free(stripped);
		}
	}
	for (size_t i = 0; i < v->n; i++)
		free(old[i]);
	free(sorted);
	free(old);
	return 0;
}

int dataset_list(struct dataset *ds, struct znode *dir, struct dir_entry **out,
		 size_t *count)
{
	struct entries v = {0};
	int r;

	if (dir->kind == ZN_CTL_DIR)
		return ctl_list(ds, dir, out, count);
	if (ds->single) {
		char *name = ends_with_zst(ds->single) ? strip_zst(ds->single)
						       : strdup(ds->single);

		r = name ? entries_add(&v, name, S_IFREG, 0) : -ENOMEM;
		if (!r)
			v.e[0].decode = ends_with_zst(ds->single);
		free(name);
	} else {
		r = read_backing_dir(ds, dir, &v);
		if (!r)
			r = serve_names(&v);
	}
	if (r) {
		dataset_list_free(v.e, v.n);
		return r;
	}
	*out = v.e;
	*count = v.n;
	return 0;
}

void dataset_list_free(struct dir_entry *e, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(e[i].name);
	}
	free(e);
}

/* --- the dataset's lifetime --- */

/*
 * One mounted FILE.zst: zstd data, or nothing (an empty file is an empty
 * stream); anything else is refused now rather than mounted to read as
 * EIO.  What is wrong further in is found when it is read, as for a tree.
 */
static int check_single(const char *path, char *err, size_t errlen)
{
	uint8_t b[4];
	uint32_t m;
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -errno;
	}
	n = pread(fd, b, sizeof(b), 0);
	if (n < 0)
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
	close(fd);
	if (n < 0)
		return -EIO;
	if (n == 0)
		return 0;
	m = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
	    (uint32_t)b[3] << 24;
	if (n == (ssize_t)sizeof(b) &&
	    (m == ZSEEK_ZSTD_MAGIC ||
	     (m & ZSEEK_SKIPPABLE_MASK) == ZSEEK_SKIPPABLE_START))
		return 0;
	snprintf(err, errlen, "%s: not zstd data (%s)", path,
		 n >= 2 && b[0] == 0x1f && b[1] == 0x8b ? "gzip?"
		 : n >= 4 && !memcmp(b, "\xfd" "7zX", 4) ? "xz?"
		 : n >= 3 && !memcmp(b, "BZh", 3) ? "bzip2?"
		 : "it does not start with zstd's magic number");
	return -EINVAL;
}

/* The dataset root: a directory, or the directory of one mounted file. */
static int open_root(struct dataset *ds, const char *path, char *err,
		     size_t errlen)
{
	struct stat st;
	char *copy, *slash;

	if (stat(path, &st)) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -errno;
	}
	ds->root_st = st;
	if (S_ISDIR(st.st_mode)) {
		ds->rootfd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	} else if (S_ISREG(st.st_mode)) {
		int r = ends_with_zst(path) ? check_single(path, err, errlen)
					    : 0;

		if (r)
			return r;
		copy = strdup(path);
		if (!copy)
			return -ENOMEM;
		slash = strrchr(copy, '/');
		ds->single = strdup(slash ? slash + 1 : copy);
		if (slash)
			*slash = '\0';
		ds->rootfd = open(slash ? (*copy ? copy : "/") : ".",
				  O_PATH | O_DIRECTORY | O_CLOEXEC);
		free(copy);
	} else {
		snprintf(err, errlen, "%s: not a directory or a file", path);
		return -EINVAL;
	}
	if (ds->rootfd < 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return -errno;
	}
	return 0;
}

/* A size option in pages; "max" is no limit. */
static unsigned long option_pages(uint64_t bytes)
{
	return bytes == UINT64_MAX ? (unsigned long)COUNTER_MAX
				   : (unsigned long)(bytes >> ZF_PAGE_SHIFT);
}

/* The mount's cache and readahead, as the options say. */
static int start_engine(struct dataset *ds, const struct options *opt)
{
	struct cache_config cc = {
		.budget = {
			.max_pages = opt->budget >> ZF_PAGE_SHIFT,
			.high_pages = option_pages(opt->high),
			.group_max_pages = option_pages(opt->group_max),
			.group_high_pages = option_pages(opt->group_high),
			.group_by = opt->group_by,
			.reclaim_headroom = opt->ra_reclaim == RA_RECLAIM_BATCH,
		},
		.lockless = opt->lockless,
		.fill_threads = opt->decode_threads,
		.ccache_pct = options_ccache_pct(opt),
	};
	struct ra_config rc = {
		.ra_pages = opt->ra_kb / 4,
		.reclaim = opt->ra_reclaim,
		.readaround = opt->readaround,
	};
	int r = cache_init(&ds->cache, &cc);

	/* idle decoders are reclaim's last resort */
	ds->cache.shrink_other = stream_pool_shrink;
	ds->cache.shrink_other_arg = &ds->streams;
	return r ? r : readahead_init(&ds->cache, &rc);
}

/* Whether the dataset's root has an entry named as the control directory,
 * which the control directory hides. */
static bool ctl_name_taken(struct dataset *ds, const char *ctl)
{
	char zst[NAME_MAX + 8];
	struct stat st;
	bool r;

	if (ds->single || !ctl || !*ctl)
		return false;
	if (ds->mf) {
		cache_thread_register(); /* reads through the cache */
		r = manifest_lookup(ds, FUSE_ROOT_ID, ctl, &st) == 0;
		cache_thread_unregister();
		return r;
	}
	/* NAME.zst shows as NAME only as a regular file */
	snprintf(zst, sizeof(zst), "%.*s.zst", NAME_MAX, ctl);
	return backing_lstat(ds, ctl, &st) == 0 ||
	       (backing_lstat(ds, zst, &st) == 0 && S_ISREG(st.st_mode));
}

/*
 * share=NAME: the mount's budget joins the limit it shares with the other
 * mounts of this user by that name, met in /dev/shm (accounting/share.c).
 */
static int join_share(struct dataset *ds, const struct options *opt,
		      char *err, size_t errlen)
{
	uint64_t max = opt->share_max ? opt->share_max : opt->budget;
	char path[128];

	if (!opt->share) {
		if (opt->share_max)
			snprintf(err, errlen, "share_max= without share=: "
				 "give the mounts that share it a name");
		return opt->share_max ? -EINVAL : 0;
	}
	if (max < (1u << 20)) {
		snprintf(err, errlen, "share_max=%llu: at least 1M",
			 (unsigned long long)max);
		return -EINVAL;
	}
	if (strlen(opt->share) > 64 ||
	    strspn(opt->share, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
			       "0123456789._-") != strlen(opt->share)) {
		snprintf(err, errlen, "share=%s: a name of letters, digits, "
			 "'.', '_' and '-', up to 64 of them", opt->share);
		return -EINVAL;
	}
	snprintf(path, sizeof(path), "/dev/shm/zfolio-share.%u.%s",
		 (unsigned int)geteuid(), opt->share);
	return share_join(&ds->cache.budget, path, opt->share,
			  (unsigned long)(max >> ZF_PAGE_SHIFT), err, errlen);
}

int dataset_open(struct dataset *ds, struct options *opt, char *err,
		 size_t errlen)
{
	int r;

	memset(ds, 0, sizeof(*ds));
	ds->opt = opt;
	ds->rootfd = -1;
	ds->owner = getuid();
	ds->attr_timeout = 1.0;
	pthread_mutex_init(&ds->ctl_lock, NULL);
	pthread_mutex_init(&ds->handles_lock, NULL);
	pthread_mutex_init(&ds->usage_lock, NULL);
	pthread_mutex_init(&ds->file_lru_lock, NULL);
	CDS_INIT_LIST_HEAD(&ds->file_lru);
	CDS_INIT_LIST_HEAD(&ds->idle_files);
	pthread_mutex_init(&ds->streams.lock, NULL);
	fd_cache_init(&ds->fds, opt->max_open);
	CDS_INIT_LIST_HEAD(&ds->streams.lru);
	CDS_INIT_LIST_HEAD(&ds->handles);
	/* before any file is indexed: the windows frames may need, and the
	 * dictionaries they may name */
	zseek_set_window_max(opt->max_window);
	snprintf(err, errlen, "dict=");
	r = zseek_dict_load(opt->dict, err + strlen(err), errlen - strlen(err));
	if (r)
		return r;
	*err = '\0';
	r = store_is_url(opt->dataset) ? remote_open(ds, err, errlen)
				       : open_root(ds, opt->dataset, err, errlen);
	if (r)
		return r;
	ds->root = znode_new(ZN_DIR, ".");
	if (!ds->root) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	ds->root->nodeid = FUSE_ROOT_ID;
	r = start_engine(ds, opt);
	if (r) {
		snprintf(err, errlen, "cannot start the cache: %s",
			 strerror(-r));
		return r;
	}
	r = join_share(ds, opt, err, errlen);
	if (r)
		return r;
	/* metadata the whole time the mount lives */
	meta_charge(ds, (long)zseek_dict_bytes());
	if (!ds->single) {
		r = manifest_open(ds, err, errlen);
		if (r >= 0)
			ds->ctl_hides = ctl_name_taken(ds, opt->ctl);
		/* the daemon forks next: no connection of this thread's goes */
		remote_thread_done();
		if (r < 0)
			return r;
		if (ds->store) /* the control directory's times */
			ds->root_st = ds->mf->root;
	}
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

/* After the workers are gone; safe on a dataset_open() that failed. */
void dataset_close(struct dataset *ds)
{
	if (ds->cache.budget.by_id)
		cache_stop(&ds->cache); /* fills in flight hold mappings */
	cache_thread_register(); /* the inode table wants an RCU thread */
	if (ds->handles.next)
		handles_free_all(ds);
	manifest_close(ds);
	inodes_fini(ds);
	while (ds->ctl_nodes) {
		struct znode *n = ds->ctl_nodes;

		ds->ctl_nodes = n->ctl_next;
		znode_free(n);
	}
	if (ds->root)
		znode_free(ds->root);
	ds->root = NULL;
	cache_thread_unregister();
	if (ds->cache.budget.by_id)
		cache_destroy(&ds->cache);
	if (ds->rootfd >= 0)
		close(ds->rootfd);
	remote_close(ds);
	free(ds->single);
	zseek_dict_free_all();
}
