//! The mount's side of `idxfs import`: each session decodes its stream (`wire`) and makes the
//! items with the writer `mkfs --from` uses, through the mount's engine. The transport and who
//! may ask are `idxfs_fuse::import`'s.
//!
//! A session lives from `begin` to `end`, or until its stream fails (an error ends it: the
//! client stops at the first one), or until its client's process is gone: a `begin` drops
//! the sessions of processes that no longer exist, so a killed client leaves nothing behind
//! for long, and at most `SESSIONS` are open at once. What a failed or abandoned copy made
//! stays, as after an interrupted `cp -a`.
use super::wire::Decoder;
use super::write::Writer;
use super::{Progress, Totals};
use idxfs_engine::fs::Owner;
use idxfs_engine::Fs;
use idxfs_fuse::import::{Caller, ImportServer};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Sessions open at once.
const SESSIONS: usize = 16;

struct Session {
    who: Caller,
    writer: Writer<Arc<Fs>>,
    decoder: Decoder,
}

/// `ImportServer` for a mount's server (`mount.rs`).
#[derive(Default)]
pub(crate) struct Sessions {
    open: Mutex<HashMap<u64, Session>>,
    next: std::sync::atomic::AtomicU64,
}

impl Sessions {
    /// Takes session `id` out while it works (others go on beside it), if `who` opened it.
    fn take(&self, id: u64, who: Caller) -> Result<Session, String> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        // Another uid's session stays where it is.
        let mine = open.get(&id).is_some_and(|s| s.who.uid == who.uid);
        match mine.then(|| open.remove(&id)).flatten() {
            Some(s) => Ok(s),
            None => Err(format!("no import session {id} of uid {}", who.uid)),
        }
    }

    fn put_back(&self, id: u64, s: Session) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.insert(id, s);
    }
}

/// Whether process `pid` exists.
fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

impl ImportServer for Sessions {
    fn begin(&self, fs: &Arc<Fs>, parent: u64, name: &[u8], who: Caller) -> Result<u64, String> {
        {
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            open.retain(|_, s| alive(s.who.pid));
            if open.len() >= SESSIONS {
                return Err(format!("{SESSIONS} imports are running already"));
            }
        }
        let owner = Owner {
            uid: who.uid,
            gid: who.gid,
        };
        // Owner-only until the source's own attributes are set at the end (its DirDone).
        let root = fs
            .mkdir(parent, name, 0o700, owner)
            .map_err(|e| format!("{}: {e}", String::from_utf8_lossy(name)))?;
        if fs.holds_made() {
            fs.unpin(root.ino, 1).map_err(|e| e.to_string())?;
        }
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let s = Session {
            who,
            writer: Writer::new(fs.clone(), root.ino, Progress::quiet()),
            decoder: Decoder::default(),
        };
        self.put_back(id, s);
        Ok(id)
    }

    fn data(&self, id: u64, who: Caller, bytes: &[u8]) -> Result<(), String> {
        let mut s = self.take(id, who)?;
        let Session {
            writer, decoder, ..
        } = &mut s;
        decoder.feed(bytes, |item| writer.item(item))?;
        // A failure above dropped the session: the client stops at the first error.
        self.put_back(id, s);
        Ok(())
    }

    fn end(&self, id: u64, who: Caller) -> Result<String, String> {
        let mut s = self.take(id, who)?;
        if s.decoder.pending() {
            return Err("the import stream ended inside an item".into());
        }
        s.writer.end()?;
        // What `idxfs import` returns is on the device, as after `mkfs --from`.
        s.writer
            .fs()
            .sync()
            .map_err(|e| format!("the commit after the copy: {e}"))?;
        Ok(summary(&s.writer.totals))
    }
}

/// The totals as the reply carries them: six numbers, space-separated.
fn summary(t: &Totals) -> String {
    format!(
        "{} {} {} {} {} {}",
        t.dirs, t.files, t.symlinks, t.specials, t.links, t.bytes
    )
}

/// `summary` read back by the client.
pub(super) fn parse_summary(s: &str) -> Option<Totals> {
    let v: Vec<u64> = s
        .split(' ')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    match v.as_slice() {
        &[dirs, files, symlinks, specials, links, bytes] => Some(Totals {
            dirs,
            files,
            symlinks,
            specials,
            links,
            bytes,
        }),
        _ => None,
    }
}
