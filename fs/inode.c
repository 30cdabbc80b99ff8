// SPDX-License-Identifier: MIT
/*
 * Inodes: the lock-free table of backing inodes, and each file's backing
 * state (its fd, frame index and mapping).
 *
 * Backing inodes are keyed by (device, inode, decoded) and their FUSE node
 * id is their address; the kernel's lookup count decides their life.  The
 * table is liburcu's cds_lfht: lookups take no lock (workers are RCU
 * readers while they serve a request, QSBR).  A node's lookup count is
 * taken with increment-unless-zero, and a node at zero no longer matches:
 * its forget has begun, and a lookup that races with it adds a fresh node
 * instead.  The forget removes the node from the table and frees it after
 * a grace period (call_rcu), since a lookup may still be comparing keys.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* Buckets at the start; the table grows itself (CDS_LFHT_AUTO_RESIZE). */
#define INODES_INIT_BUCKETS 1024

struct inode_key {
	dev_t dev;
	ino_t ino;
	bool decode;
};

static unsigned long key_hash(const struct inode_key *k)
{
	uint64_t h = (uint64_t)k->ino * 0x9E3779B97F4A7C15ull ^
		     (uint64_t)k->dev ^ (uint64_t)k->decode << 63;

	return (unsigned long)(h ^ (h >> 29));
}

static int key_match(struct cds_lfht_node *hn, const void *key)
{
	const struct znode *n = caa_container_of(hn, struct znode, hnode);
	const struct inode_key *k = key;

	/* a node being forgotten is nobody's any more */
	return n->dev == k->dev && n->ino == k->ino && n->decode == k->decode &&
	       atomic_load_explicit(&n->nlookup, memory_order_acquire) > 0;
}

/* Increment unless zero: a node at zero is being forgotten. */
static bool nlookup_get(struct znode *n)
{
	unsigned long v = atomic_load_explicit(&n->nlookup,
					       memory_order_relaxed);

	while (v > 0)
		if (atomic_compare_exchange_weak_explicit(
			    &n->nlookup, &v, v + 1, memory_order_acquire,
			    memory_order_relaxed))
			return true;
	return false;
}

/*
 * Files of forgotten inodes.  The kernel forgets an inode that holds no
 * page cache whenever it shrinks its inode cache (memory pressure,
 * drop_caches), and with cache=engine its inodes never hold any: a file
 * not open would lose all zfolio cached of it then, however much room the
 * budget had.  So a forgotten file with folios still cached is kept
 * (IDLE_FILES_MAX at most, the oldest going first, and before any other
 * index when metadata is over its share: inodes_shrink()), and the next
 * node of the same backing inode takes it over if the backing file is
 * unchanged.  Its folios meanwhile age in the cache as any others do.
 * (With cache=kernel, an inode whose pages the kernel holds is kept by
 * the kernel, and folios handed over whole have left zfolio's cache.)
 * A file with a frame that failed is kept in either mode, and goes after
 * every other: what it knows keeps the frame's range refused (a big
 * frame's pieces before its checksum were served unchecked, and a new
 * file would serve them again).
 */
#define IDLE_FILES_MAX 256

struct idle_file {
	struct cds_list_head link; /* on ds->idle_files */
	struct inode_key key;
	struct zfile *file;
};

/* The kept file to let go first, taken off the list (its lock held): the
 * oldest of those without a failed frame, unless files with one hold over
 * half the places (then the oldest of those: they must not push out every
 * other), or there is no other. */
static struct idle_file *idle_victim(struct dataset *ds)
{
	struct idle_file *e, *healthy = NULL, *failed = NULL;
	unsigned int nfailed = 0;

	cds_list_for_each_entry(e, &ds->idle_files, link) {
		if (!zfile_has_failed(e->file)) {
			if (!healthy)
				healthy = e;
		} else if (!nfailed++) {
			failed = e;
		}
	}
	e = healthy && nfailed <= IDLE_FILES_MAX / 2 ? healthy
	    : failed				    ? failed
						    : healthy;
	cds_list_del(&e->link);
	ds->nidle--;
	return e;
}

