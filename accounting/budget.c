// SPDX-License-Identifier: MIT
/*
 * Budgets and their groups.
 *
 * A mount has one budget; its root group carries budget=, and with
 * group_by=uid|cgroup, child groups are made on demand for the readers that
 * bring folios in.  Groups live until the budget is destroyed (a group is a
 * few dozen KiB; a mount makes as many as it has distinct readers), so a
 * group pointer taken once stays valid and needs no reference counting.
 *
 * The reclaimer is the mount's kswapd: charges that leave a group above its
 * memory.high wake it, and it reclaims until every group is back under high.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accounting.h"

static int group_setup(struct budget *b, struct group *g, struct group *parent,
		       const char *name, long max, long high)
{
	memset(g, 0, sizeof(*g));
	g->stats = calloc(STAT_SLOTS, sizeof(*g->stats));
	if (!g->stats)
		return -ENOMEM;
	counter_init(&g->mem, parent ? &parent->mem : NULL, max, high);
	g->parent = parent;
	g->budget = b;
	g->depth = parent ? parent->depth + 1 : 0;
	snprintf(g->name, sizeof(g->name), "%s", name);
	CDS_INIT_LIST_HEAD(&g->children);
	CDS_INIT_LIST_HEAD(&g->sibling);
	if (b->ops && b->ops->group_init) {
		int err = b->ops->group_init(g, b->ops_priv);

		if (err) {
			free(g->stats);
			return err;
		}
	}
	g->id = ++b->next_group_id;
	b->by_id[g->id] = g;
	return 0;
}

int budget_init(struct budget *b, const struct budget_config *cfg,
		const struct budget_ops *ops, void *priv)
{
	int err;

	memset(b, 0, sizeof(*b));
	b->cfg = *cfg;
	b->ops = ops;
	b->ops_priv = priv;
	pthread_mutex_init(&b->groups_lock, NULL);
	pthread_mutex_init(&b->reclaimer_lock, NULL);
	pthread_cond_init(&b->reclaimer_cond, NULL);
	b->by_id = calloc(GROUP_ID_MAX + 1, sizeof(*b->by_id));
	if (!b->by_id)
		return -ENOMEM;
	for (int i = 0; i < STAT_SLOTS; i++)
		atomic_init(&b->stocks[i].word, 0);
	err = group_setup(b, &b->root, NULL, "", (long)cfg->max_pages,
			  (long)cfg->high_pages);
	if (err)
		free(b->by_id);
	return err;
}

static void group_free_tree(struct budget *b, struct group *g)
{
	struct group *c, *tmp;

	cds_list_for_each_entry_safe(c, tmp, &g->children, sibling)
		group_free_tree(b, c);
	if (b->ops && b->ops->group_fini)
		b->ops->group_fini(g, b->ops_priv);
	free(g->stats);
	if (g != &b->root)
		free(g);
}

void budget_destroy(struct budget *b)
{
	budget_stop_reclaimer(b);
	drain_all_stock(b);
	group_free_tree(b, &b->root);
	free(b->by_id);
	pthread_mutex_destroy(&b->groups_lock);
	pthread_mutex_destroy(&b->reclaimer_lock);
	pthread_cond_destroy(&b->reclaimer_cond);
}

static struct group *group_child(struct group *parent, const char *name)
{
	struct group *c;

	cds_list_for_each_entry(c, &parent->children, sibling)
		if (strcmp(c->name, name) == 0)
			return c;
	return NULL;
}

struct group *group_lookup_or_create(struct budget *b, struct group *parent,
				     const char *name)
{
	struct group *g;

	if (!*name || strlen(name) >= GROUP_NAME_MAX || strchr(name, '/'))
		return NULL;
	pthread_mutex_lock(&b->groups_lock);
	g = group_child(parent, name);
	if (!g && parent->depth + 1 < GROUP_MAX_DEPTH &&
	    b->next_group_id < GROUP_ID_MAX) {
		g = malloc(sizeof(*g));
		if (g && group_setup(b, g, parent, name,
				     (long)b->cfg.group_max_pages,
				     (long)b->cfg.group_high_pages) == 0) {
			cds_list_add_tail(&g->sibling, &parent->children);
		} else {
			free(g);
			g = NULL;
		}
	}
	pthread_mutex_unlock(&b->groups_lock);
	return g;
}

struct group *group_find(struct budget *b, const char *path)
{
	struct group *g = &b->root;
	char comp[GROUP_NAME_MAX];

	pthread_mutex_lock(&b->groups_lock);
	while (g && *path) {
		size_t n = strcspn(path, "/");

		if (n == 0) {
			path++;
			continue;
		}
		if (n >= sizeof(comp)) {
			g = NULL;
			break;
		}
		memcpy(comp, path, n);
		comp[n] = '\0';
		g = group_child(g, comp);
		path += n;
	}
	pthread_mutex_unlock(&b->groups_lock);
	return g;
}

size_t group_path(const struct group *g, char *buf, size_t len)
{
	const struct group *chain[GROUP_MAX_DEPTH];
	size_t n = 0, off = 0;

	for (; g && g->parent; g = g->parent)
		chain[n++] = g;
	if (len)
		buf[0] = '\0';
	while (n--) {
		int w = snprintf(buf + off, len > off ? len - off : 0, "%s%s",
				 off ? "/" : "", chain[n]->name);
		if (w > 0)
			off += (size_t)w;
	}
	return off;
}

static void group_walk_locked(struct group *g,
			      void (*fn)(struct group *, void *), void *arg)
{
	struct group *c;

	fn(g, arg);
	cds_list_for_each_entry(c, &g->children, sibling)
		group_walk_locked(c, fn, arg);
}

void group_walk(struct group *g, void (*fn)(struct group *, void *), void *arg)
{
	pthread_mutex_lock(&g->budget->groups_lock);
	group_walk_locked(g, fn, arg);
	pthread_mutex_unlock(&g->budget->groups_lock);
}

/*
 * The cgroup of a process: the v2 line ("0::/path") of /proc/PID/cgroup,
 * else the v1 memory controller's line ("N:memory:/path").
 */
