//! Read-only snapshots (`fs::snapshot`) against a model: random changes to the file system
//! (files of every size, NOCOW files overwritten in place, preallocation, copies that share
//! blocks, truncates, punches, renames, xattrs), snapshots taken and deleted among them,
//! remounts and drop steps. After every round each snapshot opened read-only shows exactly
//! what the file system showed when it was made (`digest`), the file system shows what it
//! showed before the remount, and fsck passes (node counts, held blocks, every block
//! accounted for). At the end every snapshot is deleted and dropped: fsck then finds no
//! block held or leaked, and the free space is what it was before the first snapshot plus
//! what the file system's own changes freed.
//!
//! And at the device boundary: every prefix of the writes of such a workload (files copied
//! out of snapshots among its changes), with the last ones torn or dropped, opens to a
//! committed state whose snapshots show what they showed.
//!
//! Rollbacks (`Fs::rollback`): among the same changes, the file system rolled back to a
//! random snapshot shows exactly what the snapshot shows, every snapshot keeps its state,
//! fsck passes after each, and after everything is deleted no block is held or leaked; every
//! prefix of a rollback's writes opens to the state before it or after it.
mod common;
use common::digest::{digest, digest_crash_stable};
use common::workload::{check, every_crash_image, step, World};
use common::*;
use idxfs_blockdev::{BlockDevice, MemDevice, Tear};
use idxfs_engine::fs::{Fs, NOCOW_FL};
use idxfs_engine::testutil::Rng;
use idxfs_engine::{fsck, Error, MkfsOptions, OpenOptions};
use std::collections::BTreeMap;
use std::sync::Arc;

fn open_snapshot(dev: &Arc<MemDevice>, id: u64) -> Fs {
    Fs::open(
        dev.clone(),
        OpenOptions {
            snapshot: Some(id),
            ..opts()
        },
    )
    .expect("open a snapshot")
}

#[test]
fn snapshots_keep_their_state_and_give_every_block_back() {
    let (mut rng, seed) = Rng::from_env("snapshots model");
    let dev = Arc::new(MemDevice::new(128 << 20));
    Fs::mkfs(
        dev.clone(),
        &MkfsOptions {
            node_size: 4096,
            ..Default::default()
        },
    )
    .expect("mkfs");
    let mut fs = Fs::open(dev.clone(), opts()).expect("open");
    let mut w = World {
        fsync: true,
        ..Default::default()
    };
    for _ in 0..60 {
        step(&fs, &mut rng, &mut w);
    }
    // id -> what the file system showed when it was made.
    let mut snaps: BTreeMap<u64, String> = BTreeMap::new();
    let (mut made, mut unshares, mut held) = (0, 0, 0);
    for round in 0..24 {
        let at = format!("seed {seed} round {round}");
        for _ in 0..rng.below(80) + 10 {
            step(&fs, &mut rng, &mut w);
            if rng.chance(3) && snaps.len() < 5 {
                let want = digest(&fs);
                let id = fs
                    .snapshot(format!("s{made}").as_bytes())
                    .expect("snapshot");
                made += 1;
                snaps.insert(id, want);
            }
            if rng.chance(2) && !snaps.is_empty() {
                let id = *snaps
                    .keys()
                    .nth(rng.below(snaps.len() as u64) as usize)
                    .expect("id");
                fs.delete_snapshot(id).expect("delete");
                snaps.remove(&id);
                assert!(matches!(fs.delete_snapshot(id), Err(Error::NotFound)));
            }
        }
        if rng.chance(50) {
            fs.finish_drops().expect("drops");
        }
        // Remount; each snapshot shows its state, the file system its own.
        let live = digest(&fs);
        unshares += fs.counters().node_unshares.get();
        held += fs.counters().blocks_held.get();
        fs.close().expect("close");
        check(&dev, &at);
        for (id, want) in &snaps {
            let s = open_snapshot(&dev, *id);
            assert_eq!(&digest(&s), want, "{at}: snapshot {id} changed");
            assert!(matches!(
                s.create(ROOT, b"no", 0o644, ME),
                Err(Error::ReadOnly)
            ));
            s.close().expect("close snapshot");
        }
        fs = Fs::open(dev.clone(), opts()).expect("reopen");
        assert_eq!(
            digest(&fs),
            live,
            "{at}: the file system changed across a remount"
        );
        let listed: Vec<u64> = fs
            .snapshots()
            .expect("list")
            .iter()
            .filter(|s| !s.dropping)
            .map(|s| s.id)
            .collect();
        assert_eq!(
            listed,
            snaps.keys().copied().collect::<Vec<_>>(),
            "{at}: listed"
        );
    }
    eprintln!("seed {seed}: {made} snapshots, {unshares} shared nodes copied, {held} blocks held");
    assert!(made > 0 && unshares > 0, "seed {seed}: nothing was shared");
    // Delete everything: no block stays held, fsck finds every block accounted for.
    delete_all(fs, &dev, snaps.keys().copied(), &format!("seed {seed} end"));
}

/// Deletes the snapshots `ids` and finishes their drops: then fsck finds no block held or
/// leaked, and a remount shows what the file system showed.
fn delete_all(fs: Fs, dev: &Arc<MemDevice>, ids: impl Iterator<Item = u64>, at: &str) {
    for id in ids {
        fs.delete_snapshot(id).expect("delete");
    }
    fs.finish_drops().expect("drops");
    assert!(fs.snapshots().expect("list").is_empty(), "{at}");
    let live = digest(&fs);
    fs.close().expect("close");
    check(dev, at);
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    assert_eq!(digest(&fs), live, "{at}");
}

