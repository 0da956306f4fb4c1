//! Many threads at once through the library: two writers doing random operations (creates,
//! appends, truncates, renames, unlinks, xattrs, fsyncs, syncs) in a directory of their own
//! and in one they share, with commits coming every few dozen nodes, while two readers check
//! every view they get without holding anything:
//! - a name readdirplus lists leads, by lookup, to the inode it listed, or to nothing (names
//!   are never reused, so "nothing" only means removed since): the name-hash index and the
//!   inode-order index agree;
//! - nothing is older than a finished change: a name whose removal (unlink, or rename away)
//!   had returned before a lookup began is not found, and an inode whose unlink had returned
//!   before a getattr began is gone (nothing holds it open);
//! - a file has exactly one link (no test operation links), in readdirplus's attributes and
//!   in getattr;
//! - a file's bytes are always a prefix of its own stream (writers only append, or cut), and
//!   its `user.v` xattr is one of the values its writer gives it.
//!
//! Then the writers' models, merged, must equal what the file system holds, before and after
//! a reopen, with fsck clean. Each writer keeps to names it made itself, so its model needs
//! no other thread's order. Seeded: `IDXFS_SEED=n` replays a writer's choices (the threads'
//! interleaving is the machine's).
mod common;
use common::*;
use idxfs_engine::testutil::Rng;
use idxfs_engine::{Error, Fs, OpenOptions};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Byte `o` of inode `ino`'s stream: every file holds a prefix of its own.
fn stream(ino: u64, o: u64) -> u8 {
    (ino.wrapping_mul(31) ^ o.wrapping_mul(7) ^ (o >> 9)) as u8
}

fn stream_bytes(ino: u64, from: u64, len: u64) -> Vec<u8> {
    (from..from + len).map(|o| stream(ino, o)).collect()
}

/// The xattr values a writer gives `ino`: `v{ino}-{k}`.
fn xattr_ok(ino: u64, v: &[u8]) -> bool {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.strip_prefix(&format!("v{ino}-")))
        .is_some_and(|k| k.parse::<u64>().is_ok())
}

#[derive(Debug, Clone, PartialEq)]
struct File {
    ino: u64,
    size: u64,
    xattr: Option<Vec<u8>>,
}

/// One writer's files: (directory, name) -> file.
type Model = BTreeMap<(u64, Vec<u8>), File>;

const OPS: u64 = 12_000;

/// What writers have finished removing: names (unique for ever) and inodes (unlinked, so
/// freed: nothing holds them).
#[derive(Default)]
struct Gone {
    names: Mutex<HashSet<Vec<u8>>>,
    inodes: Mutex<HashSet<u64>>,
    /// What writers did to each inode, and all they did in order (`diagnose`).
    history: Mutex<std::collections::HashMap<u64, Vec<String>>>,
    log: Mutex<Vec<String>>,
}

impl Gone {
    fn name(&self, n: &[u8]) -> bool {
        self.names.lock().expect("lock").contains(n)
    }
    fn inode(&self, ino: u64) -> bool {
        self.inodes.lock().expect("lock").contains(&ino)
    }
    fn note(&self, ino: u64, what: String) {
        self.log
            .lock()
            .expect("lock")
            .push(format!("{ino}: {what}"));
        self.history
            .lock()
            .expect("lock")
            .entry(ino)
            .or_default()
            .push(what);
    }
    fn of(&self, ino: u64) -> Vec<String> {
        self.history
            .lock()
            .expect("lock")
            .get(&ino)
            .cloned()
            .unwrap_or_default()
    }
}

