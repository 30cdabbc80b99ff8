#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Nothing bad gets through: faults below (backing I/O, corrupt files;
changed and damaged datasets are test_damaged.py's), faults above (signals, unmounts), and what the daemon must never do
(follow links out of the dataset, open device nodes).

    test_faults.py eio | short | direct | corrupt | bigframe | log | signals |
                   security | soak | valgrind
"""
import ctypes
import errno
import os
import random
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zftest import *  # noqa: E402,F401,F403

FRAME = 128 << 10
MNT_FORCE = 1  # <sys/mount.h>: abort the connection, then unmount if not busy
AT_FRAME = ("--frame", "%dK" % (FRAME >> 10))  # the damage is placed by FRAME


def packed_file(d, size=40 * FRAME + 777, seed=1):
    src, dst = d + "/src", d + "/dst"
    os.makedirs(src)
    data = text_bytes(size, seed)
    with open(src + "/f", "wb") as f:
        f.write(data)
    pack(src, dst, TREE, *AT_FRAME)
    return data, dst


def read_frames(path, data):
    """Read each frame's range on its own: {frame: 'ok' | errno}.  Through
    the page cache a range that fails part way reads short (the pages
    before the failure), which counts as EIO; every byte returned must be
    right."""
    out = {}
    fd = os.open(path, os.O_RDONLY)
    try:
        for i in range((len(data) + FRAME - 1) // FRAME):
            off = i * FRAME
            try:
                got = os.pread(fd, FRAME, off)
                check(got == data[off:off + len(got)], "frame %d: wrong bytes" % i)
                out[i] = "ok" if got == data[off:off + FRAME] else errno.EIO
            except OSError as e:
                out[i] = e.errno
    finally:
        os.close(fd)
    return out


def test_eio():
    """Every 3rd backing read fails: with zfolio's cache alone those ranges
    are EIO, counted; every byte that is returned is right; the mount and
    the rest keep working.  Through the kernel's page cache the kernel
    reads a failed page again on its own, so a reader may never see the
    error: every byte right, the failures counted."""
    require_root_fuse()
    with tmpdir() as d:
        data, dst = packed_file(d)
        # ra_kb=0: one frame per read, so failures land on single frames
        with Mount(dst, d + "/mnt", "budget=2M,ra_kb=0,cache=engine",
                   env={"ZFOLIO_TEST_FAULT": "eio:3"}) as m:
            res = read_frames(d + "/mnt/f", data)
            bad = [i for i, r in res.items() if r != "ok"]
            check(bad and all(res[i] == errno.EIO for i in bad), "errors: %s" % res)
            check(len(bad) < len(res), "everything failed")
            check(m.stat()["io_errors"] >= len(bad), "io_errors not counted")
            # the failed ranges are not cached: read again, some now succeed
            again = read_frames(d + "/mnt/f", data)
            check(any(again[i] == "ok" for i in bad), "a failed frame stays failed")
            print("%d of %d frames failed once, counted %d io_errors" % (
                len(bad), len(res), m.stat()["io_errors"]))
        with Mount(dst, d + "/mnt", "budget=2M", env={"ZFOLIO_TEST_FAULT": "eio:3"}) as m:
            res = read_frames(d + "/mnt/f", data)  # every byte returned right
            check(any(r == "ok" for r in res.values()), "everything failed (kernel)")
            check(m.stat()["io_errors"] > 0, "io_errors not counted (kernel)")


def test_short():
    """Every 2nd backing read returns half: the rest is read, all bytes right."""
    require_root_fuse()
    with tmpdir() as d:
        data, dst = packed_file(d)
        with Mount(dst, d + "/mnt", "budget=2M", env={"ZFOLIO_TEST_FAULT": "short:2"}) as m:
            with open(d + "/mnt/f", "rb") as f:
                check(f.read() == data, "content with short backing reads")
            res = read_frames(d + "/mnt/f", data)
            check(all(r == "ok" for r in res.values()), "short reads became errors")
            check(m.stat()["io_errors"] == 0, "io_errors for short reads")


def dio_aligned(path):
    """What zfolio asks of a filesystem before it reads O_DIRECT: statx
    reports its direct I/O alignment, at most 4 KiB."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(256)
    AT_FDCWD, STATX_DIOALIGN = -100, 0x2000
    if libc.statx(AT_FDCWD, path.encode(), 0, STATX_DIOALIGN, buf):
        return False
    mask, mem, off = (struct.unpack_from("I", buf, 0)[0],
                      *struct.unpack_from("II", buf, 152))
    return bool(mask & STATX_DIOALIGN) and 0 < off <= 4096 and mem <= 4096


