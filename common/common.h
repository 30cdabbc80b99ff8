/* SPDX-License-Identifier: MIT */
/*
 * common: what every zfolio program shares and that holds no state, the API
 * of common/.  The daemon, the engine and the tools all include it; it
 * includes nothing of theirs.
 *
 *  - sizes as users write them ("64M", "1.5G", "max");
 *  - deadlines for timed waits, and orderings to tell ThreadSanitizer;
 *  - bounded text building, and JSON strings and values on top of it;
 *  - the vocabulary of the control directory: the statistics, declared once
 *    in ZF_STAT_LIST, from which accounting/ builds its counters, memory.stat
 *    its lines, zfolioctl its descriptions and the man page its table; and
 *    the ioctl that writes a control file where write(2) cannot.
 */
#ifndef ZF_COMMON_H
#define ZF_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <time.h>

#define ZF_PAGE_SHIFT 12
#define ZF_PAGE_SIZE (1UL << ZF_PAGE_SHIFT)

static inline unsigned long pages_of_bytes(uint64_t bytes)
{
	return (unsigned long)((bytes + ZF_PAGE_SIZE - 1) >> ZF_PAGE_SHIFT);
}

/*
 * An ordering ThreadSanitizer cannot see (QSBR's grace periods, memory the
 * kernel maps again at an address another thread used): a release on a
 * token by one thread, then an acquire of it by another.  Nothing in other
 * builds.
 */
#if defined(__SANITIZE_THREAD__)
#define ZF_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ZF_TSAN 1
#endif
#endif
#ifdef ZF_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
static inline void tsan_release(void *token)
{
	__tsan_release(token);
}
static inline void tsan_acquire(void *token)
{
	__tsan_acquire(token);
}
#else
static inline void tsan_release(void *token)
{
	(void)token;
}
static inline void tsan_acquire(void *token)
{
	(void)token;
}
#endif

/* The time us microseconds from now on clock clk, for a timed wait. */
static inline struct timespec deadline_after_us(clockid_t clk, long us)
{
	struct timespec t;

	clock_gettime(clk, &t);
	t.tv_sec += us / 1000000;
	t.tv_nsec += us % 1000000 * 1000L;
	if (t.tv_nsec >= 1000000000L) {
		t.tv_sec++;
		t.tv_nsec -= 1000000000L;
	}
	return t;
}

/* size.c: "123", "64K", "1.5G", "2MiB", "max" (if allow_max: UINT64_MAX).
 * 0, -EINVAL, or -ERANGE above 2^60 bytes. */
int parse_size(const char *s, uint64_t *bytes, bool allow_max);
/* "1.5 GiB", "512 KiB", "17 B" */
void format_size(char *out, size_t len, uint64_t bytes);

/* text.c: appending to a fixed buffer, always NUL-terminated, never past
 * its end; off stops at len - 1 when the text does not fit. */
