//! The fsync log (seed 003): what an fsync returned for survives any later crash, a crash
//! never opens to a state no fsync or commit produced, data freed after an fsync is not reused
//! before the commit, and an fsync's cost follows the change, not the directory.
mod common;
use common::digest::digest;
use common::*;
use idxfs_blockdev::{MemDevice, RecordingDevice, Tear};
use idxfs_engine::testutil::Rng;
use idxfs_engine::{Error, Fs, MkfsOptions, OpenOptions};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A fresh image of `bytes` on a device that records every write from here on.
fn recording_device(bytes: u64) -> Arc<RecordingDevice> {
    let base = Arc::new(MemDevice::new(bytes));
    Fs::mkfs(
        base.clone(),
        &MkfsOptions {
            node_size: 4096,
            uuid: Some([5; 16]),
            ..Default::default()
        },
    )
    .expect("mkfs");
    Arc::new(RecordingDevice::new(base.snapshot()))
}

fn recording_fs(bytes: u64) -> (Arc<RecordingDevice>, Fs) {
    let rec = recording_device(bytes);
    let fs = Fs::open(rec.clone(), opts()).expect("open");
    (rec, fs)
}

/// A mount appends to a log only after its own first commit (see `log.rs`).
fn start_log(fs: &Fs) {
    fs.mkdir(ROOT, b"first-commit", 0o755, ME).expect("mkdir");
    fs.sync().expect("sync");
}

/// Random operations; after each round an fsync of some file (now and then a commit instead).
/// Returns (device events when the fsync or commit returned, digest then), oldest first.
fn workload(fs: &Fs, rng: &mut Rng, rounds: usize, rec: &RecordingDevice) -> Vec<(usize, String)> {
    let mut states = vec![(rec.event_count(), digest(fs))];
    let mut files: Vec<(u64, u64, Vec<u8>)> = Vec::new(); // (parent, ino, name)
    let mut dirs = vec![ROOT];
    let mut n = rng.below(1 << 40);
    for round in 0..rounds {
        for _ in 0..rng.below(8) + 1 {
            n += 1;
            let parent = dirs[rng.below(dirs.len() as u64) as usize];
            match rng.below(10) {
                0 => dirs.push(
                    fs.mkdir(parent, format!("d{n}").as_bytes(), 0o755, ME)
                        .expect("mkdir")
                        .ino,
                ),
                1..=3 => {
                    let name = format!("f{n}").into_bytes();
                    let a = fs.create(parent, &name, 0o644, ME).expect("create");
                    let len = [10usize, 3000, 9000, 40_000][rng.below(4) as usize];
                    fs.write(a.ino, rng.below(5000), &rng.bytes(len))
                        .expect("write");
                    files.push((parent, a.ino, name));
                }
                4 if !files.is_empty() => {
                    let (p, _, name) = files.swap_remove(rng.below(files.len() as u64) as usize);
                    fs.unlink(p, &name).expect("unlink");
                }
                5 if !files.is_empty() => {
                    let i = rng.below(files.len() as u64) as usize;
                    let (p, _, name) = files[i].clone();
                    let to = format!("r{n}").into_bytes();
                    fs.rename(p, &name, parent, &to, 0).expect("rename");
                    files[i] = (parent, files[i].1, to);
                }
                6 if !files.is_empty() => {
                    let ino = files[rng.below(files.len() as u64) as usize].1;
                    fs.truncate(ino, rng.below(20_000)).expect("truncate");
                }
                7 if !files.is_empty() => {
                    let ino = files[rng.below(files.len() as u64) as usize].1;
                    let len = [40usize, 1500, 9000, 65536][rng.below(4) as usize];
                    fs.setxattr(ino, b"user.k", &rng.bytes(len), 0)
                        .expect("setxattr");
                }
                8 if !files.is_empty() => {
                    let (p, ino, _) = files[rng.below(files.len() as u64) as usize].clone();
                    link_long_names(fs, rng, (p, ino), &mut n, &mut files);
                }
                _ => {
                    let len = [6usize, 3000, 4095][rng.below(3) as usize];
                    let target: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
                    fs.symlink(parent, format!("s{n}").as_bytes(), &target, ME)
                        .expect("symlink");
                }
            }
        }
        if round % 5 == 4 {
            fs.sync().expect("sync");
        } else {
            let ino = files.last().map_or(ROOT, |f| f.1);
            fs.fsync(ino).expect("fsync");
        }
        states.push((rec.event_count(), digest(fs)));
    }
    states
}

