//! A device in memory: for tests, fuzzing and the library benchmark.
use crate::{check_range, BlockDevice};
use std::io;
use std::sync::Mutex;

pub struct MemDevice {
    bytes: Mutex<Vec<u8>>,
    size: u64,
}

impl MemDevice {
    pub fn new(size: u64) -> MemDevice {
        MemDevice {
            bytes: Mutex::new(vec![0; size as usize]),
            size,
        }
    }
    /// A device whose pages are all touched up front, so the first write to each block does not
    /// pay for the kernel's page allocation (benchmarks: a provisioned RAM disk, not a lazily
    /// allocated one).
    pub fn new_prefaulted(size: u64) -> MemDevice {
        let mut bytes = vec![0u8; size as usize];
        for page in bytes.chunks_mut(4096) {
            if let Some(b) = page.first_mut() {
                // A volatile write so the touch is not optimised away.
                unsafe { std::ptr::write_volatile(b, 0) };
            }
        }
        MemDevice::from_bytes(bytes)
    }

    pub fn from_bytes(bytes: Vec<u8>) -> MemDevice {
        let size = bytes.len() as u64;
        MemDevice {
            bytes: Mutex::new(bytes),
            size,
        }
    }
    /// A copy of the whole device.
    pub fn snapshot(&self) -> Vec<u8> {
        self.lock().clone()
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        // A panic while holding this lock leaves plain bytes behind: still usable.
        self.bytes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl BlockDevice for MemDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(buf.len(), offset, self.size)?;
        let b = self.lock();
        let o = offset as usize;
        buf.copy_from_slice(
            b.get(o..o + buf.len())
                .ok_or_else(|| io::Error::other("range"))?,
        );
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(buf.len(), offset, self.size)?;
        let mut b = self.lock();
        let o = offset as usize;
        b.get_mut(o..o + buf.len())
            .ok_or_else(|| io::Error::other("range"))?
            .copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.size
    }
    /// Fills the range with `DISCARDED`: what a discard leaves is unspecified, so a caller
    /// that reads a discarded block as if it still held its bytes finds garbage that fails
    /// every checksum, in tests, instead of the old bytes that would hide the bug.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(0, offset.saturating_add(len), self.size)?;
        let mut b = self.lock();
        let o = offset as usize;
        b.get_mut(o..o + len as usize)
            .ok_or_else(|| io::Error::other("range"))?
            .fill(DISCARDED);
        Ok(())
    }
}

/// The byte a discarded range of a `MemDevice` reads as.
pub const DISCARDED: u8 = 0xD5;
