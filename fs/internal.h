/* SPDX-License-Identifier: MIT */
/*
 * fs internals: shared by the files of the zfolio daemon only.
 *
 * The daemon's pieces: options (mount.c), the dataset and its inodes
 * (dataset.c), backing reads and decoding (backing.c; big frames in
 * stream.c, part reads in part.c), the FUSE ops (ops.c; on files,
 * fileops.c), and the control directory (ctl.c).
 */
#ifndef ZF_FS_INTERNAL_H
#define ZF_FS_INTERNAL_H

#define FUSE_USE_VERSION 34
#include <fuse_lowlevel.h>
#include <liburing.h>
#include <stdatomic.h>
#include <errno.h>
#include <limits.h>
#include <semaphore.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>

#include "../readahead/readahead.h"
#include <urcu/rculfhash.h>
#include "../format/format.h"
#include "../remote/remote.h"

enum cache_mode { CACHE_ENGINE, CACHE_KERNEL };
enum backing_cache { BACKING_DROP, BACKING_KEEP, BACKING_DIRECT };
enum backing_io { BACKING_URING, BACKING_PREAD };
enum transport { TRANSPORT_AUTO, TRANSPORT_URING, TRANSPORT_DEV };
/* "auto" for an OPT_UINT whose default is auto */
#define OPT_UINT_AUTO UINT32_MAX

/* Mount options: declared once in options.c's table. */
struct options {
	char *dataset;
	char *mountpoint;
	uint64_t budget;
	uint64_t high;
	uint64_t group_max;
	uint64_t group_high;
	unsigned int threads;
	unsigned int decode_threads; /* OPT_UINT_AUTO: the cores */
	unsigned int max_open;
	unsigned int ra_kb;
	unsigned int kernel_ra_kb; /* OPT_UINT_AUTO: options_kernel_ra_kb() */
	enum readaround_mode readaround;
	enum cache_mode cache;
	enum backing_cache backing_cache;
	enum backing_io backing_io;
	enum transport transport;
	unsigned int uring_poll_us;
	unsigned int ccache_pct; /* OPT_UINT_AUTO: by where the dataset is */
	enum ra_reclaim_mode ra_reclaim;
	enum group_by group_by;
	bool lockless;
	bool push; /* push a scan's next files (push.c) */
	char *ctl;
	char *dict; /* zstd dictionaries' files, ':' between them, or NULL */
	char *share; /* a limit shared with other mounts by this name, or NULL */
	uint64_t share_max; /* its limit; 0: budget */
	uint64_t max_window; /* the largest window a frame may need */
	/* a dataset in a store (remote.c): NULL is "from the usual places" */
	char *endpoint, *region, *credentials, *profile, *ca;
	unsigned int retries, timeout;
	bool foreground;
	bool debug;
	bool nonempty; /* -o nonempty: the mountpoint may hold entries */
	bool read_only; /* -o ro (the last of ro and rw given wins) */
};

enum opt_type { OPT_SIZE, OPT_SIZE_MAX, OPT_UINT, OPT_BOOL, OPT_ENUM,
		OPT_NAME, OPT_TEXT /* any text; its default ("auto", "none") is NULL */ };

struct opt_desc {
	const char *name;
	enum opt_type type;
	size_t offset;              /* in struct options */
	const char *def;
	const char *help;           /* -h, the man page and the README */
	const char *const *choices; /* OPT_ENUM, OPT_BOOL: index is the value */
	uint64_t min, max;          /* OPT_SIZE, OPT_UINT */
};

/* options.c */
extern const struct opt_desc opt_table[];
extern const size_t nr_opts;
int opt_apply(struct options *o, const struct opt_desc *d, const char *val);
void opt_value_range(const struct opt_desc *d, char *out, size_t len);
void opt_value_hint(const struct opt_desc *d, char *out, size_t len);
void options_defaults(struct options *o);
unsigned int options_kernel_ra_kb(const struct options *o);
unsigned int options_ccache_pct(const struct options *o);
unsigned int options_ra_kb(const struct options *o);
void options_usage(FILE *out, const char *progname);
/* fuse_session_new(), saying an unknown option as zfolio's (progname) */
struct fuse_session *options_session_new(struct fuse_args *args,
					 const struct fuse_lowlevel_ops *ops,
					 size_t size, void *user,
					 const char *progname);

