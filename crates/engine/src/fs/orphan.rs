//! Inodes whose last name is gone while something still holds them ("orphans").
//!
//! A front end *pins* an inode while a holder can still use it by number: the FUSE front end
//! pins once for every reply that raises the kernel's lookup count and unpins on `forget`; a
//! library user pins while it has a file open. When the last name of a pinned inode goes, the
//! inode item stays (nlink 0) and an ORPHAN item `(ORPHAN_OBJECTID, Orphan, ino)` records it in
//! the same transaction. The last unpin frees the inode and drops the orphan item.
//!
//! The ORPHAN item is written by the commit, not by the unlink: until then the unlink itself is
//! not durable either, and an orphan freed before the commit (`rm` of a file the kernel forgets
//! a moment later: nearly every one) never costs an item. Between the unlink and the commit the
//! orphan is listed in `Inner::new_orphans`.
//!
//! Pins live in memory only. After a crash the image still lists its orphans, and the next
//! read-write open frees them all (`reclaim_orphans`); a clean close does the same, since
//! nothing can hold an inode of a closed file system.
use super::{Fs, Inner, Ino, Reserve};
use crate::counters::Counters;
use crate::error::Result;
use idxfs_format::{ItemType, Key, ORPHAN_OBJECTID};

fn orphan_key(ino: Ino) -> Key {
    Key::new(ORPHAN_OBJECTID, ItemType::Orphan, ino)
}

impl Inner {
    /// The last name of `ino` is gone (its nlink is already 0): free it now, or keep it as an
    /// orphan while it is pinned.
    pub(crate) fn unlinked(&mut self, ino: Ino) -> Result<()> {
        if self.pins.contains(ino) {
            let new = self.new_orphans.insert(ino);
            debug_assert!(new, "inode {ino} orphaned twice");
            Ok(())
        } else {
            self.delete_inode(ino)
        }
    }

    /// Frees an orphan: its data, its items, and the orphan item.
    fn free_orphan(&mut self, ino: Ino) -> Result<()> {
        self.delete_inode(ino)?;
        if !self.new_orphans.remove(&ino) {
            self.fs_tree.delete(&mut self.store, &orphan_key(ino))?;
        }
        Ok(())
    }

    /// Writes the ORPHAN items of this transaction's orphans still held (at commit).
    pub(crate) fn write_new_orphans(&mut self) -> Result<()> {
        let mut hint = crate::btree::LeafHint::default();
        while let Some(ino) = self.new_orphans.pop_first() {
            let had = self.fs_tree.insert_near(
                &mut self.store,
                orphan_key(ino),
                Vec::new(),
                &mut hint,
            )?;
            if had.is_some() {
                // An inode orphans once (nlink 0 cannot be linked again), so the image had the
                // item before the unlink: it lied about an inode that had links.
                return Err(crate::error::Error::Corrupt(idxfs_format::Corrupt::new(
                    format!("orphan item of inode {ino}"),
                    "present before its last unlink",
                    "absent",
                )));
            }
        }
        Ok(())
    }

    /// Orphans: those the image lists and those of the running transaction, in inode order.
    fn orphan_list(&mut self) -> Result<Vec<Ino>> {
        let tree = self.fs_tree;
        let mut out = Vec::new();
        tree.scan(
            &mut self.store,
            orphan_key(0),
            orphan_key(u64::MAX),
            |k, _| {
                out.push(k.offset);
                Ok(true)
            },
        )?;
        out.extend(self.new_orphans.iter().copied());
        out.sort_unstable();
        Ok(out)
    }

    pub(crate) fn pin_all(&mut self, inos: &[Ino]) {
        for &ino in inos {
            if !self.pins.add(ino) {
                Counters::inc(&self.store.counters.pin_alloc_failures);
            }
        }
    }

    /// True when `ino` is an orphan nobody pins any more.
    fn is_free_orphan(&mut self, ino: Ino) -> Result<bool> {
        if self.pins.contains(ino) {
            return Ok(false);
        }
        if self.new_orphans.contains(&ino) {
            return Ok(true);
        }
        let tree = self.fs_tree;
        Ok(tree.get(&mut self.store, &orphan_key(ino))?.is_some())
    }
}

impl Fs {
    /// Holds `ino` alive past its last unlink until a matching `unpin`.
    pub fn pin(&self, ino: Ino) {
        self.pin_many(&[ino])
    }

    /// `pin` for each of `inos`, under one lock.
    pub fn pin_many(&self, inos: &[Ino]) {
        self.lock().pin_all(inos)
    }

    /// Drops `n` pins of `ino`; the last one frees it if it was unlinked meanwhile. Unpinning an
    /// inode that is not pinned does nothing (a front end may forget after a restart).
    pub fn unpin(&self, ino: Ino, n: u64) -> Result<()> {
        self.unpin_many(&[(ino, n)])
    }

    /// `unpin` for each `(ino, n)`, under one lock (the kernel's batched forgets).
    pub fn unpin_many(&self, list: &[(Ino, u64)]) -> Result<()> {
        let free = {
            let mut g = self.lock();
            let mut last = Vec::new();
            for &(ino, n) in list {
                if g.pins.drop_pins(ino, n) == Some(true) {
                    last.push(ino);
                }
            }
            if last.is_empty() || g.writable().is_err() {
                return Ok(());
            }
            let mut free = Vec::new();
            for ino in last {
                if g.is_free_orphan(ino)? {
                    free.push(ino);
                }
            }
            free
        };
        self.free_orphans(&free)
    }

    /// Frees every orphan nobody pins: at mount (after a crash, none is pinned) and at close.
    pub fn reclaim_orphans(&self) -> Result<u64> {
        let list = {
            let mut g = self.lock();
            if g.writable().is_err() {
                return Ok(0);
            }
            g.orphan_list()?
        };
        self.free_orphans(&list)?;
        Ok(list.len() as u64)
    }

    fn free_orphans(&self, inos: &[Ino]) -> Result<()> {
        for &ino in inos {
            self.write_op(4, Reserve::Shrink, |g| {
                // Checked again under this lock: a pin may have come meanwhile.
                if !g.is_free_orphan(ino)? {
                    return Ok(());
                }
                let it = g.inode(ino)?;
                let extents = g.extent_items_bound(ino, &it)?;
                g.reserve(extents, Reserve::Shrink)?;
                g.free_orphan(ino)
            })?;
        }
        Ok(())
    }

    /// Orphans the image lists (for tests and tools).
    pub fn orphans(&self) -> Result<Vec<Ino>> {
        self.lock().orphan_list()
    }
}
