//! `Fs::copy_tree` (the mount's `idxfs cp`) against its source: random trees of every file
//! type, owners, modes with set-user-ID and set-group-ID, times, xattrs and ACLs, sparse,
//! preallocated and NOCOW files, hard links inside the tree and out of it; copied under a
//! directory whose set-group-ID bit and default ACL would otherwise shape new files. The copy
//! is the source in everything `cp -a` keeps, takes few blocks for its data (it shares
//! them), changes apart from the source both ways, survives a remount, leaves fsck clean,
//! and gives every block back when both are gone.
mod common;
use common::*;
use idxfs_blockdev::MemDevice;
use idxfs_engine::fs::acl::{GROUP, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ};
use idxfs_engine::fs::{Attr, Copied, CopyAs, Owner, SetAttr, SetTime, Time, Unchecked, NOCOW_FL};
use idxfs_engine::testutil::Rng;
use idxfs_engine::{Error, Fs};
use std::collections::HashMap;
use std::sync::Arc;

/// Everything `cp -a` keeps of the tree under `top`, one line per name, by path: type and
/// mode, owner, size, device number, access and modification times, flags, xattrs with
/// their values, the data's hash (and which blocks have data sums) or the symlink's
/// target, and for a file with more than one
/// name the first path naming it in this tree (its links among the copies).
fn tree(fs: &Fs, top: u64) -> Vec<String> {
    let mut out = Vec::new();
    let mut first: HashMap<u64, String> = HashMap::new();
    let mut names: HashMap<u64, u32> = HashMap::new();
    let mut lines = Vec::new();
    let mut todo = vec![(top, String::new())];
    while let Some((dir, path)) = todo.pop() {
        let mut es = fs.list(dir).expect("list");
        es.sort_by(|a, b| a.name.cmp(&b.name));
        for e in es {
            let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
            let a = fs.getattr(e.ino).expect("getattr");
            let mut line = format!(
                "{p} mode={:o} owner={}:{} size={} rdev={} atime={:?} mtime={:?} flags={:x}",
                a.mode,
                a.uid,
                a.gid,
                a.size,
                a.rdev,
                a.atime,
                a.mtime,
                fs.flags(e.ino).expect("flags")
            );
            let mut xs = fs.listxattr(e.ino).expect("listxattr");
            xs.sort();
            for x in xs {
                let v = fs.getxattr(e.ino, &x).expect("getxattr");
                line += &format!(" x:{}={:x}", String::from_utf8_lossy(&x), hash(&v));
            }
            match a.mode & 0o170000 {
                0o040000 => todo.push((e.ino, p.clone())),
                0o100000 => {
                    let data = fs.read(e.ino, 0, a.size as usize + 1).expect("read");
                    assert_eq!(data.len() as u64, a.size, "{p}: read the whole size");
                    // Which blocks have a data sum: a copy shares its source's with its
                    // blocks, or writes its own.
                    let sums = summed_blocks(fs, e.ino);
                    line += &format!(" data={:x} sums={sums:?}", hash(&data));
                }
                0o120000 => {
                    let t = fs.readlink(e.ino).expect("readlink");
                    line += &format!(" -> {}", String::from_utf8_lossy(&t));
                }
                _ => {}
            }
            if a.mode & 0o170000 != 0o040000 {
                let f = first.entry(e.ino).or_insert_with(|| p.clone());
                *names.entry(e.ino).or_insert(0) += 1;
                lines.push((line, e.ino, f.clone()));
            } else {
                out.push(line);
            }
        }
    }
    // The first path of a file with more than one name in the tree (links out of it are
    // not the copy's).
    for (line, ino, f) in lines {
        match names[&ino] {
            1 => out.push(line),
            _ => out.push(format!("{line} first-name={f}")),
        }
    }
    out.sort();
    out
}

fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    })
}

/// Asserts two `tree`s are equal, showing the lines that differ.
#[track_caller]
fn same(have: &[String], want: &[String], what: &str) {
    if have != want {
        let only = |a: &[String], b: &[String]| -> Vec<String> {
            a.iter()
                .filter(|l| !b.contains(l))
                .take(6)
                .cloned()
                .collect()
        };
        panic!(
            "{what}: differs\nonly in the first:\n{}\nonly in the second:\n{}",
            only(have, want).join("\n"),
            only(want, have).join("\n")
        );
    }
}

