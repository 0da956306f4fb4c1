//! Where a file's data is: fallocate (preallocate, punch a hole) and lseek SEEK_DATA/SEEK_HOLE.
//!
//! Preallocated extents own blocks but read as zeros; a write over one is copy-on-write like any
//! other write (the preallocated blocks are freed when the new ones are linked). SEEK_DATA skips
//! preallocated extents, as ext4 does for unwritten extents.
//!
//! A hole punched over many extents is freed in bounded batches (`Inner::punch_batched`); a
//! commit between two batches (only when space runs short) and a crash after it leave the
//! range partly punched, as on ext4, whose punch also spans transactions.
//!
//! Every fallocate runs as a sequence of operations, each over the part of the range that
//! holds the next `SLICE_EXTENTS` extents (`Inner::slice_end`), so others go on between them:
//! as one operation, a fallocate over a file of many extents (which any user can make in
//! seconds) held the lock for all of them (docs/benchmarks.md, "Hostile shapes"). A range
//! with fewer extents (nearly every one) is one operation, as before. Each slice is a whole
//! fallocate of its part, so what another operation sees meanwhile is what the same call
//! over the first parts alone would leave, and an error in a slice leaves the earlier parts
//! done (as a crash in one would; ext4's own punch and preallocation also span
//! transactions). Every boundary between slices is an extent's start, so block-aligned:
//! only the range's own ends rewrite part of a block.
use super::file::{check_regular, inline_max, MAX_EXTENT_BLOCKS, MAX_FILE_SIZE};
use super::{
    privs, Attr, Durable, Fs, Inner, Ino, Kill, Reserve, Seek, FALLOC_KEEP_SIZE, FALLOC_PUNCH_HOLE,
    FALLOC_ZERO_RANGE,
};
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::space::Kind;
use idxfs_format::items::{ExtentItem, InodeItem, EXTENT_PREALLOC};
use idxfs_format::{Corrupt, ItemType, Key, BLOCK_SIZE};
use zerocopy::IntoBytes;

const BS: u64 = BLOCK_SIZE;
/// Extents one operation of a fallocate covers (`slice_end`): as many as a copy's batch
/// (`clone::CLONE_BATCH_BLOCKS`) names at most.
pub const SLICE_EXTENTS: usize = 2048;

impl Inner {
    /// Where the part of [at, end) that one operation of a fallocate covers ends: before the
    /// first of its extents past the first `SLICE_EXTENTS`, else `end`. Past `at` in a whole
    /// tree, where extents do not overlap: the second one counted starts where the first, which
    /// ends past `at`, ends or later. Extents that overlap are corruption, not a loop.
    fn slice_end(&mut self, ino: Ino, at: u64, end: u64) -> Result<u64> {
        let (mut seen, mut stop) = (0, end);
        self.each_extent(ino, at, end, |e| {
            seen += 1;
            if seen > SLICE_EXTENTS {
                stop = e.offset;
                return false;
            }
            true
        })?;
        if stop <= at {
            let what = format!("extents of inode {ino} from {at}");
            return Err(
                Corrupt::new(what, format!("one starting at {stop}"), "none overlapping").into(),
            );
        }
        Ok(stop)
    }

