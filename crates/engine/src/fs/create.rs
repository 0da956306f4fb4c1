//! create, mknod, mkdir, symlink, link, lookup.
use super::file::inline_symlink_max;
use super::{
    new_inode_item, published, Attr, Durable, Fs, Inner, Ino, NewFile, Owner, Reserve, NEW_FILE_MAX,
};
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::space::Kind;
use idxfs_format::items::{
    dtype_of_mode, ExtentItem, EXTENT_INLINE, EXTENT_REGULAR, S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO,
    S_IFLNK, S_IFMT, S_IFREG, S_IFSOCK,
};
use idxfs_format::{ItemType, Key, BLOCK_SIZE, SYMLINK_MAX};
use zerocopy::IntoBytes;

/// Item changes a create makes: inode, two dir indexes, back reference, plus slack.
pub(super) const CREATE_ITEMS: u64 = 5;
const S_ISGID: u32 = 0o2000;
/// Hard links per inode (ext4's limit, so programs see familiar behaviour).
pub const LINK_MAX: u32 = 65000;

impl Inner {
    /// Creates an inode of any type named `name` in `parent`: `mode` as asked, cut by
    /// `umask` or by the directory's default ACL, which the inode inherits (`acl`). The
    /// caller reserved for `CREATE_ITEMS` item changes and whatever else its operation
    /// does; the ACLs reserve for themselves on top of that, before the first change.
    pub(crate) fn make_node(
        &mut self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        owner: Owner,
        rdev: u64,
        umask: u32,
    ) -> Result<(Ino, idxfs_format::items::InodeItem)> {
        Inner::check_name(name)?;
        let p = self.dir_inode(parent)?;
        if p.nlink.get() == 0 {
            return Err(Error::NotFound); // creating in a removed directory
        }
        let (found, hash_item_len) = self.lookup_slot(parent, name)?;
        if found.is_some() {
            return Err(Error::Exists);
        }
        if self.txn.peek_ino(parent).is_none() {
            return Err(Error::NoSpace);
        }
        let is_dir = mode & S_IFMT == S_IFDIR;
        if is_dir && p.nlink.get() >= LINK_MAX {
            return Err(Error::TooManyLinks);
        }
        // A set-group-ID directory passes its group on, and to subdirectories the bit itself.
        let (mut mode, mut owner) = (mode, owner);
        if p.mode.get() & S_ISGID != 0 {
            owner.gid = p.gid.get();
            if is_dir {
                mode |= S_ISGID;
            }
        }
        let acls = self.inherit(parent, mode, umask)?;
        let mode = acls.mode;
        if acls.nodes > 0 {
            let nodes = self.op.nodes.max(CREATE_ITEMS * self.item_nodes()) + acls.nodes;
            self.reserve_nodes(nodes, 0, Reserve::Grow)?;
        }
        // After the reservation, which may commit (ending the directory's run).
        let ino = self.txn.peek_ino(parent).ok_or(Error::NoSpace)?;
        let plan = self.plan_entry(parent, name, ino, hash_item_len, true)?;
        self.txn.take_ino(parent, ino)?;
        let now = self.now();
        let mut it = new_inode_item(mode, owner, rdev, self.store.generation, now);
        it.flags = super::inode_flags::inherited(&p, mode).into();
        if is_dir {
            it.nlink = 2.into();
        }
        self.insert_inode(ino, &it)?;
        self.store_inherited(ino, acls.xattrs)?;
        self.add_entry(parent, name, ino, dtype_of_mode(mode), plan)?;
        if is_dir {
            self.modify_inode(parent, |d| d.nlink = (d.nlink.get() + 1).into())?;
        }
        self.hold_made(ino);
        Ok((ino, it))
    }
}

fn check_type(mode: u32) -> Result<()> {
    match mode & S_IFMT {
        S_IFREG | S_IFDIR | S_IFLNK | S_IFIFO | S_IFSOCK | S_IFCHR | S_IFBLK => Ok(()),
        0 => Err(Error::Invalid("mode has no file type")),
        _ => Err(Error::Invalid("unknown file type")),
    }
}

