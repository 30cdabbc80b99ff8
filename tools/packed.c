// SPDX-License-Identifier: MIT
/*
 * The packed layout (the default): DST/manifest.zst describes the tree
 * (format/manifest.c), DST/data/NNNNNNNN.zst holds the file data.
 *
 * A file bigger than --small gets a data file of its own.  Smaller ones
 * are packed: their bytes follow each other in a pack's frames, each file
 * whole within one frame (a frame is closed early rather than split a
 * file), so a random small file is read with one frame decoded; a pack is
 * closed after PACK_BYTES of content.  Hard links share one copy of the
 * data and one inode number.  Names, link targets, modes, owners, times,
 * device numbers are kept exactly, whatever bytes a name holds: nothing
 * of the source's naming reaches the data files' names.
 *
 * The walk is depth first: a directory's entries are listed (sorted), each
 * is written to the manifest as it is met (its data packed or written
 * then), and then its subdirectories are walked in order.  That is the
 * manifest's order, so nothing is sorted or held but one listing per
 * level, and memory stays bounded whatever the tree's size.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <xxhash.h>

#include "mkzfolio.h"

/* content per pack: bigger packs are fewer files, smaller ones shorter
 * seek tables to read at open */
#define PACK_BYTES (64ull << 20)
#define HARDLINK_BUCKETS 4096
/* small files remembered for deduplication: a bounded table, so packing a
 * million files takes no more memory; a file whose slot was taken again is
 * only stored twice */
#define DEDUP_BITS 18
/* the manifest is small and read often, written once: a high level costs
 * the pack little and shrinks it (its parent paths repeat) */
#define MANIFEST_LEVEL 15

/* A hard-linked file met before: its inode number and data. */
struct hardlink {
	struct hardlink *next;
	dev_t dev;
	ino_t ino;
	uint64_t inum;
	uint64_t data_id, data_off;
	bool has_data;
};

/* A small file's content seen before: the same bytes are stored once. */
struct dedup {
	XXH128_hash_t hash;
	uint64_t size, id, off;
};

/* Where an entry's bytes are. */
struct place_in_data {
	bool has;
	uint64_t id, off;
};

/* The most bytes of the header's holes= (about 70,000 big files) */
#define HOLES_MAX (1u << 20)

struct packed {
	struct packer *pk;
	const char *dst_path;
	int dstfd, datafd;
	uint64_t next_id;
	/* the pack being filled, and its open frame */
	struct outfile *pack;
	uint64_t pack_id, pack_flushed;
	uint8_t *frame;
	size_t frame_len;
	/* the manifest: lines of the open frame, then written frames */
	int mfd;
	struct zseek_writer_entry *mframes;
	uint32_t nmframes, mcap;
	char *lines;
	size_t lines_len, lines_cap;
	unsigned int nlines;
	uint64_t entries, bytes;
	uint64_t xattr_entries; /* entries with an xattrs field */
	ZSTD_CCtx *cctx;
	uint8_t *zbuf;
	size_t zcap;
	struct hardlink *links[HARDLINK_BUCKETS];
	struct dedup *dedup; /* 1 << DEDUP_BITS slots */
	/* big files' frames of zeros: "ID:BYTES," per data file that has
	 * some, the header's holes= (the mount leaves them out of
	 * st_blocks) */
	char *holes;
	size_t holes_len, holes_cap;
};

/* --- the manifest --- */

static void lines_reserve(struct packed *p, size_t more)
{
	if (p->lines_len + more <= p->lines_cap)
		return;
	p->lines_cap = (p->lines_len + more) * 2;
	p->lines = realloc(p->lines, p->lines_cap);
	if (!p->lines)
		die("out of memory");
}

