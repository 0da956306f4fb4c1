//! Writes into blocks a file already owns, without copy-on-write.
//!
//! Three kinds of block are written where they are:
//! - **Preallocated blocks** (fallocate's, in any file): the blocks the write covers are
//!   filled in place, zeros around the bytes written, and that part of the extent becomes a
//!   regular extent. Until that change is durable (a commit, or an fsync batch), every
//!   durable state still calls the blocks preallocated, and preallocated blocks read as zeros
//!   whatever they hold: a crash shows zeros or the write, never other bytes. The data is
//!   flushed before any batch or commit that calls it written (`Log::data_unflushed`).
//! - **A NOCOW file's written blocks** (`FS_NOCOW_FL`, `chattr +C`, as btrfs's nodatacow):
//!   the bytes are overwritten where they are. A crash in the middle of such a write leaves
//!   each block with its old or its new bytes, per the device's write unit, or a mix of both
//!   within one block on a device that tears them; never another file's bytes.
//! - **Any file's written blocks, when the device is full**: a copy-on-write overwrite that
//!   cannot get space for its new blocks overwrites the old ones in place instead of failing,
//!   with a NOCOW write's crash behaviour, as ext4 always overwrites. So a write inside a
//!   range fallocate returned for is never refused for space, the first one or a later one.
//!
//! Data sums (`data_sum`): a converted block gets its sum with its conversion; a NOCOW file
//! has none; a block a full device overwrites in place loses its sum, durably (a commit)
//! before its bytes change, since a crash may tear it; the part of it such a write keeps is
//! checked first.
//!
//! None of these takes data blocks. A conversion changes a few extent items, and reserves
//! their node slots with deletes' rights (`Reserve::Shrink`), as ext4 keeps clusters aside
//! for converting unwritten extents; an overwrite changes only the inode. The parts of a
//! write that fall on holes are copy-on-write as usual, and need space.
//!
//! A block is written in place only while this file alone references it. Shared blocks
//! (`shared`) are only ever a copy-on-write file's regular extents: a NOCOW file never
//! shares, preallocated extents are never shared, and a full device does not overwrite a
//! shared block in place (such a write is refused for space, as on btrfs).
//!
//! These writes run whole under the operation lock, their device I/O included, but for
//! writes inside the file's size over blocks it has (`Inner::plan_overwrite`): a NOCOW
//! file's over its written blocks, any bytes of them, or whole preallocated ones (seed 004's
//! workload: O_DIRECT 64 KiB writes into a fallocated NOCOW file), and a copy-on-write
//! file's over whole preallocated ones (a database's or a download's `posix_fallocate`d
//! file filling up). Such a write sets the inode's times under the lock, enters the read
//! fence, and writes the device after letting go (`Overwrite`).
//! Over preallocated blocks it then takes the lock again, still inside the fence, and
//! converts them (`Inner::convert_written`), if they are still this file's preallocated
//! blocks at the same place; if anything changed there, the write runs again whole under
//! the lock, which puts its bytes where the blocks are now. Why that is sound:
//! - *No other file's bytes.* Its blocks are not handed out again while it is inside the
//!   fence, whatever frees them meanwhile (a truncate, an unlink): the write lands on blocks
//!   that are its file's or free, never another's, as a reader's read never returns
//!   another file's bytes (`crate::space::read_fence`).
//! - *Only its own bytes.* A write of part of a written block puts only its bytes on the
//!   device (which takes any byte range): nothing of the rest of the block is read and
//!   written back, so two such writes into one block keep each other's bytes, and two into
//!   the same bytes leave one of them, as on the kernel's file systems. A preallocated
//!   block is filled whole, zeros around the bytes (it reads as zeros until converted, and
//!   may hold anything): two such fills of one block outside the lock could each put zeros
//!   over the other's bytes, so only whole blocks are filled outside it.
//! - *Nothing under the lock keeps bytes of its blocks from before it.* Such a write is in
//!   `InPlace`'s list of writes in flight, by disk blocks, until it is done (`Overwrite` is
//!   dropped). An operation under the lock that would keep part of one of those blocks
//!   refuses before changing anything (`Error::InFlight`), and `Fs::write_op` runs it again
//!   after a short wait (`in_flight_waits`); while one waits, no write leaves the lock, so
//!   those in flight drain and a stream of them cannot starve it. Such operations: a write
//!   under the lock into those blocks (one of part of a block reads it and writes it back
//!   whole, a fill puts zeros around its bytes), a truncate into a block, and a punch or a
//!   zeroed range from or to the middle of one (they copy the rest of it elsewhere). Run
//!   beside it, they would keep the bytes from before the write, and the write, landing
//!   after their read, would be lost though it returned. Truncates, punches and zeroed
//!   ranges of whole blocks need no wait: whichever lands last, the file ends as if the
//!   two ran one after the other (the fence keeps a freed block from another file).
//! - *No plan outside the lock reads them.* A copy-on-write plan (`data_io`) maps only
//!   holes of a NOCOW file (its written and preallocated blocks make a write in-place, run
//!   here), so `InPlace::seq`, which such a plan checks for edges it read, need not
//!   move for the device write; a conversion moves it, as under the lock.
//! - *Preallocated blocks read as zeros until converted*, whatever the device holds, so the
//!   bytes are invisible (and a crash shows zeros) until the conversion, which comes after
//!   them and makes the next fsync batch flush them first (`Log::data_unflushed`). Two
//!   NOCOW writers converting one block each write it whole; the first to convert wins the
//!   conversion, the other finds it changed and writes again under the lock, last. NOCOW
//!   data has no sums, so a block converted over the other writer's bytes is never a
//!   mismatch.
//! - *A copy-on-write file's sums match its bytes.* Its converted blocks get sums of the
//!   bytes its write put there (computed without the lock, `Overwrite::sums`), so no other
//!   write may put bytes on those blocks between the two: no plan is made over blocks in
//!   flight, and a write under the lock that would fill any of them waits, as above. After
//!   the conversion the blocks are written ones, which such a file's writes copy. A write
//!   that finds them changed runs again under the lock, as a NOCOW one does, where its
//!   blocks are now.
//! - *fsync.* The write is noted for the next flush only after it returned
//!   (`LogIo::note_data_written`): an fsync after the write flushes it, even when no
//!   metadata changed.
//! - Under `-o sync` (the write durable on return) it runs whole under the lock.
//! - A device error in that write is the caller's EIO and stops nothing (the times are
//!   already set), as for a copy-on-write write's data (`data_io`); under the lock, a
//!   failed device write stops the file system.
//!
//! Every other in-place write runs whole under the lock: a write planned outside it
//! (`data_io`) counts on blocks not changing under an unchanged extent map, and every such
//! write moves `InPlace::seq`, which a plan checks before it links its blocks. A
//! reader outside the lock may see part of an in-place write, as on the kernel's file
//! systems.
use super::data_sum::{sums_of, SumCheck};
use super::file::{extent_key, Ext, MAX_FILE_SIZE};
use super::inode_flags::is_nocow;
use super::{Durable, Inner, Ino, Reserve};
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::space::read_fence::ReadTicket;
use idxfs_blockdev::BlockDevice;
use idxfs_format::items::{ExtentItem, InodeItem, EXTENT_PREALLOC, EXTENT_REGULAR};
use idxfs_format::BLOCK_SIZE;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use zerocopy::IntoBytes;

