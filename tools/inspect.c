// SPDX-License-Identifier: MIT
/*
 * zfolioctl inspect: a look inside a .zst file.  It needs no mount: it
 * indexes the file with the format library, as the daemon does when it
 * opens it, and prints what the index holds, as text or as JSON.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/common.h"
#include "../format/format.h"
#include "zfolioctl.h"

static const char *kind_name(enum zseek_kind kind)
{
	switch (kind) {
	case ZSEEK_SEEKABLE:
		return "seekable";
	case ZSEEK_WALKED:
		return "walked";
	default:
		return "raw";
	}
}

/* What inspect prints, beyond the index. */
struct inspected {
	const char *file;
	struct zseek_index idx;
	bool has_table;
	uint64_t table_off, table_size; /* the seek table's skippable frame */
	double ratio;			/* content over file size */
};

/*
 * Where the seek table's skippable frame starts.  The index keeps only the
 * frames that hold content, so the table's own count comes from the footer
 * the parser has already checked.
 */
static void find_seek_table(int fd, struct inspected *in)
{
	uint8_t foot[ZSEEK_FOOTER_SIZE];
	uint64_t count, entry = in->idx.has_checksum ? 12 : 8;

	if (zseek_pread_fd(&fd, foot, sizeof(foot),
			   in->idx.file_size - sizeof(foot)) != sizeof(foot))
		die("%s: cannot read the seek table's footer", in->file);
	count = (uint64_t)foot[0] | (uint64_t)foot[1] << 8 |
		(uint64_t)foot[2] << 16 | (uint64_t)foot[3] << 24;
	in->has_table = true;
	in->table_size = 8 + count * entry + ZSEEK_FOOTER_SIZE;
	in->table_off = in->idx.file_size - in->table_size;
}

/* --max-window, as zfolio's max_window=: 1M to 2G. */
static void set_window_max(const char *arg)
{
	uint64_t bytes;

	if (parse_size(arg, &bytes, false) || bytes < (1u << 20) ||
	    bytes > ZSEEK_LARGEST_WINDOW)
		die("bad --max-window '%s' (a size from 1M to 2G)", arg);
	zseek_set_window_max(bytes);
}

/* Index the file as the daemon would; exits with the parser's message. */
static void inspect_file(const char *file, struct inspected *in)
{
	char err[256] = "";
	struct stat st;
	int fd = open(file, O_RDONLY | O_CLOEXEC);

	if (fd < 0 || fstat(fd, &st))
		die("%s: %s", file, strerror(errno));
	if (!S_ISREG(st.st_mode))
		die("%s: not a regular file", file);
	memset(in, 0, sizeof(*in));
	in->file = file;
	if (opt.max_window)
		set_window_max(opt.max_window);
	if (zseek_dict_load(opt.dict, err, sizeof(err)))
		die("--dict %s", err);
	if (zseek_index_build(zseek_pread_fd, &fd, (uint64_t)st.st_size, true,
			      &in->idx, err, sizeof(err)))
		die("%s: %s", file, *err ? err : "cannot index it");
	if (in->idx.kind == ZSEEK_SEEKABLE)
		find_seek_table(fd, in);
	if (in->idx.file_size)
		in->ratio = (double)in->idx.content_size /
			    (double)in->idx.file_size;
	close(fd);
}

