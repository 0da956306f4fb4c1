//! `idxfs bench concurrency`: what one writer costs the readers, and what a second thread adds.
//!
//! Through the library: getattr and lookup latency (p50, p99, max) idle, then while another
//! thread creates files with fsyncs every 64 creates and a commit every 4,096, and the same for
//! getxattr of a name files lack (the ACL `ls -l` asks for) and statfs, beside the same
//! reader's timing of two floors the machine alone puts under every row: no call at all (two
//! clock reads back to back) and a few random reads of a plain buffer (`ReadLat::memory`);
//! each row also counts its calls over 1 ms; a cold readdirplus of one of two directories
//! filled by two threads at once against the same filled one after the other; creates with two
//! threads in two directories against one; getattr throughput of two reader threads against
//! one, and getattr, getxattr and statfs throughput of two readers against two that take the
//! lock for every read (the same-run baseline of the lock-free path). Through the mount (when idxfs is among the file systems): stat latency
//! idle and while a thread creates and fsyncs, beside the FUSE round trip (`bench_mount::floor_ns`);
//! fs_mark with 2 threads against 1; fs_mark by one thread beside a busy loop on every CPU
//! (`Hogs`), idxfs and ext4 each against its own idle rate (a FUSE server must not starve when
//! a build shares the machine). fsync beside other work: on a device whose flush takes
//! `FLUSH_DELAY`, one thread creating, writing 4 KiB and fsyncing each file while another creates
//! files, and two such fsyncing threads, with the log batch written and flushed outside the
//! operation lock against under it (`OpenOptions::bench_log_under_lock`, the same-run
//! baseline). Data I/O beside other work: on a device whose every read and write takes
//! `IO_DELAY`, writers overwriting 64 KiB pieces of their own files (2 threads against 1), the
//! same in ranges of one NOCOW file, and a reader beside a writer, with the device I/O outside the operation lock against under it
//! (`OpenOptions::bench_data_under_lock`). Every ratio comes from this one run. Performance only: nothing is asserted.
use crate::bench_env::{self, cpath, FsKind, Target};
use idxfs_blockdev::{BlockDevice, MemDevice};
use idxfs_engine::fs::{Attr, Owner};
use idxfs_engine::{Fs, MkfsOptions, OpenOptions};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A directory's files: name and inode number.
type Files = Vec<(Vec<u8>, u64)>;

/// Latencies of one kind of operation, in nanoseconds.
struct Lat(Vec<u64>);

impl Lat {
    fn pct(&mut self, p: f64) -> u64 {
        if self.0.is_empty() {
            return 0;
        }
        self.0.sort_unstable();
        let i = ((self.0.len() - 1) as f64 * p).round() as usize;
        self.0[i]
    }
    /// (p50, p99, max) in microseconds, and how many took over 1 ms.
    fn summary(&mut self) -> [f64; 4] {
        let [p50, p99, max] =
            [self.pct(0.5), self.pct(0.99), self.pct(1.0)].map(|ns| ns as f64 / 1000.0);
        let over = self.0.iter().filter(|&&ns| ns > 1_000_000).count();
        [p50, p99, max, over as f64]
    }
}

/// `locked`: getattr and lookup always take the operation lock (the engine before it
/// published anything), for the same-run baseline of the lock-free path.
fn lib_fs(bytes: u64, locked: bool) -> Result<Fs, String> {
    let dev = Arc::new(MemDevice::new_prefaulted(bytes));
    Fs::mkfs(dev.clone(), &MkfsOptions::default()).map_err(|e| e.to_string())?;
    let opts = OpenOptions {
        bench_locked_reads: locked,
        ..OpenOptions::default()
    };
    Fs::open(dev, opts).map_err(|e| e.to_string())
}

/// A directory of `n` files for the readers.
fn populate(fs: &Fs, name: &[u8], n: u64) -> Result<(Attr, Files), String> {
    let dir = fs
        .mkdir(idxfs_format::ROOT_INO, name, 0o755, Owner::default())
        .map_err(|e| e.to_string())?;
    let mut files = Vec::new();
    for i in 0..n {
        let nm = format!("r{i:07}").into_bytes();
        let a = fs
            .create(dir.ino, &nm, 0o644, Owner::default())
            .map_err(|e| e.to_string())?;
        files.push((nm, a.ino));
    }
    fs.sync().map_err(|e| e.to_string())?;
    Ok((dir, files))
}

/// The xattr `ls -l` asks every file for (its ACL), which files rarely have.
const ACL_XATTR: &[u8] = b"system.posix_acl_access";

/// Latencies of the reads one reader thread makes for `dur`, on random files in turn.
struct ReadLat {
    getattr: Lat,
    lookup: Lat,
    /// getxattr of a name the file does not have (`ACL_XATTR`).
    getxattr: Lat,
    statfs: Lat,
    /// Two clock reads with no call between them: what the machine alone adds to a call that
    /// touches no memory (a reader descheduled, a timer tick).
    nothing: Lat,
    /// `FLOOR_READS` random reads of a `FLOOR_BYTES` buffer, about a lookup's time: what the
    /// machine alone adds to code that touches memory. On a PVM guest the host fills the
    /// shadow page tables behind the guest's back, and while it does the vCPU does not run:
    /// no guest sample, page fault or context switch shows it (perf's samples stop), yet
    /// reads of a plain buffer take milliseconds now and then. So this, not `nothing`, is
    /// the floor under every other row's maximum.
    memory: Lat,
}

/// Files in each of the two directories `listing_after_two_writers` fills, unless the
/// caller asks for fewer (the suite's test scale).
pub const LISTED: u64 = 50_000;

/// The memory floor's buffer: larger than the caches, as the readers' tables are together.
const FLOOR_BYTES: usize = 64 << 20;
/// Random reads per memory-floor sample.
const FLOOR_READS: usize = 4;

