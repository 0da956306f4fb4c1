//! What changes drop through the library (`fs::privs`): capabilities on every write,
//! set-user-ID and set-group-ID as the caller's `Kill` says, on chown whoever asks. The
//! mount's side, against tmpfs, is `cli/tests/mount_privs.rs`.
mod common;
use common::*;
use idxfs_engine::fs::{Fs, Kill, SetAttr, WriteHow};
use idxfs_engine::Error;

const CAPS: &[u8] = b"security.capability";
const KILL: Kill = Kill {
    suidgid: true,
    outside_group: false,
};

fn file(fs: &Fs, name: &str, mode: u32) -> u64 {
    let a = fs.create(ROOT, name.as_bytes(), 0o644, ME).expect("create");
    fs.write(a.ino, 0, b"data").expect("write");
    let chmod = SetAttr {
        mode: Some(mode),
        ..Default::default()
    };
    fs.setattr(a.ino, &chmod).expect("chmod");
    a.ino
}

fn mode(fs: &Fs, ino: u64) -> u32 {
    fs.getattr(ino).expect("getattr").mode & 0o7777
}

fn write(fs: &Fs, ino: u64, kill: Kill) {
    let how = WriteHow { times: true, kill };
    fs.write_with(ino, 4, b"more", how).expect("write");
}

#[test]
fn writes_drop_capabilities_whoever_writes() {
    let (dev, fs) = mem_fs(64 << 20);
    let f = file(&fs, "f", 0o755);
    fs.setxattr(f, CAPS, &[1; 20], 0).expect("set caps");
    fs.setxattr(f, b"user.keep", b"v", 0)
        .expect("set user xattr");
    fs.write(f, 0, b"x").expect("write");
    assert!(matches!(fs.getxattr(f, CAPS), Err(Error::NoData)));
    assert_eq!(fs.getxattr(f, b"user.keep").expect("kept"), b"v");
    assert_eq!(fs.read(f, 0, 16).expect("read"), b"xata");
    assert_eq!(mode(&fs, f), 0o755);
    fs.close().expect("close");
    assert_clean(&dev);
}

#[test]
fn writes_and_truncates_drop_suid_and_sgid_as_told() {
    let (dev, fs) = mem_fs(64 << 20);
    let a = file(&fs, "a", 0o6755);
    write(&fs, a, Kill::default());
    assert_eq!(mode(&fs, a), 0o6755, "a caller with CAP_FSETID keeps both");
    write(&fs, a, KILL);
    assert_eq!(mode(&fs, a), 0o755);
    assert_eq!(fs.read(a, 0, 16).expect("read"), b"datamore");

    let b = file(&fs, "b", 0o6745);
    write(&fs, b, KILL);
    assert_eq!(
        mode(&fs, b),
        0o2745,
        "sgid without group execute stays in the group"
    );
    let outside = Kill {
        suidgid: true,
        outside_group: true,
    };
    write(&fs, b, outside);
    assert_eq!(mode(&fs, b), 0o745);

    let c = file(&fs, "c", 0o6775);
    let truncate = |kill| SetAttr {
        size: Some(1),
        kill,
        ..Default::default()
    };
    fs.setattr(c, &truncate(Kill::default())).expect("truncate");
    assert_eq!(mode(&fs, c), 0o6775);
    fs.setattr(c, &truncate(KILL)).expect("truncate");
    assert_eq!(mode(&fs, c), 0o775);
    // A kill flag without a size (the kernel sends none) changes nothing.
    let d = file(&fs, "d", 0o6775);
    let touch = SetAttr {
        kill: KILL,
        ..Default::default()
    };
    fs.setattr(d, &touch).expect("setattr");
    assert_eq!(mode(&fs, d), 0o6775);

    let e = file(&fs, "e", 0o6775);
    fs.fallocate_with(e, 0, 8192, 0, Kill::default())
        .expect("fallocate");
    assert_eq!(mode(&fs, e), 0o6775);
    fs.fallocate_with(e, 0, 16384, 0, KILL).expect("fallocate");
    assert_eq!(mode(&fs, e), 0o775);
    fs.close().expect("close");
    assert_clean(&dev);
}

#[test]
fn chown_drops_suid_and_sgid_of_files_not_directories() {
    let (dev, fs) = mem_fs(64 << 20);
    let f = file(&fs, "f", 0o6755);
    let chown = SetAttr {
        uid: Some(7),
        ..Default::default()
    };
    fs.setattr(f, &chown).expect("chown");
    assert_eq!(mode(&fs, f), 0o755);
    let g = file(&fs, "g", 0o2745);
    fs.setattr(g, &chown).expect("chown");
    assert_eq!(
        mode(&fs, g),
        0o2745,
        "no group execute: a locking mark, kept"
    );
    // A setattr that sets the mode too (a kernel that worked it out) gets that mode.
    let h = file(&fs, "h", 0o6755);
    let both = SetAttr {
        gid: Some(7),
        mode: Some(0o4755),
        ..Default::default()
    };
    fs.setattr(h, &both).expect("chown");
    assert_eq!(mode(&fs, h), 0o4755);
    let d = fs.mkdir(ROOT, b"d", 0o2775, ME).expect("mkdir").ino;
    fs.setattr(d, &chown).expect("chown");
    assert_eq!(
        mode(&fs, d),
        0o2775,
        "a directory's sgid is inheritance, kept"
    );
    fs.close().expect("close");
    assert_clean(&dev);
}
