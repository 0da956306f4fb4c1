//! POSIX ACLs through the library (`fs::acl`): inheritance at create, chmod and the access
//! ACL kept in step, setting an ACL setting the mode, `acl: false` refusing them, and all of
//! it surviving a remount with a clean fsck. The mount's side, against ext4, is
//! `cli/tests/mount_acl.rs`.
mod common;
use common::*;
use idxfs_engine::fs::{Acl, Fs, SetAttr, ACL_ACCESS, ACL_DEFAULT};
use idxfs_engine::{Error, OpenOptions};

const UNDEF: u32 = u32::MAX;
const USER_OBJ: u16 = 1;
const USER: u16 = 2;
const GROUP_OBJ: u16 = 4;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

/// u::rwx, u:1234:rw-, g::r-x, m::rw-, o::--x
fn extended() -> Vec<u8> {
    acl_xattr(&[
        (USER_OBJ, 7, UNDEF),
        (USER, 6, 1234),
        (GROUP_OBJ, 5, UNDEF),
        (MASK, 6, UNDEF),
        (OTHER, 1, UNDEF),
    ])
}

fn mode(fs: &Fs, ino: u64) -> u32 {
    fs.getattr(ino).expect("getattr").mode & 0o7777
}

fn perms(fs: &Fs, ino: u64, name: &[u8]) -> Option<Vec<(u16, u16)>> {
    match fs.getxattr(ino, name) {
        Ok(v) => {
            let a = Acl::parse(&v).expect("a stored ACL parses");
            Some(a.entries().iter().map(|e| (e.tag, e.perm)).collect())
        }
        Err(Error::NoData) => None,
        Err(e) => panic!("getxattr: {e:?}"),
    }
}

fn chmod(fs: &Fs, ino: u64, m: u32) {
    let set = SetAttr {
        mode: Some(m),
        ..Default::default()
    };
    fs.setattr(ino, &set).expect("chmod");
}

#[test]
fn new_inodes_inherit_the_default_acl_and_ignore_the_umask() {
    let (dev, fs) = mem_fs(64 << 20);
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir").ino;
    fs.setxattr(d, ACL_DEFAULT, &extended(), 0)
        .expect("set default");
    assert_eq!(mode(&fs, d), 0o755, "a default ACL leaves the mode");

    // A file asked for 0666 under umask 077: the ACL decides, the umask is ignored.
    let f = fs
        .mknod_umask(d, b"f", 0o100_666, ME, 0, 0o077)
        .expect("create")
        .ino;
    assert_eq!(mode(&fs, f), 0o660);
    assert_eq!(
        perms(&fs, f, ACL_ACCESS),
        Some(vec![
            (USER_OBJ, 6),
            (USER, 6),
            (GROUP_OBJ, 5),
            (MASK, 6),
            (OTHER, 0)
        ])
    );
    assert_eq!(perms(&fs, f, ACL_DEFAULT), None, "files get no default ACL");

    // A directory: both, its default the parent's unchanged.
    let sub = fs
        .mknod_umask(d, b"sub", 0o040_777, ME, 0, 0o022)
        .expect("mkdir")
        .ino;
    assert_eq!(mode(&fs, sub), 0o761);
    assert_eq!(fs.getxattr(sub, ACL_DEFAULT).expect("default"), extended());
    assert!(perms(&fs, sub, ACL_ACCESS).is_some());
    // ... and so its own children inherit in turn.
    let g = fs
        .mknod_umask(sub, b"g", 0o100_640, ME, 0, 0)
        .expect("create")
        .ino;
    assert_eq!(mode(&fs, g), 0o640);

    // A symlink gets nothing; an O_TMPFILE file inherits as a named one.
    let l = fs.symlink(d, b"l", b"f", ME).expect("symlink").ino;
    assert_eq!(perms(&fs, l, ACL_ACCESS), None);
    let t = fs.tmpfile_umask(d, 0o600, ME, 0o077).expect("tmpfile").ino;
    assert_eq!(mode(&fs, t), 0o600);
    assert_eq!(
        perms(&fs, t, ACL_ACCESS).map(|p| p[3]),
        Some((MASK, 0)),
        "the mask cut to the group bits asked for"
    );
    fs.unpin(t, 1).expect("unpin");

    // Outside it: the umask, and no ACL.
    let plain = fs
        .mknod_umask(ROOT, b"plain", 0o100_666, ME, 0, 0o027)
        .expect("create")
        .ino;
    assert_eq!(mode(&fs, plain), 0o640);
    assert_eq!(perms(&fs, plain, ACL_ACCESS), None);

    // A minimal default ACL gives a mode and no access ACL.
    let minimal = acl_xattr(&[
        (USER_OBJ, 7, UNDEF),
        (GROUP_OBJ, 5, UNDEF),
        (OTHER, 0, UNDEF),
    ]);
    let m = fs.mkdir(ROOT, b"m", 0o755, ME).expect("mkdir").ino;
    fs.setxattr(m, ACL_DEFAULT, &minimal, 0).expect("default");
    let mf = fs
        .mknod_umask(m, b"f", 0o100_666, ME, 0, 0)
        .expect("create")
        .ino;
    assert_eq!(mode(&fs, mf), 0o640);
    assert_eq!(perms(&fs, mf, ACL_ACCESS), None);

    // All of it is on disk.
    drop(fs);
    assert_clean(&dev);
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    assert_eq!(mode(&fs, f), 0o660);
    assert_eq!(fs.getxattr(sub, ACL_DEFAULT).expect("default"), extended());
    assert_eq!(perms(&fs, f, ACL_ACCESS).map(|p| p.len()), Some(5));
}

