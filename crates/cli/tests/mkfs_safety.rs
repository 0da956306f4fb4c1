//! `idxfs mkfs` formats only what holds nothing to lose unless told `--force`, and never a
//! target in use: checked against images the kernel's own mkfs tools made, an idxfs image
//! with files, a file of data, a mounted image, a file attached to a loop device and a
//! mounted block device. Every refusal is one line, exit 1, and leaves the target as it was.
mod common;
use common::*;
use idxfs_blockdev::FileDevice;
use idxfs_engine::{Fs, OpenOptions};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

/// Runs `idxfs mkfs ARGS`: (exit code, the one line of stderr).
fn mkfs(args: &[&str]) -> (i32, String) {
    let mut all = vec!["mkfs"];
    all.extend_from_slice(args);
    let (code, _, err) = idxfs(&all);
    assert!(!err.contains("panicked"), "{err}");
    if code != 0 {
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    (code, err.trim().to_string())
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8 path")
}

fn sh(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().expect(cmd);
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A file of `bytes` zeros.
fn zeros(p: &Path, bytes: u64) {
    std::fs::File::create(p)
        .and_then(|f| f.set_len(bytes))
        .expect("image file");
}

/// The files in the root of the idxfs image at `p`.
fn names(p: &Path) -> Vec<Vec<u8>> {
    let dev = Arc::new(FileDevice::open(p, false).expect("open"));
    let fs = Fs::open(
        dev,
        OpenOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .expect("an idxfs image");
    let mut v: Vec<Vec<u8>> = fs
        .list(idxfs_format::ROOT_INO)
        .expect("list")
        .into_iter()
        .map(|e| e.name)
        .collect();
    v.sort();
    fs.close().expect("close");
    v
}

#[test]
fn mkfs_refuses_file_systems_and_data_unless_forced() {
    let dir = shm_tempdir();
    // An idxfs image with files: refused, and still has them; forced: empty.
    let img = dir.path().join("idxfs.img");
    assert_eq!(mkfs(&[s(&img), "--size", "64M"]).0, 0);
    {
        let dev = Arc::new(FileDevice::open(&img, true).expect("open"));
        let fs = Fs::open(dev, OpenOptions::default()).expect("open");
        for i in 0..3 {
            fs.create(
                idxfs_format::ROOT_INO,
                format!("f{i}").as_bytes(),
                0o644,
                Default::default(),
            )
            .expect("create");
        }
        fs.close().expect("close");
    }
    let (code, err) = mkfs(&[s(&img)]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("holds an idxfs file system with 4 inodes"),
        "{err}"
    );
    assert!(err.contains("--force"), "{err}");
    let (code, err) = mkfs(&[s(&img), "--size", "128M"]);
    assert_eq!(code, 1, "with --size too: {err}");
    assert_eq!(names(&img).len(), 3, "a refused mkfs changed the image");
    assert_eq!(mkfs(&[s(&img), "--force"]).0, 0);
    assert!(names(&img).is_empty(), "--force formats");

    // The kernel's file systems, as their own tools make them.
    for (tool, args, what, mb) in [
        (
            "mkfs.ext4",
            &["-q", "-F"][..],
            "an ext2/3/4 file system",
            64,
        ),
        ("mkfs.xfs", &["-q", "-f"][..], "an XFS file system", 300),
        ("mkfs.btrfs", &["-q", "-f"][..], "a btrfs file system", 200),
    ] {
        let p = dir.path().join(format!("{tool}.img"));
        zeros(&p, mb << 20);
        let mut a = args.to_vec();
        a.push(s(&p));
        sh(tool, &a);
        let before = std::fs::read(&p).expect("read");
        let (code, err) = mkfs(&[s(&p)]);
        assert_eq!(code, 1, "{tool}: {err}");
        assert!(err.contains(&format!("holds {what};")), "{err}");
        assert!(
            std::fs::read(&p).expect("read") == before,
            "{tool}: a refused mkfs wrote"
        );
        assert_eq!(mkfs(&[s(&p), "--force"]).0, 0, "{tool} --force");
        assert!(names(&p).is_empty());
        std::fs::remove_file(&p).expect("rm");
    }

    // A file of someone's data, no file system in it.
    let data = dir.path().join("notes.db");
    let bytes: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&data, &bytes).expect("write");
    let (code, err) = mkfs(&[s(&data)]);
    assert_eq!(code, 1);
    assert!(err.contains("holds data"), "{err}");
    assert!(
        std::fs::read(&data).expect("read") == bytes,
        "the data changed"
    );

    // An all-zero file is what a new image is: formatted without asking.
    let z = dir.path().join("zero.img");
    zeros(&z, 64 << 20);
    assert_eq!(mkfs(&[s(&z)]).0, 0);
}

#[test]
fn mkfs_never_shrinks_an_image_unforced_and_a_failed_create_leaves_nothing() {
    let dir = shm_tempdir();
    let z = dir.path().join("zero.img");
    zeros(&z, 64 << 20);
    let (code, err) = mkfs(&[s(&z), "--size", "32M"]);
    assert_eq!(code, 1);
    assert!(err.contains("would cut it"), "{err}");
    assert_eq!(std::fs::metadata(&z).expect("stat").len(), 64 << 20);
    assert_eq!(mkfs(&[s(&z), "--size", "32M", "--force"]).0, 0);
    assert_eq!(std::fs::metadata(&z).expect("stat").len(), 32 << 20);

    // Too small: an error, and no file left to trip the retry.
    let t = dir.path().join("tiny.img");
    let (code, err) = mkfs(&[s(&t), "--size", "100K"]);
    assert_eq!(code, 1);
    assert!(err.contains("too small"), "{err}");
    assert!(!t.exists(), "a failed mkfs left {}", t.display());
    assert_eq!(mkfs(&[s(&t), "--size", "64M"]).0, 0, "the retry");
    // A bad node size on a new file: the same.
    let n = dir.path().join("node.img");
    let (code, _) = mkfs(&[s(&n), "--node-size", "5000"]);
    assert_eq!(code, 1);
    assert!(!n.exists());
}

#[test]
fn mkfs_never_formats_a_target_in_use_even_forced() {
    // An idxfs image being served.
    let m = Mounted::new("64M", "");
    std::fs::write(m.mp.join("kept"), b"bytes").expect("write");
    let (code, err) = mkfs(&[s(&m.image), "--force"]);
    assert_eq!(code, 1);
    assert!(err.contains("in use by an idxfs server"), "{err}");
    assert!(err.contains("unmount"), "{err}");
    assert_eq!(std::fs::read(m.mp.join("kept")).expect("read"), b"bytes");
    drop(m);

    // A file attached to a loop device, and that device mounted by the kernel.
    let dir = shm_tempdir();
    let img = dir.path().join("ext4.img");
    zeros(&img, 64 << 20);
    sh("mkfs.ext4", &["-q", "-F", s(&img)]);
    let lo = Loop::new(&img);
    let (code, err) = mkfs(&[s(&img), "--force"]);
    assert_eq!(code, 1);
    assert!(err.contains(&format!("attached to {}", lo.0)), "{err}");
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).expect("mkdir");
    sh("mount", &[&lo.0, s(&mp)]);
    let km = KernelMount(mp.clone());
    std::fs::write(mp.join("kept"), b"bytes").expect("write");
    let (code, err) = mkfs(&[&lo.0, "--force"]);
    assert_eq!(code, 1);
    assert!(err.contains("in use (mounted"), "{err}");
    assert_eq!(std::fs::read(mp.join("kept")).expect("read"), b"bytes");
    drop(km);
    // Unmounted, the device still holds ext4: refused unforced, formatted forced.
    let (code, err) = mkfs(&[&lo.0]);
    assert_eq!(code, 1);
    assert!(err.contains("holds an ext2/3/4 file system"), "{err}");
    assert_eq!(mkfs(&[&lo.0, "--force"]).0, 0);
    drop(lo);
    assert!(names(&img).is_empty());
}
