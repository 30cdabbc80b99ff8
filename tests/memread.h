/* SPDX-License-Identifier: MIT */
/* A zseek_read_fn over a buffer in memory: tests and fuzz targets. */
#ifndef ZF_TESTS_MEMREAD_H
#define ZF_TESTS_MEMREAD_H

#include <string.h>
#include <sys/types.h>

struct memfile {
	const unsigned char *p;
	size_t len;
};

static inline ssize_t mem_read(void *ctx, void *buf, size_t len, uint64_t off)
{
	const struct memfile *m = ctx;

	if (off >= m->len)
		return 0;
	if (len > m->len - off)
		len = m->len - (size_t)off;
	memcpy(buf, m->p + off, len);
	return (ssize_t)len;
}

#endif