const BS: u64 = BLOCK_SIZE;

/// What happens to a run of a write's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    /// Copy-on-write: a hole, or a copy-on-write file's written blocks.
    Cow,
    /// Preallocated: filled in place and made regular (this extent, from this disk block).
    Convert { ext: usize, disk: u64 },
    /// A NOCOW file's written blocks: overwritten in place, from this disk block.
    Overwrite { disk: u64 },
}

/// Blocks [start, end) of the file, and what the write does to them.
#[derive(Debug, Clone, Copy)]
struct Piece {
    start: u64,
    end: u64,
    how: How,
}

/// What the lock knows of in-place writes beside it.
#[derive(Default)]
pub(crate) struct InPlace {
    /// Bumped by every write into blocks in place: a write planned outside the lock that read
    /// edge blocks runs again when it moved (`data_io`).
    pub seq: u64,
    /// The writes whose device I/O runs without the lock, each until its `Overwrite` is
    /// dropped: a mutex of its own, so that one leaves without the operation lock.
    flights: Arc<Mutex<Flights>>,
}

#[derive(Default)]
struct Flights {
    next: u64,
    list: Vec<Flight>,
    /// Operations waiting for writes in this list (`Waiting`): while there are any, no new
    /// write leaves the lock, so the list drains and they cannot be starved by a stream of
    /// writes into the blocks they wait for.
    waiting: usize,
}

