//! NOCOW files and preallocated blocks through the mount: `chattr +C` / `lsattr` (the
//! kernel's fileattr calls, sent on as FS_IOC_GETFLAGS / FS_IOC_SETFLAGS), inheritance from
//! a +C directory, btrfs's rule that a file with data keeps its flag, refused flags, and a
//! full device that still takes writes into a fallocated range and overwrites of a NOCOW
//! file, across a remount, fsck clean.
mod common;
use common::*;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

fn chattr(flag: &str, p: &Path) -> (bool, String) {
    let out = Command::new("chattr")
        .arg(flag)
        .arg(p)
        .output()
        .expect("run chattr");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The flag letters `lsattr -d` prints for `p`.
fn lsattr(p: &Path) -> String {
    let out = Command::new("lsattr")
        .arg("-d")
        .arg(p)
        .output()
        .expect("run lsattr");
    assert!(
        out.status.success(),
        "lsattr {}: {}",
        p.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.split_whitespace().next().unwrap_or_default().to_string()
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn chattr_c_lsattr_and_writes_in_place_on_a_full_device() {
    let mut m = Mounted::new("48M", "");
    let d = m.path("d");
    std::fs::create_dir(&d).expect("mkdir");
    assert!(!lsattr(&d).contains('C'), "no flag yet: {}", lsattr(&d));
    let ctime = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(p).expect("stat");
        (m.ctime(), m.ctime_nsec())
    };
    let before = ctime(&d);
    let (ok, err) = chattr("+C", &d);
    assert!(ok, "chattr +C dir: {err}");
    assert!(lsattr(&d).contains('C'), "dir: {}", lsattr(&d));
    // The change time moved, and the kernel shows it at once rather than the one it had
    // cached (for the mount's ttl, an hour).
    assert!(
        ctime(&d) > before,
        "ctime after chattr: {:?}, before {before:?}",
        ctime(&d)
    );
    let f = d.join("f");
    std::fs::write(&f, b"").expect("create");
    assert!(lsattr(&f).contains('C'), "inherited: {}", lsattr(&f));
    std::fs::create_dir(d.join("sub")).expect("mkdir");
    assert!(lsattr(&d.join("sub")).contains('C'), "inherited by a dir");
    // A file with data keeps its flag (btrfs), and flags idxfs lacks are refused.
    let g = m.path("g");
    std::fs::write(&g, b"data").expect("write");
    let (ok, err) = chattr("+C", &g);
    assert!(ok, "chattr +C on a file with data succeeds: {err}");
    assert!(
        !lsattr(&g).contains('C'),
        "but changes nothing: {}",
        lsattr(&g)
    );
    let (ok, err) = chattr("+i", &g);
    assert!(!ok && err.contains("Operation not supported"), "+i: {err}");

    let mut nocow_bytes = pattern(1, 2 << 20);
    std::fs::write(&f, &nocow_bytes).expect("write");
    let p = m.path("p");
    let pf = std::fs::File::create(&p).expect("create");
    // SAFETY: a valid descriptor.
    let r = unsafe { libc::posix_fallocate(std::os::fd::AsRawFd::as_raw_fd(&pf), 0, 2 << 20) };
    assert_eq!(r, 0, "posix_fallocate");
    drop(pf);
    // Fill the device.
    let fill = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(m.path("fill"))
        .expect("create");
    let chunk = vec![7u8; 1 << 20];
    let mut at = 0u64;
    for len in [1 << 20, 4096, 1] {
        while fill.write_all_at(&chunk[..len], at).is_ok() {
            at += len as u64;
        }
    }
    let e = fill.write_all_at(&chunk[..4096], at).expect_err("full");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    drop(fill);
    // Writes into the fallocated range and NOCOW overwrites, aligned and not.
    let mut pre_bytes = vec![0u8; 2 << 20];
    let pw = OpenOptions::new().write(true).open(&p).expect("open");
    let fw = OpenOptions::new().write(true).open(&f).expect("open");
    for (i, (off, len)) in [
        (0usize, 65536usize),
        (100_000, 5000),
        (1 << 20, 1 << 20),
        (4095, 2),
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(10 + i as u8, len);
        pw.write_all_at(&data, off as u64)
            .unwrap_or_else(|e| panic!("write {i} into the fallocated range: {e}"));
        pre_bytes[off..off + len].copy_from_slice(&data);
        fw.write_all_at(&data, off as u64)
            .unwrap_or_else(|e| panic!("overwrite {i} of the NOCOW file: {e}"));
        nocow_bytes[off..off + len].copy_from_slice(&data);
    }
    pw.sync_all().expect("fsync");
    fw.sync_all().expect("fsync");
    drop((pw, fw));
    m.unmount();
    m.mount("");
    assert!(
        std::fs::read(m.path("p")).expect("read") == pre_bytes,
        "fallocated file"
    );
    assert!(
        std::fs::read(m.path("d/f")).expect("read") == nocow_bytes,
        "NOCOW file"
    );
    assert!(lsattr(&m.path("d/f")).contains('C'), "after remount");
    m.unmount();
    m.assert_fsck_clean();
}
