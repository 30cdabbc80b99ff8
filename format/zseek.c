// SPDX-License-Identifier: MIT
/*
 * The zstd seekable format: its seek table (read and written), indexes of
 * seekable and foreign files, and the read callbacks the parsers use.  One
 * frame at a time (raw frames, decoding, compressing, streaming) is
 * frame.c's.
 *
 * A seekable file is independent zstd frames, then one skippable frame that
 * holds the seek table: one entry per frame (compressed size, content size,
 * and with the checksum flag the low 32 bits of XXH64 of its content), then
 * a 9-byte footer (frame count, descriptor, magic 0x8F92EAB1).  Any zstd
 * decoder reads the whole file; the table lets us find the frame that holds
 * any content offset without decoding.
 *
 * A .zst file without a table is indexed by walking its frame headers and
 * block headers (no decoding); a frame whose header omits its content size
 * is measured once by decoding it, and counted.
 *
 * Nothing read from a file is trusted: the table's count is bounded by
 * ZSEEK_MAX_FRAMES and by the file size before the entries are read, each
 * entry by ZSEEK_MAX_FRAME_CONTENT, and the entries must add up to exactly
 * the bytes before the table.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zseek_internal.h"

static inline uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static inline void put_le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return code;
}

/*
 * The most content a frame of c compressed bytes can hold: after its magic
 * and a header of at least two bytes, every block takes at least 4 bytes
 * (a 3-byte header and one byte repeated) and yields at most
 * ZSTD_BLOCKSIZE_MAX.  0 below the smallest frame that holds anything.
 */
uint64_t zseek_max_content(uint64_t c)
{
	if (c < ZSEEK_MIN_FRAME_BYTES)
		return 0;
	return (c - 6) / 4 * (uint64_t)ZSTD_BLOCKSIZE_MAX;
}

ssize_t zseek_pread_fd(void *ctx, void *buf, size_t len, uint64_t off)
{
	int fd = *(int *)ctx;
	size_t done = 0;

	while (done < len) {
		ssize_t n = pread(fd, (char *)buf + done, len - done,
				  (off_t)(off + done));

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			break;
		done += (size_t)n;
	}
	return (ssize_t)done;
}

ssize_t zseek_read_buffered(void *ctx, void *buf, size_t len, uint64_t off)
{
	struct zseek_buffered *b = ctx;
	uint64_t start;
	size_t want;
	ssize_t n;

	if (off >= b->off && off + len <= b->off + b->len) {
		memcpy(buf, b->buf + (off - b->off), len);
		return (ssize_t)len;
	}
	if (len > sizeof(b->buf) / 2 || off >= b->file_size)
		return b->rd(b->ctx, buf, len, off);
	/* the block around it, or from it when it straddles two */
	start = off / sizeof(b->buf) * sizeof(b->buf);
	if (off + len > start + sizeof(b->buf))
		start = off;
	want = b->file_size - start < sizeof(b->buf)
		       ? (size_t)(b->file_size - start)
		       : sizeof(b->buf);
	n = b->rd(b->ctx, b->buf, want, start);
	if (n < 0) {
		b->len = 0;
		return n;
	}
	b->off = start;
	b->len = (size_t)n;
	if (off + len > start + b->len) /* short: the file ended */
		len = start + b->len > off ? (size_t)(start + b->len - off) : 0;
	memcpy(buf, b->buf + (off - start), len);
	return (ssize_t)len;
}

void zseek_index_free(struct zseek_index *idx)
{
	free(idx->frames);
	free(idx->groups);
	free(idx->packed);
	idx->frames = NULL;
	idx->groups = NULL;
	idx->packed = NULL;
	idx->nframes = 0;
}

/* Whether the wide frames fit the packed form: 32-bit sizes and offsets
 * within a group, and each frame's content right after the one before. */
static bool packable(const struct zseek_index *idx)
{
	const struct zseek_frame *fr = idx->frames;
	uint64_t d = 0;

	for (uint32_t i = 0; i < idx->nframes; i++) {
		const struct zseek_frame *base = &fr[i & ~(ZSEEK_GROUP - 1)];

		if (fr[i].d_off != d || fr[i].c_size > UINT32_MAX ||
		    fr[i].c_off < base->c_off ||
		    fr[i].c_off - base->c_off > UINT32_MAX ||
		    fr[i].d_off - base->d_off > UINT32_MAX)
			return false;
		d += fr[i].d_size;
	}
	return d == idx->content_size;
}

