//! getattr, lookup, readlink, getxattr, listxattr, statfs and readdir answered without the
//! lock (`fs/published.rs`): never stale, never a half-applied operation.
//!
//! - A model test reads every name, inode, symlink target, xattr and directory listing back
//!   after every operation, so each one is published before the next operation changes it;
//!   any change that does not unpublish or republish what it touched shows up as a stale
//!   answer. The inode cache is tiny, so published inodes outlive their cache entries.
//!   statfs read without the lock must equal statfs computed under it. Listings are read in
//!   runs of a random length, each resumed from the last cookie, so a listing is published
//!   in several runs and read back across them.
//! - A concurrency test keeps a name moving between two inodes by rename while readers look it
//!   up without the lock: whichever inode the name leads to has exactly two names then, so a
//!   reader that saw the name from one operation and the link count from another fails.
mod common;
use common::*;
use idxfs_engine::fs::{Attr, SetAttr, RENAME_EXCHANGE};
use idxfs_engine::testutil::Rng;
use idxfs_engine::{Error, Fs, OpenOptions};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// An inode as the model has it.
#[derive(Debug, Clone, PartialEq)]
struct Ino {
    dir: bool,
    nlink: u32,
    mode: u32,
    size: u64,
}

#[derive(Default)]
struct Model {
    /// (directory, name) -> inode.
    names: BTreeMap<(u64, Vec<u8>), u64>,
    inodes: BTreeMap<u64, Ino>,
    /// Every inode number ever seen: freed ones must read as gone.
    seen: Vec<u64>,
    /// Symlink targets.
    links: BTreeMap<u64, Vec<u8>>,
    /// Each inode's xattrs.
    xattrs: BTreeMap<u64, BTreeMap<Vec<u8>, Vec<u8>>>,
}

/// The xattr names the test uses.
const XATTR_NAMES: [&[u8]; 3] = [b"user.a", b"user.b", b"user.c"];

impl Model {
    /// Drops one name of `ino` (the caller removed it from `names`).
    fn unlink(&mut self, ino: u64) {
        let Some(i) = self.inodes.get_mut(&ino) else {
            panic!("model: unlink of unknown inode {ino}")
        };
        if !i.dir {
            i.nlink -= 1;
        }
        if i.dir || i.nlink == 0 {
            self.inodes.remove(&ino);
            self.links.remove(&ino);
            self.xattrs.remove(&ino);
        }
    }

    /// The directory that names `dir` (the root's is itself).
    fn parent(&self, dir: u64) -> u64 {
        if dir == ROOT {
            return ROOT;
        }
        match self.names.iter().find(|(_, &i)| i == dir) {
            Some(((p, _), _)) => *p,
            None => panic!("model: directory {dir} has no name"),
        }
    }

    /// Directory `dir` listed by readdir in runs of up to `run` entries, each resumed from
    /// the last entry's cookie, against the model: (name, inode) sorted, "." and ".." first.
    fn check_listing(&self, fs: &Fs, dir: u64, run: usize, step: usize) {
        let mut got: Vec<(Vec<u8>, u64)> = list_in_runs(fs, dir, || run)
            .into_iter()
            .map(|e| (e.name, e.ino))
            .collect();
        let want_dots = [(b".".to_vec(), dir), (b"..".to_vec(), self.parent(dir))];
        assert_eq!(
            got.get(..2),
            Some(&want_dots[..]),
            "step {step}: dots of {dir}"
        );
        let mut rest = got.split_off(2);
        rest.sort();
        let mut want: Vec<(Vec<u8>, u64)> = self
            .names
            .iter()
            .filter(|((d, _), _)| *d == dir)
            .map(|((_, n), &i)| (n.clone(), i))
            .collect();
        want.sort();
        assert_eq!(rest, want, "step {step}: listing of {dir} in runs of {run}");
    }

