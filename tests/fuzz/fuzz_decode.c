// SPDX-License-Identifier: MIT
/*
 * Fuzz decoding and verifying one frame, as a read of a damaged dataset
 * would: [u32 content size][u32 checksum][frame bytes].  Both the one-shot
 * decode and the streamed one (for frames served in sub-folios).
 */
#include <stdlib.h>
#include <string.h>

#include "../../format/format.h"
#include "../memread.h"

#define MAX_CONTENT (1u << 20)


static ZSTD_DCtx *dctx;
static uint8_t *out;

static bool ckpt_room(void *arg, size_t bytes)
{
	size_t *held = arg;

	if (*held + bytes > (64u << 20))
		return false;
	*held += bytes;
	return true;
}

static void ckpt_back(void *arg, size_t bytes)
{
	size_t *held = arg;

	*held -= bytes;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t held = 0;
	struct zseek_frame fr = {0};
	struct zseek_index idx = {0};
	struct zseek_stream s;
	struct memfile m;
	uint32_t d, ck;

	if (size < 8)
		return 0;
	if (!dctx) {
		dctx = ZSTD_createDCtx();
		out = malloc(MAX_CONTENT);
	}
	memcpy(&d, data, 4);
	memcpy(&ck, data + 4, 4);
	fr.d_size = d % (MAX_CONTENT + 1);
	fr.checksum = ck;
	fr.c_off = 8;
	fr.c_size = size - 8;
	fr.sized = true;
	(void)zseek_decode_frame(dctx, &fr, true, data + 8, out);
	(void)zseek_decode_frame(dctx, &fr, false, data + 8, out);
	/* streamed: a sub-folio from the middle, then from the start, then
	 * the middle again from a checkpoint saved on the way (every 1 KiB,
	 * in at most 64 MiB: a hostile header's window may be big) */
	m = (struct memfile){data, size};
	idx.nframes = 1;
	idx.frames = &fr;
	if (zseek_stream_init(&s) == 0) {
		s.ck_every = 1024;
		s.ck_take = ckpt_room;
		s.ck_give = ckpt_back;
		s.ck_arg = &held;
		if (fr.d_size >= 2)
			(void)zseek_stream_read(&s, mem_read, &m, &idx, 0,
						fr.d_size / 2,
						out, fr.d_size - fr.d_size / 2);
		(void)zseek_stream_read(&s, mem_read, &m, &idx, 0, 0, out,
					fr.d_size);
		if (fr.d_size >= 2)
			(void)zseek_stream_read(&s, mem_read, &m, &idx, 0,
						fr.d_size / 2,
						out, fr.d_size - fr.d_size / 2);
		zseek_stream_free(&s);
		if (held) /* every state given back */
			__builtin_trap();
	}
	return 0;
}
