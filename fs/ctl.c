// SPDX-License-Identifier: MIT
/*
 * The control directory: the budget's groups as cgroup v2 style files.
 *
 * ".zfolio/" (name set by -o ctl=) at the mount root is not listed by
 * readdir but can be reached by path.  It holds the root group's files and
 * one subdirectory per child group, with the same files.  The files are
 * declared once, in ctl_files[], which lookup, readdir, reads, writes and
 * the documentation all use.  Writes are parsed whole: a bad value is
 * EINVAL and changes nothing.  Only the mount's owner and root may write.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* the largest control file text (memory.stat.json of every stat) */
#define CTL_BUF 16384

static int show_bytes(char *buf, size_t len, long pages)
{
	if (pages >= COUNTER_MAX)
		return snprintf(buf, len, "max\n");
	return snprintf(buf, len, "%ld\n", pages * (long)ZF_PAGE_SIZE);
}

static int read_current(struct group *g, char *buf, size_t len)
{
	return show_bytes(buf, len, counter_read(&g->mem));
}

static int read_peak(struct group *g, char *buf, size_t len)
{
	return show_bytes(buf, len, atomic_load(&g->mem.peak));
}

static int read_max(struct group *g, char *buf, size_t len)
{
	return show_bytes(buf, len, counter_max(&g->mem));
}

static int read_high(struct group *g, char *buf, size_t len)
{
	return show_bytes(buf, len, atomic_load(&g->mem.high));
}

static int read_events(struct group *g, char *buf, size_t len)
{
	return events_format(g, buf, len);
}

static int read_stat(struct group *g, char *buf, size_t len)
{
	return stat_format(g, buf, len);
}

static int read_json(struct group *g, char *buf, size_t len)
{
	return stat_format_json(g, buf, len);
}

static int read_transport(struct group *g, char *buf, size_t len)
{
	(void)g;
	return furing_describe(buf, len);
}

static int read_store(struct group *g, char *buf, size_t len)
{
	(void)g;
	return remote_describe(buf, len);
}

/* A size in bytes, or "max": pages.  Rounds down, like the kernel. */
static int parse_pages(const char *s, long *pages)
{
	uint64_t bytes;
	int r = parse_size(s, &bytes, true);

	if (r)
		return -EINVAL;
	*pages = bytes == UINT64_MAX ? COUNTER_MAX
				     : (long)(bytes >> ZF_PAGE_SHIFT);
	return 0;
}

static int write_max(struct group *g, const char *s)
{
	long pages;

	bool was;
	int r;

	if (parse_pages(s, &pages))
		return -EINVAL;
	was = reclaim_user_begin(); /* idle decoders may go too */
	r = group_set_max(g, pages);
	reclaim_user_end(was);
	return r;
}

static int write_high(struct group *g, const char *s)
{
	long pages;

	if (parse_pages(s, &pages))
		return -EINVAL;
	return group_set_high(g, pages);
}

static int write_reclaim(struct group *g, const char *s)
{
	uint64_t bytes;
	bool was;
	int r;

	if (parse_size(s, &bytes, false))
		return -EINVAL;
	was = reclaim_user_begin(); /* idle decoders may go too */
	r = reclaim_proactive(g, (unsigned long)(bytes >> ZF_PAGE_SHIFT));
	reclaim_user_end(was);
	return r;
}

static int write_peak(struct group *g, const char *s)
{
	if (strcmp(s, "reset") != 0 && strcmp(s, "reset\n") != 0)
		return -EINVAL;
	counter_reset_peak(&g->mem);
	return 0;
}

static int read_share(struct group *g, char *buf, size_t len)
{
	return share_describe(g->budget, buf, len);
}

