// SPDX-License-Identifier: MIT
/*
 * mkzfolio SRC DST: pack a directory tree into a zfolio dataset.
 *
 * Each regular file f becomes DST/f.zst in the zstd seekable format with
 * checksums: independent frames of --frame bytes of content, then the seek
 * table.  Directories, symlinks (as links, never followed), FIFOs and (as
 * root) device nodes are recreated; modes, mtimes and (as root) owners are
 * kept.  Every output is a plain zstd stream: zstd -d restores the file.
 *
 * Frames are independent, so they are compressed on our own threads, in
 * batches that may span many small files; the main thread reads the input
 * and writes the output in order.  The output depends only on the input and
 * the options, never on the thread count or timing.
 *
 * main() runs the steps in order: parse the options, check the source and
 * the destination, set up the packer and its pool, pack, restore the
 * directories' times, tear down, print the summary.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "../common/common.h"
#include "../format/format.h"

#define BATCH_PER_THREAD 4
#define MAX_THREADS 1024

struct outfile {
	int fd;
	char *path;
	struct stat st;          /* the source's */
	uint32_t nframes, queued, written;
	bool all_queued;
	struct zseek_writer_entry *entries;
	uint64_t out_bytes;
};

struct job {
	struct outfile *of;
	uint8_t *src, *dst;
	size_t len, cap, csize;
	uint32_t checksum;
};

struct packer {
	int level;
	size_t frame;
	unsigned int threads;
	bool root, progress;
	/* the batch */
	struct job *jobs;
	unsigned int njobs, max_jobs;
	uint8_t *in_arena, *out_arena;
	size_t out_cap;
	/* the pool */
	pthread_t *tids;
	pthread_mutex_t lock;
	pthread_cond_t work, done;
	unsigned int next, finished, generation;
	bool stop;
	int error;
	/* totals */
	uint64_t total_in, done_in, bytes_out;
	unsigned long files, dirs, links, others;
	struct timespec t0, last_draw;
	/* directories whose times are set last, deepest first */
	char **dirpaths;
	struct stat *dirstats;
	size_t ndirs, dircap;
};

/* A directory being walked: its fd, and its path for messages. */
struct place {
	int fd;
	const char *path;
};

/* One name in a source directory, with both of its paths. */
struct entry {
	const char *name;
	struct stat st;
	char *spath, *dpath;
};

/* What the command line asks for besides the packer's settings. */
struct cli {
	const char *src, *dst;
	bool force, quiet;
};

static const char *progname = "mkzfolio";

/* On a line of its own: the progress bar may be on the current one. */
static void report(const char *fmt, va_list ap)
{
	fprintf(stderr, "\n%s: ", progname);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
}

static void die(const char *fmt, ...)
	__attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	report(fmt, ap);
	va_end(ap);
	/* what the pack held dies with it: no leak checks, no cleanup */
	fflush(stdout);
	_exit(1);
}

/* For metadata that could not be restored: the data is packed, go on. */
static void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warn(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	report(fmt, ap);
	va_end(ap);
}

static char *join(const char *dir, const char *name)
{
	char *p;

	if (asprintf(&p, "%s/%s", dir, name) < 0)
		die("out of memory");
	return p;
}

static double now_s(const struct timespec *t0)
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
				     pk->next >= pk->njobs))
			pthread_cond_wait(&pk->work, &pk->lock);
		if (pk->stop)
			break;
		gen = pk->generation;
		while (pk->next < pk->njobs) {
			struct job *j = &pk->jobs[pk->next++];
			size_t r;

			pthread_mutex_unlock(&pk->lock);
			r = cctx ? zseek_compress_frame(cctx, pk->level, j->src,
							j->len, j->dst, j->cap,
							&j->checksum)
				 : (size_t)-1;
			pthread_mutex_lock(&pk->lock);
			if (!cctx || ZSTD_isError(r))
				pk->error = 1;
			else
				j->csize = r;
			if (++pk->finished == pk->njobs)
				pthread_cond_signal(&pk->done);
		}
	}
	pthread_mutex_unlock(&pk->lock);
	ZSTD_freeCCtx(cctx);
	return NULL;
}

