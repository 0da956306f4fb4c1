//! Space reservations: what an operation may need, checked before its first change, and what
//! `statfs` may promise.
//!
//! Glossary:
//! - *item change*: one insert, delete or in-place change of an item at an arbitrary key. Its
//!   worst case copies a path, splits every level and grows a root: `item_nodes` nodes.
//! - *run*: items inserted at consecutive keys (the extents of one write, the chunks of one
//!   xattr). They share one copied path and fill the new leaves they open, so their cost
//!   follows their bytes (`run_nodes`), not their count.
//! - *global reserve*: free blocks creates and writes leave alone, so that deletes (which may
//!   use them) can always empty a full file system.
//! - *root reserve*: 1% of the device more that growing operations of an unprivileged caller
//!   leave alone (`crate::caller`), as ext4 keeps blocks for root: a user who fills the
//!   device does not stop root from writing.
//! - *commit need*: what the next commit may still allocate: the copied paths of dirty inodes
//!   (at most `INODE_WRITEBACK` of them: past that, cached inode changes go into the tree
//!   after the operation), the orphan items it writes, and every node of the space tree
//!   (which holds a fixed-size item pair per block group, so its shape never changes after
//!   mkfs: a commit copies each of its nodes at most once, however many groups an operation
//!   dirtied).
//! - *node slot*: `blocks_per_node` contiguous free blocks, what a node needs. Free blocks
//!   alone do not promise nodes (free space cut into single blocks holds none), so a
//!   reservation takes the slots its operation and the next commit may need into the
//!   store's pool (`btree::pools::NodePools`), and every node allocation draws from there: once an
//!   operation has changed something, no allocation can fail. Growing operations first set
//!   a few slots aside that only deletes may take (`NodePools::reserve`).
//!
//! A reservation checks the blocks outside the pools (the operation's data, the slots it
//! still lacks, and for growing operations the global reserve's rest) and then takes the
//! slots. When either fails and the running transaction has freed blocks (pinned until it
//! commits), it commits and tries again.
//!
//! `statfs` answers with the same arithmetic: available = free (counting what the next
//! commit releases and what the pools hold) - global reserve - root reserve - the commit's
//! fixed need - the metadata margin of one large operation (with, once blocks may be shared,
//! the count changes it may make) - the share of the rest that data sums take when it is
//! written (about 0.4%: a group item per 256 KiB, in leaves at least half full, and their
//! copies until the commit). So an unprivileged `fallocate` or
//! write of what `df` says is available succeeds (root may go on into the root reserve); a
//! fallocate, which takes no sums, leaves that share available after it.
//! Free space cut into single blocks is the exception: it holds data, but no node slots.
use super::{Inner, Reserve};
use crate::counters::Counters;
use crate::error::{Error, Result};
use idxfs_format::items::{BLOCK_SUMS_MAX, SUM_GROUP_BLOCKS};
use idxfs_format::node::{internal_capacity, leaf_capacity, ITEM_HEADER_SIZE};
use idxfs_format::BLOCK_SIZE;

/// Bytes of an extent item in a leaf.
const EXTENT_BYTES: u64 = (idxfs_format::items::EXTENT_ITEM_SIZE + ITEM_HEADER_SIZE) as u64;
/// Item changes the margin of `statfs` covers besides a run: more than the largest single
/// operation (a 1 MiB write over a few old extents, a fallocate) changes.
const MARGIN_ITEMS: u64 = 8;
/// Item changes the largest reservation of a delete covers (an unlink's is 6): a hole
/// punch's or a truncate's, whose edges each rewrite a partial block (its extents and data
/// sum) and cut an extent and a group of sums, then the size and the first batch (a leaf of
/// extents, a leaf of sums).
pub(crate) const DELETE_ITEMS: u64 = 20;
/// Largest write request a front end sends (FUSE's max_write), for the margin.
const MARGIN_WRITE_BYTES: u64 = 1 << 20;

/// What the blocks of a file system are, as `statfs` reports them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SpaceReport {
    pub free: u64,
    /// What an unprivileged caller can get (statfs's f_bavail).
    pub avail: u64,
}

impl Inner {
    pub(super) fn bpn(&self) -> u64 {
        self.store.blocks_per_node()
    }