def test_direct():
    """backing_cache=direct (the default) reads frames O_DIRECT where the
    filesystem allows it, every byte right; a refused O_DIRECT read is done
    again without it, and the file is read without it from then on;
    backing_cache=drop reads none so."""
    require_root_fuse()
    with tmpdir() as d:
        data, dst = packed_file(d)
        can = dio_aligned(next(os.path.join(r, n) for r, _, ns in os.walk(dst)
                               for n in ns))
        print("O_DIRECT on the dataset's filesystem: %s" % can)
        # on the worker's ring, and by plain pread
        for io in ("uring", "pread"):
            with Mount(dst, d + "/mnt", "budget=2M,cache=engine,backing_io=" + io) as m:
                with open(d + "/mnt/f", "rb") as f:
                    check(f.read() == data, "content read O_DIRECT (%s)" % io)
                res = read_frames(d + "/mnt/f", data)
                check(all(r == "ok" for r in res.values()), "O_DIRECT reads failed")
                st = m.stat()
                check(st["io_errors"] == 0, "io_errors")
                if can:
                    check(st["backing_direct_bytes"] == st["backing_bytes"] > 0,
                          "not every frame read O_DIRECT (%s): %d of %d bytes" % (
                              io, st["backing_direct_bytes"], st["backing_bytes"]))
                else:
                    check(st["backing_direct_bytes"] == 0, "O_DIRECT where refused")
        # frames bigger than the budget: every read is a bounce read (the
        # folio decoded into a buffer of its own, not cached), O_DIRECT too
        pack(d + "/src", d + "/big", TREE, "--frame", "2M")
        with Mount(d + "/big", d + "/mnt", "budget=1M,cache=engine") as m:
            with open(d + "/mnt/f", "rb") as f:
                check(f.read() == data, "content read by bounce reads")
            st = m.stat()
            check(st["bounce_reads"] > 0 and st["io_errors"] == 0,
                  "bounce reads: %d, io_errors %d" % (st["bounce_reads"],
                                                     st["io_errors"]))
            if can:
                check(st["backing_direct_bytes"] == st["backing_bytes"] > 0,
                      "bounce reads not O_DIRECT: %d of %d bytes" % (
                          st["backing_direct_bytes"], st["backing_bytes"]))
        with Mount(dst, d + "/mnt", "budget=2M,cache=engine",
                   env={"ZFOLIO_TEST_FAULT": "direct_einval:1"}) as m:
            with open(d + "/mnt/f", "rb") as f:
                check(f.read() == data, "content after O_DIRECT was refused")
            st = m.stat()
            check(st["io_errors"] == 0, "a refused O_DIRECT read became an error")
            # windows asked before the refusal came back may have gone
            # O_DIRECT; none after it: a second read (the budget holds a
            # part of the file) reads from the backing file, none so
            with open(d + "/mnt/f", "rb") as f:
                check(f.read() == data, "content read again after the refusal")
            again = m.stat()
            if can:
                check(0 < st["backing_direct_bytes"] < st["backing_bytes"],
                      "O_DIRECT after a refusal: %d of %d bytes" % (
                          st["backing_direct_bytes"], st["backing_bytes"]))
                check(again["backing_bytes"] > st["backing_bytes"] and
                      again["backing_direct_bytes"] == st["backing_direct_bytes"],
                      "O_DIRECT kept after a refusal: %d then %d of %d then %d "
                      "bytes" % (st["backing_direct_bytes"],
                                 again["backing_direct_bytes"],
                                 st["backing_bytes"], again["backing_bytes"]))
        with Mount(dst, d + "/mnt", "budget=2M,backing_cache=drop") as m:
            with open(d + "/mnt/f", "rb") as f:
                check(f.read() == data, "content read uncached")
            check(m.stat()["backing_direct_bytes"] == 0, "O_DIRECT with drop")
        # a plain file in a directory mounted as it is: its folios straight
        # into their buffers, the last (not 4 KiB long) uncached
        plain = d + "/plain"
        os.makedirs(plain)
        with open(plain + "/p.txt", "wb") as f:
            f.write(data)
        for fault in ("", "direct_einval:1", "short:3"):
            env = {"ZFOLIO_TEST_FAULT": fault} if fault else {}
            with Mount(plain, d + "/mnt", "budget=2M,cache=engine", env=env) as m:
                with open(d + "/mnt/p.txt", "rb") as f:
                    check(f.read() == data, "plain file (%s)" % (fault or "O_DIRECT"))
                st = m.stat()
                check(st["io_errors"] == 0, "plain file: io_errors (%s)" % fault)
                if can and not fault:
                    check(st["backing_direct_bytes"] >= len(data) - FRAME,
                          "plain file not read O_DIRECT: %d of %d bytes "
                          "(%d bounce reads)" % (
                              st["backing_direct_bytes"], len(data),
                              st["bounce_reads"]))
                if can and fault.startswith("direct"):
                    check(st["backing_direct_bytes"] == 0,
                          "plain file: O_DIRECT kept after a refusal")
        # raw frames read in part (a few KiB of a frame): O_DIRECT too, and
        # refused on the first one
        src = d + "/rsrc"
        os.makedirs(src)
        rnd = rand_bytes(8 << 20, 5)
        with open(src + "/r", "wb") as f:
            f.write(rnd)
        pack(src, d + "/rdst", *AT_FRAME)
        rng = random.Random(3)
        for fault in ("", "direct_einval:1"):
            env = {"ZFOLIO_TEST_FAULT": fault} if fault else {}
            with Mount(d + "/rdst", d + "/mnt", "budget=64M,cache=engine", env=env) as m:
                fd = os.open(d + "/mnt/r", os.O_RDONLY)
                try:
                    for _ in range(40):
                        off = rng.randrange(len(rnd) - 5000)
                        check(os.pread(fd, 4096, off) == rnd[off:off + 4096],
                              "part read at %d (%s)" % (off, fault or "O_DIRECT"))
                finally:
                    os.close(fd)
                st = m.stat()
                check(st["part_reads"] >= 20 and st["io_errors"] == 0,
                      "part reads %d, io_errors %d (%s)" % (
                          st["part_reads"], st["io_errors"], fault or "O_DIRECT"))


