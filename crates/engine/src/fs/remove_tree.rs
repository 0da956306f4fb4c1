//! `Fs::remove_tree`: a directory and everything under it removed inside the engine, as
//! `rm -rf` removes it, without a request per file from a front end (the mount's `idxfs rm`,
//! issue 25's "a tree dropped inside the engine without a round trip per file").
//!
//! Each name goes by the operation that removes it alone (`unlink`, `rmdir`): its own lock,
//! reservation and orphan handling, so an open file stays readable until let go of, a file
//! with links elsewhere keeps them, and other operations run between any two removals. The
//! walk lists each directory in its inode-number index's order (seed 002), so a whole pass
//! reads the directories' entries and inodes in on-disk order.
//!
//! The engine checks no permission (its front ends do, or the kernel in front of them), but
//! one call here does what would have been many checked calls, so it asks the caller's
//! `Permits` before each listing and each removal: a front end serving more than one user
//! checks there what the kernel would check for `rm -rf` (`idxfs_fuse::permission`). The
//! first refusal ends the walk with its error, what was removed before it staying removed
//! (`rm -rf` would report it and go on with the rest; the removal stops, so a walk meeting
//! a refusal removes less, never more, than `rm -rf` would). A directory's own removal is
//! asked for before it is entered, so a directory that could not go is not emptied first;
//! one that may not be listed is removed if it is empty, as `rm -rf` removes it.
//!
//! A front end that must not hold a thread for the whole tree runs it a slice at a time
//! (`RemoveJob`: `remove_tree_start`, then `remove_tree_step` until a deadline, a batch of a
//! directory's names at least each time).
//!
//! Not one change: a crash midway leaves part of the tree (what the last commit or fsync
//! held), as with `rm -rf`. A name someone else removed or renamed away meanwhile is
//! skipped, but a directory renamed out of the tree after it was listed is still emptied
//! (its number is what the walk holds, as `rm -rf` holds a descriptor of it); a directory found empty whose rmdir meets a new entry is listed again, up to
//! `REFILLS` times, then the removal gives up (`NotEmpty`). Someone creating inside the tree
//! as fast as it empties keeps it going, as long as that lasts.
use super::{Attr, Fs, Ino};
use crate::error::{Error, Result};
use idxfs_format::items::{S_IFDIR, S_IFMT};

/// Entries one listing of a directory takes before their removals.
const BATCH: usize = 1024;
/// Times a directory may be found refilled at its rmdir before the removal gives up.
const REFILLS: u32 = 8;
const DT_DIR: u8 = 4;

/// What `Fs::remove_tree` removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Removed {
    /// Names of files (any type but directories), each an unlink.
    pub files: u64,
    /// Directories, the top one included.
    pub dirs: u64,
}

/// What `Fs::remove_tree` asks before each step, the answers a front end's permission checks
/// give (module docs). An `Err` ends the walk and is what it returns: `Error::Denied` and
/// `Error::NotPermitted` are meant for these.
pub trait Permits {
    /// Before `dir` is listed (its attributes read just before).
    fn list(&self, fs: &Fs, dir: &Attr) -> Result<()>;
    /// Before names are removed from `dir`: once for each batch of them, with the
    /// attributes its listing read.
    fn change(&self, fs: &Fs, dir: &Attr) -> Result<()>;
    /// Before the entry naming `child` is removed from `dir` (or before `child`, a directory,
    /// is entered to be emptied), after `change` permitted `dir`: what depends on the
    /// entry itself (the sticky bit).
    fn remove(&self, fs: &Fs, dir: &Attr, child: Ino) -> Result<()>;
}

/// Permits everything: for a caller that checked what it needs itself, or needs no checks
/// (a library's owner, root).
pub struct Unchecked;

impl Permits for Unchecked {
    fn list(&self, _: &Fs, _: &Attr) -> Result<()> {
        Ok(())
    }
    fn change(&self, _: &Fs, _: &Attr) -> Result<()> {
        Ok(())
    }
    fn remove(&self, _: &Fs, _: &Attr, _: Ino) -> Result<()> {
        Ok(())
    }
}

/// A directory being emptied: where its name is, and its number.
struct Dir {
    parent: Ino,
    name: Vec<u8>,
    ino: Ino,
    /// Its rmdirs that met a new entry.
    refills: u32,
}

/// A removal under way (`Fs::remove_tree_start`, then `Fs::remove_tree_step` until it says
/// done): what it has removed and the directories it is emptying. A front end that must not
/// hold a thread for a whole tree runs it a slice at a time, as a copy (`CopyJob`).
pub struct RemoveJob {
    done: Removed,
    stack: Vec<Dir>,
}

impl RemoveJob {
    /// What it has removed so far.
    pub fn removed(&self) -> Removed {
        self.done
    }
}

