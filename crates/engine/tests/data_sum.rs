//! Data checksums (`fs/data_sum.rs`): a damaged block of a copy-on-write file is EIO, never
//! wrong bytes; the sums follow every change of a file's data (writes in and across blocks,
//! truncates, holes, zeroed ranges, preallocated blocks, NOCOW files) so that no block reads
//! unchecked and none fails its check; and a crash at every write prefix opens to data that
//! matches its sums.
mod common;
use common::*;
use idxfs_blockdev::{BlockDevice, MemDevice, Tear};
use idxfs_engine::fs::{Fs, FALLOC_KEEP_SIZE, FALLOC_PUNCH_HOLE, FALLOC_ZERO_RANGE, NOCOW_FL};
use idxfs_engine::testutil::Rng;
use idxfs_engine::{fsck, Error, OpenOptions};
use idxfs_format::items::{EXTENT_REGULAR, SUM_GROUP_BLOCKS};
use idxfs_format::superblock::Superblock;
use idxfs_format::versions::COMPAT_RO_DATA_SUMS;
use std::collections::BTreeMap;
use std::sync::Arc;

const BS: u64 = 4096;

/// (file block, device block) of every block of `ino`'s regular extents.
fn regular_blocks(fs: &Fs, ino: u64) -> Vec<(u64, u64)> {
    extent_blocks(fs, ino)
        .into_iter()
        .filter(|b| b.2 == EXTENT_REGULAR)
        .map(|(f, d, _)| (f, d))
        .collect()
}

fn flip_bit(dev: &MemDevice, block: u64, bit: u64) {
    let mut b = [0u8; 1];
    let at = block * BS + bit / 8;
    dev.read_at(&mut b, at).expect("read");
    b[0] ^= 1 << (bit % 8);
    dev.write_at(&b, at).expect("write");
}

