//! Rolling the file system back to one of its snapshots (`Fs::rollback`), as `zfs rollback`
//! does: the file system's tree becomes snapshot `S`'s (made at commit `g`), so every change
//! made since is gone,
//! while the snapshot and every other one stay as they are (later ones included, unlike
//! ZFS). What it costs follows what changed since the snapshot, not what the file system
//! holds, and one commit makes it durable: a crash before that commit leaves the file system
//! as it was, after it rolled back.
//!
//! **Which nodes differ.** The two trees share every node neither changed since the
//! snapshot was made (and, after earlier rollbacks, whatever else they have in common): a node
//! both point to is the same subtree in both. `Tree::own_leaves` walks both a level at a
//! time and leaves out the nodes both have, so it reads only what differs and the paths to
//! it. The leaves it reaches are each tree's *own*.
//!
//! **Which data blocks change hands.** Only blocks the own leaves name can. Each tree counts
//! the extents naming each shared block (`SharedBlocks`, in the tree: `shared`), so a block
//! named `c` times in one tree's own leaves, whose count there is `n`, is named `n - c` times
//! in the leaves both trees have: named by the other tree too exactly when the other's own
//! leaves name it or `n > c`. Then:
//! - a block the fs tree names and `S` does not is let go of as any the fs tree lets go of
//!   (`free_or_hold`: freed, or held while another snapshot may name it), with the
//!   generation of the extent that named it;
//! - a block `S` names and the fs tree does not was let go of after `S` was made, so it is
//!   held (its window holds `g`); it leaves its held run (`unhold`) and the tree names it
//!   again, as a restore's blocks do. One that is not held is damage, and the rollback
//!   stops before its first change.
//! - in a clone, blocks of extents as old as its origin are the origin's (`clones`): the
//!   clone never lets go of them (`free_or_hold` does nothing), and one the snapshot names
//!   that the clone does not any more is named again as it was, by the origin's generation,
//!   and stays where it is: the origin names it, and it is the business of the tree the
//!   origin was taken of whether it is held.
//!
//! **Preallocated extents.** The file system fills a preallocated block it names in place,
//! even when a snapshot names it (`in_place`): such a snapshot names it preallocated too,
//! and reads zeros whatever the block holds, because a file system only ever turns a
//! preallocated block into a written one, never back. A rollback would break that: the
//! snapshot's preallocated block may be one the file system wrote after it, which a later
//! snapshot names as written. So a preallocated extent in the snapshot's own leaves that
//! another snapshot may name (one as new as the extent) gets new blocks in the rolled-back
//! tree, taken before the first change; the old ones stay with the snapshots (held).
//!
//! **The tree.** The file system's root becomes `S`'s (one more count on it, `Tree::share`),
//! and the old tree is dropped at once as a deleted snapshot's is (`Tree::drop_some`): a
//! node another tree shares loses a count, the rest are freed. Its data needs nothing more,
//! settled above. The inode count becomes `S`'s; the next inode number stays the larger of
//! the two, so no number names two different files across the rollback.
//!
//! The `Fs` is consumed: every cache of the old tree (inodes, published reads, pins) goes
//! with it, and the image is opened again for use. A kernel's caches would be as stale, so
//! the command line refuses a mounted image.
use super::snapshot::Snap;
use super::Reserve;
use super::{Fs, Inner};
use crate::btree::Node;
use crate::error::{Error, Result};
use crate::inode_cache::InodeCache;
use crate::space::Kind;
use idxfs_format::items::{decode_extent, ExtentItem, EXTENT_INLINE, EXTENT_PREALLOC};
use idxfs_format::{Corrupt, ItemType, Key, BLOCK_SIZE};
use std::collections::HashSet;
use zerocopy::IntoBytes;

/// Nodes of the old tree each drop step takes: the whole drop is done before the commit.
const DROP_STEP: usize = 4096;

