// SPDX-License-Identifier: MIT
/*
 * Bounded text: control files, JSON and tool output are built into fixed
 * buffers.  Nothing is ever written past the end and the text is always
 * NUL-terminated; what does not fit is cut, and the cut is visible as
 * off == len - 1.  Also the statistics' descriptions, from ZF_STAT_LIST.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common.h"

void text_printf(struct text *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!t->len || t->off >= t->len - 1)
		return;
	va_start(ap, fmt);
	n = vsnprintf(t->buf + t->off, t->len - t->off, fmt, ap);
	va_end(ap);
	if (n > 0)
		t->off = t->off + (size_t)n < t->len ? t->off + (size_t)n
						     : t->len - 1;
}

void text_json_string(struct text *t, const char *s)
{
	text_printf(t, "\"");
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			text_printf(t, "\\%c", c);
		else if (c < 0x20)
			text_printf(t, "\\u%04x", c);
		else
			text_printf(t, "%c", c);
	}
	text_printf(t, "\"");
}

const struct stat_desc stat_descs[NR_STATS] = {
#define ZF_STAT_DESC(id, n, k, d) [STAT_##id] = {n, STAT_##k, d},
#define STAT_gauge STAT_GAUGE
#define STAT_event STAT_EVENT
#define STAT_derived STAT_DERIVED
	ZF_STAT_LIST(ZF_STAT_DESC)
#undef ZF_STAT_DESC
};

const struct stat_desc *stat_desc_find(const char *name)
{
	for (int i = 0; i < NR_STATS; i++)
		if (strcmp(stat_descs[i].name, name) == 0)
			return &stat_descs[i];
	return NULL;
}
