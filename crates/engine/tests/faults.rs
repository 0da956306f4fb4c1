//! A failing disk and a full disk: clear errors, read-only after a failed flush, a commit the
//! device refuses kept in memory until it takes writes again, nothing lost that was
//! committed, fsck clean.
mod common;
use common::digest::digest;
use common::*;
use idxfs_blockdev::{FaultDevice, MemDevice};
use idxfs_engine::{Error, Fs, MkfsOptions, OpenOptions};
use std::sync::Arc;

type Faulty = FaultDevice<Arc<MemDevice>>;

/// A fresh image of `bytes` in memory, behind a device that fails on command, opened with
/// `o`.
fn faulty_fs(bytes: u64, o: OpenOptions) -> (Arc<MemDevice>, Arc<Faulty>, Fs) {
    let mem = Arc::new(MemDevice::new(bytes));
    Fs::mkfs(mem.clone(), &MkfsOptions::default()).expect("mkfs");
    let dev = Arc::new(FaultDevice::new(mem.clone()));
    let fs = Fs::open(dev.clone(), o).expect("open");
    (mem, dev, fs)
}

/// The image on `mem` as a crash would leave it now: opened from a copy of its bytes, its
/// digest, after fsck found it clean.
fn crash_digest(mem: &MemDevice) -> String {
    let copy = Arc::new(MemDevice::from_bytes(mem.snapshot()));
    assert_clean(&copy);
    let fs = Fs::open(copy, opts()).expect("open the crash image");
    digest(&fs)
}

/// A commit whose writes the device refuses (EIO on write) stalls instead of stopping the
/// file system: durability requests answer the error, changes go on in memory, a crash
/// keeps the last commit, and once the device takes writes again the stalled commit and
/// everything after it become durable.
#[test]
fn a_refused_commit_write_stalls_and_loses_nothing() {
    let (mem, dev, fs) = faulty_fs(32 << 20, opts());
    let a = fs.create(ROOT, b"kept", 0o644, ME).expect("create");
    fs.write(a.ino, 0, &vec![5u8; 100_000]).expect("write");
    fs.sync().expect("sync");
    let committed = digest(&fs);
    fs.create(ROOT, b"made before", 0o644, ME).expect("create");
    // One run of nodes lands, then every write is refused: a torn commit, no superblock.
    dev.fail_writes_after(1);
    let r = fs.sync();
    assert!(matches!(r, Err(Error::Unwritten(_))), "{r:?}");
    assert_eq!(
        r.map_err(|e| e.errno()),
        Err(5),
        "EIO: the device said nothing else"
    );
    assert!(fs.failure().is_none(), "a refused write stops nothing");
    assert!(fs.counters().commit_stalls.get() >= 1);
    // Changes go on in memory; data the device refuses is a clean error.
    let b = fs
        .create(ROOT, b"made while refused", 0o644, ME)
        .expect("create while refused");
    let r = fs.write(b.ino, 0, &vec![6u8; 3 * 4096]);
    assert!(matches!(r, Err(Error::WriteRefused(_))), "{r:?}");
    fs.write(b.ino, 0, b"inline bytes")
        .expect("an inline write needs no device");
    let r = fs.fsync(b.ino);
    assert!(matches!(r, Err(Error::Unwritten(_))), "fsync: {r:?}");
    fs.mkdir(ROOT, b"dir", 0o755, ME)
        .expect("mkdir while refused");
    assert!(fs.failure().is_none());
    assert_eq!(
        crash_digest(&mem),
        committed,
        "a crash keeps the last commit"
    );
    // The device takes writes again: the next durability request writes it all.
    dev.heal();
    fs.fsync(b.ino).expect("fsync once the device takes writes");
    let all = digest(&fs);
    assert!(all.contains("made while refused") && all.contains("dir"));
    assert_eq!(crash_digest(&mem), all, "a crash now keeps everything");
    fs.close().expect("close");
    assert_clean(&mem);
    let fs = Fs::open(mem.clone(), opts()).expect("reopen");
    assert_eq!(digest(&fs), all);
}

