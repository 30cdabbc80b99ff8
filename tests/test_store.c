// SPDX-License-Identifier: MIT
/*
 * remote/ against a real HTTP server in the test's own process: a small
 * HTTP/1.1 server on a loopback port that serves objects by range, with
 * ETags, keep-alive, and faults on demand (a 503 every Nth request, a
 * body cut in half and the connection closed every Mth).  What it checks:
 * an object opened with one request (size, ETag, its tail kept); ranged
 * reads right, in parallel; a file read in sequence is one stream, also
 * when the windows come out of order; failures retried from where the
 * body stopped, opens too; an exhausted retry budget, a missing object, a
 * refusal and a changed object give their errors; a cancelled read; an
 * object freed with an idle stream; many threads at once (under TSan in
 * the concurrency suite).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../remote/remote.h"
#include "check.h"

/* --- the server --- */

#define OBJ_SIZE (3u << 20)
#define NOBJ 2

static struct server {
	int fd, port;
	pthread_t thread;
	uint8_t *data[NOBJ];
	char etag[NOBJ][32];
	atomic_uint requests, gets;
	atomic_uint every_503, every_drop; /* 0: never */
	atomic_int status;                 /* answer this to all, if set */
	atomic_int ignore_range; /* the next N GETs: a 200 of it all, cut short */
	atomic_bool stop;
	uint8_t *put;                      /* the last PUT's body */
	atomic_size_t put_len;
	atomic_uint puts;
} srv;

static void write_all(int fd, const void *p, size_t n)
{
	while (n) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);

		if (k <= 0)
			return;
		p = (const char *)p + k;
		n -= (size_t)k;
	}
}

/* One request's head into buf (up to the blank line): its length, or 0. */
static size_t read_head(int fd, char *buf, size_t cap)
{
	size_t n = 0;

	while (n + 1 < cap) {
		ssize_t k = recv(fd, buf + n, 1, 0);

		if (k <= 0)
			return 0;
		n++;
		buf[n] = '\0';
		if (n >= 4 && !memcmp(buf + n - 4, "\r\n\r\n", 4))
			return n;
	}
	return 0;
}

/* A PUT: its body kept (answered 200), or refused with status. */
static void answer_put(int fd, const char *head, int status)
{
	const char *cl = strstr(head, "Content-Length: ");
	size_t len = cl ? strtoull(cl + 16, NULL, 10) : 0, got = 0;
	uint8_t *buf = malloc(len ? len : 1);
	const char *ok = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
	char no[128];

	while (got < len) {
		ssize_t k = recv(fd, buf + got, len - got, 0);

		if (k <= 0)
			break;
		got += (size_t)k;
	}
	if (status || got < len) {
		free(buf);
		snprintf(no, sizeof(no), "HTTP/1.1 %d X\r\nContent-Length: 29"
			 "\r\n\r\n<Error><Code>x</Code></Error>",
			 status ? status : 400);
		write_all(fd, no, strlen(no));
		return;
	}
	free(srv.put);
	srv.put = buf;
	atomic_store(&srv.put_len, len);
	atomic_fetch_add(&srv.puts, 1);
	write_all(fd, ok, strlen(ok));
}