const struct ctl_file ctl_files[] = {
	{"memory.current", 0444, read_current, NULL,
	 "bytes charged to the group and below, now"},
	{"memory.peak", 0644, read_peak, write_peak,
	 "the most memory.current has been; write \"reset\" to restart"},
	{"memory.max", 0644, read_max, write_max,
	 "hard limit in bytes or \"max\"; lowering it reclaims down to it "
	 "(EBUSY, the old limit kept, if what is in use cannot be freed "
	 "that far)"},
	{"memory.high", 0644, read_high, write_high,
	 "above it, background reclaim brings usage back under it"},
	{"memory.reclaim", 0200, NULL, write_reclaim,
	 "write a size to reclaim that much now (EAGAIN if it cannot)"},
	{"memory.events", 0444, read_events, NULL,
	 "how often the group hit high and max, and reclaim passes"},
	{"memory.stat", 0444, read_stat, NULL,
	 "every statistic, hierarchical, exact when read"},
	{"memory.stat.json", 0444, read_json, NULL,
	 "the same and the limits, as one JSON object"},
	{"transport", 0444, read_transport, NULL,
	 "how requests reach the daemon (uring or dev), its io_uring queues "
	 "and entries, and the requests served over io_uring; the same in "
	 "every group"},
	{"store", 0444, read_store, NULL,
	 "a dataset in a store: its address, HTTP requests sent (streams: "
	 "those read by successive windows), body bytes received, requests "
	 "retried, reads failed after their retries, and responses that "
	 "showed an object changed (\"store none\" for a local dataset); "
	 "the same in every group"},
	{"share", 0444, read_share, NULL,
	 "with share=: its name, share_max, what its mounts hold together, "
	 "how many they are, and this mount's reclaims for it and what they "
	 "freed (\"none\" without); the same in every group"},
};
const int nr_ctl_files = (int)(sizeof(ctl_files) / sizeof(ctl_files[0]));
#define NR_CTL_FILES nr_ctl_files

int ctl_lookup(struct dataset *ds, struct znode *dir, const char *name,
	       struct znode **out)
{
	struct group *c;

	for (int i = 0; i < NR_CTL_FILES; i++)
		if (strcmp(name, ctl_files[i].name) == 0) {
			*out = znode_ctl(ds, dir->group, i, ZN_CTL_FILE);
			return *out ? 0 : -ENOMEM;
		}
	pthread_mutex_lock(&ds->cache.budget.groups_lock);
	cds_list_for_each_entry(c, &dir->group->children, sibling)
		if (strcmp(c->name, name) == 0)
			break;
	pthread_mutex_unlock(&ds->cache.budget.groups_lock);
	if (&c->sibling == &dir->group->children)
		return -ENOENT;
	*out = znode_ctl(ds, c, CTL_DIR_ID, ZN_CTL_DIR);
	return *out ? 0 : -ENOMEM;
}

int ctl_list(struct dataset *ds, struct znode *dir, struct dir_entry **out,
	     size_t *count)
{
	size_t n = 0, cap = NR_CTL_FILES + 8;
	struct dir_entry *e = calloc(cap, sizeof(*e));
	struct group *c;

	if (!e)
		return -ENOMEM;
	for (int i = 0; i < NR_CTL_FILES; i++) {
		e[n].name = strdup(ctl_files[i].name);
		e[n++].type = S_IFREG;
	}
	pthread_mutex_lock(&ds->cache.budget.groups_lock);
	cds_list_for_each_entry(c, &dir->group->children, sibling) {
		if (n == cap) {
			struct dir_entry *ne = realloc(e, 2 * cap * sizeof(*e));

			if (!ne)
				break;
			e = ne;
			cap *= 2;
		}
		e[n].name = strdup(c->name);
		e[n++].type = S_IFDIR;
	}
	pthread_mutex_unlock(&ds->cache.budget.groups_lock);
	*out = e;
	*count = n;
	return 0;
}

/* A new time for n, after its last even within the clock's resolution. */
static void time_bump(struct znode *n)
{
	struct timespec now, was = n->ctl_time;

	clock_gettime(CLOCK_REALTIME, &now);
	if (now.tv_sec < was.tv_sec ||
	    (now.tv_sec == was.tv_sec && now.tv_nsec <= was.tv_nsec)) {
		now = was;
		if (++now.tv_nsec == 1000000000L) {
			now.tv_sec++;
			now.tv_nsec = 0;
		}
	}
	n->ctl_time = now;
}

/*
 * Control files where the kernel opens files itself (ds->kernel_opens,
 * ops.c): with no open there is no handle to hold the text, and reads go
 * through the page cache, which reads no further than the size stat gave.
 * So the text is made at each lookup of the file (every open by path is
 * one: these entries time out at once; so are a stat and a listing of the
 * directory with attributes), stat gives its size and the time it was
 * made (a new time drops what the page cache held, auto_inval_data), and
 * reads are served from it: a program that opens and reads gets one text,
 * as from a handle, unless another program looks the file up meanwhile;
 * then it may read a part of the other's text (the kernel asks for the
 * attributes again at each read, so the next read is whole again).  A
 * text that cannot be made (no memory) leaves the last one.  The kernel
 * keeps directory listings too, as long as the directory's time stays: a
 * control directory gets a new time at each stat, which the kernel asks
 * for before each listing (time-out 0), so a listing shows the groups
 * there are now.
 */
