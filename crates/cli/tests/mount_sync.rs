//! `-o sync` and `-o dirsync`: the kernel passes the flags on but does not make FUSE requests
//! synchronous (it only fsyncs after writes), so idxfs does. Regression: both were accepted and
//! nothing acted on them. Each test kills the server with SIGKILL (no commit, no unmount) right
//! after the calls returned, mounts again, and finds everything they did.
mod common;
use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;

#[test]
fn sync_makes_every_change_durable_on_return() {
    let mut m = Mounted::new("256M", "sync");
    fs::create_dir(m.path("d")).expect("mkdir");
    fs::write(m.path("d/f"), b"written under sync").expect("write");
    let mut data = vec![0u8; 300_000];
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i * 7) as u8;
    }
    fs::write(m.path("big"), &data).expect("write big");
    fs::set_permissions(m.path("d/f"), fs::Permissions::from_mode(0o600)).expect("chmod");
    setxattr(&m.path("d/f"), "user.kept", b"value");
    fs::rename(m.path("big"), m.path("d/big")).expect("rename");
    m.kill();
    m.mount("");
    assert_eq!(
        fs::read(m.path("d/f")).expect("read"),
        b"written under sync"
    );
    assert_eq!(fs::read(m.path("d/big")).expect("read"), data);
    let mode = fs::metadata(m.path("d/f"))
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let c = std::ffi::CString::new(m.path("d/f").as_os_str().as_encoded_bytes()).expect("c");
    let mut buf = [0u8; 16];
    // SAFETY: valid C strings and a buffer of the given length.
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            c"user.kept".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert_eq!(&buf[..n.max(0) as usize], b"value");
    m.unmount();
    m.assert_fsck_clean();
}

#[test]
fn dirsync_makes_directory_changes_durable_on_return() {
    let mut m = Mounted::new("256M", "dirsync");
    fs::create_dir(m.path("d")).expect("mkdir");
    fs::write(m.path("d/a"), b"").expect("create");
    fs::write(m.path("d/b"), b"").expect("create");
    fs::hard_link(m.path("d/a"), m.path("a-link")).expect("link");
    std::os::unix::fs::symlink("d/a", m.path("sym")).expect("symlink");
    fs::rename(m.path("d/b"), m.path("b-moved")).expect("rename");
    fs::create_dir(m.path("gone")).expect("mkdir");
    fs::remove_dir(m.path("gone")).expect("rmdir");
    m.kill();
    m.mount("");
    for p in ["d", "d/a", "a-link", "sym", "b-moved"] {
        assert!(
            fs::symlink_metadata(m.path(p)).is_ok(),
            "{p} was made durable"
        );
    }
    assert!(fs::metadata(m.path("d/b")).is_err() && fs::metadata(m.path("gone")).is_err());
    assert_eq!(fs::metadata(m.path("a-link")).expect("stat").len(), 0);
    m.unmount();
    m.assert_fsck_clean();
}

/// `sync` and `sync -f` never reach a FUSE server (the kernel sends FUSE_SYNCFS to virtiofs
/// only), so `idxfs sync PATH` is what makes a default mount's changes durable: one fsync,
/// and idxfs's fsync covers every change on the mount. The server is killed right after it
/// returns; everything written anywhere before it is there after a remount.
#[test]
fn idxfs_sync_makes_every_change_on_the_mount_durable() {
    let mut m = Mounted::new("256M", "");
    fs::create_dir_all(m.path("a/b")).expect("mkdir");
    let files: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| {
            let p = if i % 2 == 0 {
                format!("a/f{i}")
            } else {
                format!("a/b/g{i}")
            };
            (p, vec![i as u8; 1000 * i])
        })
        .collect();
    for (p, data) in &files {
        fs::write(m.path(p), data).expect("write");
    }
    fs::rename(m.path("a/f0"), m.path("moved")).expect("rename");
    // From a path deep in the mount: the whole mount is made durable.
    let (code, out, err) = idxfs(&["sync", m.path("a/b").to_str().expect("utf8")]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("every change is durable"), "{out}");
    m.kill();
    m.mount("");
    assert_eq!(fs::read(m.path("moved")).expect("moved"), files[0].1);
    for (p, data) in &files[1..] {
        assert_eq!(fs::read(m.path(p)).expect(p), *data, "{p}");
    }
    // Off idxfs: one line that says so, exit 1.
    let (code, _, err) = idxfs(&["sync", "/proc"]);
    assert_eq!(code, 1);
    assert!(err.contains("not idxfs"), "{err}");
    m.unmount();
    m.assert_fsck_clean();
}
