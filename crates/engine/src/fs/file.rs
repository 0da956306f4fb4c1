//! File data: small files inline in their extent item, larger ones in extents of whole blocks.
//!
//! Writes are copy-on-write: the new data goes to newly allocated blocks, then the extent items
//! are changed to point at them, and the old blocks are freed (pinned until the commit is
//! durable). A crash before the commit leaves the old data and the old extents intact.
use super::{Atime, Attr, Fs, Inner, Ino, Reserve};
use crate::btree::Change;
use crate::error::{Error, Result};
use crate::space::Kind;
use idxfs_format::items::{
    decode_extent, ExtentItem, InodeItem, EXTENT_INLINE, EXTENT_REGULAR, S_IFDIR, S_IFMT, S_IFREG,
};
use idxfs_format::node::max_item_size;
use idxfs_format::{ItemType, Key, BLOCK_SIZE};
use zerocopy::IntoBytes;

const BS: u64 = BLOCK_SIZE;
/// Largest file: keeps every block index and byte offset far from overflow.
pub const MAX_FILE_SIZE: u64 = 1 << 50;
/// Largest extent, in blocks (keeps any single write's allocation bounded).
pub(crate) const MAX_EXTENT_BLOCKS: u64 = 8192;

/// Largest inline file for a node size.
pub fn inline_max(node_size: u32) -> usize {
    (max_item_size(node_size) - idxfs_format::items::EXTENT_ITEM_SIZE).min(2048)
}

/// One extent as found in the tree.
#[derive(Debug, Clone)]
pub(crate) struct Ext {
    pub offset: u64,
    pub item: ExtentItem,
    pub inline: Vec<u8>,
}

impl Ext {
    pub fn len_bytes(&self) -> u64 {
        if self.item.kind == EXTENT_INLINE {
            self.inline.len() as u64
        } else {
            self.item.blocks.get() * BS
        }
    }
}

impl Inner {
    /// Extents that overlap [start, end), in order.
    pub(crate) fn extents(&mut self, ino: Ino, start: u64, end: u64) -> Result<Vec<Ext>> {
        let tree = self.fs_tree;
        let total = self.store.total_blocks;
        let mut out = Vec::new();
        let lo = Key::new(ino, ItemType::Extent, 0);
        let from = match tree.last_at_or_before(
            &mut self.store,
            lo,
            Key::new(ino, ItemType::Extent, start),
        )? {
            Some((k, _)) => k,
            None => Key::new(ino, ItemType::Extent, start),
        };
        let mut err = None;
        tree.scan(
            &mut self.store,
            from,
            Key::new(ino, ItemType::Extent, end),
            |k, v| match decode_extent(v, format_args!("extent {k}"), total) {
                Ok((item, rest)) => {
                    let e = Ext {
                        offset: k.offset,
                        item,
                        inline: rest.to_vec(),
                    };
                    if e.offset + e.len_bytes() > start {
                        out.push(e);
                    }
                    Ok(true)
                }
                Err(c) => {
                    err = Some(c);
                    Ok(false)
                }
            },
        )?;
        if let Some(c) = err {
            return Err(c.into());
        }
        Ok(out)
    }

    /// Reads up to `len` bytes at `off`, clamped to the file size.
    pub fn read_data(&mut self, ino: Ino, it: &InodeItem, off: u64, len: usize) -> Result<Vec<u8>> {
        let size = it.size.get();
        if off >= size {
            return Ok(Vec::new());
        }
        let end = size.min(off.saturating_add(len as u64));
        let mut buf = vec![0u8; (end - off) as usize];
        for e in self.extents(ino, off, end)? {
            let (a, b) = (e.offset.max(off), (e.offset + e.len_bytes()).min(end));
            if a >= b {
                continue;
            }
            let dst = &mut buf[(a - off) as usize..(b - off) as usize];
            if e.item.kind == EXTENT_INLINE {
                dst.copy_from_slice(&e.inline[(a - e.offset) as usize..(b - e.offset) as usize]);
            } else if e.item.kind == EXTENT_REGULAR {
                let disk = e.item.disk_block.get() * BS + (a - e.offset);
                self.store.dev.read_at(dst, disk)?;
            }
            // Prealloc extents read as zeros: the buffer already is.
        }
        Ok(buf)
    }

