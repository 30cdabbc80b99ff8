// SPDX-License-Identifier: MIT
/*
 * zfolio DATASET MOUNTPOINT [-o OPTIONS]: the daemon.
 *
 * Options are declared once in opt_table[]: the parser, the defaults and
 * -h all read it.  Standard FUSE options pass through to libfuse, so the
 * program works from /etc/fstab as type fuse.zfolio.
 *
 * zfolio runs its own worker loop: N threads each receive a request with
 * fuse_session_receive_buf() and process it.  Each worker is registered
 * with liburcu's QSBR flavour: offline while it waits in receive, online
 * while it serves, announcing a quiescent state after every reply.
 */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <malloc.h>
#include <semaphore.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "internal.h"

enum opt_type { OPT_SIZE, OPT_SIZE_MAX, OPT_UINT, OPT_BOOL, OPT_ENUM,
		OPT_NAME };

struct opt_desc {
	const char *name;
	enum opt_type type;
	size_t offset;
	const char *def;
	const char *help;
	const char *const *choices; /* OPT_ENUM: index is the value */
	uint64_t min, max;          /* OPT_SIZE, OPT_UINT */
};

static const char *const cache_modes[] = {"engine", "kernel", NULL};
static const char *const reclaim_modes[] = {"batch", "per_folio", NULL};
static const char *const group_modes[] = {"none", "uid", "cgroup", NULL};
static const char *const readaround_modes[] = {"adaptive", "fixed", "off",
					       NULL};
static const char *const backing_modes[] = {"drop", "keep", NULL};
static const char *const io_modes[] = {"uring", "pread", NULL};

#define OFF(f) offsetof(struct options, f)
static const struct opt_desc opt_table[] = {
	{"budget", OPT_SIZE, OFF(budget), "256M",
	 "memory for cached file data (K/M/G suffixes)", NULL, 1 << 20,
	 1ull << 42},
	{"high", OPT_SIZE_MAX, OFF(high), "max",
	 "above this, background reclaim brings usage down", NULL, 0,
	 1ull << 42},
	{"threads", OPT_UINT, OFF(threads), "0",
	 "worker threads (0: twice the cores)", NULL, 0, 256},
	{"cache", OPT_ENUM, OFF(cache), "engine",
	 "engine: zfolio's cache only (direct_io); kernel: page cache in front",
	 cache_modes, 0, 0},
	{"backing_cache", OPT_ENUM, OFF(backing_cache), "drop",
	 "drop: read the backing files uncached; keep: let the kernel cache "
	 "them", backing_modes, 0, 0},
	{"backing_io", OPT_ENUM, OFF(backing_io), "uring",
	 "backing reads: io_uring batches per window, or pread (valgrind)",
	 io_modes, 0, 0},
	{"ra_kb", OPT_UINT, OFF(ra_kb), "128",
	 "largest readahead window in KiB (btrfs uses 4096)", NULL, 0,
	 64 << 10},
	{"readaround", OPT_ENUM, OFF(readaround), "adaptive",
	 "mmap faults: read around sized by use, fixed ra_kb, or off",
	 readaround_modes, 0, 0},
	{"kernel_ra_kb", OPT_UINT, OFF(kernel_ra_kb), "auto",
	 "the kernel's own read-around for mmap (auto: 4 with cache=engine)",
	 NULL, 0, 1024},
	{"ra_reclaim", OPT_ENUM, OFF(ra_reclaim), "batch",
	 "readahead at the limit: batch reclaim per window, or per_folio",
	 reclaim_modes, 0, 0},
	{"lockless", OPT_BOOL, OFF(lockless), "1",
	 "read hot folios without references (0: always take one)", NULL, 0,
	 1},
	{"group_by", OPT_ENUM, OFF(group_by), "none",
	 "child budget groups per reader: none, uid or cgroup", group_modes, 0,
	 0},
	{"group_max", OPT_SIZE_MAX, OFF(group_max), "max",
	 "memory.max of new groups", NULL, 0, 1ull << 42},
	{"group_high", OPT_SIZE_MAX, OFF(group_high), "max",
	 "memory.high of new groups", NULL, 0, 1ull << 42},
	{"ctl", OPT_NAME, OFF(ctl), ".zfolio",
	 "name of the control directory at the mount root", NULL, 0, 0},
};
#define NR_OPTS (sizeof(opt_table) / sizeof(opt_table[0]))

