//! `idxfs bench snapshot` (issue 25): a snapshot of a tree of small files, and the delete of
//! a tree of them, beside what the kernel file systems offer, for two file counts a factor
//! of ten apart (a snapshot's cost should not follow the count):
//! - **snapshot**: idxfs's `Fs::snapshot` (the library call on the unmounted image, two
//!   commits included) and `idxfs snapshot IMAGE NAME` (the command: open, snapshot, close),
//!   each the fastest of `ROUNDS`, and `idxfs snapshot MOUNT NAME` of the tree imported into
//!   a mount (`idxfs import`; the command's syncfs and ioctl, the server's two commits);
//!   `btrfs subvolume snapshot` of a subvolume holding the tree; `cp -a` of the tree on ext4,
//!   until synced (what a file system without snapshots has).
//! - **writable snapshot**: idxfs's `Fs::writable_snapshot` (a clone of the tree with a
//!   hidden origin made with it: two commits on the unmounted image, as the read-only
//!   snapshot), `Fs::make_clone` of the first snapshot (a commit), and the open that makes the clone the active tree and closes it
//!   (`OpenOptions::subvolume`: the open's own work, the switch's commits, the close), and
//!   the same open and close without a switch, each the fastest of `ROUNDS`; btrfs's
//!   snapshot row is writable already. And in a clone and in the file system's own tree, a
//!   file made, written (4 KiB) and fsynced in a directory of the tree, beside the same
//!   ended by a commit instead (`fsyncs`): the fsync log at work in a clone; and the clone
//!   opened beside the file system's own tree (`Fs::open_subvolume`), where the same fsync
//!   commits, and that open and close alone; and through a mount, the same fsync in its own
//!   tree and in a writable snapshot of it served beside at `.snapshots/NAME`.
//! - **rollback** after the same changes at both counts (`mistake`: a directory of 1,000
//!   files removed, 100 files of 4 KiB made): idxfs's `Fs::rollback` on the unmounted image
//!   (its commits included; the fastest of `ROUNDS`, the mistake made again before each),
//!   in the file system's own tree and in a writable snapshot back to a snapshot of it;
//!   btrfs's way, `btrfs subvolume delete` of the subvolume and `btrfs subvolume snapshot`
//!   of the snapshot in its place, until both return. ext4 has none.
//! - **remove a tree from a mount**, until synced: `idxfs rm` (inside the server) and
//!   `rm -rf` (a request per name through FUSE), each on a fresh mount the tree was
//!   imported into; ext4's `rm -rf` is its delete row.
//! - **copy a tree inside a mount**, until synced: `idxfs cp` (inside the server, data
//!   shared) and `cp -a` (requests per name through FUSE, each file's data shared by
//!   copy_file_range), each on a fresh mount the tree was imported into; ext4's `cp -a` is
//!   its snapshot row.
//! - **delete a tree nobody else holds**: idxfs: a snapshot whose files the file system has
//!   since removed, `Fs::delete_snapshot` until it returns, and the drop until the space is
//!   back; btrfs: `btrfs subvolume delete` of the subvolume (its snapshot deleted first)
//!   until it returns, and `btrfs subvolume sync` until the space is back; ext4: `rm -rf`
//!   of the copy, until synced.
//!
//! The tree is `bench_import`'s source: files of 0 to 4 KiB in directories of 1,000, put in
//! place untimed (idxfs: `mkfs --from`; the others: `cp -a` into the mount).
use crate::bench_env::{self, FsKind, Target};
use crate::bench_suite::Scale;
use idxfs_blockdev::FileDevice;
use idxfs_engine::{Fs, OpenOptions};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