enum znode_kind {
	ZN_DIR,
	ZN_FILE,    /* a regular file, raw or decoded */
	ZN_SYMLINK,
	ZN_SPECIAL, /* device, fifo, socket: served as their type, never opened */
	ZN_CTL_DIR, /* the control directory or a group's subdirectory */
	ZN_CTL_FILE,
};

/* O_DIRECT reads: offsets, lengths and buffers aligned to this */
#define DIO_ALIGN 4096u

/*
 * A decoder going forwards through a big frame (backing.c), with the
 * window it keeps charged to the budget.  A file has a few, so that
 * readers at different places of one frame do not each restart the
 * other's: a read takes the one that has least to decode to reach it.
 */
#define ZFILE_STREAMS 4
struct zstream {
	struct zfile *owner;
	pthread_mutex_t lock; /* held while it decodes */
	struct zseek_stream s;
	bool ready;
	unsigned long pages;       /* charged for its window */
	unsigned long ck_pages;    /* charged for its checkpoints */
	uint64_t need;             /* bytes of its window (and buffers) */
	uint64_t need_off;         /* for the frame there, or UINT64_MAX */
	struct cds_list_head link; /* on the pool's lru while it has one */
	/* under the owner's stream_lock: where it stands, for the choice */
	uint32_t frame;
	uint64_t pos;
	uint64_t from; /* where a reader taking it to pos found it */
	uint64_t used;     /* the owner's stream_clock at its last choice */
	unsigned long win; /* pages, as of its last read */
};

/*
 * A file's backing state at one moment: its fd, its frame index and the
 * folio geometry built from it.  The mapping's host.  A changed backing
 * file gets a new one; handles opened on the old one keep it alive.
 */
struct zfile {
	struct dataset *ds;
	long meta_bytes;       /* what its index takes, charged (meta.c) */
	char *path;            /* the backing path, relative to the root */
	/* the fd, -1 while closed; fd_users and fd_link under ds->fds.lock */
	int fd;
	struct store_obj *obj; /* in a store: its object, and fd is -1 */
	unsigned int fd_users;
	struct cds_list_head fd_link; /* on ds->fds.lru while idle */
	atomic_bool dontcache; /* backing reads with RWF_DONTCACHE */
	/* frames read with O_DIRECT (at DIO_ALIGN) through dfd, -1 while
	 * closed, until the filesystem refuses it; opened, closed with fd */
	atomic_bool direct;
	int dfd;
	struct zseek_index idx;
	bool decode;
	/* a frame's header gave a size other than its seek table's: every
	 * offset past it is wrong, so the whole file reads as EIO */
	atomic_bool table_lies;
	struct stat st; /* the backing file when it was indexed */
	atomic_bool said_changed; /* its change since then is in the log */
	/* folio i: frame slot_frame[i], at slot_skip[i] into that frame */
	unsigned long nslots;
	uint64_t *starts;      /* nslots + 1 content offsets */
	uint32_t *slot_frame;  /* NULL: folio i is frame i */
	uint64_t *slot_skip;
	uint32_t folio_size;   /* fixed size of every folio but the last, or 0 */
	/* per folio: ds->fill_clock + 1 when last read in part, or 0 */
	_Atomic uint32_t *parts;
	/* per folio of a frame of raw blocks read in part before: where its
	 * first block's bytes start in the frame (the frame and block headers
	 * were checked then), or 0: not known */
	_Atomic uint8_t *raw_at;
	/* decoders of split frames, one per reader going forwards */
	pthread_mutex_t stream_lock; /* the choice of one, their places */
	struct zstream streams[ZFILE_STREAMS];
	uint64_t stream_clock;
	struct stream_pool *pool;   /* the dataset's live streams */
	/* split frames found damaged, a bit per frame (NULL until one is):
	 * their pieces were served before the end was checked, and are not
	 * served again (zfile_range_refused) */
	_Atomic uint8_t *_Atomic failed;
	struct mapping *mapping;
	/* content in frames of zeros, by the table (holes.c), and the first
	 * such frame's bytes once one was read */
	uint64_t zero_bytes;
	struct zero_sig *_Atomic zero_sig;
};

