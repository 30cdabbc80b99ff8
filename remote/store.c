// SPDX-License-Identifier: MIT
/*
 * Where a dataset lives and how to sign for it.
 *
 * https://HOST/PATH/ (or http://) is a directory of objects read with
 * plain range requests.  s3://BUCKET/PREFIX is the same under an S3
 * service: path-style (ENDPOINT/BUCKET/PREFIX/) when an endpoint is given,
 * by endpoint= or AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS's
 * virtual-hosted https://BUCKET.s3.REGION.amazonaws.com/PREFIX/.
 *
 * S3 requests are signed with AWS Signature V4, libcurl's own
 * (CURLOPT_AWS_SIGV4).  Credentials come from, in order: a credentials
 * file named by credentials= (its profile= section, else AWS_PROFILE's,
 * else [default]); AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (with
 * AWS_SESSION_TOKEN); the shared credentials file (AWS_SHARED_CREDENTIALS_FILE,
 * else ~/.aws/credentials).  None found: requests go unsigned (a public
 * bucket).  The region: region=, AWS_REGION, AWS_DEFAULT_REGION, the
 * profile's region in ~/.aws/config, else us-east-1.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#define DEFAULT_REGION "us-east-1"

bool store_is_url(const char *spec)
{
	return !strncmp(spec, "s3://", 5) || !strncmp(spec, "http://", 7) ||
	       !strncmp(spec, "https://", 8);
}

void url_hide_passwords(char *text)
{
	for (char *p = strstr(text, "://"); p; p = strstr(p, "://")) {
		char *user = p + 3, *end = user + strcspn(user, "/?#@ \t\n"),
		     *colon;

		p = end;
		if (*end != '@')
			continue;
		colon = memchr(user, ':', (size_t)(end - user));
		if (colon)
			memset(colon + 1, '*', (size_t)(end - colon - 1));
	}
}

static void error_text(char *out, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Where url's host starts, past a user part (user:password@). */
static const char *url_host(const char *url)
{
	const char *host = strstr(url, "://") + 3,
		   *at = host + strcspn(host, "/?#@");

	return *at == '@' ? at + 1 : host;
}

static const char *env(const char *name)
{
	const char *v = getenv(name);

	return v && *v ? v : NULL;
}

/* --- ini files: ~/.aws/credentials and ~/.aws/config --- */

static char *trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

/*
 * The value of key in section of the ini file path: malloc'd, or NULL.  In
 * ~/.aws/config a profile's section is "[profile NAME]" (but [default]).
 */
static char *ini_value(const char *path, const char *section, bool config,
		       const char *key)
{
	FILE *f = fopen(path, "r");
	char line[1024], want[300];
	bool in = false;
	char *val = NULL;

	if (!f)
		return NULL;
	if (config && strcmp(section, "default"))
		snprintf(want, sizeof(want), "profile %s", section);
	else
		snprintf(want, sizeof(want), "%s", section);
	while (!val && fgets(line, sizeof(line), f)) {
		char *s = trim(line), *eq;

		if (*s == '#' || *s == ';' || !*s)
			continue;
		if (*s == '[') {
			char *end = strchr(s, ']');

			if (end)
				*end = '\0';
			in = !strcmp(trim(s + 1), want);
			continue;
		}
		eq = strchr(s, '=');
		if (!in || !eq)
			continue;
		*eq = '\0';
		if (!strcmp(trim(s), key))
			val = strdup(trim(eq + 1));
	}
	fclose(f);
	return val;
}

static char *home_file(const char *rel)
{
	const char *home = env("HOME");
	char *p;

	if (!home || asprintf(&p, "%s/%s", home, rel) < 0)
		return NULL;
	return p;
}

struct creds {
	char *key, *secret, *token, *region;
};

static void creds_free(struct creds *c)
{
	free(c->key);
	free(c->secret);
	free(c->token);
	free(c->region);
}

static void creds_from_file(struct creds *c, const char *path,
			    const char *profile)
{
	c->key = ini_value(path, profile, false, "aws_access_key_id");
	c->secret = ini_value(path, profile, false, "aws_secret_access_key");
	c->token = ini_value(path, profile, false, "aws_session_token");
	if (!c->region)
		c->region = ini_value(path, profile, false, "region");
}

