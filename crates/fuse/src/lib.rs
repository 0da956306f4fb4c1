//! idxfs over FUSE: the kernel's requests translated to the engine's library API.
//!
//! This crate only translates. Every decision about the file system is the engine's; the only
//! knowledge here is FUSE's: errno numbers (`Error::errno`), attribute and entry caching, the
//! kernel's lookup counts (mapped to engine pins, so a file unlinked while open lives until
//! the kernel forgets it), and which protocol features make each request cheap:
//!
//! - entry and attribute TTLs, with negative entries cached too: every change goes through this
//!   kernel, which invalidates what a change makes stale, so the caches may live long;
//! - writeback cache only when asked (`-o writeback`): it gathers small writes into large
//!   requests, but the kernel then sends mtime/ctime by setattr at every close of a written
//!   file. Measured here, a create+write+close+unlink of a small file took 10 requests with it
//!   and 8 without, and with it a full device reports ENOSPC only at fsync or close;
//! - no-open / no-opendir: open, release, opendir and releasedir cost no round trip (the engine
//!   keeps no per-open state);
//! - readdirplus: names and attributes in one pass, in inode order (`Fs::readdir_plus_batch`),
//!   the next batch read ahead while the kernel takes in the last (`readahead.rs`); for every
//!   listing unless `-o readdirplus=auto`, since GNU tar, cp and rm read a whole directory
//!   before they stat (`MountConfig::readdirplus_auto`);
//! - FUSE over io_uring when the kernel allows it: a ring per CPU and a worker pinned to that
//!   CPU, so a request is served where its caller runs (`uring.rs`); while one caller keeps
//!   the file system busy, replies go out at SCHED_IDLE so the caller wakes on that CPU too
//!   instead of an idle one (`handoff.rs`);
//! - otherwise parallel directory operations, several threads each on its own cloned /dev/fuse
//!   fd, pinned one per CPU when they cover every CPU (`pin.rs`);
//! - permissions checked by the kernel (`default_permissions`) wherever anyone but root can
//!   reach the mount; on a root mount without `allow_other` not asked for, which spares a
//!   GETATTR of the directory after every change in it
//!   (`MountConfig::kernel_checks_permissions`); the one request that stands for many
//!   changes, `idxfs rm`'s, is checked by the server as the kernel would check each
//!   (`permission.rs`);
//! - POSIX ACLs kept by the engine and cached and enforced by the kernel (`FUSE_POSIX_ACL`,
//!   with `FUSE_DONT_MASK` so the engine applies the umask, which a default ACL overrides),
//!   wherever the kernel checks permissions anyway (`MountConfig::acl_on`);
//! - "not supported" for the xattrs idxfs does not keep (SELinux labels, and ACLs on a mount
//!   without them), which tools such as `ls -l` ask for once per device instead of once per
//!   file (`xattr_unsupported`); without ACLs, an access ACL that repeats the mode is taken
//!   as a chmod, so `cp -a` needs no chmod after it (`acl.rs`; the kernel is told its cached
//!   mode is stale);
//! - privileges dropped by the server (`FUSE_HANDLE_KILLPRIV_V2`, the engine's `privs`, the
//!   caller's groups in `kill.rs`): the kernel then sends no GETATTR before each chown, and
//!   the mount gets `SB_NOSEC`, so a file's first write asks for `security.capability` once
//!   and later writes do not;
//! - file handles that outlive the kernel's cache (`FUSE_EXPORT_SUPPORT`: "." looked up by
//!   inode number), O_TMPFILE (`tmpfile`), and `idxfs trim MOUNT` by ioctl (`trim.rs`);
//! - the image's snapshots at `MOUNT/.snapshots/NAME`, each served by an engine opened
//!   beside the file system, with inode numbers of their own (`snapdir.rs`);
//! - lseek's SEEK_DATA/SEEK_HOLE left to the kernel, which then reports the whole file as
//!   data, unless `-o holes`: the extents say nothing of pages the kernel holds dirty (a
//!   shared writable mapping's, the writeback cache's), and a sparse copy would get zeros for
//!   them (`MountConfig::holes`);
//! - `chattr +C` / `lsattr`: the inode flags ioctls the kernel's fileattr calls send
//!   (`fileattr.rs`);
//! - O_DIRECT as ext4 takes it: an offset or length that is not a multiple of 512 is EINVAL
//!   (`misaligned_direct`); the caller's buffer address never reaches the daemon, so a
//!   misaligned buffer, which ext4 refuses too, is taken here.
//!
//! What the kernel asks that no reply can spare: a LOOKUP before every create (the name is new,
//! so no dentry caches it), and a GETXATTR of `security.capability` at every chown (the VFS
//! asks whether there are capabilities to drop before any file system hears of the chown)
//! and at a file's first write.
mod acl;
pub mod cptree;
mod fileattr;
pub mod handoff;
pub mod import;
mod kill;
mod long;
mod options;
pub mod permission;
mod pin;
mod readahead;
pub mod remount;
pub mod rmtree;
mod root_ioctl;
mod serve;
mod slices;
mod snapdir;
pub mod snapshot;
pub mod trim;
pub mod uring;

pub use options::{MountConfig, Named, OptionError};
pub use serve::{block_shutdown_signals, serve, serve_with, unmount, ServeError};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, ForgetOne, Generation, INodeNo,
    InitFlags, KernelConfig, Notifier, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use idxfs_engine::counters::Counter;
use idxfs_engine::fs::{Attr, Kill, Owner, Seek, SetAttr, SetTime, Time, WriteHow};
use idxfs_engine::{Error, Fs};
use snapdir::{Place, View};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Largest write request the kernel sends.
pub const MAX_WRITE: u32 = 1 << 20;

/// FUSE requests by kind, for `IDXFS_COUNTERS=1` (printed when the mount ends).
#[derive(Clone, Copy)]
enum Op {
    Lookup,
    Forget,
    Getattr,
    Setattr,
    Readlink,
    Mknod,
    Mkdir,
    Unlink,
    Rmdir,
    Symlink,
    Rename,
    Link,
    Open,
    Read,
    Write,
    Flush,
    Fsync,
    Opendir,
    Readdir,
    Readdirplus,
    Fsyncdir,
    Statfs,
    Setxattr,
    Getxattr,
    Listxattr,
    Removexattr,
    Access,
    Create,
    Fallocate,
    Lseek,
    BatchForget,
    Ioctl,
    Tmpfile,
    CopyFileRange,
}

/// One per `Op`, in its order.
const OPS: usize = 34;

const OP_NAMES: [&str; OPS] = [
    "lookup",
    "forget",
    "getattr",
    "setattr",
    "readlink",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "symlink",
    "rename",
    "link",
    "open",
    "read",
    "write",
    "flush",
    "fsync",
    "opendir",
    "readdir",
    "readdirplus",
    "fsyncdir",
    "statfs",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "access",
    "create",
    "fallocate",
    "lseek",
    "batch_forget",
    "ioctl",
    "tmpfile",
    "copy_file_range",
];

pub struct Requests {
    ops: [Counter; OPS],
    /// Nanoseconds spent in each kind's handler (engine work and building the reply), when
    /// `timed`. A caller waiting on one request at a time waits for this and for the transport,
    /// so wall time minus this is what the FUSE round trips cost.
    nanos: [Counter; OPS],
    timed: bool,
    /// readdirplus replies made of a batch read ahead (`readahead.rs`).
    pub plus_read_ahead: Counter,
    /// Batches read ahead and then not used because something changed meanwhile.
    pub plus_ahead_stale: Counter,
}

/// One request in its handler: adds the time to its kind's total when dropped, and holds the
/// caller's privilege for the engine (`idxfs_engine::caller`).
struct InHandler<'a> {
    requests: &'a Requests,
    op: Op,
    since: Option<std::time::Instant>,
    _caller: idxfs_engine::caller::Guard,
}

impl Drop for InHandler<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.since {
            let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.requests.nanos[self.op as usize].add(ns);
        }
    }
}

impl Default for Requests {
    fn default() -> Requests {
        Requests {
            ops: std::array::from_fn(|_| Default::default()),
            nanos: std::array::from_fn(|_| Default::default()),
            timed: false,
            plus_read_ahead: Default::default(),
            plus_ahead_stale: Default::default(),
        }
    }
}

impl Requests {
    /// Counts requests and also times their handlers (two clock reads per request).
    pub fn timed() -> Requests {
        Requests {
            timed: true,
            ..Requests::default()
        }
    }

    fn count(&self, op: Op, privileged: bool) -> InHandler<'_> {
        self.ops[op as usize].add(1);
        InHandler {
            requests: self,
            op,
            since: self.timed.then(std::time::Instant::now),
            _caller: idxfs_engine::caller::enter(privileged),
        }
    }

    /// (request kind, count, seconds in its handler) for every kind seen; seconds are 0
    /// unless the requests were [`Requests::timed`].
    pub fn snapshot(&self) -> Vec<(&'static str, u64, f64)> {
        OP_NAMES
            .iter()
            .zip(self.ops.iter().zip(&self.nanos))
            .map(|(n, (c, t))| (*n, c.get(), t.get() as f64 / 1e9))
            .filter(|(_, c, _)| *c > 0)
            .collect()
    }
}

