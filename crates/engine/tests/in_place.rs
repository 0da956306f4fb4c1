//! Writes into blocks a file already has (`fs/in_place.rs`): preallocated blocks filled and
//! converted where they are, NOCOW files overwritten where they are, the NOCOW flag itself,
//! and what a crash at every write prefix leaves of both.
mod common;
use common::*;
use idxfs_blockdev::{BlockDevice, MemDevice, Tear};
use idxfs_engine::fs::{Fs, FALLOC_KEEP_SIZE, NOCOW_FL};
use idxfs_engine::testutil::Rng;
use idxfs_engine::Error;
use idxfs_format::items::EXTENT_PREALLOC;
use std::sync::Arc;

const BS: usize = 4096;

/// The device blocks that hold `block` (a whole block's bytes).
fn find_block(dev: &MemDevice, block: &[u8]) -> Vec<u64> {
    let mut buf = vec![0u8; BS];
    (0..dev.size() / BS as u64)
        .filter(|b| {
            dev.read_at(&mut buf, b * BS as u64).expect("read");
            buf == block
        })
        .collect()
}

/// The device blocks of `ino`'s extents, in file order, and whether each is preallocated.
fn disk_blocks(fs: &Fs, ino: u64) -> Vec<(u64, bool)> {
    extent_blocks(fs, ino)
        .into_iter()
        .map(|(_, d, kind)| (d, kind == EXTENT_PREALLOC))
        .collect()
}

/// Where each block of `data` (whole blocks) lies on the device, after a commit.
fn blocks_of(dev: &MemDevice, data: &[u8]) -> Vec<Vec<u64>> {
    data.chunks(BS).map(|c| find_block(dev, c)).collect()
}

#[test]
fn nocow_overwrites_and_first_writes_to_preallocated_blocks_stay_where_the_blocks_are() {
    let mut rng = Rng::new(7);
    let (dev, fs) = mem_fs(64 << 20);
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir");
    assert_eq!(
        fs.set_flags(d.ino, NOCOW_FL).expect("chattr +C dir"),
        NOCOW_FL
    );
    let nocow = fs.create(d.ino, b"n", 0o644, ME).expect("create").ino;
    assert_eq!(fs.flags(nocow).expect("flags"), NOCOW_FL, "inherited");
    let cow = fs.create(ROOT, b"c", 0o644, ME).expect("create").ino;
    let pre = fs.create(ROOT, b"p", 0o644, ME).expect("create").ino;
    fs.fallocate(pre, 0, 16 * BS as u64, 0).expect("fallocate");
    let a = rng.bytes(16 * BS);
    fs.write(nocow, 0, &a).expect("write");
    fs.write(cow, 0, &a).expect("write");
    fs.sync().expect("sync");
    let before = blocks_of(&dev, &a);
    assert!(
        before.iter().all(|w| w.len() == 2),
        "each block in two files"
    );
    // A first write into preallocated blocks goes where they are, and makes them written.
    let pre_blocks = disk_blocks(&fs, pre);
    assert_eq!(pre_blocks.len(), 16);
    assert!(pre_blocks.iter().all(|b| b.1), "preallocated");
    // Partial blocks too: what the write leaves of a block it fills reads as zeros.
    let mut p = rng.bytes(16 * BS);
    fs.write(pre, 0, &p[..5 * BS + 7]).expect("write");
    fs.write(pre, 6 * BS as u64, &p[6 * BS..]).expect("write");
    p[5 * BS + 7..6 * BS].fill(0);
    assert_eq!(fs.read(pre, 0, 16 * BS).expect("read"), p);
    fs.sync().expect("sync");
    let pre_at = blocks_of(&dev, &p);
    assert!(pre_at.iter().all(|w| w.len() == 1), "each block once");
    let at: Vec<u64> = pre_at.iter().map(|w| w[0]).collect();
    let was: Vec<u64> = pre_blocks.iter().map(|b| b.0).collect();
    assert_eq!(at, was, "the data is where the preallocated blocks were");
    let now: Vec<(u64, bool)> = at.iter().map(|&b| (b, false)).collect();
    assert_eq!(disk_blocks(&fs, pre), now, "written now, not preallocated");

    let b = rng.bytes(16 * BS);
    fs.write(nocow, 0, &b).expect("overwrite");
    fs.write(cow, 0, &b).expect("overwrite");
    // Unaligned too: a partial block overwritten in place keeps the bytes around it.
    let c = rng.bytes(BS + 100);
    fs.write(nocow, 3 * BS as u64 + 50, &c).expect("overwrite");
    fs.write(cow, 3 * BS as u64 + 50, &c).expect("overwrite");
    fs.sync().expect("sync");
    let mut want = b.clone();
    want[3 * BS + 50..4 * BS + 150].copy_from_slice(&c);
    assert_eq!(fs.read(nocow, 0, 16 * BS).expect("read"), want);
    assert_eq!(fs.read(cow, 0, 16 * BS).expect("read"), want);
    let after = blocks_of(&dev, &want);
    for (i, (was, now)) in before.iter().zip(&after).enumerate() {
        // The NOCOW file's block is where it was; the copy-on-write file's moved.
        assert_eq!(now.len(), 2, "block {i} in both files");
        let nocow_at = was.iter().filter(|w| now.contains(w)).count();
        assert_eq!(
            nocow_at, 1,
            "block {i}: one file kept its place (was {was:?}, now {now:?})"
        );
    }
    assert_clean(&dev);
    drop(fs);
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    assert_eq!(fs.read(nocow, 0, 16 * BS).expect("read"), want);
    assert_eq!(fs.read(pre, 0, 16 * BS).expect("read"), p);
    assert_eq!(fs.flags(nocow).expect("flags"), NOCOW_FL);
}

