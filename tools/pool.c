// SPDX-License-Identifier: MIT
/*
 * mkzfolio's machinery: frames are compressed on a pool of threads, in
 * batches that may span many files, and the main thread writes them out in
 * order, so the output depends only on the input and the options, never on
 * the thread count or timing.  Also messages, progress and the listing of
 * source directories (sorted: the packing order); extended attributes are
 * in xattrs.c.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mkzfolio.h"

/* The progress bar is on stderr's current line. */
static bool bar_shown;

/* On a line of its own, below the progress bar if it is shown. */
static void report(const char *fmt, va_list ap)
{
	fprintf(stderr, "%s%s: ", bar_shown ? "\n" : "", progname);
	bar_shown = false;
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
}

void (*die_hook)(void);

void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	report(fmt, ap);
	va_end(ap);
	/* what the pack held dies with it: no leak checks, no cleanup but
	 * the hook's (a temporary directory) */
	fflush(stdout);
	if (die_hook)
		die_hook();
	_exit(1);
}

void warn(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	report(fmt, ap);
	va_end(ap);
}

char *join(const char *dir, const char *name)
{
	char *p;

	if (asprintf(&p, "%s/%s", dir, name) < 0)
		die("out of memory");
	return p;
}

double now_s(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) +
	       (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

static void *pool_main(void *arg)
{
	struct packer *pk = arg;
	ZSTD_CCtx *cctx = ZSTD_createCCtx();
	unsigned int gen = 0;

	pthread_mutex_lock(&pk->lock);
	for (;;) {
		while (!pk->stop && (pk->generation == gen ||
				     pk->next >= pk->batch_jobs))
			pthread_cond_wait(&pk->work, &pk->lock);
		if (pk->stop)
			break;
		gen = pk->generation;
		while (pk->next < pk->batch_jobs) {
			struct job *j = &pk->jobs[pk->next++];
			size_t r;

			if (j->done)
				r = j->csize;
			else {
				pthread_mutex_unlock(&pk->lock);
				r = cctx ? zseek_compress_frame(
						   cctx, pk->level, j->src,
						   j->len, j->dst, j->cap,
						   &j->checksum)
					 : (size_t)-1;
				pthread_mutex_lock(&pk->lock);
			}
			if (!cctx || ZSTD_isError(r))
				pk->error = 1;
			else
				j->csize = r;
			if (++pk->finished == pk->batch_jobs)
				pthread_cond_signal(&pk->done);
		}
	}
	pthread_mutex_unlock(&pk->lock);
	ZSTD_freeCCtx(cctx);
	return NULL;
}

void draw_progress(struct packer *pk, bool final)
{
	double t = now_s(&pk->t0), rate, eta, frac;
	char bar[31];
	int fill;

	if (!pk->progress)
		return;
	if (!final && now_s(&pk->last_draw) < 0.1)
		return;
	clock_gettime(CLOCK_MONOTONIC, &pk->last_draw);
	frac = pk->total_in ? (double)pk->done_in / (double)pk->total_in : 1;
	rate = t > 0 ? (double)pk->done_in / t : 0;
	eta = rate > 0 ? (double)(pk->total_in - pk->done_in) / rate : 0;
	fill = (int)(frac * 30);
	for (int i = 0; i < 30; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[30] = '\0';
	fprintf(stderr,
		"\r[%s] %3.0f%% %llu/%llu files %.1f/%.1f MiB  %.1f MiB/s  "
		"ETA %d:%02d ",
		bar, frac * 100, (unsigned long long)pk->done_files,
		(unsigned long long)pk->total_files,
		(double)pk->done_in / 1048576.0,
		(double)pk->total_in / 1048576.0, rate / 1048576.0,
		(int)eta / 60, (int)eta % 60);
	if (final)
		fputc('\n', stderr);
	bar_shown = !final;
	fflush(stderr);
}

void write_all(int fd, const void *buf, size_t len, const char *path)
{
	const char *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("%s: %s", path,
			    n < 0 ? strerror(errno) : "short write");
		p += n;
		len -= (size_t)n;
	}
}

unsigned long inode_bucket(const struct stat *st, unsigned long buckets)
{
	uint64_t h = (uint64_t)st->st_ino * 0x9E3779B97F4A7C15ull ^
		     (uint64_t)st->st_dev;

	return (unsigned long)((h >> 40) % buckets);
}

/* Files that were shorter when read than fstatat said, the last named. */
static unsigned int changed_files;
static char changed_last[PATH_MAX];

/* path counted as changed, if it was not already: whether it is new. */
static bool count_changed(const char *path)
{
	if (!strcmp(changed_last, path))
		return false;
	snprintf(changed_last, sizeof(changed_last), "%s", path);
	changed_files++;
	return true;
}

/*
 * Exactly len bytes at off.  A file that shrank while being read (a log
 * rotated, a file rewritten) is packed as it was read, its missing tail as
 * zeros, as tar does: said once per file here, and counted for mkzfolio's
 * exit status.  A file that grew is packed at the size fstatat gave, and
 * said by check_unchanged().
 */
void read_all(int fd, void *buf, size_t len, off_t off, const char *path)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = pread(fd, (char *)buf + got, len - got,
				  off + (off_t)got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("%s: %s", path, strerror(errno));
		if (n == 0) {
			memset((char *)buf + got, 0, len - got);
			if (count_changed(path))
				warn("%s: shrank while being read; packed "
				     "as read, the rest as zeros", path);
			return;
		}
		got += (size_t)n;
	}
}

