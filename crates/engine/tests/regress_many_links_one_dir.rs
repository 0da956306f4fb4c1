//! Regression: all names of one inode in one directory shared one back-reference item, whose
//! overflow was found only after both directory indexes had changed. The 17th hard link with
//! a 250-byte name got ENOSPC, left the operation half-applied, and stopped the file system
//! (every later write EROFS, the last seconds of everyone's work lost). Names past the item's
//! room now take extended references, up to LINK_MAX.
mod common;
use common::*;
use idxfs_engine::fs::LINK_MAX;
use idxfs_engine::{Error, Fs};

fn long_name(i: usize) -> Vec<u8> {
    let mut n = format!("{i:06}-").into_bytes();
    n.resize(250, b'x');
    n
}

#[test]
fn many_long_names_of_one_inode_in_one_directory() {
    let (dev, fs) = mem_fs(256 << 20);
    let f = fs.create(ROOT, &long_name(0), 0o644, ME).expect("create");
    fs.write(f.ino, 0, b"data").expect("write");
    for i in 1..200 {
        fs.link(f.ino, ROOT, &long_name(i))
            .unwrap_or_else(|e| panic!("link {i}: {e}"));
    }
    assert!(fs.failure().is_none());
    assert_eq!(fs.getattr(f.ino).expect("getattr").nlink, 200);
    // Everyone else can still write.
    let g = fs.create(ROOT, b"other", 0o644, ME).expect("create");
    fs.write(g.ino, 0, b"still writable").expect("write");
    // Every name resolves, lists, and unlinks; renames move names in and out of the
    // extended references.
    assert_eq!(fs.list(ROOT).expect("list").len(), 201);
    for i in (0..200).step_by(7) {
        let to = format!("renamed-{i}").into_bytes();
        fs.rename(ROOT, &long_name(i), ROOT, &to, 0)
            .expect("rename");
        fs.rename(ROOT, &to, ROOT, &long_name(i), 0)
            .expect("rename back");
    }
    fs.sync().expect("sync");
    assert_clean(&dev);
    for i in (0..200).rev() {
        assert_eq!(fs.lookup(ROOT, &long_name(i)).expect("lookup").ino, f.ino);
        fs.unlink(ROOT, &long_name(i)).expect("unlink");
    }
    assert!(matches!(
        fs.lookup(ROOT, &long_name(3)),
        Err(Error::NotFound)
    ));
    fs.close().expect("close");
    assert_clean(&dev);
}

#[test]
fn link_max_links_in_one_directory() {
    let (dev, fs) = mem_fs(1 << 30);
    let f = fs.create(ROOT, &long_name(0), 0o644, ME).expect("create");
    for i in 1..LINK_MAX as usize {
        fs.link(f.ino, ROOT, &long_name(i))
            .unwrap_or_else(|e| panic!("link {i}: {e}"));
    }
    assert!(matches!(
        fs.link(f.ino, ROOT, b"one-too-many"),
        Err(Error::TooManyLinks)
    ));
    assert!(fs.failure().is_none());
    fs.close().expect("close");
    assert_clean(&dev);
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    assert_eq!(fs.getattr(f.ino).expect("getattr").nlink, LINK_MAX);
    for i in 0..LINK_MAX as usize {
        fs.unlink(ROOT, &long_name(i)).expect("unlink");
    }
    assert!(matches!(fs.getattr(f.ino), Err(Error::NotFound)));
    fs.close().expect("close");
    assert_clean(&dev);
}
