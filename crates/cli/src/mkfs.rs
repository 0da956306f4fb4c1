//! `idxfs mkfs`: formats only what holds nothing to lose, unless told `--force`.
//!
//! Before writing a byte it refuses, each with one line that says what is there and what to
//! do:
//! - a target that holds a file system or volume it recognizes (idxfs itself, ext2/3/4,
//!   btrfs, XFS, F2FS, FAT, exFAT, NTFS, swap, LUKS, LVM, squashfs, ISO 9660, a partition
//!   table), found by their magic numbers at their fixed offsets as `wipefs`/`blkid` do;
//! - an image file whose first 64 KiB are not all zeros (a file of someone's data, named by
//!   mistake), where a new image is all zeros;
//! - a `--size` smaller than the image file it would cut;
//! - whatever `--force` says, a target in use: an image an idxfs server holds (its lock),
//!   one attached to a loop device, a block device mounted or held by another (O_EXCL).
//!   Formatting under a running file system would corrupt what it writes next, so only
//!   unmounting helps, as mkfs.ext4 refuses a mounted device.
//!
//! A file that mkfs created and then could not format (too small, a bad node size) is
//! removed, so a retry starts from nothing.
use idxfs_blockdev::{BlockDevice, FileDevice};
use idxfs_engine::{Fs, MkfsOptions};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

/// What to format, and how.
pub(crate) struct MkfsArgs<'a> {
    pub image: &'a Path,
    /// Size of a new image file (an existing one keeps its size unless this is given).
    pub size: Option<u64>,
    pub node_size: u32,
    /// Format over what the checks found (never over a target in use).
    pub force: bool,
}

/// Bytes read to look for signatures: past btrfs's superblock at 64 KiB.
const PROBE_BYTES: usize = 0x10000 + 0x1000;

/// A signature: these bytes at this offset name what holds the target.
struct Magic {
    at: usize,
    bytes: &'static [u8],
    what: &'static str,
}

const fn m(at: usize, bytes: &'static [u8], what: &'static str) -> Magic {
    Magic { at, bytes, what }
}

const IDXFS: &str = "an idxfs file system";

/// The signatures checked, as util-linux's libblkid places them. idxfs's superblock has a
/// copy in block 1, so either copy names it.
const MAGICS: &[Magic] = &[
    m(8, &idxfs_format::versions::MAGIC, IDXFS),
    m(4096 + 8, &idxfs_format::versions::MAGIC, IDXFS),
    m(1024 + 56, &[0x53, 0xEF], "an ext2/3/4 file system"),
    m(0x10040, b"_BHRfS_M", "a btrfs file system"),
    m(0, b"XFSB", "an XFS file system"),
    m(1024, &[0x10, 0x20, 0xF5, 0xF2], "an F2FS file system"),
    m(3, b"EXFAT   ", "an exFAT file system"),
    m(3, b"NTFS    ", "an NTFS file system"),
    m(54, b"FAT1", "a FAT file system"),
    m(82, b"FAT32   ", "a FAT file system"),
    m(4086, b"SWAPSPACE2", "swap space"),
    m(4086, b"SWAP-SPACE", "swap space"),
    m(0, b"LUKS\xba\xbe", "a LUKS encrypted volume"),
    m(512 + 24, b"LVM2 001", "an LVM physical volume"),
    m(0, b"hsqs", "a squashfs image"),
    m(0x8001, b"CD001", "an ISO 9660 image"),
    m(512, b"EFI PART", "a GPT partition table"),
];

/// What the first `PROBE_BYTES` of a target show it holds, if anything.
fn recognize(head: &[u8]) -> Option<&'static str> {
    MAGICS
        .iter()
        .find(|s| head.get(s.at..s.at + s.bytes.len()) == Some(s.bytes))
        .map(|s| s.what)
        .or_else(|| {
            // An MBR: the boot signature and a partition entry with a type.
            let mbr = head.get(510..512) == Some(&[0x55, 0xAA][..])
                && (0..4).any(|i| head.get(446 + 16 * i + 4).is_some_and(|&t| t != 0));
            mbr.then_some("an MBR partition table")
        })
}

/// The first `PROBE_BYTES` of `f` (fewer for a smaller one).
fn head_of(f: &std::fs::File, len: u64) -> std::io::Result<Vec<u8>> {
    let mut head = vec![0u8; PROBE_BYTES.min(len as usize)];
    f.read_exact_at(&mut head, 0)?;
    Ok(head)
}

/// The loop device `image` backs, if any (`/sys/block/loopN/loop/backing_file`).
fn loop_device_of(image: &Path) -> Option<String> {
    let want = std::fs::canonicalize(image).ok()?;
    let blocks = std::fs::read_dir("/sys/block").ok()?;
    blocks.flatten().find_map(|e| {
        let name = e.file_name().into_string().ok()?;
        let backing = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
        // A deleted backing file reads "... (deleted)"; it is not this one.
        (Path::new(backing.trim_end()) == want).then(|| format!("/dev/{name}"))
    })
}

/// The lock an idxfs server holds on its image (`crate::lock_image`), taken now or refused.
fn lock_now(image: &Path) -> Result<std::fs::File, String> {
    use std::os::fd::AsRawFd;
    let p = image.display();
    let f = std::fs::File::open(image).map_err(|e| format!("{p}: {e}"))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(f);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Err(format!(
            "{p}: in use by an idxfs server (mounted); unmount it first"
        ));
    }
    Err(format!("{p}: lock: {e}"))
}

