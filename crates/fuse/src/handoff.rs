//! Handing the CPU to the caller with the reply.
//!
//! A ring worker serves the requests of callers on its own CPU. When its reply wakes the caller,
//! the worker is still running there, so the scheduler looks for an idle CPU and wakes the
//! caller on the other one. The next request then comes from that CPU and its worker, and the
//! caller bounces between CPUs, waking an idle one (on this VM a halted vCPU: a VM exit and
//! back) on every round trip. Measured here, one process creating files through the mount made
//! 6,000-6,500 creates/s that way, and 25,000-27,000 when pinned to one CPU with `taskset`.
//!
//! The kernel treats a CPU that runs only SCHED_IDLE tasks as idle when it places a woken task
//! (`sched_idle_cpu` in `select_idle_sibling`), and a woken normal task preempts a SCHED_IDLE
//! one at once. So a worker sends its reply at SCHED_IDLE: the caller wakes on the worker's
//! CPU and runs there immediately. The kernel's sync wake-up hint ("the waker is about to
//! sleep") is the same idea, out of a FUSE server's reach.
//!
//! A policy change costs about 1.5 us here (`sched_setscheduler` to SCHED_IDLE and back, 3 us
//! for the pair), so the worker does not change back after every reply. When it runs again,
//! the caller it handed off to has usually sent its next request and is waiting on it: the
//! worker serves that one still at SCHED_IDLE ([`Recent::may_serve_idle`]). It takes its own
//! policy back before it sleeps waiting for a request, so that a request that wakes it is
//! picked up at normal priority, and before it serves a request of another caller or an
//! fsync. While it runs at SCHED_IDLE any normal task on its CPU goes first, which a CPU hog
//! turns into starvation (below). Serving the caller's next request there saves two policy
//! changes per round trip (docs/benchmarks.md, "Handing the CPU to the caller").
//!
//! The reply and the look for the next request stay two `io_uring_enter` calls. One call that
//! submits the reply and then gathers completions without waiting never finds the next
//! request: the woken caller preempts the worker only on its way back to user space (this
//! kernel does not preempt inside the call), so the request comes after the look. Tried: every
//! request then took the slow path of a policy change and a sleep, 21,000 creates/s against
//! 29,000.
//!
//! It only pays when the caller would otherwise move: one caller and nothing else for the
//! other CPU to do. With two callers (fs_mark with two threads ran 20-30% slower with an
//! unconditional handoff) the caller was not going to move and the policy changes only cost.
//! Whether another CPU was idle at the moment of a reply proved a poor sign: two callers keep
//! their workers busy only part of the time. What a worker can see cheaply is the stream of
//! requests, so [`Recent`] hands off only while the last [`QUIET`] requests all came from one
//! caller (the request header's pid: the calling thread).
//!
//! An earlier rule also held the handoff back while forgets came through /dev/fuse: with two
//! policy changes per reply, handing off during `rm -rf` of 200,000 files made it 20-25%
//! slower. Served as above, handing off there costs `rm -rf` 3-6% (7.0 -> 7.2-7.4 s), and it
//! makes a create loop with 20% deletes at random, whose unlinks bring forgets all along, 1.2x
//! faster (50,000 files: 4.0-4.4 -> 3.4-3.5 s), so forgets no longer matter.
//!
//! A worker at SCHED_IDLE gets almost no CPU while a normal task wants its CPU: beside a CPU
//! hog on each CPU (a build next to the mount) it waited milliseconds for every step, and
//! creates ran at a few percent of their idle rate (`idxfs bench concurrency --mount`, the
//! busy-CPU row; docs/benchmarks.md); a starved worker holding the engine's lock also held up
//! every other thread, the forget thread among them, so an unlinked file's space came back
//! too late for a write after the `rm`. So a worker times
//! each stay at SCHED_IDLE (from the reply that handed off, and from each request it takes
//! there): one longer than [`STARVED`] means something else wants the CPU (or the caller
//! computes between requests, when a handoff gains nothing either), and the worker takes its
//! own policy back and hands off no more for [`STARVED_PAUSE`]. Under a lasting hog that costs
//! one starved stay a pause, not one a request. The clock is the vDSO's: no system call.
//!
//! Coming back from SCHED_IDLE needs the right to raise priority (CAP_SYS_NICE, or an
//! RLIMIT_NICE that allows nice 0), so a probe thread tries the round trip once per process
//! first; without that right the workers never drop.
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Longest stay at SCHED_IDLE that does not count as starved: a caller that keeps the file
/// system busy sends its next request within tens of microseconds, and a request served at
/// SCHED_IDLE (no fsync) takes about as long.
pub const STARVED: Duration = Duration::from_millis(2);

