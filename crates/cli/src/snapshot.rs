//! `idxfs snapshot`: read-only snapshots (the engine's `Fs::snapshot`), made, listed and
//! deleted, of an unmounted image here, or of a mounted file system by its server
//! (`idxfs_fuse::snapshot`); `idxfs mount -o snapshot=ID` mounts one. A rollback to one
//! (`Fs::rollback`) is for an unmounted image only: the kernel of a mount would go on
//! serving what it cached of the files the rollback takes away. Writable subvolumes, made
//! from snapshots (`Fs::make_clone`, `--clone`), as writable snapshots of the tree served
//! (`Fs::writable_snapshot`, `idxfs subvolume snapshot`) or empty (`Fs::make_subvolume`,
//! `idxfs subvolume create`), are made, listed and deleted on an unmounted image or by a
//! mount's server; `idxfs mount -o subvol=ID` makes one the tree a mount serves, and a
//! mount serves the others writable at `MOUNT/.snapshots/NAME`.
use idxfs_engine::fs::{SnapshotInfo, SubvolumeInfo};
use idxfs_engine::{Error, Fs, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// What `idxfs snapshot` was asked.
pub(crate) enum Ask<'a> {
    Make(&'a str),
    List,
    /// A snapshot's or a clone's id or name.
    Delete(&'a str),
    Rollback(&'a str),
    /// A writable subvolume made from snapshot (id or name) .0, named .1.
    Clone(&'a str, &'a str),
    /// An empty writable subvolume.
    Create(&'a str),
    /// A writable snapshot of the active tree.
    Writable(&'a str),
    /// The writable subvolumes.
    Subvolumes,
}

/// A subvolume name: checked here too, so that a mount's EINVAL does not read as "not an
/// idxfs mount".
fn check_name(at: &str, what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 255 || name.contains('/') || name.contains('\0') {
        return Err(format!(
            "{at}: a {what} name is 1 to 255 bytes, no NUL or '/'"
        ));
    }
    Ok(())
}

/// "the file system's own tree" or "subvolume ID".
fn tree_name(id: u64) -> String {
    match id {
        idxfs_format::FS_SUBVOL_ID => "the file system's own tree".to_string(),
        t => format!("subvolume {t}"),
    }
}

/// The writable subvolumes, as both `--list` and `idxfs subvolume list` print them.
fn print_subvolumes(subs: &[SubvolumeInfo]) {
    for s in subs {
        let n = String::from_utf8_lossy(&s.name);
        let name = match (s.id, s.snapshot_of, s.origin) {
            (idxfs_format::FS_SUBVOL_ID, _, _) => "(the file system's own tree)".to_string(),
            (_, Some(t), _) => format!("{n}\twritable snapshot of {}", tree_name(t)),
            (_, None, Some(o)) => format!("{n}\tfrom snapshot {o}"),
            (_, None, None) => format!("{n}\tmade empty"),
        };
        let active = if s.active { " (active)" } else { "" };
        println!("{}\t{name}{active}", s.id);
    }
}

/// The snapshot `which` names among `listed` (id, name, deleted): an id first (a number that
/// is a snapshot's id), else a name; one being deleted is not there.
fn resolve<'n>(
    which: &str,
    listed: impl Iterator<Item = (u64, &'n [u8], bool)> + Clone,
) -> Option<u64> {
    let mut live = listed.filter(|s| !s.2);
    let by_id = which
        .parse::<u64>()
        .ok()
        .filter(|id| live.clone().any(|s| s.0 == *id));
    by_id.or_else(|| live.find(|s| s.1 == which.as_bytes()).map(|s| s.0))
}

pub(crate) fn run(image: &Path, ask: Ask) -> Result<(), String> {
    let p = image.display();
    let _lock = crate::lock_unmounted(image, "unmount it first")?;
    if let Ask::Create(name) | Ask::Writable(name) = &ask {
        check_name(&p.to_string(), "subvolume", name)?;
    }
    let writable = !matches!(ask, Ask::List | Ask::Subvolumes);
    let opts = OpenOptions {
        commit_interval: None,
        read_only: !writable,
        ..OpenOptions::default()
    };
    let fs = Fs::open(crate::open_dev(image, writable)?, opts).map_err(|e| format!("{p}: {e}"))?;
    let id_of = |which: &str| -> Result<u64, String> {
        let list = fs.snapshots().map_err(|e| format!("{p}: {e}"))?;
        let listed = list.iter().map(|s| (s.id, &s.name[..], s.dropping));
        resolve(which, listed).ok_or_else(|| format!("{p}: no snapshot {which}"))
    };
    // A snapshot or a writable subvolume (not the file system's own tree, which has no
    // name and is never deleted).
    let any_of = |which: &str| -> Result<u64, String> {
        let subs = fs.subvolumes();
        let writable = subs.iter().filter(|s| s.id != idxfs_format::FS_SUBVOL_ID);
        let listed = writable.map(|s| (s.id, &s.name[..], false));
        match resolve(which, listed) {
            Some(id) => Ok(id),
            None => id_of(which).map_err(|_| format!("{p}: no snapshot or subvolume {which}")),
        }
    };
    let r = match &ask {
        Ask::Make(name) => fs
            .snapshot(name.as_bytes())
            .map(|id| println!("{p}: snapshot {id} ({name}); mount it with -o snapshot={id}")),
        Ask::List => fs.snapshots().map(|list| {
            if list.is_empty() {
                println!("{p}: no snapshots");
            }
            for s in list {
                print_listed(&s);
            }
            let subs = fs.subvolumes();
            if subs.len() > 1 {
                println!("writable subvolumes (mount one with -o subvol=ID):");
                print_subvolumes(&subs);
            }
        }),
        Ask::Subvolumes => {
            let subs = fs.subvolumes();
            print_subvolumes(&subs);
            Ok(())
        }
        Ask::Create(name) => {
            // Its root directory is the caller's, as a directory it made would be.
            // SAFETY: getuid(2) and getgid(2) cannot fail.
            let owner = unsafe {
                idxfs_engine::fs::Owner {
                    uid: libc::getuid(),
                    gid: libc::getgid(),
                }
            };
            fs.make_subvolume(name.as_bytes(), owner).map(|id| {
                println!(
                    "{p}: subvolume {id} ({name}), writable, empty; mount it with \
                         -o subvol={id}"
                )
            })
        }
        Ask::Writable(name) => fs.writable_snapshot(name.as_bytes()).map(|id| {
            println!(
                "{p}: subvolume {id} ({name}), a writable snapshot of {}; mount it with -o \
                 subvol={id}",
                tree_name(fs.active_subvolume())
            )
        }),
        Ask::Clone(from, name) => {
            let origin = id_of(from)?;
            fs.make_clone(origin, name.as_bytes()).map(|id| {
                println!(
                    "{p}: subvolume {id} ({name}), writable, from snapshot {origin}; mount it \
                     with -o subvol={id}"
                )
            })
        }
        // No mount to give the blocks back in the background: done before returning.
        Ask::Delete(which) => {
            let id = any_of(which)?;
            fs.delete_snapshot(id)
                .and_then(|()| fs.finish_drops())
                .map(|()| println!("{p}: {id} deleted, its blocks free"))
        }
        Ask::Rollback(which) => {
            let id = id_of(which)?;
            // Consumes and closes the file system.
            let r = fs.rollback(id).map(|r| {
                println!(
                    "{p}: rolled back to snapshot {id}: {} blocks let go of, {} taken back \
                     from the snapshot, {} preallocated ones moved; {} nodes read",
                    r.blocks_released, r.blocks_taken_back, r.blocks_moved, r.nodes_walked
                )
            });
            return r.map_err(|e| match e {
                Error::NotFound => format!("{p}: no snapshot {id}"),
                e => format!("{p}: {e}"),
            });
        }
    };
    let closed = fs.close();
    r.map_err(|e| match (e, &ask) {
        (Error::NotFound, Ask::Delete(which)) => {
            format!("{p}: no snapshot or subvolume {which}")
        }
        (
            Error::Exists,
            Ask::Make(name) | Ask::Clone(_, name) | Ask::Create(name) | Ask::Writable(name),
        ) => {
            format!("{p}: a snapshot or subvolume named {name:?} exists")
        }
        (e, _) => format!("{p}: {e}"),
    })?;
    closed.map_err(|e| format!("{p}: {e}"))
}

/// `run` for the idxfs mount holding `dir`: its server does it.
pub(crate) fn run_mounted(dir: &Path, ask: Ask) -> Result<(), String> {
    use idxfs_fuse::snapshot::{self as wire, Answer};
    let (_, mp) = crate::sync::idxfs_mount(dir, "use its own snapshot command")?;
    let m = mp.display();
    let at = m.to_string();
    // An errno from the server, in words; any other error names the mount already.
    let said = |e: std::io::Error| match e.raw_os_error() {
        Some(_) => format!("{m}: {e}"),
        None => e.to_string(),
    };
    let ask_server = |req: &wire::Ask| wire::request(&mp, req).map_err(said);
    let snapshots = || match ask_server(&wire::Ask::List)? {
        Answer::List(list, _) => Ok(list),
        _ => Err(format!("{m}: the server's answer could not be read")),
    };
    let subvolumes = || match ask_server(&wire::Ask::Subvolumes)? {
        Answer::Subvolumes(list, _) => Ok(list),
        _ => Err(format!("{m}: the server's answer could not be read")),
    };
    let snapshot_id = |which: &str| -> Result<u64, String> {
        let list = snapshots()?;
        let listed = list.iter().map(|s| (s.id, &s.name[..], s.dropping));
        resolve(which, listed).ok_or_else(|| format!("{m}: no snapshot {which}"))
    };
    let req = match &ask {
        Ask::Make(name) => {
            check_name(&at, "snapshot", name)?;
            wire::Ask::Make(name.as_bytes().to_vec())
        }
        Ask::List => wire::Ask::List,
        Ask::Subvolumes => wire::Ask::Subvolumes,
        Ask::Delete(which) => {
            // A writable subvolume's name first, as on an image.
            let subs = subvolumes()?;
            let writable = subs.iter().filter(|s| s.id != idxfs_format::FS_SUBVOL_ID);
            let listed = writable.map(|s| (s.id, &s.name[..], false));
            let id = match resolve(which, listed) {
                Some(id) => id,
                None => snapshot_id(which)
                    .map_err(|_| format!("{m}: no snapshot or subvolume {which}"))?,
            };
            wire::Ask::Delete(id)
        }
        Ask::Rollback(_) => {
            return Err(format!(
                "{m}: a rollback takes away files the kernel may have cached or open: \
                 unmount it and roll back the image"
            ))
        }
        Ask::Clone(from, name) => {
            check_name(&at, "subvolume", name)?;
            wire::Ask::Clone(snapshot_id(from)?, name.as_bytes().to_vec())
        }
        Ask::Create(name) => {
            check_name(&at, "subvolume", name)?;
            wire::Ask::Create(name.as_bytes().to_vec())
        }
        Ask::Writable(name) => {
            check_name(&at, "subvolume", name)?;
            wire::Ask::Writable(name.as_bytes().to_vec())
        }
    };
    if let Ask::Make(_) | Ask::Writable(_) = ask {
        // With the writeback cache, written pages wait in the kernel: sent to the server
        // first, as btrfs writes delalloc before a snapshot. Linux no longer waits for a FUSE
        // server to take them ("fs/writeback: skip AS_NO_DATA_INTEGRITY mappings in
        // wait_sb_inodes()"), so pages still on their way may miss the snapshot: only an
        // fsync of a file waits for its pages (README, "snapshots").
        let root = std::fs::File::open(&mp).map_err(|e| format!("{m}: {e}"))?;
        use std::os::fd::AsRawFd;
        // SAFETY: syncfs(2) on a descriptor we hold.
        if unsafe { libc::syncfs(root.as_raw_fd()) } != 0 {
            return Err(format!("{m}: syncfs: {}", std::io::Error::last_os_error()));
        }
    }
    let r = wire::request(&mp, &req).map_err(|e| match (e.raw_os_error(), &ask) {
        (Some(libc::ENOENT), Ask::Delete(which)) => {
            format!("{m}: no snapshot or subvolume {which}")
        }
        (Some(libc::ENOENT), Ask::Clone(which, _)) => format!("{m}: no snapshot {which}"),
        (
            Some(libc::EEXIST),
            Ask::Make(name) | Ask::Clone(_, name) | Ask::Create(name) | Ask::Writable(name),
        ) => {
            format!("{m}: a snapshot or subvolume named {name:?} exists")
        }
        (Some(libc::EBUSY), Ask::Delete(which)) => {
            format!(
                "{m}: {which} is in use (the tree this mount serves, one read in it, or a \
                 snapshot a subvolume was made from)"
            )
        }
        _ => said(e),
    })?;
    // A subvolume made on a mount with a snapshots directory is served there, writable.
    let beside = |id: u64, name: &str, dir: &[u8]| {
        println!(
            "{m}: subvolume {id} ({name}) is writable at {} beside the tree this mount \
             serves; a mount of the image with -o subvol={id} serves it by itself",
            mp.join(std::ffi::OsStr::from_bytes(dir))
                .join(name)
                .display()
        )
    };
    match (r, &ask) {
        (Answer::Made(id, Some(dir)), Ask::Clone(from, name)) => {
            println!("{m}: subvolume {id} ({name}), writable, from snapshot {from}");
            beside(id, name, &dir)
        }
        (Answer::Made(id, Some(dir)), Ask::Writable(name)) => {
            println!(
                "{m}: subvolume {id} ({name}), a writable snapshot of the tree this mount serves"
            );
            beside(id, name, &dir)
        }
        (Answer::Made(id, Some(dir)), Ask::Create(name)) => {
            println!("{m}: subvolume {id} ({name}), writable, empty");
            beside(id, name, &dir)
        }
        (Answer::Made(id, _), Ask::Clone(from, name)) => println!(
            "{m}: subvolume {id} ({name}), writable, from snapshot {from}; this mount goes on \
             serving its own tree: unmount it and mount the image with -o subvol={id}"
        ),
        (Answer::Made(id, _), Ask::Writable(name)) => println!(
            "{m}: subvolume {id} ({name}), a writable snapshot of the tree this mount serves; \
             this mount goes on serving that tree: unmount it and mount the image with -o \
             subvol={id}"
        ),
        (Answer::Made(id, _), Ask::Create(name)) => println!(
            "{m}: subvolume {id} ({name}), writable, empty; this mount goes on serving its own \
             tree: unmount it and mount the image with -o subvol={id}"
        ),
        (Answer::Made(id, Some(dir)), _) => println!(
            "{m}: snapshot {id}, at {}",
            mp.join(std::ffi::OsStr::from_bytes(&dir))
                .join(match &ask {
                    Ask::Make(n) => n,
                    _ => "",
                })
                .display()
        ),
        (Answer::Made(id, None), _) => println!(
            "{m}: snapshot {id}; not shown in this mount (nosnapdir): mount it with \
             -o snapshot={id} (its image unmounted)"
        ),
        (Answer::Deleted, _) => {
            println!("{m}: deleted; its blocks come back in the background")
        }
        (Answer::List(list, more), _) => {
            if list.is_empty() {
                println!("{m}: no snapshots");
            }
            for s in &list {
                print_listed(s);
            }
            if more {
                println!("(more, left out: the list outgrew one request)");
            }
            let subs = subvolumes()?;
            if subs.len() > 1 {
                println!("writable subvolumes (mount one with -o subvol=ID):");
                print_subvolumes(&subs);
            }
        }
        (Answer::Subvolumes(subs, more), _) => {
            print_subvolumes(&subs);
            if more {
                println!("(more, left out: the list outgrew one request)");
            }
        }
    }
    Ok(())
}

/// One snapshot's line: id, name, generation, the tree it was taken of when recorded
/// (restores beside other writable subvolumes go only into that tree), and whether it is
/// being deleted.
fn print_listed(s: &SnapshotInfo) {
    let state = if s.dropping {
        " (deleted, blocks coming back)"
    } else {
        ""
    };
    let of = match s.source {
        None => String::new(),
        Some(t) => format!("\tof {}", tree_name(t)),
    };
    println!(
        "{}\t{}\tgeneration {}{of}{state}",
        s.id,
        String::from_utf8_lossy(&s.name),
        s.generation
    );
}
