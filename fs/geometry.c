// SPDX-License-Identifier: MIT
/*
 * Folio geometry: where a dataset file's folios are and which frame holds
 * each.
 *
 * A folio is one frame's content.  A raw (not zstd) file is cut into
 * ZSEEK_DEFAULT_FRAME folios.  A frame bigger than ZSEEK_SPLIT_ABOVE (a
 * foreign file written as one big frame) is served in ZSEEK_SUBFOLIO
 * folios, streamed from the frame's start: slowly for random access, at
 * full speed for a sequential reader, whose stream continues (stream.c).
 * Frames of one size (what mkzfolio writes) need no table: a folio's place
 * is its index times that size; otherwise starts[] holds each folio's
 * place, and for split frames slot_frame[] and slot_skip[] its frame and
 * where in it the folio begins.
 */
#include <errno.h>
#include <stdlib.h>

#include "internal.h"

static bool frame_split(const struct zseek_frame *fr)
{
	return fr->d_size > ZSEEK_SPLIT_ABOVE;
}

int zfile_build_geometry(struct zfile *f)
{
	const struct zseek_index *idx = &f->idx;
	/* a raw file has no frames */
	uint64_t first = idx->nframes ? zseek_frame_at(idx, 0).d_size : 0;
	unsigned long n = 0, k = 0;
	bool split = false, fixed = true;

	if (idx->kind == ZSEEK_RAW) {
		f->folio_size = ZSEEK_DEFAULT_FRAME;
		f->nslots = (unsigned long)((idx->content_size +
					     ZSEEK_DEFAULT_FRAME - 1) /
					    ZSEEK_DEFAULT_FRAME);
		f->parts = calloc(f->nslots ? f->nslots : 1, sizeof(*f->parts));
		return f->parts ? 0 : -ENOMEM;
	}
	for (uint32_t i = 0; i < idx->nframes; i++) {
		struct zseek_frame fr = zseek_frame_at(idx, i);

		if (frame_split(&fr)) {
			split = true;
			n += (unsigned long)((fr.d_size + ZSEEK_SUBFOLIO - 1) /
					     ZSEEK_SUBFOLIO);
		} else {
			n++;
		}
		if (i + 1 < idx->nframes && fr.d_size != first)
			fixed = false;
	}
	f->nslots = n;
	f->parts = calloc(n ? n : 1, sizeof(*f->parts));
	f->raw_at = calloc(n ? n : 1, sizeof(*f->raw_at));
	if (!f->parts || !f->raw_at)
		return -ENOMEM;
	/* frames of one size: a folio's place is its index times that */
	if (!split && fixed && idx->nframes) {
		f->folio_size = (uint32_t)first;
		return 0;
	}
	f->starts = calloc(n + 1, sizeof(*f->starts));
	if (split) {
		f->slot_frame = calloc(n ? n : 1, sizeof(*f->slot_frame));
		f->slot_skip = calloc(n ? n : 1, sizeof(*f->slot_skip));
	}
	if (!f->starts || (split && (!f->slot_frame || !f->slot_skip)))
		return -ENOMEM;
	for (uint32_t i = 0; i < idx->nframes; i++) {
		struct zseek_frame fr = zseek_frame_at(idx, i);
		uint64_t step = frame_split(&fr) ? ZSEEK_SUBFOLIO : fr.d_size;

		for (uint64_t off = 0; off < fr.d_size; off += step, k++) {
			f->starts[k] = fr.d_off + off;
			if (split) {
				f->slot_frame[k] = i;
				f->slot_skip[k] = off;
			}
		}
	}
	f->starts[n] = idx->content_size;
	return 0;
}

uint32_t zfile_slot_frame(const struct zfile *f, unsigned long i)
{
	return f->slot_frame ? f->slot_frame[i] : (uint32_t)i;
}

bool zfile_slot_split(const struct zfile *f, unsigned long i)
{
	struct zseek_frame fr;

	if (!f->slot_frame)
		return false;
	fr = zseek_frame_at(&f->idx, f->slot_frame[i]);
	return frame_split(&fr);
}
