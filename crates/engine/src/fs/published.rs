//! Inode attributes published for readers that take no lock (seed 000's lock-free read path on
//! the engine's hottest read, getattr).
//!
//! An inode is published when a getattr first finds it unpublished (and takes the lock to read
//! it), so only inodes someone reads cost a copy here: a create does not publish the inode it
//! makes. The inode cache is changed only under the operation lock, and an operation may change
//! several inodes (a create: the new inode and its directory; a rename: up to four). When the
//! operation lets go of the lock (`Locked`'s drop), every published inode it changed or dropped
//! in the cache is published again: a new immutable copy stored in a [`BoxedMap`] (an XArray
//! of boxes freed through epochs), or its entry removed. A sequence count, odd while a
//! publish is under way, makes each publish one step for readers: a reader that saw an even
//! count before and the same count after its copy read a state between two operations, never
//! one half-way through a publish (so it cannot see a new link count with an old directory
//! time). A reader that races a publish retries a few times, then takes the lock; a reader
//! whose inode is not published takes the lock, which loads and publishes it.
//!
//! What is published is always what the cache holds after a whole operation: the lock holder
//! publishes before releasing the lock, so a reader never sees an older item once an
//! operation that changed it has returned, and never a newer one before.
//!
//! Allocation failure of an XArray node unpublishes the inode instead, so its readers take the
//! lock: nothing aborts, nothing is stale.
use idxfs_format::items::InodeItem;
use idxfs_index::BoxedMap;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub struct Published {
    items: BoxedMap<InodeItem>,
    /// Odd while a publish is under way.
    seq: AtomicU64,
}

impl Published {
    /// The item of `ino` as the last finished operation left it; None when not published (or
    /// publishes kept racing this read): the caller takes the lock.
    pub fn get(&self, ino: u64) -> Option<InodeItem> {
        for _ in 0..16 {
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let item = self.items.get(ino);
            // Order the copy before the second read of the count (the seqlock reader's fence).
            std::sync::atomic::fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == before {
                return item;
            }
        }
        None
    }

    /// Publishes what an operation changed: each published inode's item now, or its absence
    /// (`read`: also those not published yet, the getattr that read them). Called by the lock
    /// holder only.
    pub fn publish(&self, changed: Vec<(u64, Option<InodeItem>)>, read: bool) {
        let changed: Vec<_> = changed
            .into_iter()
            .filter(|(ino, _)| read || self.items.contains(*ino))
            .collect();
        if changed.is_empty() {
            return;
        }
        self.seq.fetch_add(1, Ordering::AcqRel);
        for (ino, item) in changed {
            match item {
                Some(it) => {
                    if self.items.set(ino, it).is_err() {
                        self.items.remove(ino);
                    }
                }
                None => self.items.remove(ino),
            }
        }
        self.seq.fetch_add(1, Ordering::Release);
    }
}
