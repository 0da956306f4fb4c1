//! What the command says when a mount cannot start: one line that names what is wrong and
//! what to do, for a missing or non-directory mount point, a dead mount left on the mount
//! point (its server killed), a missing image, and a failed `--create`, which must leave
//! nothing that trips the retry.
mod common;
use common::*;
use std::path::Path;

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8 path")
}

/// `idxfs ARGS` that must fail: its last stderr line (the foreground mount logs the error
/// once more before it), exit 1.
fn fails(args: &[&str]) -> String {
    let (code, out, err) = idxfs(args);
    assert_eq!(code, 1, "{args:?}: {out}{err}");
    assert!(!err.contains("panicked"), "{err}");
    let last = err.trim().lines().last().unwrap_or_default().to_string();
    assert!(last.starts_with("idxfs: "), "{err}");
    last
}

#[test]
fn a_mount_that_cannot_start_says_why_and_what_to_do() {
    let dir = shm_tempdir();
    let img = dir.path().join("fs.img");
    assert_eq!(idxfs(&["mkfs", s(&img), "--size", "64M"]).0, 0);
    let nope = dir.path().join("nope");
    let e = fails(&["mount", s(&img), s(&nope)]);
    assert!(
        e.contains("does not exist") && e.contains("mkdir -p"),
        "{e}"
    );
    let file = dir.path().join("file");
    std::fs::write(&file, b"").expect("write");
    let e = fails(&["mount", s(&img), s(&file)]);
    assert!(e.contains("is not a directory"), "{e}");
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).expect("mkdir");
    let missing = dir.path().join("missing.img");
    let e = fails(&["mount", s(&missing), s(&mp)]);
    assert!(
        e.contains("does not exist") && e.contains("--create"),
        "{e}"
    );

    // --create with a size too small: an error, no file, and the retry mounts.
    let made = dir.path().join("made.img");
    let e = fails(&["mount", s(&made), s(&mp), "--create", "--size", "100K"]);
    assert!(e.contains("too small"), "{e}");
    assert!(
        !made.exists(),
        "the failed --create left {}",
        made.display()
    );
    // Unmounted even when an assertion below fails.
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            if is_mounted(self.0) {
                force_unmount(self.0);
            }
        }
    }
    let _unmount = Unmount(&mp);
    let (code, out, err) = idxfs(&[
        "mount",
        s(&made),
        s(&mp),
        "--create",
        "--size",
        "64M",
        "--background",
    ]);
    assert_eq!(code, 0, "the retry: {out}{err}");
    assert!(is_mounted(&mp));
}

#[test]
fn a_dead_mount_on_the_mount_point_is_named_with_the_way_out() {
    let m = Mounted::new("64M", "");
    // SAFETY: kill(2) on the test's own child.
    unsafe { libc::kill(m.pid() as i32, libc::SIGKILL) };
    assert!(
        wait_for(10, || std::fs::metadata(&m.mp)
            .err()
            .and_then(|e| e.raw_os_error())
            == Some(libc::ENOTCONN)),
        "the killed server's mount did not go dead"
    );
    let e = fails(&["mount", s(&m.image), s(&m.mp)]);
    assert!(e.contains("server stopped") && e.contains("umount"), "{e}");
    // Dropping `m` clears the dead mount.
}