/* Keep n's file f (its reference) for n's backing inode, or let it go. */
static void idle_keep(struct dataset *ds, const struct znode *n,
		      struct zfile *f)
{
	struct idle_file *e = NULL, *old = NULL;

	if ((ds->opt->cache == CACHE_ENGINE &&
	     atomic_load(&f->mapping->nr_cached) > 0) ||
	    zfile_has_failed(f))
		e = malloc(sizeof(*e));
	if (!e) {
		zfile_put(f);
		return;
	}
	e->key = (struct inode_key){n->dev, n->ino, n->decode};
	e->file = f;
	stat_inc(&ds->cache.budget.root, STAT_FILES_KEPT);
	pthread_mutex_lock(&ds->file_lru_lock);
	cds_list_add_tail(&e->link, &ds->idle_files);
	if (++ds->nidle > IDLE_FILES_MAX)
		old = idle_victim(ds);
	pthread_mutex_unlock(&ds->file_lru_lock);
	if (old) {
		zfile_put(old->file);
		free(old);
	}
}

/* The kept file of n's backing inode (the newest), taken: NULL if none. */
static struct zfile *idle_take(struct dataset *ds, const struct znode *n)
{
	struct idle_file *e, *found = NULL;
	struct zfile *f;

	pthread_mutex_lock(&ds->file_lru_lock);
	cds_list_for_each_entry_reverse(e, &ds->idle_files, link)
		if (e->key.dev == n->dev && e->key.ino == n->ino &&
		    e->key.decode == n->decode) {
			found = e;
			cds_list_del(&e->link);
			ds->nidle--;
			break;
		}
	pthread_mutex_unlock(&ds->file_lru_lock);
	if (!found)
		return NULL;
	f = found->file;
	free(found);
	return f;
}

/* The kept file of n's backing inode, if the backing file has not changed
 * since: n's now. */
static struct zfile *idle_adopt(struct dataset *ds, const struct znode *n)
{
	struct zfile *f = idle_take(ds, n);
	struct stat st;

	if (!f)
		return NULL;
	if (backing_lstat(ds, n->path, &st) || !same_backing(&st, &f->st)) {
		mapping_invalidate(f->mapping);
		zfile_put(f);
		return NULL;
	}
	stat_inc(&ds->cache.budget.root, STAT_FILES_KEPT_REUSED);
	return f;
}

/* Let kept files go, oldest first, until metadata is down to target bytes
 * (all of them: target < 0). */
static void idle_drop(struct dataset *ds, long target)
{
	for (;;) {
		struct idle_file *e = NULL;

		pthread_mutex_lock(&ds->file_lru_lock);
		if (!cds_list_empty(&ds->idle_files) &&
		    (target < 0 || atomic_load(&ds->meta_bytes) > target))
			e = idle_victim(ds);
		pthread_mutex_unlock(&ds->file_lru_lock);
		if (!e)
			return;
		zfile_put(e->file); /* uncharges its metadata */
		free(e);
	}
}

/*
 * The table's resize worker is a thread: made after the daemon forks into
 * the background (detach() in mount.c), or the daemon's copy would wait
 * for a worker it does not have.
 */
int inodes_init(struct dataset *ds)
{
	ds->inodes = cds_lfht_new(INODES_INIT_BUCKETS, INODES_INIT_BUCKETS, 0,
				  CDS_LFHT_AUTO_RESIZE | CDS_LFHT_ACCOUNTING,
				  NULL);
	return ds->inodes ? 0 : -ENOMEM;
}

/*
 * At unmount, from a registered, online thread: no reader is left.  The
 * table's destruction waits for its resize worker, which may wait for a
 * grace period: the caller goes offline for it.
 */
