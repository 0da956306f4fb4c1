//! Writable subvolumes made from snapshots (`fs::clones`) against a model: the file system's
//! own tree and its clones (and clones of clones' snapshots) each opened in turn and changed
//! by the random workload of the snapshot tests, snapshots made of whichever is open, clones
//! and snapshots deleted among them. After every round every tree, parked or not, and every
//! snapshot shows exactly what it showed when it was last changed or made (`digest`), and
//! fsck passes (each block owned once, node counts, held runs, every tree a file system). At
//! the end every clone and snapshot is deleted: fsck then finds no block held or leaked.
//!
//! And the rules that keep the trees apart: a snapshot a clone was made from is not
//! deleted, a preallocated block two trees name is not filled in place, restores and
//! rollbacks follow lineage (into a clone from its own snapshots too, the origin's blocks
//! neither counted nor unheld), an fsync in a clone is logged and survives a crash,
//! every prefix of a workload that makes, switches to, writes and deletes clones opens to a
//! committed state with fsck clean, and every prefix of fsyncs in a clone to an fsynced one.
mod common;
use common::digest::{digest, digest_crash_stable};
use common::workload::{check, every_crash_image, step, World};
use common::*;
use idxfs_blockdev::{BlockDevice, MemDevice};
use idxfs_engine::fs::{Fs, Unchecked};
use idxfs_engine::testutil::Rng;
use idxfs_engine::{Error, OpenOptions};
use idxfs_format::FS_SUBVOL_ID;
use std::collections::BTreeMap;
use std::sync::Arc;

fn open_as(dev: &Arc<MemDevice>, id: u64) -> Fs {
    Fs::open(
        dev.clone(),
        OpenOptions {
            subvolume: Some(id),
            ..opts()
        },
    )
    .unwrap_or_else(|e| panic!("open subvolume {id}: {e}"))
}

fn peek(dev: &Arc<MemDevice>, id: u64) -> String {
    let fs = Fs::open(
        dev.clone(),
        OpenOptions {
            subvolume: Some(id),
            read_only: true,
            ..opts()
        },
    )
    .unwrap_or_else(|e| panic!("open subvolume {id} read-only: {e}"));
    let d = digest(&fs);
    fs.close().expect("close");
    d
}