#[test]
fn chmod_and_the_access_acl_follow_each_other() {
    let (dev, fs) = mem_fs(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.setxattr(f, ACL_ACCESS, &extended(), 0).expect("set");
    assert_eq!(mode(&fs, f), 0o761, "the mask stands for the group bits");

    // chmod g=r: the mask changes, the owning group's entry does not.
    chmod(&fs, f, 0o740);
    assert_eq!(
        perms(&fs, f, ACL_ACCESS),
        Some(vec![
            (USER_OBJ, 7),
            (USER, 6),
            (GROUP_OBJ, 5),
            (MASK, 4),
            (OTHER, 0)
        ])
    );

    // An ACL the mode says in full is the mode: the stored one goes.
    let minimal = acl_xattr(&[
        (USER_OBJ, 6, UNDEF),
        (GROUP_OBJ, 0, UNDEF),
        (OTHER, 4, UNDEF),
    ]);
    fs.setxattr(f, ACL_ACCESS, &minimal, 0)
        .expect("set minimal");
    assert_eq!(mode(&fs, f), 0o604);
    assert_eq!(perms(&fs, f, ACL_ACCESS), None);
    assert!(!fs
        .listxattr(f)
        .expect("list")
        .iter()
        .any(|n| n == ACL_ACCESS));

    // Setting one keeps set-user-ID, and drops set-group-ID when the caller says so.
    chmod(&fs, f, 0o6644);
    fs.setxattr_with(f, ACL_ACCESS, &extended(), 0, false)
        .expect("set");
    assert_eq!(mode(&fs, f), 0o6761);
    fs.setxattr_with(f, ACL_ACCESS, &extended(), 0, true)
        .expect("set");
    assert_eq!(mode(&fs, f), 0o4761);

    // Removing the ACL leaves the mode.
    fs.removexattr(f, ACL_ACCESS).expect("remove");
    assert_eq!(mode(&fs, f), 0o4761);
    // ... and removing one that is not there succeeds, as on ext4; other names do not.
    fs.removexattr(f, ACL_ACCESS).expect("remove again");
    fs.removexattr(f, ACL_DEFAULT)
        .expect("remove a default of a file");
    assert!(matches!(
        fs.removexattr(f, b"user.none"),
        Err(Error::NoData)
    ));
    drop(fs);
    assert_clean(&dev);
}

#[test]
fn bad_acls_are_refused_and_change_nothing() {
    let (_dev, fs) = mem_fs(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    // No mask with a named entry; a default ACL on a file.
    let no_mask = acl_xattr(&[
        (USER_OBJ, 7, UNDEF),
        (USER, 6, 1234),
        (GROUP_OBJ, 5, UNDEF),
        (OTHER, 1, UNDEF),
    ]);
    for (name, value) in [
        (ACL_ACCESS, &no_mask[..]),
        (ACL_ACCESS, &b"junk"[..]),
        (ACL_DEFAULT, &extended()[..]),
    ] {
        match fs.setxattr(f, name, value, 0) {
            Err(Error::Invalid(_)) => {}
            r => panic!("{:?}: {r:?}", String::from_utf8_lossy(name)),
        }
    }
    assert_eq!(mode(&fs, f), 0o644);
    assert!(fs.listxattr(f).expect("list").is_empty());
}

#[test]
fn with_acls_off_the_names_are_refused_and_nothing_is_inherited() {
    let (dev, fs) = mem_fs(64 << 20);
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir").ino;
    fs.setxattr(d, ACL_DEFAULT, &extended(), 0)
        .expect("default");
    let kept = fs.create(ROOT, b"kept", 0o644, ME).expect("create").ino;
    fs.setxattr(kept, ACL_ACCESS, &extended(), 0)
        .expect("access");
    drop(fs);
    let off = OpenOptions {
        acl: false,
        ..opts()
    };
    let fs = Fs::open(dev.clone(), off).expect("open noacl");
    let f = fs
        .mknod_umask(d, b"f", 0o100_666, ME, 0, 0o022)
        .expect("create")
        .ino;
    assert_eq!(mode(&fs, f), 0o644, "the umask, as if no default ACL");
    for r in [
        fs.getxattr(d, ACL_DEFAULT).map(drop),
        fs.setxattr(f, ACL_ACCESS, &extended(), 0),
        fs.removexattr(d, ACL_DEFAULT),
    ] {
        assert!(matches!(r, Err(Error::NotSupported(_))), "{r:?}");
    }
    assert!(fs.listxattr(d).expect("list").is_empty(), "listed by none");
    chmod(&fs, d, 0o700);
    // A chmod still keeps an access ACL kept from before in step with the mode.
    chmod(&fs, kept, 0o640);
    drop(fs);
    assert_clean(&dev);
    // Kept all along: on again, the directory still has it, untouched by the chmod.
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    assert_eq!(fs.getxattr(d, ACL_DEFAULT).expect("kept"), extended());
    assert_eq!(
        perms(&fs, kept, ACL_ACCESS).map(|p| (p[0], p[3], p[4])),
        Some(((USER_OBJ, 6), (MASK, 4), (OTHER, 0)))
    );
    drop(fs);
    assert_clean(&dev);
}

#[test]
fn a_create_too_big_for_the_space_left_changes_nothing() {
    // A directory whose default ACL is long enough to be stored in chunks, on a small
    // device filled up: a create inheriting it either succeeds whole or fails with ENOSPC
    // before any change (no inode without its ACL, no entry without its inode).
    let (dev, fs) = mem_fs(8 << 20);
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir").ino;
    let mut entries = vec![(USER_OBJ, 7, UNDEF)];
    entries.extend((0..3000).map(|i| (USER, 6, 10_000 + i)));
    entries.extend([(GROUP_OBJ, 5, UNDEF), (MASK, 7, UNDEF), (OTHER, 0, UNDEF)]);
    let big = acl_xattr(&entries);
    fs.setxattr(d, ACL_DEFAULT, &big, 0).expect("default");
    let mut made = 0u32;
    loop {
        match fs.mknod_umask(d, format!("f{made}").as_bytes(), 0o100_644, ME, 0, 0) {
            Ok(a) => {
                assert_eq!(
                    fs.getxattr(a.ino, ACL_ACCESS).expect("inherited").len(),
                    big.len()
                );
                made += 1;
            }
            Err(Error::NoSpace) => break,
            Err(e) => panic!("create {made}: {e:?}"),
        }
        assert!(made < 100_000, "the device never filled");
    }
    assert!(made > 0, "not one create fit");
    assert!(fs.lookup(d, format!("f{made}").as_bytes()).is_err());
    assert_eq!(fs.getattr(d).expect("dir").size, u64::from(made));
    drop(fs);
    assert_clean(&dev);
}

#[test]
fn a_new_directory_keeps_both_acls_when_their_names_share_an_item() {
    // A name hash under which every name collides: both ACLs of a new directory go in one
    // xattr item, each written after the other.
    fn one(_: &[u8]) -> u64 {
        42
    }
    let dev = std::sync::Arc::new(idxfs_blockdev::MemDevice::new(64 << 20));
    Fs::mkfs(dev.clone(), &idxfs_engine::MkfsOptions::default()).expect("mkfs");
    let o = OpenOptions {
        name_hash: one,
        ..opts()
    };
    let fs = Fs::open(dev.clone(), o).expect("open");
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir").ino;
    fs.setxattr(d, ACL_DEFAULT, &extended(), 0)
        .expect("default");
    let sub = fs
        .mknod_umask(d, b"sub", 0o040_777, ME, 0, 0)
        .expect("mkdir")
        .ino;
    assert_eq!(fs.getxattr(sub, ACL_DEFAULT).expect("default"), extended());
    assert!(perms(&fs, sub, ACL_ACCESS).is_some(), "access ACL kept too");
    drop(fs);
    assert_clean_with(&dev, one);
}
