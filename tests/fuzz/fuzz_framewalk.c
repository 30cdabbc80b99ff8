// SPDX-License-Identifier: MIT
/*
 * Fuzz indexing a .zst file without a usable seek table: the frame-header
 * and block-header walk, and the measuring of frames without a size.
 */
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

	if (zseek_walk_frames(rd, &m, size, &idx, err, sizeof(err)) == 0) {
		for (uint32_t i = 0; i < idx.nframes; i++)
			if (idx.frames[i].c_off + idx.frames[i].c_size > size)
				abort();
		zseek_index_free(&idx);
	}
	/* the whole indexing path, seek table first, then the walk */
	if (zseek_index_build(rd, &m, size, true, &idx, err, sizeof(err)) == 0)
		zseek_index_free(&idx);
	return 0;
}
