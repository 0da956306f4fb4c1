//! Directories' parents, as their back references say, kept beside the inode cache.
//!
//! A directory has one name, so one `InodeRef` item, keyed by its parent: `Inner::parent_of`
//! finds it with a tree scan (a descent and a leaf). A walk up a deep tree makes one per
//! level, under the operation lock (the check that a rename does not move a directory below
//! itself walks from the target to the root). Here a level is a lookup in an XArray keyed by
//! inode number (seed 000): a chain of directories made one after another has neighbouring
//! numbers, so its levels share leaves, where a hash map costs a cache miss a level (measured
//! in docs/benchmarks.md, "Hostile shapes"). A node that cannot be allocated leaves the
//! entry out: the next walk reads the tree there.
//!
//! Coherence: an entry is the directory's `InodeRef` as it was read. Only
//! `Inner::remove_back_ref` takes a back reference away (every name removal goes through
//! it, a rename's and an rmdir's too), and it forgets the child's entry; freeing an inode
//! forgets it too. The map lives in the `InodeCache`, so whatever replaces or swaps the
//! inode cache with the tree (a switch between subvolumes, a rollback, an open tree put in
//! hand) takes it along. A failed operation that changed anything stops the file system, so
//! no entry can outlive a change that was undone.
//!
//! Bounded: past `limit` entries it starts again empty. A walk longer than the bound then
//! reads the tree for the rest of its levels, as it did before the map.
use idxfs_index::XArray;

pub struct DirParents {
    map: XArray<u64>,
    limit: usize,
}

impl DirParents {
    pub fn new(limit: usize) -> Self {
        DirParents {
            map: XArray::new(),
            limit: limit.max(16),
        }
    }

    pub fn get(&mut self, dir: u64) -> Option<u64> {
        self.map.get_mut_access(dir)
    }

    /// Records `dir`'s parent as its back reference gives it now.
    pub fn insert(&mut self, dir: u64, parent: u64) {
        // u64::MAX is no inode number (a damaged key's), and no XArray value.
        if parent == u64::MAX {
            return;
        }
        if self.map.len() >= self.limit {
            self.map = XArray::new();
        }
        let _ = self.map.try_insert_mut(dir, parent);
    }

    /// `dir`'s back reference changed or went.
    pub fn forget(&mut self, dir: u64) {
        self.map.remove_mut(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgets_and_starts_again_past_its_bound() {
        let mut p = DirParents::new(16);
        for d in 0..16 {
            p.insert(100 + d, d);
        }
        assert_eq!((p.map.len(), p.get(105)), (16, Some(5)));
        p.forget(105);
        assert_eq!(p.get(105), None);
        p.insert(105, 7);
        assert_eq!(p.get(105), Some(7));
        p.insert(200, 1);
        assert_eq!((p.map.len(), p.get(200), p.get(101)), (1, Some(1), None));
        p.insert(300, u64::MAX);
        assert_eq!(p.get(300), None, "no such parent kept");
    }

    #[test]
    fn a_failed_allocation_leaves_the_entry_out() {
        let mut p = DirParents::new(1 << 10);
        p.map.fail_allocations_after(0);
        p.insert(5, 1);
        assert_eq!(p.get(5), None);
        p.map.fail_allocations_after(-1);
        p.insert(5, 1);
        assert_eq!(p.get(5), Some(1));
    }
}
