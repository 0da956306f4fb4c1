//! Read-only snapshots of the file system's tree: made in constant time, opened read-only
//! (`OpenOptions::snapshot`), deleted with their blocks given back in the background.
//!
//! **Nodes** are shared by count (`btree::refs`, Rodeh's lazy counts as btrfs keeps them): a
//! snapshot is a second root pointer to the fs tree's root, whose count becomes 2; the fs
//! tree copies a shared node when it first changes it, and the copy's children gain a parent.
//! Dropping a snapshot lets go of its nodes from the root down (`Tree::drop_some`): a node
//! still counted more than once loses one and is not entered, any other is freed. The counts
//! are `NodeRefs` items of the roots tree, written back by every commit (`persist_roots`).
//!
//! **Data blocks** are not counted per snapshot. A snapshot is a copy of the fs tree at a
//! commit, so every block it names was named by the fs tree at that commit, and while the fs
//! tree names a block nothing about it changes. The fs tree lets go of a block in one place
//! (`Inner::release`), and there:
//! - a block of an extent written after the newest snapshot's generation is in no snapshot,
//!   and is freed as before;
//! - any other is *held* (`HeldBlocks` items): kept used with its window, `born` (the
//!   extent's generation: none of its blocks is older) to `released` (now). A snapshot of
//!   generation `g` may name it exactly when `born <= g < released`.
//!
//! When a snapshot's drop ends, every held run no remaining snapshot's window holds is freed.
//! So a block a snapshot names is always named by the fs tree or held for it, which fsck
//! checks; a held run outside every window is a leak, which fsck reports. The price of not
//! counting: a held run waits for the last snapshot whose window holds it, even when that
//! snapshot no longer names it (its `born` is the extent's, so a merged extent's younger
//! blocks wait too).
//!
//! **The fsync log** carries none of this: held runs, node counts and drop progress are
//! roots-tree state that only commits write. A replay re-derives what it needs from the
//! items it applies to the committed trees: their copies of shared nodes count as any
//! copy does, and a block its extents let go of is held while any snapshot exists, as if as
//! old as the oldest (the log does not say which extent named it), so it waits for the
//! last snapshot at worst. Drop steps after the last commit are redone from its drop key.
//!
//! **In-place writes** (`in_place`): a block a snapshot may name is never overwritten (a
//! NOCOW file's write over an extent as old as a snapshot goes copy-on-write, as btrfs's
//! nodatacow does over a shared extent). A preallocated block a snapshot names is still
//! filled in place: the snapshot's extent is preallocated and reads as zeros whatever the
//! block holds (the file system only turns preallocated blocks into written ones, so no
//! snapshot names as written a block it names preallocated; a rollback keeps that true by
//! giving such extents new blocks, `rollback`).
//!
//! **A snapshot is a point in time**: it is made under the operation lock right after a
//! commit, with no write in flight outside the lock (it waits for them, and no new one
//! starts meanwhile), so it holds every operation that returned before it and none after.
//!
//! A snapshot is read either alone (`OpenOptions::snapshot`) or beside the file system
//! (`Fs::open_snapshot`, `snapshot_view`), which is how the mount shows them.
//!
//! The file system can be rolled back to a snapshot (`rollback`).
//!
//! Writable subvolumes are made from snapshots (`clones`).
use super::{Fs, Inner};
use crate::btree::{Ptr, Tree};
use crate::counters::Counters;
use crate::error::{Error, Result};
use idxfs_format::node::{internal_capacity, leaf_capacity, ITEM_HEADER_SIZE};
use idxfs_format::roots::{
    decode_held, decode_node_refs, decode_origin, decode_subvolume, HeldItem, NodeRefsItem,
    OriginItem, SubvolumeItem, SUBVOL_DROPPING, SUBVOL_HIDDEN, SUBVOL_READ_ONLY, SUBVOL_WRITABLE,
};
use idxfs_format::superblock::RootPtr;
use idxfs_format::versions::INCOMPAT_SUBVOLUMES;
use idxfs_format::{
    ItemType, Key, FIRST_SNAPSHOT_ID, FS_SUBVOL_ID, HELD_OBJECTID, MAX_INO, NAME_MAX,
    NODE_REFS_OBJECTID, TREE_FS, TREE_ROOTS,
};
use std::collections::{BTreeMap, BTreeSet};
use zerocopy::IntoBytes;