/* Compress the lines so far as one manifest frame and write it. */
static void manifest_flush(struct packed *p)
{
	size_t bound = ZSTD_compressBound(p->lines_len), c;
	uint32_t ck;

	if (!p->lines_len)
		return;
	if (bound > p->zcap) {
		p->zcap = bound;
		p->zbuf = realloc(p->zbuf, bound);
		if (!p->zbuf)
			die("out of memory");
	}
	c = zseek_compress_frame(p->cctx, MANIFEST_LEVEL, p->lines,
				 p->lines_len, p->zbuf, p->zcap, &ck);
	if (ZSTD_isError(c) || p->lines_len > UINT32_MAX)
		die("%s/%s: compression failed", p->dst_path, ZMF_NAME);
	write_all(p->mfd, p->zbuf, c, ZMF_NAME);
	if (p->nmframes == p->mcap) {
		p->mcap = p->mcap ? p->mcap * 2 : 256;
		p->mframes = realloc(p->mframes, p->mcap * sizeof(*p->mframes));
		if (!p->mframes)
			die("out of memory");
	}
	p->mframes[p->nmframes++] = (struct zseek_writer_entry){
		(uint32_t)c, (uint32_t)p->lines_len, ck};
	p->pk->bytes_out += c;
	p->lines_len = 0;
	p->nlines = 0;
}

static void put_field(struct packed *p, const char *s, size_t len, bool last)
{
	lines_reserve(p, 4 * len + 1);
	p->lines_len += zmf_escape(s, len, p->lines + p->lines_len);
	p->lines[p->lines_len++] = last ? '\n' : '\t';
}

/* Bytes as they are: an xattrs field, escaped already. */
static void put_bytes(struct packed *p, const char *s, size_t len)
{
	lines_reserve(p, len + 1);
	memcpy(p->lines + p->lines_len, s, len);
	p->lines_len += len;
}

