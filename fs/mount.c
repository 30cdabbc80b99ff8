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
 * while it serves, announcing a quiescent state after every reply.  The
 * loop and its stop are in loop.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "loop.h"

enum { KEY_HELP, KEY_VERSION };

static const struct fuse_opt fuse_keys[] = {
	FUSE_OPT_KEY("-h", KEY_HELP),
	FUSE_OPT_KEY("--help", KEY_HELP),
	FUSE_OPT_KEY("-V", KEY_VERSION),
	FUSE_OPT_KEY("--version", KEY_VERSION),
	FUSE_OPT_END,
};

static const char *progname = "zfolio";

struct parse_ctx {
	struct options *opt;
	int nonopts;
	const char *mountpoint;
	bool help, version;
	char *error;
};

/* The flags fuse_parse_cmdline() and fuse_session_new() take. */
static bool is_fuse_flag(const char *arg)
{
	static const char *const flags[] = { "-d", "--debug", "-f", "-s" };

	for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++)
		if (strcmp(arg, flags[i]) == 0)
			return true;
	return false;
}

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
		if (pc->nonopts > 2) {
			if (asprintf(&pc->error, "one DATASET and one "
						 "MOUNTPOINT, then '%s'? "
						 "(try -h)", arg) < 0)
				pc->error = NULL;
			return -1;
		}
		pc->mountpoint = arg;
		return 1; /* the mountpoint: libfuse takes it */
	case FUSE_OPT_KEY_OPT:
		/* a flag of the command line (-o's options come without a
		 * dash): only libfuse's own go on, so that a typo is named
		 * before the arguments are looked at */
		if (arg[0] == '-') {
			if (is_fuse_flag(arg))
				return 1;
			if (asprintf(&pc->error, "unknown option '%s' "
						 "(try -h)", arg) < 0)
				pc->error = NULL;
			return -1;
		}
		/* the kernel's: zfolio serves files differently on a
		 * read-only mount (ops.c, kernel_opens) */
		if (strcmp(arg, "ro") == 0 || strcmp(arg, "rw") == 0)
			pc->opt->read_only = arg[1] == 'o';
		/* fuse2's, gone from libfuse 3: zfolio checks it itself */
		if (strcmp(arg, "nonempty") == 0) {
			pc->opt->nonempty = true;
			return 0;
		}
		for (size_t i = 0; i < nr_opts; i++) {
			size_t n = strlen(opt_table[i].name);

			if (strncmp(arg, opt_table[i].name, n) ||
			    (arg[n] != '=' && arg[n] != '\0'))
				continue;
			if (arg[n] != '=' ||
			    opt_apply(pc->opt, &opt_table[i], arg + n + 1)) {
				char range[128];

				opt_value_range(&opt_table[i], range,
						sizeof(range));
				if (!pc->error &&
				    asprintf(&pc->error,
					     "bad value for option %s: '%s' "
					     "(%s)",
					     opt_table[i].name,
					     arg[n] ? arg + n + 1 : "",
					     range) < 0)
					pc->error = NULL;
				return -1;
			}
			return 0;
		}
		return 1; /* a FUSE or mount option */
	}
	return 1;
}

static int check_mountpoint(const char *mp, bool nonempty)
{
	char real[PATH_MAX], type[PATH_MAX], source[PATH_MAX];
	struct dirent *d;
	DIR *dir = opendir(mp);

	/* its daemon is gone: over io_uring the kernel says ECONNABORTED */
	if (!dir && (errno == ENOTCONN || errno == ECONNABORTED)) {
		fprintf(stderr,
			"%s: mountpoint %s: a mount whose daemon has exited "
			"is still there; unmount it first: fusermount3 -u %s\n",
			progname, mp, mp);
		return -1;
	}
	if (!dir) {
		fprintf(stderr, "%s: mountpoint %s: %s\n", progname, mp,
			strerror(errno));
		return -1;
	}
	if (realpath(mp, real) && mount_find(real, type, source,
					     sizeof(type), NULL)) {
		closedir(dir);
		fprintf(stderr,
			"%s: %s is already a mountpoint (%s from %s); unmount "
			"it first: fusermount3 -u %s\n",
			progname, mp, type, source, mp);
		return -1;
	}
	while (!nonempty && (d = readdir(dir)))
		if (strcmp(d->d_name, ".") && strcmp(d->d_name, "..")) {
			closedir(dir);
			fprintf(stderr,
				"%s: mountpoint %s is not an empty directory "
				"(-o nonempty mounts over it)\n",
				progname, mp);
			return -1;
		}
	closedir(dir);
	return 0;
}

