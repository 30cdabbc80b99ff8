// SPDX-License-Identifier: MIT
/*
 * A dataset in a store (remote/): s3://BUCKET/PREFIX or https://HOST/PATH/
 * holding what mkzfolio packed, a manifest and data files.  The engine is
 * the same: only where a zfile's compressed bytes come from changes.  A
 * zfile of the store has an object (f->obj) where a local one has an fd;
 * backing.c reads its windows as ranged GETs (adjacent frames in one
 * range, a window's ranges in parallel), its seek table from the tail the
 * open fetched, and everything else (decode, verify, budget, readahead,
 * reclaim) is unchanged.
 *
 * Every transfer is the store's fetcher thread's (remote/fetch.c): a
 * sequential reader's windows share one GET.  A thread keeps a client
 * only for the reason of its last failure, made when first needed and
 * freed when the thread ends.
 *
 * Only packed datasets are served from a store: the manifest answers every
 * lookup and listing, so nothing is ever listed in the store.  An object
 * that changed while mounted (another ETag or size) reads as ESTALE, is
 * logged once, and its file is indexed again at its next open.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* the seek table of a data file of up to ~700 MB in the open's one GET */
#define OPEN_TAIL (64 << 10)

static pthread_key_t client_key;
static struct store *client_store; /* what the key's clients are of */

static void client_free(void *c)
{
	store_client_free(c);
}

int remote_open(struct dataset *ds, char *err, size_t errlen)
{
	const struct options *o = ds->opt;
	struct store_options so = {
		.endpoint = o->endpoint,
		.region = o->region,
		.credentials = o->credentials,
		.profile = o->profile,
		.ca_file = o->ca,
		.retries = o->retries,
		.timeout_s = o->timeout,
	};
	int r = store_open(o->dataset, &so, &ds->store, err, errlen);

	if (r)
		return r;
	if (pthread_key_create(&client_key, client_free)) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	client_store = ds->store;
	return 0;
}

struct store_client *remote_client(void)
{
	struct store_client *c = pthread_getspecific(client_key);

	if (!c && client_store && (c = store_client_new(client_store)))
		pthread_setspecific(client_key, c);
	return c;
}

void remote_thread_done(void)
{
	struct store_client *c = client_store
					 ? pthread_getspecific(client_key)
					 : NULL;

	if (c) {
		pthread_setspecific(client_key, NULL);
		store_client_free(c);
	}
	if (client_store) /* its fetcher thread would not live on in a fork */
		store_idle(client_store);
}

void remote_cancel(struct dataset *ds)
{
	if (ds && ds->store)
		store_cancel(ds->store);
}

void remote_close(struct dataset *ds)
{
	if (!ds->store)
		return;
	remote_thread_done();
	client_store = NULL;
	store_close(ds->store);
	ds->store = NULL;
}

/* The object of path, opened: 0, or -errno with the reason in err. */
int remote_obj_open(struct dataset *ds, const char *path,
		    struct store_obj **out, char *err, size_t errlen)
{
	struct store_client *c = remote_client();
	int r;

	if (!c) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	r = store_obj_open(c, path, OPEN_TAIL, out);
	if (r)
		snprintf(err, errlen, "%s%s: %s", store_base_url(ds->store),
			 path, store_client_error(c));
	return r;
}

ssize_t remote_pread(struct zfile *f, void *buf, size_t len, uint64_t off)
{
	struct store_client *c = remote_client();
	ssize_t n;

	if (!c)
		return -ENOMEM;
	n = store_pread(c, f->obj, buf, len, off);
	if (n < 0)
		remote_log(f, n);
	return n;
}

void remote_log(struct zfile *f, long err)
{
	struct store_client *c = remote_client();

	if (err == -ECANCELED) /* stopped by its reader, or by the stop */
		return;
	if (err == -ESTALE)
		zlog_file(f->path, "changed in the store while mounted: "
				   "reads of it fail (EIO) until it is "
				   "opened again");
	else /* which store: the log may hold several mounts' lines */
		zlog_file(f->path, "%s (%s)",
			  c ? store_client_error(c) : strerror((int)-err),
			  store_base_url(f->ds->store));
}

int remote_describe(char *buf, size_t len)
{
	struct text t = {buf, len, 0};
	struct store_counts n;

	if (!client_store) {
		text_printf(&t, "store none\n");
		return (int)t.off;
	}
	store_counts(client_store, &n);
	text_printf(&t, "store %s\n", store_name(client_store));
	text_printf(&t, "requests %llu\n", (unsigned long long)n.requests);
	text_printf(&t, "streams %llu\n", (unsigned long long)n.streams);
	text_printf(&t, "bytes %llu\n", (unsigned long long)n.bytes);
	text_printf(&t, "retries %llu\n", (unsigned long long)n.retries);
	text_printf(&t, "failures %llu\n", (unsigned long long)n.failures);
	text_printf(&t, "changed %llu\n", (unsigned long long)n.changed);
	return (int)t.off;
}
