//! `idxfs cp` through a mount: a tree with a large file and a sparse one copied by the
//! server with their data shared (the space used grows by metadata, not by the data), the
//! copy seen at once though the kernel had looked the name up, into a directory as cp
//! does, each side changed apart from the other, a tree and a whole snapshot copied out of
//! a snapshot after the tree went, fsck clean; what must fail answered in one line each;
//! another user's copy is theirs.
//! (Every kind of entry and its attributes: `mkfs_from.rs`, `Builder::Cp`.)
mod common;
use common::*;
use std::os::unix::fs::{FileExt, PermissionsExt};

fn used_bytes(p: &std::path::Path) -> u64 {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: statvfs(3) into a zeroed struct, with a valid C string.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0, "statvfs");
    (s.f_blocks - s.f_bfree) * s.f_frsize
}

fn read(p: &std::path::Path) -> Vec<u8> {
    std::fs::read(p).expect("read")
}

#[test]
fn idxfs_cp_shares_the_data_and_the_copy_changes_apart() {
    let mut m = Mounted::new("1G", "");
    std::fs::create_dir_all(m.path("data/sub")).expect("mkdir");
    let big: Vec<u8> = (0..(64u32 << 20) / 4)
        .flat_map(|i| i.to_le_bytes())
        .collect();
    std::fs::write(m.path("data/big"), &big).expect("write");
    let sparse = std::fs::File::create(m.path("data/sub/sparse")).expect("create");
    sparse.write_at(b"here", 200 << 20).expect("write");
    sparse.set_len(256 << 20).expect("set_len");
    drop(sparse);
    for i in 0..200 {
        std::fs::write(m.path(&format!("data/sub/f{i}")), vec![i as u8; 3000]).expect("write");
    }
    let h_sparse = read(&m.path("data/sub/sparse"));
    let at = |r: &str| m.path(r).to_str().expect("utf8").to_string();
    // The kernel has looked the copy's name up, and holds that it is absent.
    assert!(!m.path("copy").exists());
    let before = used_bytes(&m.mp);
    let (code, out, err) = idxfs(&["cp", &at("data"), &at("copy")]);
    assert_eq!(code, 0, "cp: {out}{err}");
    assert!(out.contains("copied 202 files and 2 directories"), "{out}");
    let grew = used_bytes(&m.mp) - before;
    assert!(
        grew < 8 << 20,
        "{grew} bytes more used for a copy of 64 MiB"
    );
    assert!(m.path("copy/sub/f7").exists(), "the copy is seen at once");
    assert!(read(&m.path("copy/big")) == big);
    assert!(read(&m.path("copy/sub/sparse")) == h_sparse);
    assert_eq!(
        std::fs::read(m.path("copy/sub/f7")).expect("read"),
        vec![7u8; 3000]
    );

    // Each side changes alone.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(m.path("copy/big"))
        .expect("open");
    f.write_at(b"changed", 5 << 20).expect("write");
    drop(f);
    std::fs::write(m.path("data/sub/f7"), b"new").expect("write");
    assert!(
        read(&m.path("data/big")) == big,
        "the source moved with the copy"
    );
    assert!(read(&m.path("copy/big")) != big);
    assert_eq!(
        std::fs::read(m.path("copy/sub/f7")).expect("read"),
        vec![7u8; 3000]
    );

    // Into an existing directory, under the source's name, as cp does.
    std::fs::create_dir(m.path("into")).expect("mkdir");
    let (code, out, err) = idxfs(&["cp", &at("data/sub"), &at("into")]);
    assert_eq!(code, 0, "cp: {out}{err}");
    assert_eq!(std::fs::read(m.path("into/sub/f7")).expect("read"), b"new");

    // Out of a snapshot, after the tree changed and went: the tree of its moment, its
    // blocks shared; a whole snapshot too.
    std::fs::create_dir(m.path(".snapshots/s")).expect("snapshot");
    let f7 = read(&m.path("data/sub/f7"));
    std::fs::write(m.path("data/sub/f7"), b"after the snapshot").expect("write");
    let (code, out, err) = idxfs(&["rm", &at("data")]);
    assert_eq!(code, 0, "rm: {out}{err}");
    let before = used_bytes(&m.mp);
    let (code, out, err) = idxfs(&["cp", &at(".snapshots/s/data"), &at("data")]);
    assert_eq!(code, 0, "cp out of a snapshot: {out}{err}");
    assert!(out.contains("copied 202 files and 2 directories"), "{out}");
    let grew = used_bytes(&m.mp).saturating_sub(before);
    assert!(
        grew < 8 << 20,
        "{grew} bytes more used for a restore of 64 MiB"
    );
    assert!(read(&m.path("data/big")) == big);
    assert_eq!(read(&m.path("data/sub/f7")), f7);
    let (code, out, err) = idxfs(&["cp", &at(".snapshots/s"), &at("whole")]);
    assert_eq!(code, 0, "cp of a whole snapshot: {out}{err}");
    assert!(read(&m.path("whole/data/big")) == big);
    assert!(
        read(&m.path("whole/copy/big")) != big,
        "the copy's change, as it was"
    );

    // What must fail, in one line each, with nothing made.
    let elsewhere = shm_tempdir();
    let other = elsewhere.path().join("x");
    std::fs::create_dir(&other).expect("mkdir");
    for (src, dst, want) in [
        (at("data/big"), at("copy/big"), "exists"),
        (at("data"), at("data/sub/again"), "into itself"),
        (at("missing"), at("new"), "no such file"),
        (at(".snapshots"), at("all"), "the snapshots directory"),
        (at("data"), at(".snapshots/s/x"), "read-only"),
        (other.to_str().expect("utf8").into(), at("new"), "not idxfs"),
        (
            at("data"),
            other.join("y").to_str().expect("utf8").into(),
            "not idxfs",
        ),
        (at("data/."), at("new"), "not a name"),
    ] {
        let (code, out, err) = idxfs(&["cp", &src, &dst]);
        assert_ne!(code, 0, "{src} {dst}: {out}");
        assert_eq!(err.trim_end().lines().count(), 1, "{src} {dst}: {err}");
        assert!(err.contains(want), "{src} {dst}: {err}");
    }
    assert!(!m.path("new").exists() && !m.path("data/sub/again").exists());
    assert!(!m.path("copy/data").exists());
    // Another user, who may read and write everything, copies as their own `cp -a` would:
    // the copy is theirs (`mount_cp_user.rs` holds it to `cp -a` entry by entry).
    for p in [m.dir.path(), &m.mp, &m.path("data")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    }
    let o = std::process::Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(bin())
        .args(["cp", &at("data"), &at("theirs")])
        .output()
        .expect("setpriv");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    use std::os::unix::fs::MetadataExt;
    let theirs = std::fs::metadata(m.path("theirs/big")).expect("their copy");
    assert_eq!((theirs.uid(), theirs.gid()), (65534, 65534));
    assert!(read(&m.path("theirs/big")) == big);

    m.unmount();
    m.assert_fsck_clean();
}

