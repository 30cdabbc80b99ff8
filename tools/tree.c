// SPDX-License-Identifier: MIT
/*
 * The tree layout (mkzfolio --layout=tree): a copy of the source tree in
 * which each regular file f is f.zst in the zstd seekable format, and
 * directories, symlinks (as links, never followed), FIFOs and (as root)
 * device nodes are recreated, with modes, times and (as root) owners.
 * Every .zst is a plain zstd stream: zstd -d restores the file.  Hard
 * links are links between the .zst files.  A name that ".zst" would make
 * too long, and a source holding both x and x.zst, cannot be kept this
 * way: mkzfolio says so before it writes anything (the packed layout keeps
 * them).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mkzfolio.h"

/* DST/name.zst, created empty, with room for the entries of its frames. */
static struct outfile *outfile_open(struct packer *pk, const struct place *dst,
				    const struct entry *e)
{
	uint32_t nframes = (uint32_t)(((uint64_t)e->st.st_size + pk->frame -
				       1) / pk->frame);
	struct outfile *of;
	char *zname, *path;

	if (asprintf(&zname, "%s.zst", e->name) < 0)
		die("out of memory");
	path = join(dst->path, zname);
	/* a name too long once ".zst" is added: tree_count() said so, unless
	 * the tree changed since */
	if (strlen(zname) > NAME_MAX)
		die("%s: the name is too long for the tree layout once .zst "
		    "is added (the packed layout keeps it)", e->spath);
	unlinkat(dst->fd, zname, 0); /* --force over an earlier pack */
	of = outfile_create(dst->fd, zname, path, nframes);
	of->st = e->st;
	of->keep_meta = true;
	outfile_source(of, &e->st);
	free(zname);
	free(path);
	return of;
}

/* What an earlier pack (--force) made for a name now skipped: removed. */
static void remove_earlier(const struct place *dst, const char *name)
{
	char *zname;

	if (asprintf(&zname, "%s.zst", name) >= 0) {
		unlinkat(dst->fd, zname, 0);
		free(zname);
	}
	unlinkat(dst->fd, name, 0);
}

/*
 * Hard links: a file's first name is packed, its others are links to that
 * .zst (a tree of .zst files keeps them: the mount gives each .zst's inode
 * and link count); a symlink's or a special file's others, links to its
 * first name.
 */
#define TREE_LINK_BUCKETS 1024

struct tree_link {
	struct tree_link *next;
	dev_t dev;
	ino_t ino;
	char *zpath; /* the first name in DST (a file's: its .zst) */
};

static struct tree_link *tree_links[TREE_LINK_BUCKETS];

static struct tree_link **tree_link_slot(const struct stat *st)
{
	struct tree_link **pp =
		&tree_links[inode_bucket(st, TREE_LINK_BUCKETS)];

	while (*pp && ((*pp)->dev != st->st_dev || (*pp)->ino != st->st_ino))
		pp = &(*pp)->next;
	return pp;
}

static void link_earlier(struct packer *pk, const struct place *dst,
			 const struct entry *e, const char *zpath)
{
	char *zname;

	if (asprintf(&zname, "%s.zst", e->name) < 0)
		die("out of memory");
	unlinkat(dst->fd, zname, 0); /* --force over an earlier pack */
	if (linkat(AT_FDCWD, zpath, dst->fd, zname, 0))
		die("%s.zst: %s", e->dpath, strerror(errno));
	free(zname);
	pk->files++; /* names are counted, as in the packed layout */
	pk->hardlinks++;
	pk->done_files++;
}

static void pack_file(struct packer *pk, const struct place *src,
		      const struct place *dst, const struct entry *e)
{
	uint64_t left = (uint64_t)e->st.st_size;
	struct tree_link **slot = NULL;
	struct outfile *of;
	int fd;

	if (e->st.st_nlink > 1) {
		slot = tree_link_slot(&e->st);
		if (*slot) {
			link_earlier(pk, dst, e, (*slot)->zpath);
			return;
		}
	}
	fd = openat(src->fd, e->name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		skip_unreadable(errno, e->spath, "not packed");
		remove_earlier(dst, e->name);
		return;
	}
	of = outfile_open(pk, dst, e);
	if (slot) {
		struct tree_link *l = calloc(1, sizeof(*l));

		if (!l || asprintf(&l->zpath, "%s.zst", e->dpath) < 0)
			die("out of memory");
		l->dev = e->st.st_dev;
		l->ino = e->st.st_ino;
		*slot = l;
	}
	while (left) {
		size_t len = left < pk->frame ? (size_t)left : pk->frame;

		left -= len;
		queue_frame(pk, of, fd, len, e->spath);
	}
	check_unchanged(fd, &e->st, e->spath);
	close(fd);
	pk->files++;
	pk->done_files++;
	/* with frames, run_batch finishes it (and may have freed it) */
	if (!e->st.st_size)
		outfile_seal(pk, of); /* no frames: finished at once */
}

