// SPDX-License-Identifier: MIT
/*
 * The session's custom I/O on /dev/fuse: what INIT grants beyond libfuse,
 * and where replies go.
 *
 * libfuse 3.14 knows two flags of INIT's flags2 that zfolio needs, so the
 * read callback notes the INIT request (its unique id, and which of them
 * the kernel offers: FUSE_INIT_EXT in flags, then flags2) and the writev
 * callback adds them to the reply to that request, written in one piece:
 *  - FUSE_DIRECT_IO_ALLOW_MMAP (bit 36), with cache=engine: files are
 *    opened direct_io, and the kernel refuses shared mappings of such files
 *    (ENODEV) without it (Linux 6.6+).  A kernel that does not offer it
 *    gets libfuse's reply, and MAP_SHARED fails there as it always did.
 *  - FUSE_OVER_IO_URING (bit 41), unless transport=dev: requests may then
 *    come over io_uring once every queue has an entry (furing.c).
 * Every other reply goes first to the io_uring entry that holds its
 * request (furing_reply), else to /dev/fuse untouched.
 *
 * libfuse 3.14 installs no fuse_kernel.h, so the few wire layouts used here
 * are spelled out as offsets.
 */
#include <errno.h>
#include <semaphore.h>
#include <time.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "internal.h"

/* struct fuse_in_header: len u32, opcode u32, unique u64, ... (40 bytes) */
#define IN_OPCODE 4
#define IN_UNIQUE 8
#define IN_HEADER 40
/* struct fuse_init_in after it: major, minor, max_readahead, flags, flags2 */
#define INIT_IN_FLAGS (IN_HEADER + 12)
#define INIT_IN_FLAGS2 (IN_HEADER + 16)
/* struct fuse_out_header: len u32, error i32, unique u64 (16 bytes) */
#define OUT_ERROR 4
#define OUT_UNIQUE 8
#define OUT_HEADER 16
/* struct fuse_init_out: flags at 12, max_write at 20, max_pages (u16) at
 * 28, flags2 at 32 */
#define INIT_OUT_FLAGS (OUT_HEADER + 12)
#define INIT_OUT_MAX_WRITE (OUT_HEADER + 20)
#define INIT_OUT_MAX_PAGES (OUT_HEADER + 28)
#define INIT_OUT_FLAGS2 (OUT_HEADER + 32)
#define INIT_OUT_SIZE (OUT_HEADER + 64)

#define FUSE_INIT_OPCODE 26
#define FUSE_INIT_EXT (1u << 30)
#define FUSE_DIRECT_IO_ALLOW_MMAP_BIT2 (1u << 4) /* bit 36: flags2 bit 4 */
#define FUSE_OVER_IO_URING_BIT2 (1u << 9)        /* bit 41 */

static _Atomic uint64_t init_unique; /* 0: no INIT seen, or answered */
static _Atomic uint32_t offered;     /* the flags2 bits the kernel offers */
static uint32_t wanted;              /* the flags2 bits to add */
static sem_t init_done;
static atomic_bool uring_granted;

static uint32_t get32(const char *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return v;
}

static ssize_t io_read(int fd, void *buf, size_t len, void *userdata)
{
	ssize_t n = read(fd, buf, len);
	const char *p = buf;

	(void)userdata;
	if (n >= INIT_IN_FLAGS2 + 4 && get32(p + IN_OPCODE) == FUSE_INIT_OPCODE) {
		uint64_t unique;
		bool ext = get32(p + INIT_IN_FLAGS) & FUSE_INIT_EXT;

		memcpy(&unique, p + IN_UNIQUE, 8);
		atomic_store(&offered, ext ? get32(p + INIT_IN_FLAGS2) : 0);
		atomic_store(&init_unique, unique);
	}
	return n;
}

/* The INIT reply, with the flags2 bits the kernel offers and zfolio wants. */
static ssize_t init_reply(int fd, struct iovec *iov, int count, size_t total)
{
	char reply[INIT_OUT_SIZE];
	uint32_t flags, flags2, add = wanted & atomic_load(&offered);
	uint32_t max_write;
	uint16_t max_pages;
	ssize_t n;

	if (total != sizeof(reply)) {
		n = writev(fd, iov, count);
		sem_post(&init_done);
		return n;
	}
	total = 0;
	for (int i = 0; i < count; i++) {
		memcpy(reply + total, iov[i].iov_base, iov[i].iov_len);
		total += iov[i].iov_len;
	}
	memcpy(&flags, reply + INIT_OUT_FLAGS, 4);
	memcpy(&flags2, reply + INIT_OUT_FLAGS2, 4);
	memcpy(&max_write, reply + INIT_OUT_MAX_WRITE, 4);
	memcpy(&max_pages, reply + INIT_OUT_MAX_PAGES, 2);
	if (add) {
		flags |= FUSE_INIT_EXT;
		flags2 |= add;
	}
	memcpy(reply + INIT_OUT_FLAGS, &flags, 4);
	memcpy(reply + INIT_OUT_FLAGS2, &flags2, 4);
	furing_set_payload(max_write, max_pages);
	n = write(fd, reply, sizeof(reply));
	/* the kernel has taken the reply: entries may register from now on */
	atomic_store(&uring_granted,
		     n == (ssize_t)sizeof(reply) && (add & FUSE_OVER_IO_URING_BIT2));
	sem_post(&init_done);
	return n;
}

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	uint64_t want = atomic_load(&init_unique), unique;
	size_t total = 0;
	int32_t error;
	ssize_t n;

	(void)userdata;
	n = furing_reply(iov, count);
	if (n != -ENOENT)
		return n;
	if (!want || count < 1 || iov[0].iov_len < OUT_HEADER)
		return writev(fd, iov, count);
	memcpy(&unique, (char *)iov[0].iov_base + OUT_UNIQUE, 8);
	memcpy(&error, (char *)iov[0].iov_base + OUT_ERROR, 4);
	if (unique != want)
		return writev(fd, iov, count);
	atomic_store(&init_unique, 0);
	for (int i = 0; i < count; i++)
		total += iov[i].iov_len;
	if (error)
		total = 0; /* as it is */
	return init_reply(fd, iov, count, total);
}

static const struct fuse_custom_io init_io = {
	.read = io_read,
	.writev = io_writev,
};

/*
 * After fuse_session_mount(): watch INIT on the session's fd, asking for
 * shared mappings of direct_io files (allow_mmap) and FUSE over io_uring
 * (uring) where the kernel offers them.
 */
int initio_install(struct fuse_session *se, bool allow_mmap, bool uring)
{
	wanted = (allow_mmap ? FUSE_DIRECT_IO_ALLOW_MMAP_BIT2 : 0) |
		 (uring ? FUSE_OVER_IO_URING_BIT2 : 0);
	sem_init(&init_done, 0, 0);
	return fuse_session_custom_io(se, &init_io, fuse_session_fd(se));
}

/*
 * Wait up to ms for INIT to be answered: 1 if it was and the kernel takes
 * requests over io_uring, 0 if it was without, -ETIMEDOUT (or -EINTR).
 */
int initio_wait(long ms)
{
	int r = sem_wait_ms(&init_done, ms);

	if (r)
		return r;
	sem_post(&init_done); /* answered once: stays answered */
	return atomic_load(&uring_granted);
}
