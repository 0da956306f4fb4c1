//! `fsck --repair` as an engine API: rebuilds an image's trees from what can still be read,
//! so that a re-check finds nothing, keeping every file whose metadata survived.
//!
//! Steps:
//! 1. An ordinary open and close, when one works: it replays the fsync log (what was fsynced
//!    after the last commit) and finishes deletes and truncates left by a crash, so the
//!    repair starts from the newest state. When it fails, the repair starts from the last
//!    commit and says what that loses.
//! 2. `salvage`: every item of every fs-tree leaf that passes all the checks a mount makes,
//!    and every block the old state may use.
//! 3. `plan`: a set of items that keeps every invariant fsck checks, saving what the three
//!    records of each name and the back references allow (see its notes).
//! 4. The rebuild: new fs and space trees hold the plan, written as one commit with the
//!    engine's own code (the directory entries through the same `add_entry` an operation
//!    uses, so both indexes and the back references are filed as a mount files them).
//!    Until that commit's superblock is durable, nothing it writes lands on a block the old
//!    state may use, so a crash during a repair leaves the image as it was. The same
//!    commit frees what only the old state used (pinned until it is durable), so a crash
//!    after it leaves the repaired image, with nothing leaked.
//! 5. fsck of the result.
//!
//! Snapshots and writable subvolumes (`roots`): one tree is rebuilt, the active one (or the
//! file system's own, when it is parked and damaged: `roots::pick`). Each
//! snapshot and parked subvolume whose tree checks whole is kept as it is, with what it
//! holds found anew and written into a new roots tree by the rebuild's commit; a damaged
//! one is deleted, and said so. Which tree owns which data block follows the clones' rule
//! (`fs::clones`): an extent as old as its tree's origin names the origin's blocks, a
//! younger one its tree's own; a rebuilt extent whose blocks a kept tree owns (or has a
//! node in) gets a copy, and what the snapshots and the clones' origins name that no
//! writable tree owns is held.
//!
//! Limits: the rebuilt tree is built in memory and written by one commit, so a repair needs
//! memory in proportion to the metadata (about the node size per 100 files). A lost internal
//! node loses every leaf under it: nothing scans the device for them (see `salvage`).
use crate::btree::Store;
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::fs::{Fs, Inner, NameHash, OpenOptions};
use crate::fsck;
use crate::space::bitmap::Bitmap;
use crate::space::Allocator;
use idxfs_blockdev::BlockDevice;
use idxfs_format::items::{dtype_of_mode, ExtentItem, Timespec, EXTENT_INLINE, S_IFDIR, S_IFMT};
use idxfs_format::{ItemType, Key, BLOCK_SIZE, SUPER_COPIES, TREE_FS};
use std::sync::Arc;
use zerocopy::{FromBytes, IntoBytes};

mod plan;
mod roots;
mod salvage;

/// What a repair did.
#[derive(Debug, Default)]
pub struct Repaired {
    /// Subtrees that could not be read, with the keys they held.
    pub lost: Vec<String>,
    /// What was changed or dropped.
    pub actions: Vec<String>,
    /// Things worth knowing that are not damage (e.g. the fsync log could not be replayed).
    pub notes: Vec<String>,
    /// Trees rebuilt from their items (the active one, and parked writable ones: `roots`),
    /// and the inodes and names they hold.
    pub trees: u64,
    pub inodes: u64,
    pub names: u64,
    /// The check of the result.
    pub check: fsck::Report,
}