/// (snapshot seconds, delete-returns seconds, space-back seconds) of one file system and
/// count; `cli`: idxfs's command, for its snapshot row.
#[derive(Default, Clone, Copy)]
struct Times {
    snap: f64,
    cli: f64,
    /// `idxfs snapshot MOUNT NAME`.
    mount: f64,
    /// idxfs only: `Fs::writable_snapshot`, `Fs::make_clone`, an open that makes the clone
    /// active, then closes, and the same open and close of the active tree (no switch).
    writable: Option<f64>,
    clone: Option<f64>,
    clone_open: Option<f64>,
    plain_open: Option<f64>,
    /// idxfs only, medians (`fsyncs`): create, write and fsync in a clone and in the file
    /// system's own tree, and the same ended by a commit in the clone.
    fsync_clone: Option<f64>,
    fsync_own: Option<f64>,
    commit_clone: Option<f64>,
    /// idxfs only: the same fsync in the clone opened beside the file system's own tree
    /// (a commit), and that open and close (`Fs::open_subvolume`; the fastest of `ROUNDS`).
    fsync_beside: Option<f64>,
    open_beside: Option<f64>,
    /// idxfs only, medians through a mount (`mount_fsyncs`): the same fsync in the mount's
    /// own tree, and in a writable snapshot of it served beside at `.snapshots/NAME`.
    mount_fsync_own: Option<f64>,
    mount_fsync_beside: Option<f64>,
    /// Back to the snapshot after `mistake`; None where the file system has no way.
    rollback: Option<f64>,
    /// idxfs only: the same in a writable snapshot, back to a snapshot of it.
    rollback_clone: Option<f64>,
    /// idxfs only: the tree removed from a mount by `idxfs rm` and by `rm -rf`, until synced.
    rm: Option<f64>,
    rm_rf: Option<f64>,
    /// idxfs only: the tree copied inside a mount by `idxfs cp` and by `cp -a`, until synced.
    cp: Option<f64>,
    cp_a: Option<f64>,
    returns: f64,
    back: f64,
}

/// idxfs's snapshot and command are timed this many times, the fastest kept (a fraction of
/// a millisecond: one sample is mostly noise).
const ROUNDS: usize = 3;

fn secs(f: impl FnOnce() -> Result<(), String>) -> Result<f64, String> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64())
}

fn open(img: &Path) -> Result<Fs, String> {
    open_tree(img, None)
}

/// `open` with writable tree `id` made active (None: the active one).
fn open_tree(img: &Path, id: Option<u64>) -> Result<Fs, String> {
    let dev = FileDevice::open(img, true).map_err(|e| format!("{}: {e}", img.display()))?;
    let opts = OpenOptions {
        subvolume: id,
        commit_interval: None,
        ..OpenOptions::default()
    };
    Fs::open(Arc::new(dev), opts).map_err(|e| format!("{}: {e}", img.display()))
}

/// Each side of `fsyncs` is timed this many times, the median kept.
const FSYNCS: usize = 100;

/// In writable tree `id`, a file made in directory `d00000`, 4 KiB written to it and the
/// file fsynced (the log: its cost follows the change), and the same ended by a commit
/// instead (what an fsync in a clone cost before it logged), alternately; the medians.
/// `beside`: the tree is opened beside the file system's own (`Fs::open_subvolume`), whose
/// fsyncs log too, in batches that name the tree.
fn fsyncs(img: &Path, id: u64, beside: bool) -> Result<(f64, f64), String> {
    let e = |e: idxfs_engine::Error| e.to_string();
    let dev = FileDevice::open(img, true).map_err(|e| format!("{}: {e}", img.display()))?;
    let o = OpenOptions {
        subvolume: Some(if beside {
            idxfs_format::FS_SUBVOL_ID
        } else {
            id
        }),
        commit_interval: None,
        ..OpenOptions::default()
    };
    let active = Fs::open(Arc::new(dev), o).map_err(e)?;
    let fs = match beside {
        true => active.open_subvolume(id).map_err(e)?,
        false => active,
    };
    let owner = idxfs_engine::fs::Owner::default();
    let d = fs.lookup(1, b"d00000").map_err(e)?.ino;
    // A mount appends to the log once a commit of its own names a chain.
    // Names of its own: the clone may have had its fsyncs timed in place first.
    let tag = if beside { "beside-" } else { "" };
    fs.create(d, format!("{tag}fsync-start").as_bytes(), 0o644, owner)
        .map_err(e)?;
    fs.sync().map_err(e)?;
    let (mut logged, mut committed) = (Vec::new(), Vec::new());
    for i in 0..2 * FSYNCS {
        let commit = i % 2 == 1;
        let s = secs(|| {
            let name = format!("{tag}fsync{i}");
            let a = (fs.create(d, name.as_bytes(), 0o644, owner)).map_err(e)?;
            fs.write(a.ino, 0, &[7u8; 4096]).map_err(e)?;
            match commit {
                true => fs.sync().map_err(e),
                false => fs.fsync(a.ino).map_err(e),
            }
        })?;
        match commit {
            true => committed.push(s),
            false => logged.push(s),
        }
    }
    if fs.counters().log_batches.get() < FSYNCS as u64 {
        return Err(format!(
            "tree {id}: its fsyncs committed instead of logging"
        ));
    }
    fs.close().map_err(e)?;
    Ok((
        crate::bench::median(logged),
        crate::bench::median(committed),
    ))
}

