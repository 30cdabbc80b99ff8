// SPDX-License-Identifier: MIT
/*
 * Writing a dataset to a store (mkzfolio SRC s3://BUCKET/PREFIX).
 *
 * An object up to STORE_MULTIPART_ABOVE goes as one PUT.  A bigger one, in
 * S3, goes as a multipart upload: CreateMultipartUpload (POST ?uploads=),
 * parts of STORE_PART_SIZE sent PARALLEL_PARTS at a time (PUT
 * ?partNumber=N&uploadId=ID, each answered with its ETag), then
 * CompleteMultipartUpload (POST ?uploadId=ID with the parts' list); an
 * upload that fails is aborted (DELETE ?uploadId=ID) so that no parts are
 * left behind.  A plain HTTP store takes one PUT per object (a WebDAV
 * server, nginx's dav_methods PUT).  Every request is retried as reads
 * are (client.c), bodies read again from the file at their offset.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#define PARALLEL_PARTS 4

/* One request of an upload, with its body (a file range or a buffer). */
struct op {
	const char *method;
	char *url;
	int fd;            /* body from fd at off (len bytes), if >= 0 */
	uint64_t off, len, sent;
	const char *buf;   /* else from buf */
	const char *range; /* a GET's bytes ("0-0"), or NULL: all */
	char code[64];     /* S3's error code of a failed answer, or "" */
	char *resp;        /* the response body (bounded) */
	size_t resp_len;
	char etag[128];
	long status;
	unsigned int attempts;
	uint64_t retry_at_ms;
	CURL *h;
	int res; /* 1 while in flight, then 0 or -errno */
};

#define RESP_MAX 65536

static size_t op_read(char *p, size_t size, size_t n, void *arg)
{
	struct op *o = arg;
	size_t want = size * n;
	ssize_t k;

	if (want > o->len - o->sent)
		want = (size_t)(o->len - o->sent);
	if (!want)
		return 0;
	if (o->fd < 0) {
		memcpy(p, o->buf + o->sent, want);
		k = (ssize_t)want;
	} else {
		k = pread(o->fd, p, want, (off_t)(o->off + o->sent));
		if (k <= 0)
			return CURL_READFUNC_ABORT;
	}
	o->sent += (uint64_t)k;
	return (size_t)k;
}

static size_t op_body(char *p, size_t size, size_t n, void *arg)
{
	struct op *o = arg;
	size_t len = size * n, room = RESP_MAX - o->resp_len;
	char *nr;

	if (len > room)
		len = room;
	nr = realloc(o->resp, o->resp_len + len + 1);
	if (!nr)
		return 0;
	o->resp = nr;
	memcpy(o->resp + o->resp_len, p, len);
	o->resp_len += len;
	o->resp[o->resp_len] = '\0';
	return size * n;
}

