// SPDX-License-Identifier: MIT
/*
 * zfolio-gendata: deterministic test data from a seed.
 *
 *   zfolio-gendata KIND SIZE [SEED] > file
 *
 * KIND: rand (incompressible), z3 (compresses about 3:1 at zstd level 3,
 * text-like: words, numbers, punctuation), zero.  The same seed gives the
 * same bytes on every machine.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/common.h"

static uint64_t s[2];

static uint64_t next(void) /* xorshift128+ */
{
	uint64_t x = s[0], y = s[1];

	s[0] = y;
	x ^= x << 23;
	s[1] = x ^ y ^ (x >> 17) ^ (y >> 26);
	return s[1] + y;
}

static const char *const words[] = {
	"the", "of", "and", "to", "in", "is", "that", "for", "it", "as",
	"was", "with", "be", "by", "on", "not", "he", "this", "are", "or",
	"his", "from", "at", "which", "but", "have", "an", "had", "they",
	"you", "were", "their", "one", "all", "we", "can", "her", "has",
	"there", "been", "if", "more", "when", "will", "would", "who", "so",
	"no", "folio", "cache", "budget", "reclaim", "window", "kernel",
	"memory", "page", "frame", "stream", "request", "reader", "grace",
	"period", "lockless", "charge", "counter", "group", "limit", "error",
	"value", "table", "index", "offset", "length", "buffer", "thread",
	"worker", "mount", "dataset", "compressed", "decompressed", "block",
};
#define NWORDS (sizeof(words) / sizeof(words[0]))

static size_t gen_text(char *buf, size_t cap)
{
	size_t n = 0;

	while (n + 64 < cap) {
		uint64_t r = next();
		int k = (int)(r % 23);

		if (k == 0) {
			/* numbers keep the ratio honest: logs are full of them */
			n += (size_t)snprintf(buf + n, cap - n, "%llu ",
					      (unsigned long long)(next() %
								   1000000));
		} else if (k == 1) {
			n += (size_t)snprintf(buf + n, cap - n, ".\n");
		} else {
			const char *w = words[(r >> 8) % NWORDS];
			size_t l = strlen(w);

			memcpy(buf + n, w, l);
			buf[n + l] = ' ';
			n += l + 1;
		}
	}
	return n;
}

int main(int argc, char **argv)
{
	uint64_t size, done = 0;
	static char buf[1 << 20];
	int kind;

	if (argc < 3 || argc > 4 || parse_size(argv[2], &size, false)) {
		fprintf(stderr, "usage: zfolio-gendata rand|z3|zero SIZE [SEED]\n");
		return 2;
	}
	if (!strcmp(argv[1], "rand"))
		kind = 0;
	else if (!strcmp(argv[1], "z3"))
		kind = 1;
	else if (!strcmp(argv[1], "zero"))
		kind = 2;
	else {
		fprintf(stderr, "zfolio-gendata: unknown kind %s\n", argv[1]);
		return 2;
	}
	s[0] = 0x9E3779B97F4A7C15ull ^ (argc == 4 ? strtoull(argv[3], 0, 0) : 1);
	s[1] = 0xD1B54A32D192ED03ull;
	for (int i = 0; i < 16; i++)
		next();
	while (done < size) {
		size_t n = sizeof(buf);

		if (kind == 0)
			for (size_t i = 0; i < n; i += 8) {
				uint64_t r = next();

				memcpy(buf + i, &r, 8);
			}
		else if (kind == 1)
			n = gen_text(buf, sizeof(buf));
		else
			memset(buf, 0, n);
		if (n > size - done)
			n = (size_t)(size - done);
		if (fwrite(buf, 1, n, stdout) != n)
			return 1;
		done += n;
	}
	return fflush(stdout) ? 1 : 0;
}