/// Disk blocks [start, end) an `Overwrite` is writing.
struct Flight {
    id: u64,
    start: u64,
    end: u64,
}

/// An `Overwrite`'s place in `InPlace::flights`, left when dropped.
struct Aloft {
    flights: Arc<Mutex<Flights>>,
    id: u64,
}

impl Drop for Aloft {
    fn drop(&mut self) {
        lock(&self.flights).list.retain(|f| f.id != self.id);
    }
}

/// An operation refused for writes in flight (`Error::InFlight`), until it ran: counted in
/// `Flights::waiting` while it lives.
pub(crate) struct Waiting {
    flights: Arc<Mutex<Flights>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut f = lock(&self.flights);
        f.waiting = f.waiting.saturating_sub(1);
    }
}

/// The list, also after a panic elsewhere poisoned its mutex (its entries are whole either
/// way: each change is one `retain` or `extend`).
fn lock(m: &Mutex<Flights>) -> MutexGuard<'_, Flights> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl InPlace {
    /// Records disk block runs [s, e) as being written without the lock until the returned
    /// token is dropped.
    fn take_off(&self, runs: impl Iterator<Item = (u64, u64)>) -> Aloft {
        let mut f = lock(&self.flights);
        let id = f.next;
        f.next += 1;
        let new = runs.map(|(start, end)| Flight { id, start, end });
        f.list.extend(new);
        Aloft {
            flights: self.flights.clone(),
            id,
        }
    }

    /// Whether disk blocks [s, e) overlap blocks a write is writing without the lock.
    fn overlaps(&self, s: u64, e: u64) -> bool {
        lock(&self.flights)
            .list
            .iter()
            .any(|f| s < f.end && f.start < e)
    }

    /// No write is in flight outside the lock.
    pub(crate) fn is_empty(&self) -> bool {
        lock(&self.flights).list.is_empty()
    }

    /// Counts an operation refused for writes in flight as waiting until the token drops.
    pub(crate) fn wait(&self) -> Waiting {
        lock(&self.flights).waiting += 1;
        Waiting {
            flights: self.flights.clone(),
        }
    }

    /// Whether an operation waits for writes in flight: none may leave the lock meanwhile.
    fn awaited(&self) -> bool {
        lock(&self.flights).waiting > 0
    }
}

/// A write into blocks a file has, planned under the lock and written without it (module
/// docs): a NOCOW file's over its written blocks or whole preallocated ones, a
/// copy-on-write file's over whole preallocated ones.
pub(crate) struct Overwrite {
    /// The write's first file block.
    first: u64,
    /// (first byte on the device, first byte of the write's data, bytes) of each run.
    runs: Vec<(u64, usize, usize)>,
    /// The preallocated runs among them, as (first file block, end block, first disk
    /// block): converted once the bytes are on the device (`Inner::convert_written`).
    pub converts: Vec<(u64, u64, u64)>,
    /// A copy-on-write file's plan: its converted blocks get sums.
    summed: bool,
    /// In `InPlace::flights` until dropped: no operation under the lock keeps bytes of
    /// these blocks meanwhile (module docs).
    _aloft: Aloft,
    /// Inside the read fence until the device writes returned and the conversions are done:
    /// the blocks stay the file's or free.
    _inside: ReadTicket,
}

impl Overwrite {
    /// Writes `data` (the whole write the plan was made for) to its blocks.
    pub(crate) fn write(&self, dev: &dyn BlockDevice, data: &[u8]) -> Result<()> {
        for &(disk, at, len) in &self.runs {
            dev.write_at(&data[at..at + len], disk)
                .map_err(Error::WriteRefused)?;
        }
        Ok(())
    }