static void put_text(struct packed *p, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void put_text(struct packed *p, const char *fmt, ...)
{
	va_list ap;
	int n;

	lines_reserve(p, 256);
	va_start(ap, fmt);
	n = vsnprintf(p->lines + p->lines_len, 256, fmt, ap);
	va_end(ap);
	if (n < 0 || n >= 256)
		die("internal error: a manifest field does not fit");
	p->lines_len += (size_t)n;
}

static char type_char(mode_t m)
{
	return S_ISREG(m) ? 'f' : S_ISDIR(m) ? 'd' : S_ISLNK(m) ? 'l'
	       : S_ISCHR(m) ? 'c' : S_ISBLK(m) ? 'b' : S_ISFIFO(m) ? 'p'
						       : 's';
}

/* One entry's line; the manifest's frames close every ZMF_FRAME_ENTRIES. */
static void manifest_entry(struct packed *p, const char *parent,
			   const char *name, const struct stat *st,
			   uint64_t size, uint64_t inum, uint64_t nlink,
			   const struct place_in_data *d, const char *target,
			   const char *xattrs, size_t xlen)
{
	put_field(p, parent, strlen(parent), false);
	put_field(p, name, strlen(name), false);
	put_text(p, "%c\t%o\t%u\t%u\t%llu\t%lld.%09ld\t%lld.%09ld\t%llu\t%llu\t"
		    "%llu\t",
		 type_char(st->st_mode), (unsigned int)(st->st_mode & 07777),
		 (unsigned int)st->st_uid, (unsigned int)st->st_gid,
		 (unsigned long long)size, (long long)st->st_mtim.tv_sec,
		 st->st_mtim.tv_nsec, (long long)st->st_atim.tv_sec,
		 st->st_atim.tv_nsec, (unsigned long long)inum,
		 (unsigned long long)nlink,
		 (unsigned long long)(S_ISCHR(st->st_mode) ||
						      S_ISBLK(st->st_mode)
					      ? st->st_rdev
					      : 0));
	if (d->has)
		put_text(p, "%llu:%llu\t", (unsigned long long)d->id,
			 (unsigned long long)d->off);
	else
		put_text(p, "-\t");
	put_field(p, target ? target : "", target ? strlen(target) : 0,
		  !xlen);
	if (xlen) {
		put_bytes(p, xattrs, xlen);
		p->lines[p->lines_len++] = '\n';
		p->xattr_entries++;
	}
	p->entries++;
	if (++p->nlines == ZMF_FRAME_ENTRIES)
		manifest_flush(p);
}

/* The last frame: the header; then the seek table. */
static void manifest_finish(struct packed *p, const struct stat *root,
			    uint64_t root_nlink, const char *root_xattrs,
			    size_t xlen)
{
	manifest_flush(p);
	put_text(p, "%s\tversion=%d\tentries=%llu\tdata=%llu", ZMF_MAGIC,
		 p->xattr_entries || xlen ? ZMF_VERSION_XATTRS : ZMF_VERSION,
		 (unsigned long long)p->entries,
		 (unsigned long long)p->next_id);
	put_text(p, "\tbytes=%llu\tmode=%u\tuid=%u\tgid=%u\tmtime=%lld"
		    "\tmtime_ns=%ld\tnlink=%llu\tsize=%llu",
		 (unsigned long long)p->bytes,
		 (unsigned int)(root->st_mode & 07777),
		 (unsigned int)root->st_uid, (unsigned int)root->st_gid,
		 (long long)root->st_mtim.tv_sec, root->st_mtim.tv_nsec,
		 (unsigned long long)root_nlink,
		 (unsigned long long)root->st_size);
	if (p->holes_len) { /* without the last ',' */
		put_text(p, "\tholes=");
		put_bytes(p, p->holes, p->holes_len - 1);
	}
	if (xlen) {
		put_text(p, "\txattrs=");
		put_bytes(p, root_xattrs, xlen);
	}
	put_text(p, "\n");
	manifest_flush(p);
	{
		size_t tsize = zseek_table_size(p->nmframes);
		uint8_t *tab = malloc(tsize);

		if (!tab || zseek_write_table(p->mframes, p->nmframes, tab,
					      tsize) != tsize)
			die("%s: cannot build the seek table", ZMF_NAME);
		write_all(p->mfd, tab, tsize, ZMF_NAME);
		p->pk->bytes_out += tsize;
		free(tab);
	}
	if (fsync(p->mfd) || close(p->mfd))
		die("%s/%s: %s", p->dst_path, ZMF_NAME, strerror(errno));
}

/* --- data files and packs --- */

static struct outfile *data_create(struct packed *p, uint64_t id,
				   uint32_t nframes)
{
	char name[32], *path;
	struct outfile *of;

	snprintf(name, sizeof(name), "%08llu.zst", (unsigned long long)id);
	if (asprintf(&path, "%s/%s/%s", p->dst_path, ZMF_DATA_DIR, name) < 0)
		die("out of memory");
	of = outfile_create(p->datafd, name, path, nframes);
	free(path);
	return of;
}

static void pack_flush_frame(struct packed *p)
{
	if (!p->frame_len)
		return;
	queue_buffer(p->pk, p->pack, p->frame, p->frame_len);
	p->pack_flushed += p->frame_len;
	p->frame_len = 0;
}

static void pack_close(struct packed *p)
{
	if (!p->pack)
		return;
	pack_flush_frame(p);
	outfile_seal(p->pk, p->pack);
	p->pack = NULL;
}

/*
 * A small file with the same bytes, packed before: by size and XXH3-128 of
 * the content (the chance that two different files share both is about
 * 2^-128 a pair).  The slot is taken for this file if it is new.
 */
static bool dedup_find(struct packed *p, const uint8_t *buf, size_t size,
		       struct place_in_data *d, struct dedup **slot)
{
	XXH128_hash_t h = XXH3_128bits(buf, size);
	struct dedup *e = &p->dedup[h.low64 >> (64 - DEDUP_BITS)];

	*slot = e;
	if (e->size == size && XXH128_isEqual(e->hash, h)) {
		*d = (struct place_in_data){true, e->id, e->off};
		return true;
	}
	e->hash = h;
	e->size = size;
	return false;
}

/* A small file's bytes into the pack (once): where they are. */
static struct place_in_data pack_append(struct packed *p, int fd,
					size_t size, const char *spath)
{
	struct place_in_data d = {true, 0, 0};
	struct dedup *slot;

	if (p->pack && p->pack_flushed + p->frame_len + size > PACK_BYTES)
		pack_close(p);
	if (!p->pack) {
		p->pack_id = p->next_id++;
		p->pack = data_create(p, p->pack_id, 0);
		p->pack_flushed = 0;
	}
	if (p->frame_len + size > p->pk->pack_frame)
		pack_flush_frame(p); /* a file is never split across frames */
	d.id = p->pack_id;
	d.off = p->pack_flushed + p->frame_len;
	read_all(fd, p->frame + p->frame_len, size, 0, spath);
	if (dedup_find(p, p->frame + p->frame_len, size, &d, &slot)) {
		p->pk->deduped++;
		return d; /* stored before: the bytes read are dropped */
	}
	slot->id = d.id;
	slot->off = d.off;
	p->frame_len += size;
	return d;
}

/* A big file: a data file of its own, frame by frame. */
static struct place_in_data data_write(struct packed *p, int fd,
				       const struct stat *st, const char *spath)
{
	struct packer *pk = p->pk;
	uint64_t size = (uint64_t)st->st_size;
	uint32_t nframes = (uint32_t)((size + pk->frame - 1) / pk->frame);
	struct place_in_data d = {true, p->next_id++, 0};
	struct outfile *of = data_create(p, d.id, nframes);
	uint64_t zeros = 0;
	char item[48];
	int n;

	outfile_source(of, st);
	for (uint64_t left = size; left;) {
		size_t len = left < pk->frame ? (size_t)left : pk->frame;

		left -= len;
		/* frames the mount serves whole: those are its holes */
		if (queue_frame(pk, of, fd, len, spath) &&
		    len <= ZSEEK_SPLIT_ABOVE)
			zeros += len;
	}
	/* the header is one frame, read whole: past HOLES_MAX the rest of
	 * the files count their frames of zeros in st_blocks */
	if (zeros && p->holes_len + sizeof(item) <= HOLES_MAX) {
		n = snprintf(item, sizeof(item), "%llu:%llu,",
			     (unsigned long long)d.id,
			     (unsigned long long)zeros);
		if (p->holes_len + (size_t)n > p->holes_cap) {
			p->holes_cap = (p->holes_len + (size_t)n) * 2;
			p->holes = realloc(p->holes, p->holes_cap);
			if (!p->holes)
				die("out of memory");
		}
		memcpy(p->holes + p->holes_len, item, (size_t)n);
		p->holes_len += (size_t)n;
	}
	return d;
}

/* --- the walk --- */

static struct hardlink **hardlink_slot(struct packed *p, const struct stat *st)
{
	struct hardlink **pp = &p->links[inode_bucket(st, HARDLINK_BUCKETS)];

	while (*pp && ((*pp)->dev != st->st_dev || (*pp)->ino != st->st_ino))
		pp = &(*pp)->next;
	return pp;
}

/*
 * A regular file's data; for a hard link met before, the first one's.  A
 * file removed since st was taken sets *gone (and is not packed).
 */
static struct place_in_data file_data(struct packed *p, int dirfd,
				      const char *name, const char *spath,
				      const struct stat *st, uint64_t *inum,
				      bool *gone)
{
	struct hardlink **hl = NULL, *l;
	struct place_in_data d = {false, 0, 0};
	int fd;

	if (st->st_nlink > 1) {
		hl = hardlink_slot(p, st);
		if (*hl) {
			*inum = (*hl)->inum;
			p->pk->hardlinks++;
			return (struct place_in_data){(*hl)->has_data,
						      (*hl)->data_id,
						      (*hl)->data_off};
		}
	}
	if (st->st_size) {
		fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0) {
			skip_unreadable(errno, spath, "not packed");
			*gone = true;
			return d;
		}
		if ((uint64_t)st->st_size <= p->pk->small)
			d = pack_append(p, fd, (size_t)st->st_size, spath);
		else
			d = data_write(p, fd, st, spath);
		check_unchanged(fd, st, spath);
		close(fd);
		p->bytes += (uint64_t)st->st_size;
	} else {
		check_unchanged_at(dirfd, name, st, spath);
	}
	if (hl && (l = calloc(1, sizeof(*l)))) {
		*l = (struct hardlink){NULL, st->st_dev, st->st_ino, *inum,
				       d.id, d.off, d.has};
		*hl = l;
	}
	return d;
}

