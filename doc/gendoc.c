// SPDX-License-Identifier: MIT
/*
 * zfolio-gendoc check|update FILE...: the generated sections of the man
 * pages and the README, from the tables the programs themselves use.
 *
 * A section starts with a marker line naming it and ends with an end
 * marker; everything between is generated:
 *   troff:    .\" generated: options        ...   .\" end generated
 *   markdown: <!-- generated: options -->    ...   <!-- end generated -->
 * Sections: options (opt_table, what zfolio -h prints), ctl-files
 * (ctl_files, the control directory) and stats (ZF_STAT_LIST, memory.stat).
 * "check" exits 1 naming each section that differs (a test runs it, so the
 * documents cannot drift); "update" rewrites them in place.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../fs/internal.h"

enum doc_format { TROFF, MARKDOWN };

/* A growing output buffer. */
struct out {
	char *s;
	size_t len, cap;
};

static void put(struct out *o, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void put(struct out *o, const char *fmt, ...)
{
	va_list ap;
	int n;

	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(o->s + o->len, o->cap - o->len, fmt, ap);
		va_end(ap);
		if (n >= 0 && o->len + (size_t)n < o->cap)
			break;
		o->cap = o->cap ? o->cap * 2 : 4096;
		o->s = realloc(o->s, o->cap);
		if (!o->s) {
			perror("zfolio-gendoc");
			exit(2);
		}
	}
	o->len += (size_t)n;
}

/* Text for troff: backslashes doubled, hyphens as minus signs. */
static void put_troff(struct out *o, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\')
			put(o, "\\\\");
		else if (*s == '-')
			put(o, "\\-");
		else
			put(o, "%c", *s);
	}
}

/* Text for a markdown table cell: pipes escaped. */
static void put_md(struct out *o, const char *s)
{
	for (; *s; s++) {
		if (*s == '|')
			put(o, "\\|");
		else
			put(o, "%c", *s);
	}
}

static void gen_options(struct out *o, enum doc_format f)
{
	char hint[128];

	if (f == MARKDOWN)
		put(o, "| option | default | |\n|---|---|---|\n");
	for (size_t i = 0; i < nr_opts; i++) {
		const struct opt_desc *d = &opt_table[i];

		opt_value_hint(d, hint, sizeof(hint));
		if (f == MARKDOWN) {
			put(o, "| `%s=", d->name);
			put_md(o, hint);
			put(o, "` | %s | ", d->def);
			put_md(o, d->help);
			put(o, " |\n");
			continue;
		}
		put(o, ".TP\n.BI %s= ", d->name);
		put_troff(o, hint);
		put(o, "\n");
		put_troff(o, d->help);
		put(o, " (default: ");
		put_troff(o, d->def);
		put(o, ").\n");
	}
}

static void gen_ctl_files(struct out *o, enum doc_format f)
{
	if (f == MARKDOWN)
		put(o, "| file | |\n|---|---|\n");
	for (int i = 0; i < nr_ctl_files; i++) {
		const struct ctl_file *c = &ctl_files[i];
		const char *rw = c->read && c->write ? "read, write"
				 : c->write	     ? "write only"
						     : "read only";

		if (f == MARKDOWN) {
			put(o, "| `%s` | %s (%s) |\n", c->name, c->help, rw);
			continue;
		}
		put(o, ".TP\n.B ");
		put_troff(o, c->name);
		put(o, "\n");
		put_troff(o, c->help);
		put(o, " (%s).\n", rw);
	}
}

static void gen_stats(struct out *o, enum doc_format f)
{
	static const char *const kinds[] = {
		[STAT_GAUGE] = "bytes, now",
		[STAT_EVENT] = "count",
		[STAT_DERIVED] = "computed when read",
	};

	if (f == MARKDOWN)
		put(o, "| stat | | |\n|---|---|---|\n");
	for (int i = 0; i < NR_STATS; i++) {
		const struct stat_desc *d = &stat_descs[i];

		if (f == MARKDOWN) {
			put(o, "| `%s` | %s | ", d->name, kinds[d->kind]);
			put_md(o, d->desc);
			put(o, " |\n");
			continue;
		}
		put(o, ".TP\n.B ");
		put_troff(o, d->name);
		put(o, "\n");
		put_troff(o, d->desc);
		put(o, " (%s).\n", kinds[d->kind]);
	}
}