/// What a rollback did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RolledBack {
    /// Nodes read: those of either tree the other does not have, and the paths to them.
    pub nodes_walked: u64,
    /// Data blocks the file system let go of (named only since the snapshot): freed, or
    /// held for other snapshots.
    pub blocks_released: u64,
    /// Data blocks it names again (let go of since the snapshot, held for it until now).
    pub blocks_taken_back: u64,
    /// Preallocated blocks given new places (module docs, "Preallocated extents").
    pub blocks_moved: u64,
}

/// Blocks one extent of an own leaf names.
#[derive(Debug, Clone, Copy)]
struct Piece {
    start: u64,
    blocks: u64,
    /// The extent's generation.
    born: u64,
    /// In the file system's own leaves (else the snapshot's).
    old: bool,
    /// A preallocated extent of the snapshot's that the rolled-back tree gets new blocks
    /// for: it does not name these.
    moved: bool,
}

/// A run of blocks the own leaves name the same number of times.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: u64,
    blocks: u64,
    /// Names in the file system's own leaves and in the snapshot's, and how many of the
    /// latter are moved.
    in_old: u64,
    in_snap: u64,
    moved: u64,
    /// The oldest generation among the file system's extents naming it.
    born: u64,
    /// The oldest and newest among the snapshot's (0 and 0 when none does).
    snap_born: (u64, u64),
}

impl Fs {
    /// Rolls the file system back to snapshot `id` (module docs) and closes it. Err with
    /// nothing changed when the snapshot does not exist, is being deleted, or the file system
    /// cannot change or lacks the space for the moved preallocated blocks; after a device
    /// error or damage met midway, the file system stops writing and the image keeps its
    /// state from before.
    pub fn rollback(mut self, id: u64) -> Result<RolledBack> {
        if self.hand.secondary {
            return Err(Error::Busy("a subvolume opened beside the file system"));
        }
        if !self.lock().trees.alone() {
            return Err(Error::Busy("subvolumes are open beside the file system"));
        }
        self.stop_committer();
        self.release_all()?;
        let mut g = self.lock();
        g.writable()?;
        if !g.trees.alone() {
            return Err(Error::Busy("subvolumes are open beside the file system"));
        }
        if !g.in_place.is_empty() {
            return Err(Error::Busy("writes are in flight"));
        }
        // Everything before is committed: the caches hold nothing the trees lack.
        g.commit()?;
        let snap = (g.snapshots.list.get(&id))
            .filter(|s| !s.dropping() && !s.hidden())
            .cloned()
            .ok_or(Error::NotFound)?;
        // A snapshot's blocks may be another writable tree's own (`clones`).
        if !g.snapshots.clones.may_take_from(Some((id, &snap))) {
            return Err(Error::NotSupported(
                "a rollback to a snapshot of another subvolume (not this one's, nor its \
                 origin), beside other writable subvolumes",
            ));
        }
        let (report, settle) = g.rollback_plan(id, &snap)?;
        let places = g.take_places(&settle.moves, snap.tree().level)?;
        match g.roll_back(&snap, &settle, &places) {
            Ok(()) => {
                g.commit()?;
                Ok(report)
            }
            Err(e) => {
                // Some blocks may have changed hands already: half done.
                g.fail(format!("rolling back to snapshot {id}: {e}"));
                Err(e)
            }
        }
    }
}

/// What a rollback changes of the data blocks, found before it changes anything.
struct Settle {
    /// (start, blocks, born): named by the file system only.
    release: Vec<(u64, u64, u64)>,
    /// (start, blocks, 0): named by the rolled-back tree only.
    take_back: Vec<(u64, u64, u64)>,
    /// The snapshot's preallocated extents the rolled-back tree gets new blocks for.
    moves: Vec<(Key, ExtentItem)>,
}