static void draw_progress(struct packer *pk, bool final)
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
		"\r[%s] %3.0f%% %.1f/%.1f MiB  %.1f MiB/s  ETA %d:%02d ", bar,
		frac * 100, (double)pk->done_in / 1048576.0,
		(double)pk->total_in / 1048576.0, rate / 1048576.0,
		(int)eta / 60, (int)eta % 60);
	if (final)
		fputc('\n', stderr);
	fflush(stderr);
}

static void write_all(int fd, const void *buf, size_t len, const char *path)
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

/* Exactly len bytes, or the file is not what fstatat said it was. */
static void read_all(int fd, void *buf, size_t len, const char *path)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = read(fd, (char *)buf + got, len - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("%s: changed while being read", path);
		got += (size_t)n;
	}
}

static int set_times(int dirfd, const char *name, const struct stat *st,
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
static void finish_file(struct packer *pk, struct outfile *of)
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
	keep_file_meta(of, pk->root);
	if (close(of->fd))
		die("%s: %s", of->path, strerror(errno));
	free(of->entries);
	free(of->path);
	free(of);
	pk->files++;
}

/* Compress the batch on the pool, then write it out in order. */
static void run_batch(struct packer *pk)
{
	pthread_mutex_lock(&pk->lock);
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
		of->entries[of->written] = (struct zseek_writer_entry){
			(uint32_t)j->csize, (uint32_t)j->len, j->checksum};
		of->written++;
		of->out_bytes += j->csize;
		pk->done_in += j->len;
		if (of->all_queued && of->written == of->nframes)
			finish_file(pk, of);
	}
	pk->njobs = 0;
	draw_progress(pk, false);
}

/* DST/name.zst, created empty, with room for the entries of its frames. */
static struct outfile *outfile_open(struct packer *pk, const struct place *dst,
				    const struct entry *e)
{
	struct outfile *of = calloc(1, sizeof(*of));
	char *zname;

	if (!of || asprintf(&zname, "%s.zst", e->name) < 0)
		die("out of memory");
	if (asprintf(&of->path, "%s/%s", dst->path, zname) < 0)
		die("out of memory");
	of->fd = openat(dst->fd, zname,
			O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
			0600);
	if (of->fd < 0)
		die("%s: %s", of->path, strerror(errno));
	free(zname);
	of->st = e->st;
	of->nframes = (uint32_t)(((uint64_t)e->st.st_size + pk->frame - 1) /
				 pk->frame);
	of->entries = calloc(of->nframes ? of->nframes : 1,
			     sizeof(*of->entries));
	if (!of->entries)
		die("out of memory");
	return of;
}

/* Read the next frame's content into the batch; a full batch runs. */
static void queue_frame(struct packer *pk, struct outfile *of, int fd,
			size_t len, const char *spath)
{
	struct job *j = &pk->jobs[pk->njobs];

	j->of = of;
	j->src = pk->in_arena + (size_t)pk->njobs * pk->frame;
	j->dst = pk->out_arena + (size_t)pk->njobs * pk->out_cap;
	j->cap = pk->out_cap;
	read_all(fd, j->src, len, spath);
	j->len = len;
	/* before run_batch: it finishes the file once all are written */
	if (++of->queued == of->nframes)
		of->all_queued = true;
	if (++pk->njobs == pk->max_jobs)
		run_batch(pk);
}