/*
 * After the last read of a file taken at st (fd, or dirfd/name for one
 * packed without reading: empty when listed): a file written meanwhile
 * (its size or ctime moved: it grew, or was written in place) is packed as
 * read, at st's size, and said as tar says it, once per file, counted for
 * the exit status.
 */
static void said_if_changed(const struct stat *st, const struct stat *now,
			    const char *path)
{
	if (now->st_size == st->st_size &&
	    now->st_ctim.tv_sec == st->st_ctim.tv_sec &&
	    now->st_ctim.tv_nsec == st->st_ctim.tv_nsec)
		return;
	if (count_changed(path))
		warn("%s: changed while being read (%lld bytes, now %lld); "
		     "packed as read, at %lld bytes",
		     path, (long long)st->st_size, (long long)now->st_size,
		     (long long)st->st_size);
}

void check_unchanged(int fd, const struct stat *st, const char *path)
{
	struct stat now;

	if (!fstat(fd, &now))
		said_if_changed(st, &now, path);
}

void check_unchanged_at(int dirfd, const char *name, const struct stat *st,
			const char *path)
{
	struct stat now;

	if (!fstatat(dirfd, name, &now, AT_SYMLINK_NOFOLLOW) &&
	    (now.st_mode & S_IFMT) == (st->st_mode & S_IFMT))
		said_if_changed(st, &now, path);
}

unsigned int files_changed(void)
{
	return changed_files;
}

static unsigned int unreadable_files;

void skip_unreadable(int err, const char *path, const char *done)
{
	if (err == ENOENT) {
		changed_files++;
		warn("%s: removed while being packed; %s", path, done);
	} else if (err == EACCES || err == EPERM) {
		unreadable_files++;
		warn("%s: %s; %s", path, strerror(err), done);
	} else if (err == ENAMETOOLONG) {
		unreadable_files++;
		warn("%s: a path in the tree of %d bytes or more, which zfolio "
		     "does not serve; %s", path, PATH_MAX, done);
	} else {
		die("%s: %s", path, strerror(err));
	}
}

unsigned int files_unreadable(void)
{
	return unreadable_files;
}

int set_times(int dirfd, const char *name, const struct stat *st,
		     int flags)
{
	struct timespec ts[2] = {st->st_atim, st->st_mtim};

	return utimensat(dirfd, name, ts, flags);
}

/* Owner, mode and times of the source, on the finished output. */
static void keep_file_meta(const struct outfile *of, bool root)
{
	struct timespec ts[2] = {of->st.st_atim, of->st.st_mtim};

	if (root && fchown(of->fd, of->st.st_uid, of->st.st_gid))
		die("%s: chown: %s", of->path, strerror(errno));
	if (fchmod(of->fd, of->st.st_mode & 07777))
		die("%s: chmod: %s", of->path, strerror(errno));
	if (futimens(of->fd, ts))
		die("%s: %s", of->path, strerror(errno));
}

