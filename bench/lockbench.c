// SPDX-License-Identifier: MIT
/*
 * zfolio-lockbench: the cache's read path in process, without FUSE.  N
 * threads each copy 16 bytes from the same hot folio in a loop through
 * cache_read(), announcing a quiescent state after each read as a worker
 * does after each request; lockless (no reference) against refcount.
 * Prints M reads/s for 1, 2 and 4 threads, both ways.
 *
 *   zfolio-lockbench [SECONDS]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../readahead/readahead.h"

#define FOLIO 131072u

static int sub_submit(struct fill_batch *b)
{
	(void)b;
	return 0;
}

static int sub_fill(struct fill_batch *b, unsigned int i)
{
	memset(b->folios[i]->data, 'z', b->folios[i]->len);
	return 0;
}

static void sub_finish(struct fill_batch *b)
{
	(void)b;
}

static int sub_read_into(struct mapping *m, void *c, unsigned long i,
			 void *buf, struct group *g)
{
	(void)c;
	(void)g;
	memset(buf, 'z', mapping_folio_len(m, i));
	return 0;
}

static const struct mapping_ops ops = {
	.submit = sub_submit,
	.fill = sub_fill,
	.finish = sub_finish,
	.read_into = sub_read_into,
};

static int copy16(void *arg, const struct iovec *iov, int cnt)
{
	if (cnt > 0)
		memcpy(arg, iov[0].iov_base, 16);
	return 0;
}

struct bench {
	struct cache *c;
	struct mapping *m;
	volatile bool stop;
	long reads[8];
};

struct targ {
	struct bench *b;
	int id;
};

static void *reader(void *arg)
{
	struct targ *t = arg;
	struct ra_request *rq = malloc(sizeof(*rq));
	char out[16];
	long n = 0;

	cache_thread_register();
	while (!t->b->stop) {
		ra_request_init(rq, t->b->m, NULL, &t->b->c->budget.root, NULL,
				0, 16, false);
		cache_read(&rq->rq, copy16, out);
		cache_quiescent();
		n++;
	}
	t->b->reads[t->id] = n;
	cache_thread_unregister();
	free(rq);
	return NULL;
}

static double run(bool lockless, int threads, double secs)
{
	struct cache_config cfg = {
		.budget = {.max_pages = 1024, .high_pages = COUNTER_MAX,
			   .group_max_pages = COUNTER_MAX,
			   .group_high_pages = COUNTER_MAX},
		.lockless = lockless,
	};
	struct ra_config rc = {.ra_pages = 32};
	struct cache c;
	struct bench b = {.c = &c};
	struct targ t[8];
	pthread_t tid[8];
	char out[16];
	struct ra_request *rq = malloc(sizeof(*rq));
	long total = 0;

	cache_init(&c, &cfg);
	cache_start(&c);
	readahead_init(&c, &rc);
	b.m = mapping_create(&c, &ops, NULL, 4 * FOLIO, 4, FOLIO, NULL);
	/* make folio 0 hot: reads that alternate with folio 1 all count */
	cache_thread_register();
	for (int i = 0; i < 8; i++) {
		ra_request_init(rq, b.m, NULL, &c.budget.root, NULL,
				(uint64_t)(i & 1) * FOLIO, 16, false);
		cache_read(&rq->rq, copy16, out);
	}
	cache_thread_unregister();
	for (int i = 0; i < threads; i++) {
		t[i] = (struct targ){&b, i};
		pthread_create(&tid[i], NULL, reader, &t[i]);
	}
	usleep((useconds_t)(secs * 1e6));
	b.stop = true;
	for (int i = 0; i < threads; i++) {
		pthread_join(tid[i], NULL);
		total += b.reads[i];
	}
	if (lockless && !stat_read(&c.budget.root, STAT_LOCKLESS_READS))
		fprintf(stderr, "warning: the folio did not turn hot\n");
	mapping_put(b.m);
	cache_destroy(&c);
	free(rq);
	return (double)total / secs / 1e6;
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 3;
	static const int n[] = {1, 2, 4};

	printf("16-byte reads of one hot folio through cache_read(), "
	       "M reads/s (%.0f s each)\n",
	       secs);
	printf("%-10s %12s %12s %8s\n", "threads", "lockless", "refcount",
	       "ratio");
	for (int i = 0; i < 3; i++) {
		double l = run(true, n[i], secs), r = run(false, n[i], secs);

		printf("%-10d %12.2f %12.2f %8.2f\n", n[i], l, r, l / r);
	}
	return 0;
}
