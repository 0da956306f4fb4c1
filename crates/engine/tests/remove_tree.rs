//! `Fs::remove_tree` (the mount's `idxfs rm`) against a model: random trees of files of every
//! size, preallocated and NOCOW ones, symlinks, xattrs, hard links between the tree and the
//! rest, nested directories, and a file held open inside. After the removal: the counts are
//! the model's, the name is gone, every link outside keeps its file whole with one link less,
//! the open file reads whole until let go of, fsck is clean, and the free space is what it
//! was before the tree was made (a snapshot made meanwhile holds what it names, and gives it
//! back when deleted).
mod common;
use common::digest::digest;
use common::*;
use idxfs_engine::fs::{Attr, Permits, Removed, Unchecked, NOCOW_FL};
use idxfs_engine::testutil::Rng;
use idxfs_engine::Fs;
use idxfs_engine::{fsck, Error};

/// What the tree holds, as the model counts it.
#[derive(Default)]
struct Made {
    files: u64,
    dirs: u64,
    /// (directory outside, name, ino, bytes): links outside the tree to files in it.
    outside: Vec<(u64, Vec<u8>, u64, Vec<u8>)>,
}

fn make_tree(fs: &idxfs_engine::Fs, rng: &mut Rng, top: u64, out: u64, made: &mut Made) {
    let mut dirs = vec![top];
    for i in 0..rng.below(300) + 100 {
        let d = dirs[rng.below(dirs.len() as u64) as usize];
        let name = format!("n{i}").into_bytes();
        match rng.below(10) {
            0 | 1 => {
                let a = fs.mkdir(d, &name, 0o755, ME).expect("mkdir");
                dirs.push(a.ino);
                made.dirs += 1;
            }
            2 => {
                fs.symlink(d, &name, b"somewhere", ME).expect("symlink");
                made.files += 1;
            }
            n => {
                let a = fs.create(d, &name, 0o644, ME).expect("create");
                made.files += 1;
                if n == 3 {
                    fs.set_flags(a.ino, NOCOW_FL).expect("chattr +C");
                }
                let len = [0usize, 100, 5000, 70_000][rng.below(4) as usize];
                let bytes = rng.bytes(len);
                fs.write(a.ino, 0, &bytes).expect("write");
                if n == 4 {
                    fs.fallocate(a.ino, 0, 200_000, 0).expect("preallocate");
                }
                if n == 5 {
                    fs.setxattr(a.ino, b"user.x", &rng.bytes(3000), 0)
                        .expect("setxattr");
                }
                if n == 6 && rng.chance(30) {
                    let link = format!("out{i}").into_bytes();
                    fs.link(a.ino, out, &link).expect("link out");
                    made.outside.push((out, link, a.ino, bytes));
                }
            }
        }
    }
    // A directory chain deeper than any batch or stack the walk might keep.
    let mut d = top;
    for i in 0..150 {
        d = fs
            .mkdir(d, format!("deep{i}").as_bytes(), 0o755, ME)
            .expect("mkdir")
            .ino;
        made.dirs += 1;
    }
}

#[test]
fn a_removed_tree_leaves_the_rest_whole_and_gives_every_block_back() {
    removed_tree(false);
}

/// The same removal run a slice at a time (`remove_tree_start`, then `remove_tree_step`
/// until it is done, here a batch a step, with commits between steps).
#[test]
fn a_tree_removed_a_batch_at_a_time_is_removed_whole() {
    removed_tree(true);
}

