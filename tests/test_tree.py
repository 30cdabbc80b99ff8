#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Trees as users have them: every name, link and hard link round-trips
(tar of the mount equals tar of the source), and many files are listed and
read with the daemon at 256 open files and its RSS within budget + 32 MiB.

    test_tree.py fidelity | deep | many | bigdir | foreign | missing | push |
                 forgotten

ZF_TREE_FILES sets the size of the many-files tree (default 40000: CI; the
million-file run is bench/manyfiles).
"""
import errno
import hashlib
import mmap
import os
import random
import resource
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zftest import *  # noqa: E402,F401,F403

SMALL = 128 << 10


def tar_digest(root):
    """sha256 of tar --sort=name --numeric-owner -c: names, types, modes,
    owners, times, link targets, hard links and content."""
    r = subprocess.run("tar --sort=name --numeric-owner -cf - . | sha256sum",
                       shell=True, cwd=root, capture_output=True, text=True)
    check(r.returncode == 0, "tar in %s: %s" % (root, r.stderr))
    return r.stdout.split()[0]


def make_tricky(root):
    """The cases real trees hold: x beside x.zst, a 255-byte name, names
    with tabs, newlines, backslashes and bytes that are not UTF-8, hard
    links in and across directories, symlinks to .zst names and dangling
    ones, FIFOs, device nodes, empty files and directories, sizes around
    the small-file limit, deep nesting, times before 1970."""
    def put(rel, data):
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    put("x", b"plain x\n")
    put("x.zst", b"not zstd, a file named x.zst\n")
    put("foo.zst", rand_bytes(5000, 1))
    put("n" * 255, b"a name at the limit\n")
    put("dir/" + "m" * 251 + ".zst", b"x.zst too long once .zst is added\n")
    put(os.fsdecode(b"bytes\xff\xfe not utf-8"), b"latin\n")
    put("tab\there", b"tab\n")
    put("new\nline", b"newline\n")
    put("back\\slash", b"backslash\n")
    put("a-b/f", b"dash\n")
    put("a0/f", b"zero\n")
    put("a/b/c/d/e/f/g/h/i/j/deep", text_bytes(1000, 2))
    for n in (0, 1, SMALL - 1, SMALL, SMALL + 1, 3 * SMALL + 5):
        put("sizes/s%d" % n, text_bytes(n, n))
    put("links/orig", text_bytes(20000, 3))
    os.link(root + "/links/orig", root + "/links/hard")
    os.link(root + "/links/orig", root + "/dir/hard_elsewhere")
    put("links/big", text_bytes(3 * SMALL, 4))
    os.link(root + "/links/big", root + "/links/big_hard")
    os.symlink("foo.zst", root + "/to_foo_zst")
    os.symlink("nowhere/at/all", root + "/dangling")
    os.symlink("../x", root + "/links/up")
    os.mkfifo(root + "/fifo")
    os.mknod(root + "/null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    # hard links of a symlink and of special files: one inode each
    os.link(root + "/links/up", root + "/dir/up_hard", follow_symlinks=False)
    os.link(root + "/fifo", root + "/links/fifo_hard")
    os.link(root + "/null", root + "/dir/null_hard")
    os.makedirs(root + "/empty")
    os.chmod(root + "/x", 0o4755)
    os.chown(root + "/x.zst", 1234, 5678, follow_symlinks=False)
    for rel in ("x", "tab\there", "a-b", "empty"):
        os.utime(os.path.join(root, rel), ns=(1_500_000_000_000000001, 1_600_000_000_999999999))
    # times before 1970 (old archives, clamped file systems): negative
    # seconds, positive nanoseconds, as struct timespec has them
    for rel, ns in (("sizes/s0", -1), ("links/up", -1_500_000_001),
                    ("a/b", -2_000_000_000_000_000_000), ("", -86_400_000_000_000)):
        os.utime(os.path.join(root, rel), ns=(ns, ns), follow_symlinks=False)


def test_fidelity():
    require_root_fuse()
    with tmpdir() as d:
        src, dst, mnt = d + "/src", d + "/dst", d + "/mnt"
        os.makedirs(src)
        make_tricky(src)
        want = tar_digest(src)
        pack(src, dst)
        with Mount(dst, mnt, "budget=8M"):
            check(tar_digest(mnt) == want, "tar of the mount differs from the source")
            a, b = os.stat(mnt + "/links/orig"), os.stat(mnt + "/dir/hard_elsewhere")
            check(a.st_ino == b.st_ino and a.st_nlink == 3, "hard links: %s %s" % (a, b))
            for one, two in (("links/up", "dir/up_hard"), ("fifo", "links/fifo_hard"),
                             ("null", "dir/null_hard")):
                a, b = os.lstat(mnt + "/" + one), os.lstat(mnt + "/" + two)
                check(a.st_ino == b.st_ino and a.st_nlink == 2,
                      "hard links of %s: %s %s" % (one, a, b))
            check(os.readlink(mnt + "/dir/up_hard") == "../x", "a hard-linked symlink's target")
            # directories' links count their subdirectories, the root's too
            for sub in ("", "/dir", "/links"):
                check(os.stat(mnt + sub).st_nlink == os.stat(src + sub).st_nlink,
                      "links of %s: %d, the source's %d" % (sub or "/", os.stat(mnt + sub).st_nlink,
                                                             os.stat(src + sub).st_nlink))
            check(os.readlink(mnt + "/to_foo_zst") == "foo.zst", "a link to a .zst name")
            with open(mnt + "/to_foo_zst", "rb") as f:
                check(f.read() == rand_bytes(5000, 1), "through the link to foo.zst")
        # --force over the dataset: the same again
        pack(src, dst, "--force")
        with Mount(dst, mnt, "budget=8M"):
            check(tar_digest(mnt) == want, "tar after mkzfolio --force")
        # a foreign tree: a link to foo.zst finds what is served as foo
        foreign = d + "/foreign"
        os.makedirs(foreign)
        data = text_bytes(30000, 5)
        subprocess.run(["zstd", "-q", "-o", foreign + "/foo.zst"], input=data, check=True)
        os.symlink("foo.zst", foreign + "/link")
        with Mount(foreign, mnt, "budget=8M"):
            check(sorted(os.listdir(mnt)) == ["foo", "link"], "foreign listing")
            with open(mnt + "/link", "rb") as f:
                check(f.read() == data, "a foreign tree's link to a .zst name")


BASE = None


def content(size, seed):
    """A file's bytes, cheap to make a million times: a slice of one
    text-like buffer, where seed says."""
    global BASE
    if BASE is None:
        BASE = text_bytes(4 << 20, 99)
    start = (seed * 7919) % (len(BASE) - size) if size < len(BASE) else 0
    return (BASE * (size // len(BASE) + 1))[start:start + size] if size > len(BASE) \
        else BASE[start:start + size]


def gen_many(root, n, seed):
    """n entries: mostly small files, some large, wide and deep dirs.
    Returns {path: (size, seed)} of the regular files."""
    rnd = random.Random(seed)
    files = {}
    dirs = [""]
    made = 0
    while made < n:
        parent = rnd.choice(dirs[-200:] if rnd.random() < 0.7 else dirs)
        if rnd.random() < 0.05 and len(parent.split("/")) < 12:
            d = (parent + "/" if parent else "") + "d%d" % made
            os.mkdir(os.path.join(root, d))
            dirs.append(d)
        else:
            rel = (parent + "/" if parent else "") + "f%d" % made
            size = rnd.choice([0, 10, 300, 2000, 9000, 30000]) if rnd.random() < 0.995 \
                else rnd.choice([200000, 1500000])
            with open(os.path.join(root, rel), "wb") as f:
                f.write(content(size, made))
            files[rel] = (size, made)
        made += 1
    return files


class RssWatch:
    """Samples the daemon's VmRSS until stopped; keeps the peak."""
    def __init__(self, pid):
        self.pid, self.peak, self.stop = pid, 0, False
        self.t = threading.Thread(target=self.run)
        self.t.start()

    def run(self):
        while not self.stop:
            self.peak = max(self.peak, vmrss_kib(self.pid) * 1024)
            time.sleep(0.05)

    def done(self):
        self.stop = True
        self.t.join()
        return self.peak