def test_corrupt():
    """A corrupted frame and a checksum mismatch: EIO for those ranges only,
    counted in memory.stat; the rest of the file reads."""
    require_root_fuse()
    with tmpdir() as d:
        data, dst = packed_file(d)
        z = dst + "/f.zst"
        info = inspect_zst(z)
        check(info["kind"] == "seekable" and info["checksums"],
              "not a seekable file with checksums: %s" % info["kind"])
        frames = info["frame_list"]
        # 12-byte entries (c_size, d_size, checksum) after an 8-byte header
        entries = info["table_offset"] + 8
        with open(z, "r+b") as f:
            c_off, c_size = frames[3]["c_off"], frames[3]["c_size"]
            f.seek(c_off + c_size // 2)
            orig = f.read(1)
            f.seek(c_off + c_size // 2)
            f.write(bytes([orig[0] ^ 0x5A]))
            # frame 7's checksum in the table (3rd field of its entry)
            f.seek(entries + 12 * 7 + 8)
            ck = struct.unpack("<I", f.read(4))[0]
            check(ck == frames[7]["checksum"], "frame 7's checksum is not where inspect says")
            f.seek(entries + 12 * 7 + 8)
            f.write(struct.pack("<I", ck ^ 1))
        with Mount(dst, d + "/mnt", "budget=8M") as m:
            res = read_frames(d + "/mnt/f", data)
            check(res[3] == errno.EIO and res[7] == errno.EIO, "damaged frames: %s" %
                  {i: r for i, r in res.items() if r != "ok"})
            check(all(r == "ok" for i, r in res.items() if i not in (3, 7)),
                  "undamaged frames failed: %s" % res)
            check(m.stat()["corrupt_frames"] >= 2, "corrupt_frames not counted")
            out = m.output()
            for i in (3, 7):
                check("f.zst: the frame at offset %d does not decode" % frames[i]["c_off"]
                      in out, "no message for frame %d: %r" % (i, out))
            # a sequential read stops with EIO at frame 3, after its bytes
            with open(d + "/mnt/f", "rb") as f:
                got = b""
                try:
                    while True:
                        b = f.read(FRAME)
                        if not b:
                            break
                        got += b
                except OSError as e:
                    check(e.errno == errno.EIO, "sequential read: %s" % e)
                check(got == data[:len(got)] and len(got) <= 3 * FRAME, "bytes before EIO")
        # a table whose size for frame 3 is not the frame's: every offset
        # past it is wrong, so once frame 3 is read the whole file is EIO
        # (never bytes from the wrong place), and the log says the table
        with open(z, "r+b") as f:
            f.seek(c_off + c_size // 2)
            f.write(orig)  # frame 3 decodes again
            f.seek(entries + 12 * 7 + 8)
            f.write(struct.pack("<I", ck))  # frame 7's checksum again
        with Mount(dst, d + "/mnt", "budget=8M") as m:
            check(all(r == "ok" for r in read_frames(d + "/mnt/f", data).values()),
                  "the file is not whole again")
        with open(z, "r+b") as f:
            f.seek(entries + 12 * 3 + 4)
            f.write(struct.pack("<I", FRAME - 10))
        with Mount(dst, d + "/mnt", "budget=8M,cache=engine") as m:
            fd = os.open(d + "/mnt/f", os.O_RDONLY)
            try:
                # frame 6 first: filled from the wrong place, unknowingly
                os.pread(fd, 16, 6 * FRAME + 100)
                for i in (3, 6, 0):
                    try:
                        got = os.pread(fd, 16, i * FRAME + 100)
                        fail("frame %d read %r after the table was caught" % (i, got))
                    except OSError as e:
                        check(e.errno == errno.EIO, "frame %d: %s" % (i, e))
            finally:
                os.close(fd)
            try:
                open(d + "/mnt/f", "rb").close()
                fail("opened after the table was caught")
            except OSError as e:
                check(e.errno == errno.EIO, "open after: %s" % e)
            check("the seek table gives the frame at offset %d a size its header does not"
                  % c_off in m.output(), "the message: %r" % m.output())
        # the same lie in a packed dataset on an ro mount, where the kernel
        # opens files itself and reads what its page cache holds without
        # asking: once the table is caught, what was filled before leaves
        # the page cache, and reads of it fail too
        os.makedirs(d + "/src2")
        with open(d + "/src2/f", "wb") as f:
            f.write(data)
        pack(d + "/src2", d + "/dst2", *AT_FRAME)
        z2 = d + "/dst2/data/00000000.zst"
        info2 = inspect_zst(z2)
        check(info2["frame_list"][:4] == frames[:4], "the packed file's frames differ")
        with open(z2, "r+b") as f:  # the total kept: the manifest's size
            f.seek(info2["table_offset"] + 8 + 12 * 3 + 4)
            f.write(struct.pack("<I", FRAME - 10))
            f.seek(info2["table_offset"] + 8 + 12 * 4 + 4)
            f.write(struct.pack("<I", FRAME + 10))
        with Mount(d + "/dst2", d + "/mnt", "ro,budget=8M") as m:
            fd = os.open(d + "/mnt/f", os.O_RDONLY)
            try:
                os.pread(fd, 16, 6 * FRAME + 100)  # into the page cache
                try:
                    os.pread(fd, 16, 3 * FRAME + 100)
                    fail("frame 3 read with the table lying")
                except OSError as e:
                    check(e.errno == errno.EIO, "frame 3: %s" % e)
                deadline = time.time() + 5 * SLOW
                while True:
                    try:
                        got = os.pread(fd, 16, 6 * FRAME + 100)
                    except OSError as e:
                        check(e.errno == errno.EIO, "frame 6 after: %s" % e)
                        break
                    check(time.time() < deadline,
                          "frame 6 still read %r after the table was caught" % got)
                    time.sleep(0.05)
            finally:
                os.close(fd)
        lie_with_pushes(d)
        # a seek table that lies: a clear error at open, the mount lives on
        with open(z, "r+b") as f:
            f.seek(-9, 2)
            f.write(struct.pack("<I", 0x7FFFFFFF))
        with Mount(dst, d + "/mnt", "budget=8M") as m:
            try:
                open(d + "/mnt/f", "rb").read()
                fail("a lying seek table opened")
            except OSError as e:
                check(e.errno == errno.EIO, "lying table: %s" % e)
            check("seek table" in m.output(), "no message for the lying table")
            check(os.listdir(d + "/mnt") == ["f"], "the mount died")


def lie_with_pushes(d):
    """The same lie under a scan of small files on an ro mount, where a
    file's reader pushes the next files of its pack into the page cache
    (fs/push.c): the pusher may be the one to catch the table.  No read
    ever gives a wrong byte, the files of the lying frames fail, nothing
    hangs, and once the table is caught the pack's files, pushed or
    filled before, fail too."""
    size = 3000
    per_frame = FRAME // size  # small files are packed whole in a frame
    # the lie far enough in that pushes run before a read ahead reaches it
    lie, nfiles = 10, 16 * per_frame
    rng = random.Random(7)
    files = {"f%03d" % k: rng.randbytes(size) for k in range(nfiles)}
    os.makedirs(d + "/src3")
    for name, b in files.items():
        with open(d + "/src3/" + name, "wb") as f:
            f.write(b)
    pack(d + "/src3", d + "/dst3", *AT_FRAME)
    z = d + "/dst3/data/00000000.zst"
    info = inspect_zst(z)
    check(info["frames"] == 16 and info["frame_list"][0]["d_size"] == per_frame * size,
          "the pack's frames: %s" % info["frame_list"][:2])
    with open(z, "r+b") as f:  # two frames lie, the total kept
        for i, delta in ((lie, -10), (lie + 1, 10)):
            f.seek(info["table_offset"] + 8 + 12 * i + 4)
            f.write(struct.pack("<I", info["frame_list"][i]["c_size"] + delta))
    lying = {"f%03d" % k for k in range(lie * per_frame, (lie + 2) * per_frame)}

    def scan(mnt):
        """Read each file in the order tar does: {name: 'ok' | errno}."""
        res = {}
        for name in sorted(os.listdir(mnt)):
            got = b""
            try:
                with open(os.path.join(mnt, name), "rb") as f:
                    while True:
                        b = f.read(1 << 16)
                        if not b:
                            break
                        got += b
                res[name] = "ok"
            except OSError as e:
                res[name] = e.errno
            # whole, or a prefix and then an error: never a wrong byte
            check(files[name][:len(got)] == got and
                  (res[name] != "ok" or len(got) == size),
                  "%s: %d bytes read, not the file's" % (name, len(got)))
        return res

    with Mount(d + "/dst3", d + "/mnt", "ro,budget=8M") as m:
        first = scan(m.mnt)
        check(first["f000"] == "ok", "the first file: %s" % first["f000"])
        bad = {n: r for n, r in first.items() if n in lying and r != errno.EIO}
        check(not bad, "files of the lying frames: %s" % bad)
        check(set(r for r in first.values()) <= {"ok", errno.EIO},
              "errors: %s" % set(first.values()))
        pushed = int(m.stat()["kernel_pushes"])
        check(pushed > 0, "nothing was pushed")
        check("seek table" in m.output(), "no message for the table: %r" % m.output())
        # caught: what the page cache holds of the pack goes (soon)
        deadline, scans = time.time() + 5 * SLOW, 0
        while True:
            again = scan(m.mnt)
            scans += 1
            left = sorted(n for n, r in again.items() if r != errno.EIO)
            if not left:
                print("a lie under pushes: %d of %d files read, %d pages pushed, "
                      "all EIO at scan %d after" % (
                          sum(r == "ok" for r in first.values()), nfiles, pushed, scans))
                break
            check(time.time() < deadline,
                  "%d files still read after the table was caught: %s" %
                  (len(left), left[:5]))
            time.sleep(0.1)
        check(os.path.isdir(m.mnt + "/.zfolio"), "the mount died")


def test_bigframe():
    """A frame bigger than 4 MiB (a plain `zstd FILE`) is served in pieces,
    and its checksum is checked when the decoder reaches the frame's end.
    Once that fails, no piece of it is served again (zfolio's cache and the
    kernel's page cache alike, and after the kernel forgot its inode), the
    reads of its range are EIO, and the log says which file; other files
    still read."""
    require_root_fuse()
    with tmpdir() as d:
        src, dst = d + "/src", d + "/dst"
        os.makedirs(src)
        os.makedirs(dst)
        files = {"text": text_bytes(10 << 20, 21), "rand": rand_bytes(6 << 20, 22),
                 "good": text_bytes(6 << 20, 23)}
        for name, data in files.items():
            with open(src + "/" + name, "wb") as f:
                f.write(data)
            subprocess.run(["zstd", "-q", "-f", "-3", src + "/" + name, "-o",
                            dst + "/" + name + ".zst"], check=True)
        # text: the checksum itself (the last 4 bytes) damaged, so every
        # piece decodes to the right bytes and only the end tells; rand:
        # stored in raw blocks, a byte of content damaged in the middle,
        # which decodes to a wrong byte that only the checksum catches
        with open(dst + "/text.zst", "r+b") as f:
            f.seek(-1, os.SEEK_END)
            b = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([b[0] ^ 1]))
        size = os.path.getsize(dst + "/rand.zst")
        with open(dst + "/rand.zst", "r+b") as f:
            f.seek(size // 2)
            b = f.read(1)
            f.seek(size // 2)
            f.write(bytes([b[0] ^ 0x40]))
        for name in ("text", "rand"):
            r = subprocess.run(["zstd", "-t", "-q", dst + "/" + name + ".zst"],
                               capture_output=True)
            check(r.returncode != 0, "zstd -t passes the damaged " + name)
        for opts in ("budget=64M", "budget=64M,cache=engine"):
            with Mount(dst, d + "/mnt", opts) as m:
                for name in ("text", "rand"):
                    path, data = d + "/mnt/" + name, files[name]
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        failed_at = None
                        for off in range(0, len(data), 128 << 10):
                            try:
                                os.pread(fd, 128 << 10, off)
                            except OSError as e:
                                check(e.errno == errno.EIO, "%s: %s" % (name, e))
                                failed_at = off
                                break
                        check(failed_at is not None, opts + ": " + name + " read to its end")
                        # from now on nothing of it, from either cache
                        for off in (0, 1 << 20, len(data) // 2, failed_at):
                            try:
                                got = os.pread(fd, 4096, off)
                                fail("%s %s: read at %d after the frame failed: %s" % (
                                    opts, name, off, "right bytes" if
                                    got == data[off:off + 4096] else "WRONG bytes"))
                            except OSError as e:
                                check(e.errno == errno.EIO, "%s: %s" % (name, e))
                    finally:
                        os.close(fd)
                    # and through a new open
                    try:
                        with open(path, "rb") as f:
                            f.read()
                        fail(opts + ": " + name + " read whole after it failed")
                    except OSError as e:
                        check(e.errno == errno.EIO, "%s: %s" % (name, e))
                    # said by the worker that found it, maybe just after
                    # its reply
                    said = name + ".zst: the frame at offset 0 does not decode, or " \
                        "fails its checksum"
                    wait_for(lambda: said in m.output(), 5,
                             "no message for %s: %r" % (name, m.output()))

                # and once the kernel has forgotten their inodes (drop_caches,
                # as its inode cache does under memory pressure): a new node
                # must not serve the unchecked pieces again
                def forgotten():
                    with open("/proc/sys/vm/drop_caches", "w") as f:
                        f.write("2")
                    return m.stat()["files_kept"] >= 2
                wait_for(forgotten, 10, "the kernel to forget the damaged files", step=0.2)
                for name in ("text", "rand"):
                    try:
                        with open(d + "/mnt/" + name, "rb") as f:
                            got = f.read(4096)
                        fail("%s: %s read after its inode was forgotten: %s" % (
                            opts, name, "right bytes" if got == files[name][:4096]
                            else "WRONG bytes"))
                    except OSError as e:
                        check(e.errno == errno.EIO, "%s: %s forgotten: %s" % (opts, name, e))
                with open(d + "/mnt/good", "rb") as f:
                    check(f.read() == files["good"], opts + ": good file")
                check(m.stat()["corrupt_frames"] >= 2, "corrupt_frames not counted")


def test_log():
    """The log says why a file is EIO once per file, at most 20 messages in
    10 s; what is held back is said in the next 10 s, marked so, or as the
    mount stops (it was lost for good when no other message came)."""
    require_root_fuse()
    with tmpdir() as d:
        dst = d + "/dst"
        os.makedirs(dst)
        for i in range(25):
            with open("%s/f%02d.zst" % (dst, i), "wb") as f:
                f.write(b"plain text, not zstd %d\n" % i)

        def open_all():
            for i in range(25):
                try:
                    open("%s/mnt/f%02d" % (d, i), "rb").close()
                    fail("f%02d opened" % i)
                except OSError as e:
                    check(e.errno == errno.EIO, "f%02d: %s" % (i, e))

        def said():
            return sorted(set(re.findall(r"f(\d\d)\.zst: ", m.output())))
        with Mount(dst, d + "/mnt", "budget=8M") as m:
            open_all()
            first = said()
            check(len(first) == 20, "said at first: %d files: %r" % (len(first), m.output()))
            open_all()  # within the burst's 10 s: nothing more
            check(said() == first, "said again within the burst: %r" % m.output())
            time.sleep(9)
            wait_for(lambda: len(said()) == 25, 5, "the held back never said: %r" %
                     m.output())
            check(m.output().count("(held back)") == 5,
                  "the held back not marked: %r" % m.output())
        # and what is held back when the mount stops is said as it stops
        with Mount(dst, d + "/mnt", "budget=8M") as m:
            open_all()
        check(len(said()) == 25, "held back at the stop, never said: %r" % m.output())


def killed_stuck(dst, mnt):
    """SIGKILL while a thread of the daemon waits in the kernel on pages a
    fill has locked (the hook drops a held fill's pages): without the
    watchdog, that thread never returns, /dev/fuse stays open, and the
    daemon, its readers and the mount hang until umount -f."""
    m = Mount(dst, mnt, "budget=2M,cache=kernel", expect_exit=None,
              env={"ZFOLIO_TEST_FAULT": "inval_held:20000"})
    with m:
        errs = []

        def reader():
            try:
                with open(mnt + "/f", "rb") as f:
                    f.read(FRAME)
                errs.append(0)
            except OSError as e:
                errs.append(e.errno)

        t = threading.Thread(target=reader)
        t.start()
        # in writev on /dev/fuse (the drop), waiting uninterruptibly
        writev = {"x86_64": "20", "aarch64": "66"}.get(os.uname().machine)
        def stuck(st):
            return st["State"].startswith("D") and writev in (None, st["syscall"])

        wait_for(lambda: any(stuck(st) for st in thread_states(m.pid).values()),
                 10, "a thread waiting on the fill's pages")
        os.kill(m.pid, signal.SIGKILL)
        try:
            m.proc.wait(10)
        except subprocess.TimeoutExpired:
            report = threads_report(m.pid)
            # what umount -f does first, without a fork: a child would
            # inherit the reader's file and hang closing it (FUSE_FLUSH)
            ctypes.CDLL(None, use_errno=True).umount2(mnt.encode(), MNT_FORCE)
            m.proc.wait(10)
            fail("the daemon is stuck after SIGKILL; its threads:\n" + report)
        t.join(10)
        check(not t.is_alive(), "the reader hangs after SIGKILL")
        check(errs and errs[0] in (errno.ECONNABORTED, errno.ENOTCONN),
              "the reader got %s" % errs)
        # the watchdog says so once it has aborted: maybe after the exit
        wait_for(lambda: "its connection is aborted" in m.output(), 5,
                 "the watchdog saying so: " + m.output()[-1000:])
        r = subprocess.run(["fusermount3", "-u", mnt], capture_output=True, text=True)
        check(r.returncode == 0 and not is_mounted(mnt), "fusermount3 -u: " + r.stderr)


def test_signals():
    """SIGKILL during reads: readers get ECONNABORTED/ENOTCONN, none hangs,
    fusermount3 -u cleans up; so too with a thread stuck (the watchdog).  SIGTERM, SIGINT, SIGHUP: clean unmount, exit 0,
    at once when idle.
    Unmounting with files open is refused (busy) and works once closed;
    mounting on a mountpoint in use is refused."""
    require_root_fuse()
    with tmpdir() as d:
        data, dst = packed_file(d, 200 * FRAME, 3)
        mnt = d + "/mnt"
        # SIGKILL with readers blocked in reads
        m = Mount(dst, mnt, "budget=2M", expect_exit=None)
        with m:
            errs, reading = [], threading.Semaphore(0)

            def reader():
                fd = os.open(mnt + "/f", os.O_RDONLY)
                os.pread(fd, 10, 0)
                reading.release()
                try:
                    while True:
                        os.pread(fd, 1 << 20, random.randrange(len(data)))
                except OSError as e:
                    errs.append(e.errno)
                try:
                    os.pread(fd, 10, 0)
                except OSError as e:
                    errs.append(e.errno)
                try:
                    os.close(fd)
                except OSError:
                    pass

            ts = [threading.Thread(target=reader) for _ in range(3)]
            for t in ts:
                t.start()
            for t in ts:  # each has its file open and has read
                check(reading.acquire(timeout=10 * SLOW), "a reader did not start")
            time.sleep(0.2)
            os.kill(m.pid, signal.SIGKILL)
            for t in ts:
                t.join(10)
                check(not t.is_alive(), "a reader hangs after SIGKILL")
            # over io_uring, a request the kernel was handing to a dying
            # daemon's entry ends with ECANCELED (fs/fuse/dev_uring.c)
            ok = {errno.ECONNABORTED, errno.ENOTCONN}
            if TRANSPORT == "uring":
                ok.add(errno.ECANCELED)
            check(set(errs) <= ok and errs, "errors after SIGKILL: %s" % errs)
            try:
                os.stat(mnt + "/f")
                fail("the dead mount answered")
            except OSError as e:
                check(e.errno == errno.ENOTCONN, "later calls: %s" % e)
            r = subprocess.run(["fusermount3", "-u", mnt], capture_output=True, text=True)
            check(r.returncode == 0 and not is_mounted(mnt), "fusermount3 -u: " + r.stderr)
        killed_stuck(dst, mnt)
        # SIGTERM, SIGINT and SIGHUP: a clean unmount and exit status 0,
        # at once when nothing is asked (a stop used to take its whole 2 s
        # drain: the wake signal kept cutting the wait for a quiet queue)
        took = {}
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            m = Mount(dst, mnt, "budget=2M")
            with m:
                with open(mnt + "/f", "rb") as f:
                    check(f.read(FRAME) == data[:FRAME], "read before signal")
                # only the main thread takes a stop: under a sanitizer, one
                # caught by liburcu's thread asleep in a raw futex waited
                # there until something woke that thread
                stops = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGINT - 1)) | \
                    (1 << (signal.SIGHUP - 1))
                for tid, st in thread_states(m.pid).items():
                    check(tid == m.pid or int(st["SigBlk"], 16) & stops == stops,
                          "thread %d takes stop signals:\n%s" % (tid, threads_report(m.pid)))
                t = time.monotonic()
                m.proc.send_signal(sig)
                while is_mounted(mnt) and time.monotonic() - t < 10 * SLOW:
                    time.sleep(0.01)
                took[sig.name] = t = time.monotonic() - t
                try:
                    code = m.proc.wait(10 * SLOW)
                except subprocess.TimeoutExpired:
                    fail("%s: no exit %.1f s after the signal; its threads:\n%s" %
                         (sig, t + 10 * SLOW, threads_report(m.pid)))
                check(code == 0, "exit status after %s" % sig)
                check(not is_mounted(mnt), "still mounted after %s" % sig)
                check("%s: %s: serving what is asked" % (mnt, sig.name) in m.output(),
                      "the log says why it stopped: " + m.output())
        # the fastest of the three: a slow stop is slow every time (0.06 s
        # here, 2.0 s with the drain waited out), one stop can be late on
        # a loaded machine
        check(min(took.values()) < 1.5, "the mount took %s to go" %
              ", ".join("%.2f s after %s" % (t, n) for n, t in took.items()))
        # busy: unmount refused while a file is open, works once closed
        with Mount(dst, mnt, "budget=2M") as m:
            f = open(mnt + "/f", "rb")
            r = subprocess.run(["fusermount3", "-u", mnt], capture_output=True, text=True)
            check(r.returncode != 0 and "busy" in r.stderr, "unmount with a file open: " +
                  r.stderr)
            check(f.read(100) == data[:100], "the open file after a refused unmount")
            # a second mount on the same mountpoint is refused, one line
            r = subprocess.run([ZFOLIO, dst, mnt], capture_output=True, text=True)
            check(r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1,
                  "mounting on a busy mountpoint: " + r.stderr)
            f.close()
        # lazy unmount with a file open: the daemon exits when it is closed
        m = Mount(dst, mnt, "budget=2M")
        with m:
            f = open(mnt + "/f", "rb")
            subprocess.run(["fusermount3", "-u", "-z", mnt], check=True)
            check(f.read(100) == data[:100], "reads after a lazy unmount")
            f.close()
            wait_for(lambda: m.proc.poll() is not None, 10, "daemon exit after lazy unmount")
            check(m.proc.returncode == 0, "exit status after lazy unmount")


def test_security():
    """Links are served as links and never followed by the daemon, even if
    a directory becomes a link to /etc while mounted; device nodes and FIFOs
    are served as their type and never opened; nosuid,nodev by default."""
    require_root_fuse()
    with tmpdir() as d:
        src, dst, mnt = d + "/src", d + "/dst", d + "/mnt"
        os.makedirs(src + "/a")
        with open(src + "/a/inside", "w") as f:
            f.write("inside\n")
        os.symlink("/etc", src + "/etc_link")
        os.symlink("../../../../../../../etc/passwd", src + "/a/up_link")
        os.mkfifo(src + "/fifo")
        os.mknod(src + "/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.chmod(src + "/a/inside", 0o4755)  # setuid: nosuid must hold
        pack(src, dst, TREE, *AT_FRAME)
        with Mount(dst, mnt, "budget=4M") as m:
            opts = [l.split() for l in open("/proc/self/mountinfo") if l.split()[4] == mnt][0]
            check("nosuid" in opts[5] and "nodev" in opts[5], "mount options: " + opts[5])
            check(os.readlink(mnt + "/etc_link") == "/etc", "etc_link")
            check(os.readlink(mnt + "/a/up_link") == "../../../../../../../etc/passwd", "up_link")
            check(stat.S_ISFIFO(os.lstat(mnt + "/fifo").st_mode), "fifo type")
            st = os.lstat(mnt + "/null")
            check(stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3), "device type")
            try:  # nodev: the kernel refuses, the daemon is never asked
                os.open(mnt + "/null", os.O_RDONLY)
                fail("opened a device node through a nodev mount")
            except OSError as e:
                check(e.errno == errno.EACCES, "device open: %s" % e)
            fd = os.open(mnt + "/fifo", os.O_RDONLY | os.O_NONBLOCK)  # the kernel's fifo
            os.close(fd)
            # swap a looked-up directory for a link to /etc behind the mount
            check(open(mnt + "/a/inside").read() == "inside\n", "before the swap")
            os.rename(dst + "/a", dst + "/a.real")
            os.symlink("/etc", dst + "/a")
            try:
                with open(mnt + "/a/passwd") as f:
                    leaked = f.read()
                fail("served /etc/passwd through a swapped directory: %r" % leaked[:40])
            except OSError as e:
                check(e.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EXDEV),
                      "swapped directory: %s" % e)
            check("passwd" not in str(os.listdir(mnt)), "listing")
            out = m.output()
        check("root:" not in out, "the daemon printed /etc content")


def test_soak():
    """4x-oversubscribed readers under a tight budget (ZF_SOAK_SECONDS, 30 by
    default): every byte right, no budget overshoot, RSS flat."""
    require_root_fuse()
    seconds = float(os.environ.get("ZF_SOAK_SECONDS", "30"))
    r = subprocess.run([os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                     "bench", "soak"), "--seconds", str(seconds),
                        "--zfolio", ZFOLIO, "--mkzfolio", MKZFOLIO],
                       capture_output=True, text=True)
    print(r.stdout[-3000:])
    check(r.returncode == 0, "soak failed: " + r.stdout[-2000:] + r.stderr[-2000:])


def test_valgrind():
    """valgrind memcheck is clean on a short mount: no invalid access, no
    definite leak, exit status 0 after unmount."""
    require_root_fuse()
    import shutil
    if not shutil.which("valgrind") or os.environ.get("ZF_SANITIZE", "none") != "none":
        print("skipped: needs valgrind and a build without sanitizers", file=sys.stderr)
        sys.exit(SKIP)
    with tmpdir() as d:
        data, dst = packed_file(d, 30 * FRAME + 3, 4)
        vg = ["valgrind", "-q", "--error-exitcode=99", "--leak-check=full",
              "--errors-for-leak-kinds=definite", "--show-leak-kinds=definite"]
        # pread and /dev/fuse: valgrind cannot see what the kernel writes
        # into io_uring buffers, and it holds its big lock through a waiting
        # io_uring_enter, so that no other thread runs
        with Mount(dst, d + "/mnt", "budget=2M,threads=2,backing_io=pread,transport=dev",
                   wrapper=vg,
                   timeout=60) as m:
            with open(d + "/mnt/f", "rb") as f:
                check(f.read() == data, "content under valgrind")
            check(read_frames(d + "/mnt/f", data), "frames")
            m.set("memory.reclaim", "1M")
            check("file" in m.ctl("memory.stat"), "ctl under valgrind")


if __name__ == "__main__":
    main(globals(), "test_faults.py")
