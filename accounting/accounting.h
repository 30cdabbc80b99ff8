/* SPDX-License-Identifier: MIT */
/*
 * accounting: memory budgets and statistics, the API of accounting/.
 *
 * A budget is a tree of groups, like memory cgroups.  Each group has a page
 * counter (usage, max, high, peak, failcnt) charged hierarchically, and
 * per-thread statistics that every update adds to the group and all its
 * ancestors.  Charges go through a per-thread stock of pre-charged pages.
 *
 * The engine above (cache/) registers a struct budget_ops so that reclaim can
 * shrink a group's LRU lists without accounting knowing what a folio is.
 *
 * Fields other folders may touch: group->lru and group->ktier (owned by
 * cache/), group->parent, group->name (read-only).  Everything else goes
 * through the functions below.
 */
#ifndef ZF_ACCOUNTING_H
#define ZF_ACCOUNTING_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <urcu/list.h>

#include "../common/common.h"

/* Pages a thread charges at once and keeps in its stock: MEMCG_CHARGE_BATCH */
#define CHARGE_BATCH 64
/* Reclaim passes a demand charge may run before it gives up: the kernel's
 * MAX_RECLAIM_RETRIES. */
#define MAX_RECLAIM_RETRIES 16
/* The least a reclaim pass tries to free: SWAP_CLUSTER_MAX. */
#define SWAP_CLUSTER_MAX 32
/* Threads with a private statistics slot; later threads share slot 0. */
#define STAT_SLOTS 64
/* Deepest group hierarchy accepted (cgroup paths are mirrored). */
#define GROUP_MAX_DEPTH 32
#define GROUP_NAME_MAX 64

/* "max": no limit (the largest a counter holds) */
#define COUNTER_MAX ((long)UINT32_MAX)

/* memory.events, counted hierarchically like the kernel's memory.events */
enum group_event { EV_HIGH, EV_MAX, NR_GROUP_EVENTS };
extern const char *const group_event_names[NR_GROUP_EVENTS];

/*
 * A hierarchical page counter: mirrors the kernel's page_counter, except
 * that usage and max share one 64-bit word (max << 32 | usage), so that a
 * charge and a lower limit are decided atomically: usage is never above
 * max, not even for an instant.  Both count 4 KiB pages (16 TiB at most).
 */
struct counter {
	_Atomic uint64_t state; /* max << 32 | usage */
	atomic_long high;    /* above it, background reclaim runs */
	atomic_long peak;    /* highest usage seen (racy raise, like watermark) */
	atomic_long failcnt; /* charges refused at this level */
	struct counter *parent;
};

struct budget;

struct group {
	struct counter mem;
	struct group *parent;
	struct budget *budget;
	char name[GROUP_NAME_MAX];
	unsigned int depth;
	unsigned int id;
	/* children and sibling are protected by budget->groups_lock */
	struct cds_list_head children;
	struct cds_list_head sibling;
	/* round-robin position of reclaim passes started here */
	atomic_uint reclaim_cursor;
	atomic_long events[NR_GROUP_EVENTS];
	/* per-thread statistics: STAT_SLOTS rows of NR_STATS */
	long (*stats)[NR_STATS];
	/* owned by cache/: this group's LRU lists, and its kernel tier's */
	void *lru;
	void *ktier;
};

/*
 * What accounting needs from the cache above it.  shrink() reclaims up to
 * nr pages from the group's own LRU lists (not its children) and returns the
 * pages freed; it adds to *scanned.  expedite() frees folio data waiting for
 * a grace period, waiting for one, and returns the pages freed.  deferred()
 * says how many pages wait.  group_init/group_fini set up group->lru.
 * thread_state() lets the cache register the reclaimer thread with RCU and
 * take it offline while it sleeps.
 */
enum thread_state { THREAD_REGISTER, THREAD_ONLINE, THREAD_OFFLINE,
		    THREAD_UNREGISTER };

struct budget_ops {
	/* called by accounting's own threads (the reclaimer) */
	void (*thread_state)(enum thread_state st, void *priv);
	unsigned long (*shrink)(struct group *g, unsigned long nr,
				unsigned long *scanned, void *priv);
	unsigned long (*expedite)(void *priv);
	unsigned long (*deferred)(void *priv);
	int (*group_init)(struct group *g, void *priv);
	void (*group_fini)(struct group *g, void *priv);
};

/* How new child groups are formed from a request. */
enum group_by { GROUP_BY_NONE, GROUP_BY_UID, GROUP_BY_CGROUP };

struct budget_config {
	unsigned long max_pages;  /* root memory.max */
	unsigned long high_pages; /* root memory.high (COUNTER_MAX: none) */
	unsigned long group_max_pages;
	unsigned long group_high_pages;
	enum group_by group_by;
	/* foreground reclaim frees some headroom, not just what is needed */
	bool reclaim_headroom;
};

/*
 * Per-thread charge stock, like memcg_stock_pcp with one cached group: one
 * word holding (group id << 32 | pages), so that any thread can drain it with
 * an atomic exchange while its owner consumes it with compare-and-swap.
 */