    /// The sums of the preallocated runs' new bytes (from `data`, the whole write), by first
    /// file block: a copy-on-write file's, computed without the lock; none for a NOCOW file.
    pub(crate) fn sums(&self, data: &[u8]) -> Vec<(u64, Vec<u32>)> {
        if !self.summed {
            return Vec::new();
        }
        let at = |b: u64| ((b - self.first) * BS) as usize;
        let sums = self
            .converts
            .iter()
            .map(|&(s, e, _)| (s, sums_of(&data[at(s)..at(e)])));
        sums.collect()
    }
}

impl Inner {
    /// Plans a write of `len` bytes at `off` that can go to the device without the lock
    /// (module docs): inside the file's size, a NOCOW file's written blocks (any bytes of
    /// them) or whole preallocated ones, a copy-on-write file's whole preallocated ones no
    /// other write has in flight; not under `-o sync`. Sets the times (when `times`) now.
    /// None: the write runs under the lock.
    pub(crate) fn plan_overwrite(
        &mut self,
        ino: Ino,
        off: u64,
        len: u64,
        times: bool,
    ) -> Result<Option<Overwrite>> {
        let it = self.inode(ino)?;
        let end = off + len;
        let nocow = is_nocow(&it);
        let whole = off.is_multiple_of(BS) && len.is_multiple_of(BS);
        if self.policy.knobs.data_under_lock
            || self.policy.sync.covers(Durable::Data)
            || !(whole || nocow)
            || self.in_place.awaited()
            || len == 0
            || end > it.size.get()
            || self.trimming(ino)
            || self.is_inline(ino, &it)?
        {
            return Ok(None);
        }
        let (b0, b1) = (off / BS, end.div_ceil(BS));
        let exts = self.extents(ino, b0 * BS, b1 * BS)?;
        if self.shares_any(b0, b1, &exts)? {
            return Ok(None);
        }
        let (mut runs, mut converts) = (Vec::new(), Vec::new());
        // Each run's bytes by its place in the file: pieces lie inside [b0, b1), so the
        // slices do too, whatever the extents (even overlapping ones of a damaged image).
        // A copy-on-write file's written blocks are `Cow` pieces: such a write stays here.
        let floor = self.snapshots.clones.shared_floor();
        for p in Inner::pieces(b0, b1, &exts, nocow, floor) {
            let disk = match p.how {
                How::Overwrite { disk } => disk,
                // Filled whole, zeros around the write's bytes: under the lock but for
                // whole blocks.
                How::Convert { .. } if !whole => return Ok(None),
                How::Convert { disk, .. } => {
                    if !nocow && self.in_place.overlaps(disk, disk + (p.end - p.start)) {
                        return Ok(None);
                    }
                    converts.push((p.start, p.end, disk));
                    disk
                }
                How::Cow => return Ok(None),
            };
            // Only the write's own bytes of the run's first and last blocks: nothing of the
            // rest of a block is read or written back (module docs).
            let (a, z) = (off.max(p.start * BS), end.min(p.end * BS));
            let at = (a - off) as usize;
            runs.push((disk * BS + (a - p.start * BS), at, (z - a) as usize));
        }
        if !nocow {
            Counters::inc(&self.store.counters.fills_beside);
        }
        let aloft = (self.in_place).take_off(
            runs.iter()
                .map(|&(d, _, len)| (d / BS, (d + len as u64).div_ceil(BS))),
        );
        let inside = self.store.alloc.fence().enter();
        if times {
            let now = self.now();
            self.modify_inode(ino, |i| {
                i.mtime = now;
                i.ctime = now;
            })?;
        }
        Counters::inc(&self.store.counters.in_place_writes);
        Counters::inc(&self.store.counters.overwrites_beside);
        Ok(Some(Overwrite {
            first: b0,
            runs,
            converts,
            summed: !nocow,
            _aloft: aloft,
            _inside: inside,
        }))
    }

    /// Refuses (`Error::InFlight`, for `Fs::write_op` to run it again) a write of `len` bytes
    /// at `off` of `ino` whose blocks, written or preallocated, another write is writing
    /// without the lock: a part of a block it keeps would be the bytes from before that one,
    /// and a converted block's sums would not be its bytes (module docs).
    pub(crate) fn refuse_in_flight(&mut self, ino: Ino, off: u64, len: u64) -> Result<()> {
        if self.in_flight(ino, off, len)? {
            Counters::inc(&self.store.counters.in_flight_waits);
            return Err(Error::InFlight);
        }
        Ok(())
    }