int zseek_index_pack(struct zseek_index *idx)
{
	const struct zseek_frame *fr = idx->frames;
	uint32_t ngroups;

	if (!fr || !idx->nframes || !packable(idx))
		return 0;
	ngroups = (idx->nframes + ZSEEK_GROUP - 1) >> ZSEEK_GROUP_SHIFT;
	idx->groups = malloc(ngroups * sizeof(*idx->groups));
	idx->packed = malloc(idx->nframes * sizeof(*idx->packed));
	if (!idx->groups || !idx->packed) {
		free(idx->groups);
		free(idx->packed);
		idx->groups = NULL;
		idx->packed = NULL;
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < idx->nframes; i++) {
		const struct zseek_frame *base = &fr[i & ~(ZSEEK_GROUP - 1)];

		if (base == &fr[i])
			idx->groups[i >> ZSEEK_GROUP_SHIFT] =
				(struct zseek_group){fr[i].c_off, fr[i].d_off};
		idx->packed[i] = (struct zseek_packed){
			.c_rel = (uint32_t)(fr[i].c_off - base->c_off),
			.d_rel = (uint32_t)(fr[i].d_off - base->d_off),
			.c_size = (uint32_t)fr[i].c_size,
			.checksum = fr[i].checksum,
		};
	}
	free(idx->frames);
	idx->frames = NULL;
	return 0;
}

size_t zseek_index_bytes(const struct zseek_index *idx)
{
	size_t ngroups = (idx->nframes + ZSEEK_GROUP - 1) >> ZSEEK_GROUP_SHIFT;

	if (idx->frames)
		return idx->nframes * sizeof(*idx->frames);
	if (!idx->packed)
		return 0;
	return ngroups * sizeof(*idx->groups) +
	       idx->nframes * sizeof(*idx->packed);
}

/* The seek table's place: where its entries start and how it is laid out. */
struct table_geom {
	uint32_t n;          /* entries */
	bool checksum;       /* entries carry a checksum */
	uint64_t entry_size; /* 8 or 12 bytes */
	uint64_t table_off;  /* the skippable frame's start: the frames' end */
};

/* Read and check the footer and the frame header before the entries. */
static int table_locate(zseek_read_fn rd, void *ctx, uint64_t file_size,
			struct table_geom *g, char *err, size_t errlen)
{
	uint8_t foot[ZSEEK_FOOTER_SIZE], head[8];
	uint64_t table_bytes, frame_bytes;
	int r;

	if (file_size < ZSEEK_FOOTER_SIZE + 8)
		return -ENOENT;
	r = read_exact(rd, ctx, foot, sizeof(foot),
		       file_size - ZSEEK_FOOTER_SIZE);
	if (r)
		return fail(err, errlen, r == -EBADMSG ? -EIO : r,
			    "cannot read the footer");
	if (le32(foot + 5) != ZSEEK_FOOTER_MAGIC)
		return -ENOENT;
	if (foot[4] & 0x7c)
		return fail(err, errlen, -EBADMSG,
			    "seek table: reserved descriptor bits set");
	g->n = le32(foot);
	g->checksum = foot[4] & 0x80;
	g->entry_size = g->checksum ? 12 : 8;
	if (g->n > ZSEEK_MAX_FRAMES)
		return fail(err, errlen, -EBADMSG,
			    "seek table: %u frames is over the limit of %u",
			    g->n, ZSEEK_MAX_FRAMES);
	table_bytes = (uint64_t)g->n * g->entry_size;
	frame_bytes = table_bytes + ZSEEK_FOOTER_SIZE + 8;
	if (frame_bytes > file_size)
		return fail(err, errlen, -EBADMSG,
			    "seek table: %u frames do not fit in %llu bytes",
			    g->n, (unsigned long long)file_size);
	g->table_off = file_size - frame_bytes;
	r = read_exact(rd, ctx, head, sizeof(head), g->table_off);
	if (r)
		return fail(err, errlen, -EIO, "cannot read the seek table");
	if (le32(head) != ZSEEK_SKIPPABLE_MAGIC ||
	    le32(head + 4) != table_bytes + ZSEEK_FOOTER_SIZE)
		return fail(err, errlen, -EBADMSG,
			    "seek table: frame header does not match footer");
	return 0;
}

/* The entries into frames; empty frames hold no content and are dropped. */
static int table_decode(const struct table_geom *g, const uint8_t *tab,
			struct zseek_index *idx, char *err, size_t errlen)
{
	uint64_t c = 0, d = 0;
	uint32_t kept = 0;

