/* SPDX-License-Identifier: MIT */
/*
 * mkzfolio internals: shared by the files of mkzfolio only.
 *
 * pool.c: the compression pool and the ordered writer of output files
 * (struct outfile: a seekable .zst being written, frame by frame),
 * messages, progress, and listing source directories.  tree.c: the tree
 * layout (each file f as f.zst in a copy of the tree).  packed.c: the
 * packed layout (a manifest, big files in data files of their own, small
 * files packed together).  xattrs.c: extended attributes.  upload.c: a
 * dataset written to a store.
 */
#ifndef ZF_MKZFOLIO_H
#define ZF_MKZFOLIO_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#include "../common/common.h"
#include "../format/format.h"

/*
 * Frame sizes by default (README, "Frame size"): a big file's frames are
 * small, as a cold random read decodes one; small files are packed in
 * bigger frames, as they are read whole and their neighbours compress
 * them better (the Linux tree: 12% smaller than in 32K frames).
 */
#define MKZ_FRAME (32u << 10)
#define MKZ_SMALL (128u << 10)

#define BATCH_PER_THREAD 4
#define MAX_THREADS 1024

/* A seekable .zst being written: frames in order, then its seek table. */
struct outfile {
	int fd;
	char *path;
	struct stat st;          /* the source's, kept if keep_meta */
	bool keep_meta;
	uint32_t nframes, queued, written;
	bool all_queued;
	struct zseek_writer_entry *entries;
	uint32_t cap;            /* entries' room */
	uint64_t out_bytes;
	/* reading the source: where, and what lseek() said is ahead */
	off_t read_off;
	off_t hole_end;          /* [read_off, hole_end) is a hole */
	off_t data_end;          /* [read_off, data_end) holds data */
};

/* One frame to compress: content in src, the frame out in dst. */
struct job {
	struct outfile *of;
	uint8_t *src, *dst;
	size_t len, cap, csize;
	uint32_t checksum;
	bool done;               /* dst, csize and checksum set when queued */
};

enum layout { LAYOUT_PACKED, LAYOUT_TREE };

struct packer {
	int level;
	size_t frame;            /* content per frame of a big file */
	size_t pack_frame;       /* of a pack: max(frame, small) */
	unsigned int threads;
	bool root, progress;
	enum layout layout;
	uint64_t small;          /* packed: files up to this size are packed */
	/* the batch */
	struct job *jobs;
	unsigned int njobs, max_jobs;
	uint8_t *in_arena, *out_arena;
	size_t out_cap;
	/* a frame of zeros, compressed once: a hole's frames are all it */
	uint8_t *zero_frame;
	size_t zero_csize;
	uint32_t zero_checksum;
	/* the pool */
	pthread_t *tids;
	pthread_mutex_t lock;
	pthread_cond_t work, done;
	/* under lock: the batch's jobs (njobs is the main thread's own, and
	 * grows while the pool waits), the next to take, those done */
	unsigned int batch_jobs, next, finished, generation;
	bool stop;
	int error;
	/* totals */
	uint64_t total_in, done_in, bytes_out, total_files, done_files;
	unsigned long files, dirs, links, others, hardlinks, deduped;
	struct timespec t0, last_draw;
	/* tree layout: directories whose times are set last, deepest first,
	 * by their paths in DST (whose own path is dst_len bytes) */
	size_t dst_len;
	char **dirpaths;
	struct stat *dirstats;
	size_t ndirs, dircap;
};

/* A directory being walked: its fd, and its path for messages. */
struct place {
	int fd;
	const char *path;
};

/* One name in a source directory, with both of its paths. */
struct entry {
	const char *name;
	struct stat st;
	char *spath, *dpath;
};

extern const char *progname;

/* upload.c: a dataset written to a store */
struct store_options;
void upload_check(const char *url, const struct store_options *o, bool force);
void upload_dataset(const char *dir, const char *url,
		    const struct store_options *o, bool quiet);

/* pool.c */
/* run by die() before it exits */
extern void (*die_hook)(void);
void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
char *join(const char *dir, const char *name);
double now_s(const struct timespec *t0);
void draw_progress(struct packer *pk, bool final);
void write_all(int fd, const void *buf, size_t len, const char *path);
/* Hard links: the bucket of a file's (device, inode) in a table of n. */
unsigned long inode_bucket(const struct stat *st, unsigned long n);
void read_all(int fd, void *buf, size_t len, off_t off, const char *path);
void check_unchanged(int fd, const struct stat *st, const char *path);
void check_unchanged_at(int dirfd, const char *name, const struct stat *st,
			const char *path);
/* how many files changed while being read (read_all, check_unchanged) */
unsigned int files_changed(void);
/*
 * A file that cannot be read, and is skipped: err ENOENT (gone between its
 * listing and its reading: counted as changed), EACCES/EPERM, or
 * ENAMETOOLONG (a directory too deep for the daemon to list: counted as
 * unreadable), said with what was done instead (done).  Any other error
 * dies.
 */
void skip_unreadable(int err, const char *path, const char *done);
/* how many files skip_unreadable() counted as unreadable */
unsigned int files_unreadable(void);

/* xattrs.c */
/* the most a packed entry's extended attributes take in the manifest,
 * escaped (Linux allows 64 KiB for a value) */
#define XATTRS_MAX (64u << 10)
/* Counts an entry with extended attributes, for the tree layout, which
 * does not keep them; say_xattrs() says how many. */
void note_xattrs(const char *path);
/*
 * The extended attributes of path as the manifest's xattrs field
 * (format/manifest.c), malloc'd, *len bytes; NULL with *len 0 if it has
 * none (an SELinux label is the mount's to give, and left out).  Ones that
 * cannot be read, or would take more than XATTRS_MAX, are left out, all
 * of the entry's, and said by say_xattrs() as said (the entry's path, when
 * path is another way to it).
 */
char *xattrs_field(const char *path, const char *said, size_t *len);
void say_xattrs(void);
int set_times(int dirfd, const char *name, const struct stat *st, int flags);
struct outfile *outfile_create(int dirfd, const char *name, const char *path,
			       uint32_t nframes);
void outfile_seal(struct packer *pk, struct outfile *of);
/* The source of of's frames, as fstatat gave it: whether to look for
 * holes in it. */
void outfile_source(struct outfile *of, const struct stat *st);
void finish_file(struct packer *pk, struct outfile *of);
void run_batch(struct packer *pk);
bool queue_frame(struct packer *pk, struct outfile *of, int fd, size_t len,
		 const char *spath);
void queue_buffer(struct packer *pk, struct outfile *of, const void *buf,
		  size_t len);
char **list_dir(int fd, size_t *n, const char *path);
/* What tree_count() adds up under a directory, and whether it checks the
 * names for the tree layout. */
struct count {
	uint64_t *bytes, *files;
	bool tree;
	size_t root_len; /* of the top path: the rest is the path in the tree */
};
void tree_count(int fd, const char *path, const struct count *c);
void packer_setup(struct packer *pk, bool quiet);
void pool_start(struct packer *pk);
void pool_stop(struct packer *pk);
void packer_free(struct packer *pk);

/* tree.c */
void tree_pack(struct packer *pk, const struct place *src,
	       const struct place *dst);
void tree_restore_dirs(struct packer *pk, const struct place *dst);

/* packed.c */
void packed_pack(struct packer *pk, const struct place *src,
		 const struct place *dst, const struct stat *sst);

#endif
