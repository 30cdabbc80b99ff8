// SPDX-License-Identifier: MIT
/*
 * zfolioctl: a friendly front for a mount's control directory, and a look
 * inside .zst files.
 *
 *   zfolioctl stat MNT [--json] [--group G] [--interval S]
 *   zfolioctl set MNT KEY VALUE [--group G]     KEY: max, high
 *   zfolioctl reclaim MNT SIZE [--group G]
 *   zfolioctl groups MNT [--group G]
 *   zfolioctl inspect FILE.zst [--json]
 *
 * The mount commands only read and write the files under MNT/.zfolio (or
 * --ctl NAME), so everything they do can be done with cat and echo too,
 * but for writes on a mount made ro: there set and reclaim write by an
 * ioctl on the control directory (ZF_IOC_CTL_WRITE), which the kernel lets
 * through where it refuses write opens.  First they make sure, from
 * /proc/self/mountinfo, that MNT is a zfolio mount: a wrong path gets that
 * answer, not a missing memory.stat.  When a write fails they say why in
 * the mount's terms (not the owner, a bad value).
 *
 * inspect needs no mount: it indexes the file with the format library, as
 * the daemon does when it opens it, and prints what the index holds.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../common/common.h"
#include "../format/format.h"

/* Longest interval stat --interval waits for */
#define MAX_INTERVAL_S 86400.0

static const char *progname = "zfolioctl";

static struct {
	const char *ctl, *group;
	bool json;
	double interval;
} opt = {.ctl = ".zfolio", .group = ""};

static void die(const char *fmt, ...)
	__attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", progname);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	/* what the command held dies with it: no leak checks, no cleanup */
	fflush(stdout);
	_exit(1);
}

struct mount_info {
	bool zfolio; /* its type is fuse.zfolio */
	bool ro;     /* read-only, per mount or per superblock */
};

/* The mount the command works on, from require_mount(). */
static struct mount_info mnt_info;

/* MNT/CTL[/GROUP][/FILE] */
static char *ctl_path_in(const char *mnt, const char *group, const char *file)
{
	char *p;

	if (asprintf(&p, "%s/%s%s%s%s%s", mnt, opt.ctl, *group ? "/" : "",
		     group, file ? "/" : "", file ? file : "") < 0)
		die("out of memory");
	return p;
}

static char *ctl_path(const char *mnt, const char *file)
{
	return ctl_path_in(mnt, opt.group, file);
}

/* The whole of a control file, NUL-terminated. */
static char *slurp_in(const char *mnt, const char *group, const char *file)
{
	char *path = ctl_path_in(mnt, group, file), *buf = NULL;
	FILE *f = fopen(path, "re");
	size_t len = 0, cap = 0, n;

	if (!f)
		die("%s: %s", path, strerror(errno));
	do {
		if (cap - len < 4096) {
			cap = cap ? cap * 2 : 16384;
			buf = realloc(buf, cap);
			if (!buf)
				die("out of memory");
		}
		n = fread(buf + len, 1, cap - len - 1, f);
		len += n;
	} while (n);
	if (ferror(f))
		die("%s: %s", path, strerror(errno));
	fclose(f);
	buf[len] = '\0';
	free(path);
	return buf;
}

static char *slurp(const char *mnt, const char *file)
{
	return slurp_in(mnt, opt.group, file);
}

/* A control file that holds bytes or "max", as MiB for people. */
static void read_size_in(const char *mnt, const char *group, const char *file,
			 char *out, size_t len)
{
	char *s = slurp_in(mnt, group, file);

	if (strncmp(s, "max", 3) == 0)
		snprintf(out, len, "max");
	else
		snprintf(out, len, "%.1f MiB", strtod(s, NULL) / 1048576.0);
	free(s);
}

/*
 * Writing a control file fails for reasons of the mount, not of the file:
 * say which in its terms.
 */
