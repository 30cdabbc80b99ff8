// SPDX-License-Identifier: MIT
/*
 * Mount options, declared once in opt_table[]: the parser, the defaults,
 * zfolio -h, the man page and the README's table all read it (the last
 * two through doc/gendoc.c, checked by a test).  Options go through
 * fuse_opt_parse(), so "-o budget=2G" works from the command line, from
 * /etc/fstab (type fuse.zfolio) and from mount -t fuse.zfolio alike; the
 * options zfolio does not know pass through to libfuse and the kernel.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

static const char *const cache_modes[] = {"engine", "kernel", NULL};
static const char *const reclaim_modes[] = {"batch", "per_folio", NULL};
static const char *const group_modes[] = {"none", "uid", "cgroup", NULL};
static const char *const readaround_modes[] = {"adaptive", "fixed", "off",
					       NULL};
static const char *const backing_modes[] = {"drop", "keep", "direct", NULL};
static const char *const io_modes[] = {"uring", "pread", NULL};
static const char *const transports[] = {"auto", "uring", "dev", NULL};
static const char *const bool_values[] = {"0", "1", NULL};

#define OFF(f) offsetof(struct options, f)
const struct opt_desc opt_table[] = {
	{"budget", OPT_SIZE, OFF(budget), "256M",
	 "memory for cached file data (K, M, G suffixes); never exceeded",
	 NULL, 1 << 20, 1ull << 42},
	{"high", OPT_SIZE_MAX, OFF(high), "max",
	 "above it, a background reclaimer brings usage down", NULL, 0,
	 1ull << 42},
	{"threads", OPT_UINT, OFF(threads), "0",
	 "worker threads on /dev/fuse, and as many on each io_uring queue "
	 "(0: twice the cores)", NULL, 0, 256},
	{"decode_threads", OPT_UINT, OFF(decode_threads), "auto",
	 "threads that decode a readahead window's frames beside the worker "
	 "that read it (auto: one per core; 0: the worker decodes alone)",
	 NULL, 0, 256},
	{"max_open", OPT_UINT, OFF(max_open), "0",
	 "backing files kept open at once, least recently used closed first "
	 "(0: half the open-file limit)", NULL, 0, 1u << 24},
	{"cache", OPT_ENUM, OFF(cache), "kernel",
	 "engine: zfolio's cache is the only cache of file data (direct_io); "
	 "kernel: the kernel page cache sits in front and serves hits without "
	 "a round trip, and zfolio counts what it hands over in the budget "
	 "and drops it from the page cache to stay under it (O_DIRECT reads "
	 "bypass the page cache and are served from zfolio's)",
	 cache_modes, 0, 0},
	{"ra_kb", OPT_UINT, OFF(ra_kb), "auto",
	 "largest readahead window in KiB, a multiple of 4 (btrfs uses "
	 "4096); auto is 128, and for a dataset in a store, where a window "
	 "is one request and zfolio reads ahead of the kernel's fills too, "
	 "a 16th of the budget between 512 and 32768 (16384 at the default "
	 "budget)",
	 NULL, 0, 64 << 10},
	{"ra_reclaim", OPT_ENUM, OFF(ra_reclaim), "batch",
	 "at the limit: reclaim once per readahead window, with some "
	 "headroom (batch), or once per folio like the unpatched kernel "
	 "(per_folio)",
	 reclaim_modes, 0, 0},
	{"readaround", OPT_ENUM, OFF(readaround), "adaptive",
	 "mmap faults: read around sized by whether its pages get used "
	 "(adaptive), always ra_kb as the kernel does (fixed), or just the "
	 "faulting folio (off)",
	 readaround_modes, 0, 0},
	{"kernel_ra_kb", OPT_UINT, OFF(kernel_ra_kb), "auto",
	 "the kernel's own readahead and read-around, in KiB, a multiple of "
	 "4; auto is 4 "
	 "(one page) with cache=engine, so that zfolio reads around into its "
	 "cache, and 128 with cache=kernel, where it sizes the fills (4096, "
	 "btrfs's, streams faster and wastes more on random runs; 1024 for "
	 "a dataset in a store; above 128 it takes root)",
	 NULL, 0, 64 << 10},
	{"backing_cache", OPT_ENUM, OFF(backing_cache), "direct",
	 "direct: read the frames of backing files with O_DIRECT where their "
	 "filesystem allows it (no page-cache insert and drop, one copy "
	 "less), else as drop; drop: read them uncached (RWF_DONTCACHE, no "
	 "kernel readahead), so they take no memory outside the budget; "
	 "keep: let the kernel cache them",
	 backing_modes, 0, 0},
	{"ccache_pct", OPT_UINT, OFF(ccache_pct), "auto",
	 "the share of the budget, in percent (0 to 90), that may keep frames "
	 "compressed once they were read from backing twice (the compressed "
	 "cache: a random reader of more than the budget holds then decodes "
	 "them again instead of reading them again); auto is 50 for a "
	 "dataset in a store, where every read is a request, and 0 (off) on "
	 "local disk",
	 NULL, 0, 90},
	{"backing_io", OPT_ENUM, OFF(backing_io), "uring",
	 "backing reads: one io_uring submission per window (uring), or "
	 "plain pread (for valgrind)",
	 io_modes, 0, 0},
	{"transport", OPT_ENUM, OFF(transport), "auto",
	 "how FUSE requests reach zfolio: over io_uring where the kernel "
	 "offers it, else /dev/fuse (auto); io_uring or fail (uring); "
	 "/dev/fuse only (dev)",
	 transports, 0, 0},
	{"uring_poll_us", OPT_UINT, OFF(uring_poll_us), "10",
	 "over io_uring, how long a worker that has just replied looks for "
	 "the next request before it sleeps, in microseconds (0: sleep at "
	 "once)",
	 NULL, 0, 10000},
	{"lockless", OPT_BOOL, OFF(lockless), "1",
	 "read hot folios without taking references (0: always take one)",
	 bool_values, 0, 1},
	{"push", OPT_BOOL, OFF(push), "1",
	 "ro mounts of a packed dataset, not in a store: when small files "
	 "are read in the order they were packed (tar, cp -r, grep -r), "
	 "hand the files after the one read, in its frame and the next, to "
	 "the kernel page cache, sparing their reads a round trip each "
	 "(charged to the budget as the kernel tier's)",
	 bool_values, 0, 1},
	{"group_by", OPT_ENUM, OFF(group_by), "none",
	 "child budget groups per reader: none, per uid, or per cgroup of "
	 "the reading process",
	 group_modes, 0, 0},
	{"group_max", OPT_SIZE_MAX, OFF(group_max), "max",
	 "memory.max of new child groups", NULL, 0, 1ull << 42},
	{"group_high", OPT_SIZE_MAX, OFF(group_high), "max",
	 "memory.high of new child groups", NULL, 0, 1ull << 42},
	{"share", OPT_TEXT, OFF(share), "none",
	 "mounts of one user given the same NAME (letters, digits, '.', '_', "
	 "'-') hold at most share_max between them: each reclaims its part "
	 "of what they hold above it, by its size, so an idle mount's cache "
	 "gives way to a busy one's (none: a budget of its own only)",
	 NULL, 0, 0},
	{"share_max", OPT_SIZE, OFF(share_max), "0",
	 "the limit of share= (0: budget); every mount of the share gives the "
	 "same", NULL, 0, 1ull << 42},
	{"ctl", OPT_NAME, OFF(ctl), ".zfolio",
	 "name of the control directory at the mount root (an entry of the "
	 "dataset's root by that name is hidden by it, and the mount says "
	 "so)", NULL, 0, 0},
	{"dict", OPT_TEXT, OFF(dict), "auto",
	 "zstd dictionaries (files written by zstd --train, ':' between "
	 "them) for .zst files written with zstd -D: a frame decodes with "
	 "the one whose ID it names, a frame that names none with none "
	 "(auto: none; a file written with --no-dictID is not served)",
	 NULL, 0, 0},
	{"max_window", OPT_SIZE, OFF(max_window), "128M",
	 "the largest window a frame may need to be served: zstd --long=N "
	 "writes up to 2^N bytes (2G for --long=31) on a file that big, "
	 "and zstd -d decodes 128M unless given --long or --memory; a "
	 "frame that needs more reads as EIO, said in the log.  A big "
	 "frame's window is charged to the budget while it is read, and "
	 "must fit in it",
	 NULL, 1 << 20, 1ull << 31},
	{"endpoint", OPT_TEXT, OFF(endpoint), "auto",
	 "s3:// datasets: the S3 service's URL, path-style (auto: "
	 "AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, else AWS itself)",
	 NULL, 0, 0},
	{"region", OPT_TEXT, OFF(region), "auto",
	 "s3:// datasets: the region requests are signed for (auto: "
	 "AWS_REGION, AWS_DEFAULT_REGION, ~/.aws/config, else us-east-1)",
	 NULL, 0, 0},
	{"credentials", OPT_TEXT, OFF(credentials), "auto",
	 "s3:// datasets: a credentials file as AWS's (auto: "
	 "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, else "
	 "~/.aws/credentials, else unsigned requests)",
	 NULL, 0, 0},
	{"profile", OPT_TEXT, OFF(profile), "auto",
	 "s3:// datasets: the credentials file's section (auto: AWS_PROFILE, "
	 "else default)",
	 NULL, 0, 0},
	{"ca", OPT_TEXT, OFF(ca), "auto",
	 "https:// and s3:// datasets: a file of the certificate authorities "
	 "to trust (a private store's; auto: the system's)",
	 NULL, 0, 0},
	{"retries", OPT_UINT, OFF(retries), "5",
	 "datasets in a store: how many times a request that failed on the "
	 "way (5xx, reset, timeout) is sent again, with backoff, before the "
	 "read is EIO",
	 NULL, 0, 100},
	{"timeout", OPT_UINT, OFF(timeout), "15",
	 "datasets in a store: seconds without progress after which a "
	 "request is given up (and retried)",
	 NULL, 1, 3600},
};
const size_t nr_opts = sizeof(opt_table) / sizeof(opt_table[0]);

/* What a value looks like: "SIZE", "N", "engine|kernel". */
void opt_value_hint(const struct opt_desc *d, char *out, size_t len)
{
	struct text t = {out, len, 0};

	switch (d->type) {
	case OPT_SIZE:
	case OPT_SIZE_MAX:
		text_printf(&t, "SIZE");
		return;
	case OPT_UINT:
		text_printf(&t, "N");
		return;
	case OPT_NAME:
		text_printf(&t, "NAME");
		return;
	case OPT_TEXT:
		text_printf(&t, "TEXT");
		return;
	case OPT_BOOL:
	case OPT_ENUM:
		for (int i = 0; d->choices[i]; i++)
			text_printf(&t, "%s%s", i ? "|" : "", d->choices[i]);
		return;
	}
}