/// Snapshots opened beside the file system (`Fs::open_snapshot`, as the mount shows them):
/// random changes, commits, other snapshots made, deleted and dropped, and each open view
/// shows what the file system showed when its snapshot was made, after every step. A
/// snapshot cannot be deleted while a view of it is open; once the view is closed it can,
/// and fsck finds every block accounted for.
#[test]
fn snapshots_open_beside_the_file_system_keep_their_state() {
    let (mut rng, seed) = Rng::from_env("snapshot views");
    let (dev, fs) = mem_fs_with(128 << 20, 4096);
    let mut w = World {
        fsync: true,
        ..Default::default()
    };
    for _ in 0..40 {
        step(&fs, &mut rng, &mut w);
    }
    // id -> (what the file system showed when it was made, its view when open).
    let mut snaps: BTreeMap<u64, (String, Option<Fs>)> = BTreeMap::new();
    let mut checked = 0;
    for i in 0..400 {
        let at = format!("seed {seed} step {i}");
        step(&fs, &mut rng, &mut w);
        if rng.chance(4) && snaps.len() < 4 {
            let want = digest(&fs);
            let id = fs.snapshot(format!("v{i}").as_bytes()).expect("snapshot");
            let view = rng
                .chance(70)
                .then(|| fs.open_snapshot(id, 1 << 20).expect("view"));
            snaps.insert(id, (want, view));
        }
        if rng.chance(3) && !snaps.is_empty() {
            let id = *snaps
                .keys()
                .nth(rng.below(snaps.len() as u64) as usize)
                .expect("id");
            let open = snaps[&id].1.is_some();
            match fs.delete_snapshot(id) {
                Err(Error::Busy(_)) if open => {
                    // Closing the view lets the delete go through.
                    snaps.get_mut(&id).expect("snap").1 = None;
                    fs.delete_snapshot(id)
                        .expect("delete after the view closed");
                }
                Ok(()) if !open => {}
                r => panic!("{at}: delete of snapshot {id} (view open: {open}): {r:?}"),
            }
            snaps.remove(&id);
            assert!(matches!(
                fs.open_snapshot(id, 1 << 20),
                Err(Error::NotFound)
            ));
        }
        if rng.chance(10) {
            fs.finish_drops().expect("drops");
        }
        if rng.chance(10) {
            fs.sync().expect("commit");
        }
        // Every few steps, one open view against its snapshot's state.
        if rng.chance(30) {
            let open: Vec<u64> = snaps
                .iter()
                .filter(|(_, (_, v))| v.is_some())
                .map(|(id, _)| *id)
                .collect();
            if let Some(&id) = open.get(rng.below(open.len().max(1) as u64) as usize) {
                let (want, view) = &snaps[&id];
                let view = view.as_ref().expect("view");
                assert_eq!(
                    &digest(view),
                    want,
                    "{at}: the view of snapshot {id} changed"
                );
                assert_eq!(view.snapshot_id(), Some(id));
                assert!(matches!(
                    view.create(ROOT, b"no", 0o644, ME),
                    Err(Error::ReadOnly)
                ));
                assert_eq!(
                    view.statfs().expect("statfs"),
                    fs.statfs().expect("statfs"),
                    "{at}: a view's statfs is its file system's"
                );
                checked += 1;
            }
        }
    }
    eprintln!("seed {seed}: {checked} views checked");
    assert!(checked > 0, "seed {seed}: no view was checked");
    for (want, view) in snaps.values() {
        if let Some(v) = view {
            assert_eq!(&digest(v), want, "seed {seed}: at the end");
        }
    }
    let ids: Vec<u64> = snaps.keys().copied().collect();
    drop(snaps);
    for id in ids {
        fs.delete_snapshot(id).expect("delete");
    }
    fs.finish_drops().expect("drops");
    fs.close().expect("close");
    check(&dev, &format!("seed {seed} end"));
}

/// A reader walks a snapshot's view over and over on its own thread while the file system
/// overwrites, deletes and truncates everything the snapshot names, commits, and makes and
/// drops other snapshots: every walk shows the snapshot's state (no block it names is reused
/// under it).
#[test]
fn a_view_read_beside_a_writer_that_frees_everything_it_names_stays_whole() {
    let (mut rng, seed) = Rng::from_env("snapshot view beside a writer");
    let (dev, fs) = mem_fs_with(128 << 20, 4096);
    let mut w = World::default();
    for _ in 0..150 {
        step(&fs, &mut rng, &mut w);
    }
    let want = digest(&fs);
    let id = fs.snapshot(b"kept").expect("snapshot");
    let view = fs.open_snapshot(id, 1 << 20).expect("view");
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    let (stop, walked) = (AtomicBool::new(false), AtomicU64::new(0));
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            while !stop.load(Relaxed) {
                assert_eq!(
                    digest(&view),
                    want,
                    "seed {seed}: walk {}",
                    walked.load(Relaxed)
                );
                walked.fetch_add(1, Relaxed);
            }
        });
        for round in 0..20 {
            let before = walked.load(Relaxed);
            // Everything the snapshot named goes, and new files reuse the space.
            for (p, _, name) in std::mem::take(&mut w.files) {
                fs.unlink(p, &name).expect("unlink");
            }
            for _ in 0..60 {
                step(&fs, &mut rng, &mut w);
            }
            let other = fs
                .snapshot(format!("o{round}").as_bytes())
                .expect("snapshot");
            fs.sync().expect("commit");
            fs.delete_snapshot(other).expect("delete");
            fs.finish_drops().expect("drops");
            fs.sync().expect("commit");
            // A walk ends inside each round's changes: they interleave.
            while walked.load(Relaxed) < before + 2 && !reader.is_finished() {
                std::thread::yield_now();
            }
        }
        stop.store(true, Relaxed);
        reader.join().expect("reader");
    });
    let walks = walked.load(Relaxed);
    eprintln!("seed {seed}: {walks} walks");
    assert_eq!(digest(&view), want);
    drop(view);
    fs.delete_snapshot(id).expect("delete");
    fs.finish_drops().expect("drops");
    fs.close().expect("close");
    check(&dev, &format!("seed {seed} end"));
}

