//! Commits beside new work (`txn`): a commit's nodes are written outside the operation lock
//! while the next transaction takes changes.
//!
//! - One commit is held at its first device write while operations change (and free) what the
//!   frozen transaction holds; every crash of the whole run opens to one of the committed
//!   states, exactly, with fsck clean: nothing the next transaction did reached a block the
//!   frozen or the previous commit uses.
//! - Threads change their own and a shared directory while commits run every few
//!   milliseconds; the result equals each thread's model, also after a reopen, and fsck is
//!   clean.
mod common;
use common::digest::digest;
use common::*;
use idxfs_blockdev::{BlockDevice, MemDevice, RecordingDevice, Tear};
use idxfs_engine::testutil::Rng;
use idxfs_engine::{Fs, MkfsOptions, OpenOptions};
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Holds the first write after `arm` until the test says go.
struct GateDevice {
    inner: Arc<RecordingDevice>,
    armed: AtomicBool,
    held: Mutex<Option<(Sender<()>, Receiver<()>)>>,
}

impl GateDevice {
    /// Arms the gate: returns (told when a write is held, tell it to go on).
    fn arm(&self) -> (Receiver<()>, Sender<()>) {
        let (held_tx, held_rx) = channel();
        let (go_tx, go_rx) = channel();
        *self.held.lock().expect("gate") = Some((held_tx, go_rx));
        self.armed.store(true, Ordering::SeqCst);
        (held_rx, go_tx)
    }
}

