//! Whole damaged images, fuzzed for a bounded time: an image holding every kind of item (and
//! an fsync log with batches) is damaged at random, mostly in metadata blocks with their
//! checksums sealed again (so the damage reaches the checks behind them), then fsck'd,
//! opened, walked file by file (attributes, data, targets, xattrs), written to, closed,
//! rolled back to a snapshot and fsck'd again; a copy of it is repaired. Every outcome is
//! allowed but a panic, a hang or an abort (damage must come back as a clear error), and a
//! repair that finishes leaving an image fsck does not find clean.
//!
//! CI runs it for `IDXFS_FUZZ_SECS` seconds (default 40); each case prints nothing unless it
//! fails, with its seed: `IDXFS_FUZZ_CASE=n` replays that one case. Cases that once found a
//! panic (`FOUND`) run first in every run (the damage is drawn against this base image, so
//! a change to what it holds may move such a case off its bug: the list is a floor, not a
//! proof).
mod common;
use common::*;
use idxfs_blockdev::{BlockDevice, MemDevice, RecordingDevice, Tear};
use idxfs_engine::testutil::Rng;
use idxfs_engine::{fsck, Fs, MkfsOptions};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BLOCK: usize = 4096;

/// An image with inline and block files, holes, long xattrs, many links of one inode in one
/// directory, long symlinks, a deep path, POSIX ACLs (a default ACL and what inherited it), an
/// orphan, a snapshot with blocks held for it and shared nodes, a deleted snapshot partly
/// dropped, and an fsync log of a few batches
/// (taken as a crash image after the last fsync, so the log replays at open). `clone`: also
/// a writable subvolume made from the snapshot, changed and snapshotted while it was active,
/// then parked, and an empty one written to and parked (the orphan is freed by the closes
/// that takes), then opened beside the file system's own tree, its fsyncs logged too.
fn base_image(clone: bool) -> Vec<u8> {
    let mem = Arc::new(MemDevice::new(8 << 20));
    Fs::mkfs(
        mem.clone(),
        &MkfsOptions {
            node_size: 4096,
            ..MkfsOptions::default()
        },
    )
    .expect("mkfs");
    let rec = Arc::new(RecordingDevice::new(mem.snapshot()));
    let fs = Fs::open(rec.clone(), opts()).expect("open");
    let d = fs.mkdir(ROOT, b"dir", 0o755, ME).expect("mkdir").ino;
    fs.setxattr(d, idxfs_engine::fs::ACL_DEFAULT, &named_acl(), 0)
        .expect("default ACL");
    let mut last = d;
    let mut first_file = 0;
    for i in 0..6 {
        last = fs
            .mkdir(last, format!("deep{i}").as_bytes(), 0o700, ME)
            .expect("mkdir")
            .ino;
    }
    for i in 0..40u64 {
        let f = fs
            .create(d, format!("file{i}").as_bytes(), 0o644, ME)
            .expect("create")
            .ino;
        if i == 3 {
            first_file = f;
        }
        let len = [10usize, 3000, 9000, 70_000][(i % 4) as usize];
        fs.write(f, i * 1000, &vec![i as u8; len]).expect("write");
        if i % 5 == 0 {
            fs.setxattr(f, b"user.long", &vec![3u8; 9000], 0)
                .expect("xattr");
            fs.setxattr(f, b"user.short", b"v", 0).expect("xattr");
        }
    }
    assert!(
        fs.getxattr(first_file, idxfs_engine::fs::ACL_ACCESS)
            .is_ok(),
        "the files in dir inherited its default ACL"
    );
    let l = fs.create(ROOT, b"linked", 0o644, ME).expect("create").ino;
    for i in 0..20 {
        let mut name = format!("link{i}-").into_bytes();
        name.resize(250, b'x');
        fs.link(l, ROOT, &name).expect("link");
    }
    fs.symlink(ROOT, b"short", b"dir/file1", ME)
        .expect("symlink");
    fs.symlink(ROOT, b"long", &vec![b'p'; 3000], ME)
        .expect("symlink");
    let held = fs.create(ROOT, b"held", 0o644, ME).expect("create").ino;
    fs.write(held, 0, &vec![1u8; 20_000]).expect("write");
    fs.pin(held);
    fs.unlink(ROOT, b"held").expect("unlink held");
    // Snapshots: one kept, whose files then change (shared nodes copied, blocks held), and
    // one deleted and let go of in part.
    fs.snapshot(b"kept").expect("snapshot");
    let gone = fs.snapshot(b"gone").expect("snapshot");
    for i in 0..10u64 {
        if let Ok(a) = fs.lookup(d, format!("file{i}").as_bytes()) {
            fs.write(a.ino, 0, &vec![7u8; 4096]).expect("overwrite");
        }
    }
    fs.unlink(d, b"file39").expect("unlink");
    fs.delete_snapshot(gone).expect("delete");
    fs.drop_step().expect("drop step");
    fs.sync().expect("sync");
    let (fs, beside) = match clone {
        false => (fs, None),
        true => {
            let kept = (fs.snapshots().expect("list").iter())
                .find(|s| s.name == b"kept")
                .expect("kept")
                .id;
            let c = fs.make_clone(kept, b"clone").expect("clone");
            fs.close().expect("close");
            let open_as = |id| {
                let o = idxfs_engine::OpenOptions {
                    subvolume: Some(id),
                    ..opts()
                };
                Fs::open(rec.clone(), o).expect("open a subvolume")
            };
            let fs = open_as(c);
            for i in 0..6u64 {
                if let Ok(a) = fs.lookup(d, format!("file{}", i + 20).as_bytes()) {
                    fs.write(a.ino, 100, &vec![8u8; 9000])
                        .expect("overwrite in the clone");
                }
            }
            fs.unlink(d, b"file30").expect("unlink in the clone");
            let f = fs.create(ROOT, b"cloned", 0o644, ME).expect("create").ino;
            fs.write(f, 0, &vec![6u8; 30_000]).expect("write");
            fs.snapshot(b"of the clone").expect("snapshot of the clone");
            fs.write(f, 0, &vec![4u8; 8192]).expect("write");
            // And an empty subvolume (no origin), written to and parked.
            let e = fs.make_subvolume(b"empty", ME).expect("empty subvolume");
            fs.close().expect("close");
            let fs = open_as(e);
            let g = fs.create(ROOT, b"own", 0o644, ME).expect("create").ino;
            fs.write(g, 0, &vec![5u8; 12_000]).expect("write");
            // And a writable snapshot of it (a hidden origin), written to.
            let w = fs
                .writable_snapshot(b"writable")
                .expect("writable snapshot");
            fs.close().expect("close");
            let fs = open_as(w);
            fs.write(g, 4096, &vec![3u8; 4096]).expect("write");
            fs.close().expect("close");
            // The empty one opened beside the file system's own tree again, changed and
            // committed: its fsyncs below log batches that name it.
            let fs = open_as(idxfs_format::FS_SUBVOL_ID);
            let sub = fs.open_subvolume(e).expect("open beside");
            sub.mkdir(ROOT, b"beside", 0o755, ME).expect("mkdir beside");
            fs.sync().expect("sync");
            (fs, Some(sub))
        }
    };
    // After the commit: changes that reach the image only through the log.
    for i in 0..3 {
        let f = fs
            .create(ROOT, format!("logged{i}").as_bytes(), 0o644, ME)
            .expect("create")
            .ino;
        fs.write(f, 0, &vec![9u8; 5000]).expect("write");
        fs.truncate(first_file, 100 * i).expect("truncate");
        fs.fsync(f).expect("fsync");
        if let Some(sub) = &beside {
            let b = (sub.create(ROOT, format!("logged{i}").as_bytes(), 0o644, ME))
                .expect("create beside")
                .ino;
            sub.write(b, 0, &vec![8u8; 6000]).expect("write beside");
            sub.fsync(b).expect("fsync beside");
        }
    }
    std::mem::forget(beside);
    std::mem::forget(fs);
    rec.crash_image(rec.event_count(), Tear::None).bytes
}

