// SPDX-License-Identifier: MIT
/*
 * Holes: the frames of a file that hold only zeros, as lseek(SEEK_DATA,
 * SEEK_HOLE) and st_blocks show them.
 *
 * mkzfolio packs a hole of a sparse file as frames of zeros, each the same
 * few compressed bytes (tools/pool.c).  A frame is taken for one by its
 * seek table alone (a content checksum that is zeros', and a few bytes for
 * a lot of content): that is what st_blocks leaves out.  A seek believes
 * no table: a frame is a hole only once its bytes say so, decoded once per
 * file and compared with the first such frame's bytes after that (the
 * same bytes decode to the same content).  The candidates of a run are
 * read together, so a hole of many frames costs one backing read, not one
 * per frame (a request each in a store).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "internal.h"

/* The most compressed bytes a frame of zeros of d_size takes: zstd writes
 * 18 bytes for 128 KiB, 143 for 4 MiB (its blocks of zeros after the
 * first are 4 bytes each). */
static uint64_t zero_frame_max(uint64_t d_size)
{
	return 64 + d_size / 1024;
}

/* Candidate frames read at once, at most (3,000 frames of zeros: 100 MiB
 * of holes at 32 KiB a frame) */
#define RUN_BYTES (64u << 10)

#define ZERO_SUMS 8
static pthread_mutex_t sums_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	uint64_t len;
	uint32_t sum;
} sums[ZERO_SUMS];
static unsigned int nsums;

/* What a seek table says for len zeros: the low 32 bits of their XXH64. */
static uint32_t zero_sum(uint64_t len)
{
	static const uint8_t zeros[64 << 10];
	XXH64_state_t *st;
	uint32_t sum = 0;

	pthread_mutex_lock(&sums_lock);
	for (unsigned int i = 0; i < nsums && i < ZERO_SUMS; i++)
		if (sums[i].len == len) {
			sum = sums[i].sum;
			pthread_mutex_unlock(&sums_lock);
			return sum;
		}
	pthread_mutex_unlock(&sums_lock);
	st = XXH64_createState();
	if (!st) /* no answer: 0 is not zeros' sum for any length here */
		return 0;
	XXH64_reset(st, 0);
	for (uint64_t done = 0; done < len;) {
		size_t n = len - done < sizeof(zeros) ? (size_t)(len - done)
						      : sizeof(zeros);

		XXH64_update(st, zeros, n);
		done += n;
	}
	sum = (uint32_t)XXH64_digest(st);
	XXH64_freeState(st);
	pthread_mutex_lock(&sums_lock);
	sums[nsums % ZERO_SUMS].len = len;
	sums[nsums % ZERO_SUMS].sum = sum;
	nsums++;
	pthread_mutex_unlock(&sums_lock);
	return sum;
}

/*
 * Whether f's frame i, fr, may be zeros, by its table entry alone.  Only a
 * frame of the first one's size, or the last (what mkzfolio writes), is
 * looked at: a hostile table of many sizes would have zeros' checksum
 * computed for each.
 */
static bool zero_candidate(const struct zfile *f, const struct zseek_frame *fr,
			   uint32_t i)
{
	return f->decode && f->idx.kind == ZSEEK_SEEKABLE &&
	       f->idx.has_checksum && fr->d_size &&
	       (i + 1 == f->idx.nframes ||
		fr->d_size == zseek_frame_at(&f->idx, 0).d_size) &&
	       fr->d_size <= ZSEEK_SPLIT_ABOVE &&
	       fr->c_size <= zero_frame_max(fr->d_size) &&
	       fr->checksum == zero_sum(fr->d_size);
}

void zfile_count_zeros(struct zfile *f)
{
	uint64_t n = 0;

	if (!f->decode || f->idx.kind != ZSEEK_SEEKABLE ||
	    !f->idx.has_checksum) /* no checksums: no candidates */
		return;
	for (uint32_t i = 0; i < f->idx.nframes; i++) {
		struct zseek_frame fr = zseek_frame_at(&f->idx, i);

		if (zero_candidate(f, &fr, i))
			n += fr.d_size;
	}
	f->zero_bytes = n;
}

/* A frame of zeros, as it is in the file. */
struct zero_sig {
	uint64_t d_size, c_size;
	uint8_t bytes[];
};

void zfile_zero_sig_free(struct zfile *f)
{
	free(atomic_load(&f->zero_sig));
}

struct seek {
	struct zfile *f;
	ZSTD_DCtx *dctx; /* made at the first frame decoded */
	uint8_t *run;    /* the run's compressed bytes */
};

