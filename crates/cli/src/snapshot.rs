//! `idxfs snapshot`: read-only snapshots of an unmounted image (the engine's
//! `Fs::snapshot`), listed, made and deleted; `idxfs mount -o snapshot=ID` mounts one.
//! A mounted file system cannot be snapshotted from here yet (`docs/snapshots.md`).
use idxfs_engine::{Error, Fs, OpenOptions};
use std::path::Path;

/// What `idxfs snapshot` was asked.
pub(crate) enum Ask<'a> {
    Make(&'a str),
    List,
    Delete(u64),
}

pub(crate) fn run(image: &Path, ask: Ask) -> Result<(), String> {
    let p = image.display();
    let _lock = crate::lock_image(image, true, std::time::Duration::ZERO)
        .map_err(|_| format!("{p}: in use by an idxfs server (mounted); unmount it first"))?;
    let writable = !matches!(ask, Ask::List);
    let opts = OpenOptions {
        commit_interval: None,
        read_only: !writable,
        ..OpenOptions::default()
    };
    let fs = Fs::open(crate::open_dev(image, writable)?, opts).map_err(|e| format!("{p}: {e}"))?;
    let r = match &ask {
        Ask::Make(name) => fs
            .snapshot(name.as_bytes())
            .map(|id| println!("{p}: snapshot {id} ({name}); mount it with -o snapshot={id}")),
        Ask::List => fs.snapshots().map(|list| {
            if list.is_empty() {
                println!("{p}: no snapshots");
            }
            for s in list {
                let state = if s.dropping {
                    " (deleted, blocks coming back)"
                } else {
                    ""
                };
                println!(
                    "{}\t{}\tgeneration {}{state}",
                    s.id,
                    String::from_utf8_lossy(&s.name),
                    s.generation
                );
            }
        }),
        // No mount to give the blocks back in the background: done before returning.
        Ask::Delete(id) => fs
            .delete_snapshot(*id)
            .and_then(|()| fs.finish_drops())
            .map(|()| println!("{p}: snapshot {id} deleted, its blocks free")),
    };
    let closed = fs.close();
    r.map_err(|e| match (e, &ask) {
        (Error::NotFound, Ask::Delete(id)) => format!("{p}: no snapshot {id}"),
        (Error::Exists, Ask::Make(name)) => format!("{p}: a snapshot named {name:?} exists"),
        (e, _) => format!("{p}: {e}"),
    })?;
    closed.map_err(|e| format!("{p}: {e}"))
}