#[test]
fn clones_keep_their_own_state_and_give_every_block_back() {
    let (mut rng, seed) = Rng::from_env("clones model");
    let (dev, fs) = mem_fs_with(160 << 20, 4096);
    let mut w = World {
        fsync: true,
        ..Default::default()
    };
    for _ in 0..40 {
        step(&fs, &mut rng, &mut w);
    }
    // Writable trees: id -> (what it shows, the workload's files in it).
    let mut trees: BTreeMap<u64, (String, World)> = BTreeMap::new();
    trees.insert(FS_SUBVOL_ID, (digest(&fs), w));
    // Snapshots: id -> (what it shows, the files then).
    let mut snaps: BTreeMap<u64, (String, World)> = BTreeMap::new();
    // What keeps a snapshot from its delete (`clones`): clone or snapshot of a clone ->
    // the clone's origin; and the same for deleted ones whose drop may not have ended.
    let mut origins: BTreeMap<u64, u64> = BTreeMap::new();
    let mut dropping: BTreeMap<u64, u64> = BTreeMap::new();
    // Each snapshot's tree (its lineage: `Clones::may_take_from`).
    let mut snap_of: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut restores, mut refused, mut rollbacks, mut repairs) = (0, 0, 0, 0);
    let (mut rebuilds, mut into_clones) = (0, 0);
    fs.close().expect("close");
    let (mut made, mut clones_made, mut clones_deleted, mut switches) = (0, 0, 0, 0);
    // What an empty subvolume (`Fs::make_subvolume`) shows: a fresh file system's root.
    let empty = {
        let (_, fresh) = mem_fs_with(16 << 20, 4096);
        let d = digest(&fresh);
        fresh.close().expect("close");
        d
    };
    let (mut empties, mut writable_snapshots) = (0, 0);
    // Writable snapshots' origins (`Fs::writable_snapshot`), which no one lists.
    let mut hidden = std::collections::BTreeSet::new();
    let mut active = FS_SUBVOL_ID;
    for round in 0..24 {
        let at = format!("seed {seed} round {round}");
        let ids: Vec<u64> = trees.keys().copied().collect();
        let id = ids[rng.below(ids.len() as u64) as usize];
        switches += u64::from(id != active);
        active = id;
        let fs = open_as(&dev, id);
        if std::env::var("CLONES_TRACE").is_ok() {
            eprintln!("{at}: open {id}");
        }
        assert_eq!(fs.active_subvolume(), id, "{at}");
        let (want, mut w) = trees.remove(&id).expect("tree");
        assert_eq!(
            digest(&fs),
            want,
            "{at}: subvolume {id} changed while parked"
        );
        for _ in 0..rng.below(50) + 10 {
            step(&fs, &mut rng, &mut w);
            if rng.chance(4) && snaps.len() < 6 {
                let s = fs
                    .snapshot(format!("s{made}").as_bytes())
                    .expect("snapshot");
                made += 1;
                if let Some(&o) = origins.get(&id) {
                    origins.insert(s, o);
                }
                if std::env::var("CLONES_TRACE").is_ok() {
                    eprintln!("{at}: snapshot {s} of {id}");
                }
                snaps.insert(s, (digest(&fs), w.clone()));
                snap_of.insert(s, id);
            }
            if rng.chance(4) && !snaps.is_empty() {
                // A file restored out of a snapshot, as `cp` out of `.snapshots` does.
                let s = pick_snapshot(&mut rng, &snap_of, id);
                let lineage = Lineage::of(id, s, snap_of[&s], &trees, &origins, &dropping);
                let name = format!("x{}", w.n);
                match (restore_one(&fs, s, &snaps[&s].1, &mut rng, &name), lineage) {
                    (Ok(Some(x)), Lineage::Allowed | Lineage::Either) => {
                        w.files.push((ROOT, x, name.into_bytes()));
                        restores += 1;
                        into_clones += u64::from(origins.contains_key(&id));
                    }
                    (Ok(None), _) => {}
                    (Err(Error::NotSupported(_)), Lineage::Refused | Lineage::Either) => {
                        refused += 1
                    }
                    (r, l) => panic!(
                        "{at}: restore from snapshot {s} of {} into {id}: {:?}, expected {l:?}",
                        snap_of[&s],
                        r.map_err(|e| e.to_string())
                    ),
                }
            }
            if rng.chance(3) && !snaps.is_empty() && trees.len() < 5 {
                let s = *snaps
                    .keys()
                    .nth(rng.below(snaps.len() as u64) as usize)
                    .expect("id");
                let c = fs
                    .make_clone(s, format!("c{clones_made}").as_bytes())
                    .expect("clone");
                clones_made += 1;
                if std::env::var("CLONES_TRACE").is_ok() {
                    eprintln!("{at}: clone {c} of {s}");
                }
                trees.insert(c, snaps[&s].clone());
                origins.insert(c, s);
            }
            if rng.chance(2) && trees.len() < 5 {
                // A writable snapshot of the open tree: a clone of a hidden origin.
                let c = fs
                    .writable_snapshot(format!("w{clones_made}").as_bytes())
                    .expect("writable snapshot");
                clones_made += 1;
                let h = (fs.subvolumes().into_iter())
                    .find(|s| s.id == c)
                    .and_then(|s| s.origin)
                    .expect("its origin");
                if std::env::var("CLONES_TRACE").is_ok() {
                    eprintln!("{at}: writable snapshot {c} of {id} (origin {h})");
                }
                trees.insert(c, (digest(&fs), w.clone()));
                // Its hidden origin is a snapshot of the open tree: of a clone, it names
                // the clone's origin's blocks too.
                if let Some(&o) = origins.get(&id) {
                    origins.insert(h, o);
                }
                origins.insert(c, h);
                hidden.insert(h);
                writable_snapshots += 1;
            }
            if rng.chance(1) && trees.len() < 5 {
                let e = fs
                    .make_subvolume(format!("e{empties}").as_bytes(), ME)
                    .expect("make an empty subvolume");
                empties += 1;
                if std::env::var("CLONES_TRACE").is_ok() {
                    eprintln!("{at}: empty subvolume {e}");
                }
                trees.insert(e, (empty.clone(), World::default()));
            }
            if rng.chance(2) && !snaps.is_empty() {
                let s = *snaps
                    .keys()
                    .nth(rng.below(snaps.len() as u64) as usize)
                    .expect("id");
                match fs.delete_snapshot(s) {
                    Ok(()) => {
                        if std::env::var("CLONES_TRACE").is_ok() {
                            eprintln!("{at}: deleted snapshot {s}");
                        }
                        assert!(
                            !origins.values().any(|&o| o == s),
                            "{at}: origin {s} deleted"
                        );
                        snaps.remove(&s);
                        snap_of.remove(&s);
                        if let Some(o) = origins.remove(&s) {
                            dropping.insert(s, o);
                            retire_hidden(o, &hidden, &mut origins, &mut dropping);
                        }
                    }
                    Err(Error::Busy(_)) => assert!(
                        origins.values().chain(dropping.values()).any(|&o| o == s),
                        "{at}: {s} refused"
                    ),
                    Err(e) => panic!("{at}: delete snapshot {s}: {e}"),
                }
            }
            if rng.chance(2) {
                let parked: Vec<u64> = (trees.keys().copied())
                    .filter(|&t| t != FS_SUBVOL_ID)
                    .collect();
                if let Some(&c) = parked.get(rng.below(parked.len().max(1) as u64) as usize) {
                    fs.delete_snapshot(c).expect("delete a clone");
                    if std::env::var("CLONES_TRACE").is_ok() {
                        eprintln!("{at}: deleted clone {c}");
                    }
                    trees.remove(&c);
                    if let Some(o) = origins.remove(&c) {
                        dropping.insert(c, o);
                        retire_hidden(o, &hidden, &mut origins, &mut dropping);
                    }
                    clones_deleted += 1;
                }
            }
        }
        assert!(matches!(
            fs.delete_snapshot(id),
            Err(Error::Busy(_)) | Err(Error::Invalid(_))
        ));
        if rng.chance(50) {
            fs.finish_drops().expect("drops");
            dropping.clear();
        }
        let rollback_to =
            (rng.chance(30) && !snaps.is_empty()).then(|| pick_snapshot(&mut rng, &snap_of, id));
        let lineage =
            rollback_to.map(|s| Lineage::of(id, s, snap_of[&s], &trees, &origins, &dropping));
        trees.insert(id, (digest(&fs), w));
        let listed: Vec<u64> = fs.subvolumes().iter().map(|s| s.id).collect();
        assert_eq!(
            listed,
            trees.keys().copied().collect::<Vec<_>>(),
            "{at}: listed"
        );
        match (rollback_to, lineage) {
            (Some(s), Some(l)) => match (fs.rollback(s), l) {
                (Ok(_), Lineage::Allowed | Lineage::Either) => {
                    // The tree is what the snapshot holds, the workload's files its files.
                    trees.insert(id, snaps[&s].clone());
                    rollbacks += 1;
                    into_clones += u64::from(origins.contains_key(&id));
                }
                (Err(Error::NotSupported(_)), Lineage::Refused | Lineage::Either) => refused += 1,
                (r, l) => panic!(
                    "{at}: rollback of {id} to snapshot {s} of {}: {:?}, expected {l:?}",
                    snap_of[&s],
                    r.map(|_| ()).map_err(|e| e.to_string())
                ),
            },
            _ => fs.close().expect("close"),
        }
        if rng.chance(25) {
            // A repair of the whole image rebuilds the active tree and keeps every other
            // tree and snapshot as it was; drops in flight end first. Half the time a
            // writable tree, parked or active, has a file whose link count is damaged
            // first: that tree is rebuilt, and shows what it showed.
            let damaged = rng.chance(50).then(|| {
                let ids: Vec<u64> = trees.keys().copied().collect();
                let t = ids[rng.below(ids.len() as u64) as usize];
                let fs = open_as(&dev, t);
                let v = fs
                    .create(ROOT, format!("victim{repairs}").as_bytes(), 0o644, ME)
                    .expect("create")
                    .ino;
                fs.write(v, 0, &[7u8; 9000]).expect("write");
                // A mode no other inode has, earlier victims included (a snapshot may hold
                // one with the same inode number): only this leaf is damaged.
                let odd_mode = 0o7000 | (1 + repairs as u32 % 0o776);
                let odd = idxfs_engine::fs::SetAttr {
                    mode: Some(odd_mode),
                    ..Default::default()
                };
                fs.setattr(v, &odd).expect("chmod");
                if let Some(m) = trees.get_mut(&t) {
                    m.0 = digest(&fs);
                }
                fs.close().expect("close");
                if rng.chance(50) {
                    // Parked: another tree made active.
                    let u = ids[rng.below(ids.len() as u64) as usize];
                    open_as(&dev, u).close().expect("close");
                    active = u;
                } else {
                    active = t;
                }
                let mut img = dev.snapshot();
                assert!(set_link_count(&mut img, 4096, v, odd_mode, 3) > 0, "{at}");
                dev.write_at(&img, 0).expect("damage");
                t
            });
            let r = idxfs_engine::repair::repair(
                &(dev.clone() as Arc<dyn idxfs_blockdev::BlockDevice>),
                idxfs_format::hash::name_hash,
            )
            .unwrap_or_else(|e| panic!("{at}: repair: {e}"));
            assert!(r.check.is_clean(), "{at}: repair: {:?}", r.check.problems);
            let wrong = |l: &&String| l.contains("deleted") || l.contains("another tree's");
            assert!(
                !r.actions.iter().any(|l| wrong(&l)),
                "{at}: {:?}",
                r.actions
            );
            if std::env::var("CLONES_TRACE").is_ok() {
                eprintln!(
                    "{at}: damaged {damaged:?}, active {active}: {:?}",
                    r.actions
                );
            }
            if let Some(t) = damaged.filter(|&t| t != active) {
                let rebuilt = |l: &String| l.contains(" is damaged (") && l.ends_with("rebuilt");
                assert!(r.actions.iter().any(rebuilt), "{at}: {t}: {:?}", r.actions);
                rebuilds += 1;
            }
            dropping.clear();
            repairs += 1;
            if std::env::var("CLONES_TRACE").is_ok() {
                eprintln!("{at}: repaired");
            }
        }
        check(&dev, &at);
        for (t, (want, _)) in &trees {
            assert_eq!(&peek(&dev, *t), want, "{at}: subvolume {t}");
        }
        for (s, (want, _)) in &snaps {
            let v = Fs::open(
                dev.clone(),
                OpenOptions {
                    snapshot: Some(*s),
                    ..opts()
                },
            )
            .expect("open a snapshot");
            assert_eq!(&digest(&v), want, "{at}: snapshot {s} changed");
            v.close().expect("close");
        }
    }
    eprintln!(
        "seed {seed}: {made} snapshots, {clones_made} clones ({writable_snapshots} writable \
         snapshots) and {empties} empty subvolumes made, {clones_deleted} deleted, {switches} switches; {restores} restores and \
         {rollbacks} rollbacks made ({into_clones} into a clone), {refused} refused; {repairs} repairs ({rebuilds} of a \
         damaged parked tree)"
    );
    assert!(
        clones_made > 0 && switches > 0,
        "seed {seed}: no clone was used"
    );
    // Everything deleted from the file system's own tree: no block held or leaked.
    let fs = open_as(&dev, FS_SUBVOL_ID);
    for c in trees.keys().filter(|&&t| t != FS_SUBVOL_ID) {
        fs.delete_snapshot(*c).expect("delete a clone");
    }
    // Those a clone was made from go once what names their blocks through it is gone.
    let mut left: Vec<u64> = snaps.keys().copied().collect();
    for _ in 0..=snaps.len() {
        left.retain(|s| match fs.delete_snapshot(*s) {
            Ok(()) => false,
            Err(Error::Busy(_)) => true,
            Err(e) => panic!("seed {seed}: delete snapshot {s}: {e}"),
        });
        fs.finish_drops().expect("drops");
    }
    assert!(
        left.is_empty(),
        "seed {seed}: snapshots {left:?} could not be deleted"
    );
    assert!(fs.snapshots().expect("list").is_empty());
    assert_eq!(fs.subvolumes().len(), 1);
    let live = digest(&fs);
    fs.close().expect("close");
    check(&dev, &format!("seed {seed} end"));
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    assert_eq!(digest(&fs), live);
    fs.close().expect("close");
}

