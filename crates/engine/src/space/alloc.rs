//! The extent allocator over block groups.
//!
//! Each group keeps two bitmaps:
//! - `used`: what the *next* commit records on disk (blocks referenced by the running
//!   transaction's trees);
//! - `busy`: `used` plus blocks freed in this transaction that the last *committed* state still
//!   references ("pinned"). The allocator searches `busy`, so a freed block is handed out again
//!   only after the commit that freed it is durable.
//!
//! Groups carry a kind (metadata or data) once first used, so tree nodes cluster together and
//! whole-tree passes read nearly sequential blocks.
//!
//! Finding space (seeds 001 and 004): for each kind, the groups with a free block that the
//! kind may use are an ordered set with the lowest cached (`room`). An allocation looks up the
//! first such group at or after the kind's cursor (one descent of the set; a second from the
//! lowest when the search wraps) and takes a run there, so full groups and groups of the
//! other kind are never visited, however many thousands the device has. A group whose free blocks are too
//! fragmented for the run asked for is skipped by a bitmap scan; only those are visited beyond
//! the first. A block's group is `block / group_blocks`: groups are uniform, which is the
//! direct path of `idxfs_index::bgtable::BlockGroupTable` without its epoch pin, needless here
//! because every caller holds the operation lock.
//!
//! Groups a transaction changed are kept in an ordered set with the first cached (seed 001's
//! `FirstMap`), which the commit drains in group order.
//!
//! Two more states let file data move without the operation lock (`crate::fs::data_io`):
//! - *claimed*: busy but not used. A write takes its blocks so (`claim`), writes them without
//!   the lock, and links them under it (`install`) or gives them back (`unclaim`). A commit
//!   frozen in between records them free: nothing it writes references them, so a crash
//!   leaves them free, and the fsync log never names them before `install`.
//! - *held*: freed data blocks a reader outside the lock may still be reading
//!   (`super::read_fence`), busy until every reader that entered before the free has left.
//!
//! With discard on (`set_discard`), a block that nothing can read any more (its commit is
//! durable and its readers gone) does not become free at once: it waits, busy, until the
//! device has been told to drop it (`take_discards`, then `discarded`), so an image file
//! gives the space back and no allocation can hand the block out while the discard is in
//! flight. File data freed in the running transaction is pinned then too, not reused at
//! once, so it is discarded after the next commit like the rest (as ext4 frees blocks only
//! when their transaction commits).
use super::bitmap::Bitmap;
use super::freed::Freed;
use super::read_fence::ReadFence;
use crate::counters::Counters;
use idxfs_index::first_map::FirstMap;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Meta = 1,
    Data = 2,
}

pub const GROUP_META: u64 = 1;
pub const GROUP_DATA: u64 = 2;

#[derive(Debug, Clone)]
pub struct Group {
    pub start: u64,
    pub len: u64,
    pub used: Bitmap,
    pub busy: Bitmap,
    pub used_count: u64,
    /// Set bits of `busy`: `len - busy_count` blocks may be handed out.
    pub busy_count: u64,
    pub flags: u64,
    /// The `room` sets this group is filed in (bit `slot(kind)`).
    filed: u8,
}

impl Group {
    /// Whether an allocation of `kind` may look here: a free block, and the group unclaimed
    /// or already holding that kind.
    fn has_room_for(&self, kind: Kind) -> bool {
        self.busy_count < self.len && (self.flags == 0 || self.flags & kind as u64 != 0)
    }
}

const KINDS: [Kind; 2] = [Kind::Meta, Kind::Data];

fn slot(kind: Kind) -> usize {
    match kind {
        Kind::Meta => 0,
        Kind::Data => 1,
    }
}

pub struct Allocator {
    pub groups: Vec<Group>,
    pub group_blocks: u64,
    pub total_blocks: u64,
    busy_total: u64,
    used_total: u64,
    cursor: [u64; 3],
    /// Per kind (`slot`): the groups with room for it (`Group::has_room_for`), lowest cached.
    room: [FirstMap<usize, ()>; 2],
    /// Freed blocks not yet reusable, and what each waits for (`super::freed`).
    freed: Freed,
    /// Blocks claimed and not yet installed or given back.
    claimed: u64,
    /// Groups changed since the last commit: their items must be rewritten. Ordered with the
    /// first cached (seed 001), so a commit takes them in group order without looking at
    /// the groups nothing changed (a device has thousands; a commit usually changes a few).
    dirty: FirstMap<usize, ()>,
    discards: Discards,
    counters: Arc<Counters>,
}