/// While a commit is stalled, changes in memory stop at twice the dirty-node bound (the
/// cache cannot drop dirty nodes): past it, operations are refused before their first change
/// with the stalled commit's error; once the device takes writes, they go on.
#[test]
fn changes_past_twice_the_bound_wait_for_a_stalled_commit() {
    let o = OpenOptions {
        dirty_nodes_limit: 64,
        ..opts()
    };
    let (mem, dev, fs) = faulty_fs(64 << 20, o);
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir");
    fs.sync().expect("sync");
    dev.set_full(true);
    fs.create(d.ino, b"x", 0o644, ME).expect("create");
    assert_eq!(fs.sync().map_err(|e| e.errno()), Err(28));
    let mut made = 0u64;
    let refused = loop {
        match fs.create(d.ino, format!("f{made:06}").as_bytes(), 0o644, ME) {
            Ok(_) => made += 1,
            Err(e) => break e,
        }
        assert!(made < 200_000, "changes piled up without end");
    };
    assert!(matches!(refused, Error::Unwritten(_)), "{refused:?}");
    assert_eq!(refused.errno(), 28);
    assert!(made > 0 && fs.failure().is_none());
    dev.set_full(false);
    fs.sync().expect("sync once there is room");
    fs.create(d.ino, b"after", 0o644, ME).expect("create after");
    let all = digest(&fs);
    assert_eq!(
        all.matches("/d/f").count() as u64,
        made,
        "every create kept"
    );
    fs.close().expect("close");
    assert_clean(&mem);
    let fs = Fs::open(mem, opts()).expect("reopen");
    assert_eq!(digest(&fs), all);
}

/// The file system under a sparse image file fills up (every write ENOSPC): writes of data
/// and fsyncs answer ENOSPC, nothing stops, and once there is room an fsync makes every
/// change durable, the stalled commit first.
#[test]
fn a_full_disk_under_the_image_answers_enospc_and_goes_on_once_it_has_room() {
    let (mem, dev, fs) = faulty_fs(32 << 20, opts());
    let a = fs.create(ROOT, b"a", 0o644, ME).expect("create");
    fs.write(a.ino, 0, &vec![1u8; 64 << 10]).expect("write");
    fs.fsync(a.ino).expect("fsync");
    let durable = digest(&fs);
    dev.set_full(true);
    // An fsync log batch refused, then the commit it falls back to.
    let chmod = idxfs_engine::fs::SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    fs.setattr(a.ino, &chmod).expect("chmod while full");
    let r = fs.fsync(a.ino);
    assert_eq!(r.map_err(|e| e.errno()), Err(28), "ENOSPC");
    let b = fs.create(ROOT, b"b", 0o644, ME).expect("create while full");
    let r = fs.write(b.ino, 0, &vec![2u8; 64 << 10]);
    assert_eq!(r.map_err(|e| e.errno()), Err(28), "a data write: ENOSPC");
    // A commit of its own (no log to append to while one is stalled), refused too.
    let r = fs.fsync(b.ino);
    assert_eq!(r.map_err(|e| e.errno()), Err(28), "ENOSPC");
    assert_eq!(fs.sync().map_err(|e| e.errno()), Err(28));
    assert!(fs.failure().is_none(), "a full disk stops nothing");
    assert_eq!(crash_digest(&mem), durable, "a crash keeps the last fsync");
    // Room again.
    dev.set_full(false);
    fs.write(b.ino, 0, &vec![2u8; 64 << 10]).expect("write");
    fs.fsync(b.ino).expect("fsync");
    let all = digest(&fs);
    assert_eq!(crash_digest(&mem), all);
    fs.close().expect("close");
    assert_clean(&mem);
}

