// SPDX-License-Identifier: MIT
/*
 * zfolio-reader: one reader process of the seed's experiment.
 *
 *   zfolio-reader FILE cold|seq|random|extents SECONDS SEED [pread|mmap
 *                 [SPAN]]
 *
 * cold:   64 consecutive pages from a random start, repeated.
 * seq:    4096 consecutive pages from a random start, repeated.
 * random: one page at a random offset, repeated.
 * extents: one page in each 128 KiB extent, the extents in random order,
 *         until every one was read once: cold random reads (every read
 *         needs a different compressed frame).
 * SPAN (bytes): read only the file's first SPAN bytes (a hot set).
 * Each page is one 4 KiB pread, or one touched byte of a read-only shared
 * mapping (a private one where the filesystem refuses shared mappings).
 * Prints the pages read, the pages read in each second, and this process's
 * major and minor page faults.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096
#define MAX_SECONDS 3600

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int read_extents(const char *path, long seconds, uint64_t seed)
{
	const uint64_t ext = 128 << 10;
	unsigned char buf[PAGE];
	struct stat st;
	uint64_t n, *order, done = 0;
	double t0, dt;
	int fd = open(path, O_RDONLY);

	if (fd < 0 || fstat(fd, &st))
		return 1;
	n = (uint64_t)st.st_size / ext;
	order = malloc((n ? n : 1) * sizeof(*order));
	if (!order)
		return 1;
	for (uint64_t i = 0; i < n; i++)
		order[i] = i;
	for (uint64_t i = n; i > 1; i--) { /* Fisher-Yates */
		uint64_t j;

		seed ^= seed << 13;
		seed ^= seed >> 7;
		seed ^= seed << 17;
		j = seed % i;
		uint64_t t = order[i - 1];
		order[i - 1] = order[j];
		order[j] = t;
	}
	t0 = now();
	for (; done < n; done++) {
		uint64_t off = order[done] * ext + (seed >> 20) % (ext / PAGE) *
							   PAGE;

		if (pread(fd, buf, PAGE, (off_t)off) != PAGE)
			return 1;
		if ((done & 63) == 0 && now() - t0 >= (double)seconds)
			break;
	}
	dt = now() - t0;
	printf("pages %llu\nseconds %.3f\n", (unsigned long long)done, dt);
	free(order);
	return 0;
}

int main(int argc, char **argv)
{
	static long per_second[MAX_SECONDS + 1];
	uint64_t seed, npages, pages = 0;
	volatile unsigned char sink = 0;
	unsigned char *map = NULL;
	unsigned char buf[PAGE];
	double t0, end;
	long burst, seconds;
	struct stat st;
	int fd, mmap_mode;

	if (argc < 5) {
		fprintf(stderr, "usage: zfolio-reader FILE "
				"cold|seq|random|extents SECONDS SEED "
				"[pread|mmap [SPAN]]\n");
		return 2;
	}
	burst = strcmp(argv[2], "seq") == 0	     ? 4096
		: strcmp(argv[2], "random") == 0 ? 1
						 : 64;
	seconds = atol(argv[3]);
	seed = strtoull(argv[4], NULL, 10) * 0x9E3779B97F4A7C15ull + 1;
	mmap_mode = argc > 5 && strcmp(argv[5], "mmap") == 0;
	if (seconds < 1 || seconds > MAX_SECONDS)
		return 2;
	if (strcmp(argv[2], "extents") == 0)
		return read_extents(argv[1], seconds, seed);
	fd = open(argv[1], O_RDONLY);
	if (fd < 0 || fstat(fd, &st)) {
		fprintf(stderr, "zfolio-reader: %s: %s\n", argv[1],
			strerror(errno));
		return 1;
	}
	npages = (uint64_t)st.st_size / PAGE;
	if (argc > 6 && strtoull(argv[6], NULL, 10) / PAGE < npages)
		npages = strtoull(argv[6], NULL, 10) / PAGE;
	if (npages < (uint64_t)burst)
		return 1;
	if (mmap_mode) {
		map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd,
			   0);
		if (map == MAP_FAILED)
			map = mmap(NULL, (size_t)st.st_size, PROT_READ,
				   MAP_PRIVATE, fd, 0);
		if (map == MAP_FAILED) {
			perror("mmap");
			return 1;
		}
		madvise(map, (size_t)st.st_size, MADV_NORMAL);
	}
	t0 = now();
	end = t0 + (double)seconds;
	for (;;) {
		uint64_t start;
		double t = now();

		if (t >= end)
			break;
		seed ^= seed << 13;
		seed ^= seed >> 7;
		seed ^= seed << 17;
		start = seed % (npages - (uint64_t)burst + 1);
		for (long i = 0; i < burst; i++) {
			uint64_t pg = start + (uint64_t)i;

			if (map) {
				sink ^= map[pg * PAGE];
			} else if (pread(fd, buf, PAGE, (off_t)(pg * PAGE)) !=
				   PAGE) {
				perror("pread");
				return 1;
			}
			pages++;
			if ((i & 15) == 15 || i == burst - 1) {
				t = now();
				if (t >= end)
					break;
				per_second[(long)(t - t0)] += (i & 15) + 1;
			}

		}
	}
	{
		struct rusage ru;

		getrusage(RUSAGE_SELF, &ru);
		printf("pages %llu\nmajflt %ld\nminflt %ld\nper_second",
		       (unsigned long long)pages, ru.ru_majflt, ru.ru_minflt);
	}
	for (long s = 0; s < seconds; s++)
		printf(" %ld", per_second[s]);
	printf("\n");
	return sink == 255 && pages == 0;
}
