//! `Fs::copy_tree`: a directory and everything under it copied inside the engine, as
//! `cp -a --reflink` copies it, without a request per file from a front end (the mount's
//! `idxfs cp`, issue 25's "copying a dataset to version it" at engine speed). A regular
//! file's data is shared, not read and written (`copy_range`, `clone.rs`: where its blocks
//! are whole and copy-on-write), so the copy costs metadata: its inodes, names, extents and
//! sums.
//!
//! What is kept, as `cp -a` keeps it: the tree's shape, every type (directories, regular
//! files, symlinks and their targets, device nodes, FIFOs and sockets), owners, modes
//! (set-user-ID and set-group-ID included), access and modification times, every xattr
//! (ACLs included; a default ACL of the destination's directory is not inherited where the
//! source has none, as `cp -a` sets each copy's ACLs to its source's), NOCOW (set before
//! the data, as it must be), and the hard links among the copied names (a file that also
//! has names outside the tree gets one copy, linked from each of its names inside it, as
//! with `cp -a`). The change time is the copy's own, as it is after `cp -a`.
//!
//! Each entry is made by the engine's own operations, each with its own lock and
//! reservation: a regular file in one (`copy_file_whole`, `copy_file.rs`: made with its
//! bytes, owner, mode and times) unless it is NOCOW, goes into a NOCOW directory or is
//! larger than one sharing batch; anything else, and those, by `mknod`, `symlink`, `link`,
//! `copy_range`, `setxattr` and `setattr`; xattrs, where either side has any, after. Other
//! operations run between any two, and a source changed meanwhile is copied as the walk
//! finds it (as `cp` copies a tree that changes under it). Not one change: a crash midway leaves part of the
//! copy, as with `cp`. A name that vanished from the source meanwhile is skipped. The
//! directories are listed in inode order (seed 002), in batches of `BATCH`.
//!
//! A front end that must not hold a thread for the whole tree runs it a slice at a time
//! (`CopyJob`: `copy_tree_start`, then `copy_tree_step` until a deadline, an entry or 8 MiB
//! of a file's data at least each time: a large file's copy is cut in pieces too).
//!
//! The source may be a snapshot opened beside the file system (`copy_tree_from`): the copy
//! then shares the snapshot's blocks as a file restored from it does (`restore.rs`), so a
//! tree deleted or changed since comes back whole at the cost of its metadata. Beside other
//! writable trees, a snapshot of another tree names blocks that are not the active tree's
//! to take (`Clones::may_take_from`): its files' bytes are copied instead, as `cp -a`
//! copies them, and the rest of the copy is the same. So are the files of another
//! writable tree open through the same file system (`Fs::open_subvolume`, `trees.rs`):
//! each read of it takes the one operation lock by itself, between this tree's changes.
//!
//! The engine checks no permission itself, but one call here does what would have been many
//! checked calls, so it asks the caller's `CopyAs` before each step, and what each copy's
//! owner and mode are: `Unchecked` permits everything and keeps owners and modes (root's
//! `cp -a`, or a library's owner); a front end serving other users answers as the kernel
//! and `cp -a` would for them (`idxfs_fuse::permission::CopyChecks`). As `cp -a` does, a
//! refused entry is reported (`CopyAs::refused`, counted in `Copied::refused`) and the walk
//! goes on with the rest: a file that may not be read or a device node that may not be made
//! is not copied, a directory that may not be listed is copied empty, the entries of one
//! that may not be searched are not copied. Only a refusal of the top (its destination
//! directory not writable, or the top itself refused) ends the copy, before anything is
//! made.
use super::inode_flags::NOCOW_FL;
use super::remove_tree::Unchecked;
use super::{Attr, DirEntryOut, Fs, Ino, Kill, Owner, SetAttr, SetTime};
use crate::error::{Error, Result};
use idxfs_format::items::{S_IFDIR, S_IFLNK, S_IFMT, S_IFREG};
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

/// Entries one listing of a source directory takes before they are copied.
const BATCH: usize = 1024;
/// Bytes of a file copied a step (`Fs::file_step`): one sharing batch, so a step's time is
/// bounded, whatever the file's size.
const FILE_PIECE: u64 = 8 << 20;

