/* SPDX-License-Identifier: MIT */
/*
 * format: the dataset format as a library, the API of format/.  No FUSE, no
 * engine: the daemon and the tools both build on it.
 *
 * zseek_*: the zstd seekable format (read and write), the frame-header walk
 * for foreign multi-frame files, and decoding one frame with verification.
 * The parsers read through a callback so that they run the same on a file,
 * in a test, or under a fuzzer.  Every field read from a file is untrusted:
 * counts and sizes are bounded by the file size and the named limits below
 * before anything is allocated.
 */
#ifndef ZF_FORMAT_H
#define ZF_FORMAT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#define ZSTD_STATIC_LINKING_ONLY /* frame headers, block sizes */
#include <zstd.h>

#define ZSEEK_SKIPPABLE_MAGIC 0x184D2A5Eu   /* the seek table's frame */
#define ZSEEK_SKIPPABLE_MASK 0xFFFFFFF0u
#define ZSEEK_SKIPPABLE_START 0x184D2A50u
#define ZSEEK_FOOTER_MAGIC 0x8F92EAB1u
#define ZSEEK_FOOTER_SIZE 9
#define ZSEEK_ZSTD_MAGIC 0xFD2FB528u
/* ZSTD_SEEKABLE_MAXFRAMES of the reference implementation */
#define ZSEEK_MAX_FRAMES 0x8000000u
/* ZSTD_SEEKABLE_MAX_FRAME_DECOMPRESSED_SIZE: 1 GiB */
#define ZSEEK_MAX_FRAME_CONTENT (1u << 30)
/* Largest content a file may claim (a sanity bound, 2^50 bytes) */
#define ZSEEK_MAX_CONTENT (1ull << 50)
/* Frames bigger than this are served in sub-folios, streamed from their
 * start; so are frames whose content size is not in their header. */
#define ZSEEK_SPLIT_ABOVE (4u << 20)
#define ZSEEK_SUBFOLIO (1u << 20)
/* Largest window a frame may need, by default: what the zstd CLI decodes
 * without --long or --memory (ZSTD_WINDOWLOG_LIMIT_DEFAULT, 128 MiB); at
 * most what `zstd --long=31` writes.  zseek_set_window_max() sets it for
 * the process.  A streamed frame's window is charged to the budget while
 * it streams. */
#define ZSEEK_DEFAULT_WINDOW (1ull << 27)
#define ZSEEK_LARGEST_WINDOW (1ull << 31)
/* The smallest frame that holds content: magic, two header bytes, and a
 * block of a 3-byte header and one byte (zseek_max_content). */
#define ZSEEK_MIN_FRAME_BYTES 10
/* Smallest and largest frame size mkzfolio writes */
#define ZSEEK_MIN_FRAME (4u << 10)
#define ZSEEK_MAX_FRAME (16u << 20)
/* A plain file's folio, and the I/O size files report (st_blksize); what
 * mkzfolio writes by default is in tools/mkzfolio.h */
#define ZSEEK_DEFAULT_FRAME (128u << 10)

enum zseek_kind {
	ZSEEK_RAW,      /* not zstd: served as it is */
	ZSEEK_SEEKABLE, /* frames indexed by a seek table */
	ZSEEK_WALKED,   /* frames indexed by walking their headers */
};

struct zseek_frame {
	uint64_t c_off;  /* where the frame starts in the file */
	uint64_t d_off;  /* where its content starts */
	uint64_t c_size; /* compressed bytes */
	uint64_t d_size; /* content bytes */
	uint32_t checksum;
	bool sized;      /* content size came from a table or header */
	bool checked;    /* its header asks for zstd's own content checksum */
};

/*
 * An index holds its frames in one of two forms.  It is built wide (frames,
 * 40 bytes a frame), then packed where the frames allow (17 bytes a frame):
 * per group of ZSEEK_GROUP frames, where its first frame and its content
 * start; per frame, 32-bit offsets from those, its compressed size and its
 * checksum; a frame's content size is the distance to the next frame's
 * content.  A compressed frame of 4 GiB or more, or a group spanning that
 * much, keeps the index wide (a foreign file written as one big frame).
 * Read a frame with zseek_frame_at(), whichever the form.
 */
#define ZSEEK_GROUP_SHIFT 4
#define ZSEEK_GROUP (1u << ZSEEK_GROUP_SHIFT)

