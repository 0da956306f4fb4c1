//! `idxfs mkfs --from DIR IMAGE` and `idxfs import DIR MOUNT/PATH` against their reference,
//! the source tree itself: a tree of every kind of entry (and a seeded random one) is copied,
//! the image checked by fsck and mounted, and every entry's type, mode, owner, size, link
//! count, device number, three times, xattrs (ACLs included), data or target, and which names
//! share an inode, read back through the kernel and compared with what `lstat` and friends
//! said of the source before the copy. Then what must fail does, with one line, removing an
//! image it made and leaving one that was there clean; an import into a mount frees all it
//! made once removed, and is refused to other users. `idxfs cp` inside a mount is compared
//! the same way, with an imported copy of the tree as its source.
mod common;

use common::{idxfs, shm_tempdir, used_bytes, Mounted};
use idxfs_engine::testutil::Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Every entry by path, and the groups of paths that share an inode.
type Tree = (BTreeMap<Vec<u8>, Entry>, BTreeSet<BTreeSet<Vec<u8>>>);

/// What the comparison reads of one entry.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    mode: u32,
    uid: u32,
    gid: u32,
    /// None for directories, whose size each file system counts its own way.
    size: Option<u64>,
    nlink: u64,
    rdev: u64,
    atime: (i64, i64),
    mtime: (i64, i64),
    ctime: (i64, i64),
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// A file's bytes or a symlink's target.
    data: Option<Vec<u8>>,
}

/// What differs between `have` and `want`, without their bytes.
fn differs(have: Option<&Entry>, want: &Entry) -> String {
    let Some(h) = have else {
        return "missing".into();
    };
    let show =
        |e: &Entry| {
            format!(
            "mode {:o} owner {}:{} size {:?} nlink {} rdev {} atime {:?} mtime {:?} ctime {:?} \
             xattrs {:?} data {}",
            e.mode,
            e.uid,
            e.gid,
            e.size,
            e.nlink,
            e.rdev,
            e.atime,
            e.mtime,
            e.ctime,
            e.xattrs.keys().map(|k| String::from_utf8_lossy(k)).collect::<Vec<_>>(),
            if h.data == want.data { "same" } else { "differs" }
        )
        };
    format!("have {}, want {}", show(h), show(want))
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL")
}

/// Every xattr of `p`, not following a symlink.
fn xattrs(p: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let c = cpath(p);
    let mut list = vec![0u8; 64 << 10];
    // SAFETY: valid path and buffer.
    let n = unsafe { libc::llistxattr(c.as_ptr(), list.as_mut_ptr().cast(), list.len()) };
    assert!(
        n >= 0,
        "llistxattr {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    let mut out = BTreeMap::new();
    for name in list[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        let cn = CString::new(name).expect("no NUL");
        let mut v = vec![0u8; 64 << 10];
        // SAFETY: as above.
        let m = unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(
            m >= 0,
            "lgetxattr {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
        v.truncate(m as usize);
        out.insert(name.to_vec(), v);
    }
    out
}

/// Every entry under `root` (itself as ""), by path, and the groups of paths that share an
/// inode. Reads without moving atimes (O_NOATIME; root may).
fn snapshot(root: &Path) -> Tree {
    let mut out = BTreeMap::new();
    let mut by_ino: BTreeMap<u64, BTreeSet<Vec<u8>>> = BTreeMap::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let p = root.join(&rel);
        let m = std::fs::symlink_metadata(&p).expect("lstat");
        let ft = m.file_type();
        let data = if ft.is_file() {
            let mut f = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOATIME)
                .open(&p)
                .expect("open");
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut f, &mut v).expect("read");
            Some(v)
        } else if ft.is_symlink() {
            Some(
                std::fs::read_link(&p)
                    .expect("readlink")
                    .as_os_str()
                    .as_bytes()
                    .to_vec(),
            )
        } else {
            None
        };
        if ft.is_dir() {
            for name in list_noatime(&p) {
                todo.push(rel.join(name));
            }
        }
        let key = rel.as_os_str().as_bytes().to_vec();
        by_ino.entry(m.ino()).or_default().insert(key.clone());
        out.insert(
            key,
            Entry {
                mode: m.mode(),
                uid: m.uid(),
                gid: m.gid(),
                size: (!ft.is_dir()).then_some(m.size()),
                nlink: m.nlink(),
                rdev: m.rdev(),
                atime: (m.atime(), m.atime_nsec()),
                mtime: (m.mtime(), m.mtime_nsec()),
                ctime: (m.ctime(), m.ctime_nsec()),
                xattrs: xattrs(&p),
                data,
            },
        );
    }
    let groups = by_ino.into_values().filter(|g| g.len() > 1).collect();
    (out, groups)
}

