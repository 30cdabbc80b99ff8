# SPDX-License-Identifier: MIT
"""Helpers for zfolio's mount tests: trees, packing, mounting, cleanup.

Every test makes its own temporary directory and removes it, and unmounts
and stops every daemon it started, also when it fails.
"""
import contextlib
import errno
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

BUILD = os.environ.get("ZF_BUILD", os.path.join(os.path.dirname(__file__), "..", "build"))
ZFOLIO = os.environ.get("ZF_ZFOLIO", os.path.join(BUILD, "fs", "zfolio"))
MKZFOLIO = os.environ.get("ZF_MKZFOLIO", os.path.join(BUILD, "tools", "mkzfolio"))
ZFOLIOCTL = os.environ.get("ZF_ZFOLIOCTL", os.path.join(BUILD, "tools", "zfolioctl"))

SKIP = 77  # meson's "skipped"
# the transport every Mount asks for (transport=...), "" for the default
TRANSPORT = os.environ.get("ZF_TRANSPORT", "")
ENABLE_URING = "/sys/module/fuse/parameters/enable_uring"
TREE = "--layout=tree"  # one .zst per file, in a copy of the tree
# how much slower than a plain build the daemon under test runs: deadlines
# that wait for something to happen are multiplied by it
SLOW = {"": 1, "none": 1, "thread": 8}.get(os.environ.get("ZF_SANITIZE", ""), 3)
SANITIZER_REPORTS = ("AddressSanitizer", "LeakSanitizer", "ThreadSanitizer",
                     "runtime error:")


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def wait_for(pred, seconds, what, step=0.05):
    """Until pred() holds: seconds on a plain build, SLOW times that under
    a sanitizer."""
    t = time.time()
    while not pred():
        check(time.time() - t < seconds * SLOW, "timed out: " + what)
        time.sleep(step)


def check(cond, msg):
    if not cond:
        fail(msg)


def text_bytes(n, seed):
    """Text-like data: compresses about 3:1 to 4:1 at level 3."""
    rnd = random.Random(seed)
    words = [("%s%d" % (w, i)).encode() for i, w in enumerate(
        "folio cache budget zstd frame page reclaim readahead window "
        "marker grace period lockless hot cold stream dataset mount "
        "kernel memory group charge stock lru active inactive".split())]
    out = bytearray()
    while len(out) < n:
        line = b" ".join(rnd.choice(words) for _ in range(rnd.randint(4, 14)))
        out += line + b"\n"
    return bytes(out[:n])


def plain_zst(d, data, level, name="f"):
    """data as the zstd CLI writes it at level (one frame), as
    d/cli/NAME.zst: a tree of foreign files to mount."""
    os.makedirs(d + "/cli", exist_ok=True)
    with open(d + "/plain", "wb") as f:
        f.write(data)
    subprocess.run(["zstd", "-q", "-f", "-%d" % level, d + "/plain", "-o",
                    "%s/cli/%s.zst" % (d, name)], check=True)


def rand_bytes(n, seed):
    return random.Random(seed).randbytes(n)


def make_tree(root, frame=128 * 1024, big=True):
    """The tree the foundation issue asks for: edge sizes, nesting, a
    symlink, a 0600 file.  Returns {relative path: bytes} of regular files."""
    files = {}
    sizes = [0, 1, 4095, 4096, 4097, frame - 1, frame, frame + 1]
    os.makedirs(os.path.join(root, "a", "b", "c"))
    os.makedirs(os.path.join(root, "empty_dir"))
    for i, n in enumerate(sizes):
        files["size_%d" % n] = text_bytes(n, i) if i % 2 else rand_bytes(n, i)
    files["a/b/c/deep.txt"] = text_bytes(300000, 42)
    files["a/notes.txt"] = text_bytes(77777, 43)
    if big:
        files["big/text.log"] = text_bytes(12 << 20, 44)
        files["big/random.bin"] = rand_bytes(6 << 20, 45)
        files["big/mixed.dat"] = text_bytes(3 << 20, 46) + rand_bytes(3 << 20, 47)
    files["secret"] = b"only the owner may read this\n"
    for rel, data in files.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    os.chmod(os.path.join(root, "secret"), 0o600)
    os.symlink("b/c/deep.txt", os.path.join(root, "a", "link"))
    os.symlink("/etc", os.path.join(root, "outside"))
    # fixed times, so that they are compared exactly
    for rel in list(files) + ["a", "a/b"]:
        os.utime(os.path.join(root, rel), ns=(1_600_000_000_123_456_789,
                                              1_700_000_000_987_654_321))
    return files