/* A size as it would be written: "4T", "1M", "0". */
static void short_size(char *out, size_t len, uint64_t v)
{
	static const char units[] = "KMGT";
	int u = -1;

	while (v && v % 1024 == 0 && u < 3) {
		v /= 1024;
		u++;
	}
	if (u < 0)
		snprintf(out, len, "%llu", (unsigned long long)v);
	else
		snprintf(out, len, "%llu%c", (unsigned long long)v, units[u]);
}

/* What values it takes, for an error: "a size from 1M to 4T". */
void opt_value_range(const struct opt_desc *d, char *out, size_t len)
{
	struct text t = {out, len, 0};
	char lo[32], hi[32];

	switch (d->type) {
	case OPT_SIZE:
	case OPT_SIZE_MAX:
		short_size(lo, sizeof(lo), d->min);
		short_size(hi, sizeof(hi), d->max);
		text_printf(&t, "a size from %s to %s%s", lo, hi,
			    d->type == OPT_SIZE_MAX ? ", or max" : "");
		return;
	case OPT_UINT:
		text_printf(&t, "a number from %llu to %llu%s",
			    (unsigned long long)d->min,
			    (unsigned long long)d->max,
			    strcmp(d->def, "auto") ? "" : ", or auto");
		return;
	case OPT_NAME:
		text_printf(&t, "a file name: not empty, no '/', not . or ..");
		return;
	default: /* text, choices: as the help shows them */
		text_printf(&t, "%s", d->choices ? "one of " : "");
		opt_value_hint(d, out + t.off, len - t.off);
		return;
	}
}

