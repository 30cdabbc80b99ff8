// SPDX-License-Identifier: MIT
/*
 * zseek: the seekable format round trip, foreign multi-frame files, and
 * every kind of bad input giving a clear error, never a crash, a hang or
 * an unbounded allocation.
 */
#include <errno.h>
#include <string.h>
#include <xxhash.h>

#include "../format/format.h"
#include "check.h"
#include "memread.h"

struct membuf {
	unsigned char *p;
	size_t len, cap;
};

/* a growing buffer; it reads as a struct memfile (same first fields) */
static ssize_t mem_read_buf(void *ctx, void *buf, size_t len, uint64_t off)
{
	const struct membuf *m = ctx;
	struct memfile f = {m->p, m->len};

	return mem_read(&f, buf, len, off);
}

static void mb_put(struct membuf *m, const void *d, size_t n)
{
	if (m->len + n > m->cap) {
		m->cap = (m->len + n) * 2;
		m->p = realloc(m->p, m->cap);
	}
	memcpy(m->p + m->len, d, n);
	m->len += n;
}

/* text-like content that compresses, with a seed */
static void make_content(unsigned char *p, size_t n, unsigned long long seed)
{
	static const char words[][8] = {"folio ", "cache ", "budget ", "zstd ",
					"frame ", "page ", "reclaim ", "rcu\n"};

	for (size_t i = 0; i < n;) {
		const char *w = words[test_rand(&seed) % 8];

		for (; *w && i < n; w++)
			p[i++] = (unsigned char)*w;
	}
}

/* What mkzfolio writes: frames of frame bytes, then the table. */
static void write_seekable(struct membuf *out, const unsigned char *src,
			   size_t len, size_t frame)
{
	ZSTD_CCtx *cctx = ZSTD_createCCtx();
	uint32_t n = (uint32_t)((len + frame - 1) / frame);
	struct zseek_writer_entry *e = calloc(n ? n : 1, sizeof(*e));
	size_t cap = ZSTD_compressBound(frame);
	unsigned char *dst = malloc(cap);
	size_t tsize = zseek_table_size(n);
	unsigned char *tab = malloc(tsize);

	for (uint32_t i = 0; i < n; i++) {
		size_t l = len - i * frame < frame ? len - i * frame : frame;
		size_t c = zseek_compress_frame(cctx, 3, src + i * frame, l,
						dst, cap, &e[i].checksum);

		CHECK(!ZSTD_isError(c));
		mb_put(out, dst, c);
		e[i].c_size = (uint32_t)c;
		e[i].d_size = (uint32_t)l;
	}
	CHECK_EQ(zseek_write_table(e, n, tab, tsize), tsize);
	mb_put(out, tab, tsize);
	free(tab);
	free(dst);
	free(e);
	ZSTD_freeCCtx(cctx);
}

/* Read [off, off+len) of the content through the index, frame by frame. */
static int read_content(struct membuf *m, const struct zseek_index *idx,
			uint64_t off, size_t len, unsigned char *out)
{
	ZSTD_DCtx *d = ZSTD_createDCtx();
	int err = 0;

	while (len && !err) {
		uint32_t f = zseek_find_frame(idx, off);
		const struct zseek_frame frame_v = zseek_frame_at(idx, f);
		const struct zseek_frame *fr = &frame_v;
		unsigned char *buf = malloc(fr->d_size);
		uint64_t skip = off - fr->d_off;
		size_t n = fr->d_size - skip < len ? fr->d_size - skip : len;

		err = zseek_decode_frame(d, fr, idx->has_checksum,
					 m->p + fr->c_off, buf);
		if (!err)
			memcpy(out, buf + skip, n);
		free(buf);
		out += n;
		off += n;
		len -= n;
	}
	ZSTD_freeDCtx(d);
	return err;
}