static int find_creds(const struct store_options *o, struct creds *c,
		      char *err, size_t errlen)
{
	const char *profile = o->profile ? o->profile
			      : env("AWS_PROFILE") ? env("AWS_PROFILE")
						   : "default";
	char *shared;

	if (o->credentials) {
		FILE *f = fopen(o->credentials, "r");

		if (!f) {
			snprintf(err, errlen, "credentials=%s: %s",
				 o->credentials, strerror(errno));
			return -errno;
		}
		fclose(f);
		creds_from_file(c, o->credentials, profile);
		if (!c->key || !c->secret) {
			snprintf(err, errlen,
				 "credentials=%s: no aws_access_key_id and "
				 "aws_secret_access_key in [%s]",
				 o->credentials, profile);
			return -EINVAL;
		}
		return 0;
	}
	if (env("AWS_ACCESS_KEY_ID") && env("AWS_SECRET_ACCESS_KEY")) {
		c->key = strdup(env("AWS_ACCESS_KEY_ID"));
		c->secret = strdup(env("AWS_SECRET_ACCESS_KEY"));
		if (env("AWS_SESSION_TOKEN"))
			c->token = strdup(env("AWS_SESSION_TOKEN"));
		return c->key && c->secret ? 0 : -ENOMEM;
	}
	shared = env("AWS_SHARED_CREDENTIALS_FILE")
			 ? strdup(env("AWS_SHARED_CREDENTIALS_FILE"))
			 : home_file(".aws/credentials");
	if (shared)
		creds_from_file(c, shared, profile);
	free(shared);
	if (!c->key || !c->secret) { /* anonymous */
		creds_free(c);
		memset(c, 0, sizeof(*c));
	}
	return 0;
}

static char *find_region(const struct store_options *o, struct creds *c)
{
	const char *profile = o->profile ? o->profile
			      : env("AWS_PROFILE") ? env("AWS_PROFILE")
						   : "default";
	char *cfg, *r;

	if (o->region)
		return strdup(o->region);
	if (env("AWS_REGION"))
		return strdup(env("AWS_REGION"));
	if (env("AWS_DEFAULT_REGION"))
		return strdup(env("AWS_DEFAULT_REGION"));
	if (c->region)
		return strdup(c->region);
	cfg = env("AWS_CONFIG_FILE") ? strdup(env("AWS_CONFIG_FILE"))
				     : home_file(".aws/config");
	r = cfg ? ini_value(cfg, profile, true, "region") : NULL;
	free(cfg);
	return r ? r : strdup(DEFAULT_REGION);
}

/* --- URLs --- */

/* path with every byte but unreserved ones and '/' percent-encoded */
static void url_escape(FILE *out, const char *path)
{
	for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
		if (isalnum(*p) || strchr("-._~/", *p))
			fputc(*p, out);
		else
			fprintf(out, "%%%02X", *p);
	}
}

/* The objects' base URL, from an S3 spec's bucket and prefix. */
static int s3_base(struct store *s, const struct store_options *o,
		   const char *region, char *err, size_t errlen)
{
	const char *bp = s->name + 5, *slash = strchr(bp, '/');
	size_t blen = slash ? (size_t)(slash - bp) : strlen(bp);
	const char *prefix = slash ? slash + 1 : "";
	const char *ep = o->endpoint && *o->endpoint ? o->endpoint
			 : env("AWS_ENDPOINT_URL_S3") ? env("AWS_ENDPOINT_URL_S3")
						     : env("AWS_ENDPOINT_URL");
	char *buf = NULL, *bucket;
	size_t len = 0;
	FILE *m;

	if (!blen) {
		snprintf(err, errlen, "%s: no bucket (s3://BUCKET/PREFIX)",
			 s->name);
		return -EINVAL;
	}
	bucket = strndup(bp, blen);
	m = open_memstream(&buf, &len);
	if (!bucket || !m) {
		free(bucket);
		if (m)
			fclose(m);
		return -ENOMEM;
	}
	if (ep) { /* path-style: ENDPOINT/BUCKET/PREFIX/ */
		fputs(ep, m);
		if (ep[strlen(ep) - 1] != '/')
			fputc('/', m);
		url_escape(m, bucket);
		fputc('/', m);
	} else {
		fputs("https://", m);
		url_escape(m, bucket);
		fprintf(m, ".s3.%s.amazonaws.com/", region);
	}
	url_escape(m, prefix);
	if (*prefix && prefix[strlen(prefix) - 1] != '/')
		fputc('/', m);
	free(bucket);
	if (fclose(m))
		return -ENOMEM;
	s->base = buf;
	return 0;
}