/// Bytes of a roots-tree count or held-run item in a leaf, header included (the larger).
const ROOTS_ITEM_BYTES: u64 = (ITEM_HEADER_SIZE + idxfs_format::roots::HELD_ITEM_SIZE) as u64;
/// Paths of the fs tree one operation copies at most, for its count changes: a rename's
/// two directories' entries in both indexes, its inodes and back references.
const OP_PATHS: u64 = 8;

/// Nodes one drop step lets go of: a step runs under the operation lock, and may read each
/// of them from the device.
const DROP_BUDGET: usize = 32;

/// A snapshot as the roots tree has it.
#[derive(Debug, Clone)]
pub(crate) struct Snap {
    pub item: SubvolumeItem,
    pub name: Vec<u8>,
}

impl Snap {
    pub fn generation(&self) -> u64 {
        self.item.generation.get()
    }

    pub fn dropping(&self) -> bool {
        self.item.flags.get() & SUBVOL_DROPPING != 0
    }

    /// A writable snapshot's origin, listed by no one (`Fs::writable_snapshot`).
    pub fn hidden(&self) -> bool {
        self.item.flags.get() & SUBVOL_HIDDEN != 0
    }

    pub fn tree(&self) -> Tree {
        tree_at(&self.item.root, TREE_FS)
    }
}

pub(super) fn tree_at(r: &RootPtr, owner: u64) -> Tree {
    Tree {
        owner,
        root: Ptr {
            block: r.block.get(),
            generation: r.generation.get(),
        },
        level: r.level.get() as u8,
    }
}

pub(crate) fn root_ptr(t: &Tree) -> RootPtr {
    RootPtr {
        block: t.root.block.into(),
        generation: t.root.generation.into(),
        level: (t.level as u32).into(),
        reserved: 0.into(),
    }
}

/// A snapshot, as `Fs::snapshots` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub id: u64,
    pub name: Vec<u8>,
    /// The commit whose state it holds.
    pub generation: u64,
    /// Deleted; its blocks are being given back.
    pub dropping: bool,
    /// The writable tree it was taken of (`FS_SUBVOL_ID`: the file system's own); None when
    /// not recorded (made before snapshots recorded it).
    pub source: Option<u64>,
}

/// Data blocks held for snapshots (module docs), by first block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub blocks: u64,
    pub born: u64,
    pub released: u64,
}

/// The roots tree and what it holds, in memory while the image is open; each commit writes
/// what changed (`Inner::persist_roots`).
#[derive(Default)]
pub(crate) struct Snapshots {
    /// None until the first snapshot makes it.
    pub tree: Option<Tree>,
    /// Nodes of the roots tree (as of the last commit): each may be copied by the next.
    pub nodes: u64,
    pub list: BTreeMap<u64, Snap>,
    pub held: BTreeMap<u64, Held>,
    /// The snapshot (or parked writable tree) this read-only open shows instead of the fs
    /// tree.
    pub opened: Option<u64>,
    /// Writable trees made from snapshots, and which one is active (`clones`).
    pub clones: super::clones::Clones,
    changed_list: BTreeSet<u64>,
    changed_held: BTreeSet<u64>,
}

impl Snapshots {
    /// Whether a snapshot or a writable subvolume has this name.
    pub fn name_taken(&self, name: &[u8]) -> bool {
        let live = |s: &&Snap| !s.dropping() && !s.hidden() && s.name == name;
        self.list.values().any(|s| live(&s)) || self.clones.items.values().any(|s| live(&s))
    }

