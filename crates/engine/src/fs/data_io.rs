//! File data I/O without the operation lock.
//!
//! A read maps its range under the lock (the inode, its extents, inline bytes: `map_read`),
//! enters the read fence (`crate::space::read_fence`), lets go of the lock, and then reads
//! the blocks. Whatever frees those blocks meanwhile, they are not handed out again until the
//! reader has left the fence. The writes this module plans are copy-on-write, so such a read
//! returns the file's bytes as of the moment it mapped them, unless a write into blocks in
//! place (`in_place`: preallocated blocks, NOCOW files) runs meanwhile: then it may return
//! part of that write, as a read beside a write may on the kernel's file systems.
//!
//! A write that goes to blocks runs in three steps:
//! 1. Under the lock (`plan_write`): the checks, the reservation, and the new blocks claimed
//!    (`Allocator::claim`: busy, but not recorded as used by a commit frozen before step 3).
//!    When the write leaves part of its first or last block alone, that block is an *edge*:
//!    mapped (its other bytes go into the new block) and the fence entered. A last block
//!    whose bytes past the write lie past the size is not read, but is an edge all the same:
//!    a write further into it meanwhile moves the size, and this one must then not put its
//!    zeros over it.
//! 2. Without the lock (`WritePlan::write_blocks`): the edge blocks read, the new blocks
//!    written.
//! 3. Under the lock, as one operation (`write_op_once`: sync modes, stopping after an
//!    error): the blocks installed and linked in place of what the range held, the size and
//!    times set (`install_write`).
//!
//! Step 3 first checks that nothing step 1 relied on has changed: the inode is the same one
//! (its generation), still neither inline nor being trimmed, and, for a write with edge
//! blocks, the size is the same, no write went into blocks in place meanwhile
//! (`InPlace::seq`), and each edge block maps the same extents. Then same extents mean
//! the same bytes: the ones an edge maps are not reused while the writer is inside the fence.
//! A write that would put any of its blocks in place is never planned here: it runs whole
//! under the lock, or for a write into blocks the file has (a NOCOW file's written ones,
//! whole preallocated ones), writes the device after it (`in_place`, `Overwrite`). When
//! something changed, the write gives its blocks back and runs again whole under the lock
//! (`data_write_conflicts`), so two writers sharing a block never lose each other's bytes. A write of whole blocks needs no check:
//! whatever happened to its range in between, linking its blocks there is the same as the
//! write running after it.
//!
//! A write refused for space in step 1 or 3 runs whole under the lock too: there `write_op`
//! waits, without the lock, for readers holding freed blocks (step 3 cannot: it is inside
//! the fence itself).
//!
//! Writes that stay inline, or move inline bytes out to a block, run whole under the lock:
//! they copy a few bytes between items, and have no block I/O to move out.
//!
//! What still serializes: the steps under the lock, so the tree changes of two writers never
//! overlap; their device I/O does, and so does a reader's with everything.
//! `OpenOptions::bench_data_under_lock` runs every read and write whole under the lock, the
//! same-run baseline of `idxfs bench concurrency`.
use super::data_sum::sums_of;
use super::file::{check_regular, inline_max, Ext, ReadMap, MAX_EXTENT_BLOCKS, MAX_FILE_SIZE};
use super::in_place::Overwrite;
use super::{Durable, Fs, Inner, Ino, Kill, Reserve, WriteHow};
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::space::read_fence::ReadTicket;
use idxfs_blockdev::BlockDevice;
use idxfs_format::items::InodeItem;
use idxfs_format::BLOCK_SIZE;

const BS: u64 = BLOCK_SIZE;

/// A write between its steps (module docs).
pub(crate) struct WritePlan {
    ino: Ino,
    /// The inode's generation: step 3 refuses a reused inode number.
    generation: u64,
    off: u64,
    len: u64,
    /// The file's size at step 1 (what the edge blocks were read against).
    size: u64,
    /// The claimed runs, in file order; empty once installed or given back.
    runs: Vec<(u64, u64)>,
    /// The first and last blocks where the write leaves bytes alone.
    edges: Vec<Edge>,
    /// `InPlace::seq` at step 1: edge bytes read after an in-place write are not
    /// vouched for by unchanged extents.
    in_place_seq: u64,
    /// The new blocks' data sums, computed in step 2 (`data_sum`), linked with them in 3.
    sums: Vec<u32>,
    /// Inside the read fence while an edge maps blocks, until step 3 is done.
    _inside: Option<ReadTicket>,
}