#[test]
fn a_full_device_takes_writes_into_fallocated_ranges_and_overwrites() {
    let mut rng = Rng::new(11);
    let (dev, fs) = mem_fs(24 << 20);
    let n = fs.create(ROOT, b"n", 0o644, ME).expect("create").ino;
    fs.set_flags(n, NOCOW_FL).expect("chattr +C");
    let mut n_model = rng.bytes(1 << 20);
    fs.write(n, 0, &n_model).expect("write");
    let p = fs.create(ROOT, b"p", 0o644, ME).expect("create").ino;
    fs.fallocate(p, 0, 1 << 20, 0).expect("fallocate");
    let k = fs.create(ROOT, b"k", 0o644, ME).expect("create").ino;
    fs.fallocate(k, 0, 256 << 10, FALLOC_KEEP_SIZE)
        .expect("fallocate keep size");
    let c = fs.create(ROOT, b"c", 0o644, ME).expect("create").ino;
    fs.write(c, 0, &rng.bytes(64 << 10)).expect("write");
    fs.sync().expect("sync");
    // Fill the device.
    let fill = fs.create(ROOT, b"fill", 0o644, ME).expect("create").ino;
    let chunk = vec![0x5au8; 256 << 10];
    let mut at = 0u64;
    loop {
        match fs.write(fill, at, &chunk) {
            Ok(_) => at += chunk.len() as u64,
            Err(Error::NoSpace) => break,
            Err(e) => panic!("fill: {e}"),
        }
    }
    for len in [4096usize, 100, 1] {
        while fs.write(fill, at, &vec![1u8; len]).is_ok() {
            at += len as u64;
        }
    }
    assert!(
        matches!(fs.write(c, 64 << 10, &[1u8; 4096]), Err(Error::NoSpace)),
        "the device is full: a write that needs a block is refused"
    );
    // A copy-on-write file's blocks are overwritten in place rather than refused.
    let c_model = rng.bytes(64 << 10);
    fs.write(c, 0, &c_model[..5000])
        .expect("full: overwrite in place");
    fs.write(c, 5000, &c_model[5000..])
        .expect("full: overwrite in place");
    // Every write below lands in blocks the files already have.
    let mut p_model = vec![0u8; 1 << 20];
    let mut k_model = Vec::new();
    for step in 0..300 {
        let (off, len) = match rng.below(3) {
            0 => (rng.below(16) * 65536, 65536),
            1 => (rng.below(1 << 20), 1 + rng.below(3 * BS as u64)),
            _ => (rng.below(256) * 4096, 4096),
        };
        let end = (off + len).min(1 << 20);
        let data = rng.bytes((end - off) as usize);
        let (o, e) = (off as usize, end as usize);
        fs.write(n, off, &data)
            .unwrap_or_else(|e| panic!("step {step}: NOCOW overwrite: {e}"));
        n_model[o..e].copy_from_slice(&data);
        fs.write(p, off, &data)
            .unwrap_or_else(|e| panic!("step {step}: write into fallocated range: {e}"));
        p_model[o..e].copy_from_slice(&data);
        if e <= 256 << 10 {
            fs.write(k, off, &data)
                .unwrap_or_else(|e| panic!("step {step}: write past the size, fallocated: {e}"));
            if k_model.len() < e {
                k_model.resize(e, 0);
            }
            k_model[o..e].copy_from_slice(&data);
        }
        if step % 50 == 49 {
            fs.sync().expect("sync");
        }
    }
    let check = |fs: &Fs, what: &str| {
        for (ino, model, file) in [
            (n, &n_model, "NOCOW file"),
            (p, &p_model, "fallocated file"),
            (k, &k_model, "keep-size file"),
            (c, &c_model, "copy-on-write file"),
        ] {
            let got = fs.read(ino, 0, 2 << 20).expect("read");
            assert!(got == *model, "{what}: {file}");
        }
    };
    check(&fs, "before remount");
    fs.sync().expect("sync");
    assert_clean(&dev);
    drop(fs);
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    check(&fs, "after remount");
}

