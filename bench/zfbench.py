# SPDX-License-Identifier: MIT
"""Shared by the benchmark scripts: undoing what they make (mounts, loop
devices, cgroups, tracefs instances) on exit, also on Ctrl-C or failure;
memory cgroups (v2 if the memory controller is there, else v1); counting
the kernel's memcg reclaim passes; drop_caches; machine CPU time."""
import atexit
import glob
import os
import signal
import subprocess
import sys
import time

PAGE = 4096

# --- cleanup: everything made is undone, in reverse, exactly once --------

_undo = []


def on_exit(fn, *args):
    _undo.append((fn, args))


def cleanup():
    while _undo:
        fn, args = _undo.pop()
        try:
            fn(*args)
        except Exception as e:  # keep undoing the rest
            print("cleanup: %s" % e, file=sys.stderr)


def _signal(sig, frame):
    raise KeyboardInterrupt


def sh(*cmd, quiet=False, **kw):
    if quiet:
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stderr", subprocess.DEVNULL)
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def mounted(p):
    p = os.path.realpath(p)
    with open("/proc/self/mountinfo") as f:
        return any(l.split()[4] == p for l in f)


def umount(p):
    if not mounted(p):
        return
    for cmd in (["umount", p], ["fusermount3", "-u", p], ["umount", "-l", p]):
        if subprocess.run(cmd, capture_output=True).returncode == 0 and not mounted(p):
            return
        time.sleep(0.2)


def wait_mounted(p, proc=None):
    for _ in range(1000):
        if mounted(p):
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.01)
    raise RuntimeError("nothing mounted at " + p)


def losetup(img):
    dev = sh("losetup", "--find", "--show", img, capture_output=True, text=True).stdout.strip()
    on_exit(lambda d: subprocess.run(["losetup", "-d", d], capture_output=True), dev)
    return dev


def drop_caches():
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


# --- memory cgroups ------------------------------------------------------

def cgroup_v2():
    ctrl = "/sys/fs/cgroup/cgroup.controllers"
    return os.path.exists(ctrl) and "memory" in open(ctrl).read().split()


class Cgroup:
    """One memory cgroup, v2 if the memory controller is there, else v1."""

    def __init__(self, name, limit):
        if cgroup_v2():
            self.v2, self.path = True, os.path.join("/sys/fs/cgroup", name)
        else:
            self.v2, self.path = False, os.path.join("/sys/fs/cgroup/memory", name)
            if not os.path.isdir("/sys/fs/cgroup/memory"):
                raise RuntimeError("no memory cgroup controller (v2 or v1)")
        os.mkdir(self.path)
        on_exit(self.remove)
        self.write("memory.max" if self.v2 else "memory.limit_in_bytes", str(limit))

    def write(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def read(self, name):
        with open(os.path.join(self.path, name)) as f:
            return f.read()

    def join(self):
        """For preexec_fn: put the calling (child) process in the cgroup."""
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    def oom_kills(self):
        text = self.read("memory.events" if self.v2 else "memory.oom_control")
        for line in text.splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
        return 0

    def peak(self):
        return int(self.read("memory.peak" if self.v2 else "memory.max_usage_in_bytes"))

    def procs(self):
        return [int(p) for p in self.read("cgroup.procs").split()]

    def remove(self):
        if not os.path.isdir(self.path):
            return
        for _ in range(50):
            pids = self.procs()
            if not pids:
                break
            for p in pids:  # only processes this harness started are in it
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


# --- counting the kernel's memcg reclaim passes ---------------------------

class ReclaimTrace:
    """Counts vmscan:mm_vmscan_memcg_reclaim_begin in a tracefs instance of
    our own: entries + overruns of its ring buffers is every event."""

    def __init__(self):
        root = "/sys/kernel/tracing"
        if not os.path.exists(root + "/events"):
            if subprocess.run(["mount", "-t", "tracefs", "nodev", root],
                              capture_output=True).returncode == 0:
                on_exit(lambda: subprocess.run(["umount", root], capture_output=True))
        self.inst = "%s/instances/zfolio-compare-%d" % (root, os.getpid())
        self.ok = False
        try:
            os.mkdir(self.inst)
            on_exit(lambda: os.rmdir(self.inst) if os.path.isdir(self.inst) else None)
            self.ev = self.inst + "/events/vmscan/mm_vmscan_memcg_reclaim_begin/enable"
            self.ok = os.path.exists(self.ev)
        except OSError:
            pass
        if not self.ok:
            print("warning: no tracefs event mm_vmscan_memcg_reclaim_begin: "
                  "kernel reclaim passes not counted", file=sys.stderr)

    def _count(self):
        n = 0
        for stats in glob.glob(self.inst + "/per_cpu/cpu*/stats"):
            for line in open(stats):
                k, _, v = line.partition(":")
                if k.strip() in ("entries", "overrun"):
                    n += int(v)
        return n

    def start(self):
        if self.ok:
            open(self.inst + "/trace", "w").close()  # clear
            with open(self.ev, "w") as f:
                f.write("1")

    def stop(self):
        if not self.ok:
            return 0
        with open(self.ev, "w") as f:
            f.write("0")
        return self._count()


def cpu_busy():
    """Busy CPU seconds of the whole machine so far (kernel threads too)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")




def install_cleanup():
    """Undo everything on exit, and turn SIGINT/SIGTERM into a clean exit."""
    signal.signal(signal.SIGINT, _signal)
    signal.signal(signal.SIGTERM, _signal)
    atexit.register(cleanup)