struct zseek_group {
	uint64_t c_off, d_off; /* of the group's first frame */
};

struct zseek_packed {
	uint32_t c_rel, d_rel; /* from the group's first frame */
	uint32_t c_size, checksum;
};

struct zseek_index {
	enum zseek_kind kind;
	bool has_checksum;    /* the seek table's, checked by the reader */
	uint32_t frames_checked; /* frames that carry zstd's own (walked) */
	uint64_t file_size;
	uint64_t content_size;
	uint32_t nframes;
	uint32_t nunsized; /* frames whose size needed a full decode */
	struct zseek_frame *frames; /* the wide form, or NULL */
	struct zseek_group *groups; /* the packed form */
	struct zseek_packed *packed;
};

static inline uint64_t zseek_frame_d_off(const struct zseek_index *idx,
					 uint32_t i)
{
	if (idx->frames)
		return idx->frames[i].d_off;
	return idx->groups[i >> ZSEEK_GROUP_SHIFT].d_off + idx->packed[i].d_rel;
}

/* Frame i of idx (i < nframes). */
static inline struct zseek_frame zseek_frame_at(const struct zseek_index *idx,
						uint32_t i)
{
	const struct zseek_packed *p;
	struct zseek_frame fr;

	if (idx->frames)
		return idx->frames[i];
	p = &idx->packed[i];
	fr.c_off = idx->groups[i >> ZSEEK_GROUP_SHIFT].c_off + p->c_rel;
	fr.d_off = zseek_frame_d_off(idx, i);
	fr.c_size = p->c_size;
	fr.d_size = (i + 1 < idx->nframes ? zseek_frame_d_off(idx, i + 1)
					  : idx->content_size) -
		    fr.d_off;
	fr.checksum = p->checksum;
	fr.sized = true;
	return fr;
}

/* Reads len bytes at off; returns bytes read or a negative errno. */
typedef ssize_t (*zseek_read_fn)(void *ctx, void *buf, size_t len,
				 uint64_t off);

/* zseek.c */
int zseek_index_build(zseek_read_fn rd, void *ctx, uint64_t file_size,
		      bool decode, struct zseek_index *idx, char *err,
		      size_t errlen);
int zseek_parse_seek_table(zseek_read_fn rd, void *ctx, uint64_t file_size,
			   struct zseek_index *idx, char *err, size_t errlen);
int zseek_walk_frames(zseek_read_fn rd, void *ctx, uint64_t file_size,
		      struct zseek_index *idx, char *err, size_t errlen);
void zseek_index_free(struct zseek_index *idx);
/* Pack a wide index where its frames allow (zseek_index_build does);
 * -ENOMEM leaves it wide. */
int zseek_index_pack(struct zseek_index *idx);
/* Bytes the index's frames take. */
size_t zseek_index_bytes(const struct zseek_index *idx);
uint64_t zseek_max_content(uint64_t c_size);
int zseek_content_size(zseek_read_fn rd, void *ctx, uint64_t file_size,
		       uint64_t *size, char *err, size_t errlen);
uint32_t zseek_find_frame(const struct zseek_index *idx, uint64_t pos);
ssize_t zseek_pread_fd(void *ctx, void *buf, size_t len, uint64_t off);

/*
 * A read callback over rd that keeps the last 4 KiB block it read: an
 * index is built from small reads near each other (the magic, a frame
 * header, its blocks' headers; a seek table's footer, then the table),
 * one pread each without it.  Reads over half a block go straight to rd.
 */
struct zseek_buffered {
	zseek_read_fn rd;
	void *ctx;
	uint64_t file_size;
	uint64_t off; /* of buf[0] */
	size_t len;   /* bytes of buf read */
	uint8_t buf[4096];
};
ssize_t zseek_read_buffered(void *ctx, void *buf, size_t len, uint64_t off);

/* frame.c: one frame at a time */
/* Decode one whole frame into dst (exactly d_size bytes) and verify it. */
/*
 * Raw frames: content stored as it is, in raw blocks (what zstd writes for
 * incompressible data).  ZSEEK_RAW_PROBE bytes from the frame's start (or
 * the whole frame, if shorter) tell: zseek_raw_frame() returns 1 and sets
 * *data_off to where the content of its first block starts, when the frame
 * header states fr's content size and the first block is raw, of the full
 * block size (or the whole content), and the sizes leave room for raw
 * blocks only; else 0.  Content byte x of such a frame is in block
 * k = x / ZSEEK_BLOCK, whose 3-byte header zseek_raw_block_ok() checks.
 */
