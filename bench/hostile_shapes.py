#!/usr/bin/env python3
"""Shapes an unprivileged user can make in seconds, against a mounted idxfs (or any file
system): a chain of directories DEPTH deep, and a truncate to 0 of a file of EXTENTS
extents while another thread creates a file every millisecond. Prints the times and the
creates' latency beside the truncate (docs/benchmarks.md, "Hostile shapes").

    python3 bench/hostile_shapes.py chain DIR DEPTH
    python3 bench/hostile_shapes.py truncate DIR EXTENTS

Then, for the chain on an idxfs mount: `idxfs cp DIR/chain DIR/copy`, `idxfs rm DIR/copy`,
with the server's memory from /proc/PID/status.
"""
import os
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


def truncate(root, extents):
    fd = os.open(os.path.join(root, "frag"), os.O_CREAT | os.O_RDWR, 0o644)
    t = time.time()
    for i in range(extents):
        os.pwrite(fd, b"z", i * 8192)
    os.fsync(fd)
    print("wrote %d extents in %.1f s" % (extents, time.time() - t))
    lat, stop = [], threading.Event()

    def creator():
        i = 0
        while not stop.is_set():
            s = time.time()
            os.close(os.open(os.path.join(root, "c%d" % i), os.O_CREAT | os.O_WRONLY, 0o644))
            lat.append(time.time() - s)
            i += 1
            time.sleep(0.001)

    th = threading.Thread(target=creator)
    th.start()
    time.sleep(0.3)
    t = time.time()
    os.ftruncate(fd, 0)
    print("truncate to 0: %.3f s" % (time.time() - t))
    time.sleep(0.3)
    stop.set()
    th.join()
    os.close(fd)
    lat.sort()
    print("creates beside it: %d, max %.1f ms, p99 %.1f ms"
          % (len(lat), lat[-1] * 1e3, lat[int(len(lat) * 0.99)] * 1e3))


if __name__ == "__main__":
    what, root, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    {"chain": chain, "truncate": truncate}[what](root, n)