static void raise_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* What main() carries from one step to the next. */
struct daemon {
	struct fuse_args args;
	struct fuse_cmdline_opts fopts;
	struct options opt;
	struct parse_ctx pc;
	struct fuse_session *se;
	struct dataset ds;
	bool ds_open;
};

enum { RUN, EXIT_OK, EXIT_FAIL };

/* Parse the command line (or the fstab line mount(8) passes). */
static int parse_args(struct daemon *d)
{
	options_defaults(&d->opt);
	d->pc.opt = &d->opt;
	if (fuse_opt_parse(&d->args, &d->pc, fuse_keys, opt_proc) == -1) {
		fprintf(stderr, "%s: %s\n", progname,
			d->pc.error ? d->pc.error
				    : "cannot parse the options");
		return EXIT_FAIL;
	}
	if (d->pc.help) {
		options_usage(stdout, progname);
		return EXIT_OK;
	}
	if (d->pc.version) {
		printf("zfolio %s, libfuse %s, zstd %s\n", ZF_VERSION,
		       fuse_pkgversion(), ZSTD_versionString());
		return EXIT_OK;
	}
	/* defaults a mount should have; the command line may add more */
	fuse_opt_add_arg(&d->args, "-odefault_permissions,nosuid,nodev,"
				   "subtype=zfolio");
	/* named here, before libfuse's own words for it */
	if (d->pc.mountpoint && access(d->pc.mountpoint, F_OK) &&
	    errno != ENOTCONN && errno != ECONNABORTED) {
		fprintf(stderr, "%s: mountpoint %s: %s\n", progname,
			d->pc.mountpoint, strerror(errno));
		return EXIT_FAIL;
	}
	if (fuse_parse_cmdline(&d->args, &d->fopts) != 0)
		return EXIT_FAIL;
	if (!d->opt.dataset || !d->fopts.mountpoint) {
		fprintf(stderr, "%s: need %s (try -h)\n", progname,
			d->opt.dataset ? "a MOUNTPOINT after the DATASET"
				       : "DATASET and MOUNTPOINT");
		return EXIT_FAIL;
	}
	return RUN;
}

#define ENABLE_URING "/sys/module/fuse/parameters/enable_uring"

/* transport=uring: is FUSE over io_uring on in this kernel? */
static int check_uring(void)
{
	FILE *f = fopen(ENABLE_URING, "re");
	int c = f ? fgetc(f) : EOF;

	if (f)
		fclose(f);
	if (c == 'Y' || c == '1')
		return 0;
	if (!f)
		fprintf(stderr, "%s: transport=uring: this kernel has no FUSE "
				"over io_uring (Linux 6.14+, "
				"CONFIG_FUSE_IO_URING)\n", progname);
	else
		fprintf(stderr, "%s: transport=uring: FUSE over io_uring is off "
				"(as root: echo 1 > %s)\n", progname,
			ENABLE_URING);
	return -1;
}

/* Everything that can be refused before mounting, with a clear reason. */
static int check_args(struct daemon *d)
{
	struct options *o = &d->opt;
	char real[PATH_MAX];
	long cores;

	if (store_is_url(o->dataset)) {
		/* reached when the dataset is opened */
	} else if (access(o->dataset, R_OK) || !realpath(o->dataset, real)) {
		fprintf(stderr, "%s: dataset %s: %s\n", progname, o->dataset,
			strerror(errno));
		return -1;
	} else {
		/* recorded in /proc/mounts: absolute, whatever the cwd was */
		free(o->dataset);
		o->dataset = strdup(real);
	}
	if (!o->dataset || check_mountpoint(d->fopts.mountpoint, o->nonempty))
		return -1;
	if (access("/dev/fuse", R_OK | W_OK)) {
		fprintf(stderr, "%s: cannot use /dev/fuse: %s (%s)\n", progname,
			strerror(errno),
			errno == ENOENT ? "is the fuse module loaded?"
					: "its mode lets only some users mount: "
					  "ask root, or see fuse(8)");
		return -1;
	}
	o->ra_kb = options_ra_kb(o);
	if (o->ra_kb % 4) {
		fprintf(stderr, "%s: ra_kb must be a multiple of 4\n",
			progname);
		return -1;
	}
	/* the kernel's window is in pages: 7 would be taken as 4 */
	if (o->kernel_ra_kb != OPT_UINT_AUTO && o->kernel_ra_kb % 4) {
		fprintf(stderr, "%s: kernel_ra_kb must be a multiple of 4\n",
			progname);
		return -1;
	}
	if (o->transport == TRANSPORT_URING && check_uring())
		return -1;
	/* as memory.high above memory.max: allowed, and never reached */
	if (o->high != UINT64_MAX && o->high >= o->budget)
		fprintf(stderr,
			"%s: high=%llu KiB is not below budget=%llu KiB: "
			"the background reclaimer will never run\n",
			progname, (unsigned long long)(o->high >> 10),
			(unsigned long long)(o->budget >> 10));
	cores = sysconf(_SC_NPROCESSORS_ONLN);
	if (!o->threads)
		o->threads = (unsigned int)(cores > 0 ? 2 * cores : 2);
	if (o->decode_threads == OPT_UINT_AUTO)
		o->decode_threads = (unsigned int)(cores > 0 ? cores : 1);
	o->foreground = d->fopts.foreground;
	o->mountpoint = d->fopts.mountpoint;
	return 0;
}