/// Writable tree `id` opened beside the file system's own and closed (`Fs::open_subvolume`:
/// its state set up, its orphans looked for, and the close's commit), the fastest of
/// `ROUNDS`, the file system opened once.
fn open_beside(img: &Path, id: u64) -> Result<f64, String> {
    let e = |e: idxfs_engine::Error| e.to_string();
    let fs = open(img)?;
    let mut best = f64::INFINITY;
    for _ in 0..ROUNDS {
        best = best.min(secs(|| {
            let sub = fs.open_subvolume(id).map_err(e)?;
            sub.close().map_err(e)
        })?);
    }
    fs.close().map_err(e)?;
    Ok(best)
}

/// Removes every file and directory under the root (the file system's own copy of the tree,
/// so that the snapshot alone holds it).
fn empty_root(fs: &Fs) -> Result<(), String> {
    let e = |e: idxfs_engine::Error| e.to_string();
    for d in fs.list(1).map_err(e)? {
        for f in fs.list(d.ino).map_err(e)? {
            fs.unlink(d.ino, &f.name).map_err(e)?;
        }
        fs.rmdir(1, &d.name).map_err(e)?;
    }
    Ok(())
}

/// The changes a rollback undoes, the same whatever the tree holds: directory `d00000` (up
/// to 1,000 files) removed, and 100 files of 4 KiB made in a new directory.
fn mistake(fs: &Fs) -> Result<(), String> {
    let e = |e: idxfs_engine::Error| e.to_string();
    let owner = idxfs_engine::fs::Owner::default();
    let d = fs.lookup(1, b"d00000").map_err(e)?.ino;
    for f in fs.list(d).map_err(e)? {
        fs.unlink(d, &f.name).map_err(e)?;
    }
    fs.rmdir(1, b"d00000").map_err(e)?;
    let n = fs.mkdir(1, b"new", 0o755, owner).map_err(e)?.ino;
    for i in 0..100 {
        let a = fs.create(n, format!("n{i}").as_bytes(), 0o644, owner);
        fs.write(a.map_err(e)?.ino, 0, &[7u8; 4096]).map_err(e)?;
    }
    fs.sync().map_err(e)
}

/// `mistake` made in `fs` (open on `img`) and rolled back to snapshot `snap` `ROUNDS` times,
/// the fastest kept: a rollback takes about a millisecond, where one sample is mostly the
/// machine's noise. `tree`: the writable tree `fs` has active (None: the image's active
/// one). Returns the time and the file system open again.
fn rollbacks(img: &Path, mut fs: Fs, snap: u64, tree: Option<u64>) -> Result<(f64, Fs), String> {
    let mut best = f64::INFINITY;
    for _ in 0..ROUNDS {
        mistake(&fs)?;
        let s = secs(|| fs.rollback(snap).map(|_| ()).map_err(|e| e.to_string()))?;
        best = best.min(s);
        fs = open_tree(img, tree)?;
        if fs.lookup(1, b"d00000").is_err() || fs.lookup(1, b"new").is_ok() {
            return Err("the rollback did not bring the tree back".into());
        }
    }
    Ok((best, fs))
}

/// `rollbacks` in writable snapshot `id`, to a snapshot of it taken first (deleted after,
/// and the file system's own tree made active again, untimed).
fn rollback_in(img: &Path, id: u64) -> Result<f64, String> {
    let e = |e: idxfs_engine::Error| e.to_string();
    let fs = open_tree(img, Some(id))?;
    let snap = fs.snapshot(b"of the writable snapshot").map_err(e)?;
    let (best, fs) = rollbacks(img, fs, snap, Some(id))?;
    fs.delete_snapshot(snap).map_err(e)?;
    fs.finish_drops().map_err(e)?;
    fs.close().map_err(e)?;
    open_tree(img, Some(idxfs_format::FS_SUBVOL_ID))?
        .close()
        .map_err(e)?;
    Ok(best)
}