    /// The id the next snapshot or clone takes: past every id in use (never reused while
    /// its item exists).
    pub fn next_id(&self) -> Result<u64> {
        let last = self
            .list
            .keys()
            .chain(self.clones.items.keys())
            .copied()
            .max();
        let id = last.map_or(FIRST_SNAPSHOT_ID, |l| (l + 1).max(FIRST_SNAPSHOT_ID));
        if id > MAX_INO {
            return Err(Error::NoSpace);
        }
        Ok(id)
    }

    /// Snapshot `id`'s item changed: the next commit writes it.
    pub(super) fn mark_changed(&mut self, id: u64) {
        self.changed_list.insert(id);
    }

    /// Whether a snapshot may name a block of an extent of generation `born`: one was made
    /// at or after it.
    pub fn may_name(&self, born: u64) -> bool {
        self.list.values().any(|s| s.generation() >= born)
    }

    /// Whether some snapshot's window holds `h` (module docs).
    fn holds(&self, h: &Held) -> bool {
        self.list
            .values()
            .any(|s| h.born <= s.generation() && s.generation() < h.released)
    }

    /// How many of blocks [start, start + n) held runs cover.
    pub fn held_within(&self, start: u64, n: u64) -> u64 {
        let end = start + n;
        let before = self.held.range(..start).next_back();
        (before.into_iter().chain(self.held.range(start..end)))
            .map(|(s, h)| (s + h.blocks).min(end).saturating_sub(*s.max(&start)))
            .sum()
    }

    /// Holds blocks [start, start + blocks). They were the fs tree's until now, so no run
    /// holds any of them, unless the image is damaged (an extent naming held blocks).
    fn hold(&mut self, start: u64, blocks: u64, born: u64, released: u64) -> Result<()> {
        let end = start + blocks;
        if let Some((s, h)) = self.held.range(..end).next_back() {
            if s + h.blocks > start {
                return Err(idxfs_format::Corrupt::new(
                    format!("data blocks {start}+{blocks} let go of"),
                    format!("held already (from {s}, {} blocks)", h.blocks),
                    "named by the fs tree alone",
                )
                .into());
            }
        }
        self.held.insert(
            start,
            Held {
                blocks,
                born,
                released,
            },
        );
        self.changed_held.insert(start);
        Ok(())
    }
}

/// A snapshot name: 1 to 255 bytes, no NUL or '/'.
pub(super) fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    if name.is_empty() || name.contains(&0) || name.contains(&b'/') {
        return Err(Error::Invalid(
            "a snapshot name is 1 to 255 bytes, no NUL or '/'",
        ));
    }
    Ok(())
}

