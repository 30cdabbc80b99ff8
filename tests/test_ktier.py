#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The kernel tier (cache=kernel) on a real mount: the kernel page cache in
front, inside the budget.  What the mount holds is measured from outside:
zfolio's folios (memory.stat "file") plus the page-cache pages of every
file (fincore).

    test_ktier.py budget | window | limits | refaults | handover | direct | pieces
"""
import mmap
import os
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zftest import *  # noqa: E402,F401,F403

MIB = 1 << 20
BUDGET = 32 * MIB
RA = 128 << 10  # the kernel's window by default (kernel_ra_kb)


def stamped(nbytes, seed):
    """Text-like data whose every page names its file and place, so that a
    page served at the wrong offset or from the wrong file shows."""
    base = bytearray(text_bytes(MIB, seed))
    out = bytearray()
    for off in range(0, nbytes, 4096):
        page = base[off % MIB:off % MIB + 4096]
        page[:16] = struct.pack("<QQ", seed, off)
        out += page
    return bytes(out[:nbytes])


def make_dataset(d, nfiles=4, size=64 * MIB):
    src, dst = d + "/src", d + "/dst"
    os.makedirs(src)
    files = {}
    for i in range(nfiles):
        files["f%d" % i] = stamped(size, i + 1)
        with open(os.path.join(src, "f%d" % i), "wb") as f:
            f.write(files["f%d" % i])
    pack(src, dst)
    return dst, files


def resident(mnt, names):
    """Bytes of the page cache holding these files, from fincore."""
    r = subprocess.run(["fincore", "-b", "-n", "-o", "RES"] +
                       [os.path.join(mnt, n) for n in names],
                       capture_output=True, text=True)
    check(r.returncode == 0, "fincore: " + r.stderr)
    return sum(int(x) for x in r.stdout.split())


class Sampler:
    """Both tiers' bytes, sampled while the readers run: the peak."""

    def __init__(self, m, names):
        self.m, self.names = m, names
        self.peak, self.samples = 0, 0
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run)

    def total(self):
        # the page cache around the moment of the stat: at page-cache
        # speed a MiB comes and goes in a millisecond either side
        r1 = resident(self.m.mnt, self.names)
        st = self.m.stat()
        r2 = resident(self.m.mnt, self.names)
        return st["file"] + min(r1, r2)

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, self.total())
            self.samples += 1
            time.sleep(0.01)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join()
        return False


def read_file(path, data, use_mmap, errors):
    """One reader: the whole file, by read() or through a mapping."""
    try:
        with open(path, "rb") as f:
            if use_mmap:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                for off in range(0, len(data), 64 << 10):
                    if mm[off:off + (64 << 10)] != data[off:off + (64 << 10)]:
                        errors.append("%s: mmap differs at %d" % (path, off))
                        break
                mm.close()
            else:
                off = 0
                while True:
                    b = f.read(MIB)
                    if not b:
                        break
                    if b != data[off:off + len(b)]:
                        errors.append("%s: read differs at %d" % (path, off))
                        break
                    off += len(b)
                if off != len(data) and not errors:
                    errors.append("%s: %d bytes, not %d" % (path, off, len(data)))
    except OSError as e:
        errors.append("%s: %s" % (path, e))


