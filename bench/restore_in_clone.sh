#!/usr/bin/env bash
# A whole snapshot restored into a writable snapshot, and into the file system's own tree,
# through a mount: `idxfs cp MOUNT/.snapshots/NAME MOUNT/copy` and `cp -a` of the same, each
# until synced, with the space each took (docs/benchmarks.md, "A whole snapshot restored
# into a writable snapshot"). Needs a release build (cargo build --release -p idxfs-cli) and
# root; works in /dev/shm/idxfs-restore-bench, removed at the end.
set -euo pipefail
B=${IDXFS:-$(cd "$(dirname "$0")/.." && pwd)/target/release/idxfs}
D=/dev/shm/idxfs-restore-bench
rm -rf "$D"
mkdir -p "$D/src" "$D/mp"
cleanup() {
    mountpoint -q "$D/mp" && { fusermount3 -u "$D/mp" 2>/dev/null || umount "$D/mp"; }
    rm -rf "$D"
}
trap cleanup EXIT
# 20,000 files of 0-4 KiB in 20 directories.
python3 - "$D/src" <<'PY'
import os, random, sys
r = random.Random(7)
for d in range(20):
    p = os.path.join(sys.argv[1], f"d{d:03}")
    os.mkdir(p)
    for i in range(1000):
        with open(os.path.join(p, f"f{i:04}"), "wb") as f:
            f.write(os.urandom(r.randrange(0, 4097)))
PY
"$B" mkfs --size 2G --from "$D/src" "$D/img" >/dev/null
"$B" subvolume snapshot "$D/img" ws >/dev/null
used() { stat -f -c '%b %f %S' "$D/mp" | awk '{print ($1 - $2) * $3}'; }
secs() { date +%s.%N; }
for tree in ws 5; do
    "$B" mount "$D/img" "$D/mp" -o "subvol=$tree" 2>/dev/null &
    until mountpoint -q "$D/mp"; do sleep 0.2; done
    "$B" snapshot "$D/mp" "s$tree" >/dev/null
    u0=$(used); t0=$(secs)
    "$B" cp "$D/mp/.snapshots/s$tree" "$D/mp/copy" >/dev/null
    sync -f "$D/mp"; t1=$(secs); u1=$(used)
    cp -a "$D/mp/.snapshots/s$tree" "$D/mp/copy2"
    sync -f "$D/mp"; t2=$(secs); u2=$(used)
    echo "subvol=$tree: idxfs cp $(echo "$t1 - $t0" | bc) s, $(((u1 - u0) / 1024)) KiB;" \
        "cp -a $(echo "$t2 - $t1" | bc) s, $(((u2 - u1) / 1024)) KiB"
    fusermount3 -u "$D/mp" 2>/dev/null || umount "$D/mp"
    while mountpoint -q "$D/mp"; do sleep 0.2; done
done
"$B" fsck "$D/img" | tail -1
