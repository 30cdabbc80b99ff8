// SPDX-License-Identifier: MIT
/*
 * Fuzz indexing a .zst file without a usable seek table: the frame-header
 * and block-header walk, and the measuring of frames without a size.
 */
#include <stdlib.h>
#include <string.h>

#include "../../format/format.h"
#include "../memread.h"


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct memfile m = {data, size};
	struct zseek_index idx = {0};
	char err[256];

	if (zseek_walk_frames(mem_read, &m, size, &idx, err, sizeof(err)) == 0) {
		struct zseek_frame *wide = NULL;

		for (uint32_t i = 0; i < idx.nframes; i++)
			if (idx.frames[i].c_off + idx.frames[i].c_size > size)
				abort();
		/* packed, every frame reads back as it was */
		if (idx.nframes &&
		    (wide = malloc(idx.nframes * sizeof(*wide)))) {
			memcpy(wide, idx.frames, idx.nframes * sizeof(*wide));
			(void)zseek_index_pack(&idx);
			for (uint32_t i = 0; i < idx.nframes; i++) {
				struct zseek_frame fr = zseek_frame_at(&idx, i);

				if (fr.c_off != wide[i].c_off ||
				    fr.c_size != wide[i].c_size ||
				    fr.d_off != wide[i].d_off ||
				    fr.d_size != wide[i].d_size ||
				    fr.checksum != wide[i].checksum)
					abort();
			}
			free(wide);
		}
		zseek_index_free(&idx);
	}
	/* the whole indexing path, seek table first, then the walk */
	if (zseek_index_build(mem_read, &m, size, true, &idx, err, sizeof(err)) == 0)
		zseek_index_free(&idx);
	return 0;
}
