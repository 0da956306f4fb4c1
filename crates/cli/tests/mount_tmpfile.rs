//! O_TMPFILE through a mount (FUSE_TMPFILE): a file without a name, given one by
//! `linkat(AT_EMPTY_PATH)` or gone when closed; with O_EXCL it can never be named; a crash
//! before the link frees it at the next mount, even after an fsync wrote it to the log.
mod common;
use common::*;
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL")
}

fn tmpfile(dir: &Path, extra: i32) -> File {
    // SAFETY: a valid path; the new descriptor is owned by the File.
    let fd = unsafe {
        libc::open(
            c(dir).as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | extra,
            0o640,
        )
    };
    assert!(
        fd >= 0,
        "O_TMPFILE in {}: {}",
        dir.display(),
        std::io::Error::last_os_error()
    );
    // SAFETY: as above.
    unsafe { File::from_raw_fd(fd) }
}

/// linkat(fd, "", AT_FDCWD, to, AT_EMPTY_PATH).
fn link_fd(f: &File, to: &Path) -> std::io::Result<()> {
    let empty = CString::new("").expect("empty");
    // SAFETY: valid descriptor and C strings.
    let r = unsafe {
        libc::linkat(
            f.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            c(to).as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The inode count fsck reports for the (unmounted) image.
fn fsck_inodes(m: &Mounted) -> u64 {
    let (code, out, err) = idxfs(&["fsck", m.image.to_str().expect("utf8")]);
    assert_eq!(code, 0, "fsck: {out}{err}");
    out.split(", ")
        .find_map(|p| p.strip_suffix(" inodes"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no inode count in: {out}"))
}

#[test]
fn tmpfiles_are_named_by_linkat_or_gone() {
    let mut m = Mounted::root_only("64M", "");
    // Named: its bytes and mode stay.
    let mut a = tmpfile(&m.mp, 0);
    a.write_all(b"keep me").expect("write");
    let st = a.metadata().expect("fstat");
    assert_eq!((st.nlink(), st.mode() & 0o7777), (0, 0o640));
    assert!(names(&m.mp).is_empty(), "no name before the link");
    link_fd(&a, &m.path("kept")).expect("linkat");
    assert_eq!(a.metadata().expect("fstat").nlink(), 1);
    drop(a);
    // Closed without a name: gone.
    let mut b = tmpfile(&m.mp, 0);
    b.write_all(&vec![7u8; 1 << 20]).expect("write");
    drop(b);
    // O_EXCL: never linkable (the kernel refuses with ENOENT).
    let x = tmpfile(&m.mp, libc::O_EXCL);
    let e = link_fd(&x, &m.path("excl")).expect_err("O_EXCL tmpfile linked");
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    drop(x);
    // A name that exists already: EEXIST, and the file stays linkable.
    let y = tmpfile(&m.mp, 0);
    let e = link_fd(&y, &m.path("kept")).expect_err("over an existing name");
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST), "{e}");
    link_fd(&y, &m.path("second")).expect("linkat");
    drop(y);
    assert_eq!(names(&m.mp), ["kept", "second"]);
    let mut s = String::new();
    File::open(m.path("kept"))
        .expect("open")
        .read_to_string(&mut s)
        .expect("read");
    assert_eq!(s, "keep me");
    m.unmount();
    assert_eq!(
        fsck_inodes(&m),
        3,
        "the root, kept and second; the rest freed"
    );
}

#[test]
fn a_crash_before_linkat_frees_the_file() {
    let mut m = Mounted::root_only("64M", "");
    // Durable through the fsync log, without a name, then the daemon dies.
    let mut t = tmpfile(&m.mp, 0);
    t.write_all(&vec![3u8; 2 << 20]).expect("write");
    t.sync_all().expect("fsync");
    // And one that did get its name before the crash.
    let mut k = tmpfile(&m.mp, 0);
    k.write_all(b"named in time").expect("write");
    link_fd(&k, &m.path("named")).expect("linkat");
    k.sync_all().expect("fsync");
    m.kill();
    drop((t, k));
    m.mount("");
    assert_eq!(names(&m.mp), ["named"]);
    let mut s = String::new();
    File::open(m.path("named"))
        .expect("open")
        .read_to_string(&mut s)
        .expect("read");
    assert_eq!(s, "named in time");
    m.unmount();
    assert_eq!(
        fsck_inodes(&m),
        2,
        "the root and named; the nameless file freed"
    );
}