    /// Directory `dir` listed by readdirplus in batches of up to `run` entries, each resumed
    /// from the last entry's cookie, against the model: names, inodes and every entry's
    /// attributes ("." and ".." too).
    fn check_listing_plus(&self, fs: &Fs, dir: u64, run: usize, step: usize) {
        let mut got = Vec::new();
        let mut cookie = 0;
        loop {
            let b = fs
                .readdir_plus_batch(dir, cookie, run)
                .expect("readdirplus");
            assert!(
                b.entries.len() <= run,
                "step {step}: a batch past its limit"
            );
            if let Some((e, _)) = b.entries.last() {
                cookie = e.cookie;
            }
            let more = b.more && !b.entries.is_empty();
            got.extend(b.entries);
            if !more {
                break;
            }
        }
        let mut got: Vec<(Vec<u8>, u64, Ino)> = got
            .into_iter()
            .map(|(e, a)| {
                assert_eq!(e.ino, a.ino, "step {step}: entry and attributes disagree");
                (e.name, e.ino, self.view(&a))
            })
            .collect();
        let node = |i: u64| match self.inodes.get(&i) {
            Some(x) => x.clone(),
            None => panic!("model: no inode {i}"),
        };
        let p = self.parent(dir);
        let want_dots = [
            (b".".to_vec(), dir, node(dir)),
            (b"..".to_vec(), p, node(p)),
        ];
        assert_eq!(
            got.get(..2),
            Some(&want_dots[..]),
            "step {step}: readdirplus dots of {dir}"
        );
        let mut rest = got.split_off(2);
        rest.sort_by(|a, b| a.0.cmp(&b.0));
        let mut want: Vec<(Vec<u8>, u64, Ino)> = self
            .names
            .iter()
            .filter(|((d, _), _)| *d == dir)
            .map(|((_, n), &i)| (n.clone(), i, node(i)))
            .collect();
        want.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            rest, want,
            "step {step}: readdirplus of {dir} in batches of {run}"
        );
    }

    /// Every name and inode read back from `fs`, compared with the model.
    fn check(&self, fs: &Fs, dirs: &[u64], names: &[Vec<u8>], step: usize, run: usize) {
        for &d in dirs {
            for n in names {
                let got = fs.lookup(d, n).map(|a| a.ino).ok();
                let want = self.names.get(&(d, n.clone())).copied();
                assert_eq!(
                    got,
                    want,
                    "step {step}: lookup {d}/{}",
                    String::from_utf8_lossy(n)
                );
            }
        }
        for &ino in &self.seen {
            let got = fs.getattr(ino).ok().map(|a| self.view(&a));
            let want = self.inodes.get(&ino).cloned();
            assert_eq!(got, want, "step {step}: getattr {ino}");
            if want.is_none() {
                assert!(
                    fs.listxattr(ino).is_err(),
                    "step {step}: xattrs of freed {ino}"
                );
                assert!(
                    fs.readlink(ino).is_err(),
                    "step {step}: readlink of freed {ino}"
                );
                continue;
            }
            let xs = self.xattrs.get(&ino).cloned().unwrap_or_default();
            let mut names = fs.listxattr(ino).expect("listxattr");
            names.sort();
            assert_eq!(
                names,
                xs.keys().cloned().collect::<Vec<_>>(),
                "step {step}: listxattr {ino}"
            );
            for n in XATTR_NAMES {
                match (fs.getxattr(ino, n), xs.get(n)) {
                    (Ok(v), Some(w)) => assert!(v == *w, "step {step}: getxattr {ino} value"),
                    (Err(Error::NoData), None) => {}
                    (got, want) => panic!(
                        "step {step}: getxattr {ino} {}: {:?} bytes, want {:?}",
                        String::from_utf8_lossy(n),
                        got.map(|v| v.len()),
                        want.map(|v| v.len())
                    ),
                }
            }
            match self.links.get(&ino) {
                Some(t) => assert!(
                    fs.readlink(ino).expect("readlink") == *t,
                    "step {step}: readlink {ino}"
                ),
                None => assert!(fs.readlink(ino).is_err(), "step {step}: readlink of {ino}"),
            }
        }
        let free = fs.statfs().expect("statfs");
        assert_eq!(free, fs.statfs_under_lock(), "step {step}: stale statfs");
        for (&ino, i) in &self.inodes {
            if i.dir {
                self.check_listing(fs, ino, run, step);
                self.check_listing_plus(fs, ino, run + 1, step);
            }
        }
    }

    fn view(&self, a: &Attr) -> Ino {
        Ino {
            dir: a.mode & 0o170000 == 0o040000,
            nlink: a.nlink,
            mode: a.mode & 0o7777,
            size: a.size,
        }
    }
}

