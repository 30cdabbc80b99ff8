// SPDX-License-Identifier: MIT
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loop.h"

/*
 * The worker loop and its stop.  A stop (SIGTERM, SIGINT, SIGHUP, or the
 * kernel ending the session at unmount) lets every request the kernel has
 * queued be served: /dev/fuse turns non-blocking, and each worker serves
 * until a read finds the queue empty (or LOOP_DRAIN_MS have passed, so
 * that readers who keep asking cannot hold the stop up), then leaves.  A
 * worker waiting in receive without end is woken by LOOP_WAKE_SIGNAL, whose
 * handler does nothing but make the read return EINTR; it is sent again
 * until every worker has left, since it may land just before a worker
 * starts to wait.  A stopping worker's own wait for a quiet queue
 * (LOOP_QUIET_MS) is not signalled: cut every LOOP_WAKE_MS, it would never
 * see the quiet, and every stop would last LOOP_DRAIN_MS.  Only then is
 * the mount detached and /dev/fuse closed, which makes the kernel fail, at
 * once, whatever is asked later of a file left open.
 */
#define LOOP_WAKE_SIGNAL SIGUSR1
/* how often waiting workers are woken while the loop stops, in ms */
#define LOOP_WAKE_MS 20
/* the most a stop serves what is queued, in ms */
#define LOOP_DRAIN_MS 2000
/* how long the queue must stay empty for a stopping worker to leave */
#define LOOP_QUIET_MS 50

static void wake_handler(int sig)
{
	(void)sig;
}

/*
 * SIGTERM, SIGINT, SIGHUP: stop.  Not libfuse's handlers: those mark the
 * session exited, and an exited session drops every request it reads, so
 * what is queued could not be served.
 */
static const int stop_signals[] = {SIGTERM, SIGINT, SIGHUP};
/* atomic, not just sig_atomic_t: before serve() masks them, a stop may
 * land on any thread, and the main thread reads it (lock-free atomics are
 * async-signal-safe) */
atomic_int stop_signal;

static void stop_handler(int sig)
{
	stop_signal = sig;
}

int stop_signals_install(void)
{
	struct sigaction sa = {.sa_handler = stop_handler}; /* no SA_RESTART */
	struct sigaction ign = {.sa_handler = SIG_IGN};

	for (size_t i = 0; i < sizeof(stop_signals) / sizeof(*stop_signals);
	     i++)
		if (sigaction(stop_signals[i], &sa, NULL))
			return -errno;
	return sigaction(SIGPIPE, &ign, NULL) ? -errno : 0;
}

/*
 * The threads serve() starts, ours and liburcu's, inherit a mask with the
 * stop signals blocked, so a stop always lands on the main thread.  A
 * handler run on another thread would do as well in a plain build, but
 * under ThreadSanitizer a handler runs at its thread's next intercepted
 * call, and liburcu's threads sleep in raw futex calls: a stop caught by
 * one of them waited there until something woke it.
 */
void stop_signals_mask(int how, sigset_t *old)
{
	sigset_t stops;

	sigemptyset(&stops);
	for (size_t i = 0; i < sizeof(stop_signals) / sizeof(*stop_signals);
	     i++)
		sigaddset(&stops, stop_signals[i]);
	pthread_sigmask(how, &stops, old);
}

static long long monotonic_ms(void)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

static bool drain_over(struct loop *lp)
{
	return monotonic_ms() >= lp->drain_end_ms;
}

/*
 * While stopping, is every io_uring entry idle, none having had a request
 * for LOOP_QUIET_MS?  An entry whose worker leaves stays registered with
 * the kernel, which may still hand it a request that nobody serves until
 * the stop ends (and a read that waits on it comes back short).  So the
 * entries leave together, once their readers have gone quiet; a request
 * served is a sign of more to come (the reader's next read).  Over
 * /dev/fuse the workers share one queue and see the quiet by themselves.
 */
static bool uring_quiet(struct loop *lp)
{
	for (unsigned int i = 0; i < lp->n; i++)
		if (atomic_load(&lp->workers[i].busy))
			return false;
	return monotonic_ms() - atomic_load(&lp->last_request_ms) >=
	       LOOP_QUIET_MS;
}

/*
 * While stopping, the queue is empty: does a request come within
 * LOOP_QUIET_MS?  A read a reader started just before the stop may reach
 * the queue a moment later.
 */