/// The FUSE file system: an engine handle and the caching policy.
pub struct IdxFuse {
    fs: Arc<Fs>,
    /// What the mount settled when it started, read by requests.
    set: Settings,
    requests: Arc<Requests>,
    /// How many entries the last full readdirplus reply held: the kernel's buffer size is not
    /// passed to us, and reading far more names than fit would be wasted work.
    plus_fit: std::sync::atomic::AtomicUsize,
    /// Some: ask the kernel for FUSE over io_uring at init, and set the flag when it agrees.
    uring: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// The ring workers' view of the request stream: whether forgets may wait
    /// ([`handoff::FORGET_PAUSE`]).
    recent: Option<Arc<handoff::Recent>>,
    /// The next readdirplus batch of a listing, read while the kernel takes in the last.
    readahead: readahead::ReadAhead,
    /// Tells the kernel what it caches has gone stale, where no reply can: set by `serve` once
    /// the session exists.
    notifier: Arc<OnceLock<Notifier>>,
    /// What makes the entries of `idxfs import` (`import.rs`); None: the ioctl is unknown.
    import: Option<Arc<dyn import::ImportServer>>,
    /// The snapshots shown inside the mount (`snapdir.rs`); None with `-o nosnapdir`.
    snapdir: Option<snapdir::Snapdir>,
    /// `idxfs cp` copies and `idxfs rm` removals between two of their slices (`slices.rs`).
    copies: slices::Jobs<slices::CopyWork>,
    removals: slices::Jobs<slices::RemoveWork>,
}

/// What a mount settled when it started (from `MountConfig` and the server's own identity),
/// fixed for its life.
struct Settings {
    /// How long the kernel may trust an entry or attributes (and a negative lookup).
    ttl: Duration,
    /// Ask for the kernel's writeback cache.
    writeback: bool,
    /// Answer SEEK_DATA/SEEK_HOLE from the extents (`MountConfig::holes`); never with the
    /// writeback cache.
    holes: bool,
    /// Let the kernel choose plain READDIR where no entry it lists is looked up
    /// (`MountConfig::readdirplus_auto`).
    readdirplus_auto: bool,
    /// CPUs the workers are pinned to, one each (empty: not pinned); see `pin.rs`.
    pin_cpus: Vec<usize>,
    /// The mount's owner (the server's real uid): with root, the only caller a remount
    /// request is taken from (`remount.rs`).
    owner_uid: u32,
    /// POSIX ACLs kept by the engine and enforced by the kernel (`MountConfig::acl`).
    acl: bool,
}

impl IdxFuse {
    /// `uring`, `recent`: see the fields.
    pub fn new(
        fs: Arc<Fs>,
        cfg: &MountConfig,
        requests: Arc<Requests>,
        uring: Option<Arc<std::sync::atomic::AtomicBool>>,
        recent: Option<Arc<handoff::Recent>>,
    ) -> IdxFuse {
        // Every entry a create, mknod, mkdir, symlink or link replies with is the kernel's,
        // pinned by the engine inside the operation (`entry_made`).
        fs.hold_made();
        IdxFuse {
            readahead: readahead::ReadAhead::new(fs.clone()),
            fs,
            set: Settings {
                ttl: cfg.ttl,
                writeback: cfg.writeback,
                holes: cfg.holes && !cfg.writeback,
                readdirplus_auto: cfg.readdirplus_auto,
                acl: cfg.acl_here(),
                pin_cpus: if cfg.pins_threads() {
                    pin::allowed_cpus()
                } else {
                    Vec::new()
                },
                // SAFETY: getuid has no preconditions and cannot fail.
                owner_uid: unsafe { libc::getuid() },
            },
            requests,
            plus_fit: std::sync::atomic::AtomicUsize::new(64),
            uring,
            recent,
            notifier: Arc::default(),
            import: None,
            copies: slices::Jobs::default(),
            removals: slices::Jobs::default(),
            snapdir: cfg
                .snapdir
                .as_ref()
                .map(|n| snapdir::Snapdir::new(n.as_bytes().to_vec())),
        }
    }

    /// Where an inode number the kernel sent belongs (`snapdir.rs`).
    fn place(&self, ino: INodeNo) -> Place {
        match &self.snapdir {
            Some(d) => d.place(&self.fs, ino.0),
            None if ino.0 >> snapdir::SHIFT == 0 => Place::Live,
            None => Place::Stale,
        }
    }

    /// The engine that reads `ino`, and its number there: the file system's, or an open
    /// snapshot's or subvolume's; `in_dir`: the errno for the snapshots directory itself.
    fn tree(&self, ino: INodeNo, in_dir: Errno) -> Result<(Tree<'_>, u64), Errno> {
        match self.place(ino) {
            Place::Live => Ok((Tree::Live(&self.fs), ino.0)),
            Place::View(v) => {
                let i = v.ino;
                Ok((Tree::View(v), i))
            }
            Place::Dir => Err(in_dir),
            Place::Stale => Err(Errno::ESTALE),
        }
    }

    /// The tree that changes `ino`, and its number there: the file system's own, or a
    /// writable subvolume's shown in the snapshots directory; else the errno a change gets
    /// (a snapshot is read-only; a deleted one's numbers are stale).
    fn changeable(&self, ino: INodeNo) -> Result<(Tree<'_>, u64), Errno> {
        if ino.0 >> snapdir::SHIFT == 0 {
            return Ok((Tree::Live(&self.fs), ino.0));
        }
        match self.place(ino) {
            Place::View(v) if v.writable => {
                let i = v.ino;
                Ok((Tree::View(v), i))
            }
            Place::Stale => Err(Errno::ESTALE),
            _ => Err(Errno::EROFS),
        }
    }

    /// The tree of a rename or link between `a` and `b`, and their numbers there: both
    /// must be in one writable tree (`changeable`); EXDEV between two trees, as between
    /// two btrfs subvolumes.
    fn across(&self, a: INodeNo, b: INodeNo) -> Result<(Tree<'_>, u64, u64), Errno> {
        if a.0 >> snapdir::SHIFT != b.0 >> snapdir::SHIFT {
            return Err(Errno::EXDEV);
        }
        let (t, a) = self.changeable(a)?;
        Ok((t, a, snapdir::local(b.0)))
    }

    /// Whether `name` in `parent` is the snapshots directory: the root's name for it, where
    /// the file system has no entry of that name.
    fn names_snapdir(&self, parent: INodeNo, name: &[u8]) -> bool {
        parent == INodeNo::ROOT
            && self.snapdir.as_ref().is_some_and(|d| d.name() == name)
            && matches!(self.fs.lookup(parent.0, name), Err(Error::NotFound))
    }

    /// Replies with the snapshots directory's entry, for `ttl`: the mount's for the root's
    /// name of it (a path walk through it then asks nothing; `snapdir_changed` drops the
    /// link count the kernel keeps when a snapshot comes or goes), zero by number.
    fn snapdir_entry(&self, ttl: Duration, reply: ReplyEntry) {
        match self.snapdir.as_ref().map(|d| d.attr(&self.fs)) {
            Some(Ok(a)) => reply.entry(&ttl, &file_attr(&a), Generation(0)),
            Some(Err(e)) => reply.error(errno(&e)),
            None => reply.error(Errno::ENOENT),
        }
    }

    /// A snapshot or subvolume came or went (`gone`: its name, when it went by anything but
    /// an rmdir through the kernel, which drops the entry itself): the kernel forgets the
    /// snapshots directory's attributes (its link count) and that entry. Not from inside a
    /// request on the directory itself, whose lock the kernel holds while it waits (an
    /// mkdir or rmdir there: `gone` None then, as the kernel makes or drops the entry).
    fn snapdir_changed(&self, gone: Option<&[u8]>) {
        if let Some(n) = self.notifier.get() {
            if let Some(name) = gone {
                let _ = n.inval_entry(INodeNo(snapdir::DIR_INO), OsStr::from_bytes(name));
            }
            let _ = n.inval_inode(INodeNo(snapdir::DIR_INO), -1, 0);
        }
    }