fn writer(fs: &Fs, dirs: [u64; 2], names: &AtomicU64, gone: &Gone, seed: u64) -> Model {
    let mut rng = Rng::new(seed);
    let mut model = Model::new();
    let fresh = |rng: &mut Rng| -> (u64, Vec<u8>) {
        let n = names.fetch_add(1, Ordering::Relaxed);
        let dir = dirs[rng.below(2) as usize];
        (dir, format!("n{n}").into_bytes())
    };
    for step in 0..OPS {
        let pick = |rng: &mut Rng, model: &Model| -> Option<(u64, Vec<u8>)> {
            if model.is_empty() {
                return None;
            }
            model
                .keys()
                .nth(rng.below(model.len() as u64) as usize)
                .cloned()
        };
        match rng.below(10) {
            0..=2 => {
                let (dir, name) = fresh(&mut rng);
                let a = fs.create(dir, &name, 0o644, ME).expect("create");
                let len = rng.below(20_000);
                fs.write(a.ino, 0, &stream_bytes(a.ino, 0, len))
                    .expect("write");
                gone.note(a.ino, format!("create + write {len}"));
                model.insert(
                    (dir, name),
                    File {
                        ino: a.ino,
                        size: len,
                        xattr: None,
                    },
                );
            }
            3 => {
                if let Some(k) = pick(&mut rng, &model) {
                    let f = model.get_mut(&k).expect("picked");
                    let len = rng.below(9000);
                    fs.write(f.ino, f.size, &stream_bytes(f.ino, f.size, len))
                        .expect("append");
                    gone.note(f.ino, format!("append {len} at {}", f.size));
                    f.size += len;
                }
            }
            4 => {
                if let Some(k) = pick(&mut rng, &model) {
                    let f = model.get_mut(&k).expect("picked");
                    let to = rng.below(f.size + 1);
                    fs.truncate(f.ino, to).expect("truncate");
                    gone.note(f.ino, format!("truncate {} -> {to}", f.size));
                    f.size = to;
                }
            }
            5 => {
                if let Some(k) = pick(&mut rng, &model) {
                    let to = fresh(&mut rng);
                    fs.rename(k.0, &k.1, to.0, &to.1, 0).expect("rename");
                    gone.note(
                        model[&k].ino,
                        format!(
                            "rename {:?} -> {:?}",
                            String::from_utf8_lossy(&k.1),
                            String::from_utf8_lossy(&to.1)
                        ),
                    );
                    gone.names.lock().expect("lock").insert(k.1.clone());
                    let f = model.remove(&k).expect("picked");
                    model.insert(to, f);
                }
            }
            6 => {
                if let Some(k) = pick(&mut rng, &model) {
                    fs.unlink(k.0, &k.1).expect("unlink");
                    let f = model.remove(&k).expect("picked");
                    gone.note(f.ino, "unlink".into());
                    gone.names.lock().expect("lock").insert(k.1);
                    gone.inodes.lock().expect("lock").insert(f.ino);
                }
            }
            7 => {
                if let Some(k) = pick(&mut rng, &model) {
                    let f = model.get_mut(&k).expect("picked");
                    let v = format!("v{}-{step}", f.ino).into_bytes();
                    fs.setxattr(f.ino, b"user.v", &v, 0).expect("setxattr");
                    gone.note(f.ino, "setxattr".into());
                    f.xattr = Some(v);
                }
            }
            8 => {
                if let Some(k) = pick(&mut rng, &model) {
                    fs.fsync(model[&k].ino).expect("fsync");
                    gone.note(model[&k].ino, "fsync".into());
                }
            }
            _ => {
                if rng.chance(10) {
                    fs.sync().expect("sync");
                    gone.note(0, "sync".into());
                }
            }
        }
    }
    model
}

