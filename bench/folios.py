#!/usr/bin/env python3
"""Counts the page-cache folios behind a file: maps it, touches every page, and reads each
page's flags from /proc/kpageflags (root only). Large folios show as compound heads and
tails; 4 KiB folios as single pages. Used to tell a kernel file system's page cache from
FUSE's (docs/benchmarks.md, "Warm reads").

    python3 bench/folios.py FILE
"""
import mmap
import os
import struct
import sys

KPF_COMPOUND_HEAD = 15
KPF_COMPOUND_TAIL = 16
PFN_MASK = (1 << 55) - 1


def main(path):
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    if size == 0:
        sys.exit(f"{path}: empty")
    m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    for off in range(0, size, 4096):
        m[off]
    start = None
    with open("/proc/self/maps") as maps:
        for line in maps:
            if line.rstrip().endswith(" " + os.path.abspath(path)):
                start = int(line.split()[0].split("-")[0], 16)
                break
    if start is None:
        sys.exit(f"{path}: its mapping is not in /proc/self/maps")
    heads = tails = single = absent = 0
    with open("/proc/self/pagemap", "rb") as pm, open("/proc/kpageflags", "rb") as kf:
        for i in range(size // 4096):
            pm.seek((start // 4096 + i) * 8)
            e = struct.unpack("<Q", pm.read(8))[0]
            if not (e >> 63) & 1:
                absent += 1
                continue
            kf.seek((e & PFN_MASK) * 8)
            f = struct.unpack("<Q", kf.read(8))[0]
            if (f >> KPF_COMPOUND_HEAD) & 1:
                heads += 1
            elif (f >> KPF_COMPOUND_TAIL) & 1:
                tails += 1
            else:
                single += 1
    print(f"{path}: {size // 4096} pages: large folios {heads} ({tails} tail pages), "
          f"single pages {single}, not mapped {absent}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
