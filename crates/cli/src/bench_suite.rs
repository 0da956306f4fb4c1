//! `idxfs bench [WORKLOAD ...]`: every seed's benchmark in its own shape, on idxfs (mounted,
//! and where it applies the library alone) beside the kernel's file systems, in one run. Each
//! workload prints a table with a ratio to the best kernel file system and adds its raw numbers
//! to `bench.json`; `bench/plot.py` draws the PNGs. See docs/benchmarks.md.
use crate::bench_env::{self, cpath, create_close, FsKind, Target};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

pub const WORKLOADS: [&str; 11] = [
    "fs_mark",
    "dir-fsync",
    "huge-dir",
    "nocow-write",
    "data",
    "concurrency",
    "apps",
    "acl",
    "mkfs-from",
    "snapshot",
    "micro",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Seconds per workload: what the harness test runs.
    Test,
    /// Minutes in all (under 10 here).
    Small,
    /// The seeds' own sizes (hours).
    Full,
}

impl Scale {
    pub fn parse(s: &str) -> Result<Scale, String> {
        match s {
            "test" => Ok(Scale::Test),
            "small" => Ok(Scale::Small),
            "full" => Ok(Scale::Full),
            _ => Err(format!("unknown scale {s:?} (test, small, full)")),
        }
    }
    pub(crate) fn pick<T>(self, test: T, small: T, full: T) -> T {
        match self {
            Scale::Test => test,
            Scale::Small => small,
            Scale::Full => full,
        }
    }
}

pub struct Suite {
    pub workloads: Vec<String>,
    pub scale: Scale,
    pub fs: Vec<FsKind>,
    pub out: PathBuf,
    /// Override the number of files of huge-dir.
    pub files: Option<u64>,
}

/// One workload's result: its table and its raw numbers.
struct Report {
    table: String,
    json: Value,
}

/// A table row: label, file system, value, CPU seconds, load.
pub(crate) type Row = (String, FsKind, f64, f64, f64);

/// "name value" rows -> a table with a ratio column against the best kernel file system.
/// `higher_better` says which way the ratio points; the ratio is always > 1 when idxfs wins.
pub(crate) fn ratio_table(title: &str, unit: &str, rows: &[Row], higher_better: bool) -> String {
    // rows: (label, fs, value, cpu seconds, load)
    let best = rows
        .iter()
        .filter(|r| r.1.is_kernel_disk_fs())
        .map(|r| r.2)
        .fold(None, |b: Option<f64>, v| {
            Some(match b {
                None => v,
                Some(b) if higher_better => b.max(v),
                Some(b) => b.min(v),
            })
        });
    let mut o = String::new();
    let _ = writeln!(o, "{title}");
    let _ = writeln!(
        o,
        "{:<28} {:>14} {:>10} {:>8} {:>12}",
        "file system", unit, "CPU-s", "load", "vs best kernel"
    );
    for (label, fs, v, cpu, load) in rows {
        let ratio = match best {
            Some(b) if *fs == FsKind::Idxfs || label.starts_with("idxfs") => {
                if higher_better {
                    format!("{:.2}x", v / b)
                } else {
                    format!("{:.2}x", b / v)
                }
            }
            _ => "-".into(),
        };
        let _ = writeln!(
            o,
            "{label:<28} {v:>14.1} {cpu:>10.2} {load:>8.2} {ratio:>12}"
        );
    }
    o
}

fn cpu_of(t: &Target) -> f64 {
    bench_env::self_and_children_cpu() + t.daemon_pid().map(bench_env::process_cpu).unwrap_or(0.0)
}

fn image_bytes(scale: Scale) -> u64 {
    scale.pick(2 << 30, 16 << 30, 64 << 30)
}

// ---------------------------------------------------------------------------------------------
// fs_mark (seed 000)