static int http_base(struct store *s)
{
	size_t n = strlen(s->name);
	const char *host = strstr(s->name, "://") + 3;

	/* a bare host gets its root; a path its directory */
	if (!strchr(host, '/'))
		return asprintf(&s->base, "%s/", s->name) < 0 ? -ENOMEM : 0;
	if (s->name[n - 1] == '/')
		return (s->base = strdup(s->name)) ? 0 : -ENOMEM;
	return asprintf(&s->base, "%s/", s->name) < 0 ? -ENOMEM : 0;
}

char *store_url(const struct store *s, const char *name, const char *query)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&buf, &len);

	if (!m)
		return NULL;
	fputs(s->base, m);
	url_escape(m, name);
	if (query)
		fprintf(m, "?%s", query);
	if (fclose(m)) {
		free(buf);
		return NULL;
	}
	return buf;
}

/* --- the store --- */

static int s3_auth(struct store *s, const struct store_options *o,
		   char *err, size_t errlen)
{
	struct creds c = {0};
	char *region = NULL;
	int r = find_creds(o, &c, err, errlen);

	if (r)
		return r;
	region = find_region(o, &c);
	r = region ? s3_base(s, o, region, err, errlen) : -ENOMEM;
	if (!r && c.key) {
		if (asprintf(&s->sigv4, "aws:amz:%s:s3", region) < 0 ||
		    asprintf(&s->userpwd, "%s:%s", c.key, c.secret) < 0)
			r = -ENOMEM;
	}
	if (!r && c.token) {
		char *h;

		if (asprintf(&h, "x-amz-security-token: %s", c.token) < 0)
			r = -ENOMEM;
		else
			s->headers = curl_slist_append(s->headers, h);
		free(h);
	}
	if (!r && c.key) /* S3 wants the payload's hash named: GETs have none */
		s->headers = curl_slist_append(
			s->headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
	if (c.secret)
		explicit_bzero(c.secret, strlen(c.secret));
	creds_free(&c);
	free(region);
	return r;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_result;

static void curl_init(void)
{
	curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT);
}

int store_open(const char *spec, const struct store_options *o,
	       struct store **out, char *err, size_t errlen)
{
	struct store *s;
	int r;

	pthread_once(&curl_once, curl_init);
	if (curl_init_result) {
		snprintf(err, errlen, "libcurl: %s",
			 curl_easy_strerror(curl_init_result));
		return -EIO;
	}
	s = calloc(1, sizeof(*s));
	if (!s || !(s->name = strdup(spec))) {
		free(s);
		return -ENOMEM;
	}
	pthread_mutex_init(&s->fetcher_lock, NULL);
	s->retries = o->retries;
	if (o->ca_file && !(s->ca_file = strdup(o->ca_file))) {
		free(s->name);
		free(s);
		return -ENOMEM;
	}
	s->timeout_s = o->timeout_s ? o->timeout_s : STORE_TIMEOUT_S;
	s->s3 = !strncmp(spec, "s3://", 5);
	if (s->s3) {
		r = s3_auth(s, o, err, errlen);
	} else if (!url_host(spec)[0] || url_host(spec)[0] == '/') {
		error_text(err, errlen, "%s: no host", spec);
		r = -EINVAL;
	} else {
		r = http_base(s);
	}
	if (!r && (!(s->shown = strdup(s->name)) ||
		   !(s->shown_base = strdup(s->base))))
		r = -ENOMEM;
	if (r) {
		if (r == -ENOMEM)
			snprintf(err, errlen, "out of memory");
		url_hide_passwords(err);
		store_close(s);
		return r;
	}
	url_hide_passwords(s->shown);
	url_hide_passwords(s->shown_base);
	*out = s;
	return 0;
}

void store_close(struct store *s)
{
	if (!s)
		return;
	fetcher_stop(s);
	if (s->userpwd)
		explicit_bzero(s->userpwd, strlen(s->userpwd));
	free(s->userpwd);
	free(s->sigv4);
	curl_slist_free_all(s->headers);
	free(s->ca_file);
	free(s->base);
	free(s->name);
	free(s->shown);
	free(s->shown_base);
	free(s);
}

const char *store_name(const struct store *s)
{
	return s->shown;
}

const char *store_base_url(const struct store *s)
{
	return s->shown_base;
}

void store_counts(const struct store *s, struct store_counts *out)
{
	out->requests = atomic_load_explicit(&s->n_requests,
					     memory_order_relaxed);
	out->bytes = atomic_load_explicit(&s->n_bytes, memory_order_relaxed);
	out->streams = atomic_load_explicit(&s->n_streams,
					    memory_order_relaxed);
	out->retries = atomic_load_explicit(&s->n_retries,
					    memory_order_relaxed);
	out->failures = atomic_load_explicit(&s->n_failures,
					     memory_order_relaxed);
	out->changed = atomic_load_explicit(&s->n_changed,
					    memory_order_relaxed);
}

/* --- requests --- */

CURL *store_easy(struct store_client *c, const char *url)
{
	struct store *s = c->s;
	CURL *h = c->nidle ? c->idle[--c->nidle] : curl_easy_init();

	if (!h)
		return NULL;
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, (long)s->timeout_s);
	/* a transfer that moves less than a byte a second for timeout_s */
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)s->timeout_s);
	curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
	curl_easy_setopt(h, CURLOPT_PIPEWAIT, 1L);
	curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 256L << 10);
	curl_easy_setopt(h, CURLOPT_FILETIME, 1L);
	curl_easy_setopt(h, CURLOPT_USERAGENT, "zfolio/" ZF_VERSION);
	if (s->headers)
		curl_easy_setopt(h, CURLOPT_HTTPHEADER, s->headers);
	if (s->ca_file)
		curl_easy_setopt(h, CURLOPT_CAINFO, s->ca_file);
	if (s->sigv4) {
		curl_easy_setopt(h, CURLOPT_AWS_SIGV4, s->sigv4);
		curl_easy_setopt(h, CURLOPT_USERPWD, s->userpwd);
	}
	return h;
}

