//! Freed space goes back to the image file (`-o discard`, the default): after cycles of
//! creating and deleting files through a mount, the image occupies about what the file system
//! uses, while `-o nodiscard` keeps every block it ever used. Files kept throughout read back
//! whole, before and after a remount: no block still in use was discarded. `idxfs trim`
//! gives back what a `nodiscard` mount left, of the image or of the mount itself.
mod common;
use common::*;
use std::os::unix::fs::MetadataExt;

/// Bytes of the image file the host has allocated.
fn allocated(m: &Mounted) -> u64 {
    std::fs::metadata(&m.image).expect("stat image").blocks() * 512
}

/// Bytes the mounted file system reports in use.
fn used(m: &Mounted) -> u64 {
    let c = std::ffi::CString::new(m.mp.as_os_str().as_encoded_bytes()).expect("c path");
    // SAFETY: a statvfs buffer we own and a valid C path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    (st.f_blocks - st.f_bfree) * st.f_frsize
}

/// Creates and deletes 32 MiB of 16 KiB files `rounds` times beside kept files; returns the
/// kept files' contents.
fn churn(m: &Mounted, rounds: usize) -> Vec<(String, Vec<u8>)> {
    let kept: Vec<(String, Vec<u8>)> = (0..8)
        .map(|i| (format!("kept{i}"), vec![i as u8 + 1; 100_000 + i * 4096]))
        .collect();
    for (n, d) in &kept {
        std::fs::write(m.path(n), d).expect("write kept");
    }
    for r in 0..rounds {
        let dir = m.path(&format!("round{r}"));
        std::fs::create_dir(&dir).expect("mkdir");
        for i in 0..2048 {
            std::fs::write(dir.join(format!("f{i}")), vec![r as u8; 16 << 10]).expect("write");
        }
        std::fs::remove_dir_all(&dir).expect("rm -rf");
    }
    kept
}

fn check_kept(m: &Mounted, kept: &[(String, Vec<u8>)]) {
    for (n, d) in kept {
        assert!(
            std::fs::read(m.path(n)).expect("read kept") == *d,
            "{n} changed"
        );
    }
}

#[test]
fn an_image_gives_freed_space_back() {
    let mut m = Mounted::new("512M", "");
    let kept = churn(&m, 4);
    // The deletes are discarded after the commit that frees them (every 5 s).
    let bound = |m: &Mounted| used(m) + used(m) / 10 + (8 << 20);
    let settled = wait_for(20, || allocated(&m) <= bound(&m));
    assert!(
        settled,
        "mounted: the image holds {} bytes for {} used",
        allocated(&m),
        used(&m)
    );
    eprintln!(
        "after 4 rounds of 32 MiB: the image holds {} bytes for {} used",
        allocated(&m),
        used(&m)
    );
    check_kept(&m, &kept);
    m.unmount();
    m.assert_fsck_clean();
    m.mount("");
    check_kept(&m, &kept);
    let (a, u) = (allocated(&m), used(&m));
    assert!(
        a <= u + u / 10 + (8 << 20),
        "after a remount: {a} bytes for {u} used"
    );
    m.unmount();
}

#[test]
fn nodiscard_keeps_what_the_image_used_until_a_trim() {
    let mut m = Mounted::new("512M", "nodiscard");
    let kept = churn(&m, 2);
    let image = m.image.to_str().expect("utf8").to_string();
    let (code, _, err) = idxfs(&["trim", &image]);
    assert_eq!(code, 1, "trim of a mounted image: {err}");
    assert!(err.contains("trim the mount point"), "{err}");
    let used_mounted = used(&m);
    m.unmount();
    // The 32 MiB written and deleted stay allocated in the image file.
    let a = std::fs::metadata(&m.image).expect("stat").blocks() * 512;
    assert!(
        a >= 32 << 20,
        "nodiscard gave space back: {a} bytes allocated"
    );
    // A trim gives it back.
    let (code, out, err) = idxfs(&["trim", &image]);
    assert_eq!(code, 0, "{out}{err}");
    let a = std::fs::metadata(&m.image).expect("stat").blocks() * 512;
    assert!(
        a <= used_mounted + used_mounted / 10 + (8 << 20),
        "after a trim the image holds {a} bytes for {used_mounted} used: {out}"
    );
    m.assert_fsck_clean();
    m.mount("nodiscard");
    check_kept(&m, &kept);
    m.unmount();
    m.assert_fsck_clean();
}

#[test]
fn trim_of_a_mount_gives_space_back_while_mounted() {
    let m = Mounted::new("512M", "nodiscard");
    let kept = churn(&m, 2);
    let before = allocated(&m);
    assert!(
        before >= 32 << 20,
        "nodiscard gave space back: {before} bytes allocated"
    );
    let sub = m.path("kept");
    std::fs::create_dir_all(&sub).expect("mkdir");
    let (code, out, err) = idxfs(&["trim", sub.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("free blocks discarded"), "{out}");
    let (after, used) = (allocated(&m), used(&m));
    assert!(
        after <= used + used / 10 + (8 << 20),
        "after a trim of the mount the image holds {after} bytes for {used} used: {out}"
    );
    check_kept(&m, &kept);
    // Not idxfs: a one-line refusal.
    let (code, _, err) = idxfs(&["trim", "/proc"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not idxfs"), "{err}");
    let mut m = m;
    m.unmount();
    m.assert_fsck_clean();
    m.mount("nodiscard");
    check_kept(&m, &kept);
    m.unmount();
    m.assert_fsck_clean();
}
