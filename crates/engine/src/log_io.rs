//! The fsync log's device I/O, outside the operation lock.
//!
//! An fsync builds its batch under the lock (`Inner::log_build`: which items, their values,
//! the chain blocks, the encoded blocks), numbers it, and lets go of the lock; the data
//! flush, the batch's write and the flush that makes it durable run without it
//! ([`LogSync::finish`]), so other operations, and other fsyncs' batches, go on meanwhile.
//!
//! Batches are numbered in chain order (1, 2, ...; the numbering runs on across commits).
//! What keeps the chain sound when batches are written concurrently:
//! - *Prefix durability.* Replay follows the chain from its head and stops at the first block
//!   that does not check out, so a batch counts only if every batch before it in the chain
//!   is on the device too. An fsync returns only once a flush completed after the writes of
//!   its batch *and of every earlier batch* ([`LogIo::wait_durable`]): `written` is the
//!   longest prefix of batches whose writes succeeded, and a flush started when `written`
//!   was n makes batches 1..=n durable.
//! - *Group flush.* One flush at a time; an fsync whose batch a finished flush covered
//!   returns without a flush of its own, so concurrent fsyncs share one.
//! - *Failure.* A failed write or flush makes that batch, and every later one of the chain,
//!   impossible to make durable. A failed *flush* stops the file system (the device may
//!   have dropped any write since the one before, file data included). A *refused write*
//!   (a full disk under the image, a write error) does not: the fsyncs of that batch and of
//!   every later one get `Error::Unwritten` and commit instead (`Shared::finish_log`),
//!   since the running transaction holds every change their batches carried; the commit
//!   starts a new chain, and its reap clears the old chain's failure
//!   ([`LogIo::chain_replaced`]).
//! - *No write lands on a reused block.* A batch's blocks belong to the running
//!   transaction's chain; a commit frees them (pinned) when it freezes, and they become
//!   reusable when it is reaped. The reap first waits until every batch numbered before the
//!   freeze has *ended* (its write returned, [`LogIo::wait_ended`]), so a late write cannot
//!   reach a block that is already something else's.
//! - *Data first.* A batch built while data written since the last flush is unflushed carries
//!   `flush_data`: its writer flushes before writing the batch, so the data a batch names is
//!   on the device before the batch can be. Data written outside the lock (a NOCOW file's
//!   overwrite, `fs::in_place`) is noted here once its write returned
//!   ([`LogIo::note_data_written`]), and taken with the running transaction's own note
//!   (`Log::take_data_unflushed`): an fsync after such a write returned flushes it.
use crate::counters::Counters;
use crate::error::{Error, Result};
use idxfs_blockdev::BlockDevice;
use idxfs_format::BLOCK_SIZE;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// The order and durability of batches written outside the lock.
#[derive(Default)]
pub struct LogIo {
    state: Mutex<IoState>,
    changed: Condvar,
    /// File data was written outside the operation lock since the last take: set after
    /// the write returned, taken (under the operation lock) by whatever flushes next.
    data_written: AtomicBool,
}

#[derive(Default)]
struct IoState {
    /// The number of the last batch built.
    issued: u64,
    /// Every batch up to this one has ended (written or failed).
    ended: u64,
    /// Ends after `ended + 1`, not yet contiguous: (batch, succeeded).
    early: Vec<(u64, bool)>,
    /// Every batch up to this one was written successfully.
    written: u64,
    /// Every batch up to this one is durable (a flush completed after its write).
    durable: u64,
    /// A flush is running.
    flushing: bool,
    /// The first batch that can never be durable (its write, or a flush covering it, failed).
    failed: Option<u64>,
    /// What the device said of the first refused write (a failed flush instead: `Other`).
    failed_kind: Option<std::io::ErrorKind>,
    /// A flush failed: the file system stops.
    flush_failed: bool,
}

impl std::fmt::Debug for LogIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        write!(
            f,
            "LogIo {{ issued: {}, ended: {}, durable: {} }}",
            s.issued, s.ended, s.durable
        )
    }
}

impl LogIo {
    fn lock(&self) -> MutexGuard<'_, IoState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Numbers a new batch (called under the operation lock, in chain order).
    fn issue(&self) -> u64 {
        let mut s = self.lock();
        s.issued += 1;
        s.issued
    }

    /// File data written outside the operation lock has reached the device (its write
    /// returned): the next fsync's flush, or the next commit's, must cover it.
    pub fn note_data_written(&self) {
        self.data_written.store(true, Ordering::Release);
    }

