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
//! - every snapshot's tree is a whole file system of its own (`check_snapshot_files`).
use super::{Checker, Report};
use idxfs_format::items::{decode_extent, EXTENT_REGULAR};
use idxfs_format::node::KeyRange;
use idxfs_format::roots::{decode_held, decode_node_refs, decode_subvolume, SubvolumeItem};
use idxfs_format::{ItemType, Key, HELD_OBJECTID, NODE_REFS_OBJECTID, TREE_FS};
use std::collections::HashMap;

#[derive(Default)]
pub(super) struct RootsCheck {
    /// Pointers found to each fs-class node: root pointers and internal nodes' pointers.
    parents: HashMap<u64, u32>,
    snapshots: Vec<(u64, SubvolumeItem)>,
    counts: HashMap<u64, u64>,
    /// start -> (blocks, born, released)
    held: Vec<(u64, u64, u64, u64)>,
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
        let snaps = std::mem::take(&mut self.roots.snapshots);
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
            self.walk_snapshot(*id, it, &held);
        }
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

    /// Walks snapshot `id`'s tree, entering only nodes no tree walked before.
    fn walk_snapshot(&mut self, id: u64, it: &SubvolumeItem, held: &[(u64, u64, u64, u64)]) {
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
        let name = format!("snapshot {id}");
        while let Some((block, g, level, range)) = stack.pop() {
            self.claim(block, bpn, "snapshot tree");
            let Some(node) = self.read_node(block, g, TREE_FS, level, range, &name) else {
                continue;
            };
            if node.is_leaf() {
                for (k, v) in node.keys.iter().zip(node.leaf_vals().iter()) {
                    if k.item_type() == Some(ItemType::Extent) {
                        self.snapshot_extent(id, sgen, k, v, held);
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

    /// A snapshot's extent: its written blocks are the fs tree's or held for it.
    fn snapshot_extent(
        &mut self,
        id: u64,
        sgen: u64,
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
                Some(&"file extent") => true,
                Some(&"held blocks") => {
                    let i = held.partition_point(|h| h.0 <= b);
                    i > 0 && {
                        let (_, _, born, released) = held[i - 1];
                        born <= sgen && sgen < released
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