static void text_make(struct dataset *ds, struct znode *n)
{
	char *buf, *fit;
	size_t len;

	if (!ctl_files[n->ctl_id].read || ctl_read(ds, n, &buf, &len))
		return;
	fit = realloc(buf, len ? len : 1); /* not the whole CTL_BUF kept */
	free(n->ctl_text);
	n->ctl_text = fit ? fit : buf;
	n->ctl_len = len;
	time_bump(n);
}

void ctl_text_new(struct dataset *ds, struct znode *n)
{
	pthread_mutex_lock(&n->lock);
	text_make(ds, n);
	pthread_mutex_unlock(&n->lock);
}

/* [off, off + size) of the text, in a copy the caller frees. */
int ctl_text_read(struct dataset *ds, struct znode *n, uint64_t off,
		  size_t size, char **copy, size_t *len)
{
	int r = 0;

	*copy = NULL;
	*len = 0;
	if (!ctl_files[n->ctl_id].read)
		return -EACCES;
	pthread_mutex_lock(&n->lock);
	if (!n->ctl_text)
		text_make(ds, n);
	if (off < n->ctl_len) {
		*len = n->ctl_len - (size_t)off < size ? n->ctl_len - (size_t)off
						       : size;
		*copy = malloc(*len);
		if (*copy)
			memcpy(*copy, n->ctl_text + off, *len);
		else
			r = -ENOMEM;
	}
	pthread_mutex_unlock(&n->lock);
	return r;
}

void ctl_stat(struct dataset *ds, struct znode *n, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_uid = ds->owner;
	st->st_gid = getgid();
	st->st_atim = st->st_mtim = st->st_ctim = ds->root_st.st_mtim;
	st->st_ino = n->nodeid;
	if (n->kind == ZN_CTL_DIR) {
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
	} else {
		st->st_mode = S_IFREG | ctl_files[n->ctl_id].mode;
		st->st_nlink = 1;
		st->st_size = 0; /* generated when read, like cgroupfs */
	}
	if (!atomic_load(&ds->kernel_opens))
		return;
	pthread_mutex_lock(&n->lock);
	if (n->kind == ZN_CTL_DIR)
		time_bump(n); /* its groups come and go: see text_make() */
	else if (!n->ctl_text)
		text_make(ds, n);
	if (n->kind == ZN_CTL_DIR || n->ctl_text) {
		st->st_size = (off_t)n->ctl_len;
		st->st_mtim = st->st_ctim = n->ctl_time;
	}
	pthread_mutex_unlock(&n->lock);
}

int ctl_read(struct dataset *ds, struct znode *n, char **buf, size_t *len)
{
	const struct ctl_file *cf = &ctl_files[n->ctl_id];
	int r;

	(void)ds;
	if (!cf->read)
		return -EACCES;
	*buf = malloc(CTL_BUF);
	if (!*buf)
		return -ENOMEM;
	r = cf->read(n->group, *buf, CTL_BUF);
	*len = r < 0 ? 0 : (size_t)r >= CTL_BUF ? CTL_BUF - 1 : (size_t)r;
	return 0;
}

int ctl_write(struct dataset *ds, struct znode *n, const char *buf,
	      size_t len)
{
	const struct ctl_file *cf = &ctl_files[n->ctl_id];
	char tmp[128];

	(void)ds;
	if (!cf->write)
		return -EACCES;
	/* a bounded, NUL-terminated copy: control writes are small */
	if (len == 0 || len >= sizeof(tmp))
		return -EINVAL;
	memcpy(tmp, buf, len);
	tmp[len] = '\0';
	return cf->write(n->group, tmp);
}

int ctl_write_named(struct dataset *ds, struct znode *dir, const char *name,
		    const char *value)
{
	struct znode *n;
	int err = ctl_lookup(ds, dir, name, &n);

	if (err)
		return err;
	if (n->kind != ZN_CTL_FILE)
		return -EISDIR;
	return ctl_write(ds, n, value, strlen(value));
}
