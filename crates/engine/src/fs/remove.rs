//! unlink, rmdir, and dropping a link of an inode.
//!
//! Neither reserves space by the size of what goes away: the inode whose last name goes is
//! freed in batches of one leaf each (`orphan`), so deleting a file of any number of extents
//! or xattrs works on a full file system, with the global reserve.
use super::{Durable, Fs, Inner, Ino, Reserve};
use crate::error::{Error, Result};
use idxfs_format::items::{S_IFDIR, S_IFMT};

/// Item changes an unlink makes at most: the two index records and the back reference, and
/// the first freeing batch of the inode if that was its last name (later batches reserve for
/// themselves).
const UNLINK_ITEMS: u64 = 6;

impl Inner {
    /// Drops one link of `ino` (its entry is already gone); frees it at zero.
    pub(crate) fn drop_link(&mut self, ino: Ino) -> Result<()> {
        let now = self.now();
        let it = self.modify_inode(ino, |i| {
            i.nlink = i.nlink.get().saturating_sub(1).into();
            i.ctime = now;
        })?;
        if it.nlink.get() == 0 {
            self.unlinked(ino)?;
        }
        Ok(())
    }

    /// Removes an empty directory `ino` named `name` in `parent`.
    pub(crate) fn remove_dir(&mut self, parent: Ino, name: &[u8], ino: Ino) -> Result<()> {
        self.remove_entry(parent, name, ino)?;
        let now = self.now();
        self.modify_inode(parent, |p| p.nlink = p.nlink.get().saturating_sub(1).into())?;
        // Both of its links ("." and its name) go at once.
        self.modify_inode(ino, |d| {
            d.nlink = 0.into();
            d.ctime = now;
        })?;
        self.unlinked(ino)
    }

    pub(crate) fn check_rmdir(&mut self, ino: Ino) -> Result<()> {
        let it = self.dir_inode(ino)?;
        if it.size.get() != 0 {
            return Err(Error::NotEmpty);
        }
        Ok(())
    }
}

impl Fs {
    pub fn unlink(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.write_op(UNLINK_ITEMS, Reserve::Shrink, Durable::Dir, |g| {
            g.dir_inode(parent)?;
            let e = g.lookup_entry(parent, name)?.ok_or(Error::NotFound)?;
            let it = g.inode(e.ino)?;
            if it.mode.get() & S_IFMT == S_IFDIR {
                return Err(Error::IsDir);
            }
            g.remove_entry(parent, name, e.ino)?;
            g.drop_link(e.ino)
        })?;
        self.release_orphans();
        Ok(())
    }

    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.write_op(UNLINK_ITEMS, Reserve::Shrink, Durable::Dir, |g| {
            g.dir_inode(parent)?;
            if name == b"." {
                return Err(Error::Invalid("rmdir of ."));
            }
            if name == b".." {
                return Err(Error::NotEmpty);
            }
            let e = g.lookup_entry(parent, name)?.ok_or(Error::NotFound)?;
            g.check_rmdir(e.ino)?;
            g.remove_dir(parent, name, e.ino)
        })?;
        self.release_orphans();
        Ok(())
    }
}
