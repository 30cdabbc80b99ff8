#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Holes: a file's frames of zeros, as lseek(SEEK_DATA, SEEK_HOLE) and
st_blocks show them on the mount, and what cp and tar make of them.

    test_holes.py seek | copy | header | store | lies
"""
import errno
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zftest import *  # noqa: E402,F401,F403
from test_damaged import rewrite_manifest  # noqa: E402
import stores  # noqa: E402

KIB = 1 << 10
MIB = 1 << 20
FRAME = 32 * KIB  # mkzfolio's frame of a big file
SMALL = 128 * KIB  # files up to this are packed together


def sparse_tree(root):
    """Files whose data and holes fall every way on frames: {name: bytes}."""
    files = {}

    def sparse(name, size, islands):
        with open(os.path.join(root, name), "wb") as f:
            f.truncate(size)
            for off, data in islands:
                f.seek(off)
                f.write(data)
        with open(os.path.join(root, name), "rb") as f:
            files[name] = f.read()

    os.makedirs(root)
    sparse("img", 6 * MIB + 777,  # a short last frame, in the hole
           ((0, text_bytes(5000, 1)),              # data first
            (MIB + 100, rand_bytes(70000, 2)),     # across frames
            (3 * MIB - 1, b"x"),                   # a frame's last byte
            (4 * MIB, text_bytes(128 * KIB, 3))))  # whole frames
    sparse("lead", 2 * MIB, ((2 * MIB - 3, b"end"),))  # a hole first
    sparse("tail", MIB + 5, ((0, rand_bytes(40000, 4)),))  # a hole last
    sparse("empty", 3 * MIB, ())  # all hole
    sparse("small", 100 * KIB, ((50 * KIB, b"y"),))  # packed: no holes
    with open(os.path.join(root, "zeros"), "wb") as f:  # dense zeros
        f.write(bytes(MIB) + b"z" + bytes(MIB))
    with open(os.path.join(root, "zeros"), "rb") as f:
        files["zeros"] = f.read()
    with open(os.path.join(root, "dense"), "wb") as f:
        files["dense"] = rand_bytes(300 * KIB, 5)
        f.write(files["dense"])
    return files


def holes_of(data, layout):
    """The mount's holes of a file: its frames of zeros, as (start, end)
    extents of data; a packed small file has none."""
    if layout == "packed" and len(data) <= SMALL:
        return [(0, len(data))] if data else []
    ext = []
    for off in range(0, len(data), FRAME):
        if data[off:off + FRAME].count(0) == len(data[off:off + FRAME]):
            continue
        end = min(off + FRAME, len(data))
        if ext and ext[-1][1] == off:
            ext[-1] = (ext[-1][0], end)
        else:
            ext.append((off, end))
    return ext


def extents(path):
    """The data extents lseek(SEEK_DATA, SEEK_HOLE) gives, walked as cp
    walks them, with what each answers at and past the end."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        out, pos = [], 0
        while True:
            try:
                d = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as e:
                check(e.errno == errno.ENXIO, "%s: SEEK_DATA %d: %s" % (path, pos, e))
                break
            h = os.lseek(fd, d, os.SEEK_HOLE)
            check(pos <= d < h <= size, "%s: data at %d, hole at %d" % (path, d, h))
            out.append((d, h))
            pos = h
            if pos >= size:
                break
        for whence in (os.SEEK_DATA, os.SEEK_HOLE):
            try:
                os.lseek(fd, size, whence)
                fail("%s: a seek at the end did not fail" % path)
            except OSError as e:
                check(e.errno == errno.ENXIO, "%s: at the end: %s" % (path, e))
        return out
    finally:
        os.close(fd)


def packed_blocks(data):
    """st_blocks of a big packed file: its frames of zeros left out."""
    if len(data) <= SMALL:
        return (len(data) + 511) // 512
    zeros = sum(len(data[o:o + FRAME]) for o in range(0, len(data), FRAME)
                if data[o:o + FRAME].count(0) == len(data[o:o + FRAME]))
    return (len(data) - zeros + 511) // 512


