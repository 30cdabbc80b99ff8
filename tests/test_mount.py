#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Mount tests: a real FUSE mount, every byte compared with the source.

    test_mount.py basic | errors | foreign | fstab | budget | groups | lockless | mmap

(transport= is test_transport.py's.)
"""
import errno
import gzip
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zftest import *  # noqa: E402,F401,F403


def compare_tree(src, mnt, files):
    """stat (size, mode, mtime), readdir and readlink match the source."""
    check(os.stat(src).st_size == os.stat(mnt).st_size, "size of the root")
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        got = sorted(os.listdir(os.path.join(mnt, rel)))
        want = sorted(dirnames + filenames)
        check(got == want, "readdir %s: %s != %s" % (rel, got, want))
        for name in dirnames + filenames:
            s = os.lstat(os.path.join(src, rel, name))
            m = os.lstat(os.path.join(mnt, rel, name))
            what = os.path.join(rel, name)
            check(stat.S_IFMT(s.st_mode) == stat.S_IFMT(m.st_mode), "type of " + what)
            check(s.st_mode == m.st_mode, "mode of %s: %o != %o" % (what, m.st_mode, s.st_mode))
            if stat.S_ISREG(s.st_mode) or stat.S_ISDIR(s.st_mode):
                check(s.st_size == m.st_size, "size of %s: %d != %d" % (what, m.st_size, s.st_size))
            if not stat.S_ISLNK(s.st_mode):
                check(s.st_mtime_ns == m.st_mtime_ns, "mtime of %s" % what)
            if stat.S_ISLNK(s.st_mode):
                check(os.readlink(os.path.join(src, rel, name)) ==
                      os.readlink(os.path.join(mnt, rel, name)), "readlink " + what)
    for rel, data in files.items():
        with open(os.path.join(mnt, rel), "rb") as f:
            check(f.read() == data, "content of " + rel)


def read_storm(mnt, files, seconds, nthreads=4, budget=None, pid=None):
    """Readers at random offsets and sizes; every byte checked.  Samples the
    daemon's RSS meanwhile and returns its peak in KiB."""
    names = [n for n, d in files.items() if len(d) > 0]
    weights = [max(len(files[n]), 4096) for n in names]
    stop = time.time() + seconds
    errors = []
    reads = [0]
    peak = [0]

    def reader(seed):
        rnd = random.Random(seed)
        fds = {}
        try:
            while time.time() < stop and not errors:
                name = rnd.choices(names, weights)[0]
                data = files[name]
                if name not in fds:
                    fds[name] = os.open(os.path.join(mnt, name), os.O_RDONLY)
                off = rnd.randrange(len(data))
                n = rnd.choice([1, 100, 4096, 65536, 200000, 1 << 20])
                got = os.pread(fds[name], n, off)
                if got != data[off:off + n]:
                    errors.append("%s at %d+%d: %d bytes differ" % (name, off, n, len(got)))
                reads[0] += 1
        except OSError as e:
            errors.append("%s: %s" % (name, e))
        finally:
            for fd in fds.values():
                os.close(fd)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(nthreads)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        if pid:
            peak[0] = max(peak[0], vmrss_kib(pid))
        time.sleep(0.05)
    for t in threads:
        t.join()
    check(not errors, "read storm: " + "; ".join(errors[:5]))
    check(reads[0] > 100, "read storm made only %d reads" % reads[0])
    return peak[0], reads[0]


def expect_errno(fn, code, what):
    try:
        fn()
    except OSError as e:
        check(e.errno == code, "%s: errno %d, expected %d" % (what, e.errno, code))
        return
    fail(what + ": succeeded, expected " + errno.errorcode[code])


def test_basic():
    require_root_fuse()
    with tmpdir() as d:
        src, dst, mnt = d + "/src", d + "/dst", d + "/mnt"
        files = make_tree(src)
        pack(src, dst)
        budget = 4 << 20
        # the default: the kernel page cache in front, inside the budget
        with Mount(dst, mnt, "budget=4M,threads=4") as m:
            compare_tree(src, mnt, files)
            read_storm(mnt, files, 4, 4, budget, m.pid)
            check(int(m.ctl("memory.peak")) <= budget, "memory.peak over budget (kernel)")
            check(m.stat()["kernel_fills"] > 0, "no fills counted")
        # zfolio's cache alone: its readahead and reclaim see every read
        with Mount(dst, mnt, "budget=4M,threads=4,cache=engine") as m:
            compare_tree(src, mnt, files)
            peak, reads = read_storm(mnt, files, 8, 4, budget, m.pid)
            print("storm: %d reads, daemon VmRSS peak %.1f MiB" % (reads, peak / 1024))
            if os.environ.get("ZF_SANITIZE", "none") == "none":
                # sanitizers keep freed memory in quarantine: not comparable
                check(peak * 1024 <= budget + (32 << 20),
                      "VmRSS %d KiB over budget + 32 MiB" % peak)
            st = m.stat()
            check(int(m.ctl("memory.peak")) <= budget, "memory.peak over budget")
            check(int(m.ctl("memory.current")) <= budget, "memory.current over budget")
            check(st["reclaim_passes"] > 0, "no reclaim under a small budget")
            check(st["pgmajfault"] > 0 and st["cache_hits"] > 0, "counters")
            # a sequential reader: readahead runs ahead of it
            ra0 = m.stat()
            with open(mnt + "/big/text.log", "rb") as f:
                check(f.read() == files["big/text.log"], "sequential read")
            ra1 = m.stat()
            print("sequential read: ra_windows +%d, ra_pages +%d" % (ra1["ra_windows"] - ra0["ra_windows"], ra1["ra_pages"] - ra0["ra_pages"]))
            # 1 MiB requests: windows of a request's size run ahead of it
            check(ra1["ra_windows"] - ra0["ra_windows"] >= 5, "readahead windows")
            # (a 4 MiB budget: windows may stop early, so not all of it)
            check(ra1["ra_pages"] - ra0["ra_pages"] >= (12 << 20) // 4096 // 4,
                  "a good part of the file was read ahead")
            check(ra1["ra_hits"] > ra0["ra_hits"], "readahead hits")
            # write-like operations: EROFS
            expect_errno(lambda: os.open(mnt + "/a/notes.txt", os.O_WRONLY), errno.EROFS, "open for write")
            expect_errno(lambda: os.open(mnt + "/newfile", os.O_CREAT | os.O_WRONLY, 0o644), errno.EROFS, "create")
            expect_errno(lambda: os.unlink(mnt + "/a/notes.txt"), errno.EROFS, "unlink")
            expect_errno(lambda: os.mkdir(mnt + "/newdir"), errno.EROFS, "mkdir")
            expect_errno(lambda: os.rmdir(mnt + "/empty_dir"), errno.EROFS, "rmdir")
            expect_errno(lambda: os.chmod(mnt + "/a/notes.txt", 0o600), errno.EROFS, "setattr")
            expect_errno(lambda: os.truncate(mnt + "/a/notes.txt", 0), errno.EROFS, "truncate")
            expect_errno(lambda: os.rename(mnt + "/a/notes.txt", mnt + "/x"), errno.EROFS, "rename")
            expect_errno(lambda: os.symlink("x", mnt + "/sl"), errno.EROFS, "symlink")
            # the control directory is hidden from readdir, reachable by path
            check(".zfolio" not in os.listdir(mnt), "ctl dir listed")
            check("memory.stat" in os.listdir(mnt + "/.zfolio"), "ctl files")
            # symlinks are served as links; the daemon never follows them
            check(os.readlink(mnt + "/outside") == "/etc", "link to /etc")
            check(os.statvfs(mnt).f_bavail == 0, "statfs")


def run_cli(args, **kw):
    return subprocess.run([ZFOLIO, *args], capture_output=True, text=True, timeout=30, **kw)


def test_errors():
    require_root_fuse()
    with tmpdir() as d:
        os.makedirs(d + "/ds")
        os.makedirs(d + "/mnt")
        os.makedirs(d + "/full")
        open(d + "/full/x", "w").close()
        one_line_error(run_cli([d + "/missing", d + "/mnt"]), "missing dataset", "missing")
        one_line_error(run_cli([d + "/ds", d + "/full"]), "non-empty mountpoint", "not an empty directory")
        # fuse2's -o nonempty: mounts over it, hiding what is there
        with Mount(d + "/ds", d + "/full", "nonempty"):
            check(os.listdir(d + "/full") == [], "-o nonempty: %r" % os.listdir(d + "/full"))
        check(os.listdir(d + "/full") == ["x"], "after -o nonempty")
        one_line_error(run_cli([d + "/ds", d + "/nope"]), "missing mountpoint", "nope")
        one_line_error(run_cli([d + "/ds", d + "/mnt", "-o", "budget=lots"]), "bad budget", "budget")
        # a bad value says what the option takes
        one_line_error(run_cli([d + "/ds", d + "/mnt", "-o", "budget=1K"]), "small budget",
                       "'1K' (a size from 1M to 4T)")
        one_line_error(run_cli([d + "/ds", d + "/mnt", "-o", "cache=fast"]), "bad cache",
                       "(one of engine|kernel)")
        one_line_error(run_cli([d + "/ds", d + "/mnt", "-o", "threads=-1"]), "bad threads",
                       "(a number from 0 to 256)")
        one_line_error(run_cli([d + "/ds", d + "/mnt", "-o", "ctl=a/b"]), "bad ctl",
                       "(a file name: not empty, no '/', not . or ..)")
        for opt in ("ra_kb=3", "kernel_ra_kb=7"):
            one_line_error(run_cli([d + "/ds", d + "/mnt", "-o", opt]), opt,
                           "%s must be a multiple of 4" % opt.split("=")[0])
        one_line_error(run_cli([d + "/ds"]), "no mountpoint", "MOUNTPOINT")
        # an option neither zfolio nor libfuse knows: said as zfolio's
        line = one_line_error(run_cli([d + "/ds", d + "/mnt", "-o", "budgit=8M"]),
                              "unknown option", "unknown option `-o budgit=8M'")
        check(line.startswith("zfolio: ") and "--help" in line,
              "unknown option: %r" % line)
        # high at or over the budget: mounts, and says it never applies
        with Mount(d + "/ds", d + "/mnt", "budget=8M,high=16M") as m:
            check("high=16384 KiB is not below budget=8192 KiB" in m.output(),
                  "high over budget: %r" % m.output())
        # no /dev/fuse: hide /dev in a private mount namespace
        r = subprocess.run(["unshare", "-m", "sh", "-c",
                            "mount -t tmpfs none /dev && exec \"$0\" \"$@\"",
                            ZFOLIO, d + "/ds", d + "/mnt"],
                           capture_output=True, text=True, timeout=30)
        one_line_error(r, "no /dev/fuse", "/dev/fuse")
        # a /dev/fuse only root may open, for another user: not taken for
        # a missing module
        os.chmod(d, 0o755)
        os.makedirs(d + "/empty", mode=0o755)
        r = subprocess.run(["unshare", "-m", "sh", "-c",
                            "mount -t tmpfs none /dev && mknod -m 0600 /dev/fuse c 10 229 && "
                            "exec setpriv --reuid=65534 --regid=65534 --clear-groups \"$0\" \"$@\"",
                            ZFOLIO, d + "/ds", d + "/empty"],
                           capture_output=True, text=True, timeout=30)
        line = one_line_error(r, "/dev/fuse 0600", "cannot use /dev/fuse: Permission denied")
        check("module" not in line, "/dev/fuse 0600: " + line)
        # a mount whose daemon was killed: said so, with what to do
        src = d + "/src"
        os.makedirs(src)
        with open(src + "/f", "wb") as f:
            f.write(b"x")
        pack(src, d + "/packed")
        with Mount(d + "/packed", d + "/mnt", expect_exit=None) as m:
            try:
                os.kill(m.pid, signal.SIGKILL)
                m.proc.wait(timeout=30)
                one_line_error(run_cli([d + "/packed", d + "/mnt"]), "dead mount",
                               "fusermount3 -u " + d + "/mnt")
            finally:
                subprocess.run(["umount", "-l", d + "/mnt"], capture_output=True)
        h = run_cli(["-h"])
        check(h.returncode == 0, "-h exit status")
        for opt in ("budget=", "threads=", "cache=", "ra_kb=", "ra_reclaim=", "lockless=",
                    "group_by=", "ctl="):
            check(opt in h.stdout, "-h does not list " + opt)
        r = subprocess.run([MKZFOLIO, d + "/missing", d + "/out"], capture_output=True, text=True)
        check(r.returncode != 0 and "missing" in r.stderr, "mkzfolio missing source")
        r = subprocess.run([MKZFOLIO, d + "/ds", d + "/full"], capture_output=True, text=True)
        check(r.returncode != 0 and "not empty" in r.stderr, "mkzfolio non-empty DST")
        r = subprocess.run([MKZFOLIO, d + "/src", d + "/src/out"], capture_output=True, text=True)
        check(r.returncode != 0 and "is inside" in r.stderr, "mkzfolio DST inside SRC")
        check(not os.path.exists(d + "/src/out"), "mkzfolio left DST inside SRC")
        r = subprocess.run([MKZFOLIO, d + "/src", d + "/no/such/out"], capture_output=True,
                           text=True)
        check(r.returncode == 1 and "parent directory does not exist" in r.stderr,
              "mkzfolio DST without its parent: %r" % r.stderr)


def test_fstab():
    """mount -t fuse.zfolio, as /etc/fstab does: needs zfolio installed
    where mount(8) finds it (it runs helpers with a default PATH)."""
    require_root_fuse()
    found = subprocess.run(["env", "-i", "sh", "-c", "command -v zfolio"],
                           capture_output=True, text=True).stdout.strip()
    if not found:
        print("skipped: zfolio is not installed (meson install)", file=sys.stderr)
        sys.exit(SKIP)
    with tmpdir() as d:
        src, dst, mnt = d + "/src", d + "/dst", d + "/mnt"
        os.makedirs(mnt)
        files = {"f.txt": text_bytes(500000, 1)}
        os.makedirs(src)
        with open(src + "/f.txt", "wb") as f:
            f.write(files["f.txt"])
        pack(src, dst)
        r = subprocess.run(["mount", "-t", "fuse.zfolio", dst, mnt, "-o", "budget=64M"],
                           capture_output=True, text=True, timeout=30)
        check(r.returncode == 0, "mount -t fuse.zfolio: " + r.stderr)
        try:
            with open(mnt + "/f.txt", "rb") as f:
                check(f.read() == files["f.txt"], "content through fstab-style mount")
            with open(mnt + "/.zfolio/memory.max") as f:
                check(int(f.read()) == 64 << 20, "budget=64M")
            opts = [l.split()[5] for l in open("/proc/self/mountinfo") if l.split()[4] == mnt][0]
            check("nosuid" in opts and "nodev" in opts, "nosuid,nodev by default: " + opts)
            # the daemon in the background, found by its dataset
            pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and
                    os.path.exists("/proc/%s/cmdline" % p) and
                    dst.encode() in open("/proc/%s/cmdline" % p, "rb").read()]
            # and its watchdog (fs/watchdog.c), a child of it
            def comm(p):
                with open("/proc/%d/comm" % p) as f:
                    return f.read().strip()

            dogs = [p for p in pids if comm(p) == "zfolio-watchdog"]
            pids = [p for p in pids if p not in dogs]
            check(len(pids) == 1, "the daemon's process: %s" % pids)
            check(len(dogs) == 1 and
                  open("/proc/%d/stat" % dogs[0]).read().split()[3] == str(pids[0]),
                  "the daemon's watchdog: %s" % dogs)
            # names looked up: the inode table has entries to free at exit
            for i in range(20):
                os.stat(mnt + "/.zfolio/memory.stat")
        finally:
            subprocess.run(["umount", mnt], capture_output=True)
        check(not is_mounted(mnt), "still mounted")
        # a daemonized mount ends when it is unmounted
        deadline = time.time() + 10 * SLOW
        while os.path.exists("/proc/%d" % pids[0]) and time.time() < deadline:
            with open("/proc/%d/stat" % pids[0]) as f:
                if f.read().split()[2] == "Z":
                    break
            time.sleep(0.05)
        alive = os.path.exists("/proc/%d" % pids[0]) and \
            open("/proc/%d/stat" % pids[0]).read().split()[2] != "Z"
        if alive:
            os.kill(pids[0], signal.SIGKILL)
        check(not alive, "the background daemon did not exit after umount")
        check(not os.path.exists("/proc/%d" % dogs[0]) or
              open("/proc/%d/stat" % dogs[0]).read().split()[2] == "Z",
              "the watchdog did not exit with the daemon")


