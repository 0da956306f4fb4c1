//! `idxfs bench mkfs-from`: an image built from a directory of small files (issue 25's
//! "packing a data set into an image"), beside the kernel file systems' own builders in one
//! run: `idxfs mkfs --from` against `mke2fs -d` (ext4), `mkfs.btrfs --rootdir`, and `cp -a`
//! into a fresh mount of every file system asked for (idxfs's through FUSE included). Each
//! is timed until its image holds the tree: the builders until they exit, `cp -a` until the
//! unmount after it returns.
//!
//! The source is made once on /dev/shm: `files` files of 0 to 4 KiB (sizes from a fixed
//! seed) in directories of 1,000. Every builder runs twice, in turn, after a warm-up write
//! (`bench_env::warm_up`), and keeps its best.
use crate::bench_env::{self, FsKind, Target};
use crate::bench_suite::{ratio_table, Row, Scale};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

const ROUNDS: usize = 2;
const PER_DIR: u64 = 1_000;

/// Makes the source tree under `dir`; returns its data bytes.
pub(crate) fn source(dir: &Path, files: u64) -> Result<u64, String> {
    let err = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    std::fs::create_dir_all(dir).map_err(|e| err(dir, e))?;
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut bytes = 0;
    let mut progress = bench_env::Progress::new("  making the source tree", files);
    let buf: Vec<u8> = (0..4096u32).map(|i| (i * 7 + i / 251) as u8).collect();
    for i in 0..files {
        let d = dir.join(format!("d{:05}", i / PER_DIR));
        if i % PER_DIR == 0 {
            std::fs::create_dir(&d).map_err(|e| err(&d, e))?;
            progress.set(i);
        }
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let n = (s % 4096) as usize;
        let p = d.join(format!("f{:07}", i));
        std::fs::write(&p, &buf[..n]).map_err(|e| err(&p, e))?;
        bytes += n as u64;
    }
    Ok(bytes)
}

/// One way to build an image of the source.
#[derive(Clone, Copy)]
enum Builder {
    MkfsFrom,
    Mke2fs,
    MkfsBtrfs,
    /// `cp -a` into a fresh mount of this file system.
    Copy(FsKind),
    /// `idxfs import` into a fresh idxfs mount.
    Import,
}

impl Builder {
    fn label(self) -> String {
        match self {
            Builder::MkfsFrom => "idxfs mkfs --from".into(),
            Builder::Mke2fs => "mke2fs -d (ext4)".into(),
            Builder::MkfsBtrfs => "mkfs.btrfs --rootdir".into(),
            Builder::Copy(k) => format!("cp -a into {}", k.name()),
            Builder::Import => "idxfs import (a mount)".into(),
        }
    }

    fn kind(self) -> FsKind {
        match self {
            Builder::MkfsFrom => FsKind::Idxfs,
            Builder::Mke2fs => FsKind::Ext4,
            Builder::MkfsBtrfs => FsKind::Btrfs,
            Builder::Copy(k) => k,
            Builder::Import => FsKind::Idxfs,
        }
    }