/// fsck checks a snapshot's tree as a file system of its own: a wrong link count in a leaf
/// only the snapshot still names (the file system changed the inode since) is a problem
/// that names the snapshot; the same image without the damage is clean.
#[test]
fn fsck_finds_damage_in_a_leaf_only_a_snapshot_names() {
    let (dev, fs) = mem_fs_with(16 << 20, 4096);
    let ino = fs.create(ROOT, b"victim", 0o644, ME).expect("create").ino;
    for i in 0..200 {
        fs.create(ROOT, format!("f{i}").as_bytes(), 0o644, ME)
            .expect("create");
    }
    let id = fs.snapshot(b"s").expect("snapshot");
    // The file system copies the victim's leaf: the old one is the snapshot's alone.
    fs.setattr(
        ino,
        &idxfs_engine::fs::SetAttr {
            mode: Some(0o600),
            ..Default::default()
        },
    )
    .expect("chmod");
    fs.close().expect("close");
    check(&dev, "before the damage");
    // Every leaf holding the victim's inode item with its old mode (the snapshot's leaf, and
    // stale copies in free blocks, which nothing reads) gets link count 7.
    let mut img = dev.snapshot();
    let damaged = set_link_count(&mut img, 4096, ino, 0o644, 7);
    assert!(damaged > 0, "the snapshot's leaf was not found");
    let dev = Arc::new(MemDevice::from_bytes(img));
    let r = fsck::check(
        &(dev.clone() as Arc<dyn BlockDevice>),
        idxfs_format::hash::name_hash,
        &mut |_| {},
    )
    .expect("fsck");
    assert!(
        r.problems
            .iter()
            .any(|p| p.starts_with(&format!("snapshot {id}:")) && p.contains("link count 7")),
        "{:?}",
        r.problems
    );
    assert!(
        r.problems.iter().all(|p| p.starts_with("snapshot")),
        "the file system itself is whole: {:?}",
        r.problems
    );
}

/// Copies out of a snapshot (`Fs::copy_from_snapshot`) share its blocks, whether the file
/// system still names them or let go of them (held): the file system's used space grows
/// by metadata only; an unaligned copy copies bytes. An fsync right after is durable (the
/// image as the device holds it then, as after a crash, opens with the copies and fsck
/// clean). The copies then change, the snapshot does not; once it is deleted, the copies
/// keep every byte and fsck finds every block accounted for.
#[test]
fn copies_out_of_a_snapshot_share_its_blocks() {
    let (dev, fs) = mem_fs_with(64 << 20, 4096);
    let mut files = Vec::new();
    for (i, len) in [10usize, 5000, 70_000, 300_000, 1 << 20]
        .into_iter()
        .enumerate()
    {
        let a = fs
            .create(ROOT, format!("f{i}").as_bytes(), 0o644, ME)
            .expect("create");
        let data: Vec<u8> = (0..len).map(|j| (j * 7 + i) as u8).collect();
        fs.write(a.ino, 0, &data).expect("write");
        files.push((a.ino, data));
    }
    // A copy that shares, so that the image has shared blocks already and an fsync may
    // log one more (the first needs a commit for its feature bit).
    let warm = fs.create(ROOT, b"warm", 0o644, ME).expect("create").ino;
    fs.copy_range(files[3].0, 0, warm, 0, 8192, Default::default())
        .expect("copy_range");
    let before = digest(&fs);
    let id = fs.snapshot(b"s").expect("snapshot");
    // The file system lets go of some (their blocks held) and rewrites others.
    for (i, (ino, _)) in files.iter().enumerate() {
        if i % 2 == 0 {
            fs.unlink(ROOT, format!("f{i}").as_bytes()).expect("unlink");
        } else {
            fs.write(*ino, 0, &vec![9u8; 8192]).expect("overwrite");
        }
    }
    fs.sync().expect("commit");
    let view = fs.open_snapshot(id, 1 << 20).expect("view");
    let free = fs.statfs().expect("statfs").blocks_free;
    let mut restored = Vec::new();
    for (i, (ino, data)) in files.iter().enumerate() {
        let d = fs
            .create(ROOT, format!("r{i}").as_bytes(), 0o644, ME)
            .expect("create");
        let n = fs
            .copy_from_snapshot(
                &view,
                *ino,
                0,
                d.ino,
                0,
                data.len() as u64,
                Default::default(),
            )
            .expect("copy out of the snapshot");
        assert_eq!(n, data.len() as u64);
        restored.push((d.ino, data.clone()));
    }
    // Unaligned: bytes.
    let odd = fs.create(ROOT, b"odd", 0o644, ME).expect("create").ino;
    let (big, big_data) = &files[4];
    let n = fs
        .copy_from_snapshot(&view, *big, 100, odd, 0, 50_000, Default::default())
        .expect("unaligned copy");
    assert_eq!(n, 50_000);
    restored.push((odd, big_data[100..50_100].to_vec()));
    let grew = free - fs.statfs().expect("statfs").blocks_free;
    let data_blocks: u64 = files.iter().map(|f| f.1.len() as u64 / 4096).sum();
    assert!(
        grew < data_blocks / 4,
        "copies of {data_blocks} blocks took {grew}: not shared"
    );
    assert!(
        fs.counters().blocks_unheld.get() > 0,
        "no held block was named again"
    );
    for (ino, data) in &restored {
        assert_eq!(&fs.read(*ino, 0, data.len() + 1).expect("read"), data);
    }
    // Durable with the fsync: the device as it is now, as after a crash.
    fs.fsync(restored[0].0).expect("fsync");
    let crashed = Arc::new(MemDevice::from_bytes(dev.snapshot()));
    check(&crashed, "after the fsync");
    {
        let c = Fs::open(crashed.clone(), opts()).expect("open the crash image");
        for (ino, data) in &restored {
            assert_eq!(&c.read(*ino, 0, data.len() + 1).expect("read"), data);
        }
        c.close().expect("close");
    }
    check(&crashed, "after the crash image's replay");
    // The copies change; the snapshot does not.
    for (ino, _) in &restored {
        fs.write(*ino, 4096, b"changed after the copy")
            .expect("write");
    }
    assert_eq!(
        digest(&view),
        before,
        "the snapshot changed with its copies"
    );
    drop(view);
    fs.close().expect("close");
    check(&dev, "with the snapshot");
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    fs.delete_snapshot(id).expect("delete");
    fs.finish_drops().expect("drops");
    for (ino, data) in &restored {
        let msg = b"changed after the copy";
        let mut want = data.clone();
        want.resize(want.len().max(4096 + msg.len()), 0);
        want[4096..4096 + msg.len()].copy_from_slice(msg);
        assert_eq!(fs.read(*ino, 0, want.len() + 1).expect("read"), want);
    }
    fs.close().expect("close");
    check(&dev, "after the snapshot's delete");
}

