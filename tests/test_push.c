// SPDX-License-Identifier: MIT
/*
 * The scans a pusher follows (fs/push.c, push_scan_step()): which reads of
 * a file from its start are a scan's next step and start a push, which the
 * push already planned covers, and which are no scan's; gaps, a push that
 * found nothing, two walks at once, and more walks than cursors.  The
 * thread's part (what it pushed, what it plans) is played by hand.
 */
#include <stdint.h>
#include <string.h>

#include "../fs/internal.h"
#include "check.h"

static struct push_scans sc;

static bool step(fuse_ino_t ino, struct scan **s)
{
	struct scan *dummy;

	return push_scan_step(&sc, ino, s ? s : &dummy);
}

static unsigned long get(atomic_ulong *v)
{
	return atomic_load(v);
}

/* the pusher stored files up to last, planned up to planned_hi */
static void pushed(struct scan *s, fuse_ino_t last, fuse_ino_t planned_hi)
{
	atomic_store(&s->planned_hi, planned_hi);
	atomic_store(&s->at, last + 1);
}

static void test_one_walk(void)
{
	struct scan *s, *t;

	memset(&sc, 0, sizeof(sc));
	/* a first read starts a scan, but no push: one file is no walk */
	CHECK(!step(100, &s));
	CHECK_EQ(get(&s->at), 101);
	/* the next file: a push, planned for a gap's worth until the thread
	 * knows better */
	CHECK(step(101, &t));
	CHECK(t == s);
	CHECK_EQ(get(&s->planned_lo), 102);
	CHECK_EQ(get(&s->planned_hi), 102 + PUSH_GAP);
	/* reads the queued push covers start none */
	CHECK(!step(102, &t));
	CHECK(t == s);
	CHECK(!step(150, NULL));
	/* the push stored 102..199; its last frame starts at 190 */
	pushed(s, 199, 190);
	/* the first file after what was pushed: the next push */
	CHECK(step(200, &t));
	CHECK(t == s);
	CHECK_EQ(get(&s->planned_lo), 201);
	/* a push that found nothing: the next read starts one again */
	pushed(s, 200, 0);
	CHECK(step(201, NULL));
}

static void test_gaps(void)
{
	struct scan *s, *t;

	memset(&sc, 0, sizeof(sc));
	CHECK(!step(1000, &s));
	CHECK(step(1001, NULL));
	pushed(s, 1001, 0);
	/* a walk may pass over up to PUSH_GAP entries (directories, links,
	 * files it does not read) and still be the same walk */
	CHECK(step(1002 + PUSH_GAP - 1, &t));
	CHECK(t == s);
	pushed(s, 1002 + PUSH_GAP - 1, 0);
	/* one more is another walk, and so is a read behind the scan */
	CHECK(!step(get(&s->at) + PUSH_GAP, &t));
	CHECK(t != s);
	CHECK(!step(500, NULL));
}

static void test_two_walks(void)
{
	struct scan *a, *b, *t;

	memset(&sc, 0, sizeof(sc));
	/* a walk down into a directory and one still in its parent, their
	 * reads interleaved: each keeps its own cursor */
	CHECK(!step(1000, &a));
	CHECK(!step(5000, &b));
	CHECK(a != b);
	CHECK(step(1001, &t));
	CHECK(t == a);
	CHECK(step(5001, &t));
	CHECK(t == b);
	CHECK(!step(1002, &t));
	CHECK(t == a);
	CHECK(!step(5002, &t));
	CHECK(t == b);
}

static void test_more_walks_than_cursors(void)
{
	struct scan *s[PUSH_CURSORS + 1];

	memset(&sc, 0, sizeof(sc));
	for (unsigned int k = 0; k <= PUSH_CURSORS; k++)
		CHECK(!step(10000 * (k + 1), &s[k]));
	/* the last took the oldest's cursor: that walk starts over */
	CHECK(s[PUSH_CURSORS] == s[0]);
	CHECK(!step(10001, NULL));
	/* the others go on */
	for (unsigned int k = 1; k <= PUSH_CURSORS; k++)
		if (k != 1) /* 10001's new walk took walk 1's cursor */
			CHECK(step(10000 * (k + 1) + 1, NULL));
}

int main(void)
{
	RUN(test_one_walk);
	RUN(test_gaps);
	RUN(test_two_walks);
	RUN(test_more_walks_than_cursors);
	return check_done();
}
