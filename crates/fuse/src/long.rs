//! Requests that may work for long run on a thread of their own, so that the ring worker
//! that took one goes on serving its CPU's other callers.
//!
//! A ring worker (`uring.rs`) serves its CPU's callers one request at a time. Nearly every
//! request takes microseconds, but a fallocate or a shrinking truncate takes as long as the
//! extents it meets: the engine runs it as one operation per `SLICE_EXTENTS` of them and lets
//! others in between (`engine/src/fs/layout.rs`, `Fs::truncate`'s trim batches), half a
//! second for a file of 200,000 extents, which any user can make in seconds. The worker itself
//! could not serve anyone until the request returned, so every caller on that CPU waited for
//! all of it (docs/benchmarks.md, "Hostile shapes"). So a request the engine says may meet
//! more than `SLICE_EXTENTS` extents, from its inode alone (`Fs::fallocate_extents_at_most`,
//! `truncate_extents_at_most`), runs on a thread of its own with its reply, and the worker
//! parks its ring entry and goes on (`uring::park`); the reply, sent from that thread, wakes
//! the worker, which commits it.
//!
//! What that costs the request is a thread's start and a wakeup, tens of microseconds beside
//! the milliseconds its work takes. Nothing changes for its own caller, who waits for the
//! reply either way, nor in what the call does: the engine's operations are the same ones.
//!
//! The thread stays on the worker's CPU (it inherits the worker's pinning), so the long
//! request costs the CPU its caller called from and no other, and runs at the normal policy,
//! as does the worker while it has a request parked (it hands the CPU to no caller then,
//! `handoff.rs`): at SCHED_IDLE beside a thread that computes for half a second, the worker
//! would get its CPU only when that thread sleeps. With the thread free to move, a worker on
//! the CPU it moved to, left at SCHED_IDLE after a reply, kept a caller waiting 0.1-0.4 s
//! during a punch of 200,000 extents.
//!
//! Threads are bounded by the ring entries: a queue parks at most `uring::DEPTH - 1` of its
//! entries, keeping one to take its CPU's requests, and a request that cannot be parked runs
//! where it came, as before. Over /dev/fuse nothing is parked: fuser's threads each serve any
//! caller. The job lets go of its handle of the file system before it replies, so that once
//! every request is answered, the server's handle is the last one (it closes the engine at
//! unmount, `serve.rs`).
use idxfs_engine::Fs;
use std::sync::{Arc, Mutex, OnceLock};

/// The most extents a request may meet and still run where it came: `SLICE_EXTENTS` (one
/// engine operation's worth), or `IDXFS_LONG_EXTENTS` from the server's environment (tests: 0
/// runs every fallocate and every shrinking truncate on a thread of its own).
pub(crate) fn long_extents() -> u64 {
    static N: OnceLock<u64> = OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("IDXFS_LONG_EXTENTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(idxfs_engine::fs::SLICE_EXTENTS as u64)
    })
}

/// Runs `work` on `fs`, then `reply` with its result: on a thread of its own when `extents`
/// (the most the request may meet) is past `long_extents()` and the ring worker dispatching
/// it may park it, else here.
pub(crate) fn run<R: Send + 'static>(
    fs: Arc<Fs>,
    extents: u64,
    work: impl FnOnce(&Fs) -> R + Send + 'static,
    reply: impl FnOnce(R) + Send + 'static,
) {
    if extents <= long_extents() || !crate::uring::park() {
        return reply(work(&fs));
    }
    // The engine's caller is the thread's (`idxfs_engine::caller`): the job's is the request's.
    let privileged = idxfs_engine::caller::privileged();
    let job = Arc::new(Mutex::new(Some(move || {
        let r = idxfs_engine::caller::as_caller(privileged, || work(&fs));
        drop(fs);
        reply(r)
    })));
    let theirs = job.clone();
    let spawned = std::thread::Builder::new()
        .name("idxfs-long".into())
        .spawn(move || {
            crate::handoff::leave_inherited_idle();
            take(&theirs).map(|j| j())
        });
    if spawned.is_err() {
        // The job comes back with the failed spawn: it runs here, and its reply, sent before
        // the dispatch returns, is committed at once although the entry was to be parked.
        if let Some(j) = take(&job) {
            j();
        }
    }
}

fn take<T>(job: &Mutex<Option<T>>) -> Option<T> {
    job.lock().unwrap_or_else(|p| p.into_inner()).take()
}