/// The in-place rule: a NOCOW file's overwrite of blocks a snapshot names goes copy-on-write
/// (the snapshot keeps its bytes), and one of blocks written after the snapshot goes in
/// place again.
#[test]
fn a_nocow_overwrite_leaves_a_snapshots_blocks_alone() {
    let (dev, fs) = mem_fs_with(32 << 20, 4096);
    let a = fs.create(ROOT, b"a", 0o644, ME).expect("create");
    fs.set_flags(a.ino, NOCOW_FL).expect("chattr +C");
    fs.write(a.ino, 0, &[1; 65536]).expect("write");
    let before = extent_blocks(&fs, a.ino);
    let id = fs.snapshot(b"s").expect("snapshot");
    fs.write(a.ino, 0, &[2; 65536]).expect("overwrite");
    let after = extent_blocks(&fs, a.ino);
    assert_ne!(
        before, after,
        "the snapshot's blocks were overwritten in place"
    );
    fs.write(a.ino, 0, &[3; 65536]).expect("overwrite again");
    assert_eq!(
        extent_blocks(&fs, a.ino),
        after,
        "blocks newer than the snapshot: in place"
    );
    fs.close().expect("close");
    let s = open_snapshot(&dev, id);
    assert_eq!(s.read(a.ino, 0, 65536).expect("read"), vec![1; 65536]);
    s.close().expect("close");
    check(&dev, "nocow");
}

/// An fsync beside snapshots logs as always; a crash right after it replays the log onto the
/// committed trees, which share nodes with the snapshots, and holds the blocks the replayed
/// deletes let go of: the snapshots keep their bytes, the file system has what was fsynced,
/// and once the snapshots are gone every block comes back.
#[test]
fn an_fsync_log_replayed_beside_snapshots_keeps_their_blocks() {
    let (dev, fs) = mem_fs_with(64 << 20, 4096);
    let mut rng = Rng::new(11);
    let mut w = World::default();
    for _ in 0..150 {
        step(&fs, &mut rng, &mut w);
    }
    let before = digest(&fs);
    let id = fs.snapshot(b"s").expect("snapshot");
    fs.sync().expect("sync");
    let commits = fs.counters().commits.get();
    let logged = fs.counters().log_batches.get();
    // Deletes and overwrites of blocks the snapshot names, then an fsync: logged, no commit.
    for (p, _, name) in w.files.drain(..w.files.len() / 2) {
        fs.unlink(p, &name).expect("unlink");
    }
    for _ in 0..40 {
        step(&fs, &mut rng, &mut w);
    }
    let f = fs.create(ROOT, b"fsynced", 0o644, ME).expect("create");
    fs.write(f.ino, 0, b"durable").expect("write");
    fs.fsync(f.ino).expect("fsync");
    assert_eq!(fs.counters().commits.get(), commits, "the fsync committed");
    assert!(
        fs.counters().log_batches.get() > logged,
        "the fsync logged nothing"
    );
    let want = digest(&fs);
    // The crash: the device as the fsync left it.
    let crashed = Arc::new(MemDevice::from_bytes(dev.snapshot()));
    drop(fs);
    check(&crashed, "after the crash (the log replayed in memory)");
    let fs = Fs::open(crashed.clone(), opts()).expect("open after the crash");
    assert_eq!(digest(&fs), want, "what was fsynced");
    fs.close().expect("close");
    check(&crashed, "replayed");
    let s = open_snapshot(&crashed, id);
    assert_eq!(digest(&s), before, "the snapshot after the replay");
    s.close().expect("close");
    let fs = Fs::open(crashed.clone(), opts()).expect("open");
    fs.delete_snapshot(id).expect("delete");
    fs.finish_drops().expect("drops");
    fs.close().expect("close");
    check(&crashed, "dropped");
}

