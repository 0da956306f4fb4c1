//! A hostile unprivileged user (uid 65534) tries to exhaust names, links, xattrs, directory
//! depth and space on a mount shared with others (`allow_other`). Each attempt must end in a
//! plain refusal (EMLINK, ENOSPC, ...), never a read-only or stopped file system: after each,
//! root creates, writes and fsyncs, another user deletes and rewrites their own file, and at
//! the end fsck is clean.
//!
//! The attacker is this test binary again, run as uid 65534 with `IDXFS_ATTACK=kind:dir`,
//! in the `attacker` entry below (which does nothing when the variable is absent).
mod common;
use common::*;
use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const ATTACKER: u32 = 65534;
const NEIGHBOUR: u32 = 65533;

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// Runs one attack as the attacker; returns its report line ("count errno").
fn attack(kind: &str, dir: &Path) -> (u64, i32) {
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "attacker", "--nocapture", "--test-threads=1"])
        .env("IDXFS_ATTACK", format!("{kind}:{}", dir.display()))
        .uid(ATTACKER)
        .gid(ATTACKER)
        .output()
        .expect("run the attacker");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let line = text
        .lines()
        .find_map(|l| l.split("ATTACK RESULT ").nth(1))
        .unwrap_or_else(|| panic!("no result from the {kind} attack:\n{text}"));
    let mut it = line.split(' ').map(|v| v.parse::<i64>().unwrap_or(-1));
    let (n, e) = (it.next().unwrap_or(-1), it.next().unwrap_or(-1));
    eprintln!("attack {kind}: {n} done, then errno {e}");
    (n as u64, e as i32)
}

/// The attacker's side. Each kind goes on until the file system refuses, and reports how far
/// it got and the errno of the refusal.
#[test]
fn attacker() {
    let Ok(spec) = std::env::var("IDXFS_ATTACK") else {
        return; // run as a plain test: nothing to do
    };
    let (kind, dir) = spec.split_once(':').expect("kind:dir");
    let dir = PathBuf::from(dir);
    let (n, e) = match kind {
        "names" => {
            // 255-byte names in one directory.
            let d = dir.join("names");
            fs::create_dir(&d).expect("mkdir");
            let mut n = 0u64;
            loop {
                let mut name = format!("{n:010}").into_bytes();
                name.resize(255, b'n');
                match fs::File::create(d.join(OsString::from_vec(name))) {
                    Ok(_) if n < 30_000 => n += 1,
                    Ok(_) => break (n, 0),
                    Err(e) => break (n, errno_of(&e)),
                }
            }
        }
        "links" => {
            // Hard links with long names to one file, in one directory.
            let d = dir.join("links");
            fs::create_dir(&d).expect("mkdir");
            fs::write(d.join("f"), b"x").expect("create");
            let mut n = 1u64;
            loop {
                let mut name = format!("{n:010}").into_bytes();
                name.resize(250, b'l');
                match fs::hard_link(d.join("f"), d.join(OsString::from_vec(name))) {
                    Ok(()) => n += 1,
                    Err(e) => break (n, errno_of(&e)),
                }
            }
        }
        "xattrs" => {
            // Long names with the largest values, on one file.
            let f = dir.join("xattrs");
            fs::write(&f, b"").expect("create");
            let c = std::ffi::CString::new(f.as_os_str().as_encoded_bytes()).expect("c");
            let value = vec![7u8; 65536];
            let mut n = 0u64;
            loop {
                let name = format!("user.{n:06}{}", "x".repeat(240));
                let cn = std::ffi::CString::new(name).expect("c");
                // SAFETY: valid C strings and a buffer of the given length.
                let r = unsafe {
                    libc::setxattr(
                        c.as_ptr(),
                        cn.as_ptr(),
                        value.as_ptr().cast(),
                        value.len(),
                        0,
                    )
                };
                if r != 0 {
                    break (
                        n,
                        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1),
                    );
                }
                n += 1;
            }
        }
        "depth" => {
            // A chain of directories 3,000 deep, then moves that would make a cycle.
            let top = dir.join("deep");
            fs::create_dir(&top).expect("mkdir");
            std::env::set_current_dir(&top).expect("chdir");
            let mut n = 0u64;
            while n < 3000 {
                if let Err(e) = fs::create_dir("d").and_then(|_| std::env::set_current_dir("d")) {
                    println!("ATTACK RESULT {n} {}", errno_of(&e));
                    return;
                }
                n += 1;
            }
            fs::write("bottom", b"deep").expect("write at the bottom");
            // Moving the top of the chain into its own bottom: EINVAL, after a walk up all
            // 3,000 levels.
            let e = fs::rename(&top, "moved").expect_err("a cycle");
            (n, errno_of(&e))
        }
        "space" => {
            // Big writes until the device refuses, a huge fallocate, then small files.
            let f = dir.join("space");
            let mut h = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o644)
                .open(&f)
                .expect("create");
            let chunk = vec![1u8; 1 << 20];
            let mut n = 0u64;
            let e = loop {
                match h.write_all(&chunk) {
                    Ok(()) => n += 1,
                    Err(e) => break errno_of(&e),
                }
            };
            assert_eq!(e, libc::ENOSPC, "big writes end in ENOSPC");
            use std::os::fd::AsRawFd;
            // SAFETY: a valid descriptor.
            let r = unsafe { libc::fallocate(h.as_raw_fd(), 0, 0, 1 << 40) };
            assert_eq!(r, -1);
            let mut i = 0;
            let e = loop {
                match fs::write(dir.join(format!("small{i}")), vec![2u8; 5000]) {
                    Ok(()) if i < 5000 => i += 1,
                    Ok(()) => break 0,
                    Err(e) => break errno_of(&e),
                }
            };
            (n, e)
        }
        k => panic!("unknown attack {k}"),
    };
    println!("ATTACK RESULT {n} {e}");
}

