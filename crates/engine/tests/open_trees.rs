//! Several writable trees open at once through one file system (`fs::trees`): the file
//! system's own tree beside a clone of its snapshot, a writable snapshot and an empty
//! subvolume, each served by a handle of its own, changed in turns at random by the
//! workload of the snapshot tests, against a model of each (what each showed when last
//! changed, `digest`). Handles close and open again, the image closes and opens again with
//! fsck clean, snapshots are taken through each handle and shown as taken; at the end every
//! tree and snapshot is deleted and fsck finds no block held or leaked. Then the same from
//! threads at once, and a crash at every write prefix while two trees change and are made
//! durable by syncs and fsyncs (one through the log, one by commits).
mod common;
use common::digest::{digest, digest_at, digest_crash_stable};
use common::workload::{check, every_crash_image, step, World};
use common::*;
use idxfs_blockdev::MemDevice;
use idxfs_engine::fs::{Fs, Unchecked};
use idxfs_engine::testutil::Rng;
use idxfs_engine::{Error, OpenOptions};
use idxfs_format::versions::INCOMPAT_LOG_TREES;
use idxfs_format::FS_SUBVOL_ID;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

const VIEW_CACHE: usize = 1 << 20;

/// A fresh image changed by `steps` random steps, then given writable trees beside the file
/// system's own: a clone of a snapshot of it, a writable snapshot of it and an empty
/// subvolume; closed. The image, the trees' ids and worlds, in that order.
fn four_trees(rng: &mut Rng, steps: usize) -> (Arc<MemDevice>, Vec<u64>, Vec<World>) {
    let (dev, fs) = mem_fs_with(160 << 20, 4096);
    let mut w = World {
        fsync: true,
        ..Default::default()
    };
    for _ in 0..steps {
        step(&fs, rng, &mut w);
    }
    let s = fs.snapshot(b"s").expect("snapshot");
    let c = fs.make_clone(s, b"c").expect("clone");
    let ws = fs.writable_snapshot(b"ws").expect("writable snapshot");
    let e = fs.make_subvolume(b"e", ME).expect("empty subvolume");
    fs.close().expect("close");
    let worlds = vec![w.clone(), w.clone(), w, World::default()];
    (dev, vec![FS_SUBVOL_ID, c, ws, e], worlds)
}

/// Opens `dev` and every tree of `ids` beside it (the first is the file system's own).
fn open_all(dev: &Arc<MemDevice>, ids: &[u64]) -> Vec<Fs> {
    open_all_with(dev, ids, opts())
}

fn open_all_with(dev: &Arc<MemDevice>, ids: &[u64], o: OpenOptions) -> Vec<Fs> {
    let fs = Fs::open(dev.clone(), o).expect("open");
    let mut v: Vec<Fs> = (ids[1..].iter())
        .map(|&id| {
            fs.open_subvolume(id)
                .unwrap_or_else(|e| panic!("open subvolume {id} beside: {e}"))
        })
        .collect();
    v.insert(0, fs);
    v
}

/// Closes the trees opened beside first, then the file system.
fn close_all(handles: Vec<Fs>) {
    let mut it = handles.into_iter();
    let first = it.next().expect("the file system");
    for h in it {
        h.close().expect("close a subvolume");
    }
    first.close().expect("close");
}

