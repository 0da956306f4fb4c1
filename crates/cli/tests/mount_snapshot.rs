//! Read-only snapshots through the CLI and the mount (issue 25): `idxfs snapshot` of an
//! unmounted image, changes through the mount afterwards, `-o snapshot=ID` serving the old
//! state read-only (EROFS for a write) while the file system has the new one, `--delete`
//! giving the space back, fsck clean after each step; bad input answered in one line. And
//! `--rollback`: the image made what a snapshot holds again, the later changes' space back,
//! refused on a mount; snapshots named by id or by name.
mod common;
use common::*;

fn used_bytes(p: &std::path::Path) -> u64 {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: statvfs(3) into a zeroed struct, with a valid C string.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0, "statvfs");
    (s.f_blocks - s.f_bfree) * s.f_frsize
}

/// A mount with `d/f0..` ("v1 I") and a file `big` of `big` bytes, unmounted, and snapshot
/// "before" (id 256) made of its image by the command.
fn with_snapshot(files: u32, big: u32) -> (Mounted, String, Vec<u8>) {
    let mut m = Mounted::root_only("256M", "");
    let old: Vec<u8> = (0..big).map(|i: u32| (i % 251) as u8).collect();
    std::fs::create_dir(m.path("d")).expect("mkdir");
    for i in 0..files {
        std::fs::write(m.path(&format!("d/f{i}")), format!("v1 {i}")).expect("write");
    }
    std::fs::write(m.path("big"), &old).expect("write");
    m.unmount();
    let img = m.image.to_str().expect("utf8").to_string();
    let (code, out, err) = idxfs(&["snapshot", &img, "before"]);
    assert_eq!(code, 0, "snapshot: {out}{err}");
    assert!(out.contains("snapshot 256"), "{out}");
    (m, img, old)
}

