// SPDX-License-Identifier: MIT
/*
 * What the FUSE operations share: ops.c (names, attributes, listings, the
 * session) and fileops.c (opens, reads, releases) of one table,
 * zfolio_ops.
 */
#ifndef ZF_FS_OPS_H
#define ZF_FS_OPS_H

#include "internal.h"

enum handle_kind { H_FILE, H_DIR, H_CTL };

/*
 * Every handle starts with its kind and a link on the dataset's list of
 * open handles: a lazily unmounted mount may end without the kernel
 * sending their releases, and the daemon frees what is left at exit.
 */
struct handle_hdr {
	enum handle_kind kind;
	struct cds_list_head link;
};

/* A directory: of the manifest (read as it is listed), or listed at open. */
struct dir_handle {
	struct handle_hdr hdr;
	bool in_manifest;
	struct mf_dir md;
	struct dir_entry *e;
	size_t n;
};

struct ctl_handle {
	struct handle_hdr hdr;
	char *buf;
	size_t len;
};

struct zfile_handle {
	struct handle_hdr hdr;
	struct zhandle h;
};

static inline struct dataset *ds_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

/* h on the dataset's list of open handles, as kind; and off it, freed */
void handle_track(struct dataset *ds, struct handle_hdr *h,
		  enum handle_kind kind);
void handle_free(struct dataset *ds, struct handle_hdr *h);

/* fileops.c: the operations on files, in zfolio_ops */
void zf_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void zf_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
	     struct fuse_file_info *fi);
void zf_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size,
	      off_t off, struct fuse_file_info *fi);
void zf_ioctl(fuse_req_t req, fuse_ino_t ino, int cmd, void *arg,
	      struct fuse_file_info *fi, unsigned int flags, const void *in,
	      size_t in_size, size_t out_size);
void zf_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void zf_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void zf_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
	      struct fuse_file_info *fi);

#endif