impl BlockDevice for GateDevice {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.inner.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        if self.armed.swap(false, Ordering::SeqCst) {
            if let Some((held, go)) = self.held.lock().expect("gate").take() {
                let _ = held.send(());
                let _ = go.recv();
            }
        }
        self.inner.write_at(buf, off)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

fn gated_fs(bytes: u64, o: OpenOptions) -> (Arc<RecordingDevice>, Arc<GateDevice>, Fs) {
    let base = Arc::new(MemDevice::new(bytes));
    Fs::mkfs(
        base.clone(),
        &MkfsOptions {
            node_size: 4096,
            uuid: Some([7; 16]),
            ..Default::default()
        },
    )
    .expect("mkfs");
    let rec = Arc::new(RecordingDevice::new(base.snapshot()));
    let gate = Arc::new(GateDevice {
        inner: rec.clone(),
        armed: AtomicBool::new(false),
        held: Mutex::new(None),
    });
    let fs = Fs::open(gate.clone(), o).expect("open");
    (rec, gate, fs)
}

/// Random changes to the files in `files` (parent, ino, name) and new ones in `dirs`.
fn change(
    fs: &Fs,
    rng: &mut Rng,
    dirs: &mut Vec<u64>,
    files: &mut Vec<(u64, u64, Vec<u8>)>,
    n: &mut u64,
) {
    for _ in 0..rng.below(12) + 4 {
        *n += 1;
        let parent = dirs[rng.below(dirs.len() as u64) as usize];
        match rng.below(8) {
            0 => dirs.push(
                fs.mkdir(parent, format!("d{n}").as_bytes(), 0o755, ME)
                    .expect("mkdir")
                    .ino,
            ),
            1 | 2 => {
                let name = format!("f{n}").into_bytes();
                let a = fs.create(parent, &name, 0o644, ME).expect("create");
                let len = [10usize, 3000, 9000, 40_000][rng.below(4) as usize];
                fs.write(a.ino, rng.below(5000), &rng.bytes(len))
                    .expect("write");
                files.push((parent, a.ino, name));
            }
            3 if !files.is_empty() => {
                let (p, _, name) = files.swap_remove(rng.below(files.len() as u64) as usize);
                fs.unlink(p, &name).expect("unlink");
            }
            4 if !files.is_empty() => {
                let i = rng.below(files.len() as u64) as usize;
                let (p, ino, name) = files[i].clone();
                let to = format!("r{n}").into_bytes();
                fs.rename(p, &name, parent, &to, 0).expect("rename");
                files[i] = (parent, ino, to);
            }
            5 if !files.is_empty() => {
                let ino = files[rng.below(files.len() as u64) as usize].1;
                fs.truncate(ino, rng.below(20_000)).expect("truncate");
            }
            6 if !files.is_empty() => {
                // Overwrites data the frozen transaction's extents point at: copy-on-write.
                let ino = files[rng.below(files.len() as u64) as usize].1;
                fs.write(ino, rng.below(8192), &rng.bytes(6000))
                    .expect("overwrite");
            }
            _ => {
                let ino = files.last().map_or(ROOT, |f| f.1);
                let len = rng.below(3000) as usize + 1;
                fs.setxattr(ino, b"user.k", &rng.bytes(len), 0)
                    .expect("setxattr");
            }
        }
    }
}

#[test]
fn operations_beside_a_commit_being_written_never_reach_its_blocks() {
    let (mut rng, seed) = Rng::from_env("commit beside");
    let (rec, gate, fs) = gated_fs(32 << 20, opts());
    let fs = Arc::new(fs);
    let (mut dirs, mut files, mut n) = (vec![ROOT], Vec::new(), 0u64);
    // (device events when the commit was durable, digest of what it committed)
    let mut states = vec![(rec.event_count(), digest(&fs))];
    let mut held_ops = 0;
    for round in 0..6 {
        change(&fs, &mut rng, &mut dirs, &mut files, &mut n);
        let frozen = digest(&fs);
        let (held, go) = gate.arm();
        let committer = {
            let fs = fs.clone();
            std::thread::spawn(move || fs.sync())
        };
        held.recv_timeout(Duration::from_secs(60))
            .expect("the commit reached the device");
        // The commit has frozen its transaction and waits at its first node write, without
        // the lock: reads and changes go on.
        assert_eq!(
            digest(&fs),
            frozen,
            "seed {seed} round {round}: reads see the frozen state"
        );
        change(&fs, &mut rng, &mut dirs, &mut files, &mut n);
        held_ops += 1;
        go.send(()).expect("go");
        committer
            .join()
            .expect("committer")
            .unwrap_or_else(|e| panic!("seed {seed} round {round}: sync failed: {e}"));
        states.push((rec.event_count(), frozen));
        // What the changes beside it freed (at least the frozen nodes they copied) is still
        // referenced by this durable commit: it waits for the next one.
        let pinned = fs.with_store(|s, _, _| s.alloc.pinned_blocks());
        assert!(
            pinned > 0,
            "seed {seed} round {round}: blocks the durable commit uses are free"
        );
        // The changes made beside it are the next commit's.
        fs.sync().expect("sync");
        states.push((rec.event_count(), digest(&fs)));
    }
    assert_eq!(held_ops, 6);
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("fs still shared"));
    fs.close().expect("close");
    let events = rec.event_count();
    for prefix in 0..=events {
        let durable = states.iter().rposition(|s| s.0 <= prefix).unwrap_or(0);
        for tear in [Tear::None, Tear::Drop(rng.next_u64())] {
            let img = rec.crash_image(prefix, tear);
            let dev = Arc::new(MemDevice::from_bytes(img.bytes));
            assert_clean(&dev);
            let fs = Fs::open(dev, opts()).unwrap_or_else(|e| {
                panic!("seed {seed} prefix {prefix} {tear:?}: open failed: {e}")
            });
            let got = digest(&fs);
            let at = states.iter().rposition(|s| s.1 == got).unwrap_or_else(|| {
                panic!("seed {seed} prefix {prefix} {tear:?}: opened a state no commit made")
            });
            assert!(
                at >= durable,
                "seed {seed} prefix {prefix} {tear:?}: opened state {at}, but {durable} was durable"
            );
            std::mem::forget(fs);
        }
    }
}

/// One thread's files: name -> content, in its own directory and (with its prefix) in the
/// shared one.
type Model = BTreeMap<(u64, Vec<u8>), Vec<u8>>;

