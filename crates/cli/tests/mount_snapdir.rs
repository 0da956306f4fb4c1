//! Snapshots shown inside the mount (`fuse/src/snapdir.rs`): `MOUNT/.snapshots/NAME` holds
//! the tree as it was when the snapshot was made, walked against a model of it taken then,
//! while the file system changes beside it; inode numbers of its own; every change refused
//! (EROFS), a rename out EXDEV, a copy out whole; hidden from the root's listing; made by
//! mkdir and deleted by rmdir in `.snapshots`; deleted through the mount while a file of it
//! is open (ESTALE from then on); `-o snapdir=NAME`, `-o nosnapdir`, and a real entry of
//! that name winning.
mod common;
use common::*;
use std::collections::BTreeMap;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

/// What a walk sees of a tree: path -> (mode, nlink, size, content or link target, the
/// `user.k` xattr).
type Model = BTreeMap<String, (u32, u64, u64, Vec<u8>, Option<Vec<u8>>)>;

fn getxattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
    let n = std::ffi::CString::new(name).expect("name");
    let mut buf = vec![0u8; 4096];
    // SAFETY: lgetxattr(2) into a buffer of the length given, with valid C strings.
    let r = unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (r >= 0).then(|| buf[..r as usize].to_vec())
}

fn walk(root: &Path) -> Model {
    let mut out = Model::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).expect("readdir") {
            let p = e.expect("entry").path();
            let md = std::fs::symlink_metadata(&p).expect("lstat");
            let body = if md.is_dir() {
                todo.push(p.clone());
                Vec::new()
            } else if md.file_type().is_symlink() {
                std::fs::read_link(&p)
                    .expect("readlink")
                    .into_os_string()
                    .into_encoded_bytes()
            } else {
                std::fs::read(&p).expect("read")
            };
            let rel = p
                .strip_prefix(root)
                .expect("under root")
                .to_string_lossy()
                .into_owned();
            let size = if md.is_dir() { 0 } else { md.len() };
            out.insert(
                rel,
                (md.mode(), md.nlink(), size, body, getxattr(&p, "user.k")),
            );
        }
    }
    out
}

#[track_caller]
fn os_error(r: std::io::Result<impl std::fmt::Debug>) -> Option<i32> {
    r.expect_err("refused").raw_os_error()
}