/* All frames written: append the seek table and close the output. */
void finish_file(struct packer *pk, struct outfile *of)
{
	size_t tsize = zseek_table_size(of->nframes);
	uint8_t *tab = malloc(tsize);

	if (!tab)
		die("out of memory");
	if (zseek_write_table(of->entries, of->nframes, tab, tsize) != tsize)
		die("%s: cannot build the seek table", of->path);
	write_all(of->fd, tab, tsize, of->path);
	free(tab);
	of->out_bytes += tsize;
	pk->bytes_out += of->out_bytes;
	if (of->keep_meta)
		keep_file_meta(of, pk->root);
	if (close(of->fd))
		die("%s: %s", of->path, strerror(errno));
	free(of->entries);
	free(of->path);
	free(of);
}

/* Compress the batch on the pool, then write it out in order. */
void run_batch(struct packer *pk)
{
	pthread_mutex_lock(&pk->lock);
	pk->batch_jobs = pk->njobs;
	pk->next = 0;
	pk->finished = 0;
	pk->generation++;
	pthread_cond_broadcast(&pk->work);
	while (pk->finished < pk->njobs)
		pthread_cond_wait(&pk->done, &pk->lock);
	pthread_mutex_unlock(&pk->lock);
	if (pk->error)
		die("compression failed");
	for (unsigned int i = 0; i < pk->njobs; i++) {
		struct job *j = &pk->jobs[i];
		struct outfile *of = j->of;

		write_all(of->fd, j->dst, j->csize, of->path);
		if (of->written == of->cap) {
			of->cap = of->cap ? of->cap * 2 : 64;
			of->entries = realloc(of->entries,
					      of->cap * sizeof(*of->entries));
			if (!of->entries)
				die("out of memory");
		}
		of->entries[of->written] = (struct zseek_writer_entry){
			(uint32_t)j->csize, (uint32_t)j->len, j->checksum};
		of->written++;
		of->out_bytes += j->csize;
		pk->done_in += j->len;
		if (of->all_queued && of->written == of->queued)
			finish_file(pk, of);
	}
	pk->njobs = 0;
	draw_progress(pk, false);
}

/* The next job of the batch, for a frame of of. */
static struct job *job_next(struct packer *pk, struct outfile *of)
{
	struct job *j = &pk->jobs[pk->njobs];

	j->of = of;
	j->src = pk->in_arena + (size_t)pk->njobs * pk->pack_frame;
	j->dst = pk->out_arena + (size_t)pk->njobs * pk->out_cap;
	j->cap = pk->out_cap;
	return j;
}

/* The job's content is in: queue it; a full batch runs. */
static void job_queued(struct packer *pk, struct outfile *of, size_t len)
{
	pk->jobs[pk->njobs].len = len;
	/* before run_batch: it finishes the file once all are written */
	if (++of->queued == of->nframes)
		of->all_queued = true;
	if (++pk->njobs == pk->max_jobs)
		run_batch(pk);
}

/*
 * Whether the len bytes of fd at of->read_off are in a hole, and so read as
 * zeros: reading them would have the kernel zero page cache for them, page
 * by page, and copy it out (a 6 GiB sparse file: 19 s of system time).
 * What lseek() finds is kept; a file without holes (outfile_source())
 * costs nothing.
 * A file system without SEEK_DATA says all is data.
 */
static bool in_hole(struct outfile *of, int fd, size_t len)
{
	off_t off = of->read_off, end = off + (off_t)len, d, h;
	struct stat st;

	if (end <= of->data_end)
		return false;
	if (end <= of->hole_end)
		return true;
	d = lseek(fd, off, SEEK_DATA);
	if (d < 0 && errno == ENXIO) {
		/* no data from off on: a hole to the end, or the file shrank
		 * (then read() says so) */
		if (fstat(fd, &st) || st.st_size < end)
			return false;
		of->hole_end = st.st_size;
		return true;
	}
	if (d < 0) {
		of->data_end = (off_t)INT64_MAX;
		return false;
	}
	if (d >= end) {
		of->hole_end = d;
		return true;
	}
	h = lseek(fd, d, SEEK_HOLE);
	of->data_end = h > off ? h : (off_t)INT64_MAX;
	return false;
}

/* Only a file with fewer blocks than its size has holes (as cp decides):
 * a dense one is read, whatever SEEK_DATA would say. */