def test_foreign():
    """.zst files zfolio did not write: concatenated zstd outputs (no seek
    table), a piped single frame without a content size, plain files, and
    one .zst file mounted on its own."""
    require_root_fuse()
    with tmpdir() as d:
        ds, mnt = d + "/ds", d + "/mnt"
        os.makedirs(ds)
        parts = [text_bytes(700000, 1), rand_bytes(300000, 2), text_bytes(5 << 20, 3)]
        for i, p in enumerate(parts):
            with open(d + "/p%d" % i, "wb") as f:
                f.write(p)
        with open(ds + "/multi.zst", "wb") as out:
            for i in range(3):
                out.write(subprocess.run(["zstd", "-q", "-c", d + "/p%d" % i],
                                         capture_output=True, check=True).stdout)
        whole = b"".join(parts)
        # a pipe: zstd cannot know the size, so the frame does not say it
        with open(ds + "/piped.zst", "wb") as out:
            out.write(subprocess.run(["zstd", "-q", "-c"], input=parts[2],
                                     capture_output=True, check=True).stdout)
        with open(ds + "/plain.txt", "wb") as f:
            f.write(parts[0])
        # 8M: the piped frame streams through a 2 MiB window, charged too
        with Mount(ds, mnt, "budget=8M") as m:
            check(sorted(os.listdir(mnt)) == ["multi", "piped", "plain.txt"], "names")
            for name, data in (("multi", whole), ("piped", parts[2]), ("plain.txt", parts[0])):
                check(os.stat(mnt + "/" + name).st_size == len(data), "size of " + name)
                read_storm(mnt, {name: data}, 2, 2)
                with open(mnt + "/" + name, "rb") as f:
                    check(f.read() == data, "content of " + name)
            check(m.stat()["single_frame_warnings"] >= 1, "the unsized frame is counted")
            check(m.stat()["decoder_windows"] > 0, "the decoder window is charged")
        with Mount(ds + "/multi.zst", mnt, "budget=8M"):
            check(os.listdir(mnt) == ["multi"], "single file mount: " + str(os.listdir(mnt)))
            root = os.stat(mnt)
            check(stat.S_ISDIR(root.st_mode) and root.st_size == 0 and root.st_blocks == 0,
                  "the made-up root has no size of its own: %d" % root.st_size)
            with open(mnt + "/multi", "rb") as f:
                check(f.read() == whole, "single file mount content")
        # one FILE.zst that is not zstd data: refused, saying what it seems
        # to be, rather than mounted to read as EIO; an empty one is empty
        with open(ds + "/notz.zst", "wb") as f:
            f.write(gzip.compress(b"gzip, not zstd"))
        one_line_error(run_cli([ds + "/notz.zst", mnt]), "a gzip file named .zst",
                       "notz.zst: not zstd data (gzip?)")
        open(ds + "/empty.zst", "wb").close()
        with Mount(ds + "/empty.zst", mnt):
            check(os.listdir(mnt) == ["empty"] and os.path.getsize(mnt + "/empty") == 0,
                  "an empty FILE.zst: %r" % os.listdir(mnt))


