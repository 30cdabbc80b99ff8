// SPDX-License-Identifier: MIT
/*
 * zfolio-preadbench: N threads, each with its own fd, pread SIZE bytes at
 * offset 0 of FILE in a loop for SECONDS.  Prints reads/s and MiB/s.
 *
 *   zfolio-preadbench FILE THREADS SIZE SECONDS
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static const char *path;
static size_t size;
static atomic_bool stop;
static atomic_long total;

static void *run(void *arg)
{
	char *buf = malloc(size);
	long n = 0;
	int fd = open(path, O_RDONLY);

	(void)arg;
	if (fd < 0 || !buf) {
		perror(path);
		exit(1);
	}
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		if (pread(fd, buf, size, 0) != (ssize_t)size) {
			perror("pread");
			exit(1);
		}
		n++;
	}
	atomic_fetch_add(&total, n);
	close(fd);
	free(buf);
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t t[64];
	int threads;
	double secs;
	struct timespec a, b;

	if (argc != 5) {
		fprintf(stderr, "usage: zfolio-preadbench FILE THREADS SIZE "
				"SECONDS\n");
		return 2;
	}
	path = argv[1];
	threads = atoi(argv[2]);
	size = (size_t)atol(argv[3]);
	secs = atof(argv[4]);
	if (threads < 1 || threads > 64 || !size)
		return 2;
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (int i = 0; i < threads; i++)
		pthread_create(&t[i], NULL, run, NULL);
	usleep((useconds_t)(secs * 1e6));
	atomic_store(&stop, true);
	for (int i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	clock_gettime(CLOCK_MONOTONIC, &b);
	secs = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
	printf("%.0f reads/s %.1f MiB/s\n", (double)total / secs,
	       (double)total * (double)size / secs / 1048576.0);
	return 0;
}
