//! Inode numbers handed out in runs, one run per directory that creates (as XFS allocates
//! inodes in chunks of 64 near their parent, and ext4 near the parent's group).
//!
//! Inode items are keyed by inode number, so numbers taken from one global sequence put the
//! inodes of two directories filled at the same time (two writers, a mail server delivering
//! to several folders, a parallel untar) side by side in the same leaves. A whole-directory
//! pass (readdirplus, `ls -l`, a copy or backup) then reads every leaf of both
//! (docs/benchmarks.md, "concurrency": the cold readdirplus after two writers). With a run
//! per directory, each directory's inodes lie in runs of up to `RUN_MAX` consecutive
//! numbers, so its inode items fill leaves of their own, and two writers in two directories
//! change different leaves. Two more pieces make that pay: the B+tree splits a leaf right
//! after an inode's items when a later run's follow them (`btree::tree`, the split policy),
//! so a run filling in front of another's leaves full leaves, not halves; and readdirplus
//! steps over other runs instead of scanning through them (`readdir`, `SCAN_GAP`).
//!
//! A directory's first run is `RUN_MIN` numbers, and each next one twice the last up to
//! `RUN_MAX` when the last was used up, or half of it down to `RUN_MIN` when less than half
//! of it was used before it ended (`next_len`): a directory that gets one file leaves at most
//! `RUN_MIN - 1` numbers unused, one that gets a file now and then (a mail folder) stays
//! there, and the XArrays keyed by inode number (the inode cache, the published inodes) stay
//! dense (a run of 8 fills an eighth of an XArray node). A run starts where its length divides the
//! number, or, when the directory's last run ended at the sequence's end (nobody else took a
//! number since: one directory filled alone), right there, so a lone writer's numbers are as
//! dense as one sequence.
//!
//! A run lasts one transaction: the commit ends every run (`expire`), and a directory's next
//! create starts a new one at the sequence's end, as long as its last. Within a transaction
//! a run's leaves are the ones the transaction already changed; continuing it later would
//! put new inodes among old, full leaves in the middle of the tree, each needing a copy and
//! a split (and near a full device, space), where the sequence's end has room.
//!
//! Numbers a run reserves are below the sequence's next number (`TxnState::next_ino`, which
//! the superblock and the fsync log record) as soon as the run is taken, so they are never
//! handed out twice, and a run forgotten (at unmount, a crash, when the table is full, or
//! when its directory is gone, since a number is never reused) only leaves its rest unused:
//! numbers are 48 bits. Nothing on disk records a run.
use crate::btree::cache::FastMap;
use idxfs_format::MAX_INO;

/// A directory's first run, in numbers.
pub const RUN_MIN: u64 = 8;
/// The longest run: about eleven leaves of inode items with their back references, so the
/// leaf a run's last items share with another run's first is at most a tenth of its leaves.
/// A run shorter than a leaf would leave every leaf shared, each partly empty once both
/// runs end (docs/benchmarks.md, "concurrency", has the fill by run length).
pub const RUN_MAX: u64 = 1024;
/// Directories with a run at once: past it the table starts over (every run forgotten).
const DIRS_MAX: usize = 4096;

/// A directory's current run: numbers `next..end` are its own while `epoch` is the table's;
/// `len` is the run's length.
#[derive(Clone, Copy, Debug)]
struct Run {
    next: u64,
    end: u64,
    len: u64,
    epoch: u64,
}

/// The runs of the directories that created recently (see the module notes).
#[derive(Default)]
pub struct InoRuns {
    runs: FastMap<u64, Run>,
    /// Bumped by `expire`: a run of an older epoch has no numbers left, only its length.
    epoch: u64,
}

impl InoRuns {
    /// Ends every run (a commit froze the transaction they were taken in); their lengths
    /// stay, so a directory that goes on creating takes runs as long as before.
    pub fn expire(&mut self) {
        self.epoch += 1;
    }

