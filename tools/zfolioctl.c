// SPDX-License-Identifier: MIT
/*
 * zfolioctl: a friendly front for a mount's control directory.
 *
 *   zfolioctl stat MNT [--json] [--group G] [--interval S]
 *   zfolioctl set MNT KEY VALUE [--group G]     KEY: max, high
 *   zfolioctl reclaim MNT SIZE [--group G]
 *   zfolioctl groups MNT
 *
 * It only reads and writes the files under MNT/.zfolio (or --ctl NAME), so
 * everything it does can be done with cat and echo too.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/common.h"

static const char *progname = "zfolioctl";
static const char *ctl_name = ".zfolio";
static const char *group = "";

static char *ctl_path(const char *mnt, const char *file)
{
	char *p;

	if (asprintf(&p, "%s/%s%s%s%s%s", mnt, ctl_name, *group ? "/" : "",
		     group, file ? "/" : "", file ? file : "") < 0)
		return NULL;
	return p;
}

static char *slurp(const char *mnt, const char *file)
{
	char *path = ctl_path(mnt, file), *buf = malloc(65536);
	FILE *f = path ? fopen(path, "re") : NULL;
	size_t n;

	if (!f || !buf) {
		fprintf(stderr, "%s: %s: %s\n", progname, path ? path : file,
			strerror(errno));
		exit(1);
	}
	n = fread(buf, 1, 65535, f);
	buf[n] = '\0';
	fclose(f);
	free(path);
	return buf;
}

static int put(const char *mnt, const char *file, const char *value)
{
	char *path = ctl_path(mnt, file);
	FILE *f = path ? fopen(path, "we") : NULL;
	int r = 0;

	if (!f || fputs(value, f) == EOF || fclose(f) == EOF) {
		fprintf(stderr, "%s: %s: %s\n", progname, path ? path : file,
			strerror(errno));
		r = 1;
	}
	free(path);
	return r;
}

static void human(char *out, size_t len, const char *bytes)
{
	double v;

	if (strncmp(bytes, "max", 3) == 0) {
		snprintf(out, len, "max");
		return;
	}
	v = strtod(bytes, NULL);
	snprintf(out, len, "%.1f MiB", v / 1048576.0);
}

static bool is_gauge(const char *key)
{
	const struct stat_desc *d = stat_desc_find(key);

	return d && d->kind == STAT_GAUGE;
}

static const char *describe(const char *key)
{
	const struct stat_desc *d = stat_desc_find(key);

	return d ? d->desc : "";
}

struct kv {
	char key[64];
	double val;
};

static int parse_stat(char *text, struct kv *v, int max)
{
	int n = 0;

	for (char *line = strtok(text, "\n"); line && n < max;
	     line = strtok(NULL, "\n")) {
		if (sscanf(line, "%63s %lf", v[n].key, &v[n].val) == 2)
			n++;
	}
	return n;
}

static int cmd_stat(const char *mnt, bool json, double interval)
{
	char cur[32], max[32], high[32], peak[32];
	struct kv a[NR_STATS + 8], b[NR_STATS + 8];
	char *s;
	int n;

	if (json) {
		s = slurp(mnt, "memory.stat.json");
		fputs(s, stdout);
		free(s);
		return 0;
	}
	s = slurp(mnt, "memory.stat");
	n = parse_stat(s, a, NR_STATS + 8);
	free(s);
	if (interval > 0) {
		usleep((useconds_t)(interval * 1e6));
		s = slurp(mnt, "memory.stat");
		parse_stat(s, b, NR_STATS + 8);
		free(s);
	}
	s = slurp(mnt, "memory.current");
	human(cur, sizeof(cur), s);
	free(s);
	s = slurp(mnt, "memory.max");
	human(max, sizeof(max), s);
	free(s);
	s = slurp(mnt, "memory.high");
	human(high, sizeof(high), s);
	free(s);
	s = slurp(mnt, "memory.peak");
	human(peak, sizeof(peak), s);
	free(s);
	printf("zfolio cache at %s, group /%s\n", mnt, group);
	printf("  memory   %s used of %s (high %s, peak %s)\n\n", cur, max,
	       high, peak);
	for (int i = 0; i < n; i++) {
		const struct kv *k = interval > 0 ? &b[i] : &a[i];

		if (is_gauge(k->key))
			printf("  %-28s %12.1f MiB", k->key,
			       k->val / 1048576.0);
		else if (interval > 0)
			printf("  %-28s %12.1f /s  ", k->key,
			       (b[i].val - a[i].val) / interval);
		else
			printf("  %-28s %12.0f     ", k->key, k->val);
		printf("  %s\n", describe(k->key));
	}
	return 0;
}

static int cmd_groups(const char *mnt, const char *sub, int depth)
{
	char *path;
	DIR *d;
	struct dirent *e;

	if (asprintf(&path, "%s/%s%s%s", mnt, ctl_name, *sub ? "/" : "",
		     sub) < 0)
		return 1;
	d = opendir(path);
	if (!d) {
		fprintf(stderr, "%s: %s: %s\n", progname, path,
			strerror(errno));
		free(path);
		return 1;
	}
	while ((e = readdir(d))) {
		char *child;

		if (e->d_type != DT_DIR || e->d_name[0] == '.')
			continue;
		printf("%*s%s\n", depth * 2, "", e->d_name);
		if (asprintf(&child, "%s%s%s", sub, *sub ? "/" : "",
			     e->d_name) >= 0) {
			cmd_groups(mnt, child, depth + 1);
			free(child);
		}
	}
	closedir(d);
	free(path);
	return 0;
}

static void usage(FILE *out)
{
	fprintf(out,
		"usage: %s COMMAND MOUNTPOINT [ARGS] [options]\n\n"
		"  stat MNT [--json] [--interval S]  what the cache is doing "
		"(rates over S s)\n"
		"  set MNT KEY VALUE                 KEY: max or high; VALUE: "
		"a size or max\n"
		"  reclaim MNT SIZE                  reclaim SIZE now\n"
		"  groups MNT                        list the budget groups\n\n"
		"  --group G   a child group (as listed by groups)\n"
		"  --ctl NAME  the control directory's name (default "
		".zfolio)\n",
		progname);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"json", no_argument, NULL, 'J'},
		{"group", required_argument, NULL, 'g'},
		{"ctl", required_argument, NULL, 'c'},
		{"interval", required_argument, NULL, 'i'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	bool json = false;
	double interval = 0;
	int c;

	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'J':
			json = true;
			break;
		case 'g':
			group = optarg;
			break;
		case 'c':
			ctl_name = optarg;
			break;
		case 'i':
			interval = strtod(optarg, NULL);
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (argc - optind < 2) {
		usage(stderr);
		return 2;
	}
	const char *cmd = argv[optind], *mnt = argv[optind + 1];

	if (strcmp(cmd, "stat") == 0 && argc - optind == 2)
		return cmd_stat(mnt, json, interval);
	if (strcmp(cmd, "groups") == 0 && argc - optind == 2)
		return cmd_groups(mnt, group, 0);
	if (strcmp(cmd, "reclaim") == 0 && argc - optind == 3)
		return put(mnt, "memory.reclaim", argv[optind + 2]);
	if (strcmp(cmd, "set") == 0 && argc - optind == 4) {
		const char *key = argv[optind + 2];
		char file[64];

		if (strncmp(key, "memory.", 7) == 0)
			key += 7;
		if (strcmp(key, "max") && strcmp(key, "high")) {
			fprintf(stderr, "%s: unknown key '%s' (max, high)\n",
				progname, argv[optind + 2]);
			return 2;
		}
		snprintf(file, sizeof(file), "memory.%s", key);
		return put(mnt, file, argv[optind + 3]);
	}
	usage(stderr);
	return 2;
}