def storm_thread(mnt, files, stop, errors, seed):
    """A reader that runs until stop is set, checking every byte."""
    def run():
        rnd = random.Random(seed)
        names = [n for n, d in files.items() if len(d) > 100000]
        fds = {n: os.open(os.path.join(mnt, n), os.O_RDONLY) for n in names}
        try:
            while not stop.is_set():
                name = rnd.choice(names)
                data = files[name]
                off = rnd.randrange(len(data))
                n = rnd.choice([4096, 65536, 300000])
                if os.pread(fds[name], n, off) != data[off:off + n]:
                    errors.append("%s at %d" % (name, off))
        except OSError as e:
            errors.append(str(e))
        finally:
            for fd in fds.values():
                os.close(fd)
    t = threading.Thread(target=run)
    t.start()
    return t


def test_budget():
    """memory.max lowered under load, memory.reclaim, memory.high, bad
    writes, zfolioctl."""
    require_root_fuse()
    with tmpdir() as d:
        src, dst, mnt = d + "/src", d + "/dst", d + "/mnt"
        files = make_tree(src)
        pack(src, dst)
        with Mount(dst, mnt, "budget=16M,threads=4") as m:
            stop, errors = threading.Event(), []
            readers = [storm_thread(mnt, files, stop, errors, i) for i in range(3)]
            try:
                wait_for(lambda: int(m.ctl("memory.current")) > 8 << 20, 10,
                         "cache did not fill", step=0.01)
                # lower the limit while the readers run: usage follows at once
                t = time.time()
                m.set("memory.max", "4M")
                wait_for(lambda: int(m.ctl("memory.current")) <= 4 << 20, 5,
                         "memory.current still over 4M after 5 s", step=0.01)
                print("memory.max 16M -> 4M took %.3f s" % (time.time() - t))
                for _ in range(50):  # and it stays under, sampled
                    cur, mx = int(m.ctl("memory.current")), int(m.ctl("memory.max"))
                    check(cur <= mx, "memory.current %d over memory.max %d" % (cur, mx))
                    time.sleep(0.01)
                m.set("memory.max", "max")
                check(m.ctl("memory.max").strip() == "max", "memory.max reads max")
                m.set("memory.max", "16M")
                # memory.high: charges pass it, the reclaimer brings usage back
                wait_for(lambda: int(m.ctl("memory.current")) > 10 << 20, 10,
                         "cache did not fill again", step=0.01)
                m.set("memory.high", "6M")
                wait_for(lambda: int(m.ctl("memory.current")) <= (6 << 20) + (2 << 20), 10,
                         "usage still far above memory.high", step=0.01)

                def events_high():
                    return int(dict(l.split() for l in
                                    m.ctl("memory.events").splitlines())["high"])
                wait_for(lambda: events_high() > 0, 5, "no high events", step=0.01)
                wait_for(lambda: m.stat()["high_reclaim_passes"] > 0, 5,
                         "background reclaim did not run", step=0.01)
                m.set("memory.high", "max")
            finally:
                stop.set()
                for r in readers:
                    r.join()
            check(not errors, "reads failed: " + "; ".join(errors[:3]))
            # memory.reclaim frees what it says
            with open(mnt + "/big/text.log", "rb") as f:
                check(f.read() == files["big/text.log"], "content after the limit changes")
            before = int(m.ctl("memory.current"))
            check(before >= 6 << 20, "not enough cached to reclaim from")
            m.set("memory.reclaim", "4M")
            after = int(m.ctl("memory.current"))
            check(before - after >= 4 << 20, "memory.reclaim 4M freed only %d" % (before - after))
            # bad writes: EINVAL, nothing changed
            for name, bad in (("memory.max", "lots"), ("memory.max", "-5"),
                              ("memory.high", "12Q"), ("memory.reclaim", "max"),
                              ("memory.peak", "now")):
                expect_errno(lambda: m.set(name, bad), errno.EINVAL, "%s <- %s" % (name, bad))
            check(int(m.ctl("memory.max")) == 16 << 20, "bad write changed memory.max")
            expect_errno(lambda: m.set("memory.current", "1"), errno.EACCES, "write memory.current")
            # zfolioctl, the friendly front
            r = subprocess.run([ZFOLIOCTL, "stat", mnt], capture_output=True, text=True)
            check(r.returncode == 0 and "reclaim_passes" in r.stdout and "MiB" in r.stdout,
                  "zfolioctl stat: " + r.stdout + r.stderr)
            r = subprocess.run([ZFOLIOCTL, "stat", mnt, "--json"], capture_output=True, text=True)
            import json
            j = json.loads(r.stdout)
            check(j["max"] == 16 << 20 and "pgmajfault" in j, "zfolioctl --json")
            r = subprocess.run([ZFOLIOCTL, "set", mnt, "max", "8M"], capture_output=True, text=True)
            check(r.returncode == 0 and int(m.ctl("memory.max")) == 8 << 20, "zfolioctl set")
            r = subprocess.run([ZFOLIOCTL, "reclaim", mnt, "1M"], capture_output=True, text=True)
            check(r.returncode == 0, "zfolioctl reclaim: " + r.stderr)
            r = subprocess.run([ZFOLIOCTL, "set", mnt, "max", "banana"], capture_output=True, text=True)
            check(r.returncode != 0 and "Invalid argument" in r.stderr, "zfolioctl bad value")
            # only the owner and root may write: try as another uid
            r = subprocess.run(["python3", "-c",
                                "open(%r, 'w').write('1M')" % (mnt + "/.zfolio/memory.max")],
                               user=65534, capture_output=True, text=True)
            check(r.returncode != 0 and "Permission denied" in r.stderr,
                  "another uid wrote memory.max: " + r.stderr)


