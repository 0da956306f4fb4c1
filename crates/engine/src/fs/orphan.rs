//! Orphans: inodes whose freeing outlives the operation that started it.
//!
//! Two kinds (`OrphanKind`), one ORPHAN item `(ORPHAN_OBJECTID, Orphan, ino)` each:
//! - *Free*: the inode's last name is gone, but it is still held, or too large to free in one
//!   bounded batch. A front end *pins* an inode while a holder can still use it by number
//!   (the FUSE front end once for every reply that raises the kernel's lookup count, unpinned
//!   on `forget`; a library user while it has a file open). When the last name of a pinned
//!   inode goes, the inode stays (nlink 0); the last unpin frees it. Freeing goes in batches
//!   of one leaf of its items each (`free_inode_batch`), each batch its own operation, so no
//!   reservation grows with the file's size.
//! - *Trim*: a linked inode whose extents past its size are still to be freed, because a
//!   truncate took more than one batch (`Inner::trim_past_size`): the batches after the
//!   first run as operations of their own once the truncate's returns, as a Free orphan's.
//!
//! The ORPHAN item is written by the commit (or an fsync batch), not by the operation: until
//! then the operation itself is not durable either, and an orphan freed before the commit
//! (`rm` of a file the kernel forgets a moment later: nearly every one) never costs an item.
//!
//! Pins live in memory only. After a crash the image still lists its orphans, and the next
//! read-write open finishes them all (`reclaim_orphans`); a clean close does the same, since
//! nothing can hold an inode of a closed file system.
use super::{Durable, Fs, Inner, Ino, Reserve};
use crate::counters::Counters;
use crate::error::Result;
use idxfs_format::items::{decode_orphan, OrphanKind};
use idxfs_format::{Corrupt, ItemType, Key, ORPHAN_OBJECTID};
use std::collections::BTreeMap;

fn orphan_key(ino: Ino) -> Key {
    Key::new(ORPHAN_OBJECTID, ItemType::Orphan, ino)
}

/// When the mount's inodes may go: who holds them, which are orphans, which wait to be freed.
#[derive(Default)]
pub(crate) struct Lives {
    /// Pin counts of inodes a front end still holds; shared with `Fs`, which pins without
    /// the operation lock (`pins`).
    pub pins: std::sync::Arc<super::pins::Pins>,
    /// Inodes being freed, or trimmed, across operations.
    pub orphans: Orphans,
    /// Inodes whose last name an operation removed while nothing held them, too large to
    /// free in one batch, and inodes a truncate left a `Trim` orphan: freed in batches once
    /// the operation returns.
    pub release: Vec<Ino>,
}

/// The orphans this mount knows: those with an item in the fs tree, and those whose item
/// (new, or of a new kind) the next commit writes.
#[derive(Debug, Default)]
pub(crate) struct Orphans {
    stored: BTreeMap<Ino, OrphanKind>,
    pending: BTreeMap<Ino, OrphanKind>,
}

impl Orphans {
    pub fn kind(&self, ino: Ino) -> Option<OrphanKind> {
        self.pending
            .get(&ino)
            .or_else(|| self.stored.get(&ino))
            .copied()
    }

    pub fn is_free(&self, ino: Ino) -> bool {
        self.kind(ino) == Some(OrphanKind::Free)
    }

    /// Records `ino` as an orphan of `kind` (a Free orphan replaces a Trim one: freeing the
    /// inode frees what the trim was to free).
    pub fn add(&mut self, ino: Ino, kind: OrphanKind) {
        debug_assert!(
            !self.is_free(ino),
            "inode {ino} orphaned twice (nlink 0 cannot be linked again)"
        );
        self.pending.insert(ino, kind);
    }

    /// Items the next commit writes.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Every orphan, in inode order.
    pub fn all(&self) -> Vec<(Ino, OrphanKind)> {
        let mut m = self.stored.clone();
        m.extend(self.pending.iter().map(|(i, k)| (*i, *k)));
        m.into_iter().collect()
    }
}

impl Inner {
    pub(crate) fn trimming(&self, ino: Ino) -> bool {
        self.lives.orphans.kind(ino) == Some(OrphanKind::Trim)
    }

    /// The last name of `ino` is gone (its nlink is already 0). Freed now when nothing holds
    /// it and one batch takes all of it (nearly every file); else an orphan, freed in batches
    /// once released (`Fs::release_orphans` after this operation, for one nothing holds).
    pub(crate) fn unlinked(&mut self, ino: Ino) -> Result<()> {
        if self.bury(ino) {
            if self.free_inode_batch(ino)? {
                return Ok(());
            }
            self.lives.release.push(ino);
        } else {
            self.lives.pins.releases.kept_one();
        }
        self.lives.orphans.add(ino, OrphanKind::Free);
        Ok(())
    }

