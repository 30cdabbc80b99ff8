// SPDX-License-Identifier: MIT
/*
 * The watchdog: a small process that aborts the mount's FUSE connection
 * if the daemon dies without unmounting.
 *
 * A killed daemon's connection is aborted by the kernel when /dev/fuse is
 * closed, that is when its last thread is gone, and readers then get
 * ECONNABORTED.  But a thread may be in the kernel, waiting
 * uninterruptibly on a page that a fill has locked: dropping or storing
 * pages (FUSE_NOTIFY_INVAL_INODE, FUSE_NOTIFY_STORE) locks them.  The fill
 * waits for a worker, and the workers died with the rest, so that thread
 * never returns, the fd is never closed, and the daemon, the readers and
 * the mount hang until `umount -f`.  zfolio keeps to rules that avoid it
 * (cache/ktier.c, fs/push.c), with one case left that it cannot see: the
 * kernel filling again pages it dropped on its own.
 *
 * So, before its threads start, the daemon forks this process.  It keeps
 * no fd of the daemon's but one end of a pipe, and asks the kernel for a
 * signal when the daemon's main thread exits (PR_SET_PDEATHSIG).  A daemon
 * that stops as it should says so on the pipe first, and the watchdog
 * leaves.  Otherwise, when the main thread has gone: if the whole process
 * is gone in WATCHDOG_GRACE_MS (the pipe reads end of file), the kernel
 * has aborted the connection itself; if not, a thread is stuck, and the
 * watchdog writes the connection's `abort` in the FUSE control filesystem
 * (/sys/fs/fuse/connections/N, mounting it in a mount namespace of its
 * own when it is not mounted), as `umount -f` would, but leaving the
 * mount in place.  The fill ends with ECONNABORTED, the stuck thread
 * returns, and the daemon exits; readers see what they see after any
 * kill: ECONNABORTED, then ENOTCONN until the mount is unmounted.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"

/* How long a dying daemon has to exit on its own before its connection is
 * aborted: exiting closes /dev/fuse, and that aborts it as well. */
#define WATCHDOG_GRACE_MS 500
#define FUSECTL_DIR "/sys/fs/fuse/connections"
/* What a daemon that stops cleanly writes to the pipe. */
#define WATCHDOG_BYE 'q'

/* mountinfo's escapes (\040 for a space, \011, \012, \134), undone in
 * place. */
static bool is_octal(char c)
{
	return c >= '0' && c <= '7';
}

static void mountinfo_unescape(char *s)
{
	char *out = s;

	for (; *s; s++, out++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' &&
		    is_octal(s[2]) && is_octal(s[3])) {
			*out = (char)((s[1] - '0') << 6 | (s[2] - '0') << 3 |
				      (s[3] - '0'));
			s += 3;
		} else {
			*out = *s;
		}
	}
	*out = '\0';
}

/* The last one: a mount on top of another at the same place hides it. */
bool mount_find(const char *path, char *type, char *source, size_t len,
		char *dev)
{
	char line[8192], mp[PATH_MAX], fstype[PATH_MAX], src[PATH_MAX];
	char devno[32];
	FILE *f = fopen("/proc/self/mountinfo", "re");
	bool found = false;

	if (!f)
		return false;
	while (fgets(line, sizeof(line), f)) {
		char *sep = strstr(line, " - ");

		if (!sep ||
		    sscanf(line, "%*s %*s %31s %*s %4095s", devno, mp) != 2 ||
		    sscanf(sep + 3, "%4095s %4095s", fstype, src) != 2)
			continue;
		mountinfo_unescape(mp);
		if (strcmp(mp, path) != 0)
			continue;
		found = true;
		if (dev)
			snprintf(dev, 32, "%s", devno);
		snprintf(type, len, "%s", fstype);
		mountinfo_unescape(src);
		snprintf(source, len, "%s", src);
	}
	fclose(f);
	return found;
}

/* The connection's number in the control filesystem: the kernel's dev_t
 * of the mount, MAJOR:MINOR as mountinfo gives it. */
static bool connection_number(const char *devno, unsigned long *conn)
{
	unsigned int major, minor;

	if (sscanf(devno, "%u:%u", &major, &minor) != 2)
		return false;
	*conn = ((unsigned long)major << 20) | minor;
	return true;
}

/* Is the mount still there, the same one (type and device)? */
static bool still_mounted(const struct watchdog *wd)
{
	char type[PATH_MAX], source[PATH_MAX], dev[32];

	return mount_find(wd->mountpoint, type, source, sizeof(type), dev) &&
	       strcmp(dev, wd->dev) == 0 && strncmp(type, "fuse", 4) == 0;
}

static int write_abort(unsigned long conn)
{
	char path[64];
	int fd, err = 0;

	snprintf(path, sizeof(path), FUSECTL_DIR "/%lu/abort", conn);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (write(fd, "1", 1) != 1)
		err = -errno;
	close(fd);
	return err;
}

/* The control filesystem, where the system has not mounted it: in a mount
 * namespace of the watchdog's own, so that the system's mounts stay as
 * they are (root only, as is mounting it). */
static int mount_fusectl(void)
{
	if (unshare(CLONE_NEWNS) ||
	    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
	    mount("fusectl", FUSECTL_DIR, "fusectl", 0, NULL))
		return -errno;
	return 0;
}

/* Where the daemon's threads wait, for the log: "thread TID in WCHAN"
 * for each that waits uninterruptibly (state D), or "" if none does. */