/// A hidden origin `o` goes with its last use (`Inner::retire_hidden`), at the end of a drop
/// the model does not see: once no live tree or snapshot names it as origin, it counts as
/// dropping, and what it names as its own origin with it.
fn retire_hidden(
    o: u64,
    hidden: &std::collections::BTreeSet<u64>,
    origins: &mut BTreeMap<u64, u64>,
    dropping: &mut BTreeMap<u64, u64>,
) {
    if hidden.contains(&o) && !origins.values().any(|&v| v == o) {
        if let Some(oo) = origins.remove(&o) {
            dropping.insert(o, oo);
            retire_hidden(oo, hidden, origins, dropping);
        }
    }
}

/// Any snapshot of `snap_of` (snapshot -> the tree it was taken of, not empty), but half
/// the time one taken of tree `active` when there is one.
fn pick_snapshot(rng: &mut Rng, snap_of: &BTreeMap<u64, u64>, active: u64) -> u64 {
    let own: Vec<u64> = (snap_of.iter())
        .filter(|(_, &t)| t == active)
        .map(|(&s, _)| s)
        .collect();
    let all: Vec<u64> = snap_of.keys().copied().collect();
    let from = match rng.chance(50) && !own.is_empty() {
        true => own,
        false => all,
    };
    from[rng.below(from.len() as u64) as usize]
}

/// Whether a restore or rollback from a snapshot into the open tree is made
/// (`Clones::may_take_from`).
#[derive(Debug, Clone, Copy)]
enum Lineage {
    Allowed,
    Refused,
    /// Only deleted clones whose drop may have ended in the background keep it from being
    /// the only writable tree.
    Either,
}

impl Lineage {
    /// Into tree `active` from snapshot `snap` of tree `of`, beside the `others` (parked).
    fn of(
        active: u64,
        snap: u64,
        of: u64,
        others: &BTreeMap<u64, (String, World)>,
        origins: &BTreeMap<u64, u64>,
        dropping: &BTreeMap<u64, u64>,
    ) -> Lineage {
        let alone = others.is_empty() && active == FS_SUBVOL_ID && origins.is_empty();
        // Taken of the open tree (a clone's names its origin's blocks too), or its origin.
        if of == active || origins.get(&active) == Some(&snap) || alone && dropping.is_empty() {
            Lineage::Allowed
        } else if alone {
            Lineage::Either
        } else {
            Lineage::Refused
        }
    }
}

/// Restores a file of snapshot `s` (whose files were `files`) into a new file `name` of the
/// root, sharing its blocks: Some(its ino) with the source's bytes, None when the snapshot
/// held no file, or the refusal (the new file removed again).
fn restore_one(
    fs: &Fs,
    s: u64,
    files: &World,
    rng: &mut Rng,
    name: &str,
) -> Result<Option<u64>, Error> {
    if files.files.is_empty() {
        return Ok(None);
    }
    let (_, src, _) = files.files[rng.below(files.files.len() as u64) as usize].clone();
    let view = fs.open_snapshot(s, 1 << 20).expect("view");
    let size = view.getattr(src).expect("getattr in the snapshot").size;
    let x = fs
        .create(ROOT, name.as_bytes(), 0o644, ME)
        .expect("create")
        .ino;
    let r = fs.copy_from_snapshot(&view, src, 0, x, 0, size, Default::default());
    let r = match r {
        Ok(n) => {
            assert_eq!(n, size, "restored bytes");
            assert_eq!(
                fs.read(x, 0, size as usize).expect("read the copy"),
                view.read(src, 0, size as usize).expect("read the source"),
                "restored {src} of snapshot {s}"
            );
            Ok(Some(x))
        }
        Err(e) => {
            fs.unlink(ROOT, name.as_bytes()).expect("unlink");
            Err(e)
        }
    };
    view.close().expect("close view");
    r
}

/// A file system with a file of `len` preallocated bytes, a snapshot of it and a clone of
/// that: (device, clone id, file ino).
fn preallocated_clone(len: u64) -> (Arc<MemDevice>, u64, u64) {
    let (dev, fs) = mem_fs_with(64 << 20, 4096);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.fallocate(f, 0, len, 0).expect("preallocate");
    let s = fs.snapshot(b"s").expect("snapshot");
    let c = fs.make_clone(s, b"c").expect("clone");
    fs.close().expect("close");
    (dev, c, f)
}

#[test]
fn a_preallocated_block_two_trees_name_is_not_filled_in_place() {
    let (dev, c, f) = preallocated_clone(64 << 10);
    // Written in the clone, then in the file system's own tree: each keeps its bytes.
    let fs = open_as(&dev, c);
    let before = extent_blocks(&fs, f);
    fs.write(f, 0, &[7u8; 8192]).expect("write in the clone");
    assert_ne!(extent_blocks(&fs, f), before, "the clone wrote in place");
    fs.close().expect("close");
    let fs = open_as(&dev, FS_SUBVOL_ID);
    assert_eq!(fs.read(f, 0, 8192).expect("read"), vec![0u8; 8192]);
    fs.write(f, 0, &[9u8; 4096])
        .expect("write in the file system");
    fs.close().expect("close");
    let fs = open_as(&dev, c);
    assert_eq!(fs.read(f, 0, 8192).expect("read"), vec![7u8; 8192]);
    fs.close().expect("close");
    check(&dev, "after writes on both sides");
}

