//! File data: small files inline in their extent item, larger ones in extents of whole blocks.
//!
//! Writes are copy-on-write: the new data goes to newly allocated blocks, then the extent items
//! are changed to point at them, and the old blocks are freed (pinned until the commit is
//! durable). A crash before the commit leaves the old data and the old extents intact. The
//! exceptions, preallocated blocks and NOCOW files, are written in place (`in_place`).
//!
//! Adjacent extents merge: new blocks that continue both the file range and the disk range of
//! the extent before (or after) them extend it instead of adding an item, so a file written
//! front to back in small pieces (`dd bs=4k`) keeps about one extent per 32 MiB.
//!
//! Freeing is bounded: a range of extents goes in batches of one leaf each
//! (`Tree::delete_batch`), and an operation that frees many reserves space per batch, not per
//! extent, committing between batches when space runs short (`punch_batched`). A truncate that
//! takes more than one batch records a `Trim` orphan first, so a commit (and a crash) between
//! its batches leaves a state the next open finishes: the size already cut, the extents past
//! it still being freed, never visible (`trim_past_size`).
use super::data_sum::{sums_of, SumCheck};
use super::{Atime, Attr, Fs, Inner, Ino, Reserve};
use crate::btree::Change;
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::space::Kind;
use idxfs_blockdev::BlockDevice;
use idxfs_format::items::{
    decode_extent, ExtentItem, InodeItem, OrphanKind, EXTENT_INLINE, EXTENT_REGULAR, S_IFDIR,
    S_IFLNK, S_IFMT, S_IFREG,
};
use idxfs_format::node::max_item_size;
use idxfs_format::{Corrupt, ItemType, Key, BLOCK_SIZE, SYMLINK_MAX};
use zerocopy::IntoBytes;

const BS: u64 = BLOCK_SIZE;
/// Largest file: keeps every block index and byte offset far from overflow.
pub const MAX_FILE_SIZE: u64 = 1 << 50;
/// Largest extent, in blocks: keeps any single write's allocation bounded, and is where
/// merging stops.
pub(crate) const MAX_EXTENT_BLOCKS: u64 = 8192;
/// Items one freeing batch removes at most (they all come from one leaf anyway).
pub(crate) const FREE_BATCH_ITEMS: usize = 512;

/// Largest inline file for a node size.
pub fn inline_max(node_size: u32) -> usize {
    (max_item_size(node_size) - idxfs_format::items::EXTENT_ITEM_SIZE).min(2048)
}

/// Largest inline symlink target for a node size; longer ones take a block.
pub fn inline_symlink_max(node_size: u32) -> usize {
    max_item_size(node_size) - idxfs_format::items::EXTENT_ITEM_SIZE
}

/// A read's bytes as the tree mapped them: how many there are, the inline bytes, and the
/// blocks to read from the device with their checksums; every byte neither covers (a hole,
/// a preallocated extent) reads as zero.
pub(crate) struct ReadMap {
    pub ino: Ino,
    /// Bytes the read returns (clamped to the file size).
    pub len: usize,
    /// Inline bytes and where they go, in order.
    pub inline: Vec<(usize, Vec<u8>)>,
    /// Device pieces, in order.
    pub pieces: Vec<ReadPiece>,
}

/// Bytes of a regular extent a read still needs from the device.
pub(crate) struct ReadPiece {
    /// Where they go in the read's buffer, and how many.
    pub at: usize,
    pub len: usize,
    /// Device byte offset.
    pub disk: u64,
    /// The file block holding the first byte, and the sums of the blocks the piece touches
    /// (`data_sum`), from that one on.
    pub file_block: u64,
    pub sums: Vec<Option<u32>>,
}

impl ReadMap {
    /// Reads the mapped bytes into a new buffer, each block checked against its sum.
    pub fn fill(self, dev: &dyn BlockDevice, counters: &Counters) -> Result<Vec<u8>> {
        self.fill_with(dev, counters, true)
    }