#[test]
fn the_nocow_flag_follows_btrfs() {
    let (dev, fs) = mem_fs(32 << 20);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    assert_eq!(fs.flags(f).expect("flags"), 0);
    assert!(matches!(
        fs.set_flags(f, 0x10), // FS_IMMUTABLE_FL
        Err(Error::NotSupported(_))
    ));
    let ctime = fs.getattr(f).expect("getattr").ctime;
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(fs.set_flags(f, NOCOW_FL).expect("set"), NOCOW_FL);
    assert!(fs.getattr(f).expect("getattr").ctime > ctime, "ctime moves");
    assert_eq!(fs.set_flags(f, 0).expect("clear"), 0);
    // A file with data keeps what it has, as btrfs: the flag says how its data was written.
    fs.write(f, 0, b"data").expect("write");
    assert_eq!(fs.set_flags(f, NOCOW_FL).expect("set"), 0);
    assert_eq!(fs.flags(f).expect("flags"), 0);
    // So does an empty file with preallocated blocks.
    let g = fs.create(ROOT, b"g", 0o644, ME).expect("create").ino;
    fs.fallocate(g, 0, 8192, FALLOC_KEEP_SIZE)
        .expect("fallocate");
    assert_eq!(fs.set_flags(g, NOCOW_FL).expect("set"), 0);
    // Directories take it at any time and pass it on to files and directories, not symlinks.
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir").ino;
    fs.create(d, b"old", 0o644, ME).expect("create");
    assert_eq!(fs.set_flags(d, NOCOW_FL).expect("set"), NOCOW_FL);
    let sub = fs.mkdir(d, b"sub", 0o755, ME).expect("mkdir").ino;
    let deep = fs.create(sub, b"deep", 0o644, ME).expect("create").ino;
    let link = fs.symlink(d, b"l", b"target", ME).expect("symlink").ino;
    assert_eq!(fs.flags(sub).expect("flags"), NOCOW_FL);
    assert_eq!(fs.flags(deep).expect("flags"), NOCOW_FL);
    assert_eq!(fs.flags(link).expect("flags"), 0);
    assert!(matches!(
        fs.set_flags(link, NOCOW_FL),
        Err(Error::Invalid(_))
    ));
    fs.set_flags(d, 0).expect("clear");
    let later = fs.create(d, b"later", 0o644, ME).expect("create").ino;
    assert_eq!(fs.flags(later).expect("flags"), 0);
    fs.sync().expect("sync");
    assert_clean(&dev);
    drop(fs);
    let fs = Fs::open(dev, opts()).expect("reopen");
    assert_eq!(fs.flags(deep).expect("flags"), NOCOW_FL);
    assert_eq!(fs.flags(d).expect("flags"), 0);
}

/// Every version of a file's bytes from one write to the next, with the generation of the
/// transaction each was written in.
struct History(Vec<(u64, Vec<u8>)>);