static void test_round_trip(void)
{
	static const size_t frames[] = {4096, 65536, 131072, 1 << 20};
	static const size_t sizes[] = {0, 1, 4095, 4096, 4097, 131071, 131072,
				       131073, 3 << 20};

	for (size_t fi = 0; fi < 4; fi++)
		for (size_t si = 0; si < 9; si++) {
			size_t len = sizes[si];
			unsigned char *src = malloc(len + 1);
			unsigned char *got = malloc(len + 1);
			struct membuf m = {0};
			struct zseek_index idx;
			char err[128];
			unsigned long long seed = len + 1;

			make_content(src, len, len * 31 + fi);
			write_seekable(&m, src, len, frames[fi]);
			CHECK_EQ(zseek_index_build(mem_read_buf, &m, m.len, true,
						   &idx, err, sizeof(err)),
				 0);
			CHECK_EQ(idx.kind, ZSEEK_SEEKABLE);
			CHECK_EQ(idx.content_size, len);
			CHECK(idx.has_checksum);
			/* mkzfolio's frames always fit the packed form */
			CHECK(!len || (idx.packed && !idx.frames));
			CHECK_EQ(zseek_index_bytes(&idx),
				 len ? ((idx.nframes + 15) / 16) * 16 +
					       idx.nframes * 16
				     : 0);
			if (len) {
				CHECK_EQ(read_content(&m, &idx, 0, len, got),
					 0);
				CHECK(memcmp(got, src, len) == 0);
			}
			/* random ranges */
			for (int r = 0; len && r < 20; r++) {
				uint64_t off = test_rand(&seed) % len;
				size_t n = 1 + test_rand(&seed) % (len - off);

				CHECK_EQ(read_content(&m, &idx, off, n, got),
					 0);
				CHECK(memcmp(got, src + off, n) == 0);
			}
			zseek_index_free(&idx);
			free(m.p);
			free(src);
			free(got);
		}
}

/* Frames from ZSTD_compress, concatenated, no table: what zstd a; zstd b
 * and cat give.  With a skippable frame in between, as pzstd writes. */
static void test_foreign_multiframe(void)
{
	struct membuf m = {0};
	unsigned char src[300000], got[300000];
	size_t sizes[] = {100000, 50000, 150000};
	size_t cap = ZSTD_compressBound(150000), off = 0;
	unsigned char *dst = malloc(cap);
	static const unsigned char skip[] = {0x50, 0x2a, 0x4d, 0x18, 4, 0, 0,
					     0, 1, 2, 3, 4};
	struct zseek_index idx;
	char err[128];

	make_content(src, sizeof(src), 7);
	for (int i = 0; i < 3; i++) {
		size_t c = ZSTD_compress(dst, cap, src + off, sizes[i], 3);

		mb_put(&m, dst, c);
		if (i == 0)
			mb_put(&m, skip, sizeof(skip));
		off += sizes[i];
	}
	CHECK_EQ(zseek_index_build(mem_read_buf, &m, m.len, true, &idx, err,
				   sizeof(err)),
		 0);
	CHECK_EQ(idx.kind, ZSEEK_WALKED);
	CHECK_EQ(idx.nframes, 3);
	CHECK_EQ(idx.content_size, 300000);
	CHECK_EQ(read_content(&m, &idx, 0, 300000, got), 0);
	CHECK(memcmp(got, src, 300000) == 0);
	CHECK_EQ(read_content(&m, &idx, 99990, 20, got), 0);
	CHECK(memcmp(got, src + 99990, 20) == 0);
	zseek_index_free(&idx);
	free(m.p);
	free(dst);
}

/* A frame written by streaming without a pledged size: no content size in
 * its header.  Measured once by decoding, then served by streaming. */
static void test_unsized_frame(void)
{
	struct membuf m = {0};
	size_t len = 5 << 20;
	unsigned char *src = malloc(len), *got = malloc(len);
	ZSTD_CCtx *c = ZSTD_createCCtx();
	size_t cap = ZSTD_compressBound(len);
	unsigned char *dst = malloc(cap);
	ZSTD_inBuffer in = {src, 4096, 0};
	ZSTD_outBuffer out = {dst, cap, 0};
	struct zseek_index idx;
	struct zseek_stream s;
	char err[128];

	make_content(src, len, 11);
	ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 3);
	/* a first chunk without e_end: the size is never pledged */
	ZSTD_compressStream2(c, &out, &in, ZSTD_e_continue);
	in.size = len;
	CHECK_EQ(ZSTD_compressStream2(c, &out, &in, ZSTD_e_end), 0);
	mb_put(&m, dst, out.pos);
	CHECK_EQ(zseek_index_build(mem_read_buf, &m, m.len, true, &idx, err,
				   sizeof(err)),
		 0);
	CHECK_EQ(idx.nframes, 1);
	CHECK_EQ(idx.nunsized, 1);
	CHECK_EQ(idx.content_size, len);
	CHECK_EQ(zseek_stream_init(&s), 0);
	/* forward reads continue the stream; a backward read restarts */
	CHECK_EQ(zseek_stream_read(&s, mem_read_buf, &m, &idx, 0, 1000, got, 5000),
		 0);
	CHECK(memcmp(got, src + 1000, 5000) == 0);
	CHECK_EQ(zseek_stream_read(&s, mem_read_buf, &m, &idx, 0, 3 << 20, got,
				   len - (3 << 20)),
		 0);
	CHECK(memcmp(got, src + (3 << 20), len - (3 << 20)) == 0);
	CHECK_EQ(zseek_stream_read(&s, mem_read_buf, &m, &idx, 0, 0, got, 100), 0);
	CHECK(memcmp(got, src, 100) == 0);
	zseek_stream_free(&s);
	zseek_index_free(&idx);
	ZSTD_freeCCtx(c);
	free(m.p);
	free(dst);
	free(src);
	free(got);
}

