// SPDX-License-Identifier: MIT
/*
 * Granting FUSE_DIRECT_IO_ALLOW_MMAP at INIT.
 *
 * Files are opened direct_io (cache=engine), and the kernel refuses shared
 * mappings of such files (ENODEV) unless the daemon's INIT reply carries
 * FUSE_DIRECT_IO_ALLOW_MMAP (Linux 6.6+).  libfuse 3.14 has no capability
 * bit for it, so zfolio installs custom I/O on the session's /dev/fuse fd:
 * the read callback notes the INIT request (its unique id, and whether the
 * kernel offers the flag: FUSE_INIT_EXT in flags, bit 4 of flags2); the
 * writev callback sets bit 4 of flags2 in the reply to that request and
 * writes it in one piece.  Everything else passes through untouched.  A
 * kernel that does not offer the flag gets libfuse's reply as it is, and
 * MAP_SHARED fails there as it always did; MAP_PRIVATE works either way.
 *
 * libfuse 3.14 installs no fuse_kernel.h, so the few wire layouts used here
 * are spelled out as offsets.
 */
#include <errno.h>
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
/* struct fuse_init_out: flags2 at byte 32, max_readahead at 8 */
#define INIT_OUT_FLAGS2 (OUT_HEADER + 32)
#define INIT_OUT_SIZE (OUT_HEADER + 64)

#define FUSE_INIT_OPCODE 26
#define FUSE_INIT_EXT (1u << 30)
#define FUSE_DIRECT_IO_ALLOW_MMAP_BIT2 (1u << 4) /* bit 36: flags2 bit 4 */

static _Atomic uint64_t init_unique; /* 0: no INIT seen, or answered */
static atomic_int offered = -1;      /* the kernel offers the flag */

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
		atomic_store(&offered, ext && (get32(p + INIT_IN_FLAGS2) &
					       FUSE_DIRECT_IO_ALLOW_MMAP_BIT2));
		atomic_store(&init_unique, unique);
	}
	return n;
}

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	uint64_t want = atomic_load(&init_unique), unique;
	char reply[INIT_OUT_SIZE];
	size_t total = 0;
	int32_t error;
	uint32_t flags2;

	(void)userdata;
	if (!want || count < 1 || iov[0].iov_len < OUT_HEADER)
		return writev(fd, iov, count);
	memcpy(&unique, (char *)iov[0].iov_base + OUT_UNIQUE, 8);
	memcpy(&error, (char *)iov[0].iov_base + OUT_ERROR, 4);
	if (unique != want)
		return writev(fd, iov, count);
	atomic_store(&init_unique, 0);
	for (int i = 0; i < count; i++)
		total += iov[i].iov_len;
	if (error || total != sizeof(reply) || atomic_load(&offered) != 1)
		return writev(fd, iov, count);
	total = 0;
	for (int i = 0; i < count; i++) {
		memcpy(reply + total, iov[i].iov_base, iov[i].iov_len);
		total += iov[i].iov_len;
	}
	memcpy(&flags2, reply + INIT_OUT_FLAGS2, 4);
	flags2 |= FUSE_DIRECT_IO_ALLOW_MMAP_BIT2;
	memcpy(reply + INIT_OUT_FLAGS2, &flags2, 4);
	return write(fd, reply, sizeof(reply));
}

static const struct fuse_custom_io init_io = {
	.read = io_read,
	.writev = io_writev,
};

/* After fuse_session_mount(): watch INIT on the session's fd. */
int initio_install(struct fuse_session *se)
{
	return fuse_session_custom_io(se, &init_io, fuse_session_fd(se));
}
