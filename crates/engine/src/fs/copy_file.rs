//! A regular file copied whole in one operation (`Fs::copy_file_whole`, for `copy_tree`):
//! made, given its source's bytes and its owner, mode and times, under one lock, with one
//! reservation, where `mknod`, `copy_range` (its plan, then its batch) and `setattr` take
//! four. A tree copy of small files spends its time in the descents each operation makes
//! (docs/benchmarks.md, "snapshot"), so this is most of what it costs per file.
//!
//! What the copy carries is read under the source's lock: a file of this file system under
//! the operation's own, so the copy is the file as it was at one moment; a snapshot's under
//! the view's first (nothing it names changes while it is open, `restore`). Blocks are
//! shared as `copy_range` shares them (`clone`): the copy's extents name the source's
//! written blocks, with their data sums, holes and preallocated extents becoming holes; a
//! snapshot's blocks become the file system's again as a restored file's do. Inline bytes,
//! which have no block to share, are written into the copy's own inline extent.
//!
//! Only what one operation can do whole goes this way; the caller copies the rest with the
//! separate operations (`None`, before any change): a NOCOW source (its bytes are copied,
//! never shared), a destination directory whose files are born NOCOW (sharing into one is
//! refused), a source of more than one sharing batch (`CLONE_BATCH_BLOCKS`), whose
//! reservation would grow with it, and a snapshot's file naming blocks of the active
//! clone's origin that the clone does not, whose bytes are copied (`clones`). The copy
//! inherits what any new file in its directory does (a set-group-ID directory's group is
//! replaced below; a default ACL is the caller's to remove, `copy_xattrs`).
use super::clone::{pieces_in, Piece, Source, CLONE_BATCH_BLOCKS};
use super::create::CREATE_ITEMS;
use super::file::check_regular;
use super::inode_flags::is_nocow;
use super::{Durable, Fs, Inner, Ino, Owner, Reserve};
use crate::error::Result;
use idxfs_format::items::{InodeItem, EXTENT_INLINE, S_IFREG};
use idxfs_format::BLOCK_SIZE;

const BS: u64 = BLOCK_SIZE;

/// What a copy of a file carries, read under its source's lock.
enum Content {
    /// Inline bytes (or none): written into the copy.
    Bytes(Vec<u8>),
    /// Written blocks: (file block, disk block, blocks, generation), with every block's
    /// data sum from block 0: shared.
    Pieces(Vec<Piece>, Vec<Option<u32>>),
}

/// A source read for a copy: its inode as read, what the copy carries, and whether it has
/// xattrs.
struct Read {
    item: InodeItem,
    content: Content,
    xattrs: bool,
}

/// A copy `copy_file_whole` made.
pub(super) struct Made {
    pub ino: Ino,
    /// The bytes it holds.
    pub bytes: u64,
    /// The source or the copy (an inherited ACL) has xattrs: the caller makes the copy's
    /// the source's.
    pub xattrs: bool,
}

impl Inner {
    /// The content of regular file `src`, when one operation can copy it (module docs).
    fn whole_content(&mut self, src: Ino) -> Result<Option<Read>> {
        let item = self.held_inode(src)?;
        check_regular(&item)?;
        let size = item.size.get();
        if is_nocow(&item) || size > CLONE_BATCH_BLOCKS * BS {
            return Ok(None);
        }
        let n = size.div_ceil(BS);
        let exts = self.extents(src, 0, n * BS)?;
        let content = match exts.first() {
            Some(e) if e.item.kind == EXTENT_INLINE => {
                Content::Bytes(self.read_data(src, &item, 0, size as usize)?)
            }
            _ => Content::Pieces(pieces_in(&exts, 0, n), self.block_sums(src, 0, n)?),
        };
        let xattrs = self.has_xattrs(src)?;
        Ok(Some(Read {
            item,
            content,
            xattrs,
        }))
    }
}

impl Fs {
    /// Copies regular file `src` of `from` (this file system, or a snapshot opened beside
    /// it; the caller checked which) as `name` in `dir` in one operation: its bytes and
    /// access and modification times, with `owner` and permission bits `perms` (the
    /// source's, or what the caller's rules make of them); returns what it made. None, with
    /// nothing changed, when the file is not one that one operation copies (module docs);
    /// NotFound when the source is gone.
    pub(super) fn copy_file_whole(
        &self,
        from: &Fs,
        src: Ino,
        dir: Ino,
        name: &[u8],
        owner: Owner,
        perms: u32,
    ) -> Result<Option<Made>> {
        let snapshot = !std::ptr::eq(from, self);
        // A snapshot's file is read under the view's lock, before this file system's.
        let read = if snapshot {
            match from.lock().whole_content(src)? {
                Some(r) => Some(r),
                None => return Ok(None),
            }
        } else {
            None
        };
        let how = if snapshot {
            Source::Snapshot
        } else {
            Source::FileSystem
        };
        self.write_op(CREATE_ITEMS, Reserve::Grow, Durable::Dir, |g| {
            if is_nocow(&g.dir_inode(dir)?) {
                return Ok(None);
            }
            // Blocks of a clone's origin it does not name are copied (`clones`): by the
            // separate operations.
            if let Some(Read {
                content: Content::Pieces(pieces, _),
                item,
                ..
            }) = &read
            {
                let n = item.size.get().div_ceil(BS);
                if g.snapshots.clones.active_origin().is_some()
                    && g.named_prefix(src, pieces, 0, n)? < n
                {
                    return Ok(None);
                }
            }
            let here;
            let r = match &read {
                Some(r) => r,
                None => match g.whole_content(src)? {
                    Some(r) => {
                        here = r;
                        &here
                    }
                    None => return Ok(None),
                },
            };
            // Everything the operation allocates, before its first change: a reservation
            // is the least the pools hold, not an addition.
            let create = CREATE_ITEMS * g.item_nodes();
            match &r.content {
                Content::Bytes(b) if b.is_empty() => {}
                Content::Bytes(b) => {
                    let len = b.len() as u64;
                    let nodes = create + g.write_nodes(len, 0);
                    g.reserve_nodes(nodes, len.div_ceil(BS) + 2, Reserve::Grow)?;
                }
                Content::Pieces(pieces, _) => {
                    let nodes = create + g.link_nodes(pieces, how);
                    g.reserve_nodes(nodes, 0, Reserve::Grow)?;
                }
            }
            let s = &r.item;
            let mode = S_IFREG | (perms & 0o7777);
            let (ino, _) = g.make_node(dir, name, mode, owner, 0, 0)?;
            let linked = match &r.content {
                Content::Bytes(b) if b.is_empty() => 0,
                Content::Bytes(b) => {
                    g.write_data(ino, 0, b)?;
                    0
                }
                Content::Pieces(pieces, sums) => g.link_reserved(ino, 0, 0, pieces, sums, how)?,
            };
            let size = s.size.get();
            g.modify_inode(ino, |i| {
                // A set-group-ID directory gave it its group, a default ACL cut its mode.
                i.mode = mode.into();
                i.uid = owner.uid.into();
                i.gid = owner.gid.into();
                i.atime = s.atime;
                i.mtime = s.mtime;
                i.size = i.size.get().max(size).into();
                i.alloc_bytes = (i.alloc_bytes.get() + linked * BS).into();
            })?;
            let xattrs = r.xattrs || g.has_xattrs(ino)?;
            Ok(Some(Made {
                ino,
                bytes: size,
                xattrs,
            }))
        })
    }
}