	for (uint32_t i = 0; i < g->n; i++) {
		const uint8_t *e = tab + i * g->entry_size;
		struct zseek_frame *fr = &idx->frames[kept];
		uint32_t cs = le32(e), ds = le32(e + 4);

		if (ds > ZSEEK_MAX_FRAME_CONTENT || c + cs > g->table_off)
			return fail(err, errlen, -EBADMSG,
				    "seek table: entry %u is out of bounds",
				    i);
		if (ds && ds > zseek_max_content(cs))
			return fail(err, errlen, -EBADMSG,
				    "seek table: entry %u claims %u bytes of "
				    "content from %u compressed bytes",
				    i, ds, cs);
		fr->c_off = c;
		fr->d_off = d;
		fr->c_size = cs;
		fr->d_size = ds;
		fr->checksum = g->checksum ? le32(e + 8) : 0;
		fr->sized = true;
		c += cs;
		d += ds;
		if (ds)
			kept++;
	}
	if (c != g->table_off)
		return fail(err, errlen, -EBADMSG,
			    "seek table: frames cover %llu bytes, file has "
			    "%llu before the table",
			    (unsigned long long)c,
			    (unsigned long long)g->table_off);
	idx->nframes = kept;
	idx->content_size = d;
	return 0;
}

/* Returns -ENOENT if there is no seek table, -EBADMSG if it lies. */
int zseek_parse_seek_table(zseek_read_fn rd, void *ctx, uint64_t file_size,
			   struct zseek_index *idx, char *err, size_t errlen)
{
	struct table_geom g = {0};
	uint64_t bytes;
	uint8_t *tab;
	int r = table_locate(rd, ctx, file_size, &g, err, errlen);

	if (r)
		return r;
	bytes = g.n * g.entry_size;
	tab = malloc(bytes ? bytes : 1);
	idx->frames = calloc(g.n ? g.n : 1, sizeof(*idx->frames));
	if (!tab || !idx->frames) {
		free(tab);
		zseek_index_free(idx);
		return fail(err, errlen, -ENOMEM, "out of memory");
	}
	r = read_exact(rd, ctx, tab, bytes, g.table_off + 8);
	if (r)
		r = fail(err, errlen, -EIO, "cannot read the seek table");
	else
		r = table_decode(&g, tab, idx, err, errlen);
	free(tab);
	if (r) {
		zseek_index_free(idx);
		return r;
	}
	idx->kind = ZSEEK_SEEKABLE;
	idx->has_checksum = g.checksum;
	return 0;
}

/*
 * Walk one frame's blocks from pos: returns its end, or a negative errno,
 * and counts its blocks.  ZSTD_findFrameCompressedSize() would need the
 * whole frame in memory; this reads only the 3-byte block headers through
 * the callback, so a frame of gigabytes is measured without reading it.
 */
static int64_t walk_blocks(zseek_read_fn rd, void *ctx, uint64_t pos,
			   uint64_t file_size, uint64_t *nblocks)
{
	for (*nblocks = 0;; ++*nblocks) {
		uint8_t bh[3];
		uint32_t h, type, size;

		if (pos + 3 > file_size)
			return -ENODATA; /* the file ends inside the frame */
		if (read_exact(rd, ctx, bh, 3, pos))
			return -EBADMSG;
		h = (uint32_t)bh[0] | (uint32_t)bh[1] << 8 |
		    (uint32_t)bh[2] << 16;
		type = (h >> 1) & 3;
		size = h >> 3;
		if (type == 3 || size > ZSTD_BLOCKSIZE_MAX)
			return -EBADMSG;
		pos += 3 + (type == 1 ? 1 : size);
		if (pos > file_size)
			return -ENODATA;
		if (h & 1) {
			++*nblocks;
			return (int64_t)pos;
		}
	}
}

