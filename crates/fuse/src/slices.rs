//! Requests that go a slice at a time: `idxfs cp` (`cptree`) and `idxfs rm` (`rmtree`). A
//! request works for at most `SLICE` (20 ms, after the step it is in) and, while more
//! remains, answers with a token the client sends back to go on (`IOC_CPTREE_MORE`,
//! `IOC_RMTREE_MORE`). A ring worker serves its CPU's callers one request at a time
//! (`uring.rs`), so a whole tree done in one request, seconds for a large one, would keep
//! every other caller on that CPU waiting for it; sliced, they wait a slice at most.
//! copy_file_range goes by a shorter slice (`COPY_SLICE`) without a token: past it, the
//! reply is a short copy, and the caller asks again for the rest (as every caller of
//! copy_file_range must). Its caller waits for each reply anyway, so a short slice costs it
//! only a round trip per slice, where the callers queued behind it wait for less.
//!
//! Between slices a job is the engine's `CopyJob` or `RemoveJob` with what it needs to go
//! on: what it copies from (a snapshot's view stays open, so the snapshot cannot be deleted
//! under it), and the rules of the user who asked (`permission`; none for root, and for a
//! copy the mount's owner). Only that user may go on with it. A job nobody goes on with for
//! `IDLE` (its client was killed) is dropped, what it did staying, as after a killed `cp`
//! or `rm`; one user holds at most `PER_USER` jobs of a kind, so a hostile one cannot fill
//! the server's memory with them.
use crate::permission::{CopyChecks, RemoveChecks};
use idxfs_engine::fs::{CopyAs, CopyJob, Permits, RemoveJob, Unchecked};
use idxfs_engine::Fs;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The longest one request works for (after the step it is in).
const SLICE: Duration = Duration::from_millis(20);
/// The longest one copy_file_range request works for (after the batch it is in, which
/// shares up to 8 MiB, of up to 2,048 extents): a 1 GiB file of large extents is still a
/// handful of requests.
const COPY_SLICE: Duration = Duration::from_millis(2);
/// How long a job waits for its client before it is dropped.
const IDLE: Duration = Duration::from_secs(60);
/// Jobs of one kind one user may have at once.
const PER_USER: usize = 4;

/// `SLICE`, or `IDXFS_SLICE_US` microseconds from the server's environment (tests: 0 is one
/// step a request).
pub fn slice() -> Duration {
    static S: OnceLock<Duration> = OnceLock::new();
    *S.get_or_init(|| {
        std::env::var("IDXFS_SLICE_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(SLICE, Duration::from_micros)
    })
}

/// `COPY_SLICE`, or `slice()` when that is shorter (tests).
pub fn copy_slice() -> Duration {
    slice().min(COPY_SLICE)
}

/// The request for the slice after a reply with `token` (`IOC_CPTREE_MORE`,
/// `IOC_RMTREE_MORE`): the token u64, then zeros up to the ioctl's `size`.
pub(crate) fn more_request(token: u64, size: usize) -> Vec<u8> {
    let mut buf = token.to_le_bytes().to_vec();
    buf.resize(size, 0);
    buf
}

/// The token of such a request; None for 0, which no job has, or a request too short.
pub(crate) fn token_of(buf: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(buf.get(..8)?.try_into().ok()?)).filter(|&t| t != 0)
}

/// Whose rules a copy follows.
pub enum CopyRules {
    /// Root or the mount's owner: owners and modes kept.
    Kept,
    /// Anyone else: what their own `cp -a` would do.
    Checked(CopyChecks),
}

impl CopyRules {
    pub fn as_dyn(&self) -> &dyn CopyAs {
        match self {
            CopyRules::Kept => &Unchecked,
            CopyRules::Checked(c) => c,
        }
    }
}