    /// `fill`; a mismatch is counted and logged only with `report` (`SumCheck::report`).
    pub fn fill_with(
        self,
        dev: &dyn BlockDevice,
        counters: &Counters,
        report: bool,
    ) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; self.len];
        self.fill_into(&mut buf, dev, counters, report)?;
        Ok(buf)
    }

    /// Writes the read's `len` bytes into the front of `out` (at least that long), the
    /// device's checked against their sums, zeros where nothing is mapped; every one of
    /// them is written, whatever `out` held. A read into a buffer the caller sends on (a
    /// FUSE reply) costs no buffer of its own and no copy.
    pub fn fill_into(
        &self,
        out: &mut [u8],
        dev: &dyn BlockDevice,
        counters: &Counters,
        report: bool,
    ) -> Result<()> {
        debug_assert!(out.len() >= self.len, "a buffer shorter than the read");
        let out = &mut out[..self.len];
        let check = SumCheck {
            ino: self.ino,
            counters,
            report,
        };
        // What is mapped, in order; the gaps between are zeros. Extents of a sound image do
        // not overlap, and a damaged image's that do only leave less to zero.
        let mut covered: Vec<(usize, usize)> = self
            .inline
            .iter()
            .map(|(at, b)| (*at, b.len()))
            .chain(self.pieces.iter().map(|p| (p.at, p.len)))
            .collect();
        covered.sort_unstable();
        let mut zero_from = 0;
        for &(at, len) in &covered {
            out[zero_from.min(at)..at].fill(0);
            zero_from = zero_from.max(at + len);
        }
        out[zero_from.min(self.len)..].fill(0);
        for (at, b) in &self.inline {
            out[*at..*at + b.len()].copy_from_slice(b);
        }
        for p in &self.pieces {
            check.read(
                dev,
                &mut out[p.at..p.at + p.len],
                p.disk,
                p.file_block,
                &p.sums,
            )?;
        }
        Ok(())
    }
}

/// One extent as found in the tree.
#[derive(Debug, Clone)]
pub(crate) struct Ext {
    pub offset: u64,
    pub item: ExtentItem,
    pub inline: Vec<u8>,
}

impl Ext {
    /// Whether two lists name the same extents (same place in the file and on disk, same
    /// generation and kind): the same bytes, unless a write went into them in place
    /// (`InPlace::seq` says whether one did).
    pub fn same(a: &[Ext], b: &[Ext]) -> bool {
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| {
                x.offset == y.offset
                    && x.item.as_bytes() == y.item.as_bytes()
                    && x.inline == y.inline
            })
    }

    pub fn len_bytes(&self) -> u64 {
        if self.item.kind == EXTENT_INLINE {
            self.inline.len() as u64
        } else {
            self.item.blocks.get() * BS
        }
    }

    fn end(&self) -> u64 {
        self.offset + self.len_bytes()
    }
}

pub(super) fn extent_key(ino: Ino, offset: u64) -> Key {
    Key::new(ino, ItemType::Extent, offset)
}

impl Inner {
    /// Extents that overlap [start, end), in order.
    pub(crate) fn extents(&mut self, ino: Ino, start: u64, end: u64) -> Result<Vec<Ext>> {
        let mut out = Vec::new();
        self.each_extent(ino, start, end, |e| {
            out.push(e);
            true
        })?;
        Ok(out)
    }

    /// Visits the extents that overlap [start, end), in order, until `visit` returns false:
    /// a caller that wants the first extent with some property reads as far as that one
    /// (`Fs::seek`), not to `end`.
    pub(crate) fn each_extent(
        &mut self,
        ino: Ino,
        start: u64,
        end: u64,
        mut visit: impl FnMut(Ext) -> bool,
    ) -> Result<()> {
        let tree = self.fs_tree;
        let total = self.store.total_blocks;
        let lo = extent_key(ino, 0);
        let from = match tree.last_at_or_before(&mut self.store, lo, extent_key(ino, start))? {
            Some((k, _)) => k,
            None => extent_key(ino, start),
        };
        let mut err = None;
        tree.scan(
            &mut self.store,
            from,
            extent_key(ino, end),
            |k, v| match decode_extent(v, format_args!("extent {k}"), total) {
                Ok((item, rest)) => {
                    let e = Ext {
                        offset: k.offset,
                        item,
                        inline: rest.to_vec(),
                    };
                    Ok(e.end() <= start || visit(e))
                }
                Err(c) => {
                    err = Some(c);
                    Ok(false)
                }
            },
        )?;
        match err {
            Some(c) => Err(c.into()),
            None => Ok(()),
        }
    }

