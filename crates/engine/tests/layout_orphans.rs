//! Orphans (unlinked while pinned), fallocate, SEEK_DATA/SEEK_HOLE and set-group-ID directories.
mod common;
use common::*;
use idxfs_engine::fs::{Owner, Seek, FALLOC_KEEP_SIZE, FALLOC_PUNCH_HOLE};
use idxfs_engine::{Error, Fs};

#[test]
fn unlinked_while_pinned_lives_until_unpin() {
    let (dev, fs) = mem_fs(64 << 20);
    let base = fs.statfs().expect("statfs").blocks_free;
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create");
    fs.write(f.ino, 0, &vec![7u8; 300_000]).expect("write");
    fs.pin(f.ino);
    fs.pin(f.ino);
    fs.unlink(ROOT, b"f").expect("unlink");
    assert!(matches!(fs.lookup(ROOT, b"f"), Err(Error::NotFound)));
    // Still readable and writable by number, with no links.
    assert_eq!(fs.getattr(f.ino).expect("attr").nlink, 0);
    assert_eq!(fs.read(f.ino, 0, 10).expect("read"), vec![7u8; 10]);
    fs.write(f.ino, 0, b"abc").expect("write to orphan");
    assert_eq!(fs.orphans().expect("orphans"), vec![f.ino]);
    fs.sync().expect("sync");
    assert_clean(&dev);
    fs.unpin(f.ino, 1).expect("unpin");
    assert!(fs.getattr(f.ino).is_ok(), "one pin left");
    fs.unpin(f.ino, 1).expect("unpin");
    assert!(matches!(fs.getattr(f.ino), Err(Error::NotFound)));
    assert!(fs.orphans().expect("orphans").is_empty());
    fs.sync().expect("sync");
    assert_clean(&dev);
    assert_eq!(fs.statfs().expect("statfs").blocks_free, base);
    fs.close().expect("close");
}

/// An orphan's item is written by the commit: one freed before it leaves nothing behind, one
/// still held at the commit is in the image (and reclaimed after a crash), and freeing it later
/// removes the item.
#[test]
fn orphans_freed_before_or_after_the_commit() {
    let (dev, fs) = mem_fs(64 << 20);
    let a = fs.create(ROOT, b"a", 0o644, ME).expect("create a");
    let b = fs.create(ROOT, b"b", 0o644, ME).expect("create b");
    fs.write(b.ino, 0, &vec![5u8; 50_000]).expect("write b");
    fs.sync().expect("sync");
    fs.pin(a.ino);
    fs.pin(b.ino);
    fs.unlink(ROOT, b"a").expect("unlink a");
    fs.unlink(ROOT, b"b").expect("unlink b");
    assert_eq!(fs.orphans().expect("orphans"), vec![a.ino, b.ino]);
    fs.unpin(a.ino, 1).expect("unpin a");
    assert!(matches!(fs.getattr(a.ino), Err(Error::NotFound)));
    assert_eq!(fs.orphans().expect("orphans"), vec![b.ino]);
    fs.sync().expect("sync");
    assert_clean(&dev);
    // A crash now: the image lists b, and the next mount frees it.
    let crashed = std::sync::Arc::new(idxfs_blockdev::MemDevice::from_bytes(dev.snapshot()));
    let after = Fs::open(crashed.clone(), opts()).expect("open after crash");
    assert!(after.orphans().expect("orphans").is_empty());
    assert!(matches!(after.getattr(b.ino), Err(Error::NotFound)));
    assert!(matches!(after.getattr(a.ino), Err(Error::NotFound)));
    after.close().expect("close");
    assert_clean(&crashed);
    // No crash: b is freed after the commit that listed it.
    assert_eq!(fs.read(b.ino, 0, 3).expect("read orphan"), vec![5u8; 3]);
    fs.unpin(b.ino, 1).expect("unpin b");
    assert!(fs.orphans().expect("orphans").is_empty());
    fs.sync().expect("sync");
    assert_clean(&dev);
    fs.close().expect("close");
}

