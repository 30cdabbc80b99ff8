// SPDX-License-Identifier: MIT
/*
 * One zstd frame at a time: what zseek.c's index points at.
 *
 * Raw frames (content stored as it is, in raw blocks) are recognised from
 * their first bytes, so their content is read in place, without decoding.
 * Any other frame is decoded whole, its size and checksum verified, or,
 * when it is too large or its size unknown, streamed from its start by a
 * zseek_stream, which continues where the last read ended.  The writer's
 * side is here too: compressing one frame, with its checksum.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <zstd_errors.h>

#include "zseek_internal.h"

bool zseek_raw_block_ok(const uint8_t hdr[ZSEEK_BLOCK_HEADER],
			const struct zseek_frame *fr, uint64_t k)
{
	uint32_t h = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 |
		     (uint32_t)hdr[2] << 16;
	uint64_t nblocks = (fr->d_size + ZSEEK_BLOCK - 1) / ZSEEK_BLOCK;
	uint64_t size = k + 1 < nblocks ? ZSEEK_BLOCK
					: fr->d_size - k * ZSEEK_BLOCK;

	/* bit 0: last block; bits 1-2: type, 0 is raw; then the size */
	return k < nblocks && (h & 1) == (k + 1 == nblocks) &&
	       ((h >> 1) & 3) == 0 && (h >> 3) == size;
}

uint64_t zseek_raw_block_pos(unsigned int data_off, uint64_t k)
{
	return data_off - ZSEEK_BLOCK_HEADER +
	       k * (ZSEEK_BLOCK_HEADER + (uint64_t)ZSEEK_BLOCK);
}

int zseek_raw_frame(const void *probe, size_t n, const struct zseek_frame *fr,
		    unsigned int *data_off)
{
	ZSTD_frameHeader fh;
	size_t hsize = ZSTD_frameHeaderSize(probe, n);
	uint64_t nblocks = (fr->d_size + ZSEEK_BLOCK - 1) / ZSEEK_BLOCK;

	if (ZSTD_isError(hsize) || hsize + ZSEEK_BLOCK_HEADER > n ||
	    ZSTD_getFrameHeader(&fh, probe, n) || fh.frameType != ZSTD_frame ||
	    fh.frameContentSize != fr->d_size || !nblocks)
		return 0;
	/* nothing but headers and the content itself */
	if (hsize + nblocks * ZSEEK_BLOCK_HEADER + fr->d_size +
		    (fh.checksumFlag ? 4 : 0) !=
	    fr->c_size)
		return 0;
	if (!zseek_raw_block_ok((const uint8_t *)probe + hsize, fr, 0))
		return 0;
	*data_off = (unsigned int)(hsize + ZSEEK_BLOCK_HEADER);
	return 1;
}

/* A zstd error as ours: a frame naming a dictionary not given is -ENOKEY. */
static int zstd_err(size_t r)
{
	return ZSTD_getErrorCode(r) == ZSTD_error_dictionary_wrong ? -ENOKEY
								   : -EBADMSG;
}

/*
 * An entry's frames into dst (cap bytes) where dictionaries were given:
 * one at a time, each with the dictionary its header names (none if it
 * names none), skippable frames passed over.  0 and *out the bytes
 * decoded; -EBADMSG, or -ENOKEY for a frame naming a dictionary not given.
 */
static int decode_with_dicts(ZSTD_DCtx *dctx, uint8_t *dst, size_t cap,
			     const uint8_t *src, size_t len, size_t *out)
{
	*out = 0;
	while (len) {
		size_t n = ZSTD_findFrameCompressedSize(src, len), r;

		if (ZSTD_isError(n))
			return -EBADMSG;
		if (!ZSTD_isSkippableFrame(src, n)) {
			/* NULL for an ID not given: zstd says dictionary_wrong */
			r = ZSTD_decompress_usingDDict(
			    dctx, dst + *out, cap - *out, src, n,
			    zseek_dict_find(ZSTD_getDictID_fromFrame(src, n)));
			if (ZSTD_isError(r))
				return zstd_err(r);
			*out += r;
		}
		src += n;
		len -= n;
	}
	return 0;
}