static void pack_file(struct packer *pk, const struct place *src,
		      const struct place *dst, const struct entry *e)
{
	uint64_t left = (uint64_t)e->st.st_size;
	struct outfile *of;
	int fd;

	fd = openat(src->fd, e->name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		die("%s: %s", e->spath, strerror(errno));
	of = outfile_open(pk, dst, e);
	while (left) {
		size_t len = left < pk->frame ? (size_t)left : pk->frame;

		left -= len;
		queue_frame(pk, of, fd, len, e->spath);
	}
	close(fd);
	/* with frames, run_batch finishes it (and may have freed it) */
	if (!e->st.st_size)
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
static char **list_dir(int fd, size_t *n, const char *path)
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

static uint64_t tree_bytes(int fd, const char *path);

/* The content bytes under one name: what the progress bar counts. */
static uint64_t entry_bytes(int dirfd, const char *dir, const char *name)
{
	struct stat st;
	uint64_t total = 0;
	char *sub;
	int fd;

	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW))
		return 0; /* packing it will say why */
	if (S_ISREG(st.st_mode))
		return (uint64_t)st.st_size;
	if (!S_ISDIR(st.st_mode))
		return 0;
	fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
					 O_CLOEXEC);
	if (fd < 0)
		return 0;
	sub = join(dir, name);
	total = tree_bytes(fd, sub);
	free(sub);
	close(fd);
	return total;
}

static uint64_t tree_bytes(int fd, const char *path)
{
	size_t n;
	char **names = list_dir(fd, &n, path);
	uint64_t total = 0;

	for (size_t i = 0; i < n; i++) {
		total += entry_bytes(fd, path, names[i]);
		free(names[i]);
	}
	free(names);
	return total;
}

static void remember_dir(struct packer *pk, const char *path,
			 const struct stat *st)
{
	if (pk->ndirs == pk->dircap) {
		pk->dircap = pk->dircap ? pk->dircap * 2 : 64;
		pk->dirpaths = realloc(pk->dirpaths,
				       pk->dircap * sizeof(*pk->dirpaths));
		pk->dirstats = realloc(pk->dirstats,
				       pk->dircap * sizeof(*pk->dirstats));
		if (!pk->dirpaths || !pk->dirstats)
			die("out of memory");
	}
	pk->dirpaths[pk->ndirs] = strdup(path);
	if (!pk->dirpaths[pk->ndirs])
		die("out of memory");
	pk->dirstats[pk->ndirs++] = *st;
}

static void pack_tree(struct packer *pk, const struct place *src,
		      const struct place *dst);