impl Inner {
    /// Loads the roots tree the superblock names (open): snapshots, node counts, held runs.
    /// `active`: the superblock's `subvolume`.
    pub(crate) fn load_roots(&mut self, r: &RootPtr, active: u64) -> Result<()> {
        if r.block.get() == 0 {
            if active != 0 {
                return Err(idxfs_format::Corrupt::new(
                    "superblock subvolume",
                    active,
                    "0 (no roots tree)",
                )
                .into());
            }
            return Ok(());
        }
        let tree = tree_at(r, TREE_ROOTS);
        let total = self.store.total_blocks;
        let (mut list, mut counts, mut held) = (BTreeMap::new(), Vec::new(), BTreeMap::new());
        let (mut writable, mut origins) = (BTreeMap::new(), BTreeMap::new());
        tree.scan(&mut self.store, Key::MIN, Key::MAX, |k, v| {
            match k.item_type() {
                Some(ItemType::Subvolume) if k.offset == 0 => {
                    let (item, name) = decode_subvolume(v, k.objectid)?;
                    let snap = Snap {
                        item,
                        name: name.to_vec(),
                    };
                    match item.flags.get() & SUBVOL_WRITABLE != 0 && !snap.dropping() {
                        true => writable.insert(k.objectid, snap),
                        false => list.insert(k.objectid, snap),
                    };
                }
                Some(ItemType::SubvolumeOrigin) if k.offset == 0 => {
                    let o = decode_origin(v, k.objectid)?;
                    origins.insert(
                        k.objectid,
                        super::clones::Origin {
                            id: o.origin.get(),
                            generation: o.generation.get(),
                        },
                    );
                }
                Some(ItemType::NodeRefs) if k.objectid == NODE_REFS_OBJECTID => {
                    counts.push((k.offset, decode_node_refs(v, k.offset)?));
                }
                Some(ItemType::HeldBlocks) if k.objectid == HELD_OBJECTID => {
                    let h = decode_held(v, k.offset, total)?;
                    held.insert(
                        k.offset,
                        Held {
                            blocks: h.blocks.get(),
                            born: h.born.get(),
                            released: h.released.get(),
                        },
                    );
                }
                _ => {
                    return Err(idxfs_format::Corrupt::new(
                        format!("roots tree item {k}"),
                        k.ty,
                        "a snapshot, subvolume, origin, node count or held blocks item",
                    )
                    .into())
                }
            }
            Ok(true)
        })?;
        let mut end = 0;
        for (&s, h) in &held {
            if s < end {
                return Err(idxfs_format::Corrupt::new(
                    format!("held blocks at {s}"),
                    format!("inside the run before, which ends at {end}"),
                    "runs that do not overlap",
                )
                .into());
            }
            end = s + h.blocks;
        }
        let newest = list.values().map(Snap::generation).max().unwrap_or(0);
        for (block, c) in counts {
            // A node counted is in use; a count on a free block would let a new node there
            // be taken for a shared one.
            let inside = (idxfs_format::SUPER_COPIES..total).contains(&block);
            if !inside || !self.store.alloc.is_used(block) {
                return Err(idxfs_format::Corrupt::new(
                    format!("node count of {block}"),
                    "a free block",
                    "a node in use",
                )
                .into());
            }
            // Decoded as at most u32::MAX.
            self.store.refs.load(block, c as u32, newest);
        }
        let nodes = tree.count_nodes(&mut self.store)?;
        let clones = super::clones::Clones::loaded(writable, origins, active, &list)?;
        self.trees.primary = active;
        self.snapshots = Snapshots {
            tree: Some(tree),
            nodes,
            list,
            held,
            clones,
            ..Default::default()
        };
        Ok(())
    }

    /// Roots-tree items the next commit writes so far (changed counts, snapshots, runs).
    fn roots_pending(&self) -> u64 {
        let s = &self.snapshots;
        (self.store.refs.changed_len()
            + s.changed_list.len()
            + s.changed_held.len()
            + s.clones.pending()) as u64
    }

    /// Worst-case new nodes `items` more roots-tree items make a commit allocate: the
    /// leaves their bytes fill (half full, as after splits), one split of every leaf there
    /// is, and a parent for every two of those, up to a new root. Copies of the tree's
    /// nodes are `roots_copies`.
    pub(crate) fn roots_growth(&self, items: u64) -> u64 {
        if items == 0 {
            return 0;
        }
        let bytes = items * ROOTS_ITEM_BYTES;
        let leaves =
            (2 * bytes).div_ceil(leaf_capacity(self.store.node_size) as u64) + self.snapshots.nodes;
        let mut nodes = leaves;
        let mut below = leaves;
        while below > 1 {
            below = below.div_ceil(2);
            nodes += below;
        }
        nodes + 2
    }

    /// Nodes the next commit may allocate for the roots tree, besides the space tree's
    /// (`reserve::commit_need`): each of its nodes copied once, and what the items this
    /// transaction changed add.
    pub(crate) fn roots_commit_need(&self) -> u64 {
        match self.snapshots.tree.is_some() || self.roots_pending() > 0 {
            true => self.snapshots.nodes + 2 + self.roots_growth(self.roots_pending()),
            false => 0,
        }
    }