/* -o fsname=DATASET, its commas and backslashes escaped for libfuse. */
static void add_fsname(struct fuse_args *args, const char *dataset)
{
	char fsname[PATH_MAX * 2 + 16] = "-ofsname=";
	size_t k = strlen(fsname);

	for (const char *c = dataset; *c && k < sizeof(fsname) - 3; c++) {
		if (*c == ',' || *c == '\\')
			fsname[k++] = '\\';
		fsname[k++] = *c;
	}
	fsname[k] = '\0';
	url_hide_passwords(fsname); /* /proc/mounts is for every user */
	fuse_opt_add_arg(args, fsname);
}

/* The FUSE session, mounted; the dataset must be open. */
static int mount_session(struct daemon *d)
{
	add_fsname(&d->args, d->opt.dataset);
	d->se = options_session_new(&d->args, &zfolio_ops, sizeof(zfolio_ops),
				    &d->ds, progname);
	if (!d->se)
		return -1;
	d->ds.se = d->se;
	if (stop_signals_install())
		return -1;
	if (fuse_session_mount(d->se, d->fopts.mountpoint)) {
		fprintf(stderr, "%s: cannot mount on %s\n", progname,
			d->fopts.mountpoint);
		return -1;
	}
	/* shared mappings of direct_io files, io_uring: see initio.c */
	if (initio_install(d->se, d->opt.cache == CACHE_ENGINE,
			   d->opt.transport != TRANSPORT_DEV)) {
		fprintf(stderr, "%s: cannot install the session's I/O\n",
			progname);
		return -1;
	}
	return 0;
}

/*
 * FUSE over io_uring, once INIT is answered: per_queue workers on each
 * queue, each registering its entry.  0 when the ring serves (or, with
 * transport=auto, when it cannot and /dev/fuse goes on alone).
 */
static int uring_start(struct daemon *d, struct loop *lp, unsigned int nq,
		       unsigned int per_queue)
{
	bool strict = d->opt.transport == TRANSPORT_URING;
	unsigned int started = 0, ready = 0, from = lp->n;
	int r = initio_wait(10000), err = 0;

	if (r != 1) {
		if (strict)
			fprintf(stderr,
				"%s: transport=uring: %s\n", progname,
				r < 0 ? "the kernel did not send INIT"
				      : "the kernel did not offer FUSE over "
					"io_uring at INIT");
		return strict ? -1 : 0;
	}
	furing_set_poll(d->opt.uring_poll_us);
	for (unsigned int q = 0; q < nq; q++)
		started += loop_add(lp, per_queue, true, q);
	for (unsigned int i = 0; i < started; i++)
		sem_wait(&lp->registered);
	for (unsigned int q = 0; q < nq; q++) {
		bool any = false;

		for (unsigned int i = from; i < lp->n; i++)
			if (lp->workers[i].qid == q && !lp->workers[i].reg_err)
				any = true;
			else if (lp->workers[i].qid == q && !err)
				err = lp->workers[i].reg_err;
		ready += any;
	}
	if (started < nq * per_queue && !err)
		err = -EAGAIN;
	furing_set_state(ready == nq, nq, started);
	if (ready == nq && !err)
		return 0;
	if (ready == nq) {
		fprintf(stderr, "%s: FUSE over io_uring: some entries refused "
				"(%s); serving with the others\n",
			progname, strerror(-err));
		return 0;
	}
	fprintf(stderr, "%s: %s: the kernel refused to register (%s)%s\n",
		progname, strict ? "transport=uring" : "FUSE over io_uring",
		strerror(-err), strict ? "" : "; serving over /dev/fuse");
	return strict ? -1 : 0;
}