    /// The number the next inode made in `dir` gets, with `next_ino` the sequence's next
    /// number, without taking it; None when no number is left (`MAX_INO`).
    pub fn peek(&self, dir: u64, next_ino: u64) -> Option<u64> {
        self.plan(dir, next_ino).map(|(ino, _)| ino)
    }

    /// Takes the number `peek` gives, moving `next_ino` past any run it starts.
    pub fn take(&mut self, dir: u64, next_ino: &mut u64) -> Option<u64> {
        let (ino, run) = self.plan(dir, *next_ino)?;
        match run {
            Some(r) => {
                debug_assert!(r.next <= r.end);
                *next_ino = (*next_ino).max(r.end);
                if self.runs.len() >= DIRS_MAX && !self.runs.contains_key(&dir) {
                    self.runs.clear();
                }
                self.runs.insert(dir, r);
            }
            None => *next_ino = ino + 1,
        }
        debug_assert!(ino < *next_ino && ino < MAX_INO);
        Some(ino)
    }

    /// The number `dir`'s next inode gets and `dir`'s run after it (None: taken from the
    /// sequence itself, no run left room within `MAX_INO`).
    fn plan(&self, dir: u64, next_ino: u64) -> Option<(u64, Option<Run>)> {
        let last = self.runs.get(&dir).copied();
        if let Some(r) = last {
            if r.next < r.end && r.epoch == self.epoch {
                return Some((
                    r.next,
                    Some(Run {
                        next: r.next + 1,
                        ..r
                    }),
                ));
            }
        }
        if next_ino >= MAX_INO {
            return None;
        }
        let (start, len) = match last {
            // The last run ended where the sequence still is: go on right there.
            Some(r) if r.end == next_ino => (next_ino, next_len(&r)),
            Some(r) => {
                let len = next_len(&r);
                (next_ino.next_multiple_of(len), len)
            }
            None => (next_ino.next_multiple_of(RUN_MIN), RUN_MIN),
        };
        match start.checked_add(len) {
            Some(end) if end <= MAX_INO => Some((
                start,
                Some(Run {
                    next: start + 1,
                    end,
                    len,
                    epoch: self.epoch,
                }),
            )),
            // No whole run fits below MAX_INO: the last numbers go one by one.
            _ => Some((next_ino, None)),
        }
    }
}