    /// Worst-case nodes one item change at an arbitrary key allocates: a copied path, a split
    /// at every level, a new root, and one level of growth on top.
    pub(crate) fn item_nodes(&self) -> u64 {
        2 * (self.fs_tree.level as u64 + 2) + 1
    }

    /// Worst-case nodes for `items` items of `bytes` (headers included) inserted at
    /// consecutive keys: one copied path, new leaves filled at least half (a half split) or
    /// from empty (an append split), and their pointers in new internal nodes up to a new
    /// root.
    pub(crate) fn run_nodes(&self, items: u64, bytes: u64) -> u64 {
        run_nodes_at(self.fs_tree.level, self.store.node_size, items, bytes)
    }

    /// Blocks kept for deletes, so a full file system can always be emptied: 0.5% of the
    /// device and 16 nodes, but never less than the largest reservation a delete makes when
    /// the pools are empty (on a device of a few MiB, the share alone is less).
    pub fn global_reserve(&self) -> u64 {
        let share = 16 * self.bpn() + self.store.total_blocks / 200;
        share.max(self.delete_need())
    }

    /// Blocks the largest reservation of a delete takes from free space (a truncate's: its
    /// `DELETE_ITEMS` item changes, two data blocks, and the commit after them).
    /// Counted for a tree one level taller than now: growth that fills the device may
    /// also add a level, and a delete must still fit then.
    fn delete_need(&self) -> u64 {
        let later = self.commit_need().div_ceil(self.bpn()) + 4 * (self.fs_tree.level as u64 + 2);
        let shared = self.shared_nodes(super::shared::SHARED_FREE_BATCH as u64 + 2);
        (DELETE_ITEMS * (self.item_nodes() + 2) + shared + later) * self.bpn() + 2
    }

    /// Blocks only privileged callers may grow into.
    pub fn root_reserve(&self) -> u64 {
        self.store.total_blocks / 100
    }

    /// Blocks every commit may need whatever changed: each space tree node copied once, and
    /// the next transaction's first log block.
    fn commit_base(&self) -> u64 {
        (self.txn.space_nodes + 2) * self.bpn() + 1
    }

    /// What the commit needs for the roots tree (`snapshot`): its nodes copied and what
    /// this transaction's changes add.
    fn commit_roots(&self) -> u64 {
        self.roots_commit_need() * self.bpn()
    }

    /// Worst case blocks the commit of the running transaction still needs.
    pub(crate) fn commit_need(&self) -> u64 {
        let bpn = self.bpn();
        // A dirty inode's item changes in place: a copied path, no split.
        let inodes = self.inodes.dirty_count() as u64 * (self.fs_tree.level as u64 + 1) * bpn;
        let n = self.lives.orphans.pending_len() as u64;
        let orphans = self.run_nodes(n, n * (ITEM_HEADER_SIZE as u64 + 1)) * bpn;
        inodes + orphans + self.commit_base() + self.commit_roots() + self.others_commit_need()
    }

    /// Refuses with NoSpace unless `items` item changes (and the commit after them) fit.
    pub fn reserve(&mut self, items: u64, kind: Reserve) -> Result<()> {
        self.reserve_blocks(items, 0, kind)
    }

    /// `reserve` for `items` item changes and `data_blocks` of data.
    pub fn reserve_blocks(&mut self, items: u64, data_blocks: u64, kind: Reserve) -> Result<()> {
        let nodes = items * self.item_nodes();
        self.reserve_nodes(nodes, data_blocks, kind)
    }

    /// A write of `len` bytes over `touched` existing extents. Every item it changes is an
    /// extent of one inode between the extent before the range and the one after it (the
    /// inode item changes in the cache, at commit), so the nodes it can allocate are: copies
    /// of the leaves holding those extents (at most one per extent: `touched` and the two
    /// neighbours) with their paths; a merge into a sibling, cascading up, for each item
    /// removed (`touched`, one cut edge, the merged neighbour); and the leaves its new
    /// extents open, as one run (one per block at worst, however free space is cut up, plus
    /// a cut tail and the inline bytes moving out). Data: its blocks, one more for inline
    /// bytes moving out, one for a partial block.
    pub(crate) fn reserve_write(&mut self, len: u64, touched: u64) -> Result<()> {
        let data = len.div_ceil(BLOCK_SIZE) + 2;
        self.reserve_nodes(self.write_nodes(len, touched), data, Reserve::Grow)
    }