#[test]
fn lock_free_reads_follow_every_change() {
    let (mut rng, _) = Rng::from_env("lock_free_reads_follow_every_change");
    let dev = Arc::new(idxfs_blockdev::MemDevice::new(64 << 20));
    idxfs_engine::Fs::mkfs(dev.clone(), &Default::default()).expect("mkfs");
    let fs = Fs::open(
        dev.clone(),
        OpenOptions {
            inode_cache_entries: 16,
            ..opts()
        },
    )
    .expect("open");
    let mut m = Model::default();
    let mut dirs = vec![ROOT];
    m.inodes.insert(
        ROOT,
        Ino {
            dir: true,
            nlink: 2,
            mode: 0o755,
            size: 0,
        },
    );
    for d in [b"d1".as_slice(), b"d2"] {
        let a = fs.mkdir(ROOT, d, 0o755, ME).expect("mkdir");
        dirs.push(a.ino);
        m.names.insert((ROOT, d.to_vec()), a.ino);
        m.inodes.insert(
            a.ino,
            Ino {
                dir: true,
                nlink: 2,
                mode: 0o755,
                size: 0,
            },
        );
        m.seen.push(a.ino);
    }
    m.inodes.get_mut(&ROOT).expect("root").nlink = 4;
    m.inodes.get_mut(&ROOT).expect("root").size = 2;
    let names: Vec<Vec<u8>> = (0..6).map(|i| format!("n{i}").into_bytes()).collect();
    let file_dirs = dirs.clone();
    let pick = |rng: &mut Rng| {
        let d = file_dirs[rng.below(file_dirs.len() as u64) as usize];
        (d, names[rng.below(names.len() as u64) as usize].clone())
    };
    for step in 0..3000 {
        let (d, n) = pick(&mut rng);
        let at = m.names.get(&(d, n.clone())).copied();
        let is_dir = |m: &Model, i: u64| m.inodes.get(&i).is_some_and(|x| x.dir);
        let is_file = |m: &Model, i: u64| !is_dir(m, i) && !m.links.contains_key(&i);
        match rng.below(13) {
            10 => {
                // A directory beside the files (its own listing, and a parent's link).
                if at.is_none() {
                    let a = fs.mkdir(d, &n, 0o755, ME).expect("mkdir");
                    m.names.insert((d, n.clone()), a.ino);
                    m.inodes.insert(
                        a.ino,
                        Ino {
                            dir: true,
                            nlink: 2,
                            mode: 0o755,
                            size: 0,
                        },
                    );
                    m.seen.push(a.ino);
                    let p = m.inodes.get_mut(&d).expect("dir");
                    p.size += 1;
                    p.nlink += 1;
                }
            }
            11 => {
                // rmdir of an empty one (a full one must refuse).
                if let Some(i) = at.filter(|&i| is_dir(&m, i) && !dirs.contains(&i)) {
                    let empty = !m.names.keys().any(|(p, _)| *p == i);
                    match fs.rmdir(d, &n) {
                        Ok(()) => {
                            assert!(empty, "{step}: rmdir of a full directory");
                            m.names.remove(&(d, n.clone()));
                            m.unlink(i);
                            let p = m.inodes.get_mut(&d).expect("dir");
                            p.size -= 1;
                            p.nlink -= 1;
                        }
                        Err(Error::NotEmpty) => assert!(!empty, "{step}: rmdir refused"),
                        Err(e) => panic!("{step}: rmdir: {e:?}"),
                    }
                }
            }
            12 => {
                // A directory moved to a free name, maybe in another directory: its ".."
                // changes.
                let (d2, n2) = pick(&mut rng);
                let Some(src) = at.filter(|&i| is_dir(&m, i) && !dirs.contains(&i)) else {
                    continue;
                };
                if m.names.contains_key(&(d2, n2.clone())) {
                    continue;
                }
                fs.rename(d, &n, d2, &n2, 0).expect("rename dir");
                m.names.remove(&(d, n.clone()));
                m.names.insert((d2, n2.clone()), src);
                let from = m.inodes.get_mut(&d).expect("dir");
                from.size -= 1;
                from.nlink -= 1;
                let to = m.inodes.get_mut(&d2).expect("dir");
                to.size += 1;
                to.nlink += 1;
            }
            0 | 1 => {
                // A file, or a symlink (some targets too long to publish, some in a block).
                let target = rng.chance(30).then(|| {
                    let len = [1 + rng.below(200), 1 + rng.below(4095)][rng.below(2) as usize];
                    (0..len)
                        .map(|i| b'a' + ((i + step as u64) % 26) as u8)
                        .collect::<Vec<_>>()
                });
                let r = match &target {
                    Some(t) => fs.symlink(d, &n, t, ME),
                    None => fs.create(d, &n, 0o644, ME),
                };
                match at {
                    Some(_) => assert!(matches!(r, Err(Error::Exists)), "{step}: {r:?}"),
                    None => {
                        let a = r.expect("create");
                        m.names.insert((d, n.clone()), a.ino);
                        m.inodes.insert(
                            a.ino,
                            Ino {
                                dir: false,
                                nlink: 1,
                                mode: if target.is_some() { 0o777 } else { 0o644 },
                                size: target.as_ref().map_or(0, |t| t.len() as u64),
                            },
                        );
                        if let Some(t) = target {
                            m.links.insert(a.ino, t);
                        }
                        m.seen.push(a.ino);
                        m.inodes.get_mut(&d).expect("dir").size += 1;
                    }
                }
            }
            8 => {
                // An xattr set: small, large enough to take the set past what is published,
                // or long enough to live in chunks.
                if let Some(i) = at {
                    let name = XATTR_NAMES[rng.below(3) as usize];
                    let len = [rng.below(100), 900, 5000][rng.below(3) as usize] as usize;
                    let v = vec![(step % 251) as u8; len];
                    fs.setxattr(i, name, &v, 0).expect("setxattr");
                    m.xattrs.entry(i).or_default().insert(name.to_vec(), v);
                }
            }
            9 => {
                if let Some(i) = at {
                    let name = XATTR_NAMES[rng.below(3) as usize];
                    let had = m.xattrs.entry(i).or_default().remove(name).is_some();
                    match fs.removexattr(i, name) {
                        Ok(()) => assert!(had, "{step}: removed an xattr never set"),
                        Err(Error::NoData) => assert!(!had, "{step}: xattr lost"),
                        Err(e) => panic!("{step}: removexattr: {e:?}"),
                    }
                }
            }
            2 => {
                // A hard link of a file named elsewhere.
                let (d2, n2) = pick(&mut rng);
                let src = m.names.get(&(d2, n2)).copied();
                if let (Some(src), None) = (src, at) {
                    if !is_dir(&m, src) {
                        fs.link(src, d, &n).expect("link");
                        m.names.insert((d, n.clone()), src);
                        m.inodes.get_mut(&src).expect("src").nlink += 1;
                        m.inodes.get_mut(&d).expect("dir").size += 1;
                    }
                }
            }
            3 => {
                if let Some(i) = at.filter(|&i| !is_dir(&m, i)) {
                    fs.unlink(d, &n).expect("unlink");
                    m.names.remove(&(d, n.clone()));
                    m.unlink(i);
                    m.inodes.get_mut(&d).expect("dir").size -= 1;
                }
            }
            4 | 5 => {
                // Rename, over an existing file or not, or exchange.
                let (d2, n2) = pick(&mut rng);
                let to = m.names.get(&(d2, n2.clone())).copied();
                let Some(src) = at.filter(|&i| !is_dir(&m, i)) else {
                    continue;
                };
                if (d, &n) == (d2, &n2) || to.is_some_and(|t| is_dir(&m, t) || t == src) {
                    continue;
                }
                let exchange = to.is_some() && rng.chance(50);
                let flags = if exchange { RENAME_EXCHANGE } else { 0 };
                fs.rename(d, &n, d2, &n2, flags).expect("rename");
                if exchange {
                    let t = to.expect("target");
                    m.names.insert((d, n.clone()), t);
                    m.names.insert((d2, n2.clone()), src);
                } else {
                    m.names.remove(&(d, n.clone()));
                    m.inodes.get_mut(&d).expect("dir").size -= 1;
                    if let Some(t) = to {
                        m.unlink(t);
                    } else {
                        m.inodes.get_mut(&d2).expect("dir").size += 1;
                    }
                    m.names.insert((d2, n2.clone()), src);
                }
            }
            6 => {
                if let Some(i) = at {
                    let mode = 0o600 | rng.below(0o100) as u32;
                    let set = SetAttr {
                        mode: Some(mode),
                        ..Default::default()
                    };
                    fs.setattr(i, &set).expect("chmod");
                    m.inodes.get_mut(&i).expect("inode").mode = mode;
                }
            }
            _ => {
                if let Some(i) = at.filter(|&i| is_file(&m, i)) {
                    let len = rng.below(9000) as usize;
                    fs.write(i, 0, &vec![7u8; len]).expect("write");
                    let x = m.inodes.get_mut(&i).expect("inode");
                    x.size = x.size.max(len as u64);
                }
            }
        }
        if step % 500 == 0 {
            fs.sync().expect("sync");
        }
        m.check(&fs, &dirs, &names, step, 1 + rng.below(4) as usize);
    }
    let c = fs.counters();
    for (what, n) in [
        ("lookup", &c.lookup_lock_free),
        ("getattr", &c.getattr_lock_free),
        ("readlink", &c.readlink_lock_free),
        ("xattr", &c.xattr_lock_free),
        ("statfs", &c.statfs_lock_free),
        ("readdir", &c.readdir_lock_free),
        ("readdirplus", &c.readdirplus_lock_free),
    ] {
        assert!(
            n.get() > 0,
            "no {what} was answered without the lock: the test tested the locked path only"
        );
    }
    fs.close().expect("close");
    assert_clean(&dev);
}