/// A block the write covers in part, as step 1 found it.
struct Edge {
    /// Its index in the file.
    block: u64,
    /// Its bytes, to read in step 2 (None: none below the size, past the write).
    map: Option<ReadMap>,
    /// The extents over it: unchanged at step 3, or the write runs again.
    exts: Vec<Ext>,
}

impl WritePlan {
    fn first_block(&self) -> u64 {
        self.off / BS
    }

    fn end_block(&self) -> u64 {
        (self.off + self.len).div_ceil(BS)
    }

    /// Step 2: reads the edge blocks (checked against their sums) and writes the new blocks,
    /// summing them, without the lock.
    fn write_blocks(
        &mut self,
        dev: &dyn BlockDevice,
        counters: &Counters,
        data: &[u8],
    ) -> Result<()> {
        let b0 = self.first_block();
        let n = ((self.end_block() - b0) * BS) as usize;
        let head = (self.off - b0 * BS) as usize;
        let assembled;
        let buf: &[u8] = if self.edges.is_empty() && head == 0 && data.len() == n {
            data
        } else {
            let mut b = vec![0u8; n];
            for e in &mut self.edges {
                if let Some(map) = e.map.take() {
                    // Unreported: a mismatch runs the write again under the lock.
                    let bytes = map.fill_with(dev, counters, false)?;
                    let at = ((e.block - b0) * BS) as usize;
                    b[at..at + bytes.len()].copy_from_slice(&bytes);
                }
            }
            b[head..head + data.len()].copy_from_slice(data);
            assembled = b;
            &assembled
        };
        let mut at = 0usize;
        for &(s, len) in &self.runs {
            let len = (len * BS) as usize;
            dev.write_at(&buf[at..at + len], s * BS)
                .map_err(Error::WriteRefused)?;
            at += len;
        }
        self.sums = sums_of(buf);
        Ok(())
    }
}

impl Inner {
    /// Whether a write ending at `end` goes to blocks and may run in steps: the file is not
    /// inline and will not be, and no trim is pending that growing it would have to finish.
    fn write_goes_to_blocks(&mut self, ino: Ino, it: &InodeItem, end: u64) -> Result<bool> {
        let size = it.size.get();
        if end > size && self.trimming(ino) {
            return Ok(false);
        }
        if self.is_inline(ino, it)? {
            return Ok(false);
        }
        let empty = size == 0 && !self.has_extent_from(ino, 0)?;
        Ok(!(empty && end <= inline_max(self.store.node_size) as u64))
    }

