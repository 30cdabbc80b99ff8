// SPDX-License-Identifier: MIT
/*
 * A budget shared by several mounts (share=NAME, share_max=SIZE): their
 * memory together stays under one limit, as cgroups under one parent do,
 * where a budget per mount would multiply with the mounts.
 *
 * The members are processes: they meet in a small file mapped shared (in
 * /dev/shm, made by the first), a slot each, where each says how much it
 * holds (its root's memory.current) and when it last served a read.
 * Every SHARE_TICK_MS each member adds the slots up; above the limit, it
 * reclaims its part of the excess.  The excess is taken first from the
 * members idle for SHARE_IDLE_MS (their pages are older than any a busy
 * member read since: the order of one LRU over all of them), each in
 * proportion to what it holds, and what they cannot give from the busy
 * ones, again by size (the kernel scans the cgroups under a parent in
 * proportion to their size): an idle mount's cache gives way to a busy
 * one's, and busy ones share the room.
 *
 * A charge that takes the total (this member's pages as they are, the
 * others' as it last saw them) over the limit does not wait for the tick:
 * it wakes every member's thread at once (a futex word in the file, shared
 * by the processes), once until this member has looked again (share_kick).
 * So the total passes the limit only by what the members read while their
 * threads reclaim, as a cgroup passes memory.high; each member's own
 * memory.max still holds at every charge.
 *
 * A member holds a lock on its slot's byte (an open file description's
 * lock: the kernel drops it when the member's process ends, and a daemon
 * that forks after joining keeps it): a slot whose lock is gone is not
 * counted, and the next member to join frees it.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "accounting.h"

#define SHARE_MAGIC 0x7a667368u /* "zfsh" */
#define SHARE_VERSION 4
#define SHARE_SLOTS 64
/* ms a member that could not free what it was asked waits */
#define SHARE_BACKOFF_MS (10 * SHARE_TICK_MS)
/* ms between two wakes of the members by one member */
#define SHARE_KICK_MIN_MS 1

/* atomics in a file shared by processes: only if free of locks */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
	       "shared atomics need lock-free 64-bit operations");

struct share_slot {
	_Atomic int32_t pid; /* 0: free; else who took it */
	_Atomic int64_t pages;
	_Atomic int64_t busy_ms; /* CLOCK_MONOTONIC of its last read served */
	_Atomic int64_t pinned;  /* of pages, what its last reclaim left */
};

struct share_file {
	uint32_t magic, version;
	int64_t max_pages;
	_Atomic uint32_t wake; /* futex: bumped to wake every member */
	uint32_t pad;
	struct share_slot slot[SHARE_SLOTS];
};
/* slot i's lock is on byte LOCK_AT + i, past the data */
#define LOCK_AT ((off_t)sizeof(struct share_file))

struct share {
	struct budget *b;
	struct share_file *f;
	char *path;
	int fd;
	int slot;
	int64_t backoff_until; /* ms: it could not free, it waits */
	char *name;
	pthread_t thread;
	bool running;
	atomic_bool stop;
	atomic_long others; /* the other members' pages, as last seen */
	atomic_bool kicked; /* woke the members; not looked since */
	atomic_llong kick_ms; /* when it last did */
	atomic_ulong reclaims, reclaimed, kicks;
	long reads; /* the root's pgfault at the last tick */
};

static int64_t now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Slot i's lock, F_WRLCK to take it, or F_UNLCK as a question: whether
 * another open file holds it (F_OFD_GETLK). */
static int slot_lock(int fd, int i, int cmd, short type)
{
	struct flock l = {.l_type = type, .l_whence = SEEK_SET,
			  .l_start = LOCK_AT + i, .l_len = 1};

	if (cmd == F_OFD_GETLK) {
		l.l_type = F_WRLCK;
		if (fcntl(fd, F_OFD_GETLK, &l))
			return 1; /* cannot tell: held */
		return l.l_type != F_UNLCK;
	}
	return fcntl(fd, cmd, &l) ? -errno : 0;
}

/* Whether slot i holds a member alive (this one's own is). */
static bool slot_live(const struct share *s, int i)
{
	return i == s->slot || (atomic_load(&s->f->slot[i].pid) &&
				slot_lock(s->fd, i, F_OFD_GETLK, 0) == 1);
}

