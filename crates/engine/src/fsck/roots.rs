//! fsck of the roots tree and the snapshots' trees (`fs::snapshot`):
//! - every roots-tree item decodes, and held runs do not overlap;
//! - every node of every snapshot's tree passes the node checks, each node read once
//!   however many trees share it (a dropping snapshot's from its drop key on);
//! - every node's stored count (`NodeRefs`) equals the pointers to it that the fs tree, the
//!   snapshots and their nodes hold, and no count names a node nobody points at;
//! - every block a snapshot's written extent names is named by the fs tree or held with
//!   that snapshot's generation in its window; held runs are claimed like any used block
//!   (so one the fs tree still names is a block referenced twice), and a held run no
//!   snapshot's window holds is a leak;
//! - every snapshot's tree is a whole file system of its own (`check_snapshot_files`);
//! - writable subvolumes (`fs::clones`): every clone's origin (one made empty has none) is
//!   a snapshot that exists with the generation the origin item records; the superblock's
//!   `subvolume` is a writable subvolume
//!   whose item has no root, with the file system's own tree parked; each parked tree is
//!   walked before the snapshots and checked as a file system of its own. A writable tree
//!   owns the blocks of its extents younger than its origin (one tree each, so two owners are
//!   a block referenced twice); the older ones are its origin's, and must be owned by another
//!   writable tree or held, or, when no walk reached them as its own (a node the trees share
//!   is entered once), are taken as the origin's.
use super::{Checker, Report};
use idxfs_format::items::{decode_extent, EXTENT_REGULAR};
use idxfs_format::node::KeyRange;
use idxfs_format::roots::{
    decode_held, decode_node_refs, decode_origin, decode_subvolume, SubvolumeItem, SUBVOL_DROPPING,
    SUBVOL_HIDDEN, SUBVOL_WRITABLE,
};
use idxfs_format::{ItemType, Key, FS_SUBVOL_ID, HELD_OBJECTID, NODE_REFS_OBJECTID, TREE_FS};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

fn writable(it: &SubvolumeItem) -> bool {
    it.flags.get() & SUBVOL_WRITABLE != 0 && it.flags.get() & SUBVOL_DROPPING == 0
}

#[derive(Default)]
pub(super) struct RootsCheck {
    /// Pointers found to each fs-class node: root pointers and internal nodes' pointers.
    parents: HashMap<u64, u32>,
    snapshots: Vec<(u64, SubvolumeItem)>,
    counts: HashMap<u64, u64>,
    /// start -> (blocks, born, released)
    held: Vec<(u64, u64, u64, u64)>,
    /// Each clone's origin: clone id -> (origin id, origin generation).
    origins: HashMap<u64, (u64, u64)>,
    /// The active tree's origin's generation (0: the file system's own tree is active):
    /// extents this old are not its own (`Checker::claim_data`).
    pub floor: u64,
    /// Blocks writable trees name that are their origins' (start, blocks, whose: shared by
    /// every extent of one tree, which may be millions).
    pub borrowed: Vec<(u64, u64, Rc<str>)>,
    /// How many of the active tree's extents name each block it does not own.
    pub borrowed_named: HashMap<u64, u64>,
    /// The active tree's name in messages.
    pub active_name: Rc<str>,
}

impl RootsCheck {
    /// One more pointer to the node at `block`; true on the first (the node is entered).
    pub(super) fn parent(&mut self, block: u64) -> bool {
        let c = self.parents.entry(block).or_insert(0);
        *c += 1;
        *c == 1
    }
}