static int apply_size(const struct opt_desc *d, uint64_t *p, const char *val)
{
	uint64_t v;

	if (parse_size(val, &v, d->type == OPT_SIZE_MAX))
		return -EINVAL;
	if (v != UINT64_MAX && (v < d->min || v > d->max))
		return -ERANGE;
	*p = v;
	return 0;
}

static int apply_uint(const struct opt_desc *d, unsigned int *p,
		      const char *val)
{
	unsigned long long v;
	char *end;

	if (strcmp(val, "auto") == 0 && strcmp(d->def, "auto") == 0) {
		*p = OPT_UINT_AUTO;
		return 0;
	}
	errno = 0;
	v = strtoull(val, &end, 10);
	if (errno || end == val || *end || v < d->min || v > d->max)
		return -EINVAL;
	*p = (unsigned int)v;
	return 0;
}

static int apply_choice(const struct opt_desc *d, void *p, const char *val)
{
	for (int i = 0; d->choices[i]; i++) {
		if (strcmp(val, d->choices[i]))
			continue;
		if (d->type == OPT_BOOL)
			*(bool *)p = i;
		else
			*(int *)p = i;
		return 0;
	}
	return -EINVAL;
}

static int apply_name(char **p, const char *val)
{
	if (!*val || strchr(val, '/') || strlen(val) > 255 ||
	    strcmp(val, ".") == 0 || strcmp(val, "..") == 0)
		return -EINVAL;
	free(*p);
	*p = strdup(val);
	return *p ? 0 : -ENOMEM;
}

