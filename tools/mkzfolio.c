// SPDX-License-Identifier: MIT
/*
 * mkzfolio SRC DST: pack a directory tree into a zfolio dataset.
 *
 * main() runs the steps in order: parse the options, check the source and
 * the destination, set up the packer and its pool, pack (packed.c or
 * tree.c), give DST the source's attributes, tear down, print the
 * summary.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mkzfolio.h"
#include "../remote/remote.h"

const char *progname = "mkzfolio";

/* What the command line asks for besides the packer's settings. */
struct cli {
	const char *src, *dst;
	bool force, quiet, small_set;
	struct store_options store; /* DST in a store */
};

static void usage(FILE *out)
{
	fprintf(out,
		"usage: %s [options] SRC DST\n\n"
		"Pack the directory tree SRC into the zfolio dataset DST.  By "
		"default (the packed\nlayout) DST holds a manifest of the "
		"tree (manifest.zst) and the file data in\ndata/NNNNNNNN.zst: "
		"each big file in one of its own, small files packed\n"
		"together.  Every name, link, hard link, mode, time, "
		"extended attribute and\n(as root) owner is kept.  Every .zst "
		"is a plain zstd stream: zstd -d gives\nback a big file, or "
		"the small files of a pack one after another (the\nmanifest "
		"says where).\n\n"
		"  -l, --level N      zstd level (default 3)\n"
		"      --frame SIZE   content per frame of a big file, 4K..16M "
		"(default 32K)\n"
		"      --small SIZE   packed layout: files up to SIZE are "
		"packed together, in\n"
		"                     frames of SIZE or --frame, the bigger "
		"(default 128K, or\n"
		"                     the frame size if bigger; 0: none)\n"
		"      --layout L     packed (default), or tree: each file f "
		"as DST/f.zst\n"
		"  -j, --threads N    compression threads (default: the "
		"cores)\n"
		"      --force        write into a DST that is not empty\n"
		"  -q, --quiet        no progress bar or summary\n"
		"  -V, --version      print the version and exit\n"
		"  -h, --help         this help\n"
		"\nDST may be a store: s3://BUCKET/PREFIX, or an HTTP server "
		"that takes PUT\n(https://HOST/PATH/).  The dataset is packed "
		"in $TMPDIR (else /var/tmp),\nthen uploaded, data files first "
		"and the manifest last; big objects as S3\nmultipart uploads. "
		"Credentials as zfolio finds them (AWS_ACCESS_KEY_ID and\n"
		"AWS_SECRET_ACCESS_KEY, ~/.aws/credentials).\n"
		"      --endpoint URL the S3 service (default: "
		"AWS_ENDPOINT_URL_S3,\n"
		"                     AWS_ENDPOINT_URL, else AWS)\n"
		"      --region R     the signing region (default: AWS_REGION, "
		"else us-east-1)\n"
		"      --credentials FILE, --profile NAME\n"
		"                     a credentials file as AWS's, and its "
		"section\n"
		"      --ca FILE      the certificate authorities to trust "
		"(https)\n",
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
	{"small", required_argument, NULL, 'S'},
	{"layout", required_argument, NULL, 'L'},
	{"threads", required_argument, NULL, 'j'},
	{"force", no_argument, NULL, 'f'},
	{"endpoint", required_argument, NULL, 'E'},
	{"region", required_argument, NULL, 'R'},
	{"credentials", required_argument, NULL, 'C'},
	{"profile", required_argument, NULL, 'P'},
	{"ca", required_argument, NULL, 'A'},
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
		case 'S':
			if (parse_size(optarg, &pk->small, false))
				die("bad size '%s' for --small", optarg);
			cli->small_set = true;
			break;
		case 'L':
			if (strcmp(optarg, "packed") == 0)
				pk->layout = LAYOUT_PACKED;
			else if (strcmp(optarg, "tree") == 0)
				pk->layout = LAYOUT_TREE;
			else
				die("bad layout '%s' (packed or tree)", optarg);
			break;
		case 'j':
			pk->threads = parse_threads(optarg);
			break;
		case 'f':
			cli->force = true;
			break;
		case 'E':
			cli->store.endpoint = optarg;
			break;
		case 'R':
			cli->store.region = optarg;
			break;
		case 'C':
			cli->store.credentials = optarg;
			break;
		case 'P':
			cli->store.profile = optarg;
			break;
		case 'A':
			cli->store.ca_file = optarg;
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

/* DST if mkzfolio made it: removed by a failure while it is still empty
 * (a name the tree layout cannot keep is said before anything is written) */
static const char *made_dst;

static void made_dst_remove(void)
{
	if (made_dst)
		rmdir(made_dst);
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
	bool made = mkdir(cli->dst, 0755) == 0;

	if (!made && errno == ENOENT)
		die("%s: cannot make it: its parent directory does not exist "
		    "(mkzfolio makes DST, not its parents)", cli->dst);
	if (!made && errno != EEXIST)
		die("%s: %s", cli->dst, strerror(errno));
	if (!realpath(cli->src, rsrc))
		die("%s: %s", cli->src, strerror(errno));
	if (!realpath(cli->dst, rdst))
		die("%s: %s", cli->dst, strerror(errno));
	if (path_is_within(rdst, rsrc)) {
		if (made) /* leave nothing behind */
			rmdir(cli->dst);
		die("%s is inside %s", cli->dst, cli->src);
	}
	if (!cli->force && !dir_is_empty(rdst))
		die("%s is not empty (use --force to write into it)",
		    cli->dst);
	if (made && !die_hook) { /* a store's temporary one has its own */
		made_dst = cli->dst;
		die_hook = made_dst_remove;
	}
}

/* The temporary directory of a dataset for a store, until it is gone. */
static char *tmp_dir;

static void tmp_remove(void)
{
	char *argv[] = {"rm", "-rf", "--", tmp_dir, NULL};
	pid_t pid;
	int st;

	if (!tmp_dir)
		return;
	pid = fork();
	if (pid == 0) {
		execvp("rm", argv);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &st, 0) < 0 || st)
		fprintf(stderr, "%s: could not remove %s\n", progname,
			tmp_dir);
	free(tmp_dir);
	tmp_dir = NULL;
}

/*
 * DST in a store: checked now (credentials, an existing dataset), packed
 * into a temporary directory (removed at exit, also when a step fails),
 * uploaded at the end.
 */
static void store_prepare(struct cli *cli, const struct packer *pk,
			  const char *url)
{
	const char *tmp = getenv("TMPDIR");

	if (pk->layout != LAYOUT_PACKED)
		die("a store takes the packed layout only");
	cli->store.retries = STORE_RETRIES;
	upload_check(url, &cli->store, cli->force);
	if (asprintf(&tmp_dir, "%s/mkzfolio-XXXXXX",
		     tmp && *tmp ? tmp : "/var/tmp") < 0 ||
	    !mkdtemp(tmp_dir))
		die("a temporary directory: %s", strerror(errno));
	atexit(tmp_remove);
	die_hook = tmp_remove;
	cli->dst = tmp_dir;
}

static int open_dir(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd < 0)
		die("%s: %s", path, strerror(errno));
	return fd;
}