/// The crash image of `rec` at `prefix` with `tear`, checked clean (the committed state alone
/// is consistent, log or not) and opened; the state it opened to (`state_of` its digest:
/// which state produced it) must be one some fsync or commit produced, no older than
/// state `durable`. `at` names the image in messages.
fn open_crash_image(
    rec: &RecordingDevice,
    prefix: usize,
    tear: Tear,
    durable: usize,
    state_of: impl Fn(&str) -> Option<usize>,
    at: &str,
) -> (Arc<MemDevice>, Fs) {
    let img = rec.crash_image(prefix, tear);
    let dev = Arc::new(MemDevice::from_bytes(img.bytes));
    assert_clean(&dev);
    let fs = Fs::open(dev.clone(), opts()).unwrap_or_else(|e| panic!("{at}: open failed: {e}"));
    let got = state_of(&digest(&fs))
        .unwrap_or_else(|| panic!("{at}: opened a state no fsync or commit produced"));
    assert!(
        got >= durable,
        "{at}: opened state {got}, but state {durable} was durable"
    );
    (dev, fs)
}

#[test]
fn every_crash_opens_to_an_fsynced_state_no_older_than_the_last_returned() {
    let (mut rng, seed) = Rng::from_env("fsync log crash");
    let (rec, fs) = recording_fs(16 << 20);
    let states = workload(&fs, &mut rng, 16, &rec);
    let batches = fs.counters().log_batches.get();
    drop(fs);
    let events = rec.event_count();
    eprintln!(
        "seed {seed}: {events} device events, {} states, {batches} log batches",
        states.len()
    );
    assert!(
        batches >= 8,
        "the workload must go through the log: {batches} batches"
    );
    let mut replayed = 0;
    for prefix in 0..=events {
        // The newest state whose fsync or commit had returned by this prefix.
        let durable = states.iter().rposition(|s| s.0 <= prefix).unwrap_or(0);
        for tear in [Tear::None, Tear::TornLast(1), Tear::Drop(rng.next_u64())] {
            let at = format!("seed {seed} prefix {prefix} {tear:?}");
            let state = |d: &str| states.iter().rposition(|s| s.1 == d);
            let (dev, fs) = open_crash_image(&rec, prefix, tear, durable, state, &at);
            replayed += fs.counters().log_replayed_batches.get();
            // The replay was committed; the image keeps working, log included.
            assert_clean(&dev);
            let f = fs
                .create(ROOT, b"after-crash", 0o644, ME)
                .expect("create after crash");
            fs.write(f.ino, 0, b"more").expect("write after crash");
            fs.fsync(f.ino).expect("fsync after crash");
            drop(fs);
            assert_clean(&dev);
        }
    }
    assert!(
        replayed > 0,
        "no crash image needed the log: not a test of it"
    );
}