/// The kernel's batched forgets: one call drops pins of many inodes; only the ones whose last
/// pin goes and that were unlinked are freed, the rest stay as they were.
#[test]
fn unpin_many_frees_only_last_pins_of_orphans() {
    let (dev, fs) = mem_fs(64 << 20);
    let base = fs.statfs().expect("statfs").blocks_free;
    let a = fs.create(ROOT, b"a", 0o644, ME).expect("create a");
    let b = fs.create(ROOT, b"b", 0o644, ME).expect("create b");
    let c = fs.create(ROOT, b"c", 0o644, ME).expect("create c");
    for f in [a.ino, b.ino, c.ino] {
        fs.write(f, 0, &vec![3u8; 50_000]).expect("write");
        fs.pin(f);
    }
    fs.pin(b.ino);
    fs.unlink(ROOT, b"a").expect("unlink a");
    fs.unlink(ROOT, b"b").expect("unlink b");
    // a: last pin, orphan -> freed; b: one of two pins -> kept; c: last pin, still linked
    // -> kept; an inode never pinned -> ignored.
    fs.unpin_many(&[(a.ino, 1), (b.ino, 1), (c.ino, 1), (999_999, 4)])
        .expect("unpin_many");
    assert!(matches!(fs.getattr(a.ino), Err(Error::NotFound)));
    assert_eq!(fs.getattr(b.ino).expect("b").nlink, 0);
    assert_eq!(fs.getattr(c.ino).expect("c").nlink, 1);
    assert_eq!(fs.orphans().expect("orphans"), vec![b.ino]);
    fs.unpin_many(&[(b.ino, 1)]).expect("unpin b");
    assert!(matches!(fs.getattr(b.ino), Err(Error::NotFound)));
    assert!(fs.orphans().expect("orphans").is_empty());
    fs.unlink(ROOT, b"c").expect("unlink c");
    fs.sync().expect("sync");
    assert_clean(&dev);
    assert_eq!(fs.statfs().expect("statfs").blocks_free, base);
    fs.close().expect("close");
}

#[test]
fn removed_directory_pinned_and_orphans_reclaimed_after_crash() {
    let (dev, fs) = mem_fs(64 << 20);
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir");
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create");
    fs.write(f.ino, 0, &vec![1u8; 100_000]).expect("write");
    fs.pin(d.ino);
    fs.pin(f.ino);
    fs.rmdir(ROOT, b"d").expect("rmdir");
    // A removed directory: no entries, no creates, ".." gone.
    assert_eq!(fs.getattr(d.ino).expect("attr").nlink, 0);
    assert!(matches!(
        fs.readdir(d.ino, 0, |_| true),
        Err(Error::NotFound)
    ));
    assert!(matches!(
        fs.create(d.ino, b"x", 0o644, ME),
        Err(Error::NotFound)
    ));
    assert!(matches!(fs.lookup(d.ino, b".."), Err(Error::NotFound)));
    // Replacing a pinned file by rename orphans it too.
    let g = fs.create(ROOT, b"g", 0o644, ME).expect("create");
    fs.rename(ROOT, b"g", ROOT, b"f", 0).expect("rename over");
    assert_eq!(fs.getattr(f.ino).expect("attr").nlink, 0);
    let mut orphans = fs.orphans().expect("orphans");
    orphans.sort();
    assert_eq!(orphans, vec![d.ino, f.ino]);
    fs.sync().expect("sync");
    assert_clean(&dev);
    // "Crash": drop the in-memory state without closing (the image has the orphans).
    let snapshot = dev.snapshot();
    drop(fs);
    let crashed = std::sync::Arc::new(idxfs_blockdev::MemDevice::from_bytes(snapshot));
    let fs = Fs::open(crashed.clone(), opts()).expect("open after crash");
    assert!(
        fs.orphans().expect("orphans").is_empty(),
        "reclaimed at mount"
    );
    assert!(matches!(fs.getattr(f.ino), Err(Error::NotFound)));
    assert!(matches!(fs.getattr(d.ino), Err(Error::NotFound)));
    assert_eq!(fs.getattr(g.ino).expect("g").nlink, 1);
    fs.close().expect("close");
    assert_clean(&crashed);
}