/* A big frame is read in pieces: the piece that ends the frame checks
 * the frame's checksum too, and fails if it does not match (the pieces
 * before were read unchecked: fs/backing.c remembers the frame failed). */
static void test_stream_checksum(void)
{
	struct membuf m = {0};
	size_t len = 5 << 20, piece = 1 << 20;
	unsigned char *src = malloc(len), *got = malloc(piece);
	ZSTD_CCtx *c = ZSTD_createCCtx();
	size_t cap = ZSTD_compressBound(len), n;
	unsigned char *dst = malloc(cap);
	struct zseek_index idx;
	struct zseek_stream s;
	char err[128];

	make_content(src, len, 12);
	ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 3);
	ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
	n = ZSTD_compress2(c, dst, cap, src, len);
	CHECK(!ZSTD_isError(n));
	mb_put(&m, dst, n);
	CHECK_EQ(zseek_index_build(mem_read_buf, &m, m.len, true, &idx, err,
				   sizeof(err)),
		 0);
	CHECK_EQ(idx.nframes, 1);
	CHECK_EQ(zseek_stream_init(&s), 0);
	for (size_t off = 0; off < len; off += piece) {
		CHECK_EQ(zseek_stream_read(&s, mem_read_buf, &m, &idx, 0, off,
					   got, piece),
			 0);
		CHECK(memcmp(got, src + off, piece) == 0);
	}
	/* the checksum (the frame's last 4 bytes) damaged */
	m.p[m.len - 1] ^= 1;
	for (size_t off = 0; off + piece < len; off += piece)
		CHECK_EQ(zseek_stream_read(&s, mem_read_buf, &m, &idx, 0, off,
					   got, piece),
			 0);
	CHECK_EQ(zseek_stream_read(&s, mem_read_buf, &m, &idx, 0, len - piece,
				   got, piece),
		 -EBADMSG);
	/* and a piece that ends the frame on its own, from a fresh start */
	CHECK_EQ(zseek_stream_read(&s, mem_read_buf, &m, &idx, 0, len - 100,
				   got, 100),
		 -EBADMSG);
	zseek_stream_free(&s);
	zseek_index_free(&idx);
	ZSTD_freeCCtx(c);
	free(m.p);
	free(dst);
	free(src);
	free(got);
}

static void put_le32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
	p[2] = (unsigned char)(v >> 16);
	p[3] = (unsigned char)(v >> 24);
}

static struct membuf sample(size_t len, size_t frame)
{
	struct membuf m = {0};
	unsigned char *src = malloc(len);

	make_content(src, len, 3);
	write_seekable(&m, src, len, frame);
	free(src);
	return m;
}

/* Every prefix of a file: an error or a consistent index, never a crash. */
static void test_truncated(void)
{
	struct membuf m = sample(50000, 4096);
	size_t full = m.len;
	int errors = 0;

	for (size_t cut = 0; cut < full; cut++) {
		struct zseek_index idx;
		char err[128] = "";
		int r;

		m.len = cut;
		r = zseek_index_build(mem_read_buf, &m, cut, true, &idx, err,
				      sizeof(err));
		if (r) {
			errors++;
			CHECK(err[0] != '\0');
			continue;
		}
		/* what indexes must stay within the file */
		for (uint32_t i = 0; i < idx.nframes; i++)
			CHECK(zseek_frame_at(&idx, i).c_off +
				      zseek_frame_at(&idx, i).c_size <=
			      cut);
		zseek_index_free(&idx);
	}
	CHECK(errors > 0);
	m.len = full;
	free(m.p);
}

