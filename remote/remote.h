/* SPDX-License-Identifier: MIT */
/*
 * remote: datasets in object storage, the API of remote/.  A dataset that
 * mkzfolio packed (a manifest and data files) can live in an S3-compatible
 * store (s3://BUCKET/PREFIX) or under any HTTP server that honours range
 * requests (https://HOST/PATH/); every read is then a range of one of its
 * objects.  No FUSE and no engine here: the daemon (fs/) reads through it,
 * mkzfolio writes through it.
 *
 *  - struct store: where the dataset is and how to sign for it (AWS
 *    Signature V4, libcurl's own, with credentials from the usual places).
 *    Its counters are shared by every thread.
 *  - struct store_obj: one object as first seen (size, ETag, time).  A
 *    response that shows another size or ETag is a changed object: the read
 *    fails with ESTALE and the object is marked changed.
 *  - reads: started by any thread, waited for by any thread, carried by
 *    the store's fetcher, one thread that owns every transfer (fetch.c):
 *    the reads of a window go out in parallel over connections it keeps
 *    (HTTP/2 streams where offered), and a file read in sequence is one
 *    request however many windows it takes (a stream).  Transient failures
 *    (5xx, 429, resets, timeouts, short bodies) are retried with backoff,
 *    resuming where the body stopped; then EIO.
 *  - struct store_client: a thread's handle for error messages, and the
 *    transfers of uploads (mkzfolio).
 *
 * Secrets never appear in an error message, a log line or the URL.
 */
#ifndef ZF_REMOTE_H
#define ZF_REMOTE_H

#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

struct store;
struct store_obj;
struct store_client;

/* How to reach a store: NULL or 0 means "from the usual places". */
struct store_options {
	const char *endpoint;    /* s3: the service URL (AWS when unset) */
	const char *region;      /* s3: the signing region */
	const char *credentials; /* s3: a credentials file (ini, as AWS's) */
	const char *profile;     /* s3: its section */
	const char *ca_file;     /* https: the CAs to trust (else the
				  * system's) */
	unsigned int retries;    /* attempts after the first */
	unsigned int timeout_s;  /* a transfer without progress this long */
};

#define STORE_RETRIES 5
#define STORE_TIMEOUT_S 15

/* Whether spec names a store (s3://, http://, https://) and not a path. */
bool store_is_url(const char *spec);
/* The password of every URL's user part in text (http://user:pw@host/)
 * overwritten by '*', in place: for what others can see (/proc/mounts,
 * ps, logs, messages). */
void url_hide_passwords(char *text);
/* Parse spec and find credentials; nothing is sent yet. */
int store_open(const char *spec, const struct store_options *o,
	       struct store **out, char *err, size_t errlen);
void store_close(struct store *s);
/* The dataset's address as the user gave it, a password in it hidden: for
 * logs and messages. */
const char *store_name(const struct store *s);
/* Objects' base URL, a password in it hidden: for logs and messages. */
const char *store_base_url(const struct store *s);

struct store_counts {
	uint64_t requests; /* HTTP requests sent, retries included */
	uint64_t streams;  /* of which GETs read by successive reads */
	uint64_t bytes;    /* body bytes received */
	uint64_t retries;  /* requests sent again after a transient failure */
	uint64_t failures; /* reads that failed after their retries */
	uint64_t changed;  /* responses that showed a changed object */
};
void store_counts(const struct store *s, struct store_counts *out);

struct store_client *store_client_new(struct store *s);
void store_client_free(struct store_client *c);
/* The reason for the client's last failure, for a log line or error. */
const char *store_client_error(const struct store_client *c);

/*
 * Open object name (relative to the dataset): one request, a GET of its
 * last tail bytes, which learns its size, ETag and time and keeps those
 * bytes (a seek table's reads are then served from them).  -ENOENT,
 * -EACCES (refused: credentials), -EIO; the reason in store_client_error.
 */
int store_obj_open(struct store_client *c, const char *name, size_t tail,
		   struct store_obj **out);
void store_obj_free(struct store_obj *o);
uint64_t store_obj_size(const struct store_obj *o);
time_t store_obj_mtime(const struct store_obj *o);
const char *store_obj_name(const struct store_obj *o);
/* A response has shown the object changed since it was opened. */
bool store_obj_changed(const struct store_obj *o);
/* The kept tail is no longer needed (the index is built). */
void store_obj_drop_tail(struct store_obj *o);

/* A range of an object, read into dst. */
struct store_read {
	uint64_t off, len;
	uint8_t *dst;
	int res;   /* once waited for: the bytes read (len), or -errno */
	/* the fetcher's, from start until it posts done */
	sem_t done;
	atomic_bool cancel;
	bool forget;           /* not a read: the object's stream goes */
	struct store_obj *obj;
	void *handle;          /* its transfer, when it has one of its own */
	uint64_t got;          /* body bytes in dst */
	unsigned int attempts; /* sent so far */
	uint64_t retry_at_ms;  /* waiting to be sent again, or 0 */
	struct store_read *next; /* on a list of the fetcher's */
	char err[160];         /* why it failed */
};

/* Start r (its off, len and dst set): every started read is waited for. */
void store_read_start(struct store_client *c, struct store_obj *o,
		      struct store_read *r);
/* Wait until r is done: r->res (the reason of a failure in c's error). */
int store_read_wait(struct store_client *c, struct store_read *r);
/* Stop r if it is still in flight; then wait for it (-ECANCELED). */
void store_read_cancel(struct store_read *r);
/* Stop r if it is still in flight, without waiting. */
void store_read_stop(struct store_read *r);
/*
 * The calling thread's abort word, or NULL: once it reads true, its
 * store_read_wait stops the read it waits for (-ECANCELED).  A reader's
 * request interrupted (Ctrl-C on a read from a stalled store) is not held
 * up by the retries.
 */
extern __thread atomic_bool *store_wait_abort;
/* Before a fork: the fetcher thread stops (it starts again when needed). */
void store_idle(struct store *s);
/* The mount is going: what is in flight fails now (-ECANCELED), and so does
 * every read after. */
void store_cancel(struct store *s);
/* Read len bytes at off now: the bytes read or -errno. */
ssize_t store_pread(struct store_client *c, struct store_obj *o, void *buf,
		    size_t len, uint64_t off);

/*
 * Write: object name from the open file fd (size bytes), as one PUT, or
 * (S3, above STORE_MULTIPART_ABOVE) as a multipart upload of parts sent
 * in parallel.  0 or -errno, with the reason in store_client_error.
 */
#define STORE_MULTIPART_ABOVE (64ull << 20)
#define STORE_PART_SIZE (16ull << 20)
int store_put_file(struct store_client *c, const char *name, int fd,
		   uint64_t size);
/* Whether object name exists (a HEAD): 1, 0, or -errno (-ENXIO: its S3
 * bucket is not there, the error saying so). */
int store_exists(struct store_client *c, const char *name);

#endif