    /// Step 1 (module docs); None: the write runs whole under the lock.
    fn plan_write(&mut self, ino: Ino, off: u64, len: u64) -> Result<Option<WritePlan>> {
        let it = self.held_inode(ino)?;
        check_regular(&it)?;
        let end = off + len;
        if self.policy.knobs.data_under_lock || !self.write_goes_to_blocks(ino, &it, end)? {
            return Ok(None);
        }
        let size = it.size.get();
        let (b0, b1) = (off / BS, end.div_ceil(BS));
        // The extents under the range, read once: a write that puts any block in place runs
        // whole under the lock (`in_place`), and the rest reserve by how many there are.
        let exts = self.extents(ino, b0 * BS, b1 * BS)?;
        if self.puts_in_place(b0, b1, &exts, &it) {
            return Ok(None);
        }
        let mut edges = Vec::new();
        let mut edge_at = |g: &mut Inner, block: u64, read: bool| -> Result<()> {
            edges.push(Edge {
                block,
                map: if read {
                    Some(g.map_read(ino, &it, block * BS, BS as usize)?)
                } else {
                    None
                },
                exts: g.extents(ino, block * BS, (block + 1) * BS)?,
            });
            Ok(())
        };
        if !off.is_multiple_of(BS) {
            edge_at(self, b0, true)?;
        }
        // The last block's bytes past the write exist only below the size, so it is read only
        // then; but it is an edge either way: another write past this one's end (which moves
        // the size) must make this one run again, or the zeros it puts there would win. A
        // first block that is also the last was read whole already.
        if !end.is_multiple_of(BS) && (b1 - 1 != b0 || off.is_multiple_of(BS)) {
            edge_at(self, b1 - 1, end < size)?;
        }
        self.reserve_write(len, exts.len() as u64)?;
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut got = 0;
        while got < b1 - b0 {
            let Some((s, n)) = self
                .store
                .alloc
                .claim(1, (b1 - b0 - got).min(MAX_EXTENT_BLOCKS))
            else {
                self.unclaim(&runs);
                return Err(Error::NoSpace);
            };
            runs.push((s, n));
            got += n;
        }
        let reads = edges
            .iter()
            .any(|e| e.map.as_ref().is_some_and(|m| !m.pieces.is_empty()));
        Ok(Some(WritePlan {
            ino,
            generation: it.generation.get(),
            off,
            len,
            size,
            runs,
            edges,
            in_place_seq: self.in_place.seq,
            sums: Vec::new(),
            _inside: reads.then(|| self.store.alloc.fence().enter()),
        }))
    }

    fn unclaim(&mut self, runs: &[(u64, u64)]) {
        for &(s, n) in runs {
            self.store.alloc.unclaim(s, n);
        }
    }

    /// Step 3 (module docs). Ok(false): something the plan relied on changed; its blocks
    /// are left claimed for the caller to give back.
    fn install_write(&mut self, p: &mut WritePlan, times: bool) -> Result<bool> {
        let ino = p.ino;
        let it = self.inode(ino)?;
        if it.generation.get() != p.generation {
            return Err(Error::NotFound);
        }
        check_regular(&it)?;
        let (b0, b1) = (p.first_block(), p.end_block());
        let end = p.off + p.len;
        if !self.write_goes_to_blocks(ino, &it, end)? {
            return Ok(false);
        }
        if !p.edges.is_empty() && (it.size.get() != p.size || self.in_place.seq != p.in_place_seq) {
            return Ok(false);
        }
        for e in &p.edges {
            let now = self.extents(ino, e.block * BS, (e.block + 1) * BS)?;
            if !Ext::same(&now, &e.exts) {
                return Ok(false);
            }
        }
        let touched = self.extents(ino, b0 * BS, b1 * BS)?.len() as u64;
        let nodes = self.write_nodes(p.len, touched);
        self.reserve_nodes(nodes, 0, Reserve::Grow)?;
        // Nothing below can be refused: every node it may need is in the pool.
        let runs = std::mem::take(&mut p.runs);
        for &(s, n) in &runs {
            self.store.alloc.install(s, n);
        }
        self.log.data_unflushed = true;
        self.punch_now(ino, b0 * BS, b1 * BS)?;
        self.link_runs(ino, b0, &runs, end, times)?;
        self.put_sums(ino, b0, &p.sums)?;
        Ok(true)
    }

