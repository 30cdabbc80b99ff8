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
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
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

static const char *progname = "mkzfolio";

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "\n%s: ", progname);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
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
	fprintf(stderr, "\r[%s] %3.0f%% %.1f/%.1f MiB  %.1f MiB/s  ETA %d:%02d ",
		bar, frac * 100, (double)pk->done_in / 1048576.0,
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
			die("%s: %s", path, n < 0 ? strerror(errno) : "short write");
		p += n;
		len -= (size_t)n;
	}
}

static void set_times(int dirfd, const char *name, const struct stat *st,
		      int flags)
{
	struct timespec ts[2] = {st->st_atim, st->st_mtim};

	utimensat(dirfd, name, ts, flags);
}

static void finish_file(struct packer *pk, struct outfile *of)
{
	size_t tsize = zseek_table_size(of->nframes);
	uint8_t *tab = malloc(tsize);

	if (!tab)
		die("out of memory");
	zseek_write_table(of->entries, of->nframes, tab, tsize);
	write_all(of->fd, tab, tsize, of->path);
	free(tab);
	of->out_bytes += tsize;
	pk->bytes_out += of->out_bytes;
	if (pk->root && fchown(of->fd, of->st.st_uid, of->st.st_gid))
		die("%s: chown: %s", of->path, strerror(errno));
	if (fchmod(of->fd, of->st.st_mode & 07777))
		die("%s: chmod: %s", of->path, strerror(errno));
	{
		struct timespec ts[2] = {of->st.st_atim, of->st.st_mtim};

		if (futimens(of->fd, ts))
			die("%s: %s", of->path, strerror(errno));
	}
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

static void pack_file(struct packer *pk, int sdir, const char *name,
		      int ddir, const char *dpath, const struct stat *st)
{
	struct outfile *of = calloc(1, sizeof(*of));
	char *zname;
	uint64_t left = (uint64_t)st->st_size;
	int fd;

	if (!of || asprintf(&zname, "%s.zst", name) < 0)
		die("out of memory");
	fd = openat(sdir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		die("%s/%s: %s", dpath, name, strerror(errno));
	of->path = NULL;
	if (asprintf(&of->path, "%s/%s", dpath, zname) < 0)
		die("out of memory");
	of->fd = openat(ddir, zname, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW |
				      O_CLOEXEC, 0600);
	if (of->fd < 0)
		die("%s: %s", of->path, strerror(errno));
	free(zname);
	of->st = *st;
	of->nframes = (uint32_t)((left + pk->frame - 1) / pk->frame);
	of->entries = calloc(of->nframes ? of->nframes : 1,
			     sizeof(*of->entries));
	if (!of->entries)
		die("out of memory");
	while (left) {
		struct job *j = &pk->jobs[pk->njobs];
		size_t want = left < pk->frame ? (size_t)left : pk->frame;
		size_t got = 0;

		j->of = of;
		j->src = pk->in_arena + (size_t)pk->njobs * pk->frame;
		j->dst = pk->out_arena + (size_t)pk->njobs * pk->out_cap;
		j->cap = pk->out_cap;
		while (got < want) {
			ssize_t n = read(fd, j->src + got, want - got);

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				die("%s: changed while being read", of->path);
			got += (size_t)n;
		}
		j->len = want;
		left -= want;
		of->queued++;
		if (!left)
			of->all_queued = true;
		if (++pk->njobs == pk->max_jobs)
			run_batch(pk);
	}
	close(fd);
	/* with frames, run_batch finishes it (and may have freed it) */
	if (!st->st_size)
		finish_file(pk, of);
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
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
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (*n == cap) {
			cap = cap ? cap * 2 : 64;
			v = realloc(v, cap * sizeof(*v));
			if (!v)
				die("out of memory");
		}
		v[(*n)++] = strdup(e->d_name);
	}
	closedir(d);
	if (*n)
		qsort(v, *n, sizeof(*v), cmp_name);
	return v;
}

static uint64_t tree_bytes(int fd, const char *path)
{
	size_t n;
	char **names = list_dir(fd, &n, path);
	uint64_t total = 0;

	for (size_t i = 0; i < n; i++) {
		struct stat st;

		if (fstatat(fd, names[i], &st, AT_SYMLINK_NOFOLLOW) == 0) {
			if (S_ISREG(st.st_mode)) {
				total += (uint64_t)st.st_size;
			} else if (S_ISDIR(st.st_mode)) {
				int sub = openat(fd, names[i],
						 O_RDONLY | O_DIRECTORY |
							 O_NOFOLLOW | O_CLOEXEC);

				if (sub >= 0) {
					total += tree_bytes(sub, names[i]);
					close(sub);
				}
			}
		}
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
	pk->dirstats[pk->ndirs++] = *st;
}

static void pack_tree(struct packer *pk, int sdir, int ddir, const char *dpath)
{
	size_t n;
	char **names = list_dir(sdir, &n, dpath);

	for (size_t i = 0; i < n; i++) {
		const char *name = names[i];
		char *sub_path;
		struct stat st;

		if (fstatat(sdir, name, &st, AT_SYMLINK_NOFOLLOW))
			die("%s/%s: %s", dpath, name, strerror(errno));
		if (asprintf(&sub_path, "%s/%s", dpath, name) < 0)
			die("out of memory");
		if (S_ISREG(st.st_mode)) {
			pack_file(pk, sdir, name, ddir, dpath, &st);
		} else if (S_ISDIR(st.st_mode)) {
			int s2, d2;

			if (mkdirat(ddir, name, 0700) && errno != EEXIST)
				die("%s: %s", sub_path, strerror(errno));
			s2 = openat(sdir, name, O_RDONLY | O_DIRECTORY |
							O_NOFOLLOW | O_CLOEXEC);
			d2 = openat(ddir, name, O_RDONLY | O_DIRECTORY |
							O_NOFOLLOW | O_CLOEXEC);
			if (s2 < 0 || d2 < 0)
				die("%s: %s", sub_path, strerror(errno));
			pack_tree(pk, s2, d2, sub_path);
			close(s2);
			close(d2);
			remember_dir(pk, sub_path, &st);
			pk->dirs++;
		} else if (S_ISLNK(st.st_mode)) {
			char target[PATH_MAX + 1];
			ssize_t len = readlinkat(sdir, name, target,
						 sizeof(target) - 1);

			if (len < 0)
				die("%s: %s", sub_path, strerror(errno));
			target[len] = '\0';
			if (symlinkat(target, ddir, name))
				die("%s: %s", sub_path, strerror(errno));
			if (pk->root)
				fchownat(ddir, name, st.st_uid, st.st_gid,
					 AT_SYMLINK_NOFOLLOW);
			set_times(ddir, name, &st, AT_SYMLINK_NOFOLLOW);
			pk->links++;
		} else if (S_ISFIFO(st.st_mode) ||
			   (pk->root && (S_ISCHR(st.st_mode) ||
					 S_ISBLK(st.st_mode)))) {
			if (mknodat(ddir, name, st.st_mode, st.st_rdev))
				die("%s: %s", sub_path, strerror(errno));
			if (pk->root)
				fchownat(ddir, name, st.st_uid, st.st_gid,
					 AT_SYMLINK_NOFOLLOW);
			set_times(ddir, name, &st, AT_SYMLINK_NOFOLLOW);
			pk->others++;
		} else {
			fprintf(stderr, "\n%s: %s: skipped (%s)\n", progname,
				sub_path,
				S_ISSOCK(st.st_mode) ? "a socket"
						     : "a device node, needs root");
		}
		free(sub_path);
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
		"directories, symlinks, modes, times\nand (as root) owners are "
		"kept.  Every .zst file also decompresses with zstd -d.\n\n"
		"  -l, --level N      zstd level (default 3)\n"
		"      --frame SIZE   content per frame, 4K..16M (default "
		"128K)\n"
		"  -j, --threads N    compression threads (default: the "
		"cores)\n"
		"      --force        write into a DST that is not empty\n"
		"  -q, --quiet        no progress bar or summary\n"
		"  -h, --help         this help\n",
		progname);
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

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"level", required_argument, NULL, 'l'},
		{"frame", required_argument, NULL, 'F'},
		{"threads", required_argument, NULL, 'j'},
		{"force", no_argument, NULL, 'f'},
		{"quiet", no_argument, NULL, 'q'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct packer pk = {.level = 3, .frame = ZSEEK_DEFAULT_FRAME};
	bool force = false, quiet = false;
	char rsrc[PATH_MAX], rdst[PATH_MAX];
	struct stat sst;
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	int c, sfd, dfd;
	double t;

	pk.threads = cores > 0 ? (unsigned int)cores : 1;
	while ((c = getopt_long(argc, argv, "l:j:qh", longopts, NULL)) != -1) {
		char *end;
		uint64_t v;

		switch (c) {
		case 'l':
			pk.level = (int)strtol(optarg, &end, 10);
			if (*end || end == optarg ||
			    pk.level < ZSTD_minCLevel() ||
			    pk.level > ZSTD_maxCLevel())
				die("bad level '%s' (%d..%d)", optarg,
				    ZSTD_minCLevel(), ZSTD_maxCLevel());
			break;
		case 'F':
			if (parse_size(optarg, &v, false) ||
			    v < ZSEEK_MIN_FRAME || v > ZSEEK_MAX_FRAME)
				die("bad frame size '%s' (4K..16M)", optarg);
			pk.frame = (size_t)v;
			break;
		case 'j':
			pk.threads = (unsigned int)strtoul(optarg, &end, 10);
			if (*end || end == optarg || pk.threads < 1 ||
			    pk.threads > 1024)
				die("bad thread count '%s'", optarg);
			break;
		case 'f':
			force = true;
			break;
		case 'q':
			quiet = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (argc - optind != 2) {
		usage(stderr);
		return 2;
	}
	if (stat(argv[optind], &sst) || !S_ISDIR(sst.st_mode))
		die("%s: not a directory", argv[optind]);
	if (mkdir(argv[optind + 1], 0755) && errno != EEXIST)
		die("%s: %s", argv[optind + 1], strerror(errno));
	if (!realpath(argv[optind], rsrc) || !realpath(argv[optind + 1], rdst))
		die("%s", strerror(errno));
	if (strcmp(rsrc, rdst) == 0 ||
	    (strncmp(rdst, rsrc, strlen(rsrc)) == 0 &&
	     rdst[strlen(rsrc)] == '/'))
		die("%s is inside %s", argv[optind + 1], argv[optind]);
	if (!force && !dir_is_empty(rdst))
		die("%s is not empty (use --force to write into it)",
		    argv[optind + 1]);
	sfd = open(rsrc, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	dfd = open(rdst, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (sfd < 0 || dfd < 0)
		die("%s", strerror(errno));
	pk.root = geteuid() == 0;
	pk.progress = !quiet && isatty(2);
	pk.max_jobs = pk.threads * BATCH_PER_THREAD;
	pk.out_cap = ZSTD_compressBound(pk.frame);
	pk.jobs = calloc(pk.max_jobs, sizeof(*pk.jobs));
	pk.in_arena = malloc(pk.max_jobs * pk.frame);
	pk.out_arena = malloc(pk.max_jobs * pk.out_cap);
	pk.tids = calloc(pk.threads, sizeof(*pk.tids));
	if (!pk.jobs || !pk.in_arena || !pk.out_arena || !pk.tids)
		die("out of memory");
	pthread_mutex_init(&pk.lock, NULL);
	pthread_cond_init(&pk.work, NULL);
	pthread_cond_init(&pk.done, NULL);
	for (unsigned int i = 0; i < pk.threads; i++)
		if (pthread_create(&pk.tids[i], NULL, pool_main, &pk))
			die("cannot start threads");
	clock_gettime(CLOCK_MONOTONIC, &pk.t0);
	pk.total_in = tree_bytes(sfd, rsrc);
	pack_tree(&pk, sfd, dfd, argv[optind + 1]);
	if (pk.njobs)
		run_batch(&pk);
	/* directory times last, deepest first: packing changed them */
	while (pk.ndirs--) {
		struct stat *st = &pk.dirstats[pk.ndirs];
		const char *p = pk.dirpaths[pk.ndirs];

		if (pk.root)
			lchown(p, st->st_uid, st->st_gid);
		chmod(p, st->st_mode & 07777);
		set_times(AT_FDCWD, p, st, AT_SYMLINK_NOFOLLOW);
		free(pk.dirpaths[pk.ndirs]);
	}
	if (pk.root)
		fchown(dfd, sst.st_uid, sst.st_gid);
	fchmod(dfd, sst.st_mode & 07777);
	{
		struct timespec ts[2] = {sst.st_atim, sst.st_mtim};

		futimens(dfd, ts);
	}
	pthread_mutex_lock(&pk.lock);
	pk.stop = true;
	pthread_cond_broadcast(&pk.work);
	pthread_mutex_unlock(&pk.lock);
	for (unsigned int i = 0; i < pk.threads; i++)
		pthread_join(pk.tids[i], NULL);
	draw_progress(&pk, true);
	t = now_s(&pk.t0);
	if (!quiet)
		fprintf(stderr,
			"%s: %lu files, %lu dirs, %lu links, %.1f MiB in, "
			"%.1f MiB out (ratio %.2f), %.2f s\n",
			progname, pk.files, pk.dirs, pk.links,
			(double)pk.total_in / 1048576.0,
			(double)pk.bytes_out / 1048576.0,
			pk.bytes_out ? (double)pk.total_in /
					       (double)pk.bytes_out
				     : 0.0,
			t);
	free(pk.jobs);
	free(pk.in_arena);
	free(pk.out_arena);
	free(pk.tids);
	free(pk.dirpaths);
	free(pk.dirstats);
	close(sfd);
	close(dfd);
	return 0;
}
