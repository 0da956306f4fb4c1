//! `idxfs cp` run by a user who is neither root nor the mount's owner, against `cp -a` run by
//! the same user on tmpfs: the same random trees (files, directories, symlinks, FIFOs,
//! device nodes and hard links of several owners, groups and modes, with set-user-ID,
//! set-group-ID and sticky bits, user and trusted xattrs, access and default ACLs, random
//! times) made as root in both, copied as the user by each, and the copies compared entry
//! by entry: type, mode, owner, group, size, bytes, times, xattrs (ACLs included), which
//! names share an inode; whether the command failed, and how many entries it left out
//! (`cp -a`'s error lines against `idxfs cp`'s count).
mod common;
use common::*;
use idxfs_engine::testutil::Rng;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The user the copies run as, and a supplementary group of theirs.
const USER: u32 = 65534;
const GROUP: u32 = 1000;

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path")
}

/// Every xattr of `p` (not following a symlink), sorted, as root reads them.
fn xattrs(p: &Path) -> Vec<(String, Vec<u8>)> {
    let cp = c(p);
    let mut names = vec![0u8; 65536];
    // SAFETY: llistxattr(2) into a buffer of the length given.
    let n = unsafe { libc::llistxattr(cp.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(n >= 0, "llistxattr {}", p.display());
    let mut out = Vec::new();
    for name in names[..n as usize]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
    {
        let cn = CString::new(name).expect("name");
        let mut v = vec![0u8; 65536];
        // SAFETY: lgetxattr(2) into a buffer of the length given.
        let k =
            unsafe { libc::lgetxattr(cp.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(k >= 0, "lgetxattr {}", p.display());
        v.truncate(k as usize);
        out.push((String::from_utf8_lossy(name).into_owned(), v));
    }
    out.sort();
    out
}

fn set_times(p: &Path, atime: i64, mtime: i64) {
    let t = |s: i64| libc::timespec {
        tv_sec: s,
        tv_nsec: (s % 1000) * 1000,
    };
    let ts = [t(atime), t(mtime)];
    // SAFETY: utimensat(2) with a valid path and two timespecs.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c(p).as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(r, 0, "utimensat {}", p.display());
}

fn setfacl(args: &[&str], p: &Path) {
    let st = std::process::Command::new("setfacl")
        .args(args)
        .arg(p)
        .status()
        .expect("setfacl");
    assert!(st.success(), "setfacl {args:?} {}", p.display());
}

/// One entry of a random tree.
enum Kind {
    Dir,
    File(Vec<u8>),
    Symlink(String),
    Fifo,
    Device,
    /// Another name of the file at this index.
    Link(usize),
}

/// Makes the same random tree at each of `tops` (as root); afterwards owners, modes, ACLs
/// and times, deepest first, so root's making is not what a mode would stop. A `gentle`
/// tree has nothing the user may not read or make, so its copy is whole (every other
/// attribute as random).
fn random_tree(rng: &mut Rng, tops: [&Path; 2], gentle: bool) {
    use std::os::unix::fs::lchown;
    let owners = [USER, USER, USER, 0, 4242];
    let groups = [USER, GROUP, GROUP, 0, 4242];
    let dir_modes = [
        0o755, 0o755, 0o700, 0o2775, 0o1777, 0o711, 0o311, 0o644, 0o555, 0o2750,
    ];
    let file_modes = [
        0o644, 0o644, 0o600, 0o400, 0o4755, 0o2755, 0o6711, 0o1644, 0o000, 0o640, 0o604,
    ];
    let acls = [
        "u:65534:r--",
        "u:65534:---",
        "g:1000:r-x",
        "g:1000:r--,m::---",
        "u:4242:rw-",
    ];
    let (dir_modes, file_modes, acls) = match gentle {
        true => (
            &[0o755, 0o2775, 0o1777, 0o555][..],
            &[0o644, 0o4755, 0o2755, 0o1644, 0o666][..],
            &acls[4..],
        ),
        false => (&dir_modes[..], &file_modes[..], &acls[..]),
    };
    let mut dirs = vec![(PathBuf::new(), 0)];
    let mut made: Vec<(PathBuf, Kind)> = Vec::new();
    for t in tops {
        std::fs::create_dir(t).expect("mkdir top");
    }
    for i in 0..rng.below(30) + 4 {
        let (d, depth) = dirs[rng.below(dirs.len() as u64) as usize].clone();
        let rel = d.join(format!("n{i}"));
        let files: Vec<usize> = (0..made.len())
            .filter(|&k| matches!(made[k].1, Kind::File(_)))
            .collect();
        let kind = match rng.below(20) {
            0..=4 if depth < 3 => Kind::Dir,
            5 => Kind::Symlink(format!("../target{}", rng.below(100))),
            6 => Kind::Fifo,
            7 if !gentle => Kind::Device,
            8 | 9 if !files.is_empty() => Kind::Link(files[rng.below(files.len() as u64) as usize]),
            _ => {
                let len = rng.below(9000) as usize;
                Kind::File(rng.bytes(len))
            }
        };
        for t in tops {
            let p = t.join(&rel);
            match &kind {
                Kind::Dir => std::fs::create_dir(&p).expect("mkdir"),
                Kind::File(b) => std::fs::write(&p, b).expect("write"),
                Kind::Symlink(to) => std::os::unix::fs::symlink(to, &p).expect("symlink"),
                // SAFETY: mkfifo(3) and mknod(2) with a valid path.
                Kind::Fifo => assert_eq!(unsafe { libc::mkfifo(c(&p).as_ptr(), 0o644) }, 0),
                Kind::Device => assert_eq!(
                    unsafe {
                        libc::mknod(c(&p).as_ptr(), libc::S_IFCHR | 0o644, libc::makedev(1, 3))
                    },
                    0
                ),
                Kind::Link(k) => std::fs::hard_link(t.join(&made[*k].0), &p).expect("link"),
            }
        }
        if matches!(kind, Kind::Dir) {
            dirs.push((rel.clone(), depth + 1));
        }
        made.push((rel, kind));
    }
    // The top: the user's and open, mostly; now and then one they may not list.
    for (rel, kind) in made
        .iter()
        .rev()
        .chain([(PathBuf::new(), Kind::Dir)].iter())
    {
        if matches!(kind, Kind::Link(_)) {
            continue;
        }
        let top = rel.as_os_str().is_empty();
        let uid = if top {
            USER
        } else {
            owners[rng.below(5) as usize]
        };
        let gid = groups[rng.below(5) as usize];
        let mode = match kind {
            _ if top && gentle => 0o755,
            _ if top => [0o755, 0o755, 0o755, 0o311][rng.below(4) as usize],
            Kind::Dir => dir_modes[rng.below(dir_modes.len() as u64) as usize],
            Kind::File(_) => file_modes[rng.below(file_modes.len() as u64) as usize],
            _ => 0o644,
        };
        let symlink = matches!(kind, Kind::Symlink(_));
        let acl = (!symlink && rng.chance(20)).then(|| acls[rng.below(acls.len() as u64) as usize]);
        let default_acl = matches!(kind, Kind::Dir) && rng.chance(20);
        let user_x = matches!(kind, Kind::Dir | Kind::File(_)) && rng.chance(25);
        let trusted_x = !symlink && rng.chance(15);
        let (atime, mtime) = (rng.below(1 << 31) as i64, rng.below(1 << 31) as i64);
        for t in tops {
            let p = t.join(rel);
            lchown(&p, Some(uid), Some(gid)).expect("chown");
            if !symlink {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
            }
            if let Some(a) = acl {
                setfacl(&["-m", a], &p);
            }
            if default_acl {
                setfacl(&["-d", "-m", "u:65534:rwx,g:1000:r-x"], &p);
            }
            if user_x {
                setxattr(&p, "user.note", rel.as_os_str().as_bytes());
            }
            if trusted_x {
                setxattr(&p, "trusted.root", b"root's");
            }
            set_times(&p, atime, mtime);
        }
    }
}

/// Everything compared of the tree at `top`, by path, as root reads it: stat's type, mode,
/// owner, group, size, device number, times (the access time with `atime`); symlink
/// target, xattrs, bytes; and for a name of an inode with more than one in the tree, the
/// first such path. Every entry is looked at before any file is read, which may move access
/// times (of every name of the file).
fn picture(top: &Path, atime: bool) -> BTreeMap<PathBuf, String> {
    let mut out: BTreeMap<PathBuf, (String, bool)> = BTreeMap::new();
    let mut first: BTreeMap<u64, PathBuf> = BTreeMap::new();
    if std::fs::symlink_metadata(top).is_err() {
        return BTreeMap::new();
    }
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let p = top.join(&rel);
        // Before listing it, which may move its access time.
        let m = std::fs::symlink_metadata(&p).expect("lstat");
        let mut line = format!(
            "mode={:o} owner={}:{} size={} rdev={:x} atime={}.{} mtime={}.{}",
            m.mode(),
            m.uid(),
            m.gid(),
            if m.is_dir() { 0 } else { m.size() },
            m.rdev(),
            if atime { m.atime() } else { 0 },
            if atime { m.atime_nsec() } else { 0 },
            m.mtime(),
            m.mtime_nsec()
        );
        for (n, v) in xattrs(&p) {
            line += &format!(" x:{n}={v:x?}");
        }
        let ft = m.file_type();
        if ft.is_dir() {
            let mut names: Vec<_> = std::fs::read_dir(&p)
                .expect("ls")
                .map(|e| e.expect("entry").file_name())
                .collect();
            names.sort();
            todo.extend(names.into_iter().map(|n| rel.join(n)));
        } else if ft.is_symlink() {
            line += &format!(" -> {:?}", std::fs::read_link(&p).expect("readlink"));
        }
        if !ft.is_dir() && m.nlink() > 1 {
            let f = first.entry(m.ino()).or_insert_with(|| rel.clone());
            line += &format!(" first-name={}", f.display());
        }
        out.insert(rel, (line, ft.is_file()));
    }
    out.into_iter()
        .map(|(rel, (mut line, file))| {
            if file {
                let bytes = std::fs::read(top.join(&rel)).expect("read");
                line += &format!(" data={:x}", crc32c::crc32c(&bytes));
            }
            (rel, line)
        })
        .collect()
}

/// How many entries `idxfs cp`'s message says it left out.
fn left_out(err: &str) -> usize {
    if !err.contains("not copied:") {
        return 0;
    }
    match err.rsplit_once(" and ") {
        Some((_, more)) => {
            1 + more
                .split(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        }
        None => 1,
    }
}

#[test]
fn another_users_idxfs_cp_copies_what_their_cp_a_copies() {
    let (mut rng, seed) = Rng::from_env("idxfs cp as a user");
    let mut m = Mounted::new("256M", "");
    let reference = shm_tempdir();
    for p in [m.dir.path(), &m.mp, reference.path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    }
    let (mut whole, mut partial, mut entries) = (0, 0, 0);
    for k in 0..24 {
        let (idx, tmp) = (
            m.path(&format!("t{k}")),
            reference.path().join(format!("t{k}")),
        );
        let gentle = k % 3 == 0;
        random_tree(&mut rng, [&tmp, &idx], gentle);
        let ctx = format!("seed {seed}, tree {k}");
        let (idx_copy, tmp_copy) = (
            m.path(&format!("c{k}")),
            reference.path().join(format!("c{k}")),
        );
        let (cp_ok, cp_err) = as_user("cp", &["-a".as_ref(), &tmp, &tmp_copy]);
        let (idx_ok, idx_err) = as_user(bin(), &["cp".as_ref(), &idx, &idx_copy]);
        let ctx = format!("{ctx}: cp -a {cp_ok} ({cp_err}), idxfs cp {idx_ok} ({idx_err})");
        assert!(!idx_err.contains("panicked"), "{ctx}");
        assert_eq!(cp_ok, idx_ok, "{ctx}");
        assert!(idx_ok || !gentle, "{ctx}: a tree with nothing to refuse");
        let cp_lines = cp_err.lines().filter(|l| l.starts_with("cp: ")).count();
        assert_eq!(left_out(&idx_err), cp_lines, "{ctx}: entries left out");
        if !idx_ok {
            assert_eq!(idx_err.trim_end().lines().count(), 1, "{ctx}");
        }
        // Made alike (not their access times, which reading them moves on tmpfs: after
        // the copies, whose are the sources' before).
        assert_eq!(
            picture(&idx, false),
            picture(&tmp, false),
            "{ctx}: made alike"
        );
        let (have, want) = (picture(&idx_copy, true), picture(&tmp_copy, true));
        if have != want {
            let source = picture(&tmp, false);
            let show = |a: &BTreeMap<PathBuf, String>, b: &BTreeMap<PathBuf, String>| {
                a.iter()
                    .filter(|(k, v)| b.get(*k) != Some(v))
                    .map(|(k, v)| format!("{}: {v}\n  source: {:?}", k.display(), source.get(k)))
                    .take(8)
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            panic!(
                "{ctx}: the copies differ\nidxfs cp:\n{}\ncp -a:\n{}",
                show(&have, &want),
                show(&want, &have)
            );
        }
        // The user made them: root's making is not in the copies.
        let meta = std::fs::symlink_metadata(&idx_copy).expect("the copy");
        assert_eq!(meta.uid(), USER, "{ctx}");
        entries += have.len();
        match idx_ok {
            true => whole += 1,
            false => partial += 1,
        }
    }
    eprintln!("seed {seed}: {whole} trees copied whole, {partial} in part, {entries} entries");
    assert!(
        whole > 0 && partial > 0,
        "seed {seed}: {whole} whole, {partial} in part"
    );
    m.unmount();
    m.assert_fsck_clean();
}
