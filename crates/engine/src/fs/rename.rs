//! rename, with RENAME_NOREPLACE and RENAME_EXCHANGE.
use super::dir::EntryPlan;
use super::{Durable, Fs, Inner, Ino, Reserve, RENAME_EXCHANGE, RENAME_NOREPLACE};
use crate::error::{Error, Result};
use idxfs_format::items::{dir_entry_size, dtype_of_mode, S_IFDIR, S_IFMT};
use idxfs_format::ROOT_INO;

/// Item changes a rename makes at most: three records out and three in for each of two names,
/// and the first freeing batch of a replaced inode.
const RENAME_ITEMS: u64 = 13;

impl Inner {
    /// True if `dir` is `anc` or lies below it.
    pub(super) fn is_within(&mut self, mut dir: Ino, anc: Ino) -> Result<bool> {
        // A directory met twice on the way up is a cycle: corruption. (A cap on the walk
        // would call a deep but valid tree corrupt, and one from the image's inode count
        // would let a damaged image spin for ever.)
        let mut seen = std::collections::HashSet::new();
        loop {
            if dir == anc {
                return Ok(true);
            }
            if dir == ROOT_INO {
                return Ok(false);
            }
            if !seen.insert(dir) {
                return Err(idxfs_format::Corrupt::new(
                    format!("directory {dir} ancestry"),
                    "a cycle",
                    "a path to the root",
                )
                .into());
            }
            dir = self.parent_of(dir)?;
        }
    }

    fn is_dir(&mut self, ino: Ino) -> Result<bool> {
        Ok(self.inode(ino)?.mode.get() & S_IFMT == S_IFDIR)
    }

    /// Moves the entry (p1, n1) -> ino to (p2, n2), fixing directory link counts.
    fn move_entry(
        &mut self,
        p1: Ino,
        n1: &[u8],
        p2: Ino,
        n2: &[u8],
        ino: Ino,
        plan: EntryPlan,
    ) -> Result<()> {
        let it = self.inode(ino)?;
        self.remove_entry(p1, n1, ino)?;
        self.add_entry(p2, n2, ino, dtype_of_mode(it.mode.get()), plan)?;
        if it.mode.get() & S_IFMT == S_IFDIR && p1 != p2 {
            self.modify_inode(p1, |p| p.nlink = p.nlink.get().saturating_sub(1).into())?;
            self.modify_inode(p2, |p| p.nlink = (p.nlink.get() + 1).into())?;
        }
        let now = self.now();
        self.modify_inode(ino, |i| i.ctime = now)?;
        Ok(())
    }
}

impl Fs {
    pub fn rename(&self, p1: Ino, n1: &[u8], p2: Ino, n2: &[u8], flags: u32) -> Result<()> {
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || flags == RENAME_NOREPLACE | RENAME_EXCHANGE
        {
            return Err(Error::Invalid("rename flags"));
        }
        // Names move, nothing grows: renames may use the global reserve, so a full file system
        // can still replace a file (the usual way to save one).
        self.write_op(RENAME_ITEMS, Reserve::Shrink, Durable::Dir, |g| {
            g.dir_inode(p1)?;
            g.dir_inode(p2)?;
            for n in [n1, n2] {
                if n == b"." || n == b".." {
                    return Err(Error::Invalid("rename of . or .."));
                }
            }
            Inner::check_name(n2)?;
            let (src, src_item_len) = g.lookup_slot(p1, n1)?;
            let src = src.ok_or(Error::NotFound)?;
            let (dst, dst_item_len) = g.lookup_slot(p2, n2)?;
            // Each name's new record replaces one of the same name (or none): the hash item
            // has room for it if it has room with that record gone.
            let n1_len = src_item_len.saturating_sub(dir_entry_size(n1.len()));
            let n2_len =
                dst_item_len.saturating_sub(dst.as_ref().map_or(0, |_| dir_entry_size(n2.len())));
            let src_dir = g.is_dir(src.ino)?;
            if p1 == p2 && n1 == n2 {
                return Ok(());
            }
            // A directory may not move below itself (nor can it, within its own parent:
            // the walk up from a directory as deep as n costs n lookups under the lock).
            if src_dir && p1 != p2 && g.is_within(p2, src.ino)? {
                return Err(Error::Invalid("rename of a directory into its own subtree"));
            }
            if flags & RENAME_EXCHANGE != 0 {
                let dst = dst.ok_or(Error::NotFound)?;
                let dst_dir = g.is_dir(dst.ino)?;
                if dst_dir && p1 != p2 && g.is_within(p1, dst.ino)? {
                    return Err(Error::Invalid("rename of a directory into its own subtree"));
                }
                if src.ino == dst.ino {
                    return Ok(());
                }
                let plan1 = g.plan_entry(p1, n1, dst.ino, n1_len, false)?;
                let plan2 = g.plan_entry(p2, n2, src.ino, n2_len, false)?;
                // Take both names out, then put them back crosswise.
                g.remove_entry(p1, n1, src.ino)?;
                g.remove_entry(p2, n2, dst.ino)?;
                g.add_entry(p1, n1, dst.ino, dst.dtype, plan1)?;
                g.add_entry(p2, n2, src.ino, src.dtype, plan2)?;
                if p1 != p2 && src_dir != dst_dir {
                    let (from, to) = if src_dir { (p1, p2) } else { (p2, p1) };
                    g.modify_inode(from, |p| p.nlink = p.nlink.get().saturating_sub(1).into())?;
                    g.modify_inode(to, |p| p.nlink = (p.nlink.get() + 1).into())?;
                }
                let now = g.now();
                g.modify_inode(src.ino, |i| i.ctime = now)?;
                g.modify_inode(dst.ino, |i| i.ctime = now)?;
                return Ok(());
            }
            if let Some(dst) = &dst {
                if flags & RENAME_NOREPLACE != 0 {
                    return Err(Error::Exists);
                }
                if dst.ino == src.ino {
                    // Two names of one inode: POSIX says do nothing.
                    return Ok(());
                }
                let dst_dir = g.is_dir(dst.ino)?;
                match (src_dir, dst_dir) {
                    (true, false) => return Err(Error::NotDir),
                    (false, true) => return Err(Error::IsDir),
                    (true, true) => g.check_rmdir(dst.ino)?,
                    (false, false) => {}
                }
            }
            let plan = g.plan_entry(p2, n2, src.ino, n2_len, false)?;
            if let Some(dst) = dst {
                // The replaced inode's data, if this was its last name, is freed in bounded
                // batches (`Inner::unlinked`), so no reservation grows with its size.
                if g.is_dir(dst.ino)? {
                    g.remove_dir(p2, n2, dst.ino)?;
                } else {
                    g.remove_entry(p2, n2, dst.ino)?;
                    g.drop_link(dst.ino)?;
                }
            }
            g.move_entry(p1, n1, p2, n2, src.ino, plan)
        })?;
        self.release_orphans();
        Ok(())
    }
}