static int op_send(struct store_client *c, struct op *o)
{
	o->h = store_easy(c, o->url);
	if (!o->h)
		return -ENOMEM;
	o->sent = 0;
	free(o->resp); /* an answer is this attempt's alone */
	o->resp = NULL;
	o->resp_len = 0;
	o->status = 0;
	o->etag[0] = '\0';
	if (!strcmp(o->method, "PUT")) {
		curl_easy_setopt(o->h, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(o->h, CURLOPT_INFILESIZE_LARGE,
				 (curl_off_t)o->len);
	} else if (!strcmp(o->method, "POST")) {
		curl_easy_setopt(o->h, CURLOPT_POST, 1L);
		curl_easy_setopt(o->h, CURLOPT_POSTFIELDSIZE_LARGE,
				 (curl_off_t)o->len);
	} else {
		curl_easy_setopt(o->h, CURLOPT_CUSTOMREQUEST, o->method);
		if (!strcmp(o->method, "HEAD"))
			curl_easy_setopt(o->h, CURLOPT_NOBODY, 1L);
		if (o->range)
			curl_easy_setopt(o->h, CURLOPT_RANGE, o->range);
	}
	if (o->len || strcmp(o->method, "HEAD")) {
		curl_easy_setopt(o->h, CURLOPT_READFUNCTION, op_read);
		curl_easy_setopt(o->h, CURLOPT_READDATA, o);
	}
	curl_easy_setopt(o->h, CURLOPT_WRITEFUNCTION, op_body);
	curl_easy_setopt(o->h, CURLOPT_WRITEDATA, o);
	curl_easy_setopt(o->h, CURLOPT_PRIVATE, o);
	o->attempts++;
	o->retry_at_ms = 0;
	o->res = 1;
	atomic_fetch_add_explicit(&c->s->n_requests, 1, memory_order_relaxed);
	return curl_multi_add_handle(c->multi, o->h) == CURLM_OK ? 0
								  : -ENOMEM;
}

static void op_end(struct store_client *c, struct op *o, CURLcode cc)
{
	struct curl_header *hd;
	char code[64] = "";

	curl_easy_getinfo(o->h, CURLINFO_RESPONSE_CODE, &o->status);
	if (curl_easy_header(o->h, "ETag", 0, CURLH_HEADER, -1, &hd) ==
		    CURLHE_OK &&
	    strlen(hd->value) < sizeof(o->etag))
		strcpy(o->etag, hd->value);
	curl_multi_remove_handle(c->multi, o->h);
	store_easy_release(c, o->h);
	o->h = NULL;
	/* S3 may answer a completion 200 with an error in the body, and
	 * then it is worth sending again; an error status is what it says */
	bool ok = cc == CURLE_OK && o->status >= 200 && o->status <= 299;
	bool error_body = ok && o->resp && strstr(o->resp, "<Error>");

	if (ok && !error_body) {
		o->res = 0;
		return;
	}
	if (o->resp)
		store_error_code(o->resp, o->resp_len, code, sizeof(code));
	memcpy(o->code, code, sizeof(o->code));
	if (cc != CURLE_OK)
		store_set_error(c, "%s %s: %s", o->method, o->url,
				curl_easy_strerror(cc));
	else
		store_set_error(c, "%s %s: HTTP %ld%s%s", o->method, o->url,
				o->status, code[0] ? " " : "", code);
	if ((store_transient(cc, o->status) || error_body) &&
	    o->attempts <= c->s->retries) {
		atomic_fetch_add_explicit(&c->s->n_retries, 1,
					  memory_order_relaxed);
		o->retry_at_ms = store_now_ms() + store_backoff_ms(o->attempts);
		return;
	}
	o->res = cc == CURLE_OK && !error_body ? store_status_errno(o->status)
					       : -EIO;
}

/* Run ops[0..n) to the end, at most PARALLEL_PARTS at once: 0 or the
 * first error. */
static int ops_run(struct store_client *c, struct op *ops, size_t n)
{
	size_t next = 0, live = 0;
	int err = store_client_transfers(c);

	if (err) {
		store_set_error(c, "out of memory");
		return err;
	}
	for (size_t i = 0; i < n; i++)
		ops[i].res = 2; /* not sent yet */
	while (!err && (next < n || live)) {
		uint64_t now = store_now_ms();
		long wait = 1000;
		CURLMsg *m;
		int left, running;

		while (next < n && live < PARALLEL_PARTS) {
			if ((err = op_send(c, &ops[next++])))
				break;
			live++;
		}
		curl_multi_perform(c->multi, &running);
		while ((m = curl_multi_info_read(c->multi, &left))) {
			struct op *o;

			if (m->msg != CURLMSG_DONE)
				continue;
			curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE,
					  (char **)&o);
			op_end(c, o, m->data.result);
			if (o->res <= 0 && !o->retry_at_ms) {
				live--;
				if (o->res < 0 && !err)
					err = o->res;
			}
		}
		for (size_t i = 0; i < next && !err; i++) {
			struct op *o = &ops[i];

			if (!o->retry_at_ms)
				continue;
			if (o->retry_at_ms <= now)
				err = op_send(c, o);
			else if ((long)(o->retry_at_ms - now) < wait)
				wait = (long)(o->retry_at_ms - now);
		}
		if (!err && live)
			curl_multi_poll(c->multi, NULL, 0, (int)wait, NULL);
	}
	for (size_t i = 0; i < next; i++) /* stop what still runs */
		if (ops[i].h) {
			curl_multi_remove_handle(c->multi, ops[i].h);
			store_easy_release(c, ops[i].h);
			ops[i].h = NULL;
		}
	return err;
}

static void op_free(struct op *o)
{
	free(o->url);
	free(o->resp);
}

/* One request on object name, to its end: 0 or -errno. */
static int op_once(struct store_client *c, struct op o, const char *name)
{
	int r;

	o.url = store_url(c->s, name, NULL);
	if (!o.url)
		return -ENOMEM;
	r = ops_run(c, &o, 1);
	op_free(&o);
	return r;
}

/* The text between <tag> and </tag> in xml, malloc'd, or NULL. */
static char *xml_value(const char *xml, const char *tag)
{
	char open[64], close[64];
	const char *a, *b;

	snprintf(open, sizeof(open), "<%s>", tag);
	snprintf(close, sizeof(close), "</%s>", tag);
	a = xml ? strstr(xml, open) : NULL;
	b = a ? strstr(a, close) : NULL;
	return b ? strndup(a + strlen(open), (size_t)(b - a - strlen(open)))
		 : NULL;
}