enum { KEY_HELP, KEY_VERSION };

static const struct fuse_opt fuse_keys[] = {
	FUSE_OPT_KEY("-h", KEY_HELP),
	FUSE_OPT_KEY("--help", KEY_HELP),
	FUSE_OPT_KEY("-V", KEY_VERSION),
	FUSE_OPT_KEY("--version", KEY_VERSION),
	FUSE_OPT_END,
};

static const char *progname = "zfolio";

static int opt_apply(struct options *o, const struct opt_desc *d,
		     const char *val)
{
	void *p = (char *)o + d->offset;
	uint64_t v;
	char *end;

	switch (d->type) {
	case OPT_SIZE:
	case OPT_SIZE_MAX:
		if (parse_size(val, &v, d->type == OPT_SIZE_MAX))
			return -EINVAL;
		if (v != UINT64_MAX && (v < d->min || v > d->max))
			return -ERANGE;
		*(uint64_t *)p = v;
		return 0;
	case OPT_UINT:
		if (strcmp(val, "auto") == 0 && strcmp(d->def, "auto") == 0) {
			*(unsigned int *)p = KERNEL_RA_AUTO;
			return 0;
		}
		errno = 0;
		v = strtoull(val, &end, 10);
		if (errno || end == val || *end || v < d->min || v > d->max)
			return -EINVAL;
		*(unsigned int *)p = (unsigned int)v;
		return 0;
	case OPT_BOOL:
		if (strcmp(val, "1") && strcmp(val, "0"))
			return -EINVAL;
		*(bool *)p = val[0] == '1';
		return 0;
	case OPT_ENUM:
		for (int i = 0; d->choices[i]; i++)
			if (strcmp(val, d->choices[i]) == 0) {
				*(int *)p = i;
				return 0;
			}
		return -EINVAL;
	case OPT_NAME:
		if (!*val || strchr(val, '/') || strlen(val) > 255 ||
		    strcmp(val, ".") == 0 || strcmp(val, "..") == 0)
			return -EINVAL;
		free(*(char **)p);
		*(char **)p = strdup(val);
		return 0;
	}
	return -EINVAL;
}

static void usage(FILE *out)
{
	fprintf(out,
		"usage: %s DATASET MOUNTPOINT [-o OPTION[,OPTION...]] [-f] "
		"[-d]\n\n"
		"Mount a zstd-compressed dataset read-only and serve it from "
		"zfolio's own\npage cache under a memory budget.  DATASET is "
		"a directory made by mkzfolio,\nany tree of .zst and plain "
		"files, or one .zst file.\n\nzfolio options (-o name=value):\n",
		progname);
	for (size_t i = 0; i < NR_OPTS; i++) {
		const struct opt_desc *d = &opt_table[i];
		char left[48];

		snprintf(left, sizeof(left), "%s=%s", d->name,
			 d->type == OPT_ENUM ? "MODE"
			 : d->type == OPT_UINT ? "N"
			 : d->type == OPT_BOOL ? "0|1"
			 : d->type == OPT_NAME ? "NAME"
					       : "SIZE");
		fprintf(out, "    %-22s %s (default: %s)\n", left, d->help,
			d->def);
	}
	fprintf(out,
		"\nFUSE and mount options pass through, among them:\n"
		"    -f                     stay in the foreground\n"
		"    -d                     debug: print every request "
		"(implies -f)\n"
		"    -o allow_other         let other users read the mount\n"
		"    -o nosuid,nodev        set by default\n\n"
		"Unmount with: fusermount3 -u MOUNTPOINT\n"
		"fstab: DATASET MOUNTPOINT fuse.zfolio budget=512M 0 0\n");
}

struct parse_ctx {
	struct options *opt;
	int nonopts;
	bool help, version;
	char *error;
};

static int opt_proc(void *data, const char *arg, int key,
		    struct fuse_args *outargs)
{
	struct parse_ctx *pc = data;

