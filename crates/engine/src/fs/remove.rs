//! unlink, rmdir, and freeing an inode whose last link went away.
use super::{Fs, Inner, Ino, Reserve};
use crate::error::{Error, Result};
use idxfs_format::items::{decode_extent, EXTENT_INLINE, S_IFDIR, S_IFMT};
use idxfs_format::Corrupt;
use idxfs_format::{ItemType, Key};

impl Inner {
    /// Deletes every item of an inode with no links left: data, xattrs, the inode item.
    pub(crate) fn delete_inode(&mut self, ino: Ino) -> Result<()> {
        // Blocks to give back only when some are allocated (fsck holds `alloc_bytes` to the
        // sum of the extents); otherwise at most the inline extent remains, an item like the
        // others below, and the file costs no search of its extents.
        let has_blocks = self.inode(ino)?.alloc_bytes.get() > 0;
        if has_blocks {
            self.free_all_data(ino)?;
        }
        let tree = self.fs_tree;
        let total = self.store.total_blocks;
        let mut keys = Vec::new();
        tree.scan(
            &mut self.store,
            Key::new(ino, ItemType::Inode, 0),
            Key::new(ino + 1, ItemType::Inode, 0),
            |k, v| {
                if k.ty == ItemType::Extent as u8 {
                    // Deleting the item of an extent with blocks would leak them.
                    let what = format_args!("extent {k} of inode {ino} without blocks");
                    let (e, _) = decode_extent(v, what, total)?;
                    if e.kind != EXTENT_INLINE {
                        return Err(Corrupt::new(what.to_string(), e.kind, "inline").into());
                    }
                }
                keys.push(*k);
                Ok(true)
            },
        )?;
        for k in keys {
            self.fs_tree.delete(&mut self.store, &k)?;
        }
        self.inodes.remove(ino);
        self.inode_count -= 1;
        Ok(())
    }

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
        self.write_op(6, Reserve::Shrink, |g| {
            g.dir_inode(parent)?;
            let e = g.lookup_entry(parent, name)?.ok_or(Error::NotFound)?;
            let it = g.inode(e.ino)?;
            if it.mode.get() & S_IFMT == S_IFDIR {
                return Err(Error::IsDir);
            }
            // Data may need one item change per extent.
            let extents = if it.nlink.get() == 1 {
                g.extent_items_bound(e.ino, &it)?
            } else {
                0
            };
            g.reserve(extents, Reserve::Shrink)?;
            g.remove_entry(parent, name, e.ino)?;
            g.drop_link(e.ino)
        })
    }

    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> Result<()> {
        self.write_op(8, Reserve::Shrink, |g| {
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
        })
    }
}