fn idxfs(src: &Path, base: &Path, bytes: u64) -> Result<Times, String> {
    let img = base.join("snap.img");
    let _ = std::fs::remove_file(&img);
    let mut mkfs = Command::new(bench_env::self_exe());
    mkfs.args(["mkfs", "--size", &bytes.to_string(), "--from"]);
    bench_env::run(mkfs.arg(src).arg(&img))?;
    let mut t = Times {
        snap: f64::INFINITY,
        cli: f64::INFINITY,
        ..Times::default()
    };
    let fs = open(&img)?;
    for i in 0..ROUNDS {
        let name = format!("lib{i}");
        let s = secs(|| {
            fs.snapshot(name.as_bytes())
                .map(|_| ())
                .map_err(|e| e.to_string())
        })?;
        t.snap = t.snap.min(s);
    }
    let first = (fs.snapshots().map_err(|e| e.to_string())?)
        .first()
        .map(|s| s.id)
        .ok_or("no snapshot")?;
    let (mut clone, mut clone_open) = (f64::INFINITY, f64::INFINITY);
    let mut clones = Vec::new();
    for i in 0..ROUNDS {
        let name = format!("clone{i}");
        let s = secs(|| {
            let id = fs
                .make_clone(first, name.as_bytes())
                .map_err(|e| e.to_string())?;
            clones.push(id);
            Ok(())
        })?;
        clone = clone.min(s);
    }
    let mut writable = f64::INFINITY;
    let mut writables = Vec::new();
    for i in 0..ROUNDS {
        let name = format!("writable{i}");
        let s = secs(|| {
            let id = (fs.writable_snapshot(name.as_bytes())).map_err(|e| e.to_string())?;
            writables.push(id);
            Ok(())
        })?;
        writable = writable.min(s);
    }
    t.writable = Some(writable);
    fs.close().map_err(|e| e.to_string())?;
    let open_close = |id: Option<u64>| {
        secs(|| {
            let dev = FileDevice::open(&img, true).map_err(|e| e.to_string())?;
            let o = OpenOptions {
                subvolume: id,
                commit_interval: None,
                ..OpenOptions::default()
            };
            let fs = Fs::open(Arc::new(dev), o).map_err(|e| e.to_string())?;
            fs.close().map_err(|e| e.to_string())
        })
    };
    // Each open makes another tree active: a clone, the file system's own, in turn; and
    // between them one that keeps the active tree (the open's own cost).
    let mut plain_open = f64::INFINITY;
    for c in clones.iter().copied() {
        clone_open = clone_open.min(open_close(Some(c))?);
        clone_open = clone_open.min(open_close(Some(idxfs_format::FS_SUBVOL_ID))?);
        plain_open = plain_open.min(open_close(None)?);
    }
    (t.clone, t.clone_open) = (Some(clone), Some(clone_open));
    t.plain_open = Some(plain_open);
    let (logged, committed) = fsyncs(&img, clones[0], false)?;
    (t.fsync_clone, t.commit_clone) = (Some(logged), Some(committed));
    t.fsync_own = Some(fsyncs(&img, idxfs_format::FS_SUBVOL_ID, false)?.0);
    t.fsync_beside = Some(fsyncs(&img, clones[0], true)?.0);
    t.open_beside = Some(open_beside(&img, clones[0])?);
    t.rollback_clone = Some(rollback_in(&img, writables[0])?);
    // Untimed: the clones go before the rollback, whose row measures it alone.
    let fs = open(&img)?;
    for id in clones.into_iter().chain(writables) {
        fs.delete_snapshot(id).map_err(|e| e.to_string())?;
    }
    fs.finish_drops().map_err(|e| e.to_string())?;
    fs.close().map_err(|e| e.to_string())?;
    for i in 0..ROUNDS {
        let mut cmd = Command::new(bench_env::self_exe());
        cmd.arg("snapshot").arg(&img).arg(format!("cli{i}"));
        t.cli = t.cli.min(secs(|| bench_env::run(&mut cmd).map(|_| ()))?);
    }
    let mut fs = open(&img)?;
    let ids: Vec<u64> = (fs.snapshots().map_err(|e| e.to_string())?)
        .iter()
        .map(|s| s.id)
        .collect();
    let (rollback, again) = rollbacks(&img, fs, ids[0], None)?;
    t.rollback = Some(rollback);
    fs = again;
    // All but the first go untimed; the file system lets go of its copy of the tree.
    for &id in &ids[1..] {
        fs.delete_snapshot(id).map_err(|e| e.to_string())?;
    }
    fs.finish_drops().map_err(|e| e.to_string())?;
    empty_root(&fs)?;
    fs.sync().map_err(|e| e.to_string())?;
    t.returns = secs(|| fs.delete_snapshot(ids[0]).map_err(|e| e.to_string()))?;
    t.back = t.returns
        + secs(|| {
            fs.finish_drops()
                .and_then(|()| fs.sync())
                .map_err(|e| e.to_string())
        })?;
    fs.close().map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&img);
    Ok(t)
}