/// What `Fs::copy_tree` copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Copied {
    /// Names of anything but directories (a hard link among the copies counts once per name).
    pub files: u64,
    /// Directories, the top one included.
    pub dirs: u64,
    /// Bytes of regular files copied (shared where `copy_range` could).
    pub bytes: u64,
    /// Entries not copied, each refused by `CopyAs` (a directory that may not be listed,
    /// copied empty, counts once).
    pub refused: u64,
}

/// What `Fs::copy_tree` asks before each step and how its copies are owned: the answers a
/// front end's permission checks give for the user it copies for (module docs). An `Err`
/// from a check refuses that entry (`Error::Denied` and `Error::NotPermitted` are meant for
/// these); the walk reports it to `refused` and goes on.
pub trait CopyAs {
    /// Before the top copy is made in `dir`, the destination's directory.
    fn create(&self, fs: &Fs, dir: &Attr) -> Result<()>;
    /// Before directory `dir` of the source is listed.
    fn list(&self, from: &Fs, dir: &Attr) -> Result<()>;
    /// Before the entries of directory `dir` of the source are looked at (their attributes
    /// read): once per batch of them.
    fn search(&self, from: &Fs, dir: &Attr) -> Result<()>;
    /// Before the data of regular file `file` of the source is read.
    fn read(&self, from: &Fs, file: &Attr) -> Result<()>;
    /// Before a copy of `src`, a device node, FIFO or socket, is made.
    fn make(&self, src: &Attr) -> Result<()>;
    /// The owner and permission bits (07777) the copy of `src` ends with, in a copy whose
    /// top is made in `top_dir` (the destination's directory: `cp -a` gives a directory it
    /// copies its mode and owner after its contents, so what a new file there is made
    /// with comes from `top_dir` alone).
    fn owned(&self, src: &Attr, top_dir: &Attr) -> (Owner, u32);
    /// Whether xattr `name` of `src`, of the source, is copied (the copy's xattrs are
    /// exactly the source's that this lets through).
    fn xattr(&self, from: &Fs, src: &Attr, name: &[u8]) -> Result<bool>;
    /// Told of each entry refused: its path under the top (empty for the top itself) and
    /// why.
    fn refused(&self, path: &[u8], why: &Error);
}

/// Root's `cp -a`: everything copied, owners and modes kept.
impl CopyAs for Unchecked {
    fn create(&self, _: &Fs, _: &Attr) -> Result<()> {
        Ok(())
    }
    fn list(&self, _: &Fs, _: &Attr) -> Result<()> {
        Ok(())
    }
    fn search(&self, _: &Fs, _: &Attr) -> Result<()> {
        Ok(())
    }
    fn read(&self, _: &Fs, _: &Attr) -> Result<()> {
        Ok(())
    }
    fn make(&self, _: &Attr) -> Result<()> {
        Ok(())
    }
    fn owned(&self, src: &Attr, _: &Attr) -> (Owner, u32) {
        (
            Owner {
                uid: src.uid,
                gid: src.gid,
            },
            src.mode & 0o7777,
        )
    }
    fn xattr(&self, _: &Fs, _: &Attr, _: &[u8]) -> Result<bool> {
        Ok(true)
    }
    fn refused(&self, _: &[u8], _: &Error) {}
}

/// A directory being copied: the source (its attributes, for its times, set once
/// everything in it is made), its copy, where its listing resumes, its name and where its
/// parent is on the walk's stack (its path under the top, built only for a refusal: a path
/// kept per directory would make a chain of directories n deep cost n² bytes), the entries
/// of its last batch not copied yet, and the directories that batch made (whose contents
/// are copied before its next batch).
struct Dir {
    src: Attr,
    copy: Ino,
    cookie: u64,
    name: Vec<u8>,
    /// The parent's index on the stack (None for the top). A directory is pushed above its
    /// parent and popped before it, so the index holds while it is on the stack.
    parent: Option<usize>,
    pending: VecDeque<(DirEntryOut, Attr)>,
    made: Vec<Dir>,
}