struct stock {
	_Alignas(64) atomic_uint_least64_t word;
};

/* Groups are named by a 32-bit id in stocks; ids index budget->by_id. */
#define GROUP_ID_MAX 65535

struct budget {
	struct group root;
	struct budget_config cfg;
	const struct budget_ops *ops;
	void *ops_priv;
	pthread_mutex_t groups_lock;
	unsigned int next_group_id;
	struct group **by_id; /* GROUP_ID_MAX + 1 slots, written once */
	struct stock stocks[STAT_SLOTS];
	/* background reclaimer for memory.high (kswapd for the mount) */
	pthread_t reclaimer;
	bool reclaimer_running;
	bool reclaimer_stop;
	bool reclaimer_kick;
	pthread_mutex_t reclaimer_lock;
	pthread_cond_t reclaimer_cond;
	struct share *share; /* share=: a limit with other mounts, or NULL */
};

/*
 * share.c: a limit over several mounts (processes), met in a file at path
 * (share_join: 0, or -errno with the reason in err); share_start runs the
 * member's thread, which every SHARE_TICK_MS reclaims its part of what the
 * members hold together above max_pages (share_step), and at once when a
 * charge takes them over it (share_kick, with this member's pages now);
 * share_stop stops it (before what it reclaims from goes), share_leave
 * gives the slot back.
 */
#define SHARE_TICK_MS 10
#define SHARE_IDLE_MS 1000 /* a member that served no read for this long */
struct share;
int share_join(struct budget *b, const char *path, const char *name,
	       unsigned long max_pages, char *err, size_t errlen);
int share_start(struct budget *b);
void share_step(struct share *s);
void share_kick(struct share *s, long mine);
bool share_over(struct share *s, long mine, unsigned long nr);
void share_stop(struct budget *b);
void share_leave(struct budget *b);
int share_describe(const struct budget *b, char *buf, size_t len);

/* budget.c */
int budget_init(struct budget *b, const struct budget_config *cfg,
		const struct budget_ops *ops, void *priv);
void budget_destroy(struct budget *b);
int budget_start_reclaimer(struct budget *b);
void budget_stop_reclaimer(struct budget *b);
struct group *group_lookup_or_create(struct budget *b, struct group *parent,
				     const char *name);
struct group *group_find(struct budget *b, const char *path);
struct group *group_for_request(struct budget *b, unsigned int uid,
				int pid);
size_t group_path(const struct group *g, char *buf, size_t len);
/* Visit g and every group below it, parents first, under groups_lock. */
void group_walk(struct group *g, void (*fn)(struct group *, void *),
		void *arg);

/* counter.c */
void counter_init(struct counter *c, struct counter *parent, long max,
		  long high);
bool counter_try_charge(struct counter *c, long nr, struct counter **fail);
void counter_uncharge(struct counter *c, long nr);
long counter_read(const struct counter *c);
long counter_max(const struct counter *c);
void counter_snapshot(const struct counter *c, long *usage, long *max);
long counter_margin(const struct counter *c);
int counter_set_max(struct counter *c, long max);
void counter_set_high(struct counter *c, long high);
void counter_reset_peak(struct counter *c);

/* charge.c */
int charge_demand(struct group *g, unsigned long nr);
int charge_speculative(struct group *g, unsigned long nr);
int charge_nowait(struct group *g, unsigned long nr);
void uncharge(struct group *g, unsigned long nr);
bool reclaim_for_batch(struct group *g, unsigned long nr, bool for_ra);
unsigned long reclaim_pass(struct group *g, unsigned long nr, bool for_ra);
int reclaim_proactive(struct group *g, unsigned long nr_pages);
bool reclaim_user_asked(void);
bool reclaim_user_begin(void);
void reclaim_user_end(bool was);
unsigned long reclaim_headroom_pages(const struct group *g);
unsigned long reclaim_headroom_of(unsigned long max);
unsigned long reclaim_batch_size(unsigned long target,
				 unsigned long reclaimed);
int group_set_max(struct group *g, long max_pages);
int group_set_high(struct group *g, long high_pages);
void drain_all_stock(struct budget *b);
long stock_pages(struct budget *b);
struct group *group_over_limit(struct group *g, unsigned long nr);

/* stat.c */
int stat_thread_slot(void);
void stat_mod(struct group *g, enum stat_item item, long delta);
static inline void stat_inc(struct group *g, enum stat_item item)
{
	stat_mod(g, item, 1);
}
long stat_read(const struct group *g, enum stat_item item);
void stat_read_all(const struct group *g, long out[NR_STATS]);
void group_event(struct group *g, enum group_event ev);
long group_event_read(const struct group *g, enum group_event ev);
int stat_format(const struct group *g, char *buf, size_t len);
int events_format(const struct group *g, char *buf, size_t len);
int stat_format_json(const struct group *g, char *buf, size_t len);

#endif
