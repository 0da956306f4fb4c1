//! The two directory indexes (seed 002) under stress: forced name-hash collisions, hard links
//! that want the same inode-order slot, readdir resumed by cookie while the directory changes
//! (a seeded model, and a second thread), and the leaf fill of aged directories.
mod common;
use common::*;
use idxfs_blockdev::MemDevice;
use idxfs_engine::dump::{self, Which};
use idxfs_engine::fs::{DirEntryOut, NameHash};
use idxfs_engine::testutil::Rng;
use idxfs_engine::{fsck, Fs, MkfsOptions, OpenOptions};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn xxh(n: &[u8]) -> u64 {
    idxfs_format::hash::name_hash(n)
}

/// Test hash: 16 values in all, so hundreds of names share each name-hash item.
fn hash_16(n: &[u8]) -> u64 {
    1 + xxh(n) % 16
}

/// Test hash: every name's low 16 bits are 7, so all hard links of one inode in one directory
/// want the same inode-order slot.
fn hash_low_7(n: &[u8]) -> u64 {
    (xxh(n) << 16) | 7
}

fn fs_with(hash: NameHash) -> (Arc<MemDevice>, Fs) {
    let dev = Arc::new(MemDevice::new(256 << 20));
    Fs::mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
    let fs = Fs::open(dev.clone(), reopen_opts(hash)).expect("open");
    (dev, fs)
}

fn reopen_opts(hash: NameHash) -> OpenOptions {
    OpenOptions {
        name_hash: hash,
        ..opts()
    }
}

/// A whole listing resumed from the last cookie every `page` entries. Checks that cookies
/// strictly increase; leaves out "." and "..".
fn list_paged(fs: &Fs, dir: u64, page: usize) -> Vec<DirEntryOut> {
    list_paged_with(fs, dir, page, || {})
}

/// `list_paged`, calling `between` after every page (to change the directory mid-listing).
fn list_paged_with(fs: &Fs, dir: u64, page: usize, mut between: impl FnMut()) -> Vec<DirEntryOut> {
    let mut out = Vec::new();
    let mut cookie = 0;
    loop {
        let mut batch = Vec::new();
        fs.readdir(dir, cookie, |e| {
            if batch.len() == page {
                return false;
            }
            batch.push(e.clone());
            true
        })
        .expect("readdir");
        if batch.is_empty() {
            return out;
        }
        for e in batch {
            assert!(e.cookie > cookie, "cookie {} after {cookie}", e.cookie);
            cookie = e.cookie;
            if e.name != b"." && e.name != b".." {
                out.push(e);
            }
        }
        between();
    }
}

fn names(es: &[DirEntryOut]) -> BTreeMap<Vec<u8>, u64> {
    let mut m = BTreeMap::new();
    for e in es {
        assert!(
            m.insert(e.name.clone(), e.ino).is_none(),
            "{:?} listed twice",
            String::from_utf8_lossy(&e.name)
        );
    }
    m
}

fn assert_inode_order(es: &[DirEntryOut]) {
    assert!(
        es.windows(2).all(|w| w[0].ino <= w[1].ino),
        "readdir is in inode order"
    );
}