    /// Nodes one operation's changes may add to the next commit's roots tree: while trees
    /// share nodes, each fs-tree path it copies may copy shared internal nodes, each adding
    /// a count for every child (`btree::refs`), for the few paths an operation copies; and
    /// while snapshots exist, a held run for each extent of a freeing batch.
    pub(crate) fn roots_op_need(&self) -> u64 {
        let mut items = 0;
        if !self.store.refs.is_empty() {
            let fanout = internal_capacity(self.store.node_size) as u64;
            items += OP_PATHS * self.fs_tree.level as u64 * fanout;
        }
        if !self.snapshots.list.is_empty() {
            items += 2 * (super::shared::SHARED_FREE_BATCH as u64 + 2);
        }
        self.roots_growth(items)
    }

    /// Commit step 1: writes what changed of the roots tree (node counts, snapshots, held
    /// runs), making the tree at the first snapshot. Returns its root for the superblock.
    pub(crate) fn persist_roots(&mut self) -> Result<Option<RootPtr>> {
        let counts = self.store.refs.take_changed();
        let mut list = std::mem::take(&mut self.snapshots.changed_list);
        list.append(&mut self.snapshots.clones.changed_items);
        let origins = std::mem::take(&mut self.snapshots.clones.changed_origins);
        let held = std::mem::take(&mut self.snapshots.changed_held);
        let unchanged =
            counts.is_empty() && list.is_empty() && held.is_empty() && origins.is_empty();
        let mut tree = match self.snapshots.tree {
            Some(t) if unchanged => return Ok(Some(root_ptr(&t))),
            Some(t) => t,
            None if unchanged => return Ok(None),
            None => Tree::create(&mut self.store, TREE_ROOTS)?,
        };
        for block in counts {
            let key = Key::new(NODE_REFS_OBJECTID, ItemType::NodeRefs, block);
            match self.store.refs.count(block) {
                c if c >= 2 => {
                    let v = NodeRefsItem {
                        refs: (c as u64).into(),
                    };
                    tree.put(&mut self.store, key, v.as_bytes().to_vec())?;
                }
                _ => {
                    tree.delete(&mut self.store, &key)?;
                }
            }
        }
        for id in list {
            let key = Key::new(id, ItemType::Subvolume, 0);
            let writable = self.snapshots.clones.items.get(&id);
            match self.snapshots.list.get(&id).or(writable) {
                Some(s) => {
                    let mut v = s.item.as_bytes().to_vec();
                    v.extend_from_slice(&s.name);
                    tree.put(&mut self.store, key, v)?;
                }
                None => {
                    tree.delete(&mut self.store, &key)?;
                }
            }
        }
        for id in origins {
            let key = Key::new(id, ItemType::SubvolumeOrigin, 0);
            match self.snapshots.clones.origins.get(&id) {
                Some(o) => {
                    let v = OriginItem {
                        origin: o.id.into(),
                        generation: o.generation.into(),
                    };
                    tree.put(&mut self.store, key, v.as_bytes().to_vec())?;
                }
                None => {
                    tree.delete(&mut self.store, &key)?;
                }
            }
        }
        for start in held {
            let key = Key::new(HELD_OBJECTID, ItemType::HeldBlocks, start);
            match self.snapshots.held.get(&start) {
                Some(h) => {
                    let v = HeldItem {
                        blocks: h.blocks.into(),
                        born: h.born.into(),
                        released: h.released.into(),
                    };
                    tree.put(&mut self.store, key, v.as_bytes().to_vec())?;
                }
                None => {
                    tree.delete(&mut self.store, &key)?;
                }
            }
        }
        self.snapshots.tree = Some(tree);
        self.snapshots.nodes = tree.count_nodes(&mut self.store)?;
        Ok(Some(root_ptr(&tree)))
    }

    /// Frees data blocks the fs tree lets go of, or holds them while a snapshot may name
    /// them (module docs). `born`: the generation of the extent that named them. In a clone,
    /// blocks as old as its origin are the origin's, and stay as they are (`clones`).
    pub(crate) fn free_or_hold(&mut self, start: u64, n: u64, now: bool, born: u64) -> Result<()> {
        if self.snapshots.clones.of_origin(born) {
            return Ok(());
        }
        self.let_go(start, n, now, born)
    }

