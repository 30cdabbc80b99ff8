// SPDX-License-Identifier: MIT
/*
 * zfolioctl: a friendly front for a mount's control directory, and a look
 * inside .zst files.
 *
 *   zfolioctl stat MNT [--json] [--group G] [--interval S]
 *   zfolioctl set MNT KEY VALUE [--group G]     KEY: max, high
 *   zfolioctl reclaim MNT SIZE [--group G]
 *   zfolioctl groups MNT [--group G]
 *   zfolioctl inspect FILE.zst [--json] [--dict D] [--max-window SIZE]
 *
 * This file holds main(), the options, the usage and the command table;
 * the mount commands are in control.c, inspect in inspect.c.
 */
#include <ctype.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zfolioctl.h"

/* Longest interval stat --interval waits for */
#define MAX_INTERVAL_S 86400.0

const char *progname = "zfolioctl";

struct ctl_options opt = {.ctl = ".zfolio", .group = ""};

void die(const char *fmt, ...)
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
		"  --dict D       inspect: zstd dictionaries its frames name "
		"(files, ':'\n"
		"                 between them), as zfolio -o dict=D\n"
		"  --max-window W inspect: the largest window a frame "
		"may need (default\n"
		"                 128M, up to 2G), as zfolio -o max_window=W\n"
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
	{"dict", required_argument, NULL, 'D'},
	{"max-window", required_argument, NULL, 'W'},
	{"version", no_argument, NULL, 'V'},
	{"help", no_argument, NULL, 'h'},
	{NULL, 0, NULL, 0},
};

/*
 * A word that starts with '-' and a digit is a value (a size, a group's
 * number), to be refused as one, not taken for options: getopt would read
 * "-5M" as -5 -M.  Its '-' is hidden from getopt while it parses, and
 * given back after.
 */
#define HIDDEN_DASH '\001'

static void hide_negative(int argc, char **argv, char from, char to)
{
	for (int i = 1; i < argc; i++)
		if (argv[i][0] == from && isdigit((unsigned char)argv[i][1]))
			argv[i][0] = to;
}

/* Exits for --help, --version and bad options. */
static void parse_options(int argc, char **argv)
{
	int c;

	hide_negative(argc, argv, '-', HIDDEN_DASH);
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
			if (optarg[0] == HIDDEN_DASH) /* back, for the message */
				optarg[0] = '-';
			opt.interval = parse_interval(optarg);
			break;
		case 'D':
			opt.dict = optarg;
			break;
		case 'W':
			opt.max_window = optarg;
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
	hide_negative(argc, argv, HIDDEN_DASH, '-');
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
