//! Copies out of a snapshot into the file system that share the snapshot's blocks
//! (`Fs::copy_from_snapshot`: what `cp` out of `MOUNT/.snapshots` sends). Restoring a file
//! costs its extent and sum items, as a sharing copy inside the file system does (`clone`,
//! whose batches it runs); offsets that are not block-aligned, and NOCOW or inline files,
//! are copied byte by byte instead.
//!
//! A block a snapshot names is the fs tree's or held (`snapshot`), and the copy's new
//! extents name it again:
//! - a block the fs tree names gains a count, as any sharing copy's (`shared`);
//! - a held block is the fs tree's again: it leaves its held run (`Inner::adopt_blocks`),
//!   and the new extent alone names it.
//!
//! In a clone, a snapshot also names blocks of the clone's origin, which the clone may no
//! longer name, held or named by another tree: never unheld, they gain a count where the
//! clone's extent of the same file block names them, and a restore copies the others'
//! bytes (`clones`, "Restores and rollbacks into a clone").
//!
//! The new extents keep the snapshot's extent generation. None of their blocks is older, so
//! every snapshot that may name one of them is at least as new, and when the file system
//! lets go of them again they are held for all of those (`free_or_hold`).
//!
//! Held runs are roots-tree state the fsync log does not carry: after a block leaves one,
//! the next fsync commits instead of logging (a replay over the committed roots tree would
//! find it named and still held).
//!
//! The two sides are read under their own locks: the snapshot's pieces and sums under the
//! view's, then the changes under the file system's. Nothing the snapshot names changes in
//! between: it is open, so it cannot be deleted, and whether each block is the fs tree's or
//! held is decided under the file system's lock.
use super::clone::Plan;
use super::file::{check_regular, MAX_FILE_SIZE};
use super::inode_flags::is_nocow;
use super::{Fs, Inner, Ino, Kill};
use crate::error::{Error, Result};
use std::sync::Arc;

impl Fs {
    /// Whether `view` is a snapshot of this file system opened beside it (`open_snapshot`).
    pub(super) fn is_view_of_mine(&self, view: &Fs) -> bool {
        let mine = view.shared.views.of.as_ref();
        mine.is_some_and(|v| Arc::ptr_eq(&v.parent, &self.shared))
    }

    /// copy_file_range(2) from file `src` of `view`, a snapshot of this file system opened
    /// beside it (`open_snapshot`), at `src_off`, to this file system's `dst` at `dst_off`:
    /// at most `len` bytes, fewer when the source ends first; returns how many were copied.
    /// Shares the snapshot's blocks where `copy_range` would share a file's (module docs).
    #[allow(clippy::too_many_arguments)]
    pub fn copy_from_snapshot(
        &self,
        view: &Fs,
        src: Ino,
        src_off: u64,
        dst: Ino,
        dst_off: u64,
        len: u64,
        kill: Kill,
    ) -> Result<u64> {
        self.copy_from_snapshot_until(view, src, src_off, dst, dst_off, len, kill, None)
    }

    /// `copy_from_snapshot`, stopping short after the batch in progress at `until` if given,
    /// as `copy_range_until` does.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_from_snapshot_until(
        &self,
        view: &Fs,
        src: Ino,
        src_off: u64,
        dst: Ino,
        dst_off: u64,
        len: u64,
        kill: Kill,
        until: Option<std::time::Instant>,
    ) -> Result<u64> {
        if !self.is_view_of_mine(view) {
            return Err(Error::Invalid(
                "not a snapshot opened beside this file system",
            ));
        }
        self.check_lineage(view)?;
        if src_off.checked_add(len).is_none() {
            return Err(Error::Invalid("copy range past the largest offset"));
        }
        let (size, src_shares) = {
            let mut v = view.lock();
            let s = v.inode(src)?;
            check_regular(&s)?;
            (s.size.get(), !is_nocow(&s) && !v.is_inline(src, &s)?)
        };
        let len = len.min(size.saturating_sub(src_off));
        if len == 0 {
            return Ok(0);
        }
        if dst_off.checked_add(len).is_none_or(|e| e > MAX_FILE_SIZE) {
            return Err(Error::FileTooBig);
        }
        let (dst_size, dst_shares) = {
            let mut g = self.lock();
            g.writable()?;
            let d = g.held_inode(dst)?;
            check_regular(&d)?;
            (d.size.get(), !is_nocow(&d) && !g.is_inline(dst, &d)?)
        };
        let plan = Plan::of(
            src_off,
            dst_off,
            len,
            (size, dst_size),
            src_shares && dst_shares,
        );
        self.run_plan(
            plan,
            Some(view),
            (src, src_off),
            (dst, dst_off),
            kill,
            until,
        )
    }
}

impl Fs {
    /// Refuses to move blocks from `view` into the active tree when another writable tree
    /// may own some of them (`Clones::may_take_from`).
    pub(super) fn check_lineage(&self, view: &Fs) -> Result<()> {
        match self.may_take_from(view) {
            true => Ok(()),
            false => Err(Error::NotSupported(LINEAGE)),
        }
    }

    /// Whether blocks of `view`, a snapshot opened beside this file system, may move into
    /// the active tree (`Clones::may_take_from`).
    pub(super) fn may_take_from(&self, view: &Fs) -> bool {
        let id = view.shared.views.of.as_ref().map(|v| v.id());
        let g = self.lock();
        let snap = id.and_then(|id| g.snapshots.list.get(&id).map(|s| (id, s)));
        g.snapshots.clones.may_take_from(snap)
    }
}

/// Why a restore beside other writable trees is refused.
const LINEAGE: &str = "restoring from a snapshot of another subvolume, beside other \
     writable subvolumes";

impl Inner {
    /// Blocks [start, start + n), which a snapshot names, become named by one more extent of
    /// the fs tree (`link_pieces`): those it names already gain a count, held ones leave
    /// their runs.
    pub(super) fn adopt_blocks(&mut self, start: u64, n: u64) -> Result<()> {
        let mut at = start;
        for (s, k) in self.unhold(start, n)? {
            if at < s {
                self.share(at, s - at)?;
            }
            at = s + k;
        }
        if at < start + n {
            self.share(at, start + n - at)?;
        }
        Ok(())
    }
}