/// Runs `write` on this thread while 2 reader threads each call the body `reader(r)` makes,
/// over and over, until `write` has returned (or panicked); returns the sum of what the bodies
/// returned (the reads they made). `write` sees that sum as it grows, to wait for the readers.
fn beside_readers<B: FnMut() -> u64>(
    reader: impl Fn(u64) -> B + Sync,
    write: impl FnOnce(&AtomicU64),
) -> u64 {
    /// Stops the readers however `write` ends, so the scope never waits for them forever.
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stop = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    // Reader passes finished, and reader threads ended (a panicking one included).
    let (rounds, ended) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        let (reader, stop, reads) = (&reader, &stop, &reads);
        let (rounds, ended) = (&rounds, &ended);
        for r in 0..2 {
            s.spawn(move || {
                struct Ended<'a>(&'a AtomicU64);
                impl Drop for Ended<'_> {
                    fn drop(&mut self) {
                        self.0.fetch_add(1, Ordering::Release);
                    }
                }
                let _ended = Ended(ended);
                let mut body = reader(r);
                while !stop.load(Ordering::Relaxed) {
                    reads.fetch_add(body(), Ordering::Relaxed);
                    rounds.fetch_add(1, Ordering::Release);
                }
            });
        }
        let _stop = Stop(stop);
        write(reads);
        // On a loaded machine the writer can finish before a reader was scheduled at all:
        // each reader gets a pass (a count, not a time) before they stop.
        while rounds.load(Ordering::Acquire) < 2 && ended.load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
    });
    reads.into_inner()
}