impl Fs {
    /// Removes `name` in `parent` and, when it is a directory, everything under it, asking
    /// `permits` before each listing and removal (module docs). `progress` is told the counts
    /// after each directory's batch; `held` each inode removed (a name of it, or the
    /// directory) that a front end pins just after, whose attributes it may have cached (a
    /// file linked elsewhere has one link less, an open one none).
    pub fn remove_tree(
        &self,
        parent: Ino,
        name: &[u8],
        permits: &dyn Permits,
        mut progress: impl FnMut(&Removed),
        mut held: impl FnMut(Ino),
    ) -> Result<Removed> {
        let mut job = self.remove_tree_start(parent, name, permits, &mut held)?;
        while !self.remove_tree_step(&mut job, permits, None, &mut progress, &mut held)? {}
        Ok(job.removed())
    }

    /// The start of `remove_tree`: the checks of the top, and its unlink when it is not a
    /// directory. `remove_tree_step` with the same `permits` removes the rest.
    pub fn remove_tree_start(
        &self,
        parent: Ino,
        name: &[u8],
        permits: &dyn Permits,
        held: &mut dyn FnMut(Ino),
    ) -> Result<RemoveJob> {
        let mut job = RemoveJob {
            done: Removed::default(),
            stack: Vec::new(),
        };
        let top = self.lookup(parent, name)?;
        let parent_attr = self.getattr(parent)?;
        permits.change(self, &parent_attr)?;
        permits.remove(self, &parent_attr, top.ino)?;
        if top.mode & S_IFMT != S_IFDIR {
            self.unlink(parent, name)?;
            self.tell_held(top.ino, held);
            job.done.files = 1;
            return Ok(job);
        }
        job.stack.push(Dir {
            parent,
            name: name.to_vec(),
            ino: top.ino,
            refills: 0,
        });
        Ok(job)
    }

    /// Removes more of `job` (made by `remove_tree_start` with these `permits`): until it is
    /// done (true), or, with `until`, until that moment passes after a batch of a
    /// directory's names (false: more to do).
    pub fn remove_tree_step(
        &self,
        job: &mut RemoveJob,
        permits: &dyn Permits,
        until: Option<std::time::Instant>,
        progress: &mut dyn FnMut(&Removed),
        held: &mut dyn FnMut(Ino),
    ) -> Result<bool> {
        let RemoveJob { done, stack } = job;
        let mut tell = |ino: Ino| self.tell_held(ino, held);
        // One batch at least a step, so a step always gets somewhere.
        let mut first = true;
        while let Some(d) = stack.last() {
            if !first && until.is_some_and(|t| std::time::Instant::now() >= t) {
                return Ok(false);
            }
            first = false;
            // Read again for every batch: a chmod meanwhile counts from then on.
            let attr = match self.getattr(d.ino) {
                Ok(a) => a,
                Err(Error::NotFound) => {
                    stack.pop();
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Err(refused) = permits.list(self, &attr) {
                // As `rm -rf` does with a directory it may not read: removed if it is empty
                // (its removal was permitted when it was entered), else the refusal stands.
                let d = stack
                    .pop()
                    .unwrap_or_else(|| unreachable!("the loop's top"));
                if !self.rmdir_counted(&d, done, &mut tell)? {
                    return Err(refused);
                }
                continue;
            }
            let mut batch = Vec::new();
            let listed = self.readdir(d.ino, 2, |e| {
                batch.push(e.clone());
                batch.len() < BATCH
            });
            match listed {
                Ok(()) => {}
                // Removed or renamed away by someone else, with what it held.
                Err(Error::NotFound) => {
                    stack.pop();
                    continue;
                }
                Err(e) => return Err(e),
            }
            if batch.is_empty() {
                let mut d = stack
                    .pop()
                    .unwrap_or_else(|| unreachable!("the loop's top"));
                if !self.rmdir_counted(&d, done, &mut tell)? {
                    // Filled again meanwhile: listed again.
                    if d.refills == REFILLS {
                        return Err(Error::NotEmpty);
                    }
                    d.refills += 1;
                    stack.push(d);
                }
            } else {
                let dir = d.ino;
                permits.change(self, &attr)?;
                for e in batch {
                    permits.remove(self, &attr, e.ino)?;
                    if e.dtype == DT_DIR {
                        stack.push(Dir {
                            parent: dir,
                            name: e.name,
                            ino: e.ino,
                            refills: 0,
                        });
                        continue;
                    }
                    match self.unlink(dir, &e.name) {
                        Ok(()) => {
                            done.files += 1;
                            tell(e.ino);
                        }
                        Err(Error::NotFound) => {}
                        Err(e) => return Err(e),
                    }
                }
                progress(done);
            }
        }
        Ok(true)
    }

    /// Tells `held` of `ino`, removed, when a front end pins it.
    fn tell_held(&self, ino: Ino, held: &mut dyn FnMut(Ino)) {
        if self.hand.pins.contains(ino) {
            held(ino);
        }
    }

    /// The rmdir of `d`, counted in `done` and told to `tell`: false when it still holds
    /// something; gone already counts as done.
    fn rmdir_counted(
        &self,
        d: &Dir,
        done: &mut Removed,
        tell: &mut impl FnMut(Ino),
    ) -> Result<bool> {
        match self.rmdir(d.parent, &d.name) {
            Ok(()) => {
                done.dirs += 1;
                tell(d.ino);
                Ok(true)
            }
            Err(Error::NotFound) => Ok(true),
            Err(Error::NotEmpty) => Ok(false),
            Err(e) => Err(e),
        }
    }
}