#[test]
fn trees_open_at_once_each_keep_their_own_state() {
    let (mut rng, seed) = Rng::from_env("open trees model");
    let (dev, ids, mut worlds) = four_trees(&mut rng, 30);
    let mut handles = open_all(&dev, &ids);
    // What each tree showed when last changed.
    let mut shown: Vec<String> = handles.iter().map(digest).collect();
    assert_eq!(
        shown[1], shown[2],
        "the clone and the writable snapshot start alike"
    );
    assert!(
        matches!(handles[0].open_subvolume(ids[1]), Err(Error::Busy(_))),
        "a tree open beside is not opened twice"
    );
    assert!(matches!(
        handles[0].open_subvolume(FS_SUBVOL_ID),
        Err(Error::Busy(_))
    ));
    assert!(matches!(
        handles[0].delete_snapshot(ids[1]),
        Err(Error::Busy(_))
    ));
    assert!(matches!(
        handles[0].open_snapshot(ids[2], VIEW_CACHE),
        Err(Error::Busy(_))
    ));
    // Snapshots taken through the handles: id -> what its tree showed then.
    let mut snaps: BTreeMap<u64, String> = BTreeMap::new();
    let (mut reopens, mut handle_reopens, mut syncs) = (0, 0, 0);
    for round in 0..10 {
        for _ in 0..50 {
            let t = rng.below(handles.len() as u64) as usize;
            step(&handles[t], &mut rng, &mut worlds[t]);
            shown[t] = digest(&handles[t]);
        }
        for (t, h) in handles.iter().enumerate() {
            assert_eq!(
                digest(h),
                shown[t],
                "seed {seed} round {round}: tree {} changed by another's operations",
                ids[t]
            );
            assert_eq!(
                h.active_subvolume(),
                ids[t],
                "seed {seed}: each handle acts on its tree"
            );
        }
        match rng.below(4) {
            0 => {
                handles[rng.below(4) as usize].sync().expect("sync");
                syncs += 1;
            }
            1 => {
                // One tree's handle closes (the tree parks) and opens again.
                let t = 1 + rng.below(3) as usize;
                let h = handles.remove(t);
                h.close().expect("close a subvolume");
                let h = handles[0].open_subvolume(ids[t]).expect("open it again");
                assert_eq!(
                    digest(&h),
                    shown[t],
                    "seed {seed}: tree {} after parking",
                    ids[t]
                );
                handles.insert(t, h);
                handle_reopens += 1;
            }
            2 => {
                close_all(std::mem::take(&mut handles));
                check(&dev, &format!("seed {seed} round {round}"));
                handles = open_all(&dev, &ids);
                for (t, h) in handles.iter().enumerate() {
                    assert_eq!(digest(h), shown[t], "seed {seed}: tree {} reopened", ids[t]);
                }
                reopens += 1;
            }
            _ => {
                let t = rng.below(4) as usize;
                let id = handles[t]
                    .snapshot(format!("r{round}").as_bytes())
                    .expect("snapshot through a handle");
                snaps.insert(id, shown[t].clone());
            }
        }
    }
    for (&id, want) in &snaps {
        let v = handles[0].open_snapshot(id, VIEW_CACHE).expect("view");
        assert_eq!(&digest(&v), want, "seed {seed}: snapshot {id} as taken");
        v.close().expect("close the view");
    }
    eprintln!(
        "seed {seed}: {} steps, {reopens} reopens, {handle_reopens} handles reopened, \
         {syncs} syncs, {} snapshots",
        worlds.iter().map(|w| w.n).sum::<u64>(),
        snaps.len()
    );
    close_all(handles);
    check(&dev, &format!("seed {seed} at the end"));
    // Everything but the file system's own tree goes, and every block of it comes back.
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    assert_eq!(digest(&fs), shown[0]);
    let snapshots: Vec<u64> = fs.snapshots().expect("list").iter().map(|s| s.id).collect();
    for id in snaps.keys().chain(&ids[1..]).chain(&snapshots) {
        match fs.delete_snapshot(*id) {
            Ok(()) | Err(Error::NotFound) => {}
            Err(e) => panic!("seed {seed}: delete {id}: {e}"),
        }
        fs.finish_drops().expect("drops");
    }
    assert_eq!(fs.subvolumes().len(), 1);
    fs.close().expect("close");
    check(&dev, &format!("seed {seed} with everything deleted"));
}

