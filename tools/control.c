// SPDX-License-Identifier: MIT
/*
 * zfolioctl's commands on a mount: stat, set, reclaim and groups, and the
 * check that MNT is a zfolio mount.
 *
 * They only read and write the files under MNT/.zfolio (or --ctl NAME), so
 * everything they do can be done with cat and echo too, but for writes on a
 * mount made ro: there set and reclaim write by an ioctl on the control
 * directory (ZF_IOC_CTL_WRITE), which the kernel lets through where it
 * refuses write opens.  First they make sure, from /proc/self/mountinfo,
 * that MNT is a zfolio mount: a wrong path gets that answer, not a missing
 * memory.stat.  When a write fails they say why in the mount's terms (not
 * the owner, a bad value).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../common/common.h"
#include "zfolioctl.h"

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
void require_mount(const char *mnt)
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

int cmd_stat(char **args)
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

int cmd_set(char **args)
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

int cmd_reclaim(char **args)
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

int cmd_groups(char **args)
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
