//! `idxfs bench huge-dir` (seed 002): one directory of N empty files, and the whole-directory
//! passes people run on such directories, on idxfs through its mount beside ext4, btrfs and XFS
//! on memory-backed loop devices, in one run. Caches are cold before every step (the kernel's
//! dropped; idxfs also remounted). Fresh: N creates in an empty directory. Aged: 80% creates,
//! 20% deletes of a random entry, until the directory holds N entries. Then readdir,
//! readdir+stat, `tar cf /dev/null`, `cp -a` within the file system, `rm -rf`.
//!
//! Nothing here is asserted; it prints seconds, CPU-seconds (the benchmark process, its
//! children, and for idxfs the daemon too) and the ratio to the best kernel file system.
use crate::bench_env::{self, cpath, create_close, FsKind, Target};
use std::os::unix::fs::DirEntryExt;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

pub struct Options {
    pub files: u64,
    pub fs: Vec<FsKind>,
    pub fresh: bool,
    pub aged: bool,
}

/// One measured step.
#[derive(Clone, Debug)]
pub struct Sample {
    pub variant: &'static str,
    pub step: &'static str,
    pub fs: FsKind,
    pub seconds: f64,
    pub cpu_seconds: f64,
    pub load: f64,
    /// readdir only: fraction of consecutive entries whose inode numbers increase.
    pub increasing: Option<f64>,
}

pub const STEPS: [&str; 6] = [
    "create",
    "readdir",
    "readdir+stat",
    "tar cf /dev/null",
    "cp -a",
    "rm -rf",
];

fn name(i: u64) -> String {
    format!("f{i:08}")
}

/// Creates `files` entries in `dir` (fresh), or reaches `files` entries by 80% creates and 20%
/// deletes of a random entry (aged).
fn fill(dir: &Path, files: u64, aged: bool, label: &str) -> Result<(), String> {
    std::fs::create_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut bar = bench_env::Progress::new(label, files);
    let mut present: Vec<u64> = Vec::new();
    let mut next = 0u64;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut step = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    while (present.len() as u64) < files {
        if next.is_multiple_of(4096) {
            bench_env::interrupted()?;
            bar.set(present.len() as u64);
        }
        if aged && !present.is_empty() && step() % 100 < 20 {
            let i = (step() % present.len() as u64) as usize;
            let victim = present.swap_remove(i);
            let p = dir.join(name(victim));
            bench_env::check(
                // SAFETY: a valid C path.
                unsafe { libc::unlink(cpath(&p).as_ptr()) },
                "unlink",
                &p,
            )?;
        } else {
            let p = dir.join(name(next));
            create_close(&cpath(&p), &p)?;
            present.push(next);
            next += 1;
        }
    }
    Ok(())
}

/// readdir of the whole directory: (entries, fraction of consecutive increasing inodes).
fn readdir(dir: &Path, stat: bool, files: u64, label: &str) -> Result<(u64, f64), String> {
    let mut bar = bench_env::Progress::new(label, files);
    let rd = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (mut n, mut up, mut last) = (0u64, 0u64, None);
    for e in rd {
        let e = e.map_err(|e| format!("readdir {}: {e}", dir.display()))?;
        if stat {
            // fstatat(dirfd, name, AT_SYMLINK_NOFOLLOW), in the order readdir returned
            e.metadata()
                .map_err(|x| format!("stat {}: {x}", e.path().display()))?;
        }
        if last.is_some_and(|l| e.ino() > l) {
            up += 1;
        }
        last = Some(e.ino());
        n += 1;
        if n.is_multiple_of(4096) {
            bench_env::interrupted()?;
            bar.set(n);
        }
    }
    Ok((n, up as f64 / (n.max(2) - 1) as f64))
}

