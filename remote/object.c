// SPDX-License-Identifier: MIT
/*
 * A store's objects: opened with one request, a GET of the object's last
 * bytes.  The response tells the size (Content-Range's total), the version
 * (ETag) and the time (Last-Modified), and those bytes are what the seek
 * table's parser reads first, so a data file costs one request to index.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int store_obj_open(struct store_client *c, const char *name, size_t tail,
		   struct store_obj **out)
{
	struct store_obj *o = calloc(1, sizeof(*o));
	struct store_read r = {.len = tail ? tail : 1};
	int res;

	if (!o || !(o->name = strdup(name)) ||
	    !(o->url = store_url(c->s, name, NULL)) ||
	    !(o->tail = malloc(r.len))) {
		store_obj_free(o);
		store_set_error(c, "out of memory");
		return -ENOMEM;
	}
	o->s = c->s;
	o->size = STORE_SIZE_UNKNOWN;
	o->seq_end = UINT64_MAX; /* no read yet */
	r.dst = o->tail;
	store_read_start(c, o, &r);
	res = store_read_wait(c, &r);
	if (res < 0) {
		store_obj_free(o);
		return res;
	}
	*out = o;
	return 0;
}

void store_obj_free(struct store_obj *o)
{
	if (!o)
		return;
	if (o->s)
		fetcher_forget(o);
	free(o->tail);
	free(o->url);
	free(o->name);
	free(o);
}

uint64_t store_obj_size(const struct store_obj *o)
{
	return o->size;
}

time_t store_obj_mtime(const struct store_obj *o)
{
	return o->mtime;
}

const char *store_obj_name(const struct store_obj *o)
{
	return o->name;
}

bool store_obj_changed(const struct store_obj *o)
{
	return atomic_load_explicit(&o->changed, memory_order_relaxed);
}

void store_obj_drop_tail(struct store_obj *o)
{
	free(o->tail);
	o->tail = NULL;
	o->tail_len = 0;
}