/// Runs `script` as the neighbour; panics with its output unless it succeeds.
fn as_neighbour(m: &Mounted, script: &str, what: &str) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("cd {} && {script}", m.path("neighbour").display()))
        .uid(NEIGHBOUR)
        .gid(NEIGHBOUR)
        .output()
        .expect("run as the neighbour");
    assert!(
        out.status.success(),
        "the neighbour could not {what}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What everyone else must still be able to do: root creates, writes 1 MiB and fsyncs (into
/// the root reserve if need be); the neighbour reads and deletes their own files (deletes
/// never need free space) and writes in the space that frees. At the very edge of a full
/// device a new file needs the worst-case headroom of its metadata (a few hundred KiB with
/// 16 KiB nodes), so the neighbour frees 2 MiB and writes 1 MiB.
fn others_still_work(m: &Mounted, round: usize) {
    let p = m.path(&format!("root-after-{round}"));
    let mut f = fs::File::create(&p).unwrap_or_else(|e| panic!("root create after {round}: {e}"));
    f.write_all(&vec![9u8; 1 << 20])
        .unwrap_or_else(|e| panic!("root write after {round}: {e}"));
    f.sync_all()
        .unwrap_or_else(|e| panic!("root fsync after {round}: {e}"));
    // Closed before the remove: an open file keeps its blocks after its last name goes, and
    // root's megabyte (written into the root reserve) would then leave the neighbour's
    // megabyte only half the 2 MiB they free below.
    drop(f);
    fs::remove_file(&p).expect("root remove");
    as_neighbour(
        m,
        &format!(
            "cat stash{round} >/dev/null && rm stash{round} && dd if=/dev/zero of=new{round} bs=64k count=16 2>&1"
        ),
        &format!("delete 2 MiB and write 1 MiB after round {round}"),
    );
}

#[test]
fn a_hostile_user_cannot_stop_anyone_else() {
    let mut m = Mounted::new("512M", "");
    let arena = m.path("hostile");
    fs::create_dir(&arena).expect("mkdir");
    std::os::unix::fs::chown(&arena, Some(ATTACKER), Some(ATTACKER)).expect("chown");
    let mine = m.path("neighbour");
    fs::create_dir(&mine).expect("mkdir");
    std::os::unix::fs::chown(&mine, Some(NEIGHBOUR), Some(NEIGHBOUR)).expect("chown");
    fs::set_permissions(m.path(""), fs::Permissions::from_mode(0o755)).expect("chmod");
    // The neighbour's files, one to give up after each round.
    as_neighbour(
        &m,
        "for i in 0 1 2 3 4 5 6 7 8; do dd if=/dev/zero of=stash$i bs=64k count=32 2>&1 || exit 1; done",
        "write their files",
    );
    others_still_work(&m, 0);

    let (n, e) = attack("names", &arena);
    assert_eq!((n, e), (30_000, 0), "30,000 long names");
    others_still_work(&m, 1);

    let (n, e) = attack("links", &arena);
    assert_eq!(
        (n, e),
        (65_000, libc::EMLINK),
        "LINK_MAX links, then EMLINK"
    );
    others_still_work(&m, 2);

    let (n, e) = attack("xattrs", &arena);
    assert_eq!(
        e,
        libc::ENOSPC,
        "xattrs end when the names fill a listxattr answer"
    );
    assert!(n >= 200, "{n} xattrs of 64 KiB");
    others_still_work(&m, 3);

    let (n, e) = attack("depth", &arena);
    assert_eq!((n, e), (3000, libc::EINVAL), "3,000 levels, then no cycle");
    others_still_work(&m, 4);

    let (n, e) = attack("space", &arena);
    assert_eq!(e, libc::ENOSPC);
    assert!(
        n > 100,
        "{n} MiB before the device was full (for the attacker)"
    );
    others_still_work(&m, 5);

    // Root takes it all back; the image is whole, before and after a remount.
    let st = Command::new("rm")
        .arg("-rf")
        .arg(&arena)
        .status()
        .expect("rm -rf");
    assert!(st.success());
    others_still_work(&m, 6);
    m.unmount();
    m.assert_fsck_clean();
    m.mount("");
    others_still_work(&m, 7);
    m.unmount();
    m.assert_fsck_clean();
}