static int frames_push(struct zseek_index *idx, uint32_t *cap,
		       const struct zseek_frame *fr)
{
	if (idx->nframes == *cap) {
		uint32_t ncap = *cap ? *cap * 2 : 64;
		struct zseek_frame *v;

		if (idx->nframes >= ZSEEK_MAX_FRAMES)
			return -E2BIG;
		v = realloc(idx->frames, ncap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		idx->frames = v;
		*cap = ncap;
	}
	idx->frames[idx->nframes++] = *fr;
	return 0;
}

/*
 * One frame at off: its place, and its content size if the header says
 * it.  A header that claims more content than its blocks can hold, or a
 * window larger than zseek_window_max(), is refused with the reason.
 */
static int walk_frame(zseek_read_fn rd, void *ctx, uint64_t off,
		      uint64_t file_size, struct zseek_frame *fr,
		      char *err, size_t errlen)
{
	uint8_t hdr[ZSTD_FRAMEHEADERSIZE_MAX];
	size_t n = file_size - off < sizeof(hdr) ? file_size - off
						 : sizeof(hdr);
	ZSTD_frameHeader fh;
	uint64_t nblocks;
	int64_t end;
	size_t hsize;

	if (n < 6 || read_exact(rd, ctx, hdr, n, off) ||
	    le32(hdr) != ZSEEK_ZSTD_MAGIC)
		return -EBADMSG;
	hsize = ZSTD_frameHeaderSize(hdr, n);
	if (ZSTD_isError(hsize) || ZSTD_getFrameHeader(&fh, hdr, n))
		return -EBADMSG;
	if (fh.windowSize > zseek_window_max())
		return fail(err, errlen, -EBADMSG,
			    "frame at offset %llu needs a %llu MiB window, "
			    "over the limit of %llu MiB (zfolio -o "
			    "max_window=SIZE)",
			    (unsigned long long)off,
			    (unsigned long long)(fh.windowSize >> 20),
			    (unsigned long long)(zseek_window_max() >> 20));
	if (fh.dictID && !zseek_dict_find(fh.dictID))
		return fail(err, errlen, -EBADMSG,
			    "frame at offset %llu was compressed with a "
			    "dictionary (ID %u) that was not given "
			    "(zfolio -o dict=FILE)",
			    (unsigned long long)off, fh.dictID);
	end = walk_blocks(rd, ctx, off + hsize, file_size, &nblocks);
	if (end == -ENODATA ||
	    (end >= 0 && fh.checksumFlag && (uint64_t)end + 4 > file_size))
		return fail(err, errlen, -EBADMSG,
			    "the frame at offset %llu is cut short: the file "
			    "ends inside it (truncated?)",
			    (unsigned long long)off);
	if (end < 0)
		return -EBADMSG;
	fr->c_off = off;
	fr->c_size = (uint64_t)end + (fh.checksumFlag ? 4 : 0) - off;
	fr->sized = fh.frameContentSize != ZSTD_CONTENTSIZE_UNKNOWN;
	fr->checked = fh.checksumFlag;
	fr->d_size = fr->sized ? fh.frameContentSize : 0;
	if (fr->d_size > nblocks * ZSTD_BLOCKSIZE_MAX)
		return fail(err, errlen, -EBADMSG,
			    "frame at offset %llu claims %llu bytes of "
			    "content, its %llu blocks hold at most %llu",
			    (unsigned long long)off,
			    (unsigned long long)fr->d_size,
			    (unsigned long long)nblocks,
			    (unsigned long long)(nblocks *
						 ZSTD_BLOCKSIZE_MAX));
	return 0;
}

int zseek_walk_frames(zseek_read_fn rd, void *ctx, uint64_t file_size,
		      struct zseek_index *idx, char *err, size_t errlen)
{
	uint64_t off = 0, d = 0;
	uint32_t cap = 0;
	int r = 0;

	idx->frames = NULL;
	idx->nframes = 0;
	idx->frames_checked = 0;
	if (err && errlen)
		err[0] = '\0';
	while (off < file_size) {
		struct zseek_frame fr = {0};
		uint8_t hdr[8];

		if (file_size - off < 8 || read_exact(rd, ctx, hdr, 8, off)) {
			r = -EBADMSG;
			break;
		}
		if ((le32(hdr) & ZSEEK_SKIPPABLE_MASK) == ZSEEK_SKIPPABLE_START) {
			off += 8 + (uint64_t)le32(hdr + 4);
			if (off > file_size)
				r = -EBADMSG;
			if (r)
				break;
			continue;
		}
		r = walk_frame(rd, ctx, off, file_size, &fr, err, errlen);
		if (r || fr.d_size > ZSEEK_MAX_CONTENT - d) {
			r = -EBADMSG;
			break;
		}
		fr.d_off = d;
		/* keep unsized frames: their size is measured later */
		if (fr.d_size || !fr.sized) {
			if ((r = frames_push(idx, &cap, &fr))) {
				zseek_index_free(idx);
				return fail(err, errlen, r,
					    "too many frames (limit %u)",
					    ZSEEK_MAX_FRAMES);
			}
			idx->frames_checked += fr.checked;
		}
		d += fr.d_size;
		off += fr.c_size;
	}
	if (r) {
		zseek_index_free(idx);
		if (err && errlen && err[0])
			return r; /* walk_frame said why */
		return fail(err, errlen, r,
			    "not a valid zstd stream at offset %llu",
			    (unsigned long long)off);
	}
	idx->kind = ZSEEK_WALKED;
	idx->content_size = d;
	idx->has_checksum = false;
	return 0;
}

/* Measure frames whose headers do not say their size: decode them once. */
static int measure_unsized(zseek_read_fn rd, void *ctx,
			   struct zseek_index *idx, char *err, size_t errlen)
{
	struct zseek_stream s;
	uint64_t d = 0;
	uint32_t kept = 0;
	int r = 0;

	for (uint32_t i = 0; i < idx->nframes; i++)
		if (!idx->frames[i].sized)
			goto measure;
	return 0;
measure:
	r = zseek_stream_init(&s);
	if (r)
		return fail(err, errlen, r, "out of memory");
	for (uint32_t i = 0; i < idx->nframes; i++) {
		struct zseek_frame *fr = &idx->frames[i];

		if (!fr->sized) {
			int64_t n = zseek_stream_count(&s, rd, ctx, fr);

			if (n < 0) {
				r = fail(err, errlen, (int)n,
					 "frame at offset %llu does not decode",
					 (unsigned long long)fr->c_off);
				break;
			}
			fr->d_size = (uint64_t)n;
			idx->nunsized++;
		}
		fr->d_off = d;
		d += fr->d_size;
		if (fr->d_size)
			idx->frames[kept++] = *fr;
		else
			idx->frames_checked -= fr->checked;
	}
	zseek_stream_free(&s);
	idx->nframes = kept;
	idx->content_size = d;
	return r;
}

int zseek_index_build(zseek_read_fn rd, void *ctx, uint64_t file_size,
		      bool decode, struct zseek_index *idx, char *err,
		      size_t errlen)
{
	uint8_t magic[4];
	int r;

	memset(idx, 0, sizeof(*idx));
	idx->file_size = file_size;
	idx->kind = ZSEEK_RAW;
	idx->content_size = file_size;
	if (!decode)
		return 0;
	if (file_size == 0) {
		idx->kind = ZSEEK_WALKED; /* an empty stream: no content */
		idx->content_size = 0;
		return 0;
	}
	if (file_size < 4 || read_exact(rd, ctx, magic, 4, 0))
		return fail(err, errlen, -EBADMSG, "too short to be zstd");
	if (le32(magic) != ZSEEK_ZSTD_MAGIC &&
	    (le32(magic) & ZSEEK_SKIPPABLE_MASK) != ZSEEK_SKIPPABLE_START)
		return fail(err, errlen, -EBADMSG, "not a zstd file");
	r = zseek_parse_seek_table(rd, ctx, file_size, idx, err, errlen);
	if (r == -ENOENT) {
		r = zseek_walk_frames(rd, ctx, file_size, idx, err, errlen);
		if (r)
			return r;
		r = measure_unsized(rd, ctx, idx, err, errlen);
	}
	if (r) {
		zseek_index_free(idx);
		return r;
	}
	(void)zseek_index_pack(idx); /* out of memory: it stays wide */
	return 0;
}

uint32_t zseek_find_frame(const struct zseek_index *idx, uint64_t pos)
{
	uint32_t lo = 0, hi = idx->nframes ? idx->nframes - 1 : 0;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo + 1) / 2;

		if (zseek_frame_d_off(idx, mid) <= pos)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

size_t zseek_table_size(uint32_t nframes)
{
	return 8 + (size_t)nframes * 12 + ZSEEK_FOOTER_SIZE;
}

size_t zseek_write_table(const struct zseek_writer_entry *e, uint32_t n,
			 void *out, size_t cap)
{
	uint8_t *p = out;
	size_t need = zseek_table_size(n);

	if (cap < need)
		return 0;
	put_le32(p, ZSEEK_SKIPPABLE_MAGIC);
	put_le32(p + 4, (uint32_t)(need - 8));
	p += 8;
	for (uint32_t i = 0; i < n; i++, p += 12) {
		put_le32(p, e[i].c_size);
		put_le32(p + 4, e[i].d_size);
		put_le32(p + 8, e[i].checksum);
	}
	put_le32(p, n);
	p[4] = 0x80; /* Checksum_Flag */
	put_le32(p + 5, ZSEEK_FOOTER_MAGIC);
	return need;
}

/*
 * The content size of a .zst file without keeping its index: one read of
 * the seek table, or a walk of the frame headers; frames whose header has
 * no size are measured by decoding them (as zseek_index_build does), so
 * the size is exact and never changes once the file is indexed.
 */
int zseek_content_size(zseek_read_fn rd, void *ctx, uint64_t file_size,
		       uint64_t *size, char *err, size_t errlen)
{
	struct zseek_index idx;
	int r = zseek_index_build(rd, ctx, file_size, true, &idx, err, errlen);

	if (r)
		return r;
	*size = idx.content_size;
	zseek_index_free(&idx);
	return 0;
}
