//! File handles (FUSE_EXPORT_SUPPORT): `name_to_handle_at` / `open_by_handle_at` go on
//! working after the kernel dropped its inodes and after a remount, which is what an NFS
//! re-export of a mount needs; the handle of a deleted file is stale (ESTALE).
mod common;
use common::*;
use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Bytes of a handle's body the kernel may fill (MAX_HANDLE_SZ).
const HANDLE_MAX: usize = 128;
/// Where the body starts: after `handle_bytes` and `handle_type`.
const HEAD: usize = 8;

fn handle_of(p: &Path) -> Vec<u8> {
    let path = CString::new(p.as_os_str().as_bytes()).expect("no NUL");
    let mut buf = vec![0u8; HEAD + HANDLE_MAX];
    buf[..4].copy_from_slice(&(HANDLE_MAX as u32).to_ne_bytes());
    let mut mount_id = 0;
    // SAFETY: `buf` is a `struct file_handle` with room for HANDLE_MAX bytes of body, as
    // its first field says.
    let r = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            path.as_ptr(),
            buf.as_mut_ptr().cast(),
            &mut mount_id,
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "name_to_handle_at {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    buf
}

/// Opens the file `handle` names on the file system mounted at `mp`.
fn open_by_handle(mp: &Path, handle: &[u8], flags: i32) -> std::io::Result<File> {
    let mount = File::open(mp)?;
    let mut h = handle.to_vec();
    // SAFETY: `h` is a handle name_to_handle_at filled; the kernel reads only its length.
    let fd = unsafe { libc::open_by_handle_at(mount.as_raw_fd(), h.as_mut_ptr().cast(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor, owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn read_all(mut f: File) -> Vec<u8> {
    let mut v = Vec::new();
    f.read_to_end(&mut v).expect("read");
    v
}

fn drop_caches() {
    std::fs::write("/proc/sys/vm/drop_caches", "2").expect("drop caches (needs root)");
}

#[test]
fn handles_survive_dropped_caches_and_a_remount() {
    let mut m = Mounted::root_only("64M", "");
    std::fs::create_dir(m.path("d")).expect("mkdir");
    std::fs::write(m.path("d/f"), b"hello").expect("write");
    std::fs::write(m.path("gone"), b"bye").expect("write");
    let (f, d, gone) = (
        handle_of(&m.path("d/f")),
        handle_of(&m.path("d")),
        handle_of(&m.path("gone")),
    );
    let (f_ino, d_ino) = (
        std::fs::metadata(m.path("d/f")).expect("stat").ino(),
        std::fs::metadata(m.path("d")).expect("stat").ino(),
    );
    std::fs::remove_file(m.path("gone")).expect("rm");
    for round in ["after dropped caches", "after a remount"] {
        if round == "after a remount" {
            m.unmount();
            m.mount("");
        } else {
            drop_caches();
        }
        let file = open_by_handle(&m.mp, &f, libc::O_RDONLY).expect(round);
        assert_eq!(file.metadata().expect("fstat").ino(), f_ino, "{round}");
        assert_eq!(read_all(file), b"hello", "{round}");
        // A directory's handle: the kernel connects it to the tree by looking up "..".
        let dir = open_by_handle(&m.mp, &d, libc::O_RDONLY | libc::O_DIRECTORY).expect(round);
        assert_eq!(dir.metadata().expect("fstat").ino(), d_ino, "{round}");
        let names: Vec<_> = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))
            .expect("list through the handle")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["f"], "{round}");
        let parent =
            std::fs::metadata(format!("/proc/self/fd/{}/..", dir.as_raw_fd())).expect("stat ..");
        assert_eq!(parent.ino(), 1, "{round}: the parent is the root");
        let e = open_by_handle(&m.mp, &gone, libc::O_RDONLY).expect_err("a deleted file");
        assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{round}: {e}");
    }
    m.unmount();
    m.assert_fsck_clean();
}

/// A handle of a file in a snapshot shown inside the mount (`.snapshots/NAME`) opens it
/// after the kernel dropped its inodes; after a remount, where the snapshot's inode numbers
/// may name another snapshot, it is stale, never the other snapshot's file.
#[test]
fn a_snapshot_file_handle_opens_that_snapshot_or_none() {
    let mut m = Mounted::root_only("64M", "");
    let mp = m.mp.to_str().expect("utf8").to_string();
    std::fs::write(m.path("f"), b"first").expect("write");
    let (code, out, err) = idxfs(&["snapshot", &mp, "a"]);
    assert_eq!(code, 0, "{out}{err}");
    std::fs::write(m.path("f"), b"second").expect("write");
    let (code, out, err) = idxfs(&["snapshot", &mp, "b"]);
    assert_eq!(code, 0, "{out}{err}");
    let h = handle_of(&m.path(".snapshots/a/f"));
    drop_caches();
    assert_eq!(
        read_all(open_by_handle(&m.mp, &h, libc::O_RDONLY).expect("open by handle")),
        b"first"
    );
    m.unmount();
    m.mount("");
    // Snapshot b is shown first in this mount: it gets the numbers a had.
    assert_eq!(
        std::fs::read(m.path(".snapshots/b/f")).expect("read"),
        b"second"
    );
    let e = open_by_handle(&m.mp, &h, libc::O_RDONLY).expect_err("another snapshot's file");
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    m.unmount();
}