/// A copy goes a slice at a time (`fuse/src/slices.rs`): the server answers each IOCTL
/// when its slice is over and the command asks again, so callers on the ring worker's CPU
/// wait a slice at most; with slices of no time at all (`IDXFS_SLICE_US=0`), one entry
/// each, and the copy is whole at the end. A token the server does not hold is refused.
#[test]
fn a_copy_goes_a_slice_at_a_time() {
    let mut m = Mounted::new("256M", "");
    m.unmount();
    m.counters = true;
    m.env.push(("IDXFS_SLICE_US", "0".into()));
    m.mount("");
    let n = 300;
    for d in 0..3 {
        std::fs::create_dir_all(m.path(&format!("data/d{d}"))).expect("mkdir");
        for i in 0..n / 3 {
            let p = m.path(&format!("data/d{d}/f{i}"));
            std::fs::write(p, format!("{d}/{i}")).expect("write");
        }
    }
    let at = |r: &str| m.path(r).to_str().expect("utf8").to_string();
    let (code, out, err) = idxfs(&["cp", &at("data"), &at("copy")]);
    assert_eq!(code, 0, "cp: {out}{err}");
    assert!(
        out.contains(&format!("copied {n} files and 4 directories")),
        "{out}"
    );
    for d in 0..3 {
        let names = std::fs::read_dir(m.path(&format!("copy/d{d}")))
            .expect("ls")
            .count();
        assert_eq!(names, n / 3, "copy/d{d}");
    }
    assert_eq!(read(&m.path("copy/d2/f99")), b"2/99");
    // A made-up token is nobody's.
    let dir = std::fs::File::open(&m.mp).expect("open");
    let mut buf = idxfs_fuse::cptree::encode_more(12345);
    use std::os::fd::AsRawFd;
    // SAFETY: an ioctl on a descriptor we hold, with a buffer of the size its number says.
    let r = unsafe {
        libc::ioctl(
            dir.as_raw_fd(),
            idxfs_fuse::cptree::IOC_CPTREE_MORE as _,
            buf.as_mut_ptr(),
        )
    };
    let e = std::io::Error::last_os_error();
    assert_eq!((r, e.raw_os_error()), (-1, Some(libc::EINVAL)), "{e}");
    drop(dir);
    let err = m.unmount();
    // An entry a request, the three directories' included, and the refused one.
    let ioctls = Mounted::requests(&err, "ioctl");
    assert!(
        ioctls > n as u64 + 3,
        "{ioctls} ioctls for {n} files\n{err}"
    );
    m.assert_fsck_clean();
}