def one_line_error(r, what, needle):
    """Exit status 1 and one line on stderr that says needle: that line."""
    check(r.returncode == 1, "%s: exit status %d: %s" % (what, r.returncode, r.stderr))
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    check(len(lines) == 1, "%s: expected one line, got %r" % (what, r.stderr))
    check(needle in lines[0], "%s: %r does not say %r" % (what, lines[0], needle))
    return lines[0]


def pack(src, dst, *args):
    """mkzfolio SRC DST (the packed layout unless args say --layout=tree:
    the tests that edit a dataset's files need one file per .zst)."""
    r = subprocess.run([MKZFOLIO, "-q", *args, src, dst], capture_output=True, text=True)
    check(r.returncode == 0, "mkzfolio failed: " + r.stderr)


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


class Mount:
    """zfolio in the foreground as a child process; unmounted on exit."""

    def __init__(self, dataset, mnt, opts="", extra=(), env=None, expect_exit=0,
                 wrapper=(), timeout=10, preexec=None):
        self.dataset, self.mnt, self.opts, self.extra = dataset, mnt, opts, extra
        self.preexec = preexec
        self.wrapper, self.timeout = list(wrapper), timeout
        self.env, self.expect_exit = env, expect_exit
        self.proc = None
        self.log = None

    def __enter__(self):
        os.makedirs(self.mnt, exist_ok=True)
        cmd = self.wrapper + [ZFOLIO, self.dataset, self.mnt, "-f"]
        opts = self.opts
        if TRANSPORT and "transport=" not in opts:
            opts = (opts + "," if opts else "") + "transport=" + TRANSPORT
        if opts:
            cmd += ["-o", opts]
        cmd += list(self.extra)
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ, **self.env) if self.env else None
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, env=env,
                                     preexec_fn=self.preexec)
        deadline = time.time() + self.timeout * SLOW
        while not is_mounted(self.mnt):
            if self.proc.poll() is not None or time.time() > deadline:
                self.log.seek(0)
                out = self.log.read().decode(errors="replace")
                self.__exit__(None, None, None)
                fail("zfolio did not mount: " + out)
            time.sleep(0.02)
        return self

    @property
    def pid(self):
        return self.proc.pid

    def ctl(self, name, group=""):
        p = os.path.join(self.mnt, ".zfolio", group, name)
        with open(p) as f:
            return f.read()

    def stat(self, group=""):
        out = {}
        for line in self.ctl("memory.stat", group).splitlines():
            k, v = line.split()
            out[k] = int(v)
        return out

    def set(self, name, value, group=""):
        with open(os.path.join(self.mnt, ".zfolio", group, name), "w") as f:
            f.write(value)

    def output(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def __exit__(self, *exc):
        if self.proc is None:
            return False
        if is_mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", self.mnt], capture_output=True)
        killed = False
        try:
            self.proc.wait(timeout=30 * SLOW + self.timeout)
        except subprocess.TimeoutExpired:
            killed = True
            self.proc.kill()
            self.proc.wait()
            subprocess.run(["fusermount3", "-u", "-z", self.mnt], capture_output=True)
        code = self.proc.returncode
        self.proc = None
        out = self.output()
        if exc[0] is not None:
            print("daemon output:\n" + out[-4000:], file=sys.stderr)
        else:
            for needle in SANITIZER_REPORTS:
                check(needle not in out, "the daemon reported: " + out[-4000:])
            check(not killed, "the daemon did not exit after unmount")
            if self.expect_exit is not None:
                check(code == self.expect_exit,
                      "the daemon exited with %d: %s" % (code, out[-2000:]))
        return False


@contextlib.contextmanager
def tmpdir():
    d = tempfile.mkdtemp(prefix="zfolio-test-")
    try:
        yield d
    finally:
        # never leave a mount behind us, whatever happened
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mp = line.split()[4]
                if mp.startswith(d):
                    subprocess.run(["fusermount3", "-u", "-z", mp], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


def vmrss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def thread_states(pid):
    """Each thread of a live process: {tid: its /proc status fields, with
    "wchan" and "syscall" added}; a thread that ended meanwhile is left out."""
    states = {}
    for tid in sorted(os.listdir("/proc/%d/task" % pid), key=int):
        d = "/proc/%d/task/%s/" % (pid, tid)
        try:
            with open(d + "status") as f:
                st = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
            with open(d + "wchan") as f:
                st["wchan"] = f.read() or "-"
            with open(d + "syscall") as f:
                st["syscall"] = f.read().split()[0]
        except OSError:
            continue
        states[int(tid)] = st
    return states


def threads_report(pid):
    """Where each thread of a live process waits, for a hang's message:
    name, kernel wait channel, system call, blocked and pending signals."""
    try:
        states = thread_states(pid)
    except OSError as e:
        return "no threads to show: %s" % e
    return "\n".join("%d %s wchan=%s syscall=%s blocked=%s pending=%s" %
                     (tid, st.get("Name", "?"), st["wchan"], st["syscall"],
                      st.get("SigBlk", "?"), st.get("SigPnd", "?"))
                     for tid, st in states.items())


def hang_report(pid):
    """threads_report, and each thread's stack where gdb is installed."""
    text = threads_report(pid)
    if shutil.which("gdb"):
        try:
            r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex",
                                "thread apply all bt 20"], capture_output=True,
                               text=True, timeout=120)
            text += "\n" + "\n".join(l for l in r.stdout.splitlines()
                                      if l.startswith(("#", "Thread")))
        except subprocess.TimeoutExpired:
            text += "\n(gdb took too long)"
    return text


