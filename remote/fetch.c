// SPDX-License-Identifier: MIT
/*
 * The fetcher: one thread per store that owns every read's transfer.
 *
 * Any thread starts a read (an object's range into its buffer) and waits
 * for it; the fetcher takes it from a queue and carries it on its curl
 * multi handle, where the reads of a window go out in parallel over the
 * connections it keeps (HTTP/2 streams where the server offers them).
 * Owning every transfer in one place is what lets reads share one:
 *
 * Streams.  A read that starts where the previous read of its object
 * ended opens a stream: one GET from there to the object's end.  The next
 * reads of the object that start where the stream has got to (or a little
 * further, STREAM_SKIP_MAX: the stream reads through frames cached
 * already) take their bytes from it, in order; while nobody waits for its
 * bytes the transfer is paused (TCP's window holds the server back) and
 * after STREAM_IDLE_MS it is closed.  So a file read in sequence costs one
 * request, not one per readahead window, and a reader that jumps costs a
 * request per jump, as before.  A stream that fails hands its readers to
 * requests of their own, from where each stopped.
 *
 * Here: the fetcher's thread and queue, streams, and where each read
 * goes.  A read of its own (one ranged GET, and its retries) is
 * request.c's.
 *
 * Threads: a read's fields are the fetcher's from store_read_start() until
 * it posts r->done; the waiter reads r->res after sem_wait() (the
 * semaphore orders them).  An object's seq_end and stream are the
 * fetcher's alone.  The fetcher is started by the first read and stopped
 * by store_idle() (before the daemon forks) and store_close().
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* a gap a stream reads through rather than a new request */
#define STREAM_SKIP_MAX (1u << 20)
/* a stream nobody reads for this long is closed */
#define STREAM_IDLE_MS 1000
/*
 * Streams open at once: each holds a connection (HTTP/1.1 for S3) while
 * its readers keep coming, and CURLMOPT_MAX_HOST_CONNECTIONS is 16: the
 * rest stay for reads of their own (and opens), which would otherwise
 * wait for a stream to end.
 */
#define STREAMS_MAX 6
/* no seq_end yet */
#define SEQ_NONE UINT64_MAX

/* One GET from start to the object's end, read by successive reads. */
struct stream {
	enum xfer_kind kind;
	struct fetcher *F;
	struct store_obj *obj;
	CURL *h;        /* NULL once the transfer has ended */
	long status;
	bool checked;   /* the response was looked at */
	bool bad;       /* not the bytes asked for: readers go elsewhere */
	bool paused;
	uint64_t start; /* where it was asked from */
	uint64_t pos;   /* the offset of the next byte curl gives */
	/* bytes [pos - spill_len, pos), given while nobody could take them */
	uint8_t *spill;
	size_t spill_len;
	struct store_read *head, *tail; /* its readers, in offset order */
	uint64_t idle_since_ms;
	char range[48];
	char body[ERR_BODY];
	size_t body_len;
	struct stream *next;
};

void set_err(struct store_read *r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	store_format_error(r->err, sizeof(r->err), fmt, ap);
	va_end(ap);
}

/* r is done: after this the waiter owns it (and may free it at once). */
void complete(struct fetcher *F, struct store_read *r, int res)
{
	free(r->handle);
	r->handle = NULL;
	r->res = res;
	if (res < 0 && res != -ECANCELED)
		atomic_fetch_add_explicit(&F->s->n_failures, 1,
					  memory_order_relaxed);
	sem_post(&r->done);
}

void list_del(struct store_read **list, struct store_read *r)
{
	for (struct store_read **p = list; *p; p = &(*p)->next)
		if (*p == r) {
			*p = r->next;
			break;
		}
	r->next = NULL;
}

void mark_changed(struct fetcher *F, struct store_obj *o)
{
	atomic_store_explicit(&o->changed, true, memory_order_relaxed);
	atomic_fetch_add_explicit(&F->s->n_changed, 1, memory_order_relaxed);
}

/* --- streams --- */