/// Blocks that hold metadata: superblocks, tree nodes, log blocks.
fn metadata_blocks(img: &[u8]) -> Vec<usize> {
    (0..img.len() / BLOCK)
        .filter(|&b| {
            let m = &img[b * BLOCK + 4..b * BLOCK + 8];
            b < 2 || m == b"IXND" || m == b"IXLG"
        })
        .collect()
}

fn reseal(block: &mut [u8]) {
    let c = crc32c::crc32c(&block[4..]);
    block[..4].copy_from_slice(&c.to_le_bytes());
}

/// Damages a copy of `base`: a few bytes of metadata blocks set at random (most resealed),
/// now and then a data block or a field-sized run, or a whole block zeroed.
fn damage(base: &[u8], meta: &[usize], rng: &mut Rng) -> Vec<u8> {
    let mut img = base.to_vec();
    for _ in 0..rng.below(3) + 1 {
        let b = if rng.chance(90) {
            meta[rng.below(meta.len() as u64) as usize]
        } else {
            rng.below((img.len() / BLOCK) as u64) as usize
        };
        let block = &mut img[b * BLOCK..(b + 1) * BLOCK];
        match rng.below(10) {
            0 => block.fill(0),
            1..=3 => {
                // A field-sized run: the header, an item header or a key.
                let at = rng.below(200) as usize;
                let len = [1usize, 2, 4, 8][rng.below(4) as usize];
                for x in &mut block[at..at + len] {
                    *x = rng.next_u64() as u8;
                }
            }
            _ => {
                for _ in 0..rng.below(4) + 1 {
                    let at = rng.below(BLOCK as u64) as usize;
                    block[at] ^= 1 << rng.below(8);
                }
            }
        }
        if rng.chance(85) {
            reseal(block);
        }
    }
    img
}

