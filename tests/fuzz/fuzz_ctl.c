// SPDX-License-Identifier: MIT
/*
 * Fuzz the parsers of the writable control files: memory.max, memory.high,
 * memory.reclaim, memory.peak, and the size parser behind mount options.
 * [u8 file][bytes written].  Each write either changes its group or is
 * EINVAL (or EBUSY/EAGAIN from reclaim) with nothing changed.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../../fs/internal.h"

static unsigned long no_shrink(struct group *g, unsigned long nr,
			       unsigned long *scanned, void *priv)
{
	(void)g, (void)nr, (void)priv;
	*scanned += 0;
	return 0;
}

static const struct budget_ops ops = {.shrink = no_shrink};
static struct budget b;
static struct znode n;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const int writable[] = {1, 2, 3, 4}; /* peak max high reclaim */
	uint64_t v;
	char s[256];

	if (!b.by_id) {
		struct budget_config cfg = {.max_pages = 1 << 16,
					    .high_pages = COUNTER_MAX,
					    .group_max_pages = COUNTER_MAX,
					    .group_high_pages = COUNTER_MAX};

		if (budget_init(&b, &cfg, &ops, NULL))
			abort();
		n.kind = ZN_CTL_FILE;
		n.group = &b.root;
	}
	if (size < 1)
		return 0;
	n.ctl_id = writable[data[0] % 4];
	long before = counter_max(&b.root.mem);
	int r = ctl_write(NULL, &n, (const char *)data + 1, size - 1);
	bool parsed = false;

	/* the size parser, as options and control files use it */
	if (size - 1 < sizeof(s)) {
		memcpy(s, data + 1, size - 1);
		s[size - 1] = '\0';
		(void)parse_size(s, &v, false);
		parsed = strlen(s) == size - 1 && parse_size(s, &v, true) == 0;
	}
	if (r == -22 /* EINVAL */ && counter_max(&b.root.mem) != before)
		abort(); /* a refused write changed the limit */
	if (r == 0 && n.ctl_id == 2 && parsed) {
		/* memory.max took the value written, in pages, or max */
		long want = v == UINT64_MAX || v >> ZF_PAGE_SHIFT > COUNTER_MAX
				    ? COUNTER_MAX
				    : (long)(v >> ZF_PAGE_SHIFT);

		if (counter_max(&b.root.mem) != want)
			abort();
	}
	group_set_max(&b.root, 1 << 16);
	group_set_high(&b.root, COUNTER_MAX);
	return 0;
}