/* Text: its default's word ("auto", "none") is NULL. */
static int apply_text(const struct opt_desc *d, char **p, const char *val)
{
	free(*p);
	*p = NULL;
	if (!*val || strcmp(val, d->def) == 0)
		return 0;
	*p = strdup(val);
	return *p ? 0 : -ENOMEM;
}

/* Set one option from its text; 0 or a negative errno. */
int opt_apply(struct options *o, const struct opt_desc *d, const char *val)
{
	void *p = (char *)o + d->offset;

	switch (d->type) {
	case OPT_SIZE:
	case OPT_SIZE_MAX:
		return apply_size(d, p, val);
	case OPT_UINT:
		return apply_uint(d, p, val);
	case OPT_BOOL:
	case OPT_ENUM:
		return apply_choice(d, p, val);
	case OPT_NAME:
		return apply_name(p, val);
	case OPT_TEXT:
		return apply_text(d, p, val);
	}
	return -EINVAL;
}

/* ccache_pct, auto resolved: 50 for a dataset in a store, else 0. */
unsigned int options_ccache_pct(const struct options *o)
{
	if (o->ccache_pct != OPT_UINT_AUTO)
		return o->ccache_pct;
	return o->dataset && store_is_url(o->dataset) ? 50 : 0;
}

/* kernel_ra_kb, auto resolved: KiB of the kernel's readahead window. */
unsigned int options_kernel_ra_kb(const struct options *o)
{
	if (o->kernel_ra_kb != OPT_UINT_AUTO)
		return o->kernel_ra_kb;
	if (o->cache == CACHE_ENGINE)
		return 4;
	return o->dataset && store_is_url(o->dataset) ? 1024 : 128;
}

/*
 * ra_kb, auto resolved: KiB of zfolio's largest readahead window.  In a
 * store a window is one request: the bigger, the fewer requests a stream
 * makes (a 4 MiB window makes ~270 per GB, 16 MiB ~90), but a window is
 * memory until read: a 16th of the budget leaves room for many readers.
 */
#define STORE_RA_MIN_KB 512
#define STORE_RA_MAX_KB (32 << 10)
unsigned int options_ra_kb(const struct options *o)
{
	uint64_t kb = o->budget / 16 / 1024 / 128 * 128; /* whole frames */

	if (o->ra_kb != OPT_UINT_AUTO)
		return o->ra_kb;
	if (!o->dataset || !store_is_url(o->dataset))
		return 128;
	return kb < STORE_RA_MIN_KB ? STORE_RA_MIN_KB
	       : kb > STORE_RA_MAX_KB ? STORE_RA_MAX_KB
				      : (unsigned int)kb;
}

