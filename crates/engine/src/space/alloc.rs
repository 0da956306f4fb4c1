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
//! whole-tree passes read nearly sequential blocks. Groups a transaction changed are kept in
//! an ordered set with the first cached (seed 001's `FirstMap`), which the commit drains in
//! group order. Not built yet: seed 004's table (the lowest group with free space cached,
//! readers never contending) in place of the linear search from the cursor below.
use super::bitmap::Bitmap;
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
    pub flags: u64,
}

pub struct Allocator {
    pub groups: Vec<Group>,
    pub group_blocks: u64,
    pub total_blocks: u64,
    busy_total: u64,
    used_total: u64,
    cursor: [u64; 3],
    /// Freed by the running transaction, referenced by the last committed state.
    pinned: Vec<(u64, u64)>,
    /// Freed by the transaction a commit is writing: reusable once that commit is durable.
    committing: Vec<(u64, u64)>,
    /// Groups changed since the last commit: their items must be rewritten. Ordered with the
    /// first cached (seed 001), so a commit takes them in group order without looking at
    /// the groups nothing changed (a device has thousands; a commit usually changes a few).
    dirty: FirstMap<usize, ()>,
    counters: Arc<Counters>,
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
                flags: 0,
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
            pinned: Vec::new(),
            committing: Vec::new(),
            dirty: FirstMap::new(),
            counters,
        };
        for gi in 0..a.groups.len() {
            a.dirty.insert(gi, ());
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
        self.busy_total = self.busy_total - g.busy.count_ones() + n;
        g.used_count = n;
        g.busy = used.clone();
        g.used = used;
        g.flags = flags;
        self.dirty.remove(&index);
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
                self.busy_total += 1;
            }
            self.dirty.insert(gi, ());
            self.used_total += 1;
        }
    }

    /// Allocates a run of between `min` and `max` blocks inside one group, first fit from the
    /// kind's cursor. Returns (start, length).
    pub fn alloc(&mut self, min: u64, max: u64, kind: Kind) -> Option<(u64, u64)> {
        assert!(min >= 1 && min <= max);
        if self.free_blocks() < min {
            return None;
        }
        let ngroups = self.groups.len();
        let cur = self.cursor[kind as usize];
        let first = self.group_of(cur).min(ngroups.saturating_sub(1));
        // Pass 0: groups of this kind or unclaimed; pass 1: any group (mixed use when one kind
        // has run out).
        for pass in 0..2 {
            for step in 0..=ngroups {
                let gi = (first + step) % ngroups;
                let g = &self.groups[gi];
                let ok_kind = g.flags == 0 || g.flags & kind as u64 != 0;
                if (pass == 0 && !ok_kind) || g.len - g.used_count < min {
                    continue;
                }
                let from = if step == 0 && cur >= g.start {
                    cur - g.start
                } else {
                    0
                };
                if let Some((s, n)) = find_run(&g.busy, from, min, max) {
                    let start = g.start + s;
                    self.take(start, n, kind);
                    self.cursor[kind as usize] = start + n;
                    return Some((start, n));
                }
                if step == 0 && from > 0 {
                    // The cursor's group may still have room before the cursor.
                    if let Some((s, n)) = find_run(&self.groups[gi].busy, 0, min, max) {
                        let start = self.groups[gi].start + s;
                        self.take(start, n, kind);
                        self.cursor[kind as usize] = start + n;
                        return Some((start, n));
                    }
                }
            }
        }
        None
    }

    fn take(&mut self, start: u64, n: u64, kind: Kind) {
        let gi = self.group_of(start);
        let g = &mut self.groups[gi];
        for b in start..start + n {
            let i = b - g.start;
            assert!(
                !g.busy.get(i) && !g.used.get(i),
                "allocating busy block {b}"
            );
            g.busy.set(i, true);
            g.used.set(i, true);
        }
        g.used_count += n;
        g.flags |= kind as u64;
        self.dirty.insert(gi, ());
        self.busy_total += n;
        self.used_total += n;
        Counters::inc(&self.counters.blocks_allocated);
    }

    /// Frees a range. `now` = the range was allocated in the running transaction, so no
    /// committed state references it and it may be reused at once; otherwise it is pinned until
    /// [`Allocator::commit_done`].
    pub fn free(&mut self, start: u64, n: u64, now: bool) -> Result<(), idxfs_format::Corrupt> {
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
        for b in start..start + n {
            let i = b - g.start;
            g.used.set(i, false);
            if now {
                g.busy.set(i, false);
            }
        }
        g.used_count -= n;
        self.dirty.insert(gi, ());
        self.used_total -= n;
        if now {
            self.busy_total -= n;
            Counters::inc(&self.counters.blocks_freed_now);
        } else {
            self.pinned.push((start, n));
            Counters::inc(&self.counters.blocks_pinned);
        }
        Ok(())
    }

    /// A commit froze the running transaction: what it freed waits for that commit, and
    /// what the next one frees waits for the next.
    pub fn start_commit(&mut self) {
        assert!(
            self.committing.is_empty(),
            "a commit began before the last one was done"
        );
        self.committing = std::mem::take(&mut self.pinned);
    }

    /// The commit that froze the pinned blocks is durable: they may be reused.
    pub fn commit_done(&mut self) {
        // Reuse released blocks before new ones: keeps the metadata compact on the device (and
        // a memory-backed device from faulting in fresh pages for every commit).
        if let Some(low) = self.committing.iter().map(|p| p.0).min() {
            let c = &mut self.cursor[Kind::Meta as usize];
            *c = (*c).min(low);
        }
        for (start, n) in std::mem::take(&mut self.committing) {
            let gi = self.group_of(start);
            let g = &mut self.groups[gi];
            for b in start..start + n {
                let i = b - g.start;
                debug_assert!(g.busy.get(i));
                if !g.used.get(i) {
                    g.busy.set(i, false);
                    self.busy_total -= 1;
                }
            }
        }
    }

    /// Blocks freed but not yet reusable: by the running transaction and by a commit in flight.
    pub fn pinned_blocks(&self) -> u64 {
        self.pinned
            .iter()
            .chain(&self.committing)
            .map(|p| p.1)
            .sum()
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

fn find_run(bm: &Bitmap, from: u64, min: u64, max: u64) -> Option<(u64, u64)> {
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