/// A full device beside a snapshot: writes end in ENOSPC, deletes of what the snapshot
/// holds succeed (and give nothing back), the file system never stops; deleting the snapshot
/// gives the space back and writes go on.
#[test]
fn a_full_device_beside_a_snapshot_takes_deletes_and_comes_back_after_its_drop() {
    let (dev, fs) = mem_fs_with(24 << 20, 4096);
    let mut files = Vec::new();
    let chunk = vec![7u8; 256 << 10];
    for i in 0.. {
        let name = format!("a{i}");
        let a = match fs.create(ROOT, name.as_bytes(), 0o644, ME) {
            Ok(a) => a,
            Err(Error::NoSpace) => break,
            Err(e) => panic!("create: {e}"),
        };
        files.push(name);
        match fs.write(a.ino, 0, &chunk) {
            Ok(_) => {}
            Err(Error::NoSpace) => break,
            Err(e) => panic!("write: {e}"),
        }
        if i == 20 {
            fs.snapshot(b"s").expect("snapshot");
        }
    }
    assert!(files.len() > 30, "the device filled before the snapshot");
    let free_full = fs.statfs().expect("statfs").blocks_free;
    // Everything goes; what the snapshot holds stays used.
    for name in &files {
        fs.unlink(ROOT, name.as_bytes())
            .expect("unlink beside a snapshot on a full device");
    }
    fs.sync().expect("sync");
    let c = fs
        .create(ROOT, b"after", 0o644, ME)
        .expect("create after the deletes");
    fs.write(c.ino, 0, &[1; 4096]).expect("a small write");
    let id = fs.snapshots().expect("list")[0].id;
    fs.delete_snapshot(id).expect("delete");
    fs.finish_drops().expect("drops");
    fs.sync().expect("sync");
    let back = fs.statfs().expect("statfs").blocks_free;
    assert!(
        back > free_full + 20 * 64,
        "{back} free after the drop, {free_full} when full"
    );
    fs.write(c.ino, 0, &vec![2; 4 << 20])
        .expect("a large write after the drop");
    fs.close().expect("close");
    check(&dev, "full device");
}

/// The commit's roots-tree writes are reserved for: beside a snapshot, overwrites that hold
/// a run each and copy shared nodes (a count for each of their children) interleaved with a
/// write that fills the device; the fill ends in ENOSPC and every commit still fits.
#[test]
fn the_roots_tree_of_a_full_device_still_commits() {
    let (dev, fs) = mem_fs_with(24 << 20, 4096);
    let mut small = Vec::new();
    for i in 0..3000 {
        let a = fs
            .create(ROOT, format!("s{i}").as_bytes(), 0o644, ME)
            .expect("create");
        fs.write(a.ino, 0, &[1; 4096]).expect("write");
        small.push(a.ino);
    }
    fs.snapshot(b"s").expect("snapshot");
    let big = fs.create(ROOT, b"big", 0o644, ME).expect("create").ino;
    let (mut off, mut full) = (0u64, false);
    for (i, ino) in small.iter().enumerate() {
        match fs.write(*ino, 0, &[2; 4096]) {
            Ok(_) => {}
            Err(Error::NoSpace) => {}
            Err(e) => panic!("an overwrite: {e:?}"),
        }
        if !full {
            match fs.write(big, off, &[3; 65536]) {
                Ok(_) => off += 65536,
                Err(Error::NoSpace) => full = true,
                Err(e) => panic!("fill: {e}"),
            }
        }
        if i % 1000 == 999 {
            fs.sync().expect("a commit beside a full device");
        }
    }
    assert!(full, "the device never filled");
    fs.sync().expect("the last commit");
    fs.close().expect("close");
    check(&dev, "full");
}

/// A snapshot's drop is resumable: the drop key and the counts it changed are committed
/// together, so a remount between steps goes on where the last commit left it.
#[test]
fn a_drop_resumes_after_a_remount_between_steps() {
    let (dev, fs) = mem_fs_with(64 << 20, 4096);
    let mut rng = Rng::new(7);
    let mut w = World::default();
    for _ in 0..400 {
        step(&fs, &mut rng, &mut w);
    }
    let id = fs.snapshot(b"big").expect("snapshot");
    // Most of the snapshot's nodes become its own: the drop has many to free.
    for (p, _, name) in std::mem::take(&mut w.files) {
        fs.unlink(p, &name).expect("unlink");
    }
    for _ in 0..100 {
        step(&fs, &mut rng, &mut w);
    }
    fs.delete_snapshot(id).expect("delete");
    let mut fs = fs;
    let mut steps = 0;
    loop {
        let more = fs.drop_step().expect("drop step");
        if !more {
            break;
        }
        steps += 1;
        if steps % 2 == 0 {
            fs.sync().expect("sync");
            fs.close().expect("close");
            check(&dev, &format!("after {steps} drop steps"));
            fs = Fs::open(dev.clone(), opts()).expect("reopen");
        }
    }
    assert!(
        steps >= 2,
        "the drop took {steps} steps: too small to test resuming"
    );
    fs.close().expect("close");
    check(&dev, "dropped");
}

