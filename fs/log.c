// SPDX-License-Identifier: MIT
/*
 * Messages about the dataset: why a file reads as EIO.  In the foreground
 * they go to stderr; a daemonized mount sends them to syslog (the
 * journal), where users look.  Each (file, reason) is said once, however
 * often the file is opened, and no more than LOG_BURST messages go out per
 * LOG_PERIOD seconds: a tree of a million damaged files must not flood the
 * journal.  What is held back is said in the next periods (the main
 * thread looks every 200 ms: zlog_tick), LOG_PENDING messages of it, the
 * rest counted; at the stop, all that is left.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include <time.h>

#include "internal.h"

/* messages per period: more tells more, and floods the journal sooner */
#define LOG_BURST 20
#define LOG_PERIOD 10
/* (file, reason) pairs remembered: past it, old pairs may be said again */
#define LOG_SEEN_BITS 12
/* messages held back to be said in later periods; past it, only counted */
#define LOG_PENDING 64

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static enum zlog_to log_to = ZLOG_STDERR;
static uint64_t seen[1u << LOG_SEEN_BITS];
static time_t period_start;
static unsigned int period_count, dropped;
static char pending[LOG_PENDING][1024];
static unsigned int npending, pending_first;

void zlog_init(enum zlog_to to)
{
	log_to = to;
	if (to == ZLOG_SYSLOG)
		openlog("zfolio", LOG_PID, LOG_DAEMON);
}

static uint64_t hash_str(uint64_t h, const char *s)
{
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
	return h;
}

/* Said before (or to be said)?  Remembers it in *slot if not. */
static bool said_before(const char *what, const char *msg, uint64_t **slot)
{
	uint64_t h = hash_str(hash_str(0xcbf29ce484222325ull, what), msg);

	*slot = &seen[h >> (64 - LOG_SEEN_BITS)];
	h |= 1; /* 0 marks an empty slot */
	if (**slot == h)
		return true;
	**slot = h;
	return false;
}

/* Within the rate limit?  Counts the message if so. */
static bool may_say(void)
{
	struct timespec t;
	time_t now;

	clock_gettime(CLOCK_MONOTONIC, &t); /* not stalled by a clock set back */
	now = t.tv_sec;

	if (now - period_start >= LOG_PERIOD) {
		period_start = now;
		period_count = 0;
	}
	if (period_count >= LOG_BURST)
		return false;
	period_count++;
	return true;
}

static void say(const char *line)
{
	if (log_to == ZLOG_SYSLOG)
		syslog(LOG_WARNING, "%s", line);
	else if (log_to == ZLOG_STDERR)
		fprintf(stderr, "zfolio: %s\n", line);
}

/* The held-back lines the rate allows now (all of them: at the stop),
 * oldest first, then how many could not be kept.  log_lock held. */
static void say_pending(bool all)
{
	char line[64];

	while (npending && (all || may_say())) {
		say(pending[pending_first]);
		pending_first = (pending_first + 1) % LOG_PENDING;
		npending--;
	}
	if (!npending && dropped && (all || may_say())) {
		snprintf(line, sizeof(line), "%u more messages not said",
			 dropped);
		say(line);
		dropped = 0;
	}
}

void zlog_file(const char *what, const char *fmt, ...)
{
	char msg[512], line[1024];
	uint64_t *slot;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&log_lock);
	if (!said_before(what, msg, &slot)) {
		say_pending(false);
		if (!npending && may_say()) {
			snprintf(line, sizeof(line), "%s: %s", what, msg);
			say(line);
		} else if (npending < LOG_PENDING) {
			snprintf(pending[(pending_first + npending) %
					 LOG_PENDING],
				 sizeof(pending[0]), "%s: %s (held back)", what,
				 msg);
			npending++;
		} else {
			dropped++;
			*slot = 0; /* not said: its next time may be */
		}
	}
	pthread_mutex_unlock(&log_lock);
}

void zlog_tick(bool stop)
{
	pthread_mutex_lock(&log_lock);
	say_pending(stop);
	pthread_mutex_unlock(&log_lock);
}