/// What a reader's failure message says of inode `ino` beyond its bytes: a second read,
/// every key of it in the tree (found by walking every node, so also keys a search no longer
/// reaches), any node whose first key differs from its parent's key for it, what writers did
/// to it, and the writers' last operations.
fn diagnose(fs: &Fs, ino: u64, gone: &Gone) -> String {
    let again = fs.read(ino, 0, 40_000).map(|d| {
        let w = stream_bytes(ino, 0, d.len() as u64);
        (d.len(), d == w)
    });
    let (keys, bad) = fs.with_store(|st, t, _| {
        let (mut keys, mut bad) = (Vec::new(), Vec::new());
        let mut firsts = std::collections::HashMap::new();
        let walked = t.walk_nodes(st, |_, b, n| {
            if let Some(want) = firsts.get(&b) {
                if n.keys.first() != Some(want) {
                    bad.push(format!(
                        "node {b}: first {:?}, parent's {want:?}",
                        n.keys.first()
                    ));
                }
            }
            if n.is_leaf() {
                keys.extend(
                    n.keys
                        .iter()
                        .filter(|k| k.objectid == ino)
                        .map(|k| format!("{k:?} in {b}")),
                );
            } else {
                for (i, c) in n.ptrs().iter().enumerate() {
                    firsts.insert(c.block, n.keys[i]);
                }
            }
            Ok(())
        });
        if let Err(e) = walked {
            bad.push(format!("walk: {e}"));
        }
        (keys, bad)
    });
    let log = gone.log.lock().expect("lock");
    let last: Vec<&String> = log.iter().rev().take(30).rev().collect();
    format!(
        "read again: {again:?} (length, a prefix); its keys {keys:?}; structure problems \
         {bad:?}; what writers did to it {:?}; their last operations {last:#?}",
        gone.of(ino)
    )
}

/// Checks every view of `dirs` a pass gets; returns how many entries it checked.
fn reader_pass(fs: &Fs, dirs: &[u64], gone: &Gone) -> u64 {
    let mut checked = 0;
    for &d in dirs {
        let mut listed = Vec::new();
        fs.readdir_plus(d, 0, usize::MAX, |e, a| {
            listed.push((e.clone(), a.clone()));
            true
        })
        .expect("readdirplus");
        for (e, a) in listed {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            assert_eq!(a.ino, e.ino);
            assert_eq!(a.nlink, 1, "{:?}: listed with nlink {}", e.name, a.nlink);
            let name_gone = gone.name(&e.name);
            match fs.lookup(d, &e.name) {
                Ok(_) if name_gone => panic!(
                    "{}: found after its removal returned",
                    String::from_utf8_lossy(&e.name)
                ),
                Ok(l) => assert_eq!(
                    l.ino, e.ino,
                    "{:?}: readdir says inode {}, lookup {}",
                    e.name, e.ino, l.ino
                ),
                Err(Error::NotFound) => {}
                Err(x) => panic!("lookup {:?}: {x:?}", e.name),
            }
            let inode_gone = gone.inode(e.ino);
            match fs.getattr(e.ino) {
                Ok(_) if inode_gone => panic!("inode {}: there after its unlink returned", e.ino),
                Ok(g) => assert!(g.nlink <= 1, "inode {}: nlink {}", e.ino, g.nlink),
                Err(Error::NotFound) => {}
                Err(x) => panic!("getattr {}: {x:?}", e.ino),
            }
            match fs.read(e.ino, 0, 40_000) {
                Ok(data) => {
                    let want = stream_bytes(e.ino, 0, data.len() as u64);
                    if let Some(at) = data.iter().zip(&want).position(|(a, b)| a != b) {
                        panic!(
                            "inode {}: not a prefix of its stream: {} bytes read, the first \
                             wrong at {at} ({:#04x} for {:#04x}); {}",
                            e.ino,
                            data.len(),
                            data[at],
                            want[at],
                            diagnose(fs, e.ino, gone)
                        );
                    }
                }
                Err(Error::NotFound) => {}
                Err(x) => panic!("read {}: {x:?}", e.ino),
            }
            match fs.getxattr(e.ino, b"user.v") {
                Ok(v) => assert!(xattr_ok(e.ino, &v), "inode {}: xattr {v:?}", e.ino),
                Err(Error::NoData | Error::NotFound) => {}
                Err(x) => panic!("getxattr {}: {x:?}", e.ino),
            }
            checked += 1;
        }
    }
    checked
}