/*
 * An inode.  Backing inodes live in the dataset's lock-free table (inode.c)
 * while the kernel holds lookups on them; control inodes live as long as
 * the mount.
 */
struct znode {
	uint64_t nodeid;
	atomic_ulong nlookup; /* the kernel's lookups; 0: being forgotten */
	enum znode_kind kind;
	bool decode;    /* files: a .zst served decoded */
	dev_t dev;
	ino_t ino;
	struct cds_lfht_node hnode; /* in ds->inodes, keyed by (dev, ino, decode) */
	struct rcu_head rcu;        /* freed a grace period after its forget */
	char *path;     /* backing path relative to the dataset root */
	/* files */
	pthread_mutex_t lock;
	struct zfile *file; /* current, indexed at the first getattr or open */
	/* file was replaced (the backing changed): the kernel's page cache of
	 * this inode holds the old bytes, dropped at the next open */
	atomic_bool file_changed;
	int bad_err;        /* the index failed: this, while unchanged */
	struct stat bad_st; /* the backing file it failed on */
	uint64_t size;      /* decoded size, while size_st is the backing */
	struct stat size_st;
	/* control files */
	struct group *group;
	int ctl_id;
	/* with kernel_opens: the text reads get, made at each lookup */
	char *ctl_text;
	size_t ctl_len;
	struct timespec ctl_time; /* when it was made: its mtime */
	struct znode *ctl_next; /* on ds->ctl_nodes */
	struct cds_list_head file_lru; /* on ds->file_lru while file is set */
};

struct zhandle {
	struct znode *node;         /* NULL for a manifest inode */
	struct zfile *file;         /* holds a mapping reference; NULL: empty */
	uint64_t base, size;        /* the file's bytes in file's content */
	struct file_ra_state ra;
	struct file_ra_state *pack_ra; /* a packed file's: its pack's */
};

/*
 * The streams with a decoder window, least recently used first: a window
 * that the budget cannot hold is made room for by freeing idle ones.
 */
struct stream_pool {
	pthread_mutex_t lock;
	struct cds_list_head lru;
};

/* Backing fds, bounded: see fdcache.c. */
struct fd_cache {
	pthread_mutex_t lock;
	struct cds_list_head lru; /* idle fds, least recently used first */
	unsigned int open, max;
};

struct manifest;

struct dataset {
	struct options *opt;
	struct manifest *mf;     /* the dataset's manifest, or NULL */
	struct store *store;     /* in a store (remote.c), or NULL */
	atomic_long meta_bytes;  /* metadata charged (meta.c) */
	atomic_uint fill_clock;  /* folios filled from backing, ever */
	atomic_long meta_pages;
	struct stream_pool streams;
	struct fd_cache fds;
	int rootfd;              /* the dataset directory, or the file's dir */
	char *single;            /* when mounting one file: its backing name */
	struct stat root_st;
	struct cache cache;
	struct znode *root;
	struct cds_lfht *inodes; /* backing inodes, see inode.c */
	struct znode *ctl_root;
	bool ctl_hides;          /* the dataset's root has a ctl= entry */
	pthread_mutex_t ctl_lock;
	struct znode *ctl_nodes; /* every control node, by ctl_next */
	uid_t owner;
	struct fuse_session *se;
	double attr_timeout;
	/* the kernel opens files itself: no OPEN or RELEASE (ops.c); set
	 * once, at INIT, before any other request */
	atomic_bool kernel_opens;
	struct pusher *push; /* a scan's next files (push.c), or NULL */
	pthread_mutex_t handles_lock;
	struct cds_list_head handles; /* open handles, see ops.c */
	/* a tree's inodes with an index, oldest use first (inode.c) */
	pthread_mutex_t file_lru_lock;
	struct cds_list_head file_lru;
	/* the files of forgotten inodes kept with their cached data, for
	 * the next lookup of the same backing inode, oldest first (inode.c);
	 * under file_lru_lock */
	struct cds_list_head idle_files;
	unsigned int nidle;
	/* what df shows, counted once (usage.c) */
	pthread_mutex_t usage_lock;
	bool usage_known;
	uint64_t usage_bytes, usage_entries;
};

