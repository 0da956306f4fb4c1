//! Pin counts of the inodes a front end still holds (see `orphan`), in an XArray keyed by inode
//! number (seed 000).
//!
//! A FUSE mount pins every inode the kernel learns of, so a pass over a directory of a million
//! files pins a million inodes, in inode-number order (readdirplus) or in creation order, which
//! is the same. A hash map spread those keys over a table of megabytes, a cache miss per pin
//! (perf: 7.7% of the daemon's samples during a cold readdir+stat of 200,000 entries went to
//! its inserts), and rehashed the whole table at each doubling, inside some unlucky request.
//! The radix tree puts 64 consecutive inode numbers in one leaf and never rehashes.
//!
//! An allocation that fails leaves the inode unpinned (counted in `pin_alloc_failures`): should
//! its last name go while the kernel still knows it, the inode is freed at once rather than
//! kept as an orphan, and the kernel's later requests for it get ENOENT. Nothing aborts.
use super::Ino;
use idxfs_index::XArray;

#[derive(Default)]
pub struct Pins(XArray<u64>);

impl Pins {
    /// Adds one pin; false when the index could not allocate (the pin is not taken).
    pub fn add(&mut self, ino: Ino) -> bool {
        let n = self.0.get_mut_access(ino).unwrap_or(0);
        // The XArray keeps a value as raw + 1: u64::MAX would not fit, and nothing pins that often.
        self.0
            .try_insert_mut(ino, n.saturating_add(1).min(u64::MAX - 1))
            .is_ok()
    }

    /// Drops `n` pins: Some(true) when that was the last, None when `ino` was not pinned.
    pub fn drop_pins(&mut self, ino: Ino, n: u64) -> Option<bool> {
        let have = self.0.get_mut_access(ino)?;
        let left = have.saturating_sub(n);
        if left == 0 {
            self.0.remove_mut(ino);
            Some(true)
        } else {
            // Replacing a present value allocates nothing.
            let _ = self.0.try_insert_mut(ino, left);
            Some(false)
        }
    }

    pub fn contains(&mut self, ino: Ino) -> bool {
        self.0.get_mut_access(ino).is_some()
    }

    pub fn clear(&mut self) {
        self.0 = XArray::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_up_and_down() {
        let mut p = Pins::default();
        assert!(!p.contains(7));
        assert_eq!(p.drop_pins(7, 1), None, "not pinned");
        assert!(p.add(7) && p.add(7) && p.add(9));
        assert_eq!(p.0.len(), 2);
        assert_eq!(p.drop_pins(7, 1), Some(false), "one pin left");
        assert!(p.contains(7));
        assert_eq!(p.drop_pins(7, 5), Some(true), "more than held: the last");
        assert!(!p.contains(7));
        assert!(p.contains(9));
        p.clear();
        assert!(p.0.is_empty() && !p.contains(9));
    }

    #[test]
    fn a_failed_allocation_takes_no_pin() {
        let mut p = Pins::default();
        p.0.fail_allocations_after(0);
        assert!(!p.add(1 << 40), "no node for this index");
        assert!(!p.contains(1 << 40));
        assert!(p.0.is_empty());
    }
}
