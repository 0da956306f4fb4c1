//! `idxfs bench mount`: per-operation cost through the idxfs FUSE mount beside ext4 on a
//! memory-backed loop device, measured by the same compiled loops in one run, plus the floor of
//! the FUSE transport (`floor_ns`: one round trip that asks idxfs nothing to speak of).
//! Performance only: nothing asserted.
use crate::bench_env::{self, check, cpath, create_close, FsKind, Target};
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The measured loops, on a directory of some file system. Returns ns per op for stat,
/// open+close, create+unlink, and creates/s for 1 and 2 threads.
fn measure(root: &Path, files: u64) -> Result<[f64; 5], String> {
    let dir = root.join("ops");
    std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let names: Vec<(PathBuf, CString)> = (0..files)
        .map(|i| {
            let p = dir.join(format!("f{i:07}"));
            let c = cpath(&p);
            (p, c)
        })
        .collect();
    for (p, c) in &names {
        create_close(c, p)?;
    }
    // SAFETY (all loops below): valid C paths and a stat buffer we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let per = |t: Instant, n: u64| t.elapsed().as_nanos() as f64 / n as f64;
    // Warm once, then time.
    for (_, c) in &names {
        unsafe { libc::stat(c.as_ptr(), &mut st) };
    }
    let t = Instant::now();
    for _ in 0..3 {
        for (p, c) in &names {
            check(unsafe { libc::stat(c.as_ptr(), &mut st) }, "stat", p)?;
        }
    }
    let stat_ns = per(t, 3 * files);
    let t = Instant::now();
    for (p, c) in &names {
        let fd = check(
            unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) },
            "open",
            p,
        )?;
        unsafe { libc::close(fd) };
    }
    let open_ns = per(t, files);
    let scratch = dir.join("scratch");
    let sc = cpath(&scratch);
    let t = Instant::now();
    for _ in 0..files {
        create_close(&sc, &scratch)?;
        check(unsafe { libc::unlink(sc.as_ptr()) }, "unlink", &scratch)?;
    }
    let cu_ns = per(t, files);
    let creates = |threads: u64, tag: &str| -> Result<f64, String> {
        let t = Instant::now();
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|k| {
                    let d = root.join(format!("{tag}{k}"));
                    s.spawn(move || -> Result<(), String> {
                        std::fs::create_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
                        for i in 0..files / threads {
                            let p = d.join(format!("f{i:07}"));
                            create_close(&cpath(&p), &p)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            hs.into_iter()
                .try_for_each(|h| h.join().map_err(|_| "thread panicked".to_string())?)
        })?;
        Ok((files / threads * threads) as f64 / t.elapsed().as_secs_f64())
    };
    let c1 = creates(1, "one")?;
    let c2 = creates(2, "two")?;
    Ok([stat_ns, open_ns, cu_ns, c1, c2])
}

/// The FUSE floor, in ns: one round trip over the transport idxfs serves with (FUSE over
/// io_uring, a ring per CPU, replies handed off at SCHED_IDLE), to a daemon with nothing to
/// do: `stat` of the root of a fresh idxfs mount with `ttl=0` is one GETATTR, answered from
/// the published inode (a fraction of a microsecond of the total). Not an empty daemon on
/// /dev/fuse: that is another, slower transport, whose round trip idxfs's own requests beat,
/// so it bounds nothing idxfs does.
pub(crate) fn floor_ns(base: &Path) -> Result<f64, String> {
    // A directory of its own: a target's image and mount point are named by its kind.
    let dir = base.join("floor");
    std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let t = Target::make_with(&dir, FsKind::Idxfs, 64 << 20, 1024, Some("ttl=0"))?;
    let c = cpath(&t.mp);
    // SAFETY: a valid C path and our stat buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let stat = |st: &mut libc::stat| check(unsafe { libc::stat(c.as_ptr(), st) }, "stat", &t.mp);
    for _ in 0..2_000 {
        stat(&mut st)?;
    }
    let n = 20_000;
    let at = Instant::now();
    for _ in 0..n {
        stat(&mut st)?;
    }
    let ns = at.elapsed().as_nanos() as f64 / n as f64;
    drop(t);
    std::fs::remove_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(ns)
}

pub fn bench_mount(files: u64) -> Result<(), String> {
    bench_env::catch_interrupts();
    let scratch = bench_env::Scratch::new()?;
    let base = scratch.0.clone();
    println!(
        "idxfs bench mount: {files} files; load average {:.2}",
        bench_env::load_average()
    );
    // ext4 on a loop device over a file in /dev/shm; idxfs through this binary's mount.
    let inodes = files * 4 + 65_536;
    let ext4 = Target::make(&base, FsKind::Ext4, 2 << 30, inodes)?;
    let idx = Target::make(&base, FsKind::Idxfs, 2 << 30, inodes)?;
    let (ext4_mp, idx_mp) = (ext4.mp.clone(), idx.mp.clone());
    let floor = floor_ns(&base)?;
    let cpu0 = crate::bench::cpu_seconds();
    let e = measure(&ext4_mp, files)?;
    let cpu_e = crate::bench::cpu_seconds() - cpu0;
    let cpu0 = crate::bench::cpu_seconds();
    let daemon = idx.daemon_pid().map(bench_env::process_cpu).unwrap_or(0.0);
    let i = measure(&idx_mp, files)?;
    let cpu_i = crate::bench::cpu_seconds() - cpu0;
    let cpu_d = idx.daemon_pid().map(bench_env::process_cpu).unwrap_or(0.0) - daemon;
    println!(
        "{:<26} {:>12} {:>12} {:>10}  (ratio > 1: idxfs faster)",
        "operation", "idxfs", "ext4", "ratio"
    );
    let rows = [
        ("stat (ns)", 0, true),
        ("open+close (ns)", 1, true),
        ("create+unlink (ns)", 2, true),
        ("creates/s, 1 thread", 3, false),
        ("creates/s, 2 threads", 4, false),
    ];
    for (name, k, lower_better) in rows {
        let ratio = if lower_better {
            e[k] / i[k]
        } else {
            i[k] / e[k]
        };
        println!("{name:<26} {:>12.0} {:>12.0} {ratio:>10.2}", i[k], e[k]);
    }
    println!(
        "FUSE round trip (stat of a root, TTL 0): {floor:.0} ns; create costs at least two \
         round trips (LOOKUP, CREATE), unlink one"
    );
    println!(
        "CPU seconds: benchmark process on idxfs {cpu_i:.2} + idxfs daemon {cpu_d:.2}; on ext4 {cpu_e:.2}"
    );
    drop((idx, ext4, scratch));
    Ok(())
}
