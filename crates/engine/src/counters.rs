//! Counters for every distinct code path, readable at run time ("the humble counter").
//!
//! A counter is striped, as the kernel's percpu counters are: each thread adds to a stripe of
//! its own (a cache line no other thread of the first `STRIPES` writes), and a read sums the
//! stripes. Lock-free readers bump a counter on every call (`getattr_lock_free`, say), and one
//! shared word would bounce between their CPUs on every call, so that two readers made fewer
//! calls than one (docs/benchmarks.md, "concurrency"). A read is exact once the adds it should see have happened (Relaxed adds,
//! then whatever made them visible to the reader: a join, a lock, the end of a call).
use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Stripes per counter: threads beyond this many share stripes (still correct, only slower).
const STRIPES: usize = 8;

/// One stripe, alone in its cache line pair (x86's adjacent-line prefetcher pulls lines in
/// pairs, so 64-byte alignment would still let two stripes' writers disturb each other).
#[derive(Default)]
#[repr(align(128))]
struct Stripe(AtomicU64);

/// A count many threads add to without sharing a cache line; `get` sums it.
#[derive(Default)]
pub struct Counter([Stripe; STRIPES]);

impl Counter {
    #[inline]
    pub fn add(&self, n: u64) {
        self.0[stripe()].0.fetch_add(n, Ordering::Relaxed);
    }

    /// The sum of every stripe (wrapping, as one word's adds would).
    pub fn get(&self) -> u64 {
        self.0
            .iter()
            .fold(0u64, |a, s| a.wrapping_add(s.0.load(Ordering::Relaxed)))
    }
}

/// The calling thread's stripe: threads take stripes in turn as they first count.
#[inline]
fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    MINE.with(|m| {
        let s = m.get();
        if s < STRIPES {
            return s;
        }
        let s = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
        m.set(s);
        s
    })
}

macro_rules! counters {
    ($($name:ident: $doc:literal,)*) => {
        #[derive(Default)]
        pub struct Counters { $(#[doc = $doc] pub $name: Counter,)* }
        impl Counters {
            pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name.get()),)*]
            }
        }
    };
}