static void answer(int fd, const char *head)
{
	unsigned int n = atomic_fetch_add(&srv.requests, 1) + 1;
	unsigned int e503 = atomic_load(&srv.every_503);
	unsigned int edrop = atomic_load(&srv.every_drop);
	char path[64], hdr[512];
	const char *rg = strstr(head, "Range: bytes=");
	unsigned long long a = 0, b = OBJ_SIZE - 1, len;
	int obj = -1, forced = atomic_load(&srv.status);
	bool head_only = !strncmp(head, "HEAD ", 5);

	if (!strncmp(head, "PUT ", 4)) {
		answer_put(fd, head,
			   forced ? forced : e503 && n % e503 == 0 ? 503 : 0);
		return;
	}
	if (sscanf(head, "%*s /o%63s", path) == 1)
		obj = atoi(path);
	if (!head_only)
		atomic_fetch_add(&srv.gets, 1);
	if (forced || (e503 && n % e503 == 0) || obj < 0 || obj >= NOBJ) {
		int st = forced ? forced : obj < 0 || obj >= NOBJ ? 404 : 503;
		const char *body = st == 403 ? "<Error><Code>AccessDenied</Code>"
					       "</Error>"
					     : "<Error><Code>x</Code></Error>";

		snprintf(hdr, sizeof(hdr),
			 "HTTP/1.1 %d X\r\nContent-Length: %zu\r\n\r\n", st,
			 strlen(body));
		write_all(fd, hdr, strlen(hdr));
		write_all(fd, body, strlen(body));
		return;
	}
	if (rg && rg[13] == '-') {
		len = strtoull(rg + 14, NULL, 10);
		a = len >= OBJ_SIZE ? 0 : OBJ_SIZE - len;
	} else if (rg) {
		sscanf(rg + 13, "%llu-%llu", &a, &b);
		if (b >= OBJ_SIZE)
			b = OBJ_SIZE - 1;
	}
	len = b - a + 1;
	if (rg && rg[13] != '-' && atomic_fetch_sub(&srv.ignore_range, 1) > 0) {
		snprintf(hdr, sizeof(hdr),
			 "HTTP/1.1 200 OK\r\nETag: %s\r\nContent-Length: "
			 "%u\r\n\r\n", srv.etag[obj], OBJ_SIZE);
		write_all(fd, hdr, strlen(hdr));
		write_all(fd, srv.data[obj], 1000);
		shutdown(fd, SHUT_RDWR);
		return;
	}
	snprintf(hdr, sizeof(hdr),
		 "HTTP/1.1 206 Partial\r\nContent-Range: bytes %llu-%llu/%u\r\n"
		 "ETag: %s\r\nContent-Length: %llu\r\n\r\n",
		 a, b, OBJ_SIZE, srv.etag[obj], len);
	write_all(fd, hdr, strlen(hdr));
	if (head_only)
		return;
	if (edrop && n % edrop == 0) { /* half the body, then gone */
		write_all(fd, srv.data[obj] + a, len / 2);
		shutdown(fd, SHUT_RDWR);
		return;
	}
	write_all(fd, srv.data[obj] + a, len);
}

static void *conn_main(void *arg)
{
	int fd = (int)(intptr_t)arg;
	char head[4096];

	while (!atomic_load(&srv.stop) && read_head(fd, head, sizeof(head)))
		answer(fd, head);
	close(fd);
	return NULL;
}

static void *accept_main(void *arg)
{
	(void)arg;
	for (;;) {
		int c = accept(srv.fd, NULL, NULL);
		pthread_t t;

		if (c < 0 || atomic_load(&srv.stop)) {
			if (c >= 0)
				close(c);
			return NULL;
		}
		if (pthread_create(&t, NULL, conn_main, (void *)(intptr_t)c))
			close(c);
		else
			pthread_detach(t);
	}
}

static void server_start(void)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t sl = sizeof(sa);
	unsigned long long seed = 42;

	for (int i = 0; i < NOBJ; i++) {
		srv.data[i] = malloc(OBJ_SIZE);
		for (unsigned int k = 0; k < OBJ_SIZE; k++)
			srv.data[i][k] = (uint8_t)test_rand(&seed);
		snprintf(srv.etag[i], sizeof(srv.etag[i]), "\"v1-%d\"", i);
	}
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	srv.fd = socket(AF_INET, SOCK_STREAM, 0);
	if (srv.fd < 0 || bind(srv.fd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    listen(srv.fd, 64) ||
	    getsockname(srv.fd, (struct sockaddr *)&sa, &sl)) {
		perror("server");
		exit(1);
	}
	srv.port = ntohs(sa.sin_port);
	pthread_create(&srv.thread, NULL, accept_main, NULL);
}

static void server_stop(void)
{
	atomic_store(&srv.stop, true);
	shutdown(srv.fd, SHUT_RDWR);
	close(srv.fd);
	pthread_join(srv.thread, NULL);
	/* the objects stay: a connection's thread may still be answering */
}

/* --- the client side --- */

static struct store *open_store(unsigned int retries)
{
	struct store_options so = {.retries = retries, .timeout_s = 5};
	struct store *s;
	char url[64], err[256];

	snprintf(url, sizeof(url), "http://127.0.0.1:%d/", srv.port);
	if (store_open(url, &so, &s, err, sizeof(err))) {
		fprintf(stderr, "store_open: %s\n", err);
		exit(1);
	}
	return s;
}

static struct store_obj *open_obj(struct store_client *c, int i)
{
	struct store_obj *o = NULL;
	char name[16];

	snprintf(name, sizeof(name), "o%d", i);
	CHECK_EQ(store_obj_open(c, name, 65536, &o), 0);
	return o;
}