    /// Removes file data in [start, end) (block-aligned start for regular extents), freeing
    /// blocks; extents that straddle a bound are trimmed or split.
    pub(crate) fn punch(&mut self, ino: Ino, start: u64, end: u64) -> Result<u64> {
        let gen = self.store.generation;
        let mut freed = 0;
        for e in self.extents(ino, start, end)? {
            let key = Key::new(ino, ItemType::Extent, e.offset);
            if e.item.kind == EXTENT_INLINE {
                // Inline data only ever starts at 0; cut it to `start`.
                assert_eq!(e.offset, 0);
                let keep = start.min(e.inline.len() as u64) as usize;
                self.fs_tree.update(&mut self.store, &key, |v| {
                    if keep == 0 {
                        return Change::Delete;
                    }
                    v.truncate(idxfs_format::items::EXTENT_ITEM_SIZE + keep);
                    Change::Keep
                })?;
                continue;
            }
            assert!(
                start.is_multiple_of(BS),
                "punch of regular extents at unaligned {start}"
            );
            let (eb, en) = (e.item.disk_block.get(), e.item.blocks.get());
            let e_end = e.offset + en * BS;
            let cut_a = start.max(e.offset);
            let cut_b = end.min(e_end).div_ceil(BS) * BS;
            let cut_b = cut_b.min(e_end);
            let head = (cut_a - e.offset) / BS;
            let tail_start = (cut_b - e.offset) / BS;
            // Data of this transaction may be reused at once, unless an fsync batch may
            // name it (`crate::log`).
            let now = e.item.generation.get() == gen && !self.log.frees_must_wait();
            if tail_start > head {
                self.store.alloc.free(eb + head, tail_start - head, now)?;
                freed += tail_start - head;
            }
            // Replace the item by the head and tail that survive.
            self.fs_tree.delete(&mut self.store, &key)?;
            if head > 0 {
                let mut h = e.item;
                h.blocks = head.into();
                self.fs_tree
                    .insert(&mut self.store, key, h.as_bytes().to_vec())?;
            }
            if tail_start < en {
                let mut t = e.item;
                t.disk_block = (eb + tail_start).into();
                t.blocks = (en - tail_start).into();
                self.fs_tree.insert(
                    &mut self.store,
                    Key::new(ino, ItemType::Extent, e.offset + tail_start * BS),
                    t.as_bytes().to_vec(),
                )?;
            }
        }
        Ok(freed)
    }

    pub(crate) fn has_inline(&mut self, ino: Ino) -> Result<bool> {
        let tree = self.fs_tree;
        let v = tree.get(&mut self.store, &Key::new(ino, ItemType::Extent, 0))?;
        Ok(v.is_some_and(|v| v.first() == Some(&EXTENT_INLINE)))
    }