/// Repairs the image on `dev` (see the module notes). Err when it cannot start (no valid
/// superblock, a device opened read-only, trees that name each other's blocks:
/// `roots::keep`) or cannot write; the image is then as it was (after the replay a mount
/// makes), or as a crash would leave it: its old state.
pub fn repair(dev: &Arc<dyn BlockDevice>, hash: NameHash) -> Result<Repaired> {
    if !dev.writable() {
        return Err(Error::Invalid("the image was opened read-only"));
    }
    let mut out = Repaired::default();
    let replay = Fs::open(
        dev.clone(),
        OpenOptions {
            commit_interval: None,
            name_hash: hash,
            discard: false,
            ..OpenOptions::default()
        },
    );
    // Deleted snapshots' drops are finished too: what is left of them is not kept.
    match replay
        .and_then(|fs| fs.finish_drops().map(|()| fs))
        .map(|fs| fs.close())
    {
        Ok(Ok(())) => {}
        Ok(Err(e)) | Err(e) => out.notes.push(format!(
            "the image could not be opened to replay its fsync log and finish interrupted \
             deletes ({e}): repaired from its last commit, so what was fsynced after that \
             commit is lost"
        )),
    }
    let (sb, copy_damaged) = crate::fs::read_superblock_and_damage(dev.as_ref())?;
    let (sb, picked) = roots::pick(dev.as_ref(), &sb);
    let mut roots_actions = Vec::new();
    if let roots::Pick::OwnLost(a) = picked {
        roots_actions.push(format!(
            "the item of the file system's own tree, parked while subvolume {a} was active, \
             cannot be read, nor can its tree: subvolume {a}'s tree is rebuilt as the file \
             system's own"
        ));
    }
    let salvaged = salvage::salvage(dev.as_ref(), &sb);
    let (sec, nsec) = crate::clock::Clock::now(&crate::clock::SystemClock);
    let now = Timespec {
        sec: sec.into(),
        nsec: nsec.into(),
    };
    let block = |b: u64| {
        let mut buf = vec![0u8; BLOCK_SIZE as usize];
        // A block from damaged metadata may lie past any device: unreadable, as one past
        // this device is.
        let at = b.checked_mul(BLOCK_SIZE)?;
        dev.read_at(&mut buf, at).ok().map(|()| buf)
    };
    let active_plan = plan::plan(
        salvaged.items,
        &sb,
        hash,
        now,
        &salvaged.lost_ranges,
        &block,
    );
    let mut kept = roots::keep(dev.as_ref(), &sb, hash, &picked, &mut roots_actions)?;
    out.lost = salvaged.lost;
    let mut old_blocks = salvaged.busy;
    let mut trees = vec![Rebuild {
        parked: None,
        floor: kept.floor,
        plan: active_plan,
    }];
    // The parked writable trees rebuilt too, each from what can be read of it.
    for (id, snap, floor) in std::mem::take(&mut kept.rebuild) {
        let mut read = salvage::Salvaged::default();
        let mut items = std::collections::BTreeMap::new();
        salvage::walk(
            dev.as_ref(),
            &sb,
            &snap.item.root,
            TREE_FS,
            &mut read,
            &mut |k, v| {
                items.insert(k, v.to_vec());
            },
        );
        let mut view = sb;
        view.fs_root = snap.item.root;
        view.next_ino = snap.item.next_ino;
        view.inode_count = snap.item.inode_count;
        let plan = plan::plan(items, &view, hash, now, &read.lost_ranges, &block);
        out.lost
            .extend(read.lost.iter().map(|l| format!("subvolume {id}: {l}")));
        old_blocks.extend(read.busy);
        trees.push(Rebuild {
            parked: Some((id, snap)),
            floor,
            plan,
        });
    }
    // No two writable trees own a block, and no extent names a node. The trees whose origin
    // went claim last: where they and another tree name one block, it was the other's.
    let mut claims = Claims::new(&kept, &sb);
    let active_id = sb.subvolume.get();
    let lone = |t: &Rebuild| {
        kept.lone
            .contains(&t.parked.as_ref().map_or(active_id, |p| p.0))
    };
    let mut order: Vec<usize> = (0..trees.len()).collect();
    order.sort_by_key(|&i| lone(&trees[i]));
    for i in order {
        let t = &mut trees[i];
        copy_what_others_own(&mut t.plan, t.floor, &mut claims);
    }
    for t in &trees {
        let p = &t.plan;
        let prefix = t
            .parked
            .as_ref()
            .map_or(String::new(), |(id, _)| format!("subvolume {id}: "));
        out.actions
            .extend(p.actions.iter().map(|a| format!("{prefix}{a}")));
        if p.actions_left_out > 0 {
            out.actions
                .push(format!("{prefix}... and {} more", p.actions_left_out));
        }
        out.trees += 1;
        out.inodes += p.inodes.len() as u64;
        out.names += p.entries.len() as u64;
    }
    out.actions.append(&mut roots_actions);
    let listed: Vec<String> = (kept.list.iter())
        .filter(|(_, s)| !s.hidden())
        .map(|(id, _)| id.to_string())
        .collect();
    if !listed.is_empty() {
        out.notes.push(format!(
            "{} snapshot(s) kept as they were: {}",
            listed.len(),
            listed.join(", ")
        ));
    }
    let parked: Vec<String> = (kept.writable.iter())
        .filter(|(_, s)| s.item.root.block.get() != 0)
        .map(|(id, _)| id.to_string())
        .collect();
    if !parked.is_empty() {
        out.notes.push(format!(
            "{} writable subvolume(s) besides the active tree kept as they were: {}",
            parked.len(),
            parked.join(", ")
        ));
    }
    let bpn = sb.blocks_per_node();
    let snapshot_runs = kept.runs(bpn);

    // Blocks the rebuild must not write: the old state's, and the data it keeps.
    let total = sb.total_blocks.get();
    let mut busy = Bitmap::new(total);
    let planned = trees.iter().flat_map(|t| t.plan.data.iter());
    for &(s, n) in old_blocks.iter().chain(planned).chain(&snapshot_runs) {
        set(&mut busy, s, n);
    }
    busy.set_range(0, SUPER_COPIES, false);
    let counters = Arc::new(Counters::default());
    let mut alloc = Allocator::new(total, sb.group_blocks.get(), counters.clone());
    for (s, n) in runs(&busy) {
        alloc.mark_used(s, n);
    }
    let store = Store::new(
        dev.clone(),
        sb.uuid,
        sb.node_size.get(),
        total,
        sb.generation.get() + 1,
        1 << 16,
        alloc,
        counters,
    );
    let mut base = sb;
    base.errors = 0.into();
    base.first_error_time = 0.into();
    // The kept snapshots go into a new roots tree (`adopt_snapshots`); none when none is.
    base.roots_root = Default::default();
    let mut inner = Inner::empty(store, base, hash)?;
    inner.txn.zero_log_head = copy_damaged;
    for t in &trees {
        for bit in (0..64).map(|i| 1u64 << i).filter(|b| t.plan.needs & b != 0) {
            inner.require_incompat(bit);
        }
        inner.txn.compat_ro_wanted |= t.plan.needs_ro & !base.compat_ro.get();
    }
    let mut rebuilt = Rebuilt::default();
    let mut writable = std::mem::take(&mut kept.writable);
    let mut trees = trees.into_iter();
    let active = trees.next().ok_or(Error::Invalid("no tree to rebuild"))?;
    for t in trees {
        let Some((id, snap)) = t.parked else { continue };
        let item = build_parked(&mut inner, &t.plan, t.floor, &snap, &mut rebuilt)?;
        writable.insert(id, item);
    }
    inner.txn.next_ino = active.plan.next_ino;
    inner.txn.inode_count = active.plan.inodes.len() as u64;
    build(&mut inner, &active.plan)?;
    let tree = inner.fs_tree;
    rebuilt_runs(&mut inner, tree, active.floor, &mut rebuilt)?;
    let held = held_runs(&kept, &rebuilt, total, sb.group_blocks.get());
    let released = inner.store.generation;
    inner.adopt_snapshots(kept.list, &kept.parents, &held, released);
    inner.adopt_clones(writable, kept.origins, sb.subvolume.get());
    // What only the old state used is free in the same commit: pinned (`Allocator::free`),
    // so nothing this commit writes lands on it before its superblock is durable, and a
    // crash leaves the old image or the new one, never one with blocks nothing names.
    let mut keep = Bitmap::new(total);
    let rebuilt_all = rebuilt.own.iter().chain(&rebuilt.borrowed);
    for &(s, n) in rebuilt_all.chain(&snapshot_runs) {
        set(&mut keep, s, n);
    }
    let gb = sb.group_blocks.get();
    for (s, n) in runs(&busy) {
        let mut b = s;
        while b < s + n {
            if keep.get(b) {
                b += 1;
                continue;
            }
            let mut e = b + 1;
            while e < s + n && !keep.get(e) && e % gb != 0 {
                e += 1;
            }
            inner.store.alloc.free(b, e - b, false)?;
            b = e;
        }
    }
    inner.commit()?;
    drop(inner);
    out.check = fsck::check(dev, hash, &mut |_| {})?;
    Ok(out)
}

