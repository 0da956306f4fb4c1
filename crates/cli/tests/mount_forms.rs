//! The ways the system runs idxfs: mkfs.idxfs and fsck.idxfs (mkfs(8), fsck(8)),
//! `mount -t fuse.idxfs` and an fstab line (through mount.fuse3, which runs `idxfs` from PATH).
mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// A bin directory holding `idxfs`, `mkfs.idxfs` and `fsck.idxfs` as links to the built binary.
fn bin_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("tempdir");
    for name in ["idxfs", "mkfs.idxfs", "fsck.idxfs"] {
        std::os::unix::fs::symlink(bin(), d.path().join(name)).expect("symlink");
    }
    d
}

fn path_with(dir: &Path) -> std::ffi::OsString {
    let mut p = dir.as_os_str().to_os_string();
    if let Some(old) = std::env::var_os("PATH") {
        p.push(":");
        p.push(old);
    }
    p
}

fn run_in(path: &std::ffi::OsStr, prog: &str, args: &[&str]) -> (i32, String) {
    let out = Command::new(prog)
        .args(args)
        .env("PATH", path)
        .output()
        .unwrap_or_else(|e| panic!("run {prog}: {e}"));
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Waits until no idxfs server holds the image (it commits after the unmount returns).
fn wait_released(image: &Path) {
    let f = std::fs::File::open(image).expect("open image");
    use std::os::fd::AsRawFd;
    let free = wait_for(20, || {
        // SAFETY: flock on our own descriptor; released right away.
        let ok = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        if ok {
            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
        }
        ok
    });
    assert!(free, "the idxfs server did not exit after unmount");
}

#[test]
fn mkfs_fsck_names_mount_type_and_fstab() {
    let bins = bin_dir();
    let path = path_with(bins.path());
    let dir = shm_tempdir();
    let img = dir.path().join("x.img");
    let imgs = img.to_str().expect("utf8");
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).expect("mkdir");
    let mps = mp.to_str().expect("utf8");

    let (code, out) = run_in(&path, "mkfs.idxfs", &[imgs, "--size", "128M"]);
    assert_eq!(code, 0, "mkfs.idxfs: {out}");
    let (code, out) = run_in(&path, "fsck.idxfs", &["-n", imgs]);
    assert_eq!(code, 0, "fsck.idxfs on a clean image: {out}");
    let junk = dir.path().join("junk.img");
    std::fs::write(&junk, vec![0u8; 1 << 20]).expect("junk");
    let (code, out) = run_in(&path, "fsck.idxfs", &["-a", junk.to_str().expect("utf8")]);
    assert_eq!(code, 8, "fsck.idxfs on a foreign image: {out}");

    // mount -t fuse.idxfs IMAGE DIR: mount(8) -> mount.fuse3 -> `idxfs IMAGE DIR -o ...`,
    // with a PATH of its own (/usr/local/sbin first), where scripts/install puts idxfs.
    let _installed = Installed::new();
    let (code, out) = run_in(&path, "mount", &["-t", "fuse.idxfs", imgs, mps]);
    let guard = MountGuard(mp.clone());
    assert_eq!(code, 0, "mount -t fuse.idxfs: {out}");
    let line = mounts_line(&mp).expect("mounted");
    assert!(
        line.starts_with(&format!("{imgs} {mps} fuse.idxfs ")),
        "/proc/mounts: {line}"
    );
    std::fs::write(mp.join("hello"), b"via mount -t").expect("write");
    let (code, out) = run_in(&path, "umount", &[mps]);
    assert_eq!(code, 0, "umount: {out}");
    wait_released(&img);

    // An fstab line (util-linux mount reads an alternative fstab with -T).
    let fstab = dir.path().join("fstab");
    std::fs::write(
        &fstab,
        format!("# test fstab\n{imgs} {mps} fuse.idxfs defaults,noatime,nofail 0 0\n"),
    )
    .expect("fstab");
    let (code, out) = run_in(&path, "mount", &["-T", fstab.to_str().expect("utf8"), mps]);
    assert_eq!(code, 0, "mount via fstab: {out}");
    let line = mounts_line(&mp).expect("mounted from fstab");
    assert!(line.contains("noatime"), "options from fstab: {line}");
    assert_eq!(
        std::fs::read(mp.join("hello")).expect("read"),
        b"via mount -t"
    );

    // Remount, as mount(8) does it (mount.fuse3 runs `idxfs IMAGE DIR -o ...,remount,...`
    // with the options /proc/mounts lists, user_id= and group_id= among them): read-only,
    // then writable again, with the server and the kernel agreeing each time.
    let (code, out) = run_in(&path, "mount", &["-o", "remount,ro", mps]);
    assert_eq!(code, 0, "mount -o remount,ro: {out}");
    let line = mounts_line(&mp).expect("mounted");
    assert!(
        line.contains(" ro,"),
        "/proc/mounts after remount,ro: {line}"
    );
    let e = std::fs::write(mp.join("refused"), b"x").expect_err("read-only");
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    assert_eq!(
        std::fs::read(mp.join("hello")).expect("read"),
        b"via mount -t"
    );
    let (code, out) = run_in(&path, "mount", &["-o", "remount,rw,nodiratime", mps]);
    assert_eq!(code, 0, "mount -o remount,rw: {out}");
    let line = mounts_line(&mp).expect("mounted");
    assert!(
        line.contains(" rw,") && line.contains("nodiratime"),
        "{line}"
    );
    std::fs::write(mp.join("after-remount"), b"writable").expect("write after remount,rw");
    // A remount of something that is not an idxfs mount says so.
    let (code, out) = run_in(
        &path,
        "idxfs",
        &[imgs, dir.path().to_str().expect("utf8"), "-o", "remount,ro"],
    );
    assert_ne!(code, 0);
    assert!(out.contains("not an idxfs mount"), "{out}");
    let (code, out) = run_in(&path, "umount", &[mps]);
    assert_eq!(code, 0, "umount: {out}");
    wait_released(&img);
    drop(guard);
    let (code, out) = run_in(&path, "fsck.idxfs", &[imgs]);
    assert_eq!(code, 0, "fsck.idxfs after use: {out}");
    let (code, out) = run_in(&path, "idxfs", &["mount", imgs, mps, "--background"]);
    assert_eq!(code, 0, "idxfs mount --background: {out}");
    let _guard = MountGuard(mp.clone());
    assert!(
        std::fs::read_to_string(mp.join("after-remount")).expect("read") == "writable",
        "the write made after remount,rw was kept"
    );
    // A background server says where its messages go, and they name the image and the
    // mount point on every line.
    let log = format!("{imgs}.log");
    assert!(out.contains(&format!("messages go to {log}")), "{out}");
    let (code, out) = run_in(&path, "umount", &[mps]);
    assert_eq!(code, 0, "umount: {out}");
    wait_released(&img);
    let text = std::fs::read_to_string(&log).expect("log file beside the image");
    let place = format!("{imgs} on {mps}");
    for want in ["mounted", "remounted", "unmounted"] {
        assert!(
            text.lines().any(|l| l.contains(&place) && l.contains(want)),
            "no {want:?} line naming {place} in:\n{text}"
        );
    }
    assert!(text.lines().all(|l| l.contains(&place)), "{text}");
}

