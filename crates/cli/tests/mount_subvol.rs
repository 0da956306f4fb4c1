//! Writable subvolumes made from snapshots (issue 25's clones) through the CLI and the
//! mount: `idxfs snapshot IMAGE --clone SNAP NAME`, `-o subvol=ID` serving it writable while
//! the file system's own tree keeps its state, `--list` naming both and which is active,
//! `-o subvol=5` back to the file system's own tree, the origin refused a delete while the
//! clone lives, `--delete` of the clone and then of the origin, fsck clean after each step.
mod common;
use common::*;

/// `idxfs ARGS`, which must succeed: its standard output.
fn ok(args: &[&str]) -> String {
    let (code, out, err) = idxfs(args);
    assert_eq!(code, 0, "idxfs {args:?}: {out}{err}");
    out
}

#[test]
fn a_clone_mounts_writable_beside_the_file_system_and_goes_with_its_origin() {
    let mut m = Mounted::root_only("256M", "");
    std::fs::create_dir(m.path("d")).expect("mkdir");
    std::fs::write(m.path("d/f"), b"v1").expect("write");
    std::fs::write(m.path("big"), vec![5u8; 8 << 20]).expect("write");
    m.unmount();
    let img = m.image.to_str().expect("utf8").to_string();
    ok(&["snapshot", &img, "base"]);
    let out = ok(&["snapshot", &img, "--clone", "base", "work"]);
    assert!(out.contains("subvolume 257 (work)"), "{out}");
    let (code, _, err) = idxfs(&["snapshot", &img, "--clone", "base", "work"]);
    assert!(code != 0 && err.contains("exists"), "{err}");
    let (code, _, err) = idxfs(&["snapshot", &img, "--clone", "nosuch", "other"]);
    assert!(code != 0 && err.contains("no snapshot nosuch"), "{err}");
    m.assert_fsck_clean();

    // The clone, changed.
    m.mount("subvol=257");
    assert_eq!(std::fs::read(m.path("d/f")).expect("read"), b"v1");
    std::fs::write(m.path("d/f"), b"clone").expect("write");
    std::fs::remove_file(m.path("big")).expect("rm");
    std::fs::write(m.path("new"), b"only in the clone").expect("write");
    m.unmount();
    m.assert_fsck_clean();
    let out = ok(&["snapshot", &img, "--list"]);
    assert!(
        out.contains("257\twork\tfrom snapshot 256 (active)"),
        "{out}"
    );

    // A plain mount keeps the active one; subvol=5 is the file system's own tree again.
    m.mount("");
    assert_eq!(std::fs::read(m.path("d/f")).expect("read"), b"clone");
    m.unmount();
    m.mount("subvol=5");
    assert_eq!(std::fs::read(m.path("d/f")).expect("read"), b"v1");
    assert_eq!(
        std::fs::read(m.path("big")).expect("read"),
        vec![5u8; 8 << 20]
    );
    assert!(!m.path("new").exists());
    std::fs::write(m.path("d/f"), b"own").expect("write");
    m.unmount();
    m.mount("subvol=257");
    assert_eq!(std::fs::read(m.path("d/f")).expect("read"), b"clone");
    m.unmount();
    let (code, _, err) = idxfs(&[
        "mount",
        &img,
        m.mp.to_str().expect("utf8"),
        "-o",
        "subvol=999",
    ]);
    assert!(code != 0 && err.contains("no subvolume 999"), "{err}");
    m.assert_fsck_clean();

    // The origin stays while the clone does; then both go.
    let (code, _, err) = idxfs(&["snapshot", &img, "--delete", "base"]);
    assert!(code != 0 && err.contains("made from the snapshot"), "{err}");
    let (code, _, err) = idxfs(&["snapshot", &img, "--delete", "work"]);
    assert!(code != 0 && err.contains("open"), "the active one: {err}");
    m.mount("subvol=5");
    m.unmount();
    ok(&["snapshot", &img, "--delete", "work"]);
    ok(&["snapshot", &img, "--delete", "base"]);
    let out = ok(&["snapshot", &img, "--list"]);
    assert!(
        out.contains("no snapshots") && !out.contains("writable"),
        "{out}"
    );
    m.assert_fsck_clean();
    m.mount("");
    assert_eq!(std::fs::read(m.path("d/f")).expect("read"), b"own");
}

