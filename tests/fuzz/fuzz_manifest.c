// SPDX-License-Identifier: MIT
/*
 * Fuzz a hostile manifest: the input is a manifest's text, as `zstd -dc
 * manifest.zst` shows one (entry lines, the header's line last), which is
 * laid out here as mkzfolio writes it (frames of ZMF_FRAME_ENTRIES lines,
 * the header's a frame of its own, a seek table with checksums) beside a
 * data file of known bytes, and opened by the daemon's own code.  The tree
 * it describes is then walked as the kernel would walk it: each directory
 * listed, each name looked up and stat'd, links read, extended attributes
 * listed and read, files opened and read through the cache, names that
 * are not there looked up.  Whatever the text, nothing may crash or trip
 * a sanitizer, a read is the right length or an error, and every inode
 * number handed out is one the manifest holds (never 0 or the root's but
 * for the root).
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../cache/internal.h"
#include "../../fs/internal.h"
#include "reply.h"

#define BUDGET (4u << 20)
#define DATA_FRAMES 4
#define DATA_FRAME (16u << 10)
#define OPS 2000     /* calls per input, at most */
#define PER_DIR 64   /* names of a directory walked */
#define DEPTH 8

static char dir[] = "/tmp/zfolio-fuzz-mf-XXXXXX";
static char mf_path[sizeof(dir) + 32];
static struct options opt;
static struct worker *w;
static ZSTD_CCtx *cctx;
static int ops;

/* A file of frames of `data`, with its seek table, at path. */
static void write_seekable(const char *path, const char *text, size_t len,
			   const size_t *cuts, uint32_t n)
{
	struct zseek_writer_entry *e = calloc(n ? n : 1, sizeof(*e));
	size_t cap = ZSTD_compressBound(len) + 64 * (n + 1);
	uint8_t *out = malloc(cap + zseek_table_size(n));
	size_t pos = 0, at = 0;
	int fd;

	if (!e || !out)
		abort();
	for (uint32_t i = 0; i < n; i++) {
		size_t c = zseek_compress_frame(cctx, 1, text + at, cuts[i],
						out + pos, cap - pos,
						&e[i].checksum);

		if (ZSTD_isError(c))
			abort();
		e[i].c_size = (uint32_t)c;
		e[i].d_size = (uint32_t)cuts[i];
		pos += c;
		at += cuts[i];
	}
	pos += zseek_write_table(e, n, out + pos, zseek_table_size(n));
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || write(fd, out, pos) != (ssize_t)pos)
		abort();
	close(fd);
	free(out);
	free(e);
}

/* The directory and its files, at exit (libFuzzer's end, or a crash's
 * exit): nothing of the run stays in /tmp. */
static void cleanup(void)
{
	char path[sizeof(dir) + 32];

	unlink(mf_path);
	snprintf(path, sizeof(path), "%s/%s/00000000.zst", dir, ZMF_DATA_DIR);
	unlink(path);
	snprintf(path, sizeof(path), "%s/%s", dir, ZMF_DATA_DIR);
	rmdir(path);
	rmdir(dir);
}

static void setup(void)
{
	static char data[DATA_FRAMES * DATA_FRAME];
	size_t cuts[DATA_FRAMES];
	char path[sizeof(dir) + 32];

	if (!mkdtemp(dir))
		abort();
	zlog_init(ZLOG_NONE); /* the reasons, for every input, are noise here */
	cctx = ZSTD_createCCtx();
	snprintf(path, sizeof(path), "%s/%s", dir, ZMF_DATA_DIR);
	if (!cctx || mkdir(path, 0755))
		abort();
	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (char)('a' + i % 23);
	for (int i = 0; i < DATA_FRAMES; i++)
		cuts[i] = DATA_FRAME;
	snprintf(path, sizeof(path), "%s/%s/00000000.zst", dir, ZMF_DATA_DIR);
	write_seekable(path, data, sizeof(data), cuts, DATA_FRAMES);
	snprintf(mf_path, sizeof(mf_path), "%s/%s", dir, ZMF_NAME);
	atexit(cleanup);
	options_defaults(&opt);
	opt.dataset = strdup(dir);
	opt.budget = BUDGET;
	opt.backing_cache = BACKING_KEEP;
	w = worker_create(0, true);
	if (!w)
		abort();
	current_worker = w;
}

