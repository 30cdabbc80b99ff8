// SPDX-License-Identifier: MIT
/*
 * mkzfolio and extended attributes: read from the source (llistxattr and
 * lgetxattr, never following a link), escaped into the manifest's xattrs
 * field, and counted where a dataset does not keep them (the tree layout;
 * values that cannot be read, or over XATTRS_MAX), to be said once at the
 * end.  An SELinux label is left out: it is the mount's to give.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

#include "mkzfolio.h"

/* Entries whose extended attributes a dataset does not keep: any in the
 * tree layout; in the packed one those it could not read or hold. */
static unsigned long long xattr_entries, xattr_lost;
static char *xattr_first, *xattr_lost_first;

/* An SELinux label is the mount's to give, not the file's. */
static bool label_only(const char *names, ssize_t n)
{
	return (size_t)n == sizeof("security.selinux") &&
	       !memcmp(names, "security.selinux", (size_t)n);
}

void note_xattrs(const char *path)
{
	char names[256];
	ssize_t n = llistxattr(path, names, sizeof(names));

	if (n == 0 || (n < 0 && errno != ERANGE) || (n > 0 && label_only(names, n)))
		return;
	if (!xattr_entries++)
		xattr_first = strdup(path);
}

static void xattrs_not_kept(const char *path)
{
	if (!xattr_lost++)
		xattr_lost_first = strdup(path);
}

/* The names of path's attributes, NUL after each (malloc'd, *n bytes), or
 * NULL: none (*n 0), or they cannot be listed (*n -1). */
static char *list_names(const char *path, ssize_t *n)
{
	char *names = NULL;

	for (;;) {
		ssize_t want = llistxattr(path, NULL, 0);
		char *bigger;

		if (want <= 0) {
			*n = want == 0 || errno == ENOTSUP || errno == ENODATA
				     ? 0
				     : -1;
			break;
		}
		bigger = realloc(names, (size_t)want);
		if (!bigger)
			die("out of memory");
		names = bigger;
		*n = llistxattr(path, names, (size_t)want);
		if (*n >= 0)
			return names;
		if (errno != ERANGE) {
			*n = -1;
			break;
		}
	}
	free(names);
	return NULL;
}

/* One attribute's value into *buf (grown as needed): its length, -1 if it
 * went away, -2 if it cannot be read. */
static ssize_t get_value(const char *path, const char *name, char **buf,
			 size_t *cap)
{
	for (;;) {
		ssize_t want = lgetxattr(path, name, NULL, 0), n;

		if (want < 0)
			return errno == ENODATA ? -1 : -2;
		if ((size_t)want + 1 > *cap) {
			char *bigger = realloc(*buf, (size_t)want + 1);

			if (!bigger)
				die("out of memory");
			*buf = bigger;
			*cap = (size_t)want + 1;
		}
		n = lgetxattr(path, name, *buf, (size_t)want);
		if (n >= 0)
			return n;
		if (errno != ERANGE)
			return errno == ENODATA ? -1 : -2;
	}
}

char *xattrs_field(const char *path, const char *said, size_t *len)
{
	char *names, *value = NULL, *out = NULL;
	size_t cap = 0, ocap = 0;
	ssize_t n;
	bool lost = false;

	*len = 0;
	names = list_names(path, &n);
	if (!names || label_only(names, n)) {
		if (n < 0)
			xattrs_not_kept(said);
		free(names);
		return NULL;
	}
	/* in the order the source lists them, as tar --xattrs keeps them */
	for (ssize_t i = 0; i < n && !lost;
	     i += (ssize_t)strlen(names + i) + 1) {
		const char *name = names + i;
		size_t nlen = strlen(name);
		ssize_t vlen;

		if (!strcmp(name, "security.selinux"))
			continue;
		vlen = get_value(path, name, &value, &cap);
		if (vlen == -1)
			continue;
		if (vlen < 0 ||
		    *len + 2 + 4 * (nlen + (size_t)vlen) > XATTRS_MAX) {
			lost = true;
			break;
		}
		if (*len + 2 + 4 * (nlen + (size_t)vlen) > ocap) {
			char *bigger;

			ocap = *len + 2 + 4 * (nlen + (size_t)vlen);
			bigger = realloc(out, ocap);
			if (!bigger)
				die("out of memory");
			out = bigger;
		}
		if (*len)
			out[(*len)++] = ' ';
		*len += zmf_xattr_escape(name, nlen, out + *len);
		out[(*len)++] = '=';
		*len += zmf_xattr_escape(value, (size_t)vlen, out + *len);
	}
	free(names);
	free(value);
	if (lost) {
		xattrs_not_kept(said);
		free(out);
		*len = 0;
		return NULL;
	}
	if (!*len) {
		free(out);
		return NULL;
	}
	return out;
}

void say_xattrs(void)
{
	if (xattr_entries)
		warn("%llu entr%s extended attributes (the first: %s); the "
		     "tree layout does not keep them, the packed one does",
		     xattr_entries, xattr_entries == 1 ? "y has" : "ies have",
		     xattr_first ? xattr_first : "?");
	if (xattr_lost)
		warn("the extended attributes of %llu entr%s could not be "
		     "read, or are over %u KiB, and are not kept (the first: "
		     "%s)",
		     xattr_lost, xattr_lost == 1 ? "y" : "ies",
		     XATTRS_MAX >> 10,
		     xattr_lost_first ? xattr_lost_first : "?");
	free(xattr_first);
	free(xattr_lost_first);
	xattr_first = xattr_lost_first = NULL;
}