fn removed_tree(stepwise: bool) {
    let (mut rng, seed) = Rng::from_env("remove tree");
    let (dev, fs) = mem_fs_with(256 << 20, 4096);
    let out = fs.mkdir(ROOT, b"outside", 0o755, ME).expect("mkdir").ino;
    let keep = fs.create(out, b"keep", 0o644, ME).expect("create").ino;
    fs.write(keep, 0, b"kept").expect("write");
    let free = free_blocks_with_roots_tree(&fs);
    let rest = digest(&fs);
    let top = fs.mkdir(ROOT, b"tree", 0o755, ME).expect("mkdir").ino;
    let mut made = Made {
        dirs: 1,
        ..Made::default()
    };
    make_tree(&fs, &mut rng, top, out, &mut made);
    // A file held open inside, as the kernel holds one a process has open.
    let open = fs.create(top, b"held-open", 0o644, ME).expect("create").ino;
    let held = rng.bytes(20_000);
    fs.write(open, 0, &held).expect("write");
    made.files += 1;
    assert!(fs.pin(open), "pin");
    fs.sync().expect("sync");
    let snap = fs.snapshot(b"before").expect("snapshot");
    let (mut calls, mut told) = (0, Vec::new());
    let r = if stepwise {
        let mut tell = |i| told.push(i);
        let mut job = fs
            .remove_tree_start(ROOT, b"tree", &Unchecked, &mut tell)
            .expect("start");
        let mut steps = 0;
        let now = || Some(std::time::Instant::now());
        while !fs
            .remove_tree_step(&mut job, &Unchecked, now(), &mut |_| calls += 1, &mut tell)
            .unwrap_or_else(|e| panic!("seed {seed}: step: {e}"))
        {
            steps += 1;
            if steps % 4 == 0 {
                fs.sync().expect("sync");
            }
        }
        // A batch a step: at least one a directory.
        assert!(steps >= made.dirs, "seed {seed}: {steps} steps");
        job.removed()
    } else {
        fs.remove_tree(ROOT, b"tree", &Unchecked, |_| calls += 1, |i| told.push(i))
            .unwrap_or_else(|e| panic!("seed {seed}: remove_tree: {e}"))
    };
    assert_eq!(
        r,
        Removed {
            files: made.files,
            dirs: made.dirs
        },
        "seed {seed}"
    );
    assert!(calls > 0, "seed {seed}: no progress reported");
    // The one inode held (pinned) is told of: a front end's cache of it is stale.
    assert_eq!(told, vec![open], "seed {seed}");
    eprintln!("seed {seed}: {r:?}, {} links outside", made.outside.len());
    assert!(matches!(fs.lookup(ROOT, b"tree"), Err(Error::NotFound)));
    for (d, name, ino, bytes) in &made.outside {
        let a = fs.lookup(*d, name).expect("the link outside");
        assert_eq!(a.ino, *ino);
        assert_eq!(a.nlink, 1, "seed {seed}: links of a file linked outside");
        assert_eq!(&fs.read(*ino, 0, bytes.len() + 10).expect("read"), bytes);
    }
    assert_eq!(fs.read(open, 0, 30_000).expect("read the open file"), held);
    fs.unpin(open, 1).expect("let go");
    for (d, name, _, _) in &made.outside {
        fs.unlink(*d, name).expect("unlink the link outside");
    }
    assert_eq!(digest(&fs), rest, "seed {seed}: the rest changed");
    // Everything the tree held comes back once the snapshot that holds it is deleted.
    fs.delete_snapshot(snap).expect("delete");
    fs.finish_drops().expect("drops");
    fs.sync().expect("sync");
    assert_eq!(
        fs.statfs().expect("statfs").blocks_free,
        free,
        "seed {seed}"
    );
    fs.close().expect("close");
    let r = fsck::check(
        &(dev.clone() as std::sync::Arc<dyn idxfs_blockdev::BlockDevice>),
        idxfs_format::hash::name_hash,
        &mut |_| {},
    )
    .expect("fsck");
    assert!(r.is_clean(), "seed {seed}: {}", r.problems.join("\n"));
}

#[test]
fn a_file_or_a_missing_name_is_removed_as_rm_removes_it() {
    let (_dev, fs) = mem_fs_with(16 << 20, 4096);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.write(f, 0, b"x").expect("write");
    let r = fs
        .remove_tree(ROOT, b"f", &Unchecked, |_| {}, |_| {})
        .expect("remove a file");
    assert_eq!(r, Removed { files: 1, dirs: 0 });
    assert!(matches!(fs.lookup(ROOT, b"f"), Err(Error::NotFound)));
    assert!(matches!(
        fs.remove_tree(ROOT, b"f", &Unchecked, |_| {}, |_| {}),
        Err(Error::NotFound)
    ));
    let d = fs.mkdir(ROOT, b"empty", 0o755, ME).expect("mkdir").ino;
    assert!(d > 0);
    let r = fs
        .remove_tree(ROOT, b"empty", &Unchecked, |_| {}, |_| {})
        .expect("remove");
    assert_eq!(r, Removed { files: 0, dirs: 1 });
}

/// A front end's checks (`Permits`) that refuse to list the directories in `unlisted` and to
/// remove anything from those in `fixed`, and keep what they were asked.
#[derive(Default)]
struct Refusing {
    unlisted: Vec<u64>,
    fixed: Vec<u64>,
    listed: std::cell::RefCell<Vec<u64>>,
    permitted: std::cell::RefCell<Vec<(u64, u64)>>,
}

impl Permits for Refusing {
    fn list(&self, _: &Fs, dir: &Attr) -> Result<(), Error> {
        if self.unlisted.contains(&dir.ino) {
            return Err(Error::Denied("test"));
        }
        self.listed.borrow_mut().push(dir.ino);
        Ok(())
    }
    fn change(&self, _: &Fs, dir: &Attr) -> Result<(), Error> {
        if self.fixed.contains(&dir.ino) {
            return Err(Error::NotPermitted("test"));
        }
        Ok(())
    }
    fn remove(&self, _: &Fs, dir: &Attr, child: u64) -> Result<(), Error> {
        assert!(
            !self.fixed.contains(&dir.ino),
            "a removal from a refused directory"
        );
        self.permitted.borrow_mut().push((dir.ino, child));
        Ok(())
    }
}

