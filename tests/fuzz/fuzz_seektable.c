// SPDX-License-Identifier: MIT
/* Fuzz the seek-table parser: any file, a clear error or a sane index. */
#include <stdlib.h>
#include <string.h>

#include "../../fs/fs.h"

struct mem {
	const uint8_t *p;
	size_t n;
};

static ssize_t rd(void *ctx, void *buf, size_t len, uint64_t off)
{
	struct mem *m = ctx;

	if (off >= m->n)
		return 0;
	if (len > m->n - off)
		len = m->n - (size_t)off;
	memcpy(buf, m->p + off, len);
	return (ssize_t)len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct mem m = {data, size};
	struct zseek_index idx = {0};
	char err[256];

	if (zseek_parse_seek_table(rd, &m, size, &idx, err, sizeof(err)) == 0) {
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
