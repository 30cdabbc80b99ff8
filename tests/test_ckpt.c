// SPDX-License-Identifier: MIT
/*
 * Checkpoints of the stream decoder: a big frame read in any order gives
 * the right bytes, going back to the nearest saved state before each read
 * instead of to the frame's start; states are saved where the owner gives
 * room and given back when the stream goes; the frame's checksum is still
 * checked at its end, after a read that went back.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../format/format.h"
#include "check.h"
#include "memread.h"

#define CONTENT (24u << 20)
#define EVERY (2u << 20)
#define PIECE (1u << 20)

struct room {
	long taken, given, limit;
};

static bool take(void *arg, size_t bytes)
{
	struct room *r = arg;

	(void)bytes;
	if (r->taken - r->given >= r->limit)
		return false;
	r->taken++;
	return true;
}

static void give(void *arg, size_t bytes)
{
	struct room *r = arg;

	(void)bytes;
	r->given++;
}

static unsigned char *src;
static unsigned char *z;
static size_t zn;

/* One frame of CONTENT bytes, a 1 MiB window, with its checksum: a plain
 * `zstd` file, small. */
static void make_frame(void)
{
	ZSTD_CCtx *c = ZSTD_createCCtx();
	size_t cap = ZSTD_compressBound(CONTENT);
	unsigned long long x = 88172645463325252ull;

	src = malloc(CONTENT);
	z = malloc(cap);
	for (size_t i = 0; i < CONTENT; i++) { /* text-like: 3:1 or so */
		if (i % 16 == 0) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
		}
		src[i] = (unsigned char)("etaoin shrdlu\n"[(x >> (i % 16 * 4)) %
							  14]);
	}
	ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 3);
	ZSTD_CCtx_setParameter(c, ZSTD_c_windowLog, 20);
	ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
	zn = ZSTD_compress2(c, z, cap, src, CONTENT);
	CHECK(!ZSTD_isError(zn));
	ZSTD_freeCCtx(c);
}

static void stream_with(struct zseek_stream *s, struct room *r)
{
	CHECK_EQ(zseek_stream_init(s), 0);
	s->ck_every = EVERY;
	s->ck_take = take;
	s->ck_give = give;
	s->ck_arg = r;
}

static void index_of(struct memfile *m, struct zseek_index *idx)
{
	char err[256];

	*idx = (struct zseek_index){0};
	CHECK_EQ(zseek_index_build(mem_read, m, m->len, true, idx, err,
				   sizeof(err)),
		 0);
	CHECK_EQ(idx->nframes, 1);
}

/* What a test reads with: the frame in memory, its index, one stream
 * whose owner gives room for limit states, and a piece's buffer. */
struct fix {
	struct memfile m;
	struct zseek_index idx;
	struct zseek_stream s;
	struct room r;
	unsigned char *got;
};

static void fix_up(struct fix *x, long limit)
{
	x->m = (struct memfile){z, zn};
	x->r = (struct room){.limit = limit};
	x->got = malloc(PIECE);
	index_of(&x->m, &x->idx);
	stream_with(&x->s, &x->r);
}

/* The stream freed: every state it saved given back. */
static void fix_down(struct fix *x)
{
	zseek_stream_free(&x->s);
	CHECK_EQ(x->r.given, x->r.taken);
	zseek_index_free(&x->idx);
	free(x->got);
}

/* len bytes at off, checked against the source. */
static void read_at(struct fix *x, uint64_t off, size_t len)
{
	CHECK_EQ(zseek_stream_read(&x->s, mem_read, &x->m, &x->idx, 0, off,
				   x->got, len),
		 0);
	CHECK(memcmp(x->got, src + off, len) == 0);
}

/* Read through once: a state saved at every 2 MiB inside the frame; then
 * pieces backwards, each from the checkpoint just before it. */
static void test_back(void)
{
	struct fix x;
	uint64_t skipped;

	fix_up(&x, 100);
	for (uint64_t off = 0; off < CONTENT; off += PIECE)
		read_at(&x, off, PIECE);
	CHECK_EQ(x.r.taken, CONTENT / EVERY - 1); /* not at 0, nor at the end */
	CHECK_EQ(x.s.restores, 0);
	skipped = x.s.skipped;
	for (int k = 0; k < 8; k++) { /* 23, 20, ... 2 MiB and a bit */
		uint64_t off = CONTENT - PIECE + 12345 - k * 3ull * PIECE;
		uint64_t ck = zseek_stream_ckpt_below(&x.s, 0, off);

		CHECK(ck > 0 && ck <= off && off - ck < EVERY);
		read_at(&x, off, 4096);
	}
	CHECK_EQ(x.s.restores, 8);
	/* each went back to within EVERY of its bytes */
	CHECK(x.s.skipped - skipped < 8 * (uint64_t)EVERY);
	/* the frame's end, after going back: its checksum checked */
	read_at(&x, CONTENT - PIECE, PIECE);
	fix_down(&x); /* all given back */
	CHECK_EQ(zseek_stream_ckpt_below(&x.s, 0, CONTENT), 0);
}

