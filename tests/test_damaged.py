#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A dataset changed or damaged under its mount: manifests edited by hand
(inode numbers, modes, parents, root attributes), a dataset packed again
or removed while mounted, backing files replaced or truncated.  Nothing
wrong is ever served: EIO or ESTALE with a line in the log.

    test_damaged.py manifest | replaced | repacked | changed
"""
import errno
import os
import random
import shutil
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zftest import *  # noqa: E402,F401,F403
from test_faults import AT_FRAME, FRAME, packed_file  # noqa: E402


def rewrite_manifest(path, edit):
    """Decompress manifest.zst, let edit(lines) change its lines (the
    header last), and write it back as mkzfolio lays one out: frames of
    256 entries, the header's line a frame of its own, a seek table (here
    without checksums: the zstd CLI compresses each frame)."""
    text = subprocess.run(["zstd", "-dc", path], capture_output=True, check=True).stdout
    lines = edit(text.split(b"\n")[:-1])
    entries, header = lines[:-1], lines[-1]
    groups = [entries[i:i + 256] for i in range(0, len(entries), 256)] + [[header]]
    out, table = b"", b""
    for g in groups:
        raw = b"".join(line + b"\n" for line in g)
        z = subprocess.run(["zstd", "-q", "-c", "--no-check", "-1"], input=raw,
                           capture_output=True, check=True).stdout
        out += z
        table += struct.pack("<II", len(z), len(raw))
    table += struct.pack("<IBI", len(groups), 0, 0x8F92EAB1)
    with open(path, "wb") as f:
        f.write(out + struct.pack("<II", 0x184D2A5E, len(table)) + table)


def set_field(name, field, value):
    """An edit: field (0: parent, 1: name, 3: mode, 9: inode number) of
    the entry whose path is name."""
    parent, _, base = name.rpartition("/")

    def edit(lines):
        for i, line in enumerate(lines[:-1]):
            f = line.split(b"\t")
            if f[0] == parent.encode() and f[1] == base.encode():
                f[field] = value(i) if callable(value) else value
                lines[i] = b"\t".join(f)
                return lines
        fail("no entry " + name)
    return edit


def test_manifest():
    """An edited manifest.zst: an entry whose inode number is not its own
    (the root's, a directory's, a later file's; a hard link's later name
    given a directory's) or that does not parse
    reads as EIO, with a line in the log naming it, and every other entry
    still reads right; a header that is not one, a count of entries the
    frames do not hold, or the manifest recompressed as one zstd frame
    refuse the mount with the reason."""
    require_root_fuse()
    with tmpdir() as d:
        src, mnt = d + "/src", d + "/mnt"
        files = {"a": b"first\n", "d/e/f": b"hello\n"}
        files.update({"many/%03d" % i: b"%d\n" % i for i in range(300)})
        for n, data in files.items():
            os.makedirs(os.path.dirname(src + "/" + n), exist_ok=True)
            with open(src + "/" + n, "wb") as f:
                f.write(data)
        os.link(src + "/a", src + "/h")
        try:  # a manifest with extended attributes, the root without
            os.setxattr(src + "/a", "user.k", b"v")
            xattrs = True
        except OSError:
            xattrs = False
        pack(src, d + "/good")

        def served(edit):
            dst = d + "/dst"
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(d + "/good", dst, symlinks=True)
            rewrite_manifest(dst + "/manifest.zst", edit)
            return dst

        def expect(fn, err, what):
            try:
                fn()
            except OSError as e:
                check(e.errno == err, "%s: %s, not %s" % (what, e, errno.errorcode[err]))
                return
            fail(what + ": no error")

        def read(name):
            with open(mnt + "/" + name, "rb") as f:
                return f.read()

        cases = [
            # a directory named as the root: the kernel would take it for it
            ("d", 9, b"1", ["d", "d/e/f"], [""]),
            # a directory under two names
            ("d/e", 9, b"3", ["d/e", "d/e/f"], ["d"]),
            # node 0: the kernel would take it for "no such name"
            ("a", 9, b"0", ["a"], [""]),
            # a later name of a hard link numbered as a directory (d, the
            # entry before h)
            ("h", 9, lambda i: b"%d" % (i + 1), ["h"], []),
            # a file numbered as a later one
            ("a", 9, lambda i: b"%d" % (len(files) + 5), ["a"], [""]),
            # a mode that is not octal, in the second frame
            ("many/299", 3, b"zz", ["many/299"], ["many"]),
            # and the entry after the last of d/e: d/e still lists
            ("many/000", 3, b"zz", ["many/000"], ["many"]),
            # names no directory holds (in their sorted places: an edit out
            # of its place misleads the lookups of the frame's next names)
            ("many/001", 1, b"001/", ["many/001"], ["many"]),
            ("many/000", 1, b"..", ["many/000"], ["many"]),
        ]
        dirs = ["", "d", "d/e", "many"]
        for name, field, value, bad, bad_dirs in cases:
            what = "%s field %d = %r" % (name, field, value)
            with Mount(served(set_field(name, field, value)), mnt) as m:
                for n in bad:  # a name changed is not found by the old one
                    expect(lambda: read(n), errno.ENOENT if field == 1 else errno.EIO,
                           what + ": " + n)
                for n in bad_dirs:
                    expect(lambda: os.listdir(mnt + "/" + n), errno.EIO,
                           what + ": listing " + (n or "the root"))
                for n in dirs:
                    if n not in bad_dirs and not any(n == b or n.startswith(b + "/")
                                                     for b in bad):
                        os.listdir(mnt + "/" + n)
                for n, data in files.items():
                    if n not in bad and not any(n.startswith(b + "/") for b in bad):
                        check(read(n) == data, what + ": " + n + " wrong")
                check("a" in bad or "h" in bad or read("h") == files["a"], what + ": h")
                out = m.output()
                check(("manifest.zst: " in out and "the manifest is damaged" in out)
                      if field == 9 else "holds an entry that does not parse" in out,
                      what + ": not said: " + out)
        # extended attributes that do not parse: EIO for them, said; the
        # file reads
        if xattrs:
            with Mount(served(set_field("a", 14, b"garbage")), mnt) as m:
                expect(lambda: os.getxattr(mnt + "/a", "user.k"), errno.EIO, "xattrs")
                expect(lambda: os.listxattr(mnt + "/a"), errno.EIO, "xattr list")
                check(read("a") == files["a"], "a with damaged xattrs")
                check("extended attributes of inode 2 do not parse" in m.output(),
                      "not said: " + m.output())
            # the root's, in the header, with a NUL among them: read as
            # they are, to the end of the field (under ASan, a copy cut at
            # the NUL was read past its end)
            def root_nul(lines):
                lines[-1] += b"\txattrs=user.r=t\x00p"
                return lines
            with Mount(served(root_nul), mnt) as m:
                check(os.listxattr(mnt) == ["user.r"], "root's xattrs with a NUL")
                check(os.getxattr(mnt, "user.r") == b"t\x00p", "root's xattr with a NUL")
                check(read("a") == files["a"], "a beside the root's xattrs")
        # a name edited out of its sorted place: the names a lookup would
        # pass over in its frame read as EIO, not as missing
        with Mount(served(set_field("many/001", 1, b"zzz")), mnt) as m:
            expect(lambda: read("many/002"), errno.EIO, "a name passed over")
            check(read("many/000") == files["many/000"], "the name before")
            check(read("many/299") == files["many/299"], "the next frame")
            check("out of order" in m.output(), "not said: " + m.output())
        # a header that counts fewer entries than the frames hold: what is
        # past its count is not there, not even in a listing
        def fewer(ls):
            n = int(ls[-1].split(b"\tentries=")[1].split(b"\t")[0])
            return ls[:-1] + [ls[-1].replace(b"\tentries=%d\t" % n,
                                             b"\tentries=%d\t" % (n - 5), 1)]
        with Mount(served(fewer), mnt):
            names = sorted(os.listdir(mnt + "/many"))
            check(names == ["%03d" % i for i in range(295)], "listed past the count: %d %s"
                  % (len(names), names[-3:]))
            for n in names:
                check(read("many/" + n) == files["many/" + n], "many/" + n)
            expect(lambda: read("many/299"), errno.EIO, "past the count")
            if xattrs:  # a root without any (undefined behaviour once)
                check(os.listxattr(mnt) == [], "root xattrs")
        refused = [
            (lambda ls: ls[:-1] + [ls[-1].replace(b"zfolio-manifest", b"zfolio-manifext", 1)],
             "its last frame is not a zfolio-manifest header line"),
            (lambda ls: ls[:-1] + [ls[-1].replace(b"zfolio-manifest", b"zfolio-manifesto", 1)],
             "its last frame is not a zfolio-manifest header line"),
            (lambda ls: ls[:-1] + [ls[-1].replace(b"\tentries=", b"\tentries=9", 1)],
             "its header counts 9"),
        ]
        for edit, reason in refused:
            r = subprocess.run([ZFOLIO, served(edit), mnt, "-f"], capture_output=True,
                               text=True, timeout=30)
            check(r.returncode == 1 and r.stderr.count("\n") == 1 and reason in r.stderr,
                  "%s: %d %r" % (reason, r.returncode, r.stderr))
            check(not is_mounted(mnt), "mounted a broken manifest")
        # recompressed whole by the zstd CLI: one frame, no seek table
        dst = served(lambda ls: ls)
        subprocess.run("zstd -dc %s/good/manifest.zst | zstd -q -f -o %s/manifest.zst"
                       % (d, dst), shell=True, check=True)
        r = subprocess.run([ZFOLIO, dst, mnt, "-f"], capture_output=True, text=True,
                           timeout=30)
        check(r.returncode == 1 and "not a valid manifest: " in r.stderr,
              "one frame: %d %r" % (r.returncode, r.stderr))


def test_replaced():
    """A data file replaced by another dataset's, shorter (copied over it
    by hand, before the mount): the file the manifest places past its end
    opens as EIO, and the log says which file and why, never a silent
    EIO."""
    require_root_fuse()
    with tmpdir() as d:
        for name, size in (("a", 2 << 20), ("b", 1 << 19)):
            os.makedirs(d + "/src_" + name)
            with open(d + "/src_%s/f" % name, "wb") as f:
                f.write(random.Random(size).randbytes(size))
            pack(d + "/src_" + name, d + "/ds_" + name)
        for data in os.listdir(d + "/ds_b/data"):
            shutil.copyfile(d + "/ds_b/data/" + data, d + "/ds_a/data/" + data)
        with Mount(d + "/ds_a", d + "/mnt") as m:
            try:
                open(d + "/mnt/f", "rb").close()
                fail("a file past its replaced data file opened")
            except OSError as e:
                check(e.errno == errno.EIO, "open: %r" % e)
            check("f ends at byte %d of data file" % (2 << 20) in m.output() and
                  "a data file replaced or cut short" in m.output(),
                  "the log: %r" % m.output())


def test_repacked():
    """mkzfolio --force over a mounted dataset: what the mount read before
    still reads; what it did not read is EIO (its old places in the new
    data files hold other files' bytes), never those bytes; the log says
    to remount, and the remount serves the new dataset.  A dataset removed
    under its mount: EIO, and the log says it was removed."""
    require_root_fuse()
    with tmpdir() as d:
        rnd = random.Random(7)
        # small files packed together, big ones in data files of their own
        old = {"f%02d" % i: rnd.randbytes(1000 + i) for i in range(10)}
        old.update({"b%d" % i: rnd.randbytes(200000 + i) for i in range(4)})
        new = {"f%02d" % i: rnd.randbytes(1500 + 3 * i) for i in range(10)}
        new.update({"b%d" % i: rnd.randbytes(300000 + 7 * i) for i in range(4)})
        for name, files in (("src", old), ("src2", new)):
            os.makedirs(d + "/" + name)
            for n, data in files.items():
                with open(d + "/%s/%s" % (name, n), "wb") as f:
                    f.write(data)
        pack(d + "/src", d + "/dst")
        with Mount(d + "/dst", d + "/mnt") as m:
            with open(d + "/mnt/f00", "rb") as f:
                check(f.read() == old["f00"], "f00 before")
            pack(d + "/src2", d + "/dst", "--force")
            # the kernel still caches f00's pages: it reads as before
            with open(d + "/mnt/f00", "rb") as f:
                check(f.read() == old["f00"], "f00 after")
            for n in ("b0", "b2", "b3"):
                try:
                    with open(d + "/mnt/" + n, "rb") as f:
                        got = f.read()
                    fail("%s read %d bytes after the repack (old %s, new %s)" %
                         (n, len(got), got == old[n], got == new[n][:len(got)]))
                except OSError as e:
                    check(e.errno == errno.EIO, "%s: %s" % (n, e))
            check("packed again under the mount: remount it" in m.output(),
                  "no message: %r" % m.output())
        with Mount(d + "/dst", d + "/mnt"):
            for n in ("f00", "f09", "b0", "b3"):
                with open(d + "/mnt/" + n, "rb") as f:
                    check(f.read() == new[n], n + " after the remount")
        # the dataset removed under the mount: EIO, and the log says so
        # (not that it was packed again)
        shutil.copytree(d + "/dst", d + "/dst3")
        with Mount(d + "/dst3", d + "/mnt") as m:
            with open(d + "/mnt/f00", "rb") as f:
                check(f.read() == new["f00"], "f00 before the removal")
            shutil.rmtree(d + "/dst3")
            try:
                with open(d + "/mnt/b1", "rb") as f:
                    f.read()
                fail("b1 read after the dataset was removed")
            except OSError as e:
                check(e.errno == errno.EIO, "b1 after the removal: %s" % e)
            check("the dataset was removed under the mount" in m.output() and
                  "packed again" not in m.output(), "the message: %r" % m.output())
        # a data file missing before the mount: its file reads as EIO, not
        # ENOENT (that is a file removed under its reader), with a message;
        # the others read
        shutil.copytree(d + "/dst", d + "/dst4")
        data_dir = d + "/dst4/data"
        biggest = max(os.listdir(data_dir), key=lambda n: os.path.getsize(data_dir + "/" + n))
        os.unlink(data_dir + "/" + biggest)
        with Mount(d + "/dst4", d + "/mnt") as m:
            res = {}
            for n in sorted(new):
                try:
                    with open(d + "/mnt/" + n, "rb") as f:
                        res[n] = "ok" if f.read() == new[n] else "wrong"
                except OSError as e:
                    res[n] = e.errno
            bad = {n: r for n, r in res.items() if r != "ok"}
            check(len(bad) == 1 and list(bad.values()) == [errno.EIO],
                  "with %s missing: %s" % (biggest, bad))
            check("data/%s: No such file or directory: the dataset is damaged" % biggest
                  in m.output(), "the message: %r" % m.output())


def test_changed():
    """A backing file replaced or truncated while mounted: re-indexed at the
    next open, old folios dropped, no stale bytes (nor stale pages of the
    kernel's page cache with cache=kernel); with cache=engine open handles
    keep theirs (with cache=kernel the page cache is the inode's, so they
    see the new file from their next read on).  Rewritten in place under an
    open handle: not taken for damage."""
    require_root_fuse()
    for cache in ("engine", "kernel"):
        with tmpdir() as d:
            changed_once(d, cache)


def changed_once(d, cache):
    old, dst = packed_file(d, 20 * FRAME + 5, 1)
    new = text_bytes(13 * FRAME + 99, 2)
    os.makedirs(d + "/src2")
    with open(d + "/src2/f", "wb") as f:
        f.write(new)
    pack(d + "/src2", d + "/dst2", TREE, *AT_FRAME)
    with Mount(dst, d + "/mnt", "budget=32M,cache=" + cache) as m:
        held = open(d + "/mnt/f", "rb")
        check(held.read() == old, "old content")
        # replace it (a new inode, as tools do), then open again
        os.rename(d + "/dst2/f.zst", dst + "/f.zst.tmp")
        os.rename(dst + "/f.zst.tmp", dst + "/f.zst")
        time.sleep(1.2)  # the kernel's attribute cache (1 s)
        check(os.stat(d + "/mnt/f").st_size == len(new), "size after replace")
        with open(d + "/mnt/f", "rb") as f:
            check(f.read() == new, "stale bytes after replace (%s)" % cache)
        held.seek(0)
        if cache == "engine":
            check(held.read() == old, "the open handle lost its file")
        held.close()
        # rewritten in place (as cp does: the same inode) with content of
        # the same size: the kernel sees no change of size to drop its
        # pages for
        same = text_bytes(len(new), 3)
        os.makedirs(d + "/src3")
        with open(d + "/src3/f", "wb") as f:
            f.write(same)
        pack(d + "/src3", d + "/dst3", TREE, *AT_FRAME)
        with open(d + "/mnt/f", "rb") as f:
            check(f.read() == new, "before the rewrite")
        with open(d + "/dst3/f.zst", "rb") as f, open(dst + "/f.zst", "r+b") as g:
            z = f.read()
            g.truncate(0)
            g.write(z)
        time.sleep(1.2)
        with open(d + "/mnt/f", "rb") as f:
            check(f.read() == same, "stale bytes after a same-size replace (%s)" % cache)
        # rewritten in place, its bytes overwritten, while a handle opened
        # before reads nothing yet: that handle's read fails with EIO
        # (nothing of the old is left to keep; with cache=kernel a later
        # read may find the new file), and the log says the file changed,
        # not that it is damaged; a new open reads the new file
        other = text_bytes(9 * FRAME + 7, 4)
        os.makedirs(d + "/src4")
        with open(d + "/src4/f", "wb") as f:
            f.write(other)
        pack(d + "/src4", d + "/dst4", TREE, *AT_FRAME)
        held = open(d + "/mnt/f", "rb")
        with open(d + "/dst4/f.zst", "rb") as f, open(dst + "/f.zst", "r+b") as g:
            z = f.read()
            g.truncate(0)
            g.write(z)
        time.sleep(1.2)
        try:  # the old folios gone: nothing to keep
            m.set("memory.reclaim", "1G")
        except BlockingIOError:
            pass  # not all of 1G (as a cgroup says): what there was is gone
        try:
            got = held.read()
            check(got == other, "the held handle read %d wrong bytes (%s)" % (len(got), cache))
        except OSError as e:
            check(e.errno == errno.EIO, "held handle: %s" % e)
        held.close()
        with open(d + "/mnt/f", "rb") as f:
            check(f.read() == other, "stale bytes after a rewrite in place (%s)" % cache)
        check(m.stat()["corrupt_frames"] == 0, "a rewrite counted as damage (%s)" % cache)
        check("changed on disk while open" in m.output(), "the log: %r" % m.output()[-400:])
        check("does not decode" not in m.output(), "said damaged: %r" % m.output()[-400:])
        # truncate it in place: the next open fails clearly, no stale bytes
        with open(dst + "/f.zst", "r+b") as f:
            f.truncate(5000)
        time.sleep(1.2)
        try:
            with open(d + "/mnt/f", "rb") as f:
                got = f.read()
                check(got == other[:len(got)] and len(got) < len(other),
                      "truncated file served stale bytes (%s)" % cache)
        except OSError as e:
            check(e.errno == errno.EIO, "truncated: %s" % e)


if __name__ == "__main__":
    main(globals(), "test_damaged.py")