/*
 * cache=kernel: the kernel's readahead sizes the fills, and INIT can only
 * lower it (to at most 128 KiB), so once INIT is answered the mount's
 * read_ahead_kb is set to kernel_ra_kb in sysfs, as for a block device.
 * That takes root; without it the window stays as INIT left it, and is
 * said so.
 */
static void kernel_readahead(struct daemon *d)
{
	char real[PATH_MAX], type[PATH_MAX], source[PATH_MAX], dev[32];
	char path[96];
	unsigned int kra = options_kernel_ra_kb(&d->opt);
	FILE *f;
	int ok;

	if (d->opt.cache != CACHE_KERNEL || kra <= 128 ||
	    initio_wait(10000) < 0 || !realpath(d->fopts.mountpoint, real) ||
	    !mount_find(real, type, source, sizeof(type), dev))
		return;
	snprintf(path, sizeof(path), "/sys/class/bdi/%s/read_ahead_kb", dev);
	f = fopen(path, "we");
	ok = f && fprintf(f, "%u\n", kra) > 0;
	if (f && fclose(f))
		ok = 0;
	if (!ok)
		fprintf(stderr, "%s: the kernel's readahead stays at 128 KiB: "
				"kernel_ra_kb=%u needs %s writable (root)\n",
			progname, kra, path);
}

/* The kernel tier's eviction: drop [off, off + len) of inode id from the
 * page cache.  ENOENT: the kernel no longer has the inode, nothing to do. */
static void tier_invalidate(uint64_t id, uint64_t off, uint64_t len,
			    void *priv)
{
	struct fuse_session *se = priv;

	fuse_lowlevel_notify_inval_inode(se, id, (off_t)off, (off_t)len);
}

/*
 * Into the background unless -f, as fuse_daemonize() does (fork, setsid,
 * chdir "/"), but the command waits until the daemon serves, or fails to,
 * and exits with that: a mount that fails after the fork (its threads, a
 * refused transport=uring) fails the command, and what the daemon says
 * while it starts reaches the terminal.  That wait includes the kernel's
 * INIT (up to 10 s, initio_wait()).  A stop signal to the waiting command
 * is passed on to the daemon, which then stops.  The end of a pipe to
 * report on with started(), -1 in the foreground, -2 if the fork failed;
 * a daemon that exits without reporting closes it, and the command exits
 * 1.
 */
static int detach(bool foreground)
{
	char status = 1;
	ssize_t n;
	pid_t pid;
	int p[2];

	if (foreground) {
		(void)!chdir("/");
		return -1;
	}
	if (pipe2(p, O_CLOEXEC)) {
		fprintf(stderr, "%s: cannot detach: %s\n", progname,
			strerror(errno));
		return -2;
	}
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "%s: cannot detach: %s\n", progname,
			strerror(errno));
		close(p[0]);
		close(p[1]);
		return -2;
	}
	if (pid > 0) {
		close(p[1]);
		while ((n = read(p[0], &status, 1)) < 0 && errno == EINTR)
			if (stop_signal)
				kill(pid, stop_signal);
		_exit(n == 1 ? status : 1);
	}
	close(p[0]);
	setsid();
	(void)!chdir("/");
	return p[1];
}

/* Serving: the standard streams go to /dev/null, the command exits 0. */
static void started(int report)
{
	char status = 0;
	int null;

	if (report < 0)
		return;
	null = open("/dev/null", O_RDWR);
	if (null >= 0) {
		dup2(null, STDIN_FILENO);
		dup2(null, STDOUT_FILENO);
		dup2(null, STDERR_FILENO);
		if (null > STDERR_FILENO)
			close(null);
	}
	(void)!write(report, &status, 1);
	close(report);
}

