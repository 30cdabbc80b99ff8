// SPDX-License-Identifier: MIT
/*
 * share: budgets of several members under one limit.  Members are budgets
 * of this process (and, for a member that dies, of a child), met in a file
 * of the test's own directory; reclaim is a fake whose pool shrink() frees.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../accounting/accounting.h"
#include "check.h"

struct fake {
	atomic_long pool; /* the root's reclaimable pages */
};

static unsigned long fake_shrink(struct group *g, unsigned long nr,
				 unsigned long *scanned, void *priv)
{
	struct fake *f = priv;
	long have = atomic_load(&f->pool), take;

	*scanned += nr;
	do {
		take = have < (long)nr ? have : (long)nr;
	} while (!atomic_compare_exchange_weak(&f->pool, &have, have - take));
	uncharge(g, (unsigned long)take);
	return (unsigned long)take;
}

static const struct budget_ops fake_ops = {.shrink = fake_shrink};

struct member {
	struct budget b;
	struct fake f;
};

static char dir[64], path[96];

static void member_init(struct member *m, long max)
{
	struct budget_config cfg = {
		.max_pages = (unsigned long)max,
		.high_pages = COUNTER_MAX,
		.group_max_pages = COUNTER_MAX,
		.group_high_pages = COUNTER_MAX,
	};

	memset(m, 0, sizeof(*m));
	CHECK_EQ(budget_init(&m->b, &cfg, &fake_ops, &m->f), 0);
}

static int join(struct member *m, long share_max)
{
	char err[256];

	return share_join(&m->b, path, "t", (unsigned long)share_max, err,
			  sizeof(err));
}

/* n more pages, reclaimable */
static void fill(struct member *m, long n)
{
	CHECK_EQ(counter_try_charge(&m->b.root.mem, n, NULL), 1);
	atomic_fetch_add(&m->f.pool, n);
}

/* Two members of a share of share_max, each with a budget of max */
static void pair(struct member *a, struct member *b, long max, long share_max)
{
	member_init(a, max);
	member_init(b, max);
	CHECK_EQ(join(a, share_max), 0);
	CHECK_EQ(join(b, share_max), 0);
}

static long held(struct member *m)
{
	return counter_read(&m->b.root.mem);
}

static void member_fini(struct member *m)
{
	share_leave(&m->b);
	uncharge(&m->b.root, (unsigned long)atomic_exchange(&m->f.pool, 0));
	budget_destroy(&m->b);
}

/* Over the limit, each reclaims its part, by what it holds: the two
 * together come under it, each having given in proportion. */
static void test_proportional(void)
{
	struct member a, b;

	pair(&a, &b, 10000, 600);
	fill(&a, 300);
	fill(&b, 900);
	share_step(a.b.share); /* publishes 300 only: 300 < 600 */
	CHECK_EQ(held(&a), 300);
	for (int i = 0; i < 8; i++) {
		share_step(b.b.share);
		share_step(a.b.share);
	}
	CHECK(held(&a) + held(&b) <= 600);
	CHECK(held(&a) + held(&b) >= 540); /* reclaim rounds up a little */
	/* each gave by what it held when it looked: b, looking first with
	 * three quarters of the total, gave most; a gave too */
	CHECK(held(&a) < 300 && held(&a) > 150);
	CHECK(300 - held(&a) < 900 - held(&b));
	member_fini(&a);
	member_fini(&b);
	CHECK(access(path, F_OK) != 0); /* the last one out removed it */
}

/* A busy member takes the room of an idle one, which gives it up. */
static void test_idle_gives_way(void)
{
	struct member a, b;

	pair(&a, &b, 10000, 1000);
	fill(&a, 900);
	for (int i = 0; i < 200; i++) {
		fill(&b, 50);
		share_step(b.b.share);
		share_step(a.b.share);
		CHECK(held(&a) + held(&b) <= 1000 + 50);
	}
	CHECK(held(&a) < 100);
	CHECK(held(&b) > 850);
	member_fini(&a);
	member_fini(&b);
}