impl Checker<'_> {
    pub(super) fn roots_item(&mut self, k: &Key, v: &[u8]) {
        let total = self.sb.total_blocks.get();
        let r = match k.item_type() {
            Some(ItemType::Subvolume) if k.offset == 0 => decode_subvolume(v, k.objectid)
                .map(|(it, _)| self.roots.snapshots.push((k.objectid, it))),
            Some(ItemType::SubvolumeOrigin) if k.offset == 0 => {
                decode_origin(v, k.objectid).map(|o| {
                    let o = (o.origin.get(), o.generation.get());
                    self.roots.origins.insert(k.objectid, o);
                })
            }
            Some(ItemType::NodeRefs) if k.objectid == NODE_REFS_OBJECTID => {
                decode_node_refs(v, k.offset).map(|c| {
                    self.roots.counts.insert(k.offset, c);
                })
            }
            Some(ItemType::HeldBlocks) if k.objectid == HELD_OBJECTID => {
                decode_held(v, k.offset, total).map(|h| {
                    let run = (k.offset, h.blocks.get(), h.born.get(), h.released.get());
                    self.roots.held.push(run);
                })
            }
            _ => {
                self.report
                    .problem(format!("roots tree: item {k} of no kind it holds"));
                Ok(())
            }
        };
        if let Err(e) = r {
            self.report.problem(format!("roots tree: {e}"));
        }
    }

    /// After the roots tree's walk, before the fs tree's: the active clone's origin, whose
    /// generation divides its extents into its own and its origin's.
    pub(super) fn active_clone(&mut self) {
        let active = self.sb.subvolume.get();
        if active == 0 {
            return;
        }
        self.roots.active_name = format!("fs tree (subvolume {active})").into();
        // One made empty has no origin: every block it names is its own.
        self.roots.floor = self.roots.origins.get(&active).map_or(0, |o| o.1);
    }

    /// Each clone's origin exists with its generation, and the writable trees' items agree
    /// with the superblock (module notes).
    fn check_clones(&mut self, snaps: &[(u64, SubvolumeItem)]) {
        let active = self.sb.subvolume.get();
        let items: HashMap<u64, &SubvolumeItem> = snaps
            .iter()
            .filter(|(_, it)| writable(it))
            .map(|(id, it)| (*id, it))
            .collect();
        for (&id, it) in &items {
            let is_active = id == active;
            if is_active != (it.root.block.get() == 0) || (id == FS_SUBVOL_ID && active == 0) {
                self.report.problem(format!(
                    "subvolume {id}: root {} while subvolume {active} is active",
                    it.root.block.get()
                ));
            }
        }
        if active != 0 && !(items.contains_key(&active) && items.contains_key(&FS_SUBVOL_ID)) {
            self.report.problem(format!(
                "superblock: subvolume {active} active without its item and the file system's \
                     own tree parked"
            ));
        }
        let mut origins: Vec<_> = self.roots.origins.iter().map(|(a, b)| (*a, *b)).collect();
        origins.sort_unstable();
        for (id, (origin, g)) in origins {
            let snap = snaps.iter().find(|(i, it)| {
                *i == origin && !writable(it) && it.flags.get() & SUBVOL_DROPPING == 0
            });
            let named = snaps.iter().any(|(i, _)| *i == id);
            if !named || snap.is_none_or(|(_, it)| it.generation.get() != g) {
                self.report.problem(format!(
                    "subvolume {id}: origin snapshot {origin} of generation {g} does not exist \
                     as such, or the subvolume does not"
                ));
            }
        }
        // A writable snapshot's origin is deleted with its last use: one no tree names its
        // blocks through would keep them for ever.
        for (id, it) in snaps {
            let f = it.flags.get();
            let unused = !self.roots.origins.values().any(|o| o.0 == *id);
            if f & SUBVOL_HIDDEN != 0 && f & SUBVOL_DROPPING == 0 && unused {
                self.report.problem(format!(
                    "snapshot {id}: hidden (a writable snapshot's origin), but no subvolume's \
                     origin: its blocks would never come back"
                ));
            }
        }
    }

    /// The blocks writable trees name as their origins': owned by a writable tree or held,
    /// or else taken as the origin's, which no walk reached as its own (module notes).
    fn check_borrowed(&mut self) {
        for (s, n, whose) in std::mem::take(&mut self.roots.borrowed) {
            for b in s..s + n {
                match self.blocks.owners.get(&b) {
                    None => {
                        self.blocks.owners.insert(b, "origin's extent");
                    }
                    Some(
                        &("file extent" | "subvolume extent" | "held blocks" | "origin's extent"),
                    ) => {}
                    Some(other) => {
                        self.report
                            .problem(format!("{whose}: block {b} of its origin's is {other}"));
                        break;
                    }
                }
            }
        }
    }

    /// The checks of the module notes, after the fs, space and roots trees were walked.
    pub(super) fn check_snapshots(&mut self) {
        let gen = self.sb.generation.get();
        // Held runs are used blocks: claimed first, so a snapshot's extent finds them.
        let mut held = std::mem::take(&mut self.roots.held);
        held.sort_unstable();
        let mut end = 0;
        for &(s, n, _, _) in &held {
            if s < end {
                self.report
                    .problem(format!("held blocks at {s}: overlap the run before"));
            }
            end = end.max(s + n);
            self.claim(s, n, "held blocks");
        }
        let all = std::mem::take(&mut self.roots.snapshots);
        self.check_clones(&all);
        let (parked, snaps): (Vec<_>, Vec<_>) = all.into_iter().partition(|(_, it)| writable(it));
        // Writable trees first: they own blocks the snapshots then find owned.
        for (id, it) in &parked {
            if it.root.block.get() == 0 {
                continue; // the active one: the superblock's fs tree
            }
            // Parked by a commit before this one, or made empty by this one (its root
            // written with it: `Fs::make_subvolume`).
            if it.generation.get() > gen || it.root.generation.get() > it.generation.get() {
                self.report.problem(format!(
                    "subvolume {id}: parked at generation {} with root of generation {}, in an \
                     image of generation {gen}",
                    it.generation.get(),
                    it.root.generation.get()
                ));
                continue;
            }
            let floor = self.roots.origins.get(id).map_or(0, |o| o.1);
            self.walk_tree(*id, it, &held, Some(floor));
        }
        self.check_borrowed();
        for (id, it) in &snaps {
            if it.generation.get() >= gen || it.root.generation.get() > it.generation.get() {
                self.report.problem(format!(
                    "snapshot {id}: generation {} with root of generation {}, in an image of \
                     generation {gen}",
                    it.generation.get(),
                    it.root.generation.get()
                ));
                continue;
            }
            self.walk_tree(*id, it, &held, None);
        }
        let parked: Vec<_> = parked
            .into_iter()
            .filter(|(_, it)| it.root.block.get() != 0)
            .collect();
        self.check_snapshot_files(&parked);
        self.check_snapshot_files(&snaps);
        for &(s, n, born, released) in &held {
            let kept = snaps.iter().any(|(_, it)| {
                let g = it.generation.get();
                born <= g && g < released
            });
            if !kept {
                self.report.problem(format!(
                    "held blocks at {s}+{n} (born {born}, released {released}): no snapshot \
                     may name them, yet they are not free"
                ));
            }
        }
        let parents = std::mem::take(&mut self.roots.parents);
        let mut bad: Vec<(u64, String)> = Vec::new();
        for (&b, &n) in &parents {
            let kept = self.roots.counts.get(&b).copied().unwrap_or(1);
            if kept != n as u64 {
                bad.push((b, format!("node {b}: {n} pointers to it, counted {kept}")));
            }
        }
        for (&b, &kept) in &self.roots.counts {
            if !parents.contains_key(&b) {
                bad.push((
                    b,
                    format!("node {b}: counted {kept}, but nothing points at it"),
                ));
            }
        }
        bad.sort();
        for (_, p) in bad {
            self.report.problem(p);
        }
    }

    /// Each snapshot's tree checked as the fs tree is, as the file system it was at its
    /// commit: every item, link counts, both directory indexes and the back references,
    /// sizes, long xattrs, data sums (read with `--data`), shared-block counts and feature
    /// bits, against the inode counters it was made with. Not its blocks' accounting (they
    /// are shared: `walk_snapshot` did that). Each tree is walked whole, shared nodes again,
    /// so this costs a full pass per snapshot; one whose root a checked tree has (nothing
    /// changed between them) is skipped, and so is a deleted one (part of it is gone).
    fn check_snapshot_files(&mut self, snaps: &[(u64, SubvolumeItem)]) {
        let mut seen = std::collections::HashSet::from([self.sb.fs_root.block.get()]);
        for (id, it) in snaps {
            let dropping = it.flags.get() & idxfs_format::roots::SUBVOL_DROPPING != 0;
            if dropping || !seen.insert(it.root.block.get()) {
                continue;
            }
            for p in snapshot_problems(self.dev, &self.sb, self.hash, self.sums.verify, it) {
                self.report.problem(format!("snapshot {id}: {p}"));
            }
        }
    }

    /// Walks snapshot `id`'s tree, or parked writable tree `id`'s (`own`: its origin's
    /// generation, 0 for the file system's own), entering only nodes no tree walked before.
    fn walk_tree(
        &mut self,
        id: u64,
        it: &SubvolumeItem,
        held: &[(u64, u64, u64, u64)],
        own: Option<u64>,
    ) {
        let mut claimed = HashSet::new();
        let bpn = self.sb.blocks_per_node();
        let from = it.drop_key();
        let dropping = it.flags.get() & idxfs_format::roots::SUBVOL_DROPPING != 0;
        let sgen = it.generation.get();
        let root = &it.root;
        if !self.roots.parent(root.block.get()) {
            return;
        }
        let mut stack = vec![(
            root.block.get(),
            root.generation.get(),
            root.level.get() as u8,
            KeyRange::ANY,
        )];
        let name: Rc<str> = match own {
            Some(_) => format!("subvolume {id}").into(),
            None => format!("snapshot {id}").into(),
        };
        while let Some((block, g, level, range)) = stack.pop() {
            self.claim(block, bpn, "snapshot tree");
            let Some(node) = self.read_node(block, g, TREE_FS, level, range, &name) else {
                continue;
            };
            if node.is_leaf() {
                for (k, v) in node.keys.iter().zip(node.leaf_vals().iter()) {
                    if k.item_type() != Some(ItemType::Extent) {
                        continue;
                    }
                    match own {
                        Some(floor) => self.writable_extent(&name, floor, k, v, &mut claimed),
                        None => {
                            let floor = self.roots.origins.get(&id).map_or(0, |o| o.1);
                            self.snapshot_extent(id, sgen, floor, k, v, held)
                        }
                    }
                }
                continue;
            }
            let n = node.keys.len();
            for i in (0..n).rev() {
                let below = node.keys.get(i + 1).copied().or(range.below);
                if dropping && below.is_some_and(|b| b <= from) {
                    continue; // let go of by an earlier drop step
                }
                let p = node.ptrs()[i];
                if self.roots.parent(p.block) {
                    let r = KeyRange {
                        first: Some(node.keys[i]),
                        below,
                    };
                    stack.push((p.block, p.generation, level - 1, r));
                }
            }
        }
    }

    /// A parked writable tree's extent: blocks younger than `floor` are the tree's own,
    /// claimed once however many of its extents name them; older ones its origin's.
    fn writable_extent(
        &mut self,
        name: &Rc<str>,
        floor: u64,
        k: &Key,
        v: &[u8],
        claimed: &mut HashSet<u64>,
    ) {
        let e = match decode_extent(
            v,
            format_args!("{name} extent {k}"),
            self.sb.total_blocks.get(),
        ) {
            Ok((e, _)) => e,
            Err(e) => {
                self.report.problem(format!("{name}: {e}"));
                return;
            }
        };
        if e.kind == idxfs_format::items::EXTENT_INLINE {
            return;
        }
        let (s, n) = (e.disk_block.get(), e.blocks.get());
        if e.generation.get() <= floor {
            self.roots.borrowed.push((s, n, name.clone()));
            return;
        }
        for b in s..s + n {
            if claimed.insert(b) {
                self.claim(b, 1, "subvolume extent");
            }
        }
    }

    /// A snapshot's extent: its written blocks are the fs tree's or held for it; those as
    /// old as `floor` (a snapshot of a clone: its origin's generation) are its origin's,
    /// owned by a writable tree or held for the origin.
    fn snapshot_extent(
        &mut self,
        id: u64,
        sgen: u64,
        floor: u64,
        k: &Key,
        v: &[u8],
        held: &[(u64, u64, u64, u64)],
    ) {
        let e = match decode_extent(
            v,
            format_args!("snapshot {id} extent {k}"),
            self.sb.total_blocks.get(),
        ) {
            Ok((e, _)) => e,
            Err(e) => {
                self.report.problem(format!("snapshot {id}: {e}"));
                return;
            }
        };
        // A preallocated extent reads as zeros whatever its blocks hold: the fs tree may
        // have filled them, or let them go.
        if e.kind != EXTENT_REGULAR {
            return;
        }
        let (s, n) = (e.disk_block.get(), e.blocks.get());
        for b in s..s + n {
            let ok = match self.blocks.owners.get(&b) {
                Some(&("file extent" | "subvolume extent" | "origin's extent")) => true,
                Some(&"held blocks") => {
                    let i = held.partition_point(|h| h.0 <= b);
                    i > 0 && {
                        let (_, _, born, released) = held[i - 1];
                        e.generation.get() <= floor || (born <= sgen && sgen < released)
                    }
                }
                _ => false,
            };
            if !ok {
                self.report.problem(format!(
                    "snapshot {id} extent {k}: block {b} is neither the fs tree's nor held for \
                     the snapshot"
                ));
                return;
            }
        }
    }
}

/// Snapshot `it`'s tree checked as the fs tree is, as the file system it was at its commit
/// (`Checker::check_snapshot_files`): every problem found, none when it is whole. `data`:
/// read every block that has a data sum too.
pub(crate) fn snapshot_problems(
    dev: &dyn idxfs_blockdev::BlockDevice,
    sb: &idxfs_format::superblock::Superblock,
    hash: crate::fs::NameHash,
    data: bool,
    it: &SubvolumeItem,
) -> Vec<String> {
    let mut sb = *sb;
    sb.next_ino = it.next_ino;
    sb.inode_count = it.inode_count;
    let mut quiet = |_: u64| {};
    let mut sub = Checker::new(dev, sb, hash, data, Report::default(), &mut quiet);
    sub.walk(&it.root, TREE_FS, "fs tree");
    sub.cross_check();
    sub.check_chunks();
    sub.check_shared();
    sub.check_features();
    sub.report.problems
}