/* A directory's path in DST, from its path for messages. */
static const char *in_dst(const struct packer *pk, const char *dpath)
{
	return dpath + pk->dst_len + 1;
}

static void remember_dir(struct packer *pk, const char *path,
			 const struct stat *st)
{
	if (pk->ndirs == pk->dircap) {
		pk->dircap = pk->dircap ? pk->dircap * 2 : 64;
		pk->dirpaths = realloc(pk->dirpaths,
				       pk->dircap * sizeof(*pk->dirpaths));
		pk->dirstats = realloc(pk->dirstats,
				       pk->dircap * sizeof(*pk->dirstats));
		if (!pk->dirpaths || !pk->dirstats)
			die("out of memory");
	}
	pk->dirpaths[pk->ndirs] = strdup(in_dst(pk, path));
	if (!pk->dirpaths[pk->ndirs])
		die("out of memory");
	pk->dirstats[pk->ndirs++] = *st;
}

/* Owner (as root) and times of a link or node just made in dst. */
static void keep_node_meta(struct packer *pk, const struct place *dst,
			   const struct entry *e)
{
	if (pk->root && fchownat(dst->fd, e->name, e->st.st_uid, e->st.st_gid,
				 AT_SYMLINK_NOFOLLOW))
		warn("%s: chown: %s", e->dpath, strerror(errno));
	if (set_times(dst->fd, e->name, &e->st, AT_SYMLINK_NOFOLLOW))
		warn("%s: times: %s", e->dpath, strerror(errno));
}