#[test]
fn data_freed_after_an_fsync_is_not_reused_before_the_commit() {
    let (rec, fs) = recording_fs(16 << 20);
    start_log(&fs);
    let a = fs.create(ROOT, b"a", 0o644, ME).expect("create a");
    let pa = vec![0xa5u8; 64 << 10];
    fs.write(a.ino, 0, &pa).expect("write a");
    fs.fsync(a.ino).expect("fsync a");
    assert_eq!(fs.counters().log_batches.get(), 1);
    // Freed after the batch that names them: reusing them now would overwrite what a crash
    // brings back, so they wait for the commit like committed data does.
    let pinned = |fs: &Fs| fs.with_store(|s, _, _| s.alloc.pinned_blocks());
    let before = pinned(&fs);
    fs.truncate(a.ino, 0).expect("truncate a");
    assert_eq!(
        pinned(&fs) - before,
        16,
        "a's 16 blocks wait for the commit"
    );
    let b = fs.create(ROOT, b"b", 0o644, ME).expect("create b");
    fs.write(b.ino, 0, &vec![0x3cu8; 256 << 10])
        .expect("write b");
    std::mem::forget(fs); // a crash: no commit at close
    let img = rec.crash_image(rec.event_count(), Tear::None);
    let fs = Fs::open(Arc::new(MemDevice::from_bytes(img.bytes)), opts()).expect("open");
    let a = fs.lookup(ROOT, b"a").expect("a survives");
    assert_eq!(a.size, pa.len() as u64);
    assert!(
        fs.read(a.ino, 0, pa.len()).expect("read a") == pa,
        "a's fsynced data was overwritten"
    );
    assert!(fs.lookup(ROOT, b"b").is_err(), "b was never fsynced");
}

#[test]
fn data_freed_with_no_fsync_since_it_was_written_is_reusable_at_once() {
    // Without discard: with it, freed data always waits for the next commit, to be
    // discarded then (`space::discard`), which the second half checks.
    for discard in [false, true] {
        let rec = recording_device(16 << 20);
        let o = OpenOptions { discard, ..opts() };
        let fs = Fs::open(rec.clone(), o).expect("open");
        start_log(&fs);
        let a = fs.create(ROOT, b"a", 0o644, ME).expect("create a");
        fs.write(a.ino, 0, &[1u8; 64 << 10]).expect("write a");
        let pinned = |fs: &Fs| fs.with_store(|s, _, _| s.alloc.pinned_blocks());
        let before = pinned(&fs);
        fs.truncate(a.ino, 0).expect("truncate a");
        if discard {
            assert_eq!(pinned(&fs) - before, 16, "a's blocks wait to be discarded");
            fs.sync().expect("sync");
            assert_eq!(pinned(&fs), 0, "discarded by the commit, then free");
        } else {
            assert_eq!(pinned(&fs), before, "no batch names a's blocks");
        }
    }
}

#[test]
fn an_fsync_logs_what_changed_not_the_directory() {
    // 100 creates then an fsync, in a directory of 1,000 entries and in one of 20,000: the
    // batch is the same size, and no tree node is written.
    let mut sizes = Vec::new();
    for entries in [1_000u64, 20_000] {
        let (_dev, fs) = mem_fs(256 << 20);
        let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir");
        for i in 0..entries {
            fs.create(d.ino, format!("old{i:08}").as_bytes(), 0o644, ME)
                .expect("create");
        }
        fs.sync().expect("sync");
        let c = fs.counters();
        let (blocks, nodes) = (c.log_blocks.get(), c.node_writes.get());
        for i in 0..100 {
            fs.create(d.ino, format!("new{i:08}").as_bytes(), 0o644, ME)
                .expect("create");
        }
        fs.fsync(d.ino).expect("fsync");
        assert_eq!(c.node_writes.get(), nodes, "fsync committed");
        sizes.push(c.log_blocks.get() - blocks);
        fs.close().expect("close");
    }
    eprintln!("log blocks for 100 creates and an fsync: {sizes:?}");
    assert_eq!(sizes[0], sizes[1], "log blocks per fsync: {sizes:?}");
    assert!(sizes[0] <= 16, "100 creates took {} log blocks", sizes[0]);
}