/// A copy between two of its slices.
pub struct CopyWork {
    pub rules: CopyRules,
    /// The snapshot it copies from, or the subvolume it copies inside (None: the file
    /// system itself).
    pub from: Option<Arc<Fs>>,
    /// The writable subvolume it copies into (None: the file system itself).
    pub into: Option<Arc<Fs>>,
    pub copy: CopyJob,
    /// For the log line at its end: the source's and the copy's names.
    pub names: (Vec<u8>, Vec<u8>),
}

/// Whose rules a removal follows.
pub enum RemoveRules {
    /// Root: every check passes.
    Root,
    /// Anyone else: what `rm -rf` would meet.
    Checked(RemoveChecks),
}

impl RemoveRules {
    pub fn as_dyn(&self) -> &dyn Permits {
        match self {
            RemoveRules::Root => &Unchecked,
            RemoveRules::Checked(c) => c,
        }
    }
}

/// A removal between two of its slices: the directory its name is in (the kernel's
/// number, for what it must forget) and the name.
pub struct RemoveWork {
    pub rules: RemoveRules,
    pub removal: RemoveJob,
    pub parent: u64,
    pub name: Vec<u8>,
    /// The writable subvolume it removes in, and its slot: the high bits of the kernel's
    /// numbers for its inodes (None: the file system itself).
    pub inside: Option<(Arc<Fs>, u64)>,
}

/// A job and who may go on with it.
struct Held<T> {
    uid: u32,
    /// When its last slice ended.
    last: Instant,
    job: T,
}

/// The jobs of one kind waiting for their next slice, by token.
pub struct Jobs<T> {
    map: Mutex<(u64, HashMap<u64, Held<T>>)>,
}

impl<T> Default for Jobs<T> {
    fn default() -> Self {
        Jobs {
            map: Mutex::new((0, HashMap::new())),
        }
    }
}

impl<T> Jobs<T> {
    /// Keeps `job` of user `uid` for its next slice; its token, or None when that user holds
    /// `PER_USER` jobs already (the job is dropped).
    pub fn put(&self, uid: u32, job: T) -> Option<u64> {
        let mut g = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let (next, map) = &mut *g;
        map.retain(|_, j| j.last.elapsed() < IDLE);
        if map.values().filter(|j| j.uid == uid).count() >= PER_USER {
            return None;
        }
        *next += 1;
        let last = Instant::now();
        map.insert(*next, Held { uid, last, job });
        Some(*next)
    }

    /// Takes job `token` out for its next slice, when `uid` asked for it.
    pub fn take(&self, token: u64, uid: u32) -> Option<T> {
        let mut g = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let map = &mut g.1;
        match map.get(&token) {
            Some(j) if j.uid == uid && j.last.elapsed() < IDLE => map.remove(&token).map(|h| h.job),
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
        let job = |k: usize| {
            let name = format!("copy{k}");
            let copy = fs
                .copy_tree_start(&fs, d.ino, 1, name.as_bytes(), &Unchecked)
                .expect("start");
            let names = (b"d".to_vec(), name.into_bytes());
            CopyWork {
                rules: CopyRules::Kept,
                from: None,
                into: None,
                copy,
                names,
            }
        };
        let jobs = Jobs::default();
        let tokens: Vec<u64> = (0..PER_USER)
            .map(|k| jobs.put(7, job(k)).expect("room"))
            .collect();
        assert!(
            jobs.put(7, job(PER_USER)).is_none(),
            "one too many for one user"
        );
        let other = jobs.put(8, job(PER_USER + 1)).expect("another user's");
        // Only its user takes it, once.
        assert!(jobs.take(tokens[0], 8).is_none());
        let j = jobs.take(tokens[0], 7).expect("its user");
        assert_eq!(j.names.1, b"copy0");
        assert!(jobs.take(tokens[0], 7).is_none(), "taken already");
        assert!(jobs.take(other, 8).is_some());
        // Taken out, it leaves room for another.
        assert!(jobs.put(7, j).is_some());
    }
}