/// Blocks on their way to the device's discard.
#[derive(Default)]
struct Discards {
    on: bool,
    /// Ranges no state references, busy until discarded: (start, length), each inside a group.
    waiting: Vec<(u64, u64)>,
    /// Blocks of ranges taken by `take_discards` and not yet `discarded`.
    out: u64,
}

impl Allocator {
    /// Empty groups covering the device; the superblock blocks are marked used.
    pub fn new(total_blocks: u64, group_blocks: u64, counters: Arc<Counters>) -> Allocator {
        let mut groups = Vec::new();
        let mut start = 0;
        while start < total_blocks {
            let len = group_blocks.min(total_blocks - start);
            groups.push(Group {
                start,
                len,
                used: Bitmap::new(len),
                busy: Bitmap::new(len),
                used_count: 0,
                busy_count: 0,
                flags: 0,
                filed: 0,
            });
            start += len;
        }
        let mut a = Allocator {
            groups,
            group_blocks,
            total_blocks,
            busy_total: 0,
            used_total: 0,
            cursor: [0; 3],
            room: [FirstMap::new(), FirstMap::new()],
            freed: Freed::default(),
            claimed: 0,
            dirty: FirstMap::new(),
            discards: Discards::default(),
            counters,
        };
        for gi in 0..a.groups.len() {
            a.dirty.insert(gi, ());
            a.refile(gi);
        }
        a.mark_used(0, idxfs_format::SUPER_COPIES);
        a
    }

    /// Installs a group read from disk (mount).
    pub fn load_group(&mut self, index: usize, used: Bitmap, flags: u64) {
        let g = &mut self.groups[index];
        assert_eq!(used.len(), g.len);
        let n = used.count_ones();
        self.used_total = self.used_total - g.used_count + n;
        self.busy_total = self.busy_total - g.busy_count + n;
        g.used_count = n;
        g.busy_count = n;
        g.busy = used.clone();
        g.used = used;
        g.flags = flags;
        self.dirty.remove(&index);
        self.refile(index);
    }

    /// Files group `gi` in the `room` sets it belongs to now: called after every change to
    /// its `busy_count` or `flags`.
    fn refile(&mut self, gi: usize) {
        let g = &mut self.groups[gi];
        for kind in KINDS {
            let bit = 1u8 << slot(kind);
            let want = g.has_room_for(kind);
            if want != (g.filed & bit != 0) {
                if want {
                    self.room[slot(kind)].insert(gi, ());
                } else {
                    self.room[slot(kind)].remove(&gi);
                }
                g.filed ^= bit;
            }
        }
    }

    pub fn group_of(&self, block: u64) -> usize {
        (block / self.group_blocks) as usize
    }

    pub fn free_blocks(&self) -> u64 {
        self.total_blocks - self.busy_total
    }

    pub fn used_blocks(&self) -> u64 {
        self.used_total
    }

    /// Marks a range used in both bitmaps (mkfs, mount of superblocks).
    pub fn mark_used(&mut self, start: u64, n: u64) {
        for b in start..start + n {
            let gi = self.group_of(b);
            let g = &mut self.groups[gi];
            let i = b - g.start;
            assert!(!g.used.get(i), "block {b} marked used twice");
            g.used.set(i, true);
            g.used_count += 1;
            if !g.busy.get(i) {
                g.busy.set(i, true);
                g.busy_count += 1;
                self.busy_total += 1;
            }
            self.dirty.insert(gi, ());
            self.used_total += 1;
            self.refile(gi);
        }
    }

    /// Allocates a run of between `min` and `max` blocks inside one group, first fit from the
    /// kind's cursor among the groups with room for the kind, then (when that kind has run
    /// out) among the other kind's groups. Returns (start, length).
    pub fn alloc(&mut self, min: u64, max: u64, kind: Kind) -> Option<(u64, u64)> {
        let (start, n) = self.find(min, max, kind)?;
        self.take(start, n, kind, true);
        self.cursor[kind as usize] = start + n;
        Some((start, n))
    }