/* A member that served no read for SHARE_IDLE_MS gives first: the busy
 * one keeps what it read, the idle one gives all the excess. */
static void test_idle_first(void)
{
	struct member a, b;

	pair(&a, &b, 10000, 1000);
	fill(&a, 900);
	share_step(a.b.share);
	usleep((SHARE_IDLE_MS + 100) * 1000);
	stat_mod(&b.b.root, STAT_PGFAULT, 1); /* b serves reads */
	fill(&b, 400);
	share_step(b.b.share); /* busy: the idle a can give it all */
	CHECK_EQ(held(&b), 400);
	share_step(a.b.share);
	CHECK(held(&a) <= 600 && held(&a) >= 560);
	CHECK_EQ(held(&b), 400);
	member_fini(&a);
	member_fini(&b);
}

/* Members agree on the limit, or the one that disagrees is refused with
 * the reason; the share has room for its slots only. */
static void test_refusals(void)
{
	struct member a, b;
	char err[256] = "";

	member_init(&a, 1000);
	member_init(&b, 1000);
	CHECK_EQ(join(&a, 500), 0);
	CHECK_EQ(share_join(&b.b, path, "t", 400, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "share_max") != NULL);
	CHECK(b.b.share == NULL);
	member_fini(&a);
	/* alone again: any limit */
	CHECK_EQ(join(&b, 400), 0);
	member_fini(&b);
	member_init(&a, 1000);
	CHECK_EQ(share_join(&a.b, "/nonexistent-dir/share", "t", 1, err,
			    sizeof(err)), -ENOENT);
	CHECK(strstr(err, "/nonexistent-dir/share") != NULL);
	member_fini(&a);
}

/* A member whose process died without leaving is counted no more, even
 * before it is reaped. */
static void test_dead_member(void)
{
	struct member a, b;
	char text[512];
	int pipefd[2], status;
	siginfo_t info;
	char c;
	pid_t pid;

	member_init(&a, 10000);
	CHECK_EQ(join(&a, 1000), 0);
	CHECK_EQ(pipe(pipefd), 0);
	pid = fork();
	if (pid == 0) { /* joins, holds 900, and dies */
		member_init(&b, 10000);
		if (join(&b, 1000))
			_exit(1);
		fill(&b, 900);
		share_step(b.b.share);
		if (write(pipefd[1], "x", 1) != 1)
			_exit(1);
		_exit(0);
	}
	CHECK(read(pipefd[0], &c, 1) == 1);
	/* ended, not yet reaped (a zombie, whose pid still answers): its
	 * slot's lock went with its files */
	CHECK_EQ(waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT), 0);
	fill(&a, 500);
	share_step(a.b.share); /* 500 + a dead 900: nothing to give */
	CHECK_EQ(held(&a), 500);
	share_describe(&a.b, text, sizeof(text));
	CHECK(strstr(text, "members 1\n") != NULL);
	CHECK_EQ(waitpid(pid, &status, 0), pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	close(pipefd[0]);
	close(pipefd[1]);
	member_fini(&a);
}

static long kicks(struct member *m)
{
	char text[512];
	const char *k;

	share_describe(&m->b, text, sizeof(text));
	k = strstr(text, "kicks ");
	CHECK(k != NULL);
	return k ? atol(k + 6) : -1;
}

/* n more pages charged as the cache charges them: a charge that takes the
 * share over its limit kicks it */
static void charge(struct member *m, long n)
{
	CHECK_EQ(charge_demand(&m->b.root, (unsigned long)n), 0);
	atomic_fetch_add(&m->f.pool, n);
}

/* A charge over the limit wakes the members at once, once until this one
 * has looked again; under the limit, or with the others unseen, none. */
