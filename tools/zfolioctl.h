/* SPDX-License-Identifier: MIT */
/*
 * zfolioctl internals: shared by the files of zfolioctl only.
 *
 * zfolioctl.c: main(), the options, the usage and the command table.
 * control.c: the commands on a mount's control files (stat, set, reclaim,
 * groups) and the check that MNT is a zfolio mount.  inspect.c: inspect,
 * a look inside a .zst file, no mount needed.
 */
#ifndef ZF_ZFOLIOCTL_H
#define ZF_ZFOLIOCTL_H

#include <stdbool.h>

extern const char *progname;

/* The options, as parse_options() leaves them for the commands. */
struct ctl_options {
	const char *ctl, *group; /* the control directory's name; a group */
	const char *dict;	 /* inspect's dictionaries, as zfolio's dict= */
	const char *max_window;	 /* inspect's, as zfolio's max_window= */
	bool json;
	double interval; /* stat's, in seconds; 0 for none */
};
extern struct ctl_options opt;

void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* control.c */
void require_mount(const char *mnt);
int cmd_stat(char **args);
int cmd_set(char **args);
int cmd_reclaim(char **args);
int cmd_groups(char **args);

/* inspect.c */
int cmd_inspect(char **args);

#endif