def test_lockless():
    """4 threads read hot folios in a loop while another shrinks and grows
    memory.max and calls memory.reclaim, for 10 s (ZF_STRESS_SECONDS):
    every byte right, memory.current never above memory.max, and no
    deferred page left once the readers stop and a grace period passes."""
    require_root_fuse()
    seconds = float(os.environ.get("ZF_STRESS_SECONDS", "10"))
    with tmpdir() as d:
        src, dst, mnt = d + "/src", d + "/dst", d + "/mnt"
        os.makedirs(src)
        files = {}
        for i in range(4):
            files["hot%d" % i] = text_bytes(1 << 20, 100 + i)
            with open(src + "/hot%d" % i, "wb") as f:
                f.write(files["hot%d" % i])
        pack(src, dst)
        with Mount(dst, mnt, "budget=8M,threads=4") as m:
            stop, errors, over = threading.Event(), [], []
            reads = [0]

            def reader(seed):
                rnd = random.Random(seed)
                fds = {n: os.open(mnt + "/" + n, os.O_RDONLY) for n in files}
                try:
                    while not stop.is_set():
                        name = rnd.choice(list(files))
                        off = rnd.randrange(4) * 131072 + rnd.randrange(4000)
                        n = rnd.randint(1, 96)
                        if os.pread(fds[name], n, off) != files[name][off:off + n]:
                            errors.append("%s at %d" % (name, off))
                        reads[0] += 1
                except OSError as e:
                    errors.append(str(e))
                finally:
                    for fd in fds.values():
                        os.close(fd)

            def shaker():
                sizes = ["2M", "1M", "8M", "512K", "4M"]
                i = 0
                while not stop.is_set():
                    try:
                        m.set("memory.max", sizes[i % len(sizes)])
                        m.set("memory.reclaim", "128K")
                    except OSError as e:
                        if e.errno not in (errno.EAGAIN, errno.EBUSY):
                            errors.append("shaker: %s" % e)
                    i += 1

            def watch():
                import json
                while not stop.is_set():
                    # one file, one instant: current and max together
                    j = json.loads(m.ctl("memory.stat.json"))
                    if j["current"] > j["max"]:
                        over.append((j["current"], j["max"]))

            threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
            threads += [threading.Thread(target=shaker), threading.Thread(target=watch)]
            for t in threads:
                t.start()
            time.sleep(seconds)
            stop.set()
            for t in threads:
                t.join()
            check(not errors, "errors: " + "; ".join(errors[:3]))
            check(not over, "memory.current above memory.max: %s" % over[:3])
            st = m.stat()
            print("%d reads, %d lockless, %d hot folios, %d deferred frees, %d expedited" % (
                reads[0], st["lockless_reads"], st["hot_folios"], st["deferred_frees"],
                st["expedited_gps"]))
            check(st["lockless_reads"] > 0 and st["deferred_frees"] > 0, "lockless path used")
            deadline = time.time() + 5
            while m.stat()["deferred_free_pages"]:
                check(time.time() < deadline, "deferred pages left: %d" % m.stat()["deferred_free_pages"])
                time.sleep(0.05)