    /// Whether `ino` has an extent at or past byte `from` (one at most is read).
    pub(crate) fn has_extent_from(&mut self, ino: Ino, from: u64) -> Result<bool> {
        let tree = self.fs_tree;
        let mut any = false;
        tree.scan(
            &mut self.store,
            extent_key(ino, from),
            extent_key(ino, u64::MAX),
            |_, _| {
                any = true;
                Ok(false)
            },
        )?;
        Ok(any)
    }

    /// Whether `ino` has an extent at or past byte `from` (block-aligned), or a data sum
    /// group wholly past it: what `trim_past_size` has left to free once the sums of the
    /// group holding `from` were cut there (`clear_sum_edges`), which keeps that group's
    /// item for the blocks below.
    fn has_data_from(&mut self, ino: Ino, from: u64) -> Result<bool> {
        if self.has_extent_from(ino, from)? {
            return Ok(true);
        }
        if !self.may_have_sums() {
            return Ok(false);
        }
        let g = (from / BS).div_ceil(idxfs_format::items::SUM_GROUP_BLOCKS);
        let tree = self.fs_tree;
        let mut any = false;
        tree.scan(
            &mut self.store,
            super::data_sum::sum_key(ino, g),
            super::data_sum::sum_key(ino, u64::MAX),
            |_, _| {
                any = true;
                Ok(false)
            },
        )?;
        Ok(any)
    }

    /// Reads up to `len` bytes at `off`, clamped to the file size.
    pub fn read_data(&mut self, ino: Ino, it: &InodeItem, off: u64, len: usize) -> Result<Vec<u8>> {
        self.map_read(ino, it, off, len)?
            .fill(self.store.dev.as_ref(), &self.store.counters)
    }

    /// What a read of up to `len` bytes at `off` (clamped to the file size) returns, as the
    /// tree maps it now: inline bytes and holes filled, the blocks still to read.
    pub(crate) fn map_read(
        &mut self,
        ino: Ino,
        it: &InodeItem,
        off: u64,
        len: usize,
    ) -> Result<ReadMap> {
        let size = it.size.get();
        let mut map = ReadMap {
            ino,
            len: 0,
            inline: Vec::new(),
            pieces: Vec::new(),
        };
        if off >= size {
            return Ok(map);
        }
        let end = size.min(off.saturating_add(len as u64));
        map.len = (end - off) as usize;
        let exts = self.extents(ino, off, end)?;
        let sb0 = off / BS;
        let sums = if exts.iter().any(|e| e.item.kind == EXTENT_REGULAR) {
            self.block_sums(ino, sb0, end.div_ceil(BS))?
        } else {
            Vec::new()
        };
        for e in exts {
            let (a, b) = (e.offset.max(off), e.end().min(end));
            if a >= b {
                continue;
            }
            let at = (a - off) as usize;
            if e.item.kind == EXTENT_INLINE {
                let bytes = e.inline[(a - e.offset) as usize..(b - e.offset) as usize].to_vec();
                map.inline.push((at, bytes));
            } else if e.item.kind == EXTENT_REGULAR {
                let disk = e.item.disk_block.get() * BS + (a - e.offset);
                let (f0, f1) = (a / BS, b.div_ceil(BS));
                map.pieces.push(ReadPiece {
                    at,
                    len: (b - a) as usize,
                    disk,
                    file_block: f0,
                    sums: sums[(f0 - sb0) as usize..(f1 - sb0) as usize].to_vec(),
                });
            }
            // Prealloc extents read as zeros, as holes do (`ReadMap::fill_into`).
        }
        Ok(map)
    }

    /// Whether `ino` (item `it`) keeps its data inline. Checks what the image says before
    /// anything sizes a buffer by it: an inline file is never larger than an item can hold.
    pub(crate) fn is_inline(&mut self, ino: Ino, it: &InodeItem) -> Result<bool> {
        let tree = self.fs_tree;
        let inline = tree
            .with(&mut self.store, &extent_key(ino, 0), |v| {
                v.first() == Some(&EXTENT_INLINE)
            })?
            .unwrap_or(false);
        let limit = if it.mode.get() & S_IFMT == S_IFLNK {
            inline_symlink_max(self.store.node_size)
        } else {
            inline_max(self.store.node_size)
        } as u64;
        if inline && it.size.get() > limit {
            return Err(Corrupt::new(
                format!("inode {ino} size"),
                it.size.get(),
                format!("<= {limit} (its data is inline)"),
            )
            .into());
        }
        Ok(inline)
    }