static void print_inspected(const struct inspected *in)
{
	const struct zseek_index *idx = &in->idx;
	char content[32], file[32];

	format_size(content, sizeof(content), idx->content_size);
	format_size(file, sizeof(file), idx->file_size);
	printf("%s: %s%s, %u frames, ", in->file, kind_name(idx->kind),
	       idx->kind == ZSEEK_WALKED ? " (no seek table)" : "",
	       idx->nframes);
	if (idx->has_checksum)
		printf("checksums in the seek table\n");
	else if (idx->frames_checked && idx->frames_checked == idx->nframes)
		printf("zstd's checksum in every frame\n");
	else if (idx->frames_checked)
		printf("zstd's checksum in %u of them\n", idx->frames_checked);
	else
		printf("no checksums\n");
	printf("  content      %12llu bytes (%s)\n",
	       (unsigned long long)idx->content_size, content);
	printf("  compressed   %12llu bytes (%s), ratio %.2f\n",
	       (unsigned long long)idx->file_size, file, in->ratio);
	if (in->has_table)
		printf("  seek table   %12llu bytes at %llu\n",
		       (unsigned long long)in->table_size,
		       (unsigned long long)in->table_off);
	if (idx->nunsized)
		printf("  unsized      %12u frames, measured by decoding\n",
		       idx->nunsized);
	if (!idx->nframes)
		return;
	printf("\n  %8s %14s %10s %14s %10s  %s\n", "frame", "c_off", "c_size",
	       "d_off", "d_size", "checksum");
	for (uint32_t i = 0; i < idx->nframes; i++) {
		const struct zseek_frame frame_v = zseek_frame_at(idx, i);
		const struct zseek_frame *fr = &frame_v;

		printf("  %8u %14llu %10llu %14llu %10llu  ", i,
		       (unsigned long long)fr->c_off,
		       (unsigned long long)fr->c_size,
		       (unsigned long long)fr->d_off,
		       (unsigned long long)fr->d_size);
		if (idx->has_checksum)
			printf("%08x\n", fr->checksum);
		else
			printf("-\n");
	}
}

/* Out with what t holds, then empty it; a cut would be a bug of ours. */
static void text_flush(struct text *t)
{
	if (t->len && t->off >= t->len - 1)
		die("internal error: the JSON text did not fit");
	fputs(t->buf, stdout);
	t->off = 0;
	t->buf[0] = '\0';
}

static void json_head(struct text *t, const struct inspected *in)
{
	const struct zseek_index *idx = &in->idx;

	text_printf(t, "{\"file\":");
	text_json_string(t, in->file);
	text_printf(t, ",\"kind\":\"%s\",\"checksums\":%s,\"frames\":%u",
		    kind_name(idx->kind),
		    idx->has_checksum ? "true" : "false", idx->nframes);
	text_printf(t, ",\"content_size\":%llu,\"file_size\":%llu",
		    (unsigned long long)idx->content_size,
		    (unsigned long long)idx->file_size);
	text_printf(t, ",\"frames_checked\":%u", idx->frames_checked);
	text_printf(t, ",\"ratio\":%.4f,\"unsized_frames\":%u", in->ratio,
		    idx->nunsized);
	if (in->has_table)
		text_printf(t, ",\"table_offset\":%llu,\"table_size\":%llu",
			    (unsigned long long)in->table_off,
			    (unsigned long long)in->table_size);
	else
		text_printf(t, ",\"table_offset\":null,\"table_size\":null");
	text_printf(t, ",\"frame_list\":[");
}

static void json_frame(struct text *t, const struct zseek_index *idx,
		       uint32_t i)
{
	const struct zseek_frame frame_v = zseek_frame_at(idx, i);
	const struct zseek_frame *fr = &frame_v;

	text_printf(t, "%s{\"c_off\":%llu,\"c_size\":%llu", i ? "," : "",
		    (unsigned long long)fr->c_off,
		    (unsigned long long)fr->c_size);
	text_printf(t, ",\"d_off\":%llu,\"d_size\":%llu",
		    (unsigned long long)fr->d_off,
		    (unsigned long long)fr->d_size);
	if (idx->has_checksum)
		text_printf(t, ",\"checksum\":%u}", fr->checksum);
	else
		text_printf(t, ",\"checksum\":null}");
}

/* One object; the head sized for the name, then frame by frame. */
static void print_inspected_json(const struct inspected *in)
{
	size_t len = 6 * strlen(in->file) + 512;
	struct text t = {.buf = malloc(len), .len = len};

	if (!t.buf)
		die("out of memory");
	t.buf[0] = '\0';
	json_head(&t, in);
	text_flush(&t);
	for (uint32_t i = 0; i < in->idx.nframes; i++) {
		json_frame(&t, &in->idx, i);
		text_flush(&t);
	}
	text_printf(&t, "]}\n");
	text_flush(&t);
	free(t.buf);
}

int cmd_inspect(char **args)
{
	struct inspected in;

	inspect_file(args[0], &in);
	if (opt.json)
		print_inspected_json(&in);
	else
		print_inspected(&in);
	zseek_index_free(&in.idx);
	if (fflush(stdout) || ferror(stdout))
		die("stdout: %s", strerror(errno));
	return 0;
}
