// SPDX-License-Identifier: MIT
/*
 * A thread's client of a store: the reason of its last failure, for a
 * message, and, made when first needed, a curl multi handle with easy
 * handles for reuse (uploads run on it, and the fetcher has one of its
 * own): a thread that only waits for reads has none.  Reads go through
 * the store's fetcher (fetch.c); this file only waits for them.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

struct store_client *store_client_new(struct store *s)
{
	struct store_client *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->s = s;
	return c;
}

int store_client_transfers(struct store_client *c)
{
	if (c->multi)
		return 0;
	c->multi = curl_multi_init();
	if (!c->multi)
		return -ENOMEM;
	curl_multi_setopt(c->multi, CURLMOPT_PIPELINING, CURLPIPE_MULTIPLEX);
	curl_multi_setopt(c->multi, CURLMOPT_MAX_HOST_CONNECTIONS, 16L);
	return 0;
}

void store_client_free(struct store_client *c)
{
	if (!c)
		return;
	for (unsigned int i = 0; i < c->nidle; i++)
		curl_easy_cleanup(c->idle[i]);
	free(c->idle);
	if (c->multi)
		curl_multi_cleanup(c->multi);
	free(c);
}

const char *store_client_error(const struct store_client *c)
{
	return c->err[0] ? c->err : "no error";
}

__thread atomic_bool *store_wait_abort;

/* Wait up to ms for sem: 0, or -1 (timed out, or a signal). */
static int sem_wait_ms(sem_t *sem, long ms)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	t.tv_nsec += (ms % 1000) * 1000000L;
	t.tv_sec += ms / 1000 + t.tv_nsec / 1000000000L;
	t.tv_nsec %= 1000000000L;
	return sem_timedwait(sem, &t);
}

int store_read_wait(struct store_client *c, struct store_read *r)
{
	atomic_bool *abort = store_wait_abort;

	/* looking at the abort word every 50 ms until it is set */
	while (abort && sem_wait_ms(&r->done, 50)) {
		if (atomic_load_explicit(abort, memory_order_relaxed)) {
			store_read_stop(r);
			abort = NULL;
		}
	}
	while (!abort && sem_wait(&r->done) && errno == EINTR)
		;
	sem_destroy(&r->done);
	if (r->res < 0 && c)
		store_set_error(c, "%s", r->err[0] ? r->err : strerror(-r->res));
	return r->res;
}

ssize_t store_pread(struct store_client *c, struct store_obj *o, void *buf,
		    size_t len, uint64_t off)
{
	struct store_read r = {.off = off, .len = len, .dst = buf};

	if (off >= o->size)
		return 0; /* also while opening: its size is unknown */
	if (len > o->size - off)
		r.len = len = (size_t)(o->size - off);
	/* the kept tail: a seek table's reads */
	if (o->tail && off >= o->tail_off &&
	    off + len <= o->tail_off + o->tail_len) {
		memcpy(buf, o->tail + (off - o->tail_off), len);
		return (ssize_t)len;
	}
	store_read_start(c, o, &r);
	return store_read_wait(c, &r);
}