    /// Lets go of the blocks of a removed extent item (freeing those no other extent names,
    /// `shared`); returns how many it named. Data of this transaction is reusable at once,
    /// unless an fsync batch may name it (`crate::log`).
    pub(crate) fn free_extent_item(&mut self, k: &Key, v: &[u8]) -> Result<u64> {
        let (e, _) = decode_extent(v, format_args!("extent {k}"), self.store.total_blocks)?;
        if e.kind == EXTENT_INLINE {
            return Ok(0);
        }
        let now = e.generation.get() == self.store.generation && !self.log.frees_must_wait();
        let n = e.blocks.get();
        self.release(e.disk_block.get(), n, now, e.generation.get())?;
        Ok(n)
    }

    /// Cuts the extents that straddle `start` or `end` so that every extent lies wholly inside
    /// [start, end) or wholly outside, freeing the blocks cut off; returns how many. At most
    /// two extents change: a bounded step. `start` is block-aligned (regular extents cover
    /// whole blocks); `end` is rounded up to a block.
    fn trim_edges(&mut self, ino: Ino, start: u64, end: u64) -> Result<u64> {
        if !start.is_multiple_of(BS) {
            return Err(Error::Invalid(
                "engine bug: unaligned punch of block extents",
            ));
        }
        let end = end.div_ceil(BS).saturating_mul(BS);
        let mut freed = 0;
        let mut edges = vec![start];
        if end > start && end < u64::MAX / 2 {
            edges.push(end);
        }
        for at in edges {
            let Some(e) = self
                .extents(ino, at.saturating_sub(1), at)?
                .into_iter()
                .find(|e| e.offset < at && e.end() > at)
            else {
                continue;
            };
            if e.item.kind == EXTENT_INLINE {
                return Err(Corrupt::new(
                    format!("inode {ino} extents"),
                    "inline data beside block extents",
                    "one or the other",
                )
                .into());
            }
            // Split at `at`: the part inside [start, end) goes, the rest stays as one or two
            // extents.
            let (eb, en) = (e.item.disk_block.get(), e.item.blocks.get());
            let cut_a = start.max(e.offset);
            let cut_b = end.min(e.end());
            let (head, tail) = ((cut_a - e.offset) / BS, (cut_b - e.offset) / BS);
            let now =
                e.item.generation.get() == self.store.generation && !self.log.frees_must_wait();
            if tail > head {
                self.release(eb + head, tail - head, now, e.item.generation.get())?;
                freed += tail - head;
            }
            let key = extent_key(ino, e.offset);
            if head > 0 {
                let mut h = e.item;
                h.blocks = head.into();
                self.fs_tree
                    .put(&mut self.store, key, h.as_bytes().to_vec())?;
            } else {
                self.fs_tree.delete(&mut self.store, &key)?;
            }
            if tail < en {
                let mut t = e.item;
                t.disk_block = (eb + tail).into();
                t.blocks = (en - tail).into();
                self.fs_tree.insert(
                    &mut self.store,
                    extent_key(ino, e.offset + tail * BS),
                    t.as_bytes().to_vec(),
                )?;
            }
        }
        Ok(freed)
    }

    /// One batch of freeing [start, end) after `trim_edges` and `clear_sum_edges`: the
    /// extents of one leaf, and the data sums of one more (`data_sum`). Returns (blocks
    /// freed, whether more may remain).
    fn free_batch(&mut self, ino: Ino, start: u64, end: u64) -> Result<(u64, bool)> {
        let (freed, more) = self.punch_batch(ino, start, end)?;
        let sums = self.clear_sum_batch(ino, start / BS, end.div_ceil(BS))?;
        Ok((freed, more || sums))
    }

    /// `trim_edges`, and the sums of the blocks it cuts off or leaves in the range taken
    /// where a group item is shared with blocks outside it.
    fn trim_edges_and_sums(&mut self, ino: Ino, start: u64, end: u64) -> Result<u64> {
        let freed = self.trim_edges(ino, start, end)?;
        self.clear_sum_edges(ino, start / BS, end.div_ceil(BS))?;
        Ok(freed)
    }