int zseek_decode_frame(ZSTD_DCtx *dctx, const struct zseek_frame *fr,
		       bool check, const void *src, void *dst)
{
	unsigned long long fcs = ZSTD_getFrameContentSize(src, fr->c_size);
	size_t r;
	int err;

	/*
	 * An entry that is one frame whose header says its size, and the
	 * table another: the table lies, and every offset it gives past this
	 * frame is wrong too.  (An entry may also be a skippable frame and a
	 * frame, or several frames: those are judged by what they decode to.)
	 */
	if (fcs != ZSTD_CONTENTSIZE_UNKNOWN && fcs != ZSTD_CONTENTSIZE_ERROR &&
	    fcs != fr->d_size && !ZSTD_isSkippableFrame(src, fr->c_size) &&
	    ZSTD_findFrameCompressedSize(src, fr->c_size) == fr->c_size)
		return -EUCLEAN;
	if (zseek_dict_count()) {
		err = decode_with_dicts(dctx, dst, fr->d_size, src, fr->c_size,
					&r);
		if (err)
			return err;
	} else {
		r = ZSTD_decompressDCtx(dctx, dst, fr->d_size, src, fr->c_size);
		if (ZSTD_isError(r))
			return zstd_err(r);
	}
	if (r != fr->d_size) /* whole, and shorter than the table says */
		return -EUCLEAN;
	if (check && (uint32_t)XXH64(dst, fr->d_size, 0) != fr->checksum)
		return -EBADMSG;
	return 0;
}

size_t zseek_compress_frame(ZSTD_CCtx *cctx, int level, const void *src,
			    size_t len, void *dst, size_t cap,
			    uint32_t *checksum)
{
	size_t r;

	ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
	ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
	ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1);
	ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 0);
	r = ZSTD_compress2(cctx, dst, cap, src, len);
	*checksum = (uint32_t)XXH64(src, len, 0);
	return r;
}

/*
 * The largest window a frame may need, the process's (a daemon serves one
 * dataset): set before the first file is indexed, read-only after.
 */
static uint64_t window_max = ZSEEK_DEFAULT_WINDOW;

void zseek_set_window_max(uint64_t bytes)
{
	if (bytes < (1u << ZSTD_WINDOWLOG_MIN))
		bytes = 1u << ZSTD_WINDOWLOG_MIN;
	window_max = bytes < ZSEEK_LARGEST_WINDOW ? bytes
						  : ZSEEK_LARGEST_WINDOW;
}

uint64_t zseek_window_max(void)
{
	return window_max;
}

/* The stream decoder's limit: the power of two at or above window_max. */
static int window_log_max(void)
{
	int log = ZSTD_WINDOWLOG_MIN;

	while ((1ull << log) < window_max)
		log++;
	return log;
}

int zseek_stream_init(struct zseek_stream *s)
{
	memset(s, 0, sizeof(*s));
	s->ds = ZSTD_createDStream();
	s->in_cap = ZSTD_DStreamInSize();
	s->inbuf = malloc(s->in_cap);
	s->scratch = malloc(ZSTD_BLOCKSIZE_MAX);
	s->frame = UINT32_MAX;
	if (!s->ds || !s->inbuf || !s->scratch) {
		zseek_stream_free(s);
		return -ENOMEM;
	}
	/* the windows allowed, and no more: walk_frame refuses larger */
	ZSTD_DCtx_setParameter(s->ds, ZSTD_d_windowLogMax, window_log_max());
	return 0;
}

void zseek_stream_free(struct zseek_stream *s)
{
	ZSTD_freeDStream(s->ds);
	free(s->inbuf);
	free(s->scratch);
	memset(s, 0, sizeof(*s));
	s->frame = UINT32_MAX;
}

/*
 * Start frame fr (number frame) over: 0, or -errno if its first input
 * cannot be read.  That is read here, for the dictionary its header names,
 * only where dictionaries were given.
 */
static int stream_reset(struct zseek_stream *s, zseek_read_fn rd, void *ctx,
			const struct zseek_frame *fr, uint32_t frame)
{
	size_t n = fr->c_size < s->in_cap ? (size_t)fr->c_size : s->in_cap;
	const ZSTD_DDict *dict = NULL;
	int r;

	s->frame = UINT32_MAX;
	ZSTD_DCtx_reset(s->ds, ZSTD_reset_session_only);
	s->in_off = fr->c_off;
	s->out_pos = 0;
	s->in_pos = s->in_len = 0;
	if (zseek_dict_count()) {
		/* the frame's first input, its header in it, read now */
		r = read_exact(rd, ctx, s->inbuf, n, fr->c_off);
		if (r)
			return r;
		s->in_off += n;
		s->in_len = n;
		dict = zseek_dict_find(ZSTD_getDictID_fromFrame(s->inbuf, n));
	}
	/* NULL drops the last frame's: none is used unless asked for (and
	 * a frame naming one not given fails as dictionary_wrong) */
	if (ZSTD_isError(ZSTD_DCtx_refDDict(s->ds, dict)))
		return -EBADMSG;
	s->frame = frame;
	return 0;
}

/*
 * Produce the frame's content into dst (len bytes, or discarding when dst
 * is NULL, until the frame ends).  Returns bytes produced or -errno.
 */