/* Give [at, at + len) to the stream's readers, in order: bytes used. */
static size_t stream_deliver(struct stream *s, const uint8_t *p, size_t len,
			     uint64_t at)
{
	struct store_read *r;
	size_t used = 0;

	while (used < len && (r = s->head)) {
		uint64_t want = r->off + r->got, k;

		if (at + used < want) { /* a gap: frames cached already */
			k = want - (at + used);
			used += k < len - used ? k : len - used;
			continue;
		}
		k = r->len - r->got < len - used ? r->len - r->got : len - used;
		memcpy(r->dst + r->got, p + used, k);
		r->got += k;
		used += k;
		if (r->got < r->len)
			continue;
		s->head = r->next;
		if (!s->head) {
			s->tail = NULL;
			s->idle_since_ms = store_now_ms();
		}
		r->next = NULL;
		complete(s->F, r, (int)r->len);
	}
	return used;
}

/* Look at the response once: the bytes asked for, of the same object? */
static void stream_check(struct stream *s)
{
	s->checked = true;
	curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &s->status);
	if (s->status == 206 && !same_object(s->h, s->obj)) {
		mark_changed(s->F, s->obj);
		s->bad = true;
	} else if (!range_ok(s->h, s->status, s->start, false)) {
		s->bad = true;
	}
}

static size_t stream_body(char *p, size_t size, size_t n, void *arg)
{
	struct stream *s = arg;
	size_t len = size * n, used;

	if (!s->checked)
		stream_check(s);
	if (s->bad) /* its readers go elsewhere when it ends */
		return 0;
	if (!s->head) { /* nobody waits: curl keeps these and pauses */
		s->paused = true;
		return CURL_WRITEFUNC_PAUSE;
	}
	used = stream_deliver(s, (const uint8_t *)p, len, s->pos);
	s->pos += len;
	atomic_fetch_add_explicit(&s->F->s->n_bytes, len,
				  memory_order_relaxed);
	if (used < len) { /* the rest waits for the next reader */
		s->spill = malloc(len - used);
		if (!s->spill)
			return 0;
		memcpy(s->spill, p + used, len - used);
		s->spill_len = len - used;
		s->paused = true;
		curl_easy_pause(s->h, CURLPAUSE_RECV);
	}
	return len;
}

static struct stream *stream_open(struct fetcher *F, struct store_obj *o,
				  uint64_t off)
{
	struct stream *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->kind = XFER_STREAM;
	s->F = F;
	s->obj = o;
	s->start = s->pos = off;
	s->h = store_easy(F->c, o->url);
	if (!s->h) {
		free(s);
		return NULL;
	}
	snprintf(s->range, sizeof(s->range), "%" PRIu64 "-%" PRIu64, off,
		 o->size - 1);
	curl_easy_setopt(s->h, CURLOPT_RANGE, s->range);
	/* a connection of its own: libcurl 7.88 pauses an HTTP/2 stream
	 * badly (readers of the same connection saw wrong bytes and EIO) */
	curl_easy_setopt(s->h, CURLOPT_HTTP_VERSION,
			 (long)CURL_HTTP_VERSION_1_1);
	curl_easy_setopt(s->h, CURLOPT_PIPEWAIT, 0L);
	curl_easy_setopt(s->h, CURLOPT_WRITEFUNCTION, stream_body);
	curl_easy_setopt(s->h, CURLOPT_WRITEDATA, s);
	curl_easy_setopt(s->h, CURLOPT_PRIVATE, s);
	if (curl_multi_add_handle(F->c->multi, s->h) != CURLM_OK) {
		store_easy_release(F->c, s->h);
		free(s);
		return NULL;
	}
	atomic_fetch_add_explicit(&F->s->n_requests, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&F->s->n_streams, 1, memory_order_relaxed);
	s->idle_since_ms = store_now_ms();
	o->stream = s;
	s->next = F->streams;
	F->streams = s;
	F->nstreams++;
	return s;
}

/*
 * r reads from s if its bytes are still to come and it starts at most
 * STREAM_SKIP_MAX past the reader before it (or where s has got to): it
 * goes in offset order among the readers (windows read by several workers
 * come in any order), overlapping none.
 */