def nofile(n):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return set_limit


def timed(what, t0):
    """With ZF_TREE_TIMES set (bench/manyfiles), say how long a step took."""
    if os.environ.get("ZF_TREE_TIMES"):
        print("%-28s %8.1f s" % (what, time.time() - t0), flush=True)
    return time.time()


def check_many(mnt, files, nentries, budget, pid, sample):
    """find, ls -lR, du, random files byte-exact; RSS bounded."""
    watch = RssWatch(pid)
    t = time.time()
    try:
        r = subprocess.run("find . | wc -l", shell=True, cwd=mnt, capture_output=True,
                           text=True)
        check(r.returncode == 0 and int(r.stdout) == nentries + 1,
              "find | wc -l: %s, want %d" % (r.stdout.strip(), nentries + 1))
        t = timed("find | wc -l", t)
        r = subprocess.run("ls -lR . > /dev/null", shell=True, cwd=mnt,
                           capture_output=True, text=True)
        check(r.returncode == 0 and not r.stderr, "ls -lR: " + r.stderr[:300])
        t = timed("ls -lR", t)
        r = subprocess.run(["du", "-s", mnt], capture_output=True, text=True)
        check(r.returncode == 0, "du -s: " + r.stderr[:300])
        t = timed("du -s", t)
        rnd = random.Random(7)
        for rel in rnd.sample(sorted(files), min(sample, len(files))):
            size, seed = files[rel]
            with open(os.path.join(mnt, rel), "rb") as f:
                check(f.read() == content(size, seed), "content of " + rel)
        t = timed("%d random files read" % min(sample, len(files)), t)
    finally:
        peak = watch.done()
    print("daemon VmRSS peak %.1f MiB" % (peak / 2**20))
    if os.environ.get("ZF_SANITIZE", "none") == "none":
        check(peak <= budget + (32 << 20), "VmRSS %.1f MiB over budget + 32 MiB" %
              (peak / 2**20))


