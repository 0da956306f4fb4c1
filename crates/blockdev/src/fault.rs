//! A device that fails on command: after N more writes, for the next N writes, on every
//! write as a full disk (ENOSPC: the file system under a sparse image file filled up), on
//! every flush, or on every read. Models a failing disk at the only boundary the engine has.
use crate::BlockDevice;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

pub struct FaultDevice<D> {
    inner: D,
    /// Writes left before every write fails; negative = never.
    writes_left: AtomicI64,
    /// The next this many writes fail (EIO), then writes go through again.
    refuse_next: AtomicI64,
    /// Every write fails with ENOSPC.
    full: AtomicBool,
    fail_flush: AtomicBool,
    fail_reads: AtomicBool,
}

impl<D: BlockDevice> FaultDevice<D> {
    pub fn new(inner: D) -> Self {
        FaultDevice {
            inner,
            writes_left: AtomicI64::new(-1),
            refuse_next: AtomicI64::new(0),
            full: AtomicBool::new(false),
            fail_flush: AtomicBool::new(false),
            fail_reads: AtomicBool::new(false),
        }
    }
    /// After `n` more successful writes, every write fails with EIO.
    pub fn fail_writes_after(&self, n: i64) {
        self.writes_left.store(n, Ordering::SeqCst);
    }
    /// The next `n` writes fail with EIO; those after them go through.
    pub fn refuse_next_writes(&self, n: i64) {
        self.refuse_next.store(n, Ordering::SeqCst);
    }
    /// While on, every write fails with ENOSPC, as a sparse image file's do once the file
    /// system holding it is full.
    pub fn set_full(&self, on: bool) {
        self.full.store(on, Ordering::SeqCst);
    }
    pub fn set_fail_flush(&self, on: bool) {
        self.fail_flush.store(on, Ordering::SeqCst);
    }
    pub fn set_fail_reads(&self, on: bool) {
        self.fail_reads.store(on, Ordering::SeqCst);
    }
    pub fn heal(&self) {
        self.fail_writes_after(-1);
        self.refuse_next_writes(0);
        self.set_full(false);
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
        if self.full.load(Ordering::SeqCst) {
            return Err(io::Error::from(io::ErrorKind::StorageFull));
        }
        let refused = self
            .refuse_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n > 0).then(|| n - 1)
            });
        if refused.is_ok() {
            return Err(eio("write"));
        }
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