fn t(sec: i64) -> Time {
    Time {
        sec,
        nsec: (sec as u32 % 1000) * 1000,
    }
}

/// What the model counts of a tree made by `make_tree`.
#[derive(Default)]
struct Made {
    files: u64,
    dirs: u64,
    data: u64,
}

/// A random tree under `top`: each kind of file, with owners, modes, times and xattrs;
/// `out` gets links to some of its files.
fn make_tree(fs: &Fs, rng: &mut Rng, top: u64, out: u64) -> Made {
    let mut m = Made {
        dirs: 1,
        ..Made::default()
    };
    let mut dirs = vec![top];
    let mut files = Vec::new();
    let owners = [ME, Owner { uid: 0, gid: 0 }, Owner { uid: 7, gid: 8 }];
    for i in 0..rng.below(250) + 80 {
        let d = dirs[rng.below(dirs.len() as u64) as usize];
        let name = format!("n{i}").into_bytes();
        let who = owners[rng.below(3) as usize];
        let ino = match rng.below(14) {
            0 | 1 => {
                let a = fs.mkdir(d, &name, 0o755, who).expect("mkdir");
                dirs.push(a.ino);
                m.dirs += 1;
                a.ino
            }
            2 => {
                let len = 1 + rng.below(200) as usize;
                let target: Vec<u8> = rng.bytes(len).iter().map(|b| b | 1).collect();
                m.files += 1;
                fs.symlink(d, &name, &target, who).expect("symlink").ino
            }
            3 => {
                m.files += 1;
                fs.mknod(d, &name, 0o020644, who, 0x0801)
                    .expect("mknod")
                    .ino
            }
            4 => {
                m.files += 1;
                fs.mknod(d, &name, 0o010600, who, 0).expect("mkfifo").ino
            }
            5 if !files.is_empty() => {
                let f = files[rng.below(files.len() as u64) as usize];
                fs.link(f, d, &name).expect("link");
                m.files += 1;
                continue;
            }
            n => {
                let a = fs.create(d, &name, 0o644, who).expect("create");
                m.files += 1;
                if n == 6 {
                    fs.set_flags(a.ino, NOCOW_FL).expect("chattr +C");
                }
                let len = [0usize, 100, 4096, 5000, 70_000, 300_000][rng.below(6) as usize];
                let bytes = rng.bytes(len);
                fs.write(a.ino, 0, &bytes).expect("write");
                m.data += len as u64;
                if n == 7 {
                    // A hole, then a block far out.
                    fs.write(a.ino, 3 << 20, b"far").expect("write far");
                    m.data += 3;
                }
                if n == 8 {
                    fs.fallocate(a.ino, 0, 400_000, 0).expect("preallocate");
                }
                if n == 9 {
                    fs.link(a.ino, out, &name).expect("link out");
                }
                files.push(a.ino);
                a.ino
            }
        };
        if rng.chance(20) {
            let len = rng.below(3000) as usize;
            fs.setxattr(ino, b"user.x", &rng.bytes(len), 0)
                .expect("setxattr");
        }
        if rng.chance(10) && fs.getattr(ino).expect("getattr").mode & 0o170000 != 0o120000 {
            let acl = acl_xattr(&[
                (USER_OBJ, 7, u32::MAX),
                (USER, 5, 4242),
                (GROUP_OBJ, 5, u32::MAX),
                (GROUP, 1, 77),
                (MASK, 5, u32::MAX),
                (OTHER, 0, u32::MAX),
            ]);
            fs.setxattr(ino, b"system.posix_acl_access", &acl, 0)
                .expect("set an ACL");
        }
    }
    // Modes and times last, deepest first, so nothing made in a directory moves its times.
    let mut all = Vec::new();
    let mut todo = vec![top];
    while let Some(d) = todo.pop() {
        all.push(d);
        for e in fs.list(d).expect("list") {
            if e.dtype == 4 {
                todo.push(e.ino);
            } else {
                all.push(e.ino);
            }
        }
    }
    for ino in all.into_iter().rev() {
        let a = fs.getattr(ino).expect("getattr");
        let mut set = SetAttr {
            atime: Some(SetTime::At(t(rng.below(1 << 31) as i64))),
            mtime: Some(SetTime::At(t(rng.below(1 << 31) as i64))),
            ..SetAttr::default()
        };
        if a.mode & 0o170000 != 0o120000 && rng.chance(30) {
            set.mode = Some([0o4755, 0o2750, 0o1777, 0o600, 0o2775, 0][rng.below(6) as usize]);
        }
        fs.setattr(ino, &set).expect("setattr");
    }
    m
}