static void test_lying_table(void)
{
	struct membuf m = sample(50000, 4096);
	unsigned char *foot = m.p + m.len - ZSEEK_FOOTER_SIZE;
	struct zseek_index idx;
	char err[128];
	uint32_t n;

	/* a count far beyond the file: refused before any allocation */
	n = (uint32_t)foot[0] | (uint32_t)foot[1] << 8;
	put_le32(foot, 0x7fffffff);
	CHECK_EQ(zseek_index_build(mem_read_buf, &m, m.len, true, &idx, err,
				   sizeof(err)),
		 -EBADMSG);
	CHECK(strstr(err, "frames") != NULL);
	put_le32(foot, 0xffffffff);
	CHECK_EQ(zseek_index_build(mem_read_buf, &m, m.len, true, &idx, err,
				   sizeof(err)),
		 -EBADMSG);
	/* one more frame than there is: header size no longer matches */
	put_le32(foot, n + 1);
	CHECK_EQ(zseek_index_build(mem_read_buf, &m, m.len, true, &idx, err,
				   sizeof(err)),
		 -EBADMSG);
	put_le32(foot, n);
	/* reserved descriptor bits */
	foot[4] |= 0x04;
	CHECK_EQ(zseek_index_build(mem_read_buf, &m, m.len, true, &idx, err,
				   sizeof(err)),
		 -EBADMSG);
	foot[4] &= (unsigned char)~0x04;
	/* an entry whose compressed size lies */
	{
		unsigned char *e = m.p + m.len - zseek_table_size(n) + 8;
		uint32_t cs = (uint32_t)e[0] | (uint32_t)e[1] << 8;

		put_le32(e, cs + 1);
		CHECK_EQ(zseek_index_build(mem_read_buf, &m, m.len, true, &idx,
					   err, sizeof(err)),
			 -EBADMSG);
		put_le32(e, 0xffffff00);
		CHECK_EQ(zseek_index_build(mem_read_buf, &m, m.len, true, &idx,
					   err, sizeof(err)),
			 -EBADMSG);
		put_le32(e, cs);
		/* a content size over the limit */
		put_le32(e + 4, ZSEEK_MAX_FRAME_CONTENT + 1);
		CHECK_EQ(zseek_index_build(mem_read_buf, &m, m.len, true, &idx,
					   err, sizeof(err)),
			 -EBADMSG);
	}
	free(m.p);
}

/* A corrupted frame or a checksum mismatch: that frame fails, others read */
static void test_corrupt_frame(void)
{
	struct membuf m = sample(50000, 4096);
	struct zseek_index idx;
	char err[128];
	unsigned char got[50000];
	ZSTD_DCtx *d = ZSTD_createDCtx();

	CHECK_EQ(zseek_index_build(mem_read_buf, &m, m.len, true, &idx, err,
				   sizeof(err)),
		 0);
	/* flip a byte in the middle of frame 3's compressed data */
	struct zseek_frame f3 = zseek_frame_at(&idx, 3);

	m.p[f3.c_off + f3.c_size / 2] ^= 0x55;
	for (uint32_t i = 0; i < idx.nframes; i++) {
		struct zseek_frame fr = zseek_frame_at(&idx, i);
		int r = zseek_decode_frame(d, &fr, true, m.p + fr.c_off, got);

		if (i == 3)
			CHECK_EQ(r, -EBADMSG);
		else
			CHECK_EQ(r, 0);
	}
	m.p[f3.c_off + f3.c_size / 2] ^= 0x55;
	/* a checksum mismatch on frame 5 only */
	for (uint32_t i = 0; i < idx.nframes; i++) {
		struct zseek_frame fr = zseek_frame_at(&idx, i);
		int r;

		fr.checksum ^= i == 5;
		r = zseek_decode_frame(d, &fr, true, m.p + fr.c_off, got);
		CHECK_EQ(r, i == 5 ? -EBADMSG : 0);
	}
	/* a table whose size for frame 2 is not its header's: the table is
	 * what lies, told apart from a frame that does not decode */
	for (uint32_t i = 0; i < idx.nframes; i++) {
		struct zseek_frame fr = zseek_frame_at(&idx, i);
		int r;

		fr.d_size -= i == 2 ? 10 : 0;
		r = zseek_decode_frame(d, &fr, true, m.p + fr.c_off, got);
		CHECK_EQ(r, i == 2 ? -EUCLEAN : 0);
	}
	/* entries that are not one frame, as other writers may make them:
	 * a skippable frame then a frame, and two frames; judged by what
	 * they decode to */
	{
		unsigned char in[3000], z[2][ZSTD_COMPRESSBOUND(3000) + 12];
		unsigned char out[6010];
		size_t n0, n1;
		struct zseek_frame fr = {0};

		for (size_t i = 0; i < sizeof(in); i++)
			in[i] = (unsigned char)(i % 13);
		/* skippable: magic, 4-byte size, 4 bytes of payload */
		memcpy(z[0], "\x50\x2a\x4d\x18\x04\0\0\0abcd", 12);
		n0 = ZSTD_compress(z[0] + 12, sizeof(z[0]) - 12, in, 3000, 3);
		CHECK(!ZSTD_isError(n0));
		fr.c_size = 12 + n0;
		fr.d_size = 3000;
		CHECK_EQ(zseek_decode_frame(d, &fr, false, z[0], out), 0);
		n1 = ZSTD_compress(z[1], sizeof(z[1]), in, 3000, 3);
		CHECK(!ZSTD_isError(n1));
		memcpy(z[0], z[1], n1);
		memcpy(z[0] + n1, z[1], n1);
		fr.c_size = 2 * n1;
		fr.d_size = 6000;
		CHECK_EQ(zseek_decode_frame(d, &fr, false, z[0], out), 0);
		fr.d_size = 6010; /* decodes whole, to less than said */
		CHECK_EQ(zseek_decode_frame(d, &fr, false, z[0], out),
			 -EUCLEAN);
	}
	zseek_index_free(&idx);
	ZSTD_freeDCtx(d);
	free(m.p);
}