/* Whether frame fr, its bytes at src, is zeros: 1, 0, or -errno. */
static int frame_zeros(struct seek *s, const struct zseek_frame *fr,
		       const uint8_t *src)
{
	struct zero_sig *sig = atomic_load(&s->f->zero_sig), *mine;
	uint8_t *dst;
	int r;

	if (sig && sig->d_size == fr->d_size && sig->c_size == fr->c_size &&
	    !memcmp(sig->bytes, src, fr->c_size))
		return 1;
	if (!s->dctx && !(s->dctx = ZSTD_createDCtx()))
		return -ENOMEM;
	dst = malloc(fr->d_size);
	if (!dst)
		return -ENOMEM;
	r = zseek_decode_frame(s->dctx, fr, true, src, dst);
	/* one that does not decode is data: a read of it says the rest */
	r = !r && dst[0] == 0 && !memcmp(dst, dst + 1, fr->d_size - 1);
	free(dst);
	if (r && !sig && (mine = malloc(sizeof(*mine) + fr->c_size))) {
		mine->d_size = fr->d_size;
		mine->c_size = fr->c_size;
		memcpy(mine->bytes, src, fr->c_size);
		if (!atomic_compare_exchange_strong(&s->f->zero_sig, &sig,
						    mine))
			free(mine);
	}
	return r;
}

/*
 * How many of frames i, i + 1, ... are zeros, read as one run of adjacent
 * candidates (at most RUN_BYTES): stops at the first that is not, or at
 * the first that is no candidate; -errno if the run cannot be read.
 */
static long zeros_from(struct seek *s, uint32_t i)
{
	const struct zseek_index *idx = &s->f->idx;
	struct zseek_frame first = zseek_frame_at(idx, i), fr = first;
	uint64_t end = first.c_off + first.c_size;
	uint32_t j = i + 1;
	ssize_t got;
	long n = 0;

	if (!zero_candidate(s->f, &first, i))
		return 0;
	for (; j < idx->nframes; j++) {
		fr = zseek_frame_at(idx, j);
		if (fr.c_off != end || !zero_candidate(s->f, &fr, j) ||
		    end + fr.c_size - first.c_off > RUN_BYTES)
			break;
		end += fr.c_size;
	}
	got = backing_pread(s->f, s->run, (size_t)(end - first.c_off),
			    first.c_off);
	if (got < 0)
		return got;
	for (uint32_t k = i; k < j; k++) {
		int z;

		fr = zseek_frame_at(idx, k);
		if (fr.c_off + fr.c_size > first.c_off + (uint64_t)got)
			return -EIO; /* the file is shorter than its table */
		z = frame_zeros(s, &fr, s->run + (fr.c_off - first.c_off));
		if (z < 0)
			return z;
		if (!z)
			break;
		n++;
	}
	return n;
}

/*
 * SEEK_DATA or SEEK_HOLE from pos in [lo, hi) of f's content: the place
 * found, hi for a hole that is only the end, or -ENXIO for no data.
 */
static int64_t seek_in(struct seek *s, uint64_t pos, uint64_t hi, int whence)
{
	const struct zseek_index *idx = &s->f->idx;
	uint32_t i = zseek_find_frame(idx, pos);

	while (i < idx->nframes && pos < hi) {
		struct zseek_frame fr = zseek_frame_at(idx, i);
		long z;

		if (!fr.d_size) { /* holds nothing, neither data nor hole */
			i++;
			continue;
		}
		z = zeros_from(s, i);
		if (z < 0)
			return z;
		if (whence == SEEK_HOLE && z > 0)
			return (int64_t)pos;
		if (whence == SEEK_DATA && z == 0)
			return (int64_t)pos;
		if (z == 0)
			z = 1; /* data: the next frame */
		i += (uint32_t)z;
		fr = zseek_frame_at(idx, i - 1);
		pos = fr.d_off + fr.d_size;
	}
	return whence == SEEK_HOLE ? (int64_t)hi : -ENXIO;
}

int zfile_seek(struct zfile *f, uint64_t base, uint64_t size, uint64_t off,
	       int whence, uint64_t *out)
{
	struct seek s = {.f = f};
	int64_t r;

	if (off >= size)
		return -ENXIO;
	/* no frame may be zeros: all data, as on a file system without
	 * holes */
	if (!f || !f->zero_bytes) {
		*out = whence == SEEK_DATA ? off : size;
		return 0;
	}
	if (atomic_load(&f->table_lies))
		return -EIO;
	s.run = malloc(RUN_BYTES);
	r = s.run ? zfile_fd_get(f) : -ENOMEM;
	if (!r) {
		r = seek_in(&s, base + off, base + size, whence);
		zfile_fd_put(f);
	}
	ZSTD_freeDCtx(s.dctx);
	free(s.run);
	if (r < 0)
		return (int)r;
	*out = (uint64_t)r - base;
	return 0;
}