    /// `alloc` that leaves the run unused as far as a commit is concerned (see the module
    /// docs): for data written outside the lock, then `install`ed or `unclaim`ed.
    pub fn claim(&mut self, min: u64, max: u64) -> Option<(u64, u64)> {
        let (start, n) = self.find(min, max, Kind::Data)?;
        self.take(start, n, Kind::Data, false);
        self.cursor[Kind::Data as usize] = start + n;
        self.claimed += n;
        Some((start, n))
    }

    /// A claimed run is now referenced by the running transaction: the next commit records it.
    pub fn install(&mut self, start: u64, n: u64) {
        self.end_claim(start, n, true);
    }

    /// Gives back a claimed run nothing references (no reader can have mapped it).
    pub fn unclaim(&mut self, start: u64, n: u64) {
        self.end_claim(start, n, false);
    }

    /// Ends a claim: the run becomes used (`install`) or free again.
    fn end_claim(&mut self, start: u64, n: u64, install: bool) {
        let gi = self.group_of(start);
        let g = &mut self.groups[gi];
        for b in start..start + n {
            let i = b - g.start;
            assert!(
                g.busy.get(i) && !g.used.get(i),
                "ending a claim of unclaimed block {b}"
            );
            if install {
                g.used.set(i, true);
            } else {
                g.busy.set(i, false);
            }
        }
        if install {
            g.used_count += n;
            self.used_total += n;
            self.dirty.insert(gi, ());
        } else {
            g.busy_count -= n;
            self.busy_total -= n;
            self.refile(gi);
        }
        self.claimed -= n;
    }

    /// Blocks claimed and neither installed nor given back.
    pub fn claimed_blocks(&self) -> u64 {
        self.claimed
    }

    /// The fence readers of data outside the lock enter.
    pub fn fence(&self) -> &Arc<ReadFence> {
        &self.freed.fence
    }

    /// Where [`Allocator::alloc`] would allocate, taking nothing.
    pub fn find(&self, min: u64, max: u64, kind: Kind) -> Option<(u64, u64)> {
        assert!(min >= 1 && min <= max);
        if self.free_blocks() < min {
            return None;
        }
        let cur = self.cursor[kind as usize];
        let other = match kind {
            Kind::Meta => Kind::Data,
            Kind::Data => Kind::Meta,
        };
        // The second search is mixed use: only groups the first could not look in.
        self.search(slot(kind), cur, min, max, |_| true)
            .or_else(|| self.search(slot(other), cur, min, max, |g| !g.has_room_for(kind)))
    }

    /// The kind's cursor: its searches start at this block.
    pub fn cursor(&self, kind: Kind) -> u64 {
        self.cursor[kind as usize]
    }

    /// The first run of `min..=max` free blocks in the groups of `room[set]` that `pick`
    /// accepts, circularly from block `cur`'s group (from `cur` itself inside that group).
    fn search(
        &self,
        set: usize,
        cur: u64,
        min: u64,
        max: u64,
        pick: impl Fn(&Group) -> bool,
    ) -> Option<(u64, u64)> {
        let room = &self.room[set];
        let first = self.group_of(cur);
        let wrapped = room.keys_from(0).take_while(|&gi| gi < first);
        for gi in room.keys_from(first).chain(wrapped) {
            let g = &self.groups[gi];
            debug_assert!(g.filed & (1 << set) != 0 && g.busy_count < g.len);
            if g.len - g.busy_count < min || !pick(g) {
                continue;
            }
            let from = if gi == first { cur - g.start } else { 0 };
            let run = find_run(&g.busy, from, min, max)
                .or_else(|| (from > 0).then(|| find_run(&g.busy, 0, min, max)).flatten());
            if let Some((s, n)) = run {
                return Some((g.start + s, n));
            }
        }
        None
    }

    /// Marks a found run busy, and used unless it is a claim.
    fn take(&mut self, start: u64, n: u64, kind: Kind, used: bool) {
        let gi = self.group_of(start);
        let g = &mut self.groups[gi];
        for b in start..start + n {
            let i = b - g.start;
            assert!(
                !g.busy.get(i) && !g.used.get(i),
                "allocating busy block {b}"
            );
            g.busy.set(i, true);
            g.used.set(i, used);
        }
        if used {
            g.used_count += n;
            self.used_total += n;
        }
        g.busy_count += n;
        g.flags |= kind as u64;
        self.dirty.insert(gi, ());
        self.refile(gi);
        self.busy_total += n;
        Counters::inc(&self.counters.blocks_allocated);
    }

    /// Discards freed blocks before they are reused (see the module docs).
    pub fn set_discard(&mut self, on: bool) {
        self.discards.on = on;
    }

