// SPDX-License-Identifier: MIT
/*
 * zfolio-nullfs: the floor FUSE itself sets.  A minimal low-level server
 * with one file, "f" (1 GiB), opened direct_io like zfolio's, that answers
 * every read from a static buffer.  What zfolio adds on top of it is what a
 * benchmark beside it measures.
 *
 *   zfolio-nullfs MOUNTPOINT [-f] [-o options]
 */
#define FUSE_USE_VERSION 312
#include <errno.h>
#include <fuse_lowlevel.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FILE_INO 2
#define FILE_SIZE (1ull << 30)

static char zeros[1 << 20];

static int fill_stat(fuse_ino_t ino, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	if (ino == FUSE_ROOT_ID) {
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
	} else if (ino == FILE_INO) {
		st->st_mode = S_IFREG | 0444;
		st->st_nlink = 1;
		st->st_size = FILE_SIZE;
	} else {
		return -1;
	}
	return 0;
}

static void n_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e = {.ino = FILE_INO, .attr_timeout = 3600,
				     .entry_timeout = 3600};

	if (parent != FUSE_ROOT_ID || strcmp(name, "f")) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	fill_stat(FILE_INO, &e.attr);
	fuse_reply_entry(req, &e);
}

static void n_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stat st;

	(void)fi;
	if (fill_stat(ino, &st))
		fuse_reply_err(req, ENOENT);
	else
		fuse_reply_attr(req, &st, 3600);
}

static void n_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	fi->direct_io = 1;
	fuse_reply_open(req, fi);
}

static void n_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		   struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	if ((uint64_t)off >= FILE_SIZE)
		size = 0;
	if (size > sizeof(zeros))
		size = sizeof(zeros);
	fuse_reply_buf(req, zeros, size);
}

static const struct fuse_lowlevel_ops ops = {
	.lookup = n_lookup,
	.getattr = n_getattr,
	.open = n_open,
	.read = n_read,
};

int main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts o;
	struct fuse_loop_config *cfg;
	struct fuse_session *se;
	int ret = 1;

	if (fuse_parse_cmdline(&args, &o) || !o.mountpoint) {
		fprintf(stderr, "usage: zfolio-nullfs MOUNTPOINT [-f]\n");
		return 2;
	}
	se = fuse_session_new(&args, &ops, sizeof(ops), NULL);
	if (!se || fuse_set_signal_handlers(se) ||
	    fuse_session_mount(se, o.mountpoint))
		goto out;
	fuse_daemonize(o.foreground);
	cfg = fuse_loop_cfg_create();
	fuse_loop_cfg_set_max_threads(cfg, 2 * (unsigned)sysconf(_SC_NPROCESSORS_ONLN));
	ret = fuse_session_loop_mt(se, cfg);
	fuse_loop_cfg_destroy(cfg);
	fuse_session_unmount(se);
out:
	if (se) {
		fuse_remove_signal_handlers(se);
		fuse_session_destroy(se);
	}
	free(o.mountpoint);
	fuse_opt_free_args(&args);
	return ret ? 1 : 0;
}