    /// Writes `data` at `off`. Returns the new inode.
    pub fn write_data(&mut self, ino: Ino, off: u64, data: &[u8]) -> Result<InodeItem> {
        let it = self.inode(ino)?;
        let size = it.size.get();
        let end = off + data.len() as u64;
        let inline_max = inline_max(self.store.node_size) as u64;
        // An empty file with no extents starts inline; one with preallocated blocks does not.
        let inline_now =
            self.has_inline(ino)? || (size == 0 && self.extents(ino, 0, u64::MAX)?.is_empty());
        let gen = self.store.generation;
        if inline_now && end <= inline_max {
            let mut cur = self.read_data(ino, &it, 0, size as usize)?;
            cur.resize(size.max(end) as usize, 0);
            cur[off as usize..end as usize].copy_from_slice(data);
            let ext = ExtentItem {
                kind: EXTENT_INLINE,
                reserved: [0; 7],
                generation: gen.into(),
                disk_block: 0.into(),
                blocks: 0.into(),
            };
            let mut v = ext.as_bytes().to_vec();
            v.extend_from_slice(&cur);
            self.fs_tree
                .put(&mut self.store, Key::new(ino, ItemType::Extent, 0), v)?;
            let now = self.now();
            return self.modify_inode(ino, |i| {
                i.size = (cur.len() as u64).into();
                i.mtime = now;
                i.ctime = now;
            });
        }
        // Block-granular copy-on-write of [b0, b1).
        let b0 = off / BS;
        let b1 = end.div_ceil(BS);
        let nblocks = b1 - b0;
        let mut buf = vec![0u8; (nblocks * BS) as usize];
        let head = (off - b0 * BS) as usize;
        if head > 0 || (!end.is_multiple_of(BS) && end < size) || inline_now {
            // Partial first/last block (or inline data moving out): start from what is there.
            let old = self.read_data(ino, &it, b0 * BS, buf.len())?;
            buf[..old.len()].copy_from_slice(&old);
        }
        buf[head..head + data.len()].copy_from_slice(data);
        // Allocate before touching any tree, so running out of space changes nothing.
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut got = 0;
        while got < nblocks {
            match self
                .store
                .alloc
                .alloc(1, (nblocks - got).min(MAX_EXTENT_BLOCKS), Kind::Data)
            {
                Some((s, n)) => {
                    runs.push((s, n));
                    got += n;
                }
                None => {
                    for (s, n) in runs {
                        // Just allocated by us: marked used, so this cannot fail.
                        let _ = self.store.alloc.free(s, n, true);
                    }
                    return Err(Error::NoSpace);
                }
            }
        }
        let mut at = 0usize;
        for &(s, n) in &runs {
            let len = (n * BS) as usize;
            if let Err(e) = self.store.dev.write_at(&buf[at..at + len], s * BS) {
                for (s, n) in runs {
                    // Just allocated by us: marked used, so this cannot fail.
                    let _ = self.store.alloc.free(s, n, true);
                }
                return Err(e.into());
            }
            at += len;
        }
        self.store.data_unflushed = true;
        let freed = if inline_now {
            self.punch(ino, 0, u64::MAX)?
        } else {
            self.punch(ino, b0 * BS, b1 * BS)?
        };
        let mut fo = b0 * BS;
        for &(s, n) in &runs {
            let ext = ExtentItem {
                kind: EXTENT_REGULAR,
                reserved: [0; 7],
                generation: gen.into(),
                disk_block: s.into(),
                blocks: n.into(),
            };
            self.fs_tree.insert(
                &mut self.store,
                Key::new(ino, ItemType::Extent, fo),
                ext.as_bytes().to_vec(),
            )?;
            fo += n * BS;
        }
        let now = self.now();
        self.modify_inode(ino, |i| {
            i.size = i.size.get().max(end).into();
            i.alloc_bytes = (i.alloc_bytes.get() + nblocks * BS)
                .saturating_sub(freed * BS)
                .into();
            i.mtime = now;
            i.ctime = now;
        })
    }

    /// Sets the file size, freeing blocks past it and zeroing the tail of a partial last block.
    pub fn truncate(&mut self, ino: Ino, new_size: u64) -> Result<InodeItem> {
        let it = self.inode(ino)?;
        let size = it.size.get();
        if new_size < size {
            if self.has_inline(ino)? {
                self.punch(ino, new_size, u64::MAX)?;
            } else {
                let keep_end = new_size.div_ceil(BS) * BS;
                let freed = self.punch(ino, keep_end, u64::MAX)?;
                self.modify_inode(ino, |i| {
                    i.alloc_bytes = i.alloc_bytes.get().saturating_sub(freed * BS).into()
                })?;
                if !new_size.is_multiple_of(BS) {
                    // Zero the rest of the last block so a later extension reads zeros.
                    let blk_start = new_size / BS * BS;
                    let it = self.inode(ino)?;
                    let has = !self.extents(ino, blk_start, blk_start + BS)?.is_empty();
                    if has {
                        let mut b =
                            self.read_data(ino, &it, blk_start, (new_size - blk_start) as usize)?;
                        b.resize(BS as usize, 0);
                        // Writing the whole block rewrites it; then shrink the size back.
                        self.write_data(ino, blk_start, &b)?;
                    }
                }
            }
        } else if new_size > size
            && self.has_inline(ino)?
            && new_size > inline_max(self.store.node_size) as u64
        {
            // Growing past the inline limit: move the data out to a block first.
            let it = self.inode(ino)?;
            let cur = self.read_data(ino, &it, 0, size as usize)?;
            self.write_data_force_blocks(ino, &cur)?;
        }
        let now = self.now();
        self.modify_inode(ino, |i| {
            i.size = new_size.into();
            i.mtime = now;
            i.ctime = now;
        })
    }

    pub(crate) fn write_data_force_blocks(&mut self, ino: Ino, cur: &[u8]) -> Result<()> {
        // Write one block's worth (zero padded) so the inline path is not taken.
        let mut b = cur.to_vec();
        b.resize(BS as usize, 0);
        self.write_data(ino, 0, &b)?;
        Ok(())
    }

