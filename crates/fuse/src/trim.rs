//! `idxfs trim MOUNT`: every free block of a mounted file system given back to its device
//! (holes punched in an image file, BLKDISCARD on a block device), for what `-o nodiscard` or
//! an older idxfs left allocated. The server hears through an ioctl on the mount's root, as
//! for a remount (`remount`): only root and the mount's owner may ask, and the pass runs in
//! the server (`Fs::trim`: a commit, then the free ranges discarded under the engine's lock,
//! so nothing can take a block meanwhile).
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// `_IOR(0xD7, 2, u64)`: out, the blocks discarded (little-endian).
pub const IOC_TRIM: u32 = (2 << 30) | (8 << 16) | (0xD7 << 8) | 2;

/// Asks the server of the idxfs mount at `mp` to trim; returns the blocks it discarded.
pub fn trim_mount(mp: &Path) -> io::Result<u64> {
    let dir = std::fs::File::open(mp)?;
    let mut buf = [0u8; 8];
    // SAFETY: an _IOR ioctl whose size (8) is the buffer's; the kernel copies out into it.
    let r = unsafe { libc::ioctl(dir.as_raw_fd(), IOC_TRIM as _, buf.as_mut_ptr()) };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::ENOTTY) | Some(libc::ENOSYS) | Some(libc::EINVAL) => {
                io::Error::other(format!(
                    "{}: not the root of an idxfs mount (or its server is too old to trim)",
                    mp.display()
                ))
            }
            Some(libc::EPERM) | Some(libc::EACCES) => io::Error::other(format!(
                "{}: only root or the mount's owner may trim it",
                mp.display()
            )),
            Some(libc::EROFS) => io::Error::other(format!(
                "{}: mounted read-only; remount it read-write to trim",
                mp.display()
            )),
            _ => e,
        });
    }
    Ok(u64::from_le_bytes(buf))
}
