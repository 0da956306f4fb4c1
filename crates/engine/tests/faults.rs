//! A failing disk and a full disk: clear errors, read-only after an I/O error, nothing lost that
//! was committed, fsck clean.
mod common;
use common::digest::digest;
use common::*;
use idxfs_blockdev::{FaultDevice, MemDevice};
use idxfs_engine::{Error, Fs, MkfsOptions};
use std::sync::Arc;

#[test]
fn write_failure_turns_read_only_and_keeps_last_commit() {
    let mem = Arc::new(MemDevice::new(32 << 20));
    Fs::mkfs(mem.clone(), &MkfsOptions::default()).expect("mkfs");
    let dev = Arc::new(FaultDevice::new(mem.clone()));
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    let a = fs.create(ROOT, b"kept", 0o644, ME).expect("create");
    fs.write(a.ino, 0, &vec![5u8; 100_000]).expect("write");
    fs.sync().expect("sync");
    let committed = digest(&fs);
    fs.create(ROOT, b"lost", 0o644, ME).expect("create");
    dev.fail_writes_after(0);
    assert!(
        matches!(fs.sync(), Err(Error::Io(_))),
        "the failed commit reports EIO"
    );
    assert!(fs.failure().is_some());
    assert!(
        matches!(fs.create(ROOT, b"more", 0o644, ME), Err(Error::ReadOnly)),
        "read-only after the error"
    );
    // What a caller asks to make durable cannot be: EIO, the failure itself, as the kernel's
    // file systems answer (not EROFS).
    let r = fs.fsync(a.ino);
    assert!(
        matches!(r, Err(Error::Io(_))),
        "fsync after the failure: {r:?}"
    );
    assert_eq!(r.map_err(|e| e.errno()), Err(5));
    assert!(matches!(fs.sync(), Err(Error::Io(_))));
    // Reads still work from memory.
    assert_eq!(fs.read(a.ino, 0, 10).expect("read"), vec![5u8; 10]);
    drop(fs);
    dev.heal();
    assert_clean(&mem);
    let fs = Fs::open(mem.clone(), opts()).expect("reopen");
    assert_eq!(
        digest(&fs),
        committed,
        "the last commit is intact, the failed one absent"
    );
}

#[test]
fn flush_failure_is_an_error_too() {
    let mem = Arc::new(MemDevice::new(32 << 20));
    Fs::mkfs(mem.clone(), &MkfsOptions::default()).expect("mkfs");
    let dev = Arc::new(FaultDevice::new(mem.clone()));
    let fs = Fs::open(dev.clone(), opts()).expect("open");
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
    let mem = Arc::new(MemDevice::new(32 << 20));
    Fs::mkfs(mem.clone(), &MkfsOptions::default()).expect("mkfs");
    let dev = Arc::new(FaultDevice::new(mem.clone()));
    let fs = Arc::new(Fs::open(dev.clone(), opts()).expect("open"));
    let p = fs.create(ROOT, b"p", 0o644, ME).expect("create").ino;
    fs.fallocate(p, 0, 4 * BS as u64, 0).expect("fallocate");
    fs.sync().expect("sync");
    let fills = fs.counters().fills_beside.get();
    dev.fail_writes_after(0);
    let r = fs.write(p, 0, &vec![0xaa; 2 * BS]);
    assert!(matches!(r, Err(Error::Io(_))), "the failed fill: {r:?}");
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