impl History {
    /// Whether every 512-byte sector of `got` is that sector of the last version written
    /// in generation `gen` or before (what `gen`'s commit made durable) or of a later one
    /// (a write in place that reached the device before the crash).
    fn explains(&self, got: &[u8], gen: u64) -> Result<(), String> {
        let from = self
            .0
            .iter()
            .rposition(|(g, _)| *g <= gen)
            .ok_or("no version that old")?;
        let tail = &self.0[from..];
        for (i, s) in got.chunks(512).enumerate() {
            let at = i * 512;
            if !tail.iter().any(|(_, v)| v.get(at..at + s.len()) == Some(s)) {
                let older: Vec<u64> = self.0[..from]
                    .iter()
                    .filter(|(_, v)| v.get(at..at + s.len()) == Some(s))
                    .map(|(g, _)| *g)
                    .collect();
                return Err(format!(
                    "sector {i} is in no version since generation {gen} (versions: {:?}; older ones with it: {older:?}; zeros: {})",
                    self.0.iter().map(|(g, _)| *g).collect::<Vec<_>>(),
                    s.iter().all(|&b| b == 0)
                ));
            }
        }
        Ok(())
    }
}

#[test]
fn a_crash_at_every_write_prefix_shows_zeros_or_whole_writes_in_preallocated_blocks() {
    let (mut rng, seed) = Rng::from_env("in_place crash");
    let rec = recorded();
    let fs = Fs::open(rec.clone(), opts()).expect("open");
    let gen = |fs: &Fs| fs.with_store(|s, _, _| s.generation);
    const SIZE: usize = 96 * BS;
    // Copy-on-write and preallocated: its first whole-block writes fill the blocks outside
    // the lock and convert them, with their sums, after.
    let p = fs.create(ROOT, b"p", 0o644, ME).expect("create").ino;
    fs.fallocate(p, 0, SIZE as u64, 0).expect("fallocate");
    let n = fs.create(ROOT, b"n", 0o644, ME).expect("create").ino;
    fs.set_flags(n, NOCOW_FL).expect("chattr +C");
    let mut n_now = rng.bytes(SIZE);
    fs.write(n, 0, &n_now).expect("write");
    let mut p_now = vec![0u8; SIZE];
    fs.sync().expect("sync");
    // The preallocated file is copy-on-write: its state at each commit, exactly.
    let mut p_at = vec![(gen(&fs) - 1, p_now.clone())];
    let mut n_hist = History(vec![(gen(&fs) - 1, n_now.clone())]);
    for _ in 0..8 {
        for _ in 0..1 + rng.below(5) {
            let off = rng.below(SIZE as u64 - 1);
            let len = (1 + rng.below(5 * BS as u64)).min(SIZE as u64 - off);
            let data = rng.bytes(len as usize);
            let (o, e) = (off as usize, (off + len) as usize);
            fs.write(p, off, &data).expect("write");
            p_now[o..e].copy_from_slice(&data);
            fs.write(n, off, &data).expect("overwrite");
            n_now[o..e].copy_from_slice(&data);
            n_hist.0.push((gen(&fs), n_now.clone()));
        }
        fs.sync().expect("sync");
        p_at.push((gen(&fs) - 1, p_now.clone()));
    }
    drop(fs);
    let events = rec.event_count();
    let mut checked = 0;
    for prefix in 0..=events {
        for tear in [Tear::None, Tear::TornLast(3), Tear::Drop(rng.next_u64())] {
            let img = rec.crash_image(prefix, tear);
            let dev = Arc::new(MemDevice::from_bytes(img.bytes));
            let Ok(fs) = Fs::open(dev.clone(), opts()) else {
                // Before the file system's first commit: nothing to look at.
                continue;
            };
            let at = fs.with_store(|s, _, _| s.generation - 1);
            let Some((_, want)) = p_at.iter().find(|(g, _)| *g == at) else {
                continue; // before the files were made
            };
            let got = fs.read(p, 0, SIZE).expect("read");
            assert!(
                got == *want,
                "seed {seed} prefix {prefix} {tear:?}: the preallocated file at generation {at} \
                 is not what was committed (first difference at {:?})",
                got.iter().zip(want).position(|(a, b)| a != b)
            );
            let got = fs.read(n, 0, SIZE).expect("read");
            n_hist
                .explains(&got, at)
                .unwrap_or_else(|e| panic!("seed {seed} prefix {prefix} {tear:?}: NOCOW: {e}"));
            checked += 1;
        }
    }
    assert!(
        checked > 100,
        "seed {seed}: only {checked} crash images checked"
    );
}

