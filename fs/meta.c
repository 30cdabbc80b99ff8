// SPDX-License-Identifier: MIT
/*
 * Metadata inside the budget: what the daemon keeps about the dataset
 * (frame indexes, the manifest's keys, inodes of a tree without a
 * manifest) is charged to the mount's root group, as the kernel charges
 * dentries and inodes to a memory cgroup as slab.  Objects are counted by
 * the byte and charged by the page: the pages charged always cover the
 * bytes in use (memory.stat's slab_reclaimable).  A charge that does not
 * fit makes reclaim run, as any demand charge; if it still does not fit
 * the pages are charged at a later charge that does (the bytes stay
 * counted): the budget is never passed.
 */
#include <string.h>

#include "internal.h"

/* Metadata may take this share of the budget (1/2^n) before idle data
 * files' indexes are given back: more keeps more files ready to read, less
 * leaves more for file data. */
#define META_SHARE_SHIFT 3

static pthread_mutex_t meta_lock = PTHREAD_MUTEX_INITIALIZER;

/* What a zfile's index and geometry take. */
long zfile_meta_bytes(const struct zfile *f)
{
	long n = (long)sizeof(*f) + (long)strlen(f->path) + 1 +
		 (long)zseek_index_bytes(&f->idx);

	if (f->starts)
		n += (long)(f->nslots + 1) * (long)sizeof(*f->starts);
	if (f->slot_frame)
		n += (long)f->nslots *
		     (long)(sizeof(*f->slot_frame) + sizeof(*f->slot_skip));
	if (f->parts)
		n += (long)f->nslots * (long)sizeof(*f->parts);
	if (f->raw_at)
		n += (long)f->nslots * (long)sizeof(*f->raw_at);
	return n + (long)sizeof(struct mapping) +
	       (long)(f->nslots ? f->nslots : 1) * (long)sizeof(void *);
}

/* bytes > 0: objects made; < 0: freed. */
void meta_charge(struct dataset *ds, long bytes)
{
	struct group *root = &ds->cache.budget.root;
	long total, want, have, limit;

	total = atomic_fetch_add(&ds->meta_bytes, bytes) + bytes;
	want = (long)pages_of_bytes(total > 0 ? (uint64_t)total : 0);
	if (want == atomic_load(&ds->meta_pages))
		return;
	pthread_mutex_lock(&meta_lock);
	have = atomic_load(&ds->meta_pages);
	total = atomic_load(&ds->meta_bytes);
	want = (long)pages_of_bytes(total > 0 ? (uint64_t)total : 0);
	if (want > have && charge_demand(root, (unsigned long)(want - have)))
		want = have; /* no room: covered at the next charge */
	if (want < have)
		uncharge(root, (unsigned long)(have - want));
	if (want != have) {
		stat_mod(root, STAT_SLAB, want - have);
		atomic_store(&ds->meta_pages, want);
	}
	pthread_mutex_unlock(&meta_lock);
	/* over its share: idle files' indexes go, down to half of it */
	limit = (counter_max(&root->mem) << ZF_PAGE_SHIFT) >> META_SHARE_SHIFT;
	if (bytes > 0 && total > limit) {
		if (ds->mf)
			manifest_shrink(ds, limit / 2);
		inodes_shrink(ds, limit / 2);
	}
}
