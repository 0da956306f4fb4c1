//! The library API behaves as POSIX says, and survives close/open with fsck clean.
mod common;
use common::*;
use idxfs_engine::fs::{
    SetAttr, SetTime, Time, RENAME_EXCHANGE, RENAME_NOREPLACE, XATTR_CREATE, XATTR_REPLACE,
};
use idxfs_engine::{Error, Fs};

#[test]
fn create_lookup_write_read_persist() {
    let (dev, fs) = mem_fs(64 << 20);
    let d = fs.mkdir(ROOT, b"dir", 0o755, ME).expect("mkdir");
    let f = fs.create(d.ino, b"file", 0o644, ME).expect("create");
    assert!(f.ino > d.ino, "inode numbers increase");
    assert_eq!(fs.lookup(d.ino, b"file").expect("lookup").ino, f.ino);
    assert!(matches!(fs.lookup(d.ino, b"nope"), Err(Error::NotFound)));
    assert!(matches!(
        fs.create(d.ino, b"file", 0o644, ME),
        Err(Error::Exists)
    ));
    assert!(matches!(
        fs.create(d.ino, &[b'x'; 256], 0o644, ME),
        Err(Error::NameTooLong)
    ));
    // Not UTF-8 is a valid name.
    fs.create(d.ino, &[0xff, 0xfe, b'a'], 0o644, ME)
        .expect("non-utf8 name");
    // Small (inline) then large (extents) data, with overwrite in the middle.
    fs.write(f.ino, 0, b"hello").expect("write");
    assert_eq!(fs.read(f.ino, 0, 100).expect("read"), b"hello");
    let big: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    fs.write(f.ino, 3, &big).expect("write big");
    let mut want = b"hel".to_vec();
    want.extend_from_slice(&big);
    assert_eq!(fs.read(f.ino, 0, 200_000).expect("read"), want);
    fs.write(f.ino, 5000, b"XYZ").expect("overwrite");
    want[5000..5003].copy_from_slice(b"XYZ");
    assert_eq!(fs.read(f.ino, 0, 200_000).expect("read"), want);
    // Sparse write past the end leaves a hole of zeros.
    fs.write(f.ino, 300_000, b"end").expect("sparse");
    want.resize(300_000, 0);
    want.extend_from_slice(b"end");
    assert_eq!(fs.read(f.ino, 0, 400_000).expect("read"), want);
    fs.close().expect("close");
    assert_clean(&dev);
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    assert_eq!(fs.read(f.ino, 0, 400_000).expect("read"), want);
    assert_eq!(fs.getattr(f.ino).expect("attr").size, 300_003);
    fs.close().expect("close");
}

#[test]
fn truncate_unlink_rmdir_free_everything() {
    let (dev, fs) = mem_fs(64 << 20);
    let base = fs.statfs().expect("statfs").blocks_free;
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir");
    let f = fs.create(d.ino, b"f", 0o644, ME).expect("create");
    fs.write(f.ino, 0, &vec![1u8; 1 << 20]).expect("write");
    fs.truncate(f.ino, 5000).expect("truncate");
    assert_eq!(fs.read(f.ino, 0, 1 << 20).expect("read"), vec![1u8; 5000]);
    fs.truncate(f.ino, 10000).expect("extend");
    let r = fs.read(f.ino, 0, 1 << 20).expect("read");
    assert_eq!(&r[..5000], &vec![1u8; 5000][..]);
    assert!(
        r[5000..].iter().all(|b| *b == 0),
        "extended region reads zeros"
    );
    assert!(matches!(fs.rmdir(ROOT, b"d"), Err(Error::NotEmpty)));
    assert!(matches!(fs.unlink(ROOT, b"d"), Err(Error::IsDir)));
    assert!(matches!(fs.rmdir(d.ino, b"f"), Err(Error::NotDir)));
    fs.unlink(d.ino, b"f").expect("unlink");
    fs.rmdir(ROOT, b"d").expect("rmdir");
    assert_eq!(fs.getattr(ROOT).expect("root").nlink, 2);
    fs.sync().expect("sync");
    fs.sync().expect("sync twice, so pinned blocks come back");
    // Metadata nodes may sit elsewhere, but nothing leaks: within a few nodes of the start.
    let now = fs.statfs().expect("statfs").blocks_free;
    assert!(
        base - now <= 16,
        "space leak: {base} free before, {now} after"
    );
    fs.close().expect("close");
    assert_clean(&dev);
}