fn read_lat(fs: &Fs, dir: u64, files: &[(Vec<u8>, u64)], dur: Duration) -> ReadLat {
    let mut r = ReadLat {
        getattr: Lat(Vec::new()),
        lookup: Lat(Vec::new()),
        getxattr: Lat(Vec::new()),
        statfs: Lat(Vec::new()),
        nothing: Lat(Vec::new()),
        memory: Lat(Vec::new()),
    };
    let words = FLOOR_BYTES / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    let mut sum = 0u64;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let end = Instant::now() + dur;
    while Instant::now() < end {
        for _ in 0..256 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (name, ino) = &files[(x % files.len() as u64) as usize];
            let t = Instant::now();
            let _ = fs.getattr(*ino);
            let t2 = Instant::now();
            let _ = fs.lookup(dir, name);
            let t3 = Instant::now();
            let _ = fs.getxattr(*ino, ACL_XATTR);
            let t4 = Instant::now();
            let _ = fs.statfs();
            let t5 = Instant::now();
            let t6 = Instant::now();
            for _ in 0..FLOOR_READS {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                sum = sum.wrapping_add(buf[(x % words as u64) as usize]);
            }
            let t7 = Instant::now();
            r.nothing.0.push((t6 - t5).as_nanos() as u64);
            r.memory.0.push((t7 - t6).as_nanos() as u64);
            r.getattr.0.push((t2 - t).as_nanos() as u64);
            r.lookup.0.push((t3 - t2).as_nanos() as u64);
            r.getxattr.0.push((t4 - t3).as_nanos() as u64);
            r.statfs.0.push((t5 - t4).as_nanos() as u64);
        }
    }
    std::hint::black_box(sum);
    r
}

/// Creates files in a new directory until `stop`, fsyncing the directory every 64 creates and
/// committing every 4,096. Returns the creates done.
fn writer(fs: &Fs, name: &[u8], stop: &AtomicBool) -> Result<u64, String> {
    let d = fs
        .mkdir(idxfs_format::ROOT_INO, name, 0o755, Owner::default())
        .map_err(|e| e.to_string())?;
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        fs.create(
            d.ino,
            format!("w{i:08}").as_bytes(),
            0o644,
            Owner::default(),
        )
        .map_err(|e| e.to_string())?;
        i += 1;
        if i.is_multiple_of(64) {
            fs.fsync(d.ino).map_err(|e| e.to_string())?;
        }
        if i.is_multiple_of(4096) {
            fs.sync().map_err(|e| e.to_string())?;
        }
    }
    Ok(i)
}

/// Creates per second of 1 thread making `n` files, and of 2 threads making `n / 2` each in
/// directories of their own: each run on a fresh file system (on one file system the later
/// run would insert into the trees the earlier one grew, and pay for it), the two sides in
/// turns over `CREATE_ROUNDS` rounds (1, 2; 2, 1; ...), and each side's median (the
/// process's first run pays for warming its heap: 0.6x a warm one's rate on this machine).
fn creates_both(n: u64) -> Result<(f64, f64), String> {
    let (mut one, mut two) = (Vec::new(), Vec::new());
    for round in 0..CREATE_ROUNDS {
        for side in [round % 2, 1 - round % 2] {
            let fs = lib_fs(1 << 30, false)?;
            match side {
                0 => one.push(creates(&fs, "one", 1, n)?),
                _ => two.push(creates(&fs, "two", 2, n / 2)?),
            }
            fs.close().map_err(|e| e.to_string())?;
        }
    }
    Ok((crate::bench::median(one), crate::bench::median(two)))
}

/// Rounds of `creates_both`.
const CREATE_ROUNDS: usize = 3;

