//! Regression: removing a file needed space in proportion to its extents (7 nodes' worth per
//! extent), and every 4 KiB write left an extent of its own. So `rm` of a 400 MiB file written
//! with `dd bs=4k` failed with ENOSPC on an 8 GiB file system with 7.6 GiB free, a 12 MiB file
//! could not be removed from a 256 MiB file system with 244 MiB free, and a full file system
//! could not remove its large file. Adjacent extents now merge, and deleting frees in batches
//! of one leaf each, with the global reserve.
mod common;
use common::*;
use idxfs_engine::{Error, Fs};
use idxfs_format::{ItemType, Key};

const BS: u64 = 4096;

/// Extent items of `ino`.
fn extent_items(fs: &Fs, ino: u64) -> usize {
    fs.with_store(|s, t, _| {
        let mut n = 0;
        t.scan(
            s,
            Key::new(ino, ItemType::Extent, 0),
            Key::new(ino, ItemType::Extent, u64::MAX),
            |_, _| {
                n += 1;
                Ok(true)
            },
        )
        .expect("scan");
        n
    })
}

fn used(fs: &Fs) -> u64 {
    let s = fs.statfs().expect("statfs");
    s.blocks - s.blocks_free
}

#[test]
fn a_file_written_in_small_pieces_keeps_few_extents_and_goes_away() {
    let (dev, fs) = mem_fs(8 << 30);
    let f = fs.create(ROOT, b"big", 0o644, ME).expect("create");
    let piece = vec![7u8; BS as usize];
    for i in 0..(400 << 20) / BS {
        fs.write(f.ino, i * BS, &piece).expect("write");
    }
    // 400 MiB in extents of up to 32 MiB.
    let n = extent_items(&fs, f.ino);
    assert!(n <= 16, "{n} extents for a file written front to back");
    fs.sync().expect("sync");
    let before = used(&fs);
    fs.unlink(ROOT, b"big").expect("unlink");
    fs.sync().expect("sync");
    assert!(
        used(&fs) + (400 << 20) / BS <= before,
        "the file's blocks are free again"
    );
    fs.close().expect("close");
    assert_clean(&dev);
}

#[test]
fn a_full_file_system_removes_its_files_however_fragmented() {
    let (dev, fs) = mem_fs(256 << 20);
    fs.sync().expect("sync");
    let empty = used(&fs);
    // One file filled front to back across block groups (64 MiB each: merging must stop at
    // their edges), one with every other block (no two extents merge), until the device is
    // full.
    // A small file first, so that a's extents do not start on a group's edge (extents stop
    // at 8,192 blocks, half a group: aligned ones never reach the next group).
    let c = fs.create(ROOT, b"c", 0o644, ME).expect("create");
    fs.write(c.ino, 0, &vec![2u8; 300 * BS as usize])
        .expect("write c");
    let a = fs.create(ROOT, b"a", 0o644, ME).expect("create");
    let piece = vec![1u8; BS as usize];
    let mut i = 0;
    while i < 150 << 20 {
        fs.write(a.ino, i, &piece).expect("write a");
        i += BS;
    }
    let b = fs.create(ROOT, b"b", 0o644, ME).expect("create");
    let mut at = 0;
    let written = loop {
        match fs.write(b.ino, at, &piece) {
            Ok(_) => at += 2 * BS,
            Err(Error::NoSpace) => break at / (2 * BS),
            Err(e) => panic!("write: {e}"),
        }
    };
    assert!(written > 10_000, "filled with {written} blocks");
    assert!(
        extent_items(&fs, b.ino) as u64 >= written,
        "one extent per block"
    );
    assert!(fs.failure().is_none());
    // Full: nothing more fits, but truncating, punching and removing all work.
    assert!(matches!(
        fs.create(ROOT, b"e", 0o644, ME)
            .and_then(|e| fs.write(e.ino, 0, &vec![0; 1 << 20])),
        Err(Error::NoSpace)
    ));
    fs.fallocate(
        b.ino,
        0,
        1 << 20,
        idxfs_engine::fs::FALLOC_PUNCH_HOLE | idxfs_engine::fs::FALLOC_KEEP_SIZE,
    )
    .expect("punch");
    fs.truncate(b.ino, at / 2).expect("truncate");
    fs.unlink(ROOT, b"b").expect("unlink b");
    fs.unlink(ROOT, b"a").expect("unlink a");
    fs.unlink(ROOT, b"c").expect("unlink c");
    let _ = fs.unlink(ROOT, b"e");
    assert!(fs.failure().is_none());
    fs.sync().expect("sync");
    assert_eq!(used(&fs), empty, "every block back");
    // And it is writable again.
    let d = fs.create(ROOT, b"d", 0o644, ME).expect("create");
    fs.write(d.ino, 0, &vec![3u8; 100 << 20]).expect("write");
    fs.close().expect("close");
    assert_clean(&dev);
}

