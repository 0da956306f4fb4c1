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
    /// True if `dir` is `anc` or lies below it. One parent per level, from the inode cache's
    /// map of parents where it has them (`crate::dir_parents`), else from the tree.
    pub(super) fn is_within(&mut self, mut dir: Ino, anc: Ino) -> Result<bool> {
        // A directory met twice on the way up is a cycle: corruption. (A cap on the walk
        // would call a deep but valid tree corrupt, and one from the image's inode count
        // would let a damaged image spin for ever.) Brent's method finds one without a set
        // of every directory passed: `mark` is the directory met at the last power of two
        // steps since the one before, so a cycle brings the walk back to it within twice
        // the walk's length to the cycle and around it.
        let (mut mark, mut steps, mut span) = (dir, 0u64, 1u64);
        loop {
            if dir == anc {
                return Ok(true);
            }
            if dir == ROOT_INO {
                return Ok(false);
            }
            dir = self.parent_of(dir)?;
            if dir == mark {
                return Err(idxfs_format::Corrupt::new(
                    format!("directory {dir} ancestry"),
                    "a cycle",
                    "a path to the root",
                )
                .into());
            }
            steps += 1;
            if steps == span {
                (mark, steps, span) = (dir, 0, span.saturating_mul(2));
            }
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

#[cfg(test)]
mod tests {
    use crate::fs::{Fs, MkfsOptions, OpenOptions, Owner};
    use crate::Error;
    use idxfs_blockdev::MemDevice;
    use idxfs_format::items::encode_names;
    use idxfs_format::{ItemType, Key, ROOT_INO};
    use std::sync::Arc;

    const ME: Owner = Owner { uid: 0, gid: 0 };

    /// A walk up that meets a cycle (a damaged image whose directories name each other as
    /// parents) is corruption, found at any cycle length; the map of parents answers what
    /// the tree does.
    #[test]
    fn a_cycle_of_parents_is_corruption_at_any_length() {
        for len in [1u64, 2, 3, 5, 8, 13] {
            let dev = Arc::new(MemDevice::new(64 << 20));
            Fs::mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
            let fs = Fs::open(dev, OpenOptions::default()).expect("open");
            // A chain root/d0/d1/.../d{len+2}, then d2's back reference pointed at the
            // last: d2 -> d{len+1} -> ... -> d3 -> d2 is a cycle `len` long.
            let mut chain = vec![ROOT_INO];
            for i in 0..len + 2 {
                let d = fs.mkdir(
                    *chain.last().expect("root"),
                    format!("d{i}").as_bytes(),
                    0o755,
                    ME,
                );
                chain.push(d.expect("mkdir").ino);
            }
            let other = fs.mkdir(ROOT_INO, b"other", 0o755, ME).expect("mkdir").ino;
            let mut g = fs.lock();
            let (d2, last) = (chain[3], *chain.last().expect("chain"));
            assert!(!g.is_within(last, other).expect("a sound walk"));
            assert!(g.is_within(last, chain[1]).expect("a sound walk"));
            assert_eq!(g.inodes.parents.get(d2), Some(chain[2]), "remembered");
            let mut tree = g.fs_tree;
            tree.delete(&mut g.store, &Key::new(d2, ItemType::InodeRef, chain[2]))
                .expect("delete");
            let name = encode_names(&[b"d2".to_vec()]);
            tree.put(&mut g.store, Key::new(d2, ItemType::InodeRef, last), name)
                .expect("put");
            g.fs_tree = tree;
            g.inodes.parents.forget(d2);
            match g.is_within(last, other) {
                Err(Error::Corrupt(c)) => assert!(c.to_string().contains("a cycle"), "{c}"),
                r => panic!("cycle of {len}: {r:?}"),
            }
        }
    }
}
