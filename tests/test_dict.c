// SPDX-License-Identifier: MIT
/*
 * Dictionaries (format/dict.c): a file whose frames name a dictionary is
 * indexed and decoded once that dictionary is given, by zseek_decode_frame
 * and by the stream decoder alike; frames that name none decode without
 * one, whatever was decoded before on the same context; an entry of
 * several frames decodes each with its own; a frame naming a dictionary
 * not given is refused (-ENOKEY) with a reason, never decoded wrong; and
 * dictionary files are loaded, or refused in a line, never waited on.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
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
	 * then the first again: each right whatever came before */
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
			 -ENOKEY);
		m.len = zlen;
		zseek_index_free(&idx);
		CHECK_EQ(zseek_index_build(mem_read, &m, zlen, true, &idx, err,
					   sizeof(err)),
			 -EBADMSG);
		CHECK(strstr(err, "was not given") != NULL);
		/* given as well, it decodes with its own */
		CHECK_EQ(zseek_dict_add(other, olen, err, sizeof(err)), 0);
		CHECK_EQ(zseek_decode_frame(d, &fr, false, z + zother, got), 0);
		CHECK(memcmp(got, src, PART) == 0);
		CHECK_EQ(zseek_index_build(mem_read, &m, zlen, true, &idx, err,
					   sizeof(err)),
			 0);
		CHECK_EQ(idx.nframes, 4);
	}

	zseek_dict_free_all();
	CHECK_EQ(zseek_dict_count(), 0);
	{
		struct zseek_frame fr = {.d_size = PART};

		/* the dictionaries gone, their frames do not decode any more */
		fr.c_size = ZSTD_findFrameCompressedSize(z, zother);
		CHECK_EQ(zseek_decode_frame(d, &fr, false, z, got), -ENOKEY);
	}
	zseek_index_free(&idx);
	zseek_stream_free(&s);
	ZSTD_freeDCtx(d);
	free(src);
	free(got);
	free(z);
}

/* An entry of several frames (a skippable one, one without a dictionary,
 * one with): each decodes with its own. */
static void test_entry_of_frames(void)
{
	static unsigned char dict[64 << 10];
	static const unsigned char skip[] = {0x50, 0x2a, 0x4d, 0x18, 4, 0,
					     0,	   0,	 1,    2,    3, 4};
	size_t dlen = train(dict, sizeof(dict), 300);
	unsigned char *src = malloc(2 * PART), *got = malloc(2 * PART);
	unsigned char *z = malloc(2 * ZSTD_compressBound(PART) + 16);
	ZSTD_DCtx *d = ZSTD_createDCtx();
	size_t zlen = sizeof(skip);
	char err[256];
	struct zseek_frame fr = {.d_size = 2 * PART};

	make_text(src, 2 * PART, 17, 3000);
	memcpy(z, skip, sizeof(skip));
	put_frame(z, &zlen, src, PART, NULL, 0);
	put_frame(z, &zlen, src + PART, PART, dict, dlen);
	CHECK_EQ(zseek_dict_add(dict, dlen, err, sizeof(err)), 0);
	fr.c_size = zlen;
	CHECK_EQ(zseek_decode_frame(d, &fr, false, z, got), 0);
	CHECK(memcmp(got, src, 2 * PART) == 0);
	/* the dictionary's frame first, then a skippable one and a plain */
	zlen = 0;
	put_frame(z, &zlen, src + PART, PART, dict, dlen);
	memcpy(z + zlen, skip, sizeof(skip));
	zlen += sizeof(skip);
	put_frame(z, &zlen, src, PART, NULL, 0);
	fr.c_size = zlen;
	CHECK_EQ(zseek_decode_frame(d, &fr, false, z, got), 0);
	CHECK(memcmp(got, src + PART, PART) == 0 &&
	      memcmp(got + PART, src, PART) == 0);
	zseek_dict_free_all();
	ZSTD_freeDCtx(d);
	free(src);
	free(got);
	free(z);
}

/* A file with a seek table (never walked) whose frames need a dictionary:
 * indexed without it, its frames are -ENOKEY, not a damaged frame. */