/// Removes each of `names` and "outside" (made again empty, as the baseline had it), then
/// checks that the free blocks are `free` again, and fsck after closing.
fn all_back(fs: Fs, dev: &Arc<MemDevice>, names: &[(u64, &[u8])], free: u64, seed: u64) {
    for &(dir, name) in names.iter().chain([(ROOT, &b"outside"[..])].iter()) {
        fs.remove_tree(dir, name, &Unchecked, |_| {}, |_| {})
            .expect("rm");
    }
    fs.mkdir(ROOT, b"outside", 0o755, ME).expect("mkdir");
    fs.sync().expect("sync");
    let now = fs.statfs().expect("statfs").blocks_free;
    assert_eq!(now, free, "seed {seed}: blocks not back");
    fs.close().expect("close");
    assert_clean(dev);
}

#[test]
fn a_copied_tree_is_its_source_shares_its_data_and_changes_apart() {
    let (mut rng, seed) = Rng::from_env("copy tree");
    let (dev, fs) = mem_fs_with(512 << 20, 4096);
    let out = fs.mkdir(ROOT, b"outside", 0o755, ME).expect("mkdir").ino;
    // Where the copy goes: set-group-ID and a default ACL, which new files would take.
    let into = fs.mkdir(ROOT, b"into", 0o2775, ME).expect("mkdir").ino;
    let default = acl_xattr(&[
        (USER_OBJ, 7, u32::MAX),
        (GROUP_OBJ, 7, u32::MAX),
        (OTHER, 0, u32::MAX),
    ]);
    fs.setxattr(into, b"system.posix_acl_default", &default, 0)
        .expect("default ACL");
    fs.sync().expect("sync");
    let free = fs.statfs().expect("statfs").blocks_free;
    let src = fs.mkdir(ROOT, b"src", 0o755, ME).expect("mkdir").ino;
    let mut made = make_tree(&fs, &mut rng, src, out);
    // Past one sharing batch (8 MiB), which a file's copy in one operation is not.
    let big = fs.create(src, b"big", 0o640, ME).expect("create").ino;
    let bytes = rng.bytes((9 << 20) + 123);
    fs.write(big, 0, &bytes).expect("write");
    fs.setattr(
        big,
        &SetAttr {
            mtime: Some(SetTime::At(t(1234))),
            ..SetAttr::default()
        },
    )
    .expect("setattr");
    (made.files, made.data) = (made.files + 1, made.data + bytes.len() as u64);
    let source = tree(&fs, src);
    fs.sync().expect("sync");
    let before_copy = fs.statfs().expect("statfs").blocks_free;

    let mut calls = 0;
    let c = fs
        .copy_tree(ROOT, b"src", into, b"copy", &Unchecked, |_| calls += 1)
        .unwrap_or_else(|e| panic!("seed {seed}: copy_tree: {e}"));
    eprintln!("seed {seed}: {c:?}, {} bytes of data made", made.data);
    assert_eq!((c.files, c.dirs), (made.files, made.dirs), "seed {seed}");
    assert!(calls > 0, "seed {seed}: no progress told");
    let copy = fs.lookup(into, b"copy").expect("the copy").ino;
    let src_attr = fs.getattr(src).expect("getattr");
    let copy_attr = fs.getattr(copy).expect("getattr");
    assert_eq!(
        (
            copy_attr.mode,
            copy_attr.uid,
            copy_attr.gid,
            copy_attr.mtime
        ),
        (src_attr.mode, src_attr.uid, src_attr.gid, src_attr.mtime),
        "seed {seed}: the top directory"
    );
    // Not the default ACL of the directory it was made in: the source's xattrs alone.
    assert_eq!(
        fs.listxattr(copy).expect("listxattr"),
        fs.listxattr(src).expect("listxattr"),
        "seed {seed}: the top directory's xattrs"
    );
    same(&tree(&fs, copy), &source, &format!("seed {seed}: the copy"));
    same(
        &tree(&fs, src),
        &source,
        &format!("seed {seed}: the source after the copy"),
    );
    // The data is shared: the copy took far fewer blocks than its bytes would fill.
    fs.sync().expect("sync");
    let took = before_copy - fs.statfs().expect("statfs").blocks_free;
    assert!(
        took * 4096 < made.data / 2,
        "seed {seed}: the copy took {took} blocks for {} bytes of data",
        made.data
    );

    // Each changes apart from the other.
    let change = |rng: &mut Rng, top: u64| {
        let mut files = Vec::new();
        let mut todo = vec![top];
        while let Some(d) = todo.pop() {
            for e in fs.list(d).expect("list") {
                match e.dtype {
                    4 => todo.push(e.ino),
                    8 => files.push((d, e.name, e.ino)),
                    _ => {}
                }
            }
        }
        for _ in 0..40 {
            let (d, name, ino) = &files[rng.below(files.len() as u64) as usize];
            match rng.below(4) {
                0 => {
                    let off = rng.below(400_000);
                    fs.write(*ino, off, &rng.bytes(5000)).map(|_| ())
                }
                1 => fs.truncate(*ino, rng.below(100_000)).map(|_| ()),
                2 => fs.setxattr(*ino, b"user.changed", b"yes", 0),
                _ => match fs.unlink(*d, name) {
                    Err(Error::NotFound) => Ok(()),
                    r => r,
                },
            }
            .or_else(|e| match e {
                // An unlinked name picked again.
                Error::NotFound => Ok(()),
                e => Err(e),
            })
            .expect("change");
        }
    };
    change(&mut rng, copy);
    same(
        &tree(&fs, src),
        &source,
        &format!("seed {seed}: the source after the copy changed"),
    );
    let changed = tree(&fs, copy);
    assert_ne!(changed, source, "seed {seed}: the changes changed nothing");
    change(&mut rng, src);
    same(
        &tree(&fs, copy),
        &changed,
        &format!("seed {seed}: the copy after the source changed"),
    );
    let source = tree(&fs, src);

    // Across a remount, then fsck.
    fs.close().expect("close");
    assert_clean(&dev);
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    let (src, copy) = (
        fs.lookup(ROOT, b"src").expect("src").ino,
        fs.lookup(into, b"copy").expect("copy").ino,
    );
    same(
        &tree(&fs, src),
        &source,
        &format!("seed {seed}: the source remounted"),
    );
    same(
        &tree(&fs, copy),
        &changed,
        &format!("seed {seed}: the copy remounted"),
    );

    // Both gone, with the links outside: every block is back.
    fs.remove_tree(ROOT, b"src", &Unchecked, |_| {}, |_| {})
        .expect("rm src");
    same(
        &tree(&fs, copy),
        &changed,
        &format!("seed {seed}: the copy without its source"),
    );
    all_back(fs, &dev, &[(into, b"copy")], free, seed);
}