    /// Updates the access time after a read, as the atime policy says. Best effort: on a
    /// read-only or full file system the read succeeds and the time stays.
    pub(crate) fn touch_atime(&mut self, ino: Ino, it: &InodeItem) {
        let now = self.now();
        let due = match self.atime {
            Atime::NoAtime => false,
            Atime::Strict => true,
            Atime::Relatime => {
                let a = (it.atime.sec.get(), it.atime.nsec.get());
                let m = (it.mtime.sec.get(), it.mtime.nsec.get());
                let c = (it.ctime.sec.get(), it.ctime.nsec.get());
                a <= m || a <= c || now.sec.get() - a.0 >= 24 * 3600
            }
        };
        if !due || self.writable().is_err() || self.reserve(1, Reserve::Shrink).is_err() {
            return;
        }
        if self.modify_inode(ino, |i| i.atime = now).is_ok() {
            self.changed = true;
        }
    }

    /// Number of extent items of an inode (to reserve space for deleting them).
    pub fn extent_count(&mut self, ino: Ino) -> Result<u64> {
        Ok(self.extents(ino, 0, u64::MAX)?.len() as u64)
    }

    /// How many extent items `ino` (item `it`) may have, never fewer than it has: what a
    /// reservation needs. A file with no blocks allocated has at most its inline extent, so it
    /// needs no search.
    pub fn extent_items_bound(&mut self, ino: Ino, it: &InodeItem) -> Result<u64> {
        if it.alloc_bytes.get() == 0 {
            return Ok(1);
        }
        self.extent_count(ino)
    }

    /// Frees all data of an inode being deleted.
    pub fn free_all_data(&mut self, ino: Ino) -> Result<()> {
        self.punch(ino, 0, u64::MAX).map(|_| ())
    }
}

pub(crate) fn check_regular(it: &InodeItem) -> Result<()> {
    match it.mode.get() & S_IFMT {
        S_IFREG => Ok(()),
        S_IFDIR => Err(Error::IsDir),
        _ => Err(Error::Invalid("not a regular file")),
    }
}

impl Fs {
    /// Reads up to `len` bytes at `off`; short at end of file.
    pub fn read(&self, ino: Ino, off: u64, len: usize) -> Result<Vec<u8>> {
        let mut g = self.lock();
        let it = g.inode(ino)?;
        check_regular(&it)?;
        let data = g.read_data(ino, &it, off, len)?;
        g.touch_atime(ino, &it);
        Ok(data)
    }

    /// Writes `data` at `off`; returns bytes written (all of them, or an error). Sets the
    /// modification and change times.
    pub fn write(&self, ino: Ino, off: u64, data: &[u8]) -> Result<usize> {
        self.write_impl(ino, off, data, true)
    }

    /// `write` that leaves the modification and change times alone: for a front end whose
    /// kernel keeps those times itself and sends them with setattr (FUSE's writeback cache,
    /// where a write request may arrive after the times it should not override).
    pub fn write_keep_times(&self, ino: Ino, off: u64, data: &[u8]) -> Result<usize> {
        self.write_impl(ino, off, data, false)
    }

    fn write_impl(&self, ino: Ino, off: u64, data: &[u8], times: bool) -> Result<usize> {
        if off
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > MAX_FILE_SIZE)
        {
            return Err(Error::FileTooBig);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let blocks = (data.len() as u64).div_ceil(BS) + 2;
        let items = 8 + 2 * blocks.div_ceil(MAX_EXTENT_BLOCKS);
        self.write_op(0, Reserve::Grow, |g| {
            let it = g.inode(ino)?;
            check_regular(&it)?;
            // Existing extents in the range are rewritten or trimmed: up to two item changes each.
            let touched = g
                .extents(
                    ino,
                    off / BS * BS,
                    (off + data.len() as u64).div_ceil(BS) * BS,
                )?
                .len() as u64;
            g.reserve_blocks(items + touched * 2, blocks, Reserve::Grow)?;
            g.write_data(ino, off, data)?;
            if !times {
                g.modify_inode(ino, |i| {
                    i.mtime = it.mtime;
                    i.ctime = it.ctime;
                })?;
            }
            Ok(data.len())
        })
    }

    /// Sets a regular file's size.
    pub fn truncate(&self, ino: Ino, size: u64) -> Result<Attr> {
        if size > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        self.write_op(0, Reserve::Shrink, |g| {
            let it = g.inode(ino)?;
            check_regular(&it)?;
            let extents = g.extents(ino, size / BS * BS, u64::MAX)?.len() as u64;
            g.reserve_blocks(16 + extents * 2, 2, Reserve::Shrink)?;
            let it = g.truncate(ino, size)?;
            Ok(Attr::from_item(ino, &it))
        })
    }
}
