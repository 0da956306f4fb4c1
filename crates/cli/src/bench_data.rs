//! `idxfs bench data`: file data through each file system of the run.
//! - one large file written front to back in 1 MiB writes (then fsync), read back cold (after
//!   `Target::cold`: caches dropped, idxfs remounted) and warm, in 1 MiB reads;
//! - many 4 KiB files (in directories of 1,000) read whole, cold and warm (twice), as
//!   `find | xargs cat` does: open, read, close each.
//!
//! Beside idxfs's numbers, the FUSE floor: what the transport alone would allow, from the
//! round trip measured in the same run (`bench_mount::floor_ns`), at one request per MiB written,
//! eight per MiB read cold (READs of 128 KiB, the kernel's readahead window: 8,192 for a
//! GiB, counted with `IDXFS_COUNTERS`), two per small file read cold (LOOKUP, READ; no
//! OPEN: idxfs answers no-open) and one per small file in the first warm pass (GETATTR, see
//! `STEPS`). A warm read asks the daemon nothing else, so it has no floor.
//! idxfs also runs with `-o nodatasum`: "sums cost" is idxfs with data checksums against
//! without, same run. Every file system runs twice, in turn, and each step keeps its best
//! (`ROUNDS`).
use crate::bench_env::{self, FsKind, Target};
use crate::bench_suite::Scale;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;

const MIB: usize = 1 << 20;
const SMALL: usize = 4096;
const PER_DIR: u64 = 1_000;
/// Rounds over every file system; each step keeps its best.
const ROUNDS: usize = 2;

/// The steps, in table order: (label, unit, FUSE requests per unit for the floor).
/// A small file's first warm read after a cold one asks one GETATTR: after a READ reached the
/// daemon the kernel drops the atime it cached (`fuse_invalidate_atime`, on every mount that
/// is not read-only), and `read_to_end` stats the file. The next warm read asks nothing.
const STEPS: [(&str, &str, f64); N] = [
    ("large file, 1 MiB writes + fsync", "MiB/s", 1.0),
    ("large file, cold read", "MiB/s", 8.0),
    ("large file, warm read", "MiB/s", 0.0),
    ("4 KiB files, cold read", "files/s", 2.0),
    ("4 KiB files, warm read", "files/s", 1.0),
    ("4 KiB files, warm read again", "files/s", 0.0),
];
const N: usize = 6;

fn err(p: &Path, e: std::io::Error) -> String {
    format!("{}: {e}", p.display())
}

/// Reads `p` in 1 MiB reads; returns MiB/s.
fn read_big(p: &Path, buf: &mut [u8]) -> Result<f64, String> {
    let t = Instant::now();
    let mut f = std::fs::File::open(p).map_err(|e| err(p, e))?;
    let mut n = 0usize;
    loop {
        match f.read(buf).map_err(|e| err(p, e))? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n as f64 / MIB as f64 / t.elapsed().as_secs_f64())
}

/// Reads every file under `dir` (one level of directories); returns files/s.
fn read_small(dir: &Path) -> Result<f64, String> {
    let t = Instant::now();
    let mut files = 0u64;
    let mut buf = Vec::with_capacity(SMALL);
    for d in std::fs::read_dir(dir).map_err(|e| err(dir, e))? {
        let d = d.map_err(|e| err(dir, e))?.path();
        for f in std::fs::read_dir(&d).map_err(|e| err(&d, e))? {
            let f = f.map_err(|e| err(&d, e))?.path();
            buf.clear();
            std::fs::File::open(&f)
                .and_then(|mut h| h.read_to_end(&mut buf))
                .map_err(|e| err(&f, e))?;
            files += 1;
        }
    }
    Ok(files as f64 / t.elapsed().as_secs_f64())
}

/// The measurements on one file system (`STEPS` order).
fn on(t: &mut Target, big: u64, small: u64) -> Result<[f64; N], String> {
    let mut out = [0.0; N];
    let mut buf: Vec<u8> = (0..MIB).map(|i| (i * 7 + i / 4096) as u8).collect();
    let p = t.mp.join("large");
    let w = Instant::now();
    let mut f = std::fs::File::create(&p).map_err(|e| err(&p, e))?;
    for _ in 0..big / MIB as u64 {
        f.write_all(&buf).map_err(|e| err(&p, e))?;
    }
    f.sync_all().map_err(|e| err(&p, e))?;
    drop(f);
    out[0] = big as f64 / MIB as f64 / w.elapsed().as_secs_f64();
    let dir = t.mp.join("small");
    std::fs::create_dir(&dir).map_err(|e| err(&dir, e))?;
    for i in 0..small {
        let d = dir.join(format!("d{:03}", i / PER_DIR));
        if i % PER_DIR == 0 {
            std::fs::create_dir(&d).map_err(|e| err(&d, e))?;
        }
        let f = d.join(format!("f{i:06}"));
        std::fs::write(&f, &buf[i as usize % 1000..][..SMALL]).map_err(|e| err(&f, e))?;
    }
    t.cold()?;
    out[1] = read_big(&p, &mut buf)?;
    out[2] = read_big(&p, &mut buf)?;
    t.cold()?;
    out[3] = read_small(&dir)?;
    out[4] = read_small(&dir)?;
    out[5] = read_small(&dir)?;
    Ok(out)
}