def open_deep(root, names):
    """A descriptor of root/names[0]/names[1]/..., opened a step at a time:
    the whole path is longer than the kernel takes at once."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for n in names:
        try:
            sub = os.open(n, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        finally:
            os.close(fd)
        fd = sub
    return fd


def test_deep():
    """A tree deeper than a path: what lies within 4095 bytes of the root
    is packed and served (a file, a directory's extended attribute read
    through a source path over 4096 bytes); a directory past that is
    packed empty, said, and mkzfolio exits 1; on the mount it fails to
    list with ENAMETOOLONG rather than as damage."""
    require_root_fuse()
    with tmpdir() as d:
        src, dst, mnt = d + "/src", d + "/dst", d + "/mnt"
        os.makedirs(src)
        names = ["d%02d" % i + "x" * 250 for i in range(17)]  # 254 bytes a level
        fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
        for n in names:
            os.mkdir(n, dir_fd=fd)
            sub = os.open(n, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        # in d16, packed empty: not even looked at (x beside x.zst would
        # stop the tree layout)
        for n in ("leaf", "x", "x.zst"):
            with open(os.open(n, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as f:
                f.write(b"past the limit\n")
        os.close(fd)
        fd = open_deep(src, names[:16])
        try:
            with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd),
                      "wb") as f:
                f.write(b"deep\n")
            os.setxattr("/proc/self/fd/%d" % fd, "user.deep", b"kept")
        finally:
            os.close(fd)
        for layout in ("packed", "tree"):
            deep_layout(src, dst + layout, mnt, names, layout)


def deep_layout(src, dst, mnt, names, layout):
        r = subprocess.run([MKZFOLIO, "-q", "--layout=" + layout, src, dst],
                           capture_output=True, text=True)
        check(r.returncode == 1 and names[16] + ": a path in the tree of 4096 bytes or "
              "more, which zfolio does not serve; packed empty" in r.stderr,
              "mkzfolio %s: %d %r" % (layout, r.returncode, r.stderr[-300:]))
        check(r.stderr.count("\n") == (2 if layout == "packed" else 3),
              "mkzfolio %s said more: %r" % (layout, r.stderr[-600:]))
        with Mount(dst, mnt):
            fd = open_deep(mnt, names[:16])
            try:
                if layout == "packed":  # the tree layout keeps none
                    check(os.getxattr("/proc/self/fd/%d" % fd, "user.deep") == b"kept",
                          "the xattr of d15")
                with open(os.open("leaf", os.O_RDONLY, dir_fd=fd), "rb") as f:
                    check(f.read() == b"deep\n", "d15/leaf")
                try:
                    os.close(os.open(names[16], os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd))
                    fail("d16 listed")
                except OSError as e:
                    check(e.errno == errno.ENAMETOOLONG, "d16: %s" % e)
            finally:
                os.close(fd)


def test_many():
    require_root_fuse()
    n = int(os.environ.get("ZF_TREE_FILES", "40000"))
    with tmpdir() as d:
        src, dst, mnt = d + "/src", d + "/dst", d + "/mnt"
        os.makedirs(src)
        t = time.time()
        files = gen_many(src, n, 1)
        t = timed("generate %d entries" % n, t)
        pack(src, dst)
        t = timed("mkzfolio", t)
        with Mount(dst, mnt, "budget=64M", preexec=nofile(256), timeout=60) as m:
            check_many(mnt, files, n, 64 << 20, m.pid,
                       10000 if n >= 1000000 else 2000)


def test_bigdir():
    """One directory of 100,000 entries, listed (readdir and readdirplus)
    name for name, with the daemon's RSS within budget + 24 MiB: it reads
    a directory from the manifest as it is listed, and keeps no listing."""
    require_root_fuse()
    n = 100000
    with tmpdir() as d:
        src, dst, mnt = d + "/src", d + "/dst", d + "/mnt"
        os.makedirs(src + "/big")
        names = ["entry-%06d-%s" % (i, "x" * (i % 40)) for i in range(n)]
        for name in names:
            os.close(os.open(src + "/big/" + name, os.O_CREAT | os.O_WRONLY, 0o644))
        pack(src, dst)
        with Mount(dst, mnt, "budget=8M") as m:
            watch = RssWatch(m.pid)
            try:
                got = os.listdir(mnt + "/big")
                r = subprocess.run("ls -l big | tail -n +2 | wc -l", shell=True, cwd=mnt,
                                   capture_output=True, text=True)
            finally:
                peak = watch.done()
            check(sorted(got) == names, "listing: %d names, want %d" % (len(got), n))
            check(r.returncode == 0 and int(r.stdout) == n, "ls -l: %r" % r.stdout)
            print("daemon VmRSS peak %.1f MiB" % (peak / 2**20))
            if os.environ.get("ZF_SANITIZE", "none") == "none":
                check(peak <= (8 << 20) + (24 << 20), "VmRSS %.1f MiB over budget + 24 MiB" %
                      (peak / 2**20))


def test_foreign():
    """A tree of .zst files the zstd CLI wrote, no manifest: listed and
    read at 256 open files, RSS bounded."""
    require_root_fuse()
    n = int(os.environ.get("ZF_FOREIGN_FILES", "3000"))
    with tmpdir() as d:
        src, mnt = d + "/src", d + "/mnt"
        files = {}
        for i in range(n):
            sub = "d%d" % (i % 30)
            os.makedirs(os.path.join(src, sub), exist_ok=True)
            size = (i * 7919) % 40000
            with open(os.path.join(src, sub, "f%d" % i), "wb") as f:
                f.write(content(size, i))
            files["%s/f%d" % (sub, i)] = (size, i)
        subprocess.run("find . -type f | xargs zstd -q --rm", shell=True, cwd=src,
                       check=True)
        with Mount(src, mnt, "budget=64M", preexec=nofile(256), timeout=60) as m:
            check_many(mnt, files, n + 30, 64 << 20, m.pid, 1000)
        # a small budget: indexes of files no one has open are dropped,
        # so metadata stays within its share (an eighth) of the budget
        with Mount(src, mnt, "budget=4M", preexec=nofile(256), timeout=60) as m:
            for rel in files:  # the inodes: the kernel holds them
                os.stat(os.path.join(mnt, rel))
            listed = m.stat()["slab_reclaimable"]
            for rel, (size, seed) in sorted(files.items()):
                with open(os.path.join(mnt, rel), "rb") as f:
                    check(f.read() == content(size, seed), "content of " + rel)
            grown = m.stat()["slab_reclaimable"] - listed
            check(listed > 0 and grown <= (4 << 20) // 8 + (64 << 10),
                  "indexes grew metadata by %d bytes, over an eighth of the "
                  "budget" % grown)


def test_treelayout():
    """mkzfolio --layout=tree: a tree it cannot keep (x beside x.zst, a
    name ".zst" makes too long) is refused before anything is written, and
    DST is not left behind; hard links are links between the .zst files,
    and the mount gives back the source, tar for tar."""
    require_root_fuse()
    with tmpdir() as d:
        tricky = d + "/tricky"
        os.makedirs(tricky)
        make_tricky(tricky)
        # each refused in turn, in the walk's order
        for remove, says in (("dir/" + "m" * 251 + ".zst", "too long for the tree layout"),
                             ("n" * 255, "too long for the tree layout"),
                             ("x.zst", "cannot keep it beside %s/x.zst" % tricky)):
            r = subprocess.run([MKZFOLIO, "-q", TREE, tricky, d + "/no"],
                               capture_output=True, text=True, timeout=60)
            check(r.returncode == 1 and says in r.stderr and remove in r.stderr,
                  "%s: %d %r" % (remove, r.returncode, r.stderr))
            check(not os.path.exists(d + "/no"), "a refused tree left DST behind")
            os.unlink(tricky + "/" + remove)
        want = tar_digest(tricky)
        pack(tricky, d + "/tree", TREE)
        a, b = os.stat(d + "/tree/links/orig.zst"), os.stat(d + "/tree/dir/hard_elsewhere.zst")
        check(a.st_ino == b.st_ino and a.st_nlink == 3, "not linked: %s %s" % (a, b))
        with Mount(d + "/tree", d + "/mnt"):
            check(tar_digest(d + "/mnt") == want, "tar of the tree layout's mount differs")


def lookups(m):
    """LOOKUP requests the daemon took so far (its -d trace)."""
    return m.output().count("opcode: LOOKUP")


def test_plus():
    """A walk that lists a directory whole and then stats its entries (find,
    du, tar, ls -l): in a packed dataset every part of the listing carries
    the attributes (readdirplus), so the walk asks the daemon for no entry
    by name; what it sees is the source's."""
    require_root_fuse()
    with tmpdir() as d:
        src = d + "/src"
        for k in range(3):
            os.makedirs("%s/d%d" % (src, k))
            for i in range(2000):
                with open("%s/d%d/entry_with_a_longish_name_%05d" % (src, k, i), "wb") as f:
                    f.write(b"x" * (i % 50))
        pack(src, d + "/packed")

        def walk(root):
            out = []
            for k in range(3):
                names = sorted(os.listdir("%s/d%d" % (root, k)))  # whole, first
                for n in names:
                    st = os.lstat("%s/d%d/%s" % (root, k, n))
                    out.append((k, n, st.st_size, st.st_mode, st.st_mtime_ns))
            return out
        want = walk(src)
        with Mount(d + "/packed", d + "/mnt", extra=("-d",)) as m:
            before = lookups(m)
            check(walk(m.mnt) == want, "the walk differs from the source's")
            asked = lookups(m) - before
            print("%d lookups for a walk of %d entries" % (asked, len(want)))
            check(asked <= 3, "%d lookups for a walk of %d entries" % (asked, len(want)))