    /// A write whole under the lock (`Fs::write_with`'s last resort), or, when `outside` and
    /// it goes into blocks the file has, its plan for a device write without the lock
    /// (`in_place`), returned with the times already set.
    fn write_locked(
        &mut self,
        ino: Ino,
        off: u64,
        data: &[u8],
        times: bool,
        outside: bool,
    ) -> Result<Locked> {
        let it = self.held_inode(ino)?;
        check_regular(&it)?;
        if outside {
            if let Some(o) = self.plan_overwrite(ino, off, data.len() as u64, times)? {
                return Ok(Locked::Outside(o));
            }
        }
        self.refuse_in_flight(ino, off, data.len() as u64)?;
        match self.write_in_place(ino, off, data, times, false) {
            Ok(Some(_)) => return Ok(Locked::Done),
            // Refused for space before any change: the copy-on-write below asks again, and
            // on a full device overwrites in place.
            Ok(None) | Err(Error::NoSpace) => {}
            Err(e) => return Err(e),
        }
        // Existing extents in the range are cut at its edges and removed.
        let touched = self
            .extents(
                ino,
                off / BS * BS,
                (off + data.len() as u64).div_ceil(BS) * BS,
            )?
            .len() as u64;
        match self.reserve_write(data.len() as u64, touched) {
            Ok(()) => {}
            // A full device: blocks the file has are overwritten in place rather than the
            // write refused (`in_place`); holes in the range still need space.
            Err(Error::NoSpace) => {
                return match self.write_in_place(ino, off, data, times, true)? {
                    Some(_) => Ok(Locked::Done),
                    None => Err(Error::NoSpace),
                }
            }
            Err(e) => return Err(e),
        }
        self.write_data(ino, off, data)?;
        if !times {
            self.modify_inode(ino, |i| {
                i.mtime = it.mtime;
                i.ctime = it.ctime;
            })?;
        }
        Ok(Locked::Done)
    }
}

/// What `Inner::write_locked` did.
enum Locked {
    /// The write, whole.
    Done,
    /// Planned it to write the device without the lock (`in_place`); the times are set.
    Outside(Overwrite),
}