/* A directory: made private (0700) while packed, its mode set last. */
static void pack_dir(struct packer *pk, const struct place *src,
		     const struct place *dst, const struct entry *e)
{
	struct place s2 = {.path = e->spath}, d2 = {.path = e->dpath};

	/* the daemon opens what a directory holds by its path in DST, which
	 * must fit a path: deeper, it is packed empty */
	if (strlen(in_dst(pk, e->dpath)) >= PATH_MAX) {
		errno = ENAMETOOLONG;
		s2.fd = -1;
	} else {
		s2.fd = openat(src->fd, e->name, O_RDONLY | O_DIRECTORY |
						       O_NOFOLLOW | O_CLOEXEC);
	}
	if (s2.fd < 0) {
		int err = errno;

		skip_unreadable(err, e->spath,
				err == ENOENT ? "not packed" : "packed empty");
		if (err == ENOENT)
			return;
	}
	if (mkdirat(dst->fd, e->name, 0700) && errno != EEXIST)
		die("%s: %s", e->dpath, strerror(errno));
	if (s2.fd < 0) { /* one it may not list: empty, as in the packed
			  * layout, its owner, mode and times set now */
		keep_node_meta(pk, dst, e);
		if (fchmodat(dst->fd, e->name, e->st.st_mode & 07777, 0))
			warn("%s: chmod: %s", e->dpath, strerror(errno));
		pk->dirs++;
		return;
	}
	d2.fd = openat(dst->fd, e->name,
		       O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (d2.fd < 0)
		die("%s: %s", e->dpath, strerror(errno));
	tree_pack(pk, &s2, &d2);
	close(s2.fd);
	close(d2.fd);
	remember_dir(pk, e->dpath, &e->st);
	pk->dirs++;
}

/* A symlink or special file met before under another name: linked to
 * that name (true), or not met (false). */
static bool node_linked(struct packer *pk, const struct place *dst,
			const struct entry *e)
{
	struct tree_link **slot;

	if (e->st.st_nlink < 2 || !*(slot = tree_link_slot(&e->st)))
		return false;
	unlinkat(dst->fd, e->name, 0); /* --force over an earlier pack */
	if (linkat(AT_FDCWD, (*slot)->zpath, dst->fd, e->name, 0))
		die("%s: %s", e->dpath, strerror(errno));
	pk->hardlinks++;
	return true;
}

/* A symlink or special file of several names, made: its later names link
 * to it. */
static void node_made(const struct entry *e)
{
	struct tree_link **slot, *l;

	if (e->st.st_nlink < 2)
		return;
	slot = tree_link_slot(&e->st);
	l = calloc(1, sizeof(*l));
	if (!l || !(l->zpath = strdup(e->dpath)))
		die("out of memory");
	l->dev = e->st.st_dev;
	l->ino = e->st.st_ino;
	*slot = l;
}

/* A symlink: copied as a link, its target never followed. */
static void pack_link(struct packer *pk, const struct place *src,
		      const struct place *dst, const struct entry *e)
{
	char target[PATH_MAX + 1];
	ssize_t len;

	if (node_linked(pk, dst, e)) {
		pk->links++;
		return;
	}
	len = readlinkat(src->fd, e->name, target, sizeof(target) - 1);
	if (len < 0) {
		skip_unreadable(errno, e->spath, "not packed");
		remove_earlier(dst, e->name);
		return;
	}
	target[len] = '\0';
	unlinkat(dst->fd, e->name, 0); /* --force over an earlier pack */
	if (symlinkat(target, dst->fd, e->name))
		die("%s: %s", e->dpath, strerror(errno));
	node_made(e);
	keep_node_meta(pk, dst, e);
	pk->links++;
}

/* A FIFO, or (as root) a device node: recreated, never opened. */
static void pack_node(struct packer *pk, const struct place *dst,
		      const struct entry *e)
{
	if (node_linked(pk, dst, e)) {
		pk->others++;
		return;
	}
	unlinkat(dst->fd, e->name, 0); /* --force over an earlier pack */
	if (mknodat(dst->fd, e->name, e->st.st_mode, e->st.st_rdev))
		die("%s: %s", e->dpath, strerror(errno));
	node_made(e);
	keep_node_meta(pk, dst, e);
	pk->others++;
}

static bool can_make_node(const struct packer *pk, mode_t mode)
{
	return S_ISFIFO(mode) ||
	       (pk->root && (S_ISCHR(mode) || S_ISBLK(mode)));
}

static void pack_entry(struct packer *pk, const struct place *src,
		       const struct place *dst, const char *name)
{
	struct entry e = {.name = name};

	e.spath = join(src->path, name);
	e.dpath = join(dst->path, name);
	if (fstatat(src->fd, name, &e.st, AT_SYMLINK_NOFOLLOW)) {
		skip_unreadable(errno, e.spath, "not packed");
		remove_earlier(dst, name);
		free(e.spath);
		free(e.dpath);
		return;
	}
	note_xattrs(e.spath);
	if (S_ISREG(e.st.st_mode))
		pack_file(pk, src, dst, &e);
	else if (S_ISDIR(e.st.st_mode))
		pack_dir(pk, src, dst, &e);
	else if (S_ISLNK(e.st.st_mode))
		pack_link(pk, src, dst, &e);
	else if (can_make_node(pk, e.st.st_mode))
		pack_node(pk, dst, &e);
	else
		warn("%s: skipped (%s)", e.spath,
		     S_ISSOCK(e.st.st_mode) ? "a socket"
					    : "a device node, needs root");
	free(e.spath);
	free(e.dpath);
}

void tree_pack(struct packer *pk, const struct place *src,
	       const struct place *dst)
{
	size_t n;
	char **names = list_dir(src->fd, &n, src->path);

	for (size_t i = 0; i < n; i++) {
		pack_entry(pk, src, dst, names[i]);
		free(names[i]);
	}
	free(names);
}

/* Packing a directory changed its times: set them last, deepest first. */
void tree_restore_dirs(struct packer *pk, const struct place *dst)
{
	for (int i = 0; i < TREE_LINK_BUCKETS; i++)
		while (tree_links[i]) {
			struct tree_link *l = tree_links[i];

			tree_links[i] = l->next;
			free(l->zpath);
			free(l);
		}
	while (pk->ndirs--) {
		const struct stat *st = &pk->dirstats[pk->ndirs];
		const char *p = pk->dirpaths[pk->ndirs];

		/* by their paths in DST: its own path may make them too long */
		if (pk->root && fchownat(dst->fd, p, st->st_uid, st->st_gid,
					 AT_SYMLINK_NOFOLLOW))
			warn("%s/%s: chown: %s", dst->path, p, strerror(errno));
		if (fchmodat(dst->fd, p, st->st_mode & 07777, 0))
			warn("%s/%s: chmod: %s", dst->path, p, strerror(errno));
		if (set_times(dst->fd, p, st, AT_SYMLINK_NOFOLLOW))
			warn("%s/%s: times: %s", dst->path, p,
			     strerror(errno));
		free(pk->dirpaths[pk->ndirs]);
	}
}