#[test]
fn snapshots_show_inside_the_mount_read_only_beside_the_changing_file_system() {
    let mut m = Mounted::root_only("256M", "");
    let mp = m.mp.clone();
    std::fs::create_dir_all(m.path("a/b")).expect("mkdir");
    for i in 0..300 {
        let body: Vec<u8> = (0..(i * 37 % 9000)).map(|j| (i + j) as u8).collect();
        std::fs::write(m.path(&format!("a/f{i}")), body).expect("write");
    }
    std::fs::write(m.path("a/b/big"), vec![7u8; 3 << 20]).expect("write");
    std::fs::hard_link(m.path("a/f1"), m.path("a/b/f1-link")).expect("link");
    std::os::unix::fs::symlink("../f2", m.path("a/b/sym")).expect("symlink");
    setxattr(&m.path("a/f3"), "user.k", b"kept");
    let model = walk(&mp);
    let mp_s = mp.to_str().expect("utf8").to_string();
    let (code, out, err) = idxfs(&["snapshot", &mp_s, "one"]);
    assert_eq!(code, 0, "snapshot: {out}{err}");
    // The file system changes: the snapshot keeps its state.
    std::fs::remove_dir_all(m.path("a/b")).expect("rm -r");
    for i in 0..300 {
        if i % 3 == 0 {
            std::fs::remove_file(m.path(&format!("a/f{i}"))).expect("unlink");
        } else {
            std::fs::write(m.path(&format!("a/f{i}")), b"changed").expect("overwrite");
        }
    }
    std::fs::write(m.path("new"), b"new").expect("write");
    let snap = m.path(".snapshots/one");
    assert_eq!(walk(&snap), model, "the snapshot inside the mount");
    // Hidden from the root's listing, listed in its own.
    let root: Vec<String> = std::fs::read_dir(&mp)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
        .collect();
    assert!(!root.contains(&".snapshots".to_string()), "{root:?}");
    let listed: Vec<String> = std::fs::read_dir(m.path(".snapshots"))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
        .collect();
    assert_eq!(listed, ["one"]);
    // Inode numbers of its own: a hard link's two names share one, no file shares the file
    // system's.
    let ino = |p: &Path| std::fs::symlink_metadata(p).expect("lstat").ino();
    assert_eq!(ino(&snap.join("a/f1")), ino(&snap.join("a/b/f1-link")));
    assert_ne!(ino(&snap.join("a/f1")), ino(&m.path("a/f1")));
    assert_ne!(ino(&snap), ino(&mp));
    assert!(
        m.path(".snapshots/one/a/b/sym").exists(),
        "a relative symlink resolves"
    );
    // Every change refused; a rename out is EXDEV, a copy out is whole.
    let f = snap.join("a/f5");
    assert_eq!(
        os_error(std::fs::write(snap.join("x"), b"x")),
        Some(libc::EROFS)
    );
    assert_eq!(
        os_error(
            std::fs::OpenOptions::new()
                .append(true)
                .open(&f)
                .and_then(|mut h| {
                    use std::io::Write;
                    h.write_all(b"x")
                })
        ),
        Some(libc::EROFS)
    );
    assert_eq!(os_error(std::fs::remove_file(&f)), Some(libc::EROFS));
    assert_eq!(
        os_error(std::fs::remove_dir(m.path(".snapshots"))),
        Some(libc::EROFS)
    );
    assert_eq!(
        os_error(std::fs::rename(&f, m.path("out"))),
        Some(libc::EXDEV)
    );
    assert_eq!(
        os_error(std::fs::hard_link(&f, m.path("out"))),
        Some(libc::EXDEV)
    );
    std::fs::copy(snap.join("a/b/big"), m.path("restored")).expect("copy out");
    assert_eq!(
        std::fs::read(m.path("restored")).expect("read"),
        vec![7u8; 3 << 20]
    );
    // A second snapshot, made by mkdir as ZFS's, shows the changed state; both stay. A
    // third made so goes again by rmdir.
    let changed = walk(&mp);
    std::fs::create_dir(m.path(".snapshots/two")).expect("mkdir of a snapshot");
    assert_eq!(walk(&m.path(".snapshots/two")), changed);
    assert_eq!(walk(&snap), model);
    assert_eq!(
        os_error(std::fs::create_dir(m.path(".snapshots/two"))),
        Some(libc::EEXIST)
    );
    std::fs::create_dir(m.path(".snapshots/three")).expect("mkdir of a snapshot");
    std::fs::remove_dir(m.path(".snapshots/three")).expect("rmdir of a snapshot");
    assert!(
        !m.path(".snapshots/three").exists(),
        "a deleted snapshot still shows"
    );
    let (code, out, _) = idxfs(&["snapshot", &mp_s, "--list"]);
    assert_eq!(code, 0);
    let names: Vec<&str> = out
        .lines()
        .filter(|l| !l.contains("(deleted"))
        .filter_map(|l| l.split('\t').nth(1))
        .collect();
    assert_eq!(names, ["one", "two"], "{out}");
    // Deleted through the mount while a file of it is open: gone from the directory, the
    // open file stale, the file system whole.
    // O_DIRECT: every read asks the server (what the kernel cached of a file it may still
    // return after the delete).
    let open = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(snap.join("a/f4"))
            .expect("open")
    };
    assert_eq!(open.read_at(&mut [0u8; 4096], 0).expect("read"), 4 * 37);
    let (code, out, err) = idxfs(&["snapshot", &mp_s, "--delete", "256"]);
    assert_eq!(code, 0, "delete: {out}{err}");
    assert!(!snap.exists(), "a deleted snapshot still shows");
    assert_eq!(
        os_error(open.read_at(&mut [0u8; 4096], 0)),
        Some(libc::ESTALE)
    );
    drop(open);
    assert_eq!(walk(&m.path(".snapshots/two")).len(), changed.len());
    m.unmount();
    m.assert_fsck_clean();
}

