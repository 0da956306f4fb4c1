//! `idxfs rm` through a mount: a tree the kernel has cached removed inside the server, then
//! gone for the kernel too (no stale entry), a file open inside still readable until closed,
//! the space back, fsck clean; bad input answered in one line. Another user's `idxfs rm` on
//! random trees of owners, modes, sticky bits and ACLs against `rm -rf` of the same tree on
//! tmpfs as that user: refused exactly where `rm -rf` fails, and removing nothing `rm -rf`
//! keeps.
mod common;
use common::*;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;

fn used_bytes(p: &std::path::Path) -> u64 {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: statvfs(3) into a zeroed struct, with a valid C string.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0, "statvfs");
    (s.f_blocks - s.f_bfree) * s.f_frsize
}

#[test]
fn idxfs_rm_removes_a_tree_in_the_server_and_the_kernel_forgets_it() {
    let mut m = Mounted::new("256M", "");
    // Others may reach the mount (the unprivileged caller below).
    for p in [m.dir.path().to_path_buf(), m.path("")] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    std::fs::write(m.path("file"), b"a file").expect("write");
    let before = used_bytes(&m.mp);
    let held: Vec<u8> = (0..50_000u32).map(|i| (i % 253) as u8).collect();
    for d in 0..20 {
        let dir = m.path(&format!("tree/d{d}/sub"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        for f in 0..100 {
            std::fs::write(dir.join(format!("f{f}")), vec![d as u8; 8192]).expect("write");
        }
    }
    std::fs::write(m.path("tree/held"), &held).expect("write");
    // The kernel caches every entry and inode of the tree.
    let walked = std::process::Command::new("find")
        .arg(m.path("tree"))
        .output()
        .expect("find");
    assert!(walked.status.success());
    let mut open = std::fs::File::open(m.path("tree/held")).expect("open");
    let tree = m.path("tree").to_str().expect("utf8").to_string();

    // Not from another user, who may not write the root or the tree's directories: refused
    // before anything goes, as rm -rf would be at its first unlink.
    let out = std::process::Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(bin())
        .args(["rm", &tree])
        .output()
        .expect("setpriv");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("permission denied"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(m.path("tree/d3/sub/f7").exists());
    assert!(m.path("tree/held").exists());

    let (code, out, err) = idxfs(&["rm", &tree]);
    assert_eq!(code, 0, "rm: {out}{err}");
    assert!(
        out.contains("removed 2001 files and 41 directories"),
        "{out}"
    );
    // Gone for the kernel too, though it had all of it cached.
    assert!(!m.path("tree").exists());
    assert!(!m.path("tree/d3/sub/f7").exists());
    let names: Vec<_> = std::fs::read_dir(m.path(""))
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("file")]);
    // The open file reads whole until closed.
    let mut got = Vec::new();
    open.read_to_end(&mut got).expect("read the open file");
    assert_eq!(got, held);
    drop(open);

    // A file, as rm removes it; bad input in one line each.
    let file = m.path("file").to_str().expect("utf8").to_string();
    let (code, out, err) = idxfs(&["rm", &file]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("removed 1 files and 0 directories"), "{out}");
    let snapdir = m.path(".snapshots/x").to_str().expect("utf8").to_string();
    let elsewhere = std::env::temp_dir().join("x");
    for (arg, want) in [
        (tree.clone(), "no such file or directory"),
        (snapdir, "read-only"),
        (format!("{tree}/.."), "not a name to remove"),
        (
            format!("{}/.", m.path("").display()),
            "not a name to remove",
        ),
        (elsewhere.to_str().expect("utf8").to_string(), "not idxfs"),
    ] {
        let (code, out, err) = idxfs(&["rm", &arg]);
        assert_ne!(code, 0, "{arg}: {out}");
        assert_eq!(err.lines().count(), 1, "{arg}: {err}");
        assert!(err.contains(want), "{arg}: {err}");
    }
    m.unmount();
    m.assert_fsck_clean();
    m.mount("");
    let after = used_bytes(&m.mp);
    assert!(
        after <= before,
        "{after} bytes used after the removal, {before} before the tree"
    );
    m.unmount();
}

/// The user the reference test runs as, and a supplementary group of theirs.
const USER: u32 = 65534;
const GROUP: u32 = 1000;

/// Makes the same random tree at `tops[0]` and `tops[1]` (as root): directories and files of
/// random owners and modes, sticky directories, and directory ACLs naming the user or its
/// group. `mood`: `Some(true)` makes it all the user's, `Some(false)` gives it a top the user
/// may not change (so whether `rm -rf` can remove it is known: both outcomes come up).
fn random_tree(
    rng: &mut idxfs_engine::testutil::Rng,
    tops: [&std::path::Path; 2],
    mood: Option<bool>,
) {
    use std::os::unix::fs::chown;
    let owners = [USER, USER, USER, 0, 4242];
    let groups = [USER, GROUP, 0, 4242];
    let dir_modes = [
        0o755, 0o777, 0o700, 0o775, 0o770, 0o750, 0o1777, 0o1770, 0o500, 0o300, 0o000, 0o711,
    ];
    let acls = [
        "u:65534:rwx",
        "u:65534:r-x",
        "g:1000:rwx",
        "g:1000:r-x,m::r-x",
        "u:65534:rwx,m::---",
        "o::rwx",
    ];
    // (relative path, depth), made in creation order; modes are set afterwards, deepest
    // first, so root's writes are not what a mode would stop (it stops nothing for root,
    // but this keeps the trees equal for any mode).
    let mut dirs = vec![(std::path::PathBuf::new(), 0)];
    let mut made = Vec::new();
    for t in tops {
        std::fs::create_dir(t).expect("mkdir top");
    }
    for i in 0..rng.below(25) + 3 {
        let (d, depth) = dirs[rng.below(dirs.len() as u64) as usize].clone();
        let rel = d.join(format!("n{i}"));
        let is_dir = depth < 3 && rng.chance(40);
        for t in tops {
            let p = t.join(&rel);
            if is_dir {
                std::fs::create_dir(&p).expect("mkdir");
            } else {
                std::fs::write(&p, b"x").expect("write");
            }
        }
        if is_dir {
            dirs.push((rel.clone(), depth + 1));
        }
        made.push((rel, is_dir));
    }
    made.insert(0, (std::path::PathBuf::new(), true));
    for (rel, is_dir) in made.iter().rev() {
        let uid = owners[rng.below(owners.len() as u64) as usize];
        let gid = groups[rng.below(groups.len() as u64) as usize];
        // Mostly modes that let the removal go on, so both outcomes come up.
        let mode = if !is_dir {
            0o644
        } else if rng.chance(70) {
            [0o777, 0o755, 0o775][rng.below(3) as usize]
        } else {
            dir_modes[rng.below(dir_modes.len() as u64) as usize]
        };
        let mut acl =
            (*is_dir && rng.chance(30)).then(|| acls[rng.below(acls.len() as u64) as usize]);
        let (uid, gid, mode) = match mood {
            // An empty directory the user may not read goes too, as rm -rf removes it.
            Some(true) => {
                acl = None;
                let empty = !made.iter().any(|(r, _)| r.parent() == Some(rel.as_path()));
                let mode = match (is_dir, empty) {
                    (false, _) => 0o644,
                    (true, true) if !rel.as_os_str().is_empty() => 0o300,
                    (true, _) => 0o755,
                };
                (USER, USER, mode)
            }
            Some(false) if rel.as_os_str().is_empty() => {
                acl = None;
                (0, 0, 0o555)
            }
            _ => (uid, gid, mode),
        };
        for t in tops {
            let p = t.join(rel);
            chown(&p, Some(uid), Some(gid)).expect("chown");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
            if let Some(a) = acl {
                let st = std::process::Command::new("setfacl")
                    .args(["-m", a])
                    .arg(&p)
                    .status()
                    .expect("setfacl");
                assert!(st.success(), "setfacl -m {a} {}", p.display());
            }
        }
    }
}

/// Every path under `top` (itself included, as ""), walked as root.
fn paths_under(top: &std::path::Path) -> std::collections::BTreeSet<std::path::PathBuf> {
    let mut out = std::collections::BTreeSet::new();
    if std::fs::symlink_metadata(top).is_err() {
        return out;
    }
    let mut todo = vec![std::path::PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let p = top.join(&rel);
        if std::fs::symlink_metadata(&p).expect("stat").is_dir() {
            for e in std::fs::read_dir(&p).expect("ls") {
                todo.push(rel.join(e.expect("entry").file_name()));
            }
        }
        out.insert(rel);
    }
    out
}

#[test]
fn another_users_idxfs_rm_fails_where_rm_rf_does_and_removes_no_more() {
    let (mut rng, seed) = idxfs_engine::testutil::Rng::from_env("idxfs rm as a user");
    let mut m = Mounted::new("256M", "");
    let reference = shm_tempdir();
    // Both parents reachable and writable by the user: whether the top goes is the tree's.
    for p in [m.dir.path(), &m.mp, reference.path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    }
    let (mut removed, mut refused) = (0, 0);
    for k in 0..48 {
        let name = format!("t{k}");
        let (idx, tmp) = (m.path(&name), reference.path().join(&name));
        let mood = [Some(true), Some(false)].get(k).copied().flatten();
        random_tree(&mut rng, [&tmp, &idx], mood);
        let before = paths_under(&idx);
        assert_eq!(
            before,
            paths_under(&tmp),
            "seed {seed}, tree {k}: made alike"
        );
        let (rm_ok, rm_err) = as_user("rm", &["-rf".as_ref(), tmp.as_path()]);
        let (idx_ok, idx_err) = as_user(bin(), &["rm".as_ref(), idx.as_path()]);
        let (left_rm, left_idx) = (paths_under(&tmp), paths_under(&idx));
        let ctx = format!(
            "seed {seed}, tree {k}: rm -rf {rm_ok} ({rm_err}), idxfs rm {idx_ok} ({idx_err}), \
             left by rm -rf {left_rm:?}, by idxfs rm {left_idx:?}"
        );
        assert_eq!(rm_ok, idx_ok, "{ctx}");
        assert!(left_idx.is_superset(&left_rm), "{ctx}");
        if idx_ok {
            assert!(left_idx.is_empty(), "{ctx}");
            removed += 1;
        } else {
            assert_eq!(idx_err.trim_end().lines().count(), 1, "{ctx}");
            assert!(!idx_err.contains("panicked"), "{ctx}");
            refused += 1;
        }
    }
    eprintln!("seed {seed}: {removed} trees removed, {refused} refused");
    assert!(
        removed > 0 && refused > 0,
        "seed {seed}: {removed} removed, {refused} refused"
    );
    m.unmount();
    m.assert_fsck_clean();
}

/// What the kernel cached of a file the removal changed is dropped too: a file linked
/// outside the tree shows one link less, an open one none, as after `rm -rf`.
#[test]
fn the_kernel_forgets_the_links_a_removal_took() {
    use std::os::unix::fs::MetadataExt;
    let m = Mounted::new("64M", "");
    std::fs::create_dir_all(m.path("tree/sub")).expect("mkdir");
    std::fs::write(m.path("tree/sub/linked"), b"kept").expect("write");
    std::fs::hard_link(m.path("tree/sub/linked"), m.path("outside")).expect("link");
    std::fs::write(m.path("tree/open"), b"open").expect("write");
    let open = std::fs::File::open(m.path("tree/open")).expect("open");
    // Cached by the kernel: two links, one link.
    assert_eq!(
        std::fs::metadata(m.path("outside")).expect("stat").nlink(),
        2
    );
    assert_eq!(open.metadata().expect("fstat").nlink(), 1);
    let (code, out, err) = idxfs(&["rm", m.path("tree").to_str().expect("utf8")]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        std::fs::metadata(m.path("outside")).expect("stat").nlink(),
        1
    );
    assert_eq!(open.metadata().expect("fstat").nlink(), 0);
    assert_eq!(std::fs::read(m.path("outside")).expect("read"), b"kept");
}

/// A removal goes a slice at a time (`fuse/src/slices.rs`): with slices of no time at all
/// (`IDXFS_SLICE_US=0`), a batch of a directory's names a request, the command asking
/// again until the tree is gone.
#[test]
fn a_removal_goes_a_slice_at_a_time() {
    let mut m = Mounted::new("256M", "");
    m.unmount();
    m.counters = true;
    m.env.push(("IDXFS_SLICE_US", "0".into()));
    m.mount("");
    let dirs = 5;
    for d in 0..dirs {
        std::fs::create_dir_all(m.path(&format!("tree/d{d}/e"))).expect("mkdir");
        for i in 0..40 {
            std::fs::write(m.path(&format!("tree/d{d}/f{i}")), b"x").expect("write");
        }
    }
    let at = m.path("tree");
    let (code, out, err) = idxfs(&["rm", at.to_str().expect("utf8")]);
    assert_eq!(code, 0, "rm: {out}{err}");
    assert!(
        out.contains("removed 200 files and 11 directories"),
        "{out}"
    );
    assert!(!at.exists());
    let err = m.unmount();
    // At least a request a directory.
    let ioctls = Mounted::requests(&err, "ioctl");
    assert!(ioctls > 11, "{ioctls} ioctls\n{err}");
    m.assert_fsck_clean();
}
