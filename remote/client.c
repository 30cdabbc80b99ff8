// SPDX-License-Identifier: MIT
/*
 * Ranged reads of a store's objects, one client per thread.
 *
 * A client is a curl multi handle: the reads a thread starts go out at
 * once, in parallel, over connections it keeps (HTTP/2 streams on one
 * connection where the server offers it), and store_read_wait() drives
 * them all until the one asked for is done; the others finish on the way
 * and are found done when their turn comes, as reads on an io_uring ring.
 *
 * A read is final when its body is whole: a 206 whose Content-Range starts
 * where asked and whose total is the object's size, with the object's ETag
 * (or a 200 of the whole object).  Otherwise: a transient failure (a 5xx,
 * 429 or 408, a reset, a timeout: no byte for timeout_s, a short body) is
 * sent again after a backoff that doubles from 50 ms, asking only for the
 * bytes still missing, up to `retries` times, then EIO; a changed object
 * (another size or ETag) is ESTALE at once; a refusal (403), a missing
 * object (404) or a body longer than asked is final too.
 *
 * Only store_read_wait() and store_pread() block, in curl_multi_poll().
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* An error body kept for its <Code>: the start of it */
#define ERR_BODY 512

/* A read's transfer in flight: the read's handle while it is sent. */
struct xfer {
	struct store_read *r;
	CURL *h;
	long status;     /* 0 until the headers are in */
	uint64_t want;   /* bytes this attempt asked for */
	uint64_t got0;   /* r->got when it was sent */
	char range[48];
	char body[ERR_BODY];
	size_t body_len;
};

struct store_client *store_client_new(struct store *s)
{
	struct store_client *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->s = s;
	c->multi = curl_multi_init();
	if (!c->multi) {
		free(c);
		return NULL;
	}
	curl_multi_setopt(c->multi, CURLMOPT_PIPELINING, CURLPIPE_MULTIPLEX);
	curl_multi_setopt(c->multi, CURLMOPT_MAX_HOST_CONNECTIONS, 16L);
	return c;
}

void store_client_free(struct store_client *c)
{
	if (!c)
		return;
	while (c->reads)
		store_read_cancel(c, c->reads);
	for (unsigned int i = 0; i < c->nidle; i++)
		curl_easy_cleanup(c->idle[i]);
	free(c->idle);
	curl_multi_cleanup(c->multi);
	free(c);
}

const char *store_client_error(const struct store_client *c)
{
	return c->err[0] ? c->err : "no error";
}

/* --- the list of reads in flight --- */

static void list_add(struct store_client *c, struct store_read *r)
{
	r->next = c->reads;
	c->reads = r;
}

static void list_del(struct store_client *c, struct store_read *r)
{
	for (struct store_read **p = &c->reads; *p; p = &(*p)->next)
		if (*p == r) {
			*p = r->next;
			break;
		}
	r->next = NULL;
}

/* --- one attempt --- */

/*
 * The body goes to dst while the status is 2xx; an error body is kept (its
 * start) for the reason it gives.  More than asked for stops the transfer.
 */
static size_t on_body(char *p, size_t size, size_t n, void *arg)
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
	if (r->got + len > r->len)
		return 0; /* more than asked: CURLE_WRITE_ERROR */
	memcpy(r->dst + r->got, p, len);
	r->got += len;
	return len;
}

