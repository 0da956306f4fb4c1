//! The `idxfs` command end to end: mkfs, a library workload, fsck and dump on the same image.
use idxfs_blockdev::FileDevice;
use idxfs_engine::fs::Owner;
use idxfs_engine::{Fs, OpenOptions};
use std::process::Command;
use std::sync::Arc;

fn idxfs(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_idxfs"))
        .args(args)
        .output()
        .expect("run idxfs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn mkfs_workload_fsck_dump_million_files() {
    let dir = tempfile::tempdir_in(if std::path::Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    })
    .expect("tempdir");
    let img = dir.path().join("t.img");
    let p = img.to_str().expect("utf8 path");
    let (code, out, err) = idxfs(&["mkfs", p, "--size", "1G"]);
    assert_eq!(code, 0, "mkfs: {out}{err}");
    {
        let dev = Arc::new(FileDevice::open(&img, true).expect("open image"));
        let fs = Fs::open(
            dev,
            OpenOptions {
                commit_interval: None,
                ..OpenOptions::default()
            },
        )
        .expect("open fs");
        let d = fs.mkdir(1, b"big", 0o755, Owner::default()).expect("mkdir");
        for i in 0..1_000_000u32 {
            fs.create(
                d.ino,
                format!("file_{i}").as_bytes(),
                0o644,
                Owner::default(),
            )
            .expect("create");
        }
        let n = fs.list(d.ino).expect("list").len();
        assert_eq!(n, 1_000_000);
        fs.close().expect("close");
    }
    let (code, out, err) = idxfs(&["fsck", p]);
    assert_eq!(code, 0, "fsck: {out}{err}");
    assert!(out.contains("clean"), "{out}");
    let (code, out, _) = idxfs(&["dump", p, "fs", "--stats"]);
    assert_eq!(code, 0);
    let fill: f64 = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("fs leaf fill: "))
        .and_then(|v| v.trim_end_matches('%').parse().ok())
        .expect("dump prints the leaf fill");
    eprintln!("leaf fill after 1M creates: {fill}%");
    assert!(
        fill >= 90.0,
        "leaf fill {fill}% after 1M sequential-inode creates"
    );
}

#[test]
fn fsck_exit_codes_and_messages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("c.img");
    let p = img.to_str().expect("utf8 path");
    assert_eq!(idxfs(&["mkfs", p, "--size", "64M"]).0, 0);
    // Damage a node that is in use: the fs tree root.
    let sb = idxfs_engine::fs::read_superblock(&FileDevice::open(&img, false).expect("open"))
        .expect("sb");
    let root = sb.fs_root.block.get();
    let mut bytes = std::fs::read(&img).expect("read");
    bytes[(root * 4096 + 200) as usize] ^= 1;
    std::fs::write(&img, &bytes).expect("write");
    let (code, out, _) = idxfs(&["fsck", p]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("problem: ") && l.contains("checksum")),
        "{out}"
    );
    // Not an idxfs image at all: one line, exit 2.
    let other = dir.path().join("other");
    std::fs::write(&other, vec![0u8; 1 << 20]).expect("write");
    let (code, _, err) = idxfs(&["fsck", other.to_str().expect("utf8")]);
    assert_eq!(code, 2);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("not an idxfs image"), "{err}");
    // Bad arguments: a clear one-line error, no panic.
    let (code, _, err) = idxfs(&["mkfs", p, "--size", "12Q"]);
    assert_ne!(code, 0);
    assert!(!err.contains("panicked"), "{err}");
    let (code, _, err) = idxfs(&[
        "mkfs",
        dir.path().join("tiny").to_str().expect("utf8"),
        "--size",
        "64K",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("too small"), "{err}");
    let (code, _, err) = idxfs(&["dump", "/nonexistent/image"]);
    assert_eq!(code, 1);
    assert!(err.starts_with("idxfs: "), "{err}");
}