/*
 * A symlink, FIFO, socket or device node of several names: the later names
 * get the first one's inode number, as a regular file's hard links do.
 */
static void node_link(struct packed *p, const struct stat *st, uint64_t *inum)
{
	struct hardlink **hl = hardlink_slot(p, st), *l;

	if (*hl) {
		*inum = (*hl)->inum;
		p->pk->hardlinks++;
	} else if ((l = calloc(1, sizeof(*l)))) {
		*l = (struct hardlink){NULL, st->st_dev, st->st_ino, *inum,
				       0, 0, false};
		*hl = l;
	}
}

/* A directory's links: 2 and one per subdirectory. */
static uint64_t dir_nlink(int dirfd, const char *name)
{
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
					   O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	uint64_t n = 2;
	struct dirent *e;
	struct stat st;

	if (!d) {
		if (fd >= 0)
			close(fd);
		return n;
	}
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (e->d_type == DT_DIR ||
		    (e->d_type == DT_UNKNOWN &&
		     !fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) &&
		     S_ISDIR(st.st_mode)))
			n++;
	}
	closedir(d);
	return n;
}

/* One name of a directory into the manifest; true if it is a directory. */
static bool walk_entry(struct packed *p, int dirfd, const char *spath_dir,
		       const char *mpath, const char *name)
{
	struct place_in_data d = {false, 0, 0};
	char *spath = join(spath_dir, name), target[PATH_MAX + 1];
	char *xattrs, fdpath[32 + NAME_MAX];
	uint64_t inum = p->entries + 2, size = 0, nlink;
	size_t xlen;
	struct stat st;
	ssize_t len;

	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW)) {
		skip_unreadable(errno, spath, "not packed");
		free(spath);
		return false;
	}
	nlink = st.st_nlink;
	/* a source path too long for the kernel: read through dirfd */
	if (strlen(spath) >= PATH_MAX) {
		snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d/%s", dirfd,
			 name);
		xattrs = xattrs_field(fdpath, spath, &xlen);
	} else {
		xattrs = xattrs_field(spath, spath, &xlen);
	}
	if (S_ISREG(st.st_mode)) {
		bool gone = false;

		d = file_data(p, dirfd, name, spath, &st, &inum, &gone);
		if (gone) {
			free(xattrs);
			free(spath);
			return false;
		}
		size = (uint64_t)st.st_size;
		p->pk->files++;
	} else if (S_ISDIR(st.st_mode)) {
		nlink = dir_nlink(dirfd, name);
		size = (uint64_t)st.st_size; /* as ls shows the source's */
		p->pk->dirs++;
	} else if (S_ISLNK(st.st_mode)) {
		len = readlinkat(dirfd, name, target, sizeof(target) - 1);
		if (len < 0) {
			skip_unreadable(errno, spath, "not packed");
			free(xattrs);
			free(spath);
			return false;
		}
		target[len] = '\0';
		size = (uint64_t)len;
		p->pk->links++;
	} else {
		p->pk->others++;
	}
	if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode) && st.st_nlink > 1)
		node_link(p, &st, &inum);
	manifest_entry(p, mpath, name, &st, size, inum, nlink, &d,
		       S_ISLNK(st.st_mode) ? target : NULL, xattrs, xlen);
	p->pk->done_files++;
	draw_progress(p->pk, false);
	free(xattrs);
	free(spath);
	return S_ISDIR(st.st_mode);
}