/// A fresh idxfs mount with the tree imported into it at `tree`, and that path.
fn imported(src: &Path, base: &Path, bytes: u64) -> Result<(Target, PathBuf), String> {
    let t = Target::make(base, FsKind::Idxfs, bytes, 0)?;
    let tree = t.mp.join("tree");
    bench_env::run(
        Command::new(bench_env::self_exe())
            .arg("import")
            .arg(src)
            .arg(&tree),
    )?;
    Ok((t, tree))
}

/// `idxfs snapshot MOUNT NAME` of the tree imported into a fresh mount, the fastest of
/// `ROUNDS`.
fn idxfs_mounted(src: &Path, base: &Path, bytes: u64) -> Result<f64, String> {
    let (t, _tree) = imported(src, base, bytes)?;
    let mut best = f64::INFINITY;
    for i in 0..ROUNDS {
        let mut cmd = Command::new(bench_env::self_exe());
        cmd.arg("snapshot").arg(&t.mp).arg(format!("m{i}"));
        best = best.min(secs(|| bench_env::run(&mut cmd).map(|_| ()))?);
    }
    Ok(best)
}

/// Through a mount the tree was imported into: a file made in `tree/d00000`, 4 KiB written,
/// fsynced and closed, in the mount's own tree (the log) and in a writable snapshot of it
/// served beside at `.snapshots/w` (`idxfs subvolume snapshot MOUNT w`; its log batches name
/// its tree), alternately; the medians of `FSYNCS` each.
fn mount_fsyncs(src: &Path, base: &Path, bytes: u64) -> Result<(f64, f64), String> {
    use std::io::Write;
    let (t, tree) = imported(src, base, bytes)?;
    bench_env::run(
        Command::new(bench_env::self_exe())
            .args(["subvolume", "snapshot"])
            .arg(&t.mp)
            .arg("w"),
    )?;
    let dirs = [tree.join("d00000"), t.mp.join(".snapshots/w/tree/d00000")];
    let (mut own, mut beside) = (Vec::new(), Vec::new());
    // The first fsync of a mount commits (a chain of its own comes with its first commit), and
    // so does the first in `w` after it opens (only a chain a commit made while a tree is
    // open beside may name trees).
    for i in 0..2 * FSYNCS + 2 {
        let p = dirs[i % 2].join(format!("mount-fsync{i}"));
        let s = secs(|| {
            let mut f = std::fs::File::create(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            f.write_all(&[7u8; 4096])
                .and_then(|()| f.sync_all())
                .map_err(|e| format!("{}: {e}", p.display()))
        })?;
        if i >= 2 {
            [&mut own, &mut beside][i % 2].push(s);
        }
    }
    drop(t);
    Ok((crate::bench::median(own), crate::bench::median(beside)))
}

/// The tree imported into a fresh mount, then removed, until synced: by `idxfs rm` (inside
/// the server) or by `rm -rf` (a request per name through FUSE).
fn idxfs_removed(src: &Path, base: &Path, bytes: u64, in_server: bool) -> Result<f64, String> {
    let (t, tree) = imported(src, base, bytes)?;
    secs(|| {
        match in_server {
            true => bench_env::run(Command::new(bench_env::self_exe()).arg("rm").arg(&tree)),
            false => bench_env::run(Command::new("rm").arg("-rf").arg(&tree)),
        }?;
        bench_env::run(Command::new(bench_env::self_exe()).arg("sync").arg(&t.mp)).map(|_| ())
    })
}

/// The tree imported into a fresh mount, then copied beside itself, until synced: by
/// `idxfs cp` (inside the server) or by `cp -a` (requests per name through FUSE).
fn idxfs_copied(src: &Path, base: &Path, bytes: u64, in_server: bool) -> Result<f64, String> {
    let (t, tree) = imported(src, base, bytes)?;
    let copy = t.mp.join("copy");
    secs(|| {
        match in_server {
            true => bench_env::run(
                Command::new(bench_env::self_exe())
                    .arg("cp")
                    .arg(&tree)
                    .arg(&copy),
            ),
            false => bench_env::run(Command::new("cp").arg("-a").arg(&tree).arg(&copy)),
        }?;
        bench_env::run(Command::new(bench_env::self_exe()).arg("sync").arg(&t.mp)).map(|_| ())
    })
}

fn sync(p: &Path) -> Result<(), String> {
    bench_env::run(Command::new("sync").arg("-f").arg(p)).map(|_| ())
}

fn btrfs(src: &Path, base: &Path, bytes: u64, inodes: u64) -> Result<Times, String> {
    let t = Target::make(base, FsKind::Btrfs, bytes, inodes)?;
    let (sv, snap) = (t.mp.join("sv"), t.mp.join("snap"));
    let btrfs = |args: &[&str], p: &Path| bench_env::run(Command::new("btrfs").args(args).arg(p));
    btrfs(&["subvolume", "create"], &sv)?;
    let mut from = src.as_os_str().to_owned();
    from.push("/.");
    bench_env::run(Command::new("cp").arg("-a").arg(from).arg(&sv))?;
    sync(&t.mp)?;
    let mut r = Times::default();
    r.snap = secs(|| {
        bench_env::run(
            Command::new("btrfs")
                .args(["subvolume", "snapshot"])
                .arg(&sv)
                .arg(&snap),
        )
        .map(|_| ())
    })?;
    r.cli = r.snap;
    // The same mistake, undone as btrfs users do: the subvolume replaced by a snapshot of
    // its snapshot.
    bench_env::run(Command::new("rm").arg("-rf").arg(sv.join("d00000")))?;
    std::fs::create_dir(sv.join("new")).map_err(|e| e.to_string())?;
    for i in 0..100 {
        std::fs::write(sv.join(format!("new/n{i}")), [7u8; 4096]).map_err(|e| e.to_string())?;
    }
    sync(&t.mp)?;
    r.rollback = Some(secs(|| {
        btrfs(&["subvolume", "delete"], &sv)?;
        bench_env::run(
            Command::new("btrfs")
                .args(["subvolume", "snapshot"])
                .arg(&snap)
                .arg(&sv),
        )
        .map(|_| ())
    })?);
    btrfs(&["subvolume", "delete"], &snap)?;
    btrfs(&["subvolume", "sync"], &t.mp)?;
    r.returns = secs(|| btrfs(&["subvolume", "delete"], &sv).map(|_| ()))?;
    r.back = r.returns + secs(|| btrfs(&["subvolume", "sync"], &t.mp).map(|_| ()))?;
    Ok(r)
}

fn ext4(src: &Path, base: &Path, bytes: u64, inodes: u64) -> Result<Times, String> {
    let t = Target::make(base, FsKind::Ext4, bytes, inodes)?;
    let (a, b) = (t.mp.join("a"), t.mp.join("b"));
    std::fs::create_dir(&a).map_err(|e| format!("{}: {e}", a.display()))?;
    let mut from = src.as_os_str().to_owned();
    from.push("/.");
    bench_env::run(Command::new("cp").arg("-a").arg(from).arg(&a))?;
    sync(&t.mp)?;
    let mut r = Times::default();
    r.snap = secs(|| {
        bench_env::run(Command::new("cp").arg("-a").arg(&a).arg(&b))?;
        sync(&t.mp)
    })?;
    r.cli = r.snap;
    r.returns = secs(|| {
        bench_env::run(Command::new("rm").arg("-rf").arg(&b))?;
        sync(&t.mp)
    })?;
    r.back = r.returns;
    Ok(r)
}

fn ms(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.0} us", s * 1e6)
    } else if s < 10.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.1} s")
    }
}