fn fs_mark(s: &Suite, base: &Path) -> Result<Report, String> {
    bench_env::ensure_tools(&[("fs_mark", "fsmark")])?;
    let threads = s.scale.pick(
        1,
        2,
        std::thread::available_parallelism().map_or(2, |n| n.get()),
    );
    let n = s.scale.pick(500u64, 20_000, 100_000);
    let loops = s.scale.pick(1, 3, 5);
    let mut rows = Vec::new();
    let mut raw = Vec::new();
    for &kind in &s.fs {
        bench_env::interrupted()?;
        let t = Target::make(
            base,
            kind,
            image_bytes(s.scale),
            n * threads as u64 * loops + 65_536,
        )?;
        let load = bench_env::load_average();
        let mut cmd = Command::new("fs_mark");
        // fs_mark writes its log (fs_log.txt) into the working directory: keep it in scratch.
        cmd.current_dir(base)
            .args(["-S", "0", "-L", &loops.to_string(), "-s", "0"])
            .args(["-n", &n.to_string(), "-t", &threads.to_string(), "-k"]);
        for i in 1..=threads {
            cmd.arg("-d").arg(t.mp.join(format!("d{i}")));
        }
        let c0 = cpu_of(&t);
        let start = Instant::now();
        let out = bench_env::run(&mut cmd)?;
        let wall = start.elapsed().as_secs_f64();
        let cpu = cpu_of(&t) - c0;
        // Rows of fs_mark's table: FSUse% Count Size Files/sec AppOverhead.
        let per_loop: Vec<f64> = out
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 5 && f.iter().all(|x| x.parse::<f64>().is_ok()))
                    .then(|| f[3].parse().unwrap_or(f64::NAN))
            })
            .collect();
        let total = (n * threads as u64 * loops) as f64;
        eprintln!(
            "fs_mark {:<6} {:>10.0} files/s (total/wall), fs_mark per loop {:?}",
            kind.name(),
            total / wall,
            per_loop.iter().map(|x| *x as u64).collect::<Vec<_>>()
        );
        rows.push((kind.name().to_string(), kind, total / wall, cpu, load));
        raw.push(json!({"fs": kind.name(), "files_per_sec_by_loop": per_loop,
            "files": total, "wall_seconds": wall, "cpu_seconds": cpu,
            "files_per_cpu_second": total / cpu.max(1e-9), "load_average": load}));
    }
    // The library alone: the same number of creates, `threads` directories, one thread each.
    if s.fs.contains(&FsKind::Idxfs) {
        let load = bench_env::load_average();
        let total = n * threads as u64 * loops;
        let c0 = bench_env::self_and_children_cpu();
        let start = Instant::now();
        library_creates(threads, total / threads as u64)?;
        let wall = start.elapsed().as_secs_f64();
        let cpu = bench_env::self_and_children_cpu() - c0;
        rows.push((
            "idxfs library API".into(),
            FsKind::Idxfs,
            total as f64 / wall,
            cpu,
            load,
        ));
        raw.push(
            json!({"fs": "idxfs-library", "files": total, "wall_seconds": wall,
            "cpu_seconds": cpu, "load_average": load}),
        );
    }
    let title = format!(
        "fs_mark -S 0 -L {loops} -s 0 -n {n} -t {threads} -k: files/s = all files / wall time \
         (fs_mark's own Files/sec adds per-thread rates; per loop in the JSON)"
    );
    Ok(Report {
        table: ratio_table(&title, "files/s", &rows, true),
        json: json!({"threads": threads, "files_per_thread": n, "loops": loops, "results": raw}),
    })
}

