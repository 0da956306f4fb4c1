//! The block-group table of seed 004: find the group containing a byte offset among thousands.
//!
//! The kernel keeps block groups in an rb-tree with the leftmost cached, under a read/write
//! lock; every lookup takes the lock, so readers on different cores bounce its cache line. Here
//! writers (rare: a group is added or removed) build a new immutable snapshot and publish it
//! with one atomic store; readers load the snapshot pointer under an epoch pin and never write
//! shared memory. A snapshot of uniformly sized groups (idxfs makes them so) is a direct table
//! indexed by `offset >> shift`; otherwise a sorted array searched by bisection. The lowest
//! group is the first element: O(1). `lookup` returns a reference valid for the guard's life,
//! so a write path finds its group once and keeps it, as the seed's patch does.
use crossbeam_epoch::{self as epoch, Atomic, Guard, Owned};
use std::sync::atomic::Ordering::{AcqRel, Acquire};
use std::sync::{Arc, Mutex};

pub struct Group<G> {
    pub start: u64,
    pub len: u64,
    pub data: G,
}

struct Snapshot<G> {
    /// Sorted by start; groups never overlap.
    sorted: Vec<Arc<Group<G>>>,
    /// `Some(shift)` when every group i starts at `i << shift` and is at most `1 << shift` long.
    shift: Option<u32>,
}

pub struct BlockGroupTable<G: Send + Sync + 'static> {
    snap: Atomic<Snapshot<G>>,
    writer: Mutex<()>,
}

/// A group overlaps another, or has zero length.
#[derive(Debug, PartialEq, Eq)]
pub struct Overlap;

impl<G: Send + Sync + 'static> Default for BlockGroupTable<G> {
    fn default() -> Self {
        Self::new()
    }
}

impl<G: Send + Sync + 'static> BlockGroupTable<G> {
    pub fn new() -> Self {
        BlockGroupTable {
            snap: Atomic::new(Snapshot {
                sorted: Vec::new(),
                shift: None,
            }),
            writer: Mutex::new(()),
        }
    }

    fn publish(&self, sorted: Vec<Arc<Group<G>>>, guard: &Guard) {
        let shift = sorted.first().and_then(|g| {
            let s = g.len.next_power_of_two().trailing_zeros();
            sorted
                .iter()
                .enumerate()
                .all(|(i, g)| g.start == (i as u64) << s && g.len <= 1 << s)
                .then_some(s)
        });
        let old = self
            .snap
            .swap(Owned::new(Snapshot { sorted, shift }), AcqRel, guard);
        // SAFETY: the old snapshot is unreachable after the swap; readers that loaded it are
        // pinned, and destruction waits for them.
        unsafe { guard.defer_destroy(old) };
    }

    /// Adds a group (copy-on-write of the table).
    pub fn insert(&self, start: u64, len: u64, data: G) -> Result<(), Overlap> {
        let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let guard = epoch::pin();
        // SAFETY: pinned; the snapshot stays alive while we read it.
        let cur = unsafe { self.snap.load(Acquire, &guard).deref() };
        let end = start.checked_add(len).ok_or(Overlap)?;
        if len == 0
            || cur
                .sorted
                .iter()
                .any(|g| start < g.start + g.len && g.start < end)
        {
            return Err(Overlap);
        }
        let mut sorted = cur.sorted.clone();
        let at = sorted.partition_point(|g| g.start < start);
        sorted.insert(at, Arc::new(Group { start, len, data }));
        self.publish(sorted, &guard);
        Ok(())
    }

    /// Removes the group starting at `start`.
    pub fn remove(&self, start: u64) -> bool {
        let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let guard = epoch::pin();
        // SAFETY: pinned.
        let cur = unsafe { self.snap.load(Acquire, &guard).deref() };
        let Some(i) = cur.sorted.iter().position(|g| g.start == start) else {
            return false;
        };
        let mut sorted = cur.sorted.clone();
        sorted.remove(i);
        self.publish(sorted, &guard);
        true
    }

    /// The group containing byte/block `offset`, valid while `guard` is held.
    #[inline]
    pub fn lookup<'g>(&self, offset: u64, guard: &'g Guard) -> Option<&'g Group<G>> {
        // SAFETY: pinned by `guard`; snapshots are freed only after every pin that saw them.
        let s = unsafe { self.snap.load(Acquire, guard).deref() };
        let g = match s.shift {
            Some(shift) => s.sorted.get((offset >> shift) as usize)?,
            None => {
                let i = s
                    .sorted
                    .partition_point(|g| g.start <= offset)
                    .checked_sub(1)?;
                s.sorted.get(i)?
            }
        };
        (offset >= g.start && offset - g.start < g.len).then_some(&**g)
    }

    /// The lowest group: O(1).
    pub fn first<'g>(&self, guard: &'g Guard) -> Option<&'g Group<G>> {
        // SAFETY: pinned by `guard`.
        let s = unsafe { self.snap.load(Acquire, guard).deref() };
        s.sorted.first().map(|g| &**g)
    }

    pub fn len(&self) -> usize {
        let guard = epoch::pin();
        // SAFETY: pinned.
        unsafe { self.snap.load(Acquire, &guard).deref() }
            .sorted
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<G: Send + Sync + 'static> Drop for BlockGroupTable<G> {
    fn drop(&mut self) {
        // SAFETY: exclusive access; no reader can hold the snapshot.
        unsafe {
            let g = epoch::unprotected();
            let s = self.snap.load(Acquire, g);
            if !s.is_null() {
                drop(s.into_owned());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn direct_and_sorted_lookups_agree() {
        let t = BlockGroupTable::new();
        // Miri runs the same logic on fewer groups (it is a few thousand times slower).
        let n = if cfg!(miri) { 40u64 } else { 3500 };
        for i in 0..n {
            t.insert(i << 16, 1 << 16, AtomicU64::new(i))
                .expect("insert");
        }
        let guard = epoch::pin();
        assert_eq!(t.first(&guard).map(|g| g.start), Some(0));
        for off in [0u64, 1, 65535, 65536, (n - 1) << 16, (n << 16) - 1] {
            let g = t.lookup(off, &guard).expect("found");
            assert!(g.start <= off && off < g.start + g.len);
        }
        assert!(t.lookup(n << 16, &guard).is_none());
        // The write path keeps the group it found: bump its writer count once, drop once.
        let g = t.lookup(20 << 16, &guard).expect("found");
        g.data.fetch_add(1, Ordering::Relaxed);
        // A gap makes the table non-uniform: bisection path.
        assert!(t.remove(5 << 16));
        let g2 = epoch::pin();
        assert!(t.lookup(5 << 16, &g2).is_none());
        assert_eq!(t.lookup(6 << 16, &g2).map(|g| g.start), Some(6 << 16));
        assert_eq!(t.insert(6 << 16, 10, AtomicU64::new(0)), Err(Overlap));
    }
}