/// And restores follow lineage (`Clones::may_take_from`): beside a clone, the file system
/// restores from and rolls back to its own snapshots, not the clone's; the clone from and
/// to its origin, not another snapshot of the file system's tree.
#[test]
fn an_origin_stays_while_its_clone_does_and_restores_follow_lineage() {
    let (dev, fs) = mem_fs_with(64 << 20, 4096);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.write(f, 0, &[1u8; 20_000]).expect("write");
    let s = fs.snapshot(b"s").expect("snapshot");
    let c = fs.make_clone(s, b"c").expect("clone");
    assert!(matches!(fs.make_clone(s, b"c"), Err(Error::Exists)));
    assert!(matches!(fs.snapshot(b"c"), Err(Error::Exists)));
    assert!(matches!(fs.make_clone(c, b"d"), Err(Error::NotFound)));
    assert!(matches!(fs.delete_snapshot(s), Err(Error::Busy(_))));
    assert!(matches!(
        fs.delete_snapshot(FS_SUBVOL_ID),
        Err(Error::Invalid(_))
    ));
    let view = fs.open_snapshot(s, 1 << 20).expect("view");
    let g = fs.create(ROOT, b"g", 0o644, ME).expect("create").ino;
    fs.write(f, 0, &[2u8; 20_000]).expect("overwrite");
    fs.copy_from_snapshot(&view, f, 0, g, 0, 20_000, Default::default())
        .expect("restore from the file system's own snapshot beside its clone");
    view.close().expect("close view");
    assert_eq!(fs.read(g, 0, 20_000).expect("read"), vec![1u8; 20_000]);
    let other = fs.snapshot(b"other").expect("another snapshot");
    fs.close().expect("close");
    check(&dev, "after the restore");
    // In the clone: from its origin, whose every block is the origin's to it; not from
    // another snapshot of the file system's tree (from its own:
    // `a_clone_restores_from_and_rolls_back_to_its_own_snapshots`).
    let fs = open_as(&dev, c);
    fs.write(f, 0, &[3u8; 20_000]).expect("write in the clone");
    let own = fs.snapshot(b"of c").expect("snapshot of the clone");
    for (from, byte) in [(s, Some(1u8)), (other, None)] {
        let view = fs.open_snapshot(from, 1 << 20).expect("view");
        let h = fs.create(ROOT, b"h", 0o644, ME).expect("create").ino;
        let r = fs.copy_from_snapshot(&view, f, 0, h, 0, 20_000, Default::default());
        match byte {
            Some(b) => {
                r.expect("restore into the clone from its origin");
                assert_eq!(fs.read(h, 0, 20_000).expect("read"), vec![b; 20_000]);
            }
            None => assert!(matches!(r, Err(Error::NotSupported(_))), "{r:?}"),
        }
        view.close().expect("close view");
        fs.unlink(ROOT, b"h").expect("unlink");
    }
    fs.sync().expect("sync");
    check(&dev, "after a restore into the clone from its origin");
    assert!(matches!(fs.rollback(other), Err(Error::NotSupported(_))));
    // Rolled back to its origin, the clone is as it was made; its snapshot stays.
    let fs = open_as(&dev, c);
    fs.rollback(s).expect("rollback of the clone to its origin");
    check(&dev, "after the clone's rollback to its origin");
    let fs = open_as(&dev, c);
    assert_eq!(fs.read(f, 0, 20_000).expect("read"), vec![1u8; 20_000]);
    fs.close().expect("close");
    // The file system rolls back to its own snapshot, the clone untouched.
    let fs = open_as(&dev, FS_SUBVOL_ID);
    assert!(matches!(fs.rollback(own), Err(Error::NotSupported(_))));
    let fs = open_as(&dev, FS_SUBVOL_ID);
    let in_clone = peek(&dev, c);
    fs.rollback(s).expect("rollback beside the clone");
    check(&dev, "after the rollback");
    assert_eq!(peek(&dev, c), in_clone);
    let fs = open_as(&dev, FS_SUBVOL_ID);
    assert!(
        fs.lookup(ROOT, b"g").is_err(),
        "rolled back past the restore"
    );
    assert_eq!(fs.read(f, 0, 20_000).expect("read"), vec![1u8; 20_000]);
    fs.close().expect("close");
    // A repair rebuilds the file system's tree beside them and keeps the clone, its
    // origin and the clone's snapshot (with its origin item) as they were.
    let in_clone = peek(&dev, c);
    let r = idxfs_engine::repair::repair(
        &(dev.clone() as Arc<dyn idxfs_blockdev::BlockDevice>),
        idxfs_format::hash::name_hash,
    )
    .expect("repair beside the clone");
    assert!(r.check.is_clean(), "{:?}", r.check.problems);
    assert!(r.actions.is_empty(), "nothing was damaged: {:?}", r.actions);
    assert_eq!(peek(&dev, c), in_clone);
    let fs = open_as(&dev, FS_SUBVOL_ID);
    assert_eq!(fs.read(f, 0, 20_000).expect("read"), vec![1u8; 20_000]);
    let kept: Vec<u64> = fs.snapshots().expect("list").iter().map(|s| s.id).collect();
    assert_eq!(kept, [s, other, own]);
    fs.close().expect("close");
    // Once the clone is gone, the origin goes too, and every block comes back.
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    delete_in_turn(&fs, &[own, other]);
    fs.delete_snapshot(c).expect("delete the clone");
    // Until the clone's drop ends its leaves name the origin's blocks.
    assert!(matches!(fs.delete_snapshot(s), Err(Error::Busy(_))));
    fs.finish_drops().expect("drops");
    fs.delete_snapshot(s).expect("delete the origin");
    fs.finish_drops().expect("drops");
    fs.close().expect("close");
    check(&dev, "after deleting both");
}

