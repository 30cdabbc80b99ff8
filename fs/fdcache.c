// SPDX-License-Identifier: MIT
/*
 * Backing file descriptors, in a bounded LRU: a file is opened when it is
 * read and closed when other files need the room, however many files the
 * kernel has looked up or readers hold open.  A zfile's fd is in use
 * (zfile_fd_get .. zfile_fd_put) while a batch of its reads is in flight:
 * only idle fds are closed, so no read ever goes to a closed or reused
 * number.  A file opened again is checked against what it was when it was
 * indexed (inode, size, mtime): a file replaced while mounted reads as
 * ESTALE through the old index, and the next open indexes the new one.
 *
 * The limit: max_open= if set, else half of RLIMIT_NOFILE less a reserve
 * for /dev/fuse, the rings and the dataset root.  Past it (every fd in
 * use), a file is opened anyway and its fd closed as soon as it is idle.
 *
 * With backing_cache=direct a file has a second fd, opened O_DIRECT for
 * its frames (backing.c), with the first when it is first put to use, and
 * closed with it; both count.  A filesystem that refuses O_DIRECT, or
 * wants it aligned to more than DIO_ALIGN, turns it off for the file.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/* fds kept for everything but backing files */
#define FD_RESERVE 64
/* never fewer than this many backing fds */
#define FD_MIN 16

void fd_cache_init(struct fd_cache *c, unsigned int max_open)
{
	struct rlimit rl;

	pthread_mutex_init(&c->lock, NULL);
	CDS_INIT_LIST_HEAD(&c->lru);
	c->open = 0;
	if (!max_open && getrlimit(RLIMIT_NOFILE, &rl) == 0 &&
	    rl.rlim_cur != RLIM_INFINITY)
		max_open = rl.rlim_cur > 2 * FD_RESERVE
				   ? (unsigned int)(rl.rlim_cur / 2 - FD_RESERVE)
				   : FD_MIN;
	c->max = max_open > FD_MIN ? max_open : FD_MIN;
}

/* Close f's fds; the cache's lock is held. */
static void close_fds(struct fd_cache *c, struct zfile *f)
{
	if (f->dfd >= 0) {
		close(f->dfd);
		f->dfd = -1;
		c->open--;
	}
	if (f->fd >= 0) {
		close(f->fd);
		f->fd = -1;
		c->open--;
	}
}

/* Close the least recently used idle fds; the cache's lock is held. */
static bool close_idle(struct fd_cache *c)
{
	struct zfile *f;

	if (cds_list_empty(&c->lru))
		return false;
	f = cds_list_entry(c->lru.next, struct zfile, fd_link);
	cds_list_del_init(&f->fd_link);
	close_fds(c, f);
	return true;
}

/* Open f's backing file again; the cache's lock is held. */
static int reopen(struct fd_cache *c, struct zfile *f)
{
	struct stat st;
	int fd;

	while (c->open >= c->max && close_idle(c))
		;
	fd = dataset_open_backing(f->ds, f->path, O_RDONLY);
	if (fd == -ENOENT && f->ds->mf)
		manifest_say_changed(f->ds, f->path);
	else if (fd == -ENOENT)
		zlog_file(f->path, "removed while mounted: what must be "
				   "read from disk again fails");
	if (fd < 0)
		return fd;
	if (fstat(fd, &st) || !same_backing(&st, &f->st)) {
		close(fd);
		if (f->ds->mf) /* a packed dataset's files: all or none */
			manifest_say_changed(f->ds, f->path);
		else
			zlog_file(f->path, "replaced while mounted: it reads "
					   "as ESTALE until opened again");
		return -ESTALE;
	}
	posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
	f->fd = fd;
	c->open++;
	return 0;
}

/* Whether the filesystem of fd does O_DIRECT at an alignment we keep. */
static bool dio_aligned(int fd)
{
	struct statx sx;

	if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx))
		return false;
	return (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_offset_align &&
	       sx.stx_dio_offset_align <= DIO_ALIGN &&
	       sx.stx_dio_mem_align <= DIO_ALIGN;
}

/* f's O_DIRECT fd, beside its open fd; the cache's lock is held. */
static void open_direct(struct fd_cache *c, struct zfile *f)
{
	struct stat st;
	int fd = dataset_open_backing(f->ds, f->path, O_RDONLY | O_DIRECT);

	if (fd >= 0 && !fstat(fd, &st) && same_backing(&st, &f->st) &&
	    dio_aligned(fd)) {
		f->dfd = fd;
		c->open++;
		return;
	}
	if (fd >= 0)
		close(fd);
	atomic_store(&f->direct, false);
}

/* f's fd, open and in use until zfile_fd_put: 0 or a negative errno. */
int zfile_fd_get(struct zfile *f)
{
	struct fd_cache *c = &f->ds->fds;
	int r = 0;

	if (f->obj) /* in a store: no fd */
		return 0;
	pthread_mutex_lock(&c->lock);
	if (f->fd < 0)
		r = reopen(c, f);
	if (!r && f->dfd < 0 &&
	    atomic_load_explicit(&f->direct, memory_order_relaxed))
		open_direct(c, f);
	if (!r && f->fd_users++ == 0)
		cds_list_del_init(&f->fd_link); /* in use: not idle */
	pthread_mutex_unlock(&c->lock);
	return r;
}

void zfile_fd_put(struct zfile *f)
{
	struct fd_cache *c = &f->ds->fds;

	if (f->obj)
		return;
	pthread_mutex_lock(&c->lock);
	if (--f->fd_users == 0) {
		cds_list_add_tail(&f->fd_link, &c->lru);
		while (c->open > c->max && close_idle(c))
			;
	}
	pthread_mutex_unlock(&c->lock);
}

/* A new zfile's first fd, just opened and indexed: counted, idle. */
void zfile_fd_add(struct zfile *f)
{
	struct fd_cache *c = &f->ds->fds;

	pthread_mutex_lock(&c->lock);
	c->open++;
	cds_list_add_tail(&f->fd_link, &c->lru);
	while (c->open > c->max && close_idle(c))
		;
	pthread_mutex_unlock(&c->lock);
}

/* The zfile goes: its fd, if open, with it. */
void zfile_fd_release(struct zfile *f)
{
	struct fd_cache *c = &f->ds->fds;

	pthread_mutex_lock(&c->lock);
	cds_list_del_init(&f->fd_link);
	close_fds(c, f);
	pthread_mutex_unlock(&c->lock);
}