/// Each directory's names and numbers, under `top` (itself included, by its number).
fn names_under(fs: &Fs, top: u64) -> Vec<(u64, Vec<u8>, u64)> {
    let mut out = Vec::new();
    let mut dirs = vec![top];
    while let Some(d) = dirs.pop() {
        let mut es = Vec::new();
        fs.readdir(d, 2, |e| {
            es.push(e.clone());
            true
        })
        .expect("readdir");
        for e in es {
            if e.dtype == 4 {
                dirs.push(e.ino);
            }
            out.push((d, e.name, e.ino));
        }
    }
    out
}

/// top/{a,b,c,e,plain}: each directory but c (empty) holds files and a subdirectory with
/// files. Returns top's number and its directories' by name.
fn refusal_tree(fs: &Fs) -> (u64, std::collections::BTreeMap<&'static [u8], u64>) {
    let top = fs.mkdir(ROOT, b"top", 0o755, ME).expect("mkdir").ino;
    let mut ino = std::collections::BTreeMap::new();
    for d in [&b"a"[..], b"b", b"c", b"e"] {
        let di = fs.mkdir(top, d, 0o755, ME).expect("mkdir").ino;
        ino.insert(d, di);
        if d == b"c" {
            continue;
        }
        let sub = fs.mkdir(di, b"sub", 0o755, ME).expect("mkdir").ino;
        for i in 0..30 {
            for at in [di, sub] {
                let f = fs.create(at, format!("f{i}").as_bytes(), 0o644, ME);
                fs.write(f.expect("create").ino, 0, b"data").expect("write");
            }
        }
    }
    fs.create(top, b"plain", 0o644, ME).expect("create");
    (top, ino)
}

#[test]
fn a_refused_check_stops_the_removal_having_removed_only_what_was_permitted() {
    let (dev, fs) = mem_fs_with(64 << 20, 4096);
    type Refuse = fn(&std::collections::BTreeMap<&'static [u8], u64>) -> Refusing;
    let cases: [(&str, Refuse); 4] = [
        ("nothing may be removed from the root", |_| Refusing {
            fixed: vec![ROOT],
            ..Refusing::default()
        }),
        ("b may not be listed", |ino| Refusing {
            unlisted: vec![ino[&b"b"[..]]],
            ..Refusing::default()
        }),
        ("nothing may be removed from e", |ino| Refusing {
            fixed: vec![ino[&b"e"[..]]],
            ..Refusing::default()
        }),
        // Removed all the same, as rm -rf removes an empty directory it may not read.
        ("c, empty, may not be listed", |ino| Refusing {
            unlisted: vec![ino[&b"c"[..]]],
            ..Refusing::default()
        }),
    ];
    for (what, refuse) in cases {
        let (top, ino) = refusal_tree(&fs);
        let checks = refuse(&ino);
        let before = names_under(&fs, top);
        let refused: Vec<u64> = checks
            .unlisted
            .iter()
            .chain(&checks.fixed)
            .copied()
            .collect();
        let whole: Vec<_> = refused.iter().map(|d| names_under(&fs, *d)).collect();
        let r = fs.remove_tree(ROOT, b"top", &checks, |_| {}, |_| {});
        if what.starts_with("c,") {
            assert!(r.is_ok(), "{what}: {r:?}");
            assert!(matches!(fs.lookup(ROOT, b"top"), Err(Error::NotFound)));
            continue;
        }
        assert!(
            matches!(r, Err(Error::Denied(_)) | Err(Error::NotPermitted(_))),
            "{what}: {r:?}"
        );
        let after = names_under(&fs, top);
        // Only what was permitted went, from directories that were listed.
        let permitted = checks.permitted.borrow();
        for name in before.iter().filter(|n| !after.contains(n)) {
            let (dir, _, child) = name;
            assert!(
                permitted.contains(&(*dir, *child)),
                "{what}: {name:?} went without a permitted removal"
            );
            assert!(
                checks.listed.borrow().contains(dir),
                "{what}: {name:?} went from a directory not listed"
            );
        }
        // A refused directory keeps its name and everything under it.
        for (d, was) in refused.iter().zip(&whole) {
            assert_eq!(&names_under(&fs, *d), was, "{what}: under {d}");
            assert!(*d == ROOT || after.iter().any(|n| n.2 == *d), "{what}");
        }
        if checks.fixed == [ROOT] {
            assert_eq!(after, before, "{what}: something went");
            assert!(checks.listed.borrow().is_empty(), "{what}");
        } else {
            assert_ne!(after, before, "{what}: nothing went");
        }
        fs.remove_tree(ROOT, b"top", &Unchecked, |_| {}, |_| {})
            .expect("the rest");
    }
    fs.close().expect("close");
    assert_clean(&dev);
}
