// SPDX-License-Identifier: MIT
/*
 * The manifest's walk for pushes (fs/manifest.c, manifest_neighbours()) on
 * datasets that mkzfolio packs: the files after a file, in data order,
 * within the bound and the count asked; directories, links, empty files,
 * later names of a hard link and big files passed over; a walk across the
 * manifest's frames; and the limits past which the pack is taken as ended.
 * Also the extended attributes: the field's escapes and parsing
 * (format/manifest.c), and what manifest_getxattr() and
 * manifest_listxattr() answer for a file, a file without, the root and
 * buffers too small.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "../fs/internal.h"
#include "check.h"

#define SMALL_MAX 4096 /* mkzfolio --small: bigger files are data files */
#define MAXN 2048

static char root[128], src[160], dst[160];

static void put(const char *name, size_t size)
{
	char path[320];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", src, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0);
	/* content of its own: mkzfolio stores equal files once */
	for (size_t i = 0; fd >= 0 && i < size; i++) {
		char c = (char)('a' + (i * 7 + name[i % strlen(name)]) % 26);

		CHECK(write(fd, &c, 1) == 1);
	}
	if (fd >= 0)
		close(fd);
}

static void make_dir(const char *name)
{
	char path[320];

	snprintf(path, sizeof(path), "%s/%s", src, name);
	CHECK(mkdir(path, 0755) == 0);
}

