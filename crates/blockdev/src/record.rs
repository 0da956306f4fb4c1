//! A device that records every write and flush, so a test can rebuild the device as it would be
//! after a crash at any instant: every prefix of the write stream, with the writes issued since
//! the last flush dropped, reordered or torn (after redb's `CrashBackend`).
use crate::{BlockDevice, MemDevice};
use std::io;
use std::sync::Mutex;

#[derive(Debug, Clone)]
pub enum Event {
    Write { offset: u64, data: Vec<u8> },
    Flush,
}

/// The unit a device writes whole, and tears between (`Tear::TornLast`).
const SECTOR: u64 = 512;

pub struct RecordingDevice {
    inner: MemDevice,
    base: Vec<u8>,
    events: Mutex<Vec<Event>>,
}

/// What happens to the writes after the last flush in a crash image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tear {
    /// Every write reached the media, in order.
    None,
    /// Only the writes whose bit is set in the mask reached the media (bit i = i-th unflushed write,
    /// wrapping every 64): models dropped and reordered writes.
    Drop(u64),
    /// Everything reached the media but the last write, of which only the first `n` 512-byte
    /// sectors landed.
    TornLast(usize),
}

/// One reconstructed crash image.
pub struct CrashImage {
    pub bytes: Vec<u8>,
    /// Number of events replayed.
    pub prefix: usize,
    pub tear: Tear,
}

impl RecordingDevice {
    /// Starts recording on top of `base` (the device contents at the start).
    pub fn new(base: Vec<u8>) -> RecordingDevice {
        RecordingDevice {
            inner: MemDevice::from_bytes(base.clone()),
            base,
            events: Mutex::new(Vec::new()),
        }
    }

    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn event_count(&self) -> usize {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The device as a crash after the first `prefix` events would leave it.
    pub fn crash_image(&self, prefix: usize, tear: Tear) -> CrashImage {
        let events = self.events();
        let mut bytes = self.base.clone();
        let cut = prefix.min(events.len());
        let last_flush = events
            .get(..cut)
            .and_then(|e| e.iter().rposition(|e| matches!(e, Event::Flush)))
            .map_or(0, |i| i + 1);
        let apply = |bytes: &mut Vec<u8>, offset: u64, data: &[u8]| {
            let o = offset as usize;
            if let Some(dst) = bytes.get_mut(o..o + data.len()) {
                dst.copy_from_slice(data);
            }
        };
        for e in events.get(..last_flush).unwrap_or(&[]) {
            if let Event::Write { offset, data } = e {
                apply(&mut bytes, *offset, data);
            }
        }
        let tail: Vec<(u64, &[u8])> = events
            .get(last_flush..cut)
            .unwrap_or(&[])
            .iter()
            .filter_map(|e| match e {
                Event::Write { offset, data } => Some((*offset, data.as_slice())),
                Event::Flush => None,
            })
            .collect();
        match tear {
            Tear::None => tail.iter().for_each(|(o, d)| apply(&mut bytes, *o, d)),
            Tear::Drop(mask) => {
                for (i, (o, d)) in tail.iter().enumerate() {
                    if mask >> (i % 64) & 1 == 1 {
                        apply(&mut bytes, *o, d);
                    }
                }
            }
            Tear::TornLast(sectors) => {
                if let Some(((lo, ld), rest)) = tail.split_last() {
                    rest.iter().for_each(|(o, d)| apply(&mut bytes, *o, d));
                    let n = (sectors * SECTOR as usize).min(ld.len());
                    apply(&mut bytes, *lo, ld.get(..n).unwrap_or(&[]));
                }
            }
        }
        CrashImage {
            bytes,
            prefix: cut,
            tear,
        }
    }
}

impl BlockDevice for RecordingDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    /// Recorded as the whole sectors the write covers, as they are after it: a device writes
    /// whole sectors, and a write that starts or ends inside one reaches it as that sector
    /// read, changed and written back whole by whoever issued it (the kernel's page cache,
    /// for a file or a block device). So a crash image never holds a later write's bytes of
    /// a sector without an earlier one's, which no device could leave.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        self.inner.write_at(buf, offset)?;
        let end = offset + buf.len() as u64;
        let from = offset / SECTOR * SECTOR;
        let to = end
            .div_ceil(SECTOR)
            .saturating_mul(SECTOR)
            .min(self.inner.size());
        let data = if (from, to) == (offset, end) {
            buf.to_vec()
        } else {
            let mut whole = vec![0; (to - from) as usize];
            self.inner.read_at(&mut whole, from)?;
            whole
        };
        events.push(Event::Write { offset: from, data });
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Event::Flush);
        Ok(())
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn prefixes_and_tears() {
        let d = RecordingDevice::new(vec![0; 4096]);
        d.write_at(&[1; 1024], 0).expect("w");
        d.flush().expect("f");
        d.write_at(&[2; 1024], 1024).expect("w");
        d.write_at(&[3; 1024], 2048).expect("w");
        let full = d.crash_image(4, Tear::None).bytes;
        assert_eq!((full[0], full[1024], full[2048]), (1, 2, 3));
        let dropped = d.crash_image(4, Tear::Drop(0b10)).bytes;
        assert_eq!((dropped[0], dropped[1024], dropped[2048]), (1, 0, 3));
        let torn = d.crash_image(4, Tear::TornLast(1)).bytes;
        assert_eq!((torn[2048], torn[2048 + 511], torn[2048 + 512]), (3, 3, 0));
        let early = d.crash_image(1, Tear::None).bytes;
        assert_eq!(early[0], 1);
    }

    #[test]
    fn writes_inside_a_sector_are_recorded_as_the_whole_sector() {
        let d = RecordingDevice::new(vec![0; 4096]);
        d.write_at(&[1; 100], 600).expect("w");
        d.write_at(&[2; 100], 800).expect("w");
        // Only the second reached the media: the sector as it was after both.
        let second = d.crash_image(2, Tear::Drop(0b10)).bytes;
        assert_eq!(
            (second[599], second[600], second[800], second[900]),
            (0, 1, 2, 0)
        );
        // Only the first: the sector as it was after it.
        let first = d.crash_image(2, Tear::Drop(0b01)).bytes;
        assert_eq!((first[600], first[800]), (1, 0));
        // A write across sectors, torn after one: its first sector, whole.
        d.write_at(&[3; 600], 1000).expect("w");
        let torn = d.crash_image(3, Tear::TornLast(1)).bytes;
        assert_eq!((torn[1000], torn[1023], torn[1024]), (3, 3, 0));
        assert_eq!((torn[600], torn[800]), (1, 2), "the writes before it");
    }
}