impl Inner {
    /// Walks both trees' own nodes and finds what changes hands (module docs), changing
    /// nothing.
    fn rollback_plan(&mut self, id: u64, snap: &Snap) -> Result<(RolledBack, Settle)> {
        let (old, new) = (self.fs_tree, snap.tree());
        let total = self.store.total_blocks;
        let mut pieces = Vec::new();
        let mut prealloc = Vec::new();
        let nodes_walked = old.own_leaves(&new, &mut self.store, |in_old, leaf| {
            extents_of(leaf, in_old, total, &mut pieces, &mut prealloc)
        })?;
        // A preallocated extent another snapshot may name (module docs).
        let others = |born: u64| {
            (self.snapshots.list.iter()).any(|(&i, s)| i != id && s.generation() >= born)
        };
        let moves: Vec<(Key, ExtentItem)> = (prealloc.into_iter())
            .filter(|(_, e)| others(e.generation.get()))
            .collect();
        let moved: HashSet<u64> = moves.iter().map(|(_, e)| e.disk_block.get()).collect();
        for p in pieces.iter_mut().filter(|p| !p.old) {
            p.moved = moved.contains(&p.start);
        }
        let mut settle = Settle {
            release: Vec::new(),
            take_back: Vec::new(),
            moves,
        };
        for s in spans(pieces) {
            let (tree, own) = match s.in_old {
                0 => (new, s.in_snap),
                n => (old, n),
            };
            for r in self.block_refs_in(tree, s.start, s.blocks)? {
                // Names in the leaves both trees have.
                let both = r.refs.checked_sub(own).ok_or_else(|| {
                    Corrupt::new(
                        format!("extents naming data blocks {}+{}", r.start, r.blocks),
                        r.refs,
                        format!(">= {own}, the extents found naming them"),
                    )
                })?;
                let was = s.in_old > 0 || both > 0;
                let will = s.in_snap > s.moved || both > 0;
                if was && !will {
                    push_run(&mut settle.release, (r.start, r.blocks, s.born));
                } else if will && !was && !self.origins_blocks(&s)? {
                    push_run(&mut settle.take_back, (r.start, r.blocks, 0));
                }
            }
        }
        let report = RolledBack {
            nodes_walked,
            blocks_released: settle.release.iter().map(|r| r.1).sum(),
            blocks_taken_back: settle.take_back.iter().map(|r| r.1).sum(),
            blocks_moved: settle.moves.iter().map(|(_, e)| e.blocks.get()).sum(),
        };
        // Every block to take back must be held: checked before the first change.
        for &(start, blocks, _) in &settle.take_back {
            let held = self.snapshots.held_within(start, blocks);
            if held != blocks {
                return Err(Corrupt::new(
                    format!("data blocks {start}+{blocks} the snapshot names"),
                    format!("{held} of them held"),
                    "all held (the file system let go of them after the snapshot)",
                )
                .into());
            }
        }
        Ok((report, settle))
    }

    /// Whether span `s`, which the snapshot names, is the blocks of the active clone's
    /// origin (`clones`): the rolled-back tree names them again as the origin's, and they
    /// stay where they are, named by the origin, whoever else names or holds them. Extents
    /// naming one block lie on one side of the origin's generation; both is damage.
    fn origins_blocks(&self, s: &Span) -> Result<bool> {
        let clones = &self.snapshots.clones;
        let (lo, hi) = s.snap_born;
        match (clones.of_origin(lo), clones.of_origin(hi)) {
            (a, b) if a == b => Ok(a),
            _ => Err(Corrupt::new(
                format!(
                    "generations of the snapshot's extents naming data blocks {}+{}",
                    s.start, s.blocks
                ),
                format!("{lo} to {hi}"),
                "all as old as the clone's origin or all younger",
            )
            .into()),
        }
    }