#[test]
fn a_lookup_sees_a_name_and_its_link_count_from_one_state() {
    let (dev, fs) = mem_fs(64 << 20);
    let a = fs.create(ROOT, b"keep-a", 0o644, ME).expect("a").ino;
    let b = fs.create(ROOT, b"keep-b", 0o644, ME).expect("b").ino;
    fs.link(a, ROOT, b"cur").expect("link");
    let reader = |_| {
        || {
            let mut seen = 0;
            for name in [b"cur".as_slice(), b"tmp"] {
                // Whatever "cur" or "tmp" names has exactly two names: its own and it.
                if let Ok(at) = fs.lookup(ROOT, name) {
                    assert_eq!(
                        at.nlink,
                        2,
                        "{} -> {} seen with the link count of another state",
                        String::from_utf8_lossy(name),
                        at.ino
                    );
                    seen += 1;
                }
            }
            seen
        }
    };
    // "cur" moves between a and b: link the other as "tmp", rename it over "cur".
    let seen = beside_readers(reader, |_| {
        let n = if cfg!(debug_assertions) { 3000 } else { 20000 };
        for i in 0..n {
            let other = if i % 2 == 0 { b } else { a };
            fs.link(other, ROOT, b"tmp").expect("link tmp");
            fs.rename(ROOT, b"tmp", ROOT, b"cur", 0).expect("rename");
            if i % 1000 == 0 {
                fs.sync().expect("sync");
            }
        }
    });
    assert!(seen > 0, "the readers saw nothing");
    assert!(
        fs.counters().lookup_lock_free.get() > 0,
        "no lookup took the lock-free path"
    );
    fs.close().expect("close");
    assert_clean(&dev);
}

