//! Inode flags (`chattr`, `lsattr`: FS_IOC_GETFLAGS and FS_IOC_SETFLAGS). The one idxfs
//! knows is NOCOW (`chattr +C`): a NOCOW file's written blocks are overwritten in place
//! (`in_place`). The flags are kept in the inode item's `flags` as Linux numbers them.
//!
//! As on btrfs: a regular file takes or loses NOCOW only while it is empty (size 0); asked
//! later, the flag stays as it was and the call succeeds, so the flag always says how the
//! file's data was written. A directory takes it at any time, and passes it on to the
//! regular files and directories made in it. A flag idxfs does not have is refused
//! (`NotSupported`, EOPNOTSUPP), as the kernel's file systems refuse theirs.
use super::{Durable, Fs, Inner, Ino, Reserve};
use crate::error::{Error, Result};
use idxfs_format::items::{InodeItem, S_IFDIR, S_IFMT, S_IFREG};

/// `FS_NOCOW_FL` of `linux/fs.h`.
pub const NOCOW_FL: u64 = 0x0080_0000;
/// The flags a caller may set.
const KNOWN: u64 = NOCOW_FL;

/// Whether the inode's flags make it NOCOW.
pub fn is_nocow(it: &InodeItem) -> bool {
    it.flags.get() & NOCOW_FL != 0
}

/// The flags an inode made in a directory with `parent`'s inode starts with: NOCOW passes
/// on to regular files and directories.
pub(crate) fn inherited(parent: &InodeItem, mode: u32) -> u64 {
    match mode & S_IFMT {
        S_IFREG | S_IFDIR => parent.flags.get() & NOCOW_FL,
        _ => 0,
    }
}

impl Inner {
    /// The flags `ino` ends up with when asked for `want` (module docs).
    fn settable_flags(&mut self, ino: Ino, it: &InodeItem, want: u64) -> Result<u64> {
        if want & !KNOWN != 0 {
            return Err(Error::NotSupported(
                "inode flags other than NOCOW (chattr +C)",
            ));
        }
        let have = it.flags.get();
        Ok(match it.mode.get() & S_IFMT {
            S_IFDIR => (have & !KNOWN) | want,
            S_IFREG if it.size.get() == 0 && !self.has_extent_from(ino, 0)? => {
                (have & !KNOWN) | want
            }
            S_IFREG => have,
            _ => {
                return Err(Error::Invalid(
                    "flags of a file that is not regular or a directory",
                ))
            }
        })
    }
}

impl Fs {
    /// The inode's flags (FS_IOC_GETFLAGS).
    pub fn flags(&self, ino: Ino) -> Result<u64> {
        Ok(self.lock().inode(ino)?.flags.get() & KNOWN)
    }

    /// Sets the inode's flags (FS_IOC_SETFLAGS); the change time moves. Returns the flags it
    /// has now, which for a file with data are the ones it had (module docs).
    pub fn set_flags(&self, ino: Ino, flags: u64) -> Result<u64> {
        self.write_op(1, Reserve::Shrink, Durable::Data, |g| {
            let it = g.inode(ino)?;
            let now_flags = g.settable_flags(ino, &it, flags)?;
            let now = g.now();
            g.modify_inode(ino, |i| {
                i.flags = now_flags.into();
                i.ctime = now;
            })?;
            Ok(now_flags & KNOWN)
        })
    }
}
