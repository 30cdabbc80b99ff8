/* SPDX-License-Identifier: MIT */
/* remote internals: shared by the files of remote/ only. */
#ifndef ZF_REMOTE_INTERNAL_H
#define ZF_REMOTE_INTERNAL_H

#include <curl/curl.h>
#include <pthread.h>

#include "remote.h"

struct store {
	char *name;    /* as the user gave it */
	char *base;    /* objects' base URL, ending in '/' */
	bool s3;       /* sign requests, speak S3 for uploads */
	char *sigv4;   /* CURLOPT_AWS_SIGV4, or NULL: anonymous */
	char *userpwd; /* access key:secret, or NULL */
	struct curl_slist *headers; /* sent with every request */
	char *ca_file;              /* CURLOPT_CAINFO, or NULL */
	unsigned int retries, timeout_s;
	struct fetcher *fetcher; /* started with the first read (fetch.c) */
	pthread_mutex_t fetcher_lock;
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

/* fetch.c */
void fetcher_stop(struct store *s);
void fetcher_forget(struct store_obj *o);

/* client.c: c's multi handle, made if need be: 0 or -ENOMEM */
int store_client_transfers(struct store_client *c);

/* store.c */
char *store_url(const struct store *s, const char *name, const char *query);
/* An easy handle with the store's settings (auth, timeouts) for url. */
CURL *store_easy(struct store_client *c, const char *url);
void store_easy_release(struct store_client *c, CURL *h);
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
