//! Readers of file data outside the operation lock, and when a freed data block may be handed
//! out again.
//!
//! A read maps its range under the operation lock (which device blocks hold which bytes), lets
//! go of the lock, and only then reads those blocks. Meanwhile another operation may free them
//! (an overwrite, a truncate, an unlink) and a third may allocate them for other data: the
//! reader would return bytes that were never in its file. So a reader enters this fence under
//! the lock, before letting go, and leaves when its reads are done; a data block freed while
//! a reader that entered earlier is still inside stays busy (held) until every such reader has
//! left (`Allocator::release_held`).
//!
//! Protocol. Readers get tickets numbered in the order they enter. A free stamps what it
//! holds with the number the next reader would get. The readers that may have mapped the
//! block are exactly those numbered below the stamp: both the entering and the stamping happen
//! under the operation lock, so a reader numbered at or past the stamp mapped the tree after
//! the free and cannot name the block. A held block may be reused once the lowest number still
//! inside is at or past its stamp, or nobody is inside. The readers inside are an ordered set
//! with the lowest cached (seed 001's `FirstMap`), so that check is one load; entering and
//! leaving are an insert or a remove under the fence's own lock, never the operation lock.
use idxfs_index::first_map::FirstMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct ReadFence {
    inside: Mutex<Inside>,
    /// Signalled whenever a reader leaves.
    left: Condvar,
}

#[derive(Default)]
struct Inside {
    /// The next reader's ticket.
    next: u64,
    /// Tickets of the readers inside, lowest cached.
    readers: FirstMap<u64, ()>,
}

/// A reader inside the fence; leaves when dropped (also on an error or a panic, so no block is
/// held forever).
pub struct ReadTicket {
    fence: Arc<ReadFence>,
    no: u64,
}

impl ReadFence {
    fn inside(&self) -> MutexGuard<'_, Inside> {
        // The state is two numbers and a set, each change one step: a panic elsewhere cannot
        // leave it half-changed.
        self.inside.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Enters the fence. Call with the operation lock held, after mapping the blocks to read.
    pub fn enter(self: &Arc<Self>) -> ReadTicket {
        let mut s = self.inside();
        let no = s.next;
        s.next += 1;
        s.readers.insert(no, ());
        ReadTicket {
            fence: self.clone(),
            no,
        }
    }

    /// The stamp for a block freed now (call with the operation lock held): None when no
    /// reader is inside, so the block may be reused at once.
    pub fn stamp(&self) -> Option<u64> {
        let s = self.inside();
        (!s.readers.is_empty()).then_some(s.next)
    }

    /// Whether a block stamped `stamp` may be reused: no reader that entered before it was
    /// freed is still inside.
    pub fn passed(&self, stamp: u64) -> bool {
        self.inside().readers.first_key().is_none_or(|f| f >= stamp)
    }

    /// Waits (never with the operation lock held: a writer inside may need it to finish)
    /// until `stamp` has passed or `limit` is over; whether it passed.
    pub fn wait_passed(&self, stamp: u64, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        let mut s = self.inside();
        loop {
            if s.readers.first_key().is_none_or(|f| f >= stamp) {
                return true;
            }
            let now = Instant::now();
            if now >= end {
                return false;
            }
            s = self
                .left
                .wait_timeout(s, end - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Readers inside now.
    pub fn readers(&self) -> usize {
        self.inside().readers.len()
    }
}

impl Drop for ReadTicket {
    fn drop(&mut self) {
        let removed = self.fence.inside().readers.remove(&self.no);
        debug_assert!(removed.is_some(), "ticket {} left twice", self.no);
        self.fence.left.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_passes_once_every_earlier_reader_left() {
        let f = Arc::new(ReadFence::default());
        assert_eq!(f.stamp(), None, "nobody inside: reusable at once");
        let a = f.enter();
        let s1 = f.stamp().expect("a reader is inside");
        let b = f.enter();
        let s2 = f.stamp().expect("readers are inside");
        assert!(!f.passed(s1) && !f.passed(s2));
        drop(a);
        // b entered after s1's free: it cannot have mapped that block.
        assert!(f.passed(s1));
        assert!(!f.passed(s2), "b entered before s2's free");
        let c = f.enter();
        drop(b);
        assert!(f.passed(s2), "c entered after s2's free");
        drop(c);
        assert_eq!(f.readers(), 0);
        assert_eq!(f.stamp(), None);
    }
}