#[test]
fn hash_collisions_share_items_and_list_once() {
    let (dev, fs) = fs_with(hash_16);
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("d");
    let mut model = BTreeMap::new();
    for i in 0..800 {
        let name = format!("f{i}").into_bytes();
        let a = if i % 10 == 0 {
            fs.mkdir(d.ino, &name, 0o755, ME)
        } else {
            fs.create(d.ino, &name, 0o644, ME)
        }
        .expect("create under a colliding hash");
        model.insert(name, a.ino);
    }
    for (name, ino) in &model {
        assert_eq!(fs.lookup(d.ino, name).expect("lookup").ino, *ino);
    }
    assert_eq!(
        fs.lookup(d.ino, b"absent").err().map(|e| e.errno()),
        Some(2),
        "a colliding absent name is ENOENT"
    );
    for page in [1, 7, 1000] {
        let es = list_paged(&fs, d.ino, page);
        assert_inode_order(&es);
        assert_eq!(names(&es), model, "page {page}");
    }
    // Remove every third name, rename every fifth: items shrink and move within collisions.
    let all: Vec<(Vec<u8>, u64)> = model.clone().into_iter().collect();
    for (i, (name, ino)) in all.iter().enumerate() {
        if i % 3 == 0 {
            // a tenth of the names are (empty) directories
            let r = fs.unlink(d.ino, name).or_else(|_| fs.rmdir(d.ino, name));
            r.expect("remove");
            model.remove(name);
        } else if i % 5 == 0 {
            let to = [name.as_slice(), b".moved"].concat();
            fs.rename(d.ino, name, d.ino, &to, 0).expect("rename");
            model.remove(name);
            model.insert(to, *ino);
        }
    }
    assert_eq!(names(&list_paged(&fs, d.ino, 5)), model);
    fs.close().expect("close");
    assert_clean_with(&dev, hash_16);
    // fsck really checks where names are filed: under the format's hash they are all misfiled.
    let r = fsck::check(
        &(dev.clone() as Arc<dyn idxfs_blockdev::BlockDevice>),
        idxfs_format::hash::name_hash,
        &mut |_| {},
    )
    .expect("fsck");
    assert!(!r.is_clean(), "fsck notices names filed under another hash");
    let fs = Fs::open(dev.clone(), reopen_opts(hash_16)).expect("reopen");
    assert_eq!(names(&list_paged(&fs, d.ino, 3)), model, "after reopen");
    fs.close().expect("close");
}

#[test]
fn hard_links_in_one_directory_take_distinct_slots() {
    let (dev, fs) = fs_with(hash_low_7);
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("d");
    let f = fs.create(d.ino, b"a", 0o644, ME).expect("a");
    let mut model = BTreeMap::new();
    model.insert(b"a".to_vec(), f.ino);
    for i in 0..300 {
        let name = format!("link{i}").into_bytes();
        fs.link(f.ino, d.ino, &name).expect("link");
        model.insert(name, f.ino);
        if i % 50 == 0 {
            let other = format!("other{i}").into_bytes();
            let o = fs.create(d.ino, &other, 0o644, ME).expect("other");
            model.insert(other, o.ino);
        }
    }
    for page in [1, 13, 10_000] {
        let es = list_paged(&fs, d.ino, page);
        assert_inode_order(&es);
        assert_eq!(names(&es), model, "every link exactly once, page {page}");
    }
    // Remove a third of the links (freeing slots in the middle of the probe run), add new ones
    // (which reuse those slots), rename some links over each other and to fresh names.
    let (mut rng, _) = Rng::from_env("hard_links_in_one_directory");
    for i in 0..100 {
        let victim = format!("link{}", rng.below(300)).into_bytes();
        if model.remove(&victim).is_some() {
            fs.unlink(d.ino, &victim).expect("unlink link");
        }
        let name = format!("again{i}").into_bytes();
        fs.link(f.ino, d.ino, &name).expect("relink");
        model.insert(name, f.ino);
    }
    // rename between two names of one inode does nothing (POSIX)
    fs.rename(d.ino, b"again1", d.ino, b"again2", 0)
        .expect("rename link onto link");
    fs.rename(d.ino, b"again3", d.ino, b"renamed3", 0)
        .expect("rename link");
    model.remove(b"again3".as_slice());
    model.insert(b"renamed3".to_vec(), f.ino);
    let es = list_paged(&fs, d.ino, 9);
    assert_eq!(names(&es), model);
    let links = model.values().filter(|i| **i == f.ino).count() as u32;
    assert_eq!(fs.getattr(f.ino).expect("attr").nlink, links);
    fs.close().expect("close");
    assert_clean_with(&dev, hash_low_7);
    let fs = Fs::open(dev.clone(), reopen_opts(hash_low_7)).expect("reopen");
    assert_eq!(names(&list_paged(&fs, d.ino, 4)), model, "after reopen");
    for name in model.keys() {
        fs.unlink(d.ino, name).expect("unlink all");
    }
    fs.rmdir(ROOT, b"d").expect("rmdir");
    fs.close().expect("close");
    assert_clean_with(&dev, hash_low_7);
}