#[test]
fn a_copy_into_itself_or_onto_a_name_is_refused_before_anything_is_made() {
    let (dev, fs) = mem_fs_with(32 << 20, 4096);
    let a = fs.mkdir(ROOT, b"a", 0o755, ME).expect("mkdir").ino;
    let b = fs.mkdir(a, b"b", 0o755, ME).expect("mkdir").ino;
    let f = fs.create(b, b"f", 0o640, ME).expect("create").ino;
    fs.write(f, 0, b"bytes").expect("write");
    let before = tree(&fs, ROOT);
    for (into, why) in [(a, "a itself"), (b, "below a")] {
        let r = fs.copy_tree(ROOT, b"a", into, b"again", &Unchecked, |_| {});
        assert!(matches!(r, Err(Error::Invalid(_))), "{why}: {r:?}");
    }
    let r = fs.copy_tree(ROOT, b"a", ROOT, b"a", &Unchecked, |_| {});
    assert!(matches!(r, Err(Error::Exists)), "{r:?}");
    let r = fs.copy_tree(ROOT, b"missing", ROOT, b"x", &Unchecked, |_| {});
    assert!(matches!(r, Err(Error::NotFound)), "{r:?}");
    same(&tree(&fs, ROOT), &before, "something was made");
    // A file, and a directory beside itself, are copied.
    let r = fs
        .copy_tree(b, b"f", ROOT, b"f2", &Unchecked, |_| {})
        .expect("copy a file");
    assert_eq!(
        r,
        Copied {
            files: 1,
            dirs: 0,
            bytes: 5,
            refused: 0
        }
    );
    let r = fs
        .copy_tree(ROOT, b"a", ROOT, b"a2", &Unchecked, |_| {})
        .expect("copy beside");
    assert_eq!((r.files, r.dirs), (1, 2));
    let a2 = fs.lookup(ROOT, b"a2").expect("a2").ino;
    same(&tree(&fs, a2), &tree(&fs, a), "a beside itself");
    fs.close().expect("close");
    assert_clean(&dev);
}