/// How far a case got: fsck found damage, the image opened, a call on it failed.
#[derive(Clone)]
struct Reach {
    fsck_problems: bool,
    opened: bool,
    call_failed: bool,
    /// A repair of a copy of the damaged image: the problems its check of the result found,
    /// or why it was refused or failed.
    repaired: Result<Vec<String>, String>,
}

/// Everything a user could do with the damaged image; errors are fine.
fn exercise(img: Vec<u8>) -> Reach {
    let mut reach = Reach {
        fsck_problems: false,
        opened: false,
        call_failed: false,
        repaired: Err(String::new()),
    };
    let dev = Arc::new(MemDevice::from_bytes(img));
    let as_dyn: Arc<dyn BlockDevice> = dev.clone();
    reach.fsck_problems = fsck::check(&as_dyn, idxfs_format::hash::name_hash, &mut |_| {})
        .map_or(true, |r| !r.is_clean());
    let copy: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(dev.snapshot()));
    reach.repaired = idxfs_engine::repair::repair(&copy, idxfs_format::hash::name_hash)
        .map(|r| r.check.problems)
        .map_err(|e| e.to_string());
    let Ok(fs) = Fs::open(dev.clone(), opts()) else {
        return reach;
    };
    reach.opened = true;
    let mut stack = vec![ROOT];
    let mut files = Vec::new();
    let mut seen = 0;
    while let Some(d) = stack.pop() {
        let Ok(es) = fs.list(d) else { continue };
        for e in es {
            seen += 1;
            if seen > 10_000 {
                break;
            }
            let Ok(a) = fs.getattr(e.ino) else { continue };
            let _ = fs.listxattr(e.ino).map(|xs| {
                for x in xs {
                    let _ = fs.getxattr(e.ino, &x);
                }
            });
            match a.mode & 0o170000 {
                0o040000 if e.name != b"." && e.name != b".." => stack.push(e.ino),
                0o100000 => {
                    let _ = fs.read(e.ino, 0, 1 << 20);
                    let _ = fs.read(e.ino, a.size.saturating_sub(10), 100);
                    files.push((d, e.name.clone(), e.ino));
                }
                0o120000 => {
                    let _ = fs.readlink(e.ino);
                }
                _ => {}
            }
        }
        let _ = fs.readdir_plus(d, 0, 100, |_, _| true);
    }
    // Changes on top of the damage: creates that inherit (or meet a damaged default ACL),
    // chmods that rewrite access ACLs, an ACL set.
    let _ = fs
        .create(ROOT, b"new", 0o644, ME)
        .and_then(|a| fs.write(a.ino, 5000, b"x"));
    if let Ok(dir) = fs.lookup(ROOT, b"dir") {
        let _ = fs.mknod_umask(dir.ino, b"inherits", 0o100_666, ME, 0, 0o022);
        let _ = fs.mknod_umask(dir.ino, b"subdir", 0o040_777, ME, 0, 0o022);
    }
    for (_, _, ino) in files.iter().take(4) {
        let chmod = idxfs_engine::fs::SetAttr {
            mode: Some(0o640),
            ..Default::default()
        };
        let _ = fs.setattr(*ino, &chmod);
        let _ = fs.setxattr(*ino, idxfs_engine::fs::ACL_ACCESS, &named_acl(), 0);
    }
    for (d, name, ino) in files.iter().take(8) {
        let _ = fs.write(*ino, 3, b"overwrite");
        let _ = fs.truncate(*ino, 50);
        let _ = fs.setxattr(*ino, b"user.new", &[5u8; 6000], 0);
        let _ = fs.rename(*d, name, ROOT, b"moved", 0);
        let _ = fs.unlink(ROOT, b"moved");
    }
    // Snapshots: listed, dropped, each opened and walked at its root.
    let snaps = fs.snapshots().unwrap_or_default();
    let _ = fs.finish_drops();
    reach.call_failed = fs.fsync(ROOT).is_err() || fs.failure().is_some();
    let _ = fs.close();
    for s in snaps.iter().filter(|s| !s.dropping) {
        let o = idxfs_engine::OpenOptions {
            snapshot: Some(s.id),
            ..opts()
        };
        if let Ok(s) = Fs::open(dev.clone(), o) {
            if let Ok(es) = s.list(ROOT) {
                for e in es.iter().take(50) {
                    // At most a MiB, as a FUSE read asks: the size may be damaged.
                    let _ = s.getattr(e.ino).map(|_| s.read(e.ino, 0, 1 << 20));
                }
            }
            let _ = s.close();
        }
    }
    // A rollback to the first snapshot, over whatever the damage left of both trees.
    if let (Ok(fs), Some(s)) = (
        Fs::open(dev.clone(), opts()),
        snaps.iter().find(|s| !s.dropping),
    ) {
        let _ = fs.rollback(s.id);
    }
    // Writable subvolumes: each peeked at read-only, then made active, changed and deleted.
    let subs = Fs::open(dev.clone(), opts()).map(|fs| {
        let subs = fs.subvolumes();
        let _ = fs.close();
        subs
    });
    for sub in subs.unwrap_or_default() {
        let o = |read_only| idxfs_engine::OpenOptions {
            subvolume: Some(sub.id),
            read_only,
            ..opts()
        };
        if let Ok(s) = Fs::open(dev.clone(), o(true)) {
            let _ = s.list(ROOT).map(|es| {
                es.iter().take(50).for_each(|e| {
                    let _ = s.getattr(e.ino).map(|_| s.read(e.ino, 0, 1 << 20));
                })
            });
            let _ = s.close();
        }
        if let Ok(s) = Fs::open(dev.clone(), o(false)) {
            let _ = s
                .create(ROOT, b"in a subvolume", 0o644, ME)
                .and_then(|a| s.write(a.ino, 0, &[3u8; 10_000]));
            let _ = s.close();
        }
    }
    if let Ok(fs) = Fs::open(dev.clone(), opts()) {
        for sub in fs
            .subvolumes()
            .iter()
            .filter(|s| s.origin.is_some() && !s.active)
        {
            let _ = fs.delete_snapshot(sub.id);
        }
        let _ = fs.finish_drops();
        let _ = fs.close();
    }
    let _ = fsck::check(&as_dyn, idxfs_format::hash::name_hash, &mut |_| {});
    reach
}