/* ring.c: a worker's io_uring for backing reads */
struct ring_read {
	uint64_t off, len;
	uint8_t *dst;
	int res;       /* bytes read, or -errno */
	bool done;
	bool orphaned; /* failed with the ring: the kernel may still write dst */
	struct cds_list_head link; /* on ring->reads while queued */
};

struct ring {
	struct io_uring uring;
	bool ok;       /* usable */
	bool broken;   /* was set up, then failed: reads use pread */
	unsigned int inflight;   /* queued or submitted, not reaped */
	unsigned int cq_entries; /* the most that may be in flight */
	struct cds_list_head reads; /* what is in flight */
};
int ring_init(struct ring *r, unsigned int depth);
void ring_exit(struct ring *r);
int ring_queue(struct ring *r, int fd, struct ring_read *rr, int rw_flags);
int ring_submit(struct ring *r);
int ring_reap(struct ring *r);
int ring_wait(struct ring *r, struct ring_read *rr);

/*
 * A kernel-tier fill whose reply this worker has made but the kernel may
 * not have taken yet (over io_uring it goes with the next submission):
 * its end is told to the tier once it has (worker_reply_out()).
 */
struct tier_fill {
	struct cache *cache; /* NULL: none due */
	uint64_t id, pos;
	size_t len;
};

/* The worker that serves the current request: one per thread. */
struct worker {
	int id;
	ZSTD_DCtx *dctx;
	struct ring ring; /* backing reads of this worker's windows */
	struct ra_request rq;
	struct tier_fill fill_due;
	/* a read from a store: the request, while it is being served, and
	 * whether the reader interrupted it (fileops.c) */
	_Atomic(fuse_req_t) watched;
	atomic_bool interrupted;
};
extern __thread struct worker *current_worker;
struct worker *worker_create(int id, bool ring);
void worker_destroy(struct worker *w);
/* The kernel has this thread's last reply: end its fill, if one is due. */
void worker_reply_out(void);

/* dataset.c: the backing tree */
int dataset_open(struct dataset *ds, struct options *opt, char *err,
		 size_t errlen);
void dataset_close(struct dataset *ds);
struct znode *dataset_lookup(struct dataset *ds, struct znode *parent,
			     const char *name, struct stat *st, int *err);
int dataset_open_backing(struct dataset *ds, const char *path, int flags);
int backing_lstat(struct dataset *ds, const char *path, struct stat *st);
/* The same backing file, unchanged: inode, device, size and mtime. */
bool same_backing(const struct stat *a, const struct stat *b);
struct dir_entry {
	char *name;  /* served name */
	mode_t type;
	ino_t ino;
	bool decode; /* a .zst served decoded, as name without ".zst" */
};
int dataset_list(struct dataset *ds, struct znode *dir,
		 struct dir_entry **out, size_t *n);
void dataset_list_free(struct dir_entry *e, size_t n);
int dataset_readlink(struct dataset *ds, struct znode *n, char *buf,
		     size_t len);

/* mfread.c and manifest.c: a dataset served from its manifest */
/* A frame's first key, unescaped: parent then name. */
struct mf_key {
	size_t plen, nlen;
	char s[]; /* plen bytes of parent, nlen of name */
};

/* One data file's state: opened when one of its files is. */
struct mf_data {
	pthread_mutex_t lock;
	struct zfile *f;
	/* a pack's readahead, shared by the reads of its small files (made
	 * at the first; reads of one file after another are sequential in
	 * it, as mkzfolio packs them in the manifest's order) */
	struct file_ra_state *ra;
	struct cds_list_head lru; /* on mf->lru while f is set */
};