static void test_not_zstd(void)
{
	struct membuf m = {0};
	struct zseek_index idx;
	char err[128];

	mb_put(&m, "plain text, not zstd at all\n", 28);
	CHECK_EQ(zseek_index_build(mem_read_buf, &m, m.len, true, &idx, err,
				   sizeof(err)),
		 -EBADMSG);
	CHECK_EQ(zseek_index_build(mem_read_buf, &m, m.len, false, &idx, err,
				   sizeof(err)),
		 0);
	CHECK_EQ(idx.kind, ZSEEK_RAW);
	CHECK_EQ(idx.content_size, 28);
	/* a zstd magic followed by garbage */
	m.len = 0;
	mb_put(&m, "\x28\xb5\x2f\xfd garbage garbage garbage", 28);
	CHECK_EQ(zseek_index_build(mem_read_buf, &m, m.len, true, &idx, err,
				   sizeof(err)),
		 -EBADMSG);
	free(m.p);
	/* zstd's own output cut short: said to be cut, not "not zstd" */
	{
		unsigned char in[20000], out[ZSTD_COMPRESSBOUND(20000)];
		size_t n;

		for (size_t i = 0; i < sizeof(in); i++)
			in[i] = (unsigned char)(i * 7 % 251);
		n = ZSTD_compress(out, sizeof(out), in, sizeof(in), 3);
		CHECK(!ZSTD_isError(n) && n > 40);
		m = (struct membuf){0};
		mb_put(&m, out, n - 20);
		CHECK_EQ(zseek_index_build(mem_read_buf, &m, m.len, true,
					   &idx, err, sizeof(err)),
			 -EBADMSG);
		CHECK(strstr(err, "cut short") != NULL);
		free(m.p);
	}
}


/* Random bytes: what zstd stores in raw blocks. */
static void make_noise(unsigned char *p, size_t n, unsigned long long seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(test_rand(&seed) >> 24);
}

/* One frame of n bytes at level 3, with or without zstd's checksum. */
static size_t one_frame(const void *in, size_t n, void *out, size_t cap,
			bool checksum)
{
	ZSTD_CCtx *c = ZSTD_createCCtx();
	size_t r;

	ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 3);
	ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, checksum);
	r = ZSTD_compress2(c, out, cap, in, n);
	ZSTD_freeCCtx(c);
	CHECK(!ZSTD_isError(r));
	return r;
}

/*
 * Raw frames: incompressible frames of one and two raw blocks are found
 * raw, their content where zseek_raw_frame and zseek_raw_block_pos say,
 * with and without a checksum; a compressed frame, a wrong content size,
 * a block header of another type or size, a probe too short, are not.
 */