static void walk(struct packed *p, int dirfd, const char *spath,
		 const char *mpath)
{
	size_t n;
	char **names = list_dir(dirfd, &n, spath);
	bool *isdir = calloc(n ? n : 1, sizeof(*isdir));

	if (!isdir)
		die("out of memory");
	for (size_t i = 0; i < n; i++)
		isdir[i] = walk_entry(p, dirfd, spath, mpath, names[i]);
	for (size_t i = 0; i < n; i++) {
		char *sub_s, *sub_m;
		int fd;

		if (isdir[i]) {
			sub_s = join(spath, names[i]);
			/* the daemon lists a directory by its path in the
			 * tree, which must fit a path */
			if (strlen(mpath) + 1 + strlen(names[i]) >= PATH_MAX) {
				skip_unreadable(ENAMETOOLONG, sub_s,
						"packed empty");
				free(sub_s);
				free(names[i]);
				continue;
			}
			fd = openat(dirfd, names[i], O_RDONLY | O_DIRECTORY |
							     O_NOFOLLOW |
							     O_CLOEXEC);
			if (fd < 0) {
				skip_unreadable(errno, sub_s, "packed empty");
				free(sub_s);
				free(names[i]);
				continue;
			}
			sub_m = *mpath ? join(mpath, names[i])
				       : strdup(names[i]);
			if (!sub_m)
				die("out of memory");
			walk(p, fd, sub_s, sub_m);
			close(fd);
			free(sub_s);
			free(sub_m);
		}
		free(names[i]);
	}
	free(names);
	free(isdir);
}