static void test_kick(void)
{
	struct member a, b;

	pair(&a, &b, 100000, 1000);
	fill(&a, 600);
	charge(&b, 500); /* b has not seen a's 600 yet */
	CHECK_EQ(kicks(&b), 0);
	share_step(a.b.share);
	share_step(b.b.share); /* 1100: b gives its part, sees a's */
	CHECK(held(&a) + held(&b) <= 1000 + 64);
	CHECK_EQ(kicks(&b), 0);
	charge(&b, 200);
	CHECK_EQ(kicks(&b), 1);
	charge(&b, 200); /* not looked since: no second wake */
	CHECK_EQ(kicks(&b), 1);
	share_step(b.b.share);
	usleep(2000); /* one wake a millisecond at the most */
	charge(&b, 300);
	CHECK_EQ(kicks(&b), 2);
	CHECK_EQ(kicks(&a), 0);
	member_fini(&a);
	member_fini(&b);
}

/* Until a and b hold the limit or less together, 5 s at the most: their
 * threads reclaim every tick, later on a loaded machine. */
static void settle(struct member *a, struct member *b, long limit)
{
	for (int i = 0; i < 500 && held(a) + held(b) > limit; i++)
		usleep(10 * 1000);
	CHECK(held(a) + held(b) <= limit);
}

static int by_value(const void *x, const void *y)
{
	long a = *(const long *)x, b = *(const long *)y;

	return (a > b) - (a < b);
}

/* The members' threads, woken by kicks, keep the total near the limit
 * while one charges as the cache does. */
static void test_kick_threads(void)
{
	enum { ROUNDS = 1000, LOOKED = 250 };
	static long total[ROUNDS - LOOKED];
	struct member a, b;
	long middle;

	pair(&a, &b, 100000, 2000);
	fill(&a, 1500);
	CHECK_EQ(share_start(&a.b), 0);
	CHECK_EQ(share_start(&b.b), 0);
	for (int i = 0; i < ROUNDS; i++) {
		charge(&b, 100);
		if (i >= LOOKED) /* after both have looked */
			total[i - LOOKED] = held(&a) + held(&b);
		usleep(200); /* 2 GB/s of 4 KiB pages */
	}
	settle(&a, &b, 2000);
	CHECK(kicks(&b) > 0);
	CHECK(held(&a) < 1500);
	/* The median, not the most: one late wake of a member's thread on a
	 * loaded machine (a sanitizer's, a CI run's) takes the most past
	 * 5,000. Here the median is 2,100-2,300 with kicks, in every build
	 * and under load; 3,400-4,000 by the ticks alone. */
	qsort(total, ROUNDS - LOOKED, sizeof(total[0]), by_value);
	middle = total[(ROUNDS - LOOKED) / 2];
	CHECK(middle < 3000);
	printf("  median %ld, most %ld of 2000 while the last 75,000 pages "
	       "were charged\n", middle, total[ROUNDS - LOOKED - 1]);
	member_fini(&a);
	member_fini(&b);
}

struct filler {
	struct member *m;
	atomic_bool stop;
};

static void *filler(void *arg)
{
	struct filler *f = arg;

	while (!atomic_load(&f->stop)) {
		if (counter_try_charge(&f->m->b.root.mem, 8, NULL))
			atomic_fetch_add(&f->m->f.pool, 8);
		usleep(100);
	}
	return NULL;
}

/* The members' threads keep the total under the limit while one fills. */
static void test_threads(void)
{
	struct member a, b;
	struct filler f = {.m = &b};
	pthread_t t;

	pair(&a, &b, 100000, 2000);
	fill(&a, 1500);
	CHECK_EQ(share_start(&a.b), 0);
	CHECK_EQ(share_start(&b.b), 0);
	CHECK_EQ(pthread_create(&t, NULL, filler, &f), 0);
	usleep(300 * 1000);
	atomic_store(&f.stop, true);
	pthread_join(t, NULL);
	settle(&a, &b, 2000);
	CHECK(held(&a) < 1500);
	member_fini(&a);
	member_fini(&b);
}

int main(void)
{
	snprintf(dir, sizeof(dir), "/tmp/zf-share-XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/share", dir);
	RUN(test_proportional);
	RUN(test_idle_gives_way);
	RUN(test_idle_first);
	RUN(test_refusals);
	RUN(test_dead_member);
	RUN(test_threads);
	RUN(test_kick);
	RUN(test_kick_threads);
	unlink(path);
	rmdir(dir);
	return check_done();
}