#[test]
fn fsync_makes_writes_in_place_durable_and_never_shows_what_preallocated_blocks_held() {
    let (mut rng, seed) = Rng::from_env("in_place fsync");
    let rec = recorded();
    // No discard: freed blocks keep their old bytes, which a preallocation may then own.
    let o = || idxfs_engine::OpenOptions {
        discard: false,
        ..opts()
    };
    let fs = Fs::open(rec.clone(), o()).expect("open");
    const SIZE: usize = 64 * BS;
    let old = fs.create(ROOT, b"old", 0o644, ME).expect("create").ino;
    fs.write(old, 0, &vec![0xEE; 4 * SIZE]).expect("write");
    fs.sync().expect("sync");
    fs.unlink(ROOT, b"old").expect("unlink");
    fs.sync().expect("sync");
    // Copy-on-write and preallocated: its first whole-block writes fill the blocks outside
    // the lock and convert them, with their sums, after.
    let p = fs.create(ROOT, b"p", 0o644, ME).expect("create").ino;
    fs.fallocate(p, 0, SIZE as u64, 0).expect("fallocate");
    let n = fs.create(ROOT, b"n", 0o644, ME).expect("create").ino;
    fs.set_flags(n, NOCOW_FL).expect("chattr +C");
    fs.write(n, 0, &rng.bytes(SIZE)).expect("write");
    // NOCOW and preallocated: its first whole-block writes fill the blocks outside the lock
    // and convert them after (`Inner::convert_written`).
    let np = fs.create(ROOT, b"np", 0o644, ME).expect("create").ino;
    fs.set_flags(np, NOCOW_FL).expect("chattr +C");
    fs.fallocate(np, 0, SIZE as u64, 0).expect("fallocate");
    let mut np_now = vec![0u8; SIZE];
    fs.sync().expect("sync");
    // Each round: writes in place (with and without the times, as FUSE's writeback cache
    // sends them), then an fsync; every crash from its start on must show, for the
    // preallocated file, what the last returned fsync left or what this one writes, never
    // the bytes the blocks held before; once it returned, this one's.
    let mut p_was = vec![0u8; SIZE];
    for round in 0..6 {
        let times = round % 2 == 0;
        let how = idxfs_engine::fs::WriteHow {
            times,
            kill: Default::default(),
        };
        let (mut p_now, mut n_now) = (p_was.clone(), fs.read(n, 0, SIZE).expect("read"));
        for i in 0..3 {
            // Half of them whole blocks: the NOCOW file's go to the device without the lock
            // (`Inner::plan_overwrite`), and the fsync must still flush them. The very first
            // is, so that some first write into the preallocated file's blocks does (a seed
            // whose whole-block writes all met blocks written before tested none).
            let (off, len) = if (round, i) == (0, 0) || rng.below(2) == 0 {
                let b = rng.below(SIZE as u64 / BS as u64);
                let n = 1 + rng.below(6).min(SIZE as u64 / BS as u64 - b - 1);
                (b * BS as u64, n * BS as u64)
            } else {
                let off = rng.below(SIZE as u64 - 1);
                (off, (1 + rng.below(6 * BS as u64)).min(SIZE as u64 - off))
            };
            let data = rng.bytes(len as usize);
            let (a, z) = (off as usize, (off + len) as usize);
            fs.write_with(p, off, &data, how).expect("write");
            p_now[a..z].copy_from_slice(&data);
            fs.write_with(n, off, &data, how).expect("overwrite");
            n_now[a..z].copy_from_slice(&data);
            fs.write_with(np, off, &data, how).expect("write");
            np_now[a..z].copy_from_slice(&data);
        }
        let from = rec.event_count();
        fs.fsync(np).expect("fsync");
        let to = rec.event_count();
        for prefix in from..=to {
            for tear in [
                Tear::None,
                Tear::Drop(rng.next_u64()),
                Tear::Drop(rng.next_u64()),
            ] {
                let dev = Arc::new(MemDevice::from_bytes(rec.crash_image(prefix, tear).bytes));
                let f = Fs::open(dev, o()).expect("open");
                let got = f.read(p, 0, SIZE).expect("read");
                let done = prefix == to;
                assert!(
                    got == p_now || (!done && got == p_was),
                    "seed {seed} round {round} prefix {prefix} of {from}..{to} {tear:?}: the \
                     preallocated file is neither the last fsync's nor this one's (first \
                     difference from this one at {:?}; old bytes there: {})",
                    got.iter().zip(&p_now).position(|(a, b)| a != b),
                    got.contains(&0xEE)
                );
                let np_got = f.read(np, 0, SIZE).expect("read");
                if done {
                    assert!(
                        f.read(n, 0, SIZE).expect("read") == n_now,
                        "seed {seed}: NOCOW"
                    );
                    assert!(
                        np_got == np_now,
                        "seed {seed} round {round}: the preallocated NOCOW file (first \
                         difference at {:?})",
                        np_got.iter().zip(&np_now).position(|(a, b)| a != b)
                    );
                }
            }
        }
        p_was = p_now;
    }
    assert!(
        fs.counters().overwrites_beside.get() > 0,
        "seed {seed}: no NOCOW overwrite went to the device without the lock"
    );
    assert!(
        fs.counters().fills_beside.get() > 0,
        "seed {seed}: no first write into the copy-on-write file's preallocated blocks went \
         to the device without the lock"
    );
}

