//! `idxfs trim MOUNT`: every free block of a mounted file system given back to its device
//! (holes punched in an image file, BLKDISCARD on a block device), for what `-o nodiscard` or
//! an older idxfs left allocated. The server hears through an ioctl on the mount's root, as
//! for a remount (`remount`): only root and the mount's owner may ask, and the pass runs in
//! the server (`Fs::trim`: a commit, then the free ranges discarded under the engine's lock,
//! so nothing can take a block meanwhile).
use std::io;
use std::path::Path;

/// `_IOR(0xD7, 2, u64)`: out, the blocks discarded (little-endian).
pub const IOC_TRIM: u32 = (2 << 30) | (8 << 16) | (0xD7 << 8) | 2;

/// Asks the server of the idxfs mount at `mp` to trim; returns the blocks it discarded.
pub fn trim_mount(mp: &Path) -> io::Result<u64> {
    let mut buf = [0u8; 8];
    crate::root_ioctl::send(mp, IOC_TRIM, &mut buf, "trim")?;
    Ok(u64::from_le_bytes(buf))
}