    /// The nodes of `reserve_write`: what linking a write's blocks may allocate, for a write
    /// whose data blocks are already claimed (`data_io`).
    pub(crate) fn write_nodes(&self, len: u64, touched: u64) -> u64 {
        let data = len.div_ceil(BLOCK_SIZE) + 2;
        let path = self.fs_tree.level as u64 + 1;
        let copies = (touched + 2) * path;
        let merges = (touched + 2) * path;
        copies
            + merges
            + self.run_nodes(data + 2, (data + 2) * EXTENT_BYTES)
            + self.sum_nodes(data)
            + self.shared_nodes(touched + 2)
    }

    /// The nodes of changing the data sums of `blocks` consecutive file blocks
    /// (`data_sum`): their group items sit at consecutive keys of one inode, so one run of
    /// puts of at most `BLOCK_SUMS_MAX` bytes each, and a copy and a merge, with their paths,
    /// of each leaf holding the old ones (at least half full, so few).
    pub(crate) fn sum_nodes(&self, blocks: u64) -> u64 {
        let items = blocks / SUM_GROUP_BLOCKS + 2;
        let bytes = items * (BLOCK_SUMS_MAX + ITEM_HEADER_SIZE) as u64;
        let path = self.fs_tree.level as u64 + 1;
        let leaves = (2 * bytes).div_ceil(leaf_capacity(self.store.node_size) as u64) + 1;
        2 * leaves * path + self.run_nodes(items, bytes)
    }

    /// The nodes of converting `converts` preallocated extents among `touched` extents of
    /// one file in place (`in_place`): each conversion puts or deletes its extent and
    /// inserts at most two (the converted part, the preallocated tail), at consecutive keys;
    /// so `write_nodes` with two new items a conversion instead of one a block.
    pub(crate) fn convert_nodes(&self, touched: u64, converts: u64) -> u64 {
        if converts == 0 {
            return 0;
        }
        let path = self.fs_tree.level as u64 + 1;
        let items = 2 * converts + 2;
        2 * (touched + 2) * path + self.run_nodes(items, items * EXTENT_BYTES)
    }

    /// Refuses with NoSpace unless `nodes` new nodes and `data_blocks` of data (and the commit
    /// after them) fit; commits first when that frees what is missing. The nodes are taken
    /// as slots into the store's pool (with the commit's, and those of the inodes an
    /// operation may dirty): a node needs contiguous blocks, which free space cut into
    /// single blocks does not offer, so only slots in hand promise that no allocation fails
    /// after the operation's first change.
    pub(crate) fn reserve_nodes(
        &mut self,
        nodes: u64,
        data_blocks: u64,
        kind: Reserve,
    ) -> Result<()> {
        self.op.nodes = self.op.nodes.max(nodes);
        // Any operation may let go of the blocks of a freeing batch's extents and two cut
        // ones; while blocks may be shared, each changes counts (`shared`).
        let nodes = nodes + self.shared_nodes(super::shared::SHARED_FREE_BATCH as u64 + 2);
        // And, beside snapshots, the roots-tree items its changes add (`snapshot`).
        let nodes = nodes + self.roots_op_need();
        if self.space_fits(nodes, data_blocks, kind) {
            return Ok(());
        }
        // Blocks freed by this transaction come back once it commits.
        if self.store.alloc.pinned_blocks() > 0 || self.trees_changed() {
            self.commit()?;
            if self.space_fits(nodes, data_blocks, kind) {
                return Ok(());
            }
        }
        Counters::inc(&self.store.counters.enospc);
        Err(Error::NoSpace)
    }

