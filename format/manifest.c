// SPDX-License-Identifier: MIT
/*
 * The manifest: the dataset's tree, one line per entry, so that listing it
 * opens nothing.
 *
 * manifest.zst at the dataset root is a seekable zstd file of text (zstd
 * -dc manifest.zst | less reads it).  Its first frame holds one header
 * line; every later frame holds ZMF_FRAME_ENTRIES entry lines (the last
 * frame fewer), so entry i is line i % ZMF_FRAME_ENTRIES of frame
 * 1 + i / ZMF_FRAME_ENTRIES and is found without reading the others.
 *
 * A line is tab-separated fields (enum zmf_field).  Names, paths and link
 * targets are escaped so that a field holds no tab, newline or backslash:
 * \t, \n, \\ and \xHH for the other control bytes; everything else is
 * stored as it is, bytes not characters.
 *
 * The last field, an entry's extended attributes, is there only in a
 * manifest of version ZMF_VERSION_XATTRS, and may be left out of a line
 * even there: NAME=VALUE pairs in the order the source listed them, one
 * space between them, each escaped as zmf_xattr_escape() does (so that
 * neither holds a space or '=').  The root's are the header's "xattrs="
 * field, in the same form.
 *
 * The header's "holes=" field (left out when there are none) says which
 * big files hold frames of zeros: ID:BYTES for data/ID.zst, ',' between
 * them, ids ascending.  The mount leaves those bytes out of the file's
 * st_blocks; its lseek(SEEK_HOLE) finds the frames by their content.
 *
 * Entries are sorted by (parent, name), parents compared component by
 * component and names byte by byte: so a directory's entries are one run,
 * in the order readdir gives them, and an entry is found by binary search
 * (zmf_key_cmp).  The order is what mkzfolio's walk produces: a
 * directory's entries, then its subdirectories' in name order, depth
 * first.  An entry's inode number is its index + 2 (1 is the root), the
 * first entry's of its hard-link group for the others of that group.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format.h"

static const char *const field_names[ZMF_NR_FIELDS] = {
	"parent", "name", "type", "mode", "uid", "gid", "size", "mtime",
	"atime", "ino", "nlink", "rdev", "data", "target", "xattrs",
};

const char *zmf_field_name(enum zmf_field f)
{
	return field_names[f];
}

/* \xHH for c onto out, unless out is NULL: the bytes it takes. */
static size_t put_hex(unsigned char c, char *out)
{
	static const char hex[] = "0123456789abcdef";

	if (out) {
		out[0] = '\\';
		out[1] = 'x';
		out[2] = hex[c >> 4];
		out[3] = hex[c & 15];
	}
	return 4;
}

/*
 * Escape s (len bytes) onto out, for a field (xattr false) or for the
 * xattrs field; returns the bytes written (out may be NULL to count them).
 * At most 4 bytes per byte of s.
 */
static size_t escape(const char *s, size_t len, char *out, bool xattr)
{
	size_t n = 0;

	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		char e = c == '\\'	? '\\'
			 : xattr	? 0
			 : c == '\t'	? 't'
			 : c == '\n'	? 'n'
					: 0;

		if (e) {
			if (out) {
				out[n] = '\\';
				out[n + 1] = e;
			}
			n += 2;
		} else if (xattr ? c <= ' ' || c > '~' || c == '='
				 : c < 0x20 || c == 0x7f) {
			n += put_hex(c, out ? out + n : NULL);
		} else {
			if (out)
				out[n] = (char)c;
			n++;
		}
	}
	return n;
}

/* Escape s (len bytes) onto out; returns the bytes written (out may be
 * NULL to count them).  At most 4 bytes per byte of s. */
