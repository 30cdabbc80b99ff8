/* SPDX-License-Identifier: MIT */
/*
 * zseek internals: what zseek.c (indexes, the seek table), frame.c (single
 * frames) and stream.c (the stream decoder) share.  Not part of format.h's API.
 */
#ifndef ZF_FORMAT_ZSEEK_INTERNAL_H
#define ZF_FORMAT_ZSEEK_INTERNAL_H

#include <errno.h>
#include <zstd_errors.h>

#include "format.h"

/* A zstd error as ours: a frame naming a dictionary not given is -ENOKEY. */
static inline int zstd_err(size_t r)
{
	return ZSTD_getErrorCode(r) == ZSTD_error_dictionary_wrong ? -ENOKEY
								   : -EBADMSG;
}

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