#[test]
fn a_flipped_bit_in_a_data_block_is_eio_and_an_fsck_data_problem_and_nothing_else() {
    let mut rng = Rng::new(11);
    let (dev, fs) = mem_fs(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    let data = rng.bytes(10 * BS as usize);
    fs.write(f, 0, &data).expect("write");
    fs.sync().expect("sync");
    assert_clean(&dev);
    let blocks = regular_blocks(&fs, f);
    assert_eq!(summed_blocks(&fs, f), (0..10).collect::<Vec<_>>());
    let (_, disk) = blocks[3];
    flip_bit(&dev, disk, rng.below(BS * 8));

    // Any read touching block 3, aligned or not, whole or in part: EIO, counted.
    for (off, len) in [
        (0, 10 * BS),
        (3 * BS, BS),
        (3 * BS + 100, 7),
        (2 * BS + 5, BS),
    ] {
        let r = fs.read(f, off, len as usize);
        assert!(
            matches!(r, Err(Error::DataSum { block: 3, .. })),
            "read {off}+{len} of a damaged block: {r:?}"
        );
        assert_eq!(Error::DataSum { ino: f, block: 3 }.errno(), 5);
    }
    let errors = fs.counters().data_sum_errors.get();
    assert!(errors >= 4, "{errors} mismatches counted");
    // The blocks around it read as written.
    let a = &data[..3 * BS as usize];
    assert_eq!(fs.read(f, 0, 3 * BS as usize).expect("read before"), a);
    let b = &data[4 * BS as usize..];
    assert_eq!(fs.read(f, 4 * BS, 6 * BS as usize).expect("after"), b);
    // A write that keeps part of the damaged block refuses to carry its bytes over...
    let r = fs.write(f, 3 * BS + 10, b"x");
    assert!(matches!(r, Err(Error::DataSum { block: 3, .. })), "{r:?}");
    // ... and the metadata is fine: fsck is clean, fsck --data names the block.
    let d: Arc<dyn BlockDevice> = dev.clone();
    let r = fsck::check(&d, idxfs_format::hash::name_hash, &mut |_| {}).expect("fsck");
    assert!(r.is_clean(), "{:?}", r.problems);
    let r = fsck::check_with(&d, idxfs_format::hash::name_hash, true, &mut |_| {}).expect("fsck");
    assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
    assert!(
        r.problems[0].contains(&format!("inode {f} block 3 (device block {disk})"))
            && r.problems[0].contains("data checksum mismatch"),
        "{}",
        r.problems[0]
    );
    // The file system goes on: new files, and a whole-block rewrite of the damaged block.
    let g = fs
        .create(ROOT, b"g", 0o644, ME)
        .expect("still writable")
        .ino;
    fs.write(g, 0, &data).expect("write");
    let fresh = rng.bytes(BS as usize);
    fs.write(f, 3 * BS, &fresh)
        .expect("rewrite the damaged block");
    let mut want = data.clone();
    want[3 * BS as usize..4 * BS as usize].copy_from_slice(&fresh);
    assert_eq!(fs.read(f, 0, 10 * BS as usize).expect("read"), want);
    fs.close().expect("close");
    assert_clean(&dev);
}

/// Every block of a copy-on-write file's regular extents has a sum and nothing else has one;
/// a NOCOW file has none.
fn assert_sums_cover(fs: &Fs, ino: u64, nocow: bool, what: &str) {
    let regular: Vec<u64> = regular_blocks(fs, ino).iter().map(|b| b.0).collect();
    let summed = summed_blocks(fs, ino);
    if nocow {
        assert!(
            summed.is_empty(),
            "{what}: a NOCOW file has sums {summed:?}"
        );
    } else {
        assert_eq!(
            summed, regular,
            "{what}: the summed blocks are not the written ones"
        );
    }
}

#[test]
fn sums_follow_every_change_of_file_data() {
    let (mut rng, seed) = Rng::from_env("data_sum model");
    let (dev, fs) = mem_fs(256 << 20);
    let mut fs = Some(fs);
    const MAX: u64 = 300 * BS;
    // Three copy-on-write files and a NOCOW one, against byte-vector models.
    let mut files: Vec<(u64, bool, Vec<u8>)> = Vec::new();
    for i in 0..4u8 {
        let f = fs.as_ref().expect("open");
        let ino = f
            .create(ROOT, &[b'f', b'0' + i], 0o644, ME)
            .expect("create")
            .ino;
        let nocow = i == 3;
        if nocow {
            f.set_flags(ino, NOCOW_FL).expect("chattr +C");
        }
        files.push((ino, nocow, Vec::new()));
    }
    for step in 0..1500 {
        let f = fs.as_ref().expect("open");
        let (ino, nocow, model) = {
            let i = rng.below(4) as usize;
            (files[i].0, files[i].1, &mut files[i].2)
        };
        let size = model.len() as u64;
        // Offsets near block and group boundaries, and anywhere.
        let at = |rng: &mut Rng| match rng.below(3) {
            0 => (rng.below(MAX / BS) * BS).saturating_sub(rng.below(3)),
            1 => rng.below(MAX / BS / SUM_GROUP_BLOCKS + 1) * SUM_GROUP_BLOCKS * BS,
            _ => rng.below(MAX),
        };
        match rng.below(10) {
            0..=4 => {
                let off = at(&mut rng).min(MAX - 1);
                let len = match rng.below(4) {
                    0 => 1 + rng.below(100),
                    1 => 1 + rng.below(3 * BS),
                    _ => 1 + rng.below(80 * BS),
                }
                .min(MAX - off);
                let data = rng.bytes(len as usize);
                f.write(ino, off, &data).expect("write");
                let end = (off + len) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&data);
            }
            5 => {
                let to = if rng.below(2) == 0 {
                    at(&mut rng)
                } else {
                    size / 2
                };
                f.truncate(ino, to).expect("truncate");
                model.resize(to as usize, 0);
            }
            6 => {
                let off = at(&mut rng).min(MAX - 1);
                let len = (1 + rng.below(100 * BS)).min(MAX - off);
                let mode = FALLOC_PUNCH_HOLE | FALLOC_KEEP_SIZE;
                f.fallocate(ino, off, len, mode).expect("punch");
                let (a, z) = ((off.min(size)) as usize, ((off + len).min(size)) as usize);
                model[a..z].fill(0);
            }
            7 => {
                let off = at(&mut rng).min(MAX - 1);
                let len = (1 + rng.below(100 * BS)).min(MAX - off);
                let keep = rng.below(2) == 0;
                let mode = if rng.below(2) == 0 {
                    FALLOC_ZERO_RANGE
                } else {
                    0
                } | if keep { FALLOC_KEEP_SIZE } else { 0 };
                let zero = mode & FALLOC_ZERO_RANGE != 0;
                f.fallocate(ino, off, len, mode).expect("fallocate");
                let end = (off + len) as usize;
                if zero {
                    let z = if keep { end.min(model.len()) } else { end };
                    if model.len() < z {
                        model.resize(z, 0);
                    }
                    if (off as usize) < z {
                        model[off as usize..z].fill(0);
                    }
                } else if !keep && model.len() < end {
                    model.resize(end, 0);
                }
            }
            8 => f.sync().expect("sync"),
            _ => {
                if rng.below(4) == 0 {
                    drop(fs.take());
                    assert_clean(&dev);
                    fs = Some(Fs::open(dev.clone(), opts()).expect("reopen"));
                } else {
                    f.fsync(ino).expect("fsync");
                }
            }
        }
        let f = fs.as_ref().expect("open");
        let what = format!("seed {seed} step {step}");
        assert_sums_cover(f, ino, nocow, &what);
        let got = f
            .read(ino, 0, MAX as usize)
            .expect("every block matches its sum");
        assert!(
            got == *model,
            "{what}: inode {ino} differs from its model (sizes {} and {}, first at {:?})",
            got.len(),
            model.len(),
            got.iter().zip(model.iter()).position(|(a, b)| a != b)
        );
    }
    drop(fs);
    assert_clean(&dev);
}