struct manifest {
	struct zfile *zf;        /* manifest.zst */
	uint64_t nentries;
	uint32_t nframes;        /* the entries', then the header's */
	uint32_t ndata;
	uint64_t bytes;          /* content served, for statfs */
	struct stat root;        /* the root's attributes */
	bool xattrs;             /* entries may have extended attributes */
	char *root_xattrs;       /* the root's, as the header has them */
	size_t root_xlen;
	struct mf_key *_Atomic *keys; /* per frame, NULL until read */
	struct mf_data *data;
	/* the header's holes=: data file ids, ascending, and their bytes in
	 * frames of zeros */
	uint64_t *hole_ids, *hole_bytes;
	size_t nholes;
	pthread_mutex_t lru_lock;
	struct cds_list_head lru;     /* open data files, oldest use first */
};

/* What a frame callback gets: one frame's text, pinned while it runs. */
typedef int (*mf_frame_fn)(const char *p, size_t len, void *arg);


/* An entry, parsed: what the ops need. */
struct mf_entry {
	uint64_t index;
	struct stat st;
	uint64_t data_id, data_off; /* regular files with data */
	bool has_data;
	char name[NAME_MAX + 1];
	char target[PATH_MAX];      /* symlinks */
	char parent[PATH_MAX];      /* the directory's path */
	size_t plen, nlen;
};

int mf_frame(struct dataset *ds, uint32_t frame, mf_frame_fn fn, void *arg);
bool nth_line(const char *p, size_t len, unsigned int k, const char **line,
	      size_t *n);
int parse_entry(const char *line, size_t len, struct mf_entry *e);
int parse_parent(const char *line, size_t len, struct mf_entry *e);
/* What a line callback gets: one entry's line, pinned while it runs. */
typedef int (*mf_line_fn)(const char *line, size_t n, void *arg);
int mf_line_at(struct dataset *ds, uint64_t i, mf_line_fn fn, void *arg);
int mf_entry_at(struct dataset *ds, uint64_t i, struct mf_entry *e);
/* A big file's st_blocks without its frames of zeros (holes.c), as a file
 * system leaves its holes out */
void mf_entry_blocks(struct dataset *ds, struct mf_entry *e);
/* The bytes of data file id in frames of zeros, by the header's holes= */
uint64_t manifest_holes(const struct manifest *mf, uint64_t id);
int mf_entry_placed(const struct mf_entry *e, uint64_t i);
int mf_seek(struct dataset *ds, const char *parent, size_t plen,
	    const char *name, size_t nlen, uint64_t *index, bool *exact);

int manifest_open(struct dataset *ds, char *err, size_t errlen);
void manifest_close(struct dataset *ds);
bool manifest_ino(const struct dataset *ds, fuse_ino_t ino);
int manifest_stat(struct dataset *ds, fuse_ino_t ino, struct stat *st);
int manifest_lookup(struct dataset *ds, fuse_ino_t parent, const char *name,
		    struct stat *st);
/* Extended attributes: name's value into buf (size bytes; 0 asks only
 * its length), or the names, each ending in NUL: the length, or -errno
 * (-ENODATA: no such attribute; -ERANGE: more than size). */
ssize_t manifest_getxattr(struct dataset *ds, fuse_ino_t ino,
			  const char *name, char *buf, size_t size);
ssize_t manifest_listxattr(struct dataset *ds, fuse_ino_t ino, char *buf,
			   size_t size);
int manifest_readlink(struct dataset *ds, fuse_ino_t ino, char *buf,
		      size_t len);
/* A directory of the manifest, open: its path and where its entries start. */
struct mf_dir {
	char *path; /* "" for the root */
	size_t plen;
	uint64_t first;
};
int manifest_opendir(struct dataset *ds, fuse_ino_t ino, struct mf_dir *d);
void manifest_closedir(struct mf_dir *d);
/* An entry of a directory, its k-th: nonzero stops the walk. */
typedef int (*mf_dirent_fn)(void *arg, const struct mf_entry *e, uint64_t k);
int manifest_readdir(struct dataset *ds, const struct mf_dir *d, uint64_t k,
		     mf_dirent_fn fn, void *arg);