void outfile_source(struct outfile *of, const struct stat *st)
{
	if ((uint64_t)st->st_blocks * 512 >= (uint64_t)st->st_size)
		of->data_end = (off_t)INT64_MAX;
}

/* The frame of pk->frame zeros, compressed as any frame would be. */
static void make_zero_frame(struct packer *pk)
{
	ZSTD_CCtx *cctx = ZSTD_createCCtx();
	uint8_t *zeros = calloc(1, pk->frame);
	size_t r;

	pk->zero_frame = malloc(pk->out_cap);
	if (!cctx || !zeros || !pk->zero_frame)
		die("out of memory");
	r = zseek_compress_frame(cctx, pk->level, zeros, pk->frame,
				 pk->zero_frame, pk->out_cap,
				 &pk->zero_checksum);
	if (ZSTD_isError(r))
		die("compression failed");
	pk->zero_csize = r;
	ZSTD_freeCCtx(cctx);
	free(zeros);
}

/* Read the next frame's content from fd into the batch; a whole frame
 * in a hole is the frame of zeros, compressed once for all.  Whether the
 * frame is all zeros, in a hole or not (its content alone decides, so a
 * sparse file packs as its dense copy does). */
bool queue_frame(struct packer *pk, struct outfile *of, int fd, size_t len,
		 const char *spath)
{
	struct job *j = job_next(pk, of);
	bool zeros = true;

	j->done = false;
	if (!in_hole(of, fd, len)) {
		read_all(fd, j->src, len, of->read_off, spath);
		zeros = !j->src[0] && !memcmp(j->src, j->src + 1, len - 1);
	} else if (len != pk->frame) {
		memset(j->src, 0, len);
	} else {
		if (!pk->zero_frame)
			make_zero_frame(pk);
		j->dst = pk->zero_frame;
		j->csize = pk->zero_csize;
		j->checksum = pk->zero_checksum;
		j->done = true;
	}
	of->read_off += (off_t)len;
	job_queued(pk, of, len);
	return zeros;
}

/* A frame's content from memory into the batch. */
void queue_buffer(struct packer *pk, struct outfile *of, const void *buf,
		  size_t len)
{
	struct job *j = job_next(pk, of);

	j->done = false;
	memcpy(j->src, buf, len);
	job_queued(pk, of, len);
}

/*
 * dirfd/name, created empty (path for messages), for nframes frames, or
 * for as many as are queued before outfile_seal() when nframes is 0.
 */
struct outfile *outfile_create(int dirfd, const char *name, const char *path,
			       uint32_t nframes)
{
	struct outfile *of = calloc(1, sizeof(*of));

	if (!of || !(of->path = strdup(path)))
		die("out of memory");
	of->fd = openat(dirfd, name,
			O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
			0644);
	if (of->fd < 0)
		die("%s: %s", path, strerror(errno));
	of->nframes = nframes ? nframes : UINT32_MAX;
	of->cap = nframes;
	of->entries = calloc(nframes ? nframes : 1, sizeof(*of->entries));
	if (!of->entries)
		die("out of memory");
	return of;
}