static void explain_write_error(const char *mnt, const char *path,
				const char *value, int err)
{
	switch (err) {
	case EROFS:
		if (!mnt_info.ro)
			break;
		die("%s is mounted read-only (ro), and its zfolio is older than "
		    "the ioctl that writes control files there: mount it "
		    "without ro, or with this zfolio, to change limits",
		    mnt);
	case EACCES:
	case EPERM:
		die("%s: %s: only the mount's owner and root may write its "
		    "control files",
		    path, strerror(err));
	case EINVAL:
		die("%s: %s: '%s' (a size such as 64M%s)", path, strerror(err),
		    value, strstr(path, "reclaim") ? "" : ", or max");
	case EAGAIN:
		die("%s: could not reclaim %s: the group holds less, or the "
		    "rest is in use",
		    path, value);
	case EBUSY:
		die("%s: too much is in use to get under %s; the limit is "
		    "unchanged",
		    path, value);
	}
	die("%s: %s", path, strerror(err));
}

/*
 * The value into a control file by ZF_IOC_CTL_WRITE on its directory, which
 * works on a mount made read-only as on any other: 0 or the errno, ENOTTY
 * from a daemon that does not take the ioctl.
 */
static int put_ioctl(const char *mnt, const char *file, const char *value)
{
	struct zf_ctl_write w;
	struct stat in, root;
	char *dir = ctl_path(mnt, NULL);
	int fd, err = 0;

	if (strlen(file) >= sizeof(w.name) || strlen(value) >= sizeof(w.value))
		return EINVAL;
	memset(&w, 0, sizeof(w));
	strcpy(w.name, file);
	strcpy(w.value, value);
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	/* the ioctl goes to the mount's directory only (--group ../..) */
	if (fd >= 0 && (fstat(fd, &in) || stat(mnt, &root) ||
			in.st_dev != root.st_dev))
		err = ENOTTY;
	else if (fd < 0 || ioctl(fd, ZF_IOC_CTL_WRITE, &w))
		err = errno;
	if (fd >= 0)
		close(fd);
	free(dir);
	return err;
}

/* One write(2), as cgroup files want: the value is parsed whole. */
static int put_write(const char *path, const char *value)
{
	size_t len = strlen(value);
	int fd, err = 0;
	ssize_t n;

	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return errno;
	n = write(fd, value, len);
	if (n < 0)
		err = errno;
	else if ((size_t)n != len)
		err = EIO;
	if (close(fd) && !err)
		err = errno;
	return err;
}

static void put(const char *mnt, const char *file, const char *value)
{
	char *path = ctl_path(mnt, file);
	int err;

	if (!*value)
		die("%s: an empty value", path);
	err = put_ioctl(mnt, file, value);
	if (err == ENOTTY)
		err = put_write(path, value);
	if (err)
		explain_write_error(mnt, path, value, err);
	free(path);
}

/* mountinfo writes space, tab, newline and backslash as \ooo. */
static void unescape_octal(char *s)
{
	char *out = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' &&
		    s[2] <= '7' && s[3] >= '0' && s[3] <= '7') {
			*out++ = (char)((s[1] - '0') << 6 | (s[2] - '0') << 3 |
					(s[3] - '0'));
			s += 3;
		} else {
			*out++ = *s;
		}
	}
	*out = '\0';
}

/* Is name one of the comma-separated options in list? */
static bool has_option(const char *list, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = list; p; p = strchr(p, ',')) {
		if (*p == ',')
			p++;
		if (strncmp(p, name, n) == 0 && (p[n] == ',' || !p[n]))
			return true;
	}
	return false;
}

/*
 * One line of mountinfo, "36 35 0:39 / /mnt rw,nosuid shared:1 - fuse.zfolio
 * /data rw,user_id=0": the mount point is field 5, the mount's options
 * field 6; after the optional fields and "-", the type, the source and the
 * superblock's options.  False if the line is not for path.
 */
static bool mountinfo_match(char *line, const char *path, struct mount_info *mi)
{
	char *f[6], *save = NULL, *tok, *type, *super = NULL;

	for (int i = 0; i < 6; i++) {
		f[i] = strtok_r(i ? NULL : line, " \n", &save);
		if (!f[i])
			return false;
	}
	unescape_octal(f[4]);
	if (strcmp(f[4], path))
		return false;
	while ((tok = strtok_r(NULL, " \n", &save)) && strcmp(tok, "-"))
		;
	type = tok ? strtok_r(NULL, " \n", &save) : NULL;
	if (type && strtok_r(NULL, " \n", &save))
		super = strtok_r(NULL, " \n", &save);
	mi->zfolio = type && strcmp(type, "fuse.zfolio") == 0;
	mi->ro = has_option(f[5], "ro") || (super && has_option(super, "ro"));
	return true;
}