struct text {
	char *buf;
	size_t len, off;
};
void text_printf(struct text *t, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* A JSON string literal, quotes and escapes included. */
void text_json_string(struct text *t, const char *s);

/*
 * The statistics: name, kind and description, in memory.stat's order.
 * "gauge" items go up and down (sizes in pages, printed in bytes like the
 * kernel's memory.stat); "event" items only count up; "derived" items are
 * computed from others when read and never counted.  Kernel names where
 * one exists.
 */
#define ZF_STAT_LIST(X)                                                        \
	X(FILE, "file", gauge, "cached file data")                             \
	X(ACTIVE_FILE, "active_file", gauge, "cached data on active lists")    \
	X(INACTIVE_FILE, "inactive_file", gauge,                               \
	  "cached data on inactive lists")                                     \
	X(KERNEL_FILE, "kernel_file", gauge,                                   \
	  "data handed to the kernel page cache (cache=kernel), an upper "    \
	  "bound")                                                             \
	X(DEFERRED_FREE, "deferred_free_pages", gauge,                         \
	  "hot folio data waiting for a grace period")                         \
	X(SLAB, "slab_reclaimable", gauge,                                     \
	  "metadata: frame indexes, manifest keys, inodes")                    \
	X(DECODER_WINDOWS, "decoder_windows", gauge,                           \
	  "windows of stream decoders, for frames served in pieces")           \
	X(DECODER_CKPTS, "decoder_checkpoints", gauge,                         \
	  "stream decoders' states saved to go back to (in an eighth of the "  \
	  "budget)")                                                           \
	X(BUF_POOL, "buffer_pool", gauge,                                      \
	  "idle buffers kept for reuse, not charged (at most 16 MiB)")         \
	X(CCACHE, "compressed_cache", gauge,                                   \
	  "frames kept compressed, read from backing twice (ccache_pct)")     \
	X(PGFAULT, "pgfault", event, "read requests served")                   \
	X(KERNEL_FILLS, "kernel_fills", event,                                 \
	  "pages filled into the kernel page cache (cache=kernel)")           \
	X(KERNEL_PUSHES, "kernel_pushes", event,                               \
	  "of those, pages of files pushed ahead of a scan (push)")           \
	X(KERNEL_EVICTED, "kernel_evicted", event,                             \
	  "pages dropped from the kernel page cache by reclaim")              \
	X(KERNEL_HANDOVERS, "kernel_handovers", event,                         \
	  "folios that left the cache once the page cache held all of them")  \
	X(WORKINGSET_REFAULT, "workingset_refault", event,                     \
	  "kernel-tier pages filled again after reclaim dropped them")        \
	X(WORKINGSET_ACTIVATE, "workingset_activate", event,                   \
	  "refaulted pages found recent, so protected (active)")              \
	X(PGMAJFAULT, "pgmajfault", event, "reads that waited for backing I/O") \
	X(PGSCAN, "pgscan", event, "pages scanned by reclaim")                 \
	X(PGSTEAL, "pgsteal", event, "pages reclaimed")                        \
	X(PGACTIVATE, "pgactivate", event, "pages moved to active lists")      \
	X(PGDEACTIVATE, "pgdeactivate", event,                                 \
	  "pages moved to inactive lists")                                     \
	X(PGREFILL, "pgrefill", event, "active pages scanned for deactivation") \
	X(RECLAIM_PASSES, "reclaim_passes", event, "reclaim passes")           \
	X(RECLAIM_PASSES_RA, "reclaim_passes_ra", event,                       \
	  "reclaim passes for readahead windows")                              \
	X(CHARGE_FAIL_DEMAND, "charge_failures_demand", event,                 \
	  "demand charges that failed after reclaim")                          \
	X(CHARGE_FAIL_SPEC, "charge_failures_speculative", event,              \
	  "speculative charges that failed")                                   \
	X(BOUNCE_READS, "bounce_reads", event,                                 \
	  "reads served uncached from a bounce buffer")                        \
	X(PART_READS, "part_reads", event,                                     \
	  "random small reads of raw data served from its backing bytes")     \
	X(FOLIOS_READ, "folios_read", event, "folios filled from backing")     \
	X(SHARED_FILLS, "shared_fills", event,                                 \
	  "folios filled by decode threads beside the worker that read them") \
	X(BACKING_BYTES, "backing_bytes", event, "bytes read from backing")    \
	X(BACKING_DIRECT, "backing_direct_bytes", event,                       \
	  "of those, frames and plain folios read with O_DIRECT")              \
	X(DECOMP_BYTES, "decompressed_bytes", event,                           \
	  "bytes decoded into folios and uncached copies (not counting "       \
	  "decoder_skipped_bytes)")                                            \
	X(CACHE_HITS, "cache_hits", event, "folio lookups that hit")           \
	X(CCACHE_HITS, "ccache_hits", event,                                   \
	  "frames decoded from the compressed cache, not read from backing")  \
	X(CCACHE_STORES, "ccache_stores", event,                               \
	  "frames kept in the compressed cache")                               \
	X(CACHE_MISSES, "cache_misses", event, "folio lookups that missed")    \
	X(LOCKLESS_READS, "lockless_reads", event,                             \
	  "folio reads without a reference")                                   \
	X(HOT_FOLIOS, "hot_folios", event, "folios that became hot")           \
	X(DEFERRED_FREES, "deferred_frees", event,                             \
	  "folios freed after a grace period")                                 \
	X(EXPEDITED_GPS, "expedited_gps", event,                               \
	  "grace periods waited for by reclaim")                               \
	X(RA_WINDOWS, "ra_windows", event, "readahead windows")                \
	X(RA_PAGES, "ra_pages", event, "pages read ahead")                     \
	X(RA_EARLY_STOPS, "ra_early_stops", event,                             \
	  "readahead windows stopped for lack of budget")                      \
	X(RA_HITS, "ra_hits", event, "readahead pages read before eviction")   \
	X(RA_UNUSED_EVICTED, "ra_unused_evicted", event,                       \
	  "readahead pages evicted never read")                                \
	X(RA_UNREAD, "ra_unread", gauge,                                       \
	  "readahead pages cached and not read yet")                           \
	X(IO_ERRORS, "io_errors", event, "backing reads that failed")          \
	X(CORRUPT_FRAMES, "corrupt_frames", event,                             \
	  "frames that failed to decompress or verify")                        \
	X(SLOW_FRAMES, "single_frame_warnings", event,                         \
	  "frames without a size, measured by decoding: slow random reads")    \
	X(WINDOWS_REFUSED, "decoder_windows_refused", event,                   \
	  "reads failed (EIO): the budget cannot hold the frame's decoder "    \
	  "window")                                                            \
	X(DECODER_RESTARTS, "decoder_restarts", event,                         \
	  "reads in a big frame that decoded it again from its start")         \
	X(DECODER_SKIPPED, "decoder_skipped_bytes", event,                     \
	  "bytes of big frames decoded only to get past them")                 \
	X(DECODER_CKPT_RESTORES, "decoder_checkpoint_restores", event,         \
	  "reads in a big frame that went back to a saved state, not to the "  \
	  "start")                                                             \
	X(DECODERS_RECLAIMED, "decoders_reclaimed", event,                     \
	  "idle decoders freed by reclaim, windows and checkpoints, when "     \
	  "folios could not give enough")                                      \
	X(FILES_KEPT, "files_kept", event,                                     \
	  "files whose inode the kernel forgot, kept with their cached data")  \
	X(FILES_KEPT_REUSED, "files_kept_reused", event,                       \
	  "of those, taken up again when the kernel looked them up")          \
	X(HIGH_RECLAIMS, "high_reclaim_passes", event,                         \
	  "background reclaim passes for memory.high")                         \
	X(FAULT_FILLS, "fault_fills", event,                                   \
	  "page-cache fills (mmap faults), not read()")                        \
	X(READAROUND_WINDOWS, "readaround_windows", event,                     \
	  "read-around windows for faults")                                    \
	X(READAROUND_PAGES, "readaround_pages", event, "pages read around")    \
	X(READAROUND_USED, "readaround_used", event,                           \
	  "read-around pages used before eviction")                            \
	X(READAROUND_STOPPED, "readaround_stopped", event,                     \
	  "faults not read around: too many unused")                           \
	X(READAROUND_WINDOW_PAGES, "readaround_window_pages", derived,          \
	  "average pages per read-around window (readaround_pages / "          \
	  "readaround_windows)")

enum stat_kind { STAT_GAUGE, STAT_EVENT, STAT_DERIVED };

enum stat_item {
#define ZF_STAT_ENUM(id, name, kind, desc) STAT_##id,
	ZF_STAT_LIST(ZF_STAT_ENUM)
#undef ZF_STAT_ENUM
		NR_STATS
};

struct stat_desc {
	const char *name;
	enum stat_kind kind;
	const char *desc;
};
extern const struct stat_desc stat_descs[NR_STATS];
/* The item called name, or NULL. */
const struct stat_desc *stat_desc_find(const char *name);

/*
 * A control file written by an ioctl on its directory (a group's, or the
 * control directory itself), opened read-only: on a mount made read-only
 * (ro, the kernel refuses write opens) as on any other.  The value is what
 * write(2) would take; the reply is the error write(2) would give.
 */
#define ZF_CTL_NAME_MAX 64  /* a control file's name, NUL included */
#define ZF_CTL_VALUE_MAX 64 /* a value written to it, NUL included */
struct zf_ctl_write {
	char name[ZF_CTL_NAME_MAX];   /* "memory.max" */
	char value[ZF_CTL_VALUE_MAX]; /* "64M" */
};
#define ZF_IOC_CTL_WRITE _IOW('z', 1, struct zf_ctl_write)

#endif