static int read_cgroup_path(int pid, char *out, size_t len)
{
	char fn[64], line[4096];
	bool found = false;
	FILE *f;

	snprintf(fn, sizeof(fn), "/proc/%d/cgroup", pid);
	f = fopen(fn, "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : 0;

		if (!c2)
			continue;
		line[strcspn(line, "\n")] = '\0';
		if (strncmp(line, "0::", 3) == 0 ||
		    (!found && c2 - c1 - 1 == 6 &&
		     strncmp(c1 + 1, "memory", 6) == 0)) {
			snprintf(out, len, "%s", c2 + 1);
			found = true;
			if (line[0] == '0' && line[1] == ':')
				break;
		}
	}
	fclose(f);
	return found ? 0 : -ENOENT;
}

struct group *group_for_request(struct budget *b, unsigned int uid, int pid)
{
	char path[4096], name[GROUP_NAME_MAX];
	struct group *g = &b->root, *c;
	char *save = NULL, *tok;

	switch (b->cfg.group_by) {
	case GROUP_BY_NONE:
		return g;
	case GROUP_BY_UID:
		snprintf(name, sizeof(name), "uid_%u", uid);
		c = group_lookup_or_create(b, g, name);
		return c ? c : g;
	case GROUP_BY_CGROUP:
		if (pid <= 0 || read_cgroup_path(pid, path, sizeof(path)))
			return g;
		for (tok = strtok_r(path, "/", &save); tok;
		     tok = strtok_r(NULL, "/", &save)) {
			c = group_lookup_or_create(b, g, tok);
			if (!c)
				break;
			g = c;
		}
		return g;
	}
	return g;
}

/* The reclaimer: brings every group above memory.high back under it. */
static void reclaim_high_one(struct group *g)
{
	for (int zero = 0; zero < MAX_RECLAIM_RETRIES;) {
		long over = counter_read(&g->mem) - atomic_load(&g->mem.high);
		unsigned long got;

		if (over <= 0)
			break;
		got = reclaim_pass(g, (unsigned long)over, false);
		stat_inc(g, STAT_HIGH_RECLAIMS);
		if (!got) {
			zero++;
			drain_all_stock(g->budget);
		}
	}
}

static void reclaimer_state(struct budget *b, enum thread_state st)
{
	if (b->ops && b->ops->thread_state)
		b->ops->thread_state(st, b->ops_priv);
}

static void *reclaimer_main(void *arg)
{
	struct budget *b = arg;
	struct group **snap = NULL;

	reclaimer_state(b, THREAD_REGISTER);
	pthread_mutex_lock(&b->reclaimer_lock);
	while (!b->reclaimer_stop) {
		if (!b->reclaimer_kick) {
			reclaimer_state(b, THREAD_OFFLINE);
			pthread_cond_wait(&b->reclaimer_cond,
					  &b->reclaimer_lock);
			reclaimer_state(b, THREAD_ONLINE);
			continue;
		}
		b->reclaimer_kick = false;
		pthread_mutex_unlock(&b->reclaimer_lock);
		/* groups are never freed: walk a snapshot without the lock */
		size_t n = 0, cap = 0;

		pthread_mutex_lock(&b->groups_lock);
		cap = b->next_group_id + 1;
		snap = realloc(snap, cap * sizeof(*snap));
		for (unsigned int id = 1; snap && id <= b->next_group_id; id++)
			if (b->by_id[id])
				snap[n++] = b->by_id[id];
		pthread_mutex_unlock(&b->groups_lock);
		/* newest (deepest) first: reclaiming a child also lowers its parents */
		while (n--)
			reclaim_high_one(snap[n]);
		pthread_mutex_lock(&b->reclaimer_lock);
	}
	pthread_mutex_unlock(&b->reclaimer_lock);
	free(snap);
	reclaimer_state(b, THREAD_UNREGISTER);
	return NULL;
}

int budget_start_reclaimer(struct budget *b)
{
	int err;

	b->reclaimer_stop = false;
	err = pthread_create(&b->reclaimer, NULL, reclaimer_main, b);
	if (err)
		return -err;
	b->reclaimer_running = true;
	return 0;
}

void budget_stop_reclaimer(struct budget *b)
{
	if (!b->reclaimer_running)
		return;
	pthread_mutex_lock(&b->reclaimer_lock);
	b->reclaimer_stop = true;
	pthread_cond_signal(&b->reclaimer_cond);
	pthread_mutex_unlock(&b->reclaimer_lock);
	pthread_join(b->reclaimer, NULL);
	b->reclaimer_running = false;
}
