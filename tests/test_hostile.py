#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Hostile datasets: damaged and hand-made .zst files beside good ones,
served through the mount in both cache modes and by mmap; and a stop
with readers mid-read.

    test_hostile.py files | kernel | mmap | zstdcli | uring | stop

Each hostile file reads as EIO (or, for a damaged frame, EIO for that range
only), is named once in the daemon's log with its reason, keeps its size;
the daemon stays up within budget + 32 MiB; the good files read exactly.
"""
import errno
import mmap
import os
import signal
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zftest import *  # noqa: E402,F401,F403

FRAME = 128 << 10
AT_FRAME = ("--frame", "%dK" % (FRAME >> 10))  # the damage is placed by FRAME
MAGIC = struct.pack("<I", 0xFD2FB528)
BUDGET = 4 << 20


def le(fmt, *v):
    return struct.pack("<" + fmt, *v)


def huge_claim_frame():
    """A 17-byte frame whose header claims 2^40 bytes of content in a 1 KiB
    window: one empty block."""
    fhd, wd = 0xC0, 0  # 8-byte content size, window log 10
    return MAGIC + bytes([fhd, wd]) + le("Q", 1 << 40) + bytes([1, 0, 0])


def huge_window_frame():
    """A frame that needs a 1 GiB window (more than zstd -d allows)."""
    fhd, wd = 0x00, 20 << 3  # window log 10 + 20
    block = le("I", 1 | 0 << 1 | 5 << 3)[:3]  # last, raw, 5 bytes
    return MAGIC + bytes([fhd, wd]) + block + b"hello"


def set_entry(path, info, i, c_size=None, d_size=None):
    """Rewrite entry i of a packed file's seek table in place."""
    off = info["table_offset"] + 8 + 12 * i
    with open(path, "r+b") as f:
        f.seek(off)
        cs, ds, ck = struct.unpack("<III", f.read(12))
        f.seek(off)
        f.write(le("III", cs if c_size is None else c_size,
                   ds if d_size is None else d_size, ck))


