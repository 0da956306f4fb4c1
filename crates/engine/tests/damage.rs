//! Damaged metadata met at run time (`fs::damage`, `-o errors=`): the operation that meets it
//! gets EIO, the superblock records it, and with errors=remount-ro (the default) later changes
//! are refused while what was done before is kept; errors=continue goes on; a read-only mount
//! records nothing.
mod common;
use common::*;
use idxfs_blockdev::{BlockDevice, MemDevice};
use idxfs_engine::fs::{read_superblock, OnDamage};
use idxfs_engine::{fsck, Error, Fs, OpenOptions};
use idxfs_format::node::{KEY_PTR_SIZE, NODE_HEADER_SIZE};
use idxfs_format::Key;
use std::sync::Arc;

const NS: usize = 4096;
const FILES: usize = 400;

/// An image with directory "a" (FILES files) and directory "b" (a few), whose fs tree root is
/// one level over its leaves, and the block of a leaf that holds only items of "a".
fn image() -> (Vec<u8>, u64, u64, u64) {
    let (dev, fs) = mem_fs_with(16 << 20, NS as u32);
    let a = fs.mkdir(ROOT, b"a", 0o755, ME).expect("mkdir a").ino;
    let b = fs.mkdir(ROOT, b"b", 0o755, ME).expect("mkdir b").ino;
    for i in 0..FILES {
        fs.create(a, format!("file{i}").as_bytes(), 0o644, ME)
            .expect("create");
    }
    for i in 0..3 {
        let f = fs.create(b, format!("keep{i}").as_bytes(), 0o644, ME);
        fs.write(f.expect("create").ino, 0, b"kept").expect("write");
    }
    fs.close().expect("close");
    assert_clean(&dev);
    let img = dev.snapshot();
    let sb = read_superblock(dev.as_ref()).expect("sb");
    assert_eq!(
        sb.fs_root.level.get(),
        1,
        "the test reads the root's children"
    );
    let root = sb.fs_root.block.get() as usize * 4096;
    let n = u16::from_le_bytes([img[root + 50], img[root + 51]]) as usize;
    let key = |i: usize| {
        let at = root + NODE_HEADER_SIZE + i * KEY_PTR_SIZE;
        Key::decode(img[at..at + 17].try_into().expect("key"))
    };
    let child = |i: usize| {
        let at = root + NODE_HEADER_SIZE + i * KEY_PTR_SIZE + 17;
        u64::from_le_bytes(img[at..at + 8].try_into().expect("8 bytes"))
    };
    let i = (0..n - 1)
        .find(|&i| key(i).objectid == a && key(i + 1).objectid == a)
        .expect("a leaf of a's items alone");
    let leaf = child(i);
    (img, leaf, a, b)
}

fn damaged() -> (Arc<MemDevice>, u64, u64) {
    let (mut img, leaf, a, b) = image();
    img[leaf as usize * 4096 + 200] ^= 0x40;
    (Arc::new(MemDevice::from_bytes(img)), a, b)
}

/// Looks up every file of "a": the ones in the damaged leaf give EIO.
fn meet_damage(fs: &Fs, a: u64) {
    let mut eio = 0;
    for i in 0..FILES {
        match fs.lookup(a, format!("file{i}").as_bytes()) {
            Ok(_) => {}
            Err(Error::Corrupt(_)) => eio += 1,
            Err(e) => panic!("lookup gave {e}, not the damage"),
        }
    }
    assert!(eio > 0, "no lookup met the damaged leaf");
}

fn with(on_damage: OnDamage) -> OpenOptions {
    OpenOptions {
        on_damage,
        ..opts()
    }
}

#[test]
fn errors_remount_ro_records_the_damage_refuses_changes_and_keeps_what_was_done() {
    let (dev, a, b) = damaged();
    let fs = Fs::open(dev.clone(), with(OnDamage::ReadOnly)).expect("open");
    let before = fs.create(b, b"before", 0o644, ME).expect("create before");
    fs.write(before.ino, 0, b"written before the damage")
        .expect("write");
    assert!(fs.damage().is_none());
    meet_damage(&fs, a);
    let (what, refusing) = fs.damage().expect("damage noted");
    assert!(refusing, "errors=remount-ro refuses changes: {what}");
    assert!(matches!(
        fs.create(b, b"after", 0o644, ME),
        Err(Error::ReadOnly)
    ));
    assert!(matches!(
        fs.write(before.ino, 0, b"x"),
        Err(Error::ReadOnly)
    ));
    assert!(matches!(fs.unlink(b, b"keep0"), Err(Error::ReadOnly)));
    // Reads of what is intact go on, and what was done before is made durable.
    assert_eq!(
        fs.read(before.ino, 0, 100).expect("read"),
        b"written before the damage"
    );
    fs.fsync(before.ino).expect("fsync of what was done before");
    assert!(
        fs.reconfigure(false, Default::default(), Default::default())
            .is_err(),
        "a remount read-write must wait for a repair"
    );
    fs.close().expect("close commits what was done before");

    let sb = read_superblock(dev.as_ref()).expect("sb");
    assert!(sb.errors.get() >= 1, "the damage is recorded");
    assert_ne!(sb.first_error_time.get(), 0);
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    let f = fs
        .lookup(b, b"before")
        .expect("the file made before the damage");
    assert_eq!(
        fs.read(f.ino, 0, 100).expect("read"),
        b"written before the damage"
    );
    assert!(matches!(fs.lookup(b, b"after"), Err(Error::NotFound)));
    drop(fs);
    let dyn_dev: Arc<dyn BlockDevice> = dev.clone();
    let r = fsck::check(&dyn_dev, idxfs_format::hash::name_hash, &mut |_| {}).expect("fsck");
    assert!(
        r.problems.iter().any(|p| p.contains("met at run time")),
        "fsck reports the recorded errors: {:?}",
        r.problems
    );
}

#[test]
fn errors_continue_records_the_damage_and_goes_on() {
    let (dev, a, b) = damaged();
    let fs = Fs::open(dev.clone(), with(OnDamage::Continue)).expect("open");
    meet_damage(&fs, a);
    let (_, refusing) = fs.damage().expect("damage noted");
    assert!(!refusing);
    let after = fs.create(b, b"after", 0o644, ME).expect("create goes on");
    fs.write(after.ino, 0, b"after").expect("write goes on");
    fs.close().expect("close");
    let sb = read_superblock(dev.as_ref()).expect("sb");
    assert!(sb.errors.get() >= 1, "the damage is recorded");
    let fs = Fs::open(dev, opts()).expect("reopen");
    fs.lookup(b, b"after").expect("made after the damage");
}

#[test]
fn a_read_only_mount_writes_nothing_when_it_meets_damage() {
    let (dev, a, _) = damaged();
    let img = dev.snapshot();
    let fs = Fs::open(
        dev.clone(),
        OpenOptions {
            read_only: true,
            ..opts()
        },
    )
    .expect("open");
    meet_damage(&fs, a);
    assert!(fs.damage().is_some());
    fs.close().expect("close");
    assert!(
        dev.snapshot() == img,
        "a read-only mount wrote to the image"
    );
}