    /// Frees one batch of `ino`'s items: those of one leaf, from its last item down (its
    /// extents first, their blocks with them); the inode item goes last, and with it the
    /// inode and its orphan. Returns whether the inode is gone. Between batches the inode is
    /// a consistent orphan: fewer extents, and `alloc_bytes` to match.
    pub(crate) fn free_inode_batch(&mut self, ino: Ino) -> Result<bool> {
        let lo = Key::new(ino, ItemType::Inode, 0);
        let hi = Key::new(ino + 1, ItemType::Inode, 0);
        let batch = self.free_batch_items();
        let removed = self.fs_tree.delete_batch(&mut self.store, lo, hi, batch)?;
        Counters::inc(&self.store.counters.free_batches);
        let mut freed = 0;
        let mut gone = removed.is_empty();
        for (k, v) in &removed {
            match k.item_type() {
                Some(ItemType::Inode) => {
                    gone = true;
                    self.lives.pins.unbury(ino);
                }
                Some(ItemType::Extent) => freed += self.free_extent_item(k, v)?,
                _ => {}
            }
        }
        if !gone {
            if freed > 0 {
                self.modify_inode(ino, |i| {
                    i.alloc_bytes = i
                        .alloc_bytes
                        .get()
                        .saturating_sub(freed * idxfs_format::BLOCK_SIZE)
                        .into()
                })?;
            }
            return Ok(false);
        }
        self.inodes.remove(ino);
        self.txn.inode_count -= 1;
        if self.lives.orphans.kind(ino).is_some() {
            self.drop_orphan(ino)?;
        }
        Ok(true)
    }

    /// Forgets `ino`'s orphan: the pending record, and the item if one was written.
    pub(crate) fn drop_orphan(&mut self, ino: Ino) -> Result<()> {
        self.lives.orphans.pending.remove(&ino);
        if self.lives.orphans.stored.remove(&ino).is_some() {
            self.fs_tree.delete(&mut self.store, &orphan_key(ino))?;
        }
        Ok(())
    }

