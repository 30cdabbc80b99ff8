#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""share=NAME: mounts that hold at most share_max between them.

    test_share.py limit | store | idle | members
"""
import contextlib
import hashlib
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zftest import *  # noqa: E402,F401,F403

MIB = 1 << 20
SHM = "/dev/shm/zfolio-share.%d.%s"


def datasets(d, n, size=24 * MIB, files=2):
    """n datasets of files of random bytes: [(dataset, {name: bytes})]."""
    out = []
    for k in range(n):
        src = "%s/src%d" % (d, k)
        os.makedirs(src)
        data = {}
        for i in range(files):
            data["f%d" % i] = rand_bytes(size, 10 * k + i)
            with open("%s/f%d" % (src, i), "wb") as f:
                f.write(data["f%d" % i])
        pack(src, "%s/ds%d" % (d, k))
        out.append(("%s/ds%d" % (d, k), data))
    return out


MMAP_SUM = ("import hashlib, mmap, sys\n"
            "with open(sys.argv[1], 'rb') as f:\n"
            "    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
            "    print(hashlib.sha256(m).hexdigest())\n")


def reader(path, data, use_mmap):
    """A reader of the whole file in a process of its own (a fault in this
    one would hold the interpreter's lock, and the sampler with it): its
    process, and the digest it must print."""
    cmd = [sys.executable, "-c", MMAP_SUM, path] if use_mmap else ["sha256sum", path]
    return (subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True),
            hashlib.sha256(data).hexdigest())


def read_all(jobs):
    """Start every (path, data, use_mmap) reader, wait for them: errors."""
    procs = [(reader(*j), j[0]) for j in jobs]
    errors = []
    for (p, want), path in procs:
        out, _ = p.communicate(timeout=120 * SLOW)
        if p.returncode or out.split()[0] != want:
            errors.append("%s: wrong bytes or failed (%d)" % (path, p.returncode))
    return errors


@contextlib.contextmanager
def share_name(prefix):
    """A name of the test's own; its file is removed whatever happens
    (mounts killed, a test that failed)."""
    name = "%s%d" % (prefix, os.getpid())
    try:
        yield name
    finally:
        try:
            os.unlink(SHM % (os.geteuid(), name))
        except FileNotFoundError:
            pass


def share_info(m):
    return dict(line.split(" ", 1) for line in m.ctl("share").splitlines())


def current(m):
    return int(m.ctl("memory.current"))


@contextlib.contextmanager
def sampled_together(m0, m1):
    """What m0 and m1 hold together, sampled every 2 ms into the list it
    yields while the block runs."""
    sums, done = [], threading.Event()

    def sample():
        while not done.is_set():
            sums.append(current(m0) + current(m1))
            time.sleep(0.002)
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield sums
    finally:
        done.set()
        sampler.join()


def test_limit():
    """Two mounts of budget=64M in share=NAME,share_max=16M, each read by a
    read() reader and an mmap reader over 2 x 24 MiB: every byte right;
    what they hold together comes back under 16M as soon as the readers
    stop, and stays near it while they run (a charge over it wakes the
    members at once: it passes by what they read while they reclaim); the share says
    its members and reclaims.  The same mounts without share= hold far
    more together (the test can fail)."""
    require_root_fuse()
    with share_name("t") as name, tmpdir() as d:
        sets = datasets(d, 2)
        for share in (True, False):
            opts = "budget=64M" + (",share=%s,share_max=16M" % name if share else "")
            with Mount(sets[0][0], d + "/m0", opts) as m0, \
                 Mount(sets[1][0], d + "/m1", opts) as m1:
                errors = []
                with sampled_together(m0, m1) as sums:
                    for rnd in range(2):  # the second read finds little cached
                        errors += read_all([("%s/m%d/%s" % (d, k, f), sets[k][1][f], f == "f1")
                                            for k in (0, 1) for f in ("f0", "f1")])
                check(not errors, "; ".join(errors))
                if not share:
                    print("without share=: most %.1f MiB together" % (max(sums) / MIB))
                    check(max(sums) > 40 * MIB, "without share=: at most %d together" % max(sums))
                    check(m0.ctl("share").strip() == "none", "share without share=")
                    continue
                wait_for(lambda: current(m0) + current(m1) <= 16 * MIB, 5,
                         "together %d after the readers" % (current(m0) + current(m1)),
                         step=0.005)
                mean = sum(sums) / len(sums)
                print("together: mean %.1f MiB, most %.1f MiB of 16, %d samples" %
                      (mean / MIB, max(sums) / MIB, len(sums)))
                check(len(sums) >= 20, "%d samples" % len(sums))
                # a sanitizer's slower reclaim lets it pass further
                check(mean <= (16 + 8 * min(SLOW, 3)) * MIB,
                      "together %.1f MiB on average" % (mean / MIB))
                # near the limit nearly all the time: 16.0-16.2 MiB here
                # (17.2-17.5 when only the members' 10 ms ticks look, which
                # "kicks" below catches); not the most, which one late wake
                # of a member on a loaded machine takes further
                high = sorted(sums)[len(sums) * 95 // 100]
                check(high <= (16 + 4 * min(SLOW, 3)) * MIB,
                      "together %.1f MiB or more in 5%% of samples" % (high / MIB))
                info = share_info(m0)
                check(info["name"] == name and int(info["max"]) == 16 * MIB and
                      int(info["members"]) == 2, "share: %r" % info)
                check(int(share_info(m0)["reclaims"]) + int(share_info(m1)["reclaims"]) > 0,
                      "no member reclaimed for the share")
                check(int(share_info(m0)["kicks"]) + int(share_info(m1)["kicks"]) > 0,
                      "no read over the limit woke the members")
            check(not os.path.exists(SHM % (os.geteuid(), name)),
                  "the share's file outlived its mounts")


def test_store():
    """Two mounts of a dataset served over HTTP (nginx), budget=64M in
    share=NAME,share_max=16M, a reader each: every byte right, and what
    they hold together stays near 16M.  Readahead from a store is in
    flight while its requests run, where the members' reclaim cannot take
    it, so past the limit it is refused (a speculative charge, as at a
    parent cgroup's limit): without that, 50-82 MiB together."""
    require_root_fuse()
    import stores
    with share_name("s") as name, tmpdir() as d:
        sets = datasets(d, 1, size=32 * MIB)
        opts = "budget=64M,share=%s,share_max=16M" % name
        with stores.Nginx(d) as web:
            url = web.url + "ds0/"
            with Mount(url, d + "/m0", opts) as m0, Mount(url, d + "/m1", opts) as m1:
                with sampled_together(m0, m1) as sums:
                    errors = read_all([("%s/m%d/f%d" % (d, k, k), sets[0][1]["f%d" % k], False)
                                       for k in (0, 1)])
                check(not errors, "; ".join(errors))
                mean = sum(sums) / len(sums)
                print("from a store: mean %.1f MiB, most %.1f MiB together of 16, "
                      "%d samples" % (mean / MIB, max(sums) / MIB, len(sums)))
                # pages in flight (the kernel's fills wait on requests) are
                # past the members' reclaim: the mean is what holds
                check(mean <= (16 + 4 * min(SLOW, 3)) * MIB,
                      "together %.1f MiB on average" % (mean / MIB))


def test_idle():
    """An idle mount's cache gives way to a busy one's: the first fills the
    share and serves no read for a while; then the second reads, and
    takes the room: the idle one is left with little, the busy one holds
    most of the limit."""
    require_root_fuse()
    with share_name("i") as name, tmpdir() as d:
        sets = datasets(d, 2, size=16 * MIB, files=2)
        opts = "budget=64M,cache=engine,share=%s,share_max=16M" % name
        with Mount(sets[0][0], d + "/m0", opts) as m0, \
             Mount(sets[1][0], d + "/m1", opts) as m1:
            errors = read_all([(d + "/m0/f0", sets[0][1]["f0"], False)])
            wait_for(lambda: current(m0) > 12 * MIB, 5, "m0 did not fill: %d" % current(m0))
            time.sleep(1.2)  # idle (SHARE_IDLE_MS)
            for f in ("f0", "f1"):
                errors += read_all([(d + "/m1/" + f, sets[1][1][f], False)])
            check(not errors, "; ".join(errors))
            t = time.time()
            while current(m0) + current(m1) > 16 * MIB:
                check(time.time() - t < 5 * SLOW, "over the limit: %d + %d" % (current(m0), current(m1)))
                time.sleep(0.01)
            print("idle %d, busy %d" % (current(m0), current(m1)))
            check(current(m0) < 2 * MIB, "the idle mount kept %d" % current(m0))
            check(current(m1) > 12 * MIB, "the busy mount has %d" % current(m1))


def test_members():
    """A mount that gives another share_max is refused with the reason, so
    is a name that cannot be a file's; a member killed is counted no more
    once the others look; in the background (the daemon forks after it
    joined) a member is counted as the daemon."""
    require_root_fuse()
    with share_name("m") as name, tmpdir() as d:
        sets = datasets(d, 2, size=MIB, files=1)
        opts = "share=%s,share_max=16M" % name
        with Mount(sets[0][0], d + "/m0", opts) as m0:
            for bad, needle in (("share=%s,share_max=8M" % name, "share_max"),
                                ("share=a/b", "share=a/b"),
                                ("share_max=8M", "without share="),
                                ("share=%s,share_max=4K" % name, "at least 1M")):
                os.makedirs(d + "/x", exist_ok=True)
                r = subprocess.run([ZFOLIO, sets[1][0], d + "/x", "-o", bad],
                                   capture_output=True, text=True, timeout=30 * SLOW)
                check(r.returncode != 0 and needle in r.stderr and
                      len(r.stderr.strip().splitlines()) == 1,
                      "%s: %d %r" % (bad, r.returncode, r.stderr))
                check(not is_mounted(d + "/x"), "mounted with " + bad)
            # in the background
            os.makedirs(d + "/m1")
            r = subprocess.run([ZFOLIO, sets[1][0], d + "/m1", "-o", opts],
                               capture_output=True, text=True, timeout=30 * SLOW)
            check(r.returncode == 0, "background mount: %r" % r.stderr)
            try:
                time.sleep(0.1)
                check(int(share_info(m0)["members"]) == 2, "members: %r" % share_info(m0))
            finally:
                subprocess.run(["fusermount3", "-u", d + "/m1"], capture_output=True)
            wait_for(lambda: int(share_info(m0)["members"]) == 1, 2, "members after umount")
            # one killed: no leave, its slot found dead
            with Mount(sets[1][0], d + "/m1", opts) as m1:
                check(int(share_info(m0)["members"]) == 2, "members: %r" % share_info(m0))
                m1.proc.kill()
                m1.proc.wait()
                m1.expect_exit = None
                wait_for(lambda: int(share_info(m0)["members"]) == 1, 2, "a dead member counted")
                subprocess.run(["fusermount3", "-u", "-z", d + "/m1"], capture_output=True)
        check(not os.path.exists(SHM % (os.geteuid(), name)),
              "the share's file outlived its mounts")


if __name__ == "__main__":
    main(globals(), "test_share.py")