fn worker(fs: &Fs, t: u64, own: u64, shared: u64, seed: u64, steps: u64) -> Model {
    let mut rng = Rng::new(seed ^ (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut model = Model::new();
    for i in 0..steps {
        let dir = if rng.below(3) == 0 { shared } else { own };
        let name = format!("t{t}-{}", rng.below(40)).into_bytes();
        let key = (dir, name.clone());
        match rng.below(10) {
            0..=3 => {
                let len = [0usize, 100, 5000, 70_000][rng.below(4) as usize];
                let data = rng.bytes(len);
                let ino = match fs.lookup(dir, &name) {
                    Ok(a) => a.ino,
                    Err(_) => fs.create(dir, &name, 0o644, ME).expect("create").ino,
                };
                fs.truncate(ino, 0).expect("truncate");
                fs.write(ino, 0, &data).expect("write");
                model.insert(key, data);
            }
            4 | 5 => {
                if model.remove(&key).is_some() {
                    fs.unlink(dir, &name).expect("unlink");
                } else {
                    assert!(fs.lookup(dir, &name).is_err(), "thread {t}: {key:?} exists");
                }
            }
            6 => {
                let to = format!("t{t}-{}", rng.below(40)).into_bytes();
                let tdir = if rng.below(2) == 0 { shared } else { own };
                if let Some(v) = model.remove(&key) {
                    fs.rename(dir, &name, tdir, &to, 0).expect("rename");
                    model.insert((tdir, to), v);
                }
            }
            7 if i % 7 == 0 => fs.fsync(own).expect("fsync"),
            8 if i % 13 == 0 => fs.sync().expect("sync"),
            9 if i % 3 == 0 => {
                // This thread's names in `dir`, listed in runs resumed by cookie (without the
                // lock where an earlier listing was published): only it changes them, so they
                // are its model's, while the others change theirs in the same directory.
                let mine = format!("t{t}-").into_bytes();
                let run = 1 + rng.below(16) as usize;
                let mut got: Vec<Vec<u8>> = list_in_runs(fs, dir, || run)
                    .into_iter()
                    .filter(|e| e.name.starts_with(&mine))
                    .map(|e| e.name)
                    .collect();
                got.sort();
                let want: Vec<Vec<u8>> = model
                    .keys()
                    .filter(|(d, _)| *d == dir)
                    .map(|(_, n)| n.clone())
                    .collect();
                assert_eq!(got, want, "thread {t}: listing of {dir}");
            }
            _ => {
                // Reads: what this thread wrote is what it reads back.
                if let Some(v) = model.get(&key) {
                    let a = fs.lookup(dir, &name).expect("lookup");
                    assert_eq!(a.size, v.len() as u64, "thread {t}: size of {key:?}");
                    assert!(
                        fs.read(a.ino, 0, v.len()).expect("read") == *v,
                        "thread {t}: content of {key:?}"
                    );
                }
            }
        }
    }
    model
}

fn check_models(fs: &Fs, models: &[Model], dirs: &[u64], seed: u64) {
    let mut want: BTreeMap<(u64, Vec<u8>), Vec<u8>> = BTreeMap::new();
    for m in models {
        want.extend(m.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    let mut got = BTreeMap::new();
    for &d in dirs {
        for e in fs.list(d).expect("list") {
            if e.name.starts_with(b"t") {
                let a = fs.getattr(e.ino).expect("getattr");
                assert_eq!(a.nlink, 1, "seed {seed}: {:?} link count", e.name);
                let data = fs.read(e.ino, 0, a.size as usize).expect("read");
                got.insert((d, e.name), data);
            }
        }
    }
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "seed {seed}: names"
    );
    assert!(got == want, "seed {seed}: contents differ from the models");
}

#[test]
fn threads_changing_files_while_commits_run_match_their_models() {
    let (_, seed) = Rng::from_env("commit beside threads");
    let dev = Arc::new(MemDevice::new(256 << 20));
    Fs::mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
    let o = OpenOptions {
        commit_interval: Some(Duration::from_millis(3)),
        dirty_nodes_limit: 64,
        ..opts()
    };
    let fs = Fs::open(dev.clone(), o.clone()).expect("open");
    let shared = fs.mkdir(ROOT, b"shared", 0o755, ME).expect("mkdir").ino;
    let threads = 4u64;
    let own: Vec<u64> = (0..threads)
        .map(|t| {
            fs.mkdir(ROOT, format!("own{t}").as_bytes(), 0o755, ME)
                .expect("mkdir")
                .ino
        })
        .collect();
    let models: Vec<Model> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (fs, own) = (&fs, own[t as usize]);
                s.spawn(move || worker(fs, t, own, shared, seed, 1500))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("worker")).collect()
    });
    let commits = fs.counters().commits.get();
    assert!(
        commits > 10,
        "seed {seed}: commits ran beside the work: {commits}"
    );
    let mut dirs = own.clone();
    dirs.push(shared);
    check_models(&fs, &models, &dirs, seed);
    fs.close().expect("close");
    assert_clean(&dev);
    let fs = Fs::open(dev.clone(), o).expect("reopen");
    check_models(&fs, &models, &dirs, seed);
    fs.close().expect("close");
}

