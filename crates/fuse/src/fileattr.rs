//! `chattr` and `lsattr` (FS_IOC_GETFLAGS / FS_IOC_SETFLAGS). The kernel turns both into its
//! fileattr calls, which FUSE sends on as these two ioctls with the flags as a 32-bit int
//! (`fuse_fileattr_get`/`_set`, on a file or directory it opens for the purpose); it has
//! already checked that the caller owns the inode or has CAP_FOWNER. The flags mean what
//! the engine says (`idxfs_engine::fs::NOCOW_FL`, `fs/inode_flags.rs`).
//!
//! Before a set, the kernel reads the old attributes in their XFS form (FS_IOC_FSGETXATTR,
//! `struct fsxattr`), so that is answered too: no XFS flag stands for anything idxfs has
//! (NOCOW has none), so all zeros. Without it every `chattr` fails.
use crate::{errno, IdxFuse};
use fuser::{Errno, INodeNo, ReplyIoctl};
use idxfs_engine::Fs;

/// `_IOR('f', 1, long)` and `_IOW('f', 2, long)` on 64-bit Linux, and the 32-bit forms
/// (`FS_IOC32_*`, `int`), which carry the same flags.
pub const GETFLAGS: [u32; 2] = [0x8008_6601, 0x8004_6601];
pub const SETFLAGS: [u32; 2] = [0x4008_6602, 0x4004_6602];
/// `_IOR('X', 31, struct fsxattr)`, 28 bytes.
pub const FSGETXATTR: u32 = 0x801c_581f;
const FSXATTR_SIZE: usize = 28;

impl IdxFuse {
    /// FS_IOC_SETFLAGS of inode `i` of `fs`, the kernel's `ino`.
    pub(crate) fn setflags_request(
        &self,
        fs: &Fs,
        i: u64,
        ino: INodeNo,
        in_data: &[u8],
        reply: ReplyIoctl,
    ) {
        let Some(raw) = in_data.get(..4).and_then(|b| <[u8; 4]>::try_from(b).ok()) else {
            return reply.error(Errno::EINVAL);
        };
        if let Err(e) = fs.set_flags(i, u32::from_ne_bytes(raw) as u64) {
            return reply.error(errno(&e));
        }
        // The change time moved, and the kernel would keep the one it has (for an hour by
        // default): its attributes are dropped before the reply, so the caller's next stat
        // asks again (as for a mode set by an ACL). ENOENT (the kernel dropped the inode)
        // is no error; any other failure means the connection is going away. Without a
        // notifier (not yet serving) nothing is cached to drop.
        match self.notifier.get().map(|n| n.inval_inode(ino, -1, 0)) {
            None | Some(Ok(())) => reply.ioctl(0, &[]),
            Some(Err(_)) => reply.error(Errno::EIO),
        }
    }
}

/// FS_IOC_GETFLAGS of inode `ino` of `fs` (the file system's or a snapshot's).
pub(crate) fn getflags_request(fs: &Fs, ino: u64, reply: ReplyIoctl) {
    match fs.flags(ino) {
        Ok(f) => reply.ioctl(0, &(f as u32).to_ne_bytes()),
        Err(e) => reply.error(errno(&e)),
    }
}

/// FS_IOC_FSGETXATTR: no project ids or extent size hints here, all zero.
pub(crate) fn fsgetxattr_request(fs: &Fs, ino: u64, reply: ReplyIoctl) {
    match fs.flags(ino) {
        Ok(_) => reply.ioctl(0, &[0u8; FSXATTR_SIZE]),
        Err(e) => reply.error(errno(&e)),
    }
}