    /// Block ranges [start, end) in [b0, b1) that no extent covers.
    fn holes(&mut self, ino: Ino, b0: u64, b1: u64) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        let mut at = b0;
        for e in self.extents(ino, b0 * BS, b1 * BS)? {
            let (s, t) = (e.offset / BS, (e.offset + e.len_bytes()).div_ceil(BS));
            if s > at {
                out.push((at, s.min(b1)));
            }
            at = at.max(t);
        }
        if at < b1 {
            out.push((at, b1));
        }
        Ok(out)
    }

    /// Allocates preallocated extents over the holes in [off, off + len); returns the size the
    /// file will have (the caller sets it).
    fn preallocate(&mut self, ino: Ino, off: u64, len: u64, keep_size: bool) -> Result<u64> {
        let it = self.inode(ino)?;
        let size = it.size.get();
        let end = off + len;
        let new_size = if keep_size { size } else { size.max(end) };
        if new_size > size && self.trimming(ino) && !self.finish_trim(ino)? {
            return Err(Error::NoSpace);
        }
        let imax = inline_max(self.store.node_size) as u64;
        let inline = self.is_inline(ino, &it)?;
        let empty = !inline && size == 0 && !self.has_extent_from(ino, 0)?;
        if (inline || empty) && end <= imax && new_size <= imax {
            // Fits inline: zeros past the inline bytes are implied by the size.
            return Ok(new_size);
        }
        let (b0, b1) = (off / BS, end.div_ceil(BS));
        let holes = self.holes(ino, b0, b1)?;
        let need: u64 = holes.iter().map(|(s, t)| t - s).sum();
        // One extent per run: at most a run per MAX_EXTENT_BLOCKS, and per group crossed.
        let items: u64 = holes
            .iter()
            .map(|(s, t)| 2 * (t - s).div_ceil(MAX_EXTENT_BLOCKS) + 1)
            .sum();
        let run = self.run_nodes(items, items * 57);
        // One block more when the inline bytes move out first.
        let data = need + u64::from(inline);
        self.reserve_nodes(run + 4 * self.item_nodes(), data, Reserve::Grow)?;
        if inline {
            self.move_inline_out(ino)?;
            // The same bytes, now in a block: a whole state, should what follows be refused.
            self.checkpoint();
        }
        // Allocate everything before the first tree change, so ENOSPC changes nothing.
        let mut runs: Vec<(u64, u64, u64)> = Vec::new(); // (file block, disk block, blocks)
        for &(s, t) in &holes {
            let mut at = s;
            while at < t {
                match self
                    .store
                    .alloc
                    .alloc(1, (t - at).min(MAX_EXTENT_BLOCKS), Kind::Data)
                {
                    Some((d, n)) => {
                        runs.push((at, d, n));
                        at += n;
                    }
                    None => {
                        for &(_, d, n) in &runs {
                            // Just allocated by us and marked used: freeing cannot fail.
                            let _ = self.store.alloc.free(d, n, true);
                        }
                        return Err(Error::NoSpace);
                    }
                }
            }
        }
        let gen = self.store.generation;
        for &(fb, d, n) in &runs {
            let ext = ExtentItem {
                kind: EXTENT_PREALLOC,
                reserved: [0; 7],
                generation: gen.into(),
                disk_block: d.into(),
                blocks: n.into(),
            };
            self.fs_tree.insert(
                &mut self.store,
                Key::new(ino, ItemType::Extent, fb * BS),
                ext.as_bytes().to_vec(),
            )?;
        }
        self.modify_inode(ino, |i| {
            i.alloc_bytes = (i.alloc_bytes.get() + need * BS).into();
        })?;
        Ok(new_size)
    }

    /// FALLOC_FL_ZERO_RANGE: [off, off + len) reads as zeros and owns blocks, as after a
    /// punch and a preallocation of the same range, which is how it is done: the whole blocks
    /// inside go (copy-on-write keeps their old bytes for the last commit, so they cannot be
    /// turned into preallocated extents in place, as ext4 does) and preallocated ones come in
    /// their place; the partial blocks at the edges are zeroed. Returns the size the file will
    /// have (the caller sets it).
    ///
    /// Space for the new blocks is reserved before the first change, so ENOSPC changes
    /// nothing. Only a range of more extents than one batch frees, on a device where even
    /// that reservation's space then runs out between batches, can stop half-way: the range
    /// then reads as zeros in part, as after a crash in ext4's own zeroing.
    fn zero_range(&mut self, ino: Ino, off: u64, len: u64, keep_size: bool) -> Result<u64> {
        let (b0, b1) = (off / BS, (off + len).div_ceil(BS));
        let items = 2 * (b1 - b0).div_ceil(MAX_EXTENT_BLOCKS) + 1;
        let run = self.run_nodes(items, items * 57);
        // The new extents, the edges' copies and the cut extents (`punch_hole`'s items).
        let punch = super::reserve::DELETE_ITEMS + 4;
        self.reserve_nodes(run + punch * self.item_nodes(), b1 - b0 + 2, Reserve::Grow)?;
        self.punch_hole(ino, off, len)?;
        self.checkpoint();
        self.preallocate(ino, off, len, keep_size)
    }

    /// Zeroes [off, off + len) of file data, freeing the whole blocks inside it.
    fn punch_hole(&mut self, ino: Ino, off: u64, len: u64) -> Result<()> {
        let it = self.inode(ino)?;
        let size = it.size.get();
        let end = off + len;
        if self.is_inline(ino, &it)? {
            let e = end.min(size);
            if off < e {
                self.write_data(ino, off, &vec![0u8; (e - off) as usize])?;
            }
            return Ok(());
        }
        // Whole blocks inside the range go; the partial blocks at its edges are zeroed (only
        // below the size: past it, data already reads as zeros and stays so).
        let (w0, w1) = (off.div_ceil(BS), end / BS);
        let mut edges = Vec::new();
        if w0 > w1 {
            edges.push((off, end)); // within one block
        } else {
            edges.push((off, (w0 * BS).min(end)));
            edges.push(((w1 * BS).max(off), end));
        }
        for (a, b) in edges {
            let b = b.min(size);
            if a < b && !self.extents(ino, a, b)?.is_empty() {
                self.debug_assert_not_in_flight(ino, a);
                self.write_data(ino, a, &vec![0u8; (b - a) as usize])?;
            }
        }
        if w0 < w1 && !self.punch_batched(ino, w0 * BS, w1 * BS)? {
            // Out of space between batches: the range is partly punched (each batch left a
            // whole state), and the caller hears ENOSPC.
            return Err(Error::NoSpace);
        }
        // write_data never grows the size here (ranges are clamped to it).
        debug_assert_eq!(self.inode(ino)?.size.get(), size);
        Ok(())
    }
}

