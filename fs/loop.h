// SPDX-License-Identifier: MIT
/*
 * The worker loop of the daemon, and its stop (loop.c): mount.c starts it
 * and waits on it; the workers serve /dev/fuse or their io_uring entries.
 */
#ifndef ZF_FS_LOOP_H
#define ZF_FS_LOOP_H

#include <semaphore.h>
#include <signal.h>

#include "internal.h"

struct loop_worker {
	pthread_t thread;
	struct loop *lp;
	atomic_bool receiving; /* in a wait without end (or about to) */
	atomic_bool alive;
	atomic_bool busy; /* serving a request */
	bool uring;      /* serves an io_uring entry, not /dev/fuse */
	unsigned int qid; /* the entry's queue */
	int reg_err;     /* its registration's result, once registered posts */
};

struct loop {
	struct fuse_session *se;
	struct dataset *ds;
	const char *progname; /* for what a worker says */
	bool backing_uring;
	atomic_bool stopping;
	long long drain_end_ms; /* set before stopping */
	atomic_llong last_request_ms; /* while stopping, for io_uring */
	sem_t done; /* a worker left */
	sem_t registered; /* an io_uring worker's entry registered or failed */
	struct loop_worker *workers;
	unsigned int n, cap;
};

/* the stop signal that came (SIGTERM, SIGINT, SIGHUP), or 0 */
extern atomic_int stop_signal;
/* their handlers (not libfuse's), and SIGPIPE ignored */
int stop_signals_install(void);
/* block (or unblock) the stop signals, for the threads started after */
void stop_signals_mask(int how, sigset_t *old);
/* n workers on /dev/fuse, room for cap in all: 0 or -errno */
int loop_start(struct loop *lp, unsigned int n, unsigned int cap);
/* n workers more (on io_uring queue qid if uring): how many started */
unsigned int loop_add(struct loop *lp, unsigned int n, bool uring,
		      unsigned int qid);
/* serve until a stop signal or the kernel ends the session, then stop */
void loop_wait(struct loop *lp, const char *mountpoint);

#endif
