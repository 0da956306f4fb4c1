//! `idxfs import DIR MOUNT/PATH`: the tree under DIR copied into a mounted idxfs as the new
//! directory PATH, made by the mount's server through its engine (`serve.rs`), not file by
//! file through FUSE. The same reader as `mkfs --from` (`walk`) reads DIR with the caller's
//! own rights; its items go to the server as one byte stream (`wire`) in ioctls on PATH's
//! parent (`idxfs_fuse::import`), each carrying many small files. What is kept is what
//! `mkfs --from` keeps (module notes of `super`). On return everything is durable.
use super::walk::walk;
use super::wire::encode;
use super::{Item, Kind, Progress, Totals, QUEUE};
use idxfs_fuse::import::{request, Op, ROOM};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::mpsc::sync_channel;
use std::time::Instant;

/// What `item` adds to the totals the progress line shows.
fn count(t: &mut Totals, item: &Item) {
    match item {
        Item::Make { kind, .. } => match kind {
            Kind::Dir { .. } => t.dirs += 1,
            Kind::File { whole } => {
                t.files += 1;
                t.bytes += whole.as_ref().map_or(0, |w| w.len() as u64);
            }
            Kind::Symlink(_) => t.symlinks += 1,
            Kind::Special => t.specials += 1,
            Kind::Link(_) => t.links += 1,
        },
        Item::Data { bytes, .. } => t.bytes += bytes.len() as u64,
        Item::DirDone { .. } => {}
    }
}

/// Copies `dir` into the idxfs mount as `target`, a new directory. Returns what was copied
/// (as the server counted it) and the seconds it took; errors are one line.
pub(crate) fn import_into(dir: &Path, target: &Path) -> Result<(Totals, f64), String> {
    let start = Instant::now();
    let (d, t) = (dir.display(), target.display());
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("{d}: not a directory")),
        Err(e) => return Err(format!("{d}: {e}")),
    }
    let name = match target.file_name() {
        Some(n) if n != ".." => n,
        _ => return Err(format!("{t}: names no new entry")),
    };
    match std::fs::symlink_metadata(target) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Ok(_) => return Err(format!("{t}: exists (import makes a new directory)")),
        Err(e) => return Err(format!("{t}: {e}")),
    }
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let (parent, _mp) = crate::sync::idxfs_mount(parent, "use cp -a there")?;
    let src = std::fs::canonicalize(dir).map_err(|e| format!("{d}: {e}"))?;
    if parent.starts_with(&src) {
        return Err(format!(
            "{t}: inside {d}, which cannot be copied into itself"
        ));
    }
    let p = parent.display();
    let pdir = std::fs::File::open(&parent).map_err(|e| format!("{p}: {e}"))?;
    let refused = |r: Result<String, std::io::Error>| match r {
        Ok(line) => format!("{t}: {line}"),
        Err(e) => match e.raw_os_error() {
            Some(libc::ENOTTY) | Some(libc::ENOSYS) | Some(libc::EINVAL) => {
                format!("{p}: not an idxfs mount, or its server is too old to import")
            }
            Some(libc::EPERM) | Some(libc::EACCES) => {
                format!("{p}: only root or the mount's owner may import into it")
            }
            _ => format!("{t}: {e}"),
        },
    };
    let (session, _) = request(&pdir, Op::Begin, 0, name.as_bytes()).map_err(&refused)?;
    let (tx, rx) = sync_channel(QUEUE);
    let mut progress = Progress::new(0);
    let mut seen = Totals::default();
    let sent = std::thread::scope(|s| {
        let reader = std::thread::Builder::new()
            .name("idxfs-import-read".into())
            .spawn_scoped(s, move || walk(&src, tx))
            .map_err(|e| format!("a reader thread: {e}"))?;
        let sent = (|| {
            let mut out = Vec::with_capacity(2 * ROOM);
            for batch in rx.iter() {
                for item in &batch {
                    count(&mut seen, item);
                    encode(item, &mut out);
                    let full = out.len() / ROOM * ROOM;
                    for piece in out[..full].chunks(ROOM) {
                        request(&pdir, Op::Data, session, piece).map_err(&refused)?;
                    }
                    out.drain(..full);
                }
                progress.show(&seen);
            }
            if !out.is_empty() {
                request(&pdir, Op::Data, session, &out).map_err(&refused)?;
            }
            Ok::<(), String>(())
        })();
        // Unblocks a reader waiting to send, whatever happened here.
        drop(rx);
        let read = reader
            .join()
            .unwrap_or_else(|_| Err("the reader thread panicked".into()));
        progress.finish();
        read.and(sent)
    });
    // A read error ends the stream early: the server is told nothing more, and its session
    // goes when this process does.
    sent?;
    let (_, summary) = request(&pdir, Op::End, session, &[]).map_err(&refused)?;
    let totals = super::serve::parse_summary(&summary)
        .ok_or_else(|| format!("{t}: the server's summary {summary:?} is not one it sends"))?;
    Ok((totals, start.elapsed().as_secs_f64()))
}