static bool read_ok(struct store_client *c, struct store_obj *o, int i,
		    uint64_t off, size_t len)
{
	uint8_t *buf = malloc(len);
	ssize_t n = store_pread(c, o, buf, len, off);
	bool ok = n == (ssize_t)len && !memcmp(buf, srv.data[i] + off, len);

	free(buf);
	return ok;
}

static void test_open_and_ranges(void)
{
	struct store *s = open_store(0);
	struct store_client *c = store_client_new(s);
	struct store_obj *o = open_obj(c, 0);
	struct store_counts n0, n1;
	unsigned long long seed = 7;

	CHECK_EQ(store_obj_size(o), OBJ_SIZE);
	store_counts(s, &n0);
	CHECK_EQ(n0.requests, 1); /* the open: one GET of the tail */
	CHECK(read_ok(c, o, 0, OBJ_SIZE - 1000, 1000)); /* from the tail */
	store_counts(s, &n1);
	CHECK_EQ(n1.requests, 1);
	store_obj_drop_tail(o);
	for (int k = 0; k < 50; k++) {
		uint64_t off = test_rand(&seed) % (OBJ_SIZE - 1);
		size_t len = 1 + test_rand(&seed) % 70000;

		if (len > OBJ_SIZE - off)
			len = OBJ_SIZE - off;
		CHECK(read_ok(c, o, 0, off, len));
	}
	/* several at once, then waited for in reverse */
	{
		struct store_read r[8];
		uint8_t *buf = malloc(8 * 65536);

		for (int k = 0; k < 8; k++) {
			r[k] = (struct store_read){.off = (uint64_t)k * 300000,
						   .len = 65536,
						   .dst = buf + k * 65536};
			store_read_start(c, o, &r[k]);
		}
		for (int k = 7; k >= 0; k--) {
			CHECK_EQ(store_read_wait(c, &r[k]), 65536);
			CHECK(!memcmp(buf + k * 65536,
				      srv.data[0] + (uint64_t)k * 300000,
				      65536));
		}
		free(buf);
	}
	store_counts(s, &n1);
	CHECK_EQ(n1.failures, 0);
	CHECK_EQ(n1.streams, 0); /* nothing read in sequence */
	store_obj_free(o);
	store_client_free(c);
	store_close(s);
}

static void test_stream(void)
{
	struct store *s = open_store(0);
	struct store_client *c = store_client_new(s);
	struct store_obj *o = open_obj(c, 1);
	struct store_counts n;
	const size_t w = 200000;
	uint8_t *buf = malloc(OBJ_SIZE);
	struct store_read r[2];

	/* windows in sequence: the second opens a stream, the rest read it */
	for (uint64_t off = 0; off + w <= 6 * w; off += w)
		CHECK(read_ok(c, o, 1, off, w));
	store_counts(s, &n);
	CHECK_EQ(n.streams, 1);
	CHECK_EQ(n.requests, 3); /* the open, the first window, the stream */
	/* two windows at once, gaps of cached frames before and between */
	r[1] = (struct store_read){.off = 8 * w, .len = w, .dst = buf};
	r[0] = (struct store_read){.off = 6 * w + 1000, .len = w,
				   .dst = buf + w};
	store_read_start(c, o, &r[0]);
	store_read_start(c, o, &r[1]);
	CHECK_EQ(store_read_wait(c, &r[0]), (int)w);
	CHECK_EQ(store_read_wait(c, &r[1]), (int)w);
	CHECK(!memcmp(buf, srv.data[1] + 8 * w, w));
	CHECK(!memcmp(buf + w, srv.data[1] + 6 * w + 1000, w));
	store_counts(s, &n);
	CHECK_EQ(n.requests, 3);
	/* a jump back: a request of its own; the stream stays */
	CHECK(read_ok(c, o, 1, 100, 5000));
	CHECK(read_ok(c, o, 1, 9 * w, w));
	store_counts(s, &n);
	CHECK_EQ(n.requests, 4);
	CHECK_EQ(n.failures, 0);
	/* freed with its stream idle (ASan: nothing may point to it) */
	store_obj_free(o);
	free(buf);
	store_client_free(c);
	store_close(s);
}