/* Send r's missing bytes: 0, or -ENOMEM. */
static int attempt_send(struct store_client *c, struct store_read *r)
{
	struct xfer *x = r->handle;
	uint64_t from = r->off + r->got, to = r->off + r->len - 1;

	if (!x) {
		x = calloc(1, sizeof(*x));
		if (!x)
			return -ENOMEM;
		x->r = r;
		r->handle = x;
	}
	x->h = store_easy(c, r->obj->url);
	if (!x->h)
		return -ENOMEM;
	x->status = 0;
	x->body_len = 0;
	if (r->obj->size == STORE_SIZE_UNKNOWN) { /* opening: its tail */
		r->got = 0;
		snprintf(x->range, sizeof(x->range), "-%" PRIu64, r->len);
	} else {
		snprintf(x->range, sizeof(x->range), "%" PRIu64 "-%" PRIu64,
			 from, to);
	}
	x->want = r->len - r->got;
	x->got0 = r->got;
	curl_easy_setopt(x->h, CURLOPT_RANGE, x->range);
	curl_easy_setopt(x->h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(x->h, CURLOPT_WRITEDATA, x);
	curl_easy_setopt(x->h, CURLOPT_PRIVATE, x);
	r->attempts++;
	r->retry_at_ms = 0;
	atomic_fetch_add_explicit(&c->s->n_requests, 1, memory_order_relaxed);
	if (curl_multi_add_handle(c->multi, x->h) != CURLM_OK) {
		store_easy_release(c, x->h);
		x->h = NULL;
		return -ENOMEM;
	}
	return 0;
}

static void read_done(struct store_client *c, struct store_read *r, int res)
{
	list_del(c, r);
	free(r->handle);
	r->handle = NULL;
	r->res = res;
	r->done = true;
	if (res < 0 && res != -ECANCELED)
		atomic_fetch_add_explicit(&c->s->n_failures, 1,
					  memory_order_relaxed);
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
 * Whether the response is of the object as it was opened: the same ETag
 * (when it has one) and the same size.
 */
static bool same_object(struct xfer *x, const struct store_obj *o)
{
	const char *etag = header(x->h, "ETag");
	const char *cr = header(x->h, "Content-Range");
	const char *slash = cr ? strrchr(cr, '/') : NULL;

	if (o->etag[0] && etag && strcmp(etag, o->etag))
		return false;
	if (slash && slash[1] != '*' &&
	    strtoull(slash + 1, NULL, 10) != o->size)
		return false;
	return true;
}

/* Whether the 2xx response holds the bytes asked for, from where asked. */
static bool range_ok(struct xfer *x, const struct store_read *r)
{
	const char *cr = header(x->h, "Content-Range");
	uint64_t start;

	if (x->status == 200) /* the whole object: fine only from 0 */
		return x->got0 == 0 && r->off == 0;
	if (x->status != 206 || !cr ||
	    sscanf(cr, "bytes %" SCNu64, &start) != 1)
		return false;
	return start == r->off + x->got0;
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

/* What became of an attempt: done (final), or queued to be sent again. */
static void attempt_end(struct store_client *c, struct xfer *x, CURLcode cc)
{
	struct store_read *r = x->r;
	struct store *s = c->s;
	char code[64];
	int err = 0;

	curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &x->status);
	curl_multi_remove_handle(c->multi, x->h);
	atomic_fetch_add_explicit(&s->n_bytes, r->got - x->got0,
				  memory_order_relaxed);
	if (r->obj->size == STORE_SIZE_UNKNOWN &&
	    (cc == CURLE_OK || cc == CURLE_WRITE_ERROR) &&
	    ((x->status >= 200 && x->status <= 299) || x->status == 416)) {
		err = cc == CURLE_OK ? learn_object(x, r) : -EIO;
		if (err)
			store_set_error(c, "the server does not answer "
					   "range requests (HTTP %ld)",
					x->status);
		store_easy_release(c, x->h);
		x->h = NULL;
		read_done(c, r, err ? err : (int)r->got);
		return;
	}
	if (r->obj->size != STORE_SIZE_UNKNOWN && x->status >= 200 &&
	    x->status <= 299 && !same_object(x, r->obj)) {
		atomic_store_explicit(&r->obj->changed, true,
				      memory_order_relaxed);
		atomic_fetch_add_explicit(&s->n_changed, 1,
					  memory_order_relaxed);
		store_set_error(c, "changed in the store since it was opened");
		err = -ESTALE;
	} else if (cc == CURLE_OK && x->status >= 200 && x->status <= 299) {
		if (!range_ok(x, r)) {
			store_set_error(c, "the server did not answer the "
					   "range asked for (HTTP %ld)",
					x->status);
			err = -EIO;
		} else if (r->got == r->len) {
			store_easy_release(c, x->h);
			x->h = NULL;
			read_done(c, r, (int)r->len);
			return;
		} else {
			cc = CURLE_PARTIAL_FILE; /* short: send the rest */
		}
	} else if (cc == CURLE_OK) {
		store_error_code(x->body, x->body_len, code, sizeof(code));
		store_set_error(c, "HTTP %ld%s%s", x->status,
				code[0] ? " " : "", code);
	} else {
		store_set_error(c, "%s", curl_easy_strerror(cc));
	}
	store_easy_release(c, x->h);
	x->h = NULL;
	if (!err && store_transient(cc, x->status) &&
	    r->attempts <= s->retries) {
		atomic_fetch_add_explicit(&s->n_retries, 1,
					  memory_order_relaxed);
		r->retry_at_ms = store_now_ms() + store_backoff_ms(r->attempts);
		return;
	}
	if (!err)
		err = cc == CURLE_OK ? store_status_errno(x->status) : -EIO;
	read_done(c, r, err);
}

/* --- driving the client --- */

/* Take what finished; send again what is due: the ms to the next retry. */
static long client_step(struct store_client *c)
{
	uint64_t now = store_now_ms(), next = UINT64_MAX;
	struct store_read *r, *nx;
	CURLMsg *m;
	int left, running;

	curl_multi_perform(c->multi, &running);
	while ((m = curl_multi_info_read(c->multi, &left))) {
		struct xfer *x;

		if (m->msg != CURLMSG_DONE)
			continue;
		curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE,
				  (char **)&x);
		attempt_end(c, x, m->data.result);
	}
	for (r = c->reads; r; r = nx) {
		nx = r->next;
		if (!r->retry_at_ms)
			continue;
		if (r->retry_at_ms <= now) {
			if (attempt_send(c, r))
				read_done(c, r, -ENOMEM);
		} else if (r->retry_at_ms < next) {
			next = r->retry_at_ms;
		}
	}
	return next == UINT64_MAX ? 1000 : (long)(next - now);
}

void store_read_start(struct store_client *c, struct store_obj *o,
		      struct store_read *r)
{
	r->obj = o;
	r->got = 0;
	r->attempts = 0;
	r->retry_at_ms = 0;
	r->handle = NULL;
	r->done = false;
	r->res = 0;
	/* past the end: what there is (a probe may ask for more) */
	if (o->size != STORE_SIZE_UNKNOWN)
		r->len = r->off >= o->size ? 0
			 : r->len > o->size - r->off ? o->size - r->off
						     : r->len;
	if (r->len == 0) {
		r->done = true;
		return;
	}
	list_add(c, r);
	if (atomic_load_explicit(&o->changed, memory_order_relaxed)) {
		read_done(c, r, -ESTALE);
		return;
	}
	if (attempt_send(c, r))
		read_done(c, r, -ENOMEM);
}

int store_read_wait(struct store_client *c, struct store_read *r)
{
	while (!r->done) {
		long ms = client_step(c);

		if (r->done)
			break;
		curl_multi_poll(c->multi, NULL, 0, (int)(ms < 1000 ? ms : 1000),
				NULL);
	}
	return r->res;
}

void store_read_cancel(struct store_client *c, struct store_read *r)
{
	struct xfer *x = r->handle;

	if (r->done)
		return;
	if (x && x->h) {
		curl_multi_remove_handle(c->multi, x->h);
		store_easy_release(c, x->h);
	}
	read_done(c, r, -ECANCELED);
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