    /// Takes the ranges waiting for a discard; they stay busy until `discarded`.
    pub fn take_discards(&mut self) -> Vec<(u64, u64)> {
        let taken = std::mem::take(&mut self.discards.waiting);
        self.discards.out += taken.iter().map(|r| r.1).sum::<u64>();
        taken
    }

    /// The device was told to drop `ranges` (from `take_discards`), or tried: they are free.
    pub fn discarded(&mut self, ranges: &[(u64, u64)]) {
        for &(start, n) in ranges {
            self.discards.out -= n;
            self.unbusy(start, n);
        }
    }

    /// Every run of blocks free for allocation (neither used nor busy): a full trim's
    /// discards, valid while the caller holds the operation lock.
    pub fn free_ranges(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for g in &self.groups {
            let mut at = 0;
            while let Some((z, run)) = find_run(&g.busy, at, 1, g.len) {
                out.push((g.start + z, run));
                at = z + run;
            }
        }
        out
    }

    /// A freed range that nothing references any more: free now, or once discarded.
    fn release(&mut self, start: u64, n: u64) {
        if self.discards.on {
            self.discards.waiting.push((start, n));
        } else {
            self.unbusy(start, n);
        }
    }

    /// Frees a range. `now` = the range was allocated in the running transaction, so no
    /// committed state references it and it may be reused at once; otherwise it is pinned until
    /// [`Allocator::commit_done`].
    pub fn free(&mut self, start: u64, n: u64, now: bool) -> Result<(), idxfs_format::Corrupt> {
        self.free_range(start, n, now, false)
    }

    /// `free` for file data, which a reader outside the lock may be reading: with a reader
    /// inside the fence, blocks free at once are held until it has left, and pinned ones are
    /// held when their commit is done (`release_held`). Tree nodes and log blocks are only
    /// read under the lock, and pool slots nothing references: those never wait.
    pub fn free_data(
        &mut self,
        start: u64,
        n: u64,
        now: bool,
    ) -> Result<(), idxfs_format::Corrupt> {
        self.free_range(start, n, now, true)
    }

    /// `free_data` for a run that may span block groups: data let go of together (a deleted
    /// clone's own blocks, a log replay's, a held run when no snapshot wants it) may join
    /// extents lying end to end across a group boundary. Freed a group at a time, each
    /// piece checked as any free is.
    pub fn free_data_across(
        &mut self,
        start: u64,
        n: u64,
        now: bool,
    ) -> Result<(), idxfs_format::Corrupt> {
        let group = self.group_blocks.max(1);
        let end = start.saturating_add(n);
        let mut at = start;
        while at < end {
            let to = (at / group + 1).saturating_mul(group).min(end);
            self.free_range(at, to - at, now, true)?;
            at = to;
        }
        Ok(())
    }

    fn free_range(
        &mut self,
        start: u64,
        n: u64,
        now: bool,
        data: bool,
    ) -> Result<(), idxfs_format::Corrupt> {
        // Check before changing anything: a block the image's trees reference but its bitmap
        // calls free (or a range past a group) is corruption, reported, never a panic.
        let gi = self.group_of(start);
        let Some(g) = self.groups.get_mut(gi) else {
            return Err(idxfs_format::Corrupt::new(
                format!("free of blocks {start}+{n}"),
                "past the last block group",
                "inside the device",
            ));
        };
        if start + n > g.start + g.len {
            return Err(idxfs_format::Corrupt::new(
                format!("free of blocks {start}+{n}"),
                "crosses a block group boundary",
                "inside one group",
            ));
        }
        if let Some(b) = (start..start + n).find(|b| !g.used.get(b - g.start)) {
            return Err(idxfs_format::Corrupt::new(
                format!("free of block {b}"),
                "marked free in its bitmap",
                "marked used (referenced by the tree)",
            ));
        }
        // Data to discard waits for the next commit, like data the last one references.
        let now = now && !(data && self.discards.on);
        // A data block a reader outside the lock may still read stays busy until it is done.
        let stamp = if now && data {
            self.freed.fence.stamp()
        } else {
            None
        };
        let now = now && stamp.is_none();
        for b in start..start + n {
            let i = b - g.start;
            g.used.set(i, false);
            if now {
                g.busy.set(i, false);
            }
        }
        g.used_count -= n;
        if now {
            g.busy_count -= n;
        }
        self.dirty.insert(gi, ());
        self.refile(gi);
        self.used_total -= n;
        if let Some(stamp) = stamp {
            self.freed.held.push_back((stamp, start, n));
            Counters::inc(&self.counters.blocks_held_for_readers);
        } else if now {
            self.busy_total -= n;
            Counters::inc(&self.counters.blocks_freed_now);
        } else {
            self.freed.pinned.push((start, n, data));
            Counters::inc(&self.counters.blocks_pinned);
        }
        Ok(())
    }

