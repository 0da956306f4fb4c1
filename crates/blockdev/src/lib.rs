//! The `BlockDevice` boundary. The engine sees only this trait, so every test can run on memory,
//! on a device that records writes to build crash images, or on one that fails on command.
use std::io;

pub mod fault;
pub mod file;
pub mod mem;
pub mod overlay;
pub mod record;

pub use fault::FaultDevice;
pub use file::FileDevice;
pub use mem::MemDevice;
pub use overlay::OverlayDevice;
pub use record::{CrashImage, RecordingDevice, Tear};

/// Positioned I/O on a fixed-size device. Writes are volatile until `flush` returns: a crash may
/// drop, reorder or tear any write issued after the last completed flush.
pub trait BlockDevice: Send + Sync {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    fn flush(&self) -> io::Result<()>;
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Whether writes can succeed at all (false: opened read-only), so a caller can refuse to
    /// become writable instead of failing at its first write.
    fn writable(&self) -> bool {
        true
    }
    /// Tells the device that `len` bytes at `offset` hold nothing any more: an image file
    /// gives their space back (a hole), a block device may drop them (BLKDISCARD). Reads of
    /// the range return unspecified bytes after it. Advisory: a device that cannot leaves the
    /// bytes as they are and returns Ok.
    fn discard(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
}

impl<T: BlockDevice + ?Sized> BlockDevice for std::sync::Arc<T> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        (**self).write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        (**self).flush()
    }
    fn size(&self) -> u64 {
        (**self).size()
    }
    fn writable(&self) -> bool {
        (**self).writable()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        (**self).discard(offset, len)
    }
}

pub(crate) fn check_range(len: usize, offset: u64, size: u64) -> io::Result<()> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("I/O of {len} bytes at {offset} is past the device end ({size} bytes)"),
        )),
    }
}