void inodes_fini(struct dataset *ds)
{
	struct cds_lfht_node *hn;
	struct cds_lfht_iter it;

	idle_drop(ds, -1);
	if (!ds->inodes)
		return;
	/* not cds_lfht_for_each_entry: it forms container_of(NULL) at the end */
	for (cds_lfht_first(ds->inodes, &it);
	     (hn = cds_lfht_iter_get_node(&it)); cds_lfht_next(ds->inodes, &it)) {
		cds_lfht_del(ds->inodes, hn);
		znode_free(caa_container_of(hn, struct znode, hnode));
	}
	cache_thread_offline();
	cds_lfht_destroy(ds->inodes, NULL);
	cache_thread_online();
	ds->inodes = NULL;
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
	cds_lfht_node_init(&n->hnode);
	CDS_INIT_LIST_HEAD(&n->file_lru);
	return n;
}

void znode_free(struct znode *n)
{
	if (n->file)
		zfile_put(n->file);
	pthread_mutex_destroy(&n->lock);
	free(n->ctl_text);
	free(n->path);
	free(n);
}

static void znode_free_rcu(struct rcu_head *head)
{
	znode_free(caa_container_of(head, struct znode, rcu));
}

struct znode *znode_of(struct dataset *ds, fuse_ino_t ino)
{
	if (ino == FUSE_ROOT_ID)
		return ds->root;
	return (struct znode *)(uintptr_t)ino;
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

/* The live node for k with one more lookup, or NULL. */
static struct znode *inode_find(struct dataset *ds, const struct inode_key *k,
				unsigned long hash)
{
	struct cds_lfht_iter it;
	struct cds_lfht_node *hn;
	struct znode *n;

	for (;;) {
		cds_lfht_lookup(ds->inodes, hash, key_match, k, &it);
		hn = cds_lfht_iter_get_node(&it);
		if (!hn)
			return NULL;
		n = caa_container_of(hn, struct znode, hnode);
		if (nlookup_get(n))
			return n;
		/* forgotten since it matched: it matches no more */
	}
}

/*
 * The node of the backing inode st (decoded or not) with one more lookup:
 * found, or added with one lookup.  NULL: out of memory.
 */
struct znode *inode_get(struct dataset *ds, const struct stat *st,
			bool decode, const char *path)
{
	struct inode_key k = {st->st_dev, st->st_ino, decode};
	unsigned long hash = key_hash(&k);
	struct znode *n, *mine = NULL;
	struct cds_lfht_node *hn;

	rcu_read_lock();
	while (!(n = inode_find(ds, &k, hash))) {
		if (!mine) {
			mine = znode_new(kind_of(st->st_mode), path);
			if (!mine)
				break;
			mine->dev = k.dev;
			mine->ino = k.ino;
			mine->decode = decode;
			atomic_init(&mine->nlookup, 1);
		}
		hn = cds_lfht_add_unique(ds->inodes, hash, key_match, &k,
					 &mine->hnode);
		if (hn == &mine->hnode) {
			n = mine;
			mine = NULL;
			meta_charge(ds, (long)(sizeof(*n) + strlen(path) + 1));
			break;
		}
		/* another lookup added it first: take that one */
	}
	rcu_read_unlock();
	if (mine)
		znode_free(mine);
	return n;
}

void znode_forget(struct dataset *ds, struct znode *n, uint64_t nlookup)
{
	struct zfile *f;

	if (n == ds->root || n->kind == ZN_CTL_DIR || n->kind == ZN_CTL_FILE)
		return; /* these live as long as the mount */
	/* acq_rel: the last forget sees every use the lookups made */
	if (atomic_fetch_sub_explicit(&n->nlookup, nlookup,
				      memory_order_acq_rel) != nlookup)
		return;
	cds_lfht_del(ds->inodes, &n->hnode);
	ktier_forget(&ds->cache, n->nodeid); /* its page cache went with it */
	meta_charge(ds, -(long)(sizeof(*n) + strlen(n->path) + 1));
	/* the kernel sends nothing more for it: its file can go now */
	pthread_mutex_lock(&ds->file_lru_lock);
	cds_list_del_init(&n->file_lru);
	pthread_mutex_unlock(&ds->file_lru_lock);
	pthread_mutex_lock(&n->lock);
	f = n->file;
	n->file = NULL;
	pthread_mutex_unlock(&n->lock);
	if (f)
		idle_keep(ds, n, f);
	call_rcu(&n->rcu, znode_free_rcu);
}

/* --- control inodes: live as long as the mount --- */

struct znode *znode_ctl(struct dataset *ds, struct group *g, int ctl_id,
			enum znode_kind kind)
{
	struct znode *n;

