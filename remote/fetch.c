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
 * A read of its own is final when its body is whole: a 206 whose
 * Content-Range starts where asked, with the object's size and ETag (or a
 * 200 of the whole object).  Otherwise: a transient failure (a 5xx, 429 or
 * 408, a reset, a timeout: no byte for timeout_s, a short body) is sent
 * again after a backoff that doubles from 50 ms, asking only for the bytes
 * still missing, up to `retries` times, then EIO; a changed object
 * (another size or ETag) is ESTALE at once; a refusal (403), a missing
 * object (404) or a body longer than asked is final too.
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

/* An error body kept for its <Code>: the start of it */
#define ERR_BODY 512
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

enum xfer_kind { XFER_READ, XFER_STREAM };

struct fetcher {
	struct store *s;
	struct store_client *c; /* its multi and easy handles */
	pthread_t thread;
	pthread_mutex_t lock;
	struct store_read *queue, *queue_tail; /* started, not taken: lock */
	bool stop;                             /* under lock */
	struct store_read *reads; /* sent alone, or waiting to be sent again */
	struct stream *streams;
	unsigned int nstreams;
};

/* The transfer of a read of its own. */
struct xfer {
	enum xfer_kind kind;
	struct store_read *r;
	CURL *h;
	long status; /* 0 until the headers are in */
	uint64_t got0; /* r->got when it was sent */
	/* the first body byte's verdict: not the bytes asked for (refused,
	 * never copied), of a changed object, or more than asked for */
	bool checked, refused, changed, too_long;
	char range[48];
	char body[ERR_BODY];
	size_t body_len;
};

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

#define CHANGED "changed in the store since it was opened"

static void set_err(struct store_read *r, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void set_err(struct store_read *r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(r->err, sizeof(r->err), fmt, ap);
	va_end(ap);
}

/* r is done: after this the waiter owns it (and may free it at once). */
static void complete(struct fetcher *F, struct store_read *r, int res)
{
	free(r->handle);
	r->handle = NULL;
	r->res = res;
	if (res < 0 && res != -ECANCELED)
		atomic_fetch_add_explicit(&F->s->n_failures, 1,
					  memory_order_relaxed);
	sem_post(&r->done);
}

static void list_del(struct store_read **list, struct store_read *r)
{
	for (struct store_read **p = list; *p; p = &(*p)->next)
		if (*p == r) {
			*p = r->next;
			break;
		}
	r->next = NULL;
}

/* A header's value as sent, or NULL. */
static const char *header(CURL *h, const char *name)
{
	struct curl_header *hd;

	if (curl_easy_header(h, name, 0, CURLH_HEADER, -1, &hd) != CURLHE_OK)
		return NULL;
	return hd->value;
}

/*
 * Whether a response is of the object as it was opened: the same ETag
 * (when it has one) and the same size.
 */
static bool same_object(CURL *h, const struct store_obj *o)
{
	const char *etag = header(h, "ETag");
	const char *cr = header(h, "Content-Range");
	const char *slash = cr ? strrchr(cr, '/') : NULL;

	if (o->etag[0] && etag && strcmp(etag, o->etag))
		return false;
	if (slash && slash[1] != '*' &&
	    strtoull(slash + 1, NULL, 10) != o->size)
		return false;
	return true;
}

/* Whether a 2xx response holds the bytes asked for, from start. */
static bool range_ok(CURL *h, long status, uint64_t start, uint64_t whole)
{
	const char *cr = header(h, "Content-Range");
	uint64_t at;

	if (status == 200) /* the whole object: fine only from 0 */
		return start == 0 && whole;
	if (status != 206 || !cr || sscanf(cr, "bytes %" SCNu64, &at) != 1)
		return false;
	return at == start;
}

static void mark_changed(struct fetcher *F, struct store_obj *o)
{
	atomic_store_explicit(&o->changed, true, memory_order_relaxed);
	atomic_fetch_add_explicit(&F->s->n_changed, 1, memory_order_relaxed);
}

/* --- reads of their own --- */

/*
 * A 2xx response, looked at before its first byte is kept: a 206 from
 * where this attempt asked, or a 200 (the whole object) when it asked
 * from 0, of the object as it was opened.  (An opening read knows no
 * object yet: learn_object() looks at it at the end.)
 */
static void read_check(struct xfer *x)
{
	struct store_read *r = x->r;

	x->checked = true;
	if (r->obj->size == STORE_SIZE_UNKNOWN)
		return;
	if (!same_object(x->h, r->obj))
		x->changed = true;
	else if (!range_ok(x->h, x->status, r->off + x->got0, true))
		x->refused = true;
}

/*
 * The body goes to dst while the status is 2xx; an error body is kept (its
 * start) for the reason it gives.  More than asked for stops the transfer.
 */
static size_t read_body(char *p, size_t size, size_t n, void *arg)
{
	struct xfer *x = arg;
	struct store_read *r = x->r;
	size_t len = size * n;

	if (!x->status)
		curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &x->status);
	if (x->status < 200 || x->status > 299) {
		size_t room = sizeof(x->body) - x->body_len;
		size_t k = len < room ? len : room;

		memcpy(x->body + x->body_len, p, k);
		x->body_len += k;
		return len;
	}
	if (!x->checked) /* before a byte lands in dst */
		read_check(x);
	if (x->refused || x->changed)
		return 0; /* CURLE_WRITE_ERROR; read_outcome() says why */
	if (r->got + len > r->len) {
		x->too_long = true;
		return 0;
	}
	memcpy(r->dst + r->got, p, len);
	r->got += len;
	return len;
}