/* Detach (unless -f), start the threads and serve until unmounted. */
static int serve(struct daemon *d)
{
	struct loop lp = {.se = d->se,
			  .ds = &d->ds,
			  .progname = progname,
			  .backing_uring = d->opt.backing_io == BACKING_URING};
	unsigned int nq = furing_queues(), per_queue = d->opt.threads;
	bool uring = d->opt.transport != TRANSPORT_DEV;
	int ret = 0, report = detach(d->opt.foreground);
	struct watchdog wd;
	sigset_t mask;
	int err;

	if (report == -2) {
		fuse_session_unmount(d->se);
		return -1;
	}
	/* forked before the serving threads start (a store's fetcher may
	 * run: the child takes none of its locks) */
	err = watchdog_start(&wd, d->fopts.mountpoint, d->opt.foreground);
	if (err)
		fprintf(stderr, "%s: no watchdog (%s): if the daemon is killed, "
			"umount -f may be needed\n", progname, strerror(-err));
	/* a stop that comes now is taken once they all run */
	stop_signals_mask(SIG_BLOCK, &mask);
	/* threads only after the fork: the daemon's copy has none of them */
	if (inodes_init(&d->ds) || cache_start(&d->ds.cache) ||
	    (d->opt.cache == CACHE_KERNEL &&
	     ktier_enable(&d->ds.cache, tier_invalidate, d->se)) ||
	    /* it reclaims from both tiers: once both are there */
	    share_start(&d->ds.cache.budget) ||
	    (d->opt.push && d->opt.read_only && d->ds.mf && !d->ds.store &&
	     d->opt.cache == CACHE_KERNEL && push_start(&d->ds)) ||
	    loop_start(&lp, d->opt.threads,
		       d->opt.threads + (uring ? nq * per_queue : 0))) {
		fprintf(stderr, "%s: cannot start threads\n", progname);
		pthread_sigmask(SIG_SETMASK, &mask, NULL);
		share_stop(&d->ds.cache.budget);
		push_free(&d->ds);
		fuse_session_unmount(d->se);
		watchdog_stop(&wd);
		return -1;
	}
	kernel_readahead(d);
	if (uring && uring_start(d, &lp, nq, per_queue)) {
		stop_signal = SIGTERM;
		ret = -1;
	} else {
		started(report);
	}
	pthread_sigmask(SIG_SETMASK, &mask, NULL);
	loop_wait(&lp, ret ? NULL : d->fopts.mountpoint);
	share_stop(&d->ds.cache.budget); /* it reclaims from the tier */
	ktier_disable(&d->ds.cache);
	watchdog_stop(&wd);
	return ret;
}

static void daemon_free(struct daemon *d)
{
	if (d->se)
		fuse_session_destroy(d->se);
	if (d->ds_open)
		dataset_close(&d->ds);
	free(d->fopts.mountpoint);
	fuse_opt_free_args(&d->args);
	if (d->opt.dataset) /* a URL's password with it */
		explicit_bzero(d->opt.dataset, strlen(d->opt.dataset));
	free(d->opt.dataset);
	for (size_t i = 0; i < nr_opts; i++) /* the options that are text */
		if (opt_table[i].type == OPT_NAME ||
		    opt_table[i].type == OPT_TEXT)
			free(*(char **)((char *)&d->opt + opt_table[i].offset));
	free(d->pc.error);
}

int main(int argc, char **argv)
{
	struct daemon d = {.args = FUSE_ARGS_INIT(argc, argv)};
	char err[512] = "";
	int ret = 1;

	if (argc > 0 && argv[0]) {
		const char *s = strrchr(argv[0], '/');

		progname = s ? s + 1 : argv[0];
	}
	switch (parse_args(&d)) {
	case EXIT_OK:
		ret = 0;
		/* fall through */
	case EXIT_FAIL:
		goto out;
	}
	/* what ps shows of the command line: the options have their copies */
	for (int i = 1; i < argc; i++)
		url_hide_passwords(argv[i]);
	if (check_args(&d))
		goto out;
	zlog_init(d.opt.foreground ? ZLOG_STDERR : ZLOG_SYSLOG);
	raise_fd_limit();
	backing_faults_from_env();
	/*
	 * Folio buffers come and go: from 16 KiB up they are mapped and given
	 * back whole when freed, so the cache's churn leaves no fragmented
	 * heap behind (a manifest's frames are about 25 KiB each).
	 */
	mallopt(M_MMAP_THRESHOLD, 16 << 10);
	mallopt(M_TRIM_THRESHOLD, 1 << 20);
	d.ds_open = true;
	if (dataset_open(&d.ds, &d.opt, err, sizeof(err))) {
		fprintf(stderr, "%s: %s\n", progname, err);
		goto out;
	}
	if (d.ds.ctl_hides)
		fprintf(stderr,
			"%s: %s has a %s of its own at its root, which the "
			"control directory hides (-o ctl=NAME names the "
			"control directory otherwise)\n",
			progname,
			d.ds.store ? store_name(d.ds.store) : d.opt.dataset,
			d.opt.ctl);
	if (!mount_session(&d) && !serve(&d))
		ret = 0;
out:
	daemon_free(&d);
	return ret;
}