def opcodes(m, op):
    """How many op requests the daemon took so far (its -d trace)."""
    return m.output().count("opcode: %s " % op)


def tar_sum(root):
    r = subprocess.run("tar -C '%s' --sort=name --numeric-owner -cf - . | sha256sum" % root,
                       shell=True, capture_output=True, check=True)
    return r.stdout.split()[0]


def test_kopens():
    """A packed dataset on a read-only mount with the kernel tier: the
    kernel opens files and directories itself (one OPEN and one OPENDIR
    answered ENOSYS, then none, and no RELEASE), reads find their file by
    inode, and a second walk of what stayed cached asks the daemon for
    nothing; control files and the control directory's listing are fresh
    at every open; a rw mount keeps its opens, and its directory listings
    stay cached across opens."""
    require_root_fuse()
    with tmpdir() as d:
        src = d + "/src"
        files = make_tree(src)
        for k in range(40):
            os.makedirs("%s/many/d%d" % (src, k % 8), exist_ok=True)
            with open("%s/many/d%d/f%d" % (src, k % 8, k), "wb") as f:
                f.write(text_bytes(100 + 997 * k, k))
        pack(src, d + "/packed")
        want = tar_sum(src)
        with Mount(d + "/packed", d + "/mnt", "ro,group_by=uid", extra=("-d",)) as m:
            # the control directory lists the groups there are now: none
            # before a read, uid_0's after (not the kernel's cached listing)
            ctl = os.path.join(m.mnt, ".zfolio")
            names = os.listdir(ctl)
            check("memory.max" in names and "uid_0" not in names, "before: %s" % names)
            # an mmap of a file nothing read yet: its faults read by inode
            reads = opcodes(m, "READ")
            with open(os.path.join(m.mnt, "big/mixed.dat"), "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
                check(mm[:] == files["big/mixed.dat"], "mmap of big/mixed.dat differs")
                mm.close()
            check(opcodes(m, "READ") > reads, "the mmap asked nothing")
            names = os.listdir(ctl)
            check("uid_0" in names, "after a read: %s" % names)

            check(tar_sum(m.mnt) == want, "tar of the ro mount differs from the source's")
            for rel, data in files.items():
                with open(os.path.join(m.mnt, rel), "rb") as f:
                    check(f.read() == data, "%s differs" % rel)
            counts = {op: opcodes(m, op) for op in ("OPEN", "OPENDIR", "RELEASE",
                                                    "RELEASEDIR")}
            print("first walk: %s" % counts)
            check(counts["OPEN"] == 1 and counts["OPENDIR"] == 1,
                  "opens reached the daemon: %s" % counts)
            check(counts["RELEASE"] == 0 and counts["RELEASEDIR"] == 0,
                  "releases reached the daemon: %s" % counts)
            # what the first walk sent (the kernel's readahead past a
            # read may arrive after it) has arrived once the log stops
            # growing for 200 ms
            asked, still, deadline = -1, 0, time.time() + 5 * SLOW
            while still < 4 and time.time() < deadline:
                now = m.output().count("opcode: ")
                still = still + 1 if now == asked else 0
                asked = now
                time.sleep(0.05)
            check(tar_sum(m.mnt) == want, "a second tar differs")
            again = m.output().count("opcode: ") - asked
            print("second walk: %d requests" % again)
            if again:
                # seen in one run of five to twelve over io_uring on one
                # host: a few READs of pages of files read whole before
                # (pushed or filled alike), with no FUSE_NOTIFY_INVAL_INODE
                # sent and nothing evicted (the kernel did not keep them;
                # cause not found); what the second walk filled must then
                # be cached for a third
                st = m.stat()
                print("second walk asked: %s; %s" % (
                    [l for l in m.output().splitlines() if "opcode: " in l][-again:],
                    {k: st[k] for k in st if k.startswith(("kernel_", "workingset"))}))
                asked = m.output().count("opcode: ")
                check(tar_sum(m.mnt) == want, "a third tar differs")
                again = m.output().count("opcode: ") - asked
                print("third walk: %d requests" % again)
            check(again == 0, "the warm walk asked the daemon %d times: %s" % (
                again, m.output()[-2000:]))

            # control files: a new text at every open, read whole or in bits
            for value in ("104857600", "209715200"):  # same length: by time
                r = subprocess.run([ZFOLIOCTL, "set", m.mnt, "max", value],
                                   capture_output=True, text=True)
                check(r.returncode == 0, "zfolioctl set: " + r.stderr)
                check(m.ctl("memory.max") == value + "\n",
                      "memory.max reads %r after set %s" % (m.ctl("memory.max"), value))
                check(os.stat(ctl + "/memory.max").st_size == len(value) + 1,
                      "memory.max's size is not its text's")
            before = int(m.ctl("memory.current"))
            r = subprocess.run([ZFOLIOCTL, "reclaim", m.mnt, "8M"], capture_output=True,
                               text=True)
            check(r.returncode == 0, "zfolioctl reclaim: " + r.stderr)
            after = int(m.ctl("memory.current"))
            check(after < before, "memory.current did not move: %d then %d" % (before, after))
            with open(ctl + "/memory.stat", "rb") as f:
                bits = b""
                while True:
                    b = f.read(16)
                    if not b:
                        break
                    bits += b
            lines = bits.decode().splitlines()
            check(lines and all(len(ln.split()) == 2 and ln.split()[1].isdigit() for ln in lines),
                  "memory.stat read 16 bytes at a time: %r" % bits[:200])
            check("file" in m.stat(), "memory.stat has no file line")
            try:
                os.open(os.path.join(m.mnt, "a/notes.txt"), os.O_WRONLY)
                fail("an open for writing succeeded on a ro mount")
            except OSError as e:
                check(e.errno == errno.EROFS, "open for writing: %s" % e)
        # a rw mount keeps its opens (a write must be refused at open), and
        # a manifest directory's listing stays cached across its opens
        with Mount(d + "/packed", d + "/mnt", extra=("-d",)) as m:
            with open(os.path.join(m.mnt, "a/notes.txt"), "rb") as f:
                check(f.read() == files["a/notes.txt"], "a/notes.txt differs on rw")
            deadline = time.time() + 10 * SLOW  # RELEASE goes in the background
            while opcodes(m, "RELEASE") < 1 and time.time() < deadline:
                time.sleep(0.02)
            check(opcodes(m, "OPEN") == 1 and opcodes(m, "RELEASE") == 1,
                  "rw: OPEN %d, RELEASE %d" % (opcodes(m, "OPEN"), opcodes(m, "RELEASE")))
            try:
                os.open(os.path.join(m.mnt, "a/notes.txt"), os.O_WRONLY)
                fail("an open for writing succeeded on a rw mount")
            except OSError as e:
                check(e.errno == errno.EROFS, "open for writing (rw): %s" % e)
            listed = sorted(os.listdir(m.mnt + "/many/d3"))
            parts = opcodes(m, "READDIRPLUS") + opcodes(m, "READDIR")
            check(sorted(os.listdir(m.mnt + "/many/d3")) == listed, "the listing changed")
            check(opcodes(m, "READDIRPLUS") + opcodes(m, "READDIR") == parts,
                  "a second listing was read again")


def push_tree(src, dirs, per_dir):
    """dirs directories of per_dir small text files, a subdirectory of
    more in each: the tree a scan reads.  Returns the files' paths."""
    names = []
    for k in range(dirs):
        for sub in ("d%d" % k, "d%d/sub" % k):
            os.makedirs(os.path.join(src, sub), exist_ok=True)
            for i in range(per_dir if sub.endswith("%d" % k) else per_dir // 4):
                rel = "%s/f%03d.txt" % (sub, i)
                with open(os.path.join(src, rel), "wb") as f:
                    f.write(text_bytes(300 + (i * 977 + k * 131) % 6000, i + 1000 * k))
                names.append(rel)
    return names


def test_push():
    """A scan of small files on a read-only mount (tar): the files after
    the one read, in its frame and the next, are pushed into the page
    cache, so the scan asks the daemon for fewer reads than there are
    files, and reads the same bytes; push=0 asks for one read per file.
    At a budget smaller than the tree, the page cache of the mount plus
    zfolio's folios stay within it (fincore), pushes included."""
    require_root_fuse()
    with tmpdir() as d:
        src = d + "/src"
        names = push_tree(src, 4, 150)
        pack(src, d + "/packed")
        want = tar_sum(src)
        reads = {}
        for push in ("1", "0"):
            with Mount(d + "/packed", d + "/mnt", "ro,push=" + push, extra=("-d",)) as m:
                check(tar_sum(m.mnt) == want, "push=%s: tar differs from the source's" % push)
                reads[push] = opcodes(m, "READ")
                pushed = int(m.stat()["kernel_pushes"])
                print("push=%s: %d reads for %d files, %d pages pushed" % (
                    push, reads[push], len(names), pushed))
                if push == "1":
                    check(pushed > 0, "nothing was pushed")
                    for rel in names[::7]:  # what was pushed reads right
                        with open(os.path.join(src, rel), "rb") as a, \
                                open(os.path.join(m.mnt, rel), "rb") as b:
                            check(a.read() == b.read(), "%s differs" % rel)
                else:
                    check(pushed == 0, "push=0 pushed %d pages" % pushed)
                    check(reads[push] >= len(names), "push=0: %d reads for %d files" % (
                        reads[push], len(names)))
        # the read that starts a push waits for its first store, so the
        # scan follows the pusher rather than racing it: 20-50 reads here
        # when the machine is idle, 120 at most under ASan and load (210-265
        # without the wait); under TSan waits time out and the scan races
        check(reads["1"] < reads["0"], "pushes spared no read: %s" % reads)
        if os.environ.get("ZF_SANITIZE", "none").split(",")[0] in ("none", "address"):
            check(reads["1"] * 2 < len(names), "pushes spared too few reads: %s for %d "
                  "files" % (reads, len(names)))

        # the budget holds: a tree of 12 MiB of small files at budget=4M
        src2 = d + "/big"
        names = push_tree(src2, 12, 400)
        pack(src2, d + "/packed2")
        want = tar_sum(src2)
        budget = 4 << 20
        with Mount(d + "/packed2", d + "/mnt", "ro,budget=4M") as m:
            check(tar_sum(m.mnt) == want, "budget=4M: tar differs from the source's")
            # what reclaim uncharged leaves the page cache on the tier's
            # thread, soon after: looked at until it has
            deadline = time.time() + 5 * SLOW
            while True:
                st = m.stat()
                held = resident(m.mnt, names) + int(st["file"])
                if held <= budget + (128 << 10) or time.time() > deadline:
                    break
                time.sleep(0.05)
            print("budget=4M: %d pages pushed, page cache + folios %.1f MiB" % (
                int(st["kernel_pushes"]), held / 2**20))
            check(int(st["kernel_pushes"]) > 0, "nothing was pushed at budget=4M")
            check(st["kernel_pushes"] <= st["kernel_fills"],
                  "kernel_pushes %d, kernel_fills %d: pushes are fills" % (
                      st["kernel_pushes"], st["kernel_fills"]))
            # the slack of the tier: one kernel window (128 KiB) per reader
            check(held <= budget + (128 << 10), "page cache + folios: %d bytes at a "
                  "4 MiB budget" % held)

        # two scans at once, of two parts of the tree, on a new mount:
        # each followed by a cursor of its own, both read right
        with Mount(d + "/packed2", d + "/mnt", "ro") as m:
            parts = ("d1", "d7")
            tar = "set -o pipefail; tar -C '%s' --sort=name --numeric-owner -cf - %s | sha256sum"
            tars = [subprocess.Popen(["bash", "-c", tar % (m.mnt, p)], stdout=subprocess.PIPE)
                    for p in parts]
            try:
                got = [t.communicate(timeout=120)[0].split() for t in tars]
            finally:
                for t in tars:
                    if t.poll() is None:
                        t.kill()
                        t.wait()
            for p, t, g in zip(parts, tars, got):
                check(t.returncode == 0, "two scans at once: tar of %s failed" % p)
                w = subprocess.run(["bash", "-c", tar % (src2, p)], capture_output=True,
                                   check=True).stdout.split()
                check(g == w, "two scans at once: %s differs" % p)
            check(int(m.stat()["kernel_pushes"]) > 0, "two scans at once pushed nothing")

        # SIGTERM in the middle of a scan with pushes queued: the daemon
        # stops its pusher while the workers still answer the fills a
        # store may wait on, and exits.  A new mount's page cache is cold;
        # the pack's backing pages are dropped (its files only: drop_caches
        # would empty the mounts of tests run beside), so the scan reads
        # the disk and lasts long enough to be stopped in the middle
        stopped_mid_scan = 0
        for delay in (0.02, 0.05, 0.1, 0.3):
            for root, _, fs in os.walk(d + "/packed2"):
                for name in fs:
                    fd = os.open(os.path.join(root, name), os.O_RDONLY)
                    os.fsync(fd)  # dirty pages are not dropped
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.close(fd)
            m = Mount(d + "/packed2", d + "/mnt", "ro,budget=4M")
            with m:
                tar = subprocess.Popen("tar -C '%s' -cf - . | wc -c" % m.mnt, shell=True,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(delay)
                stopped_mid_scan += tar.poll() is None
                m.proc.send_signal(signal.SIGTERM)
                try:
                    code = m.proc.wait(20 * SLOW)
                except subprocess.TimeoutExpired:
                    code = None
                tar.wait(60)
                check(code == 0, "SIGTERM %.2f s into a scan: exit %r" % (delay, code))
                check(not is_mounted(m.mnt), "still mounted after SIGTERM")
        print("SIGTERM: %d of 4 in the middle of a scan" % stopped_mid_scan)
        check(stopped_mid_scan >= 1, "every scan had ended before its SIGTERM")


def resident(mnt, names):
    """Bytes of the page cache holding these files, from fincore."""
    r = subprocess.run(["fincore", "-b", "-n", "-o", "RES"] +
                       [os.path.join(mnt, n) for n in names],
                       capture_output=True, text=True)
    check(r.returncode == 0, "fincore: " + r.stderr)
    return sum(int(x) for x in r.stdout.split())


def test_missing():
    """Names that are not there, looked for again and again (a compiler's
    include path, a shell's PATH, a program probing for optional files):
    the daemon is asked once, and the kernel remembers the answer as long
    as it remembers names that are there: in a packed dataset for a day,
    in a tree for 1 s, after which a file put there shows."""
    require_root_fuse()
    with tmpdir() as d:
        src = d + "/src"
        os.makedirs(src + "/lib")
        data = text_bytes(5000, 1)
        with open(src + "/lib/mod.py", "wb") as f:
            f.write(data)
        pack(src, d + "/packed")
        pack(src, d + "/tree", TREE)
        missing = ["lib/mod.abi3.so", "lib/mod.so", "lib/nope/__init__.py",
                   "nothere.h"]
        for kind in ("packed", "tree"):
            with Mount(d + "/" + kind, d + "/mnt", extra=("-d",)) as m:
                before = lookups(m)
                t0 = time.time()
                for _ in range(5):
                    for rel in missing:
                        check(not os.path.exists(os.path.join(m.mnt, rel)),
                              "%s: %s is there" % (kind, rel))
                    with open(m.mnt + "/lib/mod.py", "rb") as f:
                        check(f.read() == data, "%s: lib/mod.py" % kind)
                asked = lookups(m) - before
                elapsed = time.time() - t0
                print("%s: %d lookups for %d names, 5 times each, in %.3f s" % (
                    kind, asked, len(missing) + 2, elapsed))
                # lib and lib/mod.py, then each missing name once (a tree's
                # names may be asked again after 1 s: a slower run is not
                # judged)
                if kind == "packed" or elapsed < 0.9:
                    check(asked <= len(missing) + 2,
                          "%s: %d lookups, the kernel did not keep what is "
                          "missing" % (kind, asked))
                if kind == "tree":
                    shutil.copy(d + "/tree/lib/mod.py.zst",
                                d + "/tree/lib/mod.so.zst")
                    time.sleep(1.2)
                    with open(m.mnt + "/lib/mod.so", "rb") as f:
                        check(f.read() == data, "a file put in the tree")


def test_forgotten():
    """A file whose inode the kernel forgets (drop_caches, as its inode
    cache does under memory pressure) keeps what zfolio cached of it with
    cache=engine: read again, nothing comes from backing; a file replaced
    while forgotten reads as its new self."""
    require_root_fuse()
    with tmpdir() as d:
        src, dst, mnt = d + "/src", d + "/tree", d + "/mnt"
        os.makedirs(src)
        data = {"a": content(3 << 20, 1), "b": content(1 << 20, 2)}
        for name, b in data.items():
            with open(os.path.join(src, name), "wb") as f:
                f.write(b)
        pack(src, dst, TREE)
        with Mount(dst, mnt, "budget=64M,cache=engine") as m:
            for name, b in data.items():
                with open(os.path.join(mnt, name), "rb") as f:
                    check(f.read() == b, "content of " + name)
            read0 = m.stat()["folios_read"]

            def forgotten():
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("2")
                return m.stat()["files_kept"] >= 2
            wait_for(forgotten, 10 * SLOW, "the kernel to forget both inodes",
                     step=0.2)
            data["b"] = content(1 << 20, 3)
            with open(src + "/b", "wb") as f:
                f.write(data["b"])
            os.unlink(dst + "/b.zst")
            subprocess.run(["zstd", "-q", src + "/b", "-o", dst + "/b.zst"],
                           check=True)
            for name, b in sorted(data.items()):
                with open(os.path.join(mnt, name), "rb") as f:
                    check(f.read() == b, "content of %s, forgotten" % name)
            st = m.stat()
            print("folios read %d, then %d; files kept %d, reused %d" % (
                read0, st["folios_read"], st["files_kept"], st["files_kept_reused"]))
            check(st["files_kept_reused"] == 1,
                  "files taken up again: %d, not a alone" % st["files_kept_reused"])
            # a's 96 folios were all there; only b's new content was read
            check(st["folios_read"] - read0 < 96,
                  "folios read again: %d, a's among them" % (st["folios_read"] - read0))


if __name__ == "__main__":
    main(globals(), "test_tree.py")