#[test]
fn a_truncate_of_many_extents_is_finished_after_a_crash() {
    use idxfs_blockdev::{MemDevice, RecordingDevice, Tear};
    use std::sync::Arc;
    // A fragmented file on a full device, committed; then a truncate to 0 whose batches
    // commit in between (as a device too full for the next batch's reservation makes them).
    // Every crash image of that truncate opens to the old file or the new one (size 0), with
    // fsck clean: no block leaked, no stale extent past the size.
    // 4 KiB nodes: a small reserve against ~70 extents per leaf.
    let mem = Arc::new(MemDevice::new(64 << 20));
    let mkfs = idxfs_engine::MkfsOptions {
        node_size: 4096,
        ..idxfs_engine::MkfsOptions::default()
    };
    idxfs_engine::Fs::mkfs(mem.clone(), &mkfs).expect("mkfs");
    let rec = Arc::new(RecordingDevice::new(mem.snapshot()));
    let fs = Fs::open(
        rec.clone(),
        idxfs_engine::OpenOptions {
            test_commit_between_batches: true,
            ..opts()
        },
    )
    .expect("open");
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create");
    let piece = vec![5u8; BS as usize];
    let mut at = 0;
    loop {
        match fs.write(f.ino, at, &piece) {
            Ok(_) => at += 2 * BS,
            Err(Error::NoSpace) => break,
            Err(e) => panic!("write: {e}"),
        }
    }
    let size = at - BS;
    fs.sync().expect("sync");
    let start = rec.event_count();
    let commits = || fs.counters().commits.get();
    let c0 = commits();
    fs.truncate(f.ino, 0).expect("truncate");
    let during = commits() - c0;
    fs.sync().expect("sync");
    let end = rec.event_count();
    let n = |c: &idxfs_engine::counters::Counter| c.get();
    let (trims, batches, after) = (
        n(&fs.counters().trim_orphans),
        n(&fs.counters().free_batches),
        n(&fs.counters().trim_batches),
    );
    drop(fs);
    assert_eq!(trims, 1, "the truncate took more than one batch");
    // Each batch after the first its own operation: others go on between them.
    assert!(
        after + 1 >= batches,
        "{after} of {batches} batches after the truncate's own"
    );
    assert!(
        during >= 10,
        "batches committed in between ({during} commits)"
    );
    assert!(batches > 10, "{batches} batches");
    let mut finished_at_open = 0;
    for prefix in (start..=end).step_by(((end - start) / 40).max(1)) {
        for tear in [Tear::None, Tear::Drop(0x5555_5555_5555_5555)] {
            let img = rec.crash_image(prefix, tear);
            let dev = Arc::new(MemDevice::from_bytes(img.bytes));
            // The crash image itself is consistent (a pending trim is a state fsck knows)...
            assert_clean(&dev);
            // ...and an open finishes what it says is left.
            let fs = Fs::open(dev.clone(), opts())
                .unwrap_or_else(|e| panic!("prefix {prefix} {tear:?}: open: {e}"));
            finished_at_open += n(&fs.counters().free_batches).min(1);
            let e = fs.lookup(ROOT, b"f").expect("the file is there");
            assert!(
                e.size == size || e.size == 0,
                "prefix {prefix}: size {}",
                e.size
            );
            fs.close().expect("close");
            assert_clean(&dev);
        }
    }
    assert!(
        finished_at_open > 0,
        "some crash images had a trim left to finish"
    );
}

/// A device of a few MiB, filled: a truncate and an unlink still work (the global reserve's
/// 0.5% share of such a device is less than one delete reserves, so it is never less than
/// that).
#[test]
fn small_full_file_systems_truncate_and_remove_their_files() {
    for mib in [4u64, 8, 16, 64] {
        let (dev, fs) = mem_fs(mib << 20);
        let f = fs.create(ROOT, b"f", 0o644, ME).expect("create");
        let mut at = 0u64;
        for piece in [16 * BS, BS] {
            while fs.write(f.ino, at, &vec![1u8; piece as usize]).is_ok() {
                at += piece;
            }
        }
        assert!(at > 0, "{mib} MiB: nothing fit");
        fs.sync().expect("sync");
        let g = fs.create(ROOT, b"g", 0o644, ME);
        fs.truncate(f.ino, at / 2)
            .unwrap_or_else(|e| panic!("{mib} MiB: truncate of a full device: {e}"));
        fs.unlink(ROOT, b"f")
            .unwrap_or_else(|e| panic!("{mib} MiB: unlink on a full device: {e}"));
        if g.is_ok() {
            fs.unlink(ROOT, b"g").expect("unlink g");
        }
        assert!(fs.failure().is_none());
        fs.close().expect("close");
        assert_clean(&dev);
    }
}