/* Send r's missing bytes: 0, or -ENOMEM. */
static int attempt_send(struct fetcher *F, struct store_read *r)
{
	struct xfer *x = r->handle;

	if (!x) {
		x = calloc(1, sizeof(*x));
		if (!x)
			return -ENOMEM;
		x->kind = XFER_READ;
		x->r = r;
		r->handle = x;
	}
	x->h = store_easy(F->c, r->obj->url);
	if (!x->h)
		return -ENOMEM;
	x->status = 0;
	x->body_len = 0;
	x->checked = x->refused = x->changed = x->too_long = false;
	if (r->obj->size == STORE_SIZE_UNKNOWN) { /* opening: its tail */
		r->got = 0;
		snprintf(x->range, sizeof(x->range), "-%" PRIu64, r->len);
	} else {
		snprintf(x->range, sizeof(x->range), "%" PRIu64 "-%" PRIu64,
			 r->off + r->got, r->off + r->len - 1);
	}
	x->got0 = r->got;
	curl_easy_setopt(x->h, CURLOPT_RANGE, x->range);
	curl_easy_setopt(x->h, CURLOPT_WRITEFUNCTION, read_body);
	curl_easy_setopt(x->h, CURLOPT_WRITEDATA, x);
	curl_easy_setopt(x->h, CURLOPT_PRIVATE, x);
	r->attempts++;
	r->retry_at_ms = 0;
	atomic_fetch_add_explicit(&F->s->n_requests, 1, memory_order_relaxed);
	if (curl_multi_add_handle(F->c->multi, x->h) != CURLM_OK) {
		store_easy_release(F->c, x->h);
		x->h = NULL;
		return -ENOMEM;
	}
	return 0;
}

/* r goes out on a request of its own (again, from where it stopped). */
static void read_send(struct fetcher *F, struct store_read *r)
{
	r->next = F->reads;
	F->reads = r;
	if (attempt_send(F, r)) {
		list_del(&F->reads, r);
		set_err(r, "out of memory");
		complete(F, r, -ENOMEM);
	}
}

/*
 * An object's first response (a GET of its last bytes): its size, ETag
 * and time, and where the bytes got are in it.  0, or -EIO.
 */
static int learn_object(struct xfer *x, struct store_read *r)
{
	struct store_obj *o = r->obj;
	const char *cr = header(x->h, "Content-Range");
	const char *etag = header(x->h, "ETag");
	uint64_t a, b, total;
	curl_off_t t = -1;

	if (x->status == 206 && cr &&
	    sscanf(cr, "bytes %" SCNu64 "-%" SCNu64 "/%" SCNu64, &a, &b,
		   &total) == 3 &&
	    a <= b && b < total && b - a + 1 == r->got) {
		o->tail_off = a;
	} else if (x->status == 200) { /* all of it: shorter than asked */
		total = r->got;
		o->tail_off = 0;
	} else if (x->status == 416 && cr && !strcmp(cr, "bytes */0")) {
		total = 0;
		o->tail_off = 0;
	} else {
		return -EIO;
	}
	o->size = total;
	o->tail_len = (size_t)r->got;
	snprintf(o->etag, sizeof(o->etag), "%s",
		 etag && strlen(etag) < sizeof(o->etag) ? etag : "");
	curl_easy_getinfo(x->h, CURLINFO_FILETIME_T, &t);
	o->mtime = t > 0 ? (time_t)t : 0;
	return 0;
}