fn library_creates(threads: usize, per_thread: u64) -> Result<(), String> {
    use idxfs_engine::{Fs, MkfsOptions, OpenOptions};
    let bytes = (per_thread * threads as u64 * 600).max(256 << 20) + (256 << 20);
    let dev = std::sync::Arc::new(idxfs_blockdev::MemDevice::new(bytes));
    Fs::mkfs(dev.clone(), &MkfsOptions::default()).map_err(|e| e.to_string())?;
    let fs = Fs::open(dev, OpenOptions::default()).map_err(|e| e.to_string())?;
    let owner = idxfs_engine::fs::Owner::default();
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|k| {
                let fs = &fs;
                sc.spawn(move || -> Result<(), String> {
                    let d = fs
                        .mkdir(
                            idxfs_format::ROOT_INO,
                            format!("d{k}").as_bytes(),
                            0o755,
                            owner,
                        )
                        .map_err(|e| e.to_string())?;
                    for i in 0..per_thread {
                        fs.create(d.ino, format!("f{i:08}").as_bytes(), 0o644, owner)
                            .map_err(|e| e.to_string())?;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .try_for_each(|h| h.join().map_err(|_| "thread panicked".to_string())?)
    })?;
    fs.sync().map_err(|e| e.to_string())?;
    fs.close().map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------------------------
// dir-fsync (seed 003)

#[derive(Debug)]
struct Hist {
    count: usize,
    min: f64,
    max: f64,
    mean: f64,
    median: f64,
    stddev: f64,
    p90: f64,
    p95: f64,
    p99: f64,
    /// (low, high, count), ten buckets spaced geometrically like Statistics::Histogram's.
    buckets: Vec<(f64, f64, usize)>,
}

fn histogram(mut v: Vec<f64>) -> Hist {
    v.sort_by(f64::total_cmp);
    let count = v.len();
    let at = |q: f64| {
        v.get(((count as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let mean = v.iter().sum::<f64>() / count.max(1) as f64;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / count.max(1) as f64;
    let (min, max) = (
        v.first().copied().unwrap_or(0.0),
        v.last().copied().unwrap_or(0.0),
    );
    let lo = min.max(1e-6);
    let ratio = (max.max(lo * 1.0001) / lo).powf(0.1);
    let mut buckets: Vec<(f64, f64, usize)> = (0..10)
        .map(|i| (lo * ratio.powi(i), lo * ratio.powi(i + 1), 0))
        .collect();
    for x in &v {
        let i = buckets
            .iter()
            .position(|b| *x < b.1)
            .unwrap_or(buckets.len() - 1);
        buckets[i].2 += 1;
    }
    Hist {
        count,
        min,
        max,
        mean,
        median: at(0.5),
        stddev: var.sqrt(),
        p90: at(0.9),
        p95: at(0.95),
        p99: at(0.99),
        buckets,
    }
}

fn dir_fsync(s: &Suite, base: &Path) -> Result<Report, String> {
    let n = s.scale.pick(2_000u64, 50_000, 1_000_000);
    let period = 100;
    let mut table =
        format!(
        "dir-fsync: {n} empty files in one directory, the directory fsynced every {period} files \
         (ms)\n{:<8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>11} {:>8} {:>8}\n",
        "fs", "count", "mean", "median", "p99", "max", "total s", "last/first", "files/CPU-s",
        "load", "vs best"
    );
    let mut raw = Vec::new();
    let mut means = Vec::new();
    for &kind in &s.fs {
        bench_env::interrupted()?;
        let t = Target::make(base, kind, image_bytes(s.scale), n + 65_536)?;
        let load = bench_env::load_average();
        let dir = t.mp.join("testdir");
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let dfd = std::fs::File::open(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let c0 = cpu_of(&t);
        let mut ms = Vec::new();
        let mut bar = bench_env::Progress::new(format!("dir-fsync {:<6}", kind.name()), n);
        let start = Instant::now();
        for i in 1..=n {
            let p = dir.join(format!("file_{i}"));
            create_close(&cpath(&p), &p)?;
            if i % period == 0 {
                let f0 = Instant::now();
                dfd.sync_all()
                    .map_err(|e| format!("fsync {}: {e}", dir.display()))?;
                ms.push(f0.elapsed().as_secs_f64() * 1e3);
                if i % (period * 10) == 0 {
                    bench_env::interrupted()?;
                    bar.set(i);
                }
            }
        }
        let wall = start.elapsed().as_secs_f64();
        let cpu = cpu_of(&t) - c0;
        drop(bar);
        let tenth = (ms.len() / 10).max(1);
        let first = ms[..tenth].iter().sum::<f64>() / tenth as f64;
        let last = ms[ms.len() - tenth..].iter().sum::<f64>() / tenth as f64;
        let h = histogram(ms.clone());
        let total: f64 = ms.iter().sum::<f64>() / 1e3;
        means.push((kind, h.mean));
        let _ = writeln!(
            table,
            "{:<8} {:>7} {:>9.4} {:>9.4} {:>9.4} {:>9.4} {:>9.3} {:>10.2} {:>11.0} {:>8.2} {{{}}}",
            kind.name(),
            h.count,
            h.mean,
            h.median,
            h.p99,
            h.max,
            total,
            last / first.max(1e-9),
            n as f64 / cpu.max(1e-9),
            load,
            kind.name()
        );
        eprintln!(
            "dir-fsync {:<6} mean {:.3} ms, total {total:.2} s, last/first {:.2}",
            kind.name(),
            h.mean,
            last / first.max(1e-9)
        );
        raw.push(
            json!({"fs": kind.name(), "fsync_ms": ms, "count": h.count, "min": h.min,
            "max": h.max, "mean": h.mean, "median": h.median, "stddev": h.stddev, "p90": h.p90,
            "p95": h.p95, "p99": h.p99,
            "buckets": h.buckets.iter().map(|b| json!([b.0, b.1, b.2])).collect::<Vec<_>>(),
            "total_fsync_seconds": total, "first_tenth_mean_ms": first,
            "last_tenth_mean_ms": last, "wall_seconds": wall, "cpu_seconds": cpu,
            "load_average": load}),
        );
        drop(dfd);
    }
    // The ratio column: best kernel mean / this mean, for idxfs.
    let best = means
        .iter()
        .filter(|m| m.0.is_kernel_disk_fs())
        .map(|m| m.1)
        .fold(f64::INFINITY, f64::min);
    for (kind, mean) in &means {
        let r = if *kind == FsKind::Idxfs && best.is_finite() {
            format!("{:.2}x", best / mean)
        } else {
            "-".into()
        };
        table = table.replace(&format!("{{{}}}", kind.name()), &format!("{r:>8}"));
    }
    // Histograms in the seed's form.
    for r in &raw {
        let _ = writeln!(
            table,
            "{}: Count: {}  Range: {:.3} - {:.3}; Mean: {:.3}; Median: {:.3}; Stddev: {:.3}\n  \
             Percentiles: 90th: {:.3}; 95th: {:.3}; 99th: {:.3}",
            r["fs"].as_str().unwrap_or("?"),
            r["count"],
            r["min"].as_f64().unwrap_or(0.0),
            r["max"].as_f64().unwrap_or(0.0),
            r["mean"].as_f64().unwrap_or(0.0),
            r["median"].as_f64().unwrap_or(0.0),
            r["stddev"].as_f64().unwrap_or(0.0),
            r["p90"].as_f64().unwrap_or(0.0),
            r["p95"].as_f64().unwrap_or(0.0),
            r["p99"].as_f64().unwrap_or(0.0)
        );
        let buckets = r["buckets"].as_array().cloned().unwrap_or_default();
        let peak = buckets
            .iter()
            .map(|b| b[2].as_u64().unwrap_or(0))
            .max()
            .unwrap_or(1)
            .max(1);
        for b in buckets {
            let c = b[2].as_u64().unwrap_or(0);
            let _ = writeln!(
                table,
                "  {:>10.4} - {:>10.4}: {:>6} {}",
                b[0].as_f64().unwrap_or(0.0),
                b[1].as_f64().unwrap_or(0.0),
                c,
                "#".repeat((c * 50 / peak) as usize)
            );
        }
    }
    Ok(Report {
        table,
        json: json!({"files": n, "fsync_period": period, "results": raw}),
    })
}

// ---------------------------------------------------------------------------------------------
// huge-dir (seed 002)

fn huge_dir(s: &Suite) -> Result<Report, String> {
    let files = s.files.unwrap_or(s.scale.pick(2_000, 100_000, 1_000_000));
    let opts = crate::bench_hugedir::Options {
        files,
        fs: s.fs.clone(),
        fresh: true,
        aged: true,
    };
    let samples = crate::bench_hugedir::run(&opts)?;
    let rows: Vec<Value> = samples
        .iter()
        .map(|x| {
            json!({"variant": x.variant, "step": x.step, "fs": x.fs.name(),
                "seconds": x.seconds, "cpu_seconds": x.cpu_seconds, "load_average": x.load,
                "increasing_inodes": x.increasing})
        })
        .collect();
    Ok(Report {
        table: crate::bench_hugedir::table(&samples, files),
        json: json!({"files": files, "samples": rows}),
    })
}

// ---------------------------------------------------------------------------------------------
// nocow-write (seed 004)

/// One fio run of the seed's writes into NOCOW files under `t`'s `dir` (made here; `chattr +C`
/// on btrfs and idxfs, as the seed's nodatacow mount option): io_uring at iodepth 64, psync
/// if io_uring fails.
struct Fio {
    mib: f64,
    bytes: f64,
    cpu: f64,
    engine: &'static str,
}

fn fio_randwrite(
    t: &Target,
    kind: FsKind,
    jobs: u32,
    filesize: &str,
    runtime: u32,
) -> Result<Fio, String> {
    let dir = t.mp.join("fio");
    std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if matches!(kind, FsKind::Btrfs | FsKind::Idxfs) {
        bench_env::run(Command::new("chattr").arg("+C").arg(&dir))?;
    }
    for (engine, depth) in [("io_uring", 64), ("psync", 1)] {
        let c0 = cpu_of(t);
        let r = bench_env::run(
            Command::new("fio")
                .args(["--name=randwrite", "--rw=randwrite", "--fsync=0"])
                .args(["--fallocate=posix", "--group_reporting=1", "--direct=1"])
                .arg(format!("--ioengine={engine}"))
                .arg(format!("--iodepth={depth}"))
                .args(["--bs=64k", &format!("--filesize={filesize}")])
                .arg(format!("--runtime={runtime}"))
                .args(["--time_based", "--thread", &format!("--numjobs={jobs}")])
                .arg(format!("--directory={}", dir.display()))
                .arg("--output-format=json"),
        );
        let cpu = cpu_of(t) - c0;
        match r {
            Ok(out) => {
                // fio may print warnings before the JSON document.
                let start = out.find('{').unwrap_or(0);
                let v: Value = serde_json::from_str(&out[start..])
                    .map_err(|e| format!("fio output on {}: {e}", kind.name()))?;
                let bw_kib = v["jobs"][0]["write"]["bw"].as_f64().unwrap_or(f64::NAN);
                return Ok(Fio {
                    mib: bw_kib / 1024.0,
                    bytes: v["jobs"][0]["write"]["io_bytes"].as_f64().unwrap_or(0.0),
                    cpu,
                    engine,
                });
            }
            Err(e) => eprintln!(
                "nocow-write {}: {engine} failed ({e}), trying the next engine",
                kind.name()
            ),
        }
    }
    Err(format!("fio failed on {}", kind.name()))
}

fn nocow_write(s: &Suite, base: &Path) -> Result<Report, String> {
    bench_env::ensure_tools(&[("fio", "fio")])?;
    let image = s.scale.pick(4u64 << 30, 64 << 30, 512 << 30);
    let filler = s.scale.pick(1u64 << 30, 40 << 30, 400 << 30);
    let jobs = s.scale.pick(1, 4, 8);
    let filesize = s.scale.pick("32m", "256m", "1g");
    let runtime = s.scale.pick(2, 10, 60);
    let mut rows = Vec::new();
    let mut raw = Vec::new();
    for &kind in &s.fs {
        bench_env::interrupted()?;
        let t = Target::make(base, kind, image, 65_536)?;
        // Many block groups in use before the writes, without writing them (sparse image).
        let fill = t.mp.join("filler");
        bench_env::run(
            Command::new("fallocate")
                .args(["-l", &filler.to_string()])
                .arg(&fill),
        )?;
        let load = bench_env::load_average();
        let f = fio_randwrite(&t, kind, jobs, filesize, runtime)?;
        eprintln!(
            "nocow-write {:<6} {:>9.1} MiB/s ({})",
            kind.name(),
            f.mib,
            f.engine
        );
        rows.push((
            format!("{} ({})", kind.name(), f.engine),
            kind,
            f.mib,
            f.cpu,
            load,
        ));
        raw.push(
            json!({"fs": kind.name(), "ioengine": f.engine, "mib_per_sec": f.mib,
            "bytes": f.bytes, "cpu_seconds": f.cpu,
            "mib_per_cpu_second": f.bytes / 1048576.0 / f.cpu.max(1e-9), "load_average": load}),
        );
    }
    let title = format!(
        "nocow-write: fio randwrite 64 KiB, O_DIRECT, {jobs} jobs x {filesize}, {runtime} s, after \
         fallocate of {} GiB (many block groups): MiB/s",
        filler >> 30
    );
    let mut table = ratio_table(&title, "MiB/s", &rows, true);
    let mut groups_json = Value::Null;
    if s.fs.contains(&FsKind::Idxfs) {
        let (t, j) = nocow_groups(s, base)?;
        table.push_str(&t);
        groups_json = j;
    }
    Ok(Report {
        table,
        json: json!({"jobs": jobs, "filesize": filesize, "runtime_seconds": runtime,
            "filler_bytes": filler, "results": raw, "idxfs_groups": groups_json}),
    })
}

/// Seed 004's claim on idxfs: the same NOCOW writes on an image of 10 block groups and on one
/// of 3,500 (all but 100 in use by a preallocated file, as the seed's filler), alternated, best of
/// each. idxfs writes a NOCOW file's blocks where they are and finds a block's group by
/// arithmetic (`space/alloc.rs`), so the group count should not show.
fn nocow_groups(s: &Suite, base: &Path) -> Result<(String, Value), String> {
    let group = idxfs_format::DEFAULT_NODE_SIZE as u64 * idxfs_format::BLOCK_SIZE;
    let (jobs, filesize, runtime) = (4, "64m", s.scale.pick(1, 4, 10));
    let rounds = s.scale.pick(1, 2, 3);
    let mut best = [0f64; 2];
    let mut all = Vec::new();
    for round in 0..rounds {
        for (i, groups) in [10u64, 3_500].into_iter().enumerate() {
            bench_env::interrupted()?;
            let t = Target::make(base, FsKind::Idxfs, groups * group, 65_536)?;
            if groups > 10 {
                // All but 100 groups' worth in use (preallocated, nothing written; the
                // reserves and the metadata take some).
                let fill = t.mp.join("filler");
                let len = (groups - 100) * group;
                bench_env::run(
                    Command::new("fallocate")
                        .args(["-l", &len.to_string()])
                        .arg(&fill),
                )?;
            }
            let f = fio_randwrite(&t, FsKind::Idxfs, jobs, filesize, runtime)?;
            eprintln!(
                "nocow-write idxfs, {groups} groups, round {round}: {:.1} MiB/s",
                f.mib
            );
            best[i] = best[i].max(f.mib);
            all.push(json!({"groups": groups, "round": round, "mib_per_sec": f.mib}));
        }
    }
    let table = format!(
        "\nnocow-write on idxfs by block groups ({} MiB each): {jobs} jobs x {filesize}, {runtime} s, \
         best of {rounds}: 10 groups {:.1} MiB/s, 3,500 groups {:.1} MiB/s ({:.3}x)\n",
        group >> 20,
        best[0],
        best[1],
        best[1] / best[0]
    );
    Ok((
        table,
        json!({"runs": all, "best_10": best[0], "best_3500": best[1]}),
    ))
}

// ---------------------------------------------------------------------------------------------
// concurrency (issue 22: readers beside a writer, two writers against one)

fn concurrency(s: &Suite, base: &Path) -> Result<Report, String> {
    let secs = s.scale.pick(0.3, 3.0, 10.0);
    let files = s.scale.pick(2_000, 20_000, 100_000);
    let creates = s.scale.pick(10_000, 200_000, 1_000_000);
    let listed = s.scale.pick(2_000, 50_000, 50_000);
    let with_mount = s.fs.contains(&FsKind::Idxfs);
    let (table, json) =
        crate::bench_concurrency::run(base, secs, files, creates, listed, with_mount)?;
    Ok(Report { table, json })
}

// ---------------------------------------------------------------------------------------------
// micro (seeds 000, 001, 004 in memory)

fn micro(s: &Suite) -> Result<Report, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let has_cargo = Command::new("cargo")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_cargo || !root.join("crates/index/benches/seeds.rs").exists() {
        let note = "micro: skipped (needs cargo and the idxfs source tree)\n".to_string();
        return Ok(Report {
            table: note,
            json: json!({"skipped": "needs cargo and the source tree"}),
        });
    }
    let keys = s.scale.pick("20000", "1000000", "5000000");
    let mut cmd = Command::new("cargo");
    cmd.current_dir(&root)
        .args(["bench", "-q", "-p", "idxfs-index", "--bench", "seeds"])
        .env("IDXFS_BENCH_KEYS", keys)
        // Its own target directory: this may run inside `cargo test`, which holds the default.
        .env("CARGO_TARGET_DIR", root.join("target/bench-micro"));
    let out = bench_env::run(&mut cmd)?;
    Ok(Report {
        table: format!("micro: cargo bench -p idxfs-index --bench seeds ({keys} keys)\n{out}\n"),
        json: json!({"keys": keys, "output": out}),
    })
}

// ---------------------------------------------------------------------------------------------

pub fn run(s: &Suite) -> Result<(), String> {
    for w in &s.workloads {
        if !WORKLOADS.contains(&w.as_str()) {
            return Err(format!("unknown workload {w:?} ({})", WORKLOADS.join(", ")));
        }
    }
    // SAFETY: geteuid has no side effects.
    if unsafe { libc::geteuid() } != 0 {
        return Err("idxfs bench needs root (loop devices, mounts, drop_caches)".into());
    }
    if s.fs.iter().any(|k| k.is_kernel_disk_fs()) {
        bench_env::ensure_tools(&[("mkfs.btrfs", "btrfs-progs"), ("mkfs.xfs", "xfsprogs")])?;
    }
    if s.fs.contains(&bench_env::FsKind::Idxfs) {
        bench_env::ensure_fuse_uring();
    }
    bench_env::catch_interrupts();
    std::fs::create_dir_all(&s.out).map_err(|e| format!("{}: {e}", s.out.display()))?;
    let scratch = bench_env::Scratch::new()?;
    let started = Instant::now();
    let mut doc = json!({
        "machine": bench_env::machine(),
        "scale": format!("{:?}", s.scale).to_lowercase(),
        "file_systems": s.fs.iter().map(|f| f.name()).collect::<Vec<_>>(),
        "date_unix": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs()).unwrap_or(0),
        "workloads": {},
    });
    let mut text = String::new();
    for (i, w) in s.workloads.iter().enumerate() {
        eprintln!(
            "== [{}/{}] {w} ({:.0} s so far)",
            i + 1,
            s.workloads.len(),
            started.elapsed().as_secs_f64()
        );
        let r = match w.as_str() {
            "fs_mark" => fs_mark(s, &scratch.0)?,
            "dir-fsync" => dir_fsync(s, &scratch.0)?,
            "huge-dir" => huge_dir(s)?,
            "nocow-write" => nocow_write(s, &scratch.0)?,
            "concurrency" => concurrency(s, &scratch.0)?,
            "data" => {
                let (table, json) = crate::bench_data::data(s.scale, &s.fs, &scratch.0)?;
                Report { table, json }
            }
            "apps" => {
                let (table, json) = crate::bench_apps::apps(s.scale, &s.fs, &scratch.0)?;
                Report { table, json }
            }
            "acl" => {
                let (table, json) = crate::bench_acl::acl(s.scale, s.files, &s.fs, &scratch.0)?;
                Report { table, json }
            }
            "mkfs-from" => {
                let (table, json) = crate::bench_import::mkfs_from(s.scale, &s.fs, &scratch.0)?;
                Report { table, json }
            }
            "snapshot" => {
                let (table, json) = crate::bench_snapshot::snapshot(s.scale, &s.fs, &scratch.0)?;
                Report { table, json }
            }
            _ => micro(s)?,
        };
        println!("{}", r.table);
        text.push_str(&r.table);
        text.push('\n');
        doc["workloads"][w.as_str()] = r.json;
        let txt = s.out.join(format!("{w}.txt"));
        std::fs::write(&txt, &r.table).map_err(|e| format!("{}: {e}", txt.display()))?;
    }
    drop(scratch);
    doc["total_seconds"] = json!(started.elapsed().as_secs_f64());
    let j = s.out.join("bench.json");
    std::fs::write(&j, serde_json::to_string_pretty(&doc).unwrap_or_default())
        .map_err(|e| format!("{}: {e}", j.display()))?;
    let t = s.out.join("bench.txt");
    std::fs::write(&t, &text).map_err(|e| format!("{}: {e}", t.display()))?;
    plots(&j, &s.out)?;
    eprintln!(
        "done in {:.0} s: {} (tables), {} (raw numbers), PNG plots in {}",
        started.elapsed().as_secs_f64(),
        t.display(),
        j.display(),
        s.out.display()
    );
    Ok(())
}

/// Draws the PNGs with bench/plot.py (matplotlib, installed from Debian when missing).
fn plots(json: &Path, out: &Path) -> Result<(), String> {
    let script = include_str!("../../../bench/plot.py");
    let py = "/usr/bin/python3";
    let has = |py: &str| {
        Command::new(py)
            .args(["-c", "import matplotlib"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !has(py) {
        bench_env::apt_install(&["python3-matplotlib"])?;
    }
    bench_env::run(Command::new(py).arg("-c").arg(script).arg(json).arg(out))?;
    Ok(())
}