/* mkzfolio src dst, with small files up to SMALL_MAX packed */
static bool pack(void)
{
	const char *mk = getenv("ZF_MKZFOLIO");
	pid_t pid;
	int status = -1;

	if (!mk) {
		fprintf(stderr, "ZF_MKZFOLIO is not set\n");
		return false;
	}
	pid = fork();
	if (pid == 0) {
		execl(mk, mk, "-q", "--small", "4K", src, dst, (char *)NULL);
		_exit(127);
	}
	return pid > 0 && waitpid(pid, &status, 0) == pid &&
	       WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static struct options opt;
static struct dataset ds;

static bool open_dataset(void)
{
	char err[512] = "";

	options_defaults(&opt);
	opt.dataset = dst;
	if (dataset_open(&ds, &opt, err, sizeof(err))) {
		fprintf(stderr, "dataset_open: %s\n", err);
		return false;
	}
	cache_thread_register();
	return true;
}

static void close_dataset(void)
{
	cache_thread_unregister(); /* dataset_close() registers for itself */
	dataset_close(&ds);
}

/* A name's inode and size, under parent; 0 if it is not there. */
static fuse_ino_t ino_of(fuse_ino_t parent, const char *name,
			 uint64_t *size)
{
	struct stat st;

	if (manifest_lookup(&ds, parent, name, &st))
		return 0;
	if (size)
		*size = (uint64_t)st.st_size;
	return st.st_ino;
}

/* the neighbours found are the names expected, whole, in data order */
static void check_names(const struct mf_neighbour *nb, unsigned int n,
			fuse_ino_t parent, const char *const *names,
			unsigned int want)
{
	CHECK_EQ(n, want);
	for (unsigned int i = 0; i < n && i < want; i++) {
		uint64_t size = 0;

		CHECK_EQ(nb[i].ino, ino_of(parent, names[i], &size));
		CHECK_EQ(nb[i].size, size);
		if (i)
			CHECK(nb[i].data_off >= nb[i - 1].data_off +
						     nb[i - 1].size);
	}
}

/* f00..f11 with an empty file, a link, a big file, a hard link among them */
static const char *const kinds_all[] = {"f01", "f02", "f04", "f06",
					"f08", "f10", "f11"};

static void make_kinds(void)
{
	char path[320], to[320];

	put("f00", 1000);
	put("f01", 1100);
	put("f02", 1200);
	put("f03_empty", 0);
	put("f04", 1300);
	snprintf(path, sizeof(path), "%s/f05_link", src);
	CHECK(symlink("f00", path) == 0);
	put("f06", 1400);
	put("f07_big", SMALL_MAX * 3);
	put("f08", 1500);
	snprintf(path, sizeof(path), "%s/f00", src);
	snprintf(to, sizeof(to), "%s/f09_hard", src);
	CHECK(link(path, to) == 0);
	put("f10", 1600);
	put("f11", 1700);
	make_dir("g_dir");
}

static void test_kinds(void)
{
	struct mf_neighbour nb[MAXN];
	struct mf_entry *e = calloc(1, sizeof(*e));
	fuse_ino_t f00 = ino_of(FUSE_ROOT_ID, "f00", NULL);
	fuse_ino_t f11 = ino_of(FUSE_ROOT_ID, "f11", NULL);
	uint64_t hi = 0; /* where f11's data ends: the subdirectories' files
			  * are packed after it */
	unsigned int n;

	CHECK(f00 && f11 && e);
	if (!f00 || !f11 || !e || mf_entry_at(&ds, f11 - 2, e)) {
		free(e);
		CHECK(!"f11's entry");
		return;
	}
	CHECK(e->has_data);
	hi = e->data_off + (uint64_t)e->st.st_size;
	free(e);
	/* everything after f00 in its pack, the others passed over */
	n = manifest_neighbours(&ds, f00, 0, hi, nb, MAXN);
	check_names(nb, n, FUSE_ROOT_ID, kinds_all, 7);
	/* the next directory's files follow in the pack */
	CHECK(manifest_neighbours(&ds, f00, 0, UINT64_MAX, nb, MAXN) > 7);
	/* at most max */
	n = manifest_neighbours(&ds, f00, 0, hi, nb, 3);
	check_names(nb, n, FUSE_ROOT_ID, kinds_all, 3);
	CHECK_EQ(manifest_neighbours(&ds, f00, 0, hi, nb, 0), 0);
	/* within [lo, hi): f04 ends at hi; one byte less and it is out,
	 * and nothing after it either */
	n = manifest_neighbours(&ds, f00, 0, hi, nb, MAXN);
	if (n >= 3) {
		uint64_t end = nb[2].data_off + nb[2].size;

		n = manifest_neighbours(&ds, f00, 0, end, nb, MAXN);
		check_names(nb, n, FUSE_ROOT_ID, kinds_all, 3);
		n = manifest_neighbours(&ds, f00, 0, end - 1, nb, MAXN);
		check_names(nb, n, FUSE_ROOT_ID, kinds_all, 2);
	}
	/* lo past a file's data: data before it is not the push's */
	n = manifest_neighbours(&ds, f00, 0, hi, nb, MAXN);
	if (n >= 2) {
		n = manifest_neighbours(&ds, f00, nb[1].data_off + 1, hi, nb,
					MAXN);
		check_names(nb, n, FUSE_ROOT_ID, kinds_all + 2, 5);
	}
	/* the last file has none; nor has what is no packed file */
	CHECK_EQ(manifest_neighbours(&ds, f11, 0, hi, nb, MAXN), 0);
	CHECK_EQ(manifest_neighbours(&ds, ino_of(FUSE_ROOT_ID, "f03_empty",
						 NULL), 0, UINT64_MAX, nb,
				     MAXN), 0);
	CHECK_EQ(manifest_neighbours(&ds, ino_of(FUSE_ROOT_ID, "f05_link",
						 NULL), 0, UINT64_MAX, nb,
				     MAXN), 0);
	CHECK_EQ(manifest_neighbours(&ds, ino_of(FUSE_ROOT_ID, "g_dir", NULL),
				     0, UINT64_MAX, nb, MAXN), 0);
	CHECK_EQ(manifest_neighbours(&ds, ino_of(FUSE_ROOT_ID, "f07_big",
						 NULL), 0, UINT64_MAX, nb,
				     MAXN), 0);
	CHECK_EQ(manifest_neighbours(&ds, FUSE_ROOT_ID, 0, UINT64_MAX, nb,
				     MAXN), 0);
	CHECK_EQ(manifest_neighbours(&ds, 1u << 30, 0, UINT64_MAX, nb, MAXN),
		 0);
}

/* a directory of 3 manifest frames of small files, walked in one go */
#define MANY (ZMF_FRAME_ENTRIES * 3)

static void test_frames(void)
{
	static struct mf_neighbour nb[MAXN];
	char name[32];
	fuse_ino_t dir = ino_of(FUSE_ROOT_ID, "many", NULL);
	fuse_ino_t first;
	unsigned int n;

	CHECK(dir);
	first = ino_of(dir, "m0000", NULL);
	CHECK(first);
	n = manifest_neighbours(&ds, first, 0, UINT64_MAX, nb, MAXN);
	CHECK_EQ(n, MANY - 1);
	for (unsigned int i = 0; i < n && i < MANY - 1; i++) {
		snprintf(name, sizeof(name), "m%04u", i + 1);
		if (nb[i].ino != ino_of(dir, name, NULL)) {
			CHECK_EQ(nb[i].ino, ino_of(dir, name, NULL));
			break;
		}
	}
	/* from the middle of the second frame */
	first = ino_of(dir, "m0300", NULL);
	n = manifest_neighbours(&ds, first, 0, UINT64_MAX, nb, MAXN);
	CHECK_EQ(n, MANY - 301);
	CHECK_EQ(n ? nb[0].ino : 0, ino_of(dir, "m0301", NULL));
}

/* past 32 big files in a row, or 1024 entries, the pack is taken as ended:
 * dir/z is dir/a's first neighbour, or it has none */
static bool gap_crossed(const char *name)
{
	struct mf_neighbour nb[4];
	fuse_ino_t dir = ino_of(FUSE_ROOT_ID, name, NULL);
	fuse_ino_t a = ino_of(dir, "a", NULL), z = ino_of(dir, "z", NULL);
	unsigned int n;

	CHECK(dir && a && z);
	n = manifest_neighbours(&ds, a, 0, UINT64_MAX, nb, 4);
	if (n)
		CHECK_EQ(nb[0].ino, z);
	return n > 0;
}

static void test_limits(void)
{
	CHECK(gap_crossed("big31"));
	CHECK(!gap_crossed("big32"));
	CHECK(gap_crossed("links1000"));
	CHECK(!gap_crossed("links1030"));
}

/* dir/a, then n big files or n symlinks, then dir/z */
static void make_gap(const char *dir, unsigned int n, bool big)
{
	char name[128];

	make_dir(dir);
	snprintf(name, sizeof(name), "%s/a", dir);
	put(name, 100);
	for (unsigned int i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "%s/m%04u", dir, i);
		if (big) {
			put(name, SMALL_MAX + 1);
		} else {
			char path[320];

			snprintf(path, sizeof(path), "%s/%s", src, name);
			CHECK(symlink("a", path) == 0);
		}
	}
	snprintf(name, sizeof(name), "%s/z", dir);
	put(name, 100);
}