def join_all(threads, seconds, pid, what):
    """Join threads within seconds (SLOW times that under a sanitizer);
    one still running is a hang: fail with where the daemon pid waits."""
    deadline = time.time() + seconds * SLOW
    for t in threads:
        t.join(max(0.0, deadline - time.time()))
    alive = sum(t.is_alive() for t in threads)
    if alive:
        fail("%s: %d of %d still running after %d s; the daemon's threads:\n%s" %
             (what, alive, len(threads), seconds * SLOW, hang_report(pid)))


def uring_enabled():
    try:
        with open(ENABLE_URING) as f:
            return f.read().strip() in ("Y", "1")
    except OSError:
        return False


def require_root_fuse():
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        print("skipped: needs root and /dev/fuse", file=sys.stderr)
        sys.exit(SKIP)


def inspect_zst(path):
    """A .zst file's index as zfolio builds it, from zfolioctl inspect --json:
    {"kind", "checksums", "frames", "content_size", "file_size",
    "table_offset" (where the seek table's skippable frame starts; its
    entries follow an 8-byte header), "table_size", "frame_list": [{"c_off",
    "c_size", "d_off", "d_size", "checksum"}]}."""
    r = subprocess.run([ZFOLIOCTL, "inspect", "--json", path], capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 0, "zfolioctl inspect %s: %s" % (path, r.stderr))
    return json.loads(r.stdout)


def main(namespace, usage_name):
    """Run the test named on the command line, test_NAME in namespace (a
    test file's globals()), and say ok; usage and status 2 for no such test."""
    tests = {n[5:]: f for n, f in namespace.items()
             if n.startswith("test_") and callable(f)}
    if len(sys.argv) != 2 or sys.argv[1] not in tests:
        print("usage: %s %s" % (usage_name, "|".join(tests)), file=sys.stderr)
        sys.exit(2)
    if TRANSPORT == "uring" and not uring_enabled():
        print("skipped: FUSE over io_uring is off here (%s)" % ENABLE_URING,
              file=sys.stderr)
        sys.exit(SKIP)
    tests[sys.argv[1]]()
    print("ok")