/*
 * An opening read's end: whether it is one, and then *res: the bytes got
 * (the object learnt), or why not.
 */
static bool open_end(struct xfer *x, CURLcode cc, int *res)
{
	struct store_read *r = x->r;

	if (r->obj->size != STORE_SIZE_UNKNOWN ||
	    (cc != CURLE_OK && cc != CURLE_WRITE_ERROR) ||
	    !((x->status >= 200 && x->status <= 299) || x->status == 416))
		return false;
	*res = cc == CURLE_OK ? learn_object(x, r) : -EIO;
	if (*res)
		set_err(r, "the server does not answer range requests "
			   "(HTTP %ld)", x->status);
	else
		*res = (int)r->got;
	return true;
}

/*
 * What an attempt's response says: 1 the read is whole, 0 send it again
 * if the failure is transient (cc says which), or -errno.
 */
static int read_outcome(struct xfer *x, CURLcode *cc)
{
	struct store_read *r = x->r;
	char code[64];

	if (x->changed) {
		set_err(r, CHANGED);
		return -ESTALE;
	}
	if (x->refused || x->too_long) {
		set_err(r, "the server did not answer the range asked for "
			   "(HTTP %ld%s): does it ignore Range?",
			x->status, x->too_long ? ", a longer body" : "");
		return -EIO;
	}
	if (*cc == CURLE_OK && x->status >= 200 && x->status <= 299) {
		if (r->got == r->len)
			return 1;
		*cc = CURLE_PARTIAL_FILE; /* short: send the rest */
		set_err(r, "a body shorter than asked for");
	} else if (*cc == CURLE_OK) {
		store_error_code(x->body, x->body_len, code, sizeof(code));
		set_err(r, "HTTP %ld%s%s", x->status, code[0] ? " " : "", code);
	} else {
		set_err(r, "%s", curl_easy_strerror(*cc));
	}
	return 0;
}

/* What became of an attempt: done (final), or sent again later. */
static void read_end(struct fetcher *F, struct xfer *x, CURLcode cc)
{
	struct store_read *r = x->r;
	struct store *s = F->s;
	bool final = true;
	int res;

	curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &x->status);
	curl_multi_remove_handle(F->c->multi, x->h);
	atomic_fetch_add_explicit(&s->n_bytes, r->got - x->got0,
				  memory_order_relaxed);
	if (!open_end(x, cc, &res)) {
		res = read_outcome(x, &cc);
		final = res != 0;
		if (res == -ESTALE)
			mark_changed(F, r->obj);
		else if (res == 1)
			res = (int)r->len;
	}
	/* the handle goes before the read is done: done frees x */
	store_easy_release(F->c, x->h);
	x->h = NULL;
	if (!final && store_transient(cc, x->status) &&
	    r->attempts <= s->retries) {
		atomic_fetch_add_explicit(&s->n_retries, 1,
					  memory_order_relaxed);
		r->retry_at_ms = store_now_ms() + store_backoff_ms(r->attempts);
		return;
	}
	if (!final)
		res = cc == CURLE_OK ? store_status_errno(x->status) : -EIO;
	list_del(&F->reads, r);
	complete(F, r, res);
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

/* r is done, cancelled: its transfer (if it has one of its own) first. */
static void complete_cancelled(struct fetcher *F, struct store_read *r)
{
	struct xfer *x = r->handle;

	if (x && x->h) {
		curl_multi_remove_handle(F->c->multi, x->h);
		store_easy_release(F->c, x->h);
		x->h = NULL;
	}
	complete(F, r, -ECANCELED);
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
	F = fetcher_get(o->s);
	if (F)
		fetcher_queue(F, r);
	pthread_mutex_unlock(&o->s->fetcher_lock);
	if (!F) {
		set_err(r, "out of memory");
		r->res = -ENOMEM;
		sem_post(&r->done);
	}
}

void store_read_cancel(struct store_read *r)
{
	struct fetcher *F;
	int v;

	if (sem_getvalue(&r->done, &v) == 0 && v > 0) {
		store_read_wait(NULL, r);
		return;
	}
	atomic_store_explicit(&r->cancel, true, memory_order_relaxed);
	pthread_mutex_lock(&r->obj->s->fetcher_lock);
	F = r->obj->s->fetcher;
	if (F)
		curl_multi_wakeup(F->c->multi);
	pthread_mutex_unlock(&r->obj->s->fetcher_lock);
	store_read_wait(NULL, r);
}