static void remove_tree(void)
{
	char cmd[sizeof(root) + 16];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	(void)!system(cmd);
}

/* every byte, '=' and ' ' in names and values come back from the field */
static void test_xattr_field(void)
{
	char value[256], name[] = "user.a b=c\\d", field[4096], out[1024];
	const char *pos = field, *end;
	struct zmf_xattr x;
	struct zmf_line l;
	size_t n = 0;
	ssize_t u;

	for (int i = 0; i < 256; i++)
		value[i] = (char)i;
	n += zmf_xattr_escape(name, strlen(name), field + n);
	field[n++] = '=';
	n += zmf_xattr_escape(value, sizeof(value), field + n);
	field[n++] = ' ';
	n += zmf_xattr_escape("user.e", 6, field + n);
	field[n++] = '=';
	end = field + n;
	CHECK(!memchr(field, '\t', n) && !memchr(field, '\n', n));
	CHECK(zmf_xattr_escape(value, sizeof(value), NULL) <= 4 * sizeof(value));

	CHECK_EQ(zmf_xattr_next(&pos, end, &x), 1);
	u = zmf_unescape(x.name, x.nlen, out);
	CHECK(u == (ssize_t)strlen(name) && !memcmp(out, name, strlen(name)));
	u = zmf_unescape(x.value, x.vlen, out);
	CHECK(u == (ssize_t)sizeof(value) && !memcmp(out, value, sizeof(value)));
	CHECK_EQ(zmf_xattr_next(&pos, end, &x), 1);
	CHECK(x.nlen == 6 && !memcmp(x.name, "user.e", 6) && x.vlen == 0);
	CHECK_EQ(zmf_xattr_next(&pos, end, &x), 0);
	pos = "novalue";
	CHECK_EQ(zmf_xattr_next(&pos, pos + 7, &x), -EBADMSG);
	pos = "=v";
	CHECK_EQ(zmf_xattr_next(&pos, pos + 2, &x), -EBADMSG);

	/* a line of version 1 (no xattrs field), of 2, and wrong counts */
	{
		const char *v1 = "\tf\tf\t644\t0\t0\t1\t1.0\t1.0\t2\t1\t0\t0:0\t";
		char v2[128];

		CHECK_EQ(zmf_split(v1, strlen(v1), &l), 0);
		CHECK_EQ(l.len[ZMF_XATTRS], 0);
		CHECK_EQ(l.len[ZMF_TARGET], 0);
		snprintf(v2, sizeof(v2), "%s\tuser.k=v", v1);
		CHECK_EQ(zmf_split(v2, strlen(v2), &l), 0);
		CHECK(l.len[ZMF_XATTRS] == 8 &&
		      !memcmp(l.f[ZMF_XATTRS], "user.k=v", 8));
		snprintf(v2, sizeof(v2), "%s\tuser.k=v\tmore", v1);
		CHECK_EQ(zmf_split(v2, strlen(v2), &l), -EBADMSG);
		CHECK_EQ(zmf_split(v1, strlen(v1) - 1, &l), -EBADMSG);
	}
}

