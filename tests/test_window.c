// SPDX-License-Identifier: MIT
/*
 * Windows (max_window=): a frame whose header asks for a window over the
 * limit is refused with the reason and the option that lifts it; raised,
 * the same frame is indexed, measured and decoded by the stream decoder,
 * whose own limit follows; lowered, a frame the default takes is refused.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../format/format.h"
#include "check.h"
#include "memread.h"

#define CONTENT (1u << 20)

/*
 * One frame of src, compressed at windowLog log without a content size
 * (as `zstd --long=N` reading a pipe writes it): its header asks for the
 * whole 2^log window, however little it holds.
 */
static size_t frame_of(unsigned char *out, size_t cap, const void *src,
		       size_t n, int log)
{
	ZSTD_CCtx *c = ZSTD_createCCtx();
	ZSTD_outBuffer o = {out, cap, 0};
	ZSTD_inBuffer in = {src, n / 2, 0};
	size_t r;

	ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 3);
	ZSTD_CCtx_setParameter(c, ZSTD_c_windowLog, log);
	ZSTD_CCtx_setParameter(c, ZSTD_c_enableLongDistanceMatching, 1);
	/* the size is not known before the end: the window stays 2^log */
	r = ZSTD_compressStream2(c, &o, &in, ZSTD_e_continue);
	CHECK(!ZSTD_isError(r) && in.pos == in.size);
	in = (ZSTD_inBuffer){(const char *)src + n / 2, n - n / 2, 0};
	do
		r = ZSTD_compressStream2(c, &o, &in, ZSTD_e_end);
	while (r && !ZSTD_isError(r));
	CHECK(!ZSTD_isError(r));
	ZSTD_freeCCtx(c);
	return o.pos;
}

static unsigned long long window_of(const unsigned char *z, size_t n)
{
	ZSTD_frameHeader fh;

	CHECK_EQ(ZSTD_getFrameHeader(&fh, z, n), 0);
	return fh.windowSize;
}

static void test_limits(void)
{
	size_t cap = ZSTD_compressBound(CONTENT) + 1024;
	unsigned char *src = malloc(CONTENT), *got = malloc(CONTENT);
	unsigned char *z28 = malloc(cap), *z27 = malloc(cap);
	size_t n28, n27;
	struct memfile m28, m27;
	struct zseek_index idx = {0};
	struct zseek_stream s;
	struct zseek_frame fr;
	uint64_t need;
	char err[256] = "";

	for (size_t i = 0; i < CONTENT; i++) /* compressible, not trivially */
		src[i] = (unsigned char)("abcdefgh"[(i * 7 + i / 4096) % 8] +
					 (i % 13 == 0));
	n28 = frame_of(z28, cap, src, CONTENT, 28);
	n27 = frame_of(z27, cap, src, CONTENT, 27);
	CHECK_EQ(window_of(z28, n28), 1ull << 28);
	CHECK_EQ(window_of(z27, n27), 1ull << 27);
	m28 = (struct memfile){z28, n28};
	m27 = (struct memfile){z27, n27};

	/* the default: what zstd -d takes without --long */
	CHECK_EQ(zseek_window_max(), ZSEEK_DEFAULT_WINDOW);
	CHECK_EQ(zseek_index_build(mem_read, &m28, n28, true, &idx, err,
				   sizeof(err)),
		 -EBADMSG);
	CHECK(strstr(err, "needs a 256 MiB window, over the limit of 128 MiB") &&
	      strstr(err, "max_window="));
	CHECK_EQ(zseek_index_build(mem_read, &m27, n27, true, &idx, err,
				   sizeof(err)),
		 0);
	zseek_index_free(&idx);

	/* raised: indexed, measured by decoding (no content size), read in
	 * the middle; the stream decoder takes the bigger window too */
	zseek_set_window_max(256u << 20);
	CHECK_EQ(zseek_index_build(mem_read, &m28, n28, true, &idx, err,
				   sizeof(err)),
		 0);
	if (idx.nframes != 1) { /* said above: nothing to read */
		CHECK_EQ(idx.nframes, 1);
		goto out;
	}
	CHECK_EQ(idx.content_size, CONTENT);
	fr = zseek_frame_at(&idx, 0);
	CHECK_EQ(zseek_stream_need(mem_read, &m28, &fr, &need), 0);
	CHECK(need >= 1ull << 28);
	CHECK_EQ(zseek_stream_init(&s), 0);
	CHECK_EQ(zseek_stream_read(&s, mem_read, &m28, &idx, 0, 12345, got,
				   CONTENT - 12345),
		 0);
	CHECK(memcmp(got, src + 12345, CONTENT - 12345) == 0);
	zseek_stream_free(&s);
	zseek_index_free(&idx);

	/* a limit between powers of two: the header's window counts */
	zseek_set_window_max(200u << 20);
	CHECK_EQ(zseek_index_build(mem_read, &m28, n28, true, &idx, err,
				   sizeof(err)),
		 -EBADMSG);
	CHECK_EQ(zseek_stream_need(mem_read, &m28, &fr, &need), -EBADMSG);

	/* lowered: the default's largest is refused too */
	zseek_set_window_max(64u << 20);
	CHECK_EQ(zseek_index_build(mem_read, &m27, n27, true, &idx, err,
				   sizeof(err)),
		 -EBADMSG);
	CHECK(strstr(err, "over the limit of 64 MiB") != NULL);

	/* held to what zstd decodes at all */
	zseek_set_window_max(3ull << 30);
	CHECK_EQ(zseek_window_max(), ZSEEK_LARGEST_WINDOW);
out:
	zseek_set_window_max(ZSEEK_DEFAULT_WINDOW);
	free(src);
	free(got);
	free(z28);
	free(z27);
}

int main(void)
{
	RUN(test_limits);
	return check_done();
}