    /// Whether a block holding bytes [off, off + len) of `ino`, written or preallocated, is
    /// being written without the lock.
    fn in_flight(&mut self, ino: Ino, off: u64, len: u64) -> Result<bool> {
        if self.in_place.is_empty() {
            return Ok(false);
        }
        let (b0, b1) = (off / BS, (off + len).div_ceil(BS));
        let exts = self.extents(ino, b0 * BS, b1 * BS)?;
        let floor = self.snapshots.clones.shared_floor();
        let busy = Inner::pieces(b0, b1, &exts, true, floor)
            .iter()
            .any(|p| match p.how {
                How::Convert { disk, .. } | How::Overwrite { disk } => {
                    self.in_place.overlaps(disk, disk + (p.end - p.start))
                }
                How::Cow => false,
            });
        Ok(busy)
    }

    /// Debug builds: the block of `ino` holding byte `at`, part of which the caller keeps, is
    /// not being written without the lock: the operation refused before its first change
    /// (`refuse_in_flight`), and nothing lets such a write start while the lock is held.
    pub(crate) fn debug_assert_not_in_flight(&mut self, ino: Ino, at: u64) {
        if cfg!(debug_assertions) {
            let busy = self.in_flight(ino, at / BS * BS, BS);
            debug_assert!(
                !matches!(busy, Ok(true)),
                "inode {ino}: the block at byte {at}, kept in part, has a write in flight"
            );
        }
    }

    /// `refuse_in_flight` for the blocks of `ino` an operation keeps part of when it cuts
    /// the file at `at` (a truncate into a block, a punch or a zeroed range from or to the
    /// middle of one): called before it changes anything. Whole blocks it frees or zeroes
    /// need no wait: the fence keeps a write from landing on another file's blocks, and its
    /// bytes are then as if written before the cut.
    pub(crate) fn refuse_in_flight_at(&mut self, ino: Ino, at: u64) -> Result<()> {
        if at.is_multiple_of(BS) {
            return Ok(());
        }
        self.refuse_in_flight(ino, at / BS * BS, BS)
    }

    /// After an `Overwrite`'s device write, still inside its fence: converts its
    /// preallocated runs (`o.converts`) if each still lies in one preallocated extent of
    /// `ino` at the same disk blocks, with `sums` (`Overwrite::sums`) for a copy-on-write
    /// file's. False: something changed there and nothing was converted; the write must run
    /// again under the lock, once `o` is dropped.
    pub(crate) fn convert_written(
        &mut self,
        ino: Ino,
        o: &Overwrite,
        sums: &[(u64, Vec<u32>)],
    ) -> Result<bool> {
        let mut found = Vec::with_capacity(o.converts.len());
        for &(s, e, disk) in &o.converts {
            let exts = self.extents(ino, s * BS, e * BS)?;
            let [ext] = exts.as_slice() else {
                return Ok(false);
            };
            let first = ext.offset / BS;
            // Checked sums: the extent is the image's, however damaged.
            let same = ext.item.kind == EXTENT_PREALLOC
                && first <= s
                && first
                    .checked_add(ext.item.blocks.get())
                    .is_some_and(|t| e <= t)
                && ext.item.disk_block.get().checked_add(s - first) == Some(disk);
            if !same {
                return Ok(false);
            }
            found.push((ext.clone(), s, e));
        }
        let blocks: u64 = sums.iter().map(|(_, s)| s.len() as u64).sum();
        let nodes = self.convert_nodes(found.len() as u64, found.len() as u64);
        self.reserve_nodes(nodes + self.sum_nodes(blocks), 0, Reserve::Shrink)?;
        // The bytes are on the device: a batch that names them flushes first.
        self.log.data_unflushed = true;
        self.in_place.seq += 1;
        // Last to first, so each finds its extent where `extents` found it.
        for (ext, s, e) in found.iter().rev() {
            self.convert(ino, ext, *s, *e)?;
            Counters::inc(&self.store.counters.extent_conversions);
        }
        for (start, sums) in sums {
            self.put_sums(ino, *start, sums)?;
        }
        Ok(true)
    }