/* --force over an earlier packed dataset: what it wrote goes first. */
static void clear_previous(struct packed *p)
{
	int fd = openat(p->dstfd, ZMF_DATA_DIR, O_RDONLY | O_DIRECTORY |
							O_NOFOLLOW | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *e;

	unlinkat(p->dstfd, ZMF_NAME, 0);
	if (!d)
		return;
	while ((e = readdir(d)))
		if (strlen(e->d_name) == 12 &&
		    !strcmp(e->d_name + 8, ".zst"))
			unlinkat(fd, e->d_name, 0);
	closedir(d);
}

static void packed_open(struct packed *p, struct packer *pk,
			const struct place *dst)
{
	p->pk = pk;
	p->dst_path = dst->path;
	p->dstfd = dst->fd;
	clear_previous(p);
	if (mkdirat(dst->fd, ZMF_DATA_DIR, 0755) && errno != EEXIST)
		die("%s/%s: %s", dst->path, ZMF_DATA_DIR, strerror(errno));
	p->datafd = openat(dst->fd, ZMF_DATA_DIR,
			   O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	p->mfd = openat(dst->fd, ZMF_NAME,
			O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
			0644);
	if (p->datafd < 0 || p->mfd < 0)
		die("%s: %s", dst->path, strerror(errno));
	p->frame = malloc(pk->pack_frame);
	p->cctx = ZSTD_createCCtx();
	p->dedup = calloc(1u << DEDUP_BITS, sizeof(*p->dedup));
	if (!p->frame || !p->cctx || !p->dedup)
		die("out of memory");
}

static void packed_close(struct packed *p)
{
	for (int i = 0; i < HARDLINK_BUCKETS; i++)
		while (p->links[i]) {
			struct hardlink *l = p->links[i];

			p->links[i] = l->next;
			free(l);
		}
	close(p->datafd);
	ZSTD_freeCCtx(p->cctx);
	free(p->frame);
	free(p->dedup);
	free(p->lines);
	free(p->holes);
	free(p->zbuf);
	free(p->mframes);
}

void packed_pack(struct packer *pk, const struct place *src,
		 const struct place *dst, const struct stat *sst)
{
	struct packed *p = calloc(1, sizeof(*p));
	char *root_xattrs, *root_path;
	size_t xlen;

	if (!p)
		die("out of memory");
	packed_open(p, pk, dst);
	walk(p, src->fd, src->path, "");
	pack_close(p);
	if (pk->njobs)
		run_batch(pk); /* every data file finished before the manifest */
	/* SRC itself, not a link that names it */
	root_path = join(src->path, ".");
	root_xattrs = xattrs_field(root_path, root_path, &xlen);
	free(root_path);
	manifest_finish(p, sst, dir_nlink(src->fd, "."), root_xattrs, xlen);
	free(root_xattrs);
	packed_close(p);
	free(p);
}