    /// Writes the ORPHAN items the running transaction owes (at commit, and before an fsync
    /// batch).
    pub(crate) fn write_new_orphans(&mut self) -> Result<()> {
        let mut hint = crate::btree::LeafHint::default();
        while let Some((ino, kind)) = self.lives.orphans.pending.pop_first() {
            let v = kind.encode();
            match self.lives.orphans.stored.insert(ino, kind) {
                None => {
                    let had =
                        self.fs_tree
                            .insert_near(&mut self.store, orphan_key(ino), v, &mut hint)?;
                    if had.is_some() {
                        // The image had an item this mount did not know of: it lied about an
                        // inode that was live.
                        return Err(Corrupt::new(
                            format!("orphan item of inode {ino}"),
                            "present before this mount made it",
                            "absent",
                        )
                        .into());
                    }
                }
                Some(old) if old != kind => {
                    self.fs_tree.put(&mut self.store, orphan_key(ino), v)?;
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Reads the orphan items of the image (at open), checking each against its inode: a
    /// Free orphan has no links, a Trim orphan has some. Freeing a live inode because the
    /// image said so would lose a file, so a mismatch is corruption.
    pub(crate) fn load_orphans(&mut self) -> Result<()> {
        let tree = self.fs_tree;
        let mut found = Vec::new();
        let mut bad = None;
        tree.scan(
            &mut self.store,
            orphan_key(0),
            orphan_key(u64::MAX),
            |k, v| {
                match decode_orphan(v, k.offset) {
                    Ok(kind) => found.push((k.offset, kind)),
                    Err(e) => bad = Some(e),
                }
                Ok(bad.is_none())
            },
        )?;
        if let Some(e) = bad {
            return Err(e.into());
        }
        for (ino, kind) in found {
            let nlink = self.inode(ino)?.nlink.get();
            if (kind == OrphanKind::Free) != (nlink == 0) {
                return Err(Corrupt::new(
                    format!("orphan item of inode {ino} ({kind:?})"),
                    format!("link count {nlink}"),
                    if kind == OrphanKind::Free {
                        "0"
                    } else {
                        "at least 1"
                    },
                )
                .into());
            }
            self.lives.orphans.stored.insert(ino, kind);
        }
        Ok(())
    }

    /// Pins `ino`, just made or linked by this operation, when the front end holds what
    /// operations return (`Fs::hold_made`): under the operation lock, so no unlink comes
    /// between the name and the pin.
    pub(crate) fn hold_made(&mut self, ino: Ino) {
        if self.lives.pins.holds_made() && self.lives.pins.add(ino) != super::pins::Pin::Pinned {
            Counters::inc(&self.store.counters.pin_alloc_failures);
        }
    }

    /// Whether `ino`, whose last name is gone, may be freed: nothing pins it, and no pin can
    /// come any more (`Pins::bury`).
    pub(crate) fn bury(&mut self, ino: Ino) -> bool {
        self.lives.pins.bury(ino).unwrap_or_else(|()| {
            Counters::inc(&self.store.counters.pin_alloc_failures);
            true
        })
    }

    /// True when `ino` is an orphan nobody pins any more.
    fn is_free_orphan(&mut self, ino: Ino) -> bool {
        !self.lives.pins.contains(ino) && self.lives.orphans.is_free(ino)
    }

    /// `ino`'s inode for a read or a write of its data: NotFound once its last name is gone
    /// and nothing pins it. Such an inode is being freed in batches between operations
    /// (extents first, the inode item last), so between two batches it would read as its
    /// old size of zeros; nobody holds it, so nobody may reach it by number any more (a FUSE
    /// mount pins every inode the kernel can reach, so this is what a library caller
    /// without a pin gets, the ENOENT it gets once the inode is gone).
    pub(crate) fn held_inode(&mut self, ino: Ino) -> Result<idxfs_format::items::InodeItem> {
        if self.is_free_orphan(ino) {
            return Err(crate::Error::NotFound);
        }
        self.inode(ino)
    }
}

impl Fs {
    /// Holds `ino` alive past its last unlink until a matching `unpin`. False when it cannot
    /// be held: its last name went before this pin, nothing held it, and it is being freed
    /// (or the pin index could not allocate). Every later request for it then gets NotFound,
    /// as once it is gone; an `unpin` of it does nothing. Takes no operation lock (`pins`).
    pub fn pin(&self, ino: Ino) -> bool {
        self.pin_many(&[ino]) == 0
    }

    /// Tells the engine that the caller holds (pins) every inode that create, mknod, mkdir,
    /// symlink and link return, as a FUSE front end does with the kernel's lookup count:
    /// those operations then pin it themselves before they let go of the lock, so an
    /// unlink by someone else cannot come between the new name and the pin (the creator's
    /// open file would then name a freed inode). Unpin it as any other pin.
    pub fn hold_made(&self) {
        self.hand.pins.hold_made();
    }

    /// Whether `hold_made` was called: every inode an operation makes comes pinned.
    pub fn holds_made(&self) -> bool {
        self.hand.pins.holds_made()
    }

    /// `pin` for each of `inos`, under one lock of the pins: how many it could not hold.
    pub fn pin_many(&self, inos: &[Ino]) -> usize {
        self.pin_all(inos)
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
            let mut free = Vec::new();
            for &(ino, n) in list {
                if g.lives.pins.drop_pins(ino, n) == Some(true)
                    && g.lives.orphans.is_free(ino)
                    && g.bury(ino)
                {
                    free.push(ino);
                }
            }
            if free.is_empty() || g.writable().is_err() {
                return Ok(());
            }
            free
        };
        let r = self.free_orphans(&free);
        for _ in &free {
            self.hand.pins.releases.released_one();
        }
        r
    }

    /// Finishes every orphan nobody pins: at mount (after a crash, none is pinned) and at
    /// close. Returns how many were finished.
    pub fn reclaim_orphans(&self) -> Result<u64> {
        let list = {
            let g = self.lock();
            if g.writable().is_err() {
                return Ok(0);
            }
            g.lives.orphans.all()
        };
        let mut done = 0;
        for (ino, kind) in list {
            match kind {
                OrphanKind::Free => self.free_orphans(&[ino])?,
                OrphanKind::Trim => {
                    self.write_op(0, Reserve::Shrink, Durable::Never, |g| {
                        if g.trimming(ino) {
                            g.finish_trim(ino)?;
                        }
                        Ok(())
                    })?;
                }
            }
            done += 1;
        }
        Ok(done)
    }

    /// Frees orphans nobody holds, and trims `Trim` orphans, each in batches, one operation
    /// per batch: other operations go on between them, and each reserves for one batch
    /// only. A batch refused for lack of space leaves the orphan for a later release (the
    /// next close or open; a trim, also the next change that would make it visible).
    pub(crate) fn free_orphans(&self, inos: &[Ino]) -> Result<()> {
        for &ino in inos {
            loop {
                let r = self.write_op(1, Reserve::Shrink, Durable::Never, |g| {
                    // Checked again under this lock: a pin may have come meanwhile, or
                    // another operation finished the trim.
                    if g.trimming(ino) {
                        return g.trim_batch(ino);
                    }
                    if !g.is_free_orphan(ino) {
                        return Ok(true);
                    }
                    g.free_inode_batch(ino)
                });
                match r {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(crate::Error::NoSpace) => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Frees what this mount's operations left to free after they returned: inodes unlinked
    /// while nothing held them, too large for one batch, and what a truncate cut off past
    /// the first batch (`Inner::trim_past_size`). The operation that left them has
    /// succeeded whatever happens here: an error stopped the file system (and is kept as its
    /// cause), and an orphan not freed now is freed at the next close or open.
    pub(crate) fn release_orphans(&self) {
        let list = std::mem::take(&mut self.lock().lives.release);
        if !list.is_empty() {
            let _ = self.free_orphans(&list);
        }
    }

    /// Orphans this mount knows (for tests and tools).
    pub fn orphans(&self) -> Result<Vec<Ino>> {
        Ok(self
            .lock()
            .lives
            .orphans
            .all()
            .into_iter()
            .map(|(i, _)| i)
            .collect())
    }
}