#[test]
fn the_snapshots_directory_takes_its_name_from_the_mount_and_yields_to_a_real_entry() {
    let mut m = Mounted::root_only("64M", "nosnapdir");
    std::fs::write(m.path("f"), b"v1").expect("write");
    let mp_s = m.mp.to_str().expect("utf8").to_string();
    let (code, out, err) = idxfs(&["snapshot", &mp_s, "s"]);
    assert_eq!(code, 0, "snapshot: {out}{err}");
    assert!(!m.path(".snapshots").exists(), "shown with nosnapdir");
    // A real entry of that name, made while none is shown.
    std::fs::create_dir(m.path(".snapshots")).expect("mkdir");
    std::fs::write(m.path(".snapshots/mine"), b"mine").expect("write");
    m.unmount();
    m.mount("snapdir=.snap");
    assert_eq!(std::fs::read(m.path(".snap/s/f")).expect("read"), b"v1");
    assert_eq!(
        std::fs::read(m.path(".snapshots/mine")).expect("read"),
        b"mine"
    );
    m.unmount();
    m.mount("");
    assert_eq!(
        std::fs::read(m.path(".snapshots/mine")).expect("read"),
        b"mine",
        "the real directory yields to the snapshots"
    );
    assert!(!m.path(".snapshots/s").exists());
    m.unmount();
    // With the writeback cache, the kernel may hold written pages a mkdir could not send
    // first: refused (`idxfs snapshot MOUNT` sends them).
    m.mount("writeback,snapdir=.snap");
    let e = std::fs::create_dir(m.path(".snap/w")).expect_err("mkdir on a writeback mount");
    assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}");
    m.unmount();
    let (code, _, err) = idxfs(&["mount", "x", "y", "-o", "snapdir=.."]);
    assert_ne!(code, 0);
    assert!(err.contains("bad snapdir"), "{err}");
    m.assert_fsck_clean();
}

/// `cp` of a file out of a snapshot back into the file system, after the file system let
/// go of the file's blocks (held for the snapshot): one COPY_FILE_RANGE request that
/// shares them (`Fs::copy_from_snapshot`), no data through WRITE requests and no data
/// blocks taken; the copy holds the snapshot's bytes and stays whole after the snapshot's
/// delete.
#[test]
fn cp_out_of_a_snapshot_shares_its_blocks() {
    const SIZE: usize = (8 << 20) + 777;
    let mut m = Mounted::root_only("256M", "");
    let old: Vec<u8> = (0..SIZE).map(|i| (i / 4096) as u8 ^ (i as u8)).collect();
    std::fs::write(m.path("big"), &old).expect("write");
    let mp_s = m.mp.to_str().expect("utf8").to_string();
    let (code, out, err) = idxfs(&["snapshot", &mp_s, "s"]);
    assert_eq!(code, 0, "{out}{err}");
    std::fs::remove_file(m.path("big")).expect("unlink");
    m.unmount();
    m.counters = true;
    m.mount("");
    let used = || {
        let c = std::ffi::CString::new(m.mp.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: statvfs(3) into a zeroed struct, with a valid C string.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0, "statvfs");
        (s.f_blocks - s.f_bfree) * s.f_frsize
    };
    let before = used();
    let st = std::process::Command::new("cp")
        .arg(m.path(".snapshots/s/big"))
        .arg(m.path("restored"))
        .status()
        .expect("run cp");
    assert!(st.success(), "cp: {st}");
    let grew = used().saturating_sub(before);
    assert!(
        grew < 1 << 20,
        "an 8 MiB restore took {grew} bytes: not shared"
    );
    assert!(
        std::fs::read(m.path("restored")).expect("read") == old,
        "restored differs"
    );
    let err = m.unmount();
    assert!(Mounted::requests(&err, "copy_file_range") >= 1, "{err}");
    assert_eq!(
        Mounted::requests(&err, "write"),
        0,
        "data went through WRITE: {err}"
    );
    m.assert_fsck_clean();
    m.counters = false;
    m.mount("");
    let (code, out, err) = idxfs(&["snapshot", &mp_s, "--delete", "256"]);
    assert_eq!(code, 0, "{out}{err}");
    m.unmount();
    m.assert_fsck_clean();
    m.mount("");
    assert!(
        std::fs::read(m.path("restored")).expect("read") == old,
        "lost with the snapshot"
    );
    m.unmount();
}