impl Dir {
    fn new(src: Attr, copy: Ino, name: Vec<u8>, parent: Option<usize>) -> Dir {
        Dir {
            src,
            copy,
            cookie: 2,
            name,
            parent,
            pending: VecDeque::new(),
            made: Vec::new(),
        }
    }
}

/// The path under the top of the directory at `at` on `stack`, joined with `name` when
/// given.
fn path_of(stack: &[Dir], at: usize, name: Option<&[u8]>) -> Vec<u8> {
    let mut names: Vec<&[u8]> = name.into_iter().collect();
    let mut next = Some(at);
    while let Some(i) = next {
        names.push(&stack[i].name);
        next = stack[i].parent;
    }
    // The top's name is empty: the path is relative to it.
    names.pop();
    names.reverse();
    names.join(&b'/')
}

/// A copy under way (`Fs::copy_tree_start`, then `Fs::copy_tree_step` until it says done):
/// what it has made and where its walk stands. A front end that must not hold a thread for
/// a whole tree (a FUSE server's ring worker, which other callers on its CPU wait for) runs
/// it a slice at a time; between slices other operations change what they like, as between
/// any two of the copy's own operations.
pub struct CopyJob {
    state: State,
    stack: Vec<Dir>,
}

impl CopyJob {
    /// What it has copied so far.
    pub fn copied(&self) -> Copied {
        self.state.done
    }
}

/// What a copy carries from step to step besides its walk: where the top copy was made
/// (`CopyAs::owned`), the hard links among the copies (source inode to its copy), the
/// counts, and a file whose data is under way.
struct State {
    top_dir: Attr,
    /// Whether the source's blocks may be shared (module docs); else its bytes are copied.
    share: bool,
    links: HashMap<Ino, Ino>,
    done: Copied,
    /// A regular file made, whose data is being copied (`Fs::file_step`).
    file: Option<FileCopy>,
}

/// A regular file's copy whose data goes a piece a step: its source, the copy, how far its
/// data is copied, and the owner and permission bits it ends with.
struct FileCopy {
    src: Attr,
    ino: Ino,
    at: u64,
    owned: (Owner, u32),
}

/// One step's view of a copy: the source, the caller's rules, and the copy's state.
struct Walk<'a> {
    from: &'a Fs,
    rules: &'a dyn CopyAs,
    st: &'a mut State,
}

impl Walk<'_> {
    fn refuse(&mut self, path: &[u8], why: &Error) {
        self.st.done.refused += 1;
        self.rules.refused(path, why);
    }
}

/// The refusal in a check's answer: None when it permits, an error other than a refusal
/// (a failed read of an ACL) as it is.
fn refusal(r: Result<()>) -> Result<Option<Error>> {
    match r {
        Ok(()) => Ok(None),
        Err(why @ (Error::Denied(_) | Error::NotPermitted(_))) => Ok(Some(why)),
        Err(e) => Err(e),
    }
}

impl Fs {
    /// Copies `name` in `src_parent` to the new name `dst_name` in `dst_parent`, with
    /// everything under it, as `rules` let it (module docs); `progress` is told the counts
    /// after each directory's batch. Refused before anything is made: a destination that
    /// exists (`Exists`), a directory copied into itself (`Invalid`), and whatever `rules`
    /// refuse of the top.
    pub fn copy_tree(
        &self,
        src_parent: Ino,
        name: &[u8],
        dst_parent: Ino,
        dst_name: &[u8],
        rules: &dyn CopyAs,
        progress: impl FnMut(&Copied),
    ) -> Result<Copied> {
        let top = self.lookup(src_parent, name)?.ino;
        self.copy_tree_from(self, top, dst_parent, dst_name, rules, progress)
    }