static bool request_soon(struct loop *lp)
{
	struct pollfd p = {.fd = fuse_session_fd(lp->se), .events = POLLIN};

	return poll(&p, 1, LOOP_QUIET_MS) != 0; /* ready, or EINTR: look */
}

/*
 * The next request, from /dev/fuse or (e) the worker's io_uring entry:
 * > 0 it is there; 0 none came while stopping (the worker leaves); -EINTR
 * or -EAGAIN: look again; any other error: the connection is over.
 */
static int receive(struct loop_worker *me, struct fuse_buf *buf,
		   struct furing_ent *e, bool stopping)
{
	struct loop *lp = me->lp;
	int r;

	if (e) {
		r = furing_ent_next(e, stopping ? LOOP_QUIET_MS : -1);
		if (r == -ETIME)
			return stopping && uring_quiet(lp) ? 0 : -EAGAIN;
		return r;
	}
	r = fuse_session_receive_buf(lp->se, buf);
	if (r == -EAGAIN && atomic_load(&lp->stopping) && !request_soon(lp))
		return 0; /* the queue stayed empty: done */
	return r == 0 ? -ENODEV : r;
}

/*
 * Receive and serve requests until the loop stops and the queue is empty.
 * Over io_uring a worker's last reply is sent as it leaves.
 */
static void worker_serve(struct loop_worker *me, struct fuse_buf *buf,
			 struct furing_ent *e)
{
	struct loop *lp = me->lp;

	for (;;) {
		bool stopping = atomic_load(&lp->stopping);
		int r;

		if (stopping && drain_over(lp))
			break;
		if (!stopping && fuse_session_exited(lp->se))
			break; /* the kernel ended it, or startup failed */
		/* a wait without end needs the wake signal; the short one of
		 * a stop must not get it, or it would never see the quiet */
		atomic_store(&me->receiving, !stopping);
		cache_thread_offline();
		r = receive(me, buf, e, stopping);
		cache_thread_online();
		atomic_store(&me->receiving, false);
		if (r == -EINTR || r == -EAGAIN)
			continue;
		if (r == 0)
			break;
		/* over io_uring a new request means the last commit went in
		 * (when its own submit could not say so); /dev/fuse ends fills
		 * after the writev, below */
		if (r > 0 && e)
			worker_reply_out();
		if (r < 0) {
			/* over: the kernel ended the connection (unmount) */
			if (!e)
				fuse_session_exit(lp->se);
			else if (r != -ENOTCONN && r != -ECONNABORTED)
				fprintf(stderr, "%s: io_uring queue %u: %s\n",
					lp->progname, me->qid, strerror(-r));
			break;
		}
		atomic_store(&me->busy, true);
		if (e) {
			furing_ent_process(e);
		} else {
			fuse_session_process_buf(lp->se, buf);
			worker_reply_out(); /* written: the kernel has it */
		}
		if (atomic_load(&lp->stopping))
			atomic_store(&lp->last_request_ms, monotonic_ms());
		atomic_store(&me->busy, false);
		/* pointers loaded for this request are dead from here on */
		cache_quiescent();
	}
}

static void *worker_main(void *arg)
{
	struct loop_worker *me = arg;
	struct fuse_buf buf = {.mem = NULL};
	static atomic_int ids;
	struct worker *w = worker_create(atomic_fetch_add(&ids, 1),
					 me->lp->backing_uring);
	struct furing_ent *e = NULL;
	sigset_t wake;

	sigemptyset(&wake);
	sigaddset(&wake, LOOP_WAKE_SIGNAL);
	pthread_sigmask(SIG_UNBLOCK, &wake, NULL);
	if (me->uring) {
		cpu_set_t cpu;

		/* on its queue's CPU: the callers there wake it locally */
		CPU_ZERO(&cpu);
		CPU_SET(me->qid, &cpu);
		pthread_setaffinity_np(pthread_self(), sizeof(cpu), &cpu);
		me->reg_err = w ? furing_ent_new(me->lp->se, me->qid,
						 fault_uring_register(), &e)
				: -ENOMEM;
		sem_post(&me->lp->registered);
		if (me->reg_err) {
			worker_destroy(w);
			w = NULL;
		}
	} else if (!w) {
		fuse_session_exit(me->lp->se);
	}
	if (w) {
		current_worker = w;
		cache_thread_register();
		worker_serve(me, &buf, e);
		furing_ent_free(e);
		cache_thread_unregister();
		free(buf.mem);
		current_worker = NULL;
		worker_destroy(w);
	}
	atomic_store(&me->alive, false);
	sem_post(&me->lp->done);
	return NULL;
}