/// A clone restores from and rolls back to its own snapshots (`clones`, "Restores and
/// rollbacks into a clone"). Its snapshot names the clone's own blocks, shared again by a
/// restore and named again by a rollback, and its origin's: those the clone still names in
/// the same file (`k`, but for two blocks it rewrote) a restore shares; those it let go of
/// (`f`, `k`'s two; the origin and the file system's tree still name them) it copies, and
/// a rollback names them again where they are. fsck is clean after each step (a count or an unhold of the origin's blocks the
/// clone does not name would show as a block referenced twice or a count that disagrees
/// with its extents), and once the trees are deleted every block is back.
#[test]
fn a_clone_restores_from_and_rolls_back_to_its_own_snapshots() {
    const LEN: usize = 40_960;
    let (dev, fs) = mem_fs_with(64 << 20, 4096);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.write(f, 0, &[1u8; LEN]).expect("write");
    let g = fs.create(ROOT, b"g", 0o644, ME).expect("create").ino;
    fs.write(g, 0, &[5u8; 8192]).expect("write");
    let k = fs.create(ROOT, b"k", 0o644, ME).expect("create").ino;
    fs.write(k, 0, &[6u8; LEN]).expect("write");
    let s = fs.snapshot(b"s").expect("snapshot");
    let c = fs.make_clone(s, b"c").expect("clone");
    fs.close().expect("close");
    let fs = open_as(&dev, c);
    // File blocks 3 and 4 the clone's own, the others its origin's.
    fs.write(f, 3 * 4096, &[2u8; 8192])
        .expect("write in the clone");
    let mut want = vec![1u8; LEN];
    want[3 * 4096..5 * 4096].fill(2);
    let own = fs.snapshot(b"own").expect("snapshot of the clone");
    let named = extent_blocks(&fs, f);
    assert_eq!(named.len(), 10);
    let k_named = extent_blocks(&fs, k);
    // The clone lets go of all of `f`'s blocks: its own are held for `own`, its origin's
    // stay the origin's. Of `k`'s, of blocks 3 and 4 only.
    fs.write(f, 0, &[3u8; LEN]).expect("overwrite");
    fs.write(k, 3 * 4096, &[9u8; 8192]).expect("overwrite");
    fs.unlink(ROOT, b"g").expect("unlink");
    fs.sync().expect("sync");
    check(&dev, "after the clone let go");
    let view = fs.open_snapshot(own, 1 << 20).expect("view");
    let h = fs.create(ROOT, b"h", 0o644, ME).expect("create").ino;
    let n = fs
        .copy_from_snapshot(&view, f, 0, h, 0, LEN as u64, Default::default())
        .expect("restore into the clone from its own snapshot");
    assert_eq!(n, LEN as u64);
    let hk = fs.create(ROOT, b"hk", 0o644, ME).expect("create").ino;
    let n = fs
        .copy_from_snapshot(&view, k, 0, hk, 0, LEN as u64, Default::default())
        .expect("restore a file the clone still has");
    assert_eq!(n, LEN as u64);
    // The origin's blocks the clone names there shared, the two it let go of copied.
    let shares_k = |ino: u64| {
        let got = extent_blocks(&fs, ino);
        (0..10).all(|b| (got[b].1 == k_named[b].1) != (3..5).contains(&b))
    };
    assert!(
        shares_k(hk),
        "{:?} against {k_named:?}",
        extent_blocks(&fs, hk)
    );
    // A whole tree, as `idxfs cp MOUNT/.snapshots/NAME MOUNT/PATH` restores one.
    let copied = fs
        .copy_tree_from(&view, ROOT, ROOT, b"whole", &Unchecked, |_| {})
        .expect("restore the whole snapshot into the clone");
    assert_eq!((copied.files, copied.dirs), (3, 1));
    view.close().expect("close view");
    assert_eq!(fs.read(h, 0, LEN).expect("read"), want);
    let got = extent_blocks(&fs, h);
    for b in 0..10 {
        let shared = got[b].1 == named[b].1;
        assert_eq!(
            shared,
            b == 3 || b == 4,
            "file block {b}: {got:?} against {named:?}"
        );
    }
    let whole = fs.lookup(ROOT, b"whole").expect("restored tree").ino;
    let wf = fs.lookup(whole, b"f").expect("restored f").ino;
    let wg = fs.lookup(whole, b"g").expect("restored g").ino;
    assert_eq!(fs.read(wf, 0, LEN).expect("read"), want);
    assert_eq!(fs.read(wg, 0, 8192).expect("read"), vec![5u8; 8192]);
    let wk = fs.lookup(whole, b"k").expect("restored k").ino;
    assert!(
        shares_k(wk),
        "{:?} against {k_named:?}",
        extent_blocks(&fs, wk)
    );
    for x in [hk, wk] {
        assert_eq!(fs.read(x, 0, LEN).expect("read"), vec![6u8; LEN]);
    }
    fs.sync().expect("sync");
    check(&dev, "after the restores");
    fs.rollback(own)
        .expect("rollback of the clone to its own snapshot");
    check(&dev, "after the rollback");
    let fs = open_as(&dev, c);
    assert_eq!(fs.read(f, 0, LEN).expect("read"), want);
    assert_eq!(
        extent_blocks(&fs, f),
        named,
        "the snapshot's blocks, where they were"
    );
    let g = fs.lookup(ROOT, b"g").expect("g is back").ino;
    assert_eq!(fs.read(g, 0, 8192).expect("read"), vec![5u8; 8192]);
    assert!(matches!(fs.lookup(ROOT, b"h"), Err(Error::NotFound)));
    // Changed again after the rollback, then everything deleted.
    fs.write(f, 0, &[4u8; 8192])
        .expect("write after the rollback");
    fs.close().expect("close");
    check(&dev, "after a write in the rolled-back clone");
    let fs = open_as(&dev, FS_SUBVOL_ID);
    delete_in_turn(&fs, &[own, c, s]);
    for name in [&b"f"[..], b"g", b"k"] {
        fs.unlink(ROOT, name).expect("unlink");
    }
    fs.close().expect("close");
    check(&dev, "after deleting everything");
}

#[test]
fn an_fsync_in_a_clone_survives_a_crash() {
    let (dev, fs) = mem_fs_with(64 << 20, 4096);
    let s = fs.snapshot(b"s").expect("snapshot");
    let c = fs.make_clone(s, b"c").expect("clone");
    fs.close().expect("close");
    let fs = Fs::open(
        dev.clone(),
        OpenOptions {
            subvolume: Some(c),
            commit_interval: None,
            ..opts()
        },
    )
    .expect("open the clone");
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.write(f, 0, b"kept").expect("write");
    let commits = fs.counters().commits.get();
    fs.fsync(f).expect("fsync");
    // Through the log (seed 003), not a commit.
    assert_eq!(fs.counters().log_batches.get(), 1, "the fsync logged");
    assert_eq!(fs.counters().commits.get(), commits, "the fsync committed");
    // The crash: the image as the fsync left it.
    let crashed = Arc::new(MemDevice::from_bytes(dev.snapshot()));
    drop(fs);
    let fs = Fs::open(crashed.clone(), opts()).expect("open after the crash");
    assert_eq!(fs.active_subvolume(), c);
    let a = fs.lookup(ROOT, b"f").expect("the fsynced file");
    assert_eq!(fs.read(a.ino, 0, 10).expect("read"), b"kept");
    fs.close().expect("close");
    check(&crashed, "after the crash");
}

