//! The in-memory inode cache, keyed by inode number behind this one type (the XArray of the
//! index issue replaces the map here without touching callers).
//!
//! The cache is authoritative for the inodes it holds: changes to an inode (times, size, link
//! count) are made here and marked dirty, and written into the fs tree once per commit rather
//! than once per change. That is why a million creates in one directory update the directory's
//! inode item once per commit, not a million times.
use crate::btree::cache::FastMap;
use idxfs_format::items::InodeItem;

pub struct InodeCache {
    map: FastMap<u64, Slot>,
    dirty: Vec<u64>,
    limit: usize,
}

struct Slot {
    item: InodeItem,
    dirty: bool,
}

impl InodeCache {
    pub fn new(limit: usize) -> Self {
        InodeCache {
            map: FastMap::default(),
            dirty: Vec::new(),
            limit: limit.max(16),
        }
    }

    pub fn get(&self, ino: u64) -> Option<&InodeItem> {
        self.map.get(&ino).map(|s| &s.item)
    }

    /// Installs an inode read from (or just inserted into) the tree: clean.
    pub fn insert_clean(&mut self, ino: u64, item: InodeItem) {
        if self.map.len() >= self.limit {
            self.shrink();
        }
        self.map.entry(ino).or_insert(Slot { item, dirty: false });
    }

    /// Changes a cached inode and marks it for write-back. The inode must be cached.
    pub fn modify(&mut self, ino: u64, f: impl FnOnce(&mut InodeItem)) {
        let Some(slot) = self.map.get_mut(&ino) else {
            panic!("modify of uncached inode {ino}")
        };
        f(&mut slot.item);
        if !slot.dirty {
            slot.dirty = true;
            self.dirty.push(ino);
        }
    }

    pub fn remove(&mut self, ino: u64) {
        self.map.remove(&ino);
    }

    pub fn dirty_count(&self) -> usize {
        self.dirty.len()
    }

    /// Takes the dirty inodes (ascending inode order, so write-back walks the tree in order) and
    /// marks them clean.
    pub fn take_dirty(&mut self) -> Vec<(u64, InodeItem)> {
        let mut inos = std::mem::take(&mut self.dirty);
        inos.sort_unstable();
        inos.dedup();
        let mut out = Vec::with_capacity(inos.len());
        for ino in inos {
            if let Some(s) = self.map.get_mut(&ino) {
                if s.dirty {
                    s.dirty = false;
                    out.push((ino, s.item));
                }
            }
        }
        out
    }

    /// Drops clean inodes down to half the limit. Dirty ones stay until commit.
    fn shrink(&mut self) {
        let target = self.limit / 2;
        let mut excess = self.map.len().saturating_sub(target);
        self.map.retain(|_, s| {
            if excess == 0 || s.dirty {
                return true;
            }
            excess -= 1;
            false
        });
    }

    pub fn clear(&mut self) {
        self.map.clear();
        self.dirty.clear();
    }
}