/// Unmounts on drop if a step failed with the mount up.
struct MountGuard(std::path::PathBuf);
impl Drop for MountGuard {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            force_unmount(&self.0);
        }
    }
}

/// `/usr/local/sbin/idxfs` linked to the binary under test for the test's duration, as
/// scripts/install links it. Refuses to touch an idxfs installed otherwise.
struct Installed(Option<std::path::PathBuf>);
impl Installed {
    fn new() -> Installed {
        let link = Path::new("/usr/local/sbin/idxfs");
        match std::fs::symlink_metadata(link) {
            Ok(m) if m.file_type().is_symlink() => {
                if std::fs::read_link(link).is_ok_and(|t| t == Path::new(bin())) {
                    return Installed(None); // already this build
                }
                panic!(
                    "{} links elsewhere; remove it to run this test",
                    link.display()
                );
            }
            Ok(_) => panic!(
                "{} is installed; remove it to run this test",
                link.display()
            ),
            Err(_) => {}
        }
        std::fs::create_dir_all("/usr/local/sbin").expect("mkdir /usr/local/sbin");
        std::os::unix::fs::symlink(bin(), link).expect("link /usr/local/sbin/idxfs");
        Installed(Some(link.to_path_buf()))
    }
}
impl Drop for Installed {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}