static void test_faults(void)
{
	struct store *s = open_store(10);
	struct store_client *c = store_client_new(s);
	struct store_obj *o[NOBJ];
	struct store_counts n;
	unsigned long long seed = 11;

	atomic_store(&srv.every_503, 3);
	atomic_store(&srv.every_drop, 4);
	for (int i = 0; i < NOBJ; i++) /* opens cut short are retried */
		o[i] = open_obj(c, i);
	for (int k = 0; k < 40; k++) {
		int i = k % NOBJ;
		uint64_t off = test_rand(&seed) % (OBJ_SIZE - 200000);

		CHECK(read_ok(c, o[i], i, off, 1 + test_rand(&seed) % 200000));
	}
	for (uint64_t off = 0; off + 250000 <= OBJ_SIZE; off += 250000)
		CHECK(read_ok(c, o[0], 0, off, 250000)); /* streams break */
	atomic_store(&srv.every_503, 0);
	atomic_store(&srv.every_drop, 0);
	store_counts(s, &n);
	CHECK(n.retries > 0);
	CHECK_EQ(n.failures, 0);
	CHECK_EQ(n.changed, 0);
	for (int i = 0; i < NOBJ; i++)
		store_obj_free(o[i]);
	store_client_free(c);
	store_close(s);
}

static void test_errors(void)
{
	struct store *s = open_store(2);
	struct store_client *c = store_client_new(s);
	struct store_obj *o = open_obj(c, 0), *x = NULL;
	uint8_t buf[100];
	struct store_counts n;
	struct store_read r = {.off = 5000, .len = 100000};

	CHECK_EQ(store_obj_open(c, "missing", 1000, &x), -ENOENT);
	atomic_store(&srv.status, 403);
	CHECK_EQ(store_obj_open(c, "o1", 1000, &x), -EACCES);
	CHECK(strstr(store_client_error(c), "AccessDenied") != NULL);
	atomic_store(&srv.status, 503); /* every request: retries run out */
	CHECK_EQ(store_pread(c, o, buf, sizeof(buf), 100), -EIO);
	CHECK(strstr(store_client_error(c), "503") != NULL);
	atomic_store(&srv.status, 0);
	CHECK(read_ok(c, o, 0, 100, 100)); /* and back */
	/* cancelled: done, whatever it had */
	r.dst = malloc(r.len);
	store_read_start(c, o, &r);
	store_read_cancel(&r);
	CHECK(r.res == (int)r.len || r.res == -ECANCELED);
	free(r.dst);
	/* a new version: ESTALE, and the object says so */
	snprintf(srv.etag[0], sizeof(srv.etag[0]), "\"v2-0\"");
	CHECK_EQ(store_pread(c, o, buf, sizeof(buf), 300000), -ESTALE);
	CHECK(store_obj_changed(o));
	store_counts(s, &n);
	CHECK_EQ(n.changed, 1);
	snprintf(srv.etag[0], sizeof(srv.etag[0]), "\"v1-0\"");
	store_obj_free(o); /* changed for good: opened again */
	o = open_obj(c, 0);
	/* a server (a proxy) that ignores Range once, and cuts the body
	 * short: the start of the object is never taken for the range, and
	 * the read resumed from it (the next answer is right) */
	{
		uint8_t *big = malloc(100000);

		atomic_store(&srv.ignore_range, 1);
		CHECK_EQ(store_pread(c, o, big, 100000, 400000), -EIO);
		CHECK(strstr(store_client_error(c), "Range") != NULL);
		free(big);
	}
	atomic_store(&srv.ignore_range, 0);
	CHECK(read_ok(c, o, 0, 0, 100));
	store_obj_free(o);
	store_client_free(c);
	store_close(s);
}

static void test_put(void)
{
	struct store *s = open_store(3);
	struct store_client *c = store_client_new(s);
	FILE *f = tmpfile();

	CHECK(f && fwrite(srv.data[1], 1, 1 << 20, f) == 1 << 20);
	fflush(f);
	/* the first PUT's turn is a 503 with an XML body: sent again, fine */
	atomic_store(&srv.requests, 1); /* the PUT is request 2 */
	atomic_store(&srv.every_503, 2);
	atomic_store(&srv.puts, 0);
	CHECK_EQ(store_put_file(c, "up/x", fileno(f), 1 << 20), 0);
	atomic_store(&srv.every_503, 0);
	CHECK_EQ(atomic_load(&srv.puts), 1);
	CHECK_EQ(atomic_load(&srv.put_len), 1 << 20);
	CHECK(srv.put && !memcmp(srv.put, srv.data[1], 1 << 20));
	/* refused for good (403): not sent again */
	atomic_store(&srv.status, 403);
	atomic_store(&srv.requests, 0);
	CHECK_EQ(store_put_file(c, "up/x", fileno(f), 1 << 20), -EACCES);
	CHECK_EQ(atomic_load(&srv.requests), 1);
	atomic_store(&srv.status, 0);
	fclose(f);
	store_client_free(c);
	store_close(s);
}