#[test]
fn rename_variants() {
    let (dev, fs) = mem_fs(64 << 20);
    let a = fs.mkdir(ROOT, b"a", 0o755, ME).expect("a");
    let b = fs.mkdir(ROOT, b"b", 0o755, ME).expect("b");
    let x = fs.create(a.ino, b"x", 0o644, ME).expect("x");
    let y = fs.create(b.ino, b"y", 0o644, ME).expect("y");
    fs.rename(a.ino, b"x", b.ino, b"y", RENAME_NOREPLACE)
        .expect_err("noreplace");
    fs.rename(a.ino, b"x", b.ino, b"y", RENAME_EXCHANGE)
        .expect("exchange");
    assert_eq!(fs.lookup(a.ino, b"x").expect("x").ino, y.ino);
    assert_eq!(fs.lookup(b.ino, b"y").expect("y").ino, x.ino);
    fs.rename(a.ino, b"x", b.ino, b"y", 0).expect("replace");
    assert!(matches!(fs.lookup(a.ino, b"x"), Err(Error::NotFound)));
    assert_eq!(fs.lookup(b.ino, b"y").expect("y").ino, y.ino);
    assert!(
        matches!(fs.getattr(x.ino), Err(Error::NotFound)),
        "replaced inode is gone"
    );
    // Directory into its own subtree.
    let c = fs.mkdir(a.ino, b"c", 0o755, ME).expect("c");
    assert!(matches!(
        fs.rename(ROOT, b"a", c.ino, b"a2", 0),
        Err(Error::Invalid(_))
    ));
    // Move a directory: link counts follow.
    fs.rename(a.ino, b"c", b.ino, b"c", 0).expect("move dir");
    assert_eq!(fs.getattr(a.ino).expect("a").nlink, 2);
    assert_eq!(fs.getattr(b.ino).expect("b").nlink, 3);
    assert_eq!(fs.lookup(c.ino, b"..").expect("..").ino, b.ino);
    // Exchange a file and a directory across parents.
    let f = fs.create(a.ino, b"f", 0o644, ME).expect("f");
    fs.rename(a.ino, b"f", b.ino, b"c", RENAME_EXCHANGE)
        .expect("exchange file/dir");
    assert_eq!(fs.getattr(a.ino).expect("a").nlink, 3);
    assert_eq!(fs.getattr(b.ino).expect("b").nlink, 2);
    assert_eq!(fs.lookup(b.ino, b"c").expect("c").ino, f.ino);
    // Replace an empty directory; refuse a non-empty one.
    let e = fs.mkdir(ROOT, b"e", 0o755, ME).expect("e");
    fs.rename(a.ino, b"f", ROOT, b"e", 0)
        .expect("dir over empty dir");
    assert!(matches!(fs.getattr(e.ino), Err(Error::NotFound)));
    fs.close().expect("close");
    assert_clean(&dev);
}

#[test]
fn hard_links_symlinks_xattrs_setattr() {
    let (dev, fs) = mem_fs(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("f");
    fs.link(f.ino, ROOT, b"g").expect("link");
    fs.link(f.ino, ROOT, b"h").expect("link");
    assert_eq!(fs.getattr(f.ino).expect("f").nlink, 3);
    fs.unlink(ROOT, b"f").expect("unlink");
    assert_eq!(fs.getattr(f.ino).expect("f").nlink, 2);
    let names: Vec<Vec<u8>> = fs
        .list(ROOT)
        .expect("list")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names.len(), 2);
    let s = fs.symlink(ROOT, b"s", b"/some/where", ME).expect("symlink");
    assert_eq!(fs.readlink(s.ino).expect("readlink"), b"/some/where");
    fs.setxattr(f.ino, b"user.a", b"1", 0).expect("setxattr");
    assert!(matches!(
        fs.setxattr(f.ino, b"user.a", b"2", XATTR_CREATE),
        Err(Error::Exists)
    ));
    assert!(matches!(
        fs.setxattr(f.ino, b"user.b", b"2", XATTR_REPLACE),
        Err(Error::NoData)
    ));
    fs.setxattr(f.ino, b"user.a", b"22", XATTR_REPLACE)
        .expect("replace");
    assert_eq!(fs.getxattr(f.ino, b"user.a").expect("get"), b"22");
    assert_eq!(fs.listxattr(f.ino).expect("list"), vec![b"user.a".to_vec()]);
    fs.removexattr(f.ino, b"user.a").expect("remove");
    assert!(matches!(fs.getxattr(f.ino, b"user.a"), Err(Error::NoData)));
    let t = Time {
        sec: 1234567890,
        nsec: 123456789,
    };
    let a = fs
        .setattr(
            f.ino,
            &SetAttr {
                mode: Some(0o600),
                uid: Some(5),
                gid: Some(6),
                mtime: Some(SetTime::At(t)),
                atime: Some(SetTime::At(t)),
                ..Default::default()
            },
        )
        .expect("setattr");
    assert_eq!(
        (a.mode & 0o7777, a.uid, a.gid, a.mtime, a.atime),
        (0o600, 5, 6, t, t)
    );
    fs.close().expect("close");
    assert_clean(&dev);
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    let a2 = fs.getattr(f.ino).expect("attr");
    assert_eq!(a2.mtime, t, "nanosecond times persist");
    fs.close().expect("close");
}