/// A copy run a slice at a time (`copy_tree_start`, then `copy_tree_step` until it is done,
/// here one entry per step, with commits and other changes between steps) is the whole
/// copy.
#[test]
fn a_copy_made_one_entry_at_a_time_is_the_whole_copy() {
    let (mut rng, seed) = Rng::from_env("copy tree in steps");
    let (dev, fs) = mem_fs_with(512 << 20, 4096);
    let out = fs.mkdir(ROOT, b"outside", 0o755, ME).expect("mkdir").ino;
    let other = fs.create(ROOT, b"other", 0o644, ME).expect("create").ino;
    let src = fs.mkdir(ROOT, b"src", 0o755, ME).expect("mkdir").ino;
    let mut made = make_tree(&fs, &mut rng, src, out);
    // Copied byte by byte (NOCOW) over more than two pieces a step (8 MiB each).
    let big = fs.create(src, b"big", 0o600, ME).expect("create").ino;
    fs.set_flags(big, NOCOW_FL).expect("chattr +C");
    fs.write(big, 0, &rng.bytes(20 << 20)).expect("write");
    made.files += 1;
    let source = tree(&fs, src);
    let mut job = fs
        .copy_tree_start(&fs, src, ROOT, b"copy", &Unchecked)
        .expect("start");
    let mut steps = 0u64;
    let mut listed = 0u64;
    let now = || Some(std::time::Instant::now());
    while !fs
        .copy_tree_step(&fs, &mut job, &Unchecked, now(), &mut |_| listed += 1)
        .unwrap_or_else(|e| panic!("seed {seed}: step: {e}"))
    {
        steps += 1;
        // What another caller might do between two slices.
        fs.write(other, steps * 100, b"between").expect("write");
        if steps.is_multiple_of(16) {
            fs.sync().expect("sync");
        }
    }
    let c = job.copied();
    assert_eq!((c.files, c.dirs), (made.files, made.dirs), "seed {seed}");
    // An entry a step at least (every one but the top, which the start made), and the big
    // file's data a piece a step more.
    assert!(
        steps >= made.files + made.dirs - 1 + 2,
        "seed {seed}: {steps} steps"
    );
    assert!(listed > 0, "seed {seed}: no progress told");
    let copy = fs.lookup(ROOT, b"copy").expect("the copy").ino;
    same(&tree(&fs, copy), &source, &format!("seed {seed}: the copy"));
    fs.close().expect("close");
    assert_clean(&dev);
}

/// Rules of a user who is not root, by the permission bits alone (a stand-in for the FUSE
/// edge's `CopyChecks`, which has its own tests): the owner's bits say what may be listed,
/// searched and read; device nodes may not be made; copies are the user's, without
/// set-user-ID, set-group-ID and sticky bits; only `user.` xattrs are copied.
struct AsUser {
    refused: std::sync::Mutex<Vec<(String, String)>>,
}

impl CopyAs for AsUser {
    fn create(&self, _: &Fs, dir: &Attr) -> Result<(), Error> {
        match dir.mode & 0o300 {
            0o300 => Ok(()),
            _ => Err(Error::Denied("not writable")),
        }
    }
    fn list(&self, _: &Fs, dir: &Attr) -> Result<(), Error> {
        match dir.mode & 0o400 {
            0 => Err(Error::Denied("not readable")),
            _ => Ok(()),
        }
    }
    fn search(&self, _: &Fs, dir: &Attr) -> Result<(), Error> {
        match dir.mode & 0o100 {
            0 => Err(Error::Denied("not searchable")),
            _ => Ok(()),
        }
    }
    fn read(&self, _: &Fs, file: &Attr) -> Result<(), Error> {
        match file.mode & 0o400 {
            0 => Err(Error::Denied("not readable")),
            _ => Ok(()),
        }
    }
    fn make(&self, src: &Attr) -> Result<(), Error> {
        match src.mode & 0o170000 {
            0o020000 | 0o060000 => Err(Error::NotPermitted("a device")),
            _ => Ok(()),
        }
    }
    fn owned(&self, src: &Attr, _: &Attr) -> (Owner, u32) {
        (
            Owner {
                uid: 1000,
                gid: 1000,
            },
            src.mode & 0o777,
        )
    }
    fn xattr(&self, _: &Fs, _: &Attr, name: &[u8]) -> Result<bool, Error> {
        Ok(name.starts_with(b"user."))
    }
    fn refused(&self, path: &[u8], why: &Error) {
        let p = String::from_utf8_lossy(path).into_owned();
        let kind = match why {
            Error::Denied(_) => "EACCES",
            Error::NotPermitted(_) => "EPERM",
            _ => "other",
        };
        self.refused.lock().expect("lock").push((p, kind.into()));
    }
}

