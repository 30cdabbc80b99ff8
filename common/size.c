// SPDX-License-Identifier: MIT
/*
 * Sizes as users write them: a number with an optional binary suffix (K, M,
 * G, T; "KiB" and "KB" mean the same), or "max" where a limit may be none.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* Nothing above 2^60 bytes is a real size: a named bound, not overflow. */
#define SIZE_MAX_BYTES (1ULL << 60)

static double suffix_multiplier(const char **end)
{
	static const char units[] = "KMGT";
	const char *u = **end ? strchr(units, **end & ~0x20) : NULL;
	double mult = 1;

	if (!u)
		return 1;
	for (const char *i = units; i <= u; i++)
		mult *= 1024.0;
	(*end)++;
	if (**end == 'i' || **end == 'I')
		(*end)++;
	if (**end == 'b' || **end == 'B')
		(*end)++;
	return mult;
}

static bool only_space(const char *s)
{
	while (*s == ' ' || *s == '\n' || *s == '\t')
		s++;
	return *s == '\0';
}

int parse_size(const char *s, uint64_t *bytes, bool allow_max)
{
	const char *end;
	char *num_end;
	double v;

	if (!s)
		return -EINVAL;
	while (*s == ' ' || *s == '\t')
		s++;
	if (allow_max && strncmp(s, "max", 3) == 0 && only_space(s + 3)) {
		*bytes = UINT64_MAX;
		return 0;
	}
	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtod(s, &num_end);
	if (errno || num_end == s || v < 0)
		return -EINVAL;
	end = num_end;
	v *= suffix_multiplier(&end);
	if (!only_space(end))
		return -EINVAL;
	if (v > (double)SIZE_MAX_BYTES)
		return -ERANGE;
	*bytes = (uint64_t)v;
	return 0;
}

void format_size(char *out, size_t len, uint64_t bytes)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB",
					    "PiB"};
	double v = (double)bytes;
	int u = 0;

	while (v >= 1024 && u < 5) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(out, len, "%llu B", (unsigned long long)bytes);
	else
		snprintf(out, len, "%.1f %s", v, units[u]);
}
