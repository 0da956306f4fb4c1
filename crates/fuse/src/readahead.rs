//! Reading a directory ahead of the kernel.
//!
//! A whole-directory pass through the mount (`ls -l`, `find`, `tar`, readdir+stat) alternates:
//! the daemon reads a batch of entries with their attributes (`Fs::readdir_plus_batch`), then
//! the caller's kernel turns the reply into dentries and inodes while the daemon waits, then
//! asks for the next batch from the last entry's cookie. The two halves need not alternate:
//! when a reply fills the kernel's buffer, a thread of its own reads the next batch while the
//! kernel is busy with this one, usually on the other CPU, and the next request takes it.
//!
//! A batch read ahead is used only if nothing in the file system changed since it was read:
//! [`Fs::pin_if_unchanged`] checks the engine's change sequence and pins the batch's inodes
//! under one lock, so what the kernel gets is exactly what reading it then would have given.
//! Otherwise, or when the next request does not start where the last reply ended (seekdir, a
//! second reader), the request reads its batch itself, as without read-ahead.
use idxfs_engine::fs::PlusBatch;
use idxfs_engine::Fs;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Listings read ahead at once (one batch each); a new one evicts the oldest.
const SLOTS: usize = 4;
/// The longest a request waits for a batch being read ahead before it reads the batch itself.
const WAIT: Duration = Duration::from_millis(200);

enum State {
    Reading,
    Ready(PlusBatch),
    Failed,
}

/// The batch of directory `dir` from `cookie` on.
struct Slot {
    dir: u64,
    cookie: u64,
    state: State,
}

struct Job {
    dir: u64,
    cookie: u64,
    limit: usize,
}

#[derive(Default)]
struct Shared {
    slots: Mutex<Vec<Slot>>,
    done: Condvar,
}