/// Every prefix of the writes of making a clone and an empty subvolume, switching to each,
/// writing, snapshotting, restoring from and rolling back to their own snapshots,
/// switching back and deleting them, the last writes torn or dropped, opens to a
/// committed state with fsck clean: the tree active at that commit, showing what it
/// showed.
#[test]
fn every_prefix_with_clones_opens_to_a_committed_state() {
    let (mut rng, seed) = Rng::from_env("clones crash");
    let rec = recorded_with(32 << 20, Some([6; 16]));
    let open = |id: Option<u64>| {
        Fs::open(
            rec.clone(),
            OpenOptions {
                subvolume: id,
                commit_interval: None,
                ..opts()
            },
        )
        .expect("open")
    };
    let gen = |fs: &Fs| fs.with_store(|s, _, _| s.generation - 1);
    // generation -> (the active tree, what it showed).
    let mut states: BTreeMap<u64, (u64, String)> = BTreeMap::new();
    let mut seen = |fs: &Fs, first: u64| {
        let now = (fs.active_subvolume(), digest_crash_stable(fs));
        for g in first..=gen(fs) {
            states.insert(g, now.clone());
        }
    };
    let mut w = World::default();
    let fs = open(None);
    seen(&fs, 0);
    for _ in 0..20 {
        step(&fs, &mut rng, &mut w);
    }
    let first = gen(&fs) + 1;
    fs.sync().expect("sync");
    let s = fs.snapshot(b"s").expect("snapshot");
    let c = fs.make_clone(s, b"c").expect("clone");
    let e = fs.make_subvolume(b"e", ME).expect("empty subvolume");
    seen(&fs, first);
    let c_world = w.clone();
    for _ in 0..5 {
        step(&fs, &mut rng, &mut w);
    }
    // A writable snapshot: its hidden origin and it in one commit.
    let first = gen(&fs) + 1;
    let ws = fs.writable_snapshot(b"ws").expect("writable snapshot");
    let ws_world = w.clone();
    seen(&fs, first);
    fs.close().expect("close");
    // The last snapshot of each tree and its files: each tree restores from its own beside
    // the others (`Clones::may_take_from`), and the clone rolls back to its own.
    let mut taken: BTreeMap<u64, (u64, World)> = BTreeMap::new();
    taken.insert(FS_SUBVOL_ID, (s, c_world.clone()));
    // Each open of another tree switches with one commit.
    let mut worlds = [c_world, w, World::default(), ws_world];
    for (id, which) in [(c, 0), (FS_SUBVOL_ID, 1), (e, 2), (ws, 3), (c, 0), (e, 2)] {
        let w = &mut worlds[which];
        let mut fs = open(Some(id));
        let first = gen(&fs);
        seen(&fs, first);
        if let Some((snap, files)) = taken.get(&id).filter(|_| id == c) {
            let first = gen(&fs) + 1;
            fs.rollback(*snap)
                .expect("rollback of the clone to its own snapshot");
            fs = open(Some(id));
            *w = files.clone();
            seen(&fs, first);
        }
        for _ in 0..15 {
            step(&fs, &mut rng, w);
        }
        if let Some((snap, files)) = taken.get(&id) {
            let name = format!("x{}", w.n);
            if let Some(x) = restore_one(&fs, *snap, files, &mut rng, &name)
                .unwrap_or_else(|e| panic!("restore into {id} from its snapshot {snap}: {e}"))
            {
                w.files.push((ROOT, x, name.into_bytes()));
            }
        }
        let first = gen(&fs) + 1;
        fs.sync().expect("sync");
        let snap = fs
            .snapshot(format!("of {id} at {first}").as_bytes())
            .expect("snapshot");
        taken.insert(id, (snap, w.clone()));
        seen(&fs, first);
        fs.close().expect("close");
    }
    let fs = open(Some(FS_SUBVOL_ID));
    seen(&fs, gen(&fs));
    let first = gen(&fs) + 1;
    fs.delete_snapshot(c).expect("delete the clone");
    fs.delete_snapshot(e).expect("delete the empty subvolume");
    fs.delete_snapshot(ws)
        .expect("delete the writable snapshot");
    for _ in 0..3 {
        fs.drop_step().expect("drop step");
        fs.sync().expect("sync");
    }
    seen(&fs, first);
    fs.close().expect("close");
    every_crash_image(&rec, &mut rng, seed, |dev, at| {
        let fs = Fs::open(dev.clone(), opts()).unwrap_or_else(|e| panic!("{at}: open: {e}"));
        let g = gen(&fs);
        let want = states
            .get(&g)
            .unwrap_or_else(|| panic!("{at}: generation {g} never committed"));
        let have = (fs.active_subvolume(), digest_crash_stable(&fs));
        assert_eq!(&have, want, "{at}: state of generation {g}");
        fs.finish_drops().expect("drops after a crash");
        fs.close().expect("close");
        check(&dev, &format!("{at}, drops finished"));
    });
}

/// A block a clone appends right after one of its origin's on the device stays in an
/// extent of its own (a merged one would take the origin's generation, and the clone's
/// block would never be freed): once everything is deleted, no block is leaked.
#[test]
fn a_clone_s_block_next_to_its_origin_s_is_freed_with_the_clone() {
    let (dev, fs) = mem_fs_with(64 << 20, 4096);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.write(f, 0, &[1u8; 4096]).expect("write");
    let g = fs.create(ROOT, b"g", 0o644, ME).expect("create").ino;
    fs.write(g, 0, &[2u8; 4096]).expect("write");
    let (fx, gx) = (extent_blocks(&fs, f), extent_blocks(&fs, g));
    assert_eq!(
        gx[0].1,
        fx[0].1 + 1,
        "the test needs g's block right after f's"
    );
    fs.unlink(ROOT, b"g").expect("unlink");
    fs.sync().expect("sync");
    let s = fs.snapshot(b"s").expect("snapshot");
    let c = fs.make_clone(s, b"c").expect("clone");
    fs.close().expect("close");
    let fs = open_as(&dev, c);
    let merges = fs.counters().extent_merges.get();
    fs.write(f, 4096, &[3u8; 4096])
        .expect("append in the clone");
    let ext = extent_blocks(&fs, f);
    assert!(
        ext.iter().any(|e| e.1 == gx[0].1),
        "the test needs the clone's new block where g's was: {ext:?}"
    );
    assert_eq!(
        fs.counters().extent_merges.get(),
        merges,
        "the clone's block merged into its origin's extent"
    );
    fs.close().expect("close");
    let fs = open_as(&dev, FS_SUBVOL_ID);
    delete_in_turn(&fs, &[c, s]);
    fs.close().expect("close");
    check(&dev, "everything deleted");
}

/// The fsync log in a clone (seed 003, as in the file system's own tree): random changes,
/// to its origin's files as well as its own, each round ended by an fsync (now and then a
/// commit). Every crash image opens to an fsynced or committed state no older than the last
/// that returned, with fsck clean: a replay leaves the origin's blocks to the origin and lets
/// go of the clone's own (one kept for nothing is a leak fsck finds, one freed while named
/// is a block fsck finds used twice or free). For some of them every clone and snapshot is
/// then deleted, and every block comes back.
#[test]
fn every_crash_of_fsyncs_in_a_clone_opens_to_an_fsynced_state() {
    use idxfs_blockdev::{RecordingDevice, Tear};
    let (mut rng, seed) = Rng::from_env("clones fsync crash");
    let (dev, fs) = mem_fs_with(32 << 20, 4096);
    let mut w = World::default();
    for _ in 0..30 {
        step(&fs, &mut rng, &mut w);
    }
    let s = fs.snapshot(b"s").expect("snapshot");
    let c = fs.make_clone(s, b"c").expect("clone");
    fs.close().expect("close");
    let rec = Arc::new(RecordingDevice::new(dev.snapshot()));
    let open = |d: Arc<dyn idxfs_blockdev::BlockDevice>| {
        Fs::open(
            d,
            OpenOptions {
                subvolume: Some(c),
                commit_interval: None,
                ..opts()
            },
        )
    };
    // The switch's commit starts this mount's log (a mount appends to a chain only after
    // its own first commit names it).
    let fs = open(rec.clone()).expect("open the clone");
    let mut states = vec![(rec.event_count(), digest_crash_stable(&fs))];
    let (batches, commits) = (fs.counters().log_batches.get(), fs.counters().commits.get());
    for round in 0..16 {
        for _ in 0..rng.below(6) + 1 {
            step(&fs, &mut rng, &mut w);
        }
        match (round % 5, w.files.last()) {
            (4, _) | (_, None) => fs.sync().expect("sync"),
            (_, Some(&(_, ino, _))) => fs.fsync(ino).expect("fsync"),
        }
        states.push((rec.event_count(), digest_crash_stable(&fs)));
    }
    let logged = fs.counters().log_batches.get() - batches;
    let committed = fs.counters().commits.get() - commits;
    drop(fs);
    eprintln!(
        "seed {seed}: {} device events, {logged} log batches, {committed} commits",
        rec.event_count()
    );
    assert!(
        logged >= 6,
        "the fsyncs in the clone must log: {logged} batches"
    );
    let (mut replayed, mut emptied) = (0, 0);
    for prefix in 0..=rec.event_count() {
        let durable = states.iter().rposition(|s| s.0 <= prefix).unwrap_or(0);
        for tear in [Tear::None, Tear::TornLast(1), Tear::Drop(rng.next_u64())] {
            let at = format!("seed {seed} prefix {prefix} {tear:?}");
            let dev = Arc::new(MemDevice::from_bytes(rec.crash_image(prefix, tear).bytes));
            check(&dev, &format!("{at}, committed state"));
            let fs = open(dev.clone()).unwrap_or_else(|e| panic!("{at}: open: {e}"));
            replayed += fs.counters().log_replayed_batches.get();
            let got = digest_crash_stable(&fs);
            let i = (states.iter().rposition(|s| s.1 == got))
                .unwrap_or_else(|| panic!("{at}: opened a state no fsync or commit produced"));
            assert!(
                i >= durable,
                "{at}: opened state {i}, but {durable} was durable"
            );
            fs.close().expect("close");
            check(&dev, &format!("{at}, replayed"));
            if prefix % 16 == 0 && tear == Tear::None {
                // Back to the file system's own tree; the clone, then its origin, deleted.
                let fs = Fs::open(
                    dev.clone(),
                    OpenOptions {
                        subvolume: Some(FS_SUBVOL_ID),
                        ..opts()
                    },
                )
                .unwrap_or_else(|e| panic!("{at}: open the file system's own tree: {e}"));
                delete_in_turn(&fs, &[c, s]);
                fs.close().expect("close");
                check(&dev, &format!("{at}, everything deleted"));
                emptied += 1;
            }
        }
    }
    assert!(
        replayed > 0,
        "no crash image needed the log: not a test of it"
    );
    assert!(emptied > 0);
}