/* The mount on path; of several, the last: it is the one on top. */
static int find_mount(const char *path, struct mount_info *mi)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char *line = NULL;
	size_t cap = 0;
	bool found = false;

	if (!f)
		return -errno;
	while (getline(&line, &cap, f) > 0) {
		struct mount_info m;

		if (mountinfo_match(line, path, &m)) {
			*mi = m;
			found = true;
		}
	}
	free(line);
	fclose(f);
	return found ? 0 : -ENOENT;
}

/* A zfolio mount whose control directory we cannot reach: why. */
static void explain_no_ctl(const char *mnt, const char *dir, int err)
{
	if (err == ENOENT)
		die("%s is a zfolio mount without a control directory %s "
		    "(made with -o ctl=NAME? then use --ctl NAME)",
		    mnt, opt.ctl);
	if (err == EACCES)
		die("%s: %s (a mount without allow_other is its owner's "
		    "alone)",
		    dir, strerror(err));
	die("%s: %s", dir, strerror(err));
}

/* Exits with the reason unless mnt's control files (and group) are there. */
static void require_mount(const char *mnt)
{
	char real[PATH_MAX], *dir;
	int r;

	if (!realpath(mnt, real))
		die("%s: %s", mnt, strerror(errno));
	r = find_mount(real, &mnt_info);
	if (r && r != -ENOENT)
		die("/proc/self/mountinfo: %s", strerror(-r));
	if (r || !mnt_info.zfolio)
		die("%s is not a zfolio mount", mnt);
	dir = ctl_path_in(mnt, "", NULL);
	if (access(dir, F_OK))
		explain_no_ctl(mnt, dir, errno);
	free(dir);
	dir = ctl_path(mnt, NULL);
	if (*opt.group && access(dir, F_OK))
		die("%s: no group %s (zfolioctl groups %s lists them)", mnt,
		    opt.group, mnt);
	free(dir);
}

struct kv {
	char key[64];
	double val;
};

struct stats {
	struct kv v[NR_STATS + 8];
	int n;
};

/* memory.stat: "key value" lines, in the order of ZF_STAT_LIST. */
static void read_stats(const char *mnt, struct stats *s)
{
	char *text = slurp(mnt, "memory.stat"), *save = NULL;
	int max = (int)(sizeof(s->v) / sizeof(s->v[0]));

	s->n = 0;
	for (char *line = strtok_r(text, "\n", &save); line && s->n < max;
	     line = strtok_r(NULL, "\n", &save)) {
		struct kv *k = &s->v[s->n];

		if (sscanf(line, "%63s %lf", k->key, &k->val) == 2)
			s->n++;
	}
	free(text);
}

static const struct kv *find_kv(const struct stats *s, const char *key)
{
	for (int i = 0; i < s->n; i++)
		if (strcmp(s->v[i].key, key) == 0)
			return &s->v[i];
	return NULL;
}

