//! A device that fails on command: after N more writes, on every flush, or on reads of a range.
//! Models a failing disk at the only boundary the engine has.
use crate::BlockDevice;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

pub struct FaultDevice<D> {
    inner: D,
    /// Writes left before every write fails; negative = never.
    writes_left: AtomicI64,
    fail_flush: AtomicBool,
    fail_reads: AtomicBool,
}

impl<D: BlockDevice> FaultDevice<D> {
    pub fn new(inner: D) -> Self {
        FaultDevice {
            inner,
            writes_left: AtomicI64::new(-1),
            fail_flush: AtomicBool::new(false),
            fail_reads: AtomicBool::new(false),
        }
    }
    /// After `n` more successful writes, every write fails with EIO.
    pub fn fail_writes_after(&self, n: i64) {
        self.writes_left.store(n, Ordering::SeqCst);
    }
    pub fn set_fail_flush(&self, on: bool) {
        self.fail_flush.store(on, Ordering::SeqCst);
    }
    pub fn set_fail_reads(&self, on: bool) {
        self.fail_reads.store(on, Ordering::SeqCst);
    }
    pub fn heal(&self) {
        self.fail_writes_after(-1);
        self.set_fail_flush(false);
        self.set_fail_reads(false);
    }
    pub fn inner(&self) -> &D {
        &self.inner
    }
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("injected I/O error on {what}"))
}

impl<D: BlockDevice> BlockDevice for FaultDevice<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(eio("read"));
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let left = self.writes_left.load(Ordering::SeqCst);
        if left == 0 {
            return Err(eio("write"));
        }
        if left > 0 {
            self.writes_left.fetch_sub(1, Ordering::SeqCst);
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        if self.fail_flush.load(Ordering::SeqCst) {
            return Err(eio("flush"));
        }
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}