/* The input as a manifest: its lines in frames, the last line alone. */
static bool write_manifest(const uint8_t *in, size_t len)
{
	size_t *cuts = NULL, lines = 0, start = 0, n = 0;
	bool ok;

	for (size_t i = 0; i < len; i++)
		lines += in[i] == '\n';
	if (!lines || in[len - 1] != '\n')
		return false;
	cuts = calloc(lines / ZMF_FRAME_ENTRIES + 2, sizeof(*cuts));
	if (!cuts)
		abort();
	/* entries, ZMF_FRAME_ENTRIES a frame, then the header */
	for (size_t i = 0, k = 0, seen = 0; i < len; i++) {
		if (in[i] != '\n')
			continue;
		seen++;
		if (++k == ZMF_FRAME_ENTRIES || seen == lines - 1 ||
		    seen == lines) {
			cuts[n++] = i + 1 - start;
			start = i + 1;
			k = 0;
		}
	}
	ok = n <= UINT32_MAX;
	if (ok)
		write_seekable(mf_path, (const char *)in, len, cuts, (uint32_t)n);
	free(cuts);
	return ok;
}

struct names {
	unsigned int n;
	char name[PER_DIR][NAME_MAX + 1];
	fuse_ino_t ino[PER_DIR];
};

static int collect(void *arg, const struct mf_entry *e, uint64_t k)
{
	struct names *l = arg;

	(void)k;
	if (l->n == PER_DIR)
		return 1;
	memcpy(l->name[l->n], e->name, sizeof(e->name));
	l->ino[l->n++] = e->st.st_ino;
	return 0;
}

static void check_ino(struct dataset *ds, fuse_ino_t ino)
{
	if (!manifest_ino(ds, ino))
		abort(); /* a node the kernel would take for another's */
}

static void read_file(struct dataset *ds, fuse_ino_t ino)
{
	struct file_ra_state *pack_ra;
	struct zfile *f;
	uint64_t base, size, len;
	struct reply r = {0, 0};

	if (manifest_open_file(ds, ino, &f, &base, &size, &pack_ra) || !f)
		return;
	len = size < (64u << 10) ? size : 64u << 10;
	if (len && !zfile_range_refused(f, base, len)) {
		ra_request_init(&w->rq, f->mapping, pack_ra,
				&ds->cache.budget.root, w, base, (size_t)len,
				false);
		cache_read(&w->rq.rq, on_reply, &r);
		cache_quiescent();
		if (!r.err && r.bytes != len)
			abort(); /* open checked that the data holds it */
	}
	zfile_put(f);
}

static void walk(struct dataset *ds, fuse_ino_t dino, int depth)
{
	static struct names lists[DEPTH + 1];
	struct names *l = &lists[depth];
	struct mf_dir md;
	struct stat st;
	char buf[4096];

	l->n = 0;
	if (ops++ > OPS || manifest_opendir(ds, dino, &md))
		return;
	manifest_readdir(ds, &md, 0, collect, l);
	manifest_readdir(ds, &md, l->n / 2, collect, l); /* a later part */
	manifest_closedir(&md);
	if (manifest_lookup(ds, dino, "\x7f-no-such-name", &st) == 0)
		check_ino(ds, st.st_ino);
	for (unsigned int i = 0; i < l->n && ops < OPS; i++, ops++) {
		check_ino(ds, l->ino[i]);
		if (manifest_lookup(ds, dino, l->name[i], &st))
			continue;
		check_ino(ds, st.st_ino);
		if (manifest_stat(ds, st.st_ino, &st))
			continue;
		manifest_listxattr(ds, st.st_ino, buf, sizeof(buf));
		manifest_getxattr(ds, st.st_ino, "user.k", buf, sizeof(buf));
		if (S_ISLNK(st.st_mode))
			manifest_readlink(ds, st.st_ino, buf, sizeof(buf));
		else if (S_ISREG(st.st_mode))
			read_file(ds, st.st_ino);
		else if (S_ISDIR(st.st_mode) && depth < DEPTH)
			walk(ds, st.st_ino, depth + 1);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct dataset ds;
	char err[512], buf[256];
	struct stat st;

	if (!w)
		setup();
	if (!write_manifest(data, size))
		return 0;
	if (dataset_open(&ds, &opt, err, sizeof(err)) == 0 && ds.mf) {
		cache_thread_register();
		ops = 0;
		manifest_stat(&ds, FUSE_ROOT_ID, &st);
		manifest_listxattr(&ds, FUSE_ROOT_ID, buf, sizeof(buf));
		walk(&ds, FUSE_ROOT_ID, 0);
		/* inodes by number, as a kernel that kept them asks */
		for (fuse_ino_t ino = 2; ino < 40 && ops++ < OPS; ino++)
			if (!manifest_stat(&ds, ino, &st) &&
			    S_ISREG(st.st_mode))
				read_file(&ds, ino);
		cache_quiescent();
		cache_thread_unregister();
	}
	dataset_close(&ds);
	return 0;
}