/// Four threads, one per tree, with syncs, fsyncs and the commit thread among them; then
/// each tree shows what its thread left, before and after a reopen, fsck clean.
#[test]
fn trees_open_at_once_change_from_threads_at_once() {
    let (mut rng, seed) = Rng::from_env("open trees threads");
    let (dev, ids, worlds) = four_trees(&mut rng, 20);
    // The commit thread too, committing whichever tree is in hand when it comes.
    let every = OpenOptions {
        commit_interval: Some(std::time::Duration::from_millis(3)),
        ..opts()
    };
    let handles = open_all_with(&dev, &ids, every);
    let seeds: Vec<u64> = (0..4).map(|_| rng.next_u64()).collect();
    let shown: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (handles.iter().zip(worlds))
            .zip(&seeds)
            .map(|((h, mut w), &seed)| {
                s.spawn(move || {
                    let mut rng = Rng::new(seed);
                    for i in 0..250 {
                        step(h, &mut rng, &mut w);
                        if i % 97 == 0 {
                            h.sync().expect("sync");
                        }
                    }
                    digest(h)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("a thread panicked"))
            .collect()
    });
    for (t, h) in handles.iter().enumerate() {
        assert_eq!(digest(h), shown[t], "seed {seed}: tree {}", ids[t]);
    }
    close_all(handles);
    check(&dev, &format!("seed {seed}"));
    let handles = open_all(&dev, &ids);
    for (t, h) in handles.iter().enumerate() {
        assert_eq!(digest(h), shown[t], "seed {seed}: tree {} reopened", ids[t]);
    }
    close_all(handles);
}

/// Every crash prefix while the file system's own tree and an empty subvolume opened beside
/// it change, made durable by syncs (a commit of both) and fsyncs in either tree (that
/// tree's batch of the log, naming it: that tree now, the other as last made durable; or a
/// commit when the log cannot take it): each opens, log replayed into each tree, to a pair
/// of states some sync or fsync left, fsck clean.
#[test]
fn every_prefix_with_trees_open_at_once_opens_to_a_durable_state() {
    let (mut rng, seed) = Rng::from_env("open trees crash");
    let rec = recorded_with(32 << 20, Some([7; 16]));
    let open = || Fs::open(rec.clone(), opts()).expect("open");
    let fs = open();
    let mut w = World::default();
    for _ in 0..8 {
        step(&fs, &mut rng, &mut w);
    }
    let e = fs.make_subvolume(b"e", ME).expect("empty subvolume");
    fs.close().expect("close");
    let fs = open();
    let sub = fs.open_subvolume(e).expect("open beside");
    let mut we = World::default();
    // Pairs (the file system's tree, the subvolume) some durable point left.
    let mut durable: BTreeSet<(String, String)> = BTreeSet::new();
    let mut now = [digest_crash_stable(&fs), digest_crash_stable(&sub)];
    durable.insert((now[0].clone(), now[1].clone()));
    let (mut logged, mut commits) = ([0; 2], 0);
    for _ in 0..16 {
        for _ in 0..2 {
            match rng.chance(50) {
                true => step(&fs, &mut rng, &mut w),
                false => step(&sub, &mut rng, &mut we),
            }
        }
        let before = fs.counters().commits.get();
        let which = match rng.below(3) {
            0 => {
                [&fs, &sub][rng.below(2) as usize].sync().expect("sync");
                None
            }
            t => {
                // Logged, or committed when the log cannot take it (the first fsync after
                // an open, or the first in the subvolume while the image lacks the bit that
                // lets the log name trees, commits: `log`).
                let t = t as usize - 1;
                [&fs, &sub][t].fsync(ROOT).expect("fsync");
                Some(t)
            }
        };
        match which.filter(|_| fs.counters().commits.get() == before) {
            Some(t) => {
                now[t] = digest_crash_stable([&fs, &sub][t]);
                logged[t] += 1;
            }
            None => {
                now = [digest_crash_stable(&fs), digest_crash_stable(&sub)];
                commits += 1;
            }
        }
        durable.insert((now[0].clone(), now[1].clone()));
    }
    // The closes commit both.
    durable.insert((digest_crash_stable(&fs), digest_crash_stable(&sub)));
    sub.close().expect("close the subvolume");
    fs.close().expect("close");
    eprintln!(
        "seed {seed}: {} fsyncs logged in the file system's tree, {} in the subvolume, {commits} commits",
        logged[0], logged[1]
    );
    every_crash_image(&rec, &mut rng, seed, |dev, at| {
        let fs = Fs::open(dev.clone(), opts()).unwrap_or_else(|e| panic!("{at}: open: {e}"));
        let pair = match fs.open_subvolume(e) {
            Ok(sub) => {
                let p = (digest_crash_stable(&fs), digest_crash_stable(&sub));
                sub.close().expect("close the subvolume");
                p
            }
            // Before the subvolume's first commit.
            Err(Error::NotFound) => return,
            Err(err) => panic!("{at}: open the subvolume: {err}"),
        };
        fs.close().expect("close");
        check(&dev, at);
        assert!(
            durable.contains(&pair),
            "{at}: a state no sync or fsync left:\n{}\n--- subvolume:\n{}\n=== durable:\n{}",
            pair.0,
            pair.1,
            (durable.iter())
                .map(|(a, b)| format!("{a}\n--- subvolume:\n{b}"))
                .collect::<Vec<_>>()
                .join("\n===\n")
        );
    });
}

/// The handle of a tree opened beside refuses what would act on the whole file system, and
/// the file system refuses a rollback while one is open.
#[test]
fn a_tree_open_beside_refuses_whole_file_system_changes() {
    let (dev, fs) = mem_fs_with(64 << 20, 4096);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.write(f, 0, &[1u8; 10_000]).expect("write");
    let s = fs.snapshot(b"s").expect("snapshot");
    let e = fs.make_subvolume(b"e", ME).expect("empty subvolume");
    let sub = fs.open_subvolume(e).expect("open beside");
    assert!(matches!(fs.open_subvolume(e), Err(Error::Busy(_))));
    assert!(matches!(
        sub.open_subvolume(FS_SUBVOL_ID),
        Err(Error::Busy(_))
    ));
    assert!(matches!(fs.open_subvolume(999), Err(Error::NotFound)));
    // The subvolume has its own inode numbers: ROOT is its root, f is not there.
    assert!(matches!(sub.getattr(f), Err(Error::NotFound)));
    let g = sub
        .create(ROOT, b"g", 0o644, ME)
        .expect("create in the subvolume");
    sub.write(g.ino, 0, &[2u8; 5000]).expect("write");
    assert!(matches!(fs.lookup(ROOT, b"g"), Err(Error::NotFound)));
    assert!(
        matches!(fs.rollback(s), Err(Error::Busy(_))),
        "a rollback beside an open subvolume"
    );
    // The file system's handle went with the refused rollback; the subvolume's still works
    // and commits.
    sub.write(g.ino, 5000, &[3u8; 100]).expect("write after");
    sub.close().expect("close");
    check(&dev, "after");
    let fs = Fs::open(
        dev.clone(),
        OpenOptions {
            subvolume: Some(e),
            ..opts()
        },
    )
    .expect("open the subvolume");
    let mut want = vec![2u8; 5000];
    want.extend_from_slice(&[3u8; 100]);
    assert_eq!(fs.read(g.ino, 0, 5100).expect("read"), want);
}

/// Under `-o sync` every change is durable when it returns, in a tree opened beside too
/// (there by a commit, in the active tree by its log): names made and removed in turns in
/// both trees, and every crash prefix opens to the pair of states the last change that had
/// returned by then left, or a later one, fsck clean.
#[test]
fn under_sync_every_change_in_either_tree_survives_a_crash_once_returned() {
    use idxfs_blockdev::Tear;
    use idxfs_engine::fs::SyncMode;
    let (mut rng, seed) = Rng::from_env("open trees sync");
    let rec = recorded_with(16 << 20, Some([8; 16]));
    let o = OpenOptions {
        sync: SyncMode::All,
        ..opts()
    };
    let fs = Fs::open(rec.clone(), o.clone()).expect("open");
    let e = fs.make_subvolume(b"e", ME).expect("empty subvolume");
    fs.close().expect("close");
    let fs = Fs::open(rec.clone(), o.clone()).expect("open");
    let sub = fs.open_subvolume(e).expect("open beside");
    let pair = |fs: &Fs, sub: &Fs| (digest(fs), digest(sub));
    // (device events when the change returned, the states it left).
    let mut states = vec![(rec.events().len(), pair(&fs, &sub))];
    let mut names: [Vec<Vec<u8>>; 2] = Default::default();
    for i in 0..24 {
        let t = rng.below(2) as usize;
        let h = [&fs, &sub][t];
        match names[t].len() > 2 && rng.chance(30) {
            true => {
                let name = names[t].remove(rng.below(names[t].len() as u64) as usize);
                h.unlink(ROOT, &name).expect("unlink");
            }
            false => {
                let name = format!("n{i}").into_bytes();
                h.create(ROOT, &name, 0o644, ME).expect("create");
                names[t].push(name);
            }
        }
        states.push((rec.events().len(), pair(&fs, &sub)));
    }
    sub.close().expect("close the subvolume");
    fs.close().expect("close");
    let events = rec.events().len();
    eprintln!("seed {seed}: {events} device events");
    for prefix in 0..=events {
        for tear in [Tear::None, Tear::TornLast(1), Tear::Drop(rng.next_u64())] {
            let at = format!("seed {seed} prefix {prefix} {tear:?}");
            let dev = Arc::new(MemDevice::from_bytes(rec.crash_image(prefix, tear).bytes));
            check(&dev, &at);
            let fs = Fs::open(dev.clone(), opts()).unwrap_or_else(|e| panic!("{at}: open: {e}"));
            let Ok(sub) = fs.open_subvolume(e) else {
                assert!(prefix < states[0].0, "{at}: the subvolume is gone");
                continue;
            };
            let now = pair(&fs, &sub);
            sub.close().expect("close the subvolume");
            fs.close().expect("close");
            // The last change that had returned by this prefix, or a later one.
            let k = states.iter().rposition(|s| s.0 <= prefix).unwrap_or(0);
            assert!(
                states[k..].iter().any(|s| s.1 == now),
                "{at}: older than change {k}, the last returned"
            );
        }
    }
}

/// `idxfs cp` between two trees of one mount: a tree copies a whole directory from another
/// tree open beside it (the file system's own into a subvolume, a clone into the file
/// system's own), file bytes copied and never blocks shared across trees; each copy is
/// its source whole, nothing else changes, fsck finds every count right, and a reopen
/// shows the same.
#[test]
fn a_tree_copies_a_directory_from_another_open_beside_by_its_bytes() {
    let (mut rng, seed) = Rng::from_env("open trees copy");
    let (dev, ids, _) = four_trees(&mut rng, 150);
    let h = open_all(&dev, &ids);
    let (own, clone, empty) = (&h[0], &h[1], &h[3]);
    let (own_was, clone_was) = (digest(own), digest(clone));
    let c = empty
        .copy_tree_from(own, ROOT, ROOT, b"from_own", &Unchecked, |_| {})
        .unwrap_or_else(|e| panic!("seed {seed}: copy into the subvolume: {e}"));
    let d = own
        .copy_tree_from(clone, ROOT, ROOT, b"from_clone", &Unchecked, |_| {})
        .unwrap_or_else(|e| panic!("seed {seed}: copy into the file system: {e}"));
    eprintln!("seed {seed}: {} and {} bytes copied", c.bytes, d.bytes);
    let at = |fs: &Fs, name: &[u8]| fs.lookup(ROOT, name).expect("the copy").ino;
    let check_all = |h: &[Fs], when: &str| {
        let (own, clone, empty) = (&h[0], &h[1], &h[3]);
        let copy = digest_at(empty, at(empty, b"from_own"));
        assert_eq!(copy, own_was, "seed {seed} {when}: the subvolume's copy");
        let copy = digest_at(own, at(own, b"from_clone"));
        assert_eq!(
            copy, clone_was,
            "seed {seed} {when}: the file system's copy"
        );
        assert_eq!(
            digest(clone),
            clone_was,
            "seed {seed} {when}: the source clone"
        );
        // The file system's own tree is what it was beside its new directory.
        let kept: String = (digest(own).lines())
            .filter(|l| !l.starts_with("/from_clone"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            kept, own_was,
            "seed {seed} {when}: the file system's own files"
        );
    };
    check_all(&h, "open");
    close_all(h);
    check(&dev, &format!("seed {seed}: after the copies"));
    let h = open_all(&dev, &ids);
    check_all(&h, "reopened");
    close_all(h);
}

/// An fsync in a tree opened beside is one batch of the log that names the tree, not a
/// commit: in a clone (whose origin's blocks it never lets go of) and in an empty
/// subvolume. A crash right after opens, the log replayed into each tree, to each tree as
/// its fsync left it and the file system's own as its last commit left it, fsck clean, every
/// block accounted for.
#[test]
fn an_fsync_in_a_tree_open_beside_is_a_log_batch_replayed_into_that_tree() {
    use idxfs_blockdev::Tear;
    let rec = recorded_with(48 << 20, Some([9; 16]));
    let fs = Fs::open(rec.clone(), opts()).expect("open");
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.write(f, 0, &[1u8; 300_000]).expect("write");
    let s = fs.snapshot(b"s").expect("snapshot");
    let c = fs.make_clone(s, b"c").expect("clone");
    let e = fs.make_subvolume(b"e", ME).expect("empty subvolume");
    fs.close().expect("close");
    let fs = Fs::open(rec.clone(), opts()).expect("open");
    let (clone, empty) = (
        fs.open_subvolume(c).expect("open the clone beside"),
        fs.open_subvolume(e).expect("open the subvolume beside"),
    );
    // This mount's first commit starts its log and lets the log name trees.
    fs.mkdir(ROOT, b"first-commit", 0o755, ME).expect("mkdir");
    fs.sync().expect("sync");
    let committed = digest_crash_stable(&fs);
    // Changes in all three trees; the clone's overwrite and unlink let go of its origin's
    // blocks (kept) and of its own (freed at the replay's commit).
    let g = fs
        .create(ROOT, b"g", 0o644, ME)
        .expect("create in the fs tree");
    fs.write(g.ino, 0, b"not fsynced").expect("write");
    clone
        .write(f, 4096, &[2u8; 50_000])
        .expect("overwrite in the clone");
    let h = clone.create(ROOT, b"h", 0o644, ME).expect("create").ino;
    clone.write(h, 0, &[3u8; 90_000]).expect("write");
    let d = empty.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir").ino;
    for i in 0..40u8 {
        let a = (empty.create(d, format!("x{i}").as_bytes(), 0o644, ME)).expect("create");
        empty.write(a.ino, 0, &[i; 5000]).expect("write");
    }
    let (commits, batches) = (fs.counters().commits.get(), fs.counters().log_batches.get());
    clone.fsync(h).expect("fsync in the clone");
    // Then changed again and made durable again: the later batch wins.
    clone.write(h, 80_000, &[4u8; 30_000]).expect("write");
    clone
        .unlink(ROOT, b"f")
        .expect("unlink the origin's file in the clone");
    clone.fsync(ROOT).expect("fsync in the clone");
    empty.fsync(d).expect("fsync in the subvolume");
    assert_eq!(
        (
            fs.counters().commits.get() - commits,
            fs.counters().log_batches.get() - batches
        ),
        (0, 3),
        "three fsyncs in trees opened beside: three log batches, no commit"
    );
    let want = (
        committed,
        digest_crash_stable(&clone),
        digest_crash_stable(&empty),
    );
    let at_fsync = rec.events().len();
    // A crash now: nothing after the fsyncs reached the device.
    let dev = Arc::new(MemDevice::from_bytes(
        rec.crash_image(at_fsync, Tear::None).bytes,
    ));
    drop((clone, empty));
    std::mem::forget(fs);
    // The commit made while both were open let its log name trees.
    let bit = |dev: &MemDevice| incompat(dev) & INCOMPAT_LOG_TREES;
    assert_ne!(bit(&dev), 0, "the log may name trees");
    check(&dev, "after the crash");
    // Read-only, the replay in memory only: the trees show it as views (the replayed ones
    // through this file system's cache) and refuse changes.
    let ro = Fs::open(
        dev.clone(),
        OpenOptions {
            read_only: true,
            ..opts()
        },
    )
    .expect("open read-only after the crash");
    assert!(matches!(ro.open_subvolume(c), Err(Error::ReadOnly)));
    let (vc, ve) = (
        ro.open_snapshot(c, VIEW_CACHE).expect("view of the clone"),
        ro.open_snapshot(e, VIEW_CACHE)
            .expect("view of the subvolume"),
    );
    assert_eq!(
        (
            digest_crash_stable(&ro),
            digest_crash_stable(&vc),
            digest_crash_stable(&ve)
        ),
        want,
        "read-only, the log replayed in memory"
    );
    assert!(matches!(
        ve.create(ROOT, b"no", 0o644, ME),
        Err(Error::ReadOnly)
    ));
    drop((vc, ve));
    ro.close().expect("close read-only");
    let fs = Fs::open(dev.clone(), opts()).expect("open after the crash");
    assert!(
        fs.counters().log_replayed_batches.get() >= 3,
        "the batches were replayed"
    );
    let (clone, empty) = (
        fs.open_subvolume(c).expect("open the clone"),
        fs.open_subvolume(e).expect("open the subvolume"),
    );
    let got = (
        digest_crash_stable(&fs),
        digest_crash_stable(&clone),
        digest_crash_stable(&empty),
    );
    assert_eq!(got.0, want.0, "the file system's tree: its last commit");
    assert_eq!(got.1, want.1, "the clone: its last fsync");
    assert_eq!(got.2, want.2, "the subvolume: its last fsync");
    clone.close().expect("close the clone");
    empty.close().expect("close the subvolume");
    fs.close().expect("close");
    check(&dev, "after the replay");
    // Every tree and snapshot deleted: every block comes back.
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    for id in [e, c, s] {
        fs.delete_snapshot(id).expect("delete");
        fs.finish_drops().expect("drops");
    }
    assert_eq!(fs.subvolumes().len(), 1);
    fs.close().expect("close");
    check(&dev, "after deleting everything");
    assert_eq!(
        bit(&dev),
        0,
        "a commit with no tree open beside clears the bit"
    );
}

/// The bit that lets the log name trees (`INCOMPAT_LOG_TREES`) is set by a commit made while
/// a tree is open beside, and cleared by the next commit without one, the close of a file
/// system with nothing else to write included: a cleanly closed image keeps no feature bit
/// it no longer needs.
#[test]
fn a_close_with_no_tree_open_beside_clears_the_log_s_tree_bit() {
    let (dev, fs) = mem_fs_with(32 << 20, 4096);
    let e = fs.make_subvolume(b"e", ME).expect("empty subvolume");
    let bit = |dev: &MemDevice| incompat(dev) & INCOMPAT_LOG_TREES;
    assert_eq!(bit(&dev), 0);
    let sub = fs.open_subvolume(e).expect("open beside");
    sub.create(ROOT, b"f", 0o644, ME).expect("create");
    fs.sync().expect("sync");
    assert_ne!(bit(&dev), 0, "committed with a tree open beside");
    // Nothing changed since: the subvolume's close has nothing to commit.
    sub.close().expect("close the subvolume");
    assert_ne!(bit(&dev), 0);
    fs.close().expect("close");
    assert_eq!(bit(&dev), 0, "the close cleared it");
    check(&dev, "after");
}