#[test]
fn readdir_is_in_inode_order_and_resumable() {
    let (dev, fs) = mem_fs(64 << 20);
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("d");
    for i in 0..3000 {
        fs.create(d.ino, format!("file-{i:05}").as_bytes(), 0o644, ME)
            .expect("create");
    }
    let all = fs.list(d.ino).expect("list");
    assert_eq!(all.len(), 3000);
    assert!(
        all.windows(2).all(|w| w[0].ino < w[1].ino),
        "readdir returns inode order"
    );
    // Resume from every 97th cookie while deleting entries already returned.
    let mut seen = Vec::new();
    let mut cookie = 0;
    loop {
        let mut batch = Vec::new();
        fs.readdir(d.ino, cookie, |e| {
            batch.push(e.clone());
            batch.len() < 97
        })
        .expect("readdir");
        if batch.is_empty() {
            break;
        }
        cookie = batch.last().map(|e| e.cookie).unwrap_or(0);
        for e in &batch {
            if e.name != b"." && e.name != b".." {
                fs.unlink(d.ino, &e.name).expect("unlink seen");
                seen.push(e.ino);
            }
        }
    }
    assert_eq!(seen.len(), 3000, "every entry exactly once");
    fs.rmdir(ROOT, b"d").expect("rmdir emptied");
    fs.close().expect("close");
    assert_clean(&dev);
}

/// The check that a directory does not move below itself walks up through parents that the
/// inode cache remembers (`dir_parents`): every rename that moves a directory, an exchange
/// of two, and an rmdir whose inode number comes back must make it forget, or a later
/// rename would make a cycle. Each refusal below needs the parents as they are now.
#[test]
fn renames_below_oneself_are_refused_after_the_tree_moved() {
    let (dev, fs) = mem_fs(64 << 20);
    let mk = |p: u64, n: &[u8]| fs.mkdir(p, n, 0o755, ME).expect("mkdir").ino;
    let refused = |p1: u64, n1: &[u8], p2: u64, n2: &[u8], flags: u32| {
        matches!(fs.rename(p1, n1, p2, n2, flags), Err(Error::Invalid(_)))
    };
    // a/b/c and d/e; walks from c and e remember their parents.
    let (a, d) = (mk(ROOT, b"a"), mk(ROOT, b"d"));
    let (b, e) = (mk(a, b"b"), mk(d, b"e"));
    let c = mk(b, b"c");
    assert!(refused(ROOT, b"a", c, b"x", 0));
    assert!(refused(ROOT, b"d", e, b"x", 0));
    // b moves under d: d/b/c. d may no longer go under c.
    fs.rename(a, b"b", d, b"b", 0).expect("move b");
    assert!(refused(ROOT, b"d", c, b"x", 0));
    // An exchange: d/e <-> a (so a sits at d/e, e at the root as "a"): d may not go under a.
    fs.rename(d, b"e", ROOT, b"a", RENAME_EXCHANGE)
        .expect("exchange");
    assert!(refused(ROOT, b"d", a, b"x", 0));
    assert!(!refused(ROOT, b"a", a, b"e2", 0), "e moves under a");
    // Directories removed and made again, maybe with the same numbers: the new ones' parents.
    fs.rmdir(b, b"c").expect("rmdir c");
    fs.rmdir(d, b"b").expect("rmdir b");
    let b2 = mk(ROOT, b"b2");
    let c2 = mk(b2, b"c2");
    assert!(refused(ROOT, b"b2", c2, b"x", 0));
    assert!(!refused(ROOT, b"d", c2, b"d", 0), "d is no ancestor of c2");
    assert!(refused(c2, b"d", a, b"x", 0));
    fs.close().expect("close");
    assert_clean(&dev);
}
