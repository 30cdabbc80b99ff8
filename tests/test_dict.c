// SPDX-License-Identifier: MIT
/*
 * Dictionaries (format/dict.c): a file whose frames name a dictionary is
 * indexed and decoded once that dictionary is given, by zseek_decode_frame
 * and by the stream decoder alike; frames that name none decode without
 * one, whatever was decoded before on the same context; a frame naming a
 * dictionary not given is refused with a reason, never decoded wrong.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zdict.h>

#include "../format/format.h"
#include "check.h"
#include "memread.h"

#define NSAMPLES 200
#define SAMPLE	 1500
#define PART	 40000

/* text whose phrases repeat across samples, so a dictionary helps */
static void make_text(unsigned char *p, size_t n, unsigned long long seed,
		      unsigned int vocab)
{
	for (size_t i = 0; i < n;) {
		unsigned long long w = test_rand(&seed) % vocab;
		char word[32];
		int len = snprintf(word, sizeof(word), "w%llu-%llx ", w,
				   (w * 2654435761u) & 0xfffff);

		for (int k = 0; k < len && i < n; k++)
			p[i++] = (unsigned char)word[k];
	}
}

/* A dictionary trained on samples from seed: its size, in dict. */
static size_t train(void *dict, size_t cap, unsigned long long seed)
{
	unsigned char *samples = malloc(NSAMPLES * SAMPLE);
	size_t sizes[NSAMPLES], n;

	for (int i = 0; i < NSAMPLES; i++) {
		make_text(samples + i * SAMPLE, SAMPLE, seed + (unsigned)i,
			  3000);
		sizes[i] = SAMPLE;
	}
	n = ZDICT_trainFromBuffer(dict, cap, samples, sizes, NSAMPLES);
	CHECK(!ZDICT_isError(n));
	free(samples);
	return ZDICT_isError(n) ? 0 : n;
}

/* src compressed into out at *len, with dict (or without, dict NULL). */
static void put_frame(unsigned char *out, size_t *len, const void *src,
		      size_t n, const void *dict, size_t dict_len)
{
	ZSTD_CCtx *c = ZSTD_createCCtx();
	size_t r =
	    dict ? ZSTD_compress_usingDict(c, out + *len, ZSTD_compressBound(n),
					   src, n, dict, dict_len, 3)
		 : ZSTD_compressCCtx(c, out + *len, ZSTD_compressBound(n), src,
				     n, 3);

	CHECK(!ZSTD_isError(r));
	*len += r;
	ZSTD_freeCCtx(c);
}

static void test_dictionaries(void)
{
	static unsigned char dict[64 << 10], other[64 << 10];
	size_t dlen = train(dict, sizeof(dict), 100);
	size_t olen = train(other, sizeof(other), 900);
	unsigned char *src = malloc(3 * PART), *got = malloc(PART);
	unsigned char *z = malloc(4 * ZSTD_compressBound(PART));
	size_t zlen = 0, zother;
	struct memfile m;
	struct zseek_index idx;
	struct zseek_stream s;
	ZSTD_DCtx *d = ZSTD_createDCtx();
	char err[256] = "";
	/* the order reads come in: a dictionary's frame, then one without,
	 * then the first again (nothing of one frame's may stay for the next)
	 */
	static const uint32_t order[] = {0, 1, 0, 2, 1};

	make_text(src, 3 * PART, 5, 3000);
	put_frame(z, &zlen, src, PART, dict, dlen);
	put_frame(z, &zlen, src + PART, PART, NULL, 0);
	put_frame(z, &zlen, src + 2 * PART, PART, dict, dlen);
	m = (struct memfile){z, zlen};

	/* not given: refused, and the reason names it */
	CHECK_EQ(
	    zseek_index_build(mem_read, &m, zlen, true, &idx, err, sizeof(err)),
	    -EBADMSG);
	CHECK(strstr(err, "dictionary (ID") && strstr(err, "dict=FILE"));

	/* what is not a dictionary with an ID is refused with a reason */
	CHECK_EQ(zseek_dict_add(src, 5000, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "not a zstd dictionary") != NULL);
	CHECK_EQ(zseek_dict_count(), 0);
	CHECK_EQ(zseek_dict_add(dict, dlen, err, sizeof(err)), 0);
	CHECK_EQ(zseek_dict_add(dict, dlen, err, sizeof(err)), -EEXIST);
	CHECK_EQ(zseek_dict_count(), 1);
	CHECK(zseek_dict_bytes() >= dlen);
	CHECK(zseek_dict_find(0) == NULL);

	CHECK_EQ(
	    zseek_index_build(mem_read, &m, zlen, true, &idx, err, sizeof(err)),
	    0);
	CHECK_EQ(idx.nframes, 3);
	CHECK_EQ(idx.content_size, 3 * PART);
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		struct zseek_frame fr = zseek_frame_at(&idx, order[i]);

		memset(got, 0, PART);
		CHECK_EQ(zseek_decode_frame(d, &fr, false, z + fr.c_off, got),
			 0);
		CHECK(memcmp(got, src + order[i] * PART, PART) == 0);
	}
	/* the stream decoder, frame after frame in the same order */
	CHECK_EQ(zseek_stream_init(&s), 0);
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		memset(got, 0, PART);
		CHECK_EQ(zseek_stream_read(&s, mem_read, &m, &idx, order[i],
					   100, got, PART - 100),
			 0);
		CHECK(memcmp(got, src + order[i] * PART + 100, PART - 100) ==
		      0);
	}

	/* a frame naming a dictionary that was not given: never decoded */
	zother = zlen;
	put_frame(z, &zlen, src, PART, other, olen);
	{
		struct zseek_frame fr = {
		    .c_off = zother, .c_size = zlen - zother, .d_size = PART};

		CHECK_EQ(zseek_decode_frame(d, &fr, false, z + zother, got),
			 -EBADMSG);
	}
	m.len = zlen;
	zseek_index_free(&idx);
	CHECK_EQ(
	    zseek_index_build(mem_read, &m, zlen, true, &idx, err, sizeof(err)),
	    -EBADMSG);
	CHECK(strstr(err, "was not given") != NULL);

	zseek_dict_free_all();
	CHECK_EQ(zseek_dict_count(), 0);
	{
		struct zseek_frame fr = {.c_size = zother, .d_size = PART};

		/* the dictionary gone, its frames do not decode any more */
		fr.c_size = ZSTD_findFrameCompressedSize(z, zother);
		CHECK_EQ(zseek_decode_frame(d, &fr, false, z, got), -EBADMSG);
	}
	zseek_stream_free(&s);
	ZSTD_freeDCtx(d);
	free(src);
	free(got);
	free(z);
}

int main(void)
{
	RUN(test_dictionaries);
	return check_done();
}