impl Fs {
    /// Reads up to `len` bytes at `off`; short at end of file.
    pub fn read(&self, ino: Ino, off: u64, len: usize) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.read_mapped(ino, off, len, |map, dev, counters, report| {
            out = vec![0u8; map.len];
            map.fill_into(&mut out, dev, counters, report)
        })?;
        Ok(out)
    }

    /// Reads up to `out.len()` bytes at `off` into the front of `out`; returns how many
    /// (short at end of file). The bytes past those are left as they were.
    pub fn read_into(&self, ino: Ino, off: u64, out: &mut [u8]) -> Result<usize> {
        let mut n = 0;
        self.read_mapped(ino, off, out.len(), |map, dev, counters, report| {
            n = map.len;
            map.fill_into(out, dev, counters, report)
        })?;
        Ok(n)
    }

    /// Maps a read of up to `len` bytes at `off` under the lock and has `fill` read it: outside
    /// the lock unless only inline bytes and holes are mapped, and again under the lock when
    /// a block did not match its sum. `fill` writes every byte of the read each time.
    fn read_mapped(
        &self,
        ino: Ino,
        off: u64,
        len: usize,
        mut fill: impl FnMut(&ReadMap, &dyn BlockDevice, &Counters, bool) -> Result<()>,
    ) -> Result<()> {
        let (map, _inside) = {
            let mut g = self.lock();
            let it = g.held_inode(ino)?;
            check_regular(&it)?;
            let map = g.map_read(ino, &it, off, len)?;
            g.touch_atime(ino, &it);
            if map.pieces.is_empty() || g.policy.knobs.data_under_lock {
                return fill(&map, g.store.dev.as_ref(), &g.store.counters, true);
            }
            Counters::inc(&g.store.counters.data_reads_beside);
            let inside = g.store.alloc.fence().enter();
            (map, inside)
        };
        match fill(&map, self.shared.dev.as_ref(), &self.shared.counters, false) {
            // A block that does not match its sum, or one a full device's overwrite in
            // place changed after the mapping (`data_sum`): read again under the lock,
            // which nothing changes meanwhile, and which reports a real mismatch.
            Err(Error::DataSum { .. }) => {
                drop(_inside);
                let mut g = self.lock();
                let it = g.held_inode(ino)?;
                check_regular(&it)?;
                let map = g.map_read(ino, &it, off, len)?;
                fill(&map, g.store.dev.as_ref(), &g.store.counters, true)
            }
            r => r,
        }
    }

    /// Writes `data` at `off`; returns bytes written (all of them, or an error). Sets the
    /// modification and change times, and drops the file's capabilities first, as every
    /// write does (`privs`).
    pub fn write(&self, ino: Ino, off: u64, data: &[u8]) -> Result<usize> {
        let how = WriteHow {
            times: true,
            kill: Kill::default(),
        };
        self.write_with(ino, off, data, how)
    }

    /// `write`, told by the front end whether to set the times and whether the writer may
    /// keep set-user-ID and set-group-ID.
    pub fn write_with(&self, ino: Ino, off: u64, data: &[u8], how: WriteHow) -> Result<usize> {
        if off
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > MAX_FILE_SIZE)
        {
            return Err(Error::FileTooBig);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let times = how.times;
        let (plan, drops) = {
            let mut g = self.lock();
            g.writable()?;
            let drops = g.write_drops(ino, how.kill)?;
            if drops.any() {
                // Rare: the write runs whole under the lock, after the drop.
                (None, true)
            } else {
                match g.plan_write(ino, off, data.len() as u64) {
                    // Whole under the lock below, which waits for held space (`write_op`).
                    Err(Error::NoSpace) => (None, false),
                    r => (r?, false),
                }
            }
        };
        if drops {
            // Before the data: a crash between the two leaves the file without its
            // privileges and without the write, never with both.
            self.write_op(4, Reserve::Shrink, Durable::Data, |g| {
                let d = g.write_drops(ino, how.kill)?;
                g.apply_drop(ino, d)
            })?;
        }
        if let Some(mut plan) = plan {
            let io = plan.write_blocks(self.shared.dev.as_ref(), &self.shared.counters, data);
            // Once: a wait for readers must not wait for this write's own ticket.
            let r = io.and_then(|()| {
                let mut install = |g: &mut Inner| g.install_write(&mut plan, times);
                self.write_op_once(0, Reserve::Grow, Durable::Data, &mut install, &mut None)
            });
            if !plan.runs.is_empty() {
                let mut g = self.lock();
                g.unclaim(&plan.runs);
                if r.as_ref().is_ok_and(|done| !done) {
                    Counters::inc(&g.store.counters.data_write_conflicts);
                }
            }
            // Out of the fence before the write runs again below (which may wait for it).
            drop(plan);
            match r {
                Ok(true) => {
                    Counters::inc(&self.shared.counters.data_writes_beside);
                    return Ok(data.len());
                }
                // Changed meanwhile, refused for space, or an edge block that did not match
                // its sum (perhaps changed in place meanwhile): again, whole under the lock.
                Ok(false) | Err(Error::NoSpace) | Err(Error::DataSum { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        // Reserved for inside: the copy-on-write parts as growth (`reserve_write`), what
        // goes into blocks the file has with deletes' rights (`in_place`), so the operation
        // itself must not hold the global reserve back.
        let whole = |outside: bool| {
            let f = move |g: &mut Inner| g.write_locked(ino, off, data, times, outside);
            self.write_op(0, Reserve::Shrink, Durable::Data, f)
        };
        let Locked::Outside(o) = whole(true)? else {
            return Ok(data.len());
        };
        // Blocks the file has (`in_place`): written here, without the lock, and a
        // copy-on-write file's sums computed here too.
        let r = o.write(self.shared.dev.as_ref(), data);
        // Also after a failed write: some of it may be on the device.
        self.shared.log_io.note_data_written();
        let r = r.and_then(|()| {
            if o.converts.is_empty() {
                return Ok(true);
            }
            let sums = o.sums(data);
            // Once, inside the fence: a wait for readers must not wait for this write's own
            // ticket.
            let mut convert = |g: &mut Inner| g.convert_written(ino, &o, &sums);
            self.write_op_once(0, Reserve::Shrink, Durable::Data, &mut convert, &mut None)
        });
        // Out of the fence, and out of `InPlace`'s writes in flight, before the write runs
        // again below (which would wait for both).
        drop(o);
        match r {
            Ok(true) => Ok(data.len()),
            // Changed meanwhile, or refused for space: again, whole under the lock.
            Ok(false) | Err(Error::NoSpace) => {
                Counters::inc(&self.shared.counters.data_write_conflicts);
                whole(false)?;
                Ok(data.len())
            }
            Err(e) => Err(e),
        }
    }
}