/// Names the random workload may touch; stable names are never touched.
struct Churn {
    dir: u64,
    other: u64,
    /// volatile names present in `dir` -> ino
    present: HashMap<Vec<u8>, u64>,
    /// volatile names present in `other`
    away: HashMap<Vec<u8>, u64>,
}

impl Churn {
    fn name(rng: &mut Rng) -> Vec<u8> {
        format!("v{}", rng.below(400)).into_bytes()
    }

    /// One random change to the volatile names; returns the (name, ino) it made appear in
    /// `dir`, if any.
    fn step(&mut self, fs: &Fs, rng: &mut Rng) -> Option<(Vec<u8>, u64)> {
        let a = Self::name(rng);
        let b = Self::name(rng);
        match rng.below(6) {
            0 | 1 => {
                if self.present.contains_key(&a) {
                    return None;
                }
                let at = fs.create(self.dir, &a, 0o644, ME).expect("create");
                self.present.insert(a.clone(), at.ino);
                Some((a, at.ino))
            }
            2 => {
                self.present.remove(&a)?;
                fs.unlink(self.dir, &a).expect("unlink");
                None
            }
            3 => {
                // rename within the directory, replacing b if it is there
                let ino = *self.present.get(&a)?;
                fs.rename(self.dir, &a, self.dir, &b, 0).expect("rename");
                if a != b && self.present.get(&b) != Some(&ino) {
                    self.present.remove(&a);
                    self.present.insert(b.clone(), ino);
                } else if a != b {
                    // both names were links of one inode: rename did nothing
                }
                Some((b, ino))
            }
            4 => {
                // hard link within the directory
                let ino = *self.present.get(&a)?;
                if self.present.contains_key(&b) {
                    return None;
                }
                fs.link(ino, self.dir, &b).expect("link");
                self.present.insert(b.clone(), ino);
                Some((b, ino))
            }
            _ => {
                // move out to the other directory, or back in
                if let Some(ino) = self.present.remove(&a) {
                    if self.away.contains_key(&a) {
                        self.present.insert(a, ino);
                        return None;
                    }
                    fs.rename(self.dir, &a, self.other, &a, 0)
                        .expect("move out");
                    self.away.insert(a, ino);
                    None
                } else {
                    let ino = self.away.remove(&a)?;
                    fs.rename(self.other, &a, self.dir, &a, 0).expect("move in");
                    self.present.insert(a.clone(), ino);
                    Some((a, ino))
                }
            }
        }
    }
}

fn make_stable(fs: &Fs, dir: u64, n: usize) -> BTreeMap<Vec<u8>, u64> {
    (0..n)
        .map(|i| {
            let name = format!("stable-{i}").into_bytes();
            let a = fs.create(dir, &name, 0o644, ME).expect("stable");
            (name, a.ino)
        })
        .collect()
}

/// Checks one listing made while the volatile names changed: every stable entry exactly once,
/// no (name, inode) pair twice, nothing that never existed.
fn check_listing(
    es: &[DirEntryOut],
    stable: &BTreeMap<Vec<u8>, u64>,
    appeared: &HashSet<(Vec<u8>, u64)>,
) {
    assert_inode_order(es);
    let mut pairs = HashSet::new();
    let mut stable_seen = 0;
    for e in es {
        assert!(
            pairs.insert((e.name.clone(), e.ino)),
            "{:?} -> {} listed twice",
            String::from_utf8_lossy(&e.name),
            e.ino
        );
        if let Some(ino) = stable.get(&e.name) {
            assert_eq!(*ino, e.ino);
            stable_seen += 1;
        } else {
            assert!(
                appeared.contains(&(e.name.clone(), e.ino)),
                "{:?} -> {} never existed",
                String::from_utf8_lossy(&e.name),
                e.ino
            );
        }
    }
    assert_eq!(stable_seen, stable.len(), "every stable entry exactly once");
}