    /// New blocks for each moved extent, as runs, and the nodes its items need: all taken
    /// before the first change, so that ENOSPC changes nothing. `level`: the rolled-back
    /// tree's height.
    fn take_places(
        &mut self,
        moves: &[(Key, ExtentItem)],
        level: u8,
    ) -> Result<Vec<Vec<(u64, u64)>>> {
        if moves.is_empty() {
            return Ok(Vec::new());
        }
        let blocks: u64 = moves.iter().map(|(_, e)| e.blocks.get()).sum();
        // Per item deleted or inserted, a copied path with a split at every level.
        let per_item = 2 * (level.max(self.fs_tree.level) as u64 + 2) + 1;
        let items = moves.len() as u64 * 2 + blocks.min(moves.len() as u64 * 64);
        self.reserve_nodes(per_item * items, blocks, Reserve::Grow)?;
        let mut places = Vec::with_capacity(moves.len());
        for (_, e) in moves {
            let mut runs = Vec::new();
            let mut left = e.blocks.get();
            while left > 0 {
                let Some((d, n)) = self.store.alloc.alloc(1, left, Kind::Data) else {
                    for &(d, n) in places.iter().flatten().chain(&runs) {
                        // Just allocated here: freeing cannot fail.
                        let _ = self.store.alloc.free(d, n, true);
                    }
                    return Err(Error::NoSpace);
                };
                runs.push((d, n));
                left -= n;
            }
            places.push(runs);
        }
        Ok(places)
    }

    /// Carries out `settle`, makes the snapshot's tree the file system's, gives the moved
    /// extents their `places`, and drops the old tree.
    fn roll_back(
        &mut self,
        snap: &Snap,
        settle: &Settle,
        places: &[Vec<(u64, u64)>],
    ) -> Result<()> {
        let old = self.fs_tree;
        let group = self.store.alloc.group_blocks;
        for &(start, blocks, born) in &settle.release {
            // Runs joined in the plan may cross a group; a free or a held run may not.
            let mut at = start;
            while at < start + blocks {
                let n = (start + blocks).min((at / group + 1) * group) - at;
                self.free_or_hold(at, n, false, born)?;
                at += n;
            }
        }
        for &(start, blocks, _) in &settle.take_back {
            self.unhold(start, blocks)?;
        }
        self.fs_tree = snap.tree().share(&mut self.store);
        let generation = self.store.generation;
        for ((key, e), runs) in settle.moves.iter().zip(places) {
            self.fs_tree.delete(&mut self.store, key)?;
            let mut at = key.offset;
            for &(d, n) in runs {
                let ext = ExtentItem {
                    kind: EXTENT_PREALLOC,
                    reserved: [0; 7],
                    // New blocks, in no snapshot.
                    generation: generation.into(),
                    disk_block: d.into(),
                    blocks: n.into(),
                };
                debug_assert_eq!(e.kind, EXTENT_PREALLOC);
                let k = Key::new(key.objectid, ItemType::Extent, at);
                self.fs_tree
                    .insert(&mut self.store, k, ext.as_bytes().to_vec())?;
                at += n * BLOCK_SIZE;
            }
        }
        let mut from = Key::MIN;
        let mut leaves = Vec::new();
        while let Some(k) = old.drop_some(&mut self.store, from, DROP_STEP, &mut leaves)? {
            leaves.clear();
            from = k;
        }
        self.txn.next_ino = self.txn.next_ino.max(snap.item.next_ino.get());
        self.txn.inode_count = snap.item.inode_count.get();
        // The cache was clean (committed) and is the old tree's: emptied.
        self.inodes = InodeCache::new(self.inodes.limit());
        self.dir_ino_hint = Default::default();
        self.store.changes.mod_seq += 1;
        self.txn.changed = true;
        Ok(())
    }
}