	(void)outargs;
	switch (key) {
	case KEY_HELP:
		pc->help = true;
		return 0;
	case KEY_VERSION:
		pc->version = true;
		return 0;
	case FUSE_OPT_KEY_NONOPT:
		if (pc->nonopts++ == 0) {
			pc->opt->dataset = strdup(arg);
			return 0;
		}
		return 1; /* the mountpoint: libfuse takes it */
	case FUSE_OPT_KEY_OPT:
		for (size_t i = 0; i < NR_OPTS; i++) {
			size_t n = strlen(opt_table[i].name);

			if (strncmp(arg, opt_table[i].name, n) ||
			    (arg[n] != '=' && arg[n] != '\0'))
				continue;
			if (arg[n] != '=' ||
			    opt_apply(pc->opt, &opt_table[i], arg + n + 1)) {
				if (!pc->error &&
				    asprintf(&pc->error,
					     "bad value for option %s: '%s'",
					     opt_table[i].name,
					     arg[n] ? arg + n + 1 : "") < 0)
					pc->error = NULL;
				return -1;
			}
			return 0;
		}
		return 1; /* a FUSE or mount option */
	}
	return 1;
}

static int check_mountpoint(const char *mp)
{
	struct dirent *d;
	DIR *dir = opendir(mp);

	if (!dir) {
		fprintf(stderr, "%s: mountpoint %s: %s\n", progname, mp,
			strerror(errno));
		return -1;
	}
	while ((d = readdir(dir)))
		if (strcmp(d->d_name, ".") && strcmp(d->d_name, "..")) {
			closedir(dir);
			fprintf(stderr,
				"%s: mountpoint %s is not an empty directory\n",
				progname, mp);
			return -1;
		}
	closedir(dir);
	return 0;
}

/* --- workers --- */

struct loop {
	struct fuse_session *se;
	bool ring;
	sem_t done;
	pthread_t *threads;
	unsigned int n;
};

static void *worker_main(void *arg)
{
	struct loop *lp = arg;
	struct fuse_buf buf = {.mem = NULL};
	static atomic_int ids;
	struct worker *w = worker_create(atomic_fetch_add(&ids, 1), lp->ring);

	if (!w) {
		fuse_session_exit(lp->se);
		sem_post(&lp->done);
		return NULL;
	}
	current_worker = w;
	cache_thread_register();
	while (!fuse_session_exited(lp->se)) {
		int r;

		cache_thread_offline();
		r = fuse_session_receive_buf(lp->se, &buf);
		cache_thread_online();
		if (r == -EINTR || r == -EAGAIN)
			continue;
		if (r <= 0) {
			fuse_session_exit(lp->se);
			break;
		}
		fuse_session_process_buf(lp->se, &buf);
		/* pointers loaded for this request are dead from here on */
		cache_quiescent();
	}
	cache_thread_unregister();
	free(buf.mem);
	current_worker = NULL;
	worker_destroy(w);
	sem_post(&lp->done);
	return NULL;
}

static int loop_start(struct loop *lp, unsigned int n)
{
	sigset_t all, old;

	lp->threads = calloc(n, sizeof(*lp->threads));
	if (!lp->threads)
		return -ENOMEM;
	sem_init(&lp->done, 0, 0);
	/* signals go to the main thread, which ends the session */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	for (lp->n = 0; lp->n < n; lp->n++)
		if (pthread_create(&lp->threads[lp->n], NULL, worker_main, lp))
			break;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return lp->n ? 0 : -EAGAIN;
}

static void loop_wait(struct loop *lp)
{
	while (!fuse_session_exited(lp->se))
		if (sem_wait(&lp->done) == 0)
			break;
	/* unmounting ends every worker's receive with ENODEV */
	fuse_session_unmount(lp->se);
	for (unsigned int i = 0; i < lp->n; i++)
		pthread_join(lp->threads[i], NULL);
	free(lp->threads);
	sem_destroy(&lp->done);
}

static void raise_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