#[test]
fn a_snapshot_mounts_read_only_with_the_old_state_and_its_delete_gives_the_space_back() {
    let (mut m, img, old) = with_snapshot(100, 16 << 20);
    m.assert_fsck_clean();
    let (code, out, _) = idxfs(&["dump", &img, "roots"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("(256 SUBVOLUME 0)"),
        "dump of the roots tree: {out}"
    );
    // Changes after it: the snapshot's blocks stay, the new ones take more space.
    m.mount("");
    let base = used_bytes(&m.mp);
    std::fs::remove_dir_all(m.path("d")).expect("rm -r");
    std::fs::write(m.path("big"), vec![9u8; 16 << 20]).expect("overwrite");
    std::fs::write(m.path("new"), b"new").expect("write");
    assert!(
        used_bytes(&m.mp) >= base + (15 << 20),
        "the snapshot's blocks were freed"
    );
    m.unmount();
    m.assert_fsck_clean();
    m.mount("snapshot=256");
    assert_eq!(std::fs::read(m.path("big")).expect("read"), old);
    assert_eq!(
        std::fs::read_to_string(m.path("d/f7")).expect("read"),
        "v1 7"
    );
    assert!(!m.path("new").exists());
    let e = std::fs::write(m.path("x"), b"x").expect_err("a write into a snapshot");
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    assert!(
        mounts_line(&m.mp).is_some_and(|l| l.contains(" ro,")),
        "mounted read-write"
    );
    m.unmount();
    let (code, out, _) = idxfs(&["snapshot", &img, "--list"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("256\tbefore\t"), "{out}");
    // Bad input: one line each, nothing changed.
    for (args, want) in [
        (vec!["snapshot", &img, "a/b"], "no NUL or '/'"),
        (
            vec!["snapshot", &img, "before"],
            "a snapshot or subvolume named \"before\" exists",
        ),
        (
            vec!["snapshot", &img, "--delete", "999"],
            "no snapshot or subvolume 999",
        ),
    ] {
        let (code, out, err) = idxfs(&args);
        assert_ne!(code, 0, "{args:?}: {out}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let (code, out, err) = idxfs(&["snapshot", &img, "--delete", "256"]);
    assert_eq!(code, 0, "delete: {out}{err}");
    m.assert_fsck_clean();
    m.mount("");
    assert!(
        used_bytes(&m.mp) < base,
        "the snapshot's blocks did not come back"
    );
    assert_eq!(std::fs::read(m.path("new")).expect("read"), b"new");
    m.unmount();
}

#[test]
fn a_rollback_brings_back_what_the_snapshot_holds_and_a_mount_refuses_it() {
    let (mut m, img, old) = with_snapshot(50, 8 << 20);
    m.mount("");
    let base = used_bytes(&m.mp);
    std::fs::remove_dir_all(m.path("d")).expect("rm -r");
    std::fs::write(m.path("big"), vec![7u8; 8 << 20]).expect("overwrite");
    std::fs::write(m.path("new"), vec![1u8; 4 << 20]).expect("write");
    // Through the mount: refused in one line, nothing changed.
    let mp = m.mp.to_str().expect("utf8").to_string();
    let (code, out, err) = idxfs(&["snapshot", &mp, "--rollback", "256"]);
    assert_ne!(code, 0, "{out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("unmount it"), "{err}");
    assert!(m.path("new").exists());
    m.unmount();
    let (code, _, err) = idxfs(&["snapshot", &img, "--rollback", "999"]);
    assert_ne!(code, 0);
    assert!(err.contains("no snapshot 999"), "{err}");
    let (code, _, err) = idxfs(&["snapshot", &img, "--rollback", "nosuch"]);
    assert_ne!(code, 0);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no snapshot nosuch"), "{err}");
    // By name.
    let (code, out, err) = idxfs(&["snapshot", &img, "--rollback", "before"]);
    assert_eq!(code, 0, "rollback: {out}{err}");
    assert!(out.contains("rolled back to snapshot 256"), "{out}");
    m.assert_fsck_clean();
    m.mount("");
    assert_eq!(std::fs::read(m.path("big")).expect("read"), old);
    assert_eq!(
        std::fs::read_to_string(m.path("d/f7")).expect("read"),
        "v1 7"
    );
    assert!(!m.path("new").exists());
    // The snapshot stays, as it was.
    assert_eq!(
        std::fs::read(m.path(".snapshots/before/big")).expect("read"),
        old
    );
    // The later changes' blocks are free again (nothing but the rolled-back tree and the
    // snapshot, which share everything, names any block).
    let used = used_bytes(&m.mp);
    assert!(
        used <= base + (1 << 20),
        "{} bytes used after the rollback, {base} before the changes",
        used
    );
    std::fs::write(m.path("after"), b"writable").expect("write after the rollback");
    // A delete through the mount by name.
    let (code, out, err) = idxfs(&["snapshot", &mp, "--delete", "before"]);
    assert_eq!(code, 0, "delete by name: {out}{err}");
    assert!(!m.path(".snapshots/before").exists());
    m.unmount();
    m.assert_fsck_clean();
}

fn content(i: u64) -> Vec<u8> {
    (0..10_000u64).map(|j| (i * 31 + j * 7) as u8).collect()
}

/// `idxfs snapshot MOUNT NAME` while another thread writes: files made whole under a
/// temporary name and renamed into place, one after another. The snapshot is one point in
/// time: its renamed files are exactly the first k, each whole, and at most the k-th's
/// temporary file besides; the file system goes on with all of them. Then `--list` and
/// `--delete` through the mount, and fsck clean with the drop left to the next mount.
#[test]
fn a_snapshot_of_a_mount_beside_a_writer_is_one_point_in_time() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut m = Mounted::root_only("256M", "");
    let (mp, stop) = (m.mp.clone(), std::sync::Arc::new(AtomicBool::new(false)));
    let writer = {
        let (mp, stop) = (mp.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let tmp = mp.join(format!("tmp{i}"));
                std::fs::write(&tmp, content(i)).expect("write");
                std::fs::rename(&tmp, mp.join(format!("f{i}"))).expect("rename");
                i += 1;
            }
            i
        })
    };
    assert!(
        wait_for(20, || mp.join("f50").exists()),
        "the writer did not start"
    );
    let (code, out, err) = idxfs(&["snapshot", mp.to_str().expect("utf8"), "mid"]);
    assert_eq!(code, 0, "snapshot of a mount: {out}{err}");
    assert!(out.contains("snapshot 256"), "{out}");
    std::thread::sleep(std::time::Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let n = writer.join().expect("writer");
    let (code, out, _) = idxfs(&["snapshot", mp.to_str().expect("utf8"), "--list"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("256\tmid\t"), "{out}");
    m.unmount();
    m.assert_fsck_clean();
    m.mount("snapshot=256");
    let mut names: Vec<String> = std::fs::read_dir(&m.mp)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
        .collect();
    names.sort();
    let k = (0..)
        .take_while(|i| names.contains(&format!("f{i}")))
        .count() as u64;
    assert!(
        k >= 51 && k <= n,
        "the snapshot has f0..f{k}, the writer made {n}"
    );
    for i in 0..k {
        assert_eq!(
            std::fs::read(m.path(&format!("f{i}"))).expect("read"),
            content(i)
        );
    }
    for name in &names {
        let ok = name
            .strip_prefix('f')
            .is_some_and(|i| i.parse::<u64>().is_ok_and(|i| i < k))
            || *name == format!("tmp{k}");
        assert!(ok, "{name} in a snapshot holding f0..f{}", k - 1);
    }
    if names.contains(&format!("tmp{k}")) {
        let part = std::fs::read(m.path(&format!("tmp{k}"))).expect("read");
        assert!(
            content(k).starts_with(&part),
            "tmp{k} holds bytes it never had"
        );
    }
    m.unmount();
    m.mount("");
    assert_eq!(
        std::fs::read(m.path(&format!("f{}", n - 1))).expect("read"),
        content(n - 1)
    );
    let (code, out, err) = idxfs(&["snapshot", m.mp.to_str().expect("utf8"), "--delete", "256"]);
    assert_eq!(code, 0, "delete through the mount: {out}{err}");
    m.unmount();
    m.assert_fsck_clean();
}