    /// Whether data was written outside the lock since the last take; the caller's flush
    /// (which comes after this) covers it. Under the operation lock.
    pub(crate) fn take_data_written(&self) -> bool {
        self.data_written.swap(false, Ordering::AcqRel)
    }

    /// The number of the last batch built: an fsync that adds nothing waits for it.
    pub fn issued(&self) -> u64 {
        self.lock().issued
    }

    /// Batch `no`'s write returned: `Err` with what the device said when it failed.
    fn end(&self, no: u64, r: std::result::Result<(), std::io::ErrorKind>) {
        let mut s = self.lock();
        debug_assert!(no > s.ended && no <= s.issued, "batch {no} ended twice");
        let ok = r.is_ok();
        if let Err(kind) = r {
            s.failed = Some(s.failed.map_or(no, |f| f.min(no)));
            s.failed_kind.get_or_insert(kind);
        }
        s.early.push((no, ok));
        while let Some(i) = s.early.iter().position(|e| e.0 == s.ended + 1) {
            s.early.swap_remove(i);
            s.ended += 1;
        }
        s.written = match s.failed {
            Some(f) => s.ended.min(f - 1),
            None => s.ended,
        };
        self.changed.notify_all();
    }

    /// Waits until every batch up to `no` has ended: after this, none of their writes can
    /// land any more (the reap's fence before log blocks are reused).
    pub fn wait_ended(&self, no: u64) {
        let mut s = self.lock();
        while s.ended < no {
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// A flush failed (the data flush before a batch): the file system stops.
    fn flush_failed(&self) {
        self.lock().flush_failed = true;
    }

    /// A commit whose freeze came after batch `fence` was issued is durable, and every batch
    /// up to it has ended: that commit holds every change those batches carried, and the
    /// chain they were in is no longer named. A refused write among them no longer keeps
    /// later batches, of the new chain, from being durable. Under the operation lock, at the
    /// reap: no batch of the new chain is issued before it (an fsync reaps first).
    pub fn chain_replaced(&self, fence: u64) {
        let mut s = self.lock();
        if s.flush_failed || s.issued != fence || s.ended != fence {
            return;
        }
        if s.failed.take().is_some() {
            s.failed_kind = None;
            s.written = s.ended;
            s.durable = s.durable.max(fence);
            self.changed.notify_all();
        }
    }

    /// Waits until batch `no` and every batch before it are durable, flushing `dev` when no
    /// flush running or finished covers them. Err when one of them failed: `Unwritten`
    /// when a write was refused (commit instead), `Io` after a failed flush.
    pub fn wait_durable(&self, no: u64, dev: &dyn BlockDevice) -> Result<()> {
        let mut s = self.lock();
        loop {
            if let Some(f) = s.failed.filter(|&f| f <= no) {
                let kind = s.failed_kind.unwrap_or(std::io::ErrorKind::Other);
                let e = std::io::Error::new(kind, format!("fsync log batch {f} was not written"));
                return Err(match s.flush_failed {
                    true => Error::Io(e),
                    false => Error::Unwritten(e),
                });
            }
            if s.durable >= no {
                return Ok(());
            }
            if s.written >= no && !s.flushing {
                s.flushing = true;
                let upto = s.written;
                drop(s);
                let r = dev.flush();
                s = self.lock();
                s.flushing = false;
                match r {
                    Ok(()) => s.durable = s.durable.max(upto),
                    Err(_) => {
                        let first = s.durable + 1;
                        s.failed = Some(s.failed.map_or(first, |f| f.min(first)));
                        s.flush_failed = true;
                    }
                }
                self.changed.notify_all();
                continue;
            }
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// What an fsync still has to do once it lets go of the operation lock.
pub enum LogSync {
    /// No log to append to, or too much for one batch: commit instead.
    Commit,
    /// Nothing changed since the last batch: wait for batches up to this one (0: none), after
    /// flushing data when `flush_data`.
    Wait { upto: u64, flush_data: bool },
    /// Write this batch, then wait for it.
    Write(LogBatch),
}

/// One encoded batch and where its blocks go. Dropped unwritten (an error or a panic between
/// building and writing it), it ends as failed, so neither the reap's fence nor a later
/// fsync waits for it forever.
pub struct LogBatch {
    pub io: Arc<LogIo>,
    pub no: u64,
    /// Data was written since the last flush: flush before writing the batch.
    pub flush_data: bool,
    /// Runs of contiguous chain blocks: (first block, encoded blocks).
    pub runs: Vec<(u64, Vec<u8>)>,
    ended: bool,
}

impl LogSync {
    /// Does the I/O without the operation lock and returns once the fsync's changes are
    /// durable. On `Unwritten` the caller commits instead; on any other Err it stops the
    /// file system.
    pub fn finish(self, dev: &dyn BlockDevice, io: &LogIo, counters: &Counters) -> Result<()> {
        match self {
            LogSync::Commit => Ok(()),
            LogSync::Wait { upto, flush_data } => {
                if flush_data {
                    dev.flush().inspect_err(|_| io.flush_failed())?;
                }
                io.wait_durable(upto, dev)
            }
            LogSync::Write(mut batch) => {
                let r = batch.write_blocks(dev, counters);
                batch.ended = true;
                match &r {
                    Ok(()) => io.end(batch.no, Ok(())),
                    Err(Error::Unwritten(e)) => io.end(batch.no, Err(e.kind())),
                    Err(_) => {
                        io.flush_failed();
                        io.end(batch.no, Err(std::io::ErrorKind::Other));
                    }
                }
                r?;
                io.wait_durable(batch.no, dev)
            }
        }
    }
}

impl LogBatch {
    pub fn new(io: Arc<LogIo>, flush_data: bool, runs: Vec<(u64, Vec<u8>)>) -> LogBatch {
        let no = io.issue();
        LogBatch {
            io,
            no,
            flush_data,
            runs,
            ended: false,
        }
    }

    /// `Io` when the data flush before it failed, `Unwritten` when a write was refused.
    fn write_blocks(&self, dev: &dyn BlockDevice, counters: &Counters) -> Result<()> {
        if self.flush_data {
            dev.flush()?;
        }
        let mut blocks = 0;
        for (at, buf) in &self.runs {
            dev.write_at(buf, at * BLOCK_SIZE)
                .map_err(Error::Unwritten)?;
            blocks += buf.len() as u64 / BLOCK_SIZE;
        }
        Counters::add(&counters.log_blocks, blocks);
        Ok(())
    }
}

impl Drop for LogBatch {
    fn drop(&mut self) {
        if !self.ended {
            self.io.end(self.no, Err(std::io::ErrorKind::Other));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idxfs_blockdev::MemDevice;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Counts flushes.
    struct Flushes(MemDevice, AtomicU64);

    impl BlockDevice for Flushes {
        fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
            self.0.read_at(buf, off)
        }
        fn write_at(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
            self.0.write_at(buf, off)
        }
        fn flush(&self) -> std::io::Result<()> {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.flush()
        }
        fn size(&self) -> u64 {
            self.0.size()
        }
    }

    #[test]
    fn a_batch_is_durable_only_with_every_batch_before_it() {
        let io = LogIo::default();
        let dev = Flushes(MemDevice::new(1 << 20), AtomicU64::new(0));
        let (a, b, c) = (io.issue(), io.issue(), io.issue());
        io.end(c, Ok(()));
        io.end(b, Ok(()));
        std::thread::scope(|s| {
            let waiter = s.spawn(|| io.wait_durable(c, &dev));
            // Batch `a` has not been written: nothing after it may be durable yet.
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!waiter.is_finished(), "batch {c} durable before batch {a}");
            assert_eq!(dev.1.load(Ordering::SeqCst), 0, "flushed too early");
            io.end(a, Ok(()));
            waiter.join().expect("waiter").expect("durable");
        });
        // One flush covered all three; a later wait for any of them needs none.
        assert_eq!(dev.1.load(Ordering::SeqCst), 1);
        io.wait_durable(b, &dev).expect("durable");
        assert_eq!(dev.1.load(Ordering::SeqCst), 1);
        io.wait_ended(c);
    }

    #[test]
    fn a_failed_batch_fails_every_later_one_and_no_earlier_one() {
        let io = Arc::new(LogIo::default());
        let dev = MemDevice::new(1 << 20);
        let ok = io.issue();
        io.end(ok, Ok(()));
        let batch = LogBatch::new(io.clone(), false, Vec::new());
        let failed = batch.no;
        // Dropped unwritten (an error between building and writing): it ends as failed.
        drop(batch);
        let later = io.issue();
        io.end(later, Ok(()));
        io.wait_ended(later);
        assert!(
            io.wait_durable(later, &dev).is_err(),
            "batch {later} after {failed}"
        );
        assert!(io.wait_durable(failed, &dev).is_err());
        io.wait_durable(ok, &dev)
            .expect("the batch before the failure");
    }
}