/// The workload: one table (a column per file system, idxfs against ext4, the FUSE floor)
/// and the raw numbers.
pub fn data(scale: Scale, fs: &[FsKind], base: &Path) -> Result<(String, Value), String> {
    let big = scale.pick(64u64 << 20, 2 << 30, 2 << 30);
    let small = scale.pick(2_000u64, 50_000, 200_000);
    let floor_us = if fs.contains(&FsKind::Idxfs) {
        crate::bench_mount::floor_ns(base)? / 1e3
    } else {
        f64::NAN
    };
    // (label, kind, idxfs mount options): idxfs also without data checksums, for their cost.
    let mut runs: Vec<(String, FsKind, Option<&str>)> = Vec::new();
    for &k in fs {
        runs.push((k.name().to_string(), k, None));
        if k == FsKind::Idxfs {
            runs.push(("nodatasum".into(), k, Some("nodatasum")));
        }
    }
    bench_env::warm_up(base, 2 * big)?;
    // Two rounds, every file system in turn in each, the best of the two per step: which
    // one runs first in a round still moves its numbers by up to a quarter here.
    let mut cols: Vec<(String, FsKind, [f64; N])> = runs
        .iter()
        .map(|(l, k, _)| (l.clone(), *k, [0.0; N]))
        .collect();
    for round in 0..ROUNDS {
        for (i, (label, kind, opts)) in runs.iter().enumerate() {
            bench_env::interrupted()?;
            eprintln!("  data on {label}, round {round}");
            let image = big * 2 + small * 16 * 1024 + (1 << 30);
            let mut t = Target::make_with(base, *kind, image, small * 2 + 65_536, *opts)?;
            let got = on(&mut t, big, small)?;
            for (best, v) in cols[i].2.iter_mut().zip(got) {
                *best = best.max(v);
            }
        }
    }
    let mut o = String::new();
    let _ = writeln!(
        o,
        "data: a {} MiB file in 1 MiB writes, read cold and warm; {small} files of 4 KiB read \
         cold and warm (twice); best of {ROUNDS} rounds (FUSE round trip: {floor_us:.1} us)",
        big >> 20
    );
    let _ = write!(o, "{:<36}", "step");
    for (label, _, _) in &cols {
        let _ = write!(o, " {label:>10}");
    }
    let _ = writeln!(
        o,
        " {:>11} {:>10} {:>12}",
        "idxfs/ext4", "sums cost", "FUSE floor"
    );
    let at = |l: &str| cols.iter().find(|c| c.0 == l).map(|c| c.2);
    let mut raw = serde_json::Map::new();
    for (i, (label, unit, requests)) in STEPS.iter().enumerate() {
        let _ = write!(o, "{:<36}", format!("{label} ({unit})"));
        for (_, _, v) in &cols {
            let _ = write!(o, " {:>10.0}", v[i]);
        }
        let ratio = |a: Option<[f64; N]>, b: Option<[f64; N]>| match (a, b) {
            (Some(a), Some(b)) => format!("{:.2}x", a[i] / b[i]),
            _ => "-".into(),
        };
        let idxfs = at(FsKind::Idxfs.name());
        let (vs_ext4, sums) = (
            ratio(idxfs, at(FsKind::Ext4.name())),
            ratio(idxfs, at("nodatasum")),
        );
        // Units per second the transport alone allows at `requests` round trips a unit.
        let floor = if *requests > 0.0 && floor_us.is_finite() {
            format!("{:.0}", 1e6 / (requests * floor_us))
        } else {
            "-".into()
        };
        let _ = writeln!(o, " {vs_ext4:>11} {sums:>10} {floor:>12}");
        raw.insert(
            label.to_string(),
            json!(cols
                .iter()
                .map(|(l, _, v)| (l.clone(), json!(v[i])))
                .collect::<serde_json::Map<_, _>>()),
        );
    }
    Ok((
        o,
        json!({"large_bytes": big, "small_files": small, "fuse_round_trip_us": floor_us,
            "steps": raw}),
    ))
}