impl Fs {
    /// Looks `name` up in `parent`. "." and ".." are understood.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        let plain = !matches!(name, b"." | b"..") && name.len() <= idxfs_format::NAME_MAX;
        if plain {
            if let Some((ino, it)) = self.hand.published.lookup(parent, name) {
                Counters::inc(&self.shared.counters.lookup_lock_free);
                return Ok(Attr::from_item(ino, &it));
            }
        }
        let mut g = self.lock();
        let dir = g.dir_inode(parent)?;
        if name.len() > idxfs_format::NAME_MAX {
            return Err(Error::NameTooLong);
        }
        let ino = match name {
            b"." => parent,
            b".." if dir.nlink.get() == 0 => return Err(Error::NotFound),
            b".." => g.parent_of(parent)?,
            _ => g.lookup_entry(parent, name)?.ok_or(Error::NotFound)?.ino,
        };
        let it = g.inode(ino)?;
        if plain {
            // Read under the lock, so current: the next lookup of it takes no lock.
            g.publish_read(published::Read {
                inodes: vec![(parent, dir), (ino, it)],
                name: Some(published::Name {
                    dir: parent,
                    name: name.into(),
                    ino,
                }),
                ..Default::default()
            });
        }
        Ok(Attr::from_item(ino, &it))
    }

    /// Creates a regular file. `mode` holds permission bits (a file type, if given, must be
    /// S_IFREG).
    pub fn create(&self, parent: Ino, name: &[u8], mode: u32, owner: Owner) -> Result<Attr> {
        if mode & S_IFMT != 0 && mode & S_IFMT != S_IFREG {
            return Err(Error::Invalid("create of a non-regular file"));
        }
        self.mknod(parent, name, S_IFREG | (mode & 0o7777), owner, 0)
    }

    /// Creates an inode of the type in `mode` (regular, fifo, socket, char or block device,
    /// directory). `mode` is the final one unless the directory has a default ACL
    /// (`mknod_umask`).
    pub fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        owner: Owner,
        rdev: u64,
    ) -> Result<Attr> {
        self.mknod_umask(parent, name, mode, owner, rdev, 0)
    }

    /// `mknod` for a caller that leaves the umask to the file system, as the kernel does
    /// for one with ACLs: `umask` cuts `mode` when the directory has no default ACL, and is
    /// ignored when it has one (`acl`).
    pub fn mknod_umask(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        owner: Owner,
        rdev: u64,
        umask: u32,
    ) -> Result<Attr> {
        check_type(mode)?;
        if mode & S_IFMT == S_IFLNK {
            return Err(Error::Invalid("symlinks are made by symlink()"));
        }
        self.write_op(CREATE_ITEMS, Reserve::Grow, Durable::Dir, |g| {
            let (ino, it) =
                g.make_node(parent, name, mode & (S_IFMT | 0o7777), owner, rdev, umask)?;
            Ok(Attr::from_item(ino, &it))
        })
    }

    /// Creates a regular file with its data and times in one operation, where `create`,
    /// `write` and `setattr` take three: for a copy of a file made elsewhere (`idxfs mkfs
    /// --from`). The owner and mode are `mknod`'s (a set-group-ID directory passes its group
    /// on, a default ACL cuts the mode). The data is written under the operation lock,
    /// device I/O included, which suits one thread filling an image and would stall readers
    /// beside it; hence at most `NEW_FILE_MAX` bytes.
    pub fn create_file(&self, parent: Ino, name: &[u8], f: &NewFile) -> Result<Attr> {
        if f.data.len() > NEW_FILE_MAX {
            return Err(Error::Invalid("create_file: more data than NEW_FILE_MAX"));
        }
        if [f.atime, f.mtime, f.ctime]
            .iter()
            .any(|t| t.nsec >= 1_000_000_000)
        {
            return Err(Error::Invalid("nanoseconds out of range"));
        }
        let len = f.data.len() as u64;
        self.write_op(CREATE_ITEMS, Reserve::Grow, Durable::Dir, |g| {
            // Before the first change: the data's blocks and the nodes linking them, on top
            // of the create's (a reservation is the least the pools hold, not an addition).
            if len > 0 {
                let nodes = CREATE_ITEMS * g.item_nodes() + g.write_nodes(len, 0);
                g.reserve_nodes(nodes, len.div_ceil(BLOCK_SIZE) + 2, Reserve::Grow)?;
            }
            let mode = S_IFREG | (f.mode & 0o7777);
            let (ino, _) = g.make_node(parent, name, mode, f.owner, 0, 0)?;
            if len > 0 {
                g.write_data(ino, 0, f.data)?;
            }
            let it = g.modify_inode(ino, |i| {
                i.atime = f.atime.into();
                i.mtime = f.mtime.into();
                i.ctime = f.ctime.into();
            })?;
            Ok(Attr::from_item(ino, &it))
        })
    }

    pub fn mkdir(&self, parent: Ino, name: &[u8], mode: u32, owner: Owner) -> Result<Attr> {
        self.mknod(parent, name, S_IFDIR | (mode & 0o7777), owner, 0)
    }

    /// Creates a symbolic link to `target`: inline in its extent item when it fits one (like
    /// btrfs), else in a block of its own (like ext4's long symlinks), up to 4,095 bytes.
    pub fn symlink(&self, parent: Ino, name: &[u8], target: &[u8], owner: Owner) -> Result<Attr> {
        if target.is_empty() {
            return Err(Error::NotFound);
        }
        if target.len() > SYMLINK_MAX {
            return Err(Error::NameTooLong);
        }
        if target.contains(&0) {
            return Err(Error::Invalid("NUL in a symlink target"));
        }
        self.write_op(CREATE_ITEMS + 1, Reserve::Grow, Durable::Dir, |g| {
            let inline = target.len() <= inline_symlink_max(g.store.node_size);
            if !inline {
                g.reserve_blocks(CREATE_ITEMS + 1, 1, Reserve::Grow)?;
            }
            // The block first: running out of space then changes nothing.
            let block = if inline {
                None
            } else {
                let (b, _) = g
                    .store
                    .alloc
                    .alloc(1, 1, Kind::Data)
                    .ok_or(Error::NoSpace)?;
                let mut buf = target.to_vec();
                buf.resize(BLOCK_SIZE as usize, 0);
                if let Err(e) = g.store.dev.write_at(&buf, b * BLOCK_SIZE) {
                    // Just allocated and marked used: freeing cannot fail.
                    let _ = g.store.alloc.free(b, 1, true);
                    return Err(Error::WriteRefused(e));
                }
                g.log.data_unflushed = true;
                Some(b)
            };
            let made = g.make_node(parent, name, S_IFLNK | 0o777, owner, 0, 0);
            let (ino, _) = match made {
                Ok(m) => m,
                Err(e) => {
                    if let Some(b) = block {
                        let _ = g.store.alloc.free(b, 1, true);
                    }
                    return Err(e);
                }
            };
            let gen = g.store.generation;
            let ext = ExtentItem {
                kind: if inline {
                    EXTENT_INLINE
                } else {
                    EXTENT_REGULAR
                },
                reserved: [0; 7],
                generation: gen.into(),
                disk_block: block.unwrap_or(0).into(),
                blocks: u64::from(block.is_some()).into(),
            };
            let mut v = ext.as_bytes().to_vec();
            if inline {
                v.extend_from_slice(target);
            }
            g.fs_tree
                .insert(&mut g.store, Key::new(ino, ItemType::Extent, 0), v)?;
            let it = g.modify_inode(ino, |i| {
                i.size = (target.len() as u64).into();
                if block.is_some() {
                    i.alloc_bytes = BLOCK_SIZE.into();
                }
            })?;
            Ok(Attr::from_item(ino, &it))
        })
    }

    /// A symlink's target: without the lock once read (`published`; targets never change).
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        if let Some(t) = self.hand.published.readlink(ino) {
            Counters::inc(&self.shared.counters.readlink_lock_free);
            return Ok(t);
        }
        let mut g = self.lock();
        let t = g.read_link(ino)?;
        if t.len() <= published::VALUE_BYTES_MAX {
            g.publish_read(published::Read {
                link: Some((ino, t.clone().into())),
                ..Default::default()
            });
        }
        Ok(t)
    }

    /// Adds a hard link `newparent/newname` to `ino`.
    pub fn link(&self, ino: Ino, newparent: Ino, newname: &[u8]) -> Result<Attr> {
        self.write_op(CREATE_ITEMS, Reserve::Grow, Durable::Dir, |g| {
            Inner::check_name(newname)?;
            let it = g.inode(ino)?;
            if it.mode.get() & S_IFMT == S_IFDIR {
                return Err(Error::Invalid("hard link to a directory"));
            }
            if it.nlink.get() >= LINK_MAX {
                return Err(Error::TooManyLinks);
            }
            // A nameless inode (an O_TMPFILE file, `tmpfile`) may get a name while held.
            let nameless = it.nlink.get() == 0;
            if nameless && !(g.lives.pins.contains(ino) && g.lives.orphans.is_free(ino)) {
                return Err(Error::NotFound);
            }
            let p = g.dir_inode(newparent)?;
            if p.nlink.get() == 0 {
                return Err(Error::NotFound);
            }
            let (found, hash_item_len) = g.lookup_slot(newparent, newname)?;
            if found.is_some() {
                return Err(Error::Exists);
            }
            let plan = g.plan_entry(newparent, newname, ino, hash_item_len, false)?;
            if nameless {
                g.adopt(ino)?;
            }
            g.add_entry(newparent, newname, ino, dtype_of_mode(it.mode.get()), plan)?;
            let now = g.now();
            let it = g.modify_inode(ino, |i| {
                i.nlink = (i.nlink.get() + 1).into();
                i.ctime = now;
            })?;
            g.hold_made(ino);
            Ok(Attr::from_item(ino, &it))
        })
    }
}