/// Every prefix of the device writes of a workload with snapshots made, written beside and
/// deleted opens to a committed state that fsck passes (its NOCOW files' bytes aside: they
/// are overwritten in place), with each snapshot it lists showing exactly what it showed
/// when made, NOCOW files' bytes included: nothing writes a snapshot's blocks in place.
#[test]
fn every_prefix_with_snapshots_opens_to_a_committed_state() {
    let (mut rng, seed) = Rng::from_env("snapshots crash");
    let rec = recorded_with(32 << 20, Some([5; 16]));
    let fs = Fs::open(rec.clone(), opts()).expect("open");
    let mut w = World::default();
    let gen = |fs: &Fs| fs.with_store(|s, _, _| s.generation - 1);
    // generation -> what the file system showed then (NOCOW files' bytes aside); snapshot
    // id -> what it showed when made.
    let mut states: BTreeMap<u64, String> = BTreeMap::new();
    let mut snap_digest: BTreeMap<u64, String> = BTreeMap::new();
    let mut alive: Vec<u64> = Vec::new();
    let mut restored = 0;
    states.insert(gen(&fs), digest_crash_stable(&fs));
    // A file in the root from the start, so every snapshot has one to copy out.
    let first = gen(&fs) + 1;
    let f = fs.create(ROOT, b"first", 0o644, ME).expect("create").ino;
    fs.write(f, 0, &rng.bytes(20_000)).expect("write");
    fs.sync().expect("sync");
    for g in first..=gen(&fs) {
        states.insert(g, digest_crash_stable(&fs));
    }
    for i in 0..10 {
        for _ in 0..rng.below(8) + 2 {
            step(&fs, &mut rng, &mut w);
        }
        // Now and then a file copied out of a snapshot, sharing its blocks (some held).
        if let (3, Some(&id)) = (i % 4, alive.last()) {
            let view = fs.open_snapshot(id, 1 << 20).expect("view");
            let files: Vec<_> = view.list(ROOT).expect("list").into_iter().collect();
            for e in files.iter().filter(|e| e.dtype == 8).take(3) {
                let size = view.getattr(e.ino).expect("getattr").size;
                let name = format!("restored{i}-{}", String::from_utf8_lossy(&e.name));
                let d = fs.create(ROOT, name.as_bytes(), 0o644, ME).expect("create");
                fs.copy_from_snapshot(&view, e.ino, 0, d.ino, 0, size, Default::default())
                    .expect("copy out of a snapshot");
                restored += 1;
            }
        }
        // Snapshots, deletes, drop steps and syncs commit without changing what the file
        // system shows: every generation they commit shows `now`.
        let (now, first) = (digest_crash_stable(&fs), gen(&fs) + 1);
        match i % 4 {
            0 | 1 => {
                let want = digest(&fs);
                let id = fs.snapshot(format!("c{i}").as_bytes()).expect("snapshot");
                snap_digest.insert(id, want);
                alive.insert(0, id);
            }
            2 => {
                if let Some(id) = alive.pop() {
                    fs.delete_snapshot(id).expect("delete");
                    for _ in 0..3 {
                        fs.drop_step().expect("drop step");
                        fs.sync().expect("sync");
                    }
                }
            }
            _ => {}
        }
        fs.sync().expect("sync");
        for g in first..=gen(&fs) {
            states.insert(g, now.clone());
        }
    }
    drop(fs);
    assert!(
        restored > 0,
        "seed {seed}: nothing was copied out of a snapshot"
    );
    every_crash_image(&rec, &mut rng, seed, |dev, at| {
        let fs = Fs::open(dev.clone(), opts()).unwrap_or_else(|e| panic!("{at}: open: {e}"));
        let g = gen(&fs);
        let want = states
            .get(&g)
            .unwrap_or_else(|| panic!("{at}: generation {g} never committed"));
        assert_eq!(
            &digest_crash_stable(&fs),
            want,
            "{at}: state of generation {g}"
        );
        let listed: Vec<u64> = (fs.snapshots().expect("list").iter())
            .filter(|s| !s.dropping)
            .map(|s| s.id)
            .collect();
        fs.close().expect("close");
        for id in listed {
            let s = open_snapshot(&dev, id);
            assert_eq!(
                Some(&digest(&s)),
                snap_digest.get(&id),
                "{at}: snapshot {id}"
            );
            s.close().expect("close");
        }
        // What the crash left keeps working: the drops go on, and fsck still passes.
        let fs = Fs::open(dev.clone(), opts()).expect("reopen");
        fs.finish_drops().expect("drops after a crash");
        fs.close().expect("close");
        check(&dev, &format!("{at}, drops finished"));
    });
}

/// Rolls `fs` back to snapshot `id`, checks the image, and opens it again.
fn roll_back(
    fs: Fs,
    dev: &Arc<MemDevice>,
    id: u64,
    at: &str,
) -> (Fs, idxfs_engine::fs::RolledBack) {
    let r = fs
        .rollback(id)
        .unwrap_or_else(|e| panic!("{at}: rollback to {id}: {e}"));
    check(dev, &format!("{at}, rolled back to {id}"));
    (Fs::open(dev.clone(), opts()).expect("reopen"), r)
}