    /// `free_or_hold` for blocks the caller knows to be the letting tree's own. A run may
    /// span block groups where extents lie end to end across a boundary and are let go of
    /// together (a deleted clone's, a log replay's): freed a group at a time
    /// (`Allocator::free_data_across`).
    pub(crate) fn let_go(&mut self, start: u64, n: u64, now: bool, born: u64) -> Result<()> {
        if self.snapshots.may_name(born) {
            let released = self.store.generation;
            self.snapshots.hold(start, n, born, released)?;
            Counters::add(&self.store.counters.blocks_held, n);
            return Ok(());
        }
        Ok(self.store.alloc.free_data_across(start, n, now)?)
    }

    /// One step of dropping a deleted snapshot; false when none is left to drop. When a
    /// snapshot's drop ends, the held runs no snapshot's window holds any more are freed.
    pub(crate) fn drop_step(&mut self) -> Result<bool> {
        let Some((&id, snap)) = self.snapshots.list.iter().find(|(_, s)| s.dropping()) else {
            return Ok(false);
        };
        let (tree, from) = (snap.tree(), snap.item.drop_key());
        let mut leaves = Vec::new();
        // What the leaves name is settled by the held runs' windows, not here.
        let next = tree.drop_some(&mut self.store, from, DROP_BUDGET, &mut leaves)?;
        self.store.changes.mod_seq += 1;
        self.txn.changed = true;
        self.snapshots.changed_list.insert(id);
        match next {
            Some(k) => {
                if let Some(s) = self.snapshots.list.get_mut(&id) {
                    s.item.drop_from = k.encode();
                }
            }
            None => {
                self.snapshots.list.remove(&id);
                // Its leaves named its origin's blocks until now (`clones`); a hidden
                // origin goes with its last use, its drop a step of this loop later.
                if let Some(o) = self.snapshots.clones.origins.remove(&id) {
                    self.snapshots.clones.changed_origins.insert(id);
                    self.retire_hidden(o.id);
                }
                let gone: Vec<(u64, Held)> = (self.snapshots.held.iter())
                    .filter(|(_, h)| !self.snapshots.holds(h))
                    .map(|(s, h)| (*s, *h))
                    .collect();
                for (start, h) in gone {
                    self.snapshots.held.remove(&start);
                    self.snapshots.changed_held.insert(start);
                    // A held run may span groups (`let_go`).
                    self.store.alloc.free_data_across(start, h.blocks, false)?;
                }
                Counters::inc(&self.store.counters.snapshots_dropped);
            }
        }
        Ok(true)
    }

    /// The held blocks of [start, start + n) leave their runs: the fs tree names them again
    /// (`restore`). Returns their runs, ascending; the runs they were in keep the rest, with
    /// the same window. The next fsync commits: a replay over the committed roots tree would
    /// find them named and still held.
    pub(crate) fn unhold(&mut self, start: u64, n: u64) -> Result<Vec<(u64, u64)>> {
        let end = start + n;
        let held = &self.snapshots.held;
        let mut runs: Vec<u64> = held
            .range(..start)
            .next_back()
            .filter(|(s, h)| **s + h.blocks > start)
            .map(|(s, _)| *s)
            .into_iter()
            .collect();
        runs.extend(held.range(start..end).map(|(s, _)| *s));
        let mut out = Vec::new();
        for s in runs {
            let Some(h) = self.snapshots.held.remove(&s) else {
                continue;
            };
            self.snapshots.changed_held.insert(s);
            let e = s + h.blocks;
            let (a, b) = (s.max(start), e.min(end));
            out.push((a, b - a));
            if s < a {
                let left = Held { blocks: a - s, ..h };
                self.snapshots.held.insert(s, left);
            }
            if b < e {
                let right = Held { blocks: e - b, ..h };
                self.snapshots.held.insert(b, right);
                self.snapshots.changed_held.insert(b);
            }
            Counters::add(&self.store.counters.blocks_unheld, b - a);
        }
        if !out.is_empty() {
            self.store.changes.log.commit_next();
        }
        Ok(out)
    }