static void test_seekable(void)
{
	static unsigned char dict[64 << 10];
	size_t dlen = train(dict, sizeof(dict), 500);
	unsigned char *src = malloc(2 * PART), *got = malloc(PART);
	size_t cap = 2 * ZSTD_compressBound(PART) + zseek_table_size(2);
	unsigned char *z = malloc(cap);
	struct zseek_writer_entry e[2];
	struct zseek_index idx;
	struct memfile m;
	ZSTD_DCtx *d = ZSTD_createDCtx();
	size_t zlen = 0, at;
	char err[256];

	make_text(src, 2 * PART, 23, 3000);
	for (int i = 0; i < 2; i++) {
		at = zlen;
		put_frame(z, &zlen, src + i * PART, PART, dict, dlen);
		e[i] =
		    (struct zseek_writer_entry){(uint32_t)(zlen - at), PART, 0};
	}
	zlen += zseek_write_table(e, 2, z + zlen, cap - zlen);
	m = (struct memfile){z, zlen};
	CHECK_EQ(
	    zseek_index_build(mem_read, &m, zlen, true, &idx, err, sizeof(err)),
	    0);
	CHECK_EQ(idx.kind, ZSEEK_SEEKABLE);
	for (uint32_t i = 0; i < 2; i++) {
		struct zseek_frame fr = zseek_frame_at(&idx, i);

		CHECK_EQ(zseek_decode_frame(d, &fr, false, z + fr.c_off, got),
			 -ENOKEY);
		CHECK_EQ(zseek_dict_add(dict, dlen, err, sizeof(err)), 0);
		CHECK_EQ(zseek_decode_frame(d, &fr, false, z + fr.c_off, got),
			 0);
		CHECK(memcmp(got, src + i * PART, PART) == 0);
		zseek_dict_free_all();
	}
	zseek_index_free(&idx);
	ZSTD_freeDCtx(d);
	free(src);
	free(got);
	free(z);
}

static void write_file(const char *path, const void *p, size_t n)
{
	FILE *fp = fopen(path, "wb");

	CHECK(fp != NULL);
	if (fp) {
		CHECK_EQ(fwrite(p, 1, n, fp), n);
		fclose(fp);
	}
}

/* Dictionary files: a list loads each; what is not one is said at once. */
static void test_dict_files(void)
{
	static unsigned char dict[64 << 10], other[64 << 10];
	size_t dlen = train(dict, sizeof(dict), 100);
	size_t olen = train(other, sizeof(other), 900);
	char dir[] = "/tmp/zfolio-test-dict-XXXXXX", a[64], b[64], fifo[64];
	char list[200], err[512];

	CHECK(mkdtemp(dir) != NULL);
	snprintf(a, sizeof(a), "%s/a", dir);
	snprintf(b, sizeof(b), "%s/b", dir);
	snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
	write_file(a, dict, dlen);
	write_file(b, other, olen);
	CHECK_EQ(mkfifo(fifo, 0600), 0);

	snprintf(list, sizeof(list), "%s:%s", a, b);
	CHECK_EQ(zseek_dict_load(list, err, sizeof(err)), 0);
	CHECK_EQ(zseek_dict_count(), 2);
	zseek_dict_free_all();
	CHECK_EQ(zseek_dict_load(NULL, err, sizeof(err)), 0);
	CHECK_EQ(zseek_dict_count(), 0);
	/* a FIFO is refused, not opened and waited on */
	CHECK_EQ(zseek_dict_load(fifo, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "not a regular file") != NULL);
	CHECK_EQ(zseek_dict_load(dir, err, sizeof(err)), -EINVAL);
	snprintf(list, sizeof(list), "%s/none", dir);
	CHECK_EQ(zseek_dict_load(list, err, sizeof(err)), -ENOENT);
	CHECK(strstr(err, "No such file") != NULL);
	snprintf(list, sizeof(list), "%s:%s", a, a);
	CHECK_EQ(zseek_dict_load(list, err, sizeof(err)), -EEXIST);
	CHECK(strstr(err, "a second dictionary") != NULL);
	zseek_dict_free_all();

	unlink(a);
	unlink(b);
	unlink(fifo);
	rmdir(dir);
}

int main(void)
{
	RUN(test_dictionaries);
	RUN(test_entry_of_frames);
	RUN(test_seekable);
	RUN(test_dict_files);
	return check_done();
}