def make_dataset(d):
    """Good files and hostile ones.  Returns (src, dst, good, bad, damaged):
    good {name: bytes}; bad {name: reason word the log must say}; damaged
    {name: (bytes, [(start, end) of damaged content])}."""
    src, dst = d + "/src", d + "/dst"
    os.makedirs(src)
    good = {"good/text": text_bytes(40 * FRAME + 123, 1),
            "good/rand": rand_bytes(9 * FRAME, 2),
            "good/small": text_bytes(5000, 3)}
    base = text_bytes(20 * FRAME, 4)
    for name in ("zero_csize", "claims", "damaged", "truncated"):
        good["victim/" + name] = base
    for rel, data in good.items():
        os.makedirs(os.path.dirname(src + "/" + rel), exist_ok=True)
        with open(src + "/" + rel, "wb") as f:
            f.write(data)
    pack(src, dst, TREE, *AT_FRAME)
    bad, damaged = {}, {}
    v = dst + "/victim/"
    # 1. a frame with content and no compressed bytes; the sums still add up
    info = inspect_zst(v + "zero_csize.zst")
    cs = info["frame_list"][3]["c_size"]
    set_entry(v + "zero_csize.zst", info, 3, c_size=0)
    set_entry(v + "zero_csize.zst", info, 4, c_size=info["frame_list"][4]["c_size"] + cs)
    bad["victim/zero_csize"] = "entry 3"
    # 2. an entry claiming more content than its bytes can hold
    info = inspect_zst(v + "claims.zst")
    set_entry(v + "claims.zst", info, 5, d_size=1 << 30)
    bad["victim/claims"] = "entry 5"
    # 3. a damaged frame in the middle: EIO for that range only
    info = inspect_zst(v + "damaged.zst")
    fr = info["frame_list"][7]
    with open(v + "damaged.zst", "r+b") as f:
        f.seek(fr["c_off"] + fr["c_size"] // 2)
        b = f.read(8)
        f.seek(fr["c_off"] + fr["c_size"] // 2)
        f.write(bytes(x ^ 0x55 for x in b))
    damaged["victim/damaged"] = (base, [(fr["d_off"], fr["d_off"] + fr["d_size"])])
    del good["victim/damaged"]
    # 4. a seek table whose frames run past what is left of the file
    with open(v + "truncated.zst", "r+b") as f:
        data = f.read()
        f.seek(0)
        f.truncate()
        f.write(data[:len(data) // 2] + data[-(12 * info["frames"] + 17):])
    bad["victim/truncated"] = "seek table"
    for name in ("zero_csize", "claims", "truncated"):
        del good["victim/" + name]
    # 5. hand-made frames: a huge claim, a huge window, not zstd at all
    with open(dst + "/claim.zst", "wb") as f:
        f.write(huge_claim_frame())
    bad["claim"] = "blocks hold at most"
    with open(dst + "/window.zst", "wb") as f:
        f.write(huge_window_frame())
    bad["window"] = "window"
    with open(dst + "/notzstd.zst", "wb") as f:
        f.write(b"this is not zstd\n" * 10)
    bad["notzstd"] = "not a zstd file"
    return src, dst, good, bad, damaged


def read_all(path):
    """As cat reads: 128 KiB read()s until one returns nothing."""
    out = []
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            b = os.read(fd, 128 << 10)
            if not b:
                return b"".join(out)
            out.append(b)
    finally:
        os.close(fd)


def expect_eio(fn, what):
    try:
        fn()
    except OSError as e:
        check(e.errno == errno.EIO, "%s: %s, expected EIO" % (what, e))
        return
    fail(what + ": no error")


def check_served(m, mnt, good, bad, damaged, by_mmap=False):
    """Every good file exact, every bad one EIO and logged once, damaged
    ranges EIO and the rest right; sizes never change; RSS bounded."""
    sizes = {rel: os.stat(mnt + "/" + rel).st_size for rel in list(bad) + list(damaged)}
    for rel, data in good.items():
        check(read_all(mnt + "/" + rel) == data, "good file " + rel)
    for _ in range(3):  # opened again and again: logged once
        for rel in bad:
            expect_eio(lambda: read_all(mnt + "/" + rel), "bad file " + rel)
            os.stat(mnt + "/" + rel)
    for rel, (data, ranges) in damaged.items():
        if by_mmap:
            check_mmap(mnt + "/" + rel, data, ranges)
        else:
            check_damaged(mnt + "/" + rel, data, ranges)
    for rel, size in sizes.items():
        check(os.stat(mnt + "/" + rel).st_size == size, "size of %s changed" % rel)
    out = m.output()
    for rel, reason in bad.items():
        name = os.path.basename(rel)
        lines = [l for l in out.splitlines() if name + ".zst:" in l]
        check(len(lines) == 1 and reason in lines[0],
              "log for %s: %s" % (rel, lines))
    rss = vmrss_kib(m.pid) * 1024
    if os.environ.get("ZF_SANITIZE", "none") == "none":
        check(rss <= BUDGET + (32 << 20), "daemon RSS %d over budget + 32 MiB" % rss)


def check_damaged(path, data, ranges):
    """read(): the damaged frame is EIO, every other frame right; a read
    that runs into the damage returns what comes before it, or EIO."""
    # first, from a cold start: a whole-file read stops with EIO, it never
    # ends early with success (a short page-cache fill would say "EOF")
    expect_eio(lambda: read_all(path), "reading through the damage")
    check(os.stat(path).st_size == len(data), "size after reading the damage")
    fd = os.open(path, os.O_RDONLY)
    try:
        for off in range(0, len(data), FRAME):
            hit = any(s <= off < e for s, e in ranges)
            try:
                got = os.pread(fd, FRAME, off)
                check(not hit, "damaged frame at %d read" % off)
                check(got == data[off:off + FRAME], "frame at %d" % off)
            except OSError as e:
                check(hit and e.errno == errno.EIO, "frame at %d: %s" % (off, e))
    finally:
        os.close(fd)
    expect_eio(lambda: read_all(path), "reading through the damage again")


MMAP_CHILD = r"""
import mmap, os, sys
path, start, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "rb") as f:
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    sys.stdout.buffer.write(m[start:end])
"""


def check_mmap(path, data, ranges):
    """By mmap: pages of the damaged frame raise SIGBUS, the others map
    the right bytes.  Each range is touched in a child of its own."""
    for off in range(0, len(data), FRAME):
        hit = any(s <= off < e for s, e in ranges)
        r = subprocess.run([sys.executable, "-c", MMAP_CHILD, path, str(off),
                            str(min(off + FRAME, len(data)))], capture_output=True)
        if hit:
            check(r.returncode == -signal.SIGBUS, "mmap of the damaged frame: %d" %
                  r.returncode)
        else:
            check(r.returncode == 0 and r.stdout == data[off:off + FRAME],
                  "mmap frame at %d: status %d" % (off, r.returncode))


def serve(opts, by_mmap=False):
    require_root_fuse()
    with tmpdir() as d:
        src, dst, good, bad, damaged = make_dataset(d)
        with Mount(dst, d + "/mnt", "budget=4M" + opts) as m:
            check_served(m, d + "/mnt", good, bad, damaged, by_mmap)
            # the mount lives on and still lists everything
            check(sorted(os.listdir(d + "/mnt")) == ["claim", "good", "notzstd",
                                                   "victim", "window"], "listing")


def test_files():
    serve("")


def test_kernel():
    """cache=kernel: a damaged frame in a page-cache fill is an error, never
    a short reply the kernel would take for the end of the file."""
    serve(",cache=kernel")


def test_mmap():
    serve("", by_mmap=True)


def test_zstdcli():
    """Files the zstd CLI writes with the options users pass: all served
    byte for byte, big windows included (up to zstd -d's default, or
    max_window=)."""
    require_root_fuse()
    with tmpdir() as d:
        src, dst = d + "/src", d + "/dst"
        os.makedirs(dst)
        data = text_bytes(24 << 20, 9)
        with open(d + "/orig", "wb") as f:
            f.write(data)
        variants = {"plain": ["-3"], "long24": ["--long=24"], "long27": ["--long=27"],
                    "ultra": ["--ultra", "-22", "-T2"], "nocheck": ["--no-check", "-1"],
                    "multi": ["-T2", "--rsyncable"], "fast": ["--fast=5"]}
        for name, flags in variants.items():
            subprocess.run(["zstd", "-q", "-f", *flags, d + "/orig", "-o",
                            dst + "/" + name + ".zst"], check=True)
        # a pipe: frames without a content size
        with open(d + "/orig", "rb") as fin, open(dst + "/piped.zst", "wb") as fout:
            subprocess.run(["zstd", "-q", "-c", "-"], stdin=fin, stdout=fout, check=True)
        # a dictionary: not served (zfolio takes none), and the log says why
        samples = []
        for i in range(40):
            samples.append(d + "/s%d" % i)
            with open(samples[-1], "wb") as f:
                f.write(data[i * 3000:i * 3000 + 2000])
        subprocess.run(["zstd", "-q", "-f", "--train", *samples, "-o", d + "/dict"],
                       check=True, capture_output=True)
        subprocess.run(["zstd", "-q", "-f", "-D", d + "/dict", d + "/orig", "-o",
                        d + "/dst_dict.zst"], check=True)
        # its frame header keeps no dictionary ID: its frames do not decode
        subprocess.run(["zstd", "-q", "-f", "-D", d + "/dict", "--no-dictID", d + "/orig",
                        "-o", d + "/dst_nodictid.zst"], check=True)
        os.rename(d + "/dst_dict.zst", dst + "/dict.zst")
        os.rename(d + "/dst_nodictid.zst", dst + "/nodictid.zst")
        with Mount(dst, d + "/mnt", "budget=64M") as m:
            for name in list(variants) + ["piped"]:
                check(os.stat(d + "/mnt/" + name).st_size == len(data), "size of " + name)
                check(read_all(d + "/mnt/" + name) == data, "content of " + name)
            check(m.stat()["corrupt_frames"] == 0, "corrupt frames counted")
            for name in ("dict", "nodictid"):
                try:
                    read_all(d + "/mnt/" + name)
                    fail(name + " read")
                except OSError as e:
                    check(e.errno == errno.EIO, "%s: %s" % (name, e))
            out = m.output()
            check("dict.zst: frame at offset 0 was compressed with a dictionary" in out,
                  "no message for dict.zst: %r" % out)
            check("nodictid.zst: the frame at offset 0 does not decode" in out,
                  "no message for nodictid.zst: %r" % out)
        # max_window=: a frame that needs a bigger window is refused, said
        # with the option that lifts it; the others read
        with Mount(dst, d + "/mnt", "budget=64M,max_window=16M") as m:
            for name in ("long24", "plain", "piped"):
                check(read_all(d + "/mnt/" + name) == data,
                      "content of " + name + " at max_window=16M")
            try:
                read_all(d + "/mnt/long27")
                fail("long27 read at max_window=16M")
            except OSError as e:
                check(e.errno == errno.EIO, "long27 at max_window=16M: %s" % e)
            check("long27.zst: frame at offset 0 needs a 24 MiB window, over the "
                  "limit of 16 MiB (zfolio -o max_window=SIZE)" in m.output(),
                  "no message for long27.zst: %r" % m.output())
        r = subprocess.run([ZFOLIO, dst, d + "/mnt", "-o", "max_window=3G"],
                           capture_output=True, text=True)
        check(r.returncode != 0 and "max_window: '3G' (a size from 1M to 2G)" in r.stderr,
              "max_window=3G: %r" % r.stderr)
        r = subprocess.run([ZFOLIOCTL, "inspect", dst + "/long27.zst", "--max-window",
                            "16M"], capture_output=True, text=True)
        check(r.returncode != 0 and "over the limit of 16 MiB" in r.stderr,
              "inspect --max-window 16M: %r" % r.stderr)
        # given the dictionary (dict=), its files are served, big (streamed)
        # and small (decoded whole), read in turn with files that name none
        # on one worker; a file that does not say its dictionary still not
        subprocess.run(["zstd", "-q", "-f", "-D", d + "/dict", d + "/orig", "-o",
                        dst + "/dict.zst"], check=True)
        with open(d + "/small", "wb") as f:
            f.write(data[:300000])
        subprocess.run(["zstd", "-q", "-f", "-D", d + "/dict", d + "/small", "-o",
                        dst + "/small_dict.zst"], check=True)
        subprocess.run(["zstd", "-q", "-f", d + "/small", "-o", dst + "/small_plain.zst"],
                       check=True)
        # a pipe: no content size, measured by decoding with the dictionary
        with open(d + "/small", "rb") as fin, open(dst + "/piped_dict.zst", "wb") as fout:
            subprocess.run(["zstd", "-q", "-c", "-D", d + "/dict", "-"], stdin=fin,
                           stdout=fout, check=True)
        # cache=engine and a budget smaller than the files: every round
        # decodes again, on the one worker
        with Mount(dst, d + "/mnt", "budget=4M,threads=1,cache=engine,dict=" + d + "/dict") as m:
            for _ in range(2):
                for name in ("small_dict", "small_plain", "piped_dict"):
                    check(read_all(d + "/mnt/" + name) == data[:300000],
                          "content of " + name + " with dict=")
            for name in ("dict", "plain"):
                check(read_all(d + "/mnt/" + name) == data, "content of " + name + " with dict=")
            try:
                read_all(d + "/mnt/nodictid")
                fail("nodictid read with dict=")
            except OSError as e:
                check(e.errno == errno.EIO, "nodictid with dict=: %s" % e)
            check(m.stat()["corrupt_frames"] >= 1, "nodictid's frame counted")
        # zfolioctl inspect indexes such a file given the dictionary too
        r = subprocess.run([ZFOLIOCTL, "inspect", dst + "/small_dict.zst"],
                           capture_output=True, text=True)
        check(r.returncode != 0 and "that was not given" in r.stderr, "inspect: %r" % r.stderr)
        r = subprocess.run([ZFOLIOCTL, "inspect", dst + "/small_dict.zst", "--dict",
                            d + "/dict"], capture_output=True, text=True)
        check(r.returncode == 0 and "walked" in r.stdout, "inspect --dict: %r" % r.stderr)
        # what is not a dictionary: the mount fails and says why, in one line
        r = subprocess.run([ZFOLIO, dst, d + "/mnt", "-o",
                            "dict=" + d + "/orig"], capture_output=True, text=True)
        check(r.returncode != 0 and "not a zstd dictionary" in r.stderr,
              "dict=orig: %r" % r.stderr)


def test_uring():
    """The io_uring paths: submits refused now and then are retried (all
    bytes right); a wait that fails breaks the ring, its reads are EIO, and
    the worker goes on with pread (later reads right)."""
    require_root_fuse()
    with tmpdir() as d:
        src = d + "/src"
        os.makedirs(src)
        data = text_bytes(64 * FRAME, 5)
        with open(src + "/f", "wb") as f:
            f.write(data)
        pack(src, d + "/dst", *AT_FRAME)
        with Mount(d + "/dst", d + "/mnt", "budget=2M,ra_kb=512",
                   env={"ZFOLIO_TEST_FAULT": "uring_submit:2"}):
            check(read_all(d + "/mnt/f") == data, "content with refused submits")
        # ra_kb=0 (and zfolio's cache alone: the kernel would read a
        # failed page again): every read is a demand read, so the failure
        # reaches one;
        # one worker and so one backing ring to break: /dev/fuse (over
        # io_uring each CPU's queue has a worker of its own too)
        with Mount(d + "/dst", d + "/mnt",
                   "budget=2M,ra_kb=0,threads=1,transport=dev,cache=engine",
                   env={"ZFOLIO_TEST_FAULT": "uring_wait:3"}) as m:
            errors = 0
            for _ in range(3):
                fd = os.open(d + "/mnt/f", os.O_RDONLY)
                for off in range(0, len(data), FRAME):
                    try:
                        check(os.pread(fd, FRAME, off) == data[off:off + FRAME],
                              "frame at %d" % off)
                    except OSError as e:
                        check(e.errno == errno.EIO, "broken ring: %s" % e)
                        errors += 1
                os.close(fd)
            check(errors > 0, "the broken ring failed no read")
            check(read_all(d + "/mnt/f") == data, "reads after the ring broke")
            check(m.stat()["io_errors"] >= errors, "io_errors")


def test_stop():
    """SIGTERM while readers hold files open and are mid-read: every read
    in flight returns its full, correct data; later calls fail at once;
    the daemon exits 0 within seconds; no reader is left blocked."""
    require_root_fuse()
    with tmpdir() as d:
        src = d + "/src"
        os.makedirs(src)
        data = text_bytes(200 * FRAME, 6)
        with open(src + "/f", "wb") as f:
            f.write(data)
        pack(src, d + "/dst", *AT_FRAME)
        mnt = d + "/mnt"
        # every backing read takes 100 ms: reads are in flight at the signal
        m = Mount(d + "/dst", mnt, "budget=8M,threads=6",
                  env={"ZFOLIO_TEST_FAULT": "slow:100"})
        with m:
            kill_at = [None]
            results = []
            lock = threading.Lock()

            def reader(seed):
                rnd = random.Random(seed)
                fd = os.open(mnt + "/f", os.O_RDONLY)
                while True:
                    off = rnd.randrange(0, len(data) - FRAME)
                    t0 = time.time()
                    try:
                        got = os.pread(fd, FRAME, off)
                        res = got == data[off:off + FRAME]
                        if not res:
                            res = "%s of %d bytes" % (
                                "short read" if got == data[off:off + len(got)]
                                else "wrong bytes", len(got))
                    except OSError as e:
                        res = e.errno
                    t1 = time.time()
                    with lock:
                        results.append((t0, t1, res))
                    if kill_at[0] and t0 > kill_at[0] + 1:
                        break
                try:
                    os.close(fd)
                except OSError:
                    pass

            ts = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
            for t in ts:
                t.start()
            time.sleep(1)
            kill_at[0] = time.time()
            m.proc.send_signal(signal.SIGTERM)
            check(m.proc.wait(2 + 3 * SLOW + 5) == 0, "exit status after SIGTERM")
            exited = time.time()
            for t in ts:
                t.join(10)
                check(not t.is_alive(), "a reader is blocked after the stop")
            for t0, t1, res in results:
                if t0 < kill_at[0]:  # in flight at the signal
                    check(res is True, "a read in flight at the signal: %s (started "
                          "%.3f s before it, ended %.3f s after; the daemon left "
                          "%.3f s after)" % (res, kill_at[0] - t0, t1 - kill_at[0],
                                             exited - kill_at[0]))
                elif t0 > exited:  # after the daemon left: at once
                    check(res in (errno.ENOTCONN, errno.ECONNABORTED) and t1 - t0 < SLOW,
                          "a read after the stop: %s in %.2f s" % (res, t1 - t0))
                else:
                    check(res is True or res in (errno.ENOTCONN, errno.ECONNABORTED),
                          "a read during the stop: %s" % res)
            check(exited - kill_at[0] < 2 + 3 * SLOW, "the stop took %.1f s" % (exited - kill_at[0]))
            check(not is_mounted(mnt), "still mounted after the stop")


if __name__ == "__main__":
    main(globals(), "test_hostile.py")