/* A directory: made private (0700) while packed, its mode set last. */
static void pack_dir(struct packer *pk, const struct place *src,
		     const struct place *dst, const struct entry *e)
{
	struct place s2 = {.path = e->spath}, d2 = {.path = e->dpath};

	if (mkdirat(dst->fd, e->name, 0700) && errno != EEXIST)
		die("%s: %s", e->dpath, strerror(errno));
	s2.fd = openat(src->fd, e->name,
		       O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (s2.fd < 0)
		die("%s: %s", e->spath, strerror(errno));
	d2.fd = openat(dst->fd, e->name,
		       O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (d2.fd < 0)
		die("%s: %s", e->dpath, strerror(errno));
	pack_tree(pk, &s2, &d2);
	close(s2.fd);
	close(d2.fd);
	remember_dir(pk, e->dpath, &e->st);
	pk->dirs++;
}

/* Owner (as root) and times of a link or node just made in dst. */
static void keep_node_meta(struct packer *pk, const struct place *dst,
			   const struct entry *e)
{
	if (pk->root && fchownat(dst->fd, e->name, e->st.st_uid, e->st.st_gid,
				 AT_SYMLINK_NOFOLLOW))
		warn("%s: chown: %s", e->dpath, strerror(errno));
	if (set_times(dst->fd, e->name, &e->st, AT_SYMLINK_NOFOLLOW))
		warn("%s: times: %s", e->dpath, strerror(errno));
}

/* A symlink: copied as a link, its target never followed. */
static void pack_link(struct packer *pk, const struct place *src,
		      const struct place *dst, const struct entry *e)
{
	char target[PATH_MAX + 1];
	ssize_t len = readlinkat(src->fd, e->name, target, sizeof(target) - 1);

	if (len < 0)
		die("%s: %s", e->spath, strerror(errno));
	target[len] = '\0';
	if (symlinkat(target, dst->fd, e->name))
		die("%s: %s", e->dpath, strerror(errno));
	keep_node_meta(pk, dst, e);
	pk->links++;
}

/* A FIFO, or (as root) a device node: recreated, never opened. */
static void pack_node(struct packer *pk, const struct place *dst,
		      const struct entry *e)
{
	if (mknodat(dst->fd, e->name, e->st.st_mode, e->st.st_rdev))
		die("%s: %s", e->dpath, strerror(errno));
	keep_node_meta(pk, dst, e);
	pk->others++;
}

static bool can_make_node(const struct packer *pk, mode_t mode)
{
	return S_ISFIFO(mode) ||
	       (pk->root && (S_ISCHR(mode) || S_ISBLK(mode)));
}

static void pack_entry(struct packer *pk, const struct place *src,
		       const struct place *dst, const char *name)
{
	struct entry e = {.name = name};

	e.spath = join(src->path, name);
	e.dpath = join(dst->path, name);
	if (fstatat(src->fd, name, &e.st, AT_SYMLINK_NOFOLLOW))
		die("%s: %s", e.spath, strerror(errno));
	if (S_ISREG(e.st.st_mode))
		pack_file(pk, src, dst, &e);
	else if (S_ISDIR(e.st.st_mode))
		pack_dir(pk, src, dst, &e);
	else if (S_ISLNK(e.st.st_mode))
		pack_link(pk, src, dst, &e);
	else if (can_make_node(pk, e.st.st_mode))
		pack_node(pk, dst, &e);
	else
		fprintf(stderr, "\n%s: %s: skipped (%s)\n", progname, e.spath,
			S_ISSOCK(e.st.st_mode) ? "a socket"
					       : "a device node, needs root");
	free(e.spath);
	free(e.dpath);
}

static void pack_tree(struct packer *pk, const struct place *src,
		      const struct place *dst)
{
	size_t n;
	char **names = list_dir(src->fd, &n, src->path);

	for (size_t i = 0; i < n; i++) {
		pack_entry(pk, src, dst, names[i]);
		free(names[i]);
	}
	free(names);
}

static void usage(FILE *out)
{
	fprintf(out,
		"usage: %s [options] SRC DST\n\n"
		"Pack the directory tree SRC into the zfolio dataset DST: each "
		"file f becomes\nDST/f.zst in the zstd seekable format; "
		"directories, symlinks, FIFOs, modes,\ntimes and (as root) "
		"owners and device nodes are kept.  Every .zst file also\n"
		"decompresses with zstd -d.\n\n"
		"  -l, --level N      zstd level (default 3)\n"
		"      --frame SIZE   content per frame, 4K..16M (default "
		"128K)\n"
		"  -j, --threads N    compression threads (default: the "
		"cores)\n"
		"      --force        write into a DST that is not empty\n"
		"  -q, --quiet        no progress bar or summary\n"
		"  -V, --version      print the version and exit\n"
		"  -h, --help         this help\n",
		progname);
}

static void print_version(void)
{
	printf("%s %s, zstd %s\n", progname, ZF_VERSION, ZSTD_versionString());
}

static int parse_level(const char *s)
{
	char *end;
	long level = strtol(s, &end, 10);

	if (*end || end == s || level < ZSTD_minCLevel() ||
	    level > ZSTD_maxCLevel())
		die("bad level '%s' (%d..%d)", s, ZSTD_minCLevel(),
		    ZSTD_maxCLevel());
	return (int)level;
}

static size_t parse_frame(const char *s)
{
	uint64_t v;

	if (parse_size(s, &v, false) || v < ZSEEK_MIN_FRAME ||
	    v > ZSEEK_MAX_FRAME)
		die("bad frame size '%s' (4K..16M)", s);
	return (size_t)v;
}

static unsigned int parse_threads(const char *s)
{
	char *end;
	unsigned long n = strtoul(s, &end, 10);

	if (*end || end == s || n < 1 || n > MAX_THREADS)
		die("bad thread count '%s' (1..%d)", s, MAX_THREADS);
	return (unsigned int)n;
}

static unsigned int default_threads(void)
{
	long cores = sysconf(_SC_NPROCESSORS_ONLN);

	if (cores < 1)
		return 1;
	return cores > MAX_THREADS ? MAX_THREADS : (unsigned int)cores;
}

static const struct option longopts[] = {
	{"level", required_argument, NULL, 'l'},
	{"frame", required_argument, NULL, 'F'},
	{"threads", required_argument, NULL, 'j'},
	{"force", no_argument, NULL, 'f'},
	{"quiet", no_argument, NULL, 'q'},
	{"version", no_argument, NULL, 'V'},
	{"help", no_argument, NULL, 'h'},
	{NULL, 0, NULL, 0},
};

/* Exits for --help, --version and bad usage. */
static void parse_options(int argc, char **argv, struct packer *pk,
			  struct cli *cli)
{
	int c;

	while ((c = getopt_long(argc, argv, "l:j:qVh", longopts, NULL)) != -1) {
		switch (c) {
		case 'l':
			pk->level = parse_level(optarg);
			break;
		case 'F':
			pk->frame = parse_frame(optarg);
			break;
		case 'j':
			pk->threads = parse_threads(optarg);
			break;
		case 'f':
			cli->force = true;
			break;
		case 'q':
			cli->quiet = true;
			break;
		case 'V':
			print_version();
			exit(0);
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			exit(2);
		}
	}
	if (argc - optind != 2) {
		usage(stderr);
		exit(2);
	}
	cli->src = argv[optind];
	cli->dst = argv[optind + 1];
}

static bool dir_is_empty(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *e;
	bool empty = true;

	if (!d)
		return true;
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			empty = false;
	closedir(d);
	return empty;
}

static bool path_is_within(const char *path, const char *dir)
{
	size_t n = strlen(dir);

	return strcmp(path, dir) == 0 ||
	       (strncmp(path, dir, n) == 0 && path[n] == '/');
}

/*
 * SRC a directory; DST made if missing, not inside SRC (we would pack our
 * own output), and empty unless --force.  Gives both real paths.
 */
static void check_paths(const struct cli *cli, struct stat *sst, char *rsrc,
			char *rdst)
{
	if (stat(cli->src, sst))
		die("%s: %s", cli->src, strerror(errno));
	if (!S_ISDIR(sst->st_mode))
		die("%s: not a directory", cli->src);
	if (mkdir(cli->dst, 0755) && errno != EEXIST)
		die("%s: %s", cli->dst, strerror(errno));
	if (!realpath(cli->src, rsrc))
		die("%s: %s", cli->src, strerror(errno));
	if (!realpath(cli->dst, rdst))
		die("%s: %s", cli->dst, strerror(errno));
	if (path_is_within(rdst, rsrc))
		die("%s is inside %s", cli->dst, cli->src);
	if (!cli->force && !dir_is_empty(rdst))
		die("%s is not empty (use --force to write into it)",
		    cli->dst);
}

static int open_dir(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd < 0)
		die("%s: %s", path, strerror(errno));
	return fd;
}

/* The batch: threads * BATCH_PER_THREAD frames in, as many out. */
static void packer_setup(struct packer *pk, bool quiet)
{
	pk->root = geteuid() == 0;
	pk->progress = !quiet && isatty(2);
	pk->max_jobs = pk->threads * BATCH_PER_THREAD;
	pk->out_cap = ZSTD_compressBound(pk->frame);
	pk->jobs = calloc(pk->max_jobs, sizeof(*pk->jobs));
	pk->in_arena = malloc(pk->max_jobs * pk->frame);
	pk->out_arena = malloc(pk->max_jobs * pk->out_cap);
	pk->tids = calloc(pk->threads, sizeof(*pk->tids));
	if (!pk->jobs || !pk->in_arena || !pk->out_arena || !pk->tids)
		die("out of memory");
}

static void pool_start(struct packer *pk)
{
	if (pthread_mutex_init(&pk->lock, NULL) ||
	    pthread_cond_init(&pk->work, NULL) ||
	    pthread_cond_init(&pk->done, NULL))
		die("cannot set up the thread pool");
	for (unsigned int i = 0; i < pk->threads; i++)
		if (pthread_create(&pk->tids[i], NULL, pool_main, pk))
			die("cannot start threads");
}

static void pack(struct packer *pk, const struct place *src,
		 const struct place *dst)
{
	clock_gettime(CLOCK_MONOTONIC, &pk->t0);
	pk->total_in = tree_bytes(src->fd, src->path);
	pack_tree(pk, src, dst);
	if (pk->njobs)
		run_batch(pk);
}

/* Packing a directory changed its times: set them last, deepest first. */
static void restore_dirs(struct packer *pk)
{
	while (pk->ndirs--) {
		const struct stat *st = &pk->dirstats[pk->ndirs];
		const char *p = pk->dirpaths[pk->ndirs];

		if (pk->root && lchown(p, st->st_uid, st->st_gid))
			warn("%s: chown: %s", p, strerror(errno));
		if (chmod(p, st->st_mode & 07777))
			warn("%s: chmod: %s", p, strerror(errno));
		if (set_times(AT_FDCWD, p, st, AT_SYMLINK_NOFOLLOW))
			warn("%s: times: %s", p, strerror(errno));
		free(pk->dirpaths[pk->ndirs]);
	}
}

/* DST itself takes SRC's owner (as root), mode and times. */
static void restore_top(const struct packer *pk, const struct place *dst,
			const struct stat *sst)
{
	struct timespec ts[2] = {sst->st_atim, sst->st_mtim};

	if (pk->root && fchown(dst->fd, sst->st_uid, sst->st_gid))
		warn("%s: chown: %s", dst->path, strerror(errno));
	if (fchmod(dst->fd, sst->st_mode & 07777))
		warn("%s: chmod: %s", dst->path, strerror(errno));
	if (futimens(dst->fd, ts))
		warn("%s: times: %s", dst->path, strerror(errno));
}

static void pool_stop(struct packer *pk)
{
	pthread_mutex_lock(&pk->lock);
	pk->stop = true;
	pthread_cond_broadcast(&pk->work);
	pthread_mutex_unlock(&pk->lock);
	for (unsigned int i = 0; i < pk->threads; i++)
		pthread_join(pk->tids[i], NULL);
}

static void print_summary(struct packer *pk, bool quiet)
{
	double t, ratio;

	draw_progress(pk, true);
	t = now_s(&pk->t0);
	if (quiet)
		return;
	ratio = pk->bytes_out ? (double)pk->total_in / (double)pk->bytes_out
			      : 0.0;
	fprintf(stderr,
		"%s: %lu files, %lu dirs, %lu links, %.1f MiB in, "
		"%.1f MiB out (ratio %.2f), %.2f s\n",
		progname, pk->files, pk->dirs, pk->links,
		(double)pk->total_in / 1048576.0,
		(double)pk->bytes_out / 1048576.0, ratio, t);
}

static void packer_free(struct packer *pk)
{
	pthread_mutex_destroy(&pk->lock);
	pthread_cond_destroy(&pk->work);
	pthread_cond_destroy(&pk->done);
	free(pk->jobs);
	free(pk->in_arena);
	free(pk->out_arena);
	free(pk->tids);
	free(pk->dirpaths);
	free(pk->dirstats);
}

int main(int argc, char **argv)
{
	struct packer pk = {.level = 3, .frame = ZSEEK_DEFAULT_FRAME};
	struct cli cli = {0};
	char rsrc[PATH_MAX], rdst[PATH_MAX];
	struct place src, dst;
	struct stat sst;

	pk.threads = default_threads();
	parse_options(argc, argv, &pk, &cli);
	check_paths(&cli, &sst, rsrc, rdst);
	/* messages name paths as given; restore_dirs uses them too */
	src = (struct place){open_dir(rsrc), cli.src};
	dst = (struct place){open_dir(rdst), cli.dst};
	packer_setup(&pk, cli.quiet);
	pool_start(&pk);
	pack(&pk, &src, &dst);
	restore_dirs(&pk);
	restore_top(&pk, &dst, &sst);
	pool_stop(&pk);
	print_summary(&pk, cli.quiet);
	packer_free(&pk);
	close(src.fd);
	close(dst.fd);
	return 0;
}
