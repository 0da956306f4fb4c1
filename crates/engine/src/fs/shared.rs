//! Data blocks that more than one file extent names, and how many (`SharedBlocks` items).
//!
//! A copy that shares (`clone.rs`, `copy_file_range`) makes a second extent name its source's
//! blocks instead of writing new ones. The count lives beside the extents, in the fs tree, as
//! XFS's reflink keeps it in a refcount btree: a run of blocks named by `refs` >= 2 extents
//! has an item keyed by its first block; a data block that no item covers is named by one
//! extent. So an image without sharing has no item at all, and a file system that never
//! shared pays nothing: every lookup here is skipped until the image has the feature bit
//! (`Inner::may_share`).
//!
//! Why counts per block run and not per extent: a write into the middle of a shared extent
//! replaces some of its blocks in one file only, so what stays shared is any sub-range.
//! Counting runs of blocks lets a file let go of exactly the blocks it no longer names, and
//! the last extent to let go of a block frees it, never earlier (btrfs instead keeps a whole
//! extent allocated while any part of it is named).
//!
//! Invariants (fsck checks them, `fsck.rs`): runs do not overlap; each has refs >= 2; every
//! block of a run is named by exactly `refs` regular extents; only regular extents of
//! copy-on-write files share (never preallocated ones, never a NOCOW file's: both are
//! written in place, `in_place.rs`, which must not change another file's bytes).
//!
//! The items are fs-tree items, so the fsync log carries them with the extents they count,
//! and a replay reads each block's count before and after (`crate::log`).
use super::Inner;
use crate::btree::Tree;
use crate::error::Result;
use idxfs_format::items::{decode_shared, SharedItem};
use idxfs_format::versions::INCOMPAT_SHARED_BLOCKS;
use idxfs_format::{ItemType, Key, SHARED_OBJECTID};
use zerocopy::IntoBytes;

/// Extents one freeing batch takes while blocks may be shared: each may change the counts
/// of its blocks (`release`), which the batch's reservation covers (`shared_nodes`).
pub(crate) const SHARED_FREE_BATCH: usize = 8;

pub(crate) fn shared_key(block: u64) -> Key {
    Key::new(SHARED_OBJECTID, ItemType::SharedBlocks, block)
}

/// A run of blocks and how many extents name each (1 where no item covers them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    pub start: u64,
    pub blocks: u64,
    pub refs: u64,
}

impl Run {
    fn end(&self) -> u64 {
        self.start + self.blocks
    }
}

impl Inner {
    /// Whether any block may be shared: the image has the feature, or this transaction
    /// shared one.
    pub(crate) fn may_share(&self) -> bool {
        (self.txn.sb.incompat.get() | self.txn.incompat_wanted) & INCOMPAT_SHARED_BLOCKS != 0
    }

    /// The items whose runs overlap blocks [start, end), in order.
    fn shared_items(&mut self, start: u64, end: u64) -> Result<Vec<Run>> {
        self.shared_items_in(self.fs_tree, start, end)
    }

    /// `shared_items` of `tree`, an fs tree (the file system's or a snapshot's).
    fn shared_items_in(&mut self, tree: Tree, start: u64, end: u64) -> Result<Vec<Run>> {
        let total = self.store.total_blocks;
        let mut out = Vec::new();
        // The run that starts before `start` may reach into the range.
        if start > 0 {
            if let Some((k, v)) =
                tree.last_at_or_before(&mut self.store, shared_key(0), shared_key(start - 1))?
            {
                let it = decode_shared(&v, k.offset, total)?;
                let r = Run {
                    start: k.offset,
                    blocks: it.blocks.get(),
                    refs: it.refs.get(),
                };
                if r.end() > start {
                    out.push(r);
                }
            }
        }
        let mut bad = None;
        tree.scan(
            &mut self.store,
            shared_key(start),
            shared_key(end),
            |k, v| {
                match decode_shared(v, k.offset, total) {
                    Ok(it) => out.push(Run {
                        start: k.offset,
                        blocks: it.blocks.get(),
                        refs: it.refs.get(),
                    }),
                    Err(e) => bad = Some(e),
                }
                Ok(bad.is_none())
            },
        )?;
        if let Some(e) = bad {
            return Err(e.into());
        }
        Ok(out)
    }

    /// Blocks [start, start + n) cut into runs of one count each (1 where no item says more).
    pub(crate) fn block_refs(&mut self, start: u64, n: u64) -> Result<Vec<Run>> {
        self.block_refs_in(self.fs_tree, start, n)
    }

    /// `block_refs` as `tree` counts them.
    pub(crate) fn block_refs_in(&mut self, tree: Tree, start: u64, n: u64) -> Result<Vec<Run>> {
        let items = if self.may_share() {
            self.shared_items_in(tree, start, start + n)?
        } else {
            Vec::new()
        };
        Ok(cut(start, start + n, &items))
    }