impl Fs {
    /// The most extents a fallocate of `ino` over `len` bytes from `off` can meet or make,
    /// from the inode alone (no tree walk; without the lock while it is published): the
    /// blocks the range covers, and for a punch no more than the file owns. A caller that
    /// would rather not wait for one operation per `SLICE_EXTENTS` of them where it runs
    /// asks first (the FUSE edge, `fuse/src/long.rs`).
    pub fn fallocate_extents_at_most(
        &self,
        ino: Ino,
        off: u64,
        len: u64,
        mode: u32,
    ) -> Result<u64> {
        let covered = off.saturating_add(len).div_ceil(BS) - off / BS;
        if mode & FALLOC_PUNCH_HOLE == 0 {
            // A preallocation or a zeroed range may make an extent per block it covers, in
            // free space cut that finely.
            return Ok(covered);
        }
        Ok(covered.min(owned_blocks(&self.getattr(ino)?)))
    }

    /// The most extents a truncate of `ino` to `size` can free (see
    /// `fallocate_extents_at_most`): none when it does not shrink the file, else no more than
    /// the blocks the file owns.
    pub fn truncate_extents_at_most(&self, ino: Ino, size: u64) -> Result<u64> {
        let a = self.getattr(ino)?;
        if size >= a.size {
            return Ok(0);
        }
        Ok(owned_blocks(&a))
    }

    /// fallocate(2): mode 0 allocates and may grow the size, `FALLOC_KEEP_SIZE` allocates past
    /// the size without changing it, `FALLOC_PUNCH_HOLE | FALLOC_KEEP_SIZE` frees a range,
    /// `FALLOC_ZERO_RANGE` (with or without `FALLOC_KEEP_SIZE`) makes a range read as zeros and
    /// allocates it (`Inner::zero_range`). Other modes (collapse, insert) are not supported.
    pub fn fallocate(&self, ino: Ino, off: u64, len: u64, mode: u32) -> Result<Attr> {
        self.fallocate_with(ino, off, len, mode, Kill::default())
    }

