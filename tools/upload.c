// SPDX-License-Identifier: MIT
/*
 * mkzfolio SRC s3://BUCKET/PREFIX (or an HTTP server that takes PUT): the
 * dataset is packed into a temporary directory as usual, then written to
 * the store, data files first and the manifest last, so that a dataset
 * whose upload stopped half-way has no manifest and cannot be mounted as
 * if it were whole.  Big objects go as S3 multipart uploads (remote/put.c).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mkzfolio.h"
#include "../remote/remote.h"

struct upload {
	struct store *s;
	struct store_client *c;
	uint64_t bytes;
	unsigned long objects;
};

/* A store for url, its credentials found: exits with the reason if not. */
static void upload_open(struct upload *u, const char *url,
			const struct store_options *o)
{
	char err[512];

	if (store_open(url, o, &u->s, err, sizeof(err)))
		die("%s", err);
	u->c = store_client_new(u->s);
	if (!u->c)
		die("out of memory");
}

void upload_check(const char *url, const struct store_options *o, bool force)
{
	struct upload u = {0};
	int r;

	upload_open(&u, url, o);
	r = store_exists(u.c, ZMF_NAME);
	if (r == -ENXIO)
		die("%s: its bucket is not there: make it first (%s)",
		    store_name(u.s), store_client_error(u.c));
	if (r < 0)
		die("%s: %s", store_name(u.s), store_client_error(u.c));
	if (r && !force)
		die("%s already holds a dataset (use --force to write over it)",
		    store_name(u.s));
	store_client_free(u.c);
	store_close(u.s);
}

static void put_one(struct upload *u, int dirfd, const char *name)
{
	int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
	struct stat st;

	if (fd < 0 || fstat(fd, &st))
		die("%s: %s", name, strerror(errno));
	if (store_put_file(u->c, name, fd, (uint64_t)st.st_size))
		die("uploading %s: %s", name, store_client_error(u->c));
	close(fd);
	u->bytes += (uint64_t)st.st_size;
	u->objects++;
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The data files, in order; then the manifest. */
void upload_dataset(const char *dir, const char *url,
		    const struct store_options *o, bool quiet)
{
	struct upload u = {0};
	int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d;
	struct dirent *e;
	char **names = NULL, path[300];
	size_t n = 0;
	struct store_counts cnt;

	if (dirfd < 0)
		die("%s: %s", dir, strerror(errno));
	upload_open(&u, url, o);
	snprintf(path, sizeof(path), "%s/" ZMF_DATA_DIR, dir);
	d = opendir(path);
	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		names = realloc(names, (n + 1) * sizeof(*names));
		if (!names || asprintf(&names[n], ZMF_DATA_DIR "/%s",
				       e->d_name) < 0)
			die("out of memory");
		n++;
	}
	if (d)
		closedir(d);
	qsort(names, n, sizeof(*names), name_cmp);
	for (size_t i = 0; i < n; i++) {
		put_one(&u, dirfd, names[i]);
		if (!quiet && isatty(2))
			fprintf(stderr, "\r%s: uploaded %zu of %zu data files",
				progname, i + 1, n);
		free(names[i]);
	}
	free(names);
	put_one(&u, dirfd, ZMF_NAME);
	store_counts(u.s, &cnt);
	if (!quiet)
		fprintf(stderr,
			"%s%s: uploaded %lu objects, %.1f MiB, to %s in %llu "
			"requests\n",
			isatty(2) ? "\r" : "", progname, u.objects, (double)u.bytes / 1048576.0,
			store_name(u.s),
			(unsigned long long)cnt.requests);
	store_client_free(u.c);
	store_close(u.s);
	close(dirfd);
}
