//! `idxfs bench`: performance, never asserted. Each benchmark prints a baseline measured in the
//! same run and the ratio to it, because the machine is shared and absolute times drift.
use clap::Subcommand;
use idxfs_blockdev::{BlockDevice, FileDevice, MemDevice};
use idxfs_engine::fs::Owner;
use idxfs_engine::{Fs, MkfsOptions, OpenOptions};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Per-operation cost through the idxfs mount beside ext4 on a memory-backed loop device
    /// (stat, open+close, create+unlink, creates/s with 1 and 2 threads), and the FUSE round
    /// trip (`stat` of an idxfs root, TTL 0). Needs root.
    Mount {
        #[arg(long, default_value_t = 20_000)]
        files: u64,
    },
    /// What the second directory index costs: N creates in one directory through the library
    /// with both indexes, against a build of the same creates with the name-hash index only,
    /// alternating rounds in this run (median of each).
    DirIndex {
        #[arg(long, default_value_t = 1_000_000)]
        files: u64,
        #[arg(long, default_value_t = 3)]
        rounds: u32,
        /// Run one side only (for profiling): `hash` or `both`.
        #[arg(long, value_parser = ["hash", "both"])]
        only: Option<String>,
    },
    /// Readers beside a writer and two writers against one (library; with --mount also
    /// through a FUSE mount). The same as the `concurrency` workload of `idxfs bench`.
    Concurrency {
        /// Seconds per latency measurement.
        #[arg(long, default_value_t = 3.0)]
        secs: f64,
        #[arg(long, default_value_t = 20_000)]
        files: u64,
        #[arg(long, default_value_t = 200_000)]
        creates: u64,
        /// Also measure through an idxfs mount (needs root).
        #[arg(long)]
        mount: bool,
    },
    /// Create N empty files in one directory through the library API; baseline: the same
    /// creates through syscalls on tmpfs (/dev/shm) in this run.
    Create {
        #[arg(long, default_value_t = 1_000_000)]
        files: u64,
        /// Image file to use (default: a memory device).
        #[arg(long)]
        image: Option<PathBuf>,
        /// Also run `idxfs fsck`-equivalent checking and print the leaf fill afterwards.
        #[arg(long)]
        check: bool,
        /// Node cache bound in MiB.
        #[arg(long, default_value_t = 1024)]
        cache_mib: usize,
        /// Commit when this many nodes are dirty.
        #[arg(long, default_value_t = 16384)]
        dirty_nodes: usize,
        /// Skip the tmpfs baseline (for profiling idxfs alone).
        #[arg(long)]
        no_baseline: bool,
        /// Keep the image afterwards (with --image), e.g. to mount a huge directory.
        #[arg(long, requires = "image")]
        keep: bool,
    },
}

/// CPU seconds of this process (user + system).
pub(crate) fn cpu_seconds() -> f64 {
    crate::bench_env::self_cpu()
}

