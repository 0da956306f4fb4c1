//! The operation lock: a mutex whose waiters spin, and hand it between threads rarely.
//!
//! Every tree change runs under one lock (`Shared::inner`; per-node latches are not built,
//! issue 22). Between two threads changing trees back to back, a plain `Mutex` costs twice
//! (docs/benchmarks.md, "concurrency", has the measurements):
//! - while a waiter sleeps in the futex, every unlock is a wake-up system call, and the
//!   sleeper wakes on a CPU that may have halted;
//! - each time the lock changes threads, the working set of the tree change (the leaves
//!   being filled, the allocator, the caches) moves to the other CPU's cache. A waiter
//!   spinning on `try_lock` takes the lock in the holder's every gap between operations,
//!   which moves it more often still.
//!
//! So a thread that finds the lock taken spins, reading the lock's state once per [`POLL`]
//! (each read takes the holder's cache line away from it, so reading on every turn of the
//! loop slows the holder even when the lock changes hands rarely), and takes it when one of
//! these holds:
//! - **nobody took it since the last poll**: the holder is in one long hold, or gone. It
//!   tries the mutex, as a plain mutex's waiter would: a thread that comes back only after
//!   a round trip (a FUSE worker) keeps nobody waiting longer than a poll past its release;
//!   only a thread taking the lock back to back keeps waiters out;
//! - **it asked** (`handoff`, one asker at a time): from then no other thread takes the
//!   mutex, by the fast path or by the rule above, so the asker gets it at the holder's
//!   next unlock and clears the flag. A waiter asks once it has waited its patience:
//!   [`HANDOFF_AFTER`] times its share of the lock, the part of the time since its
//!   acquisitions that it held it (a moving average over its last few, waits counted as
//!   not holding). Two threads taking it back to back each hold it about that long in
//!   turn, so it changes threads once per `HANDOFF_AFTER`, not once per operation; a
//!   thread that mostly does other things (an fsync's flush, data I/O outside the lock, a
//!   FUSE round trip) asks soon or at once, and waits about one operation of the other's.
//!   The share, not the time since the thread last let go of the lock: a thread doing
//!   create, write and fsync takes the lock three times in a row, and would wait out the
//!   whole patience at each but the first.
//!
//! After [`SPIN_MAX`] (a long hold: a commit's freeze, or a thread taking the lock back to
//! back for long, a fallocate's slices) the asker sleeps in the mutex: nobody else takes the
//! mutex while its ask stands, so the next unlock wakes it and it gets the lock. Any other
//! waiter sleeps [`SLEEP`] between its looks and asks when the ask is free. Not in the
//! mutex: an unlock wakes a sleeper there, but a holder that takes the lock back at once wins
//! that race nearly every time (the sleeper must first be scheduled, on a CPU that may have
//! halted), and a thread asleep there cannot ask, so a waiter that had found another one
//! asking waited for all of such a run: half a second beside a punch of 200,000 extents,
//! for a create through the mount. Every acquisition is the mutex's own, so the exclusion is
//! `Mutex`'s; the rules only choose who tries it when. No thread waits forever: once a
//! waiter has asked, nobody but it takes the mutex, and the asker clears the flag when it has
//! it, so each waiter in turn can ask.
//!
//! A spinning waiter yields its CPU at each look: another thread runnable there (one woken
//! from its I/O, the commit thread) runs first, where a spin would keep it off the CPU
//! while the holder needs it to go on. It spins for at most `SPIN_MAX`: a CPU that sleeps
//! may halt, and waking it costs more than the spin.
use crate::counters::Counters;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LockResult, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