/// How long a worker that was starved at SCHED_IDLE hands off no more.
pub const STARVED_PAUSE: Duration = Duration::from_secs(1);

/// How many requests must pass with one caller before replies hand off again.
pub const QUIET: u64 = 64;

/// How long the /dev/fuse thread waits after a forget while replies hand off.
///
/// The kernel queues a forget when it evicts an inode, and wakes the thread waiting on
/// /dev/fuse, in the evicting task: for `rm -rf`, inside each unlink, and the thread it wakes
/// sits on the other CPU (an inter-processor interrupt, a VM exit here). A perf profile of
/// `rm -rf` of 60,000 files put a third of rm's own samples on that wake-up
/// (`fuse_dev_queue_forget` -> `__wake_up`). While the thread waits here instead of on
/// /dev/fuse, the kernel's wake-up finds no one and costs nothing, and the forgets queued
/// meanwhile come as one batch (about 40 per batch in that run). `rm -rf` of 100,000 files
/// went from 3.54-3.73 s to 3.00-3.24 s (3 runs each, alternated; a 5 ms wait did no better),
/// and of 1,000,000 from 39.6 to 34.2 s (the fourth huge-dir run in docs/benchmarks.md, commit
/// f1f8496; the file keeps only the latest run).
///
/// Only while replies hand off: without the handoff a caller's round trips cross CPUs, the
/// forget thread's wake-ups kept the other CPU from halting, and the same wait made that
/// `rm -rf` 60% slower (3.7-4.3 s -> 5.9-6.5 s). Once the kernel serves requests through the
/// rings, the thread carries nothing but forgets and interrupts, which wait at most this long;
/// before that (no ring request seen yet) it never waits.
pub const FORGET_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

/// What the request stream looked like lately, shared by a mount's ring workers.
#[derive(Default)]
pub struct Recent {
    /// Requests taken from the rings.
    seq: AtomicU64,
    last_pid: AtomicU32,
    /// The last `seq` of the previous caller.
    pid_changed: AtomicU64,
    /// Whether a ring worker hands off (the option is on and the process may come back from
    /// SCHED_IDLE).
    handoff_on: AtomicBool,
}

impl Recent {
    /// A ring request from process (thread) `pid`.
    pub fn request(&self, pid: u32) {
        let seq = self.seq.fetch_add(1, Relaxed) + 1;
        if self.last_pid.swap(pid, Relaxed) != pid {
            self.pid_changed.store(seq - 1, Relaxed);
        }
    }

    /// Whether a worker that handed off may serve request `opcode` of `pid` still at
    /// SCHED_IDLE: only the next request of the same caller, and none that waits for the
    /// device. A worker at SCHED_IDLE makes its CPU look idle, drawing other woken tasks there,
    /// and loses the CPU to any of them while it holds the engine's lock: with two callers
    /// (fs_mark) serving everything at SCHED_IDLE after a handoff cost 16%.
    pub fn may_serve_idle(&self, pid: u32, opcode: u32) -> bool {
        const FSYNC: u32 = 20;
        const FSYNCDIR: u32 = 30;
        self.last_pid.load(Relaxed) == pid
            && self.one_caller()
            && opcode != FSYNC
            && opcode != FSYNCDIR
    }

    /// A ring worker whose handoff is on (`Handoff::is_on`).
    pub fn worker_hands_off(&self) {
        self.handoff_on.store(true, Relaxed);
    }

    /// Whether the /dev/fuse thread should wait [`FORGET_PAUSE`] after a forget, so that the
    /// next ones queue up: only while replies hand off to one caller (see [`FORGET_PAUSE`]).
    pub fn forgets_may_wait(&self) -> bool {
        self.handoff_on.load(Relaxed) && self.one_caller()
    }

    /// Whether the last `QUIET` requests came from one caller.
    pub fn one_caller(&self) -> bool {
        let seq = self.seq.load(Relaxed);
        seq >= QUIET && seq.saturating_sub(self.pid_changed.load(Relaxed)) >= QUIET
    }
}

/// Whether a thread of this process can go to SCHED_IDLE and back (tried once, on a thread of
/// its own, so a failure strands nobody that matters).
fn can_return_from_idle() -> bool {
    static PROBE: OnceLock<bool> = OnceLock::new();
    *PROBE.get_or_init(|| {
        std::thread::Builder::new()
            .name("idxfs-probe".into())
            .spawn(|| {
                let policy = current_policy();
                policy.is_some_and(|p| set_policy(libc::SCHED_IDLE) && set_policy(p))
            })
            .ok()
            .and_then(|h| h.join().ok())
            .unwrap_or(false)
    })
}