/// A copy under rules that refuse some entries: each refused entry is told and counted and
/// the walk goes on (a directory that may not be listed copied empty, the entries of one
/// that may not be searched left out); what is copied is owned, moded and xattr'd as the
/// rules say; a refusal of the top changes nothing.
#[test]
fn a_copy_under_rules_leaves_out_what_they_refuse_and_goes_on() {
    let (dev, fs) = mem_fs_with(64 << 20, 4096);
    let src = fs.mkdir(ROOT, b"src", 0o755, ME).expect("mkdir").ino;
    let mk = |dir, name: &[u8], mode| fs.mkdir(dir, name, mode, ME).expect("mkdir").ino;
    let file = |dir, name: &[u8], mode, data: &[u8]| {
        let f = fs.create(dir, name, mode, ME).expect("create").ino;
        fs.write(f, 0, data).expect("write");
        f
    };
    let ok = file(src, b"ok", 0o4755, b"readable");
    fs.setxattr(ok, b"user.kept", b"1", 0).expect("setxattr");
    fs.setxattr(ok, b"trusted.dropped", b"2", 0)
        .expect("setxattr");
    file(src, b"secret", 0o200, b"unreadable");
    fs.mknod(src, b"dev", 0o020644, ME, 0x0801).expect("mknod");
    fs.mknod(src, b"fifo", 0o010644, ME, 0).expect("mkfifo");
    let closed = mk(src, b"closed", 0o755);
    file(closed, b"inside", 0o644, b"never listed");
    let blind = mk(src, b"blind", 0o755);
    file(blind, b"a", 0o644, b"listed, never looked at");
    file(blind, b"b", 0o644, b"listed, never looked at");
    let deep = mk(src, b"deep", 0o2755);
    let big = vec![7u8; 3 << 20];
    file(deep, b"big", 0o640, &big);
    fs.symlink(deep, b"link", b"../ok", ME).expect("symlink");
    // Its path is told from the names of the directories above it, siblings between.
    let inner = mk(deep, b"inner", 0o755);
    file(inner, b"hidden", 0o200, b"unreadable, two down");
    // The modes that refuse, last (the engine checks nothing itself).
    for (ino, mode) in [(closed, 0o311), (blind, 0o655)] {
        let set = SetAttr {
            mode: Some(mode),
            ..SetAttr::default()
        };
        fs.setattr(ino, &set).expect("chmod");
    }
    let rules = AsUser {
        refused: Default::default(),
    };
    let c = fs
        .copy_tree(ROOT, b"src", ROOT, b"copy", &rules, |_| {})
        .expect("copy_tree");
    let mut told = rules.refused.lock().expect("lock").clone();
    told.sort();
    let told: Vec<(&str, &str)> = told.iter().map(|t| (t.0.as_str(), t.1.as_str())).collect();
    assert_eq!(
        told,
        [
            ("blind/a", "EACCES"),
            ("blind/b", "EACCES"),
            ("closed", "EACCES"),
            ("deep/inner/hidden", "EACCES"),
            ("dev", "EPERM"),
            ("secret", "EACCES")
        ]
    );
    assert_eq!(c.refused, 6);
    assert_eq!((c.files, c.dirs), (4, 5), "{c:?}");
    assert_eq!(c.bytes, 8 + big.len() as u64);
    let copy = fs.lookup(ROOT, b"copy").expect("the copy").ino;
    let look = |path: &[&[u8]]| {
        let mut at = copy;
        for n in path {
            at = fs.lookup(at, n).map(|a| a.ino)?;
        }
        fs.getattr(at)
    };
    let ok2 = look(&[b"ok"]).expect("ok");
    assert_eq!((ok2.uid, ok2.gid, ok2.mode), (1000, 1000, 0o100755));
    assert_eq!(fs.read(ok2.ino, 0, 100).expect("read"), b"readable");
    assert_eq!(
        fs.listxattr(ok2.ino).expect("listxattr"),
        vec![b"user.kept".to_vec()]
    );
    assert!(matches!(look(&[b"secret"]), Err(Error::NotFound)));
    assert!(matches!(look(&[b"dev"]), Err(Error::NotFound)));
    assert_eq!(look(&[b"fifo"]).expect("fifo").mode, 0o010644);
    assert!(fs
        .list(look(&[b"closed"]).expect("closed").ino)
        .expect("list")
        .is_empty());
    assert!(fs
        .list(look(&[b"blind"]).expect("blind").ino)
        .expect("list")
        .is_empty());
    let deep2 = look(&[b"deep"]).expect("deep");
    assert_eq!((deep2.uid, deep2.mode), (1000, 0o040755));
    assert_eq!(
        fs.read(look(&[b"deep", b"big"]).expect("big").ino, 0, big.len())
            .expect("read"),
        big
    );
    assert_eq!(
        fs.readlink(look(&[b"deep", b"link"]).expect("link").ino)
            .expect("readlink"),
        b"../ok"
    );

    // The top refused: nothing made, the refusal is the copy's.
    let shut = fs.mkdir(ROOT, b"shut", 0o555, ME).expect("mkdir").ino;
    let before = tree(&fs, ROOT);
    let r = fs.copy_tree(src, b"secret", ROOT, b"s2", &rules, |_| {});
    assert!(matches!(r, Err(Error::Denied(_))), "{r:?}");
    let r = fs.copy_tree(src, b"dev", ROOT, b"d2", &rules, |_| {});
    assert!(matches!(r, Err(Error::NotPermitted(_))), "{r:?}");
    let r = fs.copy_tree(ROOT, b"src", shut, b"x", &rules, |_| {});
    assert!(
        matches!(r, Err(Error::Denied(_))),
        "a destination not writable: {r:?}"
    );
    same(&tree(&fs, ROOT), &before, "something was made");
    fs.close().expect("close");
    assert_clean(&dev);
}