/// Creates per second of `threads` threads, each making `per` files in its own directory.
fn creates(fs: &Fs, tag: &str, threads: u64, per: u64) -> Result<f64, String> {
    let dirs = (0..threads)
        .map(|k| {
            fs.mkdir(
                idxfs_format::ROOT_INO,
                format!("{tag}{k}").as_bytes(),
                0o755,
                Owner::default(),
            )
            .map(|a| a.ino)
            .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let names: Vec<Vec<u8>> = (0..per).map(|i| format!("c{i:08}").into_bytes()).collect();
    let t = Instant::now();
    std::thread::scope(|s| {
        let hs: Vec<_> = dirs
            .iter()
            .map(|&d| {
                let names = &names;
                s.spawn(move || -> Result<(), String> {
                    for n in names {
                        fs.create(d, n, 0o644, Owner::default())
                            .map_err(|e| e.to_string())?;
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .try_for_each(|h| h.join().map_err(|_| "thread panicked".to_string())?)
    })?;
    Ok((threads * per) as f64 / t.elapsed().as_secs_f64())
}

/// What the reader threads of `readers` call.
#[derive(Clone, Copy)]
enum ReadOp {
    Getattr,
    /// getxattr of `ACL_XATTR`, which no file has.
    Getxattr,
    Statfs,
    /// A whole listing of this directory (`LS_FILES` files) in one readdir call.
    Readdir(u64),
    /// The same listing with every entry's attributes (readdirplus, as `ls -l` asks for it).
    ReaddirPlus(u64),
}

/// Files in the directory `ReadOp::Readdir` lists: a directory `ls` shows in one screen.
const LS_FILES: u64 = 100;

/// Calls per second of `threads` reader threads for `dur`, each calling `op` on random files.
fn readers(fs: &Fs, files: &[(Vec<u8>, u64)], threads: u64, dur: Duration, op: ReadOp) -> f64 {
    let total: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|k| {
                s.spawn(move || {
                    let mut x = 0x2545_F491_4F6C_DD1Du64 + k;
                    let end = Instant::now() + dur;
                    let mut n = 0u64;
                    while Instant::now() < end {
                        for _ in 0..256 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let ino = files[(x % files.len() as u64) as usize].1;
                            let _ = match op {
                                ReadOp::Getattr => fs.getattr(ino).map(drop),
                                ReadOp::Getxattr => fs.getxattr(ino, ACL_XATTR).map(drop),
                                ReadOp::Statfs => fs.statfs().map(drop),
                                ReadOp::Readdir(d) => fs.readdir(d, 0, |_| true),
                                ReadOp::ReaddirPlus(d) => {
                                    fs.readdir_plus_batch(d, 0, 4096).map(drop)
                                }
                            };
                        }
                        n += 256;
                    }
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    total as f64 / dur.as_secs_f64()
}

fn lat_row(o: &mut String, label: &str, l: [f64; 4], idle: Option<[f64; 4]>) {
    let ratio = idle.map_or("-".to_string(), |i| {
        format!("{:.2}x", l[1] / i[1].max(1e-3))
    });
    let _ = writeln!(
        o,
        "{label:<48} {:>9.2} {:>9.2} {:>10.1} {:>7} {ratio:>12}",
        l[0], l[1], l[2], l[3]
    );
}

/// The header of `lat_row`'s table.
fn lat_header(o: &mut String) {
    let _ = writeln!(
        o,
        "{:<48} {:>9} {:>9} {:>10} {:>7} {:>12}",
        "latency (us)", "p50", "p99", "max", ">1 ms", "p99 vs idle"
    );
}

/// Calls/s of 1 and 2 readers on a file system whose reads all take the lock: getattr, then
/// 2 readers of getxattr, of statfs and of listings of a small directory.
fn locked_readers(files: u64, dur: Duration) -> Result<[f64; 6], String> {
    let fs = lib_fs(1 << 30, true)?;
    let (_, names) = populate(&fs, b"r", files)?;
    let (ls, _) = populate(&fs, b"ls", LS_FILES)?;
    let r = [
        readers(&fs, &names, 1, dur, ReadOp::Getattr),
        readers(&fs, &names, 2, dur, ReadOp::Getattr),
        readers(&fs, &names, 2, dur, ReadOp::Getxattr),
        readers(&fs, &names, 2, dur, ReadOp::Statfs),
        readers(&fs, &names, 2, dur, ReadOp::Readdir(ls.ino)),
        readers(&fs, &names, 2, dur, ReadOp::ReaddirPlus(ls.ino)),
    ];
    fs.close().map_err(|e| e.to_string())?;
    Ok(r)
}

/// The library half.
/// A cold whole-directory readdirplus of one of two directories of `n` files each, filled
/// by two threads at once and, as the baseline, one after the other by one thread: (nodes
/// read, seconds) for each. Filled at once, the creates of the two interleave; what a later
/// pass over one directory pays for that is what `fs::ino_runs` keeps small.
fn listing_after_two_writers(n: u64) -> Result<[(u64, f64); 2], String> {
    let mut out = [(0, 0.0); 2];
    for (slot, at_once) in [(0, true), (1, false)] {
        // 16 KiB a file (two directories: 8 KiB each), far more than their items take.
        let bytes = (n << 14).clamp(256 << 20, 1 << 30);
        let dev = Arc::new(MemDevice::new_prefaulted(bytes));
        Fs::mkfs(dev.clone(), &MkfsOptions::default()).map_err(|e| e.to_string())?;
        let fs = Fs::open(dev.clone(), OpenOptions::default()).map_err(|e| e.to_string())?;
        let mk = |name: &[u8]| {
            fs.mkdir(idxfs_format::ROOT_INO, name, 0o755, Owner::default())
                .map(|a| a.ino)
                .map_err(|e| e.to_string())
        };
        let (a, b) = (mk(b"a")?, mk(b"b")?);
        let fill = |d: u64| -> Result<(), String> {
            for i in 0..n {
                fs.create(d, format!("f{i:08}").as_bytes(), 0o644, Owner::default())
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        };
        if at_once {
            std::thread::scope(|s| {
                let h = s.spawn(|| fill(b));
                let mine = fill(a);
                h.join().map_err(|_| "writer panicked".to_string())??;
                mine
            })?;
        } else {
            fill(a)?;
            fill(b)?;
        }
        fs.close().map_err(|e| e.to_string())?;
        let fs = Fs::open(dev, OpenOptions::default()).map_err(|e| e.to_string())?;
        let before = fs.counters().node_reads.get();
        let t = Instant::now();
        let mut cookie = 0;
        loop {
            let batch = fs
                .readdir_plus_batch(a, cookie, 512)
                .map_err(|e| e.to_string())?;
            match batch.entries.last() {
                Some((e, _)) if batch.more => cookie = e.cookie,
                _ => break,
            }
        }
        let secs = t.elapsed().as_secs_f64();
        out[slot] = (fs.counters().node_reads.get() - before, secs);
        fs.close().map_err(|e| e.to_string())?;
    }
    Ok(out)
}

fn library(secs: f64, files: u64, creates_n: u64, listed: u64) -> Result<(String, Value), String> {
    let fs = lib_fs(4 << 30, false)?;
    let (dir, names) = populate(&fs, b"r", files)?;
    let dur = Duration::from_secs_f64(secs);
    let mut idle = read_lat(&fs, dir.ino, &names, dur);
    let stop = AtomicBool::new(false);
    let (mut load, made) = std::thread::scope(|s| {
        let w = s.spawn(|| writer(&fs, b"w", &stop));
        // Let the writer start before measuring.
        std::thread::sleep(Duration::from_millis(50));
        let r = read_lat(&fs, dir.ino, &names, dur);
        stop.store(true, Ordering::Relaxed);
        let made = w.join().map_err(|_| "writer panicked".to_string())?;
        Ok::<_, String>((r, made?))
    })?;
    let c = fs.counters();
    let lock_free = c.getattr_lock_free.get();
    let lookups_free = c.lookup_lock_free.get();
    let getattrs = (idle.getattr.0.len() + load.getattr.0.len()) as u64;
    let lookups = (idle.lookup.0.len() + load.lookup.0.len()) as u64;
    let xattrs_free = c.xattr_lock_free.get();
    let statfs_free = c.statfs_lock_free.get();
    let xattrs = (idle.getxattr.0.len() + load.getxattr.0.len()) as u64;
    let statfses = (idle.statfs.0.len() + load.statfs.0.len()) as u64;
    let commits = c.commits.get();
    let batches = c.log_batches.get();
    let (one, two) = creates_both(creates_n)?;
    let [at_once, alone] = listing_after_two_writers(listed)?;
    let r1 = readers(&fs, &names, 1, dur, ReadOp::Getattr);
    let r2 = readers(&fs, &names, 2, dur, ReadOp::Getattr);
    let x2 = readers(&fs, &names, 2, dur, ReadOp::Getxattr);
    let s2 = readers(&fs, &names, 2, dur, ReadOp::Statfs);
    let (ls, _) = populate(&fs, b"ls", LS_FILES)?;
    let d2 = readers(&fs, &names, 2, dur, ReadOp::Readdir(ls.ino));
    let readdir_free = fs.counters().readdir_lock_free.get();
    let p2 = readers(&fs, &names, 2, dur, ReadOp::ReaddirPlus(ls.ino));
    let plus_free = fs.counters().readdirplus_lock_free.get();
    fs.close().map_err(|e| e.to_string())?;
    let [l1r, l2r, lx2, ls2, ld2, lp2] = locked_readers(files, dur)?;
    let (g0, l0, g1, l1) = (
        idle.getattr.summary(),
        idle.lookup.summary(),
        load.getattr.summary(),
        load.lookup.summary(),
    );
    let (x0, x1, s0, s1) = (
        idle.getxattr.summary(),
        load.getxattr.summary(),
        idle.statfs.summary(),
        load.statfs.summary(),
    );
    let (n0, n1) = (idle.nothing.summary(), load.nothing.summary());
    let (m0, m1) = (idle.memory.summary(), load.memory.summary());
    let mut o = String::new();
    let _ = writeln!(
        o,
        "concurrency, library: {files} files read; the writer made {made} files \
         ({commits} commits and {batches} fsync log batches in all)"
    );
    let _ = writeln!(
        o,
        "answered without the lock: getattr {lock_free} of {getattrs}, lookup {lookups_free} \
         of {lookups}, getxattr {xattrs_free} of {xattrs}, statfs {statfs_free} of \
         {statfses} (the rest: first reads, which publish)"
    );
    lat_header(&mut o);
    lat_row(&mut o, "getattr, idle", g0, None);
    lat_row(&mut o, "getattr, writer creating+fsyncing", g1, Some(g0));
    lat_row(&mut o, "lookup, idle", l0, None);
    lat_row(&mut o, "lookup, writer creating+fsyncing", l1, Some(l0));
    lat_row(&mut o, "getxattr (absent ACL), idle", x0, None);
    lat_row(
        &mut o,
        "getxattr (absent ACL), writer creating+fsyncing",
        x1,
        Some(x0),
    );
    lat_row(&mut o, "statfs, idle", s0, None);
    lat_row(&mut o, "statfs, writer creating+fsyncing", s1, Some(s0));
    lat_row(&mut o, "no call (the machine's floor), idle", n0, None);
    lat_row(&mut o, "no call, writer creating+fsyncing", n1, Some(n0));
    let reads = format!(
        "{FLOOR_READS} reads of {} MiB (floor touching memory)",
        FLOOR_BYTES >> 20
    );
    lat_row(&mut o, &format!("{reads}, idle"), m0, None);
    lat_row(
        &mut o,
        &format!("{FLOOR_READS} reads, writer creating+fsyncing"),
        m1,
        Some(m0),
    );
    let _ = writeln!(
        o,
        "creates/s, each on a fresh file system, median of {CREATE_ROUNDS} in turns: 1 thread \
         {one:.0}, 2 threads in 2 directories {two:.0} ({:.2}x)",
        two / one
    );
    let _ = writeln!(
        o,
        "cold readdirplus of one of 2 directories of {listed} files: filled by 2 threads at \
         once {} nodes in {:.1} ms, one after the other {} nodes in {:.1} ms ({:.2}x the \
         nodes)",
        at_once.0,
        at_once.1 * 1e3,
        alone.0,
        alone.1 * 1e3,
        at_once.0 as f64 / alone.0.max(1) as f64
    );
    let _ = writeln!(
        o,
        "getattr/s: 1 reader {r1:.0}, 2 readers {r2:.0} ({:.2}x); every read under the lock: \
         1 reader {l1r:.0}, 2 readers {l2r:.0} ({:.2}x); lock-free against locked, 2 readers: \
         {:.2}x",
        r2 / r1,
        l2r / l1r,
        r2 / l2r
    );
    let _ = writeln!(
        o,
        "2 readers, lock-free against every read under the lock: getxattr/s (absent ACL) \
         {x2:.0} against {lx2:.0} ({:.2}x); statfs/s {s2:.0} against {ls2:.0} ({:.2}x)",
        x2 / lx2,
        s2 / ls2
    );
    let _ = writeln!(
        o,
        "listings/s of a {LS_FILES}-file directory, 2 lock-free readers against 2 that take \
         the lock: {d2:.0} against {ld2:.0} ({:.2}x; {readdir_free} readdir runs answered \
         without the lock)",
        d2 / ld2
    );
    let _ = writeln!(
        o,
        "the same with attributes (readdirplus), listings/s: {p2:.0} against {lp2:.0} \
         ({:.2}x; {plus_free} batches answered without the lock)",
        p2 / lp2
    );
    let json = json!({
        "getattr_locked_1_reader": l1r, "getattr_locked_2_readers": l2r,
        "getattr_lock_free": lock_free, "lookup_lock_free": lookups_free,
        "files": files, "writer_creates": made, "commits": commits, "log_batches": batches,
        "getattr_idle_us": g0, "getattr_load_us": g1, "lookup_idle_us": l0, "lookup_load_us": l1,
        "creates_1_thread": one, "creates_2_threads": two,
        "listing_after_2_writers_nodes": at_once.0, "listing_after_2_writers_s": at_once.1,
        "listing_after_1_writer_nodes": alone.0, "listing_after_1_writer_s": alone.1,
        "getattr_1_reader": r1, "getattr_2_readers": r2,
        "getxattr_lock_free": xattrs_free, "statfs_lock_free": statfs_free,
        "getxattr_idle_us": x0, "getxattr_load_us": x1, "statfs_idle_us": s0,
        "statfs_load_us": s1, "no_call_idle_us": n0, "no_call_load_us": n1, "memory_floor_idle_us": m0, "memory_floor_load_us": m1, "getxattr_2_readers": x2, "getxattr_locked_2_readers": lx2,
        "statfs_2_readers": s2, "statfs_locked_2_readers": ls2,
        "readdir_2_readers": d2, "readdir_locked_2_readers": ld2,
        "readdir_lock_free": readdir_free,
        "readdirplus_2_readers": p2, "readdirplus_locked_2_readers": lp2,
        "readdirplus_lock_free": plus_free,
    });
    Ok((o, json))
}

/// stat latencies through a mount for `dur`: statx with AT_STATX_FORCE_SYNC, which FUSE answers
/// with a GETATTR to the daemon every time (a plain stat is served from the kernel's cache).
fn stat_lat(paths: &[std::ffi::CString], dur: Duration) -> Lat {
    statx_lat(libc::AT_FDCWD, paths, libc::AT_STATX_FORCE_SYNC, dur)
}

/// Latencies of statx of random `names` relative to `dir` with `flags`, for `dur`.
fn statx_lat(
    dir: libc::c_int,
    names: &[std::ffi::CString],
    flags: libc::c_int,
    dur: Duration,
) -> Lat {
    let mut v = Vec::new();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    // SAFETY: a statx buffer we own, valid C paths.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    let end = Instant::now() + dur;
    while Instant::now() < end {
        for _ in 0..64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let p = &names[(x % names.len() as u64) as usize];
            let t = Instant::now();
            // SAFETY: as above; `dir` is AT_FDCWD or a descriptor the caller holds open.
            unsafe { libc::statx(dir, p.as_ptr(), flags, libc::STATX_BASIC_STATS, &mut st) };
            v.push(t.elapsed().as_nanos() as u64);
        }
    }
    Lat(v)
}

/// Runs `measure` while a thread creates empty files in `wdir` through the mount, with an
/// fsync every 64 (so commits and fsync log batches run too).
fn beside_mount_writer<R>(wdir: &Path, measure: impl FnOnce() -> R) -> Result<R, String> {
    let stop = AtomicBool::new(false);
    std::fs::create_dir(wdir).map_err(|e| format!("{}: {e}", wdir.display()))?;
    std::thread::scope(|s| {
        let w = s.spawn(|| -> Result<(), String> {
            use std::os::unix::fs::OpenOptionsExt;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let p = wdir.join(format!("w{i:08}"));
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .write(true)
                    .mode(0o644)
                    .open(&p)
                    .map_err(|e| format!("{}: {e}", p.display()))?;
                i += 1;
                if i.is_multiple_of(64) {
                    f.sync_all().map_err(|e| format!("fsync: {e}"))?;
                }
            }
            Ok(())
        });
        std::thread::sleep(Duration::from_millis(50));
        let r = measure();
        stop.store(true, Ordering::Relaxed);
        w.join().map_err(|_| "writer panicked".to_string())??;
        Ok::<_, String>(r)
    })
}

/// Lookup latencies through a mount with `-o ttl=0`, idle and beside the writer: statx of a
/// name relative to its open directory with AT_STATX_DONT_SYNC, so the kernel revalidates
/// that one dentry with a LOOKUP and takes the attributes it returned, one request a call.
/// Every lookup's reply pins its inode (`Fs::pin`).
fn lookup_lat(base: &Path, secs: f64, files: u64) -> Result<(Lat, Lat), String> {
    let t = Target::make_with(
        base,
        FsKind::Idxfs,
        2 << 30,
        files * 4 + 65_536,
        Some("ttl=0"),
    )?;
    let (dir, names) = mount_files(&t.mp, files)?;
    let names: Vec<_> = names.iter().map(|n| cpath(Path::new(n))).collect();
    let d = std::fs::File::open(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    use std::os::fd::AsRawFd;
    let dur = Duration::from_secs_f64(secs);
    let idle = statx_lat(d.as_raw_fd(), &names, libc::AT_STATX_DONT_SYNC, dur);
    let load = beside_mount_writer(&t.mp.join("w"), || {
        statx_lat(d.as_raw_fd(), &names, libc::AT_STATX_DONT_SYNC, dur)
    })?;
    Ok((idle, load))
}

/// Directory "r" under `mp` with `files` empty files in it: the directory and their names.
fn mount_files(mp: &Path, files: u64) -> Result<(std::path::PathBuf, Vec<String>), String> {
    let dir = mp.join("r");
    std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let names: Vec<String> = (0..files).map(|i| format!("r{i:07}")).collect();
    for n in &names {
        let p = dir.join(n);
        bench_env::create_close(&cpath(&p), &p)?;
    }
    Ok((dir, names))
}

/// The mount half: stat latency idle and while a thread creates and fsyncs; fs_mark with 2
/// threads against 1 (`creates_n` files each run), and with 1 beside busy CPUs (a quarter of
/// that, on idxfs and ext4).
fn mount(base: &Path, secs: f64, files: u64, creates_n: u64) -> Result<(String, Value), String> {
    let idx = Target::make(base, FsKind::Idxfs, 2 << 30, files * 4 + 65_536)?;
    let (dir, names) = mount_files(&idx.mp, files)?;
    let paths: Vec<_> = names.iter().map(|n| cpath(&dir.join(n))).collect();
    let dur = Duration::from_secs_f64(secs);
    let mut idle = stat_lat(&paths, dur);
    let mut load = beside_mount_writer(&idx.mp.join("w"), || stat_lat(&paths, dur))?;
    drop(idx);
    let (mut lookup_idle, mut lookup_load) = lookup_lat(base, secs, files)?;
    let floor = crate::bench_mount::floor_ns(base)? / 1000.0;
    let (i, l) = (idle.summary(), load.summary());
    let mut o = String::new();
    let _ = writeln!(
        o,
        "concurrency, through the mount: statx(AT_STATX_FORCE_SYNC) of {files} files \
         (FUSE round trip: {floor:.1} us)"
    );
    lat_header(&mut o);
    lat_row(&mut o, "stat, idle", i, None);
    lat_row(&mut o, "stat, writer creating+fsyncing", l, Some(i));
    let (li, ll) = (lookup_idle.summary(), lookup_load.summary());
    lat_row(&mut o, "lookup (ttl=0: a LOOKUP a call), idle", li, None);
    lat_row(&mut o, "lookup, writer creating+fsyncing", ll, Some(li));
    let fm1 = fs_mark_rate(base, FsKind::Idxfs, 1, creates_n, false)?;
    let fm2 = fs_mark_rate(base, FsKind::Idxfs, 2, creates_n, false)?;
    let _ = writeln!(
        o,
        "fs_mark -s 0 -S 0, {creates_n} files: 1 thread {fm1:.0} files/s, 2 threads in 2 \
         directories {fm2:.0} ({:.2}x)",
        fm2 / fm1
    );
    // Beside a busy loop on every CPU (a build next to the mount): each file system's share
    // of its own idle rate, and idxfs against ext4 so loaded.
    let busy_n = (creates_n / 4).max(1);
    let busy: Vec<f64> = [FsKind::Idxfs, FsKind::Ext4]
        .into_iter()
        .flat_map(|k| [(k, false), (k, true)])
        .map(|(k, hog)| fs_mark_rate(base, k, 1, busy_n, hog))
        .collect::<Result<_, _>>()?;
    let [idx_idle, idx_busy, ext_idle, ext_busy] = busy[..] else {
        return Err("fs_mark beside busy CPUs: four runs expected".into());
    };
    let _ = writeln!(
        o,
        "fs_mark -s 0 -S 0, 1 thread, {busy_n} files beside a busy loop on each of {} CPUs: \
         idxfs {idx_busy:.0} files/s ({:.2}x its idle {idx_idle:.0}), ext4 {ext_busy:.0} \
         ({:.2}x its idle {ext_idle:.0}); idxfs/ext4 busy {:.2}x",
        Hogs::cpus(),
        idx_busy / idx_idle,
        ext_busy / ext_idle,
        idx_busy / ext_busy
    );
    Ok((
        o,
        json!({"files": files, "stat_idle_us": i, "stat_load_us": l, "fuse_floor_us": floor,
            "lookup_idle_us": li, "lookup_load_us": ll,
            "fs_mark_1_thread": fm1, "fs_mark_2_threads": fm2,
            "busy_cpus": {"files": busy_n, "idxfs_idle": idx_idle, "idxfs_busy": idx_busy,
                "ext4_idle": ext_idle, "ext4_busy": ext_busy}}),
    ))
}

/// Threads that keep every CPU this process may use busy until dropped, at normal priority:
/// what a compiler or a batch job does beside a mount.
struct Hogs {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Hogs {
    fn cpus() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }

    fn start() -> Hogs {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..Hogs::cpus())
            .filter_map(|_| {
                let stop = stop.clone();
                std::thread::Builder::new()
                    .name("bench-hog".into())
                    .spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            std::hint::spin_loop();
                        }
                    })
                    .ok()
            })
            .collect();
        Hogs { stop, threads }
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// fs_mark's files/s (all files over wall time) on a fresh file system of `kind`: `threads`
/// threads, `total` 0-byte files in all, one directory per thread, no fsync; with `hogs`, a
/// busy loop on every CPU meanwhile.
fn fs_mark_rate(
    base: &Path,
    kind: FsKind,
    threads: u64,
    total: u64,
    hogs: bool,
) -> Result<f64, String> {
    bench_env::ensure_tools(&[("fs_mark", "fsmark")])?;
    let t = Target::make(base, kind, 2 << 30, total + 65_536)?;
    let mut cmd = std::process::Command::new("fs_mark");
    // fs_mark writes its log (fs_log.txt) into the working directory: keep it in scratch.
    cmd.current_dir(base)
        .args(["-S", "0", "-L", "1", "-s", "0", "-k"])
        .args([
            "-n",
            &(total / threads).to_string(),
            "-t",
            &threads.to_string(),
        ]);
    for i in 1..=threads {
        cmd.arg("-d").arg(t.mp.join(format!("d{i}")));
    }
    let hogs = hogs.then(Hogs::start);
    let start = Instant::now();
    bench_env::run(&mut cmd)?;
    let secs = start.elapsed().as_secs_f64();
    drop(hogs);
    Ok((total / threads * threads) as f64 / secs)
}

/// A memory device whose flush takes `delay`, as a disk's cache flush does: what the fsync
/// log's flush costs other threads depends on it, and a memory device's flush costs nothing.
struct SlowFlush {
    inner: MemDevice,
    delay: Duration,
}

impl BlockDevice for SlowFlush {
    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, off)
    }
    fn flush(&self) -> std::io::Result<()> {
        std::thread::sleep(self.delay);
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

const FLUSH_DELAY: Duration = Duration::from_micros(200);

/// For `dur`: `fsyncers` threads each create a file, write 4 KiB and fsync it, over and over,
/// while `creators` threads create empty files, on a device with slow flushes. Returns
/// (fsyncs/s, creates/s of the creators).
fn fsync_beside(
    under_lock: bool,
    fsyncers: u64,
    creators: u64,
    dur: Duration,
) -> Result<(f64, f64), String> {
    let dev = Arc::new(SlowFlush {
        inner: MemDevice::new_prefaulted(1 << 30),
        delay: FLUSH_DELAY,
    });
    Fs::mkfs(dev.clone(), &MkfsOptions::default()).map_err(|e| e.to_string())?;
    let opts = OpenOptions {
        bench_log_under_lock: under_lock,
        ..OpenOptions::default()
    };
    let fs = Fs::open(dev, opts).map_err(|e| e.to_string())?;
    // A mount appends to a log only after its own first commit.
    fs.sync().map_err(|e| e.to_string())?;
    let stop = AtomicBool::new(false);
    let data = vec![7u8; 4096];
    let (syncs, made) = std::thread::scope(|s| {
        let run = |k: u64, fsync: bool| {
            let (fs, stop, data) = (&fs, &stop, &data);
            s.spawn(move || -> Result<u64, String> {
                let e = |e: idxfs_engine::Error| e.to_string();
                let tag = if fsync { "s" } else { "c" };
                let dir = fs
                    .mkdir(
                        idxfs_format::ROOT_INO,
                        format!("{tag}{k}").as_bytes(),
                        0o755,
                        Owner::default(),
                    )
                    .map_err(e)?;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let a = fs
                        .create(dir.ino, format!("f{i}").as_bytes(), 0o644, Owner::default())
                        .map_err(e)?;
                    if fsync {
                        fs.write(a.ino, 0, data).map_err(e)?;
                        fs.fsync(a.ino).map_err(e)?;
                    }
                    i += 1;
                }
                Ok(i)
            })
        };
        let hs: Vec<_> = (0..fsyncers)
            .map(|k| (true, run(k, true)))
            .chain((0..creators).map(|k| (false, run(k, false))))
            .collect();
        std::thread::sleep(dur);
        stop.store(true, Ordering::Relaxed);
        let (mut syncs, mut made) = (0, 0);
        for (fsync, h) in hs {
            let n = h.join().map_err(|_| "thread panicked".to_string())??;
            if fsync {
                syncs += n;
            } else {
                made += n;
            }
        }
        Ok::<_, String>((syncs, made))
    })?;
    fs.close().map_err(|e| e.to_string())?;
    let secs = dur.as_secs_f64();
    Ok((syncs as f64 / secs, made as f64 / secs))
}

/// The fsync rows: each case with the batch written under the lock, then outside it.
fn fsync_rows(dur: Duration) -> Result<(String, Value), String> {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "fsync beside other work (device flush {} us; log batch written under the lock / \
         outside it):",
        FLUSH_DELAY.as_micros()
    );
    let (s1u, c1u) = fsync_beside(true, 1, 1, dur)?;
    let (s1o, c1o) = fsync_beside(false, 1, 1, dur)?;
    let _ = writeln!(
        o,
        "  1 fsyncing + 1 creating thread: creates/s {c1u:.0} / {c1o:.0} ({:.2}x), fsyncs/s \
         {s1u:.0} / {s1o:.0} ({:.2}x)",
        c1o / c1u,
        s1o / s1u
    );
    let (s2u, _) = fsync_beside(true, 2, 0, dur)?;
    let (s2o, _) = fsync_beside(false, 2, 0, dur)?;
    let _ = writeln!(
        o,
        "  2 fsyncing threads: fsyncs/s {s2u:.0} / {s2o:.0} ({:.2}x)",
        s2o / s2u
    );
    let json = json!({
        "flush_us": FLUSH_DELAY.as_micros() as u64,
        "one_fsyncer_one_creator": {
            "under_lock": {"fsyncs": s1u, "creates": c1u},
            "outside": {"fsyncs": s1o, "creates": c1o},
        },
        "two_fsyncers": {"under_lock": s2u, "outside": s2o},
    });
    Ok((o, json))
}

/// A memory device whose reads and writes each take `IO_DELAY`, as a fast SSD's do: what
/// doing data I/O under the operation lock costs other threads depends on it.
struct SlowIo {
    inner: MemDevice,
}

/// Per read or write of `SlowIo`: about an NVMe drive's 64 KiB access.
const IO_DELAY: Duration = Duration::from_micros(50);

impl BlockDevice for SlowIo {
    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        std::thread::sleep(IO_DELAY);
        self.inner.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
        std::thread::sleep(IO_DELAY);
        self.inner.write_at(buf, off)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

/// Bytes per read or write of the data rows, and the file each thread works in.
const DATA_IO: usize = 64 << 10;
const DATA_FILE: u64 = 32 << 20;

/// What the writers of `data_beside` write into.
#[derive(Clone, Copy, PartialEq)]
enum WriteInto {
    /// A file of their own each.
    Own,
    /// One NOCOW file, each in a range of its own (seed 004's writes, issue 23's "different
    /// ranges of one NOCOW file in parallel").
    NocowRanges,
    /// One preallocated copy-on-write file, each filling a range of its own front to back,
    /// every block once (a download's or a database's `posix_fallocate`d file).
    PreallocRanges,
}

/// Bytes each writer fills in `WriteInto::PreallocRanges`.
const FILL_RANGE: u64 = 192 << 20;

/// For `dur`: `writers` threads overwrite 64 KiB pieces of a file of their own and `readers`
/// threads read 64 KiB pieces of one, at pseudo-random offsets, on a device with slow I/O;
/// or the writers write the `files` of another kind (a filling writer stops at its range's
/// end, and the rates count the time until the last one did). `under_lock`: every read and
/// write whole under the operation lock (the same-run baseline). Returns (MB/s written, MB/s
/// read).
fn data_beside(
    under_lock: bool,
    writers: u64,
    readers: u64,
    into: WriteInto,
    dur: Duration,
) -> Result<(f64, f64), String> {
    let e = |e: idxfs_engine::Error| e.to_string();
    let dev = Arc::new(SlowIo {
        inner: MemDevice::new_prefaulted(1 << 30),
    });
    Fs::mkfs(dev.clone(), &MkfsOptions::default()).map_err(e)?;
    let opts = OpenOptions {
        bench_data_under_lock: under_lock,
        ..OpenOptions::default()
    };
    let fs = Fs::open(dev, opts).map_err(e)?;
    let piece = vec![5u8; DATA_IO];
    // (file, first byte, bytes) each thread works in.
    let mut files: Vec<(u64, u64, u64)> = Vec::new();
    for k in 0..writers + readers {
        // Writers in ranges share the first one's file.
        let in_range = into != WriteInto::Own && k < writers;
        let range = match into {
            WriteInto::PreallocRanges => FILL_RANGE,
            _ => DATA_FILE,
        };
        if let (true, Some(&(ino, _, _))) = (in_range, files.first()) {
            files.push((ino, k * range, range));
            continue;
        }
        let a = fs
            .create(
                idxfs_format::ROOT_INO,
                format!("d{k}").as_bytes(),
                0o644,
                Owner::default(),
            )
            .map_err(e)?;
        if in_range && into == WriteInto::PreallocRanges {
            fs.fallocate(a.ino, 0, writers * range, 0).map_err(e)?;
            files.push((a.ino, 0, range));
            continue;
        }
        let len = if in_range {
            fs.set_flags(a.ino, idxfs_engine::fs::NOCOW_FL).map_err(e)?;
            writers * DATA_FILE
        } else {
            DATA_FILE
        };
        for at in (0..len).step_by(DATA_IO) {
            fs.write(a.ino, at, &piece).map_err(e)?;
        }
        files.push((a.ino, 0, DATA_FILE));
    }
    fs.sync().map_err(e)?;
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let start = Instant::now();
    let (written, read) = std::thread::scope(|s| {
        let hs: Vec<_> = files
            .iter()
            .enumerate()
            .map(|(k, &(ino, from, len))| {
                let (fs, stop, piece, done) = (&fs, &stop, &piece, &done);
                let write = (k as u64) < writers;
                let fill = write && into == WriteInto::PreallocRanges;
                s.spawn(move || -> Result<(bool, u64), String> {
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ k as u64;
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let at = if fill {
                            from + n * DATA_IO as u64
                        } else {
                            from + x % (len / DATA_IO as u64) * DATA_IO as u64
                        };
                        if fill && at >= from + len {
                            break;
                        }
                        if write {
                            fs.write(ino, at, piece).map_err(e)?;
                        } else {
                            fs.read(ino, at, DATA_IO).map_err(e)?;
                        }
                        n += 1;
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    Ok((write, n))
                })
            })
            .collect();
        let all = files.len() as u64;
        while start.elapsed() < dur && done.load(Ordering::Relaxed) < all {
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, Ordering::Relaxed);
        let (mut written, mut read) = (0, 0);
        for h in hs {
            match h.join().map_err(|_| "thread panicked".to_string())?? {
                (true, n) => written += n,
                (false, n) => read += n,
            }
        }
        Ok::<_, String>((written, read))
    })?;
    let wall = start.elapsed().min(dur);
    fs.close().map_err(e)?;
    let mb = |n: u64| (n * DATA_IO as u64) as f64 / 1e6 / wall.as_secs_f64();
    Ok((mb(written), mb(read)))
}

/// One row of writers only: 1 and 2 of them writing `into`, each whole under the lock and
/// with the device I/O outside it, printed as `what`; returns the rates for the JSON.
fn writers_row(
    o: &mut String,
    what: &str,
    into: WriteInto,
    dur: Duration,
) -> Result<Value, String> {
    let (u1, _) = data_beside(true, 1, 0, into, dur)?;
    let (o1, _) = data_beside(false, 1, 0, into, dur)?;
    let (u2, _) = data_beside(true, 2, 0, into, dur)?;
    let (o2, _) = data_beside(false, 2, 0, into, dur)?;
    let _ = writeln!(
        o,
        "  {what}, MB/s: 1 thread {u1:.0} / {o1:.0}, 2 threads {u2:.0} / {o2:.0} (2 against 1: \
         {:.2}x / {:.2}x)",
        u2 / u1,
        o2 / o1
    );
    Ok(json!({
        "under_lock": {"1": u1, "2": u2},
        "outside": {"1": o1, "2": o2},
    }))
}

/// The data rows: each case with reads and writes whole under the lock, then with their
/// device I/O outside it.
fn data_rows(dur: Duration) -> Result<(String, Value), String> {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "data I/O beside other work (64 KiB pieces, device {} us per I/O; under the lock / \
         outside it):",
        IO_DELAY.as_micros()
    );
    let own = writers_row(&mut o, "writers in their own files", WriteInto::Own, dur)?;
    let nocow = writers_row(
        &mut o,
        "writers in ranges of one NOCOW file",
        WriteInto::NocowRanges,
        dur,
    )?;
    let fill = writers_row(
        &mut o,
        "writers filling ranges of one preallocated copy-on-write file",
        WriteInto::PreallocRanges,
        dur,
    )?;
    let (wu, ru) = data_beside(true, 1, 1, WriteInto::Own, dur)?;
    let (wo, ro) = data_beside(false, 1, 1, WriteInto::Own, dur)?;
    let _ = writeln!(
        o,
        "  1 reader beside 1 writer, MB/s: read {ru:.0} / {ro:.0} ({:.2}x), written {wu:.0} / \
         {wo:.0} ({:.2}x)",
        ro / ru,
        wo / wu
    );
    let json = json!({
        "io_delay_us": IO_DELAY.as_micros() as u64,
        "writers_mb_s": own,
        "nocow_writers_mb_s": nocow,
        "prealloc_fill_writers_mb_s": fill,
        "reader_beside_writer_mb_s": {
            "under_lock": {"read": ru, "written": wu},
            "outside": {"read": ro, "written": wo},
        },
    });
    Ok((o, json))
}

/// The `concurrency` workload of `idxfs bench`: `secs` per measurement, `files` read.
/// `listed`: files in each directory of the readdirplus-after-two-writers row.
pub fn run(
    base: &Path,
    secs: f64,
    files: u64,
    creates_n: u64,
    listed: u64,
    with_mount: bool,
) -> Result<(String, Value), String> {
    let (mut text, lib) = library(secs, files, creates_n, listed)?;
    let (t, f) = fsync_rows(Duration::from_secs_f64(secs))?;
    text.push_str(&t);
    let (t, d) = data_rows(Duration::from_secs_f64(secs))?;
    text.push_str(&t);
    let mut json = json!({ "library": lib, "fsync": f, "data": d });
    if with_mount {
        let (t, m) = mount(base, secs, files, creates_n)?;
        text.push_str(&t);
        json["mount"] = m;
    }
    Ok((text, json))
}