static bool stream_take(struct stream *s, struct store_read *r)
{
	struct store_read **at = &s->head, *prev = NULL;
	uint64_t from = s->pos - s->spill_len; /* the next byte no one has */
	size_t used;

	if (s->bad || r->off < from || (!s->h && r->off + r->len > s->pos))
		return false;
	while (*at && (*at)->off < r->off) {
		prev = *at;
		at = &(*at)->next;
	}
	if (prev)
		from = prev->off + prev->len;
	if (r->off < from || r->off - from > STREAM_SKIP_MAX ||
	    (*at && r->off + r->len > (*at)->off))
		return false;
	r->got = 0;
	r->next = *at;
	*at = r;
	if (!r->next)
		s->tail = r;
	if (s->spill_len && s->head == r) {
		used = stream_deliver(s, s->spill, s->spill_len,
				      s->pos - s->spill_len);
		memmove(s->spill, s->spill + used, s->spill_len - used);
		s->spill_len -= used;
		if (!s->spill_len) {
			free(s->spill);
			s->spill = NULL;
		}
	}
	if (s->paused && s->head && !s->spill_len && s->h) {
		s->paused = false;
		curl_easy_pause(s->h, CURLPAUSE_CONT); /* may deliver now */
	}
	return true;
}

/*
 * The stream goes; its readers that are not done go on requests of their
 * own, from where each stopped: at once, or (failed: retry) after a
 * backoff; ESTALE if the object changed; cancelled ones are done.
 */
static void stream_free(struct fetcher *F, struct stream *s, bool retry)
{
	struct store_read *r;

	for (struct stream **p = &F->streams; *p; p = &(*p)->next)
		if (*p == s) {
			*p = s->next;
			break;
		}
	F->nstreams--;
	if (s->h) {
		curl_multi_remove_handle(F->c->multi, s->h);
		store_easy_release(F->c, s->h);
	}
	s->obj->stream = NULL;
	while ((r = s->head)) {
		s->head = r->next;
		r->next = NULL;
		if (atomic_load_explicit(&r->cancel, memory_order_relaxed)) {
			complete_cancelled(F, r);
		} else if (store_obj_changed(r->obj)) {
			set_err(r, CHANGED);
			complete(F, r, -ESTALE);
		} else if (retry) {
			atomic_fetch_add_explicit(&F->s->n_retries, 1,
						  memory_order_relaxed);
			r->attempts++;
			r->retry_at_ms = store_now_ms() +
					 store_backoff_ms(r->attempts);
			r->next = F->reads; /* fetcher_tend() sends it */
			F->reads = r;
		} else {
			read_send(F, r);
		}
	}
	free(s->spill);
	free(s);
}

/* Readers of s that were cancelled leave it (it reads through their
 * bytes); the stream stays for the others. */
static void stream_drop_cancelled(struct fetcher *F, struct stream *s)
{
	struct store_read **p = &s->head, *r;
	bool dropped = false;

	s->tail = NULL;
	while ((r = *p)) {
		if (atomic_load_explicit(&r->cancel, memory_order_relaxed)) {
			*p = r->next;
			r->next = NULL;
			complete_cancelled(F, r);
			dropped = true;
			continue;
		}
		s->tail = r;
		p = &r->next;
	}
	if (dropped && !s->head)
		s->idle_since_ms = store_now_ms();
}

static void stream_end(struct fetcher *F, struct stream *s, CURLcode cc)
{
	bool whole = cc == CURLE_OK && !s->bad && s->pos == s->obj->size;

	curl_multi_remove_handle(F->c->multi, s->h);
	store_easy_release(F->c, s->h);
	s->h = NULL;
	if (whole && s->spill_len)
		return; /* its last bytes wait for their reader */
	stream_free(F, s, !whole);
}

/* --- the loop --- */

/*
 * Whether a stream may open for o: its old one, if nobody reads it (the
 * reader jumped), and else the least recently idle of all, give way when
 * STREAMS_MAX are open.
 */
static bool stream_room(struct fetcher *F, struct store_obj *o)
{
	struct stream *s, *oldest = NULL;

	if (o->stream && o->stream->head)
		return false;
	if (o->stream)
		stream_free(F, o->stream, false);
	if (F->nstreams < STREAMS_MAX)
		return true;
	for (s = F->streams; s; s = s->next)
		if (!s->head && (!oldest ||
				 s->idle_since_ms < oldest->idle_since_ms))
			oldest = s;
	if (oldest)
		stream_free(F, oldest, false);
	return F->nstreams < STREAMS_MAX;
}