    /// Whether the operation fits: its node slots (with the next commit's, and for a growing
    /// operation the slots set aside for deletes) are taken into the pools, and the blocks
    /// left outside them hold its data and, for a growing operation, the rest of the global
    /// reserve (and the root reserve, for an unprivileged caller). A shrinking operation may
    /// take the slots set aside for deletes.
    fn space_fits(&mut self, nodes: u64, data_blocks: u64, kind: Reserve) -> bool {
        let bpn = self.bpn();
        // An operation dirties at most four inodes (a rename's two directories and two
        // inodes), each a copied path at the commit.
        let later = self.commit_need().div_ceil(bpn) + 4 * (self.fs_tree.level as u64 + 1);
        let want = nodes + later;
        let grow = kind == Reserve::Grow;
        let aside = if grow { self.reserve_slots() } else { 0 };
        let have = self.store.pools.nodes.len() as u64
            + if grow {
                0
            } else {
                self.store.pools.reserve.len() as u64
            };
        let new_slots =
            want.saturating_sub(have) + aside.saturating_sub(self.store.pools.reserve.len() as u64);
        let keep_free = match kind {
            Reserve::Shrink => 0,
            Reserve::Grow => {
                let rest = self.global_reserve().saturating_sub(aside * bpn);
                if crate::caller::privileged() {
                    rest
                } else {
                    rest + self.root_reserve()
                }
            }
        };
        if self.store.alloc.free_blocks() < new_slots * bpn + data_blocks + keep_free {
            return false;
        }
        self.store
            .fill_node_pool(want as usize, aside as usize, kind == Reserve::Shrink)
    }

    /// Node slots growth leaves for deletes (part of the global reserve): the largest
    /// reservation a delete makes (`delete_need`), so that a full device whose free blocks
    /// are cut into pieces smaller than a node still takes a truncate, a hole punch or an
    /// unlink; never more than the global reserve holds.
    fn reserve_slots(&self) -> u64 {
        let want = (self.delete_need() - 2).div_ceil(self.bpn());
        want.min(self.global_reserve() / self.bpn())
    }

    /// Free and available blocks for `statfs`. Free counts the blocks the next commit
    /// releases (a reservation that needs them commits first); available leaves out the
    /// global reserve, the commit's fixed need and the margin of one large operation, so
    /// that one `fallocate` (or a run of writes) of what it says succeeds; for an
    /// unprivileged caller it leaves out the root reserve too.
    pub(crate) fn space_report(&self) -> SpaceReport {
        let free = self.store.alloc.free_blocks()
            + self.store.alloc.pinned_blocks()
            + self.store.node_pool_blocks();
        let blocks = MARGIN_WRITE_BYTES / BLOCK_SIZE + 2;
        // Once blocks may be shared, every reservation also covers the count changes of a
        // freeing batch (`reserve_nodes`), and a write those of the extents it replaces.
        let shared = self.shared_nodes(super::shared::SHARED_FREE_BATCH as u64 + 2 + MARGIN_ITEMS);
        let margin = (self.run_nodes(blocks, blocks * EXTENT_BYTES)
            + self.sum_nodes(blocks)
            + MARGIN_ITEMS * self.item_nodes()
            + shared)
            * self.bpn();
        let roots = self.commit_roots() + self.roots_op_need() * self.bpn();
        let hidden = self.global_reserve() + self.commit_base() + roots + margin;
        let avail = free.saturating_sub(hidden + self.root_reserve());
        // Data written with sums takes metadata in proportion: a full group item per
        // `SUM_GROUP_BLOCKS` blocks, in leaves at least half full, which a write copies
        // (the old copy pinned until the commit): twice that again.
        let per_group = 4 * (BLOCK_SUMS_MAX + ITEM_HEADER_SIZE) as u64;
        let sums = match self.policy.datasum {
            true => (avail * per_group).div_ceil(SUM_GROUP_BLOCKS * BLOCK_SIZE + per_group),
            false => 0,
        };
        SpaceReport {
            free,
            avail: avail - sums,
        }
    }
}

/// `Inner::run_nodes` in a tree of `level` with nodes of `ns` bytes.
pub(crate) fn run_nodes_at(level: u8, ns: u32, items: u64, bytes: u64) -> u64 {
    if items == 0 {
        return 0;
    }
    let level = level as u64;
    let leaves = (2 * bytes).div_ceil(leaf_capacity(ns) as u64) + 1;
    let per_internal = (internal_capacity(ns) as u64 / 2).max(2);
    let mut nodes = (level + 1) + leaves;
    let mut below = leaves;
    for _ in 0..=level {
        let up = below.div_ceil(per_internal) + 1;
        nodes += up;
        below = up;
    }
    nodes + 1
}
