#!/usr/bin/env python3
"""Shapes an unprivileged user can make in seconds, against a mounted idxfs (or any file
system): a chain of directories DEPTH deep, and a file of EXTENTS extents copied
(copy_file_range), punched, truncated and unlinked while another thread creates a file every
millisecond. Prints the times and the creates' latency beside each (docs/benchmarks.md,
"Hostile shapes").

    python3 bench/hostile_shapes.py chain DIR DEPTH
    python3 bench/hostile_shapes.py rename DIR DEPTH
    python3 bench/hostile_shapes.py extents DIR EXTENTS
    python3 bench/hostile_shapes.py sparse DIR EXTENTS

`rename` makes a chain (as `chain`, at DIR/rchain) and times renames of a directory at its
bottom: into a sibling directory and back, and within its own directory (median of 40).
`sparse` writes a file of EXTENTS data runs (1 byte every 8 KiB), then times a walk over
it with SEEK_DATA/SEEK_HOLE and a `cp` of it (its lseeks and reads).

Then, for the chain on an idxfs mount: `idxfs cp DIR/chain DIR/copy`, `idxfs rm DIR/copy`,
with the server's memory from /proc/PID/status.
"""
import ctypes
import os
import subprocess
import sys
import threading
import time


def chain(root, depth):
    os.chdir(root)
    os.mkdir("chain")
    os.chdir("chain")
    t = time.time()
    for _ in range(depth):
        os.mkdir("d")
        os.chdir("d")
    print("made a chain %d deep in %.1f s" % (depth, time.time() - t))


def extents(root, extents):
    fd = os.open(os.path.join(root, "frag"), os.O_CREAT | os.O_RDWR, 0o644)
    t = time.time()
    for i in range(extents):
        os.pwrite(fd, b"z", i * 8192)
    os.fsync(fd)
    print("wrote %d extents in %.1f s" % (extents, time.time() - t))
    size = os.fstat(fd).st_size
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]

    def copy(name):
        out = os.open(os.path.join(root, name), os.O_CREAT | os.O_RDWR, 0o644)
        done = 0
        while done < size:
            n = os.copy_file_range(fd, out, size - done, done, done)
            if n == 0:
                break
            done += n
        os.close(out)

    def punch(name):
        c = os.open(os.path.join(root, name), os.O_RDWR)
        # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        r = libc.fallocate(c, 3, 0, size)
        os.close(c)
        if r != 0:
            raise OSError(ctypes.get_errno(), "fallocate")

    def truncate(name):
        c = os.open(os.path.join(root, name), os.O_RDWR)
        os.ftruncate(c, 0)
        os.close(c)

    # Copies share the file's blocks, so the punch and the truncate of a copy also count
    # down each block's sharing. The creating thread runs on the CPU of the one that copies,
    # punches and truncates (whose FUSE requests then go to the same ring queue), or on the
    # other one.
    os.sched_setaffinity(0, {0})
    steps = [("copy_file_range of it", lambda: copy("copy1")),
             ("punch of all of a copy", lambda: punch("copy1")),
             ("truncate of a copy to 0", lambda: truncate("copy2")),
             ("unlink of a copy", lambda: os.unlink(os.path.join(root, "copy3")))]
    for (what, action), cpu in [(s, c) for c in (0, 1) for s in steps]:
        if what.startswith("truncate"):
            copy("copy2")
        if what.startswith("unlink"):
            copy("copy3")
        lat, stop = [], threading.Event()

        def creator():
            os.sched_setaffinity(0, {cpu})
            i = 0
            while not stop.is_set():
                s = time.time()
                p = os.path.join(root, "c%d" % i)
                os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
                lat.append(time.time() - s)
                os.unlink(p)
                i += 1
                time.sleep(0.001)

        th = threading.Thread(target=creator)
        th.start()
        time.sleep(0.3)
        t = time.time()
        action()
        took = time.time() - t
        time.sleep(0.3)
        stop.set()
        th.join()
        lat.sort()
        print("%-24s %.3f s; creates beside it on %s CPU: %d, max %.1f ms, p99 %.1f ms"
              % (what, took, ("its", "the other")[cpu], len(lat), lat[-1] * 1e3,
                 lat[int(len(lat) * 0.99)] * 1e3))
        if what.startswith("truncate"):
            os.unlink(os.path.join(root, "copy1"))
            os.unlink(os.path.join(root, "copy2"))
    os.close(fd)


def rename(root, depth):
    os.chdir(root)
    os.mkdir("rchain")
    os.chdir("rchain")
    for _ in range(depth):
        os.mkdir("d")
        os.chdir("d")
    for d in ("a", "b", "a/x"):
        os.mkdir(d)

    def median(pairs):
        ts = []
        for _ in range(20):
            for src, dst in pairs:
                t = time.time()
                os.rename(src, dst)
                ts.append(time.time() - t)
        ts.sort()
        return ts[len(ts) // 2] * 1e3

    across = median([("a/x", "b/x"), ("b/x", "a/x")])
    within = median([("a/x", "a/y"), ("a/y", "a/x")])
    print("renames at depth %d: into a sibling %.2f ms, within its directory %.2f ms"
          % (depth, across, within))


def sparse(root, extents):
    p = os.path.join(root, "sparse")
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    for i in range(extents):
        os.pwrite(fd, b"z", i * 8192)
    os.fsync(fd)
    t = time.time()
    pos, runs = 0, 0
    while True:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:
            break
        pos = os.lseek(fd, data, os.SEEK_HOLE)
        runs += 1
    walk = time.time() - t
    os.close(fd)
    t = time.time()
    subprocess.run(["cp", p, p + ".copy"], check=True)
    print("%d extents: SEEK_DATA/SEEK_HOLE walk %.2f s (%d data runs seen), cp %.2f s"
          % (extents, walk, runs, time.time() - t))


if __name__ == "__main__":
    what, root, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    {"chain": chain, "rename": rename, "extents": extents, "sparse": sparse}[what](root, n)