/// A deleted clone's own blocks that lie end to end across a block group boundary are held
/// for it and freed when its drop ends, a group at a time. Regression (found by the model
/// test before landing): the delete held them as one run, and the drop's end refused to
/// free a run across groups as corruption.
#[test]
fn a_deleted_clone_s_blocks_across_a_group_boundary_come_back() {
    let (dev, fs) = mem_fs_with(64 << 20, 4096);
    let s = fs.snapshot(b"s").expect("snapshot");
    let c = fs.make_clone(s, b"c").expect("clone");
    fs.close().expect("close");
    let fs = open_as(&dev, c);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.write(f, 0, &vec![3u8; 24 << 20]).expect("write");
    let group = 4096; // node_size blocks (`Fs::mkfs`)
    assert!(
        extent_blocks(&fs, f)
            .windows(2)
            .any(|w| w[1].1 == w[0].1 + 1 && w[1].1 % group == 0),
        "the test needs f's blocks to run on across a group boundary"
    );
    fs.close().expect("close");
    let fs = open_as(&dev, FS_SUBVOL_ID);
    let free = fs.statfs().expect("statfs").blocks_free;
    delete_in_turn(&fs, &[c, s]);
    fs.sync().expect("sync");
    let back = fs.statfs().expect("statfs").blocks_free;
    assert!(
        back >= free + (24 << 20) / 4096,
        "{free} free before, {back} after"
    );
    fs.close().expect("close");
    check(&dev, "after the drops");
}

/// Deletes each of `ids` (snapshots or parked subvolumes) in order, each drop run to its
/// end before the next delete (an origin goes only once its clone's drop has ended).
fn delete_in_turn(fs: &Fs, ids: &[u64]) {
    for &id in ids {
        fs.delete_snapshot(id)
            .unwrap_or_else(|e| panic!("delete {id}: {e}"));
        fs.finish_drops().expect("drops");
    }
}

/// An image with an empty subvolume made and opened, and a file of `len` bytes of `byte`
/// written in it: (device, subvolume id, the open subvolume, file ino).
fn subvolume_with_file(len: usize, byte: u8) -> (Arc<MemDevice>, u64, Fs, u64) {
    let (dev, fs) = mem_fs_with(64 << 20, 4096);
    let e = fs.make_subvolume(b"e", ME).expect("empty subvolume");
    fs.close().expect("close");
    let fs = open_as(&dev, e);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.write(f, 0, &vec![byte; len]).expect("write");
    (dev, e, fs, f)
}

/// Blocks never move into the active tree from a snapshot while another writable tree may
/// own them: with only an empty subvolume (no origin) beside the file system, a snapshot
/// taken in it names its blocks, so a restore or rollback from one is refused there too
/// (a whole tree copied out of it gets its bytes, as `cp -a`).
/// Regression (found in review before landing): `Clones::any` counted clones' origins
/// alone, and a restore from such a snapshot gave the file system a block the parked
/// subvolume would free. The subvolume itself restores from and rolls back to its own
/// snapshot beside the file system's tree.
#[test]
fn restores_wait_for_empty_subvolumes_too() {
    let (dev, e, fs, f) = subvolume_with_file(20_000, 1);
    let s = fs.snapshot(b"s").expect("snapshot of the empty subvolume");
    fs.write(f, 0, &[2u8; 20_000]).expect("overwrite");
    let view = fs.open_snapshot(s, 1 << 20).expect("view");
    let x = fs.create(ROOT, b"x", 0o644, ME).expect("create").ino;
    fs.copy_from_snapshot(&view, f, 0, x, 0, 20_000, Default::default())
        .expect("restore in the subvolume from its own snapshot");
    // And a whole tree, as `idxfs cp MOUNT/.snapshots/NAME MOUNT/PATH` restores one.
    let c = fs
        .copy_tree_from(&view, ROOT, ROOT, b"whole", &Unchecked, |_| {})
        .expect("restore the whole snapshot in the subvolume");
    assert_eq!((c.files, c.dirs), (1, 1));
    view.close().expect("close view");
    let whole = fs.lookup(ROOT, b"whole").expect("restored tree").ino;
    let copy = fs.lookup(whole, b"f").expect("restored file").ino;
    assert_eq!(fs.read(copy, 0, 20_000).expect("read"), vec![1u8; 20_000]);
    assert_eq!(fs.read(x, 0, 20_000).expect("read"), vec![1u8; 20_000]);
    fs.rollback(s)
        .expect("rollback of the subvolume to its own snapshot");
    check(&dev, "after the subvolume's rollback");
    let fs = open_as(&dev, e);
    assert!(
        fs.lookup(ROOT, b"x").is_err(),
        "rolled back past the restore"
    );
    assert_eq!(fs.read(f, 0, 20_000).expect("read"), vec![1u8; 20_000]);
    fs.close().expect("close");
    let fs = open_as(&dev, FS_SUBVOL_ID);
    let view = fs.open_snapshot(s, 1 << 20).expect("view");
    let g = fs.create(ROOT, b"g", 0o644, ME).expect("create").ino;
    assert!(matches!(
        fs.copy_from_snapshot(&view, f, 0, g, 0, 20_000, Default::default()),
        Err(Error::NotSupported(_))
    ));
    // A whole tree is copied still, as `cp -a` copies it: its files' bytes, none of the
    // snapshot's blocks shared.
    let c = fs
        .copy_tree_from(&view, ROOT, ROOT, b"whole", &Unchecked, |_| {})
        .expect("a tree copied out of another tree's snapshot");
    assert_eq!((c.files, c.dirs, c.bytes), (1, 1, 20_000));
    let whole = fs.lookup(ROOT, b"whole").expect("copied tree").ino;
    let copy = fs.lookup(whole, b"f").expect("copied file").ino;
    assert_eq!(fs.read(copy, 0, 20_000).expect("read"), vec![1u8; 20_000]);
    let theirs: std::collections::HashSet<u64> =
        extent_blocks(&view, f).iter().map(|b| b.1).collect();
    assert!(
        extent_blocks(&fs, copy)
            .iter()
            .all(|b| !theirs.contains(&b.1)),
        "a block of the subvolume's snapshot shared into the file system's tree"
    );
    view.close().expect("close view");
    fs.sync().expect("sync");
    check(&dev, "after a tree copied out of another tree's snapshot");
    assert!(matches!(fs.rollback(s), Err(Error::NotSupported(_))));
    // Once it is gone, a restore from its snapshot is the file system's to make.
    let fs = open_as(&dev, FS_SUBVOL_ID);
    delete_in_turn(&fs, &[e]);
    let view = fs.open_snapshot(s, 1 << 20).expect("view");
    fs.copy_from_snapshot(&view, f, 0, g, 0, 20_000, Default::default())
        .expect("restore");
    view.close().expect("close view");
    assert_eq!(fs.read(g, 0, 20_000).expect("read"), vec![1u8; 20_000]);
    delete_in_turn(&fs, &[s]);
    fs.close().expect("close");
    check(&dev, "after the restore and the deletes");
}