#[test]
fn a_crash_while_a_full_device_overwrites_in_place_never_leaves_a_stale_sum() {
    let (mut rng, seed) = Rng::from_env("in_place full crash");
    let rec = recorded();
    let fs = Fs::open(rec.clone(), opts()).expect("open");
    const SIZE: usize = 32 * BS;
    let c = fs.create(ROOT, b"c", 0o644, ME).expect("create").ino;
    let mut versions = vec![rng.bytes(SIZE)];
    fs.write(c, 0, &versions[0]).expect("write");
    fs.sync().expect("sync");
    let fill = fs.create(ROOT, b"fill", 0o644, ME).expect("create").ino;
    let mut at = 0u64;
    for len in [256usize << 10, 4096, 100, 1] {
        while fs.write(fill, at, &vec![0x5a; len]).is_ok() {
            at += len as u64;
        }
    }
    fs.sync().expect("sync");
    assert!(
        matches!(fs.write(c, SIZE as u64, &[1u8; BS]), Err(Error::NoSpace)),
        "the device is full"
    );
    let from = rec.event_count();
    // Overwrites in place (the device has no room for copies), whole blocks and parts,
    // with and without a sync after them.
    // Every write's result is a version: a crash shows each sector as some write left it.
    for round in 0..6 {
        for _ in 0..3 {
            let mut now = versions.last().expect("a version").clone();
            let off = rng.below(SIZE as u64 - 1) as usize;
            let len = (1 + rng.below(3 * BS as u64) as usize).min(SIZE - off);
            let data = rng.bytes(len);
            fs.write(c, off as u64, &data).expect("overwrite in place");
            now[off..off + len].copy_from_slice(&data);
            versions.push(now);
        }
        if round % 2 == 1 {
            fs.sync().expect("sync");
        }
    }
    let drops = fs.counters().sum_drop_commits.get();
    assert!(drops > 0, "no overwrite dropped sums first");
    drop(fs);
    let events = rec.event_count();
    let mut checked = 0;
    for prefix in from..=events {
        for tear in [Tear::None, Tear::TornLast(3), Tear::Drop(rng.next_u64())] {
            let dev = Arc::new(MemDevice::from_bytes(rec.crash_image(prefix, tear).bytes));
            let f = Fs::open(dev.clone(), opts()).expect("open");
            // Every block reads (no sum left over bytes it does not match), and each
            // sector holds that sector of some version: nothing but written bytes.
            let got = f
                .read(c, 0, SIZE)
                .unwrap_or_else(|e| panic!("seed {seed} prefix {prefix} {tear:?}: {e}"));
            assert_eq!(got.len(), SIZE);
            for (i, s) in got.chunks(512).enumerate() {
                assert!(
                    versions.iter().any(|v| &v[i * 512..(i + 1) * 512] == s),
                    "seed {seed} prefix {prefix} {tear:?}: sector {i} is no version's"
                );
            }
            f.close().expect("close");
            assert_clean(&dev);
            checked += 1;
        }
    }
    assert!(checked > 30, "seed {seed}: only {checked} crash images");
}