#[test]
fn an_xattr_read_without_the_lock_is_never_older_than_a_finished_change() {
    let (dev, fs) = mem_fs(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("f").ino;
    fs.setxattr(f, b"user.v", &0u64.to_le_bytes(), 0)
        .expect("setxattr");
    // The last value whose setxattr has returned.
    let done = AtomicU64::new(0);
    let reader = |_| {
        let (fs, done) = (&fs, &done);
        let mut last = 0;
        move || {
            let floor = done.load(Ordering::Acquire);
            let v = fs.getxattr(f, b"user.v").expect("getxattr");
            let v = u64::from_le_bytes(v.try_into().expect("8 bytes"));
            assert!(v >= floor, "read {v} after {floor} was set and returned");
            assert!(v >= last, "read {v} after reading {last}");
            last = v;
            let names = fs.listxattr(f).expect("listxattr");
            assert!(names.iter().any(|n| n == b"user.v"), "user.v missing");
            let s = fs.statfs().expect("statfs");
            assert!(s.blocks_avail <= s.blocks_free && s.blocks_free <= s.blocks);
            assert!(s.files_free <= s.files);
            1
        }
    };
    let reads = beside_readers(reader, |_| {
        let n: u64 = if cfg!(debug_assertions) { 2000 } else { 20000 };
        for i in 1..=n {
            fs.setxattr(f, b"user.v", &i.to_le_bytes(), 0)
                .expect("setxattr");
            done.store(i, Ordering::Release);
            // Other xattrs come and go, and files with data, so statfs's counts move.
            let name = format!("user.x{}", i % 3).into_bytes();
            if i % 2 == 0 {
                fs.setxattr(f, &name, b"x", 0).expect("setxattr x");
            } else {
                let _ = fs.removexattr(f, &name);
            }
            if i % 64 == 0 {
                let g = fs.create(ROOT, b"g", 0o644, ME).expect("g").ino;
                fs.write(g, 0, &[1u8; 20000]).expect("write g");
                fs.unlink(ROOT, b"g").expect("unlink g");
            }
            if i % 5000 == 0 {
                fs.sync().expect("sync");
            }
        }
    });
    assert!(reads > 0, "the readers read nothing");
    assert!(
        fs.counters().xattr_lock_free.get() > 0,
        "no xattr read took the lock-free path"
    );
    fs.close().expect("close");
    assert_clean(&dev);
}

/// The writer beside the listing tests' readers: once both have listed, creates gen-0,
/// gen-1, ... in `d` (`done` counts the creates that returned), each followed by `churn(i)`,
/// with a pause now and then in which readers list what they published.
fn gen_writer(fs: &Fs, d: u64, n: u64, listed: &AtomicU64, done: &AtomicU64, churn: impl Fn(u64)) {
    let start = std::time::Instant::now();
    while listed.load(Ordering::Relaxed) < 2 {
        assert!(start.elapsed().as_secs() < 60, "the readers never listed");
        std::thread::yield_now();
    }
    for i in 0..n {
        if i % 100 == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        fs.create(d, format!("gen-{i}").as_bytes(), 0o644, ME)
            .expect("gen");
        done.store(i + 1, Ordering::Release);
        churn(i);
        if i % 500 == 0 {
            fs.sync().expect("sync");
        }
    }
}

/// Directory "d", holding keep-0 .. keep-39 for the whole of a listing test.
fn keep_dir(fs: &Fs) -> u64 {
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir").ino;
    for i in 0..40 {
        fs.create(d, format!("keep-{i}").as_bytes(), 0o644, ME)
            .expect("keep");
    }
    d
}

/// A listing begun once `floor` gen- creates had returned holds them, and keep-0..40.
fn assert_listed(seen: &std::collections::BTreeSet<Vec<u8>>, floor: u64) {
    for i in 0..40 {
        let n = format!("keep-{i}").into_bytes();
        assert!(seen.contains(&n), "keep-{i} missing from a listing");
    }
    for i in 0..floor {
        let n = format!("gen-{i}").into_bytes();
        assert!(
            seen.contains(&n),
            "gen-{i} missing from a listing begun after its create returned ({floor} had)"
        );
    }
}

/// Readers list a directory in runs (each resumed from its last cookie) while a writer adds a
/// name at a time to it and churns others: a listing has no name twice, every name present
/// for the whole listing once, and every name whose create returned before it started, so a
/// run read without the lock is never older than a finished change.
#[test]
fn a_listing_read_without_the_lock_is_never_older_than_a_finished_change() {
    let (dev, fs) = mem_fs(64 << 20);
    let d = keep_dir(&fs);
    // Names gen-0 ..= gen-(done - 1) exist: their creates returned.
    let done = AtomicU64::new(0);
    let reader = |r| {
        let (fs, done) = (&fs, &done);
        let mut rng = Rng::new(0x5eed + r);
        move || {
            let floor = done.load(Ordering::Acquire);
            let mut seen = std::collections::BTreeSet::new();
            for e in list_in_runs(fs, d, || 1 + rng.below(50) as usize) {
                assert!(
                    seen.insert(e.name.clone()),
                    "{} listed twice",
                    String::from_utf8_lossy(&e.name)
                );
            }
            assert_listed(&seen, floor);
            1
        }
    };
    let n = if cfg!(debug_assertions) { 400 } else { 2500 };
    let listings = beside_readers(reader, |listed| {
        gen_writer(&fs, d, n, listed, &done, |_| {
            fs.create(d, b"tmp", 0o644, ME).expect("tmp");
            fs.rename(d, b"tmp", d, b"tmp2", 0).expect("rename");
            fs.unlink(d, b"tmp2").expect("unlink");
        })
    });
    assert!(listings > 0, "the readers listed nothing");
    assert!(
        fs.counters().readdir_lock_free.get() > 0,
        "no readdir took the lock-free path"
    );
    fs.close().expect("close");
    assert_clean(&dev);
}

/// readdirplus beside a writer: a whole listing in one batch comes from one state (the
/// directory's size, in ".", counts exactly the entries listed, and each file's link count
/// its names in the listing, all its links being there), and is never older than a create
/// that returned before it began.
#[test]
fn a_readdirplus_without_the_lock_is_one_state_never_older_than_a_finished_change() {
    let (dev, fs) = mem_fs(64 << 20);
    let d = keep_dir(&fs);
    // Names gen-0 ..= gen-(done - 1) exist: their creates returned.
    let done = AtomicU64::new(0);
    let reader = |_| {
        let (fs, done) = (&fs, &done);
        move || {
            let floor = done.load(Ordering::Acquire);
            let b = fs.readdir_plus_batch(d, 0, 1 << 20).expect("readdirplus");
            assert!(!b.more, "one batch holds the whole directory");
            let (dot, rest) = b.entries.split_at(2);
            assert_eq!(dot[0].0.name, b".");
            assert_eq!(
                dot[0].1.size,
                rest.len() as u64,
                "the directory's size and its entries from different states"
            );
            let mut seen = std::collections::BTreeSet::new();
            let mut links: std::collections::BTreeMap<u64, (u32, u32)> = Default::default();
            for (e, a) in rest {
                let l = links.entry(e.ino).or_insert((0, a.nlink));
                l.0 += 1;
                assert_eq!(
                    l.1, a.nlink,
                    "one inode's two entries from different states"
                );
                assert!(
                    seen.insert(e.name.clone()),
                    "{} listed twice",
                    String::from_utf8_lossy(&e.name)
                );
            }
            for (ino, (names, nlink)) in links {
                assert_eq!(names, nlink, "inode {ino}: its names and its link count");
            }
            assert_listed(&seen, floor);
            1
        }
    };
    let n = if cfg!(debug_assertions) { 300 } else { 1500 };
    let listings = beside_readers(reader, |listed| {
        gen_writer(&fs, d, n, listed, &done, |i| {
            // A second link, gone again: a listing that shows it shows two links.
            let ino = fs
                .lookup(d, format!("gen-{i}").as_bytes())
                .expect("lookup")
                .ino;
            fs.link(ino, d, b"second").expect("link");
            fs.unlink(d, b"second").expect("unlink");
        })
    });
    assert!(listings > 0, "the readers listed nothing");
    eprintln!(
        "{listings} listings, {} batches without the lock",
        fs.counters().readdirplus_lock_free.get()
    );
    assert!(
        fs.counters().readdirplus_lock_free.get() > 0,
        "no readdirplus took the lock-free path"
    );
    fs.close().expect("close");
    assert_clean(&dev);
}