    /// The pieces of a write of blocks [b0, b1) over `exts` (the extents there, in order).
    /// A preallocated extent as old as `floor` may be named by another writable tree
    /// (`clones`::shared_floor) and is not filled in place.
    fn pieces(b0: u64, b1: u64, exts: &[Ext], overwrite: bool, floor: u64) -> Vec<Piece> {
        let mut out: Vec<Piece> = Vec::new();
        let mut push = |p: Piece| match out.last_mut() {
            Some(l) if l.how == How::Cow && p.how == How::Cow && l.end == p.start => l.end = p.end,
            _ => out.push(p),
        };
        let mut at = b0;
        for (i, e) in exts.iter().enumerate() {
            let (s, t) = (e.offset / BS, (e.offset + e.len_bytes()).div_ceil(BS));
            let (s, t) = (s.max(b0), t.min(b1));
            if s >= t {
                continue;
            }
            if s > at {
                push(Piece {
                    start: at,
                    end: s,
                    how: How::Cow,
                });
            }
            let disk = e.item.disk_block.get() + (s - e.offset / BS);
            let how = match e.item.kind {
                EXTENT_PREALLOC if e.item.generation.get() > floor => How::Convert { ext: i, disk },
                EXTENT_REGULAR if overwrite => How::Overwrite { disk },
                _ => How::Cow,
            };
            push(Piece {
                start: s,
                end: t,
                how,
            });
            at = t;
        }
        if at < b1 {
            push(Piece {
                start: at,
                end: b1,
                how: How::Cow,
            });
        }
        out
    }