/* Logs (once) that the dataset on disk is no longer the one mounted. */
void manifest_say_changed(struct dataset *ds, const char *path);
int manifest_open_file(struct dataset *ds, fuse_ino_t ino, struct zfile **f,
		       uint64_t *base, uint64_t *size,
		       struct file_ra_state **pack_ra);
void manifest_usage(struct dataset *ds, uint64_t *bytes, uint64_t *entries);
/* A file packed after another in the same frame (manifest_neighbours). */
struct mf_neighbour {
	fuse_ino_t ino;
	uint64_t data_off, size;
};
unsigned int manifest_neighbours(struct dataset *ds, fuse_ino_t ino,
				 uint64_t lo, uint64_t hi,
				 struct mf_neighbour *out, unsigned int max);

/* push.c: a scan's next files into the kernel page cache */
/* Entries a scan may skip between two files read (directories, links,
 * files it does not read). */
#define PUSH_GAP 256
/* Scans followed at once (directory depth a walk comes back through). */
#define PUSH_CURSORS 8
/*
 * A scan.  Relaxed atomics, all: a stale value costs a push done twice
 * (the tier check passes over its files) or one not done.  at: the inode
 * after the last one read or pushed, where the scan goes on (0: free);
 * [planned_lo, planned_hi): the inodes its queued or running push covers
 * (a guess of PUSH_GAP until the thread knows).
 */
struct scan {
	atomic_ulong at, planned_lo, planned_hi;
};
/* The scans a pusher follows.  A walk that goes down into a directory and
 * back out is two: the manifest holds a directory's files before its
 * subdirectories'.  A read that is no scan's takes the oldest. */
struct push_scans {
	struct scan s[PUSH_CURSORS];
	atomic_uint victim;
};
bool push_scan_step(struct push_scans *sc, fuse_ino_t ino, struct scan **s);
int push_start(struct dataset *ds);
void push_stop(struct dataset *ds);
void push_free(struct dataset *ds);
void push_on_read(struct dataset *ds, unsigned int uid, int pid,
		  fuse_ino_t ino, struct zfile *f,
		  struct file_ra_state *pack_ra, uint64_t base, uint64_t size,
		  uint64_t off);

/* meta.c: metadata charged to the budget, by the byte */
void meta_charge(struct dataset *ds, long bytes);
long zfile_meta_bytes(const struct zfile *f);
/* manifest.c: give back idle data files' indexes, oldest first */
void manifest_shrink(struct dataset *ds, long target_bytes);
/* inode.c: the same for a tree's inodes */
void inodes_shrink(struct dataset *ds, long target_bytes);

/* fdcache.c: backing fds, bounded */
void fd_cache_init(struct fd_cache *c, unsigned int max_open);
int zfile_fd_get(struct zfile *f);
void zfile_fd_put(struct zfile *f);
void zfile_fd_add(struct zfile *f);
void zfile_fd_release(struct zfile *f);

/* usage.c: what df shows, and the decoded size of one file */
int dataset_usage(struct dataset *ds, uint64_t *bytes, uint64_t *entries);
int backing_decoded_size(struct dataset *ds, const char *path,
			 const struct stat *st, uint64_t *size);

/* inode.c: the inode table and each file's backing state */
int inodes_init(struct dataset *ds);
void inodes_fini(struct dataset *ds);
struct znode *inode_get(struct dataset *ds, const struct stat *st,
			bool decode, const char *path);
struct znode *znode_of(struct dataset *ds, fuse_ino_t ino);
struct znode *znode_new(enum znode_kind kind, const char *path);
void znode_free(struct znode *n);
void znode_forget(struct dataset *ds, struct znode *n, uint64_t nlookup);
int znode_stat(struct dataset *ds, struct znode *n, struct stat *st);
/* znode_stat() of a node of the backing tree whose lstat st is */
void znode_stat_from(struct dataset *ds, struct znode *n, struct stat *st);
int znode_file(struct dataset *ds, struct znode *n, bool reopen,
	       struct zfile **out);