/* Reads in a random order, a few bytes to a piece: every byte right;
 * only as many states as the owner gives room for. */
static void test_random(void)
{
	struct fix x;
	unsigned int seed = 7;

	fix_up(&x, 3);
	for (int i = 0; i < 60; i++) {
		size_t len = 1 + (size_t)rand_r(&seed) % PIECE;
		uint64_t off = (uint64_t)rand_r(&seed) % (CONTENT - len);

		read_at(&x, off, len);
	}
	CHECK_EQ(x.r.taken, 3);
	CHECK(x.s.restores > 0);
	zseek_stream_drop_ckpts(&x.s);
	CHECK_EQ(x.r.given, 3);
	fix_down(&x);
}

/* Two readers taking turns on one stream: a sequential one, and one
 * reading near the frame's start.  The stream keeps the place it leaves
 * going back, so the sequential one goes on from there, not from the
 * checkpoint behind it. */
static void test_place(void)
{
	struct fix x;
	uint64_t skipped;

	fix_up(&x, 100);
	read_at(&x, CONTENT - PIECE, PIECE);
	skipped = x.s.skipped;
	for (int i = 0; i < 8; i++) {
		read_at(&x, 13 * PIECE + PIECE / 2 + (uint64_t)i * PIECE,
			PIECE);
		read_at(&x, 3 * PIECE + 5, 4096);
	}
	/* b: 1 MiB from the checkpoint at 2 MiB each time; a: 1.5 MiB from
	 * the one at 12 MiB the first time, then none, from where it left
	 * (without the place kept, 0.5 or 1.5 MiB each time) */
	CHECK(x.s.skipped - skipped <=
	      8 * (uint64_t)PIECE + 3 * PIECE / 2 + 8 * 8);
	fix_down(&x);
}

/* Pieces filled out of order, as two workers fill a sequential reader's
 * windows: the one for piece t + 1 comes first, keeps the place of piece
 * t (which the other is filling) and decodes past it; piece t goes back
 * to that place, and keeps the place it leaves for piece t + 2.  Nothing
 * is decoded twice but piece t, and nothing from a checkpoint behind. */
static void test_keep_at(void)
{
	struct fix x;
	uint64_t skipped;

	fix_up(&x, 100);
	read_at(&x, 0, PIECE);
	read_at(&x, PIECE / 2, PIECE); /* off the 2 MiB marks */
	skipped = x.s.skipped;
	for (uint64_t t = 3 * PIECE / 2; t + 3 * PIECE <= CONTENT;
	     t += 3 * PIECE) {
		CHECK_EQ(zseek_stream_keep_at(&x.s, mem_read, &x.m, &x.idx, 0,
					      t),
			 0);
		read_at(&x, t + PIECE, PIECE);
		read_at(&x, t, PIECE);
		read_at(&x, t + 2 * PIECE, PIECE);
	}
	/* 7 rounds: piece t decoded in passing once each, two restores */
	CHECK_EQ(x.s.restores, 14);
	CHECK(x.s.skipped - skipped <= 7 * (uint64_t)PIECE);
	fix_down(&x);
}

/* A checksum that fails is found at the frame's end whether the read came
 * there from the start or from a checkpoint. */
static void test_checksum(void)
{
	unsigned char *bad = malloc(zn);
	struct memfile m = {bad, zn};
	struct zseek_index idx;
	struct zseek_stream s;
	struct room r = {.limit = 100};
	unsigned char *got = malloc(PIECE);

	memcpy(bad, z, zn);
	bad[zn - 1] ^= 0x40; /* the frame's checksum, its last 4 bytes */
	index_of(&m, &idx);
	stream_with(&s, &r);
	CHECK_EQ(zseek_stream_read(&s, mem_read, &m, &idx, 0, CONTENT - PIECE,
				   got, PIECE),
		 -EBADMSG);
	CHECK(r.taken > 0);
	CHECK_EQ(zseek_stream_read(&s, mem_read, &m, &idx, 0, CONTENT - PIECE,
				   got, PIECE),
		 -EBADMSG);
	CHECK_EQ(s.restores, 1);
	zseek_stream_free(&s);
	CHECK_EQ(r.given, r.taken);
	zseek_index_free(&idx);
	free(bad);
	free(got);
}

int main(void)
{
	make_frame();
	RUN(test_back);
	RUN(test_random);
	RUN(test_place);
	RUN(test_keep_at);
	RUN(test_checksum);
	free(src);
	free(z);
	return check_done();
}