	pthread_mutex_lock(&ds->ctl_lock);
	for (n = ds->ctl_nodes; n; n = n->ctl_next)
		if (n->group == g && n->ctl_id == ctl_id)
			break;
	if (!n) {
		n = znode_new(kind, NULL);
		if (n) {
			n->group = g;
			n->ctl_id = ctl_id;
			n->ctl_next = ds->ctl_nodes;
			ds->ctl_nodes = n;
		}
	}
	pthread_mutex_unlock(&ds->ctl_lock);
	return n;
}

/* --- files: index, geometry, mapping --- */

void zfile_put(struct zfile *f)
{
	mapping_put(f->mapping);
}

bool same_backing(const struct stat *a, const struct stat *b)
{
	return a->st_ino == b->st_ino && a->st_dev == b->st_dev &&
	       a->st_size == b->st_size &&
	       a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
	       a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* What zfile_index() may have made, when it fails. */
static void zfile_unindex(struct zfile *f)
{
	zseek_index_free(&f->idx);
	free(f->starts);
	free(f->slot_frame);
	free(f->slot_skip);
	free(f->parts);
	free(f->raw_at);
}

/* The backing file's attributes: its own, or its object's. */
static int zfile_stat(struct zfile *f)
{
	if (f->obj) {
		memset(&f->st, 0, sizeof(f->st));
		f->st.st_mode = S_IFREG | 0444;
		f->st.st_size = (off_t)store_obj_size(f->obj);
		f->st.st_mtim.tv_sec = store_obj_mtime(f->obj);
		return 0;
	}
	if (fstat(f->fd, &f->st) || !S_ISREG(f->st.st_mode))
		return -EIO;
	/*
	 * zfolio reads whole windows of frames itself: the kernel's readahead
	 * of the backing file would only bring pages it does not want, into a
	 * page cache outside the budget.
	 */
	posix_fadvise(f->fd, 0, 0, POSIX_FADV_RANDOM);
	return 0;
}

/* zseek's reads of a backing file, local or in a store. */
ssize_t zfile_read_cb(void *ctx, void *buf, size_t len, uint64_t off)
{
	struct zfile *f = ctx;

	return f->obj ? remote_pread(f, buf, len, off)
		      : zseek_pread_fd(&f->fd, buf, len, off);
}

/* Index f's frames, RCU-offline (it reads, and may decode unsized ones). */
static int zfile_index(struct zfile *f)
{
	char err[256] = "";
	int r = zfile_stat(f);
	struct zseek_buffered b;

	if (r)
		return r;
	/* a store's objects keep their own tail: read them as they are */
	b = (struct zseek_buffered){.rd = zfile_read_cb, .ctx = f,
				    .file_size = (uint64_t)f->st.st_size};
	cache_thread_offline();
	r = zseek_index_build(f->obj ? zfile_read_cb : zseek_read_buffered,
			      f->obj ? (void *)f : &b,
			      (uint64_t)f->st.st_size, f->decode, &f->idx,
			      err, sizeof(err));
	cache_thread_online();
	if (f->obj)
		store_obj_drop_tail(f->obj);
	if (r) {
		zlog_file(f->path, "%s", err[0] ? err : strerror(-r));
		return r == -ENOMEM ? r : -EIO;
	}
	return zfile_build_geometry(f);
}

/* The backing a zfile takes over, when it cannot be made. */
static void backing_drop(int fd, struct store_obj *obj)
{
	if (fd >= 0)
		close(fd);
	store_obj_free(obj);
}

/*
 * The backing state of the open backing file fd, or of the store's object
 * obj (it takes over either), served decoded or not, with one mapping
 * reference for the caller.
 */
int zfile_create(struct dataset *ds, int fd, struct store_obj *obj,
		 bool decode, const char *path, struct zfile **out)
{
	struct zfile *f = calloc(1, sizeof(*f));
	int r;

	if (!f || !(f->path = strdup(path))) {
		free(f);
		backing_drop(fd, obj);
		return -ENOMEM;
	}
	f->ds = ds;
	f->fd = fd;
	f->obj = obj;
	f->decode = decode;
	f->pool = &ds->streams;
	for (int i = 0; i < ZFILE_STREAMS; i++) {
		f->streams[i].owner = f;
		f->streams[i].frame = UINT32_MAX;
		f->streams[i].need_off = UINT64_MAX;
		CDS_INIT_LIST_HEAD(&f->streams[i].link);
	}
	CDS_INIT_LIST_HEAD(&f->fd_link);
	atomic_init(&f->dontcache, ds->opt->backing_cache != BACKING_KEEP);
	atomic_init(&f->direct, ds->opt->backing_cache == BACKING_DIRECT && !obj);
	f->dfd = -1;
	r = zfile_index(f);
	if (!r) {
		f->mapping = mapping_create(&ds->cache, &zfile_mapping_ops, f,
					    f->idx.content_size, f->nslots,
					    f->folio_size, f->starts);
		r = f->mapping ? 0 : -ENOMEM;
	}
	if (r) {
		zfile_unindex(f);
		backing_drop(f->fd, f->obj);
		free(f->path);
		free(f);
		return r;
	}
	pthread_mutex_init(&f->stream_lock, NULL);
	for (int i = 0; i < ZFILE_STREAMS; i++)
		pthread_mutex_init(&f->streams[i].lock, NULL);
	if (!obj)
		zfile_fd_add(f);
	zfile_count_zeros(f);
	f->meta_bytes = zfile_meta_bytes(f);
	meta_charge(ds, f->meta_bytes);
	if (f->idx.nunsized) /* counted once per file: a slow file */
		stat_mod(&ds->cache.budget.root, STAT_SLOW_FRAMES,
			 f->idx.nunsized);
	*out = f;
	return 0;
}

/*
 * The dataset file at path (a manifest, a data file), opened and indexed,
 * from the dataset directory or the store: 0 or -errno, with the reason
 * in err when it could not be opened.
 */
int zfile_open_path(struct dataset *ds, const char *path, struct zfile **out,
		    char *err, size_t errlen)
{
	struct store_obj *obj = NULL;
	int fd = -1, r;

	if (ds->store) {
		r = remote_obj_open(ds, path, &obj, err, errlen);
	} else {
		fd = dataset_open_backing(ds, path, O_RDONLY);
		r = fd < 0 ? fd : 0;
		if (r)
			snprintf(err, errlen, "%s: %s", path, strerror(-r));
	}
	return r ? r : zfile_create(ds, fd, obj, true, path, out);
}

static int zfile_open(struct dataset *ds, struct znode *n, struct zfile **out)
{
	int fd = dataset_open_backing(ds, n->path, O_RDONLY);

	if (fd < 0)
		return fd;
	return zfile_create(ds, fd, NULL, n->decode, n->path, out);
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
		atomic_store(&n->file_changed, true);
	}
	/* a file that failed to index fails again at once, until it changes */
	if (!n->file && n->bad_err && backing_lstat(ds, n->path, &st) == 0 &&
	    same_backing(&st, &n->bad_st))
		r = n->bad_err;
	else if (!n->file)
		n->file = idle_adopt(ds, n);
	if (!r && !n->file)
		r = zfile_open(ds, n, &n->file);
	if (r == -EIO && !n->file && backing_lstat(ds, n->path, &st) == 0) {
		n->bad_err = r;
		n->bad_st = st;
	}
	if (!r) {
		f = n->file;
		mapping_get(f->mapping);
	}
	pthread_mutex_unlock(&n->lock);
	if (!r) { /* the most recently used goes last */
		pthread_mutex_lock(&ds->file_lru_lock);
		cds_list_del(&n->file_lru);
		cds_list_add_tail(&n->file_lru, &ds->file_lru);
		pthread_mutex_unlock(&ds->file_lru_lock);
	}
	*out = f;
	return r;
}

/*
 * The inode shrinker's counterpart for a tree: drop the index (and the
 * cached data) of files nobody has open, least recently used first, until
 * metadata is down to target bytes.  The inode stays; its file is indexed
 * again when next opened.
 */
void inodes_shrink(struct dataset *ds, long target)
{
	struct znode *n, *tmp;

	idle_drop(ds, target); /* forgotten files' first */
	pthread_mutex_lock(&ds->file_lru_lock);
	cds_list_for_each_entry_safe(n, tmp, &ds->file_lru, file_lru) {
		struct zfile *f = NULL;

		if (atomic_load(&ds->meta_bytes) <= target)
			break;
		if (pthread_mutex_trylock(&n->lock))
			continue;
		/* only the inode holds it: no handle is open on it; and one
		 * with a failed frame stays, to keep that frame refused */
		if (n->file && atomic_load(&n->file->mapping->refcount) == 1 &&
		    !zfile_has_failed(n->file)) {
			f = n->file;
			n->file = NULL;
			cds_list_del_init(&n->file_lru);
		}
		pthread_mutex_unlock(&n->lock);
		if (!f)
			continue;
		pthread_mutex_unlock(&ds->file_lru_lock);
		zfile_put(f); /* uncharges its metadata */
		pthread_mutex_lock(&ds->file_lru_lock);
		tmp = cds_list_entry(ds->file_lru.next, struct znode, file_lru);
	}
	pthread_mutex_unlock(&ds->file_lru_lock);
}

/*
 * A decoded file's size for stat, st its backing lstat: from its open
 * index if it has one, else found without opening it for long and
 * remembered until the backing file changes.  A file that does not index
 * keeps its size on disk (reading it is EIO).
 */
static void znode_size(struct dataset *ds, struct znode *n, struct stat *st)
{
	uint64_t size;

	pthread_mutex_lock(&n->lock);
	if (n->file && same_backing(st, &n->file->st)) {
		st->st_size = (off_t)n->file->idx.content_size;
	} else if (n->size_st.st_ino && same_backing(st, &n->size_st)) {
		st->st_size = (off_t)n->size;
	} else if (!(n->bad_err && same_backing(st, &n->bad_st)) &&
		   backing_decoded_size(ds, n->path, st, &size) == 0) {
		n->size = size;
		n->size_st = *st;
		st->st_size = (off_t)size;
	} else {
		n->bad_err = -EIO;
		n->bad_st = *st;
	}
	pthread_mutex_unlock(&n->lock);
}

int znode_stat(struct dataset *ds, struct znode *n, struct stat *st)
{
	int r;

	if (n->kind == ZN_CTL_DIR || n->kind == ZN_CTL_FILE) {
		ctl_stat(ds, n, st);
		return 0;
	}
	if (n == ds->root) {
		*st = ds->root_st;
		if (ds->single) { /* made up: the file's size is not its */
			st->st_mode = S_IFDIR | 0555;
			st->st_nlink = 2;
			st->st_size = 0;
			st->st_blocks = 0;
		}
		st->st_ino = FUSE_ROOT_ID;
		return 0;
	}
	r = backing_lstat(ds, n->path, st);
	if (r)
		return r;
	znode_stat_from(ds, n, st);
	return 0;
}

void znode_stat_from(struct dataset *ds, struct znode *n, struct stat *st)
{
	/* decoded: the size is the content's; blocks stay on disk */
	if (n->kind == ZN_FILE && n->decode)
		znode_size(ds, n, st);
	st->st_blksize = ZSEEK_DEFAULT_FRAME;
}