/// u::rwx, u:1234:rw-, g::r-x, m::rwx, o::r--
fn named_acl() -> Vec<u8> {
    acl_xattr(&[
        (1, 7, u32::MAX),
        (2, 6, 1234),
        (4, 5, u32::MAX),
        (0x10, 7, u32::MAX),
        (0x20, 4, u32::MAX),
    ])
}

/// Cases that found a bug before its fix (a panic, or a repair that left problems):
/// - a node copied (a shared one, in the log's replay) onto free space the damaged space
///   map said free while a cached node lay there: "slab key inserted twice" (now Corrupt,
///   as a new node's allocation already refused it).
/// - a node pointer naming a block past any device, read by fsck at that block times the
///   block size: an overflow (now a problem reported).
/// - an access ACL with an unknown tag kept by the repair (now dropped).
/// - a parked subvolume's item with a generation past the image's, kept as it was (now set
///   to the image's).
/// - two writable trees owning one block, and the file system's own tree damaged too: the
///   repair refused, and its advice (make the tree active, repair again) met the same
///   refusal (now both trees are rebuilt in one repair).
/// - a hidden origin deleted as unused kept its own origin item, naming a snapshot whose
///   only user it was (now the item goes with it).
/// - the newer superblock copy damaged: the repair's commit reused its generation, and its
///   log chain's first block landed on the lost copy's chain, whose batches fsck then
///   replayed over the repaired trees (now that commit zeroes its chain's first block, as
///   the first commit of any open that met a damaged copy does: `TxnState::zero_log_head`).
const FOUND: &[u64] = &[
    17261166886234172200,
    7389634691200983009,
    9853113876378406885,
    390291961927101095,
    2506998614501077973,
    17699388715626349469,
    15424086898355053154,
];