static void stuck_threads(pid_t daemon, char *out, size_t len)
{
	char path[64], state, wchan[64] = "";
	struct dirent *t;
	size_t used = 0;
	DIR *dir;
	FILE *f;

	out[0] = '\0';
	snprintf(path, sizeof(path), "/proc/%d/task", (int)daemon);
	dir = opendir(path);
	while (dir && (t = readdir(dir)) && used < len) {
		if (t->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%.16s/stat",
			 (int)daemon, t->d_name);
		f = fopen(path, "re");
		/* pid (comm) state ...: comm is "zfolio" or a thread's name */
		if (!f || fscanf(f, "%*d (%*[^)]) %c", &state) != 1 ||
		    state != 'D') {
			if (f)
				fclose(f);
			continue;
		}
		fclose(f);
		snprintf(path, sizeof(path), "/proc/%d/task/%.16s/wchan",
			 (int)daemon, t->d_name);
		f = fopen(path, "re");
		if (!f || !fgets(wchan, sizeof(wchan), f))
			snprintf(wchan, sizeof(wchan), "?");
		if (f)
			fclose(f);
		used += (size_t)snprintf(out + used, len - used,
					 "; thread %s in %s", t->d_name,
					 wchan);
	}
	if (dir)
		closedir(dir);
}

static void abort_connection(const struct watchdog *wd, pid_t daemon)
{
	char stuck[256];
	unsigned long conn;
	int err;

	if (!still_mounted(wd) || !connection_number(wd->dev, &conn))
		return;
	stuck_threads(daemon, stuck, sizeof(stuck));
	err = write_abort(conn);
	if (err == -ENOENT && !mount_fusectl())
		err = write_abort(conn);
	if (err)
		zlog_file(wd->mountpoint,
			  "the daemon died and did not exit in %d ms%s; "
			  "cannot abort its connection (%s): use umount -f",
			  WATCHDOG_GRACE_MS, stuck, strerror(-err));
	else
		zlog_file(wd->mountpoint,
			  "the daemon died and did not exit in %d ms%s; its "
			  "connection is aborted",
			  WATCHDOG_GRACE_MS, stuck);
}

/* The pipe: 1 if the daemon said goodbye or has gone (end of file), 0 if
 * nothing came in ms milliseconds. */
static int daemon_left(int fd, int ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	char c;

	if (poll(&p, 1, ms) <= 0)
		return 0;
	return read(fd, &c, 1) >= 0; /* a byte, or 0: end of file */
}

/* Stop signals: the daemon's to take, not the watchdog's. */
static const int ignored[] = {SIGINT, SIGTERM, SIGHUP};

static _Noreturn void watch(const struct watchdog *wd, int fd, pid_t daemon)
{
	struct pollfd p[2] = {{.fd = fd, .events = POLLIN},
			      {.fd = -1, .events = POLLIN}};
	sigset_t death;

	sigemptyset(&death);
	sigaddset(&death, SIGUSR1);
	sigprocmask(SIG_BLOCK, &death, NULL);
	prctl(PR_SET_NAME, "zfolio-watchdog");
	/* a Ctrl-C in the terminal reaches the whole group: the daemon stops
	 * and says goodbye, and the watchdog waits for that */
	for (unsigned int i = 0; i < sizeof(ignored) / sizeof(*ignored); i++)
		signal(ignored[i], SIG_IGN);
	p[1].fd = signalfd(-1, &death, SFD_CLOEXEC);
	if (p[1].fd < 0 || prctl(PR_SET_PDEATHSIG, SIGUSR1))
		_exit(1);
	/* unless it died before the death signal was asked for */
	if (getppid() == daemon)
		while (poll(p, 2, -1) < 0 && errno == EINTR)
			;
	/* a goodbye, or the daemon gone whole: the kernel aborted the
	 * connection when its last thread closed /dev/fuse */
	if (!(p[0].revents & (POLLIN | POLLHUP)) &&
	    !daemon_left(fd, WATCHDOG_GRACE_MS))
		abort_connection(wd, daemon);
	_exit(0);
}

int watchdog_start(struct watchdog *wd, const char *mountpoint,
		   bool foreground)
{
	char type[PATH_MAX], source[PATH_MAX];
	pid_t daemon = getpid();
	int p[2];

	wd->pid = -1;
	wd->fd = -1;
	if (!realpath(mountpoint, wd->mountpoint))
		return -errno;
	if (!mount_find(wd->mountpoint, type, source, sizeof(type), wd->dev))
		return -ENOENT;
	if (pipe2(p, O_CLOEXEC))
		return -errno;
	wd->pid = fork();
	if (wd->pid < 0) {
		int err = -errno;

		close(p[0]);
		close(p[1]);
		return err;
	}
	if (wd->pid == 0) {
		int null = open("/dev/null", O_RDWR | O_CLOEXEC);

		/* nothing of the daemon's kept open: not /dev/fuse, which
		 * would keep the connection; not the terminal when detached,
		 * which a caller reading the command's output waits on */
		if (null >= 0) {
			dup2(null, STDIN_FILENO);
			dup2(null, STDOUT_FILENO);
			if (!foreground)
				dup2(null, STDERR_FILENO);
		}
		if (dup2(p[0], 3) != 3)
			_exit(1);
		close_range(4, ~0u, 0);
		watch(wd, 3, daemon);
	}
	close(p[0]);
	wd->fd = p[1];
	return 0;
}

void watchdog_stop(struct watchdog *wd)
{
	char bye = WATCHDOG_BYE;

	if (wd->pid <= 0)
		return;
	(void)!write(wd->fd, &bye, 1);
	close(wd->fd);
	while (waitpid(wd->pid, NULL, 0) < 0 && errno == EINTR)
		;
	wd->pid = -1;
}