#define ZSEEK_BLOCK ZSTD_BLOCKSIZE_MAX
#define ZSEEK_BLOCK_HEADER 3
#define ZSEEK_RAW_PROBE (ZSTD_FRAMEHEADERSIZE_MAX + ZSEEK_BLOCK_HEADER)
int zseek_raw_frame(const void *probe, size_t n, const struct zseek_frame *fr,
		    unsigned int *data_off);
/* Where block k's header is, from the frame's start. */
uint64_t zseek_raw_block_pos(unsigned int data_off, uint64_t k);
/* Whether hdr is the header of raw block k of a raw frame fr. */
bool zseek_raw_block_ok(const uint8_t hdr[ZSEEK_BLOCK_HEADER],
			const struct zseek_frame *fr, uint64_t k);
/* Frame fr (its c_size bytes at src) into dst (its d_size bytes): 0,
 * -EBADMSG if it does not decode or fails its checksum, -EUCLEAN if its
 * header gives a size other than the seek table's, -ENOKEY if it names a
 * dictionary not given (dict.c).  The stream decoder fails so too. */
int zseek_decode_frame(ZSTD_DCtx *dctx, const struct zseek_frame *fr,
		       bool check, const void *src, void *dst);

/*
 * dict.c: the zstd dictionaries frames may name (zstd -D), given before
 * the first read and read-only after.  zseek_dict_add() takes one (its
 * bytes, as `zstd --train' writes them): 0, or -errno and a reason in err.
 * A frame that names a dictionary decodes with it (zseek_decode_frame, the
 * stream decoder) and is indexed only if it was given.
 */
#define ZSEEK_MAX_DICTS 64
int zseek_dict_add(const void *buf, size_t len, char *err, size_t errlen);
/* The dictionaries in files (list: paths, ':' between them; NULL: none):
 * 0, or -errno and "PATH: why" in err. */
int zseek_dict_load(const char *list, char *err, size_t errlen);
const ZSTD_DDict *zseek_dict_find(uint32_t id); /* NULL: not given, or 0 */
unsigned int zseek_dict_count(void);
size_t zseek_dict_bytes(void); /* the memory the dictionaries take */
void zseek_dict_free_all(void);

/* The largest window a frame may need to be served (frame.c): set before
 * the first file is indexed, from 1 KiB to ZSEEK_LARGEST_WINDOW. */
void zseek_set_window_max(uint64_t bytes);
uint64_t zseek_window_max(void);

/* Writing: one frame per chunk (frame.c), then the table (zseek.c). */
struct zseek_writer_entry {
	uint32_t c_size, d_size, checksum;
};
size_t zseek_table_size(uint32_t nframes);
size_t zseek_write_table(const struct zseek_writer_entry *e, uint32_t n,
			 void *out, size_t cap);
size_t zseek_compress_frame(ZSTD_CCtx *cctx, int level, const void *src,
			    size_t len, void *dst, size_t cap,
			    uint32_t *checksum);

/*
 * Streaming a frame from its start: for frames too big to decode whole or
 * without a usable size (stream.c).  Checkpoints: the decoder's state
 * saved every ck_every bytes of content (a multiple of ZSEEK_SUBFOLIO;
 * 0: none) where ck_take(ck_arg, bytes) gives room (ck_give returns it),
 * so a read behind the stream goes back to the nearest, not to the
 * frame's start.
 */
#define ZSEEK_CKPTS 32
struct zseek_ckpt {
	_Atomic uint64_t pos;    /* content offset in its frame; 0: none */
	_Atomic uint32_t frame;
	uint64_t in_off;         /* the next compressed byte to read */
	void *state;             /* the workspace, as it was */
};