/// A copy made with commits in its middle (after each directory): every crash prefix
/// opens fsck clean with the source whole and the copy, where there is one, a part of it;
/// the last is the whole copy.
#[test]
fn a_crash_at_every_write_prefix_of_a_copy_leaves_the_source_whole() {
    use idxfs_blockdev::Tear;
    let (mut rng, seed) = Rng::from_env("copy tree crash");
    let rec = recorded_with(32 << 20, Some([7; 16]));
    let o = opts();
    let fs = Fs::open(rec.clone(), o.clone()).expect("open");
    let src = fs.mkdir(ROOT, b"src", 0o755, ME).expect("mkdir").ino;
    let mut dirs = vec![src];
    for i in 0..120 {
        let d = dirs[rng.below(dirs.len() as u64) as usize];
        let name = format!("file-with-a-longer-name-{i}").into_bytes();
        if rng.chance(15) {
            dirs.push(fs.mkdir(d, &name, 0o750, ME).expect("mkdir").ino);
            continue;
        }
        let f = fs.create(d, &name, 0o640, ME).expect("create").ino;
        let len = [10usize, 5000, 40_000][rng.below(3) as usize];
        fs.write(f, 0, &rng.bytes(len)).expect("write");
        if rng.chance(30) {
            fs.setxattr(f, b"user.tag", &rng.bytes(300), 0)
                .expect("setxattr");
        }
    }
    fs.sync().expect("sync");
    let source = tree(&fs, src);
    let start = rec.event_count();
    fs.copy_tree(ROOT, b"src", ROOT, b"copy", &Unchecked, |_| {
        fs.sync().expect("sync")
    })
    .expect("copy");
    fs.sync().expect("sync");
    fs.close().expect("close");
    let end = rec.event_count();
    let (mut partial, mut whole) = (0, 0);
    for prefix in start..=end {
        let img = Arc::new(MemDevice::from_bytes(
            rec.crash_image(prefix, Tear::Drop(rng.next_u64())).bytes,
        ));
        assert_clean(&img);
        let f = Fs::open(img.clone(), o.clone()).expect("open");
        let at = format!("seed {seed} prefix {prefix} of {end}");
        same(
            &tree(&f, f.lookup(ROOT, b"src").expect("src").ino),
            &source,
            &at,
        );
        if let Ok(c) = f.lookup(ROOT, b"copy") {
            let copy = tree(&f, c.ino);
            if copy == source {
                whole += 1;
            } else {
                partial += 1;
            }
        }
        f.close().expect("close");
        assert_clean(&img);
    }
    let f = Fs::open(
        Arc::new(MemDevice::from_bytes(
            rec.crash_image(end, Tear::None).bytes,
        )),
        o,
    )
    .expect("open");
    let copy = f.lookup(ROOT, b"copy").expect("the copy").ino;
    same(
        &tree(&f, copy),
        &source,
        &format!("seed {seed}: the copy after the last write"),
    );
    eprintln!(
        "seed {seed}: {} prefixes, {partial} with part of the copy, {whole} with all",
        end - start + 1
    );
    assert!(partial > 0, "seed {seed}: no commit in the copy's middle");
}