    /// Replies with an entry inside a snapshot or subvolume: a writable subvolume's holds a
    /// pin for the kernel's lookup count, as the file system's own do (`entry`); a
    /// snapshot's none (nothing is unlinked in a snapshot).
    fn view_entry(&self, v: &View, r: Result<Attr, Error>, ttl: Duration, reply: ReplyEntry) {
        match r {
            Ok(a) => {
                if v.writable {
                    v.fs.pin(a.ino);
                }
                let a = v.attr(a);
                reply.entry(&ttl, &file_attr(&a), Generation(a.generation))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// A name in the snapshots directory: a snapshot's root, for the mount's TTL (a walk
    /// through it then asks nothing; its delete drops the kernel's entry, `snapdir_changed`,
    /// and a number of a deleted one is stale anyway), or "." and ".." by number (`lookup`).
    /// A name not there is an error, which the kernel does not keep.
    fn lookup_in_snapdir(&self, name: &[u8], reply: ReplyEntry) {
        let Some(d) = &self.snapdir else {
            return reply.error(Errno::ESTALE);
        };
        match name {
            b"." => self.snapdir_entry(Duration::ZERO, reply),
            b".." => self.entry(
                &Tree::Live(&self.fs),
                self.fs.getattr(INodeNo::ROOT.0),
                reply,
            ),
            _ => match d.lookup(&self.fs, name) {
                Ok(v) => {
                    let r = v.fs.getattr(v.ino);
                    self.view_entry(&v, r, self.set.ttl, reply)
                }
                Err(e) => reply.error(errno(&e)),
            },
        }
    }

    /// The snapshots directory's entries after `offset`: (kernel number, cookie, name).
    fn snapdir_listing(&self, offset: u64) -> Result<Vec<(u64, u64, std::ffi::OsString)>, Error> {
        let Some(d) = &self.snapdir else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        if offset < 1 {
            out.push((snapdir::DIR_INO, 1, ".".into()));
        }
        if offset < 2 {
            out.push((INodeNo::ROOT.0, 2, "..".into()));
        }
        for e in d.list(&self.fs, offset)? {
            // A snapshot past the last slot is not shown (`snapdir`).
            if let Some(ino) = e.ino {
                out.push((ino, e.id, OsStr::from_bytes(&e.name).to_owned()));
            }
        }
        Ok(out)
    }

    /// readdirplus of a snapshot's or subvolume's directory: no read-ahead, and pins as
    /// `view_entry` takes them.
    fn readdirplus_in_view(&self, v: &View, offset: u64, mut reply: ReplyDirectoryPlus) {
        use std::sync::atomic::Ordering::Relaxed;
        let limit = self.plus_fit.load(Relaxed) + 32;
        let batch = match v.fs.readdir_plus_batch(v.ino, offset, limit) {
            Ok(b) => b,
            Err(e) => return reply.error(errno(&e)),
        };
        let up = match v.ino == INodeNo::ROOT.0 {
            true => self.snapdir.as_ref().map(|d| d.attr(&self.fs)),
            false => None,
        };
        let mut added = 0;
        for (e, a) in &batch.entries {
            let a = match (&up, e.name.as_slice()) {
                (Some(Ok(up)), b"..") => up.clone(),
                _ => v.attr(a.clone()),
            };
            let name = OsStr::from_bytes(&e.name);
            let generation = Generation(a.generation);
            if reply.add(
                INodeNo(a.ino),
                e.cookie,
                name,
                &self.set.ttl,
                &file_attr(&a),
                generation,
            ) {
                break;
            }
            added += 1;
        }
        if v.writable {
            // Before the reply: the kernel may forget them as soon as it has it.
            v.fs.pin_many(&kernel_held(&batch.entries[..added]));
        }
        reply.ok()
    }

    /// readdirplus of the snapshots directory: each snapshot's root, opened (the mount's
    /// TTL, as `lookup_in_snapdir`).
    fn readdirplus_in_snapdir(&self, offset: u64, mut reply: ReplyDirectoryPlus) {
        let list = match self.snapdir_listing(offset) {
            Ok(l) => l,
            Err(e) => return reply.error(errno(&e)),
        };
        for (ino, cookie, name) in list {
            let a = match self.place(INodeNo(ino)) {
                Place::Dir => self.snapdir.as_ref().map(|d| d.attr(&self.fs)),
                Place::Live => Some(self.fs.getattr(ino)),
                Place::View(v) => Some(v.fs.getattr(v.ino).map(|a| v.attr(a))),
                Place::Stale => None,
            };
            // A snapshot deleted since the list was read is left out.
            let Some(Ok(a)) = a else { continue };
            if reply.add(
                INodeNo(ino),
                cookie,
                &name,
                &self.set.ttl,
                &file_attr(&a),
                Generation(0),
            ) {
                break;
            }
        }
        reply.ok()
    }

    /// `mkdir MOUNT/.snapshots/NAME` makes snapshot NAME, as ZFS's `.zfs/snapshot` takes it:
    /// from root or the mount's owner only (EPERM), as `idxfs snapshot MOUNT NAME`. Not on a
    /// `-o writeback` mount (EOPNOTSUPP): written pages the kernel still holds would be left
    /// out, and only the caller can send them (`idxfs snapshot` sends them by syncfs; an
    /// fsync of a file also waits for them).
    fn snapshot_by_mkdir(&self, req: &Request, name: &[u8], reply: ReplyEntry) {
        if req.uid() != 0 && req.uid() != self.set.owner_uid {
            return reply.error(Errno::EPERM);
        }
        if self.set.writeback {
            return reply.error(Errno::EOPNOTSUPP);
        }
        match self.fs.snapshot(name) {
            Ok(id) => {
                log::info!(
                    "snapshot {id} ({}) made by mkdir",
                    String::from_utf8_lossy(name)
                );
                self.lookup_in_snapdir(name, reply)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// `rmdir MOUNT/.snapshots/NAME` deletes snapshot NAME (as ZFS's), from root or the
    /// mount's owner only, as `idxfs snapshot MOUNT --delete ID`; its blocks come back in
    /// the background. A parked writable subvolume shown there goes only when its root is
    /// empty (ENOTEMPTY otherwise, as rmdir of a btrfs subvolume): its files are nobody's
    /// copy, and `rm -rf` of it must not end in a delete of everything.
    fn delete_by_rmdir(&self, req: &Request, name: &[u8], reply: ReplyEmpty) {
        if req.uid() != 0 && req.uid() != self.set.owner_uid {
            return reply.error(Errno::EPERM);
        }
        let Some(d) = &self.snapdir else {
            return reply.error(Errno::ENOENT);
        };
        let r = snapdir::Snapdir::id_of(&self.fs, name).and_then(|id| {
            if self.fs.subvolumes().iter().any(|s| s.id == id) {
                let v = d.lookup(&self.fs, name)?;
                if !v.fs.list(v.ino)?.is_empty() {
                    return Err(Error::NotEmpty);
                }
            }
            d.delete(&self.fs, id)?;
            log::info!("{id} deleted by rmdir; its blocks come back in the background");
            Ok(())
        });
        done(reply, r)
    }

    /// A name inside a snapshot or subvolume; its root's ".." is the snapshots directory.
    /// "." is a lookup by number (`lookup`): stale once the inode has no name left.
    fn lookup_in_view(&self, v: &View, name: &[u8], reply: ReplyEntry) {
        let r = match name {
            b"." => v.fs.getattr(v.ino).and_then(|a| match a.nlink {
                0 => Err(Error::NotFound),
                _ => Ok(a),
            }),
            b".." if v.ino == INodeNo::ROOT.0 => return self.snapdir_entry(Duration::ZERO, reply),
            _ => v.fs.lookup(v.ino, name),
        };
        match r {
            Err(Error::NotFound) if name != b"." => {
                reply.entry(&self.set.ttl, &negative_entry(), Generation(0))
            }
            r => self.view_entry(v, r, self.set.ttl, reply),
        }
    }

    /// Takes `idxfs import` requests, made by `server`.
    pub fn with_import(mut self, server: Option<Arc<dyn import::ImportServer>>) -> IdxFuse {
        self.import = server;
        self
    }

    /// Where `serve` puts the session's notifier, before the session takes `self`.
    pub(crate) fn notifier_slot(&self) -> Arc<OnceLock<Notifier>> {
        self.notifier.clone()
    }

    /// An ACL set with ACLs on: the engine keeps it and sets the mode to match
    /// (`idxfs_engine::fs::acl`). The kernel checked the caller may (owner or CAP_FOWNER)
    /// and that the value is valid, and forgets its cached ACLs and mode after the reply.
    /// Set-group-ID goes unless the caller is root or in the file's group: the kernel's
    /// CAP_FSETID test, as far as a FUSE request shows it (the flag that says it exactly
    /// comes only with FUSE_SETXATTR_EXT, which fuser does not parse).
    #[allow(clippy::too_many_arguments)]
    fn set_acl(
        &self,
        req: &Request,
        fs: &Fs,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: i32,
        reply: ReplyEmpty,
    ) {
        let kill_sgid = match fs.getattr(ino) {
            Ok(a) => req.uid() != 0 && a.mode & 0o2000 != 0 && kill::outside_group(req, a.gid),
            Err(e) => return reply.error(errno(&e)),
        };
        done(
            reply,
            fs.setxattr_with(ino, name, value, flags as u32, kill_sgid),
        )
    }

    /// xattr names refused with EOPNOTSUPP and left out of lists: `xattr_unsupported`, but
    /// for the ACLs when they are on.
    fn unsupported(&self, name: &[u8]) -> bool {
        xattr_unsupported(name) && !(self.set.acl && acl::is_acl(name))
    }

    /// `system.posix_acl_access` with ACLs off: an ACL the mode says in full is a chmod of
    /// the permission bits (`acl.rs`); one naming other users or groups is not kept.
    /// `ino`: the kernel's number, of an inode of `t`.
    fn set_access_acl(
        &self,
        req: &Request,
        t: &Tree,
        ino: INodeNo,
        value: &[u8],
        reply: ReplyEmpty,
    ) {
        let i = snapdir::local(ino.0);
        let bits = match acl::access(value) {
            acl::Access::Mode(bits) => bits,
            acl::Access::Extended => return reply.error(Errno::EOPNOTSUPP),
            acl::Access::Malformed => return reply.error(Errno::EINVAL),
        };
        // The kernel keeps the mode it has (for an hour by default) after a SETXATTR, so the
        // change is made only when it can be told; without a notifier the caller's chmod
        // fallback does the work.
        let Some(notifier) = self.notifier.get() else {
            return reply.error(Errno::EOPNOTSUPP);
        };
        let a = match t.getattr(i) {
            Ok(a) => a,
            Err(e) => return reply.error(errno(&e)),
        };
        let Some(mode) = acl::chmod(a.mode, file_owner(&a), bits, owner(req)) else {
            return reply.error(Errno::EPERM);
        };
        let set = SetAttr {
            mode: Some(mode),
            ..SetAttr::default()
        };
        if let Err(e) = t.setattr(i, &set) {
            return reply.error(errno(&e));
        }
        // Before the reply, so the caller's next stat or exec sees the new mode. ENOENT (the
        // kernel dropped the inode) is no error; any other failure means the connection is
        // going away.
        match notifier.inval_inode(ino, -1, 0) {
            Ok(()) => reply.ok(),
            Err(_) => reply.error(Errno::EIO),
        }
    }

    /// What a change to `ino` of `fs` asked by `req` drops (`kill`); `asked`: the kernel's
    /// kill flag.
    fn kill(&self, req: &Request, fs: &Fs, ino: u64, asked: bool) -> Result<Kill, Error> {
        if !asked {
            return Ok(Kill::default());
        }
        Ok(kill::for_request(req, &fs.getattr(ino)?, true))
    }

    /// After a forget: while replies hand off, wait before reading /dev/fuse again, so the
    /// kernel's next forgets wake no one and come as one batch ([`handoff::FORGET_PAUSE`]).
    fn after_forget(&self) {
        if self.recent.as_ref().is_some_and(|r| r.forgets_may_wait()) {
            std::thread::sleep(handoff::FORGET_PAUSE);
        }
    }

    /// Where every request starts: counts it, pins a worker on its first request, and tells
    /// the engine whether the caller is privileged (uid 0: it may grow into the root
    /// reserve). Hold the result until the handler returns: it times the handler when
    /// counters are on, and restores the caller after.
    #[must_use]
    fn begin(&self, op: Op, req: &Request) -> InHandler<'_> {
        pin::pin_this_worker(&self.set.pin_cpus);
        self.requests.count(op, req.uid() == 0)
    }

    /// Replies with an entry an operation of tree `t` made or linked: the engine pinned it
    /// already, under the operation's lock (`Fs::hold_made`), for the lookup count the reply
    /// gives.
    fn entry_made(&self, t: &Tree, r: Result<Attr, Error>, reply: ReplyEntry) {
        match r {
            Ok(a) => {
                let a = t.attr(a);
                reply.entry(&self.set.ttl, &file_attr(&a), Generation(a.generation))
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Replies with an entry of tree `t` the kernel now holds: one lookup count, one engine
    /// pin (none in a snapshot, `view_entry`).
    fn entry(&self, t: &Tree, r: Result<Attr, Error>, reply: ReplyEntry) {
        match r {
            Ok(a) => {
                if t.pins() {
                    t.pin(a.ino);
                }
                let a = t.attr(a);
                reply.entry(&self.set.ttl, &file_attr(&a), Generation(a.generation));
            }
            Err(e) => reply.error(errno(&e)),
        }
    }
}

/// The engine a request acts on (`IdxFuse::tree`, `changeable`): the file system's own
/// handle, borrowed (no shared count touched on the hot path), or an open snapshot's or
/// subvolume's, whose inode numbers the kernel sees in its slot (`snapdir`).
enum Tree<'a> {
    Live(&'a Fs),
    View(View),
}

impl Tree<'_> {
    /// `a` as the kernel sees it: its number (and generation) in the tree's slot.
    fn attr(&self, a: Attr) -> Attr {
        match self {
            Tree::Live(_) => a,
            Tree::View(v) => v.attr(a),
        }
    }

    /// `attr`, for a reply sent once `self` is gone (`long`).
    fn attr_fn(&self) -> impl Fn(Attr) -> Attr + Send + 'static {
        let view = match self {
            Tree::Live(_) => None,
            Tree::View(v) => Some((v.slot, v.id)),
        };
        move |a| match view {
            None => a,
            Some((slot, id)) => snapdir::attr_in(slot, id, a),
        }
    }

    /// The kernel's number for the tree's inode `ino`.
    fn out(&self, ino: u64) -> u64 {
        match self {
            Tree::Live(_) => ino,
            Tree::View(v) => v.out(ino),
        }
    }

    /// Whether the kernel's lookups of its inodes hold engine pins: in the file system's
    /// own tree and a writable subvolume's, not in a snapshot.
    fn pins(&self) -> bool {
        match self {
            Tree::Live(_) => true,
            Tree::View(v) => v.writable,
        }
    }

    /// The tree's own handle, shared: the file system's (`live`) or the view's.
    fn shared(&self, live: &Arc<Fs>) -> Arc<Fs> {
        match self {
            Tree::Live(_) => live.clone(),
            Tree::View(v) => v.fs.clone(),
        }
    }
}

impl std::ops::Deref for Tree<'_> {
    type Target = Fs;
    fn deref(&self) -> &Fs {
        match self {
            Tree::Live(fs) => fs,
            Tree::View(v) => &v.fs,
        }
    }
}

pub(crate) fn errno(e: &Error) -> Errno {
    if e.is_fatal() {
        // A failing device or a damaged image: worth a line wherever the messages go.
        log::error!("{e}");
    }
    Errno::from_i32(e.errno())
}

fn owner(req: &Request) -> Owner {
    Owner {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn file_owner(a: &Attr) -> Owner {
    Owner {
        uid: a.uid,
        gid: a.gid,
    }
}

fn system_time(t: Time) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        // sec < 0 with nsec >= 0 is the instant sec + nsec/1e9, before the epoch.
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + Duration::from_nanos(t.nsec as u64)
    }
}

fn engine_time(t: SystemTime) -> Time {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Time {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
            if n == 0 {
                Time { sec: -s, nsec: 0 }
            } else {
                Time {
                    sec: -s - 1,
                    nsec: 1_000_000_000 - n,
                }
            }
        }
    }
}

fn kind(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn kind_of_dtype(dtype: u8) -> FileType {
    match dtype {
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_FIFO => FileType::NamedPipe,
        libc::DT_SOCK => FileType::Socket,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.btime),
        kind: kind(a.mode),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        // The kernel's device numbers are 32-bit (new_encode_dev); mknod stored what it sent.
        rdev: u32::try_from(a.rdev).unwrap_or(u32::MAX),
        blksize: 4096,
        flags: 0,
    }
}

/// An entry the kernel may cache as "no such name" (node id 0).
fn negative_entry() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(engine_time(t)),
    }
}

/// xattr names this file system does not store, refused with EOPNOTSUPP for get, set, remove
/// and left out of lists (POSIX ACLs only when they are off: `IdxFuse::unsupported`):
/// - `system.` names other than ACLs have no meaning here, and ACLs on a mount without them
///   would be kept but never enforced, so they are refused as a file system without ACLs
///   refuses them (btrfs mounted `noacl` answers the same).
/// - `security.selinux`: SELinux labels a FUSE mount by policy (genfscon) or the `context=`
///   mount option, never by reading this xattr, so a stored label would mean nothing.
///
/// "Not supported" is also what lets GNU `ls -l` stop asking: it reads both for every file
/// until a device says so, and then never again on that device. Answering ENODATA instead cost
/// a GETXATTR round trip per file listed (1,000 for `ls -l` of 1,000 files; now 2). `cp -a`
/// still asks for every file's ACL; setting or removing an access ACL is handled before this
/// is asked (`acl.rs`).
fn xattr_unsupported(name: &[u8]) -> bool {
    name.starts_with(b"system.") || name == b"security.selinux"
}

fn bytes(name: &OsStr) -> &[u8] {
    name.as_bytes()
}

/// Alignment of O_DIRECT offsets and lengths: a 512-byte sector, as ext4 on a loop device
/// or a disk of 512-byte logical blocks asks.
const DIRECT_IO_ALIGN: u64 = 512;

/// Whether a read or write of the caller's own (a file opened with O_DIRECT) is not aligned
/// as ext4 requires, which refuses it with EINVAL: a program that works here then works
/// there. The kernel passes a direct request's offset and length through unchanged (split
/// at aligned points); the caller's buffer address never reaches the daemon, so a
/// misaligned buffer is taken (FUSE copies it either way).
fn misaligned_direct(flags: OpenFlags, offset: u64, len: u64) -> bool {
    flags.0 & libc::O_DIRECT != 0
        && (!offset.is_multiple_of(DIRECT_IO_ALIGN) || !len.is_multiple_of(DIRECT_IO_ALIGN))
}
impl Filesystem for IdxFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if self.set.writeback {
            let _ = config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE);
        }
        if self.set.readdirplus_auto {
            let _ = config.add_capabilities(InitFlags::FUSE_READDIRPLUS_AUTO);
        }
        if self.set.acl {
            // The kernel caches and enforces ACLs, and leaves the umask to the engine, which
            // must ignore it under a default ACL (`idxfs_engine::fs::acl`).
            config
                .add_capabilities(InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK)
                .map_err(|_| {
                    std::io::Error::other("this kernel's FUSE has no POSIX ACLs: mount -o noacl")
                })?;
        }
        for flag in [
            InitFlags::FUSE_NO_OPEN_SUPPORT,
            InitFlags::FUSE_NO_OPENDIR_SUPPORT,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_MAX_PAGES,
            InitFlags::FUSE_BIG_WRITES,
            InitFlags::FUSE_ASYNC_READ,
            // An O_DIRECT read or write of an asynchronous caller (io_uring, aio) goes out as
            // requests the caller does not wait for one by one: a queue of them in flight.
            InitFlags::FUSE_ASYNC_DIO,
            // The engine drops set-user-ID, set-group-ID and capabilities on write, truncate
            // and chown itself (`privs` in the engine): the kernel then asks for no
            // security.capability before writes and no getattr before each chown.
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
            // File handles that outlive the kernel's inode cache and a remount (NFS export,
            // open_by_handle_at): inode numbers are never reused, and "." and ".." are
            // looked up by number (`lookup`).
            InitFlags::FUSE_EXPORT_SUPPORT,
        ] {
            // A kernel without a feature gets the request without it.
            let _ = config.add_capabilities(flag);
        }
        if let Some(granted) = &self.uring {
            // Offered only when the kernel has fuse.enable_uring=Y.
            let ok = config
                .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                .is_ok();
            granted.store(ok, std::sync::atomic::Ordering::Relaxed);
        }
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_time_granularity(Duration::from_nanos(1));
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _in = self.begin(Op::Lookup, req);
        match self.place(parent) {
            Place::Live => {}
            Place::Stale => return reply.error(Errno::ESTALE),
            Place::Dir => return self.lookup_in_snapdir(bytes(name), reply),
            Place::View(v) => return self.lookup_in_view(&v, bytes(name), reply),
        }
        if bytes(name) == b"." {
            // FUSE_EXPORT_SUPPORT: the kernel finds an inode it forgot, from a file handle
            // (nodeid = inode number, and its generation), by a lookup of "." in the inode
            // itself, whatever its type. Path walks never send "." or "..". An inode with no
            // name left is stale, as on ext4.
            let r = self.fs.getattr(parent.0).and_then(|a| match a.nlink {
                0 => Err(Error::NotFound),
                _ => Ok(a),
            });
            return self.entry(&Tree::Live(&self.fs), r, reply);
        }
        match self.fs.lookup(parent.0, bytes(name)) {
            Err(Error::NotFound)
                if parent == INodeNo::ROOT
                    && self
                        .snapdir
                        .as_ref()
                        .is_some_and(|d| d.name() == bytes(name)) =>
            {
                self.snapdir_entry(self.set.ttl, reply)
            }
            Err(Error::NotFound) => reply.entry(&self.set.ttl, &negative_entry(), Generation(0)),
            r => self.entry(&Tree::Live(&self.fs), r, reply),
        }
    }

    fn forget(&self, req: &Request, ino: INodeNo, nlookup: u64) {
        let _in = self.begin(Op::Forget, req);
        // An error here (a failed device) already turned the file system read-only; the
        // orphan stays listed and is freed at the next mount.
        // Inodes of snapshots hold no pins (`view_entry`); a writable subvolume's are held
        // by its handle while it is open.
        if ino.0 >> snapdir::SHIFT == 0 {
            let _ = self.fs.unpin(ino.0, nlookup);
        } else if let Some((fs, i)) = self.snapdir.as_ref().and_then(|d| d.pinned(ino.0)) {
            let _ = fs.unpin(i, nlookup);
        }
        drop(_in);
        self.after_forget();
    }

    /// The kernel sends the forgets queued meanwhile as one request: one engine lock for all.
    /// More queue up while the /dev/fuse thread waits after one (`after_forget`), which pays
    /// only while replies hand off (`handoff::FORGET_PAUSE`).
    fn batch_forget(&self, req: &Request, nodes: &[ForgetOne]) {
        let _in = self.begin(Op::BatchForget, req);
        let list: Vec<(u64, u64)> = nodes
            .iter()
            .filter(|n| n.nodeid().0 >> snapdir::SHIFT == 0)
            .map(|n| (n.nodeid().0, n.nlookup()))
            .collect();
        // As in `forget`: an error left the file system read-only, orphans stay listed.
        let _ = self.fs.unpin_many(&list);
        // A writable subvolume's, one by one (as `forget`).
        let d = self.snapdir.as_ref();
        for n in nodes.iter().filter(|n| n.nodeid().0 >> snapdir::SHIFT != 0) {
            if let Some((fs, i)) = d.and_then(|d| d.pinned(n.nodeid().0)) {
                let _ = fs.unpin(i, n.nlookup());
            }
        }
        drop(_in);
        self.after_forget();
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _in = self.begin(Op::Getattr, req);
        let (r, ttl) = match self.place(ino) {
            Place::Live => (self.fs.getattr(ino.0), self.set.ttl),
            Place::View(v) => (v.fs.getattr(v.ino).map(|a| v.attr(a)), self.set.ttl),
            Place::Dir => match &self.snapdir {
                Some(d) => (d.attr(&self.fs), Duration::ZERO),
                None => (Err(Error::NotFound), Duration::ZERO),
            },
            Place::Stale => return reply.error(Errno::ESTALE),
        };
        match r {
            Ok(a) => reply.attr(&ttl, &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        kill_suidgid: bool,
        reply: ReplyAttr,
    ) {
        let _in = self.begin(Op::Setattr, req);
        let (t, ino) = match self.changeable(ino) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        let kill = match self.kill(req, &t, ino, kill_suidgid && size.is_some()) {
            Ok(k) => k,
            Err(e) => return reply.error(errno(&e)),
        };
        let set = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
            ctime: ctime.map(engine_time),
            kill,
        };
        // A truncate over many extents, on a thread of its own (`long`).
        let extents = match size.map(|s| t.truncate_extents_at_most(ino, s)) {
            None => 0,
            Some(Ok(n)) => n,
            Some(Err(e)) => return reply.error(errno(&e)),
        };
        let (ttl, out) = (self.set.ttl, t.attr_fn());
        long::run(
            t.shared(&self.fs),
            extents,
            move |fs| fs.setattr(ino, &set),
            move |r| match r {
                Ok(a) => reply.attr(&ttl, &file_attr(&out(a))),
                Err(e) => reply.error(errno(&e)),
            },
        )
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let _in = self.begin(Op::Readlink, req);
        let (fs, ino) = match self.tree(ino, Errno::EINVAL) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        match fs.readlink(ino) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _in = self.begin(Op::Mknod, req);
        let (t, parent) = match self.changeable(parent) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        // The umask is the engine's to apply (FUSE_DONT_MASK; without it the kernel applied
        // it already, and again changes nothing).
        let r = t.mknod_umask(parent, bytes(name), mode, owner(req), rdev as u64, umask);
        self.entry_made(&t, r, reply)
    }

    /// O_TMPFILE. The engine pins the file once itself (the kernel's one lookup count), and
    /// it has no name until a `link`. Opened as every file is here: no handle (no-open).
    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let _in = self.begin(Op::Tmpfile, req);
        let (t, parent) = match self.changeable(parent) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        match t
            .tmpfile_umask(parent, mode, owner(req), umask)
            .map(|a| t.attr(a))
        {
            Ok(a) => reply.created(
                &self.set.ttl,
                &file_attr(&a),
                Generation(a.generation),
                FileHandle(0),
                fuser::FopenFlags::empty(),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let _in = self.begin(Op::Mkdir, req);
        if parent.0 == snapdir::DIR_INO && self.snapdir.is_some() {
            return self.snapshot_by_mkdir(req, bytes(name), reply);
        }
        let (t, parent) = match self.changeable(parent) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        let r = t.mknod_umask(
            parent,
            bytes(name),
            libc::S_IFDIR | (mode & 0o7777),
            owner(req),
            0,
            umask,
        );
        self.entry_made(&t, r, reply)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _in = self.begin(Op::Unlink, req);
        if self.names_snapdir(parent, bytes(name)) {
            return reply.error(Errno::EROFS);
        }
        match self.changeable(parent) {
            Ok((t, parent)) => done(reply, t.unlink(parent, bytes(name))),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _in = self.begin(Op::Rmdir, req);
        if parent.0 == snapdir::DIR_INO && self.snapdir.is_some() {
            return self.delete_by_rmdir(req, bytes(name), reply);
        }
        if self.names_snapdir(parent, bytes(name)) {
            return reply.error(Errno::EROFS);
        }
        match self.changeable(parent) {
            Ok((t, parent)) => done(reply, t.rmdir(parent, bytes(name))),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _in = self.begin(Op::Symlink, req);
        let (t, parent) = match self.changeable(parent) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        let r = t.symlink(
            parent,
            bytes(link_name),
            target.as_os_str().as_bytes(),
            owner(req),
        );
        self.entry_made(&t, r, reply)
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _in = self.begin(Op::Rename, req);
        let (t, parent_in, newparent) = match self.across(parent, newparent) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        if self.names_snapdir(parent, bytes(name)) {
            return reply.error(Errno::EROFS);
        }
        done(
            reply,
            t.rename(
                parent_in,
                bytes(name),
                newparent,
                bytes(newname),
                flags.bits(),
            ),
        )
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _in = self.begin(Op::Link, req);
        let (t, ino, newparent) = match self.across(ino, newparent) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        let r = t.link(ino, newparent, bytes(newname));
        self.entry_made(&t, r, reply)
    }

    fn open(&self, req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _in = self.begin(Op::Open, req);
        // With FUSE_NO_OPEN_SUPPORT, ENOSYS tells the kernel to stop sending open (and
        // release): the engine keeps no per-open state.
        reply.error(Errno::ENOSYS);
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let _in = self.begin(Op::Read, req);
        if misaligned_direct(flags, offset, size as u64) {
            return reply.error(Errno::EINVAL);
        }
        let (fs, ino) = match self.tree(ino, Errno::EISDIR) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        // Over io_uring the data goes straight into the ring entry's reply area.
        let reply = match uring::with_reply_area(size as usize, reply, |area, reply| {
            match fs.read_into(ino, offset, area) {
                Ok(n) => reply.data(&area[..n]),
                Err(e) => reply.error(errno(&e)),
            }
        }) {
            Ok(()) => return,
            Err(reply) => reply,
        };
        match fs.read(ino, offset, size as usize) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let _in = self.begin(Op::Write, req);
        let (t, ino) = match self.changeable(ino) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        // A delayed write from the page cache (of a file mapped or written through the
        // writeback cache) is not the caller's direct I/O, whatever the file's flags. This
        // kernel sends such writes without open flags (mount_direct_io's mapped file, cut to
        // an unaligned size, shows it); the check keeps them safe should one ever carry
        // O_DIRECT.
        let cached = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        if !cached && misaligned_direct(flags, offset, data.len() as u64) {
            return reply.error(Errno::EINVAL);
        }
        // FUSE_HANDLE_KILLPRIV_V2: the writer lacks CAP_FSETID.
        let kill = match self.kill(
            req,
            &t,
            ino,
            write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID),
        ) {
            Ok(k) => k,
            Err(e) => return reply.error(errno(&e)),
        };
        let how = WriteHow {
            // With the writeback cache the kernel keeps mtime and ctime and sends them by
            // setattr; a write request can come after that setattr and must not override them.
            times: !self.set.writeback,
            kill,
        };
        let r = t.write_with(ino, offset, data, how);
        match r {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        let _in = self.begin(Op::Flush, req);
        // Data is in the engine once write returned and durability is fsync's job, so there is
        // nothing to do: ENOSYS tells the kernel to stop sending flush on every close (it
        // still writes back cached pages first and reports their errors to close).
        reply.error(Errno::ENOSYS);
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _in = self.begin(Op::Fsync, req);
        match self.place(ino) {
            Place::Live => done(reply, self.fs.fsync(ino.0)),
            Place::View(v) if v.writable => done(reply, v.fs.fsync(v.ino)),
            // A snapshot is durable since it was made.
            Place::Dir | Place::View(_) => reply.ok(),
            Place::Stale => reply.error(Errno::ESTALE),
        }
    }

    fn opendir(&self, req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _in = self.begin(Op::Opendir, req);
        // FUSE_NO_OPENDIR_SUPPORT: as for open.
        reply.error(Errno::ENOSYS);
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _in = self.begin(Op::Readdir, req);
        match self.place(ino) {
            Place::Live => {}
            Place::Stale => return reply.error(Errno::ESTALE),
            Place::View(v) => {
                let root = v.ino == INodeNo::ROOT.0;
                let r = v.fs.readdir(v.ino, offset, |e| {
                    let out = match root && e.name == b".." {
                        true => snapdir::DIR_INO,
                        false => v.out(e.ino),
                    };
                    let kind = kind_of_dtype(e.dtype);
                    !reply.add(INodeNo(out), e.cookie, kind, OsStr::from_bytes(&e.name))
                });
                return match r {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(errno(&e)),
                };
            }
            Place::Dir => {
                let r = self.snapdir_listing(offset).map(|list| {
                    for (ino, cookie, name) in list {
                        if reply.add(INodeNo(ino), cookie, FileType::Directory, &name) {
                            break;
                        }
                    }
                });
                return match r {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(errno(&e)),
                };
            }
        }
        let r = self.fs.readdir(ino.0, offset, |e| {
            !reply.add(
                INodeNo(e.ino),
                e.cookie,
                kind_of_dtype(e.dtype),
                OsStr::from_bytes(&e.name),
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _in = self.begin(Op::Readdirplus, req);
        match self.place(ino) {
            Place::Live => {}
            Place::Stale => return reply.error(Errno::ESTALE),
            Place::View(v) => return self.readdirplus_in_view(&v, offset, reply),
            Place::Dir => return self.readdirplus_in_snapdir(offset, reply),
        }
        // The kernel's buffer (up to 32 KiB here: ~200 entries) is not passed to us. Read a
        // little more than the last full reply held; `add` says when the buffer is full, and the
        // names read past it cost only a leaf scan.
        use std::sync::atomic::Ordering::Relaxed;
        let limit = self.plus_fit.load(Relaxed) + 32;
        // A batch read ahead from here, if nothing changed since: all its inodes are pinned
        // then, and the pins of those that do not fit are dropped below.
        let ahead = self.readahead.take(ino.0, offset);
        let had_ahead = ahead.is_some();
        let ahead = ahead.filter(|b| self.fs.pin_if_unchanged(b.seq, &kernel_held(&b.entries)));
        let pinned = ahead.is_some();
        if pinned {
            self.requests.plus_read_ahead.add(1);
        } else if had_ahead {
            self.requests.plus_ahead_stale.add(1);
        }
        let batch = match ahead {
            Some(b) => b,
            None => match self.fs.readdir_plus_batch(ino.0, offset, limit) {
                Ok(b) => b,
                Err(e) => return reply.error(errno(&e)),
            },
        };
        let mut full = false;
        let mut added = 0;
        for (e, a) in &batch.entries {
            full = reply.add(
                INodeNo(e.ino),
                e.cookie,
                OsStr::from_bytes(&e.name),
                &self.set.ttl,
                &file_attr(a),
                Generation(a.generation),
            );
            if full {
                break;
            }
            added += 1;
        }
        let (sent, rest) = batch.entries.split_at(added);
        if pinned {
            let extra: Vec<(u64, u64)> = kernel_held(rest).into_iter().map(|i| (i, 1)).collect();
            if !extra.is_empty() {
                // An error here left the file system read-only (as in `forget`).
                let _ = self.fs.unpin_many(&extra);
            }
        } else {
            self.fs.pin_many(&kernel_held(sent));
        }
        if full {
            self.plus_fit.store(added.clamp(16, 4096), Relaxed);
        } else if batch.more {
            // Sent the whole batch without filling the buffer: the buffer is larger.
            self.plus_fit.store((added * 2).clamp(16, 4096), Relaxed);
        }
        // More may follow when the buffer or the batch ran out before the directory did: read
        // the next batch while the kernel takes in this one.
        if full || batch.more {
            if let Some((e, _)) = sent.last() {
                self.readahead
                    .start(ino.0, e.cookie, self.plus_fit.load(Relaxed) + 32);
            }
        }
        reply.ok()
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _in = self.begin(Op::Fsyncdir, req);
        match self.place(ino) {
            Place::Live => done(reply, self.fs.fsync(ino.0)),
            Place::View(v) if v.writable => done(reply, v.fs.fsync(v.ino)),
            // A snapshot is durable since it was made.
            Place::Dir | Place::View(_) => reply.ok(),
            Place::Stale => reply.error(Errno::ESTALE),
        }
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _in = self.begin(Op::Statfs, req);
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_avail,
                s.files,
                s.files_free,
                s.block_size,
                s.name_max,
                s.block_size,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _in = self.begin(Op::Setxattr, req);
        let (t, i) = match self.changeable(ino) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        if self.set.acl && acl::is_acl(bytes(name)) {
            return self.set_acl(req, &t, i, bytes(name), value, flags, reply);
        }
        if bytes(name) == acl::ACCESS {
            return self.set_access_acl(req, &t, ino, value, reply);
        }
        if xattr_unsupported(bytes(name)) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        done(reply, t.setxattr(i, bytes(name), value, flags as u32))
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _in = self.begin(Op::Getxattr, req);
        if self.unsupported(bytes(name)) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let (fs, ino) = match self.tree(ino, Errno::ENODATA) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        match fs.getxattr(ino, bytes(name)) {
            Ok(v) => sized(reply, size, &v),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _in = self.begin(Op::Listxattr, req);
        let r = match self.tree(ino, Errno::ENODATA) {
            Ok((fs, ino)) => fs.listxattr(ino),
            Err(Errno::ENODATA) => Ok(Vec::new()),
            Err(e) => return reply.error(e),
        };
        match r {
            Ok(names) => {
                let mut buf = Vec::new();
                for n in names.into_iter().filter(|n| !self.unsupported(n)) {
                    buf.extend_from_slice(&n);
                    buf.push(0);
                }
                sized(reply, size, &buf)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _in = self.begin(Op::Removexattr, req);
        let (t, ino) = match self.changeable(ino) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        if !self.set.acl && acl::is_acl(bytes(name)) {
            // Nothing beyond the mode is kept, so nothing is removed (`acl.rs`); the owner or
            // root only, as for setting one.
            return match t.getattr(ino) {
                Ok(a) if acl::may_change(file_owner(&a), owner(req)) => reply.ok(),
                Ok(_) => reply.error(Errno::EPERM),
                Err(e) => reply.error(errno(&e)),
            };
        }
        if self.unsupported(bytes(name)) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        done(reply, t.removexattr(ino, bytes(name)))
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _in = self.begin(Op::Access, req);
        // Sent for access(2) and chdir when the kernel does not check permissions itself (a
        // root mount without allow_other, `MountConfig::kernel_checks_permissions`).
        let r = match self.place(ino) {
            Place::Live => self.fs.getattr(ino.0),
            Place::View(v) => v.fs.getattr(v.ino),
            Place::Dir => match &self.snapdir {
                Some(d) => d.attr(&self.fs),
                None => Err(Error::NotFound),
            },
            Place::Stale => return reply.error(Errno::ESTALE),
        };
        match r {
            Ok(a) => {
                if permission::Caller::of(req).may(&a, None, mask.bits() as u32) {
                    reply.ok()
                } else {
                    reply.error(Errno::EACCES)
                }
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let _in = self.begin(Op::Create, req);
        // ENOSYS: the kernel remembers it and creates with MKNOD, then opens without a request
        // (no-open). A file made by CREATE gets a RELEASE at its close until the first OPEN
        // is refused, so a workload that only creates (fs_mark, untar) paid four round trips
        // per file (LOOKUP, CREATE, GETATTR of the directory, RELEASE) where MKNOD pays three.
        reply.error(Errno::ENOSYS);
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _in = self.begin(Op::Fallocate, req);
        let (t, ino) = match self.changeable(ino) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        // FUSE passes no kill flag with fallocate (and KILLPRIV_V2 drops the kernel's own
        // setattr for it): a caller other than root counts as lacking CAP_FSETID.
        let kill = match self.kill(req, &t, ino, req.uid() != 0) {
            Ok(k) => k,
            Err(e) => return reply.error(errno(&e)),
        };
        // Over a file of many extents, on a thread of its own (`long`).
        let mode = mode as u32;
        let extents = match t.fallocate_extents_at_most(ino, offset, length, mode) {
            Ok(n) => n,
            Err(e) => return reply.error(errno(&e)),
        };
        long::run(
            t.shared(&self.fs),
            extents,
            move |fs| {
                fs.fallocate_with(ino, offset, length, mode, kill)
                    .map(|_| ())
            },
            move |r| done(reply, r),
        )
    }

    /// copy_file_range(2) between two files of this mount: the engine shares the source's
    /// blocks where offsets are block-aligned (`engine/src/fs/clone.rs`), so `cp` of a large
    /// file moves no data. The kernel has checked the open modes and flushed the source's
    /// cached writes; it drops the destination's cached pages after the reply. Inside one
    /// writable tree, or out of a snapshot into one; between two writable trees EXDEV, and
    /// the kernel copies the bytes itself.
    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let _in = self.begin(Op::CopyFileRange, req);
        let (t, out) = match self.changeable(ino_out) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        // As with fallocate, no kill flag comes with the request: a caller other than root
        // counts as lacking CAP_FSETID.
        let kill = match self.kill(req, &t, out, req.uid() != 0) {
            Ok(k) => k,
            Err(e) => return reply.error(errno(&e)),
        };
        // The reply's count is 32 bits; a longer copy is a short one, which callers repeat.
        let len = len.min(u64::from(u32::MAX) & !4095);
        // So is a copy that works past a slice (`slices`): this worker's other callers wait
        // for one slice at most, not for all of a copy of a file of many extents.
        let until = Some(std::time::Instant::now() + slices::copy_slice());
        if ino_in.0 >> snapdir::SHIFT != ino_out.0 >> snapdir::SHIFT {
            // Out of a snapshot: its blocks are shared where a copy inside the tree would
            // share them (`Fs::copy_from_snapshot`).
            let view = match self.place(ino_in) {
                Place::View(v) if !v.writable => v,
                Place::Dir => return reply.error(Errno::EISDIR),
                Place::Stale => return reply.error(Errno::ESTALE),
                Place::Live | Place::View(_) => return reply.error(Errno::EXDEV),
            };
            let (src, fs) = (view.ino, &view.fs);
            let r =
                t.copy_from_snapshot_until(fs, src, offset_in, out, offset_out, len, kill, until);
            return match r {
                Ok(n) => reply.written(n as u32),
                Err(e) => reply.error(errno(&e)),
            };
        }
        let ino_in = snapdir::local(ino_in.0);
        match t.copy_range_until(ino_in, offset_in, out, offset_out, len, kill, until) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        let _in = self.begin(Op::Ioctl, req);
        match cmd {
            remount::IOC_REMOUNT => self.remount_request(req, ino, in_data, reply),
            trim::IOC_TRIM => self.trim_request(req, ino, reply),
            snapshot::IOC_SNAPSHOT => self.snapshot_request(req, ino, in_data, reply),
            import::IOC_IMPORT => self.import_request(req, ino, in_data, reply),
            rmtree::IOC_RMTREE => self.rmtree_request(req, ino, in_data, reply),
            cptree::IOC_CPTREE => self.cptree_request(req, ino, in_data, reply),
            cptree::IOC_CPTREE_MORE => {
                match cptree::decode_more(in_data).and_then(|t| self.copies.take(t, req.uid())) {
                    Some(job) => self.cptree_slice(req.uid(), job, reply),
                    None => reply.error(Errno::EINVAL),
                }
            }
            rmtree::IOC_RMTREE_MORE => {
                match rmtree::decode_more(in_data).and_then(|t| self.removals.take(t, req.uid())) {
                    Some(job) => self.rmtree_slice(req.uid(), job, reply),
                    None => reply.error(Errno::EINVAL),
                }
            }
            c if fileattr::GETFLAGS.contains(&c) => match self.tree(ino, Errno::ENOTTY) {
                Ok((fs, ino)) => fileattr::getflags_request(&fs, ino, reply),
                Err(e) => reply.error(e),
            },
            c if fileattr::SETFLAGS.contains(&c) => match self.changeable(ino) {
                Ok((t, i)) => self.setflags_request(&t, i, ino, in_data, reply),
                Err(e) => reply.error(e),
            },
            fileattr::FSGETXATTR => match self.tree(ino, Errno::ENOTTY) {
                Ok((fs, ino)) => fileattr::fsgetxattr_request(&fs, ino, reply),
                Err(e) => reply.error(e),
            },
            // No other ioctl is known (FS_IOC_FSSETXATTR and the like): "not a tty", as the
            // kernel's file systems answer a command they do not have.
            _ => reply.error(Errno::ENOTTY),
        }
    }

    fn lseek(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let _in = self.begin(Op::Lseek, req);
        // Without `-o holes`, ENOSYS: the kernel asks no more on this connection and answers
        // from its own size, which sees pages it holds dirty (`MountConfig::holes`).
        if !self.set.holes {
            return reply.error(Errno::ENOSYS);
        }
        let what = match whence {
            libc::SEEK_DATA => Seek::Data,
            libc::SEEK_HOLE => Seek::Hole,
            // SEEK_SET/CUR/END never reach a file system.
            _ => return reply.error(Errno::EINVAL),
        };
        let Ok(off) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        let (fs, ino) = match self.tree(ino, Errno::EINVAL) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        match fs.seek(ino, off, what) {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

impl IdxFuse {
    /// `remount.rs`: the settings a remount asks for, from root or the mount's owner, on the
    /// mount's root directory; the answer carries the settings they replaced.
    /// `idxfs trim MOUNT` (`trim`): on the root, from root or the mount's owner.
    fn trim_request(&self, req: &Request, ino: INodeNo, reply: ReplyIoctl) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTTY);
        }
        if req.uid() != 0 && req.uid() != self.set.owner_uid {
            return reply.error(Errno::EPERM);
        }
        match self.fs.trim() {
            Ok(blocks) => {
                log::info!("trim: {blocks} free blocks discarded");
                reply.ioctl(0, &blocks.to_le_bytes())
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// `idxfs rm` (`rmtree.rs`): on a directory of the file system or of a writable
    /// subvolume, from anyone the kernel let open it, held to the checks `rm -rf` would meet
    /// (`permission.rs`).
    fn rmtree_request(&self, req: &Request, ino: INodeNo, in_data: &[u8], reply: ReplyIoctl) {
        let (t, parent) = match self.changeable(ino) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        let Some(name) = rmtree::decode(in_data) else {
            return reply.error(Errno::EINVAL);
        };
        if name == b"." || name == b".." || name.contains(&b'/') {
            return reply.error(Errno::EINVAL);
        }
        // Root passes every check; anyone else meets what `rm -rf` would (`permission`).
        let rules = match req.uid() {
            0 => slices::RemoveRules::Root,
            _ => slices::RemoveRules::Checked(permission::RemoveChecks {
                caller: permission::Caller::of(req),
                acl: self.set.acl,
            }),
        };
        let mut held = Vec::new();
        let started =
            t.remove_tree_start(parent, name, rules.as_dyn(), &mut |i| held.push(t.out(i)));
        let inside = match &t {
            Tree::Live(_) => None,
            Tree::View(v) => Some((v.fs.clone(), v.slot)),
        };
        let work = started.map(|removal| slices::RemoveWork {
            rules,
            removal,
            parent: ino.0,
            name: name.to_vec(),
            inside,
        });
        match work {
            Ok(w) => self.rmtree_slice_with(req.uid(), w, held, reply),
            Err(e) => {
                self.forget_removed(ino.0, name, &held);
                reply.error(errno(&e))
            }
        }
    }

    /// A slice of user `uid`'s `idxfs rm` removal `job` (`slices`): answered with the
    /// counts so far, and a token to go on with while more remains.
    fn rmtree_slice(&self, uid: u32, job: slices::RemoveWork, reply: ReplyIoctl) {
        self.rmtree_slice_with(uid, job, Vec::new(), reply)
    }

    /// `rmtree_slice`, `held` being inodes removed before it that the kernel must forget
    /// (by the kernel's numbers).
    fn rmtree_slice_with(
        &self,
        uid: u32,
        mut job: slices::RemoveWork,
        mut held: Vec<u64>,
        reply: ReplyIoctl,
    ) {
        let until = Some(std::time::Instant::now() + slices::slice());
        let (fs, slot): (&Fs, u64) = match &job.inside {
            Some((fs, slot)) => (fs, *slot),
            None => (&self.fs, 0),
        };
        let r = fs.remove_tree_step(
            &mut job.removal,
            job.rules.as_dyn(),
            until,
            &mut |_| {},
            &mut |i| held.push(slot << snapdir::SHIFT | i),
        );
        self.forget_removed(job.parent, &job.name, &held);
        let d = job.removal.removed();
        match r {
            Ok(true) => {
                log::info!(
                    "removed {} files and {} directories under {:?}",
                    d.files,
                    d.dirs,
                    String::from_utf8_lossy(&job.name)
                );
                reply.ioctl(0, &rmtree::encode_removed(d.files, d.dirs, 0))
            }
            Ok(false) => match self.removals.put(uid, job) {
                Some(token) => reply.ioctl(0, &rmtree::encode_removed(d.files, d.dirs, token)),
                // Its user holds as many removals as one may: this one stops here.
                None => reply.error(Errno::EAGAIN),
            },
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Tells the kernel to forget what a removal's slice changed: the name (and what it
    /// cached under it) and the directory's old times and link count, whatever part was
    /// removed; and the attributes of each inode removed that it holds (a file linked
    /// elsewhere has one link less, an open one none), which it would otherwise keep for
    /// the entry TTL.
    fn forget_removed(&self, parent: u64, name: &[u8], held: &[u64]) {
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_entry(INodeNo(parent), OsStr::from_bytes(name));
            let _ = n.inval_inode(INodeNo(parent), -1, 0);
            for &i in held {
                let _ = n.inval_inode(INodeNo(i), -1, 0);
            }
        }
    }

    /// `idxfs cp` (`cptree.rs`): on the destination's parent directory, in the file system
    /// or a writable subvolume; the source in any tree of the mount (another writable
    /// tree's files are copied by their bytes, `Fs::copy_tree_start`). Root and the mount's
    /// owner copy as root's `cp -a` does;
    /// anyone else as their own `cp -a` would (`permission::CopyChecks`). Makes the top
    /// copy, then copies its first slice (`slices`).
    fn cptree_request(&self, req: &Request, ino: INodeNo, in_data: &[u8], reply: ReplyIoctl) {
        let (t, dst_parent) = match self.changeable(ino) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        let rules = match req.uid() == 0 || req.uid() == self.set.owner_uid {
            true => slices::CopyRules::Kept,
            false => slices::CopyRules::Checked(permission::CopyChecks::new(
                permission::Caller::of(req),
                self.set.acl,
            )),
        };
        let Some(ask) = cptree::decode(in_data) else {
            return reply.error(Errno::EINVAL);
        };
        let bad = |n: &[u8]| n == b"." || n == b".." || n.contains(&b'/');
        if bad(ask.src) || bad(ask.dst) {
            return reply.error(Errno::EINVAL);
        }
        // The source: in the file system, in an open snapshot, or a whole snapshot (a name
        // in the snapshots directory), whose blocks the copy then shares.
        let parent = INodeNo(ask.src_parent);
        if self.names_snapdir(parent, ask.src) {
            return reply.error(Errno::EXDEV);
        }
        let source = match self.place(parent) {
            Place::Live => self.fs.lookup(parent.0, ask.src).map(|a| (None, a.ino)),
            Place::View(v) => v.fs.lookup(v.ino, ask.src).map(|a| (Some(v.fs), a.ino)),
            Place::Dir => match &self.snapdir {
                Some(d) => d.lookup(&self.fs, ask.src).map(|v| (Some(v.fs), v.ino)),
                None => Err(Error::NotFound),
            },
            Place::Stale => return reply.error(Errno::ESTALE),
        };
        let (view, src) = match source {
            Ok(s) => s,
            Err(e) => return reply.error(errno(&e)),
        };
        let into = match &t {
            Tree::Live(_) => None,
            Tree::View(v) => Some(v.fs.clone()),
        };
        let from: &Fs = view.as_deref().unwrap_or(&self.fs);
        let started = t.copy_tree_start(from, src, dst_parent, ask.dst, rules.as_dyn());
        // The kernel may hold a negative entry for the new name and the directory's old
        // times and link count, whatever part was made; the copy's later slices make
        // entries only below the name.
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_entry(ino, OsStr::from_bytes(ask.dst));
            let _ = n.inval_inode(ino, -1, 0);
        }
        match started {
            Ok(copy) => {
                let names = (ask.src.to_vec(), ask.dst.to_vec());
                let work = slices::CopyWork {
                    rules,
                    from: view,
                    into,
                    copy,
                    names,
                };
                self.cptree_slice(req.uid(), work, reply)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// A slice of user `uid`'s `idxfs cp` copy `job` (`slices`): answered with the counts
    /// so far, and a token to go on with while more remains.
    fn cptree_slice(&self, uid: u32, mut job: slices::CopyWork, reply: ReplyIoctl) {
        let from: &Fs = job.from.as_deref().unwrap_or(&self.fs);
        let into: &Fs = job.into.as_deref().unwrap_or(&self.fs);
        let until = Some(std::time::Instant::now() + slices::slice());
        let r = into.copy_tree_step(from, &mut job.copy, job.rules.as_dyn(), until, &mut |_| {});
        let c = job.copy.copied();
        let first = match &job.rules {
            slices::CopyRules::Checked(checks) => checks
                .first
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            slices::CopyRules::Kept => None,
        };
        match r {
            Ok(true) => {
                log::info!(
                    "copied {} files and {} directories ({} bytes) from {:?} to {:?}",
                    c.files,
                    c.dirs,
                    c.bytes,
                    String::from_utf8_lossy(&job.names.0),
                    String::from_utf8_lossy(&job.names.1)
                );
                if let Some((path, errno)) = &first {
                    log::info!(
                        "{} entries not copied, the first {:?} (errno {errno})",
                        c.refused,
                        String::from_utf8_lossy(path)
                    );
                }
                reply.ioctl(0, &cptree::encode_copied(&c, 0, first.as_ref()))
            }
            Ok(false) => match self.copies.put(uid, job) {
                Some(token) => reply.ioctl(0, &cptree::encode_copied(&c, token, first.as_ref())),
                // Its user holds as many copies as one may: this one stops here.
                None => reply.error(Errno::EAGAIN),
            },
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// `idxfs snapshot MOUNT` and `idxfs subvolume MOUNT` (`snapshot.rs`): on the root, from
    /// root or the mount's owner.
    fn snapshot_request(&self, req: &Request, ino: INodeNo, in_data: &[u8], reply: ReplyIoctl) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTTY);
        }
        if req.uid() != 0 && req.uid() != self.set.owner_uid {
            return reply.error(Errno::EPERM);
        }
        let Some(ask) = snapshot::decode(in_data) else {
            return reply.error(Errno::EINVAL);
        };
        // Where what is made shows: a snapshot read-only, a subvolume writable (`snapdir`).
        let shown = self.snapdir.as_ref().map(|d| d.name());
        // What the snapshots directory shows changes, and a delete's name, for the kernel
        // to forget its entry (`snapdir_changed`).
        let changes = !matches!(ask, snapshot::Ask::List | snapshot::Ask::Subvolumes);
        let gone = match &ask {
            snapshot::Ask::Delete(id) => snapdir::Snapdir::name_of(&self.fs, *id),
            _ => None,
        };
        let r = match ask {
            snapshot::Ask::Make(name) => self.fs.snapshot(&name).map(|id| {
                log::info!("snapshot {id} ({}) made", String::from_utf8_lossy(&name));
                snapshot::encode_made(id, shown)
            }),
            snapshot::Ask::Delete(id) => match &self.snapdir {
                Some(d) => d.delete(&self.fs, id),
                None => self.fs.delete_snapshot(id),
            }
            .map(|()| {
                log::info!("snapshot {id} deleted; its blocks come back in the background");
                Vec::new()
            }),
            snapshot::Ask::Clone(origin, name) => self.fs.make_clone(origin, &name).map(|id| {
                log::info!(
                    "subvolume {id} ({}) made from snapshot {origin}",
                    String::from_utf8_lossy(&name)
                );
                snapshot::encode_made(id, shown)
            }),
            snapshot::Ask::Writable(name) => self.fs.writable_snapshot(&name).map(|id| {
                log::info!(
                    "subvolume {id} ({}) made, a writable snapshot",
                    String::from_utf8_lossy(&name)
                );
                snapshot::encode_made(id, shown)
            }),
            snapshot::Ask::Create(name) => {
                let owner = idxfs_engine::fs::Owner {
                    uid: req.uid(),
                    gid: req.gid(),
                };
                self.fs.make_subvolume(&name, owner).map(|id| {
                    log::info!(
                        "subvolume {id} ({}) made, empty",
                        String::from_utf8_lossy(&name)
                    );
                    snapshot::encode_made(id, shown)
                })
            }
            snapshot::Ask::Subvolumes => Ok(snapshot::encode_subvolumes(&self.fs.subvolumes())),
            snapshot::Ask::List => self.fs.snapshots().map(|l| snapshot::encode_list(&l)),
        };
        if r.is_ok() && changes {
            self.snapdir_changed(gone.as_deref());
        }
        match r {
            Ok(out) => reply.ioctl(0, &out),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// `idxfs import` (`import.rs`): on the directory that gets the copy, from root or the
    /// mount's owner. A refusal by the copy itself (a name that exists, a full device) is a
    /// reply with its message; only a request no import could take is an errno.
    fn import_request(&self, req: &Request, ino: INodeNo, in_data: &[u8], reply: ReplyIoctl) {
        let Some(server) = self.import.as_ref() else {
            return reply.error(Errno::ENOTTY);
        };
        let (t, parent) = match self.changeable(ino) {
            Ok(t) => t,
            Err(e) => return reply.error(e),
        };
        if req.uid() != 0 && req.uid() != self.set.owner_uid {
            return reply.error(Errno::EPERM);
        }
        let Some(r) = import::decode(in_data) else {
            return reply.error(Errno::EINVAL);
        };
        let who = import::Caller {
            uid: req.uid(),
            gid: req.gid(),
            pid: req.pid(),
        };
        let (session, out) = match r.op {
            import::Op::Begin => match server.begin(&t.shared(&self.fs), parent, r.payload, who) {
                Ok(session) => {
                    // The kernel may hold a negative entry for the new name (the client
                    // looked for it) and the directory's old times and link count.
                    if let Some(n) = self.notifier.get() {
                        let name = std::ffi::OsStr::from_bytes(r.payload);
                        let _ = n.inval_entry(ino, name);
                        let _ = n.inval_inode(ino, -1, 0);
                    }
                    (session, Ok(String::new()))
                }
                Err(e) => (0, Err(e)),
            },
            import::Op::Data => (
                r.session,
                server
                    .data(r.session, who, r.payload)
                    .map(|()| String::new()),
            ),
            import::Op::End => (r.session, server.end(r.session, who)),
        };
        if let Err(e) = &out {
            log::warn!("import by uid {}: {e}", who.uid);
        }
        reply.ioctl(0, &import::encode_reply(session, &out))
    }

    fn remount_request(&self, req: &Request, ino: INodeNo, in_data: &[u8], reply: ReplyIoctl) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTTY);
        }
        if req.uid() != 0 && req.uid() != self.set.owner_uid {
            return reply.error(Errno::EPERM);
        }
        let Some(new) = remount::Settings::decode(in_data) else {
            return reply.error(Errno::EINVAL);
        };
        let (read_only, atime, sync) = self.fs.settings();
        let old = remount::Settings {
            read_only,
            atime,
            sync,
        };
        match self.fs.reconfigure(new.read_only, new.atime, new.sync) {
            Ok(()) => {
                log::info!("remounted: {new:?} (was {old:?})");
                reply.ioctl(0, &old.encode())
            }
            Err(e) => {
                log::warn!("remount to {new:?} refused: {e}");
                reply.error(errno(&e))
            }
        }
    }
}

/// The inodes the kernel takes a lookup count for when `entries` go out in a readdirplus
/// reply: every entry's but "." and "..".
fn kernel_held(entries: &[(idxfs_engine::fs::DirEntryOut, Attr)]) -> Vec<u64> {
    entries
        .iter()
        .filter(|(e, _)| e.name != b"." && e.name != b"..")
        .map(|(e, _)| e.ino)
        .collect()
}

/// Replies to a request that returns nothing but success or an errno.
fn done(reply: ReplyEmpty, r: Result<(), Error>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

/// Replies to getxattr/listxattr: the size when asked for it, ERANGE when it does not fit.
fn sized(reply: ReplyXattr, size: u32, data: &[u8]) {
    if size == 0 {
        reply.size(data.len() as u32);
    } else if data.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(data);
    }
}