struct zseek_stream {
	ZSTD_DStream *ds; /* in ws: a static decoder */
	void *ws;
	size_t ws_size;
	uint32_t frame;   /* the frame being streamed, or UINT32_MAX */
	uint64_t in_off;  /* next compressed byte to feed */
	uint64_t out_pos; /* content bytes produced so far in the frame */
	uint64_t skipped; /* content bytes decoded only to get past them */
	uint64_t restores; /* reads that went back to a checkpoint */
	void *inbuf, *scratch;
	size_t in_cap, in_pos, in_len;
	uint64_t ck_every;
	bool (*ck_take)(void *arg, size_t bytes);
	void (*ck_give)(void *arg, size_t bytes);
	void *ck_arg;
	int place; /* 1 + the slot of the place it left going back, or 0 */
	void *spare; /* a state dropped, still the owner's, for the next save */
	bool placing; /* the save asked of ck_take is a place's */
	struct zseek_ckpt ck[ZSEEK_CKPTS];
};
int zseek_stream_init(struct zseek_stream *s);
void zseek_stream_free(struct zseek_stream *s);
void zseek_stream_drop_ckpts(struct zseek_stream *s);
uint64_t zseek_stream_ckpt_below(const struct zseek_stream *s,
				 uint32_t frame, uint64_t at);
int zseek_stream_need(zseek_read_fn rd, void *ctx,
		      const struct zseek_frame *fr, uint64_t *bytes);
int64_t zseek_stream_count(struct zseek_stream *s, zseek_read_fn rd,
			   void *ctx, const struct zseek_frame *fr);
int zseek_stream_read(struct zseek_stream *s, zseek_read_fn rd, void *ctx,
		      const struct zseek_index *idx, uint32_t frame,
		      uint64_t off_in_frame, void *dst, size_t len);
int zseek_stream_keep_at(struct zseek_stream *s, zseek_read_fn rd, void *ctx,
			 const struct zseek_index *idx, uint32_t frame,
			 uint64_t off_in_frame);

/*
 * manifest.c: the dataset's tree, one line per entry (see the file's
 * header).  A dataset made by mkzfolio has manifest.zst at its root and
 * its file data in data/NNNNNNNN.zst: big files one each, small ones
 * packed together, each within one frame.
 */
#define ZMF_NAME "manifest.zst"
#define ZMF_DATA_DIR "data"
#define ZMF_MAGIC "zfolio-manifest"
#define ZMF_VERSION 1
/* a manifest whose entries have extended attributes: version 1 readers
 * do not know the field, and refuse it */
#define ZMF_VERSION_XATTRS 2
/* entry lines per frame: more compress better, fewer decode less per
 * lookup */
#define ZMF_FRAME_ENTRIES 256

enum zmf_field {
	ZMF_PARENT, /* the directory's path, "" at the root */
	ZMF_NAME_F, /* the entry's name */
	ZMF_TYPE,   /* f d l c b p s */
	ZMF_MODE,   /* permission bits, octal */
	ZMF_UID,
	ZMF_GID,
	ZMF_SIZE,   /* bytes served */
	ZMF_MTIME,  /* seconds.nanoseconds */
	ZMF_ATIME,
	ZMF_INO,    /* the inode number served */
	ZMF_NLINK,
	ZMF_RDEV,   /* devices: makedev() value, else 0 */
	ZMF_DATA,   /* regular files: "ID:OFFSET" in data/ID.zst, or "-" */
	ZMF_TARGET, /* symlinks: the target, else empty */
	ZMF_XATTRS, /* extended attributes (version 2; may be left out) */
	ZMF_NR_FIELDS
};

/* One line's fields, pointing into the line, escaped as stored. */
struct zmf_line {
	const char *f[ZMF_NR_FIELDS];
	size_t len[ZMF_NR_FIELDS];
};

const char *zmf_field_name(enum zmf_field f);
size_t zmf_escape(const char *s, size_t len, char *out);
ssize_t zmf_unescape(const char *s, size_t len, char *out);
int zmf_split(const char *line, size_t len, struct zmf_line *out);
int zmf_number(const struct zmf_line *l, enum zmf_field f, uint64_t *v);
int zmf_time(const struct zmf_line *l, enum zmf_field f, int64_t *sec,
	     long *nsec);
int zmf_data(const struct zmf_line *l, uint64_t *id, uint64_t *off);
size_t zmf_xattr_escape(const char *s, size_t len, char *out);
/* One attribute of an xattrs field, escaped as stored. */
struct zmf_xattr {
	const char *name, *value;
	size_t nlen, vlen;
};
int zmf_xattr_next(const char **pos, const char *end, struct zmf_xattr *x);
int zmf_path_cmp(const char *a, size_t na, const char *b, size_t nb);
int zmf_key_cmp(const char *pa, size_t npa, const char *na, size_t nna,
		const char *pb, size_t npb, const char *nb, size_t nnb);

#endif