    /// One batch of freeing [start, end) after `trim_edges`: the extents of one leaf. Returns
    /// (blocks freed, whether more remain).
    fn punch_batch(&mut self, ino: Ino, start: u64, end: u64) -> Result<(u64, bool)> {
        let batch = self.free_batch_items();
        let removed = self.fs_tree.delete_batch(
            &mut self.store,
            extent_key(ino, start),
            extent_key(ino, end),
            batch,
        )?;
        if !removed.is_empty() {
            Counters::inc(&self.store.counters.free_batches);
        }
        let mut freed = 0;
        for (k, v) in &removed {
            freed += self.free_extent_item(k, v)?;
        }
        Ok((freed, !removed.is_empty()))
    }

    fn sub_alloc(&mut self, ino: Ino, freed: u64) -> Result<()> {
        if freed > 0 {
            self.modify_inode(ino, |i| {
                i.alloc_bytes = i.alloc_bytes.get().saturating_sub(freed * BS).into()
            })?;
        }
        Ok(())
    }

    /// Removes the block extents in [start, end) in one go: for ranges whose extents the
    /// caller's reservation already covers (a write replaces at most a request's worth).
    /// The range's data sums stay: the caller links new blocks there and gives every one of
    /// them its sum (`put_sums`, which with sums off takes the old ones away).
    pub(crate) fn punch_now(&mut self, ino: Ino, start: u64, end: u64) -> Result<()> {
        let mut freed = self.trim_edges(ino, start, end)?;
        loop {
            let (f, more) = self.punch_batch(ino, start, end)?;
            freed += f;
            if !more {
                break;
            }
        }
        self.sub_alloc(ino, freed)
    }

    /// Removes the block extents in [start, end) in bounded batches, reserving space for each
    /// (a commit between batches recycles what the last ones freed). After each batch the
    /// state is whole (a checkpoint): an error then leaves a partly freed range, as a crash
    /// would, never a half-applied change. Ok(false): stopped for lack of space.
    pub(crate) fn punch_batched(&mut self, ino: Ino, start: u64, end: u64) -> Result<bool> {
        let freed = self.trim_edges_and_sums(ino, start, end)?;
        self.sub_alloc(ino, freed)?;
        self.checkpoint();
        loop {
            if self.policy.knobs.commit_between_batches {
                self.commit()?;
            }
            // Two leaves: one of extents, one of sums.
            if self.reserve(2, Reserve::Shrink).is_err() {
                return Ok(false);
            }
            let (f, more) = self.free_batch(ino, start, end)?;
            self.sub_alloc(ino, f)?;
            self.checkpoint();
            if !more {
                return Ok(true);
            }
        }
    }

    /// Frees the extents past the block holding byte `size` (the size was just cut to it):
    /// in one batch when they fit, else under a `Trim` orphan, so that a commit between
    /// batches, and a crash after it, leaves a state the next open finishes. The batches
    /// after the first run once the operation returns, each an operation of its own
    /// (`Fs::release_orphans`, `trim_batch`), so other operations go on between them: a
    /// truncate of a file of millions of extents does not hold the lock for all of them.
    /// Nothing past the size can be seen meanwhile, and whatever would make it visible (a
    /// write, truncate, preallocation or copy past the size) finishes the trim first.
    /// Ok(false): space ran out first; the orphan stays and `finish_trim` completes it later.
    pub(crate) fn trim_past_size(&mut self, ino: Ino, size: u64) -> Result<bool> {
        let from = size.div_ceil(BS) * BS;
        if !self.free_past(ino, from)? {
            return Ok(true);
        }
        if self.lives.orphans.is_free(ino) {
            // Unlinked (an orphan already): freed whole later, but a write past the size
            // checks only for a `Trim` orphan, so what is past the size goes now.
            self.checkpoint();
            return self.finish_trim(ino);
        }
        self.require_incompat(idxfs_format::versions::INCOMPAT_ORPHAN_TRIM);
        self.lives.orphans.add(ino, OrphanKind::Trim);
        Counters::inc(&self.store.counters.trim_orphans);
        self.lives.release.push(ino);
        Ok(true)
    }