counters! {
    node_reads: "nodes read from the device (cache misses)",
    node_cache_hits: "node lookups served from the cache",
    node_evictions: "clean nodes dropped from the cache to respect its bound",
    node_cows: "nodes copied to a new block on first change in a transaction",
    snapshots_made: "snapshots made",
    snapshots_dropped: "deleted snapshots whose every node was let go of",
    blocks_held: "data blocks the fs tree let go of that a snapshot may name, held for it",
    blocks_unheld: "held data blocks the fs tree named again, copied out of a snapshot",
    tree_shares: "trees made by sharing another's nodes (snapshots)",
    node_unshares: "shared nodes copied for one of the trees pointing at them (kept for the others)",
    node_writes: "nodes written at commit",
    leaf_splits_half: "leaf splits that moved half the items",
    leaf_splits_append: "leaf splits that started an empty right leaf (append at the end)",
    leaf_hint_hits: "inserts that went straight to the leaf their hint remembered (no descent)",
    leaf_hint_misses: "hinted inserts that descended (the hint was stale, or the leaf full)",
    internal_splits: "internal node splits",
    leaf_merges: "leaves merged into a neighbour after deletes",
    internal_merges: "internal nodes merged into a neighbour",
    root_grows: "tree height increases",
    root_shrinks: "tree height decreases",
    commits: "transactions committed",
    commit_us: "microseconds spent committing (all steps, including device flushes)",
    commit_dirty_inodes: "inode items written back at commit",
    log_batches: "fsyncs made durable by a log batch instead of a commit",
    log_blocks: "fsync log blocks written",
    log_fallback_commits: "fsyncs that committed (no log chain yet, or a change too large for one)",
    log_replayed_batches: "fsync log batches applied at open after a crash",
    inode_cache_hits: "inode lookups served from the inode cache",
    parent_hits: "directory parents found in the inode cache's map (`dir_parents`), not the tree",
    getattr_lock_free: "getattr answered from the published inodes, without the lock",
    lookup_lock_free: "lookups answered from the published names and inodes, without the lock",
    readlink_lock_free: "readlinks answered from the published symlink targets, without the lock",
    xattr_lock_free: "getxattr and listxattr answered from the published xattrs, without the lock",
    readdir_lock_free: "readdir runs answered from a published listing, without the lock",
    readdirplus_lock_free: "readdirplus batches answered from published runs and inodes, without the lock",
    statfs_lock_free: "statfs answered from the published counts, without the lock",
    inode_cache_misses: "inode lookups that read the fs tree",
    inode_scan_reads: "inode items readdirplus read by ordered scan (not one lookup each)",
    inode_scan_fallbacks: "readdirplus inodes looked up one by one (sparse in the scanned range)",
    blocks_allocated: "blocks allocated",
    blocks_freed_now: "blocks freed and reusable at once (allocated in the same transaction)",
    blocks_pinned: "blocks freed but held until the commit that frees them is durable",
    blocks_held_for_readers: "freed data ranges held until readers outside the lock left",
    blocks_discarded: "freed blocks the device was told to drop (an image file's holes)",
    discard_errors: "discards the device refused (the blocks were freed all the same)",
    data_reads_beside: "reads whose data I/O ran without the operation lock",
    data_writes_beside: "writes whose data I/O ran without the operation lock",
    data_write_conflicts: "writes whose device I/O ran without the lock, redone under it: their edge blocks, or the preallocated blocks they filled, changed meanwhile",
    enospc: "operations refused for lack of space",
    free_batches: "batches of freeing (the items of one leaf) by deletes, truncates and punches",
    trim_orphans: "truncates too large for one batch, recorded as trim orphans until done",
    trim_batches: "batches of a truncate run as operations of their own after it returned (`Inner::trim_batch`)",
    fallocate_slices: "operations of a fallocate after its first, each over the next of its range's extents (`fs/layout.rs`)",
    extent_merges: "writes whose new blocks extended a neighbouring extent instead of adding one",
    extent_conversions: "preallocated block runs a write filled in place and made regular",
    sum_drop_commits: "commits a full device's overwrite in place made to drop the overwritten blocks' data sums before their bytes changed",
    data_sum_errors: "file blocks read from the device that did not match their checksum (the read got EIO)",
    in_place_writes: "writes that put some of their blocks where the file already had them (preallocated or NOCOW)",
    overwrites_beside: "of those, writes of whole blocks whose device write ran without the operation lock: a NOCOW file's over its written or preallocated blocks, a copy-on-write file's over preallocated ones",
    fills_beside: "of those, a copy-on-write file's (preallocated blocks converted with their sums after)",
    in_flight_waits: "operations that waited, without the lock, for a write writing blocks they keep part of (or would fill) without the lock",
    pin_alloc_failures: "pins not taken because the pin index could not allocate",
    op_lock_handoffs: "times a thread waiting for the operation lock asked for it: nobody else takes it until the asker has (`fs::op_lock`)",
    op_lock_sleeps: "waits for the operation lock that went on sleeping between looks after spinning `fs::op_lock::SPIN_MAX` (a long hold)",
    commit_stalls: "commit writes the device refused (a full disk under the image, a write error): the commit waits in memory and is written again (`txn`, \"A stalled commit\")",
    pins_refused_gone: "pins refused because the inode's last name went before them and it is being freed (its holder gets ENOENT)",
    space_waits_for_release: "operations refused for space that ran again after an unlinked file's holder let go of it",
}

impl Counters {
    #[inline]
    pub fn inc(c: &Counter) {
        c.add(1);
    }
    #[inline]
    pub fn add(c: &Counter, n: u64) {
        c.add(n);
    }
}

impl fmt::Display for Counters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, v) in self.snapshot() {
            writeln!(f, "{name:24} {v}")?;
        }
        Ok(())
    }
}

// Each stripe alone in its 128 bytes: no two threads' adds share a line pair.
const _: () = assert!(std::mem::size_of::<Stripe>() == 128);
const _: () = assert!(std::mem::size_of::<Counter>() == 128 * STRIPES);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_threads_adds() {
        let c = Counter::default();
        std::thread::scope(|s| {
            for t in 0..(2 * STRIPES as u64 + 3) {
                let c = &c;
                s.spawn(move || {
                    for _ in 0..1000 {
                        c.add(t + 1);
                    }
                });
            }
        });
        let n = 2 * STRIPES as u64 + 3;
        assert_eq!(c.get(), 1000 * n * (n + 1) / 2);
    }
}