#[test]
fn readdir_resumed_while_the_directory_changes_model() {
    let (dev, fs) = mem_fs(256 << 20);
    let (mut rng, _) = Rng::from_env("readdir_model");
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("d");
    let o = fs.mkdir(ROOT, b"o", 0o755, ME).expect("o");
    let stable = make_stable(&fs, d.ino, 1500);
    let mut churn = Churn {
        dir: d.ino,
        other: o.ino,
        present: HashMap::new(),
        away: HashMap::new(),
    };
    for _ in 0..200 {
        churn.step(&fs, &mut rng);
    }
    for round in 0..40 {
        let mut appeared: HashSet<(Vec<u8>, u64)> =
            churn.present.iter().map(|(n, i)| (n.clone(), *i)).collect();
        let page = 1 + rng.below(64) as usize;
        let es = list_paged_with(&fs, d.ino, page, || {
            for _ in 0..rng.below(12) {
                if let Some(p) = churn.step(&fs, &mut rng) {
                    appeared.insert(p);
                }
            }
            if rng.chance(3) {
                fs.sync().expect("commit mid-listing");
            }
        });
        check_listing(&es, &stable, &appeared);
        // Quiet now: a listing is exactly the model.
        let mut want = stable.clone();
        want.extend(churn.present.iter().map(|(n, i)| (n.clone(), *i)));
        assert_eq!(names(&list_paged(&fs, d.ino, 50)), want, "round {round}");
    }
    fs.close().expect("close");
    assert_clean(&dev);
}

#[test]
fn readdir_during_changes_from_another_thread() {
    let (dev, fs) = mem_fs(256 << 20);
    let (rng, _) = Rng::from_env("readdir_threads");
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("d");
    let o = fs.mkdir(ROOT, b"o", 0o755, ME).expect("o");
    let stable = make_stable(&fs, d.ino, 2000);
    let stop = AtomicBool::new(false);
    // Everything the writer ever made appear, shared with the reader after each listing.
    let appeared = std::sync::Mutex::new(HashSet::<(Vec<u8>, u64)>::new());
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut rng = rng.clone();
            let mut churn = Churn {
                dir: d.ino,
                other: o.ino,
                present: HashMap::new(),
                away: HashMap::new(),
            };
            let mut steps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Record before the change can be listed: the reader checks against this set.
                let mut guard = appeared.lock().expect("lock");
                if let Some(p) = churn.step(&fs, &mut rng) {
                    guard.insert(p);
                }
                drop(guard);
                steps += 1;
            }
            steps
        });
        let mut rng = rng.clone();
        for _ in 0..60 {
            let es = list_paged(&fs, d.ino, 1 + rng.below(40) as usize);
            let seen = appeared.lock().expect("lock").clone();
            check_listing(&es, &stable, &seen);
        }
        stop.store(true, Ordering::Relaxed);
        let steps = writer.join().expect("writer");
        assert!(steps > 0, "the writer ran");
    });
    fs.close().expect("close");
    assert_clean(&dev);
}

fn fs_stats(dev: &MemDevice) -> dump::TreeStats {
    let all = dump::dump(dev, Some(Which::Fs), true, &mut std::io::sink()).expect("dump");
    all.into_iter().next().expect("fs tree").1
}

#[test]
fn sequential_inserts_fill_leaves() {
    let (dev, fs) = mem_fs(512 << 20);
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("d");
    for i in 0..60_000 {
        fs.create(d.ino, format!("file-{i}").as_bytes(), 0o644, ME)
            .expect("create");
    }
    fs.close().expect("close");
    let st = fs_stats(&dev);
    // Inode numbers ascend, so inode items and the inode-order index are appended: full leaves
    // (a split at the midpoint would leave them near half).
    let ino = st.leaf_fill_of("DIR_INO").expect("dir-ino leaves");
    let inode = st.leaf_fill_of("INODE").expect("inode leaves");
    assert!(ino > 0.9, "DIR_INO leaves {:.1}% full", ino * 100.0);
    assert!(inode > 0.9, "INODE leaves {:.1}% full", inode * 100.0);
    assert_clean(&dev);
}