/// An fsync of `dir` whose first write the device refuses: it commits instead, succeeds,
/// stops nothing, and leaves the file system durable as it is.
fn fsync_commits_after_a_refused_write(mem: &MemDevice, dev: &Faulty, fs: &Fs, dir: u64) {
    let fallbacks = fs.counters().log_fallback_commits.get();
    dev.refuse_next_writes(1);
    fs.fsync(dir).expect("the fsync commits instead");
    assert!(fs.failure().is_none());
    assert_eq!(fs.counters().log_fallback_commits.get(), fallbacks + 1);
    assert_eq!(crash_digest(mem), digest(fs), "durable after the fsync");
}

/// An fsync log batch the device refuses, while the commit after it goes through: the
/// fsync commits instead and returns success, and the next fsyncs log to the new chain
/// again (the old chain's failure is behind the commit).
#[test]
fn a_refused_log_batch_is_made_durable_by_a_commit() {
    let (mem, dev, fs) = faulty_fs(32 << 20, opts());
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir");
    fs.sync().expect("sync");
    fs.create(d.ino, b"first", 0o644, ME).expect("create");
    fsync_commits_after_a_refused_write(&mem, &dev, &fs, d.ino);
    let fallbacks = fs.counters().log_fallback_commits.get();
    // Logged again, not committed: the new chain is sound.
    let batches = fs.counters().log_batches.get();
    fs.create(d.ino, b"second", 0o644, ME).expect("create");
    fs.fsync(d.ino).expect("fsync");
    assert_eq!(fs.counters().log_batches.get(), batches + 1, "a log batch");
    assert_eq!(fs.counters().log_fallback_commits.get(), fallbacks);
    assert_eq!(crash_digest(&mem), digest(&fs), "durable by the log");
    fs.close().expect("close");
    assert_clean(&mem);
}

/// The first commit after an open that met an unusable superblock copy zeroes its log
/// chain's first block, and the chain's first batch zeroes the block it links to
/// (`TxnState::zero_log_head`, `Log::zero_next`): a refused write of either is a refused
/// commit write or a refused batch, which stalls or commits instead, and stops nothing.
#[test]
fn refused_zeroing_writes_after_a_damaged_superblock_copy_stop_nothing() {
    let mem = Arc::new(MemDevice::from_bytes(image_with_a_damaged_superblock_copy(
        32 << 20,
    )));
    let dev = Arc::new(FaultDevice::new(mem.clone()));
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir");
    // The commit's first write is the log head's zeroing.
    dev.refuse_next_writes(1);
    let r = fs.sync();
    assert!(matches!(r, Err(Error::Unwritten(_))), "{r:?}");
    assert!(fs.failure().is_none(), "a refused zeroing stops nothing");
    fs.sync().expect("the stalled commit written again");
    assert_eq!(crash_digest(&mem), digest(&fs), "durable after the sync");
    // The chain's first batch zeroes the block it links to first.
    fs.create(d.ino, b"logged", 0o644, ME).expect("create");
    fsync_commits_after_a_refused_write(&mem, &dev, &fs, d.ino);
    fs.close().expect("close");
    assert_clean(&mem);
}

#[test]
fn flush_failure_is_an_error_too() {
    let (_mem, dev, fs) = faulty_fs(32 << 20, opts());
    fs.create(ROOT, b"x", 0o644, ME).expect("create");
    dev.set_fail_flush(true);
    assert!(fs.sync().is_err());
    assert!(matches!(
        fs.mkdir(ROOT, b"y", 0o755, ME),
        Err(Error::ReadOnly)
    ));
}

#[test]
fn read_failure_is_eio_not_panic() {
    let mem = Arc::new(MemDevice::new(32 << 20));
    Fs::mkfs(mem.clone(), &MkfsOptions::default()).expect("mkfs");
    {
        let fs = Fs::open(mem.clone(), opts()).expect("open");
        let a = fs.create(ROOT, b"f", 0o644, ME).expect("create");
        fs.write(a.ino, 0, &vec![1u8; 50_000]).expect("write");
        fs.close().expect("close");
    }
    let dev = Arc::new(FaultDevice::new(mem.clone()));
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    let a = fs.lookup(ROOT, b"f").expect("lookup");
    dev.set_fail_reads(true);
    assert!(matches!(fs.read(a.ino, 0, 100), Err(Error::Io(_))));
}

