//! Worker threads pinned one per CPU.
//!
//! A FUSE request is a handoff between the caller's thread and a worker, and back. With the
//! workers free to move, the scheduler kept stacking them and the callers so that most
//! handoffs woke an idle CPU; with worker `i` pinned to the `i`-th allowed CPU, fs_mark, `rm`
//! and `cp -a` ran faster (docs/benchmarks.md). This is the layout
//! FUSE-over-io_uring builds in (a queue and a worker per CPU); over /dev/fuse the kernel still
//! hands a request to whichever worker waits longest, so it is only part of that win.
//!
//! Pinning is on when the workers cover every allowed CPU (`threads` >= CPUs), where no CPU
//! is left without a worker; `-o pin` / `-o nopin` decide explicitly.
use std::cell::Cell;

/// The CPUs this process may run on, in order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the size passed is the set's own.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: i is below CPU_SETSIZE.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

thread_local! {
    static DONE: Cell<bool> = const { Cell::new(false) };
}

/// On a worker's first request: pins fuser's worker `fuser-N` to `cpus[N % len]`. Other
/// threads (tests calling the file system directly) are left alone. Costs one thread-local
/// read after the first call.
pub fn pin_this_worker(cpus: &[usize]) {
    if DONE.with(|d| d.replace(true)) || cpus.is_empty() {
        return;
    }
    let Some(n) = std::thread::current()
        .name()
        .and_then(|s| s.strip_prefix("fuser-"))
        .and_then(|s| s.parse::<usize>().ok())
    else {
        return;
    };
    pin_current_to(cpus[n % cpus.len()]);
}

/// Pins the calling thread to `cpu`. Failure (a cpuset changed under us) leaves it unpinned,
/// which is correct, only slower.
pub fn pin_current_to(cpu: usize) {
    if cpu >= libc::CPU_SETSIZE as usize {
        return;
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; cpu is below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spawn_named(name: &str, cpus: Vec<usize>) -> Vec<usize> {
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                pin_this_worker(&cpus);
                allowed_cpus()
            })
            .expect("spawn")
            .join()
            .expect("join")
    }

    #[test]
    fn workers_are_pinned_one_per_cpu_and_other_threads_are_not() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty(), "sched_getaffinity gave no CPU");
        for n in 0..cpus.len() + 1 {
            let got = spawn_named(&format!("fuser-{n}"), cpus.clone());
            assert_eq!(got, vec![cpus[n % cpus.len()]], "worker {n}");
        }
        assert_eq!(spawn_named("someone-else", cpus.clone()), cpus);
        assert_eq!(spawn_named("fuser-1", Vec::new()), cpus, "pinning off");
    }
}