#[test]
fn without_sums_nothing_is_summed_nothing_stale_stays_and_a_later_mount_adds_them() {
    let mut rng = Rng::new(5);
    let (dev, fs) = mem_fs(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    let mut data = rng.bytes(200 * BS as usize);
    fs.write(f, 0, &data).expect("write");
    fs.close().expect("close");
    // A mount without sums rewrites part of it: the rewritten blocks lose theirs.
    let off_opts = OpenOptions {
        datasum: false,
        ..opts()
    };
    let fs = Fs::open(dev.clone(), off_opts.clone()).expect("open");
    let part = rng.bytes(70 * BS as usize);
    fs.write(f, 10 * BS, &part).expect("write");
    data[10 * BS as usize..80 * BS as usize].copy_from_slice(&part);
    let g = fs.create(ROOT, b"g", 0o644, ME).expect("create").ino;
    fs.write(g, 0, &data).expect("write");
    let summed = summed_blocks(&fs, f);
    let want: Vec<u64> = (0..10).chain(80..200).collect();
    assert_eq!(summed, want);
    assert!(summed_blocks(&fs, g).is_empty());
    fs.close().expect("close");
    assert_clean(&dev);
    // Sums on again: the unsummed blocks read unchecked, new writes get theirs.
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    assert_eq!(fs.read(f, 0, data.len()).expect("read"), data);
    fs.write(g, 0, &data[..BS as usize]).expect("write");
    assert_eq!(summed_blocks(&fs, g), vec![0]);
    fs.close().expect("close");
    assert_clean(&dev);
}

/// The compat_ro bits of the newest superblock.
fn compat_ro(dev: &MemDevice) -> u64 {
    let (sb, _) = idxfs_engine::fs::superblock_copies(dev).expect("superblock");
    sb.expect("a valid superblock").compat_ro.get()
}

/// Makes the image look as an idxfs from before data sums left it: the bit cleared in both
/// superblock copies (resealed).
fn clear_sums_bit(dev: &MemDevice) {
    let blocks = dev.size() / BS;
    for copy in 0..idxfs_format::SUPER_COPIES {
        let mut b = vec![0u8; BS as usize];
        dev.read_at(&mut b, copy * BS).expect("read");
        let mut sb = Superblock::decode(&b, copy, blocks).expect("superblock copy");
        sb.compat_ro = (sb.compat_ro.get() & !COMPAT_RO_DATA_SUMS).into();
        dev.write_at(&sb.encode(), copy * BS).expect("write");
    }
}

#[test]
fn an_older_image_gets_the_feature_bit_with_its_first_sum_and_a_new_one_has_it() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    Fs::mkfs(dev.clone(), &Default::default()).expect("mkfs");
    assert_eq!(
        compat_ro(&dev),
        COMPAT_RO_DATA_SUMS,
        "mkfs: sums from the start"
    );
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    let f = fs.create(ROOT, b"small", 0o644, ME).expect("create").ino;
    fs.write(f, 0, b"inline bytes have no sum").expect("write");
    fs.close().expect("close");
    clear_sums_bit(&dev);
    assert_eq!(compat_ro(&dev), 0);
    let fs = Fs::open(dev.clone(), opts()).expect("open the older image");
    assert_eq!(
        fs.read(f, 0, 100).expect("read"),
        b"inline bytes have no sum"
    );
    fs.write(f, 0, b"still inline").expect("write");
    fs.fsync(f).expect("fsync");
    assert_eq!(compat_ro(&dev), 0, "inline data needs no sums");
    fs.write(f, 0, &vec![7u8; 3 * BS as usize]).expect("write");
    // The first sum is made durable by a commit that sets the bit, never by a log batch
    // under a superblock without it.
    fs.fsync(f).expect("fsync");
    assert_eq!(compat_ro(&dev), COMPAT_RO_DATA_SUMS);
    fs.close().expect("close");
    assert_clean(&dev);
}

