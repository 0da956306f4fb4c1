//! `idxfs bench mount`: per-operation cost through the idxfs FUSE mount beside ext4 on a
//! memory-backed loop device, measured by the same compiled loops in one run, plus the floor of
//! the FUSE transport (one round trip to an empty daemon). Performance only: nothing asserted.
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Something made for the benchmark, undone on drop (also when the benchmark fails).
enum Made {
    File(PathBuf),
    Dir(PathBuf),
    Loop(String),
    Mount(PathBuf),
}

#[derive(Default)]
struct Cleanup(Vec<Made>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        while let Some(m) = self.0.pop() {
            match m {
                Made::Mount(p) => {
                    let ok = Command::new("umount")
                        .arg(&p)
                        .status()
                        .is_ok_and(|s| s.success());
                    if !ok {
                        let _ = Command::new("umount").arg("-l").arg(&p).status();
                    }
                }
                Made::Loop(dev) => {
                    let _ = Command::new("losetup").arg("-d").arg(&dev).status();
                }
                Made::File(p) => {
                    let _ = std::fs::remove_file(&p);
                }
                Made::Dir(p) => {
                    let _ = std::fs::remove_dir_all(&p);
                }
            }
        }
    }
}

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn wait_mounted(mp: &Path) -> bool {
    let want = mp.to_string_lossy().into_owned();
    for _ in 0..500 {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        if info
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
        {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

fn check(r: libc::c_int, what: &str, p: &Path) -> Result<libc::c_int, String> {
    if r < 0 {
        return Err(format!(
            "{what} {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(r)
}

fn create_close(p: &CString, path: &Path) -> Result<(), String> {
    // SAFETY: a valid C path; the descriptor is closed right away.
    let fd = unsafe {
        libc::open(
            p.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
            0o644,
        )
    };
    check(fd, "create", path)?;
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    Ok(())
}

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

fn floor_ns(base: &Path) -> Result<f64, String> {
    let mp = base.join("null");
    std::fs::create_dir(&mp).map_err(|e| e.to_string())?;
    let m = idxfs_fuse::null::NullMount::mount(&mp).map_err(|e| format!("null FUSE mount: {e}"))?;
    let c = cpath(&mp);
    // SAFETY: a valid C path and our stat buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let n = 20_000;
    let t = Instant::now();
    for _ in 0..n {
        check(unsafe { libc::stat(c.as_ptr(), &mut st) }, "stat", &mp)?;
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    m.unmount().map_err(|e| format!("null FUSE unmount: {e}"))?;
    Ok(ns)
}

pub fn bench_mount(files: u64) -> Result<(), String> {
    let mut made = Cleanup::default();
    let base = crate::tempdir_in_shm()?;
    made.0.push(Made::Dir(base.clone()));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "idxfs bench mount: {files} files; load average {}",
        load.split(' ').take(3).collect::<Vec<_>>().join(" ")
    );
    // ext4 on a loop device over a file in /dev/shm.
    let img = base.join("ext4.img");
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(2 << 30))
        .map_err(|e| format!("{}: {e}", img.display()))?;
    made.0.push(Made::File(img.clone()));
    let dev = run(Command::new("losetup").arg("-f").arg("--show").arg(&img))?;
    made.0.push(Made::Loop(dev.clone()));
    run(Command::new("mkfs.ext4").args(["-q", "-F", &dev]))?;
    let ext4_mp = base.join("ext4");
    std::fs::create_dir(&ext4_mp).map_err(|e| e.to_string())?;
    run(Command::new("mount").arg(&dev).arg(&ext4_mp))?;
    made.0.push(Made::Mount(ext4_mp.clone()));
    // idxfs: this binary's own mount command, in the background.
    let idx_img = base.join("idxfs.img");
    let idx_mp = base.join("idxfs");
    std::fs::create_dir(&idx_mp).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    run(Command::new(&exe)
        .args(["mount", "--background", "--create", "--size", "2G"])
        .arg(&idx_img)
        .arg(&idx_mp))?;
    made.0.push(Made::File(idx_img.clone()));
    made.0.push(Made::Mount(idx_mp.clone()));
    if !wait_mounted(&idx_mp) {
        return Err("idxfs mount did not come up".into());
    }
    let floor = floor_ns(&base)?;
    let cpu0 = crate::bench::cpu_seconds();
    let e = measure(&ext4_mp, files)?;
    let cpu_e = crate::bench::cpu_seconds() - cpu0;
    let cpu0 = crate::bench::cpu_seconds();
    let i = measure(&idx_mp, files)?;
    let cpu_i = crate::bench::cpu_seconds() - cpu0;
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
        "FUSE round trip, empty daemon (stat, TTL 0): {floor:.0} ns; create costs at least two \
         round trips (LOOKUP, CREATE), unlink one"
    );
    println!(
        "benchmark process CPU seconds: idxfs {cpu_i:.2}, ext4 {cpu_e:.2} (daemon CPU not included)"
    );
    drop(made);
    Ok(())
}