fn tmpfs_creates(n: u64) -> Result<f64, String> {
    let dir = crate::tempdir_in_shm()?;
    let t = Instant::now();
    for i in 0..n {
        let p = dir.join(format!("f{i:08}"));
        std::fs::File::create(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let secs = t.elapsed().as_secs_f64();
    std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(n as f64 / secs)
}

/// A fresh file system on `dev` with one empty directory `d`, and the `files` names the
/// create benchmarks put in it (made before the clock starts).
fn fs_with_one_dir(
    dev: Arc<dyn BlockDevice>,
    opts: OpenOptions,
    files: u64,
) -> Result<(Fs, idxfs_engine::fs::Attr, Vec<Vec<u8>>), String> {
    Fs::mkfs(dev.clone(), &MkfsOptions::default()).map_err(|e| e.to_string())?;
    let fs = Fs::open(dev, opts).map_err(|e| e.to_string())?;
    let dir = fs
        .mkdir(idxfs_format::ROOT_INO, b"d", 0o755, Owner::default())
        .map_err(|e| e.to_string())?;
    let names = (0..files)
        .map(|i| format!("file_{i}").into_bytes())
        .collect();
    Ok((fs, dir, names))
}

/// One run of `files` creates in a fresh directory on a memory device: (files/s including the
/// final commit, CPU-seconds per million files).
fn library_creates(files: u64, hash_index_only: bool) -> Result<(f64, f64), String> {
    let bytes = (files * 600).max(256 << 20) + (256 << 20);
    let dev = Arc::new(MemDevice::new_prefaulted(bytes));
    let opts = OpenOptions {
        bench_hash_index_only: hash_index_only,
        ..OpenOptions::default()
    };
    let (fs, dir, names) = fs_with_one_dir(dev, opts, files)?;
    let owner = Owner::default();
    let cpu0 = cpu_seconds();
    let t = Instant::now();
    for name in &names {
        fs.create(dir.ino, name, 0o644, owner)
            .map_err(|e| e.to_string())?;
    }
    fs.sync().map_err(|e| e.to_string())?;
    let secs = t.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let c = fs.counters();
    let hits = c.leaf_hint_hits.get();
    let misses = c.leaf_hint_misses.get();
    if hits + misses > 0 {
        eprintln!(
            "  inode-order inserts straight to the hinted leaf: {hits} of {}",
            hits + misses
        );
    }
    fs.close().map_err(|e| e.to_string())?;
    Ok((files as f64 / secs, cpu * 1e6 / files as f64))
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn bench_dir_index(files: u64, rounds: u32, only: Option<String>) -> Result<(), String> {
    let only = only.map(|o| o == "hash");
    let (mut both, mut one) = (Vec::new(), Vec::new());
    // Per round, the two sides' CPU per create side by side in time: the machine's speed moves
    // by tens of percent between minutes, and a ratio of neighbours cancels most of that.
    let mut paired = Vec::new();
    for r in 0..rounds.max(1) {
        // Alternate which goes first, so drift in the machine's speed hits both alike.
        let order = if r % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for hash_only in order.into_iter().filter(|h| only.is_none_or(|o| o == *h)) {
            let x = library_creates(files, hash_only)?;
            eprintln!(
                "  round {}: {:<26} {:>10.0} files/s, {:.2} CPU-s per million",
                r + 1,
                if hash_only {
                    "name-hash index only"
                } else {
                    "both indexes"
                },
                x.0,
                x.1
            );
            if hash_only { &mut one } else { &mut both }.push(x);
        }
        if let (Some(o), Some(b), None) = (one.last(), both.last(), only) {
            paired.push(b.1 / o.1);
        }
    }
    let rate = |v: &[(f64, f64)]| median(v.iter().map(|x| x.0).collect());
    let cpu = |v: &[(f64, f64)]| median(v.iter().map(|x| x.1).collect());
    println!("bench dir-index: {files} creates in one directory, library API, median of {rounds}");
    println!("{:<26} {:>12} {:>22}", "", "files/s", "CPU-s per million");
    println!(
        "{:<26} {:>12.0} {:>22.2}",
        "name-hash index only",
        rate(&one),
        cpu(&one)
    );
    println!(
        "{:<26} {:>12.0} {:>22.2}",
        "both indexes",
        rate(&both),
        cpu(&both)
    );
    println!(
        "second index costs {:+.1}% in time per create, {:+.1}% in CPU per create",
        (rate(&one) / rate(&both) - 1.0) * 100.0,
        (cpu(&both) / cpu(&one) - 1.0) * 100.0
    );
    if !paired.is_empty() {
        let lo = paired.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = paired.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        println!(
            "round by round (each round's two runs back to back): median {:+.1}% in CPU per \
             create, rounds from {:+.1}% to {:+.1}%",
            (median(paired) - 1.0) * 100.0,
            (lo - 1.0) * 100.0,
            (hi - 1.0) * 100.0
        );
    }
    Ok(())
}

pub fn run(cmd: BenchCmd) -> Result<(), String> {
    match cmd {
        BenchCmd::DirIndex {
            files,
            rounds,
            only,
        } => bench_dir_index(files, rounds, only),
        BenchCmd::Mount { files } => crate::bench_mount::bench_mount(files),
        BenchCmd::Concurrency {
            secs,
            files,
            creates,
            mount,
        } => {
            crate::bench_env::catch_interrupts();
            let scratch = crate::bench_env::Scratch::new()?;
            let (text, _) = crate::bench_concurrency::run(
                &scratch.0,
                secs,
                files,
                creates,
                crate::bench_concurrency::LISTED,
                mount,
            )?;
            print!("{text}");
            Ok(())
        }
        BenchCmd::Create {
            files,
            image,
            check,
            no_baseline,
            cache_mib,
            dirty_nodes,
            keep,
        } => {
            let bytes = (files * 600).max(256 << 20) + (256 << 20);
            let dev: Arc<dyn BlockDevice> = match &image {
                Some(p) => Arc::new(
                    FileDevice::create(p, bytes).map_err(|e| format!("{}: {e}", p.display()))?,
                ),
                None => Arc::new(MemDevice::new_prefaulted(bytes)),
            };
            let opts = OpenOptions {
                cache_bytes: cache_mib << 20,
                dirty_nodes_limit: dirty_nodes,
                ..OpenOptions::default()
            };
            let (fs, dir, names) = fs_with_one_dir(dev.clone(), opts, files)?;
            let owner = Owner::default();
            eprintln!("creating {files} files through the library API...");
            let cpu0 = cpu_seconds();
            let t = Instant::now();
            let mut lap = Instant::now();
            for (i, name) in names.iter().enumerate() {
                fs.create(dir.ino, name, 0o644, owner)
                    .map_err(|e| e.to_string())?;
                if i % 200_000 == 199_999 {
                    eprintln!(
                        "  {} / {files}: last 200000 at {:.0} files/s",
                        i + 1,
                        200_000.0 / lap.elapsed().as_secs_f64()
                    );
                    lap = Instant::now();
                }
            }
            let create_secs = t.elapsed().as_secs_f64();
            fs.sync().map_err(|e| e.to_string())?;
            let total_secs = t.elapsed().as_secs_f64();
            let cpu = cpu_seconds() - cpu0;
            eprintln!();
            let idx_rate = files as f64 / create_secs;
            let idx_rate_sync = files as f64 / total_secs;
            eprintln!("baseline: {files} creates through syscalls on tmpfs (/dev/shm)...");
            let tmpfs = if no_baseline {
                f64::NAN
            } else {
                tmpfs_creates(files)?
            };
            println!("bench create: {files} empty files in one directory");
            println!("{:<34} {:>14} {:>10}", "", "files/s", "vs tmpfs");
            println!(
                "{:<34} {:>14.0} {:>9.2}x",
                "idxfs library (creates)",
                idx_rate,
                idx_rate / tmpfs
            );
            println!(
                "{:<34} {:>14.0} {:>9.2}x",
                "idxfs library (incl. final commit)",
                idx_rate_sync,
                idx_rate_sync / tmpfs
            );
            println!(
                "{:<34} {:>14.0} {:>9.2}x",
                "tmpfs via syscalls (baseline)", tmpfs, 1.0
            );
            println!(
                "idxfs: {:.0} files per CPU-second; {} commits",
                files as f64 / cpu.max(1e-9),
                fs.counters().commits.get()
            );
            if std::env::var_os("IDXFS_COUNTERS").is_some() {
                eprint!("{}", fs.counters());
            }
            fs.close().map_err(|e| e.to_string())?;
            if check {
                let stats = idxfs_engine::dump::dump(
                    dev.as_ref(),
                    Some(idxfs_engine::dump::Which::Fs),
                    true,
                    &mut std::io::sink(),
                )
                .map_err(|e| e.to_string())?;
                if let Some((_, s)) = stats.first() {
                    println!(
                        "fs tree leaf fill after the run: {:.1}%",
                        s.leaf_fill() * 100.0
                    );
                }
                let dev: Arc<dyn BlockDevice> = dev.clone();
                let r = idxfs_engine::fsck::check(&dev, idxfs_format::hash::name_hash, &mut |_| {})
                    .map_err(|e| e.to_string())?;
                println!(
                    "fsck: {}",
                    if r.is_clean() {
                        "clean".to_string()
                    } else {
                        format!("{} problems, first: {}", r.problems.len(), r.problems[0])
                    }
                );
            }
            if let Some(p) = image.filter(|_| !keep) {
                let _ = std::fs::remove_file(p);
            }
            Ok(())
        }
    }
}
