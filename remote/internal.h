/* SPDX-License-Identifier: MIT */
/* remote internals: shared by the files of remote/ only. */
#ifndef ZF_REMOTE_INTERNAL_H
#define ZF_REMOTE_INTERNAL_H

#include <curl/curl.h>
#include <stdarg.h>
#include <pthread.h>

#include "remote.h"

struct store {
	char *name;    /* as the user gave it */
	char *base;    /* objects' base URL, ending in '/' */
	char *shown, *shown_base; /* name and base, a password hidden */
	bool s3;       /* sign requests, speak S3 for uploads */
	char *sigv4;   /* CURLOPT_AWS_SIGV4, or NULL: anonymous */
	char *userpwd; /* access key:secret, or NULL */
	struct curl_slist *headers; /* sent with every request */
	char *ca_file;              /* CURLOPT_CAINFO, or NULL */
	unsigned int retries, timeout_s;
	struct fetcher *fetcher; /* started with the first read (fetch.c) */
	pthread_mutex_t fetcher_lock;
	bool cancelled; /* under fetcher_lock: reads fail at once */
	/* counters: relaxed, each a statistic of its own */
	atomic_uint_fast64_t n_requests, n_bytes, n_retries, n_failures,
		n_changed, n_streams;
};

struct store_obj {
	struct store *s;
	char *name; /* relative to the dataset */
	char *url;
	uint64_t size;
	char etag[128]; /* as the server sent it, quotes included; "" if none */
	time_t mtime;
	atomic_bool changed; /* relaxed: a flag for the reader's next open */
	uint64_t seq_end;    /* the fetcher's: where the last read ended */
	struct stream *stream; /* the fetcher's: its open stream, or NULL */
	uint8_t *tail;       /* the object's last tail_len bytes, or NULL */
	uint64_t tail_off;
	size_t tail_len;
};

/* a store_obj's size while it is being opened */
#define STORE_SIZE_UNKNOWN UINT64_MAX

#define STORE_ERR_LEN 256

struct store_client {
	struct store *s;
	CURLM *multi;        /* NULL until store_client_transfers() */
	CURL **idle;         /* easy handles for reuse */
	unsigned int nidle, idle_cap;
	char err[STORE_ERR_LEN];
};

/*
 * The fetcher, in two files: fetch.c (its thread, queue and streams) and
 * request.c (reads of their own: one ranged GET each, and its retries).
 * Everything below is the fetcher thread's alone but the queue and stop.
 */

/* An error body kept for its <Code>: the start of it */
#define ERR_BODY 512

/* r->err of a read whose object changed (ESTALE) */
#define CHANGED "changed in the store since it was opened"

/* What a transfer's CURLOPT_PRIVATE points to starts with: which it is. */
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

/* The transfer of a read of its own (request.c's). */
struct xfer;

/* fetch.c */
void fetcher_stop(struct store *s);
void fetcher_forget(struct store_obj *o);
void set_err(struct store_read *r, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* r is done: after this the waiter owns it (and may free it at once). */
void complete(struct fetcher *F, struct store_read *r, int res);
/* r off a list of reads (F->reads) */
void list_del(struct store_read **list, struct store_read *r);
/* o is another object now: flagged for its next open, and counted */
void mark_changed(struct fetcher *F, struct store_obj *o);

/* request.c: a response's checks */
bool same_object(CURL *h, const struct store_obj *o);
bool range_ok(CURL *h, long status, uint64_t start, bool whole_ok);
/* request.c: reads of their own */
int attempt_send(struct fetcher *F, struct store_read *r);
void read_send(struct fetcher *F, struct store_read *r);
void read_end(struct fetcher *F, struct xfer *x, CURLcode cc);
void complete_cancelled(struct fetcher *F, struct store_read *r);

/* client.c: c's multi handle, made if need be: 0 or -ENOMEM */
int store_client_transfers(struct store_client *c);

/* store.c */
char *store_url(const struct store *s, const char *name, const char *query);
/* An easy handle with the store's settings (auth, timeouts) for url. */
CURL *store_easy(struct store_client *c, const char *url);
void store_easy_release(struct store_client *c, CURL *h);
/* fmt's text into out (len bytes at most), URLs' passwords hidden */
void store_format_error(char *out, size_t len, const char *fmt, va_list ap);
void store_set_error(struct store_client *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* The error text of an S3 XML error body ("<Code>...</Code>"), or "". */
void store_error_code(const char *body, size_t len, char *out, size_t outlen);
/* Whether a failed transfer is worth sending again. */
bool store_transient(CURLcode cc, long status);
/* The backoff before attempt n (1: the first retry), in ms. */
unsigned int store_backoff_ms(unsigned int n);
uint64_t store_now_ms(void);
/* errno for a final HTTP status */
int store_status_errno(long status);

#endif
