//! Regression: `Fs::copy_tree` (the mount's `idxfs cp`) kept each directory's whole path
//! under the top on its walk's stack, so a chain of directories n deep cost n²/2 names'
//! bytes: a chain 20,000 deep, which an unprivileged user makes through a mount in a second,
//! took 470 MB of the server's memory to copy, and one 200,000 deep took the machine's
//! 23 GiB. The walk now keeps each directory's name and its parent's place on the stack.
//!
//! The heap is counted by this test binary's allocator: what the copy and the removal of a
//! deep chain hold at their peak, above what was held before, must be a small multiple of
//! the chain's own size, far below the square. The node cache is kept small, so it does not
//! mask the walk's own memory.
mod common;
use common::*;
use idxfs_engine::fs::Unchecked;
use idxfs_engine::OpenOptions;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting the bytes held now and the most held since `reset_peak`.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to `System` unchanged; the counters only add up its sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = HELD.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(p, l) };
        HELD.fetch_sub(l.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            HELD.fetch_sub(l.size(), Ordering::Relaxed);
            let now = HELD.fetch_add(new, Ordering::Relaxed) + new;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The peak starts again from what is held now; returns what is held now.
fn reset_peak() -> usize {
    let now = HELD.load(Ordering::Relaxed);
    PEAK.store(now, Ordering::Relaxed);
    now
}

const DEPTH: usize = 20_000;
/// Names of 8 bytes: the old walk held about DEPTH² × 9 / 2 = 1.8 GB of paths at the
/// bottom (3.6 GB at its peak, measured).
const NAME: &[u8] = b"dddddddd";
/// What the copy or the removal may hold above its start: 2 KiB a level (each level's
/// entry on the walk's stack is a few hundred bytes, twice that while the stack grows, and
/// the copy's dirty nodes wait for a commit: 23 MB at the copy's peak, measured) and
/// 16 MiB for the node cache and what the walk holds however deep it is.
const ALLOWED: usize = DEPTH * 2048 + (16 << 20);

#[test]
fn copying_and_removing_a_deep_chain_holds_memory_in_proportion_to_its_depth() {
    let (dev, fs) = mem_fs(256 << 20);
    fs.close().expect("close");
    let fs = idxfs_engine::Fs::open(
        dev.clone(),
        OpenOptions {
            cache_bytes: 4 << 20,
            ..opts()
        },
    )
    .expect("open with a small cache");
    let top = fs.mkdir(ROOT, b"chain", 0o755, ME).expect("mkdir").ino;
    let mut at = top;
    for _ in 0..DEPTH {
        at = fs.mkdir(at, NAME, 0o755, ME).expect("mkdir").ino;
    }
    fs.create(at, b"bottom", 0o644, ME).expect("create");
    fs.sync().expect("sync");

    let before = reset_peak();
    let c = fs
        .copy_tree(ROOT, b"chain", ROOT, b"copy", &Unchecked, |_| {})
        .expect("copy_tree");
    let held = PEAK.load(Ordering::Relaxed) - before;
    assert_eq!((c.dirs, c.files), (DEPTH as u64 + 1, 1), "{c:?}");
    assert!(
        held < ALLOWED,
        "the copy held {held} bytes at its peak, for {DEPTH} levels (allowed {ALLOWED})"
    );
    // The copy is the chain, to its bottom.
    let mut at = fs.lookup(ROOT, b"copy").expect("the copy").ino;
    for _ in 0..DEPTH {
        at = fs.lookup(at, NAME).expect("a level of the copy").ino;
    }
    fs.lookup(at, b"bottom").expect("the bottom's file");

    let before = reset_peak();
    let r = fs
        .remove_tree(ROOT, b"chain", &Unchecked, |_| {}, |_| {})
        .expect("remove_tree");
    let held = PEAK.load(Ordering::Relaxed).saturating_sub(before);
    assert_eq!(r.dirs, DEPTH as u64 + 1, "{r:?}");
    assert!(
        held < ALLOWED,
        "the removal held {held} bytes at its peak, for {DEPTH} levels (allowed {ALLOWED})"
    );
    fs.close().expect("close");
    assert_clean(&dev);
}