/// Nodes a cold whole-directory readdirplus of `dir` reads (the image reopened first).
fn cold_plus_reads(dev: &Arc<MemDevice>, dir: u64) -> (u64, Vec<u64>) {
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    let before = fs.counters().node_reads.get();
    let (mut cookie, mut inos) = (0, Vec::new());
    loop {
        let b = fs
            .readdir_plus_batch(dir, cookie, 512)
            .expect("readdirplus");
        for (e, a) in &b.entries {
            assert_eq!(e.ino, a.ino, "an entry with another inode's attributes");
            inos.push(e.ino);
        }
        match b.entries.last() {
            Some((e, _)) if b.more => cookie = e.cookie,
            _ => break,
        }
    }
    let reads = fs.counters().node_reads.get() - before;
    fs.close().expect("close");
    (reads, inos)
}

/// Two directories filled at once (creates alternating between them, as two writers or a
/// mail server delivering to two folders make them) against the same two filled one after the
/// other: each directory's inodes come in runs of its own (`fs::ino_runs`), so the inode
/// leaves fill as full, and a whole-directory pass reads about as many nodes (with numbers
/// from one sequence the two directories' inodes interleave, and a pass over one reads the
/// other's leaves too, far past the bound).
#[test]
fn directories_filled_at_once_keep_their_inodes_apart() {
    const N: usize = 20_000;
    let mut reads = Vec::new();
    for alternate in [false, true] {
        let (dev, fs) = mem_fs(512 << 20);
        let a = fs.mkdir(ROOT, b"a", 0o755, ME).expect("a").ino;
        let b = fs.mkdir(ROOT, b"b", 0o755, ME).expect("b").ino;
        let order: Vec<(u64, usize)> = if alternate {
            (0..N).flat_map(|i| [(a, i), (b, i)]).collect()
        } else {
            (0..N)
                .map(|i| (a, i))
                .chain((0..N).map(|i| (b, i)))
                .collect()
        };
        let mut made = HashMap::new();
        for (d, i) in order {
            let ino = fs
                .create(d, format!("file-{i}").as_bytes(), 0o644, ME)
                .expect("create")
                .ino;
            assert!(made.insert(ino, d).is_none(), "inode {ino} made twice");
        }
        fs.close().expect("close");
        let st = fs_stats(&dev);
        let inode = st.leaf_fill_of("INODE").expect("inode leaves");
        assert!(
            inode > 0.9,
            "alternate {alternate}: INODE leaves {:.1}% full",
            inode * 100.0
        );
        let (r, inos) = cold_plus_reads(&dev, a);
        let mine: HashSet<u64> = made
            .iter()
            .filter(|(_, d)| **d == a)
            .map(|(i, _)| *i)
            .collect();
        let listed: HashSet<u64> = inos
            .iter()
            .copied()
            .filter(|i| *i != a && *i != ROOT)
            .collect();
        assert_eq!(listed, mine, "alternate {alternate}: the listing's inodes");
        reads.push(r);
        assert_clean(&dev);
    }
    let (alone, together) = (reads[0], reads[1]);
    assert!(
        together * 100 <= alone * 115,
        "a cold readdirplus read {together} nodes after alternating creates, {alone} after \
         creates one directory at a time"
    );
}

