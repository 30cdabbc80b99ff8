// SPDX-License-Identifier: MIT
/*
 * What df shows: the dataset, not the disk it lies on.  Its size is the
 * content it serves (decoded sizes of .zst files), nothing is free (it is
 * read-only), and its inodes are the entries it serves.  Both are counted
 * once, by walking the backing tree at the first statfs, and remembered:
 * the dataset does not change under a mount.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

struct usage {
	uint64_t bytes, entries;
};

/*
 * The decoded size of the .zst at path, whose lstat is st, without keeping
 * it open or indexed: one read of its seek table, or a walk of its frame
 * headers (RCU-offline: it reads).  A file that does not index is logged
 * and -EIO.
 */
int backing_decoded_size(struct dataset *ds, const char *path,
			 const struct stat *st, uint64_t *size)
{
	char err[256] = "";
	int fd = dataset_open_backing(ds, path, O_RDONLY);
	struct zseek_buffered b = {.rd = zseek_pread_fd, .ctx = &fd,
				   .file_size = (uint64_t)st->st_size};
	int r;

	if (fd < 0)
		return fd;
	cache_thread_offline();
	r = zseek_content_size(zseek_read_buffered, &b, (uint64_t)st->st_size,
			       size, err, sizeof(err));
	cache_thread_online();
	close(fd);
	if (r)
		zlog_file(path, "%s", err[0] ? err : strerror(-r));
	return r ? -EIO : 0;
}

/* The served size of a regular file: decoded for a .zst served so. */
static uint64_t file_bytes(struct dataset *ds, const char *path, bool decode)
{
	struct stat st;
	uint64_t size;

	if (backing_lstat(ds, path, &st) || !S_ISREG(st.st_mode))
		return 0;
	if (!decode || backing_decoded_size(ds, path, &st, &size))
		return (uint64_t)st.st_size; /* damaged: its bytes on disk */
	return size;
}

static char *child_path(const char *dir, const char *name, bool decode)
{
	char *p;

	if (asprintf(&p, "%s%s%s%s", strcmp(dir, ".") ? dir : "",
		     strcmp(dir, ".") ? "/" : "", name, decode ? ".zst" : "") <
	    0)
		return NULL;
	return p;
}

static void walk(struct dataset *ds, struct znode *dir, struct usage *u)
{
	struct dir_entry *e;
	size_t n;

	if (dataset_list(ds, dir, &e, &n))
		return;
	for (size_t i = 0; i < n; i++) {
		char *path = child_path(dir->path, e[i].name, e[i].decode);

		u->entries++;
		if (!path)
			continue;
		if (S_ISREG(e[i].type)) {
			u->bytes += file_bytes(ds, path, e[i].decode);
		} else if (S_ISDIR(e[i].type)) {
			struct znode sub = {.kind = ZN_DIR, .path = path};

			walk(ds, &sub, u);
		}
		free(path);
	}
	dataset_list_free(e, n);
}

int dataset_usage(struct dataset *ds, uint64_t *bytes, uint64_t *entries)
{
	if (ds->mf) {
		manifest_usage(ds, bytes, entries);
		return 0;
	}
	pthread_mutex_lock(&ds->usage_lock);
	if (!ds->usage_known) {
		struct usage u = {0, 1}; /* the root */

		walk(ds, ds->root, &u);
		ds->usage_bytes = u.bytes;
		ds->usage_entries = u.entries;
		ds->usage_known = true;
	}
	*bytes = ds->usage_bytes;
	*entries = ds->usage_entries;
	pthread_mutex_unlock(&ds->usage_lock);
	return 0;
}
