// SPDX-License-Identifier: MIT
/*
 * A test hook: ZFOLIO_TEST_FAULT=MODE:N makes every Nth event of a kind go
 * wrong, so that the mount tests reach the error paths on the real read
 * path (io_uring included):
 *   eio:N           a backing read of file data fails with EIO
 *   short:N         a backing read returns half of what it asked for
 *   uring_submit:N  io_uring_submit() refuses with EAGAIN (retried)
 *   uring_wait:N    io_uring_wait_cqe() fails with EIO (the ring breaks)
 *   slow:N          every backing read of file data takes N ms longer
 *   uring_register:N the kernel is made to refuse every Nth FUSE io_uring
 *                   entry (a header buffer too small for it)
 *   direct_einval:N an O_DIRECT backing read is refused with EINVAL, as by
 *                   a filesystem that takes O_DIRECT opens but not reads
 *   inval_held:N    cache=kernel: a fill is held N ms before it is served,
 *                   while a thread of its own drops the fill's pages
 *                   (FUSE_NOTIFY_INVAL_INODE), and so waits on them: the
 *                   stuck thread of watchdog.c, made on purpose
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

enum fault_mode {
	FAULT_NONE,
	FAULT_EIO,
	FAULT_SHORT,
	FAULT_URING_SUBMIT,
	FAULT_URING_WAIT,
	FAULT_SLOW,
	FAULT_URING_REGISTER,
	FAULT_DIRECT_EINVAL,
	FAULT_INVAL_HELD,
};

static const char *const fault_names[] = {
	[FAULT_EIO] = "eio",
	[FAULT_SHORT] = "short",
	[FAULT_URING_SUBMIT] = "uring_submit",
	[FAULT_URING_WAIT] = "uring_wait",
	[FAULT_SLOW] = "slow",
	[FAULT_URING_REGISTER] = "uring_register",
	[FAULT_DIRECT_EINVAL] = "direct_einval",
	[FAULT_INVAL_HELD] = "inval_held",
};

static enum fault_mode fault_mode;
static unsigned int fault_every;
static atomic_uint fault_count;

void backing_faults_from_env(void)
{
	const char *s = getenv("ZFOLIO_TEST_FAULT");
	size_t len = s ? strcspn(s, ":") : 0;
	unsigned int n;

	if (!s || s[len] != ':' || sscanf(s + len + 1, "%u", &n) != 1 || !n)
		return;
	for (int m = FAULT_EIO; m <= FAULT_INVAL_HELD; m++)
		if (strlen(fault_names[m]) == len &&
		    strncmp(s, fault_names[m], len) == 0) {
			fault_mode = (enum fault_mode)m;
			fault_every = n;
			fprintf(stderr, "zfolio: test hook: %s\n", s);
		}
}

/* This is the Nth event of the hook's kind. */
static bool fault_due(enum fault_mode mode)
{
	return fault_mode == mode &&
	       (atomic_fetch_add(&fault_count, 1) + 1) % fault_every == 0;
}

static void sleep_ms(unsigned int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};

	nanosleep(&ts, NULL);
}

/* What a backing read of len bytes that got res returns under the hook. */
long fault_apply(long res, uint64_t len)
{
	if (res <= 0)
		return res;
	if (fault_mode == FAULT_SLOW) {
		sleep_ms(fault_every);
		return res;
	}
	if (fault_due(FAULT_EIO))
		return -EIO;
	if (fault_due(FAULT_SHORT))
		return len / 2 ? (long)(len / 2) : res;
	return res;
}

/* What an O_DIRECT read that got res returns under the hook. */
long fault_direct(long res)
{
	return fault_due(FAULT_DIRECT_EINVAL) ? -EINVAL : res;
}

int fault_uring_submit(void)
{
	return fault_due(FAULT_URING_SUBMIT) ? -EAGAIN : 0;
}

int fault_uring_wait(void)
{
	return fault_due(FAULT_URING_WAIT) ? -EIO : 0;
}

bool fault_uring_register(void)
{
	return fault_due(FAULT_URING_REGISTER);
}

struct held_fill {
	struct fuse_session *se;
	fuse_ino_t ino;
	off_t off, len;
};

static void *drop_held(void *arg)
{
	struct held_fill *h = arg;

	fuse_lowlevel_notify_inval_inode(h->se, h->ino, h->off, h->len);
	free(h);
	return NULL;
}

void fault_hold_fill(struct fuse_session *se, fuse_ino_t ino, off_t off,
		     size_t len)
{
	struct held_fill *h;
	pthread_t t;

	if (fault_mode != FAULT_INVAL_HELD || !(h = malloc(sizeof(*h))))
		return;
	*h = (struct held_fill){se, ino, off, (off_t)len};
	if (pthread_create(&t, NULL, drop_held, h)) {
		free(h);
		return;
	}
	pthread_detach(t);
	sleep_ms(fault_every);
}