/// The blocks `leaf`'s extents name, onto `out`; the snapshot's preallocated extents also
/// onto `prealloc`.
fn extents_of(
    leaf: &Node,
    old: bool,
    total: u64,
    out: &mut Vec<Piece>,
    prealloc: &mut Vec<(Key, ExtentItem)>,
) -> Result<()> {
    let vals = leaf.leaf_vals();
    for (i, k) in leaf.keys.iter().enumerate() {
        if k.item_type() != Some(ItemType::Extent) {
            continue;
        }
        let (e, _) = decode_extent(vals.get(i), k, total)?;
        if e.kind == EXTENT_INLINE {
            continue;
        }
        out.push(Piece {
            start: e.disk_block.get(),
            blocks: e.blocks.get(),
            born: e.generation.get(),
            old,
            moved: false,
        });
        if !old && e.kind == EXTENT_PREALLOC {
            prealloc.push((*k, e));
        }
    }
    Ok(())
}

/// `pieces` cut where any of them starts or ends, each run with how many pieces of each
/// tree name it; runs no piece names are left out. In block order.
fn spans(mut pieces: Vec<Piece>) -> Vec<Span> {
    let mut edges: Vec<u64> = pieces
        .iter()
        .flat_map(|p| [p.start, p.start + p.blocks])
        .collect();
    edges.sort_unstable();
    edges.dedup();
    pieces.sort_unstable_by_key(|p| p.start);
    let (mut active, mut next, mut out) = (Vec::<Piece>::new(), 0, Vec::<Span>::new());
    for w in edges.windows(2) {
        let (a, b) = (w[0], w[1]);
        active.retain(|p| p.start + p.blocks > a);
        while let Some(p) = pieces.get(next).filter(|p| p.start <= a) {
            active.push(*p);
            next += 1;
        }
        if active.is_empty() {
            continue;
        }
        let count = |f: &dyn Fn(&Piece) -> bool| active.iter().filter(|p| f(p)).count() as u64;
        let in_old = count(&|p| p.old);
        let born = (active.iter().filter(|p| p.old))
            .map(|p| p.born)
            .min()
            .unwrap_or(0);
        let snap_born = (active.iter().filter(|p| !p.old)).fold(None, |r, p| match r {
            None => Some((p.born, p.born)),
            Some((lo, hi)) => Some((p.born.min(lo), p.born.max(hi))),
        });
        out.push(Span {
            start: a,
            blocks: b - a,
            in_old,
            in_snap: active.len() as u64 - in_old,
            moved: count(&|p| p.moved),
            born,
            snap_born: snap_born.unwrap_or((0, 0)),
        });
    }
    out
}

/// Appends a run, joined to the last when it continues it with the same generation.
fn push_run(runs: &mut Vec<(u64, u64, u64)>, r: (u64, u64, u64)) {
    match runs.last_mut() {
        Some(l) if l.0 + l.1 == r.0 && l.2 == r.2 => l.1 += r.1,
        _ => runs.push(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(start: u64, blocks: u64, born: u64, old: bool) -> Piece {
        Piece {
            start,
            blocks,
            born,
            old,
            moved: !old && start == 40,
        }
    }

    #[test]
    fn spans_count_each_tree_per_run() {
        let s = spans(vec![
            piece(10, 10, 5, true),
            piece(15, 10, 3, true),
            piece(18, 4, 1, false),
            piece(19, 2, 7, false),
            piece(40, 2, 9, false),
        ]);
        let got: Vec<_> = s
            .iter()
            .map(|s| {
                (
                    s.start,
                    s.blocks,
                    s.in_old,
                    s.in_snap,
                    s.moved,
                    s.born,
                    s.snap_born,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (10, 5, 1, 0, 0, 5, (0, 0)),
                (15, 3, 2, 0, 0, 3, (0, 0)),
                (18, 1, 2, 1, 0, 3, (1, 1)),
                (19, 1, 2, 2, 0, 3, (1, 7)),
                (20, 1, 1, 2, 0, 3, (1, 7)),
                (21, 1, 1, 1, 0, 3, (1, 1)),
                (22, 3, 1, 0, 0, 3, (0, 0)),
                (40, 2, 0, 1, 1, 0, (9, 9)),
            ]
        );
    }
}