static void test_raw_frames(void)
{
	const size_t sizes[] = {4096, 131072, 262144, 200000};
	size_t cap = ZSTD_compressBound(262144);
	unsigned char *in = malloc(262144), *out = malloc(cap);
	unsigned int off;

	for (int ck = 0; ck < 2; ck++)
		for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
			size_t n = sizes[s], c;
			struct zseek_frame fr = {0};
			uint64_t nb = (n + ZSEEK_BLOCK - 1) / ZSEEK_BLOCK;

			make_noise(in, n, 7 + s);
			c = one_frame(in, n, out, cap, ck);
			fr.c_size = c;
			fr.d_size = n;
			CHECK_EQ(zseek_raw_frame(out, ZSEEK_RAW_PROBE, &fr, &off), 1);
			for (uint64_t k = 0; k < nb; k++) {
				uint64_t h = zseek_raw_block_pos(off, k);

				CHECK(zseek_raw_block_ok(out + h, &fr, k));
				CHECK(!memcmp(out + h + ZSEEK_BLOCK_HEADER,
					      in + k * ZSEEK_BLOCK,
					      k + 1 < nb ? ZSEEK_BLOCK
							 : n - k * ZSEEK_BLOCK));
				/* not block k + 1's header, nor past the end */
				CHECK(!zseek_raw_block_ok(out + h, &fr, k + 1));
			}
			/* a content size the header does not state */
			fr.d_size = n - 1;
			CHECK_EQ(zseek_raw_frame(out, ZSEEK_RAW_PROBE, &fr, &off), 0);
			fr.d_size = n;
			/* a compressed block type */
			out[off - 3] ^= 4;
			CHECK_EQ(zseek_raw_frame(out, ZSEEK_RAW_PROBE, &fr, &off), 0);
			out[off - 3] ^= 4;
			/* too short a probe for the header */
			CHECK_EQ(zseek_raw_frame(out, 5, &fr, &off), 0);
		}
	/* compressible content is not raw */
	{
		struct zseek_frame fr = {0};
		size_t c;

		make_content(in, 131072, 3);
		c = one_frame(in, 131072, out, cap, false);
		fr.c_size = c;
		fr.d_size = 131072;
		CHECK_EQ(zseek_raw_frame(out, ZSEEK_RAW_PROBE, &fr, &off), 0);
	}
	free(in);
	free(out);
}

/* A wide index of n frames of c and d bytes each, content after content. */
static void wide_index(struct zseek_index *idx, uint32_t n, uint64_t c,
		       uint64_t d)
{
	memset(idx, 0, sizeof(*idx));
	idx->frames = calloc(n, sizeof(*idx->frames));
	CHECK(idx->frames != NULL);
	idx->nframes = n;
	for (uint32_t i = 0; i < n; i++)
		idx->frames[i] = (struct zseek_frame){
			.c_off = 7 + i * c, .d_off = i * d, .c_size = c,
			.d_size = d, .checksum = 0x9e3779b9u * i,
			.sized = true};
	idx->content_size = n * d;
}

/* Packing keeps every frame as it was, or keeps the index wide. */
static void test_pack(void)
{
	struct zseek_index idx;
	struct zseek_frame *was;
	const uint32_t n = 3 * ZSEEK_GROUP + 5;

	/* frames of mkzfolio's sizes, over several groups: packed */
	wide_index(&idx, n, 9000, 32768);
	idx.frames[n - 1].d_size = 100; /* a short last frame */
	idx.content_size -= 32768 - 100;
	was = malloc(n * sizeof(*was));
	memcpy(was, idx.frames, n * sizeof(*was));
	CHECK_EQ(zseek_index_pack(&idx), 0);
	CHECK(idx.packed && !idx.frames);
	CHECK_EQ(zseek_index_bytes(&idx), 4 * 16 + n * 16);
	for (uint32_t i = 0; i < n; i++) {
		struct zseek_frame fr = zseek_frame_at(&idx, i);

		CHECK_EQ(fr.c_off, was[i].c_off);
		CHECK_EQ(fr.c_size, was[i].c_size);
		CHECK_EQ(fr.d_off, was[i].d_off);
		CHECK_EQ(fr.d_size, was[i].d_size);
		CHECK_EQ(fr.checksum, was[i].checksum);
		CHECK_EQ(zseek_find_frame(&idx, was[i].d_off), i);
		CHECK_EQ(zseek_find_frame(&idx, was[i].d_off + was[i].d_size - 1),
			 i);
	}
	free(was);
	zseek_index_free(&idx);

	/* a frame of 4 GiB compressed (a foreign file as one frame): wide */
	wide_index(&idx, 3, 1ull << 32, 1ull << 33);
	CHECK_EQ(zseek_index_pack(&idx), 0);
	CHECK(idx.frames && !idx.packed);
	CHECK_EQ(zseek_frame_at(&idx, 1).c_size, 1ull << 32);
	CHECK_EQ(zseek_index_bytes(&idx), 3 * sizeof(struct zseek_frame));
	zseek_index_free(&idx);

	/* frames under 4 GiB, but a group spanning more: wide */
	wide_index(&idx, ZSEEK_GROUP, 1ull << 29, 1ull << 30);
	CHECK_EQ(zseek_index_pack(&idx), 0);
	CHECK(idx.frames && !idx.packed);
	CHECK_EQ(zseek_frame_at(&idx, ZSEEK_GROUP - 1).d_off,
		 (uint64_t)(ZSEEK_GROUP - 1) << 30);
	zseek_index_free(&idx);

	/* content that is not contiguous (never built so): wide */
	wide_index(&idx, 4, 100, 200);
	idx.frames[2].d_off += 1;
	CHECK_EQ(zseek_index_pack(&idx), 0);
	CHECK(idx.frames && !idx.packed);
	zseek_index_free(&idx);
}