    /// A commit froze the running transaction: what it freed waits for that commit, and
    /// what the next one frees waits for the next.
    pub fn start_commit(&mut self) {
        assert!(
            self.freed.committing.is_empty(),
            "a commit began before the last one was done"
        );
        debug_assert_eq!(
            self.pinned_blocks(),
            self.pinned_listed(),
            "busy blocks neither used nor claimed are not all pinned or held"
        );
        self.freed.committing = std::mem::take(&mut self.freed.pinned);
    }

    /// The commit that froze the pinned blocks is durable: they may be reused.
    pub fn commit_done(&mut self) {
        // Reuse released blocks before new ones: keeps the metadata compact on the device (and
        // a memory-backed device from faulting in fresh pages for every commit).
        if let Some(low) = self.freed.committing.iter().map(|p| p.0).min() {
            let c = &mut self.cursor[Kind::Meta as usize];
            *c = (*c).min(low);
        }
        let stamp = self.freed.fence.stamp();
        for (start, n, data) in std::mem::take(&mut self.freed.committing) {
            match stamp {
                Some(s) if data => {
                    self.freed.held.push_back((s, start, n));
                    Counters::inc(&self.counters.blocks_held_for_readers);
                }
                _ => self.release(start, n),
            }
        }
    }

    /// Makes the blocks of a freed range that nothing uses again free for allocation.
    fn unbusy(&mut self, start: u64, n: u64) {
        let gi = self.group_of(start);
        let g = &mut self.groups[gi];
        for b in start..start + n {
            let i = b - g.start;
            debug_assert!(g.busy.get(i));
            if !g.used.get(i) {
                g.busy.set(i, false);
                g.busy_count -= 1;
                self.busy_total -= 1;
            }
        }
        self.refile(gi);
    }

    /// The stamp after which every block held now may be reused, if any is held.
    pub fn held_until(&self) -> Option<u64> {
        self.freed.held.back().map(|h| h.0)
    }

    /// Frees the held blocks whose readers have all left (`read_fence`); cheap when none are
    /// held. Called whenever the operation lock is taken.
    pub fn release_held(&mut self) {
        while let Some(&(stamp, start, n)) = self.freed.held.front() {
            if !self.freed.fence.passed(stamp) {
                break;
            }
            self.freed.held.pop_front();
            self.release(start, n);
        }
    }

    /// Blocks freed but not yet reusable: by the running transaction, by a commit in flight,
    /// held for readers, and waiting for their discard. Those are every busy block that is
    /// neither used nor claimed (the allocator's states), so this costs nothing however many
    /// ranges are pinned: statfs's counts are recomputed each time an operation lets go of
    /// the lock (`fs::published`).
    pub fn pinned_blocks(&self) -> u64 {
        self.busy_total - self.used_total - self.claimed
    }

    /// `pinned_blocks` summed over the lists that hold them (checks the states agree).
    fn pinned_listed(&self) -> u64 {
        self.freed
            .pinned
            .iter()
            .chain(&self.freed.committing)
            .map(|p| p.1)
            .chain(self.freed.held.iter().map(|h| h.2))
            .chain(self.discards.waiting.iter().map(|d| d.1))
            .sum::<u64>()
            + self.discards.out
    }

    /// Takes the groups changed since the last call, in group order, and marks them clean.
    pub fn take_dirty_groups(&mut self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.dirty.len());
        self.dirty.drain_ordered(|gi, ()| out.push(gi));
        out
    }

    pub fn is_used(&self, block: u64) -> bool {
        let g = &self.groups[self.group_of(block)];
        g.used.get(block - g.start)
    }
}