#[test]
fn a_write_made_durable_beside_a_commit_returns_only_after_that_commit() {
    // With `-o sync`, a write goes through the fsync log, whose chain the frozen superblock
    // names: returning before that superblock is durable would let a crash lose the write.
    let o = OpenOptions {
        sync: idxfs_engine::fs::SyncMode::All,
        ..opts()
    };
    let (rec, gate, fs) = gated_fs(32 << 20, o);
    let fs = Arc::new(fs);
    let a = fs.create(ROOT, b"a", 0o644, ME).expect("create");
    fs.sync().expect("sync");
    fs.mkdir(ROOT, b"frozen", 0o755, ME).expect("mkdir");
    let (held, go) = gate.arm();
    let committer = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.sync())
    };
    held.recv_timeout(Duration::from_secs(60))
        .expect("the commit reached the device");
    let writer = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.write(a.ino, 0, b"durable"))
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !writer.is_finished(),
        "a durable write returned while the commit naming its log was held"
    );
    go.send(()).expect("go");
    committer.join().expect("committer").expect("sync");
    writer.join().expect("writer").expect("write");
    let returned = rec.event_count();
    drop(fs);
    for prefix in returned..=rec.event_count() {
        let img = rec.crash_image(prefix, Tear::None);
        let fs = Fs::open(Arc::new(MemDevice::from_bytes(img.bytes)), opts()).expect("open");
        let got = fs.lookup(ROOT, b"a").expect("a");
        assert_eq!(
            fs.read(got.ino, 0, 16).expect("read"),
            b"durable",
            "prefix {prefix}: the write was lost"
        );
        std::mem::forget(fs);
    }
}

/// An fsync's batch is held at its write, outside the lock, while a commit releases the log
/// chain it goes to. The commit's reap (after which the chain's blocks may be reused) waits
/// until that write has ended (`log_io`), so a late write never lands on a block that is
/// something else's by then; the fsync still returns, and its file is there after a reopen.
#[test]
fn a_commit_releases_log_blocks_only_after_the_writes_in_flight_to_them() {
    let (rec, gate, fs) = gated_fs(32 << 20, opts());
    let fs = Arc::new(fs);
    // A mount appends to a log only after its own first commit.
    fs.mkdir(ROOT, b"first-commit", 0o755, ME).expect("mkdir");
    fs.sync().expect("sync");
    let a = fs.create(ROOT, b"held", 0o644, ME).expect("create");
    fs.write(a.ino, 0, b"fsynced while a commit ran")
        .expect("write");
    let (held, go) = gate.arm();
    let fsyncer = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.fsync(a.ino))
    };
    held.recv_timeout(Duration::from_secs(60))
        .expect("the batch reached the device");
    let (done_tx, done_rx) = channel();
    let committer = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let r = fs.sync();
            let _ = done_tx.send(());
            r
        })
    };
    // Not a timing assertion: a correct commit cannot finish while the write is held, however
    // long the wait; a wrong one shows up whenever it finishes within it.
    let reaped_early = done_rx.recv_timeout(Duration::from_millis(300)).is_ok();
    go.send(()).expect("go");
    fsyncer.join().expect("fsyncer").expect("fsync");
    committer.join().expect("committer").expect("sync");
    assert!(
        !reaped_early,
        "the commit was reaped while a log write to the chain it released was in flight"
    );
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("fs still shared"));
    fs.close().expect("close");
    let dev = Arc::new(MemDevice::from_bytes(
        rec.crash_image(rec.event_count(), Tear::None).bytes,
    ));
    assert_clean(&dev);
    let fs = Fs::open(dev, opts()).expect("reopen");
    let got = fs.lookup(ROOT, b"held").expect("the fsynced file");
    assert_eq!(
        fs.read(got.ino, 0, 100).expect("read"),
        b"fsynced while a commit ran"
    );
}