#[test]
fn fallocate_modes() {
    let (dev, fs) = mem_fs(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create");
    let free0 = fs.statfs().expect("statfs").blocks_free;
    // Default mode: allocates and grows the size; reads zeros.
    let a = fs.fallocate(f.ino, 0, 1 << 20, 0).expect("fallocate");
    assert_eq!(a.size, 1 << 20);
    assert_eq!(a.blocks, (1 << 20) / 512);
    assert!(fs.statfs().expect("statfs").blocks_free <= free0 - 256);
    assert_eq!(
        fs.read(f.ino, 0, 1 << 20).expect("read"),
        vec![0u8; 1 << 20]
    );
    // A small write into the preallocated range lands there (not inline).
    fs.write(f.ino, 10, b"data").expect("write");
    let mut want = vec![0u8; 1 << 20];
    want[10..14].copy_from_slice(b"data");
    assert_eq!(fs.read(f.ino, 0, 1 << 20).expect("read"), want);
    // KEEP_SIZE: blocks past the end, size unchanged.
    let a = fs
        .fallocate(f.ino, 1 << 20, 1 << 20, FALLOC_KEEP_SIZE)
        .expect("keep size");
    assert_eq!(a.size, 1 << 20);
    assert_eq!(a.blocks, (2 << 20) / 512);
    // Punch: the edges are zeroed, whole blocks freed.
    fs.write(f.ino, 0, &vec![9u8; 1 << 20]).expect("fill");
    let a = fs
        .fallocate(f.ino, 5000, 20_000, FALLOC_PUNCH_HOLE | FALLOC_KEEP_SIZE)
        .expect("punch");
    assert_eq!(a.size, 1 << 20);
    let mut want = vec![9u8; 1 << 20];
    want[5000..25_000].fill(0);
    assert_eq!(fs.read(f.ino, 0, 1 << 20).expect("read"), want);
    // Blocks 2..=5 (8192..24576) are whole inside the range and freed.
    assert_eq!(a.blocks, ((2 << 20) - 4 * 4096) / 512);
    assert!(matches!(
        fs.fallocate(f.ino, 0, 10, FALLOC_PUNCH_HOLE),
        Err(Error::Invalid(_))
    ));
    // Collapse range (0x08) is not supported.
    assert!(matches!(
        fs.fallocate(f.ino, 0, 4096, 0x08),
        Err(Error::NotSupported(_))
    ));
    // Inline files: small fallocate stays inline, a larger one moves the data out.
    let s = fs.create(ROOT, b"s", 0o644, ME).expect("create");
    fs.write(s.ino, 0, b"hello").expect("write");
    assert_eq!(fs.fallocate(s.ino, 0, 100, 0).expect("small").size, 100);
    fs.fallocate(s.ino, 0, 100_000, 0).expect("large");
    let mut want = b"hello".to_vec();
    want.resize(100_000, 0);
    assert_eq!(fs.read(s.ino, 0, 200_000).expect("read"), want);
    fs.close().expect("close");
    assert_clean(&dev);
}

#[test]
fn seek_data_and_hole() {
    let (dev, fs) = mem_fs(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create");
    // [0, 64K) data, [64K, 1M) hole, [1M, 1M+4K) data, then preallocated (a hole) to 2M.
    fs.write(f.ino, 0, &vec![1u8; 65536]).expect("write");
    fs.write(f.ino, 1 << 20, &vec![2u8; 4096]).expect("write");
    fs.fallocate(f.ino, (1 << 20) + 4096, (1 << 20) - 4096, 0)
        .expect("fallocate");
    let size = 2 << 20;
    assert_eq!(fs.getattr(f.ino).expect("attr").size, size);
    assert_eq!(fs.seek(f.ino, 0, Seek::Data).expect("data"), 0);
    assert_eq!(fs.seek(f.ino, 0, Seek::Hole).expect("hole"), 65536);
    assert_eq!(fs.seek(f.ino, 70_000, Seek::Data).expect("data"), 1 << 20);
    assert_eq!(fs.seek(f.ino, 70_000, Seek::Hole).expect("hole"), 70_000);
    assert_eq!(
        fs.seek(f.ino, 1 << 20, Seek::Hole).expect("hole"),
        (1 << 20) + 4096
    );
    assert!(matches!(
        fs.seek(f.ino, (1 << 20) + 4096, Seek::Data),
        Err(Error::NoSuchOffset)
    ));
    assert!(matches!(
        fs.seek(f.ino, size, Seek::Hole),
        Err(Error::NoSuchOffset)
    ));
    // An inline file: data, then the implicit hole at the end.
    let s = fs.create(ROOT, b"s", 0o644, ME).expect("create");
    fs.write(s.ino, 0, b"hi").expect("write");
    assert_eq!(fs.seek(s.ino, 1, Seek::Data).expect("data"), 1);
    assert_eq!(fs.seek(s.ino, 0, Seek::Hole).expect("hole"), 2);
    fs.close().expect("close");
    assert_clean(&dev);
}

/// A sparse copy (GNU cp) asks SEEK_DATA and SEEK_HOLE once per data run. Each answer reads
/// the extents from its offset only as far as the answer: reading on to the end of the file
/// made the copy of a file of n extents read n² extents.
#[test]
fn seek_reads_only_as_far_as_its_answer() {
    let (dev, fs) = mem_fs(256 << 20);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create");
    // Data in every other block: runs [2i, 2i+1) blocks, holes between them.
    let runs = 6000u64;
    for i in 0..runs {
        fs.write(f.ino, i * 8192, &[7]).expect("write");
    }
    let size = (runs - 1) * 8192 + 1;
    assert_eq!(fs.getattr(f.ino).expect("attr").size, size);
    let c = fs.counters();
    let lookups = || c.node_cache_hits.get() + c.node_reads.get();
    let before = lookups();
    let (mut at, mut calls, mut seen) = (0u64, 0u64, 0u64);
    loop {
        calls += 1;
        let data = match fs.seek(f.ino, at, Seek::Data) {
            Ok(d) => d,
            Err(Error::NoSuchOffset) => break,
            Err(e) => panic!("seek data from {at}: {e}"),
        };
        assert_eq!(data, seen * 8192, "data run {seen}");
        calls += 1;
        let hole = fs.seek(f.ino, data, Seek::Hole).expect("hole");
        assert_eq!(hole, (data + 4096).min(size), "hole after run {seen}");
        seen += 1;
        at = hole;
    }
    assert_eq!(seen, runs);
    // A call costs a descent or two and a step into the next leaf at most; reading on to the
    // end of the file costs a leaf for every leaf of extents left, well past the bound at
    // this size, and more the larger the file.
    let per_call = (lookups() - before) as f64 / calls as f64;
    assert!(per_call < 10.0, "{per_call:.1} node lookups per seek");
    fs.close().expect("close");
    assert_clean(&dev);
}

#[test]
fn setgid_directory_passes_group_on() {
    let (dev, fs) = mem_fs(64 << 20);
    let d = fs
        .mkdir(ROOT, b"d", 0o2775, Owner { uid: 0, gid: 50 })
        .expect("mkdir");
    assert_eq!(d.mode & 0o7777, 0o2775);
    let f = fs.create(d.ino, b"f", 0o644, ME).expect("create");
    assert_eq!((f.uid, f.gid), (ME.uid, 50));
    let sub = fs.mkdir(d.ino, b"sub", 0o755, ME).expect("mkdir");
    assert_eq!((sub.gid, sub.mode & 0o2000), (50, 0o2000));
    let plain = fs.mkdir(ROOT, b"plain", 0o755, ME).expect("mkdir");
    assert_eq!((plain.gid, plain.mode & 0o2000), (ME.gid, 0));
    fs.close().expect("close");
    assert_clean(&dev);
}

#[test]
fn atime_policies() {
    use idxfs_engine::clock::StepClock;
    use idxfs_engine::fs::Atime;
    for (policy, first, second) in [
        (Atime::NoAtime, false, false),
        (Atime::Relatime, true, false),
        (Atime::Strict, true, true),
    ] {
        let dev = std::sync::Arc::new(idxfs_blockdev::MemDevice::new(16 << 20));
        Fs::mkfs(dev.clone(), &Default::default()).expect("mkfs");
        let o = idxfs_engine::OpenOptions {
            atime: policy,
            clock: std::sync::Arc::new(StepClock::new(1_000_000_000_000)),
            ..opts()
        };
        let fs = Fs::open(dev, o).expect("open");
        let f = fs.create(ROOT, b"f", 0o644, ME).expect("create");
        fs.write(f.ino, 0, b"x").expect("write");
        let a0 = fs.getattr(f.ino).expect("attr").atime;
        fs.read(f.ino, 0, 1).expect("read");
        let a1 = fs.getattr(f.ino).expect("attr").atime;
        fs.read(f.ino, 0, 1).expect("read");
        let a2 = fs.getattr(f.ino).expect("attr").atime;
        assert_eq!((a1 > a0, a2 > a1), (first, second), "{policy:?}");
        fs.close().expect("close");
    }
}

/// O_TMPFILE (`Fs::tmpfile`): pinned once, nameless; `link` names it while held, the last
/// unpin of one never named frees it, and a nameless inode nobody holds cannot be named.
#[test]
fn tmpfiles_live_while_held_and_take_a_name_by_link() {
    let (dev, fs) = mem_fs(64 << 20);
    let d = fs.mkdir(ROOT, b"d", 0o2775, ME).expect("mkdir");
    let t = fs
        .tmpfile(d.ino, 0o600, Owner { uid: 5, gid: 5 })
        .expect("tmpfile");
    assert_eq!(
        (t.nlink, t.mode & 0o7777, t.gid),
        (0, 0o600, d.gid),
        "sgid dir's group"
    );
    fs.write(t.ino, 0, b"bytes").expect("write");
    let named = fs.link(t.ino, d.ino, b"t").expect("link");
    assert_eq!(named.nlink, 1);
    fs.unpin(t.ino, 1).expect("unpin");
    assert_eq!(fs.read(t.ino, 0, 10).expect("still there"), b"bytes");
    let gone = fs.tmpfile(ROOT, 0o644, ME).expect("tmpfile");
    fs.write(gone.ino, 0, &vec![1u8; 1 << 20]).expect("write");
    fs.unpin(gone.ino, 1).expect("unpin");
    assert!(matches!(fs.getattr(gone.ino), Err(Error::NotFound)));
    assert!(matches!(
        fs.link(gone.ino, ROOT, b"late"),
        Err(Error::NotFound)
    ));
    fs.close().expect("close");
    assert_clean(&dev);
}

/// A fallocate over a range of more extents than one operation covers (`SLICE_EXTENTS`,
/// 2,048) runs as several operations, and each mode still leaves what one would: bytes
/// against a model, the size, the blocks the file owns, fsck clean.
#[test]
fn a_fallocate_over_many_extents_runs_in_slices_with_every_mode() {
    use idxfs_engine::fs::FALLOC_ZERO_RANGE;
    const BS: usize = 4096;
    const RUNS: usize = 5000;
    let (dev, fs) = mem_fs(256 << 20);
    let modes = [
        FALLOC_PUNCH_HOLE | FALLOC_KEEP_SIZE,
        FALLOC_ZERO_RANGE,
        FALLOC_ZERO_RANGE | FALLOC_KEEP_SIZE,
        0,
        FALLOC_KEEP_SIZE,
    ];
    for (i, mode) in modes.into_iter().enumerate() {
        let f = fs
            .create(ROOT, format!("f{i}").as_bytes(), 0o644, ME)
            .expect("create");
        // A data run of 100 bytes at the start of every other block: one extent each.
        let mut model = vec![0u8; 2 * (RUNS - 1) * BS + 100];
        for r in 0..RUNS {
            let at = 2 * r * BS;
            let bytes = [(r % 251) as u8 + 1; 100];
            fs.write(f.ino, at as u64, &bytes).expect("write");
            model[at..at + 100].copy_from_slice(&bytes);
        }
        // Unaligned edges, from inside the first run to past the end of the file.
        let (off, len) = (50u64, (2 * RUNS * BS + 30_000) as u64);
        let end = (off + len) as usize;
        let before = n(&fs.counters().fallocate_slices);
        let a = fs.fallocate(f.ino, off, len, mode).expect("fallocate");
        assert!(
            n(&fs.counters().fallocate_slices) - before >= 2,
            "mode {mode:#x}: {RUNS} extents in one operation"
        );
        let grows = mode & (FALLOC_KEEP_SIZE | FALLOC_PUNCH_HOLE) == 0;
        if mode != 0 && mode != FALLOC_KEEP_SIZE {
            // Punch and zero-range: the range reads as zeros.
            let cut = end.min(model.len());
            model[off as usize..cut].fill(0);
        }
        if grows {
            model.resize(end, 0);
        }
        assert_eq!(a.size, model.len() as u64, "mode {mode:#x}: size");
        let got = fs.read(f.ino, 0, model.len() + BS).expect("read");
        assert!(got == model, "mode {mode:#x}: bytes differ from the model");
        // Punched: only the partial first block keeps a block; else every block of the range
        // is the file's (written or preallocated) and the runs' blocks stay.
        let owned = a.blocks * 512;
        match mode {
            m if m & FALLOC_PUNCH_HOLE != 0 => assert_eq!(owned, BS as u64, "punched"),
            _ => assert!(
                owned >= (end as u64).div_ceil(BS as u64) * BS as u64,
                "{owned}"
            ),
        }
    }
    fs.sync().expect("sync");
    assert_clean(&dev);
}

fn n(c: &idxfs_engine::counters::Counter) -> u64 {
    c.get()
}
