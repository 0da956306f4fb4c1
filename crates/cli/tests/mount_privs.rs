//! Privileges a change takes away (FUSE_HANDLE_KILLPRIV_V2, the engine's `privs`): the same
//! scenarios run on an idxfs mount and on tmpfs (the kernel's own rules, in its VFS), and the
//! resulting modes and capabilities must agree. Writes, truncates and fallocate by an
//! unprivileged user; chown by root; a root write to a file with capabilities.
mod common;
use common::*;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

const NOBODY: u32 = 65534;
const CAPS: &str = "security.capability";

/// A version-2 capability set (`struct vfs_cap_data`): effective, CAP_NET_RAW permitted.
fn caps_value() -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&0x0200_0001u32.to_le_bytes());
    for word in [1u32 << 13, 0, 0, 0] {
        v.extend_from_slice(&word.to_le_bytes());
    }
    v
}

fn c_path(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL")
}

fn has_caps(p: &Path) -> bool {
    let (path, name) = (c_path(p), CString::new(CAPS).expect("name"));
    let mut buf = [0u8; 64];
    // SAFETY: valid C strings and a buffer of the length passed.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    n > 0
}

fn set_caps(p: &Path) {
    setxattr(p, CAPS, &caps_value());
}

/// Runs `script` with `sh -c` as `uid` (root when 0), with `$F` the file.
fn run_as(uid: u32, file: &Path, script: &str) {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script).env("F", file);
    if uid != 0 {
        // std drops root's supplementary groups when it sets the uid.
        cmd.uid(uid).gid(uid);
    }
    let out = cmd.output().expect("run sh");
    assert!(
        out.status.success(),
        "{script} as {uid} on {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

struct Scenario {
    name: &'static str,
    mode: u32,
    caps: bool,
    /// The file's group.
    group: u32,
    uid: u32,
    script: &'static str,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "unprivileged write drops suid and sgid",
        mode: 0o6777,
        caps: false,
        group: 0,
        uid: NOBODY,
        script: "printf x >> \"$F\"",
    },
    Scenario {
        name: "unprivileged write from outside the group drops sgid",
        mode: 0o6767,
        caps: false,
        group: 0,
        uid: NOBODY,
        script: "printf x >> \"$F\"",
    },
    Scenario {
        name: "unprivileged write in the group keeps sgid w/o g+x",
        mode: 0o6767,
        caps: false,
        group: NOBODY,
        uid: NOBODY,
        script: "printf x >> \"$F\"",
    },
    Scenario {
        name: "root's write keeps both",
        mode: 0o6777,
        caps: false,
        group: 0,
        uid: 0,
        script: "printf x >> \"$F\"",
    },
    Scenario {
        name: "unprivileged truncate drops suid and sgid",
        mode: 0o6777,
        caps: false,
        group: 0,
        uid: NOBODY,
        script: "truncate -s 1 \"$F\"",
    },
    Scenario {
        name: "root's truncate keeps both",
        mode: 0o6777,
        caps: false,
        group: 0,
        uid: 0,
        script: "truncate -s 1 \"$F\"",
    },
    Scenario {
        name: "unprivileged fallocate drops suid and sgid",
        mode: 0o6777,
        caps: false,
        group: 0,
        uid: NOBODY,
        script: "fallocate -l 65536 \"$F\"",
    },
    Scenario {
        name: "root's chown drops suid and sgid",
        mode: 0o6755,
        caps: false,
        group: 0,
        uid: 0,
        script: "chown 65534 \"$F\"",
    },
    Scenario {
        name: "root's chown keeps sgid without group execute",
        mode: 0o2745,
        caps: false,
        group: 0,
        uid: 0,
        script: "chown 65534:65534 \"$F\"",
    },
    Scenario {
        name: "root's write drops capabilities",
        mode: 0o755,
        caps: true,
        group: 0,
        uid: 0,
        script: "printf x >> \"$F\"",
    },
    Scenario {
        name: "root's chmod keeps capabilities",
        mode: 0o755,
        caps: true,
        group: 0,
        uid: 0,
        script: "chmod 0750 \"$F\"",
    },
];

/// Runs every scenario in `root`; returns (mode, has capabilities) after each.
fn outcomes(root: &Path) -> Vec<(u32, bool)> {
    SCENARIOS
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let f = root.join(format!("f{i}"));
            std::fs::write(&f, b"data").expect("create");
            // In this order: a chown drops capabilities.
            std::os::unix::fs::chown(&f, None, Some(s.group)).expect("chgrp");
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(s.mode)).expect("chmod");
            if s.caps {
                set_caps(&f);
            }
            run_as(s.uid, &f, s.script);
            let mode = std::fs::metadata(&f).expect("stat").permissions().mode() & 0o7777;
            (mode, has_caps(&f))
        })
        .collect()
}

#[test]
fn changes_drop_privileges_as_on_tmpfs() {
    let m = Mounted::new("64M", "");
    let reference = shm_tempdir();
    for d in [&m.mp, &reference.path().to_path_buf()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).expect("chmod root");
    }
    let want = outcomes(reference.path());
    let have = outcomes(&m.mp);
    for ((s, w), h) in SCENARIOS.iter().zip(&want).zip(&have) {
        eprintln!(
            "{:<52} tmpfs {:04o} caps {:<5} idxfs {:04o} caps {}",
            s.name, w.0, w.1, h.0, h.1
        );
    }
    for ((s, w), h) in SCENARIOS.iter().zip(&want).zip(&have) {
        assert_eq!(h, w, "{}: idxfs against tmpfs", s.name);
    }
    // The reference itself did what the scenarios say, so agreeing means something.
    assert_eq!(want[0], (0o777, false));
    assert_eq!(want[1], (0o767, false));
    assert_eq!(want[2], (0o2767, false));
    assert_eq!(want[3], (0o6777, false));
    assert_eq!(want[9], (0o755, false));
    assert_eq!(want[10], (0o750, true));
    // Still so after the engine wrote it all down.
    let mut m = m;
    m.unmount();
    m.mount("");
    let again: Vec<(u32, bool)> = (0..SCENARIOS.len())
        .map(|i| {
            let f = m.mp.join(format!("f{i}"));
            let mode = std::fs::metadata(&f).expect("stat").permissions().mode() & 0o7777;
            (mode, has_caps(&f))
        })
        .collect();
    assert_eq!(again, have, "after a remount");
    m.unmount();
    m.assert_fsck_clean();
}