pub fn snapshot(scale: Scale, fs: &[FsKind], base: &Path) -> Result<(String, Value), String> {
    let big = scale.pick(5_000u64, 100_000, 1_000_000);
    let counts = [big / 10, big];
    let mut text = format!(
        "snapshot: of a tree of N files of 0-4 KiB in directories of 1,000, and the delete of a \
         tree nobody else holds, N = {} and {}\n",
        counts[0], counts[1]
    );
    let mut raw = serde_json::Map::new();
    let mut rows: Vec<(String, [Times; 2])> = Vec::new();
    let mut per = |label: &str, i: usize, t: Times| match rows.iter_mut().find(|r| r.0 == label) {
        Some(r) => r.1[i] = t,
        None => {
            let mut both = [Times::default(); 2];
            both[i] = t;
            rows.push((label.to_string(), both));
        }
    };
    for (i, &n) in counts.iter().enumerate() {
        let src = base.join("snapshot-src");
        let _ = std::fs::remove_dir_all(&src);
        let data = crate::bench_import::source(&src, n)?;
        let dirs = n.div_ceil(1_000);
        let inodes = (2 * n + dirs) * 5 / 4 + 1024;
        // Two copies of the tree (ext4's `cp -a`), each file up to a 4 KiB block beside its
        // bytes, with a quarter to spare (a sparse image file: only what is used takes memory).
        let bytes = ((n * 4096 + data) * 2 * 5 / 4)
            .max(1 << 30)
            .div_ceil(1 << 20)
            << 20;
        for &k in fs {
            bench_env::interrupted()?;
            eprintln!("  {}, {n} files", k.name());
            match k {
                FsKind::Idxfs => {
                    let mut t = idxfs(&src, base, bytes)?;
                    t.mount = idxfs_mounted(&src, base, bytes)?;
                    t.rm = Some(idxfs_removed(&src, base, bytes, true)?);
                    t.rm_rf = Some(idxfs_removed(&src, base, bytes, false)?);
                    t.cp = Some(idxfs_copied(&src, base, bytes, true)?);
                    t.cp_a = Some(idxfs_copied(&src, base, bytes, false)?);
                    let (own, beside) = mount_fsyncs(&src, base, bytes)?;
                    t.mount_fsync_own = Some(own);
                    t.mount_fsync_beside = Some(beside);
                    per("idxfs", i, t)
                }
                FsKind::Btrfs => per("btrfs", i, btrfs(&src, base, bytes, inodes)?),
                FsKind::Ext4 => per("ext4 (cp -a, rm -rf)", i, ext4(&src, base, bytes, inodes)?),
                _ => {}
            }
        }
        let _ = std::fs::remove_dir_all(&src);
    }
    text.push_str(&format!(
        "{:<24} {:>12} {:>12} {:>8} {:>14} {:>14} {:>14} {:>14}\n",
        "",
        format!("snap {}", counts[0]),
        format!("snap {}", counts[1]),
        "ratio",
        format!("del {} ret", counts[0]),
        format!("del {} ret", counts[1]),
        format!("{} back", counts[0]),
        format!("{} back", counts[1]),
    ));
    for (label, t) in &rows {
        text.push_str(&format!(
            "{label:<24} {:>12} {:>12} {:>7.2}x {:>14} {:>14} {:>14} {:>14}\n",
            ms(t[0].snap),
            ms(t[1].snap),
            t[1].snap / t[0].snap,
            ms(t[0].returns),
            ms(t[1].returns),
            ms(t[0].back),
            ms(t[1].back),
        ));
        if let [Some(a), Some(b)] = [t[0].rollback, t[1].rollback] {
            text.push_str(&format!(
                "{:<24} {:>12} {:>12} {:>7.2}x\n",
                format!("{label} rollback"),
                ms(a),
                ms(b),
                b / a
            ));
        }
        if let [Some(a), Some(b)] = [t[0].rollback_clone, t[1].rollback_clone] {
            text.push_str(&format!(
                "{:<24} {:>12} {:>12} {:>7.2}x\n",
                "  in a writable snapshot",
                ms(a),
                ms(b),
                b / a
            ));
        }
        // Rows measured at both counts, with their ratio; the others are left out.
        let ratio_rows = |text: &mut String, rows: &[(&str, [Option<f64>; 2])]| {
            for (what, v) in rows {
                if let [Some(a), Some(b)] = *v {
                    text.push_str(&format!(
                        "{what:<24} {:>12} {:>12} {:>7.2}x\n",
                        ms(a),
                        ms(b),
                        b / a
                    ));
                }
            }
        };
        ratio_rows(
            &mut text,
            &[
                ("idxfs rm MOUNT/tree", [t[0].rm, t[1].rm]),
                ("rm -rf MOUNT/tree", [t[0].rm_rf, t[1].rm_rf]),
                ("idxfs cp MOUNT/tree", [t[0].cp, t[1].cp]),
                ("cp -a MOUNT/tree", [t[0].cp_a, t[1].cp_a]),
            ],
        );
        if label == "idxfs" {
            text.push_str(&format!(
                "{:<24} {:>12} {:>12}\n",
                "idxfs snapshot (command)",
                ms(t[0].cli),
                ms(t[1].cli)
            ));
            text.push_str(&format!(
                "{:<24} {:>12} {:>12}\n",
                "idxfs snapshot MOUNT",
                ms(t[0].mount),
                ms(t[1].mount)
            ));
            ratio_rows(
                &mut text,
                &[
                    ("idxfs writable snapshot", [t[0].writable, t[1].writable]),
                    ("idxfs clone of snapshot", [t[0].clone, t[1].clone]),
                    ("  opened (open+switch)", [t[0].clone_open, t[1].clone_open]),
                    ("  open, no switch", [t[0].plain_open, t[1].plain_open]),
                    ("fsync in a clone", [t[0].fsync_clone, t[1].fsync_clone]),
                    ("  in the fs's own tree", [t[0].fsync_own, t[1].fsync_own]),
                    ("  a commit instead", [t[0].commit_clone, t[1].commit_clone]),
                    ("  opened beside", [t[0].fsync_beside, t[1].fsync_beside]),
                    (
                        "clone opened beside+closed",
                        [t[0].open_beside, t[1].open_beside],
                    ),
                    (
                        "fsync through the mount",
                        [t[0].mount_fsync_own, t[1].mount_fsync_own],
                    ),
                    (
                        "  in .snapshots/NAME",
                        [t[0].mount_fsync_beside, t[1].mount_fsync_beside],
                    ),
                ],
            );
        }
        let one = |t: &Times| json!({"snapshot_s": t.snap, "command_s": t.cli, "mount_command_s": t.mount, "writable_snapshot_s": t.writable, "clone_s": t.clone, "clone_open_s": t.clone_open, "open_close_s": t.plain_open, "fsync_clone_s": t.fsync_clone, "fsync_own_s": t.fsync_own, "commit_clone_s": t.commit_clone, "fsync_beside_s": t.fsync_beside, "open_beside_s": t.open_beside, "mount_fsync_own_s": t.mount_fsync_own, "mount_fsync_beside_s": t.mount_fsync_beside, "rollback_s": t.rollback, "rollback_clone_s": t.rollback_clone, "idxfs_rm_s": t.rm, "rm_rf_mount_s": t.rm_rf, "idxfs_cp_s": t.cp, "cp_a_mount_s": t.cp_a, "delete_returns_s": t.returns, "space_back_s": t.back});
        raw.insert(
            label.clone(),
            json!({"small": one(&t[0]), "large": one(&t[1])}),
        );
    }
    text.push_str(
        "(ratio: snapshot of the larger count against the smaller; idxfs's library call is two \
         commits on the unmounted image, its command adds the open and close, and MOUNT is \
         the command against a mount holding the tree (syncfs, an ioctl, the server's two \
         commits), each the fastest of 3; writable snapshot: Fs::writable_snapshot (a clone \
         of the tree and its hidden origin, two commits, as btrfs's snapshot, which is \
         writable); clone of snapshot: Fs::make_clone of the snapshot (a commit), and an open of the image that makes the clone the active tree and \
         closes (the open, the switch's two commits, the close), beside the same open and \
         close without a switch, each the fastest of 3; fsync: a file made in a directory of 1,000, 4 KiB written and fsynced, in \
         a clone and in the file system's own tree, in the clone ended by a commit \
         instead, and in the clone opened beside the file system's own tree \
         (Fs::open_subvolume), where the fsync logs too, each the median of 100; the clone \
         opened beside and closed (the close's commit too), the fastest of 3; fsync through \
         the mount: a file made in a directory of 1,000, 4 KiB written, fsynced and closed, \
         in the mount's own tree and in a writable snapshot of it served beside at \
         .snapshots/NAME, each the median of 100; rollback: back to the snapshot after the same \
         changes at both counts (a directory of 1,000 files removed, 100 files made), idxfs's \
         library call (the fastest of 3; and in a writable snapshot, back to a snapshot of it) and btrfs's subvolume delete and snapshot of the snapshot in its place; \
         idxfs rm and rm -rf: the tree removed from a mount it was imported into, until synced; \
         idxfs cp and cp -a: the tree copied beside itself in such a mount, until synced; \
         ext4's row is cp -a and rm -rf until synced, what a file system without \
         snapshots offers)\n",
    );
    Ok((text, json!({"counts": counts, "results": raw})))
}