    /// `fallocate`, dropping set-user-ID and set-group-ID as `kill` says (`privs`).
    pub fn fallocate_with(
        &self,
        ino: Ino,
        off: u64,
        len: u64,
        mode: u32,
        kill: Kill,
    ) -> Result<Attr> {
        if len == 0 {
            return Err(Error::Invalid("fallocate of length 0"));
        }
        if off.checked_add(len).is_none_or(|e| e > MAX_FILE_SIZE) {
            return Err(Error::FileTooBig);
        }
        let (punch, zero) = match mode {
            0 | FALLOC_KEEP_SIZE => (false, false),
            m if m == FALLOC_PUNCH_HOLE | FALLOC_KEEP_SIZE => (true, false),
            m if m == FALLOC_PUNCH_HOLE => return Err(Error::Invalid("punch without keep-size")),
            m if m & !FALLOC_KEEP_SIZE == FALLOC_ZERO_RANGE => (false, true),
            _ => return Err(Error::NotSupported("this fallocate mode")),
        };
        let kind = if punch {
            Reserve::Shrink
        } else {
            Reserve::Grow
        };
        let end = off + len;
        let mut at = off;
        loop {
            let (attr, stop) = self.write_op(0, kind, Durable::Data, |g| {
                let it = g.inode(ino)?;
                check_regular(&it)?;
                let stop = g.slice_end(ino, at, end)?;
                let attr =
                    g.fallocate_part(ino, &it, (at, stop - at), (punch, zero), mode, kill)?;
                Ok((attr, stop))
            })?;
            if stop == end {
                return Ok(attr);
            }
            Counters::inc(&self.shared.counters.fallocate_slices);
            at = stop;
        }
    }
}

/// The blocks a file owns, its own or shared.
fn owned_blocks(a: &Attr) -> u64 {
    a.blocks.div_ceil(BS / 512)
}

impl Inner {
    /// One operation of `Fs::fallocate_with`: the fallocate of part `(off, len)` of its
    /// range; `it` is the file's inode (regular).
    fn fallocate_part(
        &mut self,
        ino: Ino,
        it: &InodeItem,
        (off, len): (u64, u64),
        (punch, zero): (bool, bool),
        mode: u32,
        kill: Kill,
    ) -> Result<Attr> {
        // A punch or a zeroed range from or to the middle of a block rewrites that
        // block in part: not while a write is writing it.
        if punch || zero {
            self.refuse_in_flight_at(ino, off)?;
            self.refuse_in_flight_at(ino, off + len)?;
        }
        let now = self.now();
        let mode_after = |m: u32| privs::after(m, kill);
        if punch {
            // The two partial blocks at the edges (their extents and sums), the cut
            // extents, the sums of the edge groups; the batches between them reserve for
            // themselves.
            self.reserve_blocks(super::reserve::DELETE_ITEMS, 2, Reserve::Shrink)?;
            self.punch_hole(ino, off, len)?;
            let it = self.modify_inode(ino, |i| {
                i.ctime = now;
                i.mtime = now;
                i.mode = mode_after(i.mode.get()).into();
            })?;
            return Ok(Attr::from_item(ino, &it));
        }
        let old = it.size.get();
        let keep_size = mode & FALLOC_KEEP_SIZE != 0;
        let new_size = if zero {
            self.zero_range(ino, off, len, keep_size)?
        } else {
            self.preallocate(ino, off, len, keep_size)?
        };
        let it = self.modify_inode(ino, |i| {
            i.ctime = now;
            i.mode = mode_after(i.mode.get()).into();
            if new_size != old || zero {
                i.size = new_size.into();
                i.mtime = now;
            }
        })?;
        Ok(Attr::from_item(ino, &it))
    }
}

impl Fs {
    /// lseek(2) SEEK_DATA / SEEK_HOLE from `off`. The end of the file counts as a hole.
    ///
    /// The extents are read from `off` only as far as the answer: a sparse copy (GNU cp)
    /// asks both questions once per data run, so reading on to the end of the file each time
    /// made copying a file of n extents cost n² extents read under the lock.
    pub fn seek(&self, ino: Ino, off: u64, what: Seek) -> Result<u64> {
        let mut g = self.lock();
        let it = g.inode(ino)?;
        check_regular(&it)?;
        let size = it.size.get();
        if off >= size {
            return Err(Error::NoSuchOffset);
        }
        let mut pos = off;
        let mut found = None;
        g.each_extent(ino, off, size, |e| {
            let is_data = e.item.kind != EXTENT_PREALLOC;
            let (s, t) = (e.offset, e.offset + e.len_bytes());
            if !is_data || t <= pos {
                return true;
            }
            match what {
                Seek::Data => found = Some(s.max(off)),
                Seek::Hole if s > pos => found = Some(pos),
                Seek::Hole => pos = t,
            }
            found.is_none()
        })?;
        match (found, what) {
            (Some(at), _) => Ok(at),
            (None, Seek::Data) => Err(Error::NoSuchOffset),
            (None, Seek::Hole) => Ok(pos.min(size)),
        }
    }
}
