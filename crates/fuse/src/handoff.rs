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
//! one at once. So a worker drops to SCHED_IDLE just for the system call that sends its reply:
//! the caller wakes on the worker's CPU and runs there immediately, and the worker takes its
//! normal policy back before it waits for the next request, so it neither waits behind other
//! work when a request comes nor serves at idle priority. The kernel's sync wake-up hint ("the
//! waker is about to sleep") is the same idea, out of a FUSE server's reach.
//!
//! It only pays when the caller would otherwise move: one caller and nothing else for the
//! other CPU to do. With two callers (fs_mark with two threads ran 20-30% slower with an
//! unconditional handoff), or with the /dev/fuse thread busy with forgets (`rm -rf` of 200,000
//! files, 20-25% slower), the caller was not going to move and the two policy changes per
//! reply only cost. Whether another CPU was idle at the moment of a reply proved a poor sign:
//! two callers keep their workers busy only part of the time. What a worker can see cheaply
//! is the stream of requests, so [`Recent`] hands off only while the last [`QUIET`] requests
//! all came from one caller (the request header's pid: the calling thread) and no forget
//! came meanwhile.
//!
//! Coming back from SCHED_IDLE needs the right to raise priority (CAP_SYS_NICE, or an
//! RLIMIT_NICE that allows nice 0), so a probe thread tries the round trip once per process
//! first; without that right the workers never drop.
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

/// How many requests must pass with one caller and no forget before replies hand off again.
pub const QUIET: u64 = 64;

/// What the request stream looked like lately, shared by a mount's ring workers and its
/// /dev/fuse thread.
#[derive(Default)]
pub struct Recent {
    /// Requests taken from the rings.
    seq: AtomicU64,
    last_pid: AtomicU32,
    /// The last `seq` of the previous caller.
    pid_changed: AtomicU64,
    /// `seq` at the last forget.
    forgot: AtomicU64,
}

impl Recent {
    /// A ring request from process (thread) `pid`.
    pub fn request(&self, pid: u32) {
        let seq = self.seq.fetch_add(1, Relaxed) + 1;
        if self.last_pid.swap(pid, Relaxed) != pid {
            self.pid_changed.store(seq - 1, Relaxed);
        }
    }

    /// A forget came (through /dev/fuse).
    pub fn forget(&self) {
        self.forgot.store(self.seq.load(Relaxed), Relaxed);
    }

    /// Whether the last `QUIET` requests came from one caller, with no forget among them.
    pub fn one_caller(&self) -> bool {
        let seq = self.seq.load(Relaxed);
        let since = |at: &AtomicU64| seq.saturating_sub(at.load(Relaxed));
        seq >= QUIET && since(&self.pid_changed) >= QUIET && since(&self.forgot) >= QUIET
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

/// One worker thread's handoff state.
pub struct Handoff {
    /// The thread's own policy, restored after each reply; None: handoff off.
    normal: Option<libc::c_int>,
}

impl Handoff {
    /// For the calling thread. Off when not `wanted`, when the thread runs a real-time policy
    /// (someone chose that on purpose) or when the process could not come back from SCHED_IDLE.
    pub fn new(wanted: bool) -> Handoff {
        let normal = current_policy()
            .filter(|&p| wanted && (p == libc::SCHED_OTHER || p == libc::SCHED_BATCH))
            .filter(|_| can_return_from_idle());
        Handoff { normal }
    }

    pub fn is_on(&self) -> bool {
        self.normal.is_some()
    }

    /// Runs `send` (the system call that delivers replies) at SCHED_IDLE.
    pub fn send<R>(&mut self, send: impl FnOnce() -> R) -> R {
        let Some(normal) = self.normal else {
            return send();
        };
        if !set_policy(libc::SCHED_IDLE) {
            return send();
        }
        let r = send();
        if !set_policy(normal) {
            // Not expected after the probe; stay correct, if slower, and say so once.
            eprintln!(
                "idxfs: a FUSE worker could not leave SCHED_IDLE: {}; it stops handing off",
                std::io::Error::last_os_error()
            );
            self.normal = None;
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_restores_the_policy() {
        let before = current_policy();
        let mut h = Handoff::new(true);
        let inside = h.send(current_policy);
        assert_eq!(current_policy(), before, "policy after a handoff");
        if h.is_on() {
            assert_eq!(inside, Some(libc::SCHED_IDLE), "policy while sending");
        } else {
            assert_eq!(inside, before, "no handoff, no change");
        }
        let mut off = Handoff::new(false);
        assert!(!off.is_on());
        assert_eq!(off.send(current_policy), before);
    }

    #[test]
    fn recent_sees_one_caller_without_forgets() {
        let r = Recent::default();
        assert!(!r.one_caller(), "no requests yet");
        for _ in 0..QUIET {
            r.request(7);
        }
        assert!(r.one_caller(), "{QUIET} requests of one caller");
        r.request(8);
        assert!(!r.one_caller(), "a second caller");
        for _ in 0..QUIET - 1 {
            r.request(8);
        }
        assert!(r.one_caller(), "quiet again");
        r.forget();
        assert!(!r.one_caller(), "a forget");
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