#[test]
fn rollbacks_return_to_each_snapshot_and_keep_the_others() {
    let (mut rng, seed) = Rng::from_env("rollback model");
    let (dev, mut fs) = mem_fs_with(128 << 20, 4096);
    let mut w = World {
        fsync: true,
        ..Default::default()
    };
    for _ in 0..60 {
        step(&fs, &mut rng, &mut w);
    }
    // id -> what the file system showed when it was made, and the workload's files then.
    let mut snaps: BTreeMap<u64, (String, World)> = BTreeMap::new();
    let (mut made, mut rollbacks) = (0, 0);
    let (mut released, mut taken_back, mut moved) = (0, 0, 0);
    for round in 0..30 {
        let at = format!("seed {seed} round {round}");
        for _ in 0..rng.below(60) + 10 {
            step(&fs, &mut rng, &mut w);
            if rng.chance(4) && snaps.len() < 5 {
                let id = fs
                    .snapshot(format!("s{made}").as_bytes())
                    .expect("snapshot");
                made += 1;
                snaps.insert(id, (digest(&fs), w.clone()));
            }
            if rng.chance(1) && !snaps.is_empty() {
                let id = *snaps.keys().next().expect("id");
                fs.delete_snapshot(id).expect("delete");
                snaps.remove(&id);
            }
            // A file copied out of a snapshot now and then: its blocks are held ones
            // the file system names again, or shared ones.
            if rng.chance(3) {
                if let Some(&id) = snaps.keys().next_back() {
                    let view = fs.open_snapshot(id, 1 << 20).expect("view");
                    let files = view.list(ROOT).expect("list");
                    if let Some(e) = files.iter().find(|e| e.dtype == 8) {
                        let size = view.getattr(e.ino).expect("getattr").size;
                        let name = format!("back{}", w.n).into_bytes();
                        w.n += 1;
                        let d = fs.create(ROOT, &name, 0o644, ME).expect("create");
                        fs.copy_from_snapshot(&view, e.ino, 0, d.ino, 0, size, Default::default())
                            .expect("copy out of a snapshot");
                        w.files.push((ROOT, d.ino, name));
                    }
                }
            }
        }
        if snaps.is_empty() || rng.chance(30) {
            continue;
        }
        let id = *snaps
            .keys()
            .nth(rng.below(snaps.len() as u64) as usize)
            .expect("id");
        let r;
        (fs, r) = roll_back(fs, &dev, id, &at);
        rollbacks += 1;
        released += r.blocks_released;
        taken_back += r.blocks_taken_back;
        moved += r.blocks_moved;
        let (want, then) = &snaps[&id];
        assert_eq!(&digest(&fs), want, "{at}: rolled back to {id}");
        w = World {
            fsync: true,
            n: w.n,
            ..then.clone()
        };
        let listed: Vec<u64> = (fs.snapshots().expect("list").iter())
            .filter(|s| !s.dropping)
            .map(|s| s.id)
            .collect();
        assert_eq!(listed, snaps.keys().copied().collect::<Vec<_>>(), "{at}");
        for (id, (want, _)) in &snaps {
            let v = fs.open_snapshot(*id, 1 << 20).expect("view");
            assert_eq!(&digest(&v), want, "{at}: snapshot {id} after the rollback");
        }
    }
    eprintln!(
        "seed {seed}: {made} snapshots, {rollbacks} rollbacks, {released} blocks released, \
         {taken_back} taken back, {moved} preallocated ones moved"
    );
    assert!(
        rollbacks > 0 && released > 0 && taken_back > 0,
        "seed {seed}: too little ran"
    );
    // Delete everything: no block stays held, fsck finds every block accounted for.
    delete_all(fs, &dev, snaps.keys().copied(), &format!("seed {seed} end"));
}

#[test]
fn a_rollback_to_a_missing_or_deleted_snapshot_changes_nothing() {
    let (dev, fs) = mem_fs_with(32 << 20, 4096);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.write(f, 0, b"before").expect("write");
    let id = fs.snapshot(b"s").expect("snapshot");
    fs.write(f, 0, b"after!").expect("write");
    fs.delete_snapshot(id).expect("delete");
    let want = digest(&fs);
    assert!(matches!(fs.rollback(id), Err(Error::NotFound)));
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    assert_eq!(digest(&fs), want);
    assert!(matches!(fs.rollback(id + 7), Err(Error::NotFound)));
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    assert_eq!(digest(&fs), want);
    // A snapshot open alone is read-only: nothing to roll back.
    fs.close().expect("close");
    let id = {
        let fs = Fs::open(dev.clone(), opts()).expect("reopen");
        let id = fs.snapshot(b"t").expect("snapshot");
        fs.close().expect("close");
        id
    };
    assert!(matches!(
        open_snapshot(&dev, id).rollback(id),
        Err(Error::ReadOnly)
    ));
    check(&dev, "after refused rollbacks");
}