int main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts fopts = {0};
	struct options opt = {0};
	struct parse_ctx pc = {.opt = &opt};
	struct fuse_session *se = NULL;
	struct dataset ds;
	struct loop lp = {0};
	char err[512] = "";
	long cores;
	int ret = 1;

	if (argc > 0 && argv[0]) {
		const char *s = strrchr(argv[0], '/');

		progname = s ? s + 1 : argv[0];
	}
	for (size_t i = 0; i < NR_OPTS; i++)
		opt_apply(&opt, &opt_table[i], opt_table[i].def);
	if (fuse_opt_parse(&args, &pc, fuse_keys, opt_proc) == -1) {
		fprintf(stderr, "%s: %s\n", progname,
			pc.error ? pc.error : "cannot parse the options");
		goto out;
	}
	if (pc.help) {
		usage(stdout);
		ret = 0;
		goto out;
	}
	if (pc.version) {
		printf("zfolio %s, libfuse %s, zstd %s\n", ZF_VERSION,
		       fuse_pkgversion(), ZSTD_versionString());
		ret = 0;
		goto out;
	}
	/* defaults a mount should have; the command line may add more */
	fuse_opt_add_arg(&args, "-odefault_permissions,nosuid,nodev,"
				"subtype=zfolio");
	if (fuse_parse_cmdline(&args, &fopts) != 0)
		goto out;
	if (!opt.dataset || !fopts.mountpoint) {
		fprintf(stderr, "%s: need DATASET and MOUNTPOINT (try -h)\n",
			progname);
		goto out;
	}
	if (access(opt.dataset, R_OK)) {
		fprintf(stderr, "%s: dataset %s: %s\n", progname, opt.dataset,
			strerror(errno));
		goto out;
	}
	if (check_mountpoint(fopts.mountpoint))
		goto out;
	if (access("/dev/fuse", R_OK | W_OK)) {
		fprintf(stderr, "%s: cannot use /dev/fuse: %s (is the fuse "
				"module loaded?)\n",
			progname, strerror(errno));
		goto out;
	}
	cores = sysconf(_SC_NPROCESSORS_ONLN);
	if (!opt.threads)
		opt.threads = (unsigned int)(cores > 0 ? 2 * cores : 2);
	if (opt.ra_kb % 4) {
		fprintf(stderr, "%s: ra_kb must be a multiple of 4\n",
			progname);
		goto out;
	}
	opt.foreground = fopts.foreground;
	opt.mountpoint = fopts.mountpoint;
	raise_fd_limit();
	backing_faults_from_env();
	/* folio buffers come and go: give big ones back to the system */
	mallopt(M_MMAP_THRESHOLD, 64 << 10);
	mallopt(M_TRIM_THRESHOLD, 1 << 20);

	if (dataset_open(&ds, &opt, err, sizeof(err))) {
		fprintf(stderr, "%s: %s\n", progname, err);
		goto out;
	}
	{
		/* fsname=DATASET, its commas escaped for the option parser */
		char fsname[8400] = "-ofsname=";
		size_t k = strlen(fsname);

		for (const char *c = opt.dataset; *c && k < sizeof(fsname) - 3;
		     c++) {
			if (*c == ',' || *c == '\\')
				fsname[k++] = '\\';
			fsname[k++] = *c;
		}
		fsname[k] = '\0';
		fuse_opt_add_arg(&args, fsname);
	}
	se = fuse_session_new(&args, &zfolio_ops, sizeof(zfolio_ops), &ds);
	if (!se)
		goto out_ds;
	ds.se = se;
	if (fuse_set_signal_handlers(se))
		goto out_se;
	if (fuse_session_mount(se, fopts.mountpoint)) {
		fprintf(stderr, "%s: cannot mount on %s\n", progname,
			fopts.mountpoint);
		goto out_sig;
	}
	/* shared mappings of direct_io files: see initio.c */
	if (opt.cache == CACHE_ENGINE && initio_install(se))
		fprintf(stderr, "%s: cannot watch INIT: MAP_SHARED will fail\n",
			progname);
	fuse_daemonize(fopts.foreground);
	lp.se = se;
	lp.ring = opt.backing_io == BACKING_URING;
	if (cache_start(&ds.cache) || loop_start(&lp, opt.threads)) {
		fprintf(stderr, "%s: cannot start threads\n", progname);
		fuse_session_unmount(se);
		goto out_sig;
	}
	loop_wait(&lp);
	ret = 0;
out_sig:
	fuse_remove_signal_handlers(se);
out_se:
	fuse_session_destroy(se);
out_ds:
	dataset_close(&ds);
out:
	free(fopts.mountpoint);
	fuse_opt_free_args(&args);
	free(opt.dataset);
	free(opt.ctl);
	free(pc.error);
	return ret;
}
