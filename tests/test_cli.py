#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The tools' command lines: what zfolio, mkzfolio and zfolioctl say, and
what zfolioctl makes of the path, the mount and the file it is given.

    test_cli.py version | not_mount | ctl_name | groups | writes | stat | inspect |
                frames | index | growing | changing | xattrs | sparse | summary
"""
import errno
import fcntl
import os
import random
import re
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zftest import *  # noqa: E402,F401,F403

FRAME = 128 << 10


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=60, **kw)


def ctl(*args, **kw):
    return run([ZFOLIOCTL, *args], **kw)


def packed(d, files, *args):
    """files {name: bytes} packed into d/dst; returns dst."""
    src, dst = d + "/src", d + "/dst"
    os.makedirs(src)
    for name, data in files.items():
        with open(os.path.join(src, name), "wb") as f:
            f.write(data)
    pack(src, dst, TREE, *args)
    return dst


def test_version():
    """-V and --version: one line with the version each program was built
    with, the same for all three; --help lists the new options."""
    versions = {}
    for prog, name, pattern in ((ZFOLIO, "zfolio", r"zfolio (\S+), libfuse \S+, zstd \S+"),
                                (MKZFOLIO, "mkzfolio", r"mkzfolio (\S+), zstd \S+"),
                                (ZFOLIOCTL, "zfolioctl", r"zfolioctl (\S+)")):
        for flag in ("-V", "--version"):
            r = run([prog, flag])
            check(r.returncode == 0, "%s %s: exit status %d" % (name, flag, r.returncode))
            m = re.fullmatch(pattern, r.stdout.strip())
            check(m and "\n" not in r.stdout.strip(), "%s %s: %r" % (name, flag, r.stdout))
            versions.setdefault(name, m.group(1))
    check(len(set(versions.values())) == 1, "versions differ: %s" % versions)
    h = run([ZFOLIOCTL, "--help"])
    check(h.returncode == 0 and "inspect FILE.zst" in h.stdout and "--version" in h.stdout,
          "zfolioctl --help: " + h.stdout)
    h = run([MKZFOLIO, "--help"])
    check(h.returncode == 0 and "--version" in h.stdout, "mkzfolio --help: " + h.stdout)
    # a wrong command or argument count is named, in one line, not the
    # whole help; no command at all gets the help
    for args, want in ((["bogus", "x"], "zfolioctl: no command 'bogus' (try -h)"),
                       (["stat"], "usage: zfolioctl stat MNT [--json] [--interval S]"),
                       (["set", "m", "max"], "usage: zfolioctl set MNT KEY VALUE")):
        r = ctl(*args)
        check(r.returncode == 2 and r.stderr == want + "\n", "zfolioctl %s: %d %r" %
              (" ".join(args), r.returncode, r.stderr))
    r = ctl()
    check(r.returncode == 2 and "inspect FILE.zst" in r.stderr, "zfolioctl alone: " + r.stderr)
    # zfolio names a mistyped flag or a missing argument first, in its own
    # words, whatever else the line holds
    with tempfile.TemporaryDirectory() as d:
        gone = d + "/gone"
        for args, want in ((["--bogus"], "unknown option '--bogus'"),
                           (["-x", d, d], "unknown option '-x'"),
                           ([d], "need a MOUNTPOINT after the DATASET"),
                           ([], "need DATASET and MOUNTPOINT"),
                           ([d, gone], "mountpoint %s: No such file" % gone),
                           ([d, d, "extra"], "one DATASET and one MOUNTPOINT, then 'extra'?")):
            one_line_error(run([ZFOLIO, *args]), "zfolio " + " ".join(args), "zfolio: " + want)


def test_not_mount():
    """Every mount command on a directory that is not a zfolio mount says
    so, in one line, instead of naming a control file it did not find; a
    mount made with another ctl= name gets --ctl suggested."""
    require_root_fuse()
    with tmpdir() as d:
        for cmd in (["stat"], ["stat", "--json"], ["groups"], ["set", "max", "1M"],
                    ["reclaim", "1M"]):
            r = ctl(cmd[0], d, *cmd[1:])
            check(r.stderr == "zfolioctl: %s is not a zfolio mount\n" % d,
                  "%s on a plain directory: %r" % (cmd, r.stderr))
            check(r.returncode == 1, "%s on a plain directory: status %d" % (cmd, r.returncode))
        one_line_error(ctl("stat", d + "/missing"), "a missing path", "No such file")
        dst = packed(d, {"f": text_bytes(10000, 1)})
        os.makedirs(dst + "/sub")
        with Mount(dst, d + "/mnt", "budget=4M,ctl=.other"):
            one_line_error(ctl("stat", d + "/mnt/sub"), "a directory inside a mount",
                           "is not a zfolio mount")
            line = one_line_error(ctl("stat", d + "/mnt"), "ctl=.other", "--ctl")
            check("control directory" in line, "ctl=.other: " + line)
            r = ctl("stat", d + "/mnt", "--ctl", ".other")
            check(r.returncode == 0 and "memory" in r.stdout, "--ctl .other: " + r.stderr)
            one_line_error(ctl("stat", d + "/mnt", "--ctl", ".other", "--group", "nope"),
                           "a missing group", "no group nope")


def test_ctl_name():
    """A dataset with a .zfolio of its own at its root (packed, and a tree
    of .zst files): the mount says at once that the control directory
    hides it; the control directory answers, whatever was asked first (a
    listing of the root does not show the dataset's); with ctl=NAME both
    are there."""
    require_root_fuse()
    with tmpdir() as d:
        src, mnt = d + "/src", d + "/mnt"
        os.makedirs(src + "/.zfolio")
        with open(src + "/.zfolio/notes", "wb") as f:
            f.write(b"mine\n")
        with open(src + "/a", "wb") as f:
            f.write(b"a\n")
        pack(src, d + "/packed")
        pack(src, d + "/tree", TREE)
        for dst in (d + "/packed", d + "/tree"):
            with Mount(dst, mnt) as m:
                check(sorted(os.listdir(mnt)) == ["a"], "%s: %r" % (dst, os.listdir(mnt)))
                check("memory.current" in os.listdir(mnt + "/.zfolio"), dst + ": ctl")
                check(not os.path.exists(mnt + "/.zfolio/notes"), dst + ": shadowed")
                check("has a .zfolio of its own at its root, which the control "
                      "directory hides" in m.output(), dst + ": not said: " + m.output())
            with Mount(dst, mnt, "ctl=.zf") as m:
                with open(mnt + "/.zfolio/notes", "rb") as f:
                    check(f.read() == b"mine\n", dst + ": ctl=.zf")
                check("memory.current" in os.listdir(mnt + "/.zf"), dst + ": ctl=.zf")
                check("hides" not in m.output(), dst + ": said with ctl=.zf")
            # in the background: said on the terminal, before the command returns
            r = subprocess.run([ZFOLIO, dst, mnt], capture_output=True, text=True, timeout=30)
            try:
                check(r.returncode == 0 and "control directory hides" in r.stderr,
                      "background: %d %r" % (r.returncode, r.stderr))
            finally:
                subprocess.run(["fusermount3", "-u", mnt], capture_output=True)


def test_groups():
    """groups prints the root group first, also when there are no child
    groups (group_by=none), and children indented below it."""
    require_root_fuse()
    with tmpdir() as d:
        dst = packed(d, {"f": text_bytes(300000, 2)})
        with Mount(dst, d + "/mnt", "budget=4M"):
            with open(d + "/mnt/f", "rb") as f:
                f.read()
            r = ctl("groups", d + "/mnt")
            lines = r.stdout.splitlines()
            check(r.returncode == 0 and len(lines) == 2, "groups, group_by=none: %r" % r.stdout)
            check(re.match(r"/\s+\d+\.\d MiB", lines[0]), "the root line: %r" % lines[0])
            check("no child groups" in lines[1] and "group_by=none" in lines[1],
                  "the note: %r" % lines[1])
        with Mount(dst, d + "/mnt", "budget=4M,group_by=uid"):
            with open(d + "/mnt/f", "rb") as f:
                f.read()
            r = ctl("groups", d + "/mnt")
            lines = r.stdout.splitlines()
            check(r.returncode == 0 and len(lines) == 2, "groups, group_by=uid: %r" % r.stdout)
            check(re.match(r"/\s+\d+\.\d MiB", lines[0]), "the root line: %r" % lines[0])
            check(re.match(r"  uid_0\s+\d+\.\d MiB", lines[1]), "the child line: %r" % lines[1])


# common/common.h: _IOW('z', 1, struct zf_ctl_write), 128 bytes
ZF_IOC_CTL_WRITE = (1 << 30) | (128 << 16) | (ord("z") << 8) | 1


def test_writes():
    """On a mount made with -o ro the kernel refuses write opens (EROFS), so
    echo cannot change a control file there; zfolioctl set and reclaim
    still do (an ioctl on the control directory), for the root group and a
    child group.  For a user who is neither the owner nor root they say who
    may write."""
    require_root_fuse()
    with tmpdir() as d:
        dst = packed(d, {"f": text_bytes(300000, 3)})
        mnt = d + "/mnt"
        with Mount(dst, mnt, "ro,budget=4M,group_by=uid"):
            opts = [l.split()[5] for l in open("/proc/self/mountinfo") if l.split()[4] == mnt]
            check(opts and "ro" in opts[0].split(","), "not mounted ro: %s" % opts)
            try:
                with open(mnt + "/.zfolio/memory.max", "w") as f:
                    f.write("1M")
                fail("a write open of memory.max on an ro mount")
            except OSError as e:
                check(e.errno == errno.EROFS, "echo on an ro mount: %s" % e)
            for cmd, file, want in ((["set", mnt, "max", "3M"], "memory.max", 3 << 20),
                                    (["set", mnt, "high", "2M"], "memory.high", 2 << 20)):
                r = ctl(*cmd)
                check(r.returncode == 0 and not r.stderr, "%s on an ro mount: %s" % (cmd, r.stderr))
                with open(mnt + "/.zfolio/" + file) as f:
                    check(int(f.read()) == want, "%s on an ro mount: %s unchanged" % (cmd, file))
            with open(mnt + "/f", "rb") as f:
                f.read()
            before = int(open(mnt + "/.zfolio/memory.current").read())
            r = ctl("reclaim", mnt, "64K")
            check(r.returncode == 0 and not r.stderr, "reclaim on an ro mount: " + r.stderr)
            after = int(open(mnt + "/.zfolio/memory.current").read())
            check(after <= before - 65536, "reclaim on an ro mount: %d -> %d" % (before, after))
            # the ioctl is the control directory's: elsewhere ENOTTY
            w = struct.pack("64s64s", b"memory.max", b"1M")
            for path in (mnt, mnt + "/f", mnt + "/.zfolio/memory.max"):
                fd = os.open(path, os.O_RDONLY)
                try:
                    fcntl.ioctl(fd, ZF_IOC_CTL_WRITE, w)
                    fail("ZF_IOC_CTL_WRITE on %s" % path)
                except OSError as e:
                    check(e.errno == errno.ENOTTY, "ZF_IOC_CTL_WRITE on %s: %s" % (path, e))
                finally:
                    os.close(fd)
            # and there it writes (the same request as zfolioctl's)
            fd = os.open(mnt + "/.zfolio", os.O_RDONLY)
            try:
                fcntl.ioctl(fd, ZF_IOC_CTL_WRITE, struct.pack("64s64s", b"memory.max", b"5M"))
            finally:
                os.close(fd)
            with open(mnt + "/.zfolio/memory.max") as f:
                check(int(f.read()) == 5 << 20, "ZF_IOC_CTL_WRITE on the control directory")
            one_line_error(ctl("set", mnt, "max", "banana"), "a bad value on an ro mount",
                           "Invalid argument")
            # a negative size is a bad value too, not options -5 -M
            one_line_error(ctl("set", mnt, "max", "-5M"), "a negative size",
                           "Invalid argument")
            # a child group, by --group (root's reads made uid_0)
            r = ctl("set", mnt, "max", "1M", "--group", "uid_0")
            check(r.returncode == 0 and not r.stderr, "set --group on an ro mount: " + r.stderr)
            with open(mnt + "/.zfolio/uid_0/memory.max") as f:
                check(int(f.read()) == 1 << 20, "set --group on an ro mount")
            r = ctl("stat", mnt)
            check(r.returncode == 0 and "5.0 MiB" in r.stdout, "stat on an ro mount: " + r.stderr)
        os.chmod(d, 0o755)
        with Mount(dst, mnt, "budget=4M,allow_other"):
            r = ctl("set", mnt, "max", "1M", user=65534)
            one_line_error(r, "set as another uid", "only the mount's owner and root")
            r = ctl("set", mnt, "max", "banana")
            one_line_error(r, "a bad value", "Invalid argument")
            r = ctl("set", mnt, "max", "2M")
            check(r.returncode == 0 and not r.stderr, "set as root: " + r.stderr)
            with open(mnt + "/.zfolio/memory.max") as f:
                check(int(f.read()) == 2 << 20, "set max 2M")


def stat_lines(out):
    """zfolioctl stat's statistic lines: {name: the words after it}."""
    lines = {}
    for l in out.splitlines():
        if l.startswith("  ") and not l.startswith("  memory "):
            w = l.split()
            lines[w[0]] = w[1:]
    return lines


def test_stat():
    """stat --interval: events as rates, gauges as sizes, derived items
    (readaround_window_pages, an average) as their value, not a rate."""
    require_root_fuse()
    import mmap
    with tmpdir() as d:
        data = text_bytes(6 << 20, 4)
        dst = packed(d, {"f": data})
        with Mount(dst, d + "/mnt", "budget=16M,ra_kb=512,cache=engine") as m:
            fd = os.open(d + "/mnt/f", os.O_RDONLY)
            try:
                mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                for pg in range(0, len(data) // 4096, 97):  # scattered faults
                    check(mm[pg * 4096:pg * 4096 + 8] == data[pg * 4096:pg * 4096 + 8],
                          "fault at page %d" % pg)
                mm.close()
            finally:
                os.close(fd)
            st = m.stat()
            check(st["readaround_window_pages"] > 0, "no read-around: %s" % st)
            r = ctl("stat", d + "/mnt", "--interval", "0.3")
            check(r.returncode == 0, "stat --interval: " + r.stderr)
            lines = stat_lines(r.stdout)
            derived = lines["readaround_window_pages"]
            check(derived[0] == str(st["readaround_window_pages"]) and derived[1] != "/s",
                  "derived item: %s, memory.stat says %d" % (derived,
                                                              st["readaround_window_pages"]))
            check(lines["pgfault"][1] == "/s", "an event: %s" % lines["pgfault"])
            check(lines["file"][1] == "MiB", "a gauge: %s" % lines["file"])
            lines = stat_lines(ctl("stat", d + "/mnt").stdout)
            check(lines["pgfault"][0] == str(m.stat()["pgfault"]), "stat: pgfault")
            r = ctl("stat", d + "/mnt", "--interval", "soon")
            check(r.returncode == 1 and "interval" in r.stderr, "a bad interval: " + r.stderr)


def check_index(info, data, size, what):
    """The frames cover the content and the file, in order, without gaps."""
    fl = info["frame_list"]
    check(info["frames"] == len(fl), what + ": frame count")
    check(sum(f["d_size"] for f in fl) == len(data) == info["content_size"],
          what + ": content sizes")
    check(info["file_size"] == size, what + ": file size")
    c = d = 0
    for f in fl:
        check(f["c_off"] == c and f["d_off"] == d, what + ": frame at %d/%d" % (c, d))
        c += f["c_size"]
        d += f["d_size"]


def frame_content(path, fr):
    """One frame decoded on its own, by zstd: the offsets are real."""
    with open(path, "rb") as f:
        f.seek(fr["c_off"])
        blob = f.read(fr["c_size"])
    return subprocess.run(["zstd", "-q", "-d", "-c"], input=blob, capture_output=True,
                          check=True).stdout


def test_inspect():
    """inspect --json on packed files: the frames add up to the content and,
    compressed, to the seek table's offset; each decodes to its range.  A
    file of many frames is printed whole.  Foreign files are walked; a file
    that is not zstd and a lying seek table fail with the parser's message."""
    with tmpdir() as d:
        files = {"text": text_bytes(5 * FRAME + 123, 5), "empty": b"", "one": b"x",
                 "many": rand_bytes(3000 * 4096 + 5, 6)}
        dst = packed(d, files, "--frame", "4K")
        for name, data in files.items():
            z = "%s/%s.zst" % (dst, name)
            info = inspect_zst(z)
            check(info["kind"] == "seekable" and info["checksums"] is True, name + ": kind")
            check_index(info, data, os.path.getsize(z), name)
            check(sum(f["c_size"] for f in info["frame_list"]) == info["table_offset"],
                  name + ": compressed sizes do not add up to the table's offset")
            check(info["table_offset"] + info["table_size"] == info["file_size"],
                  name + ": the table does not end the file")
            for fr in info["frame_list"][:3] + info["frame_list"][-2:]:
                check(frame_content(z, fr) == data[fr["d_off"]:fr["d_off"] + fr["d_size"]],
                      name + ": frame at %d" % fr["c_off"])
        check(inspect_zst(dst + "/many.zst")["frames"] == 3001, "many frames")
        r = ctl("inspect", dst + "/text.zst")
        check(r.returncode == 0 and "seekable" in r.stdout and "frames" in r.stdout,
              "inspect: " + r.stdout + r.stderr)
        # two zstd outputs one after the other: no seek table, walked
        with open(d + "/multi.zst", "wb") as out:
            for name in ("text", "one"):
                out.write(subprocess.run(["zstd", "-q", "-c", d + "/src/" + name],
                                         capture_output=True, check=True).stdout)
        info = inspect_zst(d + "/multi.zst")
        check(info["kind"] == "walked" and info["table_offset"] is None, "walked: %s" % info)
        check_index(info, files["text"] + files["one"], os.path.getsize(d + "/multi.zst"),
                    "walked")
        check(all(f["checksum"] is None for f in info["frame_list"]), "walked checksums")
        check(info["frames_checked"] == 2, "zstd's own checksums: %s" % info)
        r = ctl("inspect", d + "/multi.zst")
        check(r.returncode == 0 and "zstd's checksum in every frame" in r.stdout,
              "inspect of zstd CLI output: " + r.stdout + r.stderr)
        with open(d + "/mixed.zst", "wb") as out:
            for flag in ("--check", "--no-check"):
                out.write(subprocess.run(["zstd", "-q", flag, "-c", d + "/src/one"],
                                         capture_output=True, check=True).stdout)
        r = ctl("inspect", d + "/mixed.zst")
        check(r.returncode == 0 and "zstd's checksum in 1 of them" in r.stdout,
              "inspect of frames with and without: " + r.stdout + r.stderr)
        with open(d + "/plain.zst", "wb") as f:
            f.write(files["text"][:5000])
        r = ctl("inspect", d + "/plain.zst", "--json")
        one_line_error(r, "not zstd", "not a zstd file")
        check(r.stdout == "", "output for a file that is not zstd: %r" % r.stdout[:200])
        with open(dst + "/text.zst", "r+b") as f:
            f.seek(-9, 2)
            f.write((0x7FFFFFFF).to_bytes(4, "little"))
        one_line_error(ctl("inspect", dst + "/text.zst"), "a lying table", "seek table")


def test_frames():
    """mkzfolio's frame sizes: by default a big file in 32K frames, small
    files packed whole in frames of up to 128K (--small); --small above
    --frame sizes the packs' frames; above 16M it is refused.  Every byte
    reads back through a mount."""
    require_root_fuse()
    with tmpdir() as d:
        src = d + "/src"
        os.makedirs(src)
        files = {"big": text_bytes(300 << 10, 7), "s60": text_bytes(60 << 10, 8),
                 "s100": text_bytes(100 << 10, 9), "s20": text_bytes(20 << 10, 10)}
        for name, data in files.items():
            with open(os.path.join(src, name), "wb") as f:
                f.write(data)

        def frames(dst):
            """d_size of the frames of each data file, biggest file first"""
            out = []
            for name in sorted(os.listdir(dst + "/data")):
                info = inspect_zst(dst + "/data/" + name)
                out.append([f["d_size"] for f in info["frame_list"]])
            return sorted(out, key=sum, reverse=True)

        pack(src, d + "/dflt")
        big, packs = frames(d + "/dflt")
        check(big == [32 << 10] * 9 + [12 << 10], "the big file's frames: %s" % big)
        # s100 and s20 together, s60 in a frame of its own (packed in name order)
        check(packs == [120 << 10, 60 << 10], "the pack's frames: %s" % packs)
        with Mount(d + "/dflt", d + "/mnt", "budget=8M"):
            for name, data in files.items():
                with open(os.path.join(d, "mnt", name), "rb") as f:
                    check(f.read() == data, name + " through the mount")
        pack(src, d + "/small", "--frame", "16K", "--small", "64K")
        big, s100, packs = frames(d + "/small")
        check(set(big[:-1]) == {16 << 10} and set(s100[:-1]) == {16 << 10},
              "big files in 16K frames: %s %s" % (big, s100))
        check(packs == [20 << 10, 60 << 10], "packs in frames of up to 64K: %s" % packs)
        r = subprocess.run([MKZFOLIO, "-q", "--small", "17M", src, d + "/bad"],
                           capture_output=True, text=True)
        one_line_error(r, "--small 17M", "--small")


def test_index():
    """A file's frame index is charged to the budget at about 30 bytes a
    frame (the packed index, a cache slot and a part-read counter), not
    the 60 of an index kept wide: 4096 frames of 4K."""
    require_root_fuse()
    with tmpdir() as d:
        data = text_bytes(16 << 20, 11)
        src, dst = d + "/src", d + "/dst"
        os.makedirs(src)
        with open(src + "/f", "wb") as f:
            f.write(data)
        pack(src, dst, "--frame", "4K")
        frames = len(inspect_zst(dst + "/data/" + os.listdir(dst + "/data")[0])
                     ["frame_list"])
        check(frames == 4096, "%d frames" % frames)
        with Mount(dst, d + "/mnt", "budget=64M") as m:
            path = os.path.join(d, "mnt", "f")
            os.stat(path)
            before = m.stat()["slab_reclaimable"]
            with open(path, "rb") as f:
                check(f.read(4096) == data[:4096], "the first page")
                grown = m.stat()["slab_reclaimable"] - before
            check(0 < grown <= frames * 32 + 8192,
                  "the index of %d frames took %d bytes" % (frames, grown))
            with open(path, "rb") as f:
                check(f.read() == data, "every byte through the mount")


def pack_while_removing(src, dst, layout, seed):
    """mkzfolio src dst while a thread removes the 3,000 files it puts in
    src, in a random order, one about every half millisecond for as long
    as mkzfolio runs (so that some land between a file's listing and its
    read, whatever the machine's speed): (the process, its stderr)."""
    for i in range(3000):
        with open(src + "/v%04d" % i, "wb") as f:
            f.write(b"%d\n" % i)
    stop = threading.Event()
    order = list(range(3000))
    random.Random(seed).shuffle(order)

    def remove():
        for i in order:
            if stop.wait(0.0005):
                return
            os.unlink(src + "/v%04d" % i)
    p = subprocess.Popen([MKZFOLIO, "-q", "-j", "1", "--layout", layout, src, dst],
                         stderr=subprocess.PIPE, text=True)
    t = threading.Thread(target=remove)
    t.start()
    err = p.communicate(timeout=300)[1]
    stop.set()
    t.join()
    for i in range(3000):  # what the thread had not removed yet
        try:
            os.unlink(src + "/v%04d" % i)
        except FileNotFoundError:
            pass
    return p, err


def test_growing():
    """A file that grows while mkzfolio reads it (a log being written) is
    packed as it was when listed, its first bytes, and said as tar says
    it, exit status 1; the dataset mounts and serves those bytes.  Both
    layouts."""
    require_root_fuse()
    with tmpdir() as d:
        for layout in ("packed", "tree"):
            src = d + "/src_" + layout
            os.makedirs(src)
            with open(src + "/log", "wb") as f:
                f.write(text_bytes(32 << 20, 7))
            stop = threading.Event()

            def grow():
                with open(src + "/log", "ab") as f:
                    while not stop.is_set():
                        f.write(b"x" * 4096)
                        f.flush()
                        time.sleep(0.001)

            t = threading.Thread(target=grow)
            t.start()
            try:
                p = subprocess.run([MKZFOLIO, "-q", "--layout=" + layout, src, d + "/dst_" + layout],
                                   capture_output=True, text=True, timeout=120)
            finally:
                stop.set()
                t.join()
            err = p.stderr
            check(p.returncode == 1, "%s: exit status %d: %s" % (layout, p.returncode, err))
            check(src + "/log: changed while being read" in err and "pack again" in err,
                  "%s: %r" % (layout, err))
            with open(src + "/log", "rb") as f:
                whole = f.read()
            with Mount(d + "/dst_" + layout, d + "/mnt"):
                with open(d + "/mnt/log", "rb") as f:
                    got = f.read()
            check(32 << 20 <= len(got) < len(whole) and got == whole[:len(got)],
                  "%s: %d bytes served of %d, the first ones: %s" % (
                      layout, len(got), len(whole), got == whole[:len(got)]))
            print("%s: packed %d bytes of a file grown to %d; %s" % (
                layout, len(got), len(whole), err.strip().splitlines()[0]))


def test_changing():
    """mkzfolio on a tree that changes under it, as tar does: a file that
    shrinks while read is packed as read, the rest zeros; a file removed
    between listing and reading is left out; files the user cannot read
    are left out; each said, exit status 1, and the dataset is whole and
    mounts."""
    require_root_fuse()
    sysfs = "/sys/kernel/mm/transparent_hugepage/enabled"
    with tmpdir() as d:
        for layout in ("packed", "tree"):
            src = d + "/src_" + layout
            os.makedirs(src)
            # a sysfs file says 4096 bytes and holds fewer: it "shrinks"
            with open(src + "/short", "wb"):
                pass
            subprocess.run(["mount", "--bind", sysfs, src + "/short"], check=True)
            try:
                st = os.stat(src + "/short")
                with open(sysfs, "rb") as f:
                    got = f.read()
                check(st.st_size > len(got), "%s: %d bytes, size %d" %
                      (sysfs, len(got), st.st_size))
                # removals race the walk: tried again until one lands
                # between a listing and a read
                for attempt in range(5):
                    dst = d + "/dst_%s_%d" % (layout, attempt)
                    p, err = pack_while_removing(src, dst, layout, attempt)
                    gone = err.count("removed while being packed")
                    if gone:
                        break
            finally:
                subprocess.run(["umount", src + "/short"], capture_output=True)
            check(p.returncode == 1, "%s: exit status %d: %s" % (layout, p.returncode, err))
            check(src + "/short: shrank while being read" in err, "%s: %r" % (layout, err))
            check("changed while being read: pack again" in err, "%s: %r" % (layout, err))
            check(gone > 0, "%s: no removal landed in 5 packs" % layout)
            with Mount(dst, d + "/mnt"):
                with open(d + "/mnt/short", "rb") as f:
                    check(f.read() == got + bytes(st.st_size - len(got)),
                          "%s: the short file" % layout)
                names = [n for n in os.listdir(d + "/mnt") if n.startswith("v")]
                for n in names:
                    with open(d + "/mnt/" + n, "rb") as f:
                        check(f.read() == b"%d\n" % int(n[1:]), "%s: %s" % (layout, n))
            print("%s: %d of 3000 packed, %d said removed (pack %d)" %
                  (layout, len(names), gone, attempt + 1))
        # packed by a user who cannot read all of it: the rest is packed
        os.chmod(d, 0o755)
        src = d + "/src_user"
        os.makedirs(src + "/locked")
        for name in ("a", "secret", "locked/x"):
            with open(src + "/" + name, "wb") as f:
                f.write(name.encode())
        os.chmod(src + "/secret", 0o600)
        os.chmod(src + "/locked", 0o700)
        os.makedirs(d + "/out", mode=0o777)
        os.chmod(d + "/out", 0o777)
        for layout in ("packed", "tree"):
            dst = d + "/out/" + layout
            r = run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                     MKZFOLIO, "-q", "--layout", layout, src, dst])
            check(r.returncode == 1, "%s as a user: %d %s" % (layout, r.returncode, r.stderr))
            for needle in ("secret: Permission denied; not packed", "locked: Permission denied",
                           "2 entries could not be read: left out, or packed empty"):
                check(needle in r.stderr, "%s: %r does not say %r" % (layout, r.stderr, needle))
            with Mount(dst, d + "/mnt"):
                with open(d + "/mnt/a", "rb") as f:
                    check(f.read() == b"a", layout + ": a")
                check(os.listdir(d + "/mnt/locked") == [], layout + ": locked packed empty")
                check(not os.path.exists(d + "/mnt/secret"), layout + ": secret packed")