/// `idxfs subvolume create|list|delete` and `--clone` on a mount (its server makes them,
/// parked: the mount goes on serving its own tree) and on an image; an empty subvolume
/// mounts with an empty root, keeps what was written in it, and deletes like a clone;
/// `-o subvol=NAME` and `-o snapshot=NAME` mount by name; a mount shows the parked ones
/// in its snapshots directory, and rmdir there takes an empty one only.
#[test]
fn subvolumes_are_made_listed_and_deleted_on_a_mount_and_on_an_image() {
    let mut m = Mounted::root_only("256M", "");
    std::fs::write(m.path("f"), b"own").expect("write");
    let mp = m.mp.to_str().expect("utf8").to_string();
    let img = m.image.to_str().expect("utf8").to_string();
    let out = ok(&["subvolume", "create", &mp, "scratch"]);
    assert!(
        out.contains("subvolume 256 (scratch), writable, empty"),
        "{out}"
    );
    ok(&["snapshot", &mp, "base"]);
    let out = ok(&["snapshot", &mp, "--clone", "base", "work"]);
    assert!(out.contains("subvolume 258 (work)"), "{out}");
    // Bad input: one line each.
    for (args, want) in [
        (vec!["subvolume", "create", &mp, "a/b"], "no NUL or '/'"),
        (
            vec!["subvolume", "create", &mp, "work"],
            "a snapshot or subvolume named \"work\" exists",
        ),
        (
            vec!["snapshot", &mp, "--clone", "nosuch", "x"],
            "no snapshot nosuch",
        ),
        (
            vec!["subvolume", "delete", &mp, "nosuch"],
            "no snapshot or subvolume nosuch",
        ),
        (vec!["subvolume", "delete", &mp, "base"], "in use"),
        (
            vec!["subvolume", "create", &img, "x"],
            "in use by an idxfs server (mounted); unmount it first",
        ),
        (
            vec!["subvolume", "list", "/nonexistent/x.img"],
            "No such file or directory",
        ),
    ] {
        let (code, out, err) = idxfs(&args);
        assert_ne!(code, 0, "{args:?}: {out}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // The mount still serves its own tree, and shows the parked ones beside the
    // snapshots, writable (`a_parked_subvolume_is_served_writable_in_the_snapshots_directory`).
    assert_eq!(std::fs::read(m.path("f")).expect("read"), b"own");
    let shown = |m: &Mounted| {
        let mut names: Vec<String> = std::fs::read_dir(m.path(".snapshots"))
            .expect("list .snapshots")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(shown(&m), ["base", "scratch", "work"]);
    assert_eq!(
        std::fs::read(m.path(".snapshots/work/f")).expect("read in the parked clone"),
        b"own"
    );
    let e = std::fs::write(m.path(".snapshots/base/x"), b"x").expect_err("a snapshot");
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let e = std::fs::remove_dir(m.path(".snapshots/work")).expect_err("not empty");
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY), "{e}");
    ok(&["subvolume", "create", &mp, "tmp"]);
    std::fs::remove_dir(m.path(".snapshots/tmp")).expect("rmdir of an empty subvolume");
    assert_eq!(shown(&m), ["base", "scratch", "work"]);
    let out = ok(&["subvolume", "list", &mp]);
    for want in [
        "5\t(the file system's own tree) (active)",
        "256\tscratch\tmade empty",
        "258\twork\tfrom snapshot 257",
    ] {
        assert!(out.contains(want), "{want:?} in {out}");
    }
    m.unmount();
    m.assert_fsck_clean();

    // The empty one: an empty root, written to, kept.
    m.mount("subvol=256");
    assert_eq!(
        std::fs::read_dir(&m.mp).expect("list").count(),
        0,
        "an empty subvolume's root"
    );
    std::fs::write(m.path("g"), vec![9u8; 3 << 20]).expect("write");
    m.unmount();
    m.assert_fsck_clean();
    // By name too.
    m.mount("subvol=work");
    assert_eq!(std::fs::read(m.path("f")).expect("read"), b"own");
    assert!(!m.path("g").exists());
    m.unmount();
    let (code, _, err) = idxfs(&["mount", &img, &mp, "-o", "subvol=nosuch"]);
    assert!(code != 0 && err.contains("no subvolume nosuch"), "{err}");
    m.mount("snapshot=base");
    assert_eq!(std::fs::read(m.path("f")).expect("read"), b"own");
    m.unmount();
    m.mount("subvol=256");
    assert_eq!(
        std::fs::read(m.path("g")).expect("read"),
        vec![9u8; 3 << 20]
    );
    m.unmount();

    // Deleted: the clone on a mount of the file system's own tree, the empty one on the image.
    m.mount("subvol=5");
    let (code, _, err) = idxfs(&["subvolume", "delete", &mp, "5"]);
    assert!(code != 0, "the file system's own tree: {err}");
    ok(&["subvolume", "delete", &mp, "work"]);
    m.unmount();
    ok(&["subvolume", "delete", &img, "scratch"]);
    ok(&["snapshot", &img, "--delete", "base"]);
    let out = ok(&["subvolume", "list", &img]);
    assert_eq!(out.lines().count(), 1, "{out}");
    m.assert_fsck_clean();
    m.mount("");
    assert_eq!(std::fs::read(m.path("f")).expect("read"), b"own");
}

/// Beside another writable subvolume, the file system's own tree restores from its own
/// snapshots (`cp` out of `.snapshots`, `idxfs cp` of a whole snapshot) and rolls back to
/// them; a parked subvolume's tree shown at `.snapshots/NAME` is not restored by sharing
/// (`idxfs cp` copies its bytes, as plain `cp` does). `--list` says which tree each
/// snapshot was taken of.
#[test]
fn restores_and_rollbacks_beside_a_subvolume_follow_lineage() {
    let mut m = Mounted::root_only("256M", "");
    std::fs::write(m.path("f"), vec![1u8; 300_000]).expect("write");
    m.unmount();
    let img = m.image.to_str().expect("utf8").to_string();
    let mp = m.mp.to_str().expect("utf8").to_string();
    ok(&["snapshot", &img, "s1"]);
    ok(&["subvolume", "create", &img, "scratch"]);
    let out = ok(&["snapshot", &img, "--list"]);
    assert!(out.contains("\ts1\tgeneration "), "{out}");
    assert!(out.contains("\tof the file system's own tree"), "{out}");

    m.mount("");
    std::fs::write(m.path("f"), vec![2u8; 300_000]).expect("overwrite");
    let st = std::process::Command::new("cp")
        .arg(m.path(".snapshots/s1/f"))
        .arg(m.path("back"))
        .status()
        .expect("cp");
    assert!(st.success());
    assert_eq!(
        std::fs::read(m.path("back")).expect("read"),
        vec![1u8; 300_000]
    );
    ok(&["cp", &format!("{mp}/.snapshots/s1"), &format!("{mp}/whole")]);
    assert_eq!(
        std::fs::read(m.path("whole/f")).expect("read"),
        vec![1u8; 300_000]
    );
    // Another tree's: copied as `cp -a` would, its bytes and not its blocks.
    ok(&[
        "cp",
        &format!("{mp}/.snapshots/scratch"),
        &format!("{mp}/x"),
    ]);
    assert!(m.path("x").is_dir());
    m.unmount();
    m.assert_fsck_clean();

    ok(&["snapshot", &img, "--rollback", "s1"]);
    m.assert_fsck_clean();
    m.mount("");
    assert_eq!(
        std::fs::read(m.path("f")).expect("read"),
        vec![1u8; 300_000]
    );
    assert!(!m.path("back").exists() && !m.path("whole").exists());
    m.unmount();
    // In the subvolume: its own snapshot rolls back; the file system's does not.
    m.mount("subvol=scratch");
    std::fs::write(m.path("g"), b"in scratch").expect("write");
    m.unmount();
    ok(&["snapshot", &img, "s2"]);
    let out = ok(&["snapshot", &img, "--list"]);
    assert!(out.contains("\ts2\tgeneration "), "{out}");
    assert!(out.contains("\tof subvolume 257"), "{out}");
    let (code, _, err) = idxfs(&["snapshot", &img, "--rollback", "s1"]);
    assert!(
        code != 0 && err.contains("snapshot of another subvolume"),
        "{err}"
    );
    m.mount("subvol=scratch");
    std::fs::remove_file(m.path("g")).expect("rm");
    m.unmount();
    ok(&["snapshot", &img, "--rollback", "s2"]);
    m.mount("");
    assert_eq!(std::fs::read(m.path("g")).expect("read"), b"in scratch");
    m.unmount();
    m.assert_fsck_clean();
}

/// A writable snapshot restores from and rolls back to its own snapshots through the
/// binary: `cp` out of `.snapshots` (its own blocks shared, and its origin's where it still
/// names them in that file: a file it never changed comes back in no new space; the rest
/// of its origin's copied), `idxfs cp` of a whole snapshot, and `--rollback`, fsck clean
/// after each; a snapshot of the file system's own tree is still not its to roll back to.
#[test]
fn a_writable_snapshot_restores_from_and_rolls_back_to_its_own_snapshots() {
    use std::os::unix::fs::FileExt;
    let mut m = Mounted::root_only("256M", "");
    std::fs::write(m.path("f"), vec![1u8; 300_000]).expect("write");
    std::fs::write(m.path("u"), vec![4u8; 8 << 20]).expect("write");
    m.unmount();
    let img = m.image.to_str().expect("utf8").to_string();
    let mp = m.mp.to_str().expect("utf8").to_string();
    ok(&["snapshot", &img, "s0"]);
    ok(&["subvolume", "snapshot", &img, "ws"]);
    m.mount("subvol=ws");
    // Its own bytes in the middle of the file, its origin's around them.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(m.path("f"))
        .expect("open");
    f.write_all_at(&[2u8; 40_960], 81_920).expect("pwrite");
    drop(f);
    let mut want = vec![1u8; 300_000];
    want[81_920..122_880].fill(2);
    ok(&["snapshot", &mp, "mine"]);
    std::fs::write(m.path("f"), vec![3u8; 300_000]).expect("overwrite");
    let st = std::process::Command::new("cp")
        .arg(m.path(".snapshots/mine/f"))
        .arg(m.path("back"))
        .status()
        .expect("cp");
    assert!(st.success());
    assert!(std::fs::read(m.path("back")).expect("read") == want);
    let before = used_bytes(&m.mp);
    let st = std::process::Command::new("cp")
        .arg(m.path(".snapshots/mine/u"))
        .arg(m.path("u2"))
        .status()
        .expect("cp");
    assert!(st.success());
    let grew = used_bytes(&m.mp).saturating_sub(before);
    assert!(
        grew < 1 << 20,
        "restoring an unchanged 8 MiB file took {grew} bytes (its blocks should be shared)"
    );
    assert!(std::fs::read(m.path("u2")).expect("read") == vec![4u8; 8 << 20]);
    ok(&[
        "cp",
        &format!("{mp}/.snapshots/mine"),
        &format!("{mp}/whole"),
    ]);
    assert!(std::fs::read(m.path("whole/f")).expect("read") == want);
    m.unmount();
    m.assert_fsck_clean();

    let (code, _, err) = idxfs(&["snapshot", &img, "--rollback", "s0"]);
    assert!(
        code != 0 && err.contains("snapshot of another subvolume"),
        "{err}"
    );
    ok(&["snapshot", &img, "--rollback", "mine"]);
    m.assert_fsck_clean();
    m.mount("");
    assert!(std::fs::read(m.path("f")).expect("read") == want);
    assert!(!m.path("back").exists() && !m.path("whole").exists() && !m.path("u2").exists());
    m.unmount();
    m.mount("subvol=5");
    assert_eq!(
        std::fs::read(m.path("f")).expect("read"),
        vec![1u8; 300_000]
    );
    m.unmount();
    m.assert_fsck_clean();
}

/// `idxfs subvolume snapshot [-r] TARGET NAME`, as btrfs's: a writable snapshot of the tree
/// served, on an image and on a mount, listed as a subvolume (its origin by no one), served
/// with `-o subvol=NAME` and changed alone, shown read-only in a mount's snapshots
/// directory; with -r a read-only snapshot; deleted, nothing is left and fsck is clean.
#[test]
fn writable_snapshots_on_an_image_and_a_mount() {
    let mut m = Mounted::root_only("256M", "");
    std::fs::write(m.path("f"), b"one").expect("write");
    m.unmount();
    let img = m.image.to_str().expect("utf8").to_string();
    let mp = m.mp.to_str().expect("utf8").to_string();
    let out = ok(&["subvolume", "snapshot", &img, "ws"]);
    assert!(
        out.contains("(ws), a writable snapshot of the file system's own tree"),
        "{out}"
    );
    let out = ok(&["subvolume", "snapshot", "-r", &img, "ro"]);
    assert!(out.contains("snapshot 258 (ro)"), "{out}");
    let out = ok(&["subvolume", "list", &img]);
    assert!(
        out.contains("257\tws\twritable snapshot of the file system's own tree"),
        "{out}"
    );
    // Its origin (256) is listed by no one, nor deleted by name or id.
    let out = ok(&["snapshot", &img, "--list"]);
    assert!(out.contains("258\tro\t") && !out.contains("256\t"), "{out}");
    let (code, _, err) = idxfs(&["snapshot", &img, "--delete", "256"]);
    assert!(
        code != 0 && err.contains("no snapshot or subvolume 256"),
        "{err}"
    );
    let (code, _, err) = idxfs(&["subvolume", "snapshot", &img, "ro"]);
    assert!(code != 0 && err.contains("exists"), "{err}");
    m.assert_fsck_clean();

    m.mount("subvol=ws");
    assert_eq!(std::fs::read(m.path("f")).expect("read"), b"one");
    std::fs::write(m.path("f"), b"two").expect("write");
    // On a mount: of the tree it serves, shown read-only beside it.
    ok(&["subvolume", "snapshot", &mp, "ws2"]);
    std::fs::write(m.path("f"), b"three").expect("write");
    assert_eq!(
        std::fs::read(m.path(".snapshots/ws2/f")).expect("read"),
        b"two"
    );
    let out = ok(&["subvolume", "list", &mp]);
    assert!(
        out.contains("\tws2\twritable snapshot of subvolume 257"),
        "{out}"
    );
    m.unmount();
    m.assert_fsck_clean();
    m.mount("subvol=5");
    assert_eq!(std::fs::read(m.path("f")).expect("read"), b"one");
    m.unmount();
    m.mount("subvol=ws2");
    assert_eq!(std::fs::read(m.path("f")).expect("read"), b"two");
    m.unmount();

    m.mount("subvol=5");
    for which in ["ws", "ws2", "ro"] {
        ok(&["subvolume", "delete", &mp, which]);
    }
    m.unmount();
    // The hidden origins went with their last uses; an unmounted delete finishes the drops.
    m.mount("");
    ok(&["snapshot", &mp, "--list"]);
    m.unmount();
    let out = ok(&["subvolume", "list", &img]);
    assert!(!out.contains("ws"), "{out}");
    m.assert_fsck_clean();
}

/// Another user may read a shared mount (`allow_other`) but not make, clone or delete its
/// snapshots and subvolumes: each request is refused (EPERM from the server: root and the
/// mount's owner only) in one line naming the mount once, and nothing is made or deleted.
#[test]
fn another_user_cannot_make_or_delete_snapshots_or_subvolumes() {
    let mut m = Mounted::new("256M", "");
    std::fs::write(m.path("f"), b"own").expect("write");
    let mp = m.mp.clone();
    let (code, out, err) = idxfs(&["snapshot", mp.to_str().expect("utf8"), "base"]);
    assert_eq!(code, 0, "{out}{err}");
    let path = |s: &str| std::path::PathBuf::from(s);
    let asks: [&[&str]; 6] = [
        &["snapshot", "MP", "mine"],
        &["snapshot", "MP", "--clone", "base", "mine"],
        &["snapshot", "MP", "--delete", "base"],
        &["subvolume", "create", "MP", "mine"],
        &["subvolume", "snapshot", "MP", "mine"],
        &["subvolume", "snapshot", "-r", "MP", "mine"],
    ];
    for ask in asks {
        let args: Vec<std::path::PathBuf> = ask
            .iter()
            .map(|a| match *a {
                "MP" => mp.clone(),
                a => path(a),
            })
            .collect();
        let args: Vec<&std::path::Path> = args.iter().map(|p| p.as_path()).collect();
        let (ok, err) = as_user(bin(), &args);
        let once = format!(
            "idxfs: {}: only root or the mount's owner may snapshot it",
            mp.display()
        );
        assert!(
            !ok && err.trim_end() == once,
            "{ask:?} as another user: {err}"
        );
    }
    let (code, out, err) = idxfs(&["snapshot", mp.to_str().expect("utf8"), "--list"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("\tbase\t") && !out.contains("mine") && !out.contains("writable"),
        "{out}"
    );
    m.unmount();
    m.assert_fsck_clean();
}

/// A parked writable subvolume is served writable at `.snapshots/NAME` beside the mount's
/// own tree (`Fs::open_subvolume` behind the mount): every kind of change inside it, with
/// inode numbers of its own; EXDEV for a rename or link between it and the file system's
/// tree, as between two btrfs subvolumes, while `cp` across copies the bytes and `cp`
/// inside it shares them; a file unlinked while open is read to its end; `chattr +C`,
/// `idxfs cp` and `idxfs rm` inside it and across; an fsync in it survives a SIGKILL of
/// the server; and what the mount wrote there is the subvolume's own when it is mounted
/// by itself. fsck clean after each.
#[test]
fn a_parked_subvolume_is_served_writable_in_the_snapshots_directory() {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::MetadataExt;
    let mut m = Mounted::root_only("256M", "");
    let mp = m.mp.to_str().expect("utf8").to_string();
    std::fs::write(m.path("own"), vec![7u8; 200_000]).expect("write");
    ok(&["subvolume", "create", &mp, "scratch"]);
    let sub = m.path(".snapshots/scratch");
    let p = |rel: &str| sub.join(rel);
    let errno = |r: std::io::Result<()>| r.expect_err("refused").raw_os_error();

    std::fs::create_dir(p("d")).expect("mkdir in the subvolume");
    std::fs::write(p("d/f"), vec![3u8; 300_000]).expect("write");
    std::fs::rename(p("d/f"), p("f")).expect("rename inside");
    std::fs::hard_link(p("f"), p("d/g")).expect("link inside");
    std::os::unix::fs::symlink("f", p("s")).expect("symlink");
    setxattr(&p("f"), "user.k", b"v");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(p("f"))
        .expect("open");
    file.set_len(100_000).expect("truncate");
    drop(file);
    std::fs::set_permissions(p("f"), std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    let f = std::fs::metadata(p("f")).expect("stat");
    let own = std::fs::metadata(m.path("own")).expect("stat");
    assert_eq!((f.nlink(), f.len(), f.mode() & 0o7777), (2, 100_000, 0o600));
    assert_eq!(
        std::fs::read_link(p("s")).expect("readlink").to_str(),
        Some("f")
    );
    assert_eq!(f.dev(), own.dev(), "one mount");
    assert_ne!(f.ino(), own.ino(), "numbers of its own");
    assert_eq!(
        std::fs::read(m.path("own")).expect("read"),
        vec![7u8; 200_000]
    );
    assert!(!m.path("f").exists() && !m.path("d").exists());

    // Between trees: EXDEV for rename and link; cp copies across and shares inside.
    let exdev = Some(libc::EXDEV);
    assert_eq!(errno(std::fs::rename(m.path("own"), p("own"))), exdev);
    assert_eq!(errno(std::fs::rename(p("f"), m.path("f"))), exdev);
    assert_eq!(errno(std::fs::hard_link(m.path("own"), p("own"))), exdev);
    let cp = |a: &std::path::Path, b: &std::path::Path| {
        let st = std::process::Command::new("cp").arg(a).arg(b).status();
        assert!(st.expect("cp").success(), "cp {a:?} {b:?}");
    };
    cp(&m.path("own"), &p("own"));
    cp(&p("f"), &m.path("f"));
    assert_eq!(std::fs::read(p("own")).expect("read"), vec![7u8; 200_000]);
    assert_eq!(
        std::fs::read(m.path("f")).expect("read"),
        vec![3u8; 100_000]
    );
    std::fs::write(p("big"), vec![9u8; 16 << 20]).expect("write");
    let before = used_bytes(&m.mp);
    cp(&p("big"), &p("big2"));
    let grew = used_bytes(&m.mp).saturating_sub(before);
    assert!(grew < 4 << 20, "a copy inside shares: {grew} bytes used");
    assert_eq!(std::fs::read(p("big2")).expect("read"), vec![9u8; 16 << 20]);

    // An open file keeps its data past its last name (its pin is the subvolume's).
    let mut open = std::fs::File::open(p("d/g")).expect("open");
    std::fs::remove_file(p("f")).expect("unlink");
    std::fs::remove_file(p("d/g")).expect("unlink the last name");
    let mut data = Vec::new();
    open.read_to_end(&mut data).expect("read after the unlink");
    assert_eq!(data, vec![3u8; 100_000]);
    open.rewind().expect("seek");
    drop(open);

    // chattr +C; idxfs cp and rm inside and across.
    let st = std::process::Command::new("chattr")
        .arg("+C")
        .arg(p("d"))
        .status();
    assert!(st.expect("chattr").success());
    std::fs::write(p("d/n"), b"nocow").expect("write");
    let out = std::process::Command::new("lsattr")
        .arg(p("d/n"))
        .output()
        .expect("lsattr");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains('C'),
        "{out:?}"
    );
    let s = |rel: &str| format!("{mp}/.snapshots/scratch/{rel}");
    ok(&["cp", &s("d"), &s("d2")]);
    assert_eq!(std::fs::read(p("d2/n")).expect("read"), b"nocow");
    ok(&["cp", &s("d"), &format!("{mp}/from_sub")]);
    ok(&["cp", &format!("{mp}/own"), &s("own2")]);
    assert_eq!(std::fs::read(m.path("from_sub/n")).expect("read"), b"nocow");
    assert_eq!(std::fs::read(p("own2")).expect("read"), vec![7u8; 200_000]);
    ok(&["rm", &s("d2")]);
    assert!(!p("d2").exists());

    // The snapshots directory's entries are cached as any (a walk asks nothing), and the
    // server drops them when what they show comes or goes by command: a subvolume deleted
    // so no longer shows, one made shows at once, and the directory's link count follows.
    let links = || {
        std::fs::metadata(m.path(".snapshots"))
            .expect("stat")
            .nlink()
    };
    ok(&["subvolume", "create", &mp, "gone"]);
    std::fs::write(p("../gone/x"), b"x").expect("write in another subvolume");
    // Its attributes cached too (a stat after the write): nothing asks the server again.
    std::fs::metadata(p("../gone")).expect("stat");
    let before = links();
    ok(&["subvolume", "delete", &mp, "gone"]);
    assert!(!p("../gone").exists(), "a deleted subvolume still shows");
    assert_eq!(links(), before - 1);
    assert!(!p("../later").exists());
    ok(&["snapshot", &mp, "later"]);
    assert!(p("../later/own").exists(), "a snapshot made shows at once");
    assert_eq!(links(), before);
    ok(&["snapshot", &mp, "--delete", "later"]);

    // fsyncs inside (the first a commit, the next a batch of the log naming the tree), then
    // the server killed: the bytes are there at the next mount, read-only (the log replayed
    // in memory) and writable.
    for (name, byte) in [("durable", 5u8), ("durable2", 6)] {
        let mut f = std::fs::File::create(p(name)).expect("create");
        f.write_all(&vec![byte; 70_000]).expect("write");
        f.sync_all().expect("fsync in the subvolume");
    }
    m.kill();
    m.assert_fsck_clean();
    for o in ["ro", ""] {
        m.mount(o);
        for (name, byte) in [("durable", 5u8), ("durable2", 6)] {
            assert_eq!(
                std::fs::read(p(name)).unwrap_or_else(|e| panic!("read {name} ({o}): {e}")),
                vec![byte; 70_000],
                "{name} ({o})"
            );
        }
        if o == "ro" {
            m.unmount();
        }
    }
    // An empty root only goes by rmdir; what it holds stays.
    let e = std::fs::remove_dir(&sub).expect_err("not empty");
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY), "{e}");
    m.unmount();
    m.assert_fsck_clean();

    // Mounted by itself: what the mount wrote there.
    m.mount("subvol=scratch");
    let mut names: Vec<String> = std::fs::read_dir(&m.mp)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["big", "big2", "d", "durable", "durable2", "own", "own2", "s"]
    );
    assert_eq!(std::fs::read(m.path("d/n")).expect("read"), b"nocow");
    assert_eq!(
        std::fs::read(m.path("big2")).expect("read"),
        vec![9u8; 16 << 20]
    );
    m.unmount();
    m.mount("subvol=5");
    assert_eq!(
        std::fs::read(m.path("f")).expect("read"),
        vec![3u8; 100_000]
    );
    assert_eq!(std::fs::read(m.path("from_sub/n")).expect("read"), b"nocow");
    m.unmount();
    m.assert_fsck_clean();
}