/// How often a spinning waiter reads the lock's state.
pub(crate) const POLL: Duration = Duration::from_micros(4);
/// The longest a waiter waits before it asks for the lock: what a thread taking it back to
/// back holds it for while another waits.
pub(crate) const HANDOFF_AFTER: Duration = Duration::from_micros(200);
/// A waiter stops spinning after this long (module docs: the asker sleeps in the mutex, the
/// others between their looks).
pub(crate) const SPIN_MAX: Duration = Duration::from_micros(400);
/// How long a waiter past `SPIN_MAX` that is not the asker sleeps between its looks: short
/// beside the holds that make it sleep, long enough that the looks cost nothing.
pub(crate) const SLEEP: Duration = Duration::from_micros(50);

pub(crate) struct OpLock<T> {
    mutex: Mutex<T>,
    /// Boxed, so the structure that holds the lock keeps its own layout (the lines' alignment
    /// would move its fields, which lock-free readers read).
    state: Box<State>,
    /// `op_lock_handoffs`, `op_lock_sleeps`.
    counters: Arc<Counters>,
}

#[derive(Default)]
struct State {
    /// Acquisitions so far: a waiter watches it to tell a holder that comes straight back
    /// from one that stays or went away.
    taken: Line<AtomicU64>,
    /// A waiter asked for the lock: nobody else takes it until the asker has. Read by every
    /// acquisition, written twice a handoff: a line of its own.
    handoff: Line<AtomicBool>,
}

/// A value alone in its pair of cache lines (as `counters`' stripes).
#[derive(Default)]
#[repr(align(128))]
struct Line<T>(T);

impl<T> std::ops::Deref for Line<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

thread_local! {
    /// What this thread runs before it waits for the lock (`on_lock_wait`).
    static ON_WAIT: Cell<Option<fn()>> = const { Cell::new(None) };
}

/// Has the calling thread run `hook` whenever it is about to wait for the operation lock
/// (None: nothing). A FUSE ring worker that may be running at SCHED_IDLE takes its normal
/// policy back there (`fuse/src/handoff.rs`): waiting at SCHED_IDLE for a holder that runs at
/// the normal policy on the same CPU, it would get the CPU only when the holder sleeps, too
/// seldom even to ask for the lock, and every caller of that worker would wait with it.
pub fn on_lock_wait(hook: Option<fn()>) {
    ON_WAIT.with(|h| h.set(hook));
}

thread_local! {
    /// The lock this thread held last (its address), when it took it, and its share of the
    /// time since its acquisitions that it spent holding it (a moving average): a waiter's
    /// patience.
    static SHARE: Cell<(usize, Option<Instant>, f32)> = const { Cell::new((0, None, 0.0)) };
}

/// The lock held; letting go of it updates the thread's share (`SHARE`).
pub(crate) struct OpGuard<'a, T> {
    g: MutexGuard<'a, T>,
    lock: &'a OpLock<T>,
    taken_at: Instant,
}

impl<T> std::ops::Deref for OpGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.g
    }
}

impl<T> std::ops::DerefMut for OpGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.g
    }
}

impl<T> Drop for OpGuard<'_, T> {
    fn drop(&mut self) {
        let at = self.lock.id();
        let now = Instant::now();
        SHARE.with(|c| {
            let (lock, before, share) = c.get();
            let (before, share) = match before {
                Some(b) if lock == at => (b, share),
                _ => (self.taken_at, 0.0),
            };
            // Held since this acquisition, against the time since the one before it
            // (waits included, so a thread kept waiting loses share).
            let held = (now - self.taken_at).as_secs_f32();
            let span = (now - before).as_secs_f32();
            let this = if span > 0.0 {
                (held / span).min(1.0)
            } else {
                1.0
            };
            c.set((at, Some(self.taken_at), 0.75 * share + 0.25 * this));
        });
    }
}

impl<T> OpLock<T> {
    pub(crate) fn new(t: T, counters: Arc<Counters>) -> OpLock<T> {
        OpLock {
            mutex: Mutex::new(t),
            state: Box::default(),
            counters,
        }
    }

