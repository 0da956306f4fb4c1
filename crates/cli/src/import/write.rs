//! The writer of `mkfs --from` and of `idxfs import`'s server: makes each entry the reader
//! sends in the file system, then its xattrs and attributes.
use super::{Attrs, Item, Kind, Progress, Totals, Xattrs};
use idxfs_engine::fs::{Ino, NewFile, SetAttr, WriteHow};
use idxfs_engine::Fs;
use std::collections::HashMap;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;

/// The file whose data is arriving: its attributes are set when the next item comes.
struct OpenFile {
    ino: Ino,
    path: PathBuf,
    attrs: Attrs,
    xattrs: Xattrs,
    /// The end of the data written so far.
    end: u64,
}

/// `F`: the engine, borrowed (`mkfs --from`) or shared with a mount's server (`serve.rs`).
pub(super) struct Writer<F: Deref<Target = Fs>> {
    fs: F,
    /// Unpin every inode made: the engine pins what it makes for a FUSE server, whose
    /// kernel holds what a reply names; what an import makes no reply names.
    unpin_made: bool,
    /// A directory's id (`Kind::Dir`) to its inode.
    dirs: Vec<Ino>,
    /// The first name's id of an inode with several names, to the inode and its attributes.
    links: HashMap<u64, (Ino, Attrs)>,
    /// Inodes that got another name after their attributes were set.
    relinked: Vec<u64>,
    open: Option<OpenFile>,
    pub(super) totals: Totals,
    pub(super) progress: Progress,
}

/// Drops the pin the engine took on `ino` for a FUSE server's kernel (`Writer::unpin_made`).
fn made(fs: &Fs, unpin: bool, ino: Ino, path: &Path) -> Result<(), String> {
    match unpin {
        true => fs.unpin(ino, 1).map_err(|e| at(path, "unpin", e)),
        false => Ok(()),
    }
}

/// One line naming the source path of what failed.
fn at(path: &Path, what: &str, e: idxfs_engine::Error) -> String {
    match e {
        idxfs_engine::Error::NoSpace => format!(
            "{}: the image is full ({what}); give mkfs a larger --size",
            path.display()
        ),
        e => format!("{}: {what}: {e}", path.display()),
    }
}

impl<F: Deref<Target = Fs>> Writer<F> {
    /// A writer whose source directory's copy is `root` (its entries go there).
    pub(super) fn new(fs: F, root: Ino, progress: Progress) -> Writer<F> {
        let unpin_made = fs.holds_made();
        Writer {
            fs,
            unpin_made,
            dirs: vec![root],
            links: HashMap::new(),
            relinked: Vec::new(),
            open: None,
            totals: Totals::default(),
            progress,
        }
    }

    pub(super) fn fs(&self) -> &F {
        &self.fs
    }

    pub(super) fn run(&mut self, rx: &Receiver<Vec<Item>>) -> Result<(), String> {
        for batch in rx.iter() {
            for item in batch {
                self.item(item)?;
            }
            self.progress.show(&self.totals);
        }
        self.end()
    }

    /// After the last item: the attributes of the file made last, and of inodes linked to
    /// after theirs were set.
    pub(super) fn end(&mut self) -> Result<(), String> {
        self.close_file()?;
        let mut relinked = std::mem::take(&mut self.relinked);
        relinked.sort_unstable();
        relinked.dedup();
        for id in relinked {
            if let Some(&(ino, attrs)) = self.links.get(&id) {
                self.fs
                    .setattr(ino, &attrs.set())
                    .map_err(|e| format!("inode {ino}: setting its attributes: {e}"))?;
            }
        }
        Ok(())
    }

    pub(super) fn item(&mut self, item: Item) -> Result<(), String> {
        let item = match item {
            Item::Data { off, bytes } => return self.data(off, &bytes),
            other => other,
        };
        self.close_file()?;
        match item {
            Item::Make {
                parent,
                name,
                path,
                kind,
                attrs,
                xattrs,
                first_link,
            } => self.make(parent, &name, path, kind, attrs, xattrs, first_link),
            Item::DirDone {
                id,
                path,
                attrs,
                xattrs,
            } => {
                let ino = self.dir(id, &path)?;
                self.finish(ino, &path, &attrs, &xattrs)
            }
            Item::Data { .. } => Ok(()),
        }
    }