void zfile_put(struct zfile *f);
int zfile_create(struct dataset *ds, int fd, struct store_obj *obj,
		 bool decode, const char *path, struct zfile **out);
int zfile_open_path(struct dataset *ds, const char *path, struct zfile **out,
		    char *err, size_t errlen);
/* zseek's read callback for a zfile (ctx), local or in a store */
ssize_t zfile_read_cb(void *ctx, void *buf, size_t len, uint64_t off);
struct znode *znode_ctl(struct dataset *ds, struct group *g, int ctl_id,
			enum znode_kind kind);

/* remote.c: a dataset in a store */
int remote_open(struct dataset *ds, char *err, size_t errlen);
void remote_close(struct dataset *ds);
void remote_cancel(struct dataset *ds);
struct store_client *remote_client(void);
void remote_thread_done(void);
int remote_obj_open(struct dataset *ds, const char *path,
		    struct store_obj **out, char *err, size_t errlen);
ssize_t remote_pread(struct zfile *f, void *buf, size_t len, uint64_t off);
void remote_log(struct zfile *f, long err);
/* the store control file: the dataset's address and its counters */
int remote_describe(char *buf, size_t len);

#ifndef RWF_DONTCACHE
#define RWF_DONTCACHE 0x00000080 /* Linux 6.14: read, then drop the pages */
#endif

/* backing.c: a dataset file's mapping operations, its backing reads */
extern const struct mapping_ops zfile_mapping_ops;
/* geometry.c: f's folios laid over its frames (0 or -ENOMEM) */
int zfile_build_geometry(struct zfile *f);
/* the frame of folio slot i, and whether it is a piece of a big frame */
uint32_t zfile_slot_frame(const struct zfile *f, unsigned long i);
bool zfile_slot_split(const struct zfile *f, unsigned long i);
/* len bytes at off of f's backing file (uncached where it can): the bytes
 * read (fewer only at its end), or -errno */
ssize_t backing_pread(struct zfile *f, void *buf, size_t len, uint64_t off);
/* a ring read that completed, made final (see backing.c) */
void backing_read_complete(struct zfile *f, struct ring_read *r,
			   bool *dontcache);
/* the ring of a worker (io_ctx), or NULL: reads by pread */
struct ring *worker_ring(void *io_ctx);
/* buffers (and runs) the kernel may still write: kept, never freed */
void backing_keep_orphaned(void *buf, void *runs);

/* stream.c: big frames decoded in pieces, and frames that fail */
/* content of slot (a piece of a big frame) into dst, for g's fill (NULL:
 * a bounce read, which keeps nothing) */
int zfile_read_split(struct zfile *f, unsigned long slot, void *dst,
		     size_t len, struct group *g);
void zfile_streams_release(struct zfile *f);
unsigned long stream_pool_shrink(void *arg, unsigned long nr);
/* r, a frame's fill result, said in the log if the frame is damaged */
int zfile_said_if_corrupt(struct zfile *f, unsigned long slot, int r);
/* Reads of [pos, pos + len) fail: its table lies, or a frame failed */
bool zfile_range_refused(struct zfile *f, uint64_t pos, uint64_t len);
/* ... and before such a read is answered: the kernel tier dropped */
void zfile_refused(struct zfile *f);
/* Whether any read of f is refused so (a frame failed, or its table) */
bool zfile_has_failed(struct zfile *f);

/* holes.c: frames of zeros, as holes */
void zfile_count_zeros(struct zfile *f);
void zfile_zero_sig_free(struct zfile *f);
/* SEEK_DATA or SEEK_HOLE from off in [base, base + size) of f's content
 * (f NULL: empty): the place into *out relative to base, or -ENXIO */
int zfile_seek(struct zfile *f, uint64_t base, uint64_t size, uint64_t off,
	       int whence, uint64_t *out);

/* part.c: a small read of a folio not cached, from its raw bytes alone */
int zfile_read_part(struct mapping *m, void *io_ctx, unsigned long index,
		    uint32_t off, uint32_t len, void *buf);