#[test]
fn every_prefix_of_a_rollback_opens_to_before_or_after_it() {
    let (mut rng, seed) = Rng::from_env("rollback crash");
    let rec = recorded_with(32 << 20, Some([6; 16]));
    let fs = Fs::open(rec.clone(), opts()).expect("open");
    let mut w = World::default();
    for _ in 0..40 {
        step(&fs, &mut rng, &mut w);
    }
    let old_want = digest(&fs);
    let old = fs.snapshot(b"old").expect("snapshot");
    for _ in 0..30 {
        step(&fs, &mut rng, &mut w);
    }
    let want = digest(&fs);
    let id = fs.snapshot(b"target").expect("snapshot");
    for _ in 0..40 {
        step(&fs, &mut rng, &mut w);
    }
    // A file back from the older snapshot: held blocks the file system names again, which
    // the target does not name.
    let view = fs.open_snapshot(old, 1 << 20).expect("view");
    for e in view
        .list(ROOT)
        .expect("list")
        .iter()
        .filter(|e| e.dtype == 8)
        .take(2)
    {
        let size = view.getattr(e.ino).expect("getattr").size;
        let d = fs
            .create(ROOT, &[b"back-", &e.name[..]].concat(), 0o644, ME)
            .expect("create");
        fs.copy_from_snapshot(&view, e.ino, 0, d.ino, 0, size, Default::default())
            .expect("copy out of a snapshot");
    }
    drop(view);
    fs.sync().expect("sync");
    let before = digest(&fs);
    let from = rec.events().len();
    let r = fs.rollback(id).expect("rollback");
    eprintln!("seed {seed}: {r:?}");
    let events = rec.events();
    assert!(
        events.len() > from,
        "seed {seed}: the rollback wrote nothing"
    );
    let mut outcomes = [0; 2];
    for prefix in from..=events.len() {
        for tear in [Tear::None, Tear::TornLast(1), Tear::Drop(rng.next_u64())] {
            let at = format!("seed {seed} prefix {prefix} {tear:?}");
            let dev = Arc::new(MemDevice::from_bytes(rec.crash_image(prefix, tear).bytes));
            check(&dev, &at);
            let fs = Fs::open(dev.clone(), opts()).unwrap_or_else(|e| panic!("{at}: open: {e}"));
            let got = digest(&fs);
            let after = got == want;
            assert!(
                after || got == before,
                "{at}: neither before nor after the rollback"
            );
            outcomes[after as usize] += 1;
            fs.close().expect("close");
            for (s, snap_want) in [(old, &old_want), (id, &want)] {
                let v = open_snapshot(&dev, s);
                assert_eq!(&digest(&v), snap_want, "{at}: snapshot {s}");
                v.close().expect("close");
            }
            // Deleting everything afterwards leaves nothing held or leaked.
            let fs = Fs::open(dev.clone(), opts()).expect("reopen");
            fs.delete_snapshot(old).expect("delete");
            fs.delete_snapshot(id).expect("delete");
            fs.finish_drops().expect("drops");
            fs.close().expect("close");
            check(&dev, &format!("{at}, all deleted"));
        }
    }
    eprintln!("seed {seed}: before {}, after {}", outcomes[0], outcomes[1]);
    assert!(
        outcomes[0] > 0 && outcomes[1] > 0,
        "seed {seed}: {outcomes:?}"
    );
}

/// A rollback that must move a preallocated extent (the snapshot's preallocated blocks, which
/// the file system wrote after it and a later snapshot names as written) needs room for the
/// new blocks first: on a full device it is refused (ENOSPC) with nothing changed; with room
/// it moves them, and the later snapshot keeps its bytes while the rolled-back file fills
/// its preallocated range again.
#[test]
fn a_rollback_that_moves_preallocated_blocks_needs_room_first() {
    let (dev, fs) = mem_fs_with(24 << 20, 4096);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.fallocate(f, 0, 1 << 20, 0).expect("preallocate");
    let want = digest(&fs);
    let a = fs.snapshot(b"a").expect("snapshot");
    // Filled in place after the snapshot; a later snapshot names those blocks as written.
    fs.write(f, 0, &vec![5u8; 1 << 20]).expect("fill");
    let later = digest(&fs);
    let b = fs.snapshot(b"b").expect("snapshot");
    let mut n = 0;
    loop {
        let name = format!("fill{n}");
        let Ok(c) = fs.create(ROOT, name.as_bytes(), 0o644, ME) else {
            break;
        };
        n += 1;
        if fs.write(c.ino, 0, &vec![9u8; 256 << 10]).is_err() {
            break;
        }
    }
    fs.sync().expect("sync");
    let full = digest(&fs);
    assert!(matches!(fs.rollback(a), Err(Error::NoSpace)));
    check(&dev, "after a rollback refused for space");
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    assert_eq!(
        digest(&fs),
        full,
        "a refused rollback changed the file system"
    );
    for i in 0..n {
        let _ = fs.unlink(ROOT, format!("fill{i}").as_bytes());
    }
    fs.sync().expect("sync");
    let r = fs.rollback(a).expect("rollback with room");
    assert_eq!(r.blocks_moved, 256, "{r:?}");
    check(&dev, "after the rollback");
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    assert_eq!(digest(&fs), want);
    // The rolled-back file's preallocated range fills in place; snapshot b keeps its bytes.
    fs.write(f, 0, &vec![6u8; 1 << 20]).expect("fill again");
    fs.sync().expect("sync");
    let v = fs.open_snapshot(b, 1 << 20).expect("view");
    assert_eq!(digest(&v), later, "snapshot b changed");
    drop(v);
    fs.delete_snapshot(a).expect("delete");
    fs.delete_snapshot(b).expect("delete");
    fs.finish_drops().expect("drops");
    fs.close().expect("close");
    check(&dev, "everything deleted");
}