/// Refuses, with the one line to print, what must not be formatted; else the guard to hold
/// while formatting (the image's server lock, or the device's exclusive open).
fn check_existing(a: &MkfsArgs, meta: &std::fs::Metadata) -> Result<std::fs::File, String> {
    let p = a.image.display();
    let force = "formatting would destroy it (use --force to format anyway)";
    let (guard, len) = if meta.file_type().is_block_device() {
        // O_EXCL on a block device fails with EBUSY while it is mounted or held.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(a.image)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EBUSY) => {
                    format!("{p}: in use (mounted, or held by another program); unmount it first")
                }
                _ => format!("{p}: {e}"),
            })?;
        let len = FileDevice::open(a.image, false)
            .map_err(|e| format!("{p}: {e}"))?
            .size();
        (f, len)
    } else if meta.file_type().is_file() {
        let lock = lock_now(a.image)?;
        if let Some(dev) = loop_device_of(a.image) {
            return Err(format!(
                "{p}: attached to {dev}; unmount and detach it first (losetup -d {dev})"
            ));
        }
        if let Some(size) = a.size.filter(|&s| s < meta.len() && !a.force) {
            return Err(format!(
                "{p}: the file is {} bytes and --size {size} would cut it (use --force to \
                 shrink it)",
                meta.len()
            ));
        }
        (lock, meta.len())
    } else {
        return Err(format!("{p}: neither an image file nor a block device"));
    };
    if a.force {
        return Ok(guard);
    }
    let head = head_of(&guard, len).map_err(|e| format!("{p}: {e}"))?;
    if let Some(what) = recognize(&head) {
        // For idxfs, how much: the superblock's count, when it reads.
        let files = FileDevice::open(a.image, false)
            .ok()
            .and_then(|d| idxfs_engine::fs::read_superblock(&d).ok())
            .filter(|_| what == IDXFS)
            .map(|sb| match sb.inode_count.get() {
                1 => " with 1 inode".to_string(),
                n => format!(" with {n} inodes"),
            })
            .unwrap_or_default();
        return Err(format!("{p}: holds {what}{files}; {force}"));
    }
    if meta.file_type().is_file() && head.iter().any(|&b| b != 0) {
        return Err(format!(
            "{p}: holds data (no file system idxfs recognizes); {force}"
        ));
    }
    Ok(guard)
}

/// Formats `a.image` after the checks above; returns the device, formatted.
pub(crate) fn mkfs(a: &MkfsArgs) -> Result<Arc<dyn BlockDevice>, String> {
    let p = a.image.display();
    let mkfs_opts = MkfsOptions {
        node_size: a.node_size,
        ..MkfsOptions::default()
    };
    let format = |dev: &Arc<dyn BlockDevice>| {
        Fs::mkfs(dev.clone(), &mkfs_opts).map_err(|e| format!("mkfs {p}: {e}"))
    };
    match std::fs::metadata(a.image) {
        Ok(meta) => {
            let _guard = check_existing(a, &meta)?;
            let dev: Arc<dyn BlockDevice> = match a.size {
                Some(size) if meta.file_type().is_file() => {
                    Arc::new(FileDevice::create(a.image, size).map_err(|e| format!("{p}: {e}"))?)
                }
                _ => Arc::new(FileDevice::open(a.image, true).map_err(|e| format!("{p}: {e}"))?),
            };
            format(&dev)?;
            Ok(dev)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Made here and only here: what a failure leaves is removed.
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(a.image)
                .map_err(|e| format!("{p}: {e}"))?;
            let made = FileDevice::create(a.image, a.size.unwrap_or(1 << 30))
                .map_err(|e| format!("{p}: {e}"))
                .map(|d| Arc::new(d) as Arc<dyn BlockDevice>)
                .and_then(|dev| format(&dev).map(|()| dev));
            if made.is_err() {
                let _ = std::fs::remove_file(a.image);
            }
            made
        }
        Err(e) => Err(format!("{p}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_signature_is_recognized_where_it_sits_and_zeros_are_nothing() {
        assert_eq!(recognize(&vec![0u8; PROBE_BYTES]), None);
        for sig in MAGICS {
            let mut head = vec![0u8; PROBE_BYTES];
            head[sig.at..sig.at + sig.bytes.len()].copy_from_slice(sig.bytes);
            assert_eq!(
                recognize(&head),
                Some(sig.what),
                "{} at {}",
                sig.what,
                sig.at
            );
            // One byte off is something else (or nothing).
            let mut off = vec![0u8; PROBE_BYTES];
            off[sig.at + 1..sig.at + 1 + sig.bytes.len()].copy_from_slice(sig.bytes);
            assert_ne!(recognize(&off), Some(sig.what), "{} one byte off", sig.what);
        }
        // A short file holds nothing past its end.
        assert_eq!(recognize(&[0u8; 100]), None);
        let mut mbr = vec![0u8; 4096];
        mbr[510..512].copy_from_slice(&[0x55, 0xAA]);
        assert_eq!(recognize(&mbr), None, "a boot signature without partitions");
        mbr[446 + 4] = 0x83;
        assert_eq!(recognize(&mbr), Some("an MBR partition table"));
    }
}