    /// One batch of what a `Trim` orphan of `ino` says is left (its own operation, from
    /// `Fs::free_orphans`); drops the orphan when that was the last. Returns whether the
    /// trim is done.
    pub(crate) fn trim_batch(&mut self, ino: Ino) -> Result<bool> {
        if self.policy.knobs.commit_between_batches {
            self.commit()?;
        }
        let from = self.inode(ino)?.size.get().div_ceil(BS) * BS;
        // Two leaves: one of extents, one of sums.
        self.reserve(2, Reserve::Shrink)?;
        Counters::inc(&self.store.counters.trim_batches);
        if self.free_past(ino, from)? {
            return Ok(false);
        }
        self.drop_orphan(ino)?;
        Ok(true)
    }

    /// One batch of freeing past byte `from` (block-aligned): the edges and sums there, then
    /// the extents of one leaf. Returns whether anything is left past `from`.
    fn free_past(&mut self, ino: Ino, from: u64) -> Result<bool> {
        let freed = self.trim_edges_and_sums(ino, from, u64::MAX)?;
        let (f, more) = self.free_batch(ino, from, u64::MAX)?;
        self.sub_alloc(ino, freed + f)?;
        Ok(more && self.has_data_from(ino, from)?)
    }

    /// Frees what a `Trim` orphan of `ino` says is left, in batches; drops the orphan when
    /// done. Ok(false): space ran out first (the orphan stays).
    pub(crate) fn finish_trim(&mut self, ino: Ino) -> Result<bool> {
        let size = self.inode(ino)?.size.get();
        let from = size.div_ceil(BS) * BS;
        if !self.punch_batched(ino, from, u64::MAX)? {
            return Ok(false);
        }
        if self.lives.orphans.kind(ino) == Some(OrphanKind::Trim) {
            self.drop_orphan(ino)?;
        }
        Ok(true)
    }

    /// Moves an inline file's bytes into a block of their own at offset 0, keeping the size:
    /// a write or preallocation that ends past the inline limit starts from there.
    pub(crate) fn move_inline_out(&mut self, ino: Ino) -> Result<()> {
        let it = self.inode(ino)?;
        let size = it.size.get();
        let mut b = self.read_data(ino, &it, 0, size as usize)?;
        b.resize(BS as usize, 0);
        // A whole block at 0 ends past the inline limit: the block path, which takes the
        // inline extent away.
        self.write_data(ino, 0, &b)?;
        self.modify_inode(ino, |i| i.size = size.into())?;
        Ok(())
    }