    /// Takes `list` as the snapshots of a rebuilt file system (a repair: its fs tree shares
    /// no node with them), with `counts` the parents of each of their nodes and `held` the
    /// runs they name that the fs tree does not, held for every one of them (born 0,
    /// released `released`). The next commit writes a new roots tree of them.
    pub(crate) fn adopt_snapshots(
        &mut self,
        list: BTreeMap<u64, Snap>,
        counts: &std::collections::HashMap<u64, u32>,
        held: &[(u64, u64)],
        released: u64,
    ) {
        let newest = list.values().map(Snap::generation).max().unwrap_or(0);
        for (&block, &c) in counts {
            if c >= 2 {
                self.store.refs.restore(block, c, newest);
            }
        }
        for &(start, blocks) in held {
            self.snapshots.held.insert(
                start,
                Held {
                    blocks,
                    born: 0,
                    released,
                },
            );
            self.snapshots.changed_held.insert(start);
        }
        self.snapshots.changed_list.extend(list.keys().copied());
        self.snapshots.list = list;
    }

    /// Opens snapshot `id` in place of the fs tree (read-only open): its root, and the
    /// inode counters it was made with.
    pub(crate) fn enter_snapshot(&mut self, id: u64) -> Result<()> {
        let Some(s) = self.snapshots.list.get(&id).filter(|s| !s.dropping()) else {
            return Err(Error::NotFound);
        };
        self.fs_tree = s.tree();
        self.txn.next_ino = s.item.next_ino.get();
        self.txn.inode_count = s.item.inode_count.get();
        self.snapshots.opened = Some(id);
        Ok(())
    }
}

impl Inner {
    /// A snapshot of the active tree as the last commit left it (the caller committed with
    /// nothing changed since), named `name`, flagged `flags` (`SUBVOL_READ_ONLY`, maybe
    /// `SUBVOL_HIDDEN`): one count and one item, written by the next commit.
    pub(super) fn add_snapshot(&mut self, name: &[u8], flags: u64) -> Result<u64> {
        let id = self.snapshots.next_id()?;
        let generation = self.store.generation - 1;
        let fs_tree = self.fs_tree;
        let tree = fs_tree.share(&mut self.store);
        let item = SubvolumeItem {
            root: root_ptr(&tree),
            flags: flags.into(),
            generation: generation.into(),
            next_ino: self.txn.next_ino.into(),
            inode_count: self.txn.inode_count.into(),
            drop_from: Key::MIN.encode(),
            name_len: name.len() as u8,
            source: SubvolumeItem::source_of(self.snapshots.clones.active_id()),
        };
        self.snapshots.list.insert(
            id,
            Snap {
                item,
                name: name.to_vec(),
            },
        );
        self.snapshots.changed_list.insert(id);
        // A snapshot of a clone names the clone's origin's blocks too (`clones`).
        if let Some(o) = self.snapshots.clones.active_origin() {
            self.snapshots.clones.origins.insert(id, o);
            self.snapshots.clones.changed_origins.insert(id);
        }
        self.txn.incompat_wanted |= INCOMPAT_SUBVOLUMES;
        self.txn.changed = true;
        Ok(id)
    }
}

impl Fs {
    /// Makes a read-only snapshot of the file system as it is now, named `name`, and returns
    /// its id. Constant time: a commit, one count, one item and a second commit that makes
    /// it durable.
    pub fn snapshot(&self, name: &[u8]) -> Result<u64> {
        check_name(name)?;
        let mut g = self.quiet()?;
        if g.snapshots.name_taken(name) {
            return Err(Error::Exists);
        }
        // Everything before is committed: no node of the fs tree belongs to the running
        // transaction, so the fs tree changes none of them in place from now on.
        g.commit()?;
        let id = g.add_snapshot(name, SUBVOL_READ_ONLY)?;
        g.commit()?;
        Counters::inc(&g.store.counters.snapshots_made);
        Ok(id)
    }