/// The first run of `min..=max` clear bits at or after `from`: (index, length).
pub fn find_run(bm: &Bitmap, from: u64, min: u64, max: u64) -> Option<(u64, u64)> {
    let mut at = from;
    while let Some(z) = bm.next_zero(at) {
        let run = bm.zero_run(z, max);
        if run >= min {
            return Some((z, run));
        }
        at = z + run;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_run_across_groups_is_freed_a_group_at_a_time() {
        let mut a = Allocator::new(256, 64, Arc::new(Counters::default()));
        a.mark_used(60, 80);
        let free = a.free_blocks();
        assert!(
            a.free_data(60, 80, true).is_err(),
            "one free spans one group"
        );
        a.free_data_across(60, 80, true).expect("free across");
        assert_eq!(a.free_blocks(), free + 80);
        assert!((60..140).all(|b| !a.is_used(b)));
        // Each piece is checked: a block already free fails the free.
        a.mark_used(60, 10);
        assert!(a.free_data_across(60, 80, true).is_err());
    }

    #[test]
    fn pinned_blocks_wait_for_commit() {
        let mut a = Allocator::new(256, 64, Arc::new(Counters::default()));
        assert_eq!(a.free_blocks(), 254);
        let (s, n) = a.alloc(4, 4, Kind::Meta).expect("space");
        assert_eq!((s, n), (2, 4));
        a.start_commit();
        a.commit_done();
        a.free(s, 4, false).expect("free");
        assert_eq!(a.free_blocks(), 250, "pinned blocks are not free yet");
        let (s2, _) = a.alloc(4, 4, Kind::Meta).expect("space");
        assert_ne!(s2, s);
        a.start_commit();
        assert_eq!(
            a.free_blocks(),
            246,
            "still pinned while the commit is written"
        );
        a.commit_done();
        assert_eq!(a.free_blocks(), 250);
        assert!(!a.is_used(s));
        // Everything else taken, the once-pinned range is what remains.
        while a.alloc(1, 64, Kind::Data).is_some() {}
        assert_eq!(a.free_blocks(), 0);
        assert!(a.is_used(s), "the unpinned range was handed out again");
    }

    #[test]
    fn only_changed_groups_are_taken_in_order() {
        let mut a = Allocator::new(64 * 8, 64, Arc::new(Counters::default()));
        assert_eq!(
            a.take_dirty_groups(),
            (0..8).collect::<Vec<_>>(),
            "mkfs: all"
        );
        assert!(a.take_dirty_groups().is_empty(), "taking marks them clean");
        a.load_group(3, Bitmap::new(64), 0);
        assert!(a.take_dirty_groups().is_empty(), "a loaded group is clean");
        let (d, _) = a.alloc(1, 1, Kind::Data).expect("data");
        let (m, _) = a.alloc(1, 1, Kind::Meta).expect("meta");
        a.free(d, 1, true).expect("free");
        let mut want = vec![a.group_of(d), a.group_of(m)];
        want.sort_unstable();
        want.dedup();
        assert_eq!(a.take_dirty_groups(), want);
    }

    /// Every group filed exactly where `has_room_for` says, with counts that match its bitmaps.
    fn check_index(a: &Allocator) {
        for (gi, g) in a.groups.iter().enumerate() {
            assert_eq!(g.busy_count, g.busy.count_ones(), "group {gi} busy count");
            assert_eq!(g.used_count, g.used.count_ones(), "group {gi} used count");
            for kind in KINDS {
                let filed = a.room[slot(kind)].get(&gi).is_some();
                assert_eq!(filed, g.has_room_for(kind), "group {gi} {kind:?} filing");
            }
        }
        let busy: u64 = a.groups.iter().map(|g| g.busy_count).sum();
        assert_eq!(a.free_blocks(), a.total_blocks - busy);
        // Busy but unused: claimed, pinned, or held for readers; nothing else.
        assert_eq!(
            busy - a.used_blocks(),
            a.claimed_blocks() + a.pinned_listed()
        );
        assert_eq!(a.pinned_blocks(), a.pinned_listed());
    }

    /// Whether any group has a free run of `min` blocks (what a full scan would find).
    fn any_run(a: &Allocator, min: u64) -> bool {
        a.groups
            .iter()
            .any(|g| find_run(&g.busy, 0, min, min).is_some())
    }

    /// Random allocations, claims, frees (of data, too, with readers inside the fence),
    /// commits and, with discard on, discards taken and finished, over many small groups: the
    /// `room` sets stay exact, every busy block is accounted for, an allocation fails only
    /// when no group anywhere has the run, and never hands out a block waiting for or in a
    /// discard.
    #[test]
    fn indexed_search_finds_what_a_full_scan_finds() {
        for discard in [false, true] {
            random_states(discard);
        }
    }

    fn random_states(discard: bool) {
        let (mut rng, seed) = crate::testutil::Rng::from_env("alloc_index");
        let mut a = Allocator::new(64 * 40 + 17, 64, Arc::new(Counters::default()));
        a.set_discard(discard);
        let mut held: Vec<(u64, u64)> = Vec::new();
        let mut claims: Vec<(u64, u64)> = Vec::new();
        let mut readers = Vec::new();
        let mut discarding: Vec<Vec<(u64, u64)>> = Vec::new();
        let mut discarded = 0u64;
        let mut committing = false;
        let at = |step| format!("seed {seed} step {step} discard {discard}");
        // A range just handed out overlaps no range on its way to a discard.
        let fresh = |a: &Allocator, out: &[Vec<(u64, u64)>], (s, n): (u64, u64), step| {
            let mut pending = out.iter().flatten().chain(&a.discards.waiting);
            assert!(
                !pending.any(|&(d, m)| s < d + m && d < s + n),
                "{}: {s}+{n} handed out while being discarded",
                at(step)
            );
        };
        for step in 0..20_000 {
            match rng.below(16) {
                10 => {
                    if let Some(c) = a.claim(1, 1 + rng.below(8)) {
                        fresh(&a, &discarding, c, step);
                        claims.push(c);
                    }
                }
                11 if !claims.is_empty() => {
                    let (s, n) = claims.swap_remove(rng.below(claims.len() as u64) as usize);
                    if rng.below(2) == 0 {
                        a.install(s, n);
                        held.push((s, n));
                    } else {
                        a.unclaim(s, n);
                    }
                }
                12 => {
                    if readers.len() < 3 && rng.below(2) == 0 {
                        readers.push(a.fence().enter());
                    } else if !readers.is_empty() {
                        readers.swap_remove(rng.below(readers.len() as u64) as usize);
                    }
                    a.release_held();
                }
                13 if !held.is_empty() => {
                    let (s, n) = held.swap_remove(rng.below(held.len() as u64) as usize);
                    a.free_data(s, n, rng.below(2) == 0).expect("free");
                }
                14 => discarding.push(a.take_discards()),
                15 if !discarding.is_empty() => {
                    let batch = discarding.swap_remove(rng.below(discarding.len() as u64) as usize);
                    discarded += batch.iter().map(|r| r.1).sum::<u64>();
                    a.discarded(&batch);
                }
                0..=4 => {
                    let kind = if rng.below(3) == 0 {
                        Kind::Data
                    } else {
                        Kind::Meta
                    };
                    let min = 1 + rng.below(8);
                    let max = min + rng.below(8);
                    match a.alloc(min, max, kind) {
                        Some((s, n)) => {
                            assert!((min..=max).contains(&n), "{}", at(step));
                            fresh(&a, &discarding, (s, n), step);
                            held.push((s, n));
                        }
                        None => assert!(!any_run(&a, min), "{}: missed", at(step)),
                    }
                }
                5..=7 if !held.is_empty() => {
                    let (s, n) = held.swap_remove(rng.below(held.len() as u64) as usize);
                    a.free(s, n, rng.below(2) == 0).expect("free");
                }
                8 if !committing => {
                    a.start_commit();
                    committing = true;
                }
                9 if committing => {
                    a.commit_done();
                    committing = false;
                }
                _ => {}
            }
            check_index(&a);
        }
        assert_eq!(
            discarded > 0,
            discard,
            "seed {seed}: blocks went through discards exactly when it is on"
        );
    }

    #[test]
    fn data_and_meta_use_separate_groups() {
        let mut a = Allocator::new(256, 64, Arc::new(Counters::default()));
        let (m, _) = a.alloc(4, 4, Kind::Meta).expect("m");
        let (d, _) = a.alloc(1, 8, Kind::Data).expect("d");
        assert_ne!(a.group_of(m), a.group_of(d));
    }

    #[test]
    fn fills_completely_then_refuses() {
        let mut a = Allocator::new(128, 64, Arc::new(Counters::default()));
        let mut got = 0;
        while let Some((_, n)) = a.alloc(1, 16, Kind::Data) {
            got += n;
        }
        assert_eq!(got, 126);
        assert_eq!(a.free_blocks(), 0);
    }
}