#[test]
fn a_change_too_large_to_log_commits_and_the_log_resumes_after() {
    let (_dev, fs) = mem_fs(256 << 20);
    start_log(&fs);
    let c = fs.counters();
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir");
    // Four or five item changes per create: past the changed keys a transaction keeps.
    for i in 0..70_000u32 {
        fs.create(d.ino, format!("f{i:06}").as_bytes(), 0o644, ME)
            .expect("create");
    }
    let commits = c.commits.get();
    fs.fsync(d.ino).expect("fsync");
    assert_eq!(c.log_batches.get(), 0, "too large to log");
    assert_eq!(c.log_fallback_commits.get(), 1);
    assert_eq!(c.commits.get(), commits + 1);
    fs.create(d.ino, b"small", 0o644, ME).expect("create");
    fs.fsync(d.ino).expect("fsync");
    assert_eq!(c.log_batches.get(), 1, "the next fsync logs");
}

#[test]
fn a_read_only_open_shows_the_fsynced_state_and_writes_nothing() {
    let (rec, fs) = recording_fs(16 << 20);
    start_log(&fs);
    let f = fs.create(ROOT, b"kept", 0o644, ME).expect("create");
    fs.write(f.ino, 0, b"fsynced").expect("write");
    fs.fsync(f.ino).expect("fsync");
    std::mem::forget(fs);
    let img = rec.crash_image(rec.event_count(), Tear::None).bytes;
    let dev = Arc::new(MemDevice::from_bytes(img.clone()));
    let ro = idxfs_engine::OpenOptions {
        read_only: true,
        ..opts()
    };
    let fs = Fs::open(dev.clone(), ro).expect("open read-only");
    let f = fs.lookup(ROOT, b"kept").expect("the fsynced file");
    assert_eq!(fs.read(f.ino, 0, 7).expect("read"), b"fsynced");
    drop(fs);
    assert!(
        dev.snapshot() == img,
        "a read-only open wrote to the device"
    );
}

/// fsck of an image whose log has batches: a note says so, and the state after replay is
/// checked too. Regression: fsck never read the log, so an image whose log does not replay
/// (open refuses it) was reported clean.
#[test]
fn fsck_checks_what_replaying_the_log_would_give() {
    let (rec, fs) = recording_fs(16 << 20);
    start_log(&fs);
    let f = fs.create(ROOT, b"kept", 0o644, ME).expect("create");
    fs.write(f.ino, 0, &[7u8; 10_000]).expect("write");
    fs.fsync(f.ino).expect("fsync");
    std::mem::forget(fs);
    let img = rec.crash_image(rec.event_count(), Tear::None).bytes;
    let dev: Arc<dyn idxfs_blockdev::BlockDevice> = Arc::new(MemDevice::from_bytes(img.clone()));
    let r =
        idxfs_engine::fsck::check(&dev, idxfs_format::hash::name_hash, &mut |_| {}).expect("fsck");
    assert!(r.is_clean(), "{:?}", r.problems);
    assert!(
        r.notes
            .iter()
            .any(|n| n.starts_with("fsync log: 1 batches")),
        "{:?}",
        r.notes
    );
    // The log's first record made unreadable (its kind), the block resealed: the chain
    // still checks out, but no open can replay it.
    let sb = idxfs_engine::fs::read_superblock(dev.as_ref()).expect("superblock");
    let head = sb.log_root.block.get() as usize * 4096;
    let mut bad = img;
    let block = &mut bad[head..head + 4096];
    block[idxfs_format::log::LOG_HEADER_SIZE] = 0x7f;
    let c = crc32c::crc32c(&block[4..]);
    block[..4].copy_from_slice(&c.to_le_bytes());
    assert!(Fs::open(Arc::new(MemDevice::from_bytes(bad.clone())), opts()).is_err());
    let dev: Arc<dyn idxfs_blockdev::BlockDevice> = Arc::new(MemDevice::from_bytes(bad));
    let r =
        idxfs_engine::fsck::check(&dev, idxfs_format::hash::name_hash, &mut |_| {}).expect("fsck");
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("fsync log: an open cannot replay it")),
        "{:?}",
        r.problems
    );
}

