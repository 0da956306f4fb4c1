//! Regression: a pin that came after an inode's last name went (a FUSE lookup answered
//! without the lock just before an unlink, pinning a moment after it) used to hold the inode
//! while it was being freed in batches. Its holder then read the half-freed file: the old size
//! over extents already freed, zeros where data had been written. A pin after the last name
//! went is now refused (`Fs::pin` false), and the holder gets NotFound; a pin before it keeps
//! the whole file, as always.
mod common;
use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Blocks written, one every other block, so each is its own extent: the file's items fill
/// several freeing batches (512 items each), the last block's extent freed in the first.
const BLOCKS: u64 = 2048;

#[test]
fn a_pin_after_the_last_unlink_never_holds_a_half_freed_file() {
    let (dev, fs) = mem_fs(256 << 20);
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir").ino;
    let current = AtomicU64::new(0);
    let tried = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let (mut held, mut refused, mut gone) = (0u64, 0u64, 0u64);
    let last = (BLOCKS - 1) * 2 * 4096;
    std::thread::scope(|s| {
        s.spawn(|| {
            for round in 0..40u8 {
                let ino = fs.create(d, b"f", 0o644, ME).expect("create").ino;
                for b in 0..BLOCKS {
                    fs.write(ino, b * 2 * 4096, &[round + 1; 4096])
                        .expect("write");
                }
                current.store(ino, Ordering::Release);
                // Every other round waits until the reader has tried to pin this file, so
                // some pins surely come before the unlink (under load the reader may
                // otherwise never run inside the window); the other rounds race.
                if round % 2 == 0 {
                    while tried.load(Ordering::Acquire) != ino {
                        std::thread::yield_now();
                    }
                }
                fs.unlink(d, b"f").expect("unlink");
            }
            done.store(true, Ordering::Release);
        });
        while !done.load(Ordering::Acquire) {
            let ino = current.load(Ordering::Acquire);
            if ino == 0 {
                std::hint::spin_loop();
                continue;
            }
            let pinned = fs.pin(ino);
            tried.store(ino, Ordering::Release);
            if !pinned {
                refused += 1;
                continue;
            }
            // Held: the whole file, or none of it (gone before the pin), never a part.
            match fs.read(ino, last, 4096) {
                Ok(bytes) => {
                    held += 1;
                    assert!(
                        bytes.len() == 4096
                            && bytes[0] != 0
                            && bytes.iter().all(|&b| b == bytes[0]),
                        "inode {ino}: a held file's last block read {:?}... ({} bytes)",
                        &bytes[..bytes.len().min(8)],
                        bytes.len()
                    );
                }
                Err(idxfs_engine::Error::NotFound) => gone += 1,
                Err(e) => panic!("read of a held inode: {e}"),
            }
            fs.unpin(ino, 1).expect("unpin");
        }
    });
    eprintln!("pins that held the file: {held}, refused: {refused}, on inodes gone: {gone}");
    assert!(
        held > 0,
        "the reader never held a file: the test tested nothing"
    );
    assert_eq!(
        fs.orphans().expect("orphans"),
        Vec::<u64>::new(),
        "every file freed once let go"
    );
    drop(fs);
    assert_clean(&dev);
}

/// The same race at birth: a FUSE create pinned its new inode after the operation let go of
/// the lock, so another process's unlink in between freed the file under the creator's open
/// descriptor. With `hold_made`, the operation pins before anyone else can run.
#[test]
fn a_file_made_for_a_holder_is_pinned_before_anyone_can_unlink_it() {
    let (dev, fs) = mem_fs(64 << 20);
    fs.hold_made();
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    let s = fs.symlink(ROOT, b"s", b"target", ME).expect("symlink").ino;
    let l = fs.link(f, ROOT, b"l").expect("link").ino;
    assert_eq!(l, f);
    for name in [b"f".as_slice(), b"s", b"l"] {
        fs.unlink(ROOT, name).expect("unlink");
    }
    // Held: the creator may still write and read its file, and read its link.
    fs.write(f, 0, b"still mine").expect("write to a held file");
    assert_eq!(fs.read(f, 0, 64).expect("read"), b"still mine");
    assert_eq!(fs.readlink(s).expect("readlink"), b"target");
    assert_eq!(fs.getattr(f).expect("getattr").nlink, 0);
    // The create's pin and the link's: both must go before the file does.
    fs.unpin(f, 1).expect("unpin");
    assert!(fs.getattr(f).is_ok(), "one pin left");
    fs.unpin(f, 1).expect("unpin");
    fs.unpin(s, 1).expect("unpin");
    assert!(matches!(fs.getattr(f), Err(idxfs_engine::Error::NotFound)));
    assert!(matches!(fs.getattr(s), Err(idxfs_engine::Error::NotFound)));
    assert_eq!(fs.orphans().expect("orphans"), Vec::<u64>::new());
    fs.close().expect("close");
    assert_clean(&dev);
}