def test_seek():
    """Every file's data extents on the mount are its frames that are not
    all zeros, in both layouts and both cache modes (cache=kernel opens
    nothing: the seek finds its file by inode); a packed big file's
    st_blocks leaves its frames of zeros out, listed or looked up."""
    with tmpdir() as d:
        files = sparse_tree(d + "/src")
        for layout in ("packed", "tree"):
            pack(d + "/src", "%s/%s" % (d, layout), "--layout", layout)
            for cache in ("kernel", "engine"):
                with Mount("%s/%s" % (d, layout), d + "/mnt", "cache=" + cache):
                    listed = {e.name: e.stat() for e in os.scandir(d + "/mnt")}
                    for name, data in sorted(files.items()):
                        p = d + "/mnt/" + name
                        got = extents(p)
                        want = holes_of(data, layout)
                        check(got == want, "%s %s %s: data at %r, wanted %r"
                              % (layout, cache, name, got, want))
                        with open(p, "rb") as f:
                            check(f.read() == data, "%s: %s differs" % (layout, name))
                        if layout == "packed":
                            for st in (listed[name], os.stat(p)):
                                check(st.st_blocks == packed_blocks(data),
                                      "%s %s: st_blocks %d, wanted %d"
                                      % (cache, name, st.st_blocks, packed_blocks(data)))


def test_copy():
    """cp and tar --sparse keep the holes of what they copy from the
    mount, and the bytes: the copy of a sparse image takes about what its
    source takes, not its size; and cp reads no hole (a file that is all
    hole is copied without one read)."""
    with tmpdir() as d:
        files = sparse_tree(d + "/src")
        pack(d + "/src", d + "/ds")
        os.makedirs(d + "/untar")
        with Mount(d + "/ds", d + "/mnt"):
            os.makedirs(d + "/out")
            r = subprocess.run(["cp", "-a", d + "/mnt/.", d + "/out"],
                               capture_output=True, text=True)
            check(r.returncode == 0, "cp: %r" % r.stderr)
            tar = subprocess.run("tar -C %s --sparse -cf - img | tar -C %s/untar -xf -"
                                 % (d + "/mnt", d), shell=True, capture_output=True)
        with Mount(d + "/ds", d + "/mnt", "cache=engine") as m:
            reads = m.stat()["pgfault"]
            for name in ("empty", "img"):
                r = subprocess.run(["cp", d + "/mnt/" + name, d + "/one"],
                                   capture_output=True, text=True)
                check(r.returncode == 0, "cp: %r" % r.stderr)
                with open(d + "/one", "rb") as f:
                    check(f.read() == files[name], "the copy of %s differs" % name)
                now = m.stat()["pgfault"]
                # img: its data is 9 frames, some apart; read whole, 6 MiB
                check(now - reads <= (0 if name == "empty" else 12),
                      "cp read the holes of %s: %d reads" % (name, now - reads))
                reads = now
        check(tar.returncode == 0, "tar --sparse: %r" % tar.stderr)
        with open(d + "/untar/img", "rb") as f:
            check(f.read() == files["img"], "tar --sparse: img differs")
        check(os.stat(d + "/untar/img").st_blocks < len(files["img"]) // 512 // 4,
              "tar --sparse filled the holes")
        for name, data in files.items():
            with open(d + "/out/" + name, "rb") as f:
                check(f.read() == data, "the copy of %s differs" % name)
        for name in ("img", "empty", "lead"):
            st = os.stat(d + "/out/" + name)
            check(st.st_blocks * 512 <= packed_blocks(files[name]) * 512 + 64 * KIB,
                  "cp filled the holes of %s: %d blocks" % (name, st.st_blocks))


def test_header():
    """A manifest whose holes= does not parse, or names no data file, is
    damaged: the mount is refused with the reason; one from an older mkzfolio (none) serves
    st_blocks as the size."""
    with tmpdir() as d:
        files = sparse_tree(d + "/src")
        pack(d + "/src", d + "/ds")

        def header(edit):
            def f(lines):
                lines[-1] = edit(lines[-1])
                return lines
            return f

        text = subprocess.run(["zstd", "-dc", d + "/ds/manifest.zst"],
                              capture_output=True, check=True).stdout
        check(b"\tholes=" in text.split(b"\n")[-2], "no holes= in the header")
        rewrite_manifest(d + "/ds/manifest.zst",
                         header(lambda h: h.split(b"\tholes=")[0]))
        with Mount(d + "/ds", d + "/mnt"):
            st = os.stat(d + "/mnt/img")
            check(st.st_blocks == (len(files["img"]) + 511) // 512,
                  "without holes=: st_blocks %d" % st.st_blocks)
            check(extents(d + "/mnt/img") == holes_of(files["img"], "packed"),
                  "without holes=, the seek still finds the frames of zeros")
        for bad in (b"1:", b"x:5", b"3:5,2:7", b"1:5;", b"-1:5", b"99:5",
                    b",".join(b"%d:1" % i for i in range(50))):
            rewrite_manifest(d + "/ds/manifest.zst",
                             header(lambda h: h.split(b"\tholes=")[0] + b"\tholes=" + bad))
            r = subprocess.run([ZFOLIO, d + "/ds", d + "/mnt", "-f"],
                               capture_output=True, text=True, timeout=30 * SLOW)
            check(r.returncode != 0 and "manifest" in r.stderr,
                  "holes=%r: %d %r" % (bad, r.returncode, r.stderr))
            check(not is_mounted(d + "/mnt"), "mounted with holes=%r" % bad)