/// A recording device that stalls each write for a random moment, so that batches built in
/// one order under the lock reach the device in another.
struct Jitter {
    inner: Arc<RecordingDevice>,
    seed: std::sync::atomic::AtomicU64,
}

impl idxfs_blockdev::BlockDevice for Jitter {
    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
        let r = Rng::new(self.seed.fetch_add(1, Ordering::Relaxed)).below(4);
        match r {
            0 => std::thread::sleep(std::time::Duration::from_micros(200)),
            1 => std::thread::yield_now(),
            _ => {}
        }
        self.inner.write_at(buf, off)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

/// Threads fsync their own files concurrently, so their batches are written and flushed
/// outside the lock in any order (`log_io`), with now and then a commit that releases the
/// chain they are written to. At every crash point, each thread's files as of its last fsync
/// (or sync) that had returned are there with their contents: an fsync must not return
/// before the batches ahead of its own in the chain are durable too, or a crash between
/// them loses it (replay stops at the first missing block); and a batch still being written
/// when a commit releases its blocks must land before they are reused.
#[test]
fn concurrent_fsyncs_survive_every_crash_whatever_order_their_batches_land_in() {
    let (mut rng, seed) = Rng::from_env("concurrent fsync crash");
    let rec = recording_device(16 << 20);
    let dev = Arc::new(Jitter {
        inner: rec.clone(),
        seed: seed.into(),
    });
    let fs = Fs::open(dev, opts()).expect("open");
    const THREADS: u64 = 3;
    let dirs: Vec<u64> = (0..THREADS)
        .map(|t| {
            fs.mkdir(ROOT, format!("t{t}").as_bytes(), 0o755, ME)
                .expect("mkdir")
                .ino
        })
        .collect();
    start_log(&fs);
    // Per thread: (device events when an fsync returned, the files it covered).
    type Synced = Vec<(usize, Vec<(Vec<u8>, Vec<u8>)>)>;
    let synced: Vec<Synced> = std::thread::scope(|s| {
        let handles: Vec<_> = dirs
            .iter()
            .enumerate()
            .map(|(t, &dir)| {
                let (fs, rec) = (&fs, &rec);
                let mut rng = Rng::new(seed ^ ((t as u64 + 1) * 0x9e37));
                s.spawn(move || {
                    let mut files = Vec::new();
                    let mut out = Vec::new();
                    for i in 0..24 {
                        let name = format!("f{i}").into_bytes();
                        let len = 1 + rng.below(9000) as usize;
                        let data = rng.bytes(len);
                        let a = fs.create(dir, &name, 0o644, ME).expect("create");
                        fs.write(a.ino, 0, &data).expect("write");
                        files.push((name, data));
                        match rng.below(8) {
                            // A commit beside the others' batches: it releases the chain
                            // they are being written to.
                            0 => fs.sync().expect("sync"),
                            1..=4 => fs.fsync(a.ino).expect("fsync"),
                            _ => continue,
                        }
                        out.push((rec.event_count(), files.clone()));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    let batches = fs.counters().log_batches.get();
    drop(fs);
    let events = rec.event_count();
    eprintln!("seed {seed}: {events} device events, {batches} log batches");
    assert!(batches >= 12, "the run must go through the log: {batches}");
    for prefix in 0..=events {
        for tear in [Tear::None, Tear::Drop(rng.next_u64())] {
            let img = rec.crash_image(prefix, tear);
            let dev = Arc::new(MemDevice::from_bytes(img.bytes));
            let fs = Fs::open(dev.clone(), opts()).unwrap_or_else(|e| {
                panic!("seed {seed} prefix {prefix} {tear:?}: open failed: {e}")
            });
            for (t, synced) in synced.iter().enumerate() {
                let Some((_, files)) = synced.iter().rev().find(|s| s.0 <= prefix) else {
                    continue;
                };
                for (name, data) in files {
                    let what = format!(
                        "seed {seed} prefix {prefix} {tear:?}: thread {t}'s {} fsynced",
                        String::from_utf8_lossy(name)
                    );
                    let a = fs
                        .lookup(dirs[t], name)
                        .unwrap_or_else(|e| panic!("{what}, then lost: {e}"));
                    let got = fs.read(a.ino, 0, data.len() + 1).expect("read");
                    assert!(got == *data, "{what}, then read back different data");
                }
            }
            drop(fs);
            assert_clean(&dev);
        }
    }
}

/// A replay that lets go of extents lying end to end across a block group boundary (one
/// file's data filled a group and went on in the next) frees them a group at a time.
/// Regression (found before landing): a replay that let go of them as one run had the free
/// refuse a run across groups as corruption, and the image no longer opened after the crash.
#[test]
fn a_replay_frees_extents_that_meet_across_a_group_boundary() {
    let (dev, fs) = mem_fs_with(64 << 20, 4096);
    let group = 4096; // node_size blocks (`Fs::mkfs`)
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.write(f, 0, &vec![3u8; 24 << 20]).expect("write");
    let blocks = extent_blocks(&fs, f);
    assert!(
        blocks
            .windows(2)
            .any(|w| w[1].1 == w[0].1 + 1 && w[1].1 % group == 0),
        "the test needs f's blocks to run on across a group boundary"
    );
    fs.sync().expect("sync");
    fs.unlink(ROOT, b"f").expect("unlink");
    let g = fs.create(ROOT, b"g", 0o644, ME).expect("create").ino;
    let commits = fs.counters().commits.get();
    fs.fsync(g).expect("fsync");
    assert_eq!(fs.counters().commits.get(), commits, "the fsync committed");
    let crashed = Arc::new(MemDevice::from_bytes(dev.snapshot()));
    drop(fs);
    let fs = Fs::open(crashed.clone(), opts()).expect("open after the crash");
    assert!(fs.lookup(ROOT, b"f").is_err(), "the unlink was fsynced");
    let free = fs.statfs().expect("statfs").blocks_free;
    assert!(
        free > (20 << 20) / 4096,
        "f's blocks are free again: {free}"
    );
    fs.close().expect("close");
    assert_clean(&crashed);
}

/// After an open that met an unusable superblock copy, the log chain of the reused
/// generation zeroes each block before linking to it (`Log::zero_next`): every fsync still
/// survives a crash at every point, every crash image opens to an fsynced state, fsck clean.
#[test]
fn fsyncs_after_a_damaged_superblock_copy_survive_every_crash() {
    let (mut rng, seed) = Rng::from_env("fsync after a damaged superblock copy");
    let img = image_with_a_damaged_superblock_copy(16 << 20);
    let rec = Arc::new(RecordingDevice::new(img));
    let fs = Fs::open(rec.clone(), opts()).expect("open");
    let mut states = vec![digest(&fs)];
    let mut marks = vec![rec.event_count()];
    for i in 0..6 {
        let f = fs
            .create(ROOT, format!("f{i}").as_bytes(), 0o644, ME)
            .expect("create")
            .ino;
        fs.write(f, 0, &vec![i as u8; 3000 * (i + 1)])
            .expect("write");
        fs.fsync(f).expect("fsync");
        states.push(digest(&fs));
        marks.push(rec.event_count());
    }
    drop(fs);
    let events = rec.event_count();
    for prefix in 0..=events {
        for tear in [Tear::None, Tear::TornLast(1), Tear::Drop(rng.next_u64())] {
            let at = format!("seed {seed} prefix {prefix} {tear:?}");
            let dev = Arc::new(MemDevice::from_bytes(rec.crash_image(prefix, tear).bytes));
            let fs = Fs::open(dev.clone(), opts()).unwrap_or_else(|e| panic!("{at}: {e}"));
            let got = digest(&fs);
            fs.close().expect("close");
            assert_clean(&dev);
            // No older than the last fsync that returned before the cut.
            let done = marks.iter().rposition(|&m| m <= prefix).unwrap_or(0);
            let i = states.iter().position(|s| *s == got);
            assert!(
                i.is_some_and(|i| i >= done),
                "{at}: not an fsynced state at or after the last returned ({done}): {i:?}"
            );
        }
    }
}

/// Refused writes (`Error::Unwritten`) around fsyncs and commits: an fsync whose batch the
/// device refuses commits instead, a commit the device refuses stalls and is written again
/// by the next durability request. Every crash opens to a state some fsync or commit
/// produced (one that was refused may land later, when written again), never older than
/// the last that returned success.
#[test]
fn every_crash_around_refused_writes_opens_to_a_state_no_older_than_the_last_durable() {
    let (mut rng, seed) = Rng::from_env("refused writes crash");
    let rec = recording_device(16 << 20);
    let dev = Arc::new(idxfs_blockdev::FaultDevice::new(rec.clone()));
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    // (device events when the call returned, digest then, whether it returned success).
    let mut states = vec![(rec.event_count(), digest(&fs), true)];
    start_log(&fs);
    states.push((rec.event_count(), digest(&fs), true));
    let mut files: Vec<(u64, Vec<u8>)> = Vec::new();
    let (mut refused, mut n) = (0, 0u64);
    for round in 0..24 {
        for _ in 0..rng.below(6) + 1 {
            n += 1;
            match rng.below(5) {
                0..=2 => {
                    let name = format!("f{n}").into_bytes();
                    let a = fs.create(ROOT, &name, 0o644, ME).expect("create");
                    let len = [10usize, 3000, 9000][rng.below(3) as usize];
                    fs.write(a.ino, 0, &rng.bytes(len)).expect("write");
                    files.push((a.ino, name));
                }
                3 if !files.is_empty() => {
                    let (_, name) = files.swap_remove(rng.below(files.len() as u64) as usize);
                    fs.unlink(ROOT, &name).expect("unlink");
                }
                _ if !files.is_empty() => {
                    let ino = files[rng.below(files.len() as u64) as usize].0;
                    fs.setxattr(ino, b"user.k", &rng.bytes(100), 0)
                        .expect("setxattr");
                }
                _ => {}
            }
        }
        let arm = rng.chance(35);
        if arm {
            dev.refuse_next_writes(rng.below(4) as i64 + 1);
        }
        let r = match round % 4 {
            3 => fs.sync(),
            _ => fs.fsync(files.last().map_or(ROOT, |f| f.0)),
        };
        dev.refuse_next_writes(0);
        match r {
            Ok(()) => {}
            Err(Error::Unwritten(_)) if arm => refused += 1,
            Err(e) => panic!("seed {seed} round {round}: {e}"),
        }
        assert!(
            fs.failure().is_none(),
            "seed {seed}: a refused write stopped it"
        );
        states.push((rec.event_count(), digest(&fs), r.is_ok()));
    }
    fs.sync().expect("the last sync, every write taken");
    states.push((rec.event_count(), digest(&fs), true));
    let stalls = fs.counters().commit_stalls.get();
    drop(fs);
    let events = rec.event_count();
    eprintln!("seed {seed}: {events} device events, {refused} refused fsyncs or syncs, {stalls} stalled commits");
    assert!(
        refused > 0 && stalls > 0,
        "seed {seed}: nothing was refused"
    );
    for prefix in 0..=events {
        let durable = states
            .iter()
            .rposition(|s| s.2 && s.0 <= prefix)
            .unwrap_or(0);
        for tear in [Tear::None, Tear::TornLast(1), Tear::Drop(rng.next_u64())] {
            let at = format!("seed {seed} prefix {prefix} {tear:?}");
            let state = |d: &str| states.iter().rposition(|s| s.1 == d);
            let (dev, fs) = open_crash_image(&rec, prefix, tear, durable, state, &at);
            drop(fs);
            assert_clean(&dev);
        }
    }
}