/* Start n workers (on io_uring queue qid if uring); how many started. */
unsigned int loop_add(struct loop *lp, unsigned int n, bool uring,
			     unsigned int qid)
{
	sigset_t all, old;
	unsigned int started = 0;

	/* other signals go to the main thread, which stops the loop */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	for (; started < n && lp->n < lp->cap; started++) {
		struct loop_worker *w = &lp->workers[lp->n];

		w->lp = lp;
		w->uring = uring;
		w->qid = qid;
		atomic_init(&w->receiving, false);
		atomic_init(&w->alive, true);
		atomic_init(&w->busy, false);
		if (pthread_create(&w->thread, NULL, worker_main, w))
			break;
		lp->n++;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return started;
}

/* n workers on /dev/fuse, room for cap in all */
int loop_start(struct loop *lp, unsigned int n, unsigned int cap)
{
	struct sigaction sa = {.sa_handler = wake_handler}; /* no SA_RESTART */

	lp->workers = calloc(cap, sizeof(*lp->workers));
	if (!lp->workers)
		return -ENOMEM;
	lp->cap = cap;
	sem_init(&lp->done, 0, 0);
	sem_init(&lp->registered, 0, 0);
	sigaction(LOOP_WAKE_SIGNAL, &sa, NULL);
	return loop_add(lp, n, false, 0) ? 0 : -EAGAIN;
}

/* Wait up to ms for a worker to leave: true if one did. */
static bool worker_left(struct loop *lp, long ms)
{
	return sem_wait_ms(&lp->done, ms) == 0;
}

static void loop_stop(struct loop *lp)
{
	int fd = fuse_session_fd(lp->se);
	unsigned int left = lp->n;
	bool cancelled = false;

	lp->drain_end_ms = monotonic_ms() + LOOP_DRAIN_MS;
	/* serve what is queued, and no longer wait for more */
	atomic_store(&lp->last_request_ms, monotonic_ms());
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	atomic_store(&lp->stopping, true);
	while (left) {
		for (unsigned int i = 0; i < lp->n; i++)
			if (atomic_load(&lp->workers[i].alive) &&
			    atomic_load(&lp->workers[i].receiving))
				pthread_kill(lp->workers[i].thread,
					     LOOP_WAKE_SIGNAL);
		while (left && worker_left(lp, LOOP_WAKE_MS))
			left--;
		/* past the drain: a worker still waits on a store (a stalled
		 * server); its read and every one after fail now */
		if (left && !cancelled && drain_over(lp)) {
			remote_cancel(lp->ds);
			cancelled = true;
		}
	}
	for (unsigned int i = 0; i < lp->n; i++)
		pthread_join(lp->workers[i].thread, NULL);
}

/* Serve until a stop signal or the kernel ends the session, then stop;
 * a signal's stop is logged against mountpoint (NULL: a failed start's
 * stop, which its own error has said) */
void loop_wait(struct loop *lp, const char *mountpoint)
{
	unsigned int left = lp->n;

	/* a signal sets exited, and may land just before the wait: recheck */
	while (!stop_signal && !fuse_session_exited(lp->se) && left) {
		if (worker_left(lp, 200))
			left--;
		zlog_tick(false);
	}
	zlog_tick(true); /* what the log held back, before the stop's line */
	if (stop_signal && mountpoint)
		zlog_file(mountpoint, "SIG%s: serving what is asked for at most "
			  "%d ms, then unmounting", sigabbrev_np(stop_signal),
			  LOOP_DRAIN_MS);
	/* the workers that left already posted: count them again in stop */
	for (unsigned int i = 0; i < lp->n - left; i++)
		sem_post(&lp->done);
	/* while the workers still answer fills: a store waits on the pages
	 * of a fill in flight (push.c) */
	push_stop(lp->ds);
	ktier_halt(&lp->ds->cache); /* the same, for its invalidations */
	loop_stop(lp);
	zlog_tick(true); /* and what the drain's reads said */
	push_free(lp->ds); /* no worker can reach it now */
	/* detach the mount; closing /dev/fuse later aborts what is queued */
	fuse_session_unmount(lp->se);
	free(lp->workers);
	sem_destroy(&lp->done);
	sem_destroy(&lp->registered);
}
