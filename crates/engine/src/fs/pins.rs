//! Pin counts of the inodes a front end still holds (see `orphan`), in an XArray keyed by inode
//! number (seed 000), behind a lock of their own.
//!
//! A FUSE mount pins every inode the kernel learns of, so a pass over a directory of a million
//! files pins a million inodes, in inode-number order (readdirplus) or in creation order, which
//! is the same. A hash map spread those keys over a table of megabytes, a cache miss per pin
//! (perf: 7.7% of the daemon's samples during a cold readdir+stat of 200,000 entries went to
//! its inserts), and rehashed the whole table at each doubling, inside some unlucky request.
//! The radix tree puts 64 consecutive inode numbers in one leaf and never rehashes.
//!
//! Pinning takes no operation lock: a lookup answered without it (`published`), and the
//! entry of a create, would otherwise wait for every operation and commit freeze in progress
//! just to count a reference. The order between a pin and the removal of an inode's last
//! name is kept here instead. The operation that removes the last name of an inode nobody
//! pins *buries* it under this lock ([`Pins::bury`]) before freeing anything, and a pin of a
//! buried inode is refused ([`Pin::Gone`]); a pin that came first makes `bury` fail, and the
//! inode stays an orphan until its last unpin. So an inode being freed in batches is never
//! held again by a name a reader found before the removal: the reader's holder gets ENOENT,
//! as for an inode already gone, never the half-freed file (an old size over freed extents,
//! reading as zeros). The mark goes when the inode's last item does (`unbury`); a pin after
//! that names an inode that no longer exists, which every operation answers with ENOENT.
//! Lock order: the operation lock, then this one; this one is never held while waiting for
//! another.
//!
//! An allocation that fails leaves the inode unpinned (counted in `pin_alloc_failures`): should
//! its last name go while the kernel still knows it, the inode is freed at once rather than
//! kept as an orphan, and the kernel's later requests for it get ENOENT. Nothing aborts.
use super::Ino;
use idxfs_index::XArray;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// The count of a buried inode: its last name is gone, nothing held it, it is being freed.
const BURIED: u64 = u64::MAX - 1;
/// Most pins one inode counts (the XArray keeps a value as raw + 1, so u64::MAX would not
/// fit; nothing pins that often).
const MAX_PINS: u64 = BURIED - 1;

/// What [`Pins::add`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    Pinned,
    /// The inode is buried: being freed, so it cannot be held any more.
    Gone,
    /// The index could not allocate; nothing was pinned.
    NoMemory,
}

#[derive(Default)]
pub struct Pins {
    counts: Mutex<XArray<u64>>,
    /// The front end holds every inode an operation makes or links (`Fs::hold_made`).
    hold_made: AtomicBool,
    /// Inodes kept past their last name for their holders, and their releases.
    pub releases: Releases,
}

/// Inodes kept past their last name because pinned, and how many of them a last unpin
/// released since, for operations refused for space (see [`Releases::wait`]).
#[derive(Default)]
pub struct Releases {
    kept: AtomicU64,
    /// Read before every operation (`Fs::write_op`), so an atomic; changed under `lock`,
    /// which `release` waits with.
    released: AtomicU64,
    lock: Mutex<()>,
    release: Condvar,
    /// `kept` when a wait for a release last ended with none.
    fruitless: AtomicU64,
}

impl Releases {
    fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An inode's last name went while it was pinned: it is kept until its last unpin.
    pub fn kept_one(&self) {
        self.kept.fetch_add(1, Ordering::Relaxed);
    }

    /// A kept inode's last unpin came and its space is freed: wakes `wait`.
    pub fn released_one(&self) {
        {
            let _g = self.lock();
            self.released.fetch_add(1, Ordering::Relaxed);
        }
        self.release.notify_all();
    }

    /// How many kept inodes were released so far (for `wait`).
    pub fn count(&self) -> u64 {
        self.released.load(Ordering::Relaxed)
    }

    /// For an operation refused for space: waits up to `most` for a kept inode to be released
    /// after `seen` releases; true when one was (run the operation again). A FUSE mount
    /// learns that the kernel let go of an inode from a FORGET, which comes asynchronously
    /// after the unlink that took the inode's last name, so `rm big; dd of=new` on a full
    /// file system would otherwise meet ENOSPC where ext4 frees the space within the
    /// unlink. Waits only while some kept inode is not released, and not again after a
    /// wait that saw none until another inode is kept: a file held open for long costs one
    /// wait, not one per refused operation.
    pub fn wait(&self, seen: u64, most: Duration) -> bool {
        let kept = self.kept.load(Ordering::Relaxed);
        let g = self.lock();
        let released = || self.released.load(Ordering::Relaxed);
        if kept <= released() || kept <= self.fruitless.load(Ordering::Relaxed) {
            return false;
        }
        if released() != seen {
            return true;
        }
        let (_g, _) = self
            .release
            .wait_timeout_while(g, most, |_| released() == seen)
            .unwrap_or_else(|p| p.into_inner());
        if released() == seen {
            self.fruitless.store(kept, Ordering::Relaxed);
            return false;
        }
        true
    }
}

impl Pins {
    fn lock(&self) -> MutexGuard<'_, XArray<u64>> {
        // Every change below is one XArray call: a panic cannot leave the counts half-changed.
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// From now on, create, mknod, mkdir, symlink and link pin the inode they return.
    pub fn hold_made(&self) {
        self.hold_made.store(true, Ordering::Relaxed);
    }

