// SPDX-License-Identifier: MIT
/*
 * Reads of their own: a read no stream carries is one ranged GET of the
 * bytes it still misses (an opening read: the object's last bytes, from
 * which learn_object() learns its size, ETag and time).  It is final when
 * its body is whole: a 206 whose Content-Range starts where asked, with the
 * object's size and ETag (or a 200 of the whole object).  Otherwise: a
 * transient failure (a 5xx, 429 or 408, a reset, a timeout: no byte for
 * timeout_s, a short body) is sent again after a backoff that doubles from
 * 50 ms, asking only for the bytes still missing, up to `retries` times,
 * then EIO; a changed object (another size or ETag) is ESTALE at once; a
 * refusal (403), a missing object (404) or a body longer than asked is
 * final too.  The checks of a response (same_object(), range_ok()) are
 * here, for streams too.  Threads: as in fetch.c, the fetcher's alone.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

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

/* --- a response's checks --- */

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
bool same_object(CURL *h, const struct store_obj *o)
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

/*
 * Whether a 2xx response holds the bytes asked for, from start; a 200 (the
 * whole object) does only where whole_ok, asked from 0.
 */
bool range_ok(CURL *h, long status, uint64_t start, bool whole_ok)
{
	const char *cr = header(h, "Content-Range");
	uint64_t at;

	if (status == 200) /* the whole object: fine only from 0 */
		return start == 0 && whole_ok;
	if (status != 206 || !cr || sscanf(cr, "bytes %" SCNu64, &at) != 1)
		return false;
	return at == start;
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
int attempt_send(struct fetcher *F, struct store_read *r)
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
void read_send(struct fetcher *F, struct store_read *r)
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
void read_end(struct fetcher *F, struct xfer *x, CURLcode cc)
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

/* r is done, cancelled: its transfer (if it has one of its own) first. */
void complete_cancelled(struct fetcher *F, struct store_read *r)
{
	struct xfer *x = r->handle;

	if (x && x->h) {
		curl_multi_remove_handle(F->c->multi, x->h);
		store_easy_release(F->c, x->h);
		x->h = NULL;
	}
	complete(F, r, -ECANCELED);
}