/* A read callback that counts its calls, over a memfile. */
struct counted {
	struct memfile m;
	int calls;
	int fail; /* nonzero: every read fails with it */
};

static ssize_t counted_read(void *ctx, void *buf, size_t len, uint64_t off)
{
	struct counted *c = ctx;

	c->calls++;
	return c->fail ? -c->fail : mem_read(&c->m, buf, len, off);
}

/* The buffered reader gives what its reader gives, in fewer reads. */
static void test_buffered_reads(void)
{
	static unsigned char file[10000];
	struct counted c = {{file, sizeof(file)}, 0, 0};
	struct zseek_buffered b = {.rd = counted_read, .ctx = &c,
				   .file_size = sizeof(file)};
	/*
	 * off, len, and the reader's calls so far: {0,4} reads block 0;
	 * {0,8} and {6,3} come from it; {4000,200} straddles two blocks and
	 * reads from 4000; {4090,20} comes from that; {100,3000} is big and
	 * goes straight; {9990,20} reads block 8192 (10 bytes are left);
	 * {10000,4} and {12000,4} are at and past the end and go straight;
	 * {5,16} reads block 0 again.
	 */
	static const uint64_t reads[][3] = {
		{0, 4, 1},	 {0, 8, 1},	{6, 3, 1},     {4000, 200, 2},
		{4090, 20, 2},	 {100, 3000, 3}, {9990, 20, 4}, {10000, 4, 5},
		{12000, 4, 6}, {5, 16, 7}};
	unsigned char got[4096];
	ssize_t n;

	make_content(file, sizeof(file), 3);
	for (size_t i = 0; i < sizeof(reads) / sizeof(reads[0]); i++) {
		uint64_t off = reads[i][0];
		size_t len = (size_t)reads[i][1];
		size_t want = off >= sizeof(file) ? 0
			      : len < sizeof(file) - off ? len
							 : sizeof(file) - off;

		n = zseek_read_buffered(&b, got, len, off);
		CHECK_EQ(n, (ssize_t)want);
		CHECK(memcmp(got, file + (off < sizeof(file) ? off : 0),
			     want) == 0);
		CHECK_EQ(c.calls, (int)reads[i][2]);
	}
	/* a failed read says so, and forgets the block it held */
	c.fail = EIO;
	CHECK_EQ(zseek_read_buffered(&b, got, 4, 2000), 4);
	CHECK_EQ(zseek_read_buffered(&b, got, 4, 5000), -EIO);
	CHECK_EQ(zseek_read_buffered(&b, got, 4, 2000), -EIO);
}

int main(void)
{
	RUN(test_round_trip);
	RUN(test_foreign_multiframe);
	RUN(test_unsized_frame);
	RUN(test_stream_checksum);
	RUN(test_truncated);
	RUN(test_lying_table);
	RUN(test_corrupt_frame);
	RUN(test_not_zstd);
	RUN(test_raw_frames);
	RUN(test_pack);
	RUN(test_buffered_reads);
	return check_done();
}