def readers(mnt, files, rounds=1):
    """Four readers at once, two by read() and two by mmap."""
    errors = []
    for r in range(rounds):
        ts = [threading.Thread(target=read_file,
                               args=(os.path.join(mnt, n), files[n],
                                     (i + r) % 2 == 1, errors))
              for i, n in enumerate(sorted(files))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    check(not errors, "; ".join(errors[:4]))


def settle(m, names, limit, what):
    """Within a second or two (more under a sanitizer) both tiers are
    under limit."""
    deadline = time.time() + 2 * SLOW
    while True:
        total = m.stat()["file"] + resident(m.mnt, names)
        if total <= limit:
            return total
        if time.time() > deadline:
            break
        time.sleep(0.02)
    fail("%s: %d bytes held, limit %d" % (what, total, limit))


def quiet(m):
    """The daemon's count of reads served once it stops moving: read()
    returns when its own pages are in, while the kernel's readahead past
    them may still be on its way to the daemon (a loaded CI machine saw
    one arrive after the read)."""
    last, still = m.stat()["pgfault"], 0
    for _ in range(200):
        time.sleep(0.05)
        now = m.stat()["pgfault"]
        still = still + 1 if now == last else 0
        if still == 4:  # 200 ms without one
            return now
        last = now
    fail("reads kept reaching the daemon with nobody reading")


def test_budget():
    """Four readers (read() and mmap) over 4 x 64 MiB under budget=32M: every
    byte right, and zfolio's folios plus the page cache never above the
    budget plus one readahead window per reader; hits never reach zfolio."""
    require_root_fuse()
    with tmpdir() as d:
        dst, files = make_dataset(d)
        names = sorted(files)
        with Mount(dst, d + "/mnt", "budget=32M") as m:
            with Sampler(m, names) as s:
                readers(m.mnt, files, rounds=4)
            st = m.stat()
            limit = BUDGET + len(names) * RA
            print("peak %.1f MiB of folios + page cache over %d samples "
                  "(budget 32 MiB + %d windows); kernel_fills %d, evicted %d, "
                  "handovers %d" % (s.peak / MIB, s.samples, len(names),
                                    st["kernel_fills"], st["kernel_evicted"],
                                    st["kernel_handovers"]))
            check(s.samples > 10, "only %d samples" % s.samples)
            check(s.peak <= limit, "held %d bytes, more than %d" % (s.peak, limit))
            check(st["kernel_fills"] * 4096 >= 4 * 4 * 64 * MIB * 0.9,
                  "fills not counted: %d pages" % st["kernel_fills"])
            check(st["kernel_evicted"] > 0, "nothing evicted from the page cache")
            check(st["fault_fills"] == 0, "fills misfiled as mmap faults")
            check(st["ra_pages"] * 100 < st["kernel_fills"],
                  "a second readahead on top of the kernel's: %d pages" % st["ra_pages"])
            cur = int(m.ctl("memory.current"))
            check(cur <= BUDGET, "memory.current %d above the budget" % cur)
            check(st["kernel_file"] + st["file"] <= cur, "memory.current %d does not "
                  "count both tiers (%d + %d)" % (cur, st["kernel_file"], st["file"]))
            # what stays cached is served by the kernel: re-reading it
            # sends nothing to zfolio (three times at most: a window of the
            # kernel's readahead past it, or an eviction still queued, may
            # reach the daemon once on a loaded machine)
            with open(os.path.join(m.mnt, "f0"), "rb") as f:
                f.read(4 * MIB)
                for attempt in range(3):
                    before = quiet(m)
                    for _ in range(20):
                        f.seek(0)
                        check(f.read(4 * MIB) == files["f0"][:4 * MIB], "re-read")
                    after = m.stat()["pgfault"]
                    if after == before:
                        break
                    print("attempt %d: %d reads reached the daemon" % (attempt, after - before))
            check(after == before, "page-cache hits reached the daemon")


def bdi_read_ahead_kb(mnt):
    """The mount's read_ahead_kb in sysfs (its bdi is MAJOR:MINOR)."""
    real = os.path.realpath(mnt)
    with open("/proc/self/mountinfo") as f:
        dev = [l.split()[2] for l in f if l.split()[4] == real][0]
    with open("/sys/class/bdi/%s/read_ahead_kb" % dev) as f:
        return int(f.read())


def test_window():
    """kernel_ra_kb=4096 makes the kernel's readahead window 4 MiB (INIT
    alone would leave 128 KiB, the default), and the budget still holds
    with it: one window per reader above it at most."""
    require_root_fuse()
    with tmpdir() as d:
        dst, files = make_dataset(d)
        names = sorted(files)
        with Mount(dst, d + "/mnt", "cache=kernel,budget=32M,kernel_ra_kb=4096") as m:
            # the daemon sets it once INIT is answered, which may come just
            # after the mount shows (a slow ASan daemon read 128 here)
            for _ in range(100):
                if bdi_read_ahead_kb(m.mnt) == 4096:
                    break
                time.sleep(0.05)
            check(bdi_read_ahead_kb(m.mnt) == 4096,
                  "read_ahead_kb %d, not 4096" % bdi_read_ahead_kb(m.mnt))
            with Sampler(m, names) as s:
                readers(m.mnt, files, rounds=2)
            limit = BUDGET + len(names) * (4 << 20)
            print("4 MiB windows: peak %.1f MiB of folios + page cache over %d samples" % (
                s.peak / MIB, s.samples))
            check(s.peak <= limit, "held %d bytes, more than %d" % (s.peak, limit))
        with Mount(dst, d + "/mnt", "cache=kernel") as m:
            check(bdi_read_ahead_kb(m.mnt) == 128, "the default window is not 128 KiB")


def test_limits():
    """memory.max lowered under load brings both tiers under it, and
    memory.reclaim frees from both."""
    require_root_fuse()
    with tmpdir() as d:
        dst, files = make_dataset(d)
        names = sorted(files)
        with Mount(dst, d + "/mnt", "budget=64M") as m:
            errors = []
            ts = [threading.Thread(target=read_file,
                                   args=(os.path.join(m.mnt, n), files[n], i % 2 == 1,
                                         errors))
                  for i, n in enumerate(names)]
            for t in ts:
                t.start()
            time.sleep(0.3)
            m.set("memory.max", "16M")
            for t in ts:
                t.join()
            check(not errors, "; ".join(errors[:4]))
            held = settle(m, names, 16 * MIB + len(names) * RA, "after memory.max=16M")
            print("after memory.max=16M under load: %.1f MiB held" % (held / MIB))
            check(int(m.ctl("memory.current")) <= 16 * MIB, "memory.current above max")
            m.set("memory.max", "max")
            readers(m.mnt, {n: files[n] for n in names[:1]})
            before = m.stat()
            held0 = before["file"] + resident(m.mnt, names)
            m.set("memory.reclaim", "8M")
            after = m.stat()
            check(after["kernel_evicted"] > before["kernel_evicted"],
                  "memory.reclaim freed nothing from the page cache")
            held1 = settle(m, names, held0 - 6 * MIB, "after memory.reclaim=8M")
            print("memory.reclaim 8M: %.1f -> %.1f MiB held" % (held0 / MIB, held1 / MIB))


def test_refaults():
    """A re-read working set that fits is found by its refaults and
    protected (workingset_activate); a scan that does not fit is not."""
    require_root_fuse()
    with tmpdir() as d:
        dst, files = make_dataset(d, nfiles=2)
        with Mount(dst, d + "/mnt", "budget=16M") as m:
            hot = os.path.join(m.mnt, "f0")
            with open(os.path.join(m.mnt, "f1"), "rb") as scan:
                # a scan of 4x the budget, twice
                for _ in range(2):
                    scan.seek(0)
                    while scan.read(MIB):
                        pass
                st = m.stat()
                print("scan: refaults %d, activated %d" % (st["workingset_refault"],
                                                           st["workingset_activate"]))
                check(st["workingset_activate"] == 0, "a scan taken for a working set")
                # 6 MiB read again and again with 4 MiB of a stream between
                with open(hot, "rb") as f:
                    for r in range(10):
                        f.seek(0)
                        check(f.read(6 * MIB) == files["f0"][:6 * MIB], "hot set")
                        scan.seek((r * 4 * MIB) % (60 * MIB))
                        scan.read(4 * MIB)
                st = m.stat()
                print("working set: refaults %d, activated %d" % (
                    st["workingset_refault"], st["workingset_activate"]))
                check(st["workingset_activate"] > 0, "the working set never activated")


def test_handover():
    """A plain file of the zstd CLI (one frame, served in pieces bigger
    than the kernel's fills) read through once: each piece leaves zfolio's
    cache once the fills have taken all of it, so the file is cached once,
    in the page cache, and random reads of it then never reach the
    daemon."""
    require_root_fuse()
    with tmpdir() as d:
        os.makedirs(d + "/cli")
        data = stamped(32 * MIB, 7)
        with open(d + "/plain", "wb") as f:
            f.write(data)
        subprocess.run(["zstd", "-q", "-3", d + "/plain", "-o",
                        d + "/cli/f.zst"], check=True)
        with Mount(d + "/cli", d + "/mnt", "budget=64M") as m:
            path = os.path.join(m.mnt, "f")
            with open(path, "rb") as f:
                check(f.read() == data, "the file differs")
            st = m.stat()
            print("read through: folios %.1f MiB, kernel tier %.1f MiB, %d handed over" % (
                st["file"] / MIB, st["kernel_file"] / MIB, st["kernel_handovers"]))
            check(st["kernel_handovers"] > 0 and st["file"] <= 2 * MIB,
                  "cached twice: %d bytes of folios beside the page cache" % st["file"])
            served = st["pgfault"]
            seed = 1
            with open(path, "rb") as f:
                for _ in range(2000):
                    seed = (seed * 6364136223846793005 + 1442695040888963407) % (1 << 64)
                    off = (seed >> 20) % (32 * MIB - 4096)
                    f.seek(off)
                    check(f.read(4096) == data[off:off + 4096], "at %d" % off)
            st = m.stat()
            print("2000 random reads: %d reached the daemon" % (st["pgfault"] - served))
            check(st["pgfault"] - served <= 20,
                  "%d random reads reached the daemon" % (st["pgfault"] - served))


def read_direct(path, data, chunk):
    """The whole file by O_DIRECT preads of chunk bytes into an aligned
    buffer: every byte compared."""
    buf = mmap.mmap(-1, chunk)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        off = 0
        while off < len(data):
            n = os.preadv(fd, [buf], off)
            check(n > 0 and buf[:n] == data[off:off + n],
                  "%s: O_DIRECT read differs at %d" % (path, off))
            off += n
    finally:
        os.close(fd)
        buf.close()


def test_direct():
    """O_DIRECT reads put nothing in the page cache, so they are not fills
    of the kernel tier: served from zfolio's cache, charged there, never
    counted as kernel-tier pages (which would starve zfolio's cache of a
    budget held by pages that do not exist).  A plain file of the zstd CLI
    (one frame, decoded in pieces) read so twice keeps its pieces, and its
    decoder does not start over at every read."""
    require_root_fuse()
    with tmpdir() as d:
        dst, files = make_dataset(d, nfiles=1, size=16 * MIB)
        # with ro the kernel opens files itself (kernel_opens), and a read
        # comes with no handle
        for ro in ("", ",ro"):
            with Mount(dst, d + "/mnt", "cache=kernel,budget=32M" + ro) as m:
                read_direct(os.path.join(m.mnt, "f0"), files["f0"], 64 << 10)
                st = m.stat()
                res = resident(m.mnt, ["f0"])
                print("packed%s, O_DIRECT: folios %.1f MiB, kernel tier %.1f MiB, "
                      "%d fills, page cache %d bytes" % (ro,
                          st["file"] / MIB, st["kernel_file"] / MIB,
                          st["kernel_fills"], res))
                check(st["kernel_fills"] == 0 and st["kernel_file"] == 0,
                      "O_DIRECT reads counted as page-cache fills: %d fills, "
                      "%d bytes" % (st["kernel_fills"], st["kernel_file"]))
                check(st["file"] > 0 and res == 0,
                      "folios %d bytes, page cache %d" % (st["file"], res))
                # a read() afterwards is a fill again
                with open(os.path.join(m.mnt, "f0"), "rb") as f:
                    check(f.read() == files["f0"], "read() after O_DIRECT")
                check(m.stat()["kernel_fills"] > 0, "read() not a fill")
        os.makedirs(d + "/cli")
        with open(d + "/plain", "wb") as f:
            f.write(files["f0"])
        subprocess.run(["zstd", "-q", "-1", d + "/plain", "-o",
                        d + "/cli/f.zst"], check=True)
        with Mount(d + "/cli", d + "/mnt", "cache=kernel,budget=32M") as m:
            for _ in range(2):
                read_direct(os.path.join(m.mnt, "f"), files["f0"], 16 << 10)
            st = m.stat()
            print("one frame, O_DIRECT twice: %d fills, %d decoder restarts, "
                  "%.0f MiB decoded" % (st["kernel_fills"], st["decoder_restarts"],
                                        st["decompressed_bytes"] / MIB))
            check(st["kernel_fills"] == 0, "O_DIRECT reads counted as fills")
            check(st["decoder_restarts"] <= 4,
                  "%d decoder restarts for two passes" % st["decoder_restarts"])


def test_pieces():
    """A plain zstd file (one 48 MiB frame, served in 1 MiB pieces that its
    decoder yields only in order) read through once at budget=16M: the
    kernel's 128 KiB fills take each piece in eight parts, and a piece
    partly handed over is kept before the tier's pages, so the decoder never
    starts the frame over (it did 11-13 times, decoding about 8 times the
    file to get back).  Every byte right, the budget kept."""
    require_root_fuse()
    with tmpdir() as d:
        data = text_bytes(48 * MIB, 21)
        plain_zst(d, data, 3)
        with Mount(d + "/cli", d + "/mnt", "cache=kernel,budget=16M") as m:
            with open(d + "/mnt/f", "rb") as f:
                for off in range(0, len(data), 32 << 10):
                    check(f.read(32 << 10) == data[off:off + (32 << 10)],
                          "at %d" % off)
            st = m.stat()
            print("48 MiB in one frame at budget=16M: %d restarts, %.0f MiB decoded "
                  "to get past, %.1f MiB evicted from the tier, peak %s" % (
                      st["decoder_restarts"], st["decoder_skipped_bytes"] / MIB,
                      st["kernel_evicted"] * 4096 / MIB, m.ctl("memory.peak")))
            check(st["decoder_restarts"] == 0 and st["decoder_skipped_bytes"] == 0,
                  "%d restarts, %d bytes decoded to get past" % (
                      st["decoder_restarts"], st["decoder_skipped_bytes"]))
            check(st["kernel_evicted"] > 0, "the tier was never pressed")
            check(int(m.ctl("memory.peak")) <= 16 * MIB, "over the budget")


if __name__ == "__main__":
    main(globals(), "test_ktier.py")