/// The names in directory `p`, read without moving its atime (O_NOATIME).
fn list_noatime(p: &Path) -> Vec<std::ffi::OsString> {
    let c = cpath(p);
    // SAFETY: a valid path; the descriptor goes to fdopendir, which closedir closes.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOATIME,
        )
    };
    assert!(
        fd >= 0,
        "open {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    // SAFETY: an open directory descriptor.
    let d = unsafe { libc::fdopendir(fd) };
    assert!(!d.is_null(), "fdopendir {}", p.display());
    let mut names = Vec::new();
    loop {
        // SAFETY: a directory stream we opened; the entry is read before the next call.
        let e = unsafe { libc::readdir(d) };
        if e.is_null() {
            break;
        }
        // SAFETY: d_name is NUL-terminated.
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) }.to_bytes();
        if name != b"." && name != b".." {
            names.push(OsStr::from_bytes(name).to_os_string());
        }
    }
    // SAFETY: the stream opened above, closed once.
    unsafe { libc::closedir(d) };
    names
}

/// Sets atime and mtime of `p` (not following a symlink).
fn set_times(p: &Path, a: (i64, i64), m: (i64, i64)) {
    let ts = [
        libc::timespec {
            tv_sec: a.0,
            tv_nsec: a.1,
        },
        libc::timespec {
            tv_sec: m.0,
            tv_nsec: m.1,
        },
    ];
    // SAFETY: a valid path and two timespecs.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            cpath(p).as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(
        r,
        0,
        "utimensat {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

fn mknod(p: &Path, mode: u32, dev: u64) {
    // SAFETY: a valid path.
    let r = unsafe { libc::mknod(cpath(p).as_ptr(), mode, dev) };
    assert_eq!(
        r,
        0,
        "mknod {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

/// A POSIX ACL xattr value: (tag, perm, id) entries after the version.
fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

const NO_ID: u32 = u32::MAX;

/// A tree with every kind of entry and attribute `mkfs --from` promises to keep.
fn every_kind(src: &Path) {
    let p = |r: &str| src.join(r);
    for d in ["a", "a/b", "a/b/c", "big", "acl", "acl/inherits", "modes"] {
        std::fs::create_dir(p(d)).expect("mkdir");
    }
    // Sizes around the inline limit, a block, the copy's 1 MiB chunk, and larger.
    for (i, n) in [
        0usize,
        1,
        100,
        2047,
        4095,
        4096,
        4097,
        65539,
        (1 << 20) + 5,
        3 << 20,
    ]
    .into_iter()
    .enumerate()
    {
        let bytes: Vec<u8> = (0..n).map(|k| (k * 31 + i * 7 + k / 4096) as u8).collect();
        std::fs::write(p(&format!("a/size{n}")), bytes).expect("write");
    }
    // Holes: data in the middle and at the end of a hole, a trailing hole, all hole.
    let f = std::fs::File::create(p("a/sparse")).expect("create");
    std::os::unix::fs::FileExt::write_at(&f, b"middle", 5_000_000).expect("write");
    std::os::unix::fs::FileExt::write_at(&f, &[7u8; 5000], 9_000_000).expect("write");
    f.set_len(16 << 20).expect("set_len");
    std::fs::File::create(p("a/b/allhole"))
        .expect("create")
        .set_len(64 << 20)
        .expect("set_len");
    // Symlinks: short, long (a block of its own), dangling.
    std::os::unix::fs::symlink("../size100", p("a/b/short")).expect("symlink");
    std::os::unix::fs::symlink("x".repeat(4000), p("a/long")).expect("symlink");
    std::os::unix::fs::symlink("/nowhere/at/all", p("dangling")).expect("symlink");
    // Hard links: two names in one directory, three across directories, a linked symlink,
    // a linked fifo.
    std::fs::hard_link(p("a/size1"), p("a/size1-again")).expect("link");
    std::fs::hard_link(p("a/size4097"), p("a/b/c/third")).expect("link");
    std::fs::hard_link(p("a/size4097"), p("big/fourth")).expect("link");
    // SAFETY: valid paths; linkat without AT_SYMLINK_FOLLOW links the symlink itself.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            cpath(&p("a/b/short")).as_ptr(),
            libc::AT_FDCWD,
            cpath(&p("short-linked")).as_ptr(),
            0,
        )
    };
    assert_eq!(r, 0, "linkat: {}", std::io::Error::last_os_error());
    mknod(&p("fifo"), libc::S_IFIFO | 0o640, 0);
    std::fs::hard_link(p("fifo"), p("a/fifo-linked")).expect("link");
    // Devices and a socket.
    mknod(&p("null"), libc::S_IFCHR | 0o666, libc::makedev(1, 3));
    mknod(&p("loop7"), libc::S_IFBLK | 0o660, libc::makedev(7, 7));
    drop(std::os::unix::net::UnixListener::bind(p("sock")).expect("bind"));
    // Modes, owners.
    for (name, mode) in [
        ("suid", 0o4755),
        ("sgid", 0o2750),
        ("sgid-lock", 0o2640),
        ("none", 0),
    ] {
        let f = p(&format!("modes/{name}"));
        std::fs::write(&f, name).expect("write");
        std::os::unix::fs::lchown(&f, Some(1000), Some(100)).expect("chown");
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .expect("chmod");
    }
    std::fs::create_dir(p("modes/sticky")).expect("mkdir");
    std::fs::set_permissions(
        p("modes/sticky"),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .expect("chmod");
    std::fs::create_dir(p("modes/sgid-dir")).expect("mkdir");
    std::fs::set_permissions(
        p("modes/sgid-dir"),
        std::os::unix::fs::PermissionsExt::from_mode(0o2775),
    )
    .expect("chmod");
    std::os::unix::fs::lchown(p("modes/sgid-dir"), Some(5), Some(60)).expect("chown");
    // Made after its directory is set-group-ID, so it took the directory's group; then
    // given one of its own, which the copy must keep.
    std::fs::write(p("modes/sgid-dir/own-group"), b"g").expect("write");
    std::os::unix::fs::lchown(p("modes/sgid-dir/own-group"), Some(7), Some(8)).expect("chown");
    std::os::unix::fs::lchown(p("dangling"), Some(33), Some(44)).expect("chown");
    // Names: not UTF-8, the longest allowed.
    std::fs::write(src.join(OsStr::from_bytes(b"caf\xe9-\xff")), b"latin-1").expect("write");
    std::fs::write(p(&"n".repeat(255)), b"long name").expect("write");
    // Xattrs of several sizes, and ACLs: an access ACL naming a user, a default ACL whose
    // children (made before the copy sets it) keep their own.
    common::setxattr(&p("a/size100"), "user.small", b"v");
    common::setxattr(&p("a/size100"), "user.big", &[b'q'; 3000]);
    common::setxattr(&p("a/b"), "user.dir", b"on a directory");
    common::setxattr(&p("modes/suid"), "trusted.secret", b"t");
    common::setxattr(
        &p("acl"),
        "system.posix_acl_access",
        &acl(&[
            (1, 7, NO_ID),
            (2, 5, 99),
            (4, 5, NO_ID),
            (0x10, 5, NO_ID),
            (0x20, 1, NO_ID),
        ]),
    );
    common::setxattr(&p("acl/inherits"), "user.before", b"the default ACL below");
    std::fs::write(p("acl/inherits/child"), b"c").expect("write");
    common::setxattr(
        &p("acl/inherits"),
        "system.posix_acl_default",
        &acl(&[
            (1, 6, NO_ID),
            (4, 4, NO_ID),
            (8, 4, 4242),
            (0x10, 4, NO_ID),
            (0x20, 0, NO_ID),
        ]),
    );
    // A directory of many names, made out of name order.
    for i in (0..3000u32).map(|i| (i * 7919) % 3000) {
        std::fs::write(p(&format!("big/f{i:05}")), i.to_le_bytes()).expect("write");
    }
    // Times: before 1970, past 2038, nanoseconds; set last, directories after their children.
    set_times(
        &p("a/size0"),
        (-1_000_000_000, 123_456_789),
        (-86_400, 999_999_999),
    );
    set_times(&p("a/size4096"), (4_102_444_800, 1), (4_102_444_801, 2));
    set_times(&p("dangling"), (1_000_000_000, 5), (1_000_000_001, 6));
    set_times(&p("null"), (7, 7), (8, 8));
    set_times(&p("a/b/c"), (-5, 0), (-6, 500));
    set_times(src, (1_234_567_890, 42), (1_234_567_891, 43));
}

/// A seeded random tree: directories nested at random, files of random sizes, modes, owners,
/// times and xattrs, symlinks and hard links to files made before.
fn random_tree(src: &Path, rng: &mut Rng) {
    let mut next = || rng.next_u64();
    let mut dirs = vec![src.to_path_buf()];
    let mut files: Vec<PathBuf> = Vec::new();
    for i in 0..400 {
        let dir = dirs[(next() % dirs.len() as u64) as usize].clone();
        let p = dir.join(format!("r{i}-{:x}", next() % 4096));
        match next() % 10 {
            0 | 1 => {
                std::fs::create_dir(&p).expect("mkdir");
                dirs.push(p.clone());
            }
            2 => std::os::unix::fs::symlink(format!("t{}", next()), &p).expect("symlink"),
            3 if !files.is_empty() => {
                let f = &files[(next() % files.len() as u64) as usize];
                std::fs::hard_link(f, &p).expect("link");
                continue;
            }
            _ => {
                let n = match next() % 4 {
                    0 => next() % 16,
                    1 => 4096 - 8 + next() % 16,
                    2 => next() % 20_000,
                    _ => next() % 300_000,
                } as usize;
                let b: Vec<u8> = (0..n).map(|_| next() as u8).collect();
                std::fs::write(&p, b).expect("write");
                std::fs::set_permissions(
                    &p,
                    std::os::unix::fs::PermissionsExt::from_mode((next() % 0o10000) as u32),
                )
                .expect("chmod");
                files.push(p.clone());
            }
        }
        std::os::unix::fs::lchown(
            &p,
            Some((next() % 70_000) as u32),
            Some((next() % 70_000) as u32),
        )
        .expect("chown");
        if next() % 5 == 0 && !p.is_symlink() {
            let len = (next() % 2000) as usize;
            common::setxattr(&p, &format!("user.x{}", next() % 100), &vec![b'x'; len]);
        }
        let t = |v: u64| {
            (
                v as i64 % 4_000_000_000 - 1_000_000_000,
                (v % 1_000_000_000) as i64,
            )
        };
        let (a, mut m) = (t(next()), t(next()));
        if p.is_symlink() {
            // In the past, or each readlink of the source moves its atime (see
            // `copy_and_compare`).
            m.0 = m.0.min(1_700_000_000);
        }
        set_times(&p, a, m);
    }
}

/// How a test copies its tree.
#[derive(Clone, Copy, Debug)]
enum Builder {
    /// `mkfs --from` into a new image; the copy is its root.
    Mkfs,
    /// `import` into a mounted image, as the new directory "sub/copy".
    Import,
    /// `import` into a mounted image as "sub/orig", then `idxfs cp` of that to "sub/copy"
    /// by the server: the same but the change times, which are the copy's own (as after
    /// `cp -a`), and the original unmoved.
    Cp,
}

/// Copies `src` with `how`, checks the image, mounts it read-only and compares every entry
/// of the copy with the source's `before`.
fn copy_and_compare(src: &Path, how: Builder) {
    // readlink moves a symlink's atime under relatime (the source's mount) when it is not
    // newer than the mtime, and no flag says otherwise: one pass first, so the source stands
    // still from then on (the random tree's symlinks have past mtimes for this).
    snapshot(src);
    let before = snapshot(src);
    let mut m = Mounted::new("128M", "acl");
    let copy = match how {
        Builder::Mkfs => {
            m.unmount();
            std::fs::remove_file(&m.image).expect("rm image");
            let (code, out, err) = idxfs(&[
                "mkfs",
                "--from",
                src.to_str().expect("utf8"),
                m.image.to_str().expect("utf8"),
            ]);
            assert_eq!(code, 0, "mkfs --from: {out}{err}");
            assert!(out.contains("formatted from"), "{out}");
            m.mp.clone()
        }
        Builder::Import => {
            std::fs::create_dir(m.path("sub")).expect("mkdir");
            // Looked for first, so the kernel may hold that the name is absent.
            assert!(!m.path("sub/copy").exists());
            let (code, out, err) = idxfs(&[
                "import",
                src.to_str().expect("utf8"),
                m.path("sub/copy").to_str().expect("utf8"),
            ]);
            assert_eq!(code, 0, "import: {out}{err}");
            assert!(out.contains("imported from"), "{out}");
            assert!(
                m.path("sub/copy").is_dir(),
                "the copy is seen at once through the mount that made it"
            );
            m.unmount();
            m.path("sub/copy")
        }
        Builder::Cp => {
            // Reads through the mount move atimes (relatime; the kernel does not pass
            // O_NOATIME on): mounted noatime, so the original stands still.
            m.unmount();
            m.mount("acl,noatime");
            std::fs::create_dir(m.path("sub")).expect("mkdir");
            let at = |r: &str| m.path(r).to_str().expect("utf8").to_string();
            let (code, out, err) = idxfs(&["import", src.to_str().expect("utf8"), &at("sub/orig")]);
            assert_eq!(code, 0, "import: {out}{err}");
            let orig = snapshot(&m.path("sub/orig"));
            assert!(!m.path("sub/copy").exists());
            let (code, out, err) = idxfs(&["cp", &at("sub/orig"), &at("sub/copy")]);
            assert_eq!(code, 0, "cp: {out}{err}");
            assert!(out.contains("copied"), "{out}");
            assert!(
                m.path("sub/copy").is_dir(),
                "the copy is seen at once through the mount that made it"
            );
            let again = snapshot(&m.path("sub/orig"));
            for (path, e) in &orig.0 {
                let name = String::from_utf8_lossy(path);
                assert!(
                    again.0.get(path) == Some(e),
                    "{name}: the copy changed the original: {}",
                    differs(again.0.get(path), e)
                );
            }
            m.unmount();
            m.path("sub/copy")
        }
    };
    m.assert_fsck_clean();
    m.mount("ro,acl");
    let mut after = snapshot(&copy);
    if let Builder::Cp = how {
        // The change times are the copy's own: compared as the source's.
        for (path, e) in after.0.iter_mut() {
            if let Some(want) = before.0.get(path) {
                e.ctime = want.ctime;
            }
        }
    }
    let same_keys = before.0.keys().eq(after.0.keys());
    for (path, want) in &before.0 {
        let name = String::from_utf8_lossy(path);
        assert_eq!(
            after.0.get(path),
            Some(want),
            "{name} differs (or is missing)"
        );
    }
    assert!(same_keys, "extra names in the image");
    assert_eq!(after.1, before.1, "which names share an inode");
    // The source is unchanged by the copy (its atimes included).
    assert!(snapshot(src) == before, "the copy changed its source");
}

#[test]
fn every_kind_of_entry_is_copied_with_its_attributes_and_names_in_inode_order() {
    let dir = shm_tempdir();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    every_kind(&src);
    copy_and_compare(&src, Builder::Mkfs);

    // The copy made each directory's names in name order, so the image's readdir (inode
    // order) lists them sorted, with ascending inode numbers; and a sparse file stayed
    // sparse. Checked on a second copy, mounted read-write.
    let img = dir.path().join("again.img");
    let (code, out, err) = idxfs(&[
        "mkfs",
        "--from",
        src.to_str().expect("utf8"),
        img.to_str().expect("utf8"),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let mut m = Mounted::new("64M", "");
    m.unmount();
    std::fs::rename(&img, &m.image).expect("mv");
    m.mount("");
    let listed: Vec<(Vec<u8>, u64)> = std::fs::read_dir(m.path("big"))
        .expect("read_dir")
        .map(|e| {
            let e = e.expect("entry");
            (e.file_name().as_bytes().to_vec(), e.ino())
        })
        // A name of an inode made before (in "a") lists where that inode number falls.
        .filter(|(name, _)| name != b"fourth")
        .collect();
    assert_eq!(listed.len(), 3000);
    assert!(
        listed
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1),
        "name order, ascending inodes"
    );
    let sparse = std::fs::metadata(m.path("a/sparse")).expect("stat");
    assert!(
        sparse.blocks() * 512 < 1 << 20,
        "{} blocks for 16 MiB of mostly holes",
        sparse.blocks()
    );
    // Writable, and fsck clean after a change.
    std::fs::write(m.path("a/new"), b"new").expect("write");
    m.unmount();
    m.assert_fsck_clean();
}

#[test]
fn a_random_tree_is_copied_exactly() {
    let (mut rng, _) = Rng::from_env("a_random_tree_is_copied_exactly");
    let dir = shm_tempdir();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    random_tree(&src, &mut rng);
    copy_and_compare(&src, Builder::Mkfs);
}

#[test]
fn import_into_a_mount_copies_every_kind_of_entry_exactly() {
    let dir = shm_tempdir();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    every_kind(&src);
    copy_and_compare(&src, Builder::Import);
}

#[test]
fn import_into_a_mount_copies_a_random_tree_exactly() {
    let (mut rng, _) = Rng::from_env("import_into_a_mount_copies_a_random_tree_exactly");
    let dir = shm_tempdir();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    random_tree(&src, &mut rng);
    copy_and_compare(&src, Builder::Import);
}

#[test]
fn idxfs_cp_in_a_mount_copies_every_kind_of_entry_exactly() {
    let dir = shm_tempdir();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    every_kind(&src);
    copy_and_compare(&src, Builder::Cp);
}

#[test]
fn idxfs_cp_in_a_mount_copies_a_random_tree_exactly() {
    let (mut rng, _) = Rng::from_env("idxfs_cp_in_a_mount_copies_a_random_tree_exactly");
    let dir = shm_tempdir();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    random_tree(&src, &mut rng);
    copy_and_compare(&src, Builder::Cp);
}

#[test]
fn an_import_frees_all_it_made_once_removed_and_refuses_what_it_cannot_do() {
    let dir = shm_tempdir();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("d")).expect("mkdir");
    for k in 0..200 {
        std::fs::write(src.join(format!("d/f{k}")), vec![k as u8; 3000]).expect("write");
    }
    std::fs::write(src.join("big"), vec![7u8; 24 << 20]).expect("write");
    std::fs::hard_link(src.join("big"), src.join("d/big-too")).expect("link");
    let s = src.to_str().expect("utf8");
    let mut m = Mounted::new("256M", "");
    let at = |r: &str| m.path(r).to_str().expect("utf8").to_string();
    let one_line = |err: &str| {
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
        assert!(!err.contains("panicked"), "{err}");
    };

    // Removed again, every block it took comes back: nothing the server made stays held
    // (the engine pins what it makes for the kernel, and no kernel holds these).
    idxfs(&["sync", &at("")]);
    let before = used_bytes(&m.mp);
    let (code, out, err) = idxfs(&["import", s, &at("copy")]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("201 files") && out.contains("1 more hard links"),
        "{out}"
    );
    assert!(
        used_bytes(&m.mp) > before + (24 << 20),
        "the copy holds its data"
    );
    std::fs::remove_dir_all(m.path("copy")).expect("rm -rf");
    let (code, out, err) = idxfs(&["sync", &at("")]);
    assert_eq!(code, 0, "{out}{err}");
    let after = used_bytes(&m.mp);
    assert!(
        after <= before + (1 << 20),
        "{} bytes still used after the copy was removed",
        after - before
    );

    // Refused, each in one line: a name that exists, a source that is not there, a target
    // on another file system, a copy into the source itself.
    std::fs::create_dir(m.path("there")).expect("mkdir");
    let (code, _, err) = idxfs(&["import", s, &at("there")]);
    assert_eq!(code, 1);
    one_line(&err);
    assert!(err.contains("exists"), "{err}");
    let (code, _, err) = idxfs(&["import", "/no/such/dir", &at("x")]);
    assert_eq!(code, 1);
    one_line(&err);
    let elsewhere = dir.path().join("elsewhere");
    let (code, _, err) = idxfs(&["import", s, elsewhere.to_str().expect("utf8")]);
    assert_eq!(code, 1);
    one_line(&err);
    assert!(err.contains("not idxfs"), "{err}");
    let (code, _, err) = idxfs(&["import", &at("there"), &at("there/inside")]);
    assert_eq!(code, 1);
    one_line(&err);
    assert!(err.contains("into itself"), "{err}");

    // Another user, who may write the directory, is still refused by the server: an import
    // sets owners and modes as it likes, which only root and the mount's owner may.
    use std::os::unix::fs::PermissionsExt;
    for p in [dir.path(), &m.mp, &m.path("there")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    }
    use std::os::unix::process::CommandExt;
    let o = std::process::Command::new(common::bin())
        .args(["import", s, &at("there/theirs")])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run as another user");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    one_line(&err);
    assert!(err.contains("only root or the mount's owner"), "{err}");
    assert!(!m.path("there/theirs").exists(), "nothing made");
    m.unmount();
    m.assert_fsck_clean();
}

#[test]
fn what_cannot_be_copied_is_refused_in_one_line_and_an_image_it_made_goes() {
    let dir = shm_tempdir();
    let img = dir.path().join("fs.img");
    let i = img.to_str().expect("utf8");
    let one_line = |err: &str| {
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
        assert!(!err.contains("panicked"), "{err}");
    };
    // No source, and a source that is not a directory.
    let (code, _, err) = idxfs(&["mkfs", "--from", "/no/such/dir", i]);
    assert_eq!(code, 1, "{err}");
    one_line(&err);
    assert!(err.contains("/no/such/dir"), "{err}");
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").expect("write");
    let (code, _, err) = idxfs(&["mkfs", "--from", file.to_str().expect("utf8"), i]);
    assert_eq!(code, 1, "{err}");
    one_line(&err);
    assert!(err.contains("not a directory"), "{err}");
    assert!(
        !img.exists(),
        "no image is made for a source that is not there"
    );

    // A tree that does not fit the size asked for: the image made for it is removed.
    let src = dir.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    for k in 0..40 {
        std::fs::write(src.join(format!("f{k}")), vec![k as u8; 1 << 20]).expect("write");
    }
    let (code, _, err) = idxfs(&[
        "mkfs",
        "--size",
        "16M",
        "--from",
        src.to_str().expect("utf8"),
        i,
    ]);
    assert_eq!(code, 1, "{err}");
    one_line(&err);
    assert!(err.contains("--size"), "says what to do: {err}");
    assert!(!img.exists(), "a failed copy removes the image it made");

    // An idxfs image already there is refused unless --force, as plain mkfs refuses it.
    let (code, out, err) = idxfs(&["mkfs", i, "--size", "64M"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, err) = idxfs(&["mkfs", "--from", src.to_str().expect("utf8"), i]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--force"), "{err}");
    let (code, out, err) = idxfs(&["mkfs", "--force", "--from", src.to_str().expect("utf8"), i]);
    assert_eq!(code, 0, "64 MiB holds 40 MiB: {out}{err}");
    assert!(img.exists(), "an image that was there before stays");

    // One that was there and is too small keeps what was copied, committed, and says so.
    let (code, out, err) = idxfs(&["mkfs", "--force", i, "--size", "16M"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, err) = idxfs(&["mkfs", "--force", "--from", src.to_str().expect("utf8"), i]);
    assert_eq!(code, 1, "{err}");
    one_line(&err);
    assert!(err.contains("holds what was copied before"), "{err}");
    let (code, out, err) = idxfs(&["fsck", i]);
    assert_eq!(
        code, 0,
        "what was copied is a clean file system: {out}{err}"
    );
}

/// Levels of `deep_chain`: their path (5-6 bytes a level) passes PATH_MAX four times over.
const DEEP: usize = 3000;

/// `name` in the directory open as `dir`, opened with `flags` (never following a symlink).
fn open_at(dir: &std::os::fd::OwnedFd, name: &str, flags: i32) -> std::os::fd::OwnedFd {
    use std::os::fd::{AsRawFd, FromRawFd};
    let c = CString::new(name).expect("no NUL");
    // SAFETY: a NUL-terminated name in an open directory; the descriptor is ours.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags | libc::O_NOFOLLOW, 0o640) };
    assert!(
        fd >= 0,
        "openat {name}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: just opened, owned by nobody else.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
}

fn open_dir(path: &Path) -> std::os::fd::OwnedFd {
    std::fs::File::open(path).expect("open dir").into()
}

/// What the deep test compares of `name` in `dir`: type and mode, owner, size (not of a
/// directory), mtime, xattrs (through the directory's descriptor in /proc, as no path from
/// the top fits in PATH_MAX), and a file's bytes or a symlink's target.
fn entry_at(dir: &std::os::fd::OwnedFd, name: &str) -> String {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStringExt;
    let c = CString::new(name).expect("no NUL");
    let mut st = std::mem::MaybeUninit::<libc::stat64>::zeroed();
    // SAFETY: a NUL-terminated name and a stat buffer to fill.
    let r = unsafe {
        libc::fstatat64(
            dir.as_raw_fd(),
            c.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(r, 0, "fstatat {name}: {}", std::io::Error::last_os_error());
    // SAFETY: fstatat filled it.
    let st = unsafe { st.assume_init() };
    let kind = st.st_mode & libc::S_IFMT;
    let size = (kind != libc::S_IFDIR).then_some(st.st_size);
    let via = PathBuf::from(format!("/proc/self/fd/{}/{name}", dir.as_raw_fd()));
    let data = match kind {
        libc::S_IFREG => {
            let f = std::fs::File::from(open_at(dir, name, libc::O_RDONLY));
            let mut b = Vec::new();
            std::io::Read::read_to_end(&mut &f, &mut b).expect("read");
            b
        }
        libc::S_IFLNK => std::fs::read_link(&via)
            .expect("readlink")
            .into_os_string()
            .into_vec(),
        _ => Vec::new(),
    };
    format!(
        "{name}: mode {:o} owner {}:{} size {size:?} mtime {}.{} xattrs {:?} data {:?}",
        st.st_mode,
        st.st_uid,
        st.st_gid,
        st.st_mtime,
        st.st_mtime_nsec,
        xattrs(&via),
        String::from_utf8_lossy(&data)
    )
}

/// A chain of `DEEP` directories under `top`; every 700th level also holds a file, a
/// symlink and a FIFO (each with an xattr), and an xattr of its own. Made by descriptors,
/// as no path from `top` to the bottom fits in PATH_MAX.
fn deep_chain(top: &Path) {
    use std::os::fd::AsRawFd;
    let mut dir = open_dir(top);
    for level in 1..=DEEP {
        let name = CString::new(format!("d{level}")).expect("no NUL");
        // SAFETY: a NUL-terminated name in an open directory.
        let r = unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o750) };
        assert_eq!(r, 0, "mkdirat: {}", std::io::Error::last_os_error());
        dir = open_at(
            &dir,
            &format!("d{level}"),
            libc::O_RDONLY | libc::O_DIRECTORY,
        );
        if level % 700 == 0 {
            let proc = |n: &str| PathBuf::from(format!("/proc/self/fd/{}/{n}", dir.as_raw_fd()));
            let f = open_at(&dir, "f", libc::O_WRONLY | libc::O_CREAT);
            std::io::Write::write_all(
                &mut std::fs::File::from(f),
                format!("level {level}").as_bytes(),
            )
            .expect("write");
            std::os::unix::fs::symlink(format!("to{level}"), proc("s")).expect("symlink");
            let fifo = CString::new("p").expect("no NUL");
            // SAFETY: a NUL-terminated name in an open directory.
            let r = unsafe { libc::mkfifoat(dir.as_raw_fd(), fifo.as_ptr(), 0o640) };
            assert_eq!(r, 0, "mkfifoat: {}", std::io::Error::last_os_error());
            for (n, x) in [
                ("s", "trusted.s"),
                ("p", "trusted.p"),
                ("f", "user.f"),
                (".", "user.d"),
            ] {
                let (c, v) = (cpath(&proc(n)), format!("{x}{level}"));
                let xc = CString::new(x).expect("no NUL");
                // SAFETY: NUL-terminated path and name, a buffer of the given length.
                let r = unsafe {
                    libc::lsetxattr(c.as_ptr(), xc.as_ptr(), v.as_ptr().cast(), v.len(), 0)
                };
                assert_eq!(r, 0, "lsetxattr {n}: {}", std::io::Error::last_os_error());
            }
        }
    }
}

/// Walks the chains under `a` and `b` side by side by descriptors, and asserts that every
/// entry of every level is the same in both.
fn assert_same_chain(a: &Path, b: &Path) {
    let (mut da, mut db) = (open_dir(a), open_dir(b));
    let dir = libc::O_RDONLY | libc::O_DIRECTORY;
    for level in 1..=DEEP {
        let next = format!("d{level}");
        let want = entry_at(&da, &next);
        assert_eq!(entry_at(&db, &next), want);
        da = open_at(&da, &next, dir);
        db = open_at(&db, &next, dir);
        if level % 700 == 0 {
            for n in ["f", "s", "p", "."] {
                let want = entry_at(&da, n);
                assert_eq!(entry_at(&db, n), want, "at level {level}");
            }
        }
    }
}

#[test]
fn a_tree_deeper_than_path_max_is_copied_by_mkfs_from_and_import() {
    let dir = shm_tempdir();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    deep_chain(&src);
    let s = src.to_str().expect("utf8");
    let mut m = Mounted::new("128M", "");
    m.unmount();
    std::fs::remove_file(&m.image).expect("rm image");
    let (code, out, err) = idxfs(&["mkfs", "--from", s, m.image.to_str().expect("utf8")]);
    assert_eq!(code, 0, "mkfs --from: {out}{err}");
    assert!(out.contains(&format!("{DEEP} directories")), "{out}");
    m.assert_fsck_clean();
    m.mount("");
    assert_same_chain(&src, &m.mp);
    let (code, out, err) = idxfs(&["import", s, m.path("again").to_str().expect("utf8")]);
    assert_eq!(code, 0, "import: {out}{err}");
    assert_same_chain(&src, &m.path("again"));
    m.unmount();
    m.assert_fsck_clean();
}
