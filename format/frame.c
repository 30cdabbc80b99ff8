// SPDX-License-Identifier: MIT
/*
 * One zstd frame at a time: what zseek.c's index points at.
 *
 * Raw frames (content stored as it is, in raw blocks) are recognised from
 * their first bytes, so their content is read in place, without decoding.
 * Any other frame is decoded whole, its size and checksum verified (or,
 * when it is too large or its size unknown, streamed by a zseek_stream:
 * stream.c).  The writer's side is here too: compressing one frame, with
 * its checksum.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

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
