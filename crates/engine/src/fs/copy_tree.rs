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
//! Each entry is made by the engine's own operations (`mknod`, `link`, `copy_range`,
//! `setxattr`, `setattr`), each with its own lock and reservation, so other operations run
//! between any two, and a source changed meanwhile is copied as the walk finds it (as `cp`
//! copies a tree that changes under it). Not one change: a crash midway leaves part of the
//! copy, as with `cp`. A name that vanished from the source meanwhile is skipped. The
//! directories are listed in inode order (seed 002), in batches of `BATCH`.
//!
//! The source may be a snapshot opened beside the file system (`copy_tree_from`): the copy
//! then shares the snapshot's blocks as a file restored from it does (`restore.rs`), so a
//! tree deleted or changed since comes back whole at the cost of its metadata.
//!
//! The engine checks no permission: its front end decides who may (the mount lets root and
//! its owner, as for `idxfs import`, since the copy keeps owners and modes as it likes).
use super::inode_flags::NOCOW_FL;
use super::{Attr, Fs, Ino, Kill, Owner, SetAttr, SetTime};
use crate::error::{Error, Result};
use idxfs_format::items::{S_IFDIR, S_IFLNK, S_IFMT, S_IFREG};
use std::collections::HashMap;

/// Entries one listing of a source directory takes before they are copied.
const BATCH: usize = 1024;

/// What `Fs::copy_tree` copied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Copied {
    /// Names of anything but directories (a hard link among the copies counts once per name).
    pub files: u64,
    /// Directories, the top one included.
    pub dirs: u64,
    /// Bytes of regular files copied (shared where `copy_range` could).
    pub bytes: u64,
}

/// A directory being copied: the source (its attributes, for its times, set once
/// everything in it is made), its copy, and where its listing resumes.
struct Dir {
    src: Attr,
    copy: Ino,
    cookie: u64,
}

impl Fs {
    /// Copies `name` in `src_parent` to the new name `dst_name` in `dst_parent`, with
    /// everything under it (module docs); `progress` is told the counts after each
    /// directory's batch. Refused before anything is made: a destination that exists
    /// (`Exists`), and a directory copied into itself (`Invalid`).
    pub fn copy_tree(
        &self,
        src_parent: Ino,
        name: &[u8],
        dst_parent: Ino,
        dst_name: &[u8],
        progress: impl FnMut(&Copied),
    ) -> Result<Copied> {
        let top = self.lookup(src_parent, name)?.ino;
        self.copy_tree_from(self, top, dst_parent, dst_name, progress)
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
        mut progress: impl FnMut(&Copied),
    ) -> Result<Copied> {
        let mut done = Copied::default();
        let same = std::ptr::eq(from, self);
        if !same && !self.is_view_of_mine(from) {
            return Err(Error::Invalid(
                "a copy from neither this file system nor a snapshot opened beside it",
            ));
        }
        let top = from.getattr(src)?;
        if same && top.mode & S_IFMT == S_IFDIR && self.lock().is_within(dst_parent, top.ino)? {
            return Err(Error::Invalid("a copy of a directory into itself"));
        }
        // Source inode to copy, for the hard links among the files copied.
        let mut links = HashMap::new();
        let made = self.copy_entry(from, &top, dst_parent, dst_name, &mut links, &mut done)?;
        let Some(made) = made else {
            return Err(Error::NotFound);
        };
        if top.mode & S_IFMT != S_IFDIR {
            return Ok(done);
        }
        let mut stack = vec![Dir {
            src: top,
            copy: made,
            cookie: 2,
        }];
        while let Some(d) = stack.last_mut() {
            let mut batch = Vec::new();
            let listed = from.readdir(d.src.ino, d.cookie, |e| {
                batch.push(e.clone());
                batch.len() < BATCH
            });
            match listed {
                Ok(()) => {}
                // Removed meanwhile: what it held goes with it.
                Err(Error::NotFound) => batch.clear(),
                Err(e) => return Err(e),
            }
            let Some(last) = batch.last() else {
                // Everything in it is made: its times are the source's.
                let d = stack
                    .pop()
                    .unwrap_or_else(|| unreachable!("the loop's top"));
                self.setattr(d.copy, &with_times(SetAttr::default(), &d.src))?;
                continue;
            };
            d.cookie = last.cookie;
            let dst = d.copy;
            for e in batch {
                let src = match from.getattr(e.ino) {
                    Ok(a) => a,
                    Err(Error::NotFound) => continue,
                    Err(e) => return Err(e),
                };
                match self.copy_entry(from, &src, dst, &e.name, &mut links, &mut done)? {
                    Some(made) if src.mode & S_IFMT == S_IFDIR => stack.push(Dir {
                        src,
                        copy: made,
                        cookie: 2,
                    }),
                    _ => {}
                }
            }
            progress(&done);
        }
        Ok(done)
    }

    /// Makes the copy of `src` as `name` in `dir` (a copy made before, or the destination's
    /// directory), all but a directory's contents and times; None when the source vanished
    /// meanwhile.
    fn copy_entry(
        &self,
        from: &Fs,
        src: &Attr,
        dir: Ino,
        name: &[u8],
        links: &mut HashMap<Ino, Ino>,
        done: &mut Copied,
    ) -> Result<Option<Ino>> {
        let kind = src.mode & S_IFMT;
        if kind != S_IFDIR && src.nlink > 1 {
            if let Some(&copy) = links.get(&src.ino) {
                self.link(copy, dir, name)?;
                done.files += 1;
                return Ok(Some(copy));
            }
        }
        let owner = Owner {
            uid: src.uid,
            gid: src.gid,
        };
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
            let mut at = 0;
            while at < src.size {
                let (len, no) = (src.size - at, Kill::default());
                let n = if std::ptr::eq(from, self) {
                    self.copy_range(src.ino, at, ino, at, len, no)?
                } else {
                    self.copy_from_snapshot(from, src.ino, at, ino, at, len, no)?
                };
                if n == 0 {
                    // The source got shorter meanwhile.
                    break;
                }
                at += n;
            }
            done.bytes += at;
        }
        self.copy_xattrs(from, src.ino, ino)?;
        // The owner again: a set-group-ID directory gave the copy its group. A symlink's
        // permission bits are always 0777. Anything but a directory gets its times in the
        // same change; a directory's wait for what is made in it.
        let owned = SetAttr {
            mode: (kind != S_IFLNK).then_some(src.mode & 0o7777),
            uid: Some(src.uid),
            gid: Some(src.gid),
            ..SetAttr::default()
        };
        if kind == S_IFDIR {
            self.setattr(ino, &owned)?;
            done.dirs += 1;
            return Ok(Some(ino));
        }
        self.setattr(ino, &with_times(owned, src))?;
        done.files += 1;
        if src.nlink > 1 {
            links.insert(src.ino, ino);
        }
        Ok(Some(ino))
    }

    /// Gives `dst` exactly `src`'s xattrs: each of the source's set, and any other the copy
    /// was made with (an inherited ACL) removed.
    fn copy_xattrs(&self, from: &Fs, src: Ino, dst: Ino) -> Result<()> {
        let names = from.listxattr(src)?;
        for n in &names {
            match from.getxattr(src, n) {
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