/* A query value, percent-encoded as Signature V4 wants it. */
static char *query_escape(const char *v)
{
	char *out = malloc(3 * strlen(v) + 1), *p = out;

	if (!out)
		return NULL;
	for (const unsigned char *s = (const unsigned char *)v; *s; s++)
		p += isalnum(*s) || strchr("-._~", *s)
			     ? sprintf(p, "%c", *s)
			     : sprintf(p, "%%%02X", *s);
	*p = '\0';
	return out;
}

static char *complete_body(struct op *parts, size_t n)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&buf, &len);

	if (!m)
		return NULL;
	fputs("<CompleteMultipartUpload>", m);
	for (size_t i = 0; i < n; i++)
		fprintf(m, "<Part><PartNumber>%zu</PartNumber><ETag>%s</ETag>"
			   "</Part>", i + 1, parts[i].etag);
	fputs("</CompleteMultipartUpload>", m);
	if (fclose(m)) {
		free(buf);
		return NULL;
	}
	return buf;
}

/* S3's most parts in one upload */
#define MAX_PARTS 10000

static int put_multipart(struct store_client *c, const char *name, int fd,
			 uint64_t size)
{
	uint64_t part = STORE_PART_SIZE;
	size_t nparts;
	struct op create = {.method = "POST", .fd = -1, .buf = ""};
	struct op done = {.method = "POST", .fd = -1};
	struct op abort_op = {.method = "DELETE", .fd = -1, .buf = ""};
	struct op *parts;
	char *id = NULL, *qid = NULL, q[512];
	int r = -ENOMEM;

	while ((size + part - 1) / part > MAX_PARTS)
		part *= 2;
	nparts = (size_t)((size + part - 1) / part);
	parts = calloc(nparts, sizeof(*parts));
	create.url = store_url(c->s, name, "uploads=");
	if (!parts || !create.url)
		goto out;
	r = ops_run(c, &create, 1);
	if (r)
		goto out;
	id = xml_value(create.resp, "UploadId");
	qid = id ? query_escape(id) : NULL;
	if (!qid) {
		store_set_error(c, "%s: no UploadId in the store's answer",
				name);
		r = -EIO;
		goto out;
	}
	for (size_t i = 0; i < nparts; i++) {
		parts[i].method = "PUT";
		parts[i].fd = fd;
		parts[i].off = i * part;
		parts[i].len = size - parts[i].off < part ? size - parts[i].off
							  : part;
		snprintf(q, sizeof(q), "partNumber=%zu&uploadId=%s", i + 1,
			 qid);
		if (!(parts[i].url = store_url(c->s, name, q)))
			goto abort;
	}
	r = ops_run(c, parts, nparts);
	if (r)
		goto abort;
	snprintf(q, sizeof(q), "uploadId=%s", qid);
	done.url = store_url(c->s, name, q);
	done.buf = complete_body(parts, nparts);
	r = done.url && done.buf ? 0 : -ENOMEM;
	if (!r) {
		done.len = strlen(done.buf);
		r = ops_run(c, &done, 1);
	}
	if (!r)
		goto out;
abort:
	if (r == 0)
		r = -ENOMEM;
	snprintf(q, sizeof(q), "uploadId=%s", qid);
	abort_op.url = store_url(c->s, name, q);
	if (abort_op.url) {
		char keep[STORE_ERR_LEN];

		memcpy(keep, c->err, sizeof(keep)); /* the first reason */
		ops_run(c, &abort_op, 1);
		memcpy(c->err, keep, sizeof(keep));
	}
out:
	for (size_t i = 0; parts && i < nparts; i++)
		op_free(&parts[i]);
	free(parts);
	op_free(&create);
	op_free(&done);
	free((char *)done.buf);
	op_free(&abort_op);
	free(id);
	free(qid);
	return r;
}

int store_put_file(struct store_client *c, const char *name, int fd,
		   uint64_t size)
{
	if (c->s->s3 && size > STORE_MULTIPART_ABOVE)
		return put_multipart(c, name, fd, size);
	return op_once(c, (struct op){.method = "PUT", .fd = fd, .len = size},
		       name);
}

int store_exists(struct store_client *c, const char *name)
{
	int r = op_once(c, (struct op){.method = "HEAD", .fd = -1, .buf = ""},
			name);

	/* a HEAD's answer has no body, to tell a bucket that is not there
	 * from an object that is not: a GET's has (S3's error code); of its
	 * first byte, should the object be there by now */
	if (r == -ENOENT && c->s->s3) {
		struct op o = {.method = "GET", .fd = -1, .buf = "",
			       .range = "0-0"};
		bool no_bucket;

		if (!(o.url = store_url(c->s, name, NULL)))
			return -ENOMEM;
		r = ops_run(c, &o, 1);
		no_bucket = r == -ENOENT && !strcmp(o.code, "NoSuchBucket");
		op_free(&o);
		if (no_bucket)
			return -ENXIO;
	}
	return r == 0 ? 1 : r == -ENOENT ? 0 : r;
}
