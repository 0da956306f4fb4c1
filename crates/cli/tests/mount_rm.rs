//! `idxfs rm` through a mount: a tree the kernel has cached removed inside the server, then
//! gone for the kernel too (no stale entry), a file open inside still readable until closed,
//! the space back, fsck clean; an unprivileged caller refused by the server; bad input
//! answered in one line.
mod common;
use common::*;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;

fn used_bytes(p: &std::path::Path) -> u64 {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: statvfs(3) into a zeroed struct, with a valid C string.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0, "statvfs");
    (s.f_blocks - s.f_bfree) * s.f_frsize
}

#[test]
fn idxfs_rm_removes_a_tree_in_the_server_and_the_kernel_forgets_it() {
    let mut m = Mounted::new("256M", "");
    // Others may reach the mount (the unprivileged caller below).
    for p in [m.dir.path().to_path_buf(), m.path("")] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    std::fs::write(m.path("file"), b"a file").expect("write");
    let before = used_bytes(&m.mp);
    let held: Vec<u8> = (0..50_000u32).map(|i| (i % 253) as u8).collect();
    for d in 0..20 {
        let dir = m.path(&format!("tree/d{d}/sub"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        for f in 0..100 {
            std::fs::write(dir.join(format!("f{f}")), vec![d as u8; 8192]).expect("write");
        }
    }
    std::fs::write(m.path("tree/held"), &held).expect("write");
    // The kernel caches every entry and inode of the tree.
    let walked = std::process::Command::new("find")
        .arg(m.path("tree"))
        .output()
        .expect("find");
    assert!(walked.status.success());
    let mut open = std::fs::File::open(m.path("tree/held")).expect("open");
    let tree = m.path("tree").to_str().expect("utf8").to_string();

    // Not from another user: the server refuses it.
    let out = std::process::Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(bin())
        .args(["rm", &tree])
        .output()
        .expect("setpriv");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("only root or the mount's owner"), "{err}");
    assert!(m.path("tree/d3/sub/f7").exists());

    let (code, out, err) = idxfs(&["rm", &tree]);
    assert_eq!(code, 0, "rm: {out}{err}");
    assert!(
        out.contains("removed 2001 files and 41 directories"),
        "{out}"
    );
    // Gone for the kernel too, though it had all of it cached.
    assert!(!m.path("tree").exists());
    assert!(!m.path("tree/d3/sub/f7").exists());
    let names: Vec<_> = std::fs::read_dir(m.path(""))
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("file")]);
    // The open file reads whole until closed.
    let mut got = Vec::new();
    open.read_to_end(&mut got).expect("read the open file");
    assert_eq!(got, held);
    drop(open);

    // A file, as rm removes it; bad input in one line each.
    let file = m.path("file").to_str().expect("utf8").to_string();
    let (code, out, err) = idxfs(&["rm", &file]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("removed 1 files and 0 directories"), "{out}");
    let snapdir = m.path(".snapshots/x").to_str().expect("utf8").to_string();
    let elsewhere = std::env::temp_dir().join("x");
    for (arg, want) in [
        (tree.clone(), "no such file or directory"),
        (snapdir, "read-only"),
        (format!("{tree}/.."), "not a name to remove"),
        (
            format!("{}/.", m.path("").display()),
            "not a name to remove",
        ),
        (elsewhere.to_str().expect("utf8").to_string(), "not idxfs"),
    ] {
        let (code, out, err) = idxfs(&["rm", &arg]);
        assert_ne!(code, 0, "{arg}: {out}");
        assert_eq!(err.lines().count(), 1, "{arg}: {err}");
        assert!(err.contains(want), "{arg}: {err}");
    }
    m.unmount();
    m.assert_fsck_clean();
    m.mount("");
    let after = used_bytes(&m.mp);
    assert!(
        after <= before,
        "{after} bytes used after the removal, {before} before the tree"
    );
    m.unmount();
}