    fn dir(&self, id: usize, path: &Path) -> Result<Ino, String> {
        self.dirs
            .get(id)
            .copied()
            .ok_or_else(|| format!("{}: its directory was not made (id {id})", path.display()))
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "the fields of one Item::Make, taken apart by `item`"
    )]
    fn make(
        &mut self,
        parent: usize,
        name: &[u8],
        path: PathBuf,
        kind: Kind,
        attrs: Attrs,
        xattrs: Xattrs,
        first_link: Option<u64>,
    ) -> Result<(), String> {
        let dir = self.dir(parent, &path)?;
        let fs: &Fs = &self.fs;
        let unpin = self.unpin_made;
        let ino = match kind {
            Kind::Link(id) => {
                let Some(&(ino, _)) = self.links.get(&id) else {
                    return Err(format!("{}: its first name was not made", path.display()));
                };
                fs.link(ino, dir, name)
                    .map_err(|e| at(&path, "a hard link", e))?;
                made(fs, unpin, ino, &path)?;
                self.relinked.push(id);
                self.totals.links += 1;
                return Ok(());
            }
            Kind::Dir { id } => {
                let a = fs
                    .mkdir(dir, name, attrs.mode, attrs.owner())
                    .map_err(|e| at(&path, "mkdir", e))?;
                made(fs, unpin, a.ino, &path)?;
                if id != self.dirs.len() {
                    return Err(format!(
                        "{}: directory id {id} out of order",
                        path.display()
                    ));
                }
                self.dirs.push(a.ino);
                self.totals.dirs += 1;
                // Its xattrs and attributes come with `Item::DirDone`.
                return Ok(());
            }
            Kind::File { whole: Some(data) } => {
                let new = NewFile {
                    mode: attrs.mode,
                    owner: attrs.owner(),
                    atime: attrs.atime,
                    mtime: attrs.mtime,
                    ctime: attrs.ctime,
                    data: &data,
                };
                let a = fs
                    .create_file(dir, name, &new)
                    .map_err(|e| at(&path, "create", e))?;
                made(fs, unpin, a.ino, &path)?;
                self.totals.files += 1;
                self.totals.bytes += data.len() as u64;
                if let Some(id) = first_link {
                    self.links.insert(id, (a.ino, attrs));
                }
                // Made whole, times included, unless there is more to set: xattrs (which
                // move the ctime), a size the reads did not reach, or an owner or mode that
                // the directory's set-group-ID bit or default ACL changed.
                let done = xattrs.is_empty()
                    && data.len() as u64 == attrs.size
                    && (a.mode, a.uid, a.gid) == (attrs.mode, attrs.uid, attrs.gid);
                if done {
                    return Ok(());
                }
                self.open = Some(OpenFile {
                    ino: a.ino,
                    path,
                    attrs,
                    xattrs,
                    end: data.len() as u64,
                });
                return Ok(());
            }
            Kind::File { whole: None } => {
                let a = fs
                    .create(dir, name, attrs.mode & 0o7777, attrs.owner())
                    .map_err(|e| at(&path, "create", e))?;
                made(fs, unpin, a.ino, &path)?;
                self.totals.files += 1;
                if let Some(id) = first_link {
                    self.links.insert(id, (a.ino, attrs));
                }
                self.open = Some(OpenFile {
                    ino: a.ino,
                    path,
                    attrs,
                    xattrs,
                    end: 0,
                });
                return Ok(());
            }
            Kind::Symlink(target) => {
                self.totals.symlinks += 1;
                fs.symlink(dir, name, &target, attrs.owner())
                    .map_err(|e| at(&path, "symlink", e))?
                    .ino
            }
            Kind::Special => {
                self.totals.specials += 1;
                fs.mknod(dir, name, attrs.mode, attrs.owner(), attrs.rdev)
                    .map_err(|e| at(&path, "mknod", e))?
                    .ino
            }
        };
        made(fs, unpin, ino, &path)?;
        if let Some(id) = first_link {
            self.links.insert(id, (ino, attrs));
        }
        self.finish(ino, &path, &attrs, &xattrs)
    }

    fn data(&mut self, off: u64, bytes: &[u8]) -> Result<(), String> {
        let Some(f) = self.open.as_mut() else {
            return Err("file data without its file".into());
        };
        let how = WriteHow {
            times: false,
            kill: Default::default(),
        };
        let mut done = 0;
        while done < bytes.len() {
            let n = self
                .fs
                .write_with(f.ino, off + done as u64, &bytes[done..], how)
                .map_err(|e| at(&f.path, "write", e))?;
            if n == 0 {
                return Err(format!("{}: a write took no bytes", f.path.display()));
            }
            done += n;
        }
        f.end = f.end.max(off + bytes.len() as u64);
        self.totals.bytes += bytes.len() as u64;
        Ok(())
    }

    /// Sets the attributes of the file whose data came last: its size too when it ends in a
    /// hole (or shrank while it was read, then its data ends short of the size its stat gave).
    fn close_file(&mut self) -> Result<(), String> {
        let Some(f) = self.open.take() else {
            return Ok(());
        };
        if f.end != f.attrs.size {
            let size = SetAttr {
                size: Some(f.attrs.size),
                ..SetAttr::default()
            };
            self.fs
                .setattr(f.ino, &size)
                .map_err(|e| at(&f.path, "setting the size", e))?;
        }
        self.finish(f.ino, &f.path, &f.attrs, &f.xattrs)
    }

    /// Copies an entry's xattrs, then its owner, mode and times (which the xattrs' change
    /// would move).
    fn finish(
        &mut self,
        ino: Ino,
        path: &Path,
        attrs: &Attrs,
        xattrs: &Xattrs,
    ) -> Result<(), String> {
        for (name, value) in xattrs {
            self.fs.setxattr(ino, name, value, 0).map_err(|e| {
                let n = String::from_utf8_lossy(name);
                at(path, &format!("setting xattr {n}"), e)
            })?;
        }
        self.fs
            .setattr(ino, &attrs.set())
            .map_err(|e| at(path, "setting its attributes", e))?;
        Ok(())
    }
}
