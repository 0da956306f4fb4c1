//! A copy-on-write view of another device: reads see the base, or what was written here;
//! writes stay in memory and never reach the base. fsck replays an fsync log through one, so
//! it can check what an open would make of an image without changing the image.
use crate::{check_range, BlockDevice};
use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

/// Granule of the overlay: the format's block size.
const GRAIN: u64 = 4096;

pub struct OverlayDevice {
    base: Arc<dyn BlockDevice>,
    /// Granule number -> its bytes as written here.
    written: Mutex<HashMap<u64, Vec<u8>>>,
}

impl OverlayDevice {
    pub fn new(base: Arc<dyn BlockDevice>) -> OverlayDevice {
        OverlayDevice {
            base,
            written: Mutex::new(HashMap::new()),
        }
    }

    /// Granules written here so far.
    pub fn written_blocks(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Vec<u8>>> {
        // Plain bytes: still usable after a panic elsewhere.
        self.written.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The granule `g` as this device sees it.
    fn granule(&self, w: &HashMap<u64, Vec<u8>>, g: u64) -> io::Result<Vec<u8>> {
        if let Some(b) = w.get(&g) {
            return Ok(b.clone());
        }
        let len = GRAIN.min(self.size() - g * GRAIN) as usize;
        let mut b = vec![0u8; len];
        self.base.read_at(&mut b, g * GRAIN)?;
        Ok(b)
    }
}

/// The granules [first, last] that `len` bytes at `offset` touch, and where the range starts
/// in the first.
fn span(offset: u64, len: usize) -> (u64, u64, usize) {
    let end = offset + len as u64;
    (offset / GRAIN, (end - 1) / GRAIN, (offset % GRAIN) as usize)
}

impl BlockDevice for OverlayDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(buf.len(), offset, self.size())?;
        if buf.is_empty() {
            return Ok(());
        }
        let w = self.lock();
        let (first, last, mut skip) = span(offset, buf.len());
        if (first..=last).all(|g| !w.contains_key(&g)) {
            return self.base.read_at(buf, offset);
        }
        let mut at = 0;
        for g in first..=last {
            let b = self.granule(&w, g)?;
            let part = b.get(skip..).unwrap_or(&[]);
            let n = part.len().min(buf.len() - at);
            if let (Some(dst), Some(src)) = (buf.get_mut(at..at + n), part.get(..n)) {
                dst.copy_from_slice(src);
            }
            at += n;
            skip = 0;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(buf.len(), offset, self.size())?;
        if buf.is_empty() {
            return Ok(());
        }
        let mut w = self.lock();
        let (first, last, mut skip) = span(offset, buf.len());
        let mut at = 0;
        for g in first..=last {
            let mut b = self.granule(&w, g)?;
            let n = (b.len() - skip).min(buf.len() - at);
            if let (Some(dst), Some(src)) = (b.get_mut(skip..skip + n), buf.get(at..at + n)) {
                dst.copy_from_slice(src);
            }
            w.insert(g, b);
            at += n;
            skip = 0;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.base.size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;

    #[test]
    fn reads_see_writes_and_the_base_stays() {
        let base = Arc::new(MemDevice::from_bytes(
            (0..5 * 4096u32).map(|i| i as u8).collect(),
        ));
        let o = OverlayDevice::new(base.clone());
        let before = base.snapshot();
        o.write_at(&[0xaa; 5000], 4000).expect("write");
        let mut got = vec![0u8; 10_000];
        o.read_at(&mut got, 1000).expect("read");
        for (i, b) in got.iter().enumerate() {
            let at = 1000 + i;
            let want = if (4000..9000).contains(&at) {
                0xaa
            } else {
                at as u8
            };
            assert_eq!(*b, want, "byte {at}");
        }
        assert_eq!(base.snapshot(), before, "the base is never written");
        assert_eq!(
            o.written_blocks(),
            3,
            "bytes 4000..9000 touch granules 0, 1 and 2"
        );
        assert!(o.write_at(&[1], 5 * 4096).is_err(), "past the end");
    }
}
