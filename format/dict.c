// SPDX-License-Identifier: MIT
/*
 * Dictionaries: the zstd dictionaries that frames may name (files written
 * by `zstd -D DICT`), given at mount and read-only from then on.
 *
 * A frame's header names its dictionary by ID (0: none).  A frame that
 * names one decodes with the dictionary of that ID, and one whose
 * dictionary was not given does not decode; a frame that names none
 * decodes without any, as ever.  So a dictionary is never applied to a
 * frame that did not ask for it: one written with `--no-dictID` cannot
 * say which it needs, and stays unserved.  The table is the process's (a
 * daemon serves one dataset): filled before the first read and only read
 * after, by any thread, without a lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zseek_internal.h"

static struct zseek_dict {
	uint32_t id;
	ZSTD_DDict *ddict;
} dicts[ZSEEK_MAX_DICTS];
static unsigned int ndicts;

int zseek_dict_add(const void *buf, size_t len, char *err, size_t errlen)
{
	uint32_t id = (uint32_t)ZSTD_getDictID_fromDict(buf, len);
	ZSTD_DDict *d;

	if (!id) {
		snprintf(err, errlen,
			 "not a zstd dictionary (no dictionary ID: "
			 "`zstd --train' writes one)");
		return -EINVAL;
	}
	if (zseek_dict_find(id)) {
		snprintf(err, errlen, "a second dictionary with ID %u", id);
		return -EEXIST;
	}
	if (ndicts == ZSEEK_MAX_DICTS) {
		snprintf(err, errlen, "more than %u dictionaries",
			 ZSEEK_MAX_DICTS);
		return -E2BIG;
	}
	d = ZSTD_createDDict(buf, len);
	if (!d) {
		snprintf(err, errlen, "dictionary ID %u does not load", id);
		return -EINVAL;
	}
	dicts[ndicts++] = (struct zseek_dict){id, d};
	return 0;
}

const ZSTD_DDict *zseek_dict_find(uint32_t id)
{
	for (unsigned int i = 0; id && i < ndicts; i++)
		if (dicts[i].id == id)
			return dicts[i].ddict;
	return NULL;
}

unsigned int zseek_dict_count(void)
{
	return ndicts;
}

size_t zseek_dict_bytes(void)
{
	size_t n = 0;

	for (unsigned int i = 0; i < ndicts; i++)
		n += ZSTD_sizeof_DDict(dicts[i].ddict);
	return n;
}

void zseek_dict_free_all(void)
{
	while (ndicts)
		ZSTD_freeDDict(dicts[--ndicts].ddict);
}

/* A dictionary file's size is trusted up to this (zstd --train writes
 * 110 KiB by default, --maxdict a few MiB) */
#define DICT_MAX_BYTES (64u << 20)

/* One dictionary file, loaded: 0, or -errno and why in err. */
static int load_dict(const char *path, char *err, size_t errlen)
{
	char why[160] = "";
	/* O_NONBLOCK: a FIFO is refused below, not waited on */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	ssize_t got;
	uint8_t *buf = NULL;
	struct stat st;
	int r = 0;

	if (fd < 0 || fstat(fd, &st)) {
		r = -errno;
	} else if (!S_ISREG(st.st_mode)) {
		r = -EINVAL;
		snprintf(why, sizeof(why), "not a regular file");
	} else if (st.st_size > (off_t)DICT_MAX_BYTES) {
		r = -EFBIG;
		snprintf(why, sizeof(why), "larger than %u MiB",
			 DICT_MAX_BYTES >> 20);
	} else if (!(buf = malloc(st.st_size ? (size_t)st.st_size : 1))) {
		r = -ENOMEM;
	} else if ((got = zseek_pread_fd(&fd, buf, (size_t)st.st_size, 0)) !=
		   (ssize_t)st.st_size) {
		r = got < 0 ? (int)got : -EIO;
		if (got >= 0)
			snprintf(why, sizeof(why), "changed while read");
	} else {
		r = zseek_dict_add(buf, (size_t)st.st_size, why, sizeof(why));
	}
	if (r && !*why)
		snprintf(why, sizeof(why), "%s", strerror(-r));
	if (r)
		snprintf(err, errlen, "%s: %s", path, why);
	free(buf);
	if (fd >= 0)
		close(fd);
	return r;
}

int zseek_dict_load(const char *list, char *err, size_t errlen)
{
	char *copy = list ? strdup(list) : NULL, *save = NULL;
	int r = 0;

	if (list && !copy)
		return -ENOMEM;
	for (char *p = copy ? strtok_r(copy, ":", &save) : NULL; p && !r;
	     p = strtok_r(NULL, ":", &save))
		r = load_dict(p, err, errlen);
	free(copy);
	return r;
}