static void read_begin(struct fetcher *F, struct store_read *r)
{
	struct store_obj *o = r->obj;
	bool known = o->size != STORE_SIZE_UNKNOWN;
	bool seq = known && r->off == o->seq_end;

	if (r->forget) { /* the object is going: nothing may point to it */
		if (o->stream)
			stream_free(F, o->stream, false);
		complete(F, r, 0);
		return;
	}
	if (known)
		o->seq_end = r->off + r->len;
	if (atomic_load_explicit(&r->cancel, memory_order_relaxed)) {
		complete(F, r, -ECANCELED);
	} else if (store_obj_changed(o)) {
		set_err(r, CHANGED);
		complete(F, r, -ESTALE);
	} else if (!r->len) {
		complete(F, r, 0);
	} else if (o->stream && stream_take(o->stream, r)) {
		return;
	} else if (seq && stream_room(F, o) && stream_open(F, o, r->off) &&
		   stream_take(o->stream, r)) {
		return;
	} else {
		read_send(F, r);
	}
}

/* Cancelled reads, idle streams, retries due: the ms to the next due. */
static long fetcher_tend(struct fetcher *F)
{
	uint64_t now = store_now_ms(), next = now + 1000;
	struct store_read *r, *nx;
	struct stream *s, *sn;

	for (r = F->reads; r; r = nx) {
		nx = r->next;
		if (atomic_load_explicit(&r->cancel, memory_order_relaxed)) {
			list_del(&F->reads, r);
			complete_cancelled(F, r);
		} else if (r->retry_at_ms && r->retry_at_ms <= now) {
			if (attempt_send(F, r)) {
				list_del(&F->reads, r);
				complete(F, r, -ENOMEM);
			}
		} else if (r->retry_at_ms && r->retry_at_ms < next) {
			next = r->retry_at_ms;
		}
	}
	for (s = F->streams; s; s = sn) {
		sn = s->next;
		stream_drop_cancelled(F, s);
		if (!s->head && now - s->idle_since_ms >= STREAM_IDLE_MS)
			stream_free(F, s, false);
		else if (!s->head && s->idle_since_ms + STREAM_IDLE_MS < next)
			next = s->idle_since_ms + STREAM_IDLE_MS;
	}
	return (long)(next - now);
}

/* Everything still in flight, cancelled: the store is closing. */
static void fetcher_drain(struct fetcher *F)
{
	while (F->streams)
		stream_free(F, F->streams, false); /* readers to F->reads */
	while (F->reads) {
		struct store_read *r = F->reads;

		list_del(&F->reads, r);
		complete_cancelled(F, r);
	}
}

static void *fetcher_main(void *arg)
{
	struct fetcher *F = arg;

	for (;;) {
		struct store_read *r, *q;
		CURLMsg *m;
		bool stop;
		int left, running;
		long ms;

		pthread_mutex_lock(&F->lock);
		q = F->queue;
		F->queue = F->queue_tail = NULL;
		stop = F->stop;
		pthread_mutex_unlock(&F->lock);
		for (; q; q = r) {
			r = q->next;
			q->next = NULL;
			if (stop && !q->forget)
				complete(F, q, -ECANCELED);
			else /* a forget frees the object's stream now */
				read_begin(F, q);
		}
		if (stop)
			break;
		curl_multi_perform(F->c->multi, &running);
		while ((m = curl_multi_info_read(F->c->multi, &left))) {
			enum xfer_kind *k;

			if (m->msg != CURLMSG_DONE)
				continue;
			curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE,
					  (char **)&k);
			if (*k == XFER_READ)
				read_end(F, (struct xfer *)k, m->data.result);
			else
				stream_end(F, (struct stream *)k,
					   m->data.result);
		}
		ms = fetcher_tend(F);
		curl_multi_poll(F->c->multi, NULL, 0, (int)(ms > 0 ? ms : 0),
				NULL);
	}
	fetcher_drain(F);
	return NULL;
}

/* s's fetcher, started if need be; s->fetcher_lock is held. */
static struct fetcher *fetcher_get(struct store *s)
{
	struct fetcher *F = s->fetcher;

	if (F || !(F = calloc(1, sizeof(*F))))
		return F;
	F->s = s;
	pthread_mutex_init(&F->lock, NULL);
	F->c = store_client_new(s);
	if (!F->c || store_client_transfers(F->c) ||
	    pthread_create(&F->thread, NULL, fetcher_main, F)) {
		store_client_free(F->c);
		pthread_mutex_destroy(&F->lock);
		free(F);
		return NULL;
	}
	s->fetcher = F;
	return F;
}