/// What the file system holds in `dirs`, as a model.
fn holds(fs: &Fs, dirs: &[u64]) -> Model {
    let mut out = Model::new();
    for &d in dirs {
        for e in fs.list(d).expect("list") {
            let a = fs.getattr(e.ino).expect("getattr");
            let data = fs.read(e.ino, 0, a.size as usize + 1).expect("read");
            assert_eq!(data.len() as u64, a.size);
            assert!(data == stream_bytes(e.ino, 0, a.size), "inode {}", e.ino);
            let xattr = match fs.getxattr(e.ino, b"user.v") {
                Ok(v) => Some(v),
                Err(Error::NoData) => None,
                Err(x) => panic!("getxattr: {x:?}"),
            };
            out.insert(
                (d, e.name.clone()),
                File {
                    ino: e.ino,
                    size: a.size,
                    xattr,
                },
            );
        }
    }
    out
}

#[test]
fn writers_and_readers_at_once_agree_with_the_writers_models() {
    let (mut rng, seed) = Rng::from_env("concurrent model");
    let dev = Arc::new(idxfs_blockdev::MemDevice::new(512 << 20));
    Fs::mkfs(dev.clone(), &idxfs_engine::MkfsOptions::default()).expect("mkfs");
    let o = OpenOptions {
        // Commits every few dozen dirty nodes, and inodes evicted from a small cache.
        dirty_nodes_limit: 64,
        inode_cache_entries: 64,
        ..opts()
    };
    let fs = Arc::new(Fs::open(dev.clone(), o.clone()).expect("open"));
    let shared = fs.mkdir(ROOT, b"shared", 0o755, ME).expect("mkdir").ino;
    let own: Vec<u64> = (0..2)
        .map(|i| {
            fs.mkdir(ROOT, format!("w{i}").as_bytes(), 0o755, ME)
                .expect("mkdir")
                .ino
        })
        .collect();
    let dirs = [shared, own[0], own[1]];
    let names = Arc::new(AtomicU64::new(0));
    let gone = Arc::new(Gone::default());
    let done = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (fs, done, checked) = (fs.clone(), done.clone(), checked.clone());
            let gone = gone.clone();
            std::thread::spawn(move || {
                let mut passes = 0u64;
                while !done.load(Ordering::Relaxed) || passes == 0 {
                    checked.fetch_add(reader_pass(&fs, &dirs, &gone), Ordering::Relaxed);
                    passes += 1;
                }
                passes
            })
        })
        .collect();
    let writers: Vec<_> = (0..2)
        .map(|i| {
            let (fs, names, gone) = (fs.clone(), names.clone(), gone.clone());
            let (mine, s) = (own[i], rng.next_u64());
            std::thread::spawn(move || writer(&fs, [shared, mine], &names, &gone, s))
        })
        .collect();
    let mut model = Model::new();
    for w in writers {
        model.extend(w.join().expect("a writer panicked"));
    }
    done.store(true, Ordering::Relaxed);
    let passes: u64 = readers
        .into_iter()
        .map(|r| r.join().expect("a reader panicked"))
        .sum();
    let checked = checked.load(Ordering::Relaxed);
    eprintln!("concurrent model: seed {seed}, {passes} reader passes, {checked} entries checked");
    assert!(
        checked > 1000,
        "the readers checked {checked} entries: too few to mean much"
    );
    assert_eq!(holds(&fs, &dirs), model, "seed {seed}: after the run");
    let fs = Arc::into_inner(fs).expect("the threads are done");
    fs.close().expect("close");
    assert_clean(&dev);
    let fs = Fs::open(dev.clone(), o).expect("reopen");
    assert_eq!(holds(&fs, &dirs), model, "seed {seed}: after a reopen");
}