impl Shared {
    fn slots(&self) -> MutexGuard<'_, Vec<Slot>> {
        // A panic while holding this lock leaves at worst a slot that is never used.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct ReadAhead {
    shared: Arc<Shared>,
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl ReadAhead {
    /// Starts the reading thread; without it (the spawn failed) nothing is read ahead.
    pub fn new(fs: Arc<Fs>) -> ReadAhead {
        let shared = Arc::new(Shared::default());
        let (tx, rx) = channel::<Job>();
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("idxfs-readahead".into())
            .spawn(move || {
                let waiting = |slots: &[Slot], job: &Job| {
                    slots.iter().position(|x| {
                        x.dir == job.dir
                            && x.cookie == job.cookie
                            && matches!(x.state, State::Reading)
                    })
                };
                for job in rx {
                    // A slot evicted or replaced while its job queued is not going to be asked for.
                    if waiting(&s.slots(), &job).is_none() {
                        continue;
                    }
                    let r = fs.readdir_plus_batch(job.dir, job.cookie, job.limit);
                    let mut slots = s.slots();
                    if let Some(slot) = waiting(&slots, &job).and_then(|i| slots.get_mut(i)) {
                        slot.state = match r {
                            Ok(b) => State::Ready(b),
                            Err(_) => State::Failed,
                        };
                    }
                    drop(slots);
                    s.done.notify_all();
                }
            })
            .ok();
        ReadAhead {
            shared,
            jobs: thread.as_ref().map(|_| tx),
            thread,
        }
    }

    /// Reads the batch of `dir` from `cookie` on (up to `limit` entries) in the background.
    pub fn start(&self, dir: u64, cookie: u64, limit: usize) {
        let Some(jobs) = &self.jobs else { return };
        let mut slots = self.shared.slots();
        // This listing has moved on: a batch of it still waiting is not going to be asked for.
        slots.retain(|x| x.dir != dir);
        if slots.len() >= SLOTS {
            slots.remove(0);
        }
        slots.push(Slot {
            dir,
            cookie,
            state: State::Reading,
        });
        if jobs.send(Job { dir, cookie, limit }).is_err() {
            slots.pop();
        }
    }

    /// The batch read ahead for `dir` from `cookie` on, waiting for it if it is being read.
    /// None if there is none (or it failed, or took too long): read it now.
    pub fn take(&self, dir: u64, cookie: u64) -> Option<PlusBatch> {
        let deadline = Instant::now() + WAIT;
        let mut slots = self.shared.slots();
        loop {
            let i = slots
                .iter()
                .position(|x| x.dir == dir && x.cookie == cookie)?;
            if !matches!(slots[i].state, State::Reading) {
                return match slots.remove(i).state {
                    State::Ready(b) => Some(b),
                    _ => None,
                };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                slots.remove(i);
                return None;
            }
            slots = match self.shared.done.wait_timeout(slots, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        // Closing the channel ends the thread, which holds a handle on the engine.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idxfs_blockdev::MemDevice;
    use idxfs_engine::fs::Owner;
    use idxfs_engine::{MkfsOptions, OpenOptions};

    fn fs_with(n: usize) -> (Arc<Fs>, u64) {
        let dev = Arc::new(MemDevice::new(64 << 20));
        Fs::mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
        let fs = Fs::open(dev, OpenOptions::default()).expect("open");
        let d = fs.mkdir(1, b"d", 0o755, Owner::default()).expect("mkdir");
        for i in 0..n {
            fs.create(d.ino, format!("f{i}").as_bytes(), 0o644, Owner::default())
                .expect("create");
        }
        (Arc::new(fs), d.ino)
    }

    #[test]
    fn the_batch_read_ahead_is_what_a_read_then_gives() {
        let (fs, d) = fs_with(50);
        let ra = ReadAhead::new(fs.clone());
        ra.start(d, 0, 20);
        let b = ra.take(d, 0).expect("read ahead");
        let now = fs.readdir_plus_batch(d, 0, 20).expect("read");
        assert_eq!(b.entries, now.entries);
        assert_eq!(b.seq, now.seq);
        assert!(ra.take(d, 0).is_none(), "taken once");
        // The creates are not committed yet; a commit is not a change.
        fs.sync().expect("sync");
        let inos: Vec<u64> = b.entries.iter().map(|(e, _)| e.ino).collect();
        assert!(fs.pin_if_unchanged(b.seq, &inos), "nothing changed");
    }

    #[test]
    fn a_change_after_the_read_voids_the_batch() {
        let (fs, d) = fs_with(10);
        let ra = ReadAhead::new(fs.clone());
        ra.start(d, 0, 100);
        let b = ra.take(d, 0).expect("read ahead");
        fs.create(d, b"late", 0o644, Owner::default())
            .expect("create");
        assert!(!fs.pin_if_unchanged(b.seq, &[d]), "a create came after");
        let b = fs.readdir_plus_batch(d, 0, 100).expect("read");
        fs.setattr(
            b.entries[2].0.ino,
            &idxfs_engine::fs::SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .expect("chmod");
        assert!(!fs.pin_if_unchanged(b.seq, &[]), "a chmod came after");
    }

    #[test]
    fn only_the_position_asked_for_is_used() {
        let (fs, d) = fs_with(30);
        let ra = ReadAhead::new(fs.clone());
        ra.start(d, 0, 10);
        assert!(ra.take(d, 5).is_none(), "another position");
        ra.start(d, 0, 10);
        ra.start(d, 7, 10);
        assert!(ra.take(d, 0).is_none(), "the listing moved on");
        assert!(ra.take(d, 7).is_some());
        for dir in 100..100 + SLOTS as u64 + 1 {
            ra.start(dir, 0, 10);
        }
        assert!(
            ra.take(100, 0).is_none(),
            "evicted: the oldest of more than {SLOTS}"
        );
        assert!(
            ra.take(101, 0).is_none(),
            "no such directory: the read failed"
        );
    }
}