#[test]
fn full_device_gives_enospc_and_corrupts_nothing() {
    let mem = Arc::new(MemDevice::new(24 << 20));
    Fs::mkfs(mem.clone(), &MkfsOptions::default()).expect("mkfs");
    let fs = Fs::open(mem.clone(), opts()).expect("open");
    let keep = fs.create(ROOT, b"keep", 0o644, ME).expect("create");
    fs.write(keep.ino, 0, b"precious").expect("write");
    fs.sync().expect("sync");
    let mut n = 0;
    let err = loop {
        let name = format!("fill{n}");
        match fs
            .create(ROOT, name.as_bytes(), 0o644, ME)
            .and_then(|a| fs.write(a.ino, 0, &vec![7u8; 256 << 10]))
        {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 10_000, "never filled up");
    };
    assert!(matches!(err, Error::NoSpace), "full device: {err}");
    assert!(
        fs.failure().is_none(),
        "ENOSPC must not turn the file system read-only"
    );
    // Many small creates until even metadata runs out.
    let mut m = 0;
    loop {
        match fs.create(ROOT, format!("small{m}").as_bytes(), 0o644, ME) {
            Ok(_) => m += 1,
            Err(Error::NoSpace) => break,
            Err(e) => panic!("unexpected error when full: {e}"),
        }
        assert!(m < 1_000_000);
    }
    fs.sync().expect("sync when full");
    assert_clean(&mem);
    // Deletes work on a full file system and give the space back.
    for i in 0..n {
        fs.unlink(ROOT, format!("fill{i}").as_bytes())
            .expect("unlink when full");
    }
    fs.sync().expect("sync");
    let a = fs
        .create(ROOT, b"again", 0o644, ME)
        .expect("create after freeing");
    fs.write(a.ino, 0, &vec![1u8; 1 << 20])
        .expect("write after freeing");
    assert_eq!(fs.read(keep.ino, 0, 100).expect("read"), b"precious");
    fs.close().expect("close");
    assert_clean(&mem);
}

/// A copy-on-write file's first write into preallocated blocks fills them without the lock
/// (`in_place`), and other writes into them wait until it converts them. When its device
/// write fails, the caller gets EIO, nothing stops, and the blocks are not left "being
/// filled": a later write into them goes through (were they left so, it would wait for ever).
#[test]
fn a_failed_fill_of_preallocated_blocks_leaves_them_to_the_next_write() {
    const BS: usize = 4096;
    let (mem, dev, fs) = faulty_fs(32 << 20, opts());
    let fs = Arc::new(fs);
    let p = fs.create(ROOT, b"p", 0o644, ME).expect("create").ino;
    fs.fallocate(p, 0, 4 * BS as u64, 0).expect("fallocate");
    fs.sync().expect("sync");
    let fills = fs.counters().fills_beside.get();
    dev.fail_writes_after(0);
    let r = fs.write(p, 0, &vec![0xaa; 2 * BS]);
    assert!(
        matches!(r, Err(Error::WriteRefused(_))),
        "the failed fill: {r:?}"
    );
    dev.heal();
    assert_eq!(
        fs.counters().fills_beside.get(),
        fills + 1,
        "the fill was planned outside the lock"
    );
    assert!(fs.failure().is_none(), "a failed data write stops nothing");
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let r = fs.write(p, 0, &vec![0xbb; 2 * BS]);
            // Before the answer: the file system is closed once the answer is in.
            drop(fs);
            let _ = tx.send(r);
        });
    }
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .expect("the next write into the blocks waited for a fill that had failed")
        .expect("write");
    let mut want = vec![0xbb; 2 * BS];
    want.resize(4 * BS, 0);
    assert!(fs.read(p, 0, 4 * BS).expect("read") == want);
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("fs still shared"));
    fs.close().expect("close");
    assert_clean(&mem);
}