    /// `copy_tree` of inode `src` of `from`: this file system, or a snapshot of it opened
    /// beside it (`open_snapshot`), whose blocks the copy shares as a restored file does
    /// (`copy_from_snapshot`): a whole tree brought back out of a snapshot. Anything else
    /// is refused (`Invalid`) before anything is made.
    pub fn copy_tree_from(
        &self,
        from: &Fs,
        src: Ino,
        dst_parent: Ino,
        dst_name: &[u8],
        rules: &dyn CopyAs,
        mut progress: impl FnMut(&Copied),
    ) -> Result<Copied> {
        let mut job = self.copy_tree_start(from, src, dst_parent, dst_name, rules)?;
        while !self.copy_tree_step(from, &mut job, rules, None, &mut progress)? {}
        Ok(job.copied())
    }

    /// The start of `copy_tree_from`: its checks and the top's copy. `copy_tree_step` with
    /// the same `from` and `rules` copies what is under it.
    pub fn copy_tree_start(
        &self,
        from: &Fs,
        src: Ino,
        dst_parent: Ino,
        dst_name: &[u8],
        rules: &dyn CopyAs,
    ) -> Result<CopyJob> {
        let same = std::ptr::eq(from, self);
        let sibling = !same && self.is_open_beside(from);
        if !same && !sibling && !self.is_view_of_mine(from) {
            return Err(Error::Invalid(
                "a copy from neither this file system, a tree open beside it, nor a snapshot \
                 opened beside it",
            ));
        }
        // Another tree's snapshot beside other writable trees, or another open tree: its
        // blocks are not this tree's to take, so its files' bytes are copied (module docs).
        let share = same || (!sibling && self.may_take_from(from));
        let top = from.getattr(src)?;
        if same && top.mode & S_IFMT == S_IFDIR && self.lock().is_within(dst_parent, top.ino)? {
            return Err(Error::Invalid("a copy of a directory into itself"));
        }
        let top_dir = self.getattr(dst_parent)?;
        rules.create(self, &top_dir)?;
        let mut job = CopyJob {
            state: State {
                top_dir,
                share,
                links: HashMap::new(),
                done: Copied::default(),
                file: None,
            },
            stack: Vec::new(),
        };
        let mut w = Walk {
            from,
            rules,
            st: &mut job.state,
        };
        // The top alone: a refusal of it is the copy's.
        self.may_copy(&w, &top)?;
        let made = self.copy_entry(&mut w, &top, dst_parent, dst_name)?;
        let Some(made) = made else {
            return Err(Error::NotFound);
        };
        if top.mode & S_IFMT == S_IFDIR {
            job.stack.push(Dir::new(top, made, Vec::new(), None));
        }
        Ok(job)
    }

    /// Copies more of `job` (made by `copy_tree_start` with this `from` and `rules`): until
    /// it is done (true), or, with `until`, until that moment passes after an entry or a
    /// piece of a file's data (false: more to do). `progress` is told the counts as each batch of a directory is listed.
    pub fn copy_tree_step(
        &self,
        from: &Fs,
        job: &mut CopyJob,
        rules: &dyn CopyAs,
        until: Option<Instant>,
        progress: &mut dyn FnMut(&Copied),
    ) -> Result<bool> {
        let CopyJob { state, stack } = job;
        let mut w = Walk {
            from,
            rules,
            st: state,
        };
        loop {
            if w.st.file.is_some() {
                self.file_step(&mut w)?;
                if until.is_some_and(|t| Instant::now() >= t) {
                    return Ok(false);
                }
                continue;
            }
            let Some(at) = stack.len().checked_sub(1) else {
                return Ok(true);
            };
            let d = &mut stack[at];
            if let Some((e, src)) = d.pending.pop_front() {
                if let Some(why) = refusal(self.may_copy(&w, &src))? {
                    w.refuse(&path_of(stack, at, Some(&e.name)), &why);
                } else if let Some(made) = self.copy_entry(&mut w, &src, d.copy, &e.name)? {
                    if src.mode & S_IFMT == S_IFDIR {
                        d.made.push(Dir::new(src, made, e.name, Some(at)));
                    }
                }
                if until.is_some_and(|t| Instant::now() >= t) {
                    return Ok(false);
                }
                continue;
            }
            if !d.made.is_empty() {
                // The directories the batch made, before the next batch.
                let made = std::mem::take(&mut d.made);
                stack.extend(made);
                continue;
            }
            let mut batch = Vec::new();
            // Asked once, before its first batch.
            let first = d.cookie == 2;
            let listed = if first {
                rules.list(from, &d.src)
            } else {
                Ok(())
            }
            .and_then(|()| {
                // With their attributes, read under one lock in inode order.
                batch = from.readdir_plus_batch(d.src.ino, d.cookie, BATCH)?.entries;
                Ok(())
            });
            match listed {
                Ok(()) => {}
                // Removed meanwhile: what it held goes with it.
                Err(Error::NotFound) => batch.clear(),
                Err(why @ (Error::Denied(_) | Error::NotPermitted(_))) => {
                    w.refuse(&path_of(stack, at, None), &why);
                    batch.clear();
                }
                Err(e) => return Err(e),
            }
            let d = &mut stack[at];
            let Some((last, _)) = batch.last() else {
                // Everything in it is made: its times are the source's.
                let d = stack
                    .pop()
                    .unwrap_or_else(|| unreachable!("the loop's top"));
                self.setattr(d.copy, &with_times(SetAttr::default(), &d.src))?;
                continue;
            };
            d.cookie = last.cookie;
            if let Some(why) = refusal(rules.search(from, &d.src))? {
                for (e, _) in &batch {
                    w.refuse(&path_of(stack, at, Some(&e.name)), &why);
                }
            } else {
                d.pending = batch.into();
            }
            progress(&w.st.done);
        }
    }