/// A parked writable subvolume opens read-only beside the file system (`Fs::open_snapshot`,
/// as the mount's snapshots directory shows it), shows what it held when parked while the
/// file system changes, refuses changes, and is not deleted while the view is open.
#[test]
fn a_parked_subvolume_is_shown_read_only_beside_the_file_system() {
    let (dev, e, fs, _) = subvolume_with_file(9000, 4);
    let want = digest(&fs);
    fs.close().expect("close");
    let fs = open_as(&dev, FS_SUBVOL_ID);
    let view = fs
        .open_snapshot(e, 1 << 20)
        .expect("a view of the parked subvolume");
    for i in 0..50 {
        let g = fs
            .create(ROOT, format!("g{i}").as_bytes(), 0o644, ME)
            .expect("create")
            .ino;
        fs.write(g, 0, &[5u8; 9000]).expect("write");
    }
    fs.sync().expect("sync");
    assert_eq!(digest(&view), want);
    assert!(
        view.create(ROOT, b"x", 0o644, ME).is_err(),
        "a view is read-only"
    );
    assert!(matches!(fs.delete_snapshot(e), Err(Error::Busy(_))));
    view.close().expect("close view");
    fs.delete_snapshot(e)
        .expect("delete once the view is closed");
    fs.finish_drops().expect("drops");
    fs.close().expect("close");
    check(&dev, "after the delete");
}

/// A deleted subvolume's own blocks come back when its drop ends, beside a snapshot of the
/// file system taken before they were written (which cannot name them): held by their own
/// generation's window, not from generation 1. Regression (found in review before landing):
/// an empty subvolume's blocks were held for every snapshot then, so a long-kept snapshot
/// of the file system kept a deleted scratch subvolume's space.
#[test]
fn a_deleted_subvolume_s_space_comes_back_beside_an_older_snapshot() {
    let (dev, fs) = mem_fs_with(64 << 20, 4096);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.write(f, 0, &[1u8; 8192]).expect("write");
    let nightly = fs.snapshot(b"nightly").expect("snapshot");
    let e = fs.make_subvolume(b"scratch", ME).expect("empty subvolume");
    let s = fs
        .snapshot(b"s")
        .expect("snapshot before the clone's origin");
    let c = fs.make_clone(s, b"c").expect("clone");
    fs.sync().expect("sync");
    let free = fs.statfs().expect("statfs").blocks_free;
    fs.close().expect("close");
    for id in [e, c] {
        let fs = open_as(&dev, id);
        let g = fs.create(ROOT, b"big", 0o644, ME).expect("create").ino;
        fs.write(g, 0, &vec![2u8; 8 << 20]).expect("write");
        fs.close().expect("close");
    }
    let fs = open_as(&dev, FS_SUBVOL_ID);
    fs.delete_snapshot(e).expect("delete the empty subvolume");
    fs.delete_snapshot(c).expect("delete the clone");
    fs.finish_drops().expect("drops");
    fs.sync().expect("sync");
    let back = fs.statfs().expect("statfs").blocks_free;
    assert!(
        back + 64 >= free,
        "{free} blocks free before, {back} after: the deleted subvolumes' blocks are held"
    );
    assert_eq!(
        fs.snapshots().expect("list").len(),
        2,
        "{nightly} and {s} stay"
    );
    fs.close().expect("close");
    check(&dev, "after the deletes");
}

/// The superblock's incompat bits (closed image).
/// A writable snapshot (`Fs::writable_snapshot`, as `btrfs subvolume snapshot`) is a clone
/// of the tree as it is now whose origin is hidden: listed by no one, not deleted, cloned
/// or rolled back to by id, and deleted by the drop that ends its last use. Either side
/// changes alone; a writable snapshot of a writable snapshot keeps the first origin until
/// both are gone; then every block is back, fsck clean, and the feature bits cleared.
#[test]
fn a_writable_snapshot_s_hidden_origin_goes_with_its_last_use() {
    use idxfs_format::versions::{INCOMPAT_CLONES, INCOMPAT_HIDDEN_ORIGINS};
    let (dev, fs) = mem_fs_with(64 << 20, 4096);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.write(f, 0, &[1u8; 50_000]).expect("write");
    let w = fs.writable_snapshot(b"w").expect("writable snapshot");
    assert!(
        fs.snapshots().expect("list").is_empty(),
        "its origin is hidden"
    );
    let sub = (fs.subvolumes().into_iter())
        .find(|s| s.id == w)
        .expect("listed as a subvolume");
    assert_eq!(sub.snapshot_of, Some(FS_SUBVOL_ID));
    let h = sub.origin.expect("an origin");
    assert!(matches!(fs.snapshot(b"w"), Err(Error::Exists)));
    assert!(matches!(fs.make_clone(h, b"x"), Err(Error::NotFound)));
    assert!(matches!(fs.delete_snapshot(h), Err(Error::NotFound)));
    fs.write(f, 0, &[2u8; 50_000])
        .expect("overwrite in the file system");
    fs.close().expect("close");
    assert_ne!(incompat(&dev) & INCOMPAT_HIDDEN_ORIGINS, 0);
    check(&dev, "after the writable snapshot");
    let fs = open_as(&dev, w);
    assert_eq!(fs.read(f, 0, 50_000).expect("read"), vec![1u8; 50_000]);
    fs.write(f, 0, &[3u8; 20_000])
        .expect("write in the writable snapshot");
    let w2 = fs
        .writable_snapshot(b"w2")
        .expect("writable snapshot of it");
    assert!(matches!(fs.rollback(h), Err(Error::NotFound)));
    let fs = open_as(&dev, FS_SUBVOL_ID);
    assert_eq!(fs.read(f, 0, 50_000).expect("read"), vec![2u8; 50_000]);
    // The first writable snapshot goes; its origin stays for the second, whose hidden
    // origin (taken of the first) names the first origin's blocks.
    delete_in_turn(&fs, &[w]);
    fs.close().expect("close");
    check(&dev, "after deleting the first");
    let fs = open_as(&dev, w2);
    let mut want = vec![3u8; 20_000];
    want.extend_from_slice(&[1u8; 30_000]);
    assert_eq!(fs.read(f, 0, 50_000).expect("read"), want);
    let fs = open_as(&dev, FS_SUBVOL_ID);
    fs.close().expect("close");
    assert_ne!(incompat(&dev) & INCOMPAT_HIDDEN_ORIGINS, 0);
    let fs = open_as(&dev, FS_SUBVOL_ID);
    delete_in_turn(&fs, &[w2]);
    assert!(fs.snapshots().expect("list").is_empty());
    assert_eq!(fs.subvolumes().len(), 1);
    fs.close().expect("close");
    check(&dev, "after deleting both");
    assert_eq!(
        incompat(&dev) & (INCOMPAT_HIDDEN_ORIGINS | INCOMPAT_CLONES),
        0,
        "no hidden origin or clone left"
    );
}