/* "f01" has user.k and user.empty, the root user.root; the rest none */
static void test_xattr_ops(void)
{
	fuse_ino_t f01 = ino_of(FUSE_ROOT_ID, "f01", NULL),
		   f02 = ino_of(FUSE_ROOT_ID, "f02", NULL);
	char buf[64];

	CHECK(ds.mf->xattrs);
	CHECK(f01 && f02);
	CHECK_EQ(manifest_getxattr(&ds, f01, "user.k", NULL, 0), 5);
	CHECK_EQ(manifest_getxattr(&ds, f01, "user.k", buf, sizeof(buf)), 5);
	CHECK(!memcmp(buf, "va=l\n", 5));
	CHECK_EQ(manifest_getxattr(&ds, f01, "user.k", buf, 4), -ERANGE);
	CHECK_EQ(manifest_getxattr(&ds, f01, "user.empty", buf, sizeof(buf)),
		 0);
	CHECK_EQ(manifest_getxattr(&ds, f01, "user.none", buf, sizeof(buf)),
		 -ENODATA);
	CHECK_EQ(manifest_getxattr(&ds, f02, "user.k", buf, sizeof(buf)),
		 -ENODATA);
	/* the names in the source's order, each with its NUL */
	CHECK_EQ(manifest_listxattr(&ds, f01, NULL, 0), 18);
	CHECK_EQ(manifest_listxattr(&ds, f01, buf, sizeof(buf)), 18);
	CHECK(!memcmp(buf, "user.k\0user.empty\0", 18) ||
	      !memcmp(buf, "user.empty\0user.k\0", 18));
	CHECK_EQ(manifest_listxattr(&ds, f01, buf, 17), -ERANGE);
	CHECK_EQ(manifest_listxattr(&ds, f02, buf, sizeof(buf)), 0);
	CHECK_EQ(manifest_listxattr(&ds, FUSE_ROOT_ID, buf, sizeof(buf)), 10);
	CHECK(!memcmp(buf, "user.root", 10));
	CHECK_EQ(manifest_getxattr(&ds, FUSE_ROOT_ID, "user.root", buf,
				   sizeof(buf)),
		 3);
}

static int run_tests(void)
{
	RUN(test_xattr_field);
	if (!open_dataset())
		return 1;
	RUN(test_kinds);
	RUN(test_frames);
	RUN(test_limits);
	RUN(test_xattr_ops);
	close_dataset();
	return check_done();
}

int main(void)
{
	const char *tmp = getenv("TMPDIR");
	char name[32], path[320];
	int status = 0;
	pid_t pid;

	snprintf(root, sizeof(root), "%s/zfolio-manifest-XXXXXX",
		 tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(root))
		return 1;
	snprintf(src, sizeof(src), "%s/src", root);
	snprintf(dst, sizeof(dst), "%s/dst", root);
	CHECK(mkdir(src, 0755) == 0);
	make_kinds();
	make_dir("many");
	for (unsigned int i = 0; i < MANY; i++) {
		snprintf(name, sizeof(name), "many/m%04u", i);
		put(name, 50 + i % 200);
	}
	make_gap("big31", 31, true);
	make_gap("big32", 32, true);
	make_gap("links1000", 1000, false);
	make_gap("links1030", 1030, false);
	snprintf(path, sizeof(path), "%s/f01", src);
	CHECK(setxattr(path, "user.k", "va=l\n", 5, 0) == 0);
	CHECK(setxattr(path, "user.empty", "", 0, 0) == 0);
	CHECK(setxattr(src, "user.root", "top", 3, 0) == 0);
	if (check_failures || !pack()) {
		fprintf(stderr, "cannot make the dataset\n");
		remove_tree();
		return 1;
	}
	/* in a child, so that the tree goes however the tests end */
	pid = fork();
	if (pid == 0)
		exit(run_tests());
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		status = -1;
	remove_tree();
	if (WIFSIGNALED(status))
		fprintf(stderr, "the tests died of signal %d\n",
			WTERMSIG(status));
	return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