def test_mmap():
    """MAP_SHARED and MAP_PRIVATE mappings read every byte; faults and
    read() are told apart (fails if the routing is reversed); random faults
    are read around, and read-around pages get accounted."""
    require_root_fuse()
    import mmap
    with tmpdir() as d:
        src, dst, mnt = d + "/src", d + "/dst", d + "/mnt"
        os.makedirs(src)
        data = text_bytes(6 << 20, 5)
        with open(src + "/f", "wb") as f:
            f.write(data)
        pack(src, dst)
        with Mount(dst, mnt, "budget=16M,ra_kb=512,cache=engine") as m:
            fd = os.open(mnt + "/f", os.O_RDONLY)
            try:
                # read(): no page-cache fill
                s0 = m.stat()
                for off in range(0, len(data), 1 << 20):
                    check(os.pread(fd, 1 << 20, off) == data[off:off + (1 << 20)], "pread")
                s1 = m.stat()
                check(s1["fault_fills"] == s0["fault_fills"], "read() taken for faults")
                check(s1["readaround_windows"] == s0["readaround_windows"], "read() read around")
                # a shared mapping, touched forward page by page
                mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                got = bytearray()
                for off in range(0, len(data), 4096):
                    got += mm[off:off + 4096]
                check(bytes(got) == data, "MAP_SHARED content")
                s2 = m.stat()
                check(s2["fault_fills"] - s1["fault_fills"] >= len(data) // 4096 // 2,
                      "faults not seen as page-cache fills")
                check(s2["pgfault"] - s1["pgfault"] == s2["fault_fills"] - s1["fault_fills"],
                      "faults taken for read()")
                mm.close()
                # a private mapping, random pages
                mp = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
                rnd = random.Random(3)
                for _ in range(500):
                    off = rnd.randrange(0, len(data) - 100)
                    check(mp[off:off + 100] == data[off:off + 100], "MAP_PRIVATE at %d" % off)
                check(mp[:] == data, "MAP_PRIVATE content")
                mp.close()
            finally:
                os.close(fd)
        # random faults in a cold cache are read around
        with Mount(dst, mnt, "budget=16M,ra_kb=512,cache=engine") as m:
            fd = os.open(mnt + "/f", os.O_RDONLY)
            try:
                mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                rnd = random.Random(4)
                for _ in range(200):
                    pg = rnd.randrange(len(data) // 4096)
                    for k in range(4):  # a few neighbouring pages, like a record
                        off = min(pg + k, len(data) // 4096 - 1) * 4096
                        check(mm[off:off + 64] == data[off:off + 64], "random fault")
                mm.close()
            finally:
                os.close(fd)
            st = m.stat()
            print("random faults: %d fills, %d read-around windows, %d pages, %d used, "
                  "window %d pages" % (st["fault_fills"], st["readaround_windows"],
                                       st["readaround_pages"],
                                       st["readaround_used"], st["readaround_window_pages"]))
            check(st["readaround_windows"] > 0, "no read-around for random faults")
            check(st["ra_windows"] + st["readaround_windows"] > 0, "no readahead at all")


READER = """
import os, random, sys, time
mnt, names, seconds, seed = sys.argv[1], sys.argv[2].split(","), float(sys.argv[3]), int(sys.argv[4])
rnd = random.Random(seed)
fds = [os.open(os.path.join(mnt, n), os.O_RDONLY) for n in names]
sizes = [os.fstat(fd).st_size for fd in fds]
out = 0
t = time.time()
while time.time() - t < seconds:
    i = rnd.randrange(len(fds))
    off = rnd.randrange(sizes[i])
    b = os.pread(fds[i], 65536, off)
    out = (out * 31 + sum(b[::4096]) + off) % (1 << 61)
print("ok")
"""


def test_groups():
    """group_by=uid: readers as two uids each stay under group_max while
    the root budget holds both; every byte still correct."""
    require_root_fuse()
    with tmpdir() as d:
        src, dst, mnt = d + "/src", d + "/dst", d + "/mnt"
        files = make_tree(src)
        pack(src, dst)
        os.chmod(d, 0o755)
        opts = "budget=10M,group_by=uid,group_max=3M,allow_other,threads=4"
        names = "big/text.log,big/random.bin,big/mixed.dat"
        with Mount(dst, mnt, opts) as m:
            procs = [subprocess.Popen(["python3", "-c", READER, mnt, names, "4", str(uid)],
                                      user=uid, group=uid, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
                     for uid in (1001, 1002)]
            stop, errors = threading.Event(), []
            root_reader = storm_thread(mnt, files, stop, errors, 9)
            seen = set()
            maxes = {}
            while any(p.poll() is None for p in procs):
                for g in ("uid_1001", "uid_1002", "uid_0"):
                    if os.path.isdir(mnt + "/.zfolio/" + g):
                        seen.add(g)
                        cur = int(m.ctl("memory.current", g))
                        maxes[g] = max(maxes.get(g, 0), cur)
                        check(cur <= 3 << 20, "%s at %d, over group_max" % (g, cur))
                root = int(m.ctl("memory.current"))
                check(root <= 10 << 20, "root over budget: %d" % root)
                time.sleep(0.02)
            stop.set()
            root_reader.join()
            for p in procs:
                out, err = p.communicate()
                check(p.returncode == 0 and "ok" in out, "reader failed: " + err[-500:])
            check(not errors, "root reader: " + "; ".join(errors[:3]))
            check({"uid_1001", "uid_1002", "uid_0"} <= seen, "groups made: " + str(seen))
            print("group peaks (MiB): " + ", ".join("%s %.1f" % (g, v / 2**20)
                                                   for g, v in sorted(maxes.items())))
            check(all(v > 1 << 20 for v in maxes.values()), "a group never filled")
            st = m.stat("uid_1001")
            check(st["pgfault"] > 0, "per-group stats")
            check(m.stat()["pgfault"] >= st["pgfault"], "hierarchical stats")
            r = subprocess.run([ZFOLIOCTL, "groups", mnt], capture_output=True, text=True)
            check("uid_1001" in r.stdout, "zfolioctl groups: " + r.stdout)
            # bytes seen by another uid are the source's
            r = subprocess.run(["cmp", mnt + "/big/mixed.dat", src + "/big/mixed.dat"],
                               user=1001, capture_output=True, text=True)
            check(r.returncode == 0, "cmp as uid 1001: " + r.stdout + r.stderr)


if __name__ == "__main__":
    main(globals(), "test_mount.py")