/// Runs one step on a target with cold caches: (seconds, CPU-seconds, increasing fraction).
/// `label` prefixes the progress bar of the steps this process runs itself.
fn step(
    t: &mut Target,
    variant: &str,
    step: &str,
    files: u64,
    label: &str,
) -> Result<Sample, String> {
    t.cold()?;
    let dir = t.mp.join(variant);
    let copy = t.mp.join(format!("{variant}.copy"));
    let load = bench_env::load_average();
    let daemon = t.daemon_pid();
    let d0 = daemon.map(bench_env::process_cpu).unwrap_or(0.0);
    let c0 = bench_env::self_and_children_cpu();
    let start = Instant::now();
    let mut increasing = None;
    match step {
        "create" => fill(&dir, files, variant == "aged", label)?,
        "readdir" | "readdir+stat" => {
            let (n, up) = readdir(&dir, step == "readdir+stat", files, label)?;
            if n != files {
                return Err(format!(
                    "{}: readdir saw {n} entries, not {files}",
                    t.kind.name()
                ));
            }
            increasing = Some(up);
        }
        "tar cf /dev/null" => {
            bench_env::run(
                Command::new("tar")
                    .args(["cf", "/dev/null", "-C"])
                    .arg(&t.mp)
                    .arg(variant),
            )?;
        }
        "cp -a" => {
            bench_env::run(Command::new("cp").arg("-a").arg(&dir).arg(&copy))?;
        }
        "rm -rf" => {
            bench_env::run(Command::new("rm").arg("-rf").arg(&dir))?;
        }
        _ => return Err(format!("unknown step {step}")),
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu = bench_env::self_and_children_cpu() - c0
        + daemon.map(bench_env::process_cpu).unwrap_or(0.0)
        - d0;
    Ok(Sample {
        variant: if variant == "aged" { "aged" } else { "fresh" },
        step: STEPS.iter().find(|s| **s == step).copied().unwrap_or("?"),
        fs: t.kind,
        seconds,
        cpu_seconds: cpu,
        load,
        increasing,
    })
}

pub fn run(opts: &Options) -> Result<Vec<Sample>, String> {
    if opts.fs.iter().any(|k| k.is_kernel_disk_fs()) {
        bench_env::ensure_tools(&[("mkfs.btrfs", "btrfs-progs"), ("mkfs.xfs", "xfsprogs")])?;
    }
    bench_env::catch_interrupts();
    let scratch = bench_env::Scratch::new()?;
    let files = opts.files;
    // Sparse images: room for the directory, its copy and the file systems' own overhead.
    let bytes = (8u64 << 30) + files * 8192;
    // Each variant leaves its copy behind (only the original is removed by the rm -rf step):
    // fresh, its copy, aged, its copy.
    let inodes = files * 4 + 65_536;
    let variants: Vec<&str> = [("fresh", opts.fresh), ("aged", opts.aged)]
        .iter()
        .filter(|v| v.1)
        .map(|v| v.0)
        .collect();
    let total = (opts.fs.len() * variants.len() * STEPS.len()) as u64;
    let mut done = 0u64;
    let mut out = Vec::new();
    // SAFETY: isatty only inspects the descriptor.
    let tty = unsafe { libc::isatty(2) } == 1;
    for &kind in &opts.fs {
        let mut t = Target::make(&scratch.0, kind, bytes, inodes)?;
        for &v in &variants {
            for s in STEPS {
                let label = format!("[{done:>3}/{total}] {:<6} {v:<5} {s:<18}", kind.name());
                if tty {
                    eprint!("\r{label} ...");
                }
                let r = step(&mut t, v, s, files, &label)?;
                eprintln!(
                    "{}[{:>3}/{total}] {:<6} {v:<5} {s:<18} {:>9.2} s {:>9.2} CPU-s{}",
                    if tty { "\r" } else { "" },
                    done + 1,
                    kind.name(),
                    r.seconds,
                    r.cpu_seconds,
                    r.increasing
                        .map(|f| format!("  increasing inodes {:.3}", f))
                        .unwrap_or_default()
                );
                out.push(r);
                done += 1;
            }
        }
        drop(t);
    }
    drop(scratch);
    Ok(out)
}

fn row_of<'a>(samples: &'a [Sample], variant: &str, step: &str) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|s| s.variant == variant && s.step == step)
        .collect()
}

/// A row's label and one cell per file system (`-` where it did not run).
fn cells(
    o: &mut String,
    variant: &str,
    step: &str,
    row: &[&Sample],
    fss: &[FsKind],
    value: impl Fn(&Sample) -> f64,
) {
    use std::fmt::Write;
    let _ = write!(o, "{variant:<6} {step:<18}");
    for f in fss {
        let _ = match row.iter().find(|s| s.fs == *f) {
            Some(s) => write!(o, " {:>9.2}", value(s)),
            None => write!(o, " {:>9}", "-"),
        };
    }
}

/// The table: one row per (variant, step), a column per file system, then the best kernel
/// file system and the ratio best-kernel / idxfs (> 1: idxfs is faster).
pub fn table(samples: &[Sample], files: u64) -> String {
    use std::fmt::Write;
    let mut fss: Vec<FsKind> = Vec::new();
    for s in samples {
        if !fss.contains(&s.fs) {
            fss.push(s.fs);
        }
    }
    let mut o = String::new();
    let _ = writeln!(
        o,
        "huge-dir: {files} empty files in one directory, seconds (cold caches before each step)"
    );
    let _ = write!(o, "{:<6} {:<18}", "", "step");
    for f in &fss {
        let _ = write!(o, " {:>9}", f.name());
    }
    let _ = writeln!(o, " {:>12} {:>8}", "best kernel", "ratio");
    for variant in ["fresh", "aged"] {
        for st in STEPS {
            let row = row_of(samples, variant, st);
            if row.is_empty() {
                continue;
            }
            cells(&mut o, variant, st, &row, &fss, |s| s.seconds);
            let best = row
                .iter()
                .filter(|s| s.fs.is_kernel_disk_fs())
                .min_by(|a, b| a.seconds.total_cmp(&b.seconds));
            let idx = row.iter().find(|s| s.fs == FsKind::Idxfs);
            match (best, idx) {
                (Some(b), Some(i)) => {
                    let _ = writeln!(
                        o,
                        " {:>12} {:>7.2}x",
                        format!("{} {:.2}", b.fs.name(), b.seconds),
                        b.seconds / i.seconds
                    );
                }
                _ => {
                    let _ = writeln!(o, " {:>12} {:>8}", "-", "-");
                }
            }
        }
    }
    let _ = writeln!(
        o,
        "CPU-seconds (benchmark process and children; idxfs: + daemon):"
    );
    for variant in ["fresh", "aged"] {
        for st in STEPS {
            let row = row_of(samples, variant, st);
            if row.is_empty() {
                continue;
            }
            cells(&mut o, variant, st, &row, &fss, |s| s.cpu_seconds);
            let _ = writeln!(o);
        }
    }
    let _ = write!(
        o,
        "readdir: fraction of consecutive entries with increasing inode numbers:"
    );
    for s in samples.iter().filter(|s| s.step == "readdir") {
        let _ = write!(
            o,
            " {} {} {:.3};",
            s.fs.name(),
            s.variant,
            s.increasing.unwrap_or(f64::NAN)
        );
    }
    let _ = writeln!(o);
    o
}
