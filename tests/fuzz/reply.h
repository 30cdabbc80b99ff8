// SPDX-License-Identifier: MIT
/* A cache read's reply, as the fuzz targets take it: its length, or its
 * error. */
#ifndef ZFOLIO_FUZZ_REPLY_H
#define ZFOLIO_FUZZ_REPLY_H

#include <stddef.h>
#include <sys/uio.h>

struct reply {
	size_t bytes;
	int err;
};

static inline int on_reply(void *arg, const struct iovec *iov, int cnt)
{
	struct reply *r = arg;

	r->bytes = 0;
	r->err = iov ? 0 : cnt;
	for (int i = 0; iov && i < cnt; i++)
		r->bytes += iov[i].iov_len;
	return 0;
}

#endif