    /// Builds an image of `src` under `base`; the seconds it took and the CPU seconds of
    /// this process and its children (the builder, `cp`, idxfs's mount daemon).
    fn run(self, src: &Path, base: &Path, bytes: u64, inodes: u64) -> Result<(f64, f64), String> {
        let img = base.join("built.img");
        let _ = std::fs::remove_file(&img);
        let sized = || {
            std::fs::File::create(&img)
                .and_then(|f| f.set_len(bytes))
                .map_err(|e| format!("{}: {e}", img.display()))
        };
        let mut target = None;
        let mut cmd = match self {
            Builder::MkfsFrom => {
                let mut c = Command::new(bench_env::self_exe());
                c.args(["mkfs", "--size", &bytes.to_string(), "--from"]);
                c
            }
            Builder::Mke2fs => {
                sized()?;
                let mut c = Command::new("mke2fs");
                c.args(["-q", "-F", "-t", "ext4", "-N", &inodes.to_string(), "-d"]);
                c
            }
            Builder::MkfsBtrfs => {
                sized()?;
                let mut c = Command::new("mkfs.btrfs");
                c.args(["-q", "-f", "--rootdir"]);
                c
            }
            Builder::Copy(kind) => {
                let t = Target::make(base, kind, bytes, inodes)?;
                let mut c = Command::new("cp");
                c.arg("-a");
                target = Some(t);
                c
            }
            Builder::Import => {
                target = Some(Target::make(base, FsKind::Idxfs, bytes, inodes)?);
                let mut c = Command::new(bench_env::self_exe());
                c.arg("import");
                c
            }
        };
        match (&target, self) {
            // `idxfs import SRC MP/copy`.
            (Some(t), Builder::Import) => cmd.arg(src).arg(t.mp.join("copy")),
            // Into the mount: `cp -a SRC/. MP`.
            (Some(t), _) => {
                let mut from = src.as_os_str().to_owned();
                from.push("/.");
                cmd.arg(from).arg(&t.mp)
            }
            (None, _) => cmd.arg(src).arg(&img),
        };
        let cpu0 = bench_env::self_and_children_cpu();
        let start = Instant::now();
        bench_env::run(&mut cmd)?;
        if let Some(t) = target.as_mut() {
            // Written back (and for idxfs committed, its daemon exited and reaped).
            t.unmount();
        }
        let secs = start.elapsed().as_secs_f64();
        let cpu = bench_env::self_and_children_cpu() - cpu0;
        drop(target);
        let _ = std::fs::remove_file(&img);
        Ok((secs, cpu))
    }
}

pub fn mkfs_from(scale: Scale, fs: &[FsKind], base: &Path) -> Result<(String, Value), String> {
    let files = scale.pick(2_000u64, 100_000, 1_000_000);
    let src = base.join("mkfs-from-src");
    let data = source(&src, files)?;
    let dirs = files.div_ceil(PER_DIR);
    let inodes = (files + dirs) * 5 / 4 + 1024;
    // Room for the data three times over: every builder fits, none is pressed for space.
    let bytes = (data * 3).max(1 << 30).div_ceil(1 << 20) << 20;
    let mut builders = Vec::new();
    for &k in fs {
        match k {
            FsKind::Idxfs => builders.extend([Builder::MkfsFrom, Builder::Import]),
            FsKind::Ext4 => builders.push(Builder::Mke2fs),
            FsKind::Btrfs => builders.push(Builder::MkfsBtrfs),
            _ => {}
        }
        builders.push(Builder::Copy(k));
    }
    bench_env::warm_up(base, scale.pick(256 << 20, 2 << 30, 4 << 30))?;
    // Per builder: the seconds and CPU seconds of its fastest round.
    let mut best = vec![(f64::INFINITY, 0.0); builders.len()];
    for round in 0..ROUNDS {
        for (b, best) in builders.iter().zip(best.iter_mut()) {
            bench_env::interrupted()?;
            eprintln!("  {}, round {round}", b.label());
            let run = b.run(&src, base, bytes, inodes)?;
            if run.0 < best.0 {
                *best = run;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&src);
    let rows: Vec<Row> = builders
        .iter()
        .zip(&best)
        .map(|(b, &(s, cpu))| (b.label(), b.kind(), files as f64 / s, cpu, 0.0))
        .collect();
    let mut table = ratio_table(
        &format!(
            "mkfs-from: an image of {files} files of 0-4 KiB ({} MiB) in {dirs} directories; \
             best of {ROUNDS} rounds",
            data >> 20
        ),
        "files/s",
        &rows,
        true,
    );
    table.push_str(
        "(until the image holds the tree: builders until they exit, cp -a until the unmount \
         after it; CPU-s of this process and its children, the kernel's writeback not \
         counted; load not measured)\n",
    );
    let raw: serde_json::Map<String, Value> = builders
        .iter()
        .zip(&best)
        .map(|(b, &(s, cpu))| {
            (
                b.label(),
                json!({"seconds": s, "cpu_s": cpu, "files_per_s": files as f64 / s}),
            )
        })
        .collect();
    Ok((
        table,
        json!({"files": files, "data_bytes": data, "builders": raw}),
    ))
}