fn current_policy() -> Option<libc::c_int> {
    // SAFETY: no pointers; 0 is the calling thread.
    let p = unsafe { libc::sched_getscheduler(0) };
    (p >= 0).then_some(p)
}

fn set_policy(policy: libc::c_int) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` outlives the call; 0 is the calling thread.
    unsafe { libc::sched_setscheduler(0, policy, &param) == 0 }
}

thread_local! {
    /// The policy this thread takes back when it leaves SCHED_IDLE; Some only while it is
    /// there.
    static IDLE_FROM: Cell<Option<libc::c_int>> = const { Cell::new(None) };
}

/// Takes the calling thread's own policy back if it is at SCHED_IDLE: run by the engine before
/// the thread waits for its operation lock (`idxfs_engine::fs::on_lock_wait`), whose holder,
/// running at the normal policy on this CPU (a long request's thread, `long.rs`), would
/// otherwise keep it off the CPU for as long as it works.
pub fn leave_idle() {
    if let Some(normal) = IDLE_FROM.with(Cell::take) {
        if !set_policy(normal) {
            IDLE_FROM.with(|f| f.set(Some(normal)));
        }
    }
}

/// Gives a thread started by a worker at SCHED_IDLE, which it inherited, the normal policy:
/// a thread that takes the engine's lock must not hold it while any normal task keeps it off
/// its CPU. Failure (no right to leave SCHED_IDLE, when the workers never go there) leaves it
/// as it was.
pub fn leave_inherited_idle() {
    if current_policy() == Some(libc::SCHED_IDLE) {
        set_policy(libc::SCHED_OTHER);
    }
}

/// One worker thread's handoff state.
pub struct Handoff {
    /// The thread's own policy, restored before it waits; None: handoff off.
    normal: Option<libc::c_int>,
    /// When the current stay at SCHED_IDLE began: the handoff, or the last request taken
    /// there (`served_idle`).
    since: Option<Instant>,
    /// No handoff before this: the thread was starved at SCHED_IDLE lately.
    paused_until: Option<Instant>,
}

impl Handoff {
    /// For the calling thread. Off when not `wanted`, when the thread runs a real-time policy
    /// (someone chose that on purpose) or when the process could not come back from SCHED_IDLE.
    pub fn new(wanted: bool) -> Handoff {
        let normal = current_policy()
            .filter(|&p| wanted && (p == libc::SCHED_OTHER || p == libc::SCHED_BATCH))
            .filter(|_| can_return_from_idle());
        Handoff {
            normal,
            since: None,
            paused_until: None,
        }
    }

    pub fn is_on(&self) -> bool {
        self.normal.is_some()
    }

    /// Puts the thread at SCHED_IDLE for replies that hand the CPU to their caller; a no-op
    /// when it is there already. False when handoff is off or the kernel refused.
    /// Also false while paused after a starved stay ([`STARVED_PAUSE`]). Starts the stay's
    /// clock.
    pub fn idle(&mut self) -> bool {
        let now = Instant::now();
        if self.paused_until.is_some_and(|t| now < t) {
            return false;
        }
        if let Some(normal) = self.normal.filter(|_| !self.is_idle()) {
            if set_policy(libc::SCHED_IDLE) {
                IDLE_FROM.with(|f| f.set(Some(normal)));
            }
        }
        self.since = Some(now);
        self.is_idle()
    }

    /// A request is taken at SCHED_IDLE: its caller waits for it from now on, so the clock
    /// of the stay starts again.
    pub fn served_idle(&mut self) {
        self.since = Some(Instant::now());
    }

    /// After a stay at SCHED_IDLE: when it was longer than [`STARVED`], gives the thread its
    /// own policy back and pauses handoffs ([`STARVED_PAUSE`]); true then.
    pub fn starved(&mut self) -> bool {
        let Some(since) = self.since.filter(|_| self.is_idle()) else {
            return false;
        };
        let now = Instant::now();
        if now.duration_since(since) <= STARVED {
            return false;
        }
        self.normal();
        self.paused_until = Some(now + STARVED_PAUSE);
        true
    }

    /// Gives the thread its own policy back, before it waits for a request: one arriving while
    /// other work holds the CPU must not wait behind it.
    pub fn normal(&mut self) {
        let Some(normal) = self.normal.filter(|_| self.is_idle()) else {
            return;
        };
        if set_policy(normal) {
            IDLE_FROM.with(|f| f.set(None));
        } else {
            // Not expected after the probe; stay correct, if slower, and say so once.
            eprintln!(
                "idxfs: a FUSE worker could not leave SCHED_IDLE: {}; it stops handing off",
                std::io::Error::last_os_error()
            );
            self.normal = None;
        }
    }

    /// Whether the thread runs at SCHED_IDLE now (`leave_idle` may have ended a stay).
    pub fn is_idle(&self) -> bool {
        IDLE_FROM.with(Cell::get).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_and_back_to_the_own_policy() {
        let before = current_policy();
        let mut h = Handoff::new(true);
        let on = h.is_on();
        assert_eq!(h.idle(), on, "drops exactly when handoff is on");
        assert_eq!(h.is_idle(), on);
        if on {
            assert_eq!(
                current_policy(),
                Some(libc::SCHED_IDLE),
                "policy while idle"
            );
            assert!(h.idle(), "idle twice: still idle");
            assert_eq!(current_policy(), Some(libc::SCHED_IDLE));
        } else {
            assert_eq!(current_policy(), before, "no handoff, no change");
        }
        h.normal();
        assert!(!h.is_idle());
        assert_eq!(current_policy(), before, "policy after a handoff");
        h.normal();
        assert_eq!(current_policy(), before, "normal twice: unchanged");
        let mut off = Handoff::new(false);
        assert!(!off.starved(), "never idle, never starved");
        assert!(!off.is_on());
        assert!(!off.idle());
        assert_eq!(current_policy(), before);
    }

    #[test]
    fn a_starved_stay_gives_the_policy_back_and_pauses_handoffs() {
        let before = current_policy();
        let mut h = Handoff::new(true);
        if !h.is_on() {
            // No right to come back from SCHED_IDLE here: nothing to starve.
            assert!(!h.idle() && !h.starved());
            return;
        }
        // Only the stay's length decides, and a test thread at SCHED_IDLE may itself wait
        // longer than STARVED on a busy machine: so no check that a short stay passes.
        assert!(h.idle());
        let went_idle = h.since.expect("the stay's clock runs");
        std::thread::sleep(Duration::from_millis(1));
        h.served_idle();
        assert!(
            h.since.is_some_and(|t| t > went_idle),
            "a request taken starts the clock again"
        );
        std::thread::sleep(STARVED + Duration::from_millis(1));
        assert!(h.starved(), "a stay longer than STARVED");
        assert!(!h.is_idle());
        assert_eq!(current_policy(), before, "the own policy is back");
        assert!(!h.idle(), "no handoff while paused");
        assert_eq!(current_policy(), before);
        assert!(!h.starved(), "not idle: nothing to time");
        h.paused_until = Some(Instant::now());
        assert!(h.idle(), "handoffs again once the pause is over");
        h.normal();
        assert_eq!(current_policy(), before);
    }

    #[test]
    fn forgets_wait_only_while_replies_hand_off() {
        let r = Recent::default();
        for _ in 0..QUIET {
            r.request(7);
        }
        assert!(r.one_caller());
        assert!(!r.forgets_may_wait(), "no worker hands off");
        r.worker_hands_off();
        assert!(r.forgets_may_wait(), "one caller, handing off");
        r.request(8);
        assert!(!r.forgets_may_wait(), "a second caller");
        let fresh = Recent::default();
        fresh.worker_hands_off();
        assert!(!fresh.forgets_may_wait(), "no ring requests yet");
    }

    #[test]
    fn recent_sees_one_caller() {
        let r = Recent::default();
        assert!(!r.one_caller(), "no requests yet");
        for _ in 0..QUIET {
            r.request(7);
        }
        assert!(r.one_caller(), "{QUIET} requests of one caller");
        assert!(r.may_serve_idle(7, 1), "the same caller's lookup");
        assert!(!r.may_serve_idle(7, 20), "an fsync");
        assert!(!r.may_serve_idle(8, 1), "another caller");
        r.request(8);
        assert!(!r.one_caller(), "a second caller");
        assert!(!r.may_serve_idle(8, 1), "not quiet yet");
        for _ in 0..QUIET - 1 {
            r.request(8);
        }
        assert!(r.one_caller(), "quiet again");
        for i in 0..QUIET * 2 {
            r.request(if i % 2 == 0 { 1 } else { 2 });
        }
        assert!(!r.one_caller(), "two callers taking turns");
        for _ in 0..QUIET {
            r.request(2);
        }
        assert!(r.one_caller());
    }
}