size_t zmf_escape(const char *s, size_t len, char *out)
{
	return escape(s, len, out, false);
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/*
 * Unescape the field [s, s + len) into out (at most len bytes); returns
 * the bytes written, or -EBADMSG for a bad escape.
 */
ssize_t zmf_unescape(const char *s, size_t len, char *out)
{
	size_t n = 0;

	for (size_t i = 0; i < len; i++) {
		if (s[i] != '\\') {
			out[n++] = s[i];
			continue;
		}
		if (++i == len)
			return -EBADMSG;
		if (s[i] == 't' || s[i] == 'n' || s[i] == '\\') {
			out[n++] = s[i] == 't' ? '\t' : s[i] == 'n' ? '\n' : '\\';
		} else if (s[i] == 'x' && i + 2 < len &&
			   hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
			out[n++] = (char)(hexval(s[i + 1]) << 4 | hexval(s[i + 2]));
			i += 2;
		} else {
			return -EBADMSG;
		}
	}
	return (ssize_t)n;
}

/*
 * Split a line (without its newline) into its fields: 0, or -EBADMSG if
 * it does not have ZMF_NR_FIELDS of them, or all but the last (xattrs,
 * then empty).  The fields point into line.
 */
int zmf_split(const char *line, size_t len, struct zmf_line *out)
{
	const char *p = line, *end = line + len;

	for (int f = 0; f < ZMF_NR_FIELDS; f++) {
		const char *tab = memchr(p, '\t', (size_t)(end - p));

		out->f[f] = p;
		out->len[f] = (size_t)((tab ? tab : end) - p);
		if (tab && f == ZMF_NR_FIELDS - 1)
			return -EBADMSG;
		if (!tab && f < ZMF_NR_FIELDS - 1) {
			if (f != ZMF_NR_FIELDS - 2)
				return -EBADMSG;
			out->f[f + 1] = end;
			out->len[f + 1] = 0;
			return 0;
		}
		p = tab ? tab + 1 : end;
	}
	return 0;
}

/*
 * Escape an attribute's name or value for the xattrs field: bytes from
 * '!' to '~' as they are, but '\\' doubled and '=' written \x3d, as is
 * every byte outside that range (a space among them).  Returns the bytes
 * written (out may be NULL to count them); at most 4 per byte of s.
 */
size_t zmf_xattr_escape(const char *s, size_t len, char *out)
{
	return escape(s, len, out, true);
}

/*
 * The next attribute of an xattrs field, from *pos up to end: 1 with x
 * set (name and value still escaped, zmf_unescape() undoes them) and *pos
 * moved past it, 0 at the end, -EBADMSG for a pair without '=' or an
 * empty name.
 */
int zmf_xattr_next(const char **pos, const char *end, struct zmf_xattr *x)
{
	const char *p = *pos, *sp, *eq;

	if (p >= end)
		return 0;
	sp = memchr(p, ' ', (size_t)(end - p));
	if (!sp)
		sp = end;
	eq = memchr(p, '=', (size_t)(sp - p));
	if (!eq || eq == p)
		return -EBADMSG;
	x->name = p;
	x->nlen = (size_t)(eq - p);
	x->value = eq + 1;
	x->vlen = (size_t)(sp - eq - 1);
	*pos = sp < end ? sp + 1 : end;
	return 1;
}

/* A decimal field: 0, or -EBADMSG. */
int zmf_number(const struct zmf_line *l, enum zmf_field f, uint64_t *v)
{
	uint64_t x = 0;

	if (!l->len[f] || l->len[f] > 20)
		return -EBADMSG;
	for (size_t i = 0; i < l->len[f]; i++) {
		char c = l->f[f][i];

		if (c < '0' || c > '9' || x > (UINT64_MAX - 9) / 10)
			return -EBADMSG;
		x = x * 10 + (uint64_t)(c - '0');
	}
	*v = x;
	return 0;
}

/*
 * A time field, "seconds.nanoseconds", as struct timespec has it: the
 * seconds signed (a time before 1970 is "-N."), the nanoseconds from 0 to
 * 999999999 after them.  0, or -EBADMSG.
 */
int zmf_time(const struct zmf_line *l, enum zmf_field f, int64_t *sec,
	     long *nsec)
{
	struct zmf_line part = *l;
	bool neg = l->len[f] && l->f[f][0] == '-';
	const char *dot = memchr(l->f[f], '.', l->len[f]);
	uint64_t s, ns;

	if (!dot)
		return -EBADMSG;
	part.f[f] = l->f[f] + neg;
	part.len[f] = (size_t)(dot - part.f[f]);
	if (zmf_number(&part, f, &s))
		return -EBADMSG;
	part.f[f] = dot + 1;
	part.len[f] = l->len[f] - (size_t)(dot - l->f[f]) - 1;
	/* "-0.5" is not how a time before 1970 is written: "-1.500000000" */
	if (zmf_number(&part, f, &ns) || ns >= 1000000000 ||
	    s > (uint64_t)INT64_MAX + neg || (neg && !s))
		return -EBADMSG;
	*sec = neg ? (int64_t)(0 - s) : (int64_t)s;
	*nsec = (long)ns;
	return 0;
}

/* The data field "ID:OFFSET": 0, 1 for none ("-"), or -EBADMSG. */
int zmf_data(const struct zmf_line *l, uint64_t *id, uint64_t *off)
{
	struct zmf_line part = *l;
	const char *colon = memchr(l->f[ZMF_DATA], ':', l->len[ZMF_DATA]);

	if (l->len[ZMF_DATA] == 1 && l->f[ZMF_DATA][0] == '-')
		return 1;
	if (!colon)
		return -EBADMSG;
	part.len[ZMF_DATA] = (size_t)(colon - l->f[ZMF_DATA]);
	if (zmf_number(&part, ZMF_DATA, id))
		return -EBADMSG;
	part.f[ZMF_DATA] = colon + 1;
	part.len[ZMF_DATA] = l->len[ZMF_DATA] - part.len[ZMF_DATA] - 1;
	return zmf_number(&part, ZMF_DATA, off);
}

/* The next path component of [*p, end) (unescaped bytes, no '/'). */
static size_t next_component(const char **p, const char *end)
{
	const char *slash = memchr(*p, '/', (size_t)(end - *p));
	size_t n = (size_t)((slash ? slash : end) - *p);

	return n;
}

static int bytes_cmp(const char *a, size_t na, const char *b, size_t nb)
{
	int c = memcmp(a, b, na < nb ? na : nb);

	if (c)
		return c;
	return na < nb ? -1 : na > nb;
}

/* Paths compared component by component: "a/b" < "a-b" < "a0". */
int zmf_path_cmp(const char *a, size_t na, const char *b, size_t nb)
{
	const char *ea = a + na, *eb = b + nb;

	for (;;) {
		size_t ca, cb;
		int c;

		if (a == ea || b == eb)
			return (a != ea) - (b != eb);
		ca = next_component(&a, ea);
		cb = next_component(&b, eb);
		c = bytes_cmp(a, ca, b, cb);
		if (c)
			return c;
		a += ca;
		b += cb;
		if (a < ea)
			a++; /* the slash */
		if (b < eb)
			b++;
	}
}

/* (parent, name) keys, unescaped, in the manifest's order. */
int zmf_key_cmp(const char *pa, size_t npa, const char *na, size_t nna,
		const char *pb, size_t npb, const char *nb, size_t nnb)
{
	int c = zmf_path_cmp(pa, npa, pb, npb);

	return c ? c : bytes_cmp(na, nna, nb, nnb);
}