int share_join(struct budget *b, const char *path, const char *name,
	       unsigned long max_pages, char *err, size_t errlen)
{
	struct share *s = calloc(1, sizeof(*s));
	struct stat st;
	int r = 0;

	if (!s || !(s->name = strdup(name))) {
		free(s);
		return -ENOMEM;
	}
	s->b = b;
	s->slot = -1;
	/* one member at a time sets the file up and takes a slot; the last
	 * to leave removes it, so a file opened just before is one no other
	 * member will find: open again */
	for (;;) {
		struct stat now;

		s->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
			     0600);
		if (s->fd < 0 || flock(s->fd, LOCK_EX) || fstat(s->fd, &st)) {
			r = -errno;
			snprintf(err, errlen, "share %s: %s: %s", name, path,
				 strerror(-r));
			goto fail;
		}
		if (!stat(path, &now) && now.st_ino == st.st_ino &&
		    now.st_dev == st.st_dev)
			break;
		close(s->fd);
	}
	if (st.st_uid != geteuid() ||
	    ((size_t)st.st_size != sizeof(*s->f) && st.st_size != 0)) {
		r = -EPERM;
		snprintf(err, errlen, "share %s: %s is not a share of this "
			 "user's: remove it, or take another name", name, path);
		goto fail;
	}
	if (!st.st_size && ftruncate(s->fd, sizeof(*s->f))) {
		r = -errno;
		snprintf(err, errlen, "share %s: %s", name, strerror(-r));
		goto fail;
	}
	s->f = mmap(NULL, sizeof(*s->f), PROT_READ | PROT_WRITE, MAP_SHARED,
		    s->fd, 0);
	if (s->f == MAP_FAILED) {
		s->f = NULL;
		r = -errno;
		snprintf(err, errlen, "share %s: %s", name, strerror(-r));
		goto fail;
	}
	/* the slots of members gone are freed; a file of another version
	 * is made anew, unless a member of that version is alive */
	bool members = false;
	for (int i = 0; i < SHARE_SLOTS; i++) {
		if (slot_lock(s->fd, i, F_OFD_GETLK, 0) == 1) {
			members = true;
			continue;
		}
		atomic_store(&s->f->slot[i].pid, 0);
	}
	if (s->f->magic != SHARE_MAGIC || s->f->version != SHARE_VERSION) {
		if (members) {
			r = -EPROTO;
			snprintf(err, errlen, "share %s is in use by mounts of "
				 "another version of zfolio: take another name",
				 name);
			goto fail;
		}
		memset(s->f, 0, sizeof(*s->f));
		s->f->magic = SHARE_MAGIC;
		s->f->version = SHARE_VERSION;
	}
	if (!members)
		s->f->max_pages = (int64_t)max_pages;
	if (s->f->max_pages != (int64_t)max_pages) {
		r = -EINVAL;
		snprintf(err, errlen, "share %s holds at most %llu bytes for "
			 "the mounts in it, not %llu: give them one share_max",
			 name, (unsigned long long)s->f->max_pages
				   << ZF_PAGE_SHIFT,
			 (unsigned long long)max_pages << ZF_PAGE_SHIFT);
		goto fail;
	}
	for (int i = 0; i < SHARE_SLOTS && s->slot < 0; i++) {
		struct share_slot *sl = &s->f->slot[i];

		if (atomic_load(&sl->pid) ||
		    slot_lock(s->fd, i, F_OFD_SETLK, F_WRLCK))
			continue;
		atomic_store(&sl->pages, 0);
		atomic_store(&sl->pinned, 0);
		atomic_store(&sl->busy_ms, now_ms());
		atomic_store(&sl->pid, (int32_t)getpid());
		s->slot = i;
	}
	if (s->slot < 0) {
		r = -EUSERS;
		snprintf(err, errlen, "share %s has %d mounts already, the most "
			 "it takes", name, SHARE_SLOTS);
		goto fail;
	}
	flock(s->fd, LOCK_UN);
	s->path = strdup(path);
	b->share = s;
	return 0;
fail:
	if (s->f)
		munmap(s->f, sizeof(*s->f));
	if (s->fd >= 0)
		close(s->fd); /* drops the lock */
	free(s->name);
	free(s);
	return r;
}

/* What the members hold together, this one's as it is now; of that, what
 * the idle ones hold. */
