/* SPDX-License-Identifier: MIT */
/*
 * zseek internals: what zseek.c (indexes, the seek table) and frame.c
 * (single frames, the stream decoder) share.  Not part of format.h's API.
 */
#ifndef ZF_FORMAT_ZSEEK_INTERNAL_H
#define ZF_FORMAT_ZSEEK_INTERNAL_H

#include <errno.h>

#include "format.h"

/* Read exactly len bytes at off, or fail. */
static inline int read_exact(zseek_read_fn rd, void *ctx, void *buf, size_t len,
			     uint64_t off)
{
	ssize_t n = rd(ctx, buf, len, off);

	if (n < 0)
		return (int)n;
	return (size_t)n == len ? 0 : -EBADMSG;
}

#endif