/// The length of the run after `r`: twice as long when `r` was used up, half as long
/// when less than half of it was used (it ended with its transaction first), else the same.
fn next_len(r: &Run) -> u64 {
    let used = r.next - (r.end - r.len);
    if used >= r.len {
        (r.len * 2).min(RUN_MAX)
    } else if used * 2 < r.len {
        (r.len / 2).max(RUN_MIN)
    } else {
        r.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes `n` numbers for `dir`, checking each against `peek`.
    fn take_n(r: &mut InoRuns, dir: u64, next: &mut u64, n: usize) -> Vec<u64> {
        (0..n)
            .map(|_| {
                let want = r.peek(dir, *next);
                let got = r.take(dir, next);
                assert_eq!(want, got);
                got.expect("numbers left")
            })
            .collect()
    }

    #[test]
    fn a_lone_directory_numbers_densely() {
        let mut r = InoRuns::default();
        let mut next = 16;
        let got = take_n(&mut r, 5, &mut next, 300);
        let want: Vec<u64> = (16..316).collect();
        assert_eq!(got, want);
        assert!(next >= 316 && next - 316 < RUN_MAX, "next {next}");
    }

    #[test]
    fn alternating_directories_get_runs_of_their_own() {
        let mut r = InoRuns::default();
        let mut next = 257;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        const EACH: usize = 5000;
        for _ in 0..EACH {
            a.extend(take_n(&mut r, 10, &mut next, 1));
            b.extend(take_n(&mut r, 11, &mut next, 1));
        }
        let mut all: Vec<u64> = a.iter().chain(&b).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 2 * EACH, "a number handed out twice");
        assert!(all.iter().all(|&i| i >= 257 && i < next));
        // Runs double from RUN_MIN to RUN_MAX, then stay there.
        let ramp = (RUN_MAX / RUN_MIN).trailing_zeros() as usize;
        for nums in [&a, &b] {
            assert!(nums.windows(2).all(|w| w[0] < w[1]), "not ascending");
            let breaks = nums.windows(2).filter(|w| w[1] != w[0] + 1).count();
            assert!(
                breaks <= EACH / RUN_MAX as usize + ramp + 1,
                "{breaks} breaks"
            );
        }
        // Unused numbers: alignment before each run (less than the ramp's runs together,
        // then none: runs of RUN_MAX start where the last one of the other ended) and the
        // rest of each directory's last run.
        assert!(next - 257 <= (2 * EACH) as u64 + 6 * RUN_MAX, "next {next}");
    }

    #[test]
    fn a_commit_ends_runs_and_the_next_starts_at_the_sequence_end() {
        let mut r = InoRuns::default();
        let mut next = 100;
        let first = take_n(&mut r, 3, &mut next, 20);
        let other = take_n(&mut r, 4, &mut next, 1)[0];
        r.expire();
        let after = take_n(&mut r, 3, &mut next, 1)[0];
        assert!(
            after > other && after > *first.last().expect("some"),
            "{after}"
        );
        // The length stayed: the run after expiry is as long as the last one.
        let run: Vec<u64> = take_n(&mut r, 3, &mut next, 15);
        assert!(run.windows(2).all(|w| w[1] == w[0] + 1), "{run:?}");
    }

    #[test]
    fn a_directory_that_gets_a_file_now_and_then_takes_short_runs() {
        let mut r = InoRuns::default();
        let mut next = 64;
        // A burst: runs grow.
        take_n(&mut r, 3, &mut next, 3000);
        r.expire();
        // Then one file a transaction: runs shrink back to RUN_MIN, so each file leaves at
        // most RUN_MIN - 1 numbers unused.
        for _ in 0..12 {
            take_n(&mut r, 3, &mut next, 1);
            r.expire();
        }
        let before = next;
        for _ in 0..10 {
            take_n(&mut r, 3, &mut next, 1);
            r.expire();
        }
        assert!(
            next - before <= 10 * RUN_MIN,
            "{} numbers for 10 files",
            next - before
        );
    }

    #[test]
    fn the_last_numbers_go_one_by_one_and_then_none() {
        let mut r = InoRuns::default();
        let mut next = MAX_INO - 3;
        let got = take_n(&mut r, 7, &mut next, 3);
        assert_eq!(got, vec![MAX_INO - 3, MAX_INO - 2, MAX_INO - 1]);
        assert_eq!(r.peek(7, next), None);
        assert_eq!(r.take(7, &mut next), None);
        assert_eq!(r.take(8, &mut next), None);
        assert_eq!(next, MAX_INO);
    }

    #[test]
    fn a_run_left_over_is_used_even_past_the_sequence_end() {
        let mut r = InoRuns::default();
        let mut next = MAX_INO - 100;
        let first = take_n(&mut r, 1, &mut next, 1)[0];
        // Another directory takes the rest of the sequence.
        while r.take(2, &mut next).is_some() {}
        // Directory 1 still has the rest of its run.
        let rest = take_n(&mut r, 1, &mut next, (RUN_MIN - 1) as usize);
        assert!(rest.iter().all(|&i| i > first && i < first + RUN_MIN));
        assert_eq!(r.take(1, &mut next), None);
    }

    #[test]
    fn a_full_table_starts_over_without_reusing_numbers() {
        let mut r = InoRuns::default();
        let mut next = 2;
        let mut all = Vec::new();
        for round in 0..3 {
            for d in 0..(DIRS_MAX as u64 + 10) {
                all.extend(take_n(&mut r, d * 3 + round, &mut next, 2));
            }
        }
        assert!(r.runs.len() <= DIRS_MAX);
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "a number handed out twice");
    }
}