static long share_total(struct share *s, long mine, long *idle)
{
	int64_t before = now_ms() - SHARE_IDLE_MS;
	long total = 0;

	atomic_store(&s->f->slot[s->slot].pages, mine);
	*idle = 0;
	for (int i = 0; i < SHARE_SLOTS; i++) {
		struct share_slot *sl = &s->f->slot[i];
		long pages;

		if (!slot_live(s, i))
			continue;
		pages = (long)atomic_load(&sl->pages);
		total += pages;
		/* what an idle one can give: not what it could not */
		if (atomic_load(&sl->busy_ms) < before &&
		    pages > (long)atomic_load(&sl->pinned))
			*idle += pages - (long)atomic_load(&sl->pinned);
	}
	atomic_store(&s->others, total - mine);
	return total;
}

static void futex_wake_all(_Atomic uint32_t *word)
{
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL,
		NULL, 0);
}

/* Wait until the word is no longer seen, or ms pass. */
static void futex_wait_ms(_Atomic uint32_t *word, uint32_t seen, long ms)
{
	struct timespec t = {.tv_sec = ms / 1000,
			     .tv_nsec = (ms % 1000) * 1000000L};

	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, &t, NULL, 0);
}

/*
 * Whether nr pages more would take the members over the limit, this one
 * holding mine (the others as last seen): a speculative charge (readahead)
 * is then refused, as at a parent cgroup's limit, and the members are
 * woken to reclaim.  Readahead of a dataset in a store stays in flight
 * while its requests run, where the members' reclaim cannot take it: two
 * mounts of one over HTTP at share_max=32M held 50 MiB together.
 */
bool share_over(struct share *s, long mine, unsigned long nr)
{
	if (mine + (long)nr + atomic_load_explicit(&s->others,
						   memory_order_relaxed) <=
	    s->f->max_pages)
		return false;
	share_kick(s, mine);
	return true;
}

void share_kick(struct share *s, long mine)
{
	int64_t now;

	if (mine + atomic_load_explicit(&s->others, memory_order_relaxed) <=
		    s->f->max_pages ||
	    atomic_load_explicit(&s->kicked, memory_order_relaxed))
		return;
	/* at most one a millisecond: a member that does not give (stopped,
	 * or deep in a reclaim) must not have the others woken at every
	 * charge */
	now = now_ms();
	if (now < atomic_load(&s->kick_ms) + SHARE_KICK_MIN_MS ||
	    atomic_exchange(&s->kicked, true))
		return;
	atomic_store(&s->kick_ms, now);
	/* the others count what it holds now, not at its last look */
	atomic_store(&s->f->slot[s->slot].pages, mine);
	atomic_fetch_add(&s->kicks, 1);
	atomic_fetch_add(&s->f->wake, 1);
	futex_wake_all(&s->f->wake);
}

/* a * b / c, rounded up, without overflow for page counts */
static long part_of(long a, long b, long c)
{
	return c ? (long)(((__int128)a * b + c - 1) / c) : 0;
}

void share_step(struct share *s)
{
	struct group *root = &s->b->root;
	struct share_slot *me = &s->f->slot[s->slot];
	long reads = stat_read(root, STAT_PGFAULT);
	long mine, idle, total, excess, part, from_idle, before;
	bool busy, stuck, backoff = now_ms() < s->backoff_until;

	/* a charge from now on may kick again: its pages are counted below,
	 * or it sees kicked false (what it holds, it could not free just
	 * now: no kick while it waits) */
	if (!backoff)
		atomic_store(&s->kicked, false);
	mine = counter_read(&root->mem);
	if (reads != s->reads) {
		s->reads = reads;
		atomic_store(&me->busy_ms, now_ms());
		atomic_store(&me->pinned, 0);
	}
	busy = atomic_load(&me->busy_ms) >= now_ms() - SHARE_IDLE_MS;
	total = share_total(s, mine, &idle);
	if (backoff)
		return;
	excess = total - (long)s->f->max_pages;
	if (excess <= 0 || mine <= 0)
		return;
	/* over it, room for the next reads too, as a budget's pass makes
	 * (ra_reclaim=batch): the members then look again only after that
	 * much is read, not at every charge */
	if (s->b->cfg.reclaim_headroom)
		excess += (long)reclaim_headroom_of(
			(unsigned long)s->f->max_pages);
	/* the idle first, by size; the rest from the busy, by size */
	from_idle = excess < idle ? excess : idle;
	if (busy)
		part = part_of(excess - from_idle, mine, total - idle);
	else
		part = part_of(from_idle, mine, idle) +
		       part_of(excess - from_idle, mine, total);
	if (part <= 0)
		return;
	before = mine;
	/* what it cannot free (metadata, folios in use) the others take */
	stuck = reclaim_proactive(root, (unsigned long)part) == -EAGAIN;
	mine = counter_read(&root->mem);
	atomic_store(&me->pinned, stuck ? mine : 0);
	s->backoff_until = stuck ? now_ms() + SHARE_BACKOFF_MS : 0;
	atomic_fetch_add(&s->reclaims, 1);
	if (before > mine)
		atomic_fetch_add(&s->reclaimed, (unsigned long)(before - mine));
	share_total(s, mine, &idle);
}