#[test]
fn damaged_images_give_errors_not_panics() {
    let secs: u64 = std::env::var("IDXFS_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let (mut rng, seed) = Rng::from_env("image fuzz");
    // A third of the cases damage the image with a writable subvolume (`base_image`): those
    // whose seed is 2 modulo 3.
    let bases = [base_image(false), base_image(true)];
    let metas = bases.each_ref().map(|b| metadata_blocks(b));
    for (base, meta) in bases.iter().zip(&metas) {
        // The undamaged image is consistent, log included.
        assert_clean(&Arc::new(MemDevice::from_bytes(base.clone())));
        assert!(meta.len() > 20, "{} metadata blocks", meta.len());
    }
    let read_only = idxfs_engine::OpenOptions {
        read_only: true,
        ..opts()
    };
    let fs = Fs::open(Arc::new(MemDevice::from_bytes(bases[1].clone())), read_only).expect("open");
    let subs: Vec<(u64, Option<u64>, Option<u64>)> = (fs.subvolumes().iter())
        .map(|s| (s.id, s.origin, s.snapshot_of))
        .collect();
    assert!(
        subs.len() == 4
            && subs[1].1.is_some()
            && subs[1].2.is_none()
            && (subs[2].1, subs[2].2) == (None, None)
            && subs[3].2 == Some(subs[2].0),
        "the second image has a clone, an empty subvolume and a writable snapshot of it: \
         {subs:?}"
    );
    fs.close().expect("close");
    let start = Instant::now();
    let mut cases = 0u64;
    let (mut damaged, mut opened, mut failed) = (0u64, 0u64, 0u64);
    let mut refused = 0u64;
    let one_case: Option<u64> = std::env::var("IDXFS_FUZZ_CASE")
        .ok()
        .and_then(|s| s.parse().ok());
    // Cases that found a panic once, replayed first in every run.
    let mut found = FOUND.iter().copied().filter(|_| one_case.is_none());
    loop {
        let case_seed = one_case
            .or_else(|| found.next())
            .unwrap_or_else(|| rng.next_u64());
        let which = usize::from(case_seed % 3 == 2);
        let img = damage(&bases[which], &metas[which], &mut Rng::new(case_seed));
        // Each case in its own thread, so a hang is caught (and reported) too.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| exercise(img)));
            let _ = tx.send(r.ok());
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(Some(r)) => {
                // A repair that finishes leaves an image fsck finds clean.
                match &r.repaired {
                    Ok(p) => assert!(
                        p.is_empty(),
                        "case {case_seed} (run seed {seed}): the repaired image is not clean: \
                         {:?}; replay it with IDXFS_FUZZ_CASE={case_seed}",
                        &p[..p.len().min(5)]
                    ),
                    Err(why) => {
                        if std::env::var("IDXFS_FUZZ_TRACE").is_ok() {
                            eprintln!("case {case_seed}: repair refused: {why}");
                        }
                        refused += 1;
                    }
                }
                damaged += u64::from(r.fsck_problems);
                opened += u64::from(r.opened);
                failed += u64::from(r.call_failed);
            }
            Ok(None) => panic!("case {case_seed} (run seed {seed}) panicked: see above; replay it with IDXFS_FUZZ_CASE={case_seed}"),
            Err(_) => panic!("case {case_seed} (run seed {seed}) hung for 20 s; replay it with IDXFS_FUZZ_CASE={case_seed}"),
        }
        cases += 1;
        if one_case.is_some() {
            return;
        }
        if start.elapsed() >= Duration::from_secs(secs) {
            break;
        }
    }
    eprintln!(
        "image fuzz: {cases} damaged images in {secs} s, no panic or hang; fsck saw damage in \
         {damaged}, {opened} opened, {failed} of those stopped or refused an fsync; every repair \
         left it clean, {refused} refused"
    );
    // The damage must reach past the front door often, or this tests little.
    assert!(
        opened * 4 > cases,
        "only {opened} of {cases} damaged images opened"
    );
    assert!(
        damaged * 4 > cases,
        "fsck saw damage in only {damaged} of {cases}"
    );
}
