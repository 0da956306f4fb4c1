//! Requests that may work for long run on a thread of their own while their ring worker goes
//! on serving (`fuse/src/long.rs`, `uring::park`). With `IDXFS_LONG_EXTENTS=0` every
//! fallocate and every shrinking truncate goes that way, so the path is tried on files of any
//! size: threads on one CPU (their requests meet in one ring queue, where some find no entry
//! left to park in and run where they came) write, truncate and fallocate in every mode, each
//! file checked against a byte model of it after every step, after a remount, and by fsck.
mod common;
use common::*;
use idxfs_engine::testutil::Rng;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

const FALLOC_KEEP_SIZE: i32 = 1;
const FALLOC_PUNCH_HOLE: i32 = 2;
const FALLOC_ZERO_RANGE: i32 = 0x10;
/// Files stay below this, so a step's offsets land inside them or just past.
const SPAN: u64 = 3 << 20;

fn pin_to_cpu0() {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU 0 is below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// What fallocate `mode` over [off, off + len) does to a file's bytes, as tmpfs and ext4 do.
fn model_fallocate(m: &mut Vec<u8>, mode: i32, off: u64, len: u64) {
    let (off, end) = (off as usize, (off + len) as usize);
    let keep = mode & FALLOC_KEEP_SIZE != 0;
    if !keep && end > m.len() {
        m.resize(end, 0);
    }
    if mode & (FALLOC_PUNCH_HOLE | FALLOC_ZERO_RANGE) != 0 {
        let to = end.min(m.len());
        if off < to {
            m[off..to].fill(0);
        }
    }
}

/// One thread's steps on its own file; returns the model of its bytes.
fn steps(path: PathBuf, seed: u64, count: usize) -> Vec<u8> {
    pin_to_cpu0();
    let mut rng = Rng::new(seed);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .expect("create");
    let mut m: Vec<u8> = Vec::new();
    for i in 0..count {
        let off = rng.below(SPAN);
        let len = 1 + rng.below(SPAN / 3);
        let what = match rng.below(4) {
            0 => {
                let n = 1 + rng.below(256 << 10) as usize;
                let data = rng.bytes(n);
                f.write_all_at(&data, off).expect("write");
                let end = off as usize + data.len();
                if m.len() < end {
                    m.resize(end, 0);
                }
                m[off as usize..end].copy_from_slice(&data);
                format!("write {}+{}", off, data.len())
            }
            1 => {
                let size = rng.below(SPAN);
                f.set_len(size).expect("truncate");
                m.resize(size as usize, 0);
                format!("truncate to {size}")
            }
            _ => {
                let mode = [
                    0,
                    FALLOC_KEEP_SIZE,
                    FALLOC_PUNCH_HOLE | FALLOC_KEEP_SIZE,
                    FALLOC_ZERO_RANGE,
                    FALLOC_ZERO_RANGE | FALLOC_KEEP_SIZE,
                ][rng.below(5) as usize];
                // SAFETY: a valid descriptor; fallocate reads only its arguments.
                let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, off as i64, len as i64) };
                assert_eq!(
                    r,
                    0,
                    "fallocate mode {mode} at {off}+{len}: {}",
                    std::io::Error::last_os_error()
                );
                model_fallocate(&mut m, mode, off, len);
                format!("fallocate mode {mode} at {off}+{len}")
            }
        };
        let have = std::fs::read(&path).expect("read back");
        assert!(
            have == m,
            "{}: step {i} ({what}): {} bytes, the model {}; first difference at {:?}",
            path.display(),
            have.len(),
            m.len(),
            have.iter().zip(&m).position(|(a, b)| a != b)
        );
    }
    m
}

/// Parked requests, from the daemon's counters at exit.
fn parked(stderr: &str) -> u64 {
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("fuse over io_uring: "))
        .unwrap_or_else(|| panic!("no io_uring counters in {stderr}"));
    line.split(", ")
        .find(|p| p.ends_with("requests parked while a thread of their own worked"))
        .and_then(|p| p.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no parked count in {line}"))
}

#[test]
fn fallocates_and_truncates_on_threads_of_their_own_leave_what_the_model_says() {
    enable_fuse_uring();
    let (_, seed) = Rng::from_env("mount_long");
    let mut m = Mounted::new("1G", "");
    m.unmount();
    m.env.push(("IDXFS_LONG_EXTENTS", "0".into()));
    m.counters = true;
    m.mount("uring");
    const THREADS: u64 = 4;
    let hs: Vec<_> = (0..THREADS)
        .map(|t| {
            let p = m.path(&format!("f{t}"));
            std::thread::spawn(move || steps(p, seed.wrapping_add(t), 150))
        })
        .collect();
    let models: Vec<Vec<u8>> = hs.into_iter().map(|h| h.join().expect("thread")).collect();
    let err = m.unmount();
    let n = parked(&err);
    eprintln!(
        "mount_long: seed {seed}: {n} requests parked, {} fallocates, {} setattrs",
        Mounted::requests(&err, "fallocate"),
        Mounted::requests(&err, "setattr")
    );
    assert!(
        n > 0,
        "no request was parked (seed {seed}): the path under test was not taken\n{err}"
    );
    assert!(
        Mounted::requests(&err, "fallocate") > 0,
        "no fallocate came (seed {seed})"
    );
    m.mount("");
    for (t, model) in models.iter().enumerate() {
        let have = std::fs::read(m.path(&format!("f{t}"))).expect("read after remount");
        assert!(have == *model, "f{t} differs after a remount (seed {seed})");
    }
    m.unmount();
    m.assert_fsck_clean();
}

/// A request run on a thread of its own acts as its caller, as it would where it came: an
/// unprivileged user's fallocates (most of the device, then 1 MiB at a time, all in one file:
/// a create would stop at the reserve anyway), every one of them parked, stop at ENOSPC with
/// the root reserve (10 MiB here) still free, and root then preallocates in it. (Run as the thread's own caller,
/// privileged by default, they filled the reserve too.)
#[test]
fn a_parked_fallocate_keeps_its_callers_limits() {
    enable_fuse_uring();
    let mut m = Mounted::new("1G", "");
    m.unmount();
    m.env.push(("IDXFS_LONG_EXTENTS", "0".into()));
    m.counters = true;
    m.mount("uring");
    let dir = m.path("u");
    std::fs::create_dir(&dir).expect("mkdir");
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).expect("chown");
    let script = format!(
        "fallocate -l 900M {d}/f && i=900 && while fallocate -o ${{i}}M -l 1M {d}/f; do i=$((i+1)); done; test $i -gt 910",
        d = dir.display()
    );
    let (ok, err) = as_user(
        "sh",
        &[std::path::Path::new("-c"), std::path::Path::new(&script)],
    );
    assert!(ok, "the user's fallocates: {err}");
    assert!(
        err.contains("No space left on device"),
        "the user's last fallocate: {err}"
    );
    let st = std::process::Command::new("fallocate")
        .args(["-l", "4M"])
        .arg(m.path("root"))
        .output()
        .expect("run fallocate");
    assert!(
        st.status.success(),
        "root's fallocate in the reserve: {}",
        String::from_utf8_lossy(&st.stderr)
    );
    let err = m.unmount();
    assert!(
        parked(&err) > 10,
        "the user's fallocates were not parked\n{err}"
    );
    m.assert_fsck_clean();
}