    /// Whether any written block of `exts` in file blocks [b0, b1) is shared: with another
    /// extent, or with a snapshot that may name it (`snapshot`).
    fn shares_any(&mut self, b0: u64, b1: u64, exts: &[Ext]) -> Result<bool> {
        let written = |e: &&Ext| e.item.kind == EXTENT_REGULAR;
        let inside = |e: &&Ext| e.offset / BS < b1 && e.offset / BS + e.item.blocks.get() > b0;
        if (exts.iter().filter(written).filter(inside))
            .any(|e| self.snapshots.may_name(e.item.generation.get()))
        {
            return Ok(true);
        }
        if !self.may_share() {
            return Ok(false);
        }
        for e in exts.iter().filter(|e| e.item.kind == EXTENT_REGULAR) {
            let (s, t) = (e.offset / BS, e.offset / BS + e.item.blocks.get());
            let (s, t) = (s.max(b0), t.min(b1));
            if s < t {
                let disk = e.item.disk_block.get() + (s - e.offset / BS);
                if self.any_shared(disk, t - s)? {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// Whether a write of blocks [b0, b1) of a file (not inline) with inode `it` over `exts`
    /// (the extents there) would put some of its blocks in place: it is then not planned
    /// outside the lock (`data_io`) but runs whole under it (`write_in_place`).
    pub(crate) fn puts_in_place(&self, b0: u64, b1: u64, exts: &[Ext], it: &InodeItem) -> bool {
        let floor = self.snapshots.clones.shared_floor();
        Inner::pieces(b0, b1, exts, is_nocow(it), floor)
            .iter()
            .any(|p| p.how != How::Cow)
    }

    /// Writes `data` at `off` with every block that can be written in place so written (the
    /// module docs) and the rest copy-on-write. `full`: the device has no room for the
    /// copy-on-write of written blocks, so any file's are overwritten in place too (module
    /// docs). None: no block can be, and nothing was done.
    pub(crate) fn write_in_place(
        &mut self,
        ino: Ino,
        off: u64,
        data: &[u8],
        times: bool,
        full: bool,
    ) -> Result<Option<InodeItem>> {
        let it = self.inode(ino)?;
        let end = off + data.len() as u64;
        debug_assert!(end <= MAX_FILE_SIZE);
        if data.is_empty()
            || self.is_inline(ino, &it)?
            || (end > it.size.get() && self.trimming(ino))
        {
            return Ok(None);
        }
        let (b0, b1) = (off / BS, end.div_ceil(BS));
        let exts = self.extents(ino, b0 * BS, b1 * BS)?;
        // A shared block is another file's too: never written in place (`shared`).
        let overwrite = (full || is_nocow(&it)) && !self.shares_any(b0, b1, &exts)?;
        let floor = self.snapshots.clones.shared_floor();
        let pieces = Inner::pieces(b0, b1, &exts, overwrite, floor);
        if pieces.iter().all(|p| p.how == How::Cow) {
            return Ok(None);
        }
        // Everything is reserved before the first change: the copy-on-write parts' blocks
        // and nodes as any write's (they grow the file system), the conversions' nodes with
        // deletes' rights.
        let cow_bytes: u64 = pieces
            .iter()
            .filter(|p| p.how == How::Cow)
            .map(|p| (p.end - p.start) * BS)
            .sum();
        // One reservation (a second would not add to the first's slots).
        let touched = exts.len() as u64;
        let converts = pieces
            .iter()
            .filter(|p| matches!(p.how, How::Convert { .. }))
            .count() as u64;
        // Sums: the converted blocks get theirs, the overwritten ones of a copy-on-write file
        // lose theirs (`data_sum`).
        let in_place: u64 = pieces
            .iter()
            .filter(|p| p.how != How::Cow)
            .map(|p| p.end - p.start)
            .sum();
        let nocow = is_nocow(&it);
        let nodes = self.convert_nodes(touched, converts) + self.sum_nodes(in_place);
        let reserve = |g: &mut Inner| match cow_bytes {
            0 => g.reserve_nodes(nodes, 0, Reserve::Shrink),
            n => {
                let cow = g.write_nodes(n, touched);
                g.reserve_nodes(nodes + cow, n / BS + 2, Reserve::Grow)
            }
        };
        reserve(self)?;
        // The bytes of `data` that fall in blocks [s, t).
        let part = |s: u64, t: u64| {
            let (a, z) = (off.max(s * BS), end.min(t * BS));
            ((a - off) as usize..(z - off) as usize, a)
        };
        // A copy-on-write file's blocks this write keeps part of are checked against their
        // sums before their bytes are carried over (`data_sum`).
        let counters = self.store.counters.clone();
        let check = SumCheck {
            ino,
            counters: &counters,
            report: true,
        };
        let sums = if full && !nocow {
            self.block_sums(ino, b0, b1)?
        } else {
            vec![None; (b1 - b0) as usize]
        };
        // The sums of the blocks a full device makes this write overwrite go first, and
        // durably (a commit), before any byte of theirs changes: a crash must not leave a
        // sum over bytes it no longer matches, new or torn. Once per block: the next
        // overwrite finds none. The commit let go of the reservation: taken again.
        let overwritten_sums = pieces.iter().filter(|p| {
            matches!(p.how, How::Overwrite { .. })
                && sums[(p.start - b0) as usize..(p.end - b0) as usize]
                    .iter()
                    .any(Option::is_some)
        });
        let overwritten_sums: Vec<Piece> = overwritten_sums.copied().collect();
        if !nocow && !overwritten_sums.is_empty() {
            for p in &overwritten_sums {
                self.clear_sums(ino, p.start, p.end)?;
            }
            self.checkpoint();
            self.commit()?;
            Counters::inc(&self.store.counters.sum_drop_commits);
            reserve(self)?;
        }
        // The converted blocks' sums, linked after the conversions.
        let mut new_sums: Vec<(u64, Vec<u32>)> = Vec::new();
        // Device writes first, whole blocks (a device tears a write only at its own write
        // unit, from an aligned start): an error there changes no item.
        for p in &pieces {
            let (disk, keep) = match p.how {
                How::Cow => continue,
                // What the write leaves alone of its edge blocks is the block's bytes...
                How::Overwrite { disk } => (disk, true),
                // ... or zeros, which is what a preallocated block reads as.
                How::Convert { disk, .. } => (disk, false),
            };
            let (r, at) = part(p.start, p.end);
            let whole = ((p.end - p.start) * BS) as usize;
            let summed = !keep && !nocow;
            if at == p.start * BS && r.len() == whole {
                // Whole blocks: the caller's bytes as they are.
                if summed {
                    new_sums.push((p.start, sums_of(&data[r.clone()])));
                }
                (self.store.dev.write_at(&data[r], disk * BS)).map_err(Error::WriteRefused)?;
                continue;
            }
            let mut buf = vec![0u8; whole];
            let head = (at - p.start * BS) as usize;
            let last = buf.len() - BS as usize;
            let sum_of = |b: u64| &sums[(b - b0) as usize..=(b - b0) as usize];
            if keep {
                self.debug_assert_not_in_flight(ino, p.start * BS);
                self.debug_assert_not_in_flight(ino, (p.end - 1) * BS);
            }
            let dev = self.store.dev.as_ref();
            if keep && head > 0 {
                let out = &mut buf[..BS as usize];
                check.read(dev, out, disk * BS, p.start, sum_of(p.start))?;
            }
            if keep && head + r.len() < buf.len() && (head == 0 || last > 0) {
                let end_at = disk * BS + last as u64;
                let out = &mut buf[last..];
                check.read(dev, out, end_at, p.end - 1, sum_of(p.end - 1))?;
            }
            buf[head..head + r.len()].copy_from_slice(&data[r]);
            if summed {
                new_sums.push((p.start, sums_of(&buf)));
            }
            (self.store.dev.write_at(&buf, disk * BS)).map_err(Error::WriteRefused)?;
        }
        self.in_place.seq += 1;
        self.log.data_unflushed = true;
        // Copy-on-write parts (each keeps what `data` puts there and the old bytes of a
        // partial edge block), then conversions, last to first so each finds its extent
        // where `extents` found it.
        for p in pieces.iter().filter(|p| p.how == How::Cow) {
            let (r, at) = part(p.start, p.end);
            self.write_data(ino, at, &data[r])?;
        }
        for p in pieces.iter().rev() {
            // (A full device's overwritten blocks lost their sums before the device writes,
            // above; a NOCOW file's never had any.)
            if let How::Convert { ext, .. } = p.how {
                self.convert(ino, &exts[ext], p.start, p.end)?;
                Counters::inc(&self.store.counters.extent_conversions);
            }
        }
        for (start, sums) in new_sums {
            self.put_sums(ino, start, &sums)?;
        }
        Counters::inc(&self.store.counters.in_place_writes);
        let now = self.now();
        self.modify_inode(ino, |i| {
            i.size = i.size.get().max(end).into();
            // The copy-on-write parts set the times too: put back when the caller said not to.
            let (m, c) = if times {
                (now, now)
            } else {
                (it.mtime, it.ctime)
            };
            i.mtime = m;
            i.ctime = c;
        })
        .map(Some)
    }

    /// Makes blocks [c0, c1) of the preallocated extent `e` regular, in place: what lies
    /// before and after stays preallocated, and the converted part merges with a regular
    /// extent it continues (in the file and on disk). Its blocks stay the file's, so the
    /// allocation does not change; every part keeps the extent's generation, so none of its
    /// blocks is freed before a commit (they are in the last committed state).
    fn convert(&mut self, ino: Ino, e: &Ext, c0: u64, c1: u64) -> Result<()> {
        let (eb, en) = (e.item.disk_block.get(), e.item.blocks.get());
        let first = e.offset / BS;
        debug_assert!(first <= c0 && c0 < c1 && c1 <= first + en);
        let key = extent_key(ino, e.offset);
        let piece = |from: u64, to: u64| ExtentItem {
            disk_block: (eb + (from - first)).into(),
            blocks: (to - from).into(),
            ..e.item
        };
        if c0 > first {
            let head = piece(first, c0);
            self.fs_tree
                .put(&mut self.store, key, head.as_bytes().to_vec())?;
        } else {
            self.fs_tree.delete(&mut self.store, &key)?;
        }
        if c1 < first + en {
            let tail = piece(c1, first + en);
            self.fs_tree.insert(
                &mut self.store,
                extent_key(ino, c1 * BS),
                tail.as_bytes().to_vec(),
            )?;
        }
        let disk = eb + (c0 - first);
        self.insert_extent(ino, c0 * BS, disk, c1 - c0, e.item.generation.get())
    }
}
