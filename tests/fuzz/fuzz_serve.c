// SPDX-License-Identifier: MIT
/*
 * Fuzz serving a hostile file: arbitrary bytes as a backing .zst, opened
 * by the daemon's own code (zfile_create: index build, geometry, mapping)
 * and read at fuzzer-chosen ranges through the cache engine, with a small
 * budget and no FUSE.  Input: [u64 seed][file].  Every reply must be the
 * right length of bytes (as much as the file holds there) or an error, a
 * page-cache fill all or an error; the index may take no more memory than
 * a fixed multiple of the file; the budget is never passed.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../cache/internal.h"
#include "../../fs/internal.h"
#include "reply.h"

size_t __sanitizer_get_current_allocated_bytes(void);

/* What the index may take: per byte of file, and for every file. */
#define INDEX_BYTES_PER_BYTE 64
#define INDEX_BYTES_FIXED (1 << 20)
#define BUDGET (2u << 20)

static struct dataset ds;
static struct options opt;
static struct worker *w;

static void setup(void)
{
	char dir[] = "/tmp/zfolio-fuzz-XXXXXX", err[256];

	if (!mkdtemp(dir))
		abort();
	zlog_init(ZLOG_NONE); /* the reasons, for every input, are noise here */
	options_defaults(&opt);
	opt.dataset = strdup(dir);
	opt.budget = BUDGET;
	opt.backing_cache = BACKING_KEEP; /* memfds have no RWF_DONTCACHE */
	if (dataset_open(&ds, &opt, err, sizeof(err)))
		abort();
	rmdir(dir);
	w = worker_create(0, true);
	if (!w)
		abort();
	current_worker = w;
	cache_thread_register();
}

/* One read of [off, off + len): the right length, or an error. */
static void read_range(struct zfile *f, struct file_ra_state *ra,
		       uint64_t off, size_t len, bool fill)
{
	uint64_t size = f->mapping->size;
	size_t want = off >= size ? 0 : len < size - off ? len : size - off;
	struct reply r;

	ra_request_init(&w->rq, f->mapping, ra, &ds.cache.budget.root, w, off,
			len, fill);
	w->rq.rq.fill = fill;
	cache_read(&w->rq.rq, on_reply, &r);
	cache_quiescent();
	if (r.err == 0 && r.bytes != want && (fill || r.bytes > want))
		abort(); /* a short fill, or more than the file holds */
	if (r.err && r.err != -EIO && r.err != -ENOMEM)
		abort();
	if (counter_read(&ds.cache.budget.root.mem) * ZF_PAGE_SIZE > BUDGET)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct file_ra_state ra;
	unsigned long long seed = 0;
	struct zfile *f;
	long before;
	int fd;

	if (!w)
		setup();
	if (size < 8)
		return 0;
	memcpy(&seed, data, 8);
	seed |= 1;
	fd = memfd_create("fuzz.zst", MFD_CLOEXEC);
	if (fd < 0 || write(fd, data + 8, size - 8) != (ssize_t)(size - 8))
		abort();
	cache_barrier(); /* no deferred free runs while we measure */
	before = (long)__sanitizer_get_current_allocated_bytes();
	if (zfile_create(&ds, fd, NULL, true, "fuzz.zst", &f))
		return 0;
	if ((long)__sanitizer_get_current_allocated_bytes() - before >
	    (long)(INDEX_BYTES_PER_BYTE * size + INDEX_BYTES_FIXED))
		abort(); /* the index grew with what the file claims */
	file_ra_init(&ra, 32);
	for (int i = 0; i < 8; i++) {
		uint64_t x = seed = seed * 6364136223846793005ull + 1;
		uint64_t span = f->mapping->size + 4096;

		read_range(f, &ra, (x >> 16) % span, 1 + (x >> 40) % (64 << 10),
			   i & 1);
	}
	for (uint64_t off = 0; off < f->mapping->size && off < (1u << 20);
	     off += 128 << 10)
		read_range(f, &ra, off, 128 << 10, false);
	file_ra_destroy(&ra);
	zfile_put(f);
	return 0;
}