#[test]
fn a_crash_at_every_write_prefix_opens_to_data_that_matches_its_sums() {
    let (mut rng, seed) = Rng::from_env("data_sum crash");
    let rec = recorded();
    let fs = Fs::open(rec.clone(), opts()).expect("open");
    const SIZE: u64 = 80 * BS;
    let files: Vec<u64> = (0..3u8)
        .map(|i| {
            fs.create(ROOT, &[b'f', b'a' + i], 0o644, ME)
                .expect("create")
                .ino
        })
        .collect();
    // The files when a sync or fsync returned (an fsync's batch holds every change since
    // the last, whichever file it names): a crash shows one of these states, whole.
    let mut now: BTreeMap<u64, Vec<u8>> = files.iter().map(|f| (*f, Vec::new())).collect();
    let mut states: Vec<BTreeMap<u64, Vec<u8>>> = vec![now.clone()];
    for round in 0..12 {
        for _ in 0..1 + rng.below(4) {
            let f = files[rng.below(3) as usize];
            let m = now.get_mut(&f).expect("model");
            if rng.below(5) == 0 {
                let to = rng.below(SIZE);
                fs.truncate(f, to).expect("truncate");
                m.resize(to as usize, 0);
                continue;
            }
            let off = rng.below(SIZE - 1);
            let len = (1 + rng.below(6 * BS)).min(SIZE - off);
            let data = rng.bytes(len as usize);
            fs.write(f, off, &data).expect("write");
            let end = (off + len) as usize;
            if m.len() < end {
                m.resize(end, 0);
            }
            m[off as usize..end].copy_from_slice(&data);
        }
        if round % 3 == 0 {
            fs.sync().expect("sync");
        } else {
            fs.fsync(files[rng.below(3) as usize]).expect("fsync");
        }
        states.push(now.clone());
    }
    drop(fs);
    let events = rec.event_count();
    let mut checked = 0;
    for prefix in 0..=events {
        for tear in [Tear::None, Tear::TornLast(3), Tear::Drop(rng.next_u64())] {
            let img = rec.crash_image(prefix, tear);
            let dev = Arc::new(MemDevice::from_bytes(img.bytes));
            let Ok(fs) = Fs::open(dev.clone(), opts()) else {
                continue; // before the first commit
            };
            let mut got = BTreeMap::new();
            for f in &files {
                match fs.read(*f, 0, SIZE as usize) {
                    Ok(b) => {
                        got.insert(*f, b);
                    }
                    // Before the files' creation was durable.
                    Err(Error::NotFound) => break,
                    Err(e) => panic!("seed {seed} prefix {prefix} {tear:?}: inode {f}: {e:?}"),
                }
            }
            if got.len() < files.len() {
                drop(fs);
                continue;
            }
            assert!(
                states.contains(&got),
                "seed {seed} prefix {prefix} {tear:?}: the files are in no state a sync or \
                 fsync left (sizes {:?})",
                got.values().map(Vec::len).collect::<Vec<_>>()
            );
            drop(fs);
            if prefix % 7 == 0 {
                assert_clean(&dev);
            }
            checked += 1;
        }
    }
    assert!(checked > 100, "seed {seed}: only {checked} crash images");
}

#[test]
fn a_truncate_into_a_group_of_sums_frees_in_one_go_without_a_trim_orphan() {
    let mut rng = Rng::new(3);
    let (dev, fs) = mem_fs(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    let data = rng.bytes(200 * BS as usize);
    fs.write(f, 0, &data).expect("write");
    fs.sync().expect("sync");
    // Cut inside a group: the group keeps its item for the blocks below the cut, which is
    // not work left for a trim orphan.
    let size = 100 * BS + 123;
    fs.truncate(f, size).expect("truncate");
    let n = |a: &idxfs_engine::counters::Counter| a.get();
    assert_eq!(
        n(&fs.counters().trim_orphans),
        0,
        "a trim orphan for one batch"
    );
    assert_eq!(summed_blocks(&fs, f), (0..101).collect::<Vec<_>>());
    assert_eq!(
        fs.read(f, 0, 300 * BS as usize).expect("read"),
        &data[..size as usize]
    );
    fs.close().expect("close");
    let (sb, _) = idxfs_engine::fs::superblock_copies(dev.as_ref()).expect("superblock");
    let incompat = sb.expect("a superblock").incompat.get();
    assert_eq!(
        incompat & idxfs_format::versions::INCOMPAT_ORPHAN_TRIM,
        0,
        "no feature bit for a truncate that took one batch"
    );
    assert_clean(&dev);
}
