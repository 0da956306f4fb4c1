//! The copies `idxfs cp` runs a slice at a time (`cptree`): a request copies for at most
//! `SLICE` (20 ms) and, while more remains, answers with a token the client sends back to go on
//! (`IOC_CPTREE_MORE`). A ring worker serves its CPU's callers one request at a time
//! (`uring.rs`), so a whole tree copied in one request (19 s for 1,000,000 files) would
//! keep every other caller on that CPU waiting for it; sliced, they wait a slice at most.
//!
//! The job between slices is the engine's `CopyJob` with what it copies from (a snapshot's
//! view stays open, so the snapshot cannot be deleted under it) and the rules of the user
//! who asked (`permission::CopyChecks`, or none for root and the mount's owner). Only that
//! user may go on with it. A job nobody goes on with for `IDLE` (its client was killed) is
//! dropped, what it made staying, as after a killed `cp`; one user holds at most
//! `PER_USER` jobs, so a hostile one cannot fill the server's memory with them.
use crate::permission::CopyChecks;
use idxfs_engine::fs::{CopyAs, CopyJob, Unchecked};
use idxfs_engine::Fs;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The longest one request copies for (after the entry it is in).
const SLICE: Duration = Duration::from_millis(20);

/// `SLICE`, or `IDXFS_CP_SLICE_US` microseconds from the server's environment (tests: 0 is
/// one entry a request).
pub fn slice() -> Duration {
    static S: OnceLock<Duration> = OnceLock::new();
    *S.get_or_init(|| {
        std::env::var("IDXFS_CP_SLICE_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(SLICE, Duration::from_micros)
    })
}
/// How long a job waits for its client before it is dropped.
const IDLE: Duration = Duration::from_secs(60);
/// Jobs one user may have at once.
const PER_USER: usize = 4;

/// Whose rules a copy follows.
pub enum Rules {
    /// Root or the mount's owner: owners and modes kept.
    Kept,
    /// Anyone else: what their own `cp -a` would do.
    Checked(CopyChecks),
}

impl Rules {
    pub fn as_dyn(&self) -> &dyn CopyAs {
        match self {
            Rules::Kept => &Unchecked,
            Rules::Checked(c) => c,
        }
    }
}

/// A copy between two of its slices.
pub struct Job {
    /// Who asked for it: only they may go on with it.
    pub uid: u32,
    pub rules: Rules,
    /// The snapshot it copies from (None: the file system itself).
    pub from: Option<Arc<Fs>>,
    pub copy: CopyJob,
    /// For the log line at its end: the source's and the copy's names.
    pub names: (Vec<u8>, Vec<u8>),
    /// When its last slice ended.
    last: Instant,
}

impl Job {
    pub fn new(
        uid: u32,
        rules: Rules,
        from: Option<Arc<Fs>>,
        copy: CopyJob,
        names: (Vec<u8>, Vec<u8>),
    ) -> Job {
        Job {
            uid,
            rules,
            from,
            copy,
            names,
            last: Instant::now(),
        }
    }
}

/// The jobs waiting for their next slice, by token.
#[derive(Default)]
pub struct Jobs {
    map: Mutex<(u64, HashMap<u64, Job>)>,
}

impl Jobs {
    /// Keeps `job` for its next slice; its token, or None when its user holds `PER_USER`
    /// jobs already (the job is dropped).
    pub fn put(&self, mut job: Job) -> Option<u64> {
        let mut g = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let (next, map) = &mut *g;
        map.retain(|_, j| j.last.elapsed() < IDLE);
        if map.values().filter(|j| j.uid == job.uid).count() >= PER_USER {
            return None;
        }
        *next += 1;
        job.last = Instant::now();
        map.insert(*next, job);
        Some(*next)
    }

    /// Takes job `token` out for its next slice, when `uid` asked for it.
    pub fn take(&self, token: u64, uid: u32) -> Option<Job> {
        let mut g = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let map = &mut g.1;
        match map.get(&token) {
            Some(j) if j.uid == uid && j.last.elapsed() < IDLE => map.remove(&token),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idxfs_blockdev::MemDevice;
    use idxfs_engine::fs::Owner;
    use idxfs_engine::{MkfsOptions, OpenOptions};

    #[test]
    fn a_job_goes_on_only_for_its_user_and_one_user_holds_a_few() {
        let dev = Arc::new(MemDevice::new(64 << 20));
        Fs::mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
        let fs = Fs::open(dev, OpenOptions::default()).expect("open");
        let d = fs.mkdir(1, b"d", 0o755, Owner::default()).expect("mkdir");
        let job = |k: usize, uid: u32| {
            let name = format!("copy{k}");
            let copy = fs
                .copy_tree_start(&fs, d.ino, 1, name.as_bytes(), &Unchecked)
                .expect("start");
            Job::new(
                uid,
                Rules::Kept,
                None,
                copy,
                (b"d".to_vec(), name.into_bytes()),
            )
        };
        let jobs = Jobs::default();
        let tokens: Vec<u64> = (0..PER_USER)
            .map(|k| jobs.put(job(k, 7)).expect("room"))
            .collect();
        assert!(
            jobs.put(job(PER_USER, 7)).is_none(),
            "one too many for one user"
        );
        let other = jobs.put(job(PER_USER + 1, 8)).expect("another user's");
        // Only its user takes it, once.
        assert!(jobs.take(tokens[0], 8).is_none());
        let j = jobs.take(tokens[0], 7).expect("its user");
        assert_eq!(j.uid, 7);
        assert!(jobs.take(tokens[0], 7).is_none(), "taken already");
        assert!(jobs.take(other, 8).is_some());
        // Taken out, it leaves room for another.
        assert!(jobs.put(j).is_some());
    }
}
