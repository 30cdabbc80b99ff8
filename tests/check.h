/* SPDX-License-Identifier: MIT */
/* A few assertions for the unit tests: report where, keep going, count. */
#ifndef ZF_TESTS_CHECK_H
#define ZF_TESTS_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int check_failures;

#define CHECK(cond)                                                            \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, \
				__LINE__, #cond);                              \
			check_failures++;                                      \
		}                                                              \
	} while (0)

#define CHECK_EQ(a, b)                                                         \
	do {                                                                   \
		long long _a = (long long)(a), _b = (long long)(b);            \
		if (_a != _b) {                                                \
			fprintf(stderr, "%s:%d: %s == %lld, expected %s == "  \
					"%lld\n",                              \
				__FILE__, __LINE__, #a, _a, #b, _b);           \
			check_failures++;                                      \
		}                                                              \
	} while (0)

#define RUN(test)                                                              \
	do {                                                                   \
		int _before = check_failures;                                  \
		test();                                                        \
		fprintf(stderr, "%s %s\n",                                     \
			check_failures == _before ? "ok  " : "FAIL", #test);   \
	} while (0)

static inline int check_done(void)
{
	if (check_failures)
		fprintf(stderr, "%d check(s) failed\n", check_failures);
	return check_failures ? 1 : 0;
}

/* xorshift: deterministic test randomness */
static inline unsigned long long test_rand(unsigned long long *s)
{
	unsigned long long x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

#endif
