//! A sequence count (the kernel's `seqcount_t`): a writer makes a group of stores one step for
//! readers that take no lock, and a reader learns whether a write overlapped its reads.
//!
//! Protocol (Boehm, "Can seqlocks get along with programming language memory models?"):
//! - writer (one at a time; the caller's lock serializes them): store the count odd, a release
//!   fence, the stores of the write, then the count even again with a release store;
//! - reader: load the count (acquire); if odd, a write is under way: retry. Do the reads, an
//!   acquire fence, load the count again: the reads saw one state between writes if and only
//!   if it is unchanged.
//!
//! Why that is enough: if a read saw a store of a write, the writer's release fence (before
//! that store) synchronizes with the reader's acquire fence (after the read), so the odd count
//! stored before the fence is visible to the second load, which then differs. If the first
//! load saw an even count stored by a write's end, every store of that write is visible to the
//! reads (acquire of a release store). So a reader returns only what one state held.
//!
//! What readers read must be atomics (here: XArray slots, and the immutable boxes their
//! pointers lead to): a read racing a write may see either value, never a torn one.
//!
//! Under `--cfg loom` the atomics are loom's, so `tests/seqcount_loom.rs` can try every
//! interleaving and every outcome the memory model allows of a small writer and reader.
#[cfg(loom)]
use loom::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{fence, AtomicU64, Ordering};

pub struct SeqCount {
    /// Odd while a write is under way.
    seq: AtomicU64,
}

impl Default for SeqCount {
    fn default() -> Self {
        Self::new()
    }
}

impl SeqCount {
    pub fn new() -> SeqCount {
        SeqCount {
            seq: AtomicU64::new(0),
        }
    }

    /// Runs `f` as a reader: its answer when no write overlapped it, trying up to `tries`
    /// times; None if writes kept overlapping (the caller takes its lock instead).
    #[inline]
    pub fn read<R>(&self, tries: usize, mut f: impl FnMut() -> R) -> Option<R> {
        for _ in 0..tries {
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let r = f();
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == before {
                return Some(r);
            }
        }
        None
    }

    /// Runs `f`, whose stores readers see as one step. Writers must not overlap: the caller
    /// holds the lock that serializes them.
    #[inline]
    pub fn write<R>(&self, f: impl FnOnce() -> R) -> R {
        let s = self.seq.load(Ordering::Relaxed);
        debug_assert!(s & 1 == 0, "a write began inside another");
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        let r = f();
        self.seq.store(s.wrapping_add(2), Ordering::Release);
        r
    }
}