/// A tree copied out of a snapshot opened beside the file system (`copy_tree_from`), after
/// the file system changed and then removed it: the copy is the tree of the snapshot's
/// moment, shares the snapshot's blocks (held ones become the file system's again), and
/// once the snapshot and everything are deleted every block is back and fsck is clean.
#[test]
fn a_tree_copied_out_of_a_snapshot_is_its_moment_and_shares_its_blocks() {
    let (mut rng, seed) = Rng::from_env("copy tree from a snapshot");
    let (dev, fs) = mem_fs_with(512 << 20, 4096);
    let out = fs.mkdir(ROOT, b"outside", 0o755, ME).expect("mkdir").ino;
    let free = free_blocks_with_roots_tree(&fs);
    let src = fs.mkdir(ROOT, b"src", 0o755, ME).expect("mkdir").ino;
    let made = make_tree(&fs, &mut rng, src, out);
    let moment = tree(&fs, src);
    let id = fs.snapshot(b"s").expect("snapshot");
    // Changed, then gone: what the snapshot names is held for it now.
    let mut files = Vec::new();
    for e in fs.list(src).expect("list") {
        if e.dtype == 8 {
            files.push(e.ino);
        }
    }
    for f in files.iter().take(5) {
        fs.write(*f, 0, b"changed after the snapshot")
            .expect("write");
    }
    fs.remove_tree(ROOT, b"src", &Unchecked, |_| {}, |_| {})
        .expect("rm");
    fs.sync().expect("sync");
    let before = fs.statfs().expect("statfs").blocks_free;

    let view = fs.open_snapshot(id, 16 << 20).expect("open the snapshot");
    let top = view.lookup(ROOT, b"src").expect("src in the snapshot").ino;
    let c = fs
        .copy_tree_from(&view, top, ROOT, b"restored", &Unchecked, |_| {})
        .unwrap_or_else(|e| panic!("seed {seed}: copy_tree_from: {e}"));
    assert_eq!((c.files, c.dirs), (made.files, made.dirs), "seed {seed}");
    let restored = fs.lookup(ROOT, b"restored").expect("restored").ino;
    same(
        &tree(&fs, restored),
        &moment,
        &format!("seed {seed}: the restored tree"),
    );
    fs.sync().expect("sync");
    let took = before - fs.statfs().expect("statfs").blocks_free;
    assert!(
        took * 4096 < made.data / 2,
        "seed {seed}: the restore took {took} blocks for {} bytes of data",
        made.data
    );
    // Anything but a view of this file system is refused before anything is made.
    let (_other_dev, other) = mem_fs_with(32 << 20, 4096);
    let r = fs.copy_tree_from(&other, ROOT, ROOT, b"foreign", &Unchecked, |_| {});
    assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
    assert!(matches!(fs.lookup(ROOT, b"foreign"), Err(Error::NotFound)));
    drop(view);
    fs.delete_snapshot(id).expect("delete the snapshot");
    fs.finish_drops().expect("drops");
    same(
        &tree(&fs, restored),
        &moment,
        &format!("seed {seed}: without its snapshot"),
    );

    // Across a remount, then everything gone: every block back.
    fs.close().expect("close");
    assert_clean(&dev);
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    let restored = fs.lookup(ROOT, b"restored").expect("restored").ino;
    same(
        &tree(&fs, restored),
        &moment,
        &format!("seed {seed}: remounted"),
    );
    all_back(fs, &dev, &[(ROOT, b"restored")], free, seed);
}