#[test]
fn aged_directory_keeps_leaves_half_full_and_in_order() {
    let (dev, fs) = mem_fs(512 << 20);
    let (mut rng, _) = Rng::from_env("aged_directory");
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("d");
    let mut present: Vec<(Vec<u8>, u64)> = Vec::new();
    let mut next = 0u64;
    // 80% creates, 20% deletes of a random present entry.
    for _ in 0..100_000 {
        if present.is_empty() || rng.chance(80) {
            let name = format!("n{next}-{}", rng.below(1 << 20)).into_bytes();
            next += 1;
            let a = fs.create(d.ino, &name, 0o644, ME).expect("create");
            present.push((name, a.ino));
        } else {
            let i = rng.below(present.len() as u64) as usize;
            let (name, _) = present.swap_remove(i);
            fs.unlink(d.ino, &name).expect("unlink");
        }
    }
    let es = list_paged(&fs, d.ino, 1000);
    assert!(
        es.windows(2).all(|w| w[0].ino < w[1].ino),
        "aged readdir is in strictly increasing inode order"
    );
    let want: BTreeMap<Vec<u8>, u64> = present.iter().cloned().collect();
    assert_eq!(names(&es), want);
    fs.close().expect("close");
    let st = fs_stats(&dev);
    for kind in ["DIR_HASH", "DIR_INO", "INODE"] {
        let f = st.leaf_fill_of(kind).expect("leaves of each index");
        assert!(f >= 0.5, "aged {kind} leaves {:.1}% full", f * 100.0);
    }
    assert_clean(&dev);

    // Then delete 90% at random: deletes coalesce, the tree shrinks with the directory.
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    let before = st.levels.get(&0).map(|l| l.0).unwrap_or(0);
    let mut rest = present;
    let keep = rest.len() / 10;
    while rest.len() > keep {
        let i = rng.below(rest.len() as u64) as usize;
        let (name, _) = rest.swap_remove(i);
        fs.unlink(d.ino, &name).expect("unlink");
    }
    fs.close().expect("close");
    let st = fs_stats(&dev);
    let after = st.levels.get(&0).map(|l| l.0).unwrap_or(0);
    let fill = st.leaf_fill();
    eprintln!(
        "leaves {before} -> {after} after deleting 90%, fill {:.1}%",
        fill * 100.0
    );
    assert!(
        after * 4 < before,
        "leaves {before} -> {after}: deletes must merge leaves"
    );
    assert!(
        fill >= 0.3,
        "leaf fill {:.1}% after mass delete",
        fill * 100.0
    );
    assert_clean(&dev);
}

#[test]
fn readdir_plus_attributes_match_getattr_including_uncommitted_changes() {
    let dev = Arc::new(MemDevice::new(256 << 20));
    Fs::mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
    // A small inode cache, so most attributes come from the ordered scan of the tree.
    let fs = Fs::open(
        dev.clone(),
        OpenOptions {
            inode_cache_entries: 64,
            ..opts()
        },
    )
    .expect("open");
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("d");
    let other = fs.mkdir(ROOT, b"other", 0o755, ME).expect("other");
    for i in 0..5000u32 {
        // Files elsewhere in between: the scan must skip items of inodes not in `d`.
        if i % 3 == 0 {
            fs.create(other.ino, format!("x{i}").as_bytes(), 0o600, ME)
                .expect("other file");
        }
        let a = fs
            .create(d.ino, format!("f{i}").as_bytes(), 0o644, ME)
            .expect("create");
        if i % 7 == 0 {
            fs.write(a.ino, 0, &vec![7u8; (i % 9000) as usize])
                .expect("write");
        }
    }
    fs.sync().expect("commit");
    // Changed after the commit: these live only in the inode cache until the next one.
    for i in (0..5000u32).step_by(11) {
        let a = fs
            .lookup(d.ino, format!("f{i}").as_bytes())
            .expect("lookup");
        let set = idxfs_engine::fs::SetAttr {
            mode: Some(0o600 | (i % 2)),
            ..Default::default()
        };
        fs.setattr(a.ino, &set).expect("chmod");
    }
    let mut n = 0;
    let mut cookie = 0;
    loop {
        let mut batch = Vec::new();
        fs.readdir_plus(d.ino, cookie, 100, |e, a| {
            batch.push((e.clone(), a.clone()));
            true
        })
        .expect("readdir_plus");
        if batch.is_empty() {
            break;
        }
        for (e, a) in &batch {
            cookie = e.cookie;
            if e.name == b"." || e.name == b".." {
                continue;
            }
            assert_eq!(*a, fs.getattr(e.ino).expect("getattr"), "{:?}", e.name);
            n += 1;
        }
    }
    assert_eq!(n, 5000);
    fs.close().expect("close");
    assert_clean(&dev);
}