void fetcher_stop(struct store *s)
{
	struct fetcher *F;

	pthread_mutex_lock(&s->fetcher_lock);
	F = s->fetcher;
	s->fetcher = NULL;
	pthread_mutex_unlock(&s->fetcher_lock);
	if (!F)
		return;
	pthread_mutex_lock(&F->lock);
	F->stop = true;
	pthread_mutex_unlock(&F->lock);
	curl_multi_wakeup(F->c->multi);
	pthread_join(F->thread, NULL);
	/* no read is queued once it is off s (the queueing holds the lock) */
	store_client_free(F->c);
	pthread_mutex_destroy(&F->lock);
	free(F);
}

void store_idle(struct store *s)
{
	fetcher_stop(s);
}

void store_cancel(struct store *s)
{
	pthread_mutex_lock(&s->fetcher_lock);
	s->cancelled = true;
	pthread_mutex_unlock(&s->fetcher_lock);
	fetcher_stop(s); /* its reads complete with -ECANCELED */
}

/* Queue r for F; s->fetcher_lock is held, so F cannot be stopping. */
static void fetcher_queue(struct fetcher *F, struct store_read *r)
{
	pthread_mutex_lock(&F->lock);
	if (F->queue_tail)
		F->queue_tail->next = r;
	else
		F->queue = r;
	F->queue_tail = r;
	pthread_mutex_unlock(&F->lock);
	curl_multi_wakeup(F->c->multi);
}

/*
 * The object is going: the fetcher lets go of it first (its stream).  No
 * fetcher: nothing of it is left (streams end with their fetcher).  The
 * fetcher lock is held while queueing so that it cannot stop meanwhile.
 */
void fetcher_forget(struct store_obj *o)
{
	struct store_read r = {.obj = o, .forget = true};
	struct fetcher *F;

	sem_init(&r.done, 0, 0);
	pthread_mutex_lock(&o->s->fetcher_lock);
	F = o->s->fetcher;
	if (F)
		fetcher_queue(F, &r);
	pthread_mutex_unlock(&o->s->fetcher_lock);
	if (F)
		store_read_wait(NULL, &r);
	else
		sem_destroy(&r.done);
}

void store_read_start(struct store_client *c, struct store_obj *o,
		      struct store_read *r)
{
	struct fetcher *F;
	bool cancelled;

	(void)c;
	sem_init(&r->done, 0, 0);
	r->forget = false;
	atomic_init(&r->cancel, false);
	r->obj = o;
	r->got = 0;
	r->attempts = 0;
	r->retry_at_ms = 0;
	r->handle = NULL;
	r->next = NULL;
	r->res = 0;
	r->err[0] = '\0';
	/* past the end: what there is (a probe may ask for more) */
	if (o->size != STORE_SIZE_UNKNOWN)
		r->len = r->off >= o->size ? 0
			 : r->len > o->size - r->off ? o->size - r->off
						     : r->len;
	pthread_mutex_lock(&o->s->fetcher_lock);
	cancelled = o->s->cancelled;
	F = cancelled ? NULL : fetcher_get(o->s);
	if (F)
		fetcher_queue(F, r);
	pthread_mutex_unlock(&o->s->fetcher_lock);
	if (cancelled) {
		set_err(r, "the mount is stopping");
		r->res = -ECANCELED;
		sem_post(&r->done);
	} else if (!F) {
		set_err(r, "out of memory");
		r->res = -ENOMEM;
		sem_post(&r->done);
	}
}

void store_read_stop(struct store_read *r)
{
	struct fetcher *F;

	atomic_store_explicit(&r->cancel, true, memory_order_relaxed);
	pthread_mutex_lock(&r->obj->s->fetcher_lock);
	F = r->obj->s->fetcher;
	if (F)
		curl_multi_wakeup(F->c->multi);
	pthread_mutex_unlock(&r->obj->s->fetcher_lock);
}

void store_read_cancel(struct store_read *r)
{
	int v;

	if (!(sem_getvalue(&r->done, &v) == 0 && v > 0))
		store_read_stop(r);
	store_read_wait(NULL, r);
}
