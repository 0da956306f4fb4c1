//! `idxfs mkfs --from DIR IMAGE`: a directory tree copied into a new image through the
//! engine's library API, with no FUSE round trip per file; and `idxfs import DIR MOUNT/PATH`,
//! the same copy made by a mount's server (`client.rs`, `serve.rs`, `wire.rs`).
//!
//! Two threads share the work. The reader (`walk`) lists DIR and reads what each entry holds:
//! its metadata, data, symlink target and xattrs. The writer (`Writer`, the calling thread)
//! makes it in the image. They meet in a bounded channel of batches, so a tree of any size is
//! copied in bounded memory (`QUEUE` batches of at most `BATCH_BYTES` data each, and one
//! chunk of a large file at a time), and the threads wake each other once a batch, not once
//! a file.
//!
//! What is kept: every entry's type, permission bits (set-user-ID, set-group-ID and sticky
//! included), owner and group, atime, mtime and ctime to the nanosecond (ctime as
//! `mke2fs -d` keeps it, which `cp -a` cannot), device numbers, symlink targets, extended
//! attributes (POSIX ACLs and `security.capability` included), hard links (one inode, every
//! name) and holes (only a sparse file's data ranges are read and written, found with
//! SEEK_DATA / SEEK_HOLE).
//!
//! Order: a directory's entries are made in name order, all of them before any entry of a
//! subdirectory, so a directory's children get consecutive inode numbers and its readdir,
//! which walks inode order (seed 002), reads them where they sit. An entry's xattrs and
//! attributes are set after everything that would move them: a file's after its data (a
//! write drops `security.capability`), a directory's after its last child is made (each
//! child moves the directory's mtime, and a default ACL set earlier would be inherited by
//! children whose own ACLs are copied as they are). The owner is set with the mode in one
//! setattr, so a chown cannot drop set-user-ID. A name linked to an inode made earlier moves
//! that inode's ctime; such inodes get their attributes again at the end.
//!
//! Not kept: inode flags (`chattr`), and what a file becomes while it is read (a file that
//! changes during the copy is copied as the reads saw it, with the size its stat gave).
//! The walk crosses into file systems mounted below DIR, as `cp -a` does.
mod client;
mod estimate;
mod serve;
mod source;
mod walk;
mod wire;
mod write;

use crate::mkfs::MkfsArgs;
use idxfs_engine::fs::{Owner, SetAttr, SetTime, Time};
use idxfs_engine::Fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc::sync_channel;
use std::time::{Duration, Instant};
use walk::walk;
use write::Writer;

pub(crate) use client::import_into;
pub(crate) use serve::Sessions;

/// The most file bytes one `Item::Data` carries.
const CHUNK: usize = 1 << 20;
/// A batch goes to the writer once it holds this many items or `BATCH_BYTES` of data.
const BATCH_ITEMS: usize = 512;
const BATCH_BYTES: usize = 4 << 20;
/// Batches in flight between the reader and the writer.
const QUEUE: usize = 8;

/// An entry's attributes, as its stat (not following a symlink) gave them.
#[derive(Clone, Copy)]
struct Attrs {
    /// Type and permission bits (`st_mode`).
    mode: u32,
    uid: u32,
    gid: u32,
    rdev: u64,
    size: u64,
    atime: Time,
    mtime: Time,
    ctime: Time,
}

impl Attrs {
    fn of(m: &source::Stat) -> Attrs {
        let t = |(sec, nsec): (i64, i64)| Time {
            sec,
            nsec: nsec.clamp(0, 999_999_999) as u32,
        };
        let [atime, mtime, ctime] = m.times();
        Attrs {
            mode: m.mode(),
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev(),
            size: m.size(),
            atime: t(atime),
            mtime: t(mtime),
            ctime: t(ctime),
        }
    }

    fn owner(&self) -> Owner {
        Owner {
            uid: self.uid,
            gid: self.gid,
        }
    }

    /// Everything a setattr can set back: owner, mode and times (the size is the data's).
    fn set(&self) -> SetAttr {
        SetAttr {
            mode: Some(self.mode & 0o7777),
            uid: Some(self.uid),
            gid: Some(self.gid),
            atime: Some(SetTime::At(self.atime)),
            mtime: Some(SetTime::At(self.mtime)),
            ctime: Some(self.ctime),
            ..SetAttr::default()
        }
    }
}

type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// What a new name is.
enum Kind {
    /// A directory; its entries name it by `id`.
    Dir {
        id: usize,
    },
    /// A regular file: all its bytes when it has at most `NEW_FILE_MAX` and no holes, else
    /// none here and its data ranges in the `Item::Data` that follow.
    File {
        whole: Option<Vec<u8>>,
    },
    Symlink(Vec<u8>),
    /// A fifo, socket, or character or block device.
    Special,
    /// Another name of the inode made as `Link::First(id)`.
    Link(u64),
}

/// What the reader sends, in the order the writer acts on it.
enum Item {
    /// A new name in directory `parent` (an id from a `Kind::Dir`, 0 for DIR itself).
    Make {
        parent: usize,
        name: Vec<u8>,
        /// For messages: where it came from.
        path: PathBuf,
        kind: Kind,
        attrs: Attrs,
        xattrs: Xattrs,
        /// The first of several names of one inode: later `Kind::Link(id)` names link to it.
        first_link: Option<u64>,
    },
    /// Bytes at `off` of the file made last.
    Data { off: u64, bytes: Vec<u8> },
    /// Directory `id` has every entry: its own xattrs and attributes.
    DirDone {
        id: usize,
        path: PathBuf,
        attrs: Attrs,
        xattrs: Xattrs,
    },
}