static void *share_main(void *arg)
{
	struct share *s = arg;
	const struct budget_ops *ops = s->b->ops;
	uint32_t seen = atomic_load(&s->f->wake);

	if (ops && ops->thread_state)
		ops->thread_state(THREAD_REGISTER, s->b->ops_priv);
	/* a kick while it steps is not lost: the word is not what it saw */
	while (!atomic_load(&s->stop)) {
		if (ops && ops->thread_state)
			ops->thread_state(THREAD_OFFLINE, s->b->ops_priv);
		futex_wait_ms(&s->f->wake, seen, SHARE_TICK_MS);
		if (ops && ops->thread_state)
			ops->thread_state(THREAD_ONLINE, s->b->ops_priv);
		if (atomic_load(&s->stop))
			break;
		seen = atomic_load(&s->f->wake);
		share_step(s);
	}
	if (ops && ops->thread_state)
		ops->thread_state(THREAD_UNREGISTER, s->b->ops_priv);
	return NULL;
}

int share_start(struct budget *b)
{
	struct share *s = b->share;
	int err;

	if (!s || s->running)
		return 0;
	/* a daemon that forked after joining: the slot (its lock is the
	 * open file's, which the fork shares) is this process's now */
	atomic_store(&s->f->slot[s->slot].pid, (int32_t)getpid());
	atomic_store(&s->stop, false);
	err = pthread_create(&s->thread, NULL, share_main, s);
	if (err)
		return -err;
	s->running = true;
	return 0;
}

void share_stop(struct budget *b)
{
	struct share *s = b->share;

	if (!s || !s->running)
		return;
	/* the others' threads wake too, and look once more: no harm */
	atomic_store(&s->stop, true);
	atomic_fetch_add(&s->f->wake, 1);
	futex_wake_all(&s->f->wake);
	pthread_join(s->thread, NULL);
	s->running = false;
}

void share_leave(struct budget *b)
{
	struct share *s = b->share;
	struct stat mine, now;
	bool members = false;

	if (!s)
		return;
	share_stop(b);
	flock(s->fd, LOCK_EX);
	atomic_store(&s->f->slot[s->slot].pages, 0);
	atomic_store(&s->f->slot[s->slot].pid, 0);
	for (int i = 0; i < SHARE_SLOTS; i++)
		members |= i != s->slot && slot_live(s, i);
	/* under the lock (see share_join()), and only the file it is in */
	if (!members && !fstat(s->fd, &mine) && !stat(s->path, &now) &&
	    mine.st_ino == now.st_ino && mine.st_dev == now.st_dev)
		unlink(s->path);
	b->share = NULL;
	munmap(s->f, sizeof(*s->f));
	close(s->fd); /* and with it the slot's lock and the flock */
	free(s->path);
	free(s->name);
	free(s);
}

int share_describe(const struct budget *b, char *buf, size_t len)
{
	struct share *s = b->share;
	long total = 0, members = 0;

	if (!s)
		return snprintf(buf, len, "none\n");
	for (int i = 0; i < SHARE_SLOTS; i++)
		if (slot_live(s, i)) {
			members++;
			total += (long)atomic_load(&s->f->slot[i].pages);
		}
	return snprintf(buf, len,
			"name %s\nmax %llu\ncurrent %llu\nmembers %ld\n"
			"reclaims %lu\nreclaimed %llu\nkicks %lu\n",
			s->name,
			(unsigned long long)s->f->max_pages << ZF_PAGE_SHIFT,
			(unsigned long long)total << ZF_PAGE_SHIFT, members,
			atomic_load(&s->reclaims),
			(unsigned long long)atomic_load(&s->reclaimed)
				<< ZF_PAGE_SHIFT,
			atomic_load(&s->kicks));
}