    /// Writes `data` at `off`. Returns the new inode.
    pub fn write_data(&mut self, ino: Ino, off: u64, data: &[u8]) -> Result<InodeItem> {
        let mut it = self.inode(ino)?;
        let size = it.size.get();
        let end = off + data.len() as u64;
        if end > size && self.trimming(ino) && !self.finish_trim(ino)? {
            // Extents past the size are not all freed yet; growing over them would show them.
            return Err(Error::NoSpace);
        }
        let inline_max = inline_max(self.store.node_size) as u64;
        let mut inline = self.is_inline(ino, &it)?;
        // An empty file with no extents starts inline; one with preallocated blocks does not.
        let empty = !inline && size == 0 && !self.has_extent_from(ino, 0)?;
        let gen = self.store.generation;
        if (inline || empty) && end <= inline_max {
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
            self.fs_tree.put(&mut self.store, extent_key(ino, 0), v)?;
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
        if inline && b0 > 0 {
            // The write leaves block 0 alone, so the inline bytes need a block of their own
            // first (reading back only the written blocks would lose them).
            self.move_inline_out(ino)?;
            // The same bytes, now in a block: a whole state, should what follows be refused.
            self.checkpoint();
            it = self.inode(ino)?;
            inline = false;
        }
        let nblocks = b1 - b0;
        let mut buf = vec![0u8; (nblocks * BS) as usize];
        let head = (off - b0 * BS) as usize;
        if head > 0 || (!end.is_multiple_of(BS) && end < it.size.get()) || inline {
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
                    self.unalloc(&runs);
                    return Err(Error::NoSpace);
                }
            }
        }
        let mut at = 0usize;
        for &(s, n) in &runs {
            let len = (n * BS) as usize;
            if let Err(e) = self.store.dev.write_at(&buf[at..at + len], s * BS) {
                self.unalloc(&runs);
                return Err(Error::WriteRefused(e));
            }
            at += len;
        }
        self.log.data_unflushed = true;
        if inline {
            // b0 == 0: the new block 0 holds the inline bytes now.
            self.fs_tree.delete(&mut self.store, &extent_key(ino, 0))?;
        } else {
            self.punch_now(ino, b0 * BS, b1 * BS)?;
        }
        let it = self.link_runs(ino, b0, &runs, end, true)?;
        self.put_sums(ino, b0, &sums_of(&buf))?;
        Ok(it)
    }

    /// Links new blocks (`runs`, in file order) as the file's data from block `b0`, where the
    /// range's old extents are gone already, then sets the size to at least `end`, counts the
    /// blocks, and with `times` sets the modification and change times. Returns the inode.
    pub(super) fn link_runs(
        &mut self,
        ino: Ino,
        b0: u64,
        runs: &[(u64, u64)],
        end: u64,
        times: bool,
    ) -> Result<InodeItem> {
        let gen = self.store.generation;
        let mut fo = b0 * BS;
        for &(s, n) in runs {
            self.insert_extent(ino, fo, s, n, gen)?;
            fo += n * BS;
        }
        let blocks: u64 = runs.iter().map(|r| r.1).sum();
        let now = self.now();
        self.modify_inode(ino, |i| {
            i.size = i.size.get().max(end).into();
            i.alloc_bytes = (i.alloc_bytes.get() + blocks * BS).into();
            if times {
                i.mtime = now;
                i.ctime = now;
            }
        })
    }

    /// Gives back blocks a failed write allocated a moment ago.
    fn unalloc(&mut self, runs: &[(u64, u64)]) {
        for &(s, n) in runs {
            // Just allocated by us and marked used: freeing cannot fail.
            let _ = self.store.alloc.free(s, n, true);
        }
    }

    /// Links `n` new blocks at `disk` as the file's data at `file_off`, where no extent is:
    /// extends the extent before when the new blocks continue it in the file and on disk, and
    /// takes in the one after on the same terms. A merged extent keeps the older generation,
    /// so freeing any part of it later waits for a commit (never too early), and stays inside
    /// one block group, as every allocation does (blocks are freed group by group). In a
    /// clone, extents on either side of its origin's generation never merge (`clones`).
    pub(super) fn insert_extent(
        &mut self,
        ino: Ino,
        file_off: u64,
        disk: u64,
        n: u64,
        gen: u64,
    ) -> Result<()> {
        let total = self.store.total_blocks;
        let gb = self.store.alloc.group_blocks;
        let one_group = |start: u64, len: u64| start / gb == (start + len - 1) / gb;
        let tree = self.fs_tree;
        let mut ext = ExtentItem {
            kind: EXTENT_REGULAR,
            reserved: [0; 7],
            generation: gen.into(),
            disk_block: disk.into(),
            blocks: n.into(),
        };
        let mut at = file_off;
        if file_off > 0 {
            let prev = tree.last_at_or_before(
                &mut self.store,
                extent_key(ino, 0),
                extent_key(ino, file_off - 1),
            )?;
            if let Some((k, v)) = prev {
                let (p, _) = decode_extent(&v, format_args!("extent {k}"), total)?;
                let pn = p.blocks.get();
                if p.kind == EXTENT_REGULAR
                    && k.offset + pn * BS == file_off
                    && p.disk_block.get() + pn == disk
                    && pn + n <= MAX_EXTENT_BLOCKS
                    && one_group(p.disk_block.get(), pn + n)
                    && self.snapshots.clones.same_side(p.generation.get(), gen)
                {
                    ext.disk_block = p.disk_block;
                    ext.blocks = (pn + n).into();
                    ext.generation = p.generation.get().min(gen).into();
                    at = k.offset;
                    Counters::inc(&self.store.counters.extent_merges);
                }
            }
        }
        let next_key = extent_key(ino, file_off + n * BS);
        if let Some(v) = tree.get(&mut self.store, &next_key)? {
            let (x, _) = decode_extent(&v, format_args!("extent {next_key}"), total)?;
            let (en, xn) = (ext.blocks.get(), x.blocks.get());
            if x.kind == EXTENT_REGULAR
                && x.disk_block.get() == disk + n
                && en + xn <= MAX_EXTENT_BLOCKS
                && one_group(ext.disk_block.get(), en + xn)
                && (self.snapshots.clones).same_side(ext.generation.get(), x.generation.get())
            {
                self.fs_tree.delete(&mut self.store, &next_key)?;
                ext.blocks = (en + xn).into();
                ext.generation = ext.generation.get().min(x.generation.get()).into();
            }
        }
        self.fs_tree.put(
            &mut self.store,
            extent_key(ino, at),
            ext.as_bytes().to_vec(),
        )
    }

    /// Sets the file size, freeing blocks past it and zeroing the tail of a partial last block.
    pub fn truncate(&mut self, ino: Ino, new_size: u64) -> Result<InodeItem> {
        let it = self.inode(ino)?;
        let size = it.size.get();
        let now = self.now();
        if new_size < size {
            if self.is_inline(ino, &it)? {
                let key = extent_key(ino, 0);
                let keep = idxfs_format::items::EXTENT_ITEM_SIZE + new_size as usize;
                self.fs_tree.update(&mut self.store, &key, |v| {
                    v.truncate(keep);
                    Change::Keep
                })?;
            } else {
                if !new_size.is_multiple_of(BS) {
                    // Zero the rest of the last block so a later extension reads zeros.
                    let blk_start = new_size / BS * BS;
                    let has = !self.extents(ino, blk_start, blk_start + BS)?.is_empty();
                    if has {
                        self.debug_assert_not_in_flight(ino, new_size);
                        let mut b =
                            self.read_data(ino, &it, blk_start, (new_size - blk_start) as usize)?;
                        b.resize(BS as usize, 0);
                        // Writing the whole block rewrites it; the size is set below.
                        self.write_data(ino, blk_start, &b)?;
                    }
                }
                self.modify_inode(ino, |i| {
                    i.size = new_size.into();
                    i.mtime = now;
                    i.ctime = now;
                })?;
                // Ok(false) leaves the rest to `finish_trim`: the size is cut already, and
                // nothing past it can be seen.
                self.trim_past_size(ino, new_size)?;
            }
        } else if new_size > size {
            if self.trimming(ino) && !self.finish_trim(ino)? {
                return Err(Error::NoSpace);
            }
            if self.is_inline(ino, &it)? && new_size > inline_max(self.store.node_size) as u64 {
                // Growing past the inline limit: move the data out to a block first.
                self.move_inline_out(ino)?;
            }
        }
        self.modify_inode(ino, |i| {
            i.size = new_size.into();
            i.mtime = now;
            i.ctime = now;
        })
    }

    /// Updates the access time after a read, as the atime policy says. Best effort: on a
    /// read-only or full file system the read succeeds and the time stays.
    pub(crate) fn touch_atime(&mut self, ino: Ino, it: &InodeItem) {
        let now = self.now();
        let due = match self.policy.atime {
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
            self.txn.changed = true;
        }
    }

    /// Reads a symlink's target, checking its size against the format's limit before any
    /// buffer is sized by it.
    pub(crate) fn read_link(&mut self, ino: Ino) -> Result<Vec<u8>> {
        let it = self.inode(ino)?;
        if it.mode.get() & S_IFMT != S_IFLNK {
            return Err(Error::Invalid("not a symlink"));
        }
        let size = it.size.get();
        if size == 0 || size > SYMLINK_MAX as u64 {
            return Err(Corrupt::new(
                format!("symlink {ino} size"),
                size,
                format!("1..={SYMLINK_MAX}"),
            )
            .into());
        }
        let target = self.read_data(ino, &it, 0, size as usize)?;
        if target.contains(&0) {
            return Err(Corrupt::new(
                format!("symlink {ino} target"),
                "a NUL byte",
                "no NUL (the target ends at its size)",
            )
            .into());
        }
        Ok(target)
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
    /// Sets a regular file's size.
    pub fn truncate(&self, ino: Ino, size: u64) -> Result<Attr> {
        if size > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        let r = self.write_op(0, Reserve::Shrink, super::Durable::Data, |g| {
            let it = g.inode(ino)?;
            check_regular(&it)?;
            // A cut inside a block copies its head: not while a write is writing it.
            if size < it.size.get() {
                g.refuse_in_flight_at(ino, size)?;
            }
            // The edges, a one-block rewrite of the last partial block, the size, and the
            // first batch; later batches reserve for themselves.
            g.reserve_blocks(super::reserve::DELETE_ITEMS, 2, Reserve::Shrink)?;
            let it = g.truncate(ino, size)?;
            Ok(Attr::from_item(ino, &it))
        });
        self.release_orphans();
        r
    }
}