/// What a copy made.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Totals {
    pub dirs: u64,
    pub files: u64,
    pub symlinks: u64,
    pub specials: u64,
    /// Names beyond an inode's first.
    pub links: u64,
    /// File bytes written (holes not counted).
    pub bytes: u64,
}

impl Totals {
    pub fn entries(&self) -> u64 {
        self.dirs + self.files + self.symlinks + self.specials + self.links
    }

    /// What a copy made in `secs` seconds, for its closing line.
    pub fn describe(&self, secs: f64) -> String {
        format!(
            "{} directories, {} files ({} MiB), {} symlinks, {} other, {} more hard links, \
             in {secs:.2} s ({:.0} entries/s)",
            self.dirs,
            self.files,
            self.bytes >> 20,
            self.symlinks,
            self.specials,
            self.links,
            self.entries() as f64 / secs.max(1e-9)
        )
    }
}

/// `idxfs mkfs --from DIR`: formats `a.image` (sized for `dir` when new and no size is
/// given), copies the tree in and commits it. Returns what was copied and the seconds it
/// took. An image file this made is removed again when the copy fails; one that was there
/// keeps what was copied, committed, and the error says so.
pub(crate) fn mkfs_from(a: &MkfsArgs, dir: &Path) -> Result<(Totals, f64), String> {
    let start = Instant::now();
    let d = dir.display();
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("{d}: not a directory")),
        Err(e) => return Err(format!("{d}: {e}")),
    }
    let made = !a.image.exists();
    let (size, expect) = match a.size {
        Some(s) => (Some(s), 0),
        None if made => {
            let (s, n) = estimate::estimate(dir)?;
            (Some(s), n)
        }
        None => (None, 0),
    };
    let dev = crate::mkfs::mkfs(&MkfsArgs { size, ..*a })?;
    let copied = (|| {
        let _lock = crate::lock_image(a.image, true, Duration::ZERO)?;
        let fs = Fs::open(dev, idxfs_engine::OpenOptions::default())
            .map_err(|e| format!("{}: {e}", a.image.display()))?;
        let totals = import(&fs, dir, expect);
        // Commits what was copied, also after a failure (the image then holds part of it).
        let closed = fs
            .close()
            .map_err(|e| format!("{}: the last commit: {e}", a.image.display()));
        totals.and_then(|t| closed.map(|()| t))
    })();
    match copied {
        Ok(t) => Ok((t, start.elapsed().as_secs_f64())),
        Err(why) if made => {
            let _ = std::fs::remove_file(a.image);
            Err(why)
        }
        Err(why) => Err(format!(
            "{why} ({} holds what was copied before)",
            a.image.display()
        )),
    }
}

/// Copies the tree under `dir` (its own attributes onto the root) into `fs`, which must be
/// empty. `expect`: the entries the walk should find, for the progress line (0: not known).
/// Errors are one line naming the source path.
pub(crate) fn import(fs: &Fs, dir: &Path, expect: u64) -> Result<Totals, String> {
    let root = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !root.is_dir() {
        return Err(format!("{}: not a directory", dir.display()));
    }
    let (tx, rx) = sync_channel(QUEUE);
    std::thread::scope(|s| {
        let reader = std::thread::Builder::new()
            .name("idxfs-import-read".into())
            .spawn_scoped(s, move || walk(dir, tx))
            .map_err(|e| format!("a reader thread: {e}"))?;
        let mut w = Writer::new(fs, idxfs_format::ROOT_INO, Progress::new(expect));
        let wrote = w.run(&rx);
        // Unblocks a reader waiting to send, whatever the writer's result.
        drop(rx);
        let read = reader
            .join()
            .unwrap_or_else(|_| Err("the reader thread panicked".into()));
        w.progress.finish();
        // A read error ends the stream early, so it is the cause when both failed.
        read.and(wrote).map(|()| w.totals)
    })
}

/// The progress line on a terminal: entries made (of how many, when known), bytes, rate.
struct Progress {
    tty: bool,
    expect: u64,
    start: Instant,
    last: Instant,
}

impl Progress {
    const EVERY: Duration = Duration::from_millis(200);

    fn new(expect: u64) -> Progress {
        let now = Instant::now();
        Progress {
            // SAFETY: isatty only inspects the descriptor.
            tty: unsafe { libc::isatty(2) } == 1,
            expect,
            start: now,
            last: now,
        }
    }

    /// No line at all: for a mount's server, whose client shows its own.
    fn quiet() -> Progress {
        Progress {
            tty: false,
            ..Progress::new(0)
        }
    }

    fn show(&mut self, t: &Totals) {
        if !self.tty || self.last.elapsed() < Self::EVERY {
            return;
        }
        self.last = Instant::now();
        let n = t.entries();
        let rate = n as f64 / self.start.elapsed().as_secs_f64().max(1e-9);
        let bar = match (n * 100).checked_div(self.expect) {
            Some(pct) => {
                let pct = pct.min(100);
                let filled = (pct / 4) as usize;
                format!(
                    "[{}{}] {pct:3}% ",
                    "#".repeat(filled),
                    ".".repeat(25 - filled)
                )
            }
            None => String::new(),
        };
        eprint!(
            "\r{bar}{n} entries, {} MiB, {rate:.0} entries/s ",
            t.bytes >> 20
        );
    }

    fn finish(&self) {
        if self.tty && self.last != self.start {
            eprint!("\r\x1b[K");
        }
    }
}