/// One tree a repair rebuilds from its items: the active one, or a parked writable one
/// (`roots`) with its id and item.
struct Rebuild {
    parked: Option<(u64, crate::fs::Snap)>,
    /// Its origin's generation (0: none kept): its extents this old are the origin's.
    floor: u64,
    plan: plan::Plan,
}

/// Builds the plan of parked writable tree `snap` in a tree of its own beside the active
/// one (which `inner` then has again), adds the runs its extents name to `rebuilt`, and
/// returns its item: the new root, the plan's inode counters, parked at the rebuild's
/// generation (which wrote its root).
fn build_parked(
    inner: &mut Inner,
    plan: &plan::Plan,
    floor: u64,
    snap: &crate::fs::Snap,
    rebuilt: &mut Rebuilt,
) -> Result<crate::fs::Snap> {
    let active = inner.fs_tree;
    let counters = (inner.txn.next_ino, inner.txn.inode_count);
    inner.fs_tree = crate::btree::Tree::create(&mut inner.store, TREE_FS)?;
    // Nothing cached may point into the other tree (as a switch between trees clears it).
    inner.dir_ino_hint = Default::default();
    inner.txn.ino_runs = Default::default();
    inner.store.changes.shape_seq += 1;
    inner.txn.next_ino = plan.next_ino;
    inner.txn.inode_count = plan.inodes.len() as u64;
    build(inner, plan)?;
    let tree = inner.fs_tree;
    rebuilt_runs(inner, tree, floor, rebuilt)?;
    let item = idxfs_format::roots::SubvolumeItem {
        root: crate::fs::root_ptr(&tree),
        generation: inner.store.generation.into(),
        next_ino: inner.txn.next_ino.into(),
        inode_count: inner.txn.inode_count.into(),
        ..snap.item
    };
    inner.fs_tree = active;
    (inner.txn.next_ino, inner.txn.inode_count) = counters;
    inner.dir_ino_hint = Default::default();
    inner.txn.ino_runs = Default::default();
    inner.store.changes.shape_seq += 1;
    Ok(crate::fs::Snap {
        item,
        name: snap.name.clone(),
    })
}