    /// Whether any of blocks [start, start + n) is named by another extent too.
    pub(crate) fn any_shared(&mut self, start: u64, n: u64) -> Result<bool> {
        Ok(self.may_share() && !self.shared_items(start, start + n)?.is_empty())
    }

    /// Adds `delta` (+1 or -1) to the count of every block of [start, start + n), rewriting
    /// the items there; returns the runs whose count fell to 0 (no extent names them now).
    fn add_refs(&mut self, start: u64, n: u64, delta: i64) -> Result<Vec<(u64, u64)>> {
        let end = start + n;
        let items = self.shared_items(start, end)?;
        // The items' parts outside the range keep their counts.
        let mut runs: Vec<Run> = Vec::new();
        if let Some(first) = items.first().filter(|r| r.start < start) {
            runs.push(Run {
                blocks: start - first.start,
                ..*first
            });
        }
        let mut zero = Vec::new();
        for r in cut(start, end, &items) {
            let refs = r.refs.checked_add_signed(delta).ok_or_else(|| {
                idxfs_format::Corrupt::new(
                    format!("references of blocks {}+{}", r.start, r.blocks),
                    format!("{} {delta:+}", r.refs),
                    ">= 0",
                )
            })?;
            if refs == 0 {
                zero.push((r.start, r.blocks));
            }
            runs.push(Run { refs, ..r });
        }
        if let Some(last) = items.last().filter(|r| r.end() > end) {
            runs.push(Run {
                start: end,
                blocks: last.end() - end,
                refs: last.refs,
            });
        }
        for r in &items {
            self.fs_tree.delete(&mut self.store, &shared_key(r.start))?;
        }
        // Neighbouring runs of one count become one item.
        let mut merged: Vec<Run> = Vec::new();
        for r in runs.into_iter().filter(|r| r.refs >= 2) {
            match merged.last_mut() {
                Some(m) if m.end() == r.start && m.refs == r.refs => m.blocks += r.blocks,
                _ => merged.push(r),
            }
        }
        for r in merged {
            let it = SharedItem {
                blocks: r.blocks.into(),
                refs: r.refs.into(),
            };
            self.fs_tree
                .put(&mut self.store, shared_key(r.start), it.as_bytes().to_vec())?;
        }
        Ok(zero)
    }

    /// One more extent names blocks [start, start + n) (a copy that shares them).
    pub(crate) fn share(&mut self, start: u64, n: u64) -> Result<()> {
        self.require_incompat(INCOMPAT_SHARED_BLOCKS);
        let zero = self.add_refs(start, n, 1)?;
        debug_assert!(zero.is_empty(), "a count went up to zero");
        Ok(())
    }

    /// An extent of `ino` no longer names blocks [start, start + n): those no other extent
    /// names are freed (`now`: reusable at once, see `Allocator::free_data`), or held while
    /// a snapshot may name them (`born`: the extent's generation, `snapshot`); the others'
    /// counts go down.
    pub(crate) fn release(&mut self, start: u64, n: u64, now: bool, born: u64) -> Result<()> {
        if !self.may_share() {
            return self.free_or_hold(start, n, now, born);
        }
        for (s, k) in self.add_refs(start, n, -1)? {
            self.free_or_hold(s, k, now, born)?;
        }
        Ok(())
    }

    /// Extents a freeing batch takes: fewer while blocks may be shared, whose counts each
    /// freed extent may change (`SHARED_FREE_BATCH`).
    pub(crate) fn free_batch_items(&self) -> usize {
        if self.may_share() {
            SHARED_FREE_BATCH
        } else {
            super::file::FREE_BATCH_ITEMS
        }
    }

    /// Worst-case nodes for changing the counts of `extents` extents' blocks (each extent's
    /// items sit at consecutive keys and span at most two leaves, plus the two runs a cut
    /// leaves): per extent, three leaves copied with their paths, a split and a merge. Zero
    /// while nothing may be shared.
    pub(crate) fn shared_nodes(&self, extents: u64) -> u64 {
        if !self.may_share() {
            return 0;
        }
        let path = self.fs_tree.level as u64 + 2;
        extents * (3 * path + 2)
    }
}

/// Blocks [start, end) cut into runs of one count each, from `items` (the items overlapping
/// the range, in order): their counts where they lie, 1 between them.
fn cut(start: u64, end: u64, items: &[Run]) -> Vec<Run> {
    let mut out = Vec::new();
    let mut at = start;
    for r in items {
        let (s, t) = (r.start.max(at), r.end().min(end));
        if s > at {
            out.push(Run {
                start: at,
                blocks: s - at,
                refs: 1,
            });
        }
        if t > s {
            out.push(Run {
                start: s,
                blocks: t - s,
                refs: r.refs,
            });
            at = t;
        }
    }
    if at < end {
        out.push(Run {
            start: at,
            blocks: end - at,
            refs: 1,
        });
    }
    out
}
