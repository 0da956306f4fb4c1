"""Draws the PNG plots of `idxfs bench` from its bench.json (run by the subcommand itself:
python3 plot.py BENCH.json OUT_DIR). One figure per workload; missing workloads are skipped."""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

doc = json.load(open(sys.argv[1]))
out = sys.argv[2]
w = doc.get("workloads", {})
machine = doc.get("machine", {})
subtitle = f"{machine.get('cpu', '')}, {machine.get('cores', '?')} cores, kernel {machine.get('kernel', '')}"


def bars(name, labels, values, ylabel, title):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = ["tab:green" if l.startswith("idxfs") else "tab:gray" for l in labels]
    ax.bar(labels, values, color=colors)
    ax.set_ylabel(ylabel)
    ax.set_title(title + "\n" + subtitle, fontsize=9)
    for i, v in enumerate(values):
        ax.annotate(f"{v:,.0f}", (i, v), ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{out}/{name}.png", dpi=110)
    plt.close(fig)


if "fs_mark" in w:
    r = w["fs_mark"]["results"]
    bars("fs_mark", [x["fs"] for x in r], [x["files"] / x["wall_seconds"] for x in r],
         "files / s (all files / wall time)", "fs_mark (seed 000)")

if "dir-fsync" in w:
    r = w["dir-fsync"]["results"]
    fig, axes = plt.subplots(len(r), 1, figsize=(8, 2.2 * len(r) + 1), squeeze=False)
    for ax, x in zip(axes[:, 0], r):
        b = x["buckets"]
        ax.bar(range(len(b)), [c for _, _, c in b])
        ax.set_xticks(range(len(b)))
        ax.set_xticklabels([f"{lo:.2g}-{hi:.2g}" for lo, hi, _ in b], fontsize=7)
        ax.set_ylabel(x["fs"])
    axes[-1, 0].set_xlabel("directory fsync, ms")
    fig.suptitle("dir-fsync histogram (seed 003)\n" + subtitle, fontsize=9)
    fig.tight_layout()
    fig.savefig(f"{out}/dir-fsync-histogram.png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for x in r:
        ax.plot(range(1, len(x["fsync_ms"]) + 1), x["fsync_ms"], label=x["fs"], linewidth=0.7)
    ax.set_xlabel(f"fsync number (one per {w['dir-fsync']['fsync_period']} files)")
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("dir-fsync: does fsync cost grow with the directory?\n" + subtitle, fontsize=9)
    fig.tight_layout()
    fig.savefig(f"{out}/dir-fsync-series.png", dpi=110)
    plt.close(fig)

if "huge-dir" in w:
    s = w["huge-dir"]["samples"]
    fss = list(dict.fromkeys(x["fs"] for x in s))
    for variant in ["fresh", "aged"]:
        rows = [x for x in s if x["variant"] == variant]
        if not rows:
            continue
        steps = list(dict.fromkeys(x["step"] for x in rows))
        fig, ax = plt.subplots(figsize=(10, 4.5))
        width = 0.8 / max(1, len(fss))
        for i, f in enumerate(fss):
            vals = [next((x["seconds"] for x in rows if x["fs"] == f and x["step"] == st), 0)
                    for st in steps]
            ax.bar([j + i * width for j in range(len(steps))], vals, width, label=f)
        ax.set_xticks([j + width * (len(fss) - 1) / 2 for j in range(len(steps))])
        ax.set_xticklabels(steps)
        ax.set_yscale("log")
        ax.set_ylabel("seconds (log)")
        ax.legend()
        ax.set_title(f"huge-dir, {variant}: {w['huge-dir']['files']:,} files (seed 002)\n"
                     + subtitle, fontsize=9)
        fig.tight_layout()
        fig.savefig(f"{out}/huge-dir-{variant}.png", dpi=110)
        plt.close(fig)

if "nocow-write" in w:
    r = w["nocow-write"]["results"]
    bars("nocow-write", [x["fs"] for x in r], [x["mib_per_sec"] for x in r], "MiB/s",
         "nocow-write: fio randwrite 64 KiB O_DIRECT (seed 004)")

if "mkfs-from" in w:
    b = w["mkfs-from"]["builders"]
    bars("mkfs-from", list(b), [x["files_per_s"] for x in b.values()], "files / s",
         f"an image from {w['mkfs-from']['files']:,} small files (issue 25)")
