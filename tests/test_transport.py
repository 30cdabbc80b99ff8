#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""How requests reach the daemon: transport=auto|uring|dev, on a real
mount, every byte compared with the source; a kernel that refuses io_uring
and a kernel parameter that is off.

    test_transport.py modes
"""
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zftest import *  # noqa: E402,F401,F403
from test_mount import compare_tree, run_cli  # noqa: E402


def transport_of(m):
    return dict(l.split() for l in m.ctl("transport").splitlines())


def possible_cpus():
    n = 0
    with open("/sys/devices/system/cpu/possible") as f:
        for part in f.read().strip().split(","):
            a, _, b = part.partition("-")
            n += int(b or a) - int(a) + 1
    return n


def set_uring(value):
    with open(ENABLE_URING, "w") as f:
        f.write(value)


def test_modes():
    """transport=: over io_uring every queue gets entries and the requests
    go there, bytes right; a kernel that refuses to register an entry makes
    auto serve over /dev/fuse and uring fail with one line; with the kernel
    parameter off, uring is refused before mounting and auto uses /dev/fuse."""
    require_root_fuse()
    with tmpdir() as d:
        src, dst, mnt = d + "/src", d + "/dst", d + "/mnt"
        files = make_tree(src, big=False)
        files["big.bin"] = text_bytes(3 << 20, 9)
        with open(src + "/big.bin", "wb") as f:
            f.write(files["big.bin"])
        pack(src, dst)
        refuse = {"ZFOLIO_TEST_FAULT": "uring_register:1"}
        with Mount(dst, mnt, "transport=dev") as m:
            compare_tree(src, mnt, files)
            tr = transport_of(m)
            check(tr["transport"] == "dev" and tr["uring_requests"] == "0",
                  "transport=dev: %s" % tr)
        if not os.path.exists(ENABLE_URING):
            print("no FUSE over io_uring in this kernel: dev only")
            return
        with open(ENABLE_URING) as f:
            old = f.read().strip()
        try:
            set_uring("1")
            with Mount(dst, mnt, "transport=uring,threads=3") as m:
                compare_tree(src, mnt, files)
                deadline = time.time() + 10 * SLOW
                while transport_of(m)["transport"] != "uring" and time.time() < deadline:
                    time.sleep(0.01)
                tr = transport_of(m)
                n = int(tr["uring_requests"])
                print("transport=uring: %s" % tr)
                check(tr["transport"] == "uring", "not over io_uring: %s" % tr)
                check(int(tr["uring_queues"]) == possible_cpus(), "one queue per CPU")
                check(int(tr["uring_entries"]) == 3 * possible_cpus(), "threads per queue")
                # every file read again: the reads go over the ring
                compare_tree(src, mnt, files)
                check(int(transport_of(m)["uring_requests"]) > n + len(files),
                      "reads did not go over io_uring")
            # requests while the entries register: the kernel may hand one
            # to an entry in the same step that registers it (the ring is
            # ready from then on); none may be lost
            for i in range(10):
                stop = [False]
                done = []

                def hammer():
                    while not stop[0]:
                        try:
                            os.stat(mnt + "/big.bin")
                        except OSError:
                            pass  # not mounted yet
                    done.append(1)

                ts = [threading.Thread(target=hammer, daemon=True) for _ in range(2)]
                for t in ts:
                    t.start()
                try:
                    with Mount(dst, mnt, "transport=uring") as m:
                        # the entries register just after the mount appears
                        deadline = time.time() + 10 * SLOW
                        while (transport_of(m)["transport"] != "uring" and
                               time.time() < deadline):
                            time.sleep(0.01)
                        time.sleep(0.05)
                        stop[0] = True
                        for t in ts:
                            t.join(10)
                        check(len(done) == 2, "a stat hangs after mount %d" % i)
                        check(transport_of(m)["transport"] == "uring", "uring")
                finally:
                    stop[0] = True
            # the kernel refuses every entry: auto serves over /dev/fuse
            with Mount(dst, mnt, "transport=auto", env=refuse) as m:
                compare_tree(src, mnt, files)
                # the mount serves over /dev/fuse while its rings register:
                # the refusal is said once they are given up (later under
                # a sanitizer than this walk)
                deadline = time.time() + 30 * SLOW
                while "serving over /dev/fuse" not in m.output():
                    check(time.time() < deadline, "fallback not said: %r" % m.output())
                    time.sleep(0.05)
                check(transport_of(m)["transport"] == "dev", "fallback")
            r = subprocess.run([ZFOLIO, dst, mnt, "-f", "-o", "transport=uring"],
                               capture_output=True, text=True, timeout=30,
                               env=dict(os.environ, **refuse))
            lines = [l for l in r.stderr.splitlines() if "test hook" not in l]
            check(r.returncode == 1 and len(lines) == 1 and
                  "transport=uring: the kernel refused" in lines[0],
                  "transport=uring refused: %d %r" % (r.returncode, r.stderr))
            check(not is_mounted(mnt), "left mounted after a refused transport")
            # in the background the command waits for the daemon's start:
            # a refusal after the fork fails it, with the reason, and a
            # mount it returns from is served over io_uring already
            try:
                r = subprocess.run([ZFOLIO, dst, mnt, "-o", "transport=uring"],
                                   capture_output=True, text=True, timeout=30,
                                   env=dict(os.environ, **refuse))
                check(r.returncode == 1 and
                      "transport=uring: the kernel refused" in r.stderr,
                      "background transport=uring refused: %d %r" %
                      (r.returncode, r.stderr))
                check(not is_mounted(mnt),
                      "left mounted after a refused transport (background)")
            finally:
                subprocess.run(["fusermount3", "-u", mnt], capture_output=True)
            for opts in ("transport=uring", "transport=auto"):
                r = subprocess.run([ZFOLIO, dst, mnt, "-o", opts], capture_output=True,
                                   text=True, timeout=30)
                try:
                    check(r.returncode == 0 and not r.stderr,
                          "background %s: %d %r" % (opts, r.returncode, r.stderr))
                    with open(mnt + "/.zfolio/transport") as f:
                        first = f.readline().split()
                    check(first == ["transport", "uring"],
                          "background %s, just mounted: %s" % (opts, first))
                finally:
                    subprocess.run(["fusermount3", "-u", mnt], capture_output=True)
            # off in the kernel: uring refused before mounting, auto is dev
            set_uring("0")
            one_line_error(run_cli([dst, mnt, "-o", "transport=uring"]),
                           "transport=uring while off", "enable_uring")
            check(not is_mounted(mnt), "mounted although refused")
            with Mount(dst, mnt, "transport=auto") as m:
                compare_tree(src, mnt, files)
                check(transport_of(m)["transport"] == "dev", "auto with it off")
        finally:
            set_uring("1" if old in ("Y", "1") else "0")


if __name__ == "__main__":
    main(globals(), "test_transport.py")