/* No more frames for of: it is finished once they are written. */
void outfile_seal(struct packer *pk, struct outfile *of)
{
	of->nframes = of->queued;
	of->all_queued = true;
	if (of->written == of->queued)
		finish_file(pk, of);
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void push_name(char ***v, size_t *n, size_t *cap, const char *name)
{
	if (*n == *cap) {
		*cap = *cap ? *cap * 2 : 64;
		*v = realloc(*v, *cap * sizeof(**v));
		if (!*v)
			die("out of memory");
	}
	(*v)[*n] = strdup(name);
	if (!(*v)[*n])
		die("out of memory");
	(*n)++;
}

/* The sorted names of a directory: the packing order. */
char **list_dir(int fd, size_t *n, const char *path)
{
	int dup_fd = dup(fd);
	DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
	struct dirent *e;
	char **v = NULL;
	size_t cap = 0;

	if (!d)
		die("%s: %s", path, strerror(errno));
	rewinddir(d); /* the dup shares the offset of an earlier listing */
	*n = 0;
	errno = 0;
	while ((e = readdir(d))) {
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			push_name(&v, n, &cap, e->d_name);
		errno = 0;
	}
	if (errno)
		die("%s: %s", path, strerror(errno));
	closedir(d);
	if (*n)
		qsort(v, *n, sizeof(*v), cmp_name);
	return v;
}

/*
 * The tree layout stores a file f as f.zst: a name ".zst" makes too long,
 * or one beside an f.zst (of any kind), cannot be kept.  Said before
 * anything is written, so that no half-made dataset is left to mount.
 */
static void tree_name_check(const char *dir, const char *name,
			    char **names, size_t n)
{
	char *zname, *path;

	if (asprintf(&zname, "%s.zst", name) < 0)
		die("out of memory");
	path = join(dir, name);
	if (strlen(zname) > NAME_MAX)
		die("%s: the name is too long for the tree layout once .zst "
		    "is added (the packed layout keeps it)", path);
	if (bsearch(&zname, names, n, sizeof(*names), cmp_name))
		die("%s: the tree layout cannot keep it beside %s.zst (the "
		    "packed layout keeps both)", path, path);
	free(path);
	free(zname);
}

/* The content bytes and files under one name: what the progress counts;
 * for the tree layout, its name is checked too. */
static void entry_count(int dirfd, const char *dir, char **names, size_t n,
			size_t i, const struct count *c)
{
	struct stat st;
	char *sub;
	int fd;

	if (fstatat(dirfd, names[i], &st, AT_SYMLINK_NOFOLLOW))
		return; /* packing it will say why */
	++*c->files;
	if (S_ISREG(st.st_mode)) {
		*c->bytes += (uint64_t)st.st_size;
		if (c->tree)
			tree_name_check(dir, names[i], names, n);
	}
	if (!S_ISDIR(st.st_mode))
		return;
	sub = join(dir, names[i]);
	/* one too deep for the mount is packed empty: not walked */
	if (strlen(sub) - c->root_len - 1 >= PATH_MAX) {
		free(sub);
		return;
	}
	fd = openat(dirfd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
					     O_CLOEXEC);
	if (fd < 0) {
		free(sub);
		return;
	}
	tree_count(fd, sub, c);
	free(sub);
	close(fd);
}

void tree_count(int fd, const char *path, const struct count *c)
{
	size_t n;
	char **names = list_dir(fd, &n, path);

	for (size_t i = 0; i < n; i++)
		entry_count(fd, path, names, n, i, c);
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

void packer_setup(struct packer *pk, bool quiet)
{
	pk->root = geteuid() == 0;
	pk->progress = !quiet && isatty(2);
	pk->max_jobs = pk->threads * BATCH_PER_THREAD;
	pk->out_cap = ZSTD_compressBound(pk->pack_frame);
	pk->jobs = calloc(pk->max_jobs, sizeof(*pk->jobs));
	pk->in_arena = malloc(pk->max_jobs * pk->pack_frame);
	pk->out_arena = malloc(pk->max_jobs * pk->out_cap);
	pk->tids = calloc(pk->threads, sizeof(*pk->tids));
	if (!pk->jobs || !pk->in_arena || !pk->out_arena || !pk->tids)
		die("out of memory");
}

void pool_start(struct packer *pk)
{
	if (pthread_mutex_init(&pk->lock, NULL) ||
	    pthread_cond_init(&pk->work, NULL) ||
	    pthread_cond_init(&pk->done, NULL))
		die("cannot set up the thread pool");
	for (unsigned int i = 0; i < pk->threads; i++)
		if (pthread_create(&pk->tids[i], NULL, pool_main, pk))
			die("cannot start threads");
}

void pool_stop(struct packer *pk)
{
	pthread_mutex_lock(&pk->lock);
	pk->stop = true;
	pthread_cond_broadcast(&pk->work);
	pthread_mutex_unlock(&pk->lock);
	for (unsigned int i = 0; i < pk->threads; i++)
		pthread_join(pk->tids[i], NULL);
}

void packer_free(struct packer *pk)
{
	pthread_mutex_destroy(&pk->lock);
	pthread_cond_destroy(&pk->work);
	pthread_cond_destroy(&pk->done);
	free(pk->jobs);
	free(pk->in_arena);
	free(pk->out_arena);
	free(pk->zero_frame);
	free(pk->tids);
	free(pk->dirpaths);
	free(pk->dirstats);
}
