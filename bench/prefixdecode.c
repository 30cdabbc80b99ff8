// SPDX-License-Identifier: MIT
/*
 * What decoding a frame only up to the bytes asked for would save.
 *
 *   zfolio-prefixdecode FILE [FRAME_KB BLOCK_KB]...
 *
 * Cuts FILE (up to 64 MiB of it) into frames of FRAME_KB, each compressed at
 * zstd level 3 with blocks of at most BLOCK_KB (ZSTD_c_maxBlockSize), and
 * prints the ratio, the time to decode each frame whole, and the time to
 * decode it only up to the end of its first, second, ... block with
 * zstd's block-by-block API (what a partial decode would do: zstd decodes
 * a block whole, so a frame of one block cannot be decoded in part).
 * Every decoded byte is compared with the input.  Defaults: 128 128,
 * 128 32, 128 16, 32 32.
 */
#define ZSTD_STATIC_LINKING_ONLY
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zstd.h>

#define INPUT_MAX_BYTES (64u << 20)
#define RUNS 3

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

struct frames {
	size_t n, size;
	char **data;
	size_t *csize;
	size_t total;
};

static int compress_all(const char *in, size_t len, size_t fsize,
			size_t bsize, struct frames *fr)
{
	ZSTD_CCtx *c = ZSTD_createCCtx();
	size_t bound = ZSTD_compressBound(fsize);

	fr->n = len / fsize;
	fr->size = fsize;
	fr->data = calloc(fr->n, sizeof(*fr->data));
	fr->csize = calloc(fr->n, sizeof(*fr->csize));
	fr->total = 0;
	if (!c || !fr->data || !fr->csize)
		return -1;
	ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 3);
	if (bsize < fsize)
		ZSTD_CCtx_setParameter(c, ZSTD_c_maxBlockSize, (int)bsize);
	for (size_t i = 0; i < fr->n; i++) {
		fr->data[i] = malloc(bound);
		if (!fr->data[i])
			return -1;
		fr->csize[i] = ZSTD_compress2(c, fr->data[i], bound,
					      in + i * fsize, fsize);
		if (ZSTD_isError(fr->csize[i]))
			return -1;
		fr->total += fr->csize[i];
	}
	ZSTD_freeCCtx(c);
	return 0;
}

/* Decode frame src up to the end of block k (k < 0: whole): bytes out. */
static long decode_prefix(ZSTD_DCtx *d, const char *src, char *out,
			  size_t cap, int k)
{
	size_t pos = 0, ip = 0;
	int blocks = 0;

	ZSTD_decompressBegin(d);
	for (;;) {
		size_t want = ZSTD_nextSrcSizeToDecompress(d);
		size_t r;

		if (!want)
			break;
		r = ZSTD_decompressContinue(d, out + pos, cap - pos, src + ip,
					    want);
		if (ZSTD_isError(r))
			return -1;
		ip += want;
		if (r) {
			pos += r;
			if (k >= 0 && ++blocks > k)
				break;
		}
	}
	return (long)pos;
}

/* Microseconds per frame to decode up to block k; -1 if a byte differs. */
static double time_prefix(const struct frames *fr, const char *in, int k)
{
	ZSTD_DCtx *d = ZSTD_createDCtx();
	char *out = malloc(fr->size);
	double best = 1e30;

	for (int run = 0; run < RUNS; run++) {
		double t = now();

		for (size_t i = 0; i < fr->n; i++) {
			long got = decode_prefix(d, fr->data[i], out, fr->size, k);

			if (got < 0 || memcmp(out, in + i * fr->size, (size_t)got))
				return -1;
		}
		t = (now() - t) / (double)fr->n * 1e6;
		if (t < best)
			best = t;
	}
	free(out);
	ZSTD_freeDCtx(d);
	return best;
}

static void free_frames(struct frames *fr)
{
	for (size_t i = 0; i < fr->n; i++)
		free(fr->data[i]);
	free(fr->data);
	free(fr->csize);
}

static int run(const char *in, size_t len, size_t fkb, size_t bkb)
{
	struct frames fr;
	size_t nblocks = fkb / bkb ? fkb / bkb : 1;
	double whole, sum = 0;

	if (compress_all(in, len, fkb << 10, bkb << 10, &fr) || !fr.n) {
		fprintf(stderr, "prefixdecode: cannot compress\n");
		return 1;
	}
	whole = time_prefix(&fr, in, -1);
	printf("frame %zuK, blocks %zuK: ratio %.3f, whole frame %.1f us;"
	       " up to block",
	       fkb, bkb, (double)(fr.n * fr.size) / (double)fr.total, whole);
	for (size_t k = 0; k < nblocks; k++) {
		double t = time_prefix(&fr, in, (int)k);

		if (t < 0 || whole < 0) {
			fprintf(stderr, "\nprefixdecode: decoded bytes differ\n");
			return 1;
		}
		printf(" %zu: %.1f", k + 1, t);
		sum += t;
	}
	printf(" us; a random byte: %.1f us (%.2fx less than whole)\n",
	       sum / (double)nblocks, whole / (sum / (double)nblocks));
	free_frames(&fr);
	return 0;
}

int main(int argc, char **argv)
{
	static const size_t defaults[] = {128, 128, 128, 32, 128, 16, 32, 32};
	FILE *f;
	char *in;
	size_t len;
	int err = 0;

	if (argc < 2 || argc % 2) {
		fprintf(stderr, "usage: %s FILE [FRAME_KB BLOCK_KB]...\n",
			argv[0]);
		return 2;
	}
	f = fopen(argv[1], "rb");
	in = malloc(INPUT_MAX_BYTES);
	if (!f || !in) {
		perror(argv[1]);
		return 1;
	}
	len = fread(in, 1, INPUT_MAX_BYTES, f);
	fclose(f);
	if (argc == 2)
		for (size_t i = 0; i < 8 && !err; i += 2)
			err = run(in, len, defaults[i], defaults[i + 1]);
	for (int i = 2; i + 1 < argc && !err; i += 2)
		err = run(in, len, (size_t)atoi(argv[i]), (size_t)atoi(argv[i + 1]));
	free(in);
	return err;
}
