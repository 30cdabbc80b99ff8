// SPDX-License-Identifier: MIT
/* Fuzz the seek-table parser: any file, a clear error or a sane index. */
#include <stdlib.h>
#include <string.h>

#include "../../format/format.h"
#include "../memread.h"


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct memfile m = {data, size};
	struct zseek_index idx = {0};
	char err[256];

	if (zseek_parse_seek_table(mem_read, &m, size, &idx, err, sizeof(err)) == 0) {
		uint64_t d = 0;

		for (uint32_t i = 0; i < idx.nframes; i++) {
			const struct zseek_frame *f = &idx.frames[i];

			if (f->c_off + f->c_size > size || f->d_off != d ||
			    f->d_size > ZSEEK_MAX_FRAME_CONTENT)
				abort();
			d += f->d_size;
		}
		if (d != idx.content_size)
			abort();
		if (idx.nframes)
			(void)zseek_find_frame(&idx, d ? d - 1 : 0);
		zseek_index_free(&idx);
	}
	return 0;
}