    /// Takes the lock (module docs). Poisoned as `Mutex::lock` is: the caller decides.
    pub(crate) fn lock(&self) -> LockResult<OpGuard<'_, T>> {
        if !self.state.handoff.load(Ordering::Relaxed) {
            if let Some(r) = self.try_take() {
                return r;
            }
        }
        self.lock_slow()
    }

    /// The mutex, if free, counted as taken.
    fn try_take(&self) -> Option<LockResult<OpGuard<'_, T>>> {
        let r = match self.mutex.try_lock() {
            Ok(g) => Ok(self.guard(g)),
            Err(TryLockError::Poisoned(p)) => Err(PoisonError::new(self.guard(p.into_inner()))),
            Err(TryLockError::WouldBlock) => return None,
        };
        self.state.taken.fetch_add(1, Ordering::Relaxed);
        Some(r)
    }

    fn guard<'a>(&'a self, g: MutexGuard<'a, T>) -> OpGuard<'a, T> {
        OpGuard {
            g,
            lock: self,
            taken_at: Instant::now(),
        }
    }

    /// How long this thread waits before it asks: `HANDOFF_AFTER` times its share of the
    /// lock (`SHARE`; none for a thread new to it).
    fn patience(&self) -> Duration {
        let (at, _, share) = SHARE.with(Cell::get);
        match at == self.id() && share.is_finite() {
            true => HANDOFF_AFTER.mul_f32(share.clamp(0.0, 1.0)),
            false => Duration::ZERO,
        }
    }

    /// Which lock a thread's `SHARE` is of: its address.
    fn id(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    #[cold]
    fn lock_slow(&self) -> LockResult<OpGuard<'_, T>> {
        if let Some(hook) = ON_WAIT.with(Cell::get) {
            hook();
        }
        let start = Instant::now();
        let patience = self.patience();
        let (mut asked, mut slept) = (false, false);
        let mut seen = self.state.taken.load(Ordering::Relaxed);
        loop {
            let now = Instant::now();
            if !asked && now - start >= patience {
                asked = (self.state.handoff)
                    .compare_exchange(false, true, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok();
                if asked {
                    Counters::inc(&self.counters.op_lock_handoffs);
                }
            }
            let t = self.state.taken.load(Ordering::Relaxed);
            let open = asked || (t == seen && !self.state.handoff.load(Ordering::Relaxed));
            seen = t;
            if open {
                if let Some(r) = self.try_take() {
                    if asked {
                        self.state.handoff.store(false, Ordering::Relaxed);
                    }
                    return r;
                }
            }
            if now - start >= SPIN_MAX {
                if !slept {
                    Counters::inc(&self.counters.op_lock_sleeps);
                    slept = true;
                }
                if asked {
                    // Nobody else takes the mutex while the ask stands, so the next unlock
                    // wakes this thread and it gets the lock.
                    let r = self.mutex.lock();
                    self.state.handoff.store(false, Ordering::Relaxed);
                    self.state.taken.fetch_add(1, Ordering::Relaxed);
                    return match r {
                        Ok(g) => Ok(self.guard(g)),
                        Err(p) => Err(PoisonError::new(self.guard(p.into_inner()))),
                    };
                }
                std::thread::sleep(SLEEP);
                continue;
            }
            // Another thread runnable on this CPU (one woken from its I/O, the commit
            // thread) runs first: spinning past it would keep it from a CPU.
            std::thread::yield_now();
            while now.elapsed() < POLL {
                std::hint::spin_loop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Threads that take the lock back to back, with and without pauses outside it, each
    /// bumping a plain counter under the lock and checking nobody else is inside: the count
    /// is every acquisition, and every thread finishes (a thread kept out for good would
    /// hang the test: the holders stop only when every thread is done).
    #[test]
    fn every_thread_gets_the_lock_and_holds_it_alone() {
        let lock = Arc::new(OpLock::new(0u64, Arc::default()));
        let inside = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        const THREADS: usize = 4;
        const EACH: u64 = 20_000;
        let hs: Vec<_> = (0..THREADS)
            .map(|k| {
                let (lock, inside, done) = (lock.clone(), inside.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut mine = 0u64;
                    // Thread 0 goes on taking the lock back to back until the others are
                    // done: the case where waiters must ask for it.
                    while mine < EACH || (k == 0 && done.load(Ordering::Relaxed) < THREADS - 1) {
                        let mut g = lock.lock().unwrap_or_else(|p| p.into_inner());
                        assert_eq!(inside.fetch_add(1, Ordering::Relaxed), 0, "two inside");
                        *g += 1;
                        // A long hold now and then: waiters sleep between their looks.
                        if k == 1 && mine.is_multiple_of(5_000) {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        inside.fetch_sub(1, Ordering::Relaxed);
                        drop(g);
                        mine += 1;
                        if k == 2 && mine.is_multiple_of(64) {
                            std::thread::sleep(Duration::from_micros(50));
                        }
                    }
                    if k != 0 {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    mine
                })
            })
            .collect();
        let total: u64 = hs.into_iter().map(|h| h.join().expect("thread")).sum();
        assert_eq!(*lock.lock().expect("not poisoned"), total);
        assert!(
            !lock.state.handoff.load(Ordering::Relaxed),
            "an ask left standing"
        );
    }

    /// Beside a thread that takes the lock back to back, each hold longer than `SPIN_MAX`,
    /// two waiters at once each get it within a few of its holds: one asks, the other sleeps
    /// between looks and asks in its turn. (Sleeping in the mutex, the one that could not ask
    /// lost the race at nearly every unlock to the holder taking it back.) Counted in the
    /// holder's holds, not timed.
    #[test]
    fn every_waiter_gets_in_within_a_few_holds_of_a_thread_holding_long_back_to_back() {
        let lock = Arc::new(OpLock::new((), Arc::default()));
        let holds = Arc::new(AtomicU64::new(0));
        let waiting = Arc::new(AtomicUsize::new(2));
        let holder = {
            let (lock, holds, waiting) = (lock.clone(), holds.clone(), waiting.clone());
            std::thread::spawn(move || {
                // Bounded, so that a waiter kept out fails the test instead of hanging it.
                while waiting.load(Ordering::Relaxed) > 0 && holds.load(Ordering::Relaxed) < 3_000 {
                    let _g = lock.lock().unwrap_or_else(|p| p.into_inner());
                    holds.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(SPIN_MAX * 2);
                }
            })
        };
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (lock, holds, waiting) = (lock.clone(), holds.clone(), waiting.clone());
                std::thread::spawn(move || {
                    let mut worst = 0;
                    for _ in 0..100 {
                        let before = holds.load(Ordering::Relaxed);
                        let g = lock.lock().unwrap_or_else(|p| p.into_inner());
                        worst = worst.max(holds.load(Ordering::Relaxed) - before);
                        drop(g);
                        std::thread::sleep(SPIN_MAX);
                    }
                    waiting.fetch_sub(1, Ordering::Relaxed);
                    worst
                })
            })
            .collect();
        let worst: Vec<u64> = waiters
            .into_iter()
            .map(|h| h.join().expect("waiter"))
            .collect();
        holder.join().expect("holder");
        // The other waiter's turn and the holder's hold in progress: 1 here. The bound leaves
        // room for a VM that stops a thread for milliseconds; sleeping in the mutex, a waiter
        // waited through up to thousands.
        assert!(
            worst.iter().all(|&w| w <= 20),
            "holds a waiter waited through: {worst:?}"
        );
    }

    /// A panic under the lock poisons it as a `Mutex`'s, for the caller to act on.
    #[test]
    fn a_panic_under_the_lock_poisons_it() {
        let lock = Arc::new(OpLock::new((), Arc::default()));
        let l = lock.clone();
        let _ = std::thread::spawn(move || {
            let _g = l.lock();
            panic!("under the lock");
        })
        .join();
        assert!(lock.lock().is_err());
    }
}