/* faults.c: the test hook ZFOLIO_TEST_FAULT */
void backing_faults_from_env(void);
long fault_apply(long res, uint64_t len);
long fault_direct(long res);
int fault_uring_submit(void);
int fault_uring_wait(void);
bool fault_uring_register(void);
void fault_hold_fill(struct fuse_session *se, fuse_ino_t ino, off_t off,
		     size_t len);

/* ctl.c: the control files, declared once in ctl_files[] */
#define CTL_DIR_ID (-1)
struct ctl_file {
	const char *name;
	mode_t mode;
	int (*read)(struct group *g, char *buf, size_t len);
	int (*write)(struct group *g, const char *s);
	const char *help; /* the man page's text */
};
extern const struct ctl_file ctl_files[];
extern const int nr_ctl_files;
int ctl_lookup(struct dataset *ds, struct znode *dir, const char *name,
	       struct znode **out);
int ctl_list(struct dataset *ds, struct znode *dir, struct dir_entry **out,
	     size_t *n);
void ctl_stat(struct dataset *ds, struct znode *n, struct stat *st);
int ctl_read(struct dataset *ds, struct znode *n, char **buf, size_t *len);
void ctl_text_new(struct dataset *ds, struct znode *n);
int ctl_text_read(struct dataset *ds, struct znode *n, uint64_t off,
		  size_t size, char **copy, size_t *len);
int ctl_write(struct dataset *ds, struct znode *n, const char *buf,
	      size_t len);
/* Control directory dir's file name written with value (ZF_IOC_CTL_WRITE). */
int ctl_write_named(struct dataset *ds, struct znode *dir, const char *name,
		    const char *value);

/* log.c: why a file reads as EIO, once per file and reason */
enum zlog_to { ZLOG_STDERR, ZLOG_SYSLOG, ZLOG_NONE };
void zlog_init(enum zlog_to to);
void zlog_file(const char *what, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Say what the rate limit held back, as far as it allows now (all of it:
 * stop). */
void zlog_tick(bool stop);

/* watchdog.c: aborts the connection of a daemon that died stuck */
struct watchdog {
	pid_t pid;               /* -1: none */
	int fd;                  /* the pipe to it */
	char dev[32];            /* the mount's MAJOR:MINOR */
	char mountpoint[PATH_MAX];
};
/* Fork it, once mounted and before the serving threads: 0, or -errno. */
int watchdog_start(struct watchdog *wd, const char *mountpoint,
		   bool foreground);
/* The daemon stops as it should: the watchdog leaves. */
void watchdog_stop(struct watchdog *wd);
/* The mount at path in /proc/self/mountinfo: its type and source, and
 * its device as MAJOR:MINOR (dev: NULL or 32 bytes). */
bool mount_find(const char *path, char *type, char *source, size_t len,
		char *dev);

/* Wait up to ms for s: 0, or -ETIMEDOUT, -EINTR. */
static inline int sem_wait_ms(sem_t *s, long ms)
{
	struct timespec until = deadline_after_us(CLOCK_REALTIME, ms * 1000);

	return sem_timedwait(s, &until) ? -errno : 0;
}

/* initio.c: INIT's extra flags, and where replies go */
int initio_install(struct fuse_session *se, bool allow_mmap, bool uring);
int initio_wait(long ms);

/* furing.c: FUSE requests over io_uring, one entry per worker thread */
struct furing_ent;
unsigned int furing_queues(void);
void furing_set_payload(size_t max_write, unsigned int max_pages);
void furing_set_poll(unsigned int us);
int furing_ent_new(struct fuse_session *se, unsigned int qid, bool refuse,
		   struct furing_ent **out);
int furing_ent_next(struct furing_ent *e, int timeout_ms);
void furing_ent_process(struct furing_ent *e);
ssize_t furing_reply(const struct iovec *iov, int count);
void furing_ent_free(struct furing_ent *e);
void furing_set_state(bool serving, unsigned int queues,
		      unsigned int entries);
int furing_describe(char *buf, size_t len);

/* ops.c */
extern const struct fuse_lowlevel_ops zfolio_ops;
void handles_free_all(struct dataset *ds);

#endif