static void pack(struct packer *pk, const struct place *src,
		 const struct place *dst, const struct stat *sst)
{
	clock_gettime(CLOCK_MONOTONIC, &pk->t0);
	tree_count(src->fd, src->path,
		   &(struct count){&pk->total_in, &pk->total_files,
				   pk->layout == LAYOUT_TREE,
				   strlen(src->path)});
	pk->dst_len = strlen(dst->path);
	if (pk->layout == LAYOUT_TREE)
		tree_pack(pk, src, dst);
	else
		packed_pack(pk, src, dst, sst);
	if (pk->njobs)
		run_batch(pk);
	if (pk->layout == LAYOUT_TREE)
		tree_restore_dirs(pk, dst);
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
		"%s: %lu files (%lu stored once for several), %lu dirs, "
		"%lu links, %lu other; %lu of these names hard links to an "
		"earlier one; %.1f MiB in, %.1f MiB out (ratio %.2f), "
		"%.2f s\n",
		progname, pk->files, pk->deduped, pk->dirs, pk->links,
		pk->others, pk->hardlinks, (double)pk->total_in / 1048576.0,
		(double)pk->bytes_out / 1048576.0, ratio, t);
}

int main(int argc, char **argv)
{
	struct packer pk = {.level = 3, .frame = MKZ_FRAME};
	struct cli cli = {0};
	char rsrc[PATH_MAX], rdst[PATH_MAX];
	struct place src, dst;
	struct stat sst;
	char *url = NULL;

	pk.threads = default_threads();
	parse_options(argc, argv, &pk, &cli);
	if (!cli.small_set)
		pk.small = pk.frame > MKZ_SMALL ? pk.frame : MKZ_SMALL;
	if (pk.small > ZSEEK_MAX_FRAME)
		die("bad --small %llu (0..16M): a small file is packed whole "
		    "in one frame", (unsigned long long)pk.small);
	/* a small file is whole in one frame of its pack */
	pk.pack_frame = pk.small > pk.frame ? (size_t)pk.small : pk.frame;
	if (store_is_url(cli.dst)) {
		if (!(url = strdup(cli.dst)))
			die("out of memory");
		/* what ps shows of the command line; messages name the
		 * store with its password hidden too */
		url_hide_passwords((char *)cli.dst);
		store_prepare(&cli, &pk, url);
	}
	check_paths(&cli, &sst, rsrc, rdst);
	/* messages name paths as given; the tree layout's last step too */
	src = (struct place){open_dir(rsrc), cli.src};
	dst = (struct place){open_dir(rdst), cli.dst};
	if (pk.layout == LAYOUT_TREE)
		note_xattrs(cli.src);
	packer_setup(&pk, cli.quiet);
	pool_start(&pk);
	pack(&pk, &src, &dst, &sst);
	restore_top(&pk, &dst, &sst);
	pool_stop(&pk);
	print_summary(&pk, cli.quiet);
	packer_free(&pk);
	close(src.fd);
	close(dst.fd);
	say_xattrs();
	/* the dataset is whole either way; these files are not all there */
	if (files_changed())
		warn("%u file%s changed while being read: pack again for a "
		     "consistent copy", files_changed(),
		     files_changed() == 1 ? "" : "s");
	if (files_unreadable())
		warn("%u entr%s could not be read: left out, or packed "
		     "empty (directories), each named above",
		     files_unreadable(), files_unreadable() == 1 ? "y" : "ies");
	if (url)
		upload_dataset(tmp_dir, url, &cli.store, cli.quiet);
	free(url);
	return files_changed() || files_unreadable() ? 1 : 0;
}
