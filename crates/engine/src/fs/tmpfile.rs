//! O_TMPFILE: a regular file made without a name, which a later `link` may give one.
//!
//! It is born an orphan (`orphan`): nlink 0, pinned once for its maker (the FUSE front end's
//! reply gives the kernel that one lookup count), with a *Free* orphan record. So it lives
//! while held, is freed at its last unpin if it never got a name, and a crash before `link`
//! leaves an orphan the next open frees, as for a file unlinked while open. `link` of an
//! inode with no name takes the orphan record away again (`Inner::adopt`); the kernel allows
//! that only for O_TMPFILE files opened without O_EXCL (I_LINKABLE), so the engine lets any
//! held nameless inode be linked and leaves the gate to the front end's kernel.
use super::{new_inode_item, Attr, Durable, Fs, Inner, Ino, Owner, Reserve};
use crate::error::{Error, Result};
use idxfs_format::items::{OrphanKind, S_IFMT, S_IFREG};

const S_ISGID: u32 = 0o2000;

impl Fs {
    /// Makes a regular file with no name, for a directory `dir` that must still exist: nlink
    /// 0, pinned once (the caller's hold: `unpin` frees it unless `link` named it first).
    /// `mode`: permission bits (a file type, if given, must be S_IFREG).
    pub fn tmpfile(&self, dir: Ino, mode: u32, owner: Owner) -> Result<Attr> {
        self.tmpfile_umask(dir, mode, owner, 0)
    }

    /// `tmpfile` with the umask left to the file system, as `Fs::mknod_umask`.
    pub fn tmpfile_umask(&self, dir: Ino, mode: u32, owner: Owner, umask: u32) -> Result<Attr> {
        if mode & S_IFMT != 0 && mode & S_IFMT != S_IFREG {
            return Err(Error::Invalid("tmpfile of a non-regular file"));
        }
        // The inode item; its orphan record is written by the commit.
        self.write_op(2, Reserve::Grow, Durable::Data, |g| {
            let p = g.dir_inode(dir)?;
            if p.nlink.get() == 0 {
                return Err(Error::NotFound);
            }
            if g.txn.peek_ino(dir).is_none() {
                return Err(Error::NoSpace);
            }
            let acls = g.inherit(dir, S_IFREG | (mode & 0o7777), umask)?;
            if acls.nodes > 0 {
                g.reserve_nodes(2 * g.item_nodes() + acls.nodes, 0, Reserve::Grow)?;
            }
            // After the reservation, which may commit (ending the directory's run).
            let ino = g.txn.peek_ino(dir).ok_or(Error::NoSpace)?;
            // The pin first: a file nobody holds would be freed as soon as it is made.
            if g.lives.pins.add(ino) != super::pins::Pin::Pinned {
                return Err(Error::NoSpace);
            }
            // As for a named file: a set-group-ID directory passes its group on.
            let mut owner = owner;
            if p.mode.get() & S_ISGID != 0 {
                owner.gid = p.gid.get();
            }
            g.txn.take_ino(dir, ino)?;
            let now = g.now();
            let mut it = new_inode_item(acls.mode, owner, 0, g.store.generation, now);
            it.nlink = 0.into();
            g.insert_inode(ino, &it)?;
            g.store_inherited(ino, acls.xattrs)?;
            g.lives.orphans.add(ino, OrphanKind::Free);
            // Kept for its holder as an unlinked file is (`Releases::wait`).
            g.lives.pins.releases.kept_one();
            Ok(Attr::from_item(ino, &it))
        })
    }
}

impl Inner {
    /// `ino` has no name and gets its first: it stops being an orphan. Only for a held
    /// inode (`link` checks): one nobody pins may already be partly freed.
    pub(crate) fn adopt(&mut self, ino: Ino) -> Result<()> {
        if !self.lives.pins.contains(ino) || !self.lives.orphans.is_free(ino) {
            return Err(Error::NotFound);
        }
        self.drop_orphan(ino)
    }
}