/* A dataset in a store: where, and what it has cost (the store file). */
static void print_store(const char *mnt)
{
	char *text = slurp_in(mnt, "", "store"), *line, *save = NULL;
	char where[512] = "";
	unsigned long long v[6] = {0};
	static const char *const keys[] = {"requests", "streams", "bytes",
					   "retries",  "failures", "changed"};

	for (line = strtok_r(text, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		if (!strncmp(line, "store ", 6))
			snprintf(where, sizeof(where), "%s", line + 6);
		for (int i = 0; i < 6; i++)
			if (!strncmp(line, keys[i], strlen(keys[i])) &&
			    line[strlen(keys[i])] == ' ')
				v[i] = strtoull(line + strlen(keys[i]) + 1,
						NULL, 10);
	}
	free(text);
	if (!where[0] || !strcmp(where, "none"))
		return;
	printf("  store    %s: %llu requests (%llu streams), %.1f MiB "
	       "received, %llu retried, %llu failed, %llu changed objects\n",
	       where, v[0], v[1], (double)v[2] / 1048576.0, v[3], v[4], v[5]);
}

static void print_limits(const char *mnt)
{
	char cur[32], max[32], high[32], peak[32];

	read_size_in(mnt, opt.group, "memory.current", cur, sizeof(cur));
	read_size_in(mnt, opt.group, "memory.max", max, sizeof(max));
	read_size_in(mnt, opt.group, "memory.high", high, sizeof(high));
	read_size_in(mnt, opt.group, "memory.peak", peak, sizeof(peak));
	printf("zfolio cache at %s, group /%s\n", mnt, opt.group);
	printf("  memory   %s used of %s (high %s, peak %s)\n", cur, max,
	       high, peak);
	print_store(mnt);
	printf("\n");
}

/*
 * Gauges are sizes; events, over an interval, are rates; derived items are
 * computed by the daemon from others (an average, say), so their value is
 * what it is now: a rate of an average means nothing.  A name we do not
 * know is taken for an event.
 */
static void print_stat(const struct kv *now, const struct kv *before)
{
	const struct stat_desc *d = stat_desc_find(now->key);
	enum stat_kind kind = d ? d->kind : STAT_EVENT;

	if (kind == STAT_GAUGE)
		printf("  %-28s %12.1f MiB", now->key, now->val / 1048576.0);
	else if (kind == STAT_EVENT && before)
		printf("  %-28s %12.1f /s  ", now->key,
		       (now->val - before->val) / opt.interval);
	else
		printf("  %-28s %12.0f     ", now->key, now->val);
	printf("  %s\n", d ? d->desc : "");
}

static void sleep_s(double s)
{
	struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static int cmd_stat(char **args)
{
	const char *mnt = args[0];
	struct stats a, b;
	char *s;

	if (opt.json && opt.interval > 0)
		die("--interval gives rates, --json the counters: one or the "
		    "other");
	if (opt.json) {
		s = slurp(mnt, "memory.stat.json");
		fputs(s, stdout);
		free(s);
		return 0;
	}
	read_stats(mnt, &a);
	if (opt.interval > 0) {
		sleep_s(opt.interval);
		read_stats(mnt, &b);
	}
	print_limits(mnt);
	if (opt.interval > 0)
		for (int i = 0; i < b.n; i++)
			print_stat(&b.v[i], find_kv(&a, b.v[i].key));
	else
		for (int i = 0; i < a.n; i++)
			print_stat(&a.v[i], NULL);
	return 0;
}

static int cmd_set(char **args)
{
	const char *key = args[1];
	char file[64];

	if (strncmp(key, "memory.", 7) == 0)
		key += 7;
	if (strcmp(key, "max") && strcmp(key, "high")) {
		fprintf(stderr, "%s: unknown key '%s' (max, high)\n", progname,
			args[1]);
		return 2;
	}
	snprintf(file, sizeof(file), "memory.%s", key);
	put(args[0], file, args[2]);
	return 0;
}

static int cmd_reclaim(char **args)
{
	put(args[0], "memory.reclaim", args[1]);
	return 0;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The child groups of group: the directories in its control directory. */
static char **child_groups(const char *mnt, const char *group, size_t *n)
{
	char *path = ctl_path_in(mnt, group, NULL), **v = NULL;
	DIR *d = opendir(path);
	struct dirent *e;
	size_t cap = 0;

	if (!d)
		die("%s: %s", path, strerror(errno));
	*n = 0;
	while ((e = readdir(d))) {
		if (e->d_type != DT_DIR || e->d_name[0] == '.')
			continue;
		if (*n == cap) {
			cap = cap ? cap * 2 : 16;
			v = realloc(v, cap * sizeof(*v));
			if (!v)
				die("out of memory");
		}
		v[*n] = strdup(e->d_name);
		if (!v[(*n)++])
			die("out of memory");
	}
	closedir(d);
	free(path);
	if (*n)
		qsort(v, *n, sizeof(*v), cmp_name);
	return v;
}

static void print_group(const char *mnt, const char *group, const char *name,
			int depth)
{
	int indent = depth < 12 ? depth * 2 : 24;
	char cur[32], max[32];

	read_size_in(mnt, group, "memory.current", cur, sizeof(cur));
	read_size_in(mnt, group, "memory.max", max, sizeof(max));
	printf("%*s%-*s %12s  ", indent, "", 32 - indent, name, cur);
	if (strcmp(max, "max"))
		printf("(max %s)\n", max);
	else
		printf("(no limit)\n");
}

/* Depth first, each group's children indented below it. */
static size_t print_children(const char *mnt, const char *group, int depth)
{
	size_t n;
	char **names = child_groups(mnt, group, &n);

	for (size_t i = 0; i < n; i++) {
		char *child;

		if (asprintf(&child, "%s%s%s", group, *group ? "/" : "",
			     names[i]) < 0)
			die("out of memory");
		print_group(mnt, child, names[i], depth);
		print_children(mnt, child, depth + 1);
		free(child);
		free(names[i]);
	}
	free(names);
	return n;
}

static int cmd_groups(char **args)
{
	char *top;

	if (asprintf(&top, "/%s", opt.group) < 0)
		die("out of memory");
	print_group(args[0], opt.group, top, 0);
	free(top);
	if (print_children(args[0], opt.group, 1))
		return 0;
	if (*opt.group)
		printf("(no child groups)\n");
	else
		printf("(no child groups: the mount was made with "
		       "group_by=none, or no reader has charged one yet)\n");
	return 0;
}

static const char *kind_name(enum zseek_kind kind)
{
	switch (kind) {
	case ZSEEK_SEEKABLE:
		return "seekable";
	case ZSEEK_WALKED:
		return "walked";
	default:
		return "raw";
	}
}

/* What inspect prints, beyond the index. */
struct inspected {
	const char *file;
	struct zseek_index idx;
	bool has_table;
	uint64_t table_off, table_size; /* the seek table's skippable frame */
	double ratio;			/* content over file size */
};

/*
 * Where the seek table's skippable frame starts.  The index keeps only the
 * frames that hold content, so the table's own count comes from the footer
 * the parser has already checked.
 */
static void find_seek_table(int fd, struct inspected *in)
{
	uint8_t foot[ZSEEK_FOOTER_SIZE];
	uint64_t count, entry = in->idx.has_checksum ? 12 : 8;

	if (zseek_pread_fd(&fd, foot, sizeof(foot),
			   in->idx.file_size - sizeof(foot)) != sizeof(foot))
		die("%s: cannot read the seek table's footer", in->file);
	count = (uint64_t)foot[0] | (uint64_t)foot[1] << 8 |
		(uint64_t)foot[2] << 16 | (uint64_t)foot[3] << 24;
	in->has_table = true;
	in->table_size = 8 + count * entry + ZSEEK_FOOTER_SIZE;
	in->table_off = in->idx.file_size - in->table_size;
}

/* Index the file as the daemon would; exits with the parser's message. */
static void inspect_file(const char *file, struct inspected *in)
{
	char err[256] = "";
	struct stat st;
	int fd = open(file, O_RDONLY | O_CLOEXEC);

	if (fd < 0 || fstat(fd, &st))
		die("%s: %s", file, strerror(errno));
	if (!S_ISREG(st.st_mode))
		die("%s: not a regular file", file);
	memset(in, 0, sizeof(*in));
	in->file = file;
	if (zseek_index_build(zseek_pread_fd, &fd, (uint64_t)st.st_size, true,
			      &in->idx, err, sizeof(err)))
		die("%s: %s", file, *err ? err : "cannot index it");
	if (in->idx.kind == ZSEEK_SEEKABLE)
		find_seek_table(fd, in);
	if (in->idx.file_size)
		in->ratio = (double)in->idx.content_size /
			    (double)in->idx.file_size;
	close(fd);
}

static void print_inspected(const struct inspected *in)
{
	const struct zseek_index *idx = &in->idx;
	char content[32], file[32];

	format_size(content, sizeof(content), idx->content_size);
	format_size(file, sizeof(file), idx->file_size);
	printf("%s: %s%s, %u frames, %s\n", in->file, kind_name(idx->kind),
	       idx->kind == ZSEEK_WALKED ? " (no seek table)" : "",
	       idx->nframes,
	       idx->has_checksum ? "checksums in the seek table"
				 : "no checksums");
	printf("  content      %12llu bytes (%s)\n",
	       (unsigned long long)idx->content_size, content);
	printf("  compressed   %12llu bytes (%s), ratio %.2f\n",
	       (unsigned long long)idx->file_size, file, in->ratio);
	if (in->has_table)
		printf("  seek table   %12llu bytes at %llu\n",
		       (unsigned long long)in->table_size,
		       (unsigned long long)in->table_off);
	if (idx->nunsized)
		printf("  unsized      %12u frames, measured by decoding\n",
		       idx->nunsized);
	if (!idx->nframes)
		return;
	printf("\n  %8s %14s %10s %14s %10s  %s\n", "frame", "c_off", "c_size",
	       "d_off", "d_size", "checksum");
	for (uint32_t i = 0; i < idx->nframes; i++) {
		const struct zseek_frame frame_v = zseek_frame_at(idx, i);
		const struct zseek_frame *fr = &frame_v;

		printf("  %8u %14llu %10llu %14llu %10llu  ", i,
		       (unsigned long long)fr->c_off,
		       (unsigned long long)fr->c_size,
		       (unsigned long long)fr->d_off,
		       (unsigned long long)fr->d_size);
		if (idx->has_checksum)
			printf("%08x\n", fr->checksum);
		else
			printf("-\n");
	}
}

/* Out with what t holds, then empty it; a cut would be a bug of ours. */
static void text_flush(struct text *t)
{
	if (t->len && t->off >= t->len - 1)
		die("internal error: the JSON text did not fit");
	fputs(t->buf, stdout);
	t->off = 0;
	t->buf[0] = '\0';
}

static void json_head(struct text *t, const struct inspected *in)
{
	const struct zseek_index *idx = &in->idx;

	text_printf(t, "{\"file\":");
	text_json_string(t, in->file);
	text_printf(t, ",\"kind\":\"%s\",\"checksums\":%s,\"frames\":%u",
		    kind_name(idx->kind),
		    idx->has_checksum ? "true" : "false", idx->nframes);
	text_printf(t, ",\"content_size\":%llu,\"file_size\":%llu",
		    (unsigned long long)idx->content_size,
		    (unsigned long long)idx->file_size);
	text_printf(t, ",\"ratio\":%.4f,\"unsized_frames\":%u", in->ratio,
		    idx->nunsized);
	if (in->has_table)
		text_printf(t, ",\"table_offset\":%llu,\"table_size\":%llu",
			    (unsigned long long)in->table_off,
			    (unsigned long long)in->table_size);
	else
		text_printf(t, ",\"table_offset\":null,\"table_size\":null");
	text_printf(t, ",\"frame_list\":[");
}

static void json_frame(struct text *t, const struct zseek_index *idx,
		       uint32_t i)
{
	const struct zseek_frame frame_v = zseek_frame_at(idx, i);
	const struct zseek_frame *fr = &frame_v;

	text_printf(t, "%s{\"c_off\":%llu,\"c_size\":%llu", i ? "," : "",
		    (unsigned long long)fr->c_off,
		    (unsigned long long)fr->c_size);
	text_printf(t, ",\"d_off\":%llu,\"d_size\":%llu",
		    (unsigned long long)fr->d_off,
		    (unsigned long long)fr->d_size);
	if (idx->has_checksum)
		text_printf(t, ",\"checksum\":%u}", fr->checksum);
	else
		text_printf(t, ",\"checksum\":null}");
}

/* One object; the head sized for the name, then frame by frame. */
static void print_inspected_json(const struct inspected *in)
{
	size_t len = 6 * strlen(in->file) + 512;
	struct text t = {.buf = malloc(len), .len = len};

	if (!t.buf)
		die("out of memory");
	t.buf[0] = '\0';
	json_head(&t, in);
	text_flush(&t);
	for (uint32_t i = 0; i < in->idx.nframes; i++) {
		json_frame(&t, &in->idx, i);
		text_flush(&t);
	}
	text_printf(&t, "]}\n");
	text_flush(&t);
	free(t.buf);
}

static int cmd_inspect(char **args)
{
	struct inspected in;

	inspect_file(args[0], &in);
	if (opt.json)
		print_inspected_json(&in);
	else
		print_inspected(&in);
	zseek_index_free(&in.idx);
	if (fflush(stdout) || ferror(stdout))
		die("stdout: %s", strerror(errno));
	return 0;
}

struct command {
	const char *name;
	int nargs;  /* the words after the command */
	bool mount; /* the first of them is a mount point */
	int (*run)(char **args);
	const char *args, *what; /* for the usage */
};

static const struct command commands[] = {
	{"stat", 1, true, cmd_stat, "MNT [--json] [--interval S]",
	 "what the cache is doing (rates over S s)"},
	{"set", 3, true, cmd_set, "MNT KEY VALUE",
	 "KEY: max or high; VALUE: a size or max"},
	{"reclaim", 2, true, cmd_reclaim, "MNT SIZE", "reclaim SIZE now"},
	{"groups", 1, true, cmd_groups, "MNT", "the budget groups, the root first"},
	{"inspect", 1, false, cmd_inspect, "FILE.zst [--json]",
	 "a .zst file's frames (no mount needed)"},
};
#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *out)
{
	fprintf(out, "usage: %s COMMAND ARGS [options]\n\n", progname);
	for (size_t i = 0; i < NCOMMANDS; i++)
		fprintf(out, "  %s %-*s %s\n", commands[i].name,
			(int)(32 - strlen(commands[i].name)), commands[i].args,
			commands[i].what);
	fprintf(out,
		"\n"
		"  --group G      a child group (as listed by groups)\n"
		"  --ctl NAME     the control directory's name (default "
		".zfolio)\n"
		"  -V, --version  print the version and exit\n"
		"  -h, --help     this help\n");
}

static double parse_interval(const char *s)
{
	char *end;
	double v = strtod(s, &end);

	if (*end || end == s || !(v > 0) || v > MAX_INTERVAL_S)
		die("bad interval '%s' (seconds, above 0 and up to %.0f)", s,
		    MAX_INTERVAL_S);
	return v;
}

static const struct option longopts[] = {
	{"json", no_argument, NULL, 'J'},
	{"group", required_argument, NULL, 'g'},
	{"ctl", required_argument, NULL, 'c'},
	{"interval", required_argument, NULL, 'i'},
	{"version", no_argument, NULL, 'V'},
	{"help", no_argument, NULL, 'h'},
	{NULL, 0, NULL, 0},
};

/* Exits for --help, --version and bad options. */
static void parse_options(int argc, char **argv)
{
	int c;

	while ((c = getopt_long(argc, argv, "hV", longopts, NULL)) != -1) {
		switch (c) {
		case 'J':
			opt.json = true;
			break;
		case 'g':
			opt.group = optarg;
			break;
		case 'c':
			opt.ctl = optarg;
			break;
		case 'i':
			opt.interval = parse_interval(optarg);
			break;
		case 'V':
			printf("%s %s\n", progname, ZF_VERSION);
			exit(0);
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			exit(2);
		}
	}
}

/* The command named, taking nargs words; else say why, and exit 2. */
static const struct command *find_command(const char *name, int nargs)
{
	for (size_t i = 0; i < NCOMMANDS; i++) {
		const struct command *c = &commands[i];

		if (strcmp(c->name, name))
			continue;
		if (c->nargs == nargs)
			return c;
		fprintf(stderr, "usage: %s %s %s\n", progname, name, c->args);
		exit(2);
	}
	fprintf(stderr, "%s: no command '%s' (try -h)\n", progname, name);
	exit(2);
}

int main(int argc, char **argv)
{
	const struct command *cmd;

	parse_options(argc, argv);
	if (argc <= optind) {
		usage(stderr);
		return 2;
	}
	cmd = find_command(argv[optind], argc - optind - 1);
	if (cmd->mount)
		require_mount(argv[optind + 1]);
	return cmd->run(&argv[optind + 1]);
}