/// The runs the rebuilt trees' extents name (not inline ones): their own, younger than their
/// origin's generation (all, for a tree with none), and their origins'.
#[derive(Default)]
struct Rebuilt {
    own: Vec<(u64, u64)>,
    borrowed: Vec<(u64, u64)>,
}

fn rebuilt_runs(
    inner: &mut Inner,
    tree: crate::btree::Tree,
    floor: u64,
    out: &mut Rebuilt,
) -> Result<()> {
    tree.scan(&mut inner.store, Key::MIN, Key::MAX, |k, v| {
        if k.item_type() == Some(ItemType::Extent) {
            if let Ok((e, _)) = ExtentItem::read_from_prefix(v) {
                let run = (e.disk_block.get(), e.blocks.get());
                match e.kind {
                    EXTENT_INLINE => {}
                    _ if e.generation.get() <= floor => out.borrowed.push(run),
                    _ => out.own.push(run),
                }
            }
        }
        Ok(true)
    })
}

/// What the kept snapshots name, and what writable trees name of their origins', that no
/// writable tree owns: held for every kept snapshot, a run per block group (as
/// `Allocator::free` frees them).
fn held_runs(kept: &roots::Kept, rebuilt: &Rebuilt, total: u64, gb: u64) -> Vec<(u64, u64)> {
    let mut only = Bitmap::new(total);
    let mut set = |runs: &[(u64, u64)], on: bool| {
        for &(s, n) in runs {
            let end = (s + n).min(total);
            if s < end {
                only.set_range(s, end - s, on);
            }
        }
    };
    set(&kept.data, true);
    set(&kept.borrowed, true);
    set(&rebuilt.borrowed, true);
    set(&kept.owned, false);
    set(&rebuilt.own, false);
    let mut out = Vec::new();
    for (mut s, n) in runs(&only) {
        let end = s + n;
        while s < end {
            let e = end.min((s / gb + 1) * gb);
            out.push((s, e - s));
            s = e;
        }
    }
    out
}

/// The blocks a rebuilt tree's extents may not name as their own: the kept trees' nodes, and
/// the blocks a writable tree owns, kept or rebuilt before (`copy_what_others_own`).
struct Claims {
    nodes: Bitmap,
    owned: Bitmap,
}

impl Claims {
    fn new(kept: &roots::Kept, sb: &idxfs_format::superblock::Superblock) -> Claims {
        let total = sb.total_blocks.get();
        let mut c = Claims {
            nodes: Bitmap::new(total),
            owned: Bitmap::new(total),
        };
        for (s, n) in kept.node_runs(sb.blocks_per_node()) {
            set(&mut c.nodes, s, n);
        }
        for &(s, n) in &kept.owned {
            set(&mut c.owned, s, n);
        }
        c
    }
}

/// Sets `n` bits of `b` from `s`, those past its end left out (runs read from a damaged
/// image may name blocks past the device).
fn set(b: &mut Bitmap, s: u64, n: u64) {
    let end = (s + n).min(b.len());
    if s < end {
        b.set_range(s, end - s, true);
    }
}

