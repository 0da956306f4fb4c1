//! The in-memory inode cache: inodes found by number through an XArray (seed 000), in a slab,
//! with changed inodes carrying the XArray's DIRTY mark.
//!
//! The cache is authoritative for the inodes it holds: changes to an inode (times, size, link
//! count) are made here and marked dirty, and written into the fs tree once per commit rather
//! than once per change. That is why a million creates in one directory update the directory's
//! inode item once per commit, not a million times. Commit walks the DIRTY mark, which yields
//! inodes in ascending order, so write-back walks the tree in order.
//!
//! Every inode whose cached item was installed, changed or removed (freed) is also listed in
//! `changed`, so the operation that changed it can publish the new items for lock-free readers
//! when it ends (`fs::published`). Dropping a clean inode to make room is not a change.
use crate::btree::cache::{Slab, DIRTY};
use crate::dir_parents::DirParents;
use idxfs_format::items::InodeItem;

pub struct InodeCache {
    slab: Slab<Slot>,
    dirty: usize,
    limit: usize,
    /// Inodes installed, changed or removed since the last `take_changed` (repeats possible).
    changed: Vec<u64>,
    /// Directories' parents (`dir_parents`): here so that they go wherever the inodes go.
    pub parents: DirParents,
}

struct Slot {
    ino: u64,
    item: InodeItem,
    dirty: bool,
}

impl InodeCache {
    pub fn new(limit: usize) -> Self {
        InodeCache {
            slab: Slab::default(),
            dirty: 0,
            limit: limit.max(16),
            changed: Vec::new(),
            parents: DirParents::new(limit.saturating_mul(4)),
        }
    }

    /// The most inodes it keeps.
    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn get(&mut self, ino: u64) -> Option<&InodeItem> {
        self.slab.get(ino).map(|s| &s.item)
    }

    /// Installs an inode read from the tree: clean.
    pub fn insert_clean(&mut self, ino: u64, item: InodeItem) {
        if self.slab.contains(ino) {
            return;
        }
        if self.slab.len() >= self.limit {
            self.shrink();
        }
        self.slab.insert(
            ino,
            Slot {
                ino,
                item,
                dirty: false,
            },
        );
        self.changed.push(ino);
    }

    /// Changes a cached inode and marks it for write-back. The inode must be cached.
    pub fn modify(&mut self, ino: u64, f: impl FnOnce(&mut InodeItem)) {
        let Some(slot) = self.slab.get(ino) else {
            panic!("modify of uncached inode {ino}")
        };
        f(&mut slot.item);
        self.changed.push(ino);
        if !slot.dirty {
            slot.dirty = true;
            self.dirty += 1;
            self.slab.set_mark(ino, DIRTY);
        }
    }

    /// The inode was freed.
    pub fn remove(&mut self, ino: u64) {
        self.changed.push(ino);
        self.parents.forget(ino);
        if let Some(s) = self.slab.remove(ino) {
            if s.dirty {
                self.dirty -= 1;
            }
        }
    }

    pub fn dirty_count(&self) -> usize {
        self.dirty
    }

    /// Takes the dirty inodes, ascending, and marks them clean.
    pub fn take_dirty(&mut self) -> Vec<(u64, InodeItem)> {
        let inos = self.slab.marked(DIRTY);
        let mut out = Vec::with_capacity(inos.len());
        for ino in inos {
            self.slab.clear_mark(ino, DIRTY);
            if let Some(s) = self.slab.get(ino) {
                s.dirty = false;
                out.push((ino, s.item));
            }
        }
        debug_assert_eq!(
            out.len(),
            self.dirty,
            "dirty count drifted from the DIRTY mark"
        );
        self.dirty = 0;
        out
    }

    /// Drops clean inodes down to half the limit. Dirty ones stay until commit.
    fn shrink(&mut self) {
        let target = self.limit / 2;
        let excess = self.slab.len().saturating_sub(target);
        let victims: Vec<u64> = self
            .slab
            .values_mut()
            .filter(|s| !s.dirty)
            .take(excess)
            .map(|s| s.ino)
            .collect();
        // Not recorded as changed: a dropped clean inode's item is the tree's, so what was
        // published of it stays true (`fs::published`).
        for ino in victims {
            self.slab.remove(ino);
        }
    }

    /// The inodes installed, changed or removed since the last call, each once, with the
    /// item cached now (None: freed, or dropped to make room after the change; either way
    /// its published copy goes).
    pub fn take_changed(&mut self) -> Vec<(u64, Option<InodeItem>)> {
        if self.changed.is_empty() {
            return Vec::new();
        }
        let mut inos = std::mem::take(&mut self.changed);
        inos.sort_unstable();
        inos.dedup();
        inos.into_iter()
            .map(|ino| (ino, self.slab.get(ino).map(|s| s.item)))
            .collect()
    }
}