/* --- many threads --- */

struct reader_arg {
	struct store *s;
	struct store_obj **o;
	int id;
	atomic_int *bad;
};

static void *reader_main(void *p)
{
	struct reader_arg *a = p;
	struct store_client *c = store_client_new(a->s);
	unsigned long long seed = 100 + (unsigned long long)a->id;
	int i = a->id % NOBJ;

	/* half the threads read in sequence, half at random */
	for (int k = 0; k < 40; k++) {
		uint64_t off = a->id % 2
				       ? (uint64_t)k * 60000
				       : test_rand(&seed) % (OBJ_SIZE - 60000);

		if (!read_ok(c, a->o[i], i, off, 60000))
			atomic_fetch_add(a->bad, 1);
	}
	store_client_free(c);
	return NULL;
}

static void test_threads(void)
{
	struct store *s = open_store(3);
	struct store_client *c = store_client_new(s);
	struct store_obj *o[NOBJ];
	struct reader_arg a[8];
	pthread_t t[8];
	atomic_int bad = 0;

	for (int i = 0; i < NOBJ; i++)
		o[i] = open_obj(c, i);
	for (int k = 0; k < 8; k++) {
		a[k] = (struct reader_arg){s, o, k, &bad};
		pthread_create(&t[k], NULL, reader_main, &a[k]);
	}
	for (int k = 0; k < 8; k++)
		pthread_join(t[k], NULL);
	CHECK_EQ(atomic_load(&bad), 0);
	/* the fetcher stops (as before a fork) and starts again */
	store_idle(s);
	CHECK(read_ok(c, o[0], 0, 12345, 54321));
	for (int i = 0; i < NOBJ; i++)
		store_obj_free(o[i]);
	store_client_free(c);
	store_close(s);
}

/* Passwords hidden in place, every URL's of a text; nothing else touched,
 * and a store names itself without its own. */
static void test_passwords(void)
{
	static const char *const cases[][2] = {
		{"http://u:secret@h:80/ds/", "http://u:******@h:80/ds/"},
		{"https://u@h/ds/", "https://u@h/ds/"},
		{"http://u:@h/", "http://u:@h/"},
		{"http://h/a:b@c/", "http://h/a:b@c/"},
		{"http://h:8080/x?u:p@q", "http://h:8080/x?u:p@q"},
		{"s3://bucket/prefix", "s3://bucket/prefix"},
		{"GET http://a:bb@h/x: HTTP 401 (from https://c:d:e@g/)",
		 "GET http://a:**@h/x: HTTP 401 (from https://c:***@g/)"},
		{"a path:with@signs", "a path:with@signs"},
		{"", ""},
	};
	struct store_options o = {0};
	struct store *st;
	char err[256];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char text[128];

		snprintf(text, sizeof(text), "%s", cases[i][0]);
		url_hide_passwords(text);
		CHECK(!strcmp(text, cases[i][1]));
		if (strcmp(text, cases[i][1]))
			fprintf(stderr, "  %s -> %s\n", cases[i][0], text);
	}
	CHECK_EQ(store_open("http://u:secret@h/ds", &o, &st, err, sizeof(err)),
		 0);
	CHECK(!strcmp(store_name(st), "http://u:******@h/ds"));
	CHECK(!strcmp(store_base_url(st), "http://u:******@h/ds/"));
	store_close(st);
	CHECK(store_open("http://u:secret@/ds", &o, &st, err, sizeof(err)) <
	      0);
	CHECK(!strstr(err, "secret"));
	/* a message cut short is cut after the password is hidden */
	{
		char url[400], small[64];

		snprintf(url, sizeof(url), "http://u:%0300d@/ds", 0);
		CHECK(store_open(url, &o, &st, small, sizeof(small)) < 0);
		CHECK(!strstr(small, "000"));
	}
}

int main(void)
{
	server_start();
	RUN(test_passwords);
	RUN(test_open_and_ranges);
	RUN(test_stream);
	RUN(test_faults);
	RUN(test_errors);
	RUN(test_put);
	RUN(test_threads);
	server_stop();
	return check_done();
}