def test_store():
    """In a store (nginx), the seeks read each run of frames of zeros in
    one request: walking every file's extents takes a few requests, not
    one per frame."""
    require_root_fuse()
    with tmpdir() as d:
        files = sparse_tree(d + "/src")
        os.makedirs(d + "/www")
        pack(d + "/src", d + "/www/ds")
        with stores.Nginx(d + "/www") as web:
            with Mount(web.url + "ds/", d + "/mnt", "cache=engine") as m:
                before = int(dict(line.split(" ", 1) for line in
                                  m.ctl("store").splitlines())["requests"])
                for name, data in sorted(files.items()):
                    got = extents(d + "/mnt/" + name)
                    check(got == holes_of(data, "packed"), "%s: data at %r" % (name, got))
                after = int(dict(line.split(" ", 1) for line in
                                 m.ctl("store").splitlines())["requests"])
                # the seven data files' seek tables (two requests each),
                # then about one per run of holes (24 here), where one per
                # frame of zeros would be over 400
                zero_frames = sum(1 for data in files.values() if len(data) > SMALL
                                  for o in range(0, len(data), FRAME)
                                  if not any(data[o:o + FRAME]))
                check(zero_frames > 400, "only %d frames of zeros" % zero_frames)
                check(after - before <= 40, "%d requests to seek" % (after - before))
                print("%d requests to seek" % (after - before))


def test_lies():
    """A frame whose seek table gives zeros' checksum but whose bytes are
    not zeros (a table edited, or a checksum that collides) is data to
    lseek, also after a real frame of zeros of the same file was seen (its
    bytes are compared with later ones): a hole is only what decodes to
    zeros, so cp cannot leave a hole where there were bytes."""
    with tmpdir() as d:
        os.makedirs(d + "/src")
        size = 5 * FRAME
        with open(d + "/src/aaa", "wb") as f:  # a few bytes a frame too,
            f.write(bytes(FRAME) + b"a" * (size - FRAME))  # after zeros
        with open(d + "/src/zeros", "wb") as f:
            f.write(bytes(size))
        pack(d + "/src", d + "/ds", TREE, "--frame", "%dK" % (FRAME // KIB))

        def entry(path, k):
            """Where entry k of a seekable file's table is, and its
            (c_size, d_size, checksum)."""
            with open(path, "rb") as f:
                b = f.read()
            n, flags, magic = struct.unpack("<IBI", b[-9:])
            check(magic == 0x8F92EAB1 and flags & 0x80, "%s: no table with checksums" % path)
            at = len(b) - 9 - (n - k) * 12
            return at, struct.unpack("<III", b[at:at + 12])

        _, (zc, zd, zsum) = entry(d + "/ds/zeros.zst", 0)
        at, (ac, ad, _) = entry(d + "/ds/aaa.zst", 2)
        check(ad == zd and ac <= 64 + ad // 1024, "frame 2 of aaa: %d bytes for %d" % (ac, ad))
        with open(d + "/ds/aaa.zst", "r+b") as f:
            f.seek(at + 8)
            f.write(struct.pack("<I", zsum))
        with Mount(d + "/ds", d + "/mnt"):
            check(extents(d + "/mnt/zeros") == [], "zeros: not a hole")
            # frame 0 is zeros (the bytes compared with after it); the
            # forged frame 2 is not
            got = extents(d + "/mnt/aaa")
            check(got == [(FRAME, size)], "aaa: data at %r: a frame of 'a' taken for a hole" % got)


if __name__ == "__main__":
    main(globals(), "test_holes.py")