static bool generate(struct out *o, const char *section, enum doc_format f)
{
	if (strcmp(section, "options") == 0)
		gen_options(o, f);
	else if (strcmp(section, "ctl-files") == 0)
		gen_ctl_files(o, f);
	else if (strcmp(section, "stats") == 0)
		gen_stats(o, f);
	else
		return false;
	return true;
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	struct out o = {0};
	char buf[4096];
	size_t n;

	if (!f)
		return NULL;
	put(&o, "%s", "");
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		put(&o, "%.*s", (int)n, buf);
	fclose(f);
	return o.s;
}

/* The section a marker line starts ("options"), or NULL. */
static bool marker(const char *line, size_t len, enum doc_format f,
		   char *section, size_t seclen)
{
	const char *open = f == MARKDOWN ? "<!-- generated: " : ".\\\" generated: ";
	size_t n = strlen(open), k = 0;

	if (len < n || strncmp(line, open, n))
		return false;
	for (line += n, len -= n; len && *line != ' ' && *line != '\n' &&
				  k + 1 < seclen;
	     line++, len--)
		section[k++] = *line;
	section[k] = '\0';
	return k > 0;
}

static bool end_marker(const char *line, enum doc_format f)
{
	const char *end = f == MARKDOWN ? "<!-- end generated -->"
					: ".\\\" end generated";

	return strncmp(line, end, strlen(end)) == 0;
}

/* The document with every section regenerated; *bad: a section unknown
 * or not closed. */
static char *regenerate(const char *path, const char *text, bool *bad)
{
	enum doc_format f = strstr(path, ".md") ? MARKDOWN : TROFF;
	struct out o = {0};
	const char *p = text;
	char section[64];

	put(&o, "%s", "");
	while (*p) {
		const char *nl = strchr(p, '\n');
		size_t len = nl ? (size_t)(nl - p + 1) : strlen(p);

		put(&o, "%.*s", (int)len, p);
		p += len;
		if (!marker(p - len, len, f, section, sizeof(section)))
			continue;
		if (!generate(&o, section, f)) {
			fprintf(stderr, "%s: unknown section '%s'\n", path,
				section);
			*bad = true;
		}
		while (*p && !end_marker(p, f)) /* skip the old text */
			p += strcspn(p, "\n") + (strchr(p, '\n') ? 1 : 0);
		if (!*p) {
			fprintf(stderr, "%s: section '%s' has no end marker\n",
				path, section);
			*bad = true;
		}
	}
	return o.s;
}

static int update(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f || fputs(text, f) == EOF || fclose(f)) {
		perror(path);
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	bool fix = argc > 1 && strcmp(argv[1], "update") == 0;
	int status = 0;

	if (argc < 3 || (!fix && strcmp(argv[1], "check"))) {
		fprintf(stderr, "usage: zfolio-gendoc check|update FILE...\n");
		return 2;
	}
	for (int i = 2; i < argc; i++) {
		char *text = slurp(argv[i]), *want;
		bool bad = false;

		if (!text) {
			perror(argv[i]);
			return 2;
		}
		want = regenerate(argv[i], text, &bad);
		if (bad) {
			status = 1;
		} else if (strcmp(text, want) && fix) {
			status |= update(argv[i], want);
		} else if (strcmp(text, want)) {
			fprintf(stderr,
				"%s: generated sections differ from the "
				"tables in the code; run zfolio-gendoc update "
				"%s\n",
				argv[i], argv[i]);
			status = 1;
		}
		free(text);
		free(want);
	}
	return status;
}