    /// Whether they do.
    pub fn holds_made(&self) -> bool {
        self.hold_made.load(Ordering::Relaxed)
    }

    /// Adds one pin, unless the inode is buried or the index cannot allocate.
    pub fn add(&self, ino: Ino) -> Pin {
        let mut x = self.lock();
        Self::add_locked(&mut x, ino)
    }

    /// `add` for each of `inos`, under one lock; the inodes it did not pin.
    pub fn add_all(&self, inos: &[Ino]) -> Vec<(Ino, Pin)> {
        let mut x = self.lock();
        inos.iter()
            .map(|&ino| (ino, Self::add_locked(&mut x, ino)))
            .filter(|(_, p)| *p != Pin::Pinned)
            .collect()
    }

    fn add_locked(x: &mut XArray<u64>, ino: Ino) -> Pin {
        let n = x.get_mut_access(ino).unwrap_or(0);
        if n == BURIED {
            return Pin::Gone;
        }
        match x.try_insert_mut(ino, n.saturating_add(1).min(MAX_PINS)) {
            Ok(_) => Pin::Pinned,
            Err(_) => Pin::NoMemory,
        }
    }

    /// Drops `n` pins: Some(true) when that was the last, None when `ino` was not pinned.
    pub fn drop_pins(&self, ino: Ino, n: u64) -> Option<bool> {
        let mut x = self.lock();
        let have = x.get_mut_access(ino).filter(|&h| h != BURIED)?;
        let left = have.saturating_sub(n);
        if left == 0 {
            x.remove_mut(ino);
            Some(true)
        } else {
            // Replacing a present value allocates nothing.
            let _ = x.try_insert_mut(ino, left);
            Some(false)
        }
    }

    /// Whether a front end holds `ino`.
    pub fn contains(&self, ino: Ino) -> bool {
        self.lock().get_mut_access(ino).is_some_and(|n| n != BURIED)
    }

    /// Marks `ino`, whose last name is gone, as being freed, unless something pins it: true
    /// when it was not pinned (and no pin can come now), false when it is held. When the
    /// index cannot allocate the mark, the inode is still reported unpinned: a pin racing it
    /// then finds a half-freed inode, as before the mark existed, which is consistent on
    /// disk (counted in `pin_alloc_failures` by the caller).
    pub fn bury(&self, ino: Ino) -> Result<bool, ()> {
        let mut x = self.lock();
        match x.get_mut_access(ino) {
            Some(BURIED) => Ok(true),
            Some(_) => Ok(false),
            None => match x.try_insert_mut(ino, BURIED) {
                Ok(_) => Ok(true),
                Err(_) => Err(()),
            },
        }
    }

    /// `ino`'s last item is gone: its mark goes too.
    pub fn unbury(&self, ino: Ino) {
        let mut x = self.lock();
        if x.get_mut_access(ino) == Some(BURIED) {
            x.remove_mut(ino);
        }
    }

    /// Forgets every pin and mark (a closing file system: nothing holds its inodes).
    pub fn clear(&self) {
        *self.lock() = XArray::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_up_and_down() {
        let p = Pins::default();
        assert!(!p.contains(7));
        assert_eq!(p.drop_pins(7, 1), None, "not pinned");
        assert_eq!(p.add(7), Pin::Pinned);
        assert_eq!(p.add(7), Pin::Pinned);
        assert_eq!(p.add(9), Pin::Pinned);
        assert_eq!(p.lock().len(), 2);
        assert_eq!(p.drop_pins(7, 1), Some(false), "one pin left");
        assert!(p.contains(7));
        assert_eq!(p.drop_pins(7, 5), Some(true), "more than held: the last");
        assert!(!p.contains(7));
        assert!(p.contains(9));
        p.clear();
        assert!(p.lock().is_empty() && !p.contains(9));
    }

    #[test]
    fn a_buried_inode_takes_no_pin_and_a_pinned_one_is_not_buried() {
        let p = Pins::default();
        assert_eq!(p.add(5), Pin::Pinned);
        assert_eq!(p.bury(5), Ok(false), "held: stays an orphan");
        assert!(p.contains(5));
        assert_eq!(p.drop_pins(5, 1), Some(true));
        assert_eq!(
            p.bury(5),
            Ok(true),
            "the last pin went: now it may be freed"
        );
        assert_eq!(p.bury(5), Ok(true), "twice is the same");
        assert!(!p.contains(5), "a mark is not a pin");
        assert_eq!(p.drop_pins(5, 1), None, "a mark is not a pin");
        assert_eq!(p.add(5), Pin::Gone);
        assert_eq!(
            p.add_all(&[4, 5, 6]),
            vec![(5, Pin::Gone)],
            "only the buried one refused"
        );
        assert!(p.contains(4) && p.contains(6));
        p.unbury(5);
        assert_eq!(p.lock().get_mut_access(5), None, "the mark is gone");
        p.unbury(4);
        assert!(p.contains(4), "unbury leaves pins alone");
        assert_eq!(
            p.add(5),
            Pin::Pinned,
            "an inode gone for good: ENOENT later"
        );
    }

    #[test]
    fn a_failed_allocation_takes_no_pin() {
        let p = Pins::default();
        p.lock().fail_allocations_after(0);
        assert_eq!(p.add(1 << 40), Pin::NoMemory, "no node for this index");
        assert!(!p.contains(1 << 40));
        assert_eq!(p.bury(1 << 41), Err(()), "no node for the mark either");
        assert!(p.lock().is_empty());
    }
}