void store_easy_release(struct store_client *c, CURL *h)
{
	if (!h)
		return;
	curl_easy_reset(h); /* keeps its connection cache and DNS */
	if (c->nidle == c->idle_cap) {
		unsigned int cap = c->idle_cap ? 2 * c->idle_cap : 8;
		CURL **n = realloc(c->idle, cap * sizeof(*n));

		if (!n) {
			curl_easy_cleanup(h);
			return;
		}
		c->idle = n;
		c->idle_cap = cap;
	}
	c->idle[c->nidle++] = h;
}

void store_format_error(char *out, size_t len, const char *fmt, va_list ap)
{
	char *text;

	/* whole, then its passwords hidden, then cut: a cut before a URL's
	 * '@' would leave its password as it is */
	if (vasprintf(&text, fmt, ap) < 0) {
		snprintf(out, len, "out of memory");
		return;
	}
	url_hide_passwords(text);
	snprintf(out, len, "%s", text);
	free(text);
}

static void error_text(char *out, size_t len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	store_format_error(out, len, fmt, ap);
	va_end(ap);
}

void store_set_error(struct store_client *c, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	store_format_error(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
}

void store_error_code(const char *body, size_t len, char *out, size_t outlen)
{
	const char *a = memmem(body, len, "<Code>", 6), *b;

	*out = '\0';
	if (!a)
		return;
	a += 6;
	b = memmem(a, len - (size_t)(a - body), "</Code>", 7);
	if (b && (size_t)(b - a) < outlen)
		snprintf(out, outlen, "%.*s", (int)(b - a), a);
}

bool store_transient(CURLcode cc, long status)
{
	switch (cc) {
	case CURLE_OK:
		return status >= 500 || status == 429 || status == 408;
	case CURLE_COULDNT_CONNECT:
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
	case CURLE_SSL_CONNECT_ERROR:
		return true;
	default:
		return false;
	}
}

unsigned int store_backoff_ms(unsigned int n)
{
	unsigned int base = 50u << (n < 6 ? n - 1 : 5); /* 50 ms .. 1.6 s */

	return base / 2 + (unsigned int)rand() % (base / 2 + 1);
}

uint64_t store_now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

int store_status_errno(long status)
{
	switch (status) {
	case 401:
	case 403:
		return -EACCES;
	case 404:
	case 410:
		return -ENOENT;
	case 412:
		return -ESTALE;
	default:
		return -EIO;
	}
}