static int64_t stream_pump(struct zseek_stream *s, zseek_read_fn rd,
			   void *ctx, const struct zseek_frame *fr, void *dst,
			   size_t len)
{
	uint64_t produced = 0, end = fr->c_off + fr->c_size;

	while (dst ? produced < len : true) {
		ZSTD_inBuffer in;
		ZSTD_outBuffer out;
		size_t r;

		if (s->in_pos == s->in_len) {
			size_t n = end - s->in_off < s->in_cap
					   ? (size_t)(end - s->in_off)
					   : s->in_cap;
			ssize_t got;

			if (n == 0)
				return dst ? -EBADMSG : (int64_t)produced;
			got = rd(ctx, s->inbuf, n, s->in_off);
			if (got < 0)
				return got;
			if ((size_t)got != n)
				return -EBADMSG;
			s->in_off += n;
			s->in_pos = 0;
			s->in_len = n;
		}
		in = (ZSTD_inBuffer){s->inbuf, s->in_len, s->in_pos};
		if (dst)
			out = (ZSTD_outBuffer){(char *)dst + produced,
					       len - produced, 0};
		else
			out = (ZSTD_outBuffer){s->scratch, ZSTD_BLOCKSIZE_MAX,
					       0};
		r = ZSTD_decompressStream(s->ds, &out, &in);
		if (ZSTD_isError(r))
			return zstd_err(r);
		s->in_pos = in.pos;
		s->out_pos += out.pos;
		produced += out.pos;
		if (produced > ZSEEK_MAX_CONTENT)
			return -EFBIG;
		if (r == 0) { /* the frame is complete */
			if (dst && produced < len)
				return -EBADMSG;
			if (!dst)
				return (int64_t)produced;
		}
	}
	return (int64_t)produced;
}

/*
 * The memory a stream needs to decode frame fr: its window (or, if
 * smaller, its content) and one block, read from the frame's header.  0
 * and -EBADMSG if the header cannot be read or wants too large a window.
 */
int zseek_stream_need(zseek_read_fn rd, void *ctx,
		      const struct zseek_frame *fr, uint64_t *bytes)
{
	uint8_t hdr[ZSTD_FRAMEHEADERSIZE_MAX];
	size_t n = fr->c_size < sizeof(hdr) ? (size_t)fr->c_size : sizeof(hdr);
	ZSTD_frameHeader fh;

	if (read_exact(rd, ctx, hdr, n, fr->c_off) ||
	    ZSTD_getFrameHeader(&fh, hdr, n) ||
	    fh.windowSize > window_max)
		return -EBADMSG;
	*bytes = ZSTD_decodingBufferSize_min(fh.windowSize,
					     fh.frameContentSize) +
		 ZSTD_DStreamInSize() + ZSTD_BLOCKSIZE_MAX;
	return 0;
}

int64_t zseek_stream_count(struct zseek_stream *s, zseek_read_fn rd,
			   void *ctx, const struct zseek_frame *fr)
{
	int r = stream_reset(s, rd, ctx, fr, UINT32_MAX);

	return r ? r : stream_pump(s, rd, ctx, fr, NULL, 0);
}

/* Content [off, off + len) of frame, continuing the stream when it can. */
int zseek_stream_read(struct zseek_stream *s, zseek_read_fn rd, void *ctx,
		      const struct zseek_index *idx, uint32_t frame,
		      uint64_t off_in_frame, void *dst, size_t len)
{
	const struct zseek_frame frame_v = zseek_frame_at(idx, frame);
	const struct zseek_frame *fr = &frame_v;
	int64_t r;

	if (off_in_frame + len > fr->d_size)
		return -EINVAL;
	if (s->frame != frame || s->out_pos > off_in_frame) {
		r = stream_reset(s, rd, ctx, fr, frame);
		if (r < 0)
			goto bad;
	}
	while (s->out_pos < off_in_frame) {
		size_t skip = off_in_frame - s->out_pos < ZSTD_BLOCKSIZE_MAX
				      ? (size_t)(off_in_frame - s->out_pos)
				      : ZSTD_BLOCKSIZE_MAX;

		r = stream_pump(s, rd, ctx, fr, s->scratch, skip);
		if (r < 0)
			goto bad;
		s->skipped += skip;
	}
	r = stream_pump(s, rd, ctx, fr, dst, len);
	/* the piece that ends the frame: its checksum is read and checked
	 * too, whether or not zstd got to it filling the piece */
	if (r >= 0 && s->out_pos == fr->d_size)
		r = stream_pump(s, rd, ctx, fr, NULL, 0) ? -EBADMSG : 0;
	if (r < 0)
		goto bad;
	return 0;
bad:
	s->frame = UINT32_MAX; /* start over next time */
	return (int)r;
}