    /// The operation lock with no write in flight outside it (and none starting): what a
    /// snapshot needs to be one point in time, since such a write could change a block the
    /// snapshot names after it was made.
    pub(super) fn quiet(&self) -> Result<super::Locked<'_>> {
        let _waiting = self.lock().in_place.wait();
        let g = loop {
            let g = self.lock();
            if g.in_place.is_empty() {
                break g;
            }
            drop(g);
            std::thread::sleep(super::IN_FLIGHT_WAIT);
        };
        g.writable()?;
        Ok(g)
    }
    /// Every snapshot, by id, but writable snapshots' origins (`writable_snapshot`).
    pub fn snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        let g = self.lock();
        Ok(g.snapshots
            .list
            .iter()
            .filter(|(_, s)| !s.hidden())
            .map(|(&id, s)| SnapshotInfo {
                id,
                name: s.name.clone(),
                generation: s.generation(),
                dropping: s.dropping(),
                source: Some(s.item.source()).filter(|&t| t != 0),
            })
            .collect())
    }

    /// Deletes snapshot `id`: it is gone once this returns (durably), and its blocks come
    /// back in the background (the commit thread's drop steps, or `finish_drops`), resumed
    /// at the next open after a crash. `Error::Busy` while it is open beside the file system
    /// (`open_snapshot`), or while anything names its blocks as its origin's (`clones`).
    /// A parked clone's id deletes the clone (`Inner::delete_clone`).
    pub fn delete_snapshot(&self, id: u64) -> Result<()> {
        let mut g = self.lock();
        g.writable()?;
        // A writable snapshot's origin goes with it (`writable_snapshot`).
        if g.snapshots.list.get(&id).is_some_and(Snap::hidden) {
            return Err(Error::NotFound);
        }
        if g.snapshots.clones.is_origin(id) {
            return Err(Error::Busy(
                "a writable subvolume was made from the snapshot",
            ));
        }
        if g.snapshots.clones.items.contains_key(&id) || id == FS_SUBVOL_ID {
            // Under the lock, as `open_snapshot`'s registration (`snapshot_view`).
            if self.shared.views.open.is_open(id) {
                return Err(Error::Busy("the subvolume is open beside the file system"));
            }
            return g.delete_clone(id);
        }
        let Some(s) = g.snapshots.list.get_mut(&id).filter(|s| !s.dropping()) else {
            return Err(Error::NotFound);
        };
        // Under the lock, as `open_snapshot`'s registration (`snapshot_view`).
        if self.shared.views.open.is_open(id) {
            return Err(Error::Busy("the snapshot is open beside the file system"));
        }
        s.item.flags = (s.item.flags.get() | SUBVOL_DROPPING).into();
        s.item.drop_from = Key::MIN.encode();
        g.snapshots.changed_list.insert(id);
        g.txn.changed = true;
        g.commit()
    }

    /// Runs the drop steps of deleted snapshots until none is left (what the commit thread
    /// does a step at a time); each step is one change of the running transaction.
    pub fn finish_drops(&self) -> Result<()> {
        while self.drop_step()? {}
        Ok(())
    }

    /// One drop step of a deleted snapshot (what the commit thread runs); false when no
    /// deleted snapshot is left to drop.
    pub fn drop_step(&self) -> Result<bool> {
        self.shared.drop_step()
    }
}

impl super::Shared {
    /// One drop step under the lock, as an operation: an error stops the file system.
    pub(crate) fn drop_step(&self) -> Result<bool> {
        let mut g = self.lock();
        if g.writable().is_err() {
            return Ok(false);
        }
        match g.drop_step() {
            Ok(false) => Ok(false),
            Ok(true) => {
                let over_bound = g.after_op()?;
                drop(g);
                if over_bound {
                    self.commit_beside(true)?;
                }
                Ok(true)
            }
            Err(e) => {
                // A step may have let go of some nodes before it failed: half done.
                g.fail(format!("dropping a snapshot: {e}"));
                Err(e)
            }
        }
    }
}