void options_defaults(struct options *o)
{
	memset(o, 0, sizeof(*o));
	for (size_t i = 0; i < nr_opts; i++)
		opt_apply(o, &opt_table[i], opt_table[i].def);
}

/* Print text wrapped at 79 columns, continuation lines at indent. */
static void print_wrapped(FILE *out, const char *text, int col, int indent)
{
	const char *p = text;

	while (*p) {
		const char *w = p + strcspn(p, " ");
		int n = (int)(w - p);

		if (col + n + 1 > 79 && col > indent) {
			fprintf(out, "\n%*s", indent, "");
			col = indent;
		} else if (p != text) {
			fputc(' ', out);
			col++;
		}
		fprintf(out, "%.*s", n, p);
		col += n;
		p = *w ? w + 1 : w;
	}
	fputc('\n', out);
}

void options_usage(FILE *out, const char *progname)
{
	fprintf(out,
		"usage: %s DATASET MOUNTPOINT [-o OPTION[,OPTION...]] [-f] "
		"[-d]\n\n"
		"Mount a zstd-compressed dataset read-only and serve it from "
		"zfolio's own\npage cache under a memory budget.  DATASET is "
		"a directory made by mkzfolio,\nany tree of .zst and plain "
		"files, or one .zst file; or a dataset mkzfolio packed\nin a "
		"store: s3://BUCKET/PREFIX or https://HOST/PATH/.\n\n"
		"zfolio options (-o name=value):\n",
		progname);
	for (size_t i = 0; i < nr_opts; i++) {
		const struct opt_desc *d = &opt_table[i];
		char hint[64], left[96], help[512];

		opt_value_hint(d, hint, sizeof(hint));
		snprintf(left, sizeof(left), "  %s=%s", d->name, hint);
		snprintf(help, sizeof(help), "%s (default: %s)", d->help,
			 d->def);
		fprintf(out, "%s\n      ", left);
		print_wrapped(out, help, 6, 6);
	}
	fprintf(out,
		"\nFUSE and mount options pass through, among them:\n"
		"  -f                 stay in the foreground\n"
		"  -d                 debug: print every request (implies -f)\n"
		"  -o allow_other     let other users read the mount\n"
		"  -o nonempty        mount over a directory that is not "
		"empty (hiding it)\n"
		"  -o nosuid,nodev    set by default\n"
		"  -V, --version      print the version and exit\n\n"
		"Unmount with: fusermount3 -u MOUNTPOINT\n"
		"fstab: DATASET MOUNTPOINT fuse.zfolio budget=512M 0 0\n");
}

/* libfuse's complaint about options it does not know either */
#define FUSE_UNKNOWN "fuse: unknown option(s): "

/*
 * The FUSE session, as fuse_session_new() makes it, but with what it says
 * of an option that neither zfolio nor libfuse knows said as zfolio's and
 * pointing to --help: libfuse's own line names no program.  Its other
 * lines pass as they are.
 */
struct fuse_session *options_session_new(struct fuse_args *args,
					 const struct fuse_lowlevel_ops *ops,
					 size_t size, void *user,
					 const char *progname)
{
	int saved = dup(STDERR_FILENO), mfd = memfd_create("fuse-stderr", 0);
	struct fuse_session *se;
	char text[4096], *line, *next;
	ssize_t n;

	if (saved < 0 || mfd < 0 || dup2(mfd, STDERR_FILENO) < 0) {
		if (saved >= 0)
			close(saved);
		if (mfd >= 0)
			close(mfd);
		return fuse_session_new(args, ops, size, user);
	}
	se = fuse_session_new(args, ops, size, user);
	fflush(stderr);
	dup2(saved, STDERR_FILENO);
	close(saved);
	n = pread(mfd, text, sizeof(text) - 1, 0);
	close(mfd);
	text[n > 0 ? n : 0] = '\0';
	for (line = text; *line; line = next) {
		next = strchrnul(line, '\n');
		if (*next)
			*next++ = '\0';
		if (!strncmp(line, FUSE_UNKNOWN, strlen(FUSE_UNKNOWN)))
			fprintf(stderr,
				"%s: unknown option %s (%s --help lists "
				"them)\n",
				progname, line + strlen(FUSE_UNKNOWN),
				progname);
		else
			fprintf(stderr, "%s\n", line);
	}
	return se;
}