def acl_bytes(entries):
    """A POSIX ACL as its xattr holds it: version 2, then (tag, perm, id)."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", t, p, i)
                                           for t, p, i in entries)


ANY = 0xffffffff  # the id of an ACL entry that has none


def xattrs_of(path):
    """[(name, value)] of path itself (not a link's target), in order."""
    return [(n, os.getxattr(path, n, follow_symlinks=False))
            for n in os.listxattr(path, follow_symlinks=False)]


def tar_xattrs_sum(root):
    # --xattrs writes the pax format, which would hold ctime and atime
    r = subprocess.run("tar -C '%s' --sort=name --numeric-owner --xattrs "
                       "--xattrs-include='*' --acls --pax-option=delete=ctime,"
                       "delete=atime -cf - . | sha256sum" % root,
                       shell=True, capture_output=True, check=True)
    return r.stdout.split()[0]


def as_user(uid, path):
    """Can uid read path? (setpriv from util-linux)"""
    return subprocess.run(["setpriv", "--reuid=%d" % uid, "--regid=%d" % uid,
                           "--clear-groups", "cat", path],
                          capture_output=True).returncode == 0


def test_xattrs():
    """Extended attributes: the packed layout keeps them (user, trusted and
    security names, ACLs, any bytes in names and values, on files,
    directories, links, hard links and the root), and the mount gives them
    back in the source's order, so that `tar --xattrs --acls` of the mount
    equals the source's, and checks access by the ACLs as the source does.
    A dataset without any answers as before (the kernel is told once that
    there are none).  The tree layout does not keep them, and mkzfolio
    says how many entries had some (an SELinux label alone aside)."""
    require_root_fuse()
    with tmpdir() as d:
        os.chmod(d, 0o755)  # for the users who try the ACLs
        src = d + "/src"
        os.makedirs(src + "/sub")
        for name in ("a", "b", "sub/c", "open", "closed"):
            with open(src + "/" + name, "wb") as f:
                f.write(name.encode() + b"\n")
        os.symlink("a", src + "/l")
        r = run([MKZFOLIO, "-q", src, d + "/plain"])
        check(r.returncode == 0 and "extended" not in r.stderr, "no xattrs: %r" % r.stderr)
        with Mount(d + "/plain", d + "/mnt"):
            for _ in range(2):
                try:
                    os.listxattr(d + "/mnt/a")
                    check(False, "a dataset without xattrs listed some")
                except OSError as e:
                    check(e.errno == errno.EOPNOTSUPP, "without xattrs: %s" % e)

        os.link(src + "/a", src + "/sub/hard")
        os.setxattr(src + "/a", "user.empty", b"")
        os.setxattr(src + "/b", "user.k", b"v")
        os.setxattr(src + "/b", "user.odd name=\\ \t", bytes(range(256)))
        os.setxattr(src + "/b", "user.a", b"after the others")
        os.setxattr(src + "/sub", "user.k", b"dir")
        os.setxattr(src, "user.root", b"top")
        os.setxattr(src + "/l", "trusted.link", b"of the link", follow_symlinks=False)
        # CAP_NET_BIND_SERVICE, effective (struct vfs_cap_data, revision 2)
        os.setxattr(src + "/sub/c", "security.capability",
                    struct.pack("<IIIII", 0x02000001, 1 << 10, 0, 0, 0))
        # 'open': mode 0640 root's, and uid 1000 may read it by its ACL
        os.chmod(src + "/open", 0o640)
        os.chmod(src + "/closed", 0o640)
        os.setxattr(src + "/open", "system.posix_acl_access",
                    acl_bytes([(1, 6, ANY), (2, 4, 1000), (4, 4, ANY), (0x10, 4, ANY),
                               (0x20, 0, ANY)]))
        os.setxattr(src + "/sub", "system.posix_acl_default",
                    acl_bytes([(1, 7, ANY), (4, 5, ANY), (0x20, 5, ANY)]))
        check(as_user(1000, src + "/open") and not as_user(1001, src + "/open")
              and not as_user(1000, src + "/closed"), "the source's ACLs do not work")

        r = run([MKZFOLIO, "-q", "--layout", "tree", src, d + "/tree"])
        check(r.returncode == 0, "tree: %r" % r.stderr)
        check("8 entries have extended attributes (the first: %s)" % src in r.stderr
              and "the tree layout does not keep them" in r.stderr, "tree: %r" % r.stderr)
        r = run([MKZFOLIO, "-q", src, d + "/packed"])
        check(r.returncode == 0 and "extended" not in r.stderr, "packed: %r" % r.stderr)
        with Mount(d + "/packed", d + "/mnt", "allow_other"):
            paths = [src] + [os.path.join(root, name) for root, dirs, files in os.walk(src)
                             for name in dirs + files]
            seen = 0
            for a in paths:
                b = d + "/mnt" + a[len(src):]
                want = xattrs_of(a)
                check(xattrs_of(b) == want, "%s: %r, not %r" % (b, xattrs_of(b), want))
                seen += len(want)
            check(seen == 11, "the source has %d attributes, not 11" % seen)
            try:
                os.getxattr(d + "/mnt/b", "user.none")
                check(False, "an attribute that is not there was found")
            except OSError as e:
                check(e.errno == errno.ENODATA, "user.none: %s" % e)
            check(tar_xattrs_sum(d + "/mnt") == tar_xattrs_sum(src),
                  "tar --xattrs --acls of the mount differs from the source's")
            check(as_user(1000, d + "/mnt/open"), "the ACL that lets uid 1000 read is not used")
            check(not as_user(1001, d + "/mnt/open") and not as_user(1000, d + "/mnt/closed"),
                  "the mount lets a user read what the source does not")


def test_sparse():
    """A sparse file packs to the very bytes its dense copy packs to, in
    both layouts, and its holes are not read: the page cache holds little
    more than its data afterwards (reading a hole fills the cache with
    zeros)."""
    mib = 1 << 20
    size = 96 * mib + 777  # a short last frame, in the hole
    islands = ((0, text_bytes(5000, 1)),                 # data first
               (3 * mib + 100, rand_bytes(70000, 2)),    # across frames
               (20 * mib - 1, b"x"),                     # a frame's end
               (40 * mib, text_bytes(128 << 10, 3)))     # whole frames
    with tmpdir() as d:
        for name in ("sparse", "dense"):
            os.makedirs(d + "/" + name)
        with open(d + "/sparse/f", "wb") as f:
            f.truncate(size)
            for off, data in islands:
                f.seek(off)
                f.write(data)
        with open(d + "/sparse/lead", "wb") as f:  # a hole first
            f.truncate(8 * mib)
            f.seek(8 * mib - 3)
            f.write(b"end")
        for name in ("f", "lead"):
            with open(d + "/sparse/" + name, "rb") as f, open(d + "/dense/" + name, "wb") as g:
                g.write(f.read())
            st = os.stat(d + "/sparse/" + name)
            os.utime(d + "/dense/" + name, ns=(st.st_atime_ns, st.st_mtime_ns))
            fd = os.open(d + "/sparse/" + name, os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        st = os.stat(d + "/sparse")
        os.utime(d + "/dense", ns=(st.st_atime_ns, st.st_mtime_ns))
        for layout in ("packed", "tree"):
            for name in ("sparse", "dense"):
                r = run([MKZFOLIO, "-q", "--layout", layout, d + "/" + name,
                         "%s/%s.%s" % (d, name, layout)])
                check(r.returncode == 0 and not r.stderr, "%s %s: %r" % (layout, name, r.stderr))
            if layout == "packed":
                # only now: the dense copy's packing read it all
                cached = subprocess.run(["fincore", "--bytes", "--raw", "--noheadings",
                                         d + "/sparse/f"], capture_output=True, text=True)
                check(cached.returncode == 0, "fincore (util-linux): %r" % cached.stderr)
                res = int(cached.stdout.split()[0])
                check(res < 16 * mib, "the holes were read: %d bytes cached" % res)
            for root, _, files in os.walk("%s/sparse.%s" % (d, layout)):
                for fn in files:
                    a = os.path.join(root, fn)
                    b = a.replace("/sparse.%s" % layout, "/dense.%s" % layout, 1)
                    with open(a, "rb") as f, open(b, "rb") as g:
                        check(f.read() == g.read(), "%s: %s differs from its dense copy's"
                              % (layout, a))
        with Mount(d + "/sparse.packed", d + "/mnt"):
            for name in ("f", "lead"):
                with open(d + "/mnt/" + name, "rb") as f, open(d + "/dense/" + name, "rb") as g:
                    check(f.read() == g.read(), "mounted %s differs" % name)


def test_summary():
    """mkzfolio's summary counts names, in both layouts alike: a later name
    of a file, a symlink or a FIFO counts as one of its kind and as a hard
    link to an earlier one."""
    with tmpdir() as d:
        src = d + "/src"
        os.makedirs(src + "/sub")
        with open(src + "/f", "wb") as f:
            f.write(b"x" * 5000)
        os.link(src + "/f", src + "/sub/g")
        os.symlink("f", src + "/l")
        os.link(src + "/l", src + "/sub/l2", follow_symlinks=False)
        os.mkfifo(src + "/p")
        os.link(src + "/p", src + "/sub/p2")
        want = "2 files (0 stored once for several), 1 dirs, 2 links, 2 other; " \
            "3 of these names hard links to an earlier one;"
        for layout in ("packed", "tree"):
            r = run([MKZFOLIO, "--layout", layout, src, "%s/%s" % (d, layout)])
            check(r.returncode == 0 and want in r.stderr,
                  "%s: %r" % (layout, r.stderr))


if __name__ == "__main__":
    main(globals(), "test_cli.py")