/// Marks for a copy (`Plan::clones`) each planned extent whose blocks are a kept tree's node
/// or another writable tree's own (`claims`), then claims what the plan's own extents name
/// (younger than `floor`, its tree's origin's generation). The kept trees checked whole and
/// the trees rebuilt before came first, so this tree's extent is the one that gives way; the
/// copy keeps its bytes for it. An extent as old as the tree's kept origin may name blocks
/// another tree owns (that is how clones share), but not a node.
fn copy_what_others_own(plan: &mut plan::Plan, floor: u64, claims: &mut Claims) {
    let total = claims.nodes.len();
    let mut copies = Vec::new();
    let mut mine = Vec::new();
    for (k, v) in &plan.items {
        if k.item_type() != Some(ItemType::Extent) || plan.clones.contains(k) {
            continue;
        }
        let Ok((e, _)) = ExtentItem::read_from_prefix(v) else {
            continue;
        };
        if e.kind == EXTENT_INLINE {
            continue;
        }
        let (s, n) = (e.disk_block.get(), e.blocks.get());
        let own = e.generation.get() > floor;
        let hit =
            (s..(s + n).min(total)).find(|&b| claims.nodes.get(b) || (own && claims.owned.get(b)));
        match hit {
            Some(b) => copies.push((*k, b)),
            None if own => mine.push((s, n)),
            None => {}
        }
    }
    for (s, n) in mine {
        set(&mut claims.owned, s, n);
    }
    for (k, b) in copies {
        plan.act(format!(
            "inode {}: extent at {}: block {b} is another tree's: given a copy of its own",
            k.objectid, k.offset
        ));
        plan.clones.push(k);
    }
}

/// Writes the plan into `inner`'s empty trees: items, then names, then the inode items with
/// their planned counts and times (which adding names changed).
fn build(inner: &mut Inner, plan: &plan::Plan) -> Result<()> {
    let mut all = plan.items.clone();
    for key in &plan.clones {
        if let Some(v) = all.get_mut(key) {
            clone_extent(inner, v)?;
        }
    }
    for (ino, it) in &plan.inodes {
        all.insert(Key::new(*ino, ItemType::Inode, 0), it.as_bytes().to_vec());
    }
    for (k, v) in all {
        inner.fs_tree.insert(&mut inner.store, k, v)?;
    }
    for (i, (dir, child, name)) in plan.entries.iter().enumerate() {
        let mode = plan.inodes.get(child).map_or(0, |it| it.mode.get());
        let (_, hash_len) = inner.lookup_slot(*dir, name)?;
        let e = inner.plan_entry(*dir, name, *child, hash_len, false)?;
        inner.add_entry(*dir, name, *child, dtype_of_mode(mode), e)?;
        if i % 512 == 511 {
            inner.write_back_inodes()?;
        }
    }
    inner.write_back_inodes()?;
    for (ino, it) in &plan.inodes {
        if it.mode.get() & S_IFMT == S_IFDIR {
            let key = Key::new(*ino, ItemType::Inode, 0);
            inner
                .fs_tree
                .put(&mut inner.store, key, it.as_bytes().to_vec())?;
        }
    }
    inner.inodes = crate::inode_cache::InodeCache::new(1024);
    Ok(())
}

/// Gives the extent `v` a copy of its blocks in newly allocated ones (`Plan::clones`).
fn clone_extent(inner: &mut Inner, v: &mut Vec<u8>) -> Result<()> {
    let Ok(mut e) = ExtentItem::read_from_prefix(v).map(|(e, _)| e) else {
        return Ok(());
    };
    let n = e.blocks.get();
    let (to, _) = inner
        .store
        .alloc
        .alloc(n, n, crate::space::Kind::Data)
        .ok_or(Error::NoSpace)?;
    let mut buf = vec![0u8; (n * BLOCK_SIZE) as usize];
    inner
        .store
        .dev
        .read_at(&mut buf, e.disk_block.get() * BLOCK_SIZE)?;
    inner.store.dev.write_at(&buf, to * BLOCK_SIZE)?;
    e.disk_block = to.into();
    // Written now: its blocks are its tree's own, whatever its origin (`fs::clones`).
    e.generation = inner.store.generation.into();
    v.clear();
    v.extend_from_slice(e.as_bytes());
    Ok(())
}

/// The runs of set bits: (start, length).
fn runs(b: &Bitmap) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !b.get(i) {
            i += 1;
            continue;
        }
        let s = i;
        while i < b.len() && b.get(i) {
            i += 1;
        }
        out.push((s, i - s));
    }
    out
}
