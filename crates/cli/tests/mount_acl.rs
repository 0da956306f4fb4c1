//! POSIX ACLs through the mount, against ext4: one script of `setfacl`, `getfacl`, creates
//! under umasks, chmod, `cp -a --preserve=all`, and accesses by an unprivileged user runs on
//! an idxfs mount and on ext4 on a loop device (tmpfs, whose ACLs are the kernel's same code,
//! where no loop device can be had), and their transcripts must be equal line for line. The
//! idxfs side then survives a remount and a clean fsck. `noacl` is checked on its own.
mod common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The script; `$R` is the directory it works in, `$AS` runs a command as uid 1234 (in no
/// group of the files here). Every line it prints must be the same on both file systems, so
/// listings are sorted and sizes and times left out.
const SCRIPT: &str = r#"
set -u
cd "$R"
acl() { for f in "$@"; do getfacl -n "$f" 2>&1; done; }
modes() { for f in "$@"; do printf '%s ' "$f"; ls -ld "$f" | cut -d' ' -f1; done; }
try() { if "$@" >/dev/null 2>&1; then echo "ok: $*"; else echo "refused: $*"; fi; }

echo '== a directory with a default ACL'
umask 022
mkdir d
setfacl -m u:1234:rx,d:u:1234:rwx,d:g::r-x,d:o::- d
acl d; modes d

echo '== new inodes inherit it, the umask ignored'
umask 077
touch d/f; mkdir d/sub; mkfifo d/p; ln -s f d/l
umask 022
acl d/f d/sub d/p; modes d/f d/sub d/p d/l
umask 0
touch d/sub/deeper
acl d/sub/deeper; modes d/sub/deeper

echo '== outside it, the umask'
umask 027
touch plain; mkdir plaind
umask 022
acl plain plaind; modes plain plaind

echo '== chmod moves the mask, not the owning group'
chmod 750 d/f; acl d/f; modes d/f
chmod g-w d/sub; acl d/sub
setfacl -m m::r d/sub; modes d/sub

echo '== an ACL the mode says in full is the mode'
setfacl --set u::rw,g::r,o::- plain; acl plain; modes plain
setfacl -b d/f; acl d/f; modes d/f

echo '== default ACLs: only on directories, removable'
setfacl -d -m u:1234:rw d/p 2>&1 | sed 's/^setfacl: //'
setfacl -k d/sub; acl d/sub
touch d/sub/after; acl d/sub/after

echo '== cp -a --preserve=all copies them'
cp -a --preserve=all d d2
for f in $(find d2 | sort); do acl "$f"; modes "$f"; done

echo '== enforcement for uid 1234'
touch e; chmod 600 e; setfacl -m u:1234:r e
mkdir ed; chmod 700 ed; setfacl -m u:1234:rx ed; touch ed/x
touch w; chmod 600 w; setfacl -m u:1234:rw w; setfacl -m m::r w
touch n; chmod 666 n; setfacl -m u:1234:- n
try $AS cat e
try $AS sh -c 'echo x >> e'
try $AS ls ed
try $AS touch ed/y
try $AS sh -c 'echo x >> w'
try $AS cat n
try $AS cat plain

echo '== set-group-ID goes when someone outside the group sets an ACL'
touch sg; chown 1234:0 sg; chmod 2755 sg
$AS setfacl -m u:5678:r sg
modes sg; acl sg
"#;

/// The ext4 (or tmpfs) side: unmounted (and detached) on drop.
struct Reference {
    _ext4: Option<Ext4>,
    _tmpfs: Option<KernelMount>,
    dir: tempfile::TempDir,
    kind: &'static str,
}

fn reference() -> Reference {
    let dir = shm_tempdir();
    if let Some(ext4) = Ext4::new(dir.path(), 64 << 20) {
        return Reference {
            _ext4: Some(ext4),
            _tmpfs: None,
            dir,
            kind: "ext4",
        };
    }
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).expect("mkdir");
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"])
        .arg(&mp)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "mount tmpfs");
    Reference {
        _ext4: None,
        _tmpfs: Some(KernelMount(mp)),
        dir,
        kind: "tmpfs",
    }
}

/// Makes `root/t` for the script, with every directory above it open to uid 1234.
fn work_dir(top: &Path, mp: &Path) -> PathBuf {
    for p in [top, mp] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let t = mp.join("t");
    std::fs::create_dir(&t).expect("mkdir t");
    std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    t
}

fn run_script(script: &str, dir: &Path) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .env("R", dir)
        .env("AS", "setpriv --reuid=1234 --regid=1234 --clear-groups")
        .env("LC_ALL", "C")
        .output()
        .expect("sh");
    let mut s = String::from_utf8_lossy(&out.stdout).to_string();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    s
}

fn assert_same(what: &str, ours: &str, theirs: &str, kind: &str) {
    if ours == theirs {
        return;
    }
    let first = ours
        .lines()
        .zip(theirs.lines())
        .position(|(a, b)| a != b)
        .unwrap_or(ours.lines().count().min(theirs.lines().count()));
    panic!(
        "{what}: idxfs and {kind} differ from line {}\n--- idxfs:\n{ours}\n--- {kind}:\n{theirs}",
        first + 1
    );
}

/// Every file's ACLs and mode under `dir`, in sorted order.
const LISTING: &str = r#"cd "$R" && for f in $(find . | sort); do getfacl -n "$f" 2>&1; ls -ld "$f" | cut -d' ' -f1; done"#;

#[test]
fn acls_behave_as_on_ext4_and_survive_a_remount() {
    let r = reference();
    let mut m = Mounted::new("64M", "");
    let theirs_dir = work_dir(r.dir.path(), &r.dir.path().join("mnt"));
    let ours_dir = work_dir(m.dir.path(), &m.mp);
    let theirs = run_script(SCRIPT, &theirs_dir);
    let ours = run_script(SCRIPT, &ours_dir);
    // The script must have done what it says: ACLs inherited and enforced on the reference.
    assert!(theirs.contains("default:user:1234:rwx"), "{theirs}");
    assert!(theirs.contains("refused: setpriv"), "{theirs}");
    assert!(theirs.contains("ok: setpriv"), "{theirs}");
    assert_same("the script", &ours, &theirs, r.kind);

    let before = run_script(LISTING, &ours_dir);
    assert_same(
        "the listing",
        &before,
        &run_script(LISTING, &theirs_dir),
        r.kind,
    );
    m.unmount();
    m.assert_fsck_clean();
    m.mount("");
    assert_same(
        "the listing after a remount",
        &run_script(LISTING, &ours_dir),
        &before,
        "before",
    );
}

#[test]
fn with_noacl_acls_beyond_the_mode_are_refused_and_nothing_is_inherited() {
    let m = Mounted::new("64M", "noacl");
    let t = work_dir(m.dir.path(), &m.mp);
    let out = run_script(
        r#"cd "$R"
mkdir d
setfacl -m d:u:1234:rwx d 2>&1 | sed 's/^setfacl: //'
setfacl -m u:1234:rw d 2>&1 | sed 's/^setfacl: //'
setfacl --set u::rwx,g::r-x,o::- d && ls -ld d | cut -d' ' -f1
umask 077; touch d/f; ls -l d/f | cut -d' ' -f1
getfacl -n d/f | grep -c '^user:[0-9]' || true
"#,
        &t,
    );
    assert_eq!(
        out, "d: Operation not supported\nd: Operation not supported\ndrwxr-x---\n-rw-------\n0\n",
        "{out}"
    );
}