    /// What the rules say of copying `src` at all: a regular file must be readable, a
    /// device node, FIFO or socket makeable.
    fn may_copy(&self, w: &Walk<'_>, src: &Attr) -> Result<()> {
        match src.mode & S_IFMT {
            S_IFREG => w.rules.read(w.from, src),
            S_IFDIR | S_IFLNK => Ok(()),
            _ => w.rules.make(src),
        }
    }

    /// Makes the copy of `src` as `name` in `dir` (a copy made before, or the destination's
    /// directory), all but a directory's contents and times; None when the source vanished
    /// meanwhile.
    fn copy_entry(
        &self,
        w: &mut Walk<'_>,
        src: &Attr,
        dir: Ino,
        name: &[u8],
    ) -> Result<Option<Ino>> {
        let from = w.from;
        let kind = src.mode & S_IFMT;
        if kind != S_IFDIR && src.nlink > 1 {
            if let Some(&copy) = w.st.links.get(&src.ino) {
                self.link(copy, dir, name)?;
                w.st.done.files += 1;
                return Ok(Some(copy));
            }
        }
        let (owner, mode) = w.rules.owned(src, &w.st.top_dir);
        if kind == S_IFREG && w.st.share {
            match self.copy_file_whole(from, src.ino, dir, name, owner, mode) {
                Ok(Some(made)) => {
                    w.st.done.bytes += made.bytes;
                    if made.xattrs {
                        self.copied_xattrs(w, src, made.ino, (owner, mode))?;
                    }
                    w.st.done.files += 1;
                    if src.nlink > 1 {
                        w.st.links.insert(src.ino, made.ino);
                    }
                    return Ok(Some(made.ino));
                }
                Ok(None) => {}
                Err(Error::NotFound) if from.getattr(src.ino).is_err() => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        let made = match kind {
            S_IFLNK => {
                let target = match from.readlink(src.ino) {
                    Ok(t) => t,
                    Err(Error::NotFound) => return Ok(None),
                    Err(e) => return Err(e),
                };
                self.symlink(dir, name, &target, owner)?
            }
            // Made without permission bits, which it gets with its owner below: a default
            // ACL or a set-group-ID directory has no say in the copy's.
            _ => self.mknod(dir, name, kind, owner, src.rdev)?,
        };
        let ino = made.ino;
        if kind == S_IFREG {
            if from.flags(src.ino)? & NOCOW_FL != 0 {
                self.set_flags(ino, NOCOW_FL)?;
            }
            // Its data a piece a step (`file_step`), then the rest of it.
            w.st.file = Some(FileCopy {
                src: src.clone(),
                ino,
                at: 0,
                owned: (owner, mode),
            });
            return Ok(Some(ino));
        }
        self.copy_xattrs(w, src, ino)?;
        // The owner again: a set-group-ID directory gave the copy its group. A symlink's
        // permission bits are always 0777. Anything but a directory gets its times in the
        // same change; a directory's wait for what is made in it.
        let owned = SetAttr {
            mode: (kind != S_IFLNK).then_some(mode),
            uid: Some(owner.uid),
            gid: Some(owner.gid),
            ..SetAttr::default()
        };
        if kind == S_IFDIR {
            self.setattr(ino, &owned)?;
            w.st.done.dirs += 1;
            return Ok(Some(ino));
        }
        self.setattr(ino, &with_times(owned, src))?;
        w.st.done.files += 1;
        if src.nlink > 1 {
            w.st.links.insert(src.ino, ino);
        }
        Ok(Some(ino))
    }

    /// The next piece of the file `copy_entry` left with its data to copy (`State::file`):
    /// at most `FILE_PIECE` bytes; once they are all there, its xattrs, owner, mode and
    /// times, and the file is done.
    fn file_step(&self, w: &mut Walk<'_>) -> Result<()> {
        let from = w.from;
        let Some(f) = w.st.file.as_mut() else {
            return Ok(());
        };
        if f.at < f.src.size {
            let (len, no) = ((f.src.size - f.at).min(FILE_PIECE), Kill::default());
            let (s, d, at) = (f.src.ino, f.ino, f.at);
            let n = if std::ptr::eq(from, self) {
                self.copy_range(s, at, d, at, len, no)?
            } else if w.st.share {
                self.copy_from_snapshot(from, s, at, d, at, len, no)?
            } else {
                self.copy_bytes(from, s, at, d, at, len, no, None)?
            };
            // Nothing: the source got shorter meanwhile.
            f.at = if n == 0 { f.src.size } else { at + n };
            w.st.done.bytes += n;
            return Ok(());
        }
        let Some(f) = w.st.file.take() else {
            return Ok(());
        };
        self.copied_xattrs(w, &f.src, f.ino, f.owned)?;
        w.st.done.files += 1;
        if f.src.nlink > 1 {
            w.st.links.insert(f.src.ino, f.ino);
        }
        Ok(())
    }

    /// The xattrs of the copy `ino` of file `src` that `copy_file_whole` made with
    /// `owned`, when either side has any (the source's, or a default ACL the copy
    /// inherited); then its owner, mode and times again (setting an access ACL sets the
    /// mode).
    fn copied_xattrs(
        &self,
        w: &Walk<'_>,
        src: &Attr,
        ino: Ino,
        (owner, mode): (Owner, u32),
    ) -> Result<()> {
        self.copy_xattrs(w, src, ino)?;
        let owned = SetAttr {
            mode: Some(mode),
            uid: Some(owner.uid),
            gid: Some(owner.gid),
            ..SetAttr::default()
        };
        self.setattr(ino, &with_times(owned, src)).map(|_| ())
    }

    /// Gives `dst` exactly the xattrs of `src` the rules let through: each of those set,
    /// and any other the copy was made with (an inherited ACL) removed.
    fn copy_xattrs(&self, w: &Walk<'_>, src: &Attr, dst: Ino) -> Result<()> {
        let mut names = Vec::new();
        for n in w.from.listxattr(src.ino)? {
            if w.rules.xattr(w.from, src, &n)? {
                names.push(n);
            }
        }
        for n in &names {
            match w.from.getxattr(src.ino, n) {
                Ok(v) => self.setxattr(dst, n, &v, 0)?,
                // Removed meanwhile.
                Err(Error::NoData) => {}
                Err(e) => return Err(e),
            }
        }
        for n in self.listxattr(dst)? {
            if !names.contains(&n) {
                self.removexattr(dst, &n)?;
            }
        }
        Ok(())
    }
}

/// `set`, also giving a copy `src`'s access and modification times.
fn with_times(set: SetAttr, src: &Attr) -> SetAttr {
    SetAttr {
        atime: Some(SetTime::At(src.atime)),
        mtime: Some(SetTime::At(src.mtime)),
        ..set
    }
}
