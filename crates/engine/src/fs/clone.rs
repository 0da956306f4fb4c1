//! copy_file_range(2) inside one file system: copies that share their source's blocks.
//!
//! Where the source and destination offsets are block-aligned, the destination gets extents
//! naming the source's blocks, their counts go up (`shared`), and the source's data sums
//! are copied beside them; no data block is read or written, so copying a large file costs
//! its extent and sum items (about 1 MiB of metadata per GiB), not its bytes. A later write
//! to either file is copy-on-write as always and leaves the other's bytes alone; a block is
//! freed when the last extent naming it goes.
//!
//! What is shared: written blocks of copy-on-write files. Holes and preallocated extents
//! of the source become holes of the destination (both read as zeros; preallocated blocks
//! are written in place, so they are never shared). A NOCOW source or destination, inline
//! data, and offsets that are not block-aligned are copied byte by byte instead, through
//! the ordinary read and write paths. The last, partial block of the source is shared
//! when the copy ends the destination too (as a reflink does); else it is copied.
//!
//! A copy out of a snapshot (`restore`) runs the same batches, with the pieces read from
//! the snapshot under its own lock (`From::Snapshot`).
//!
//! The copy runs in batches of `CLONE_BATCH_BLOCKS`, each reserving for itself and ending
//! in a whole state: a copy refused for space part-way returns the bytes done so far (a
//! short copy, as copy_file_range allows), and a crash leaves a prefix of the copy, as a
//! crash in the middle of a long write would. Each batch is an operation of its own, so
//! other operations go on between them; a caller that must answer others soon (a FUSE ring
//! worker serves its CPU's callers one request at a time) gives a time by which the copy
//! stops after its batch in progress, also a short copy (`copy_range_until`): sharing a file
//! of many extents takes time in proportion, and any user can make such a file in seconds
//! (docs/benchmarks.md, "Hostile shapes").
use super::file::{check_regular, MAX_FILE_SIZE};
use super::inode_flags::is_nocow;
use super::{privs, Durable, Fs, Inner, Ino, Kill, Reserve, WriteHow};
use crate::error::{Error, Result};
use idxfs_format::items::{EXTENT_INLINE, EXTENT_REGULAR};
use idxfs_format::BLOCK_SIZE;
use std::time::Instant;

const BS: u64 = BLOCK_SIZE;
/// File blocks one batch of a sharing copy covers (8 MiB).
pub(super) const CLONE_BATCH_BLOCKS: u64 = 2048;
/// Bytes a byte-by-byte copy moves per read and write.
const COPY_CHUNK: u64 = 1 << 20;

/// How a copy of `len` bytes goes, decided under the lock.
pub(super) enum Plan {
    /// Nothing to copy: the source ends at or before `src_off`.
    Nothing,
    /// Shares whole blocks: `blocks` of them from block `src_b` to block `dst_b`, and sets
    /// the destination's size to at least `dst_end`.
    Share {
        src_b: u64,
        dst_b: u64,
        blocks: u64,
        dst_end: u64,
    },
    /// Byte by byte, `len` bytes.
    Copy { len: u64 },
}

impl Fs {
    /// copy_file_range(2) from `src` at `src_off` to `dst` at `dst_off`, at most `len` bytes
    /// (fewer when the source ends first); returns how many were copied. Shares the source's
    /// blocks where it can (module docs). `kill` is what a write by this caller drops from
    /// the destination (`privs`). Overlapping ranges of one file are refused (EINVAL, as
    /// Linux does).
    pub fn copy_range(
        &self,
        src: Ino,
        src_off: u64,
        dst: Ino,
        dst_off: u64,
        len: u64,
        kill: Kill,
    ) -> Result<u64> {
        self.copy_range_until(src, src_off, dst, dst_off, len, kill, None)
    }

    /// `copy_range`, stopping after the batch (module docs) in progress at `until` if given:
    /// a short copy when more was left, never an empty one.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_range_until(
        &self,
        src: Ino,
        src_off: u64,
        dst: Ino,
        dst_off: u64,
        len: u64,
        kill: Kill,
        until: Option<Instant>,
    ) -> Result<u64> {
        if src_off.checked_add(len).is_none() {
            return Err(Error::Invalid("copy range past the largest offset"));
        }
        let (plan, hook) = {
            let mut g = self.lock();
            g.writable()?;
            let plan = g.plan_copy(src, src_off, dst, dst_off, len)?;
            (plan, g.policy.before_share.clone())
        };
        if let (Some(hook), Plan::Share { .. }) = (hook, &plan) {
            hook();
        }
        self.run_plan(plan, None, (src, src_off), (dst, dst_off), kill, until)
    }

    /// Carries out `plan` for a copy from `src` (inode, offset) to `dst`; `snapshot`: the
    /// snapshot `src` is in (`restore`), None for this file system; `until`: when it stops
    /// short (`copy_range_until`).
    pub(super) fn run_plan(
        &self,
        plan: Plan,
        snapshot: Option<&Fs>,
        (src, src_off): (Ino, u64),
        (dst, dst_off): (Ino, u64),
        kill: Kill,
        until: Option<Instant>,
    ) -> Result<u64> {
        match plan {
            Plan::Nothing => Ok(0),
            Plan::Copy { len } => {
                let from = snapshot.unwrap_or(self);
                self.copy_bytes(from, src, src_off, dst, dst_off, len, kill, until)
            }
            Plan::Share {
                src_b,
                dst_b,
                blocks,
                dst_end,
            } => {
                let span = (src_b, dst_b, blocks, dst_end);
                self.share_blocks(snapshot, src, dst, span, kill, until)
            }
        }
    }

    /// The byte-by-byte copy, through read and write (which drop privileges as any write);
    /// `from`: the file system `src` is read from (this one, or a snapshot of it). Stops
    /// short after the chunk in progress at `until`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn copy_bytes(
        &self,
        from: &Fs,
        src: Ino,
        src_off: u64,
        dst: Ino,
        dst_off: u64,
        len: u64,
        kill: Kill,
        until: Option<Instant>,
    ) -> Result<u64> {
        let mut done = 0;
        while done < len {
            if done > 0 && passed(until) {
                break;
            }
            let n = (len - done).min(COPY_CHUNK) as usize;
            let data = from.read(src, src_off + done, n)?;
            if data.is_empty() {
                break;
            }
            let how = WriteHow { times: true, kill };
            match self.write_with(dst, dst_off + done, &data, how) {
                Ok(w) => done += w as u64,
                Err(Error::NoSpace) if done > 0 => break,
                Err(e) => return Err(e),
            }
            if data.len() < n {
                break;
            }
        }
        Ok(done)
    }

    /// Shares `blocks` blocks of `src` from file block `src_b` as `dst`'s from `dst_b`
    /// (`span`: those three and the copy's end in `dst`), in batches; returns the bytes
    /// copied (fewer only when space ran out after the first batch, or `until` came). `snapshot`: `src` is that snapshot's, opened beside this file system
    /// (`restore`), whose pieces each batch reads under the snapshot's lock first; in a
    /// clone, blocks of its origin that it does not name are copied instead (`clones`,
    /// "Restores and rollbacks into a clone"), in block order with the shared batches, so a
    /// crash leaves a prefix of the copy as before.
    pub(super) fn share_blocks(
        &self,
        snapshot: Option<&Fs>,
        src: Ino,
        dst: Ino,
        (src_b, dst_b, blocks, dst_end): (u64, u64, u64, u64),
        kill: Kill,
        until: Option<Instant>,
    ) -> Result<u64> {
        // Fixed while the file system is open: the active tree never changes.
        let in_clone = match snapshot {
            Some(_) => self.lock().snapshots.clones.active_origin().is_some(),
            None => false,
        };
        let mut done = 0;
        while done < blocks {
            if done > 0 && passed(until) {
                break;
            }
            let mut n = (blocks - done).min(CLONE_BATCH_BLOCKS);
            let (sb, db) = (src_b + done, dst_b + done);
            // The batch's end: the copy's, or its last whole block's.
            let end = |n: u64| match done + n == blocks {
                true => dst_end,
                false => (dst_b + done + n) * BS,
            };
            let r = match snapshot {
                None => self.write_op(0, Reserve::Grow, Durable::Data, |g| {
                    g.share_batch(From::File(src), sb, dst, db, n, end(n), kill)
                }),
                Some(view) => {
                    let (pieces, sums) = {
                        let mut v = view.lock();
                        (
                            v.written_pieces(src, sb, n)?,
                            v.block_sums(src, sb, sb + n)?,
                        )
                    };
                    let from = || From::Snapshot {
                        pieces: &pieces,
                        sums: &sums,
                    };
                    // In a clone, the batch stops before the first of its origin's blocks
                    // the clone does not name (`named_prefix`), decided under the batch's
                    // lock; Err: the batch's first block is one, and so are this many.
                    let batch = self.write_op(0, Reserve::Grow, Durable::Data, |g| {
                        let m = match in_clone {
                            true => g.named_prefix(src, &pieces, sb, n)?,
                            false => n,
                        };
                        match (m, pieces.first()) {
                            (0, Some(&p)) => Ok(Err(g.origin_run(src, p, sb, false)?.max(1))),
                            _ => (g.share_batch(from(), sb, dst, db, m, end(m), kill))
                                .map(|k| Ok((m, k))),
                        }
                    });
                    match batch {
                        Ok(Ok((m, k))) => {
                            n = m;
                            Ok(k)
                        }
                        Ok(Err(k)) => {
                            // Those of the origin's blocks are copied (`clones`).
                            let at = db * BS;
                            let len = (k * BS).min(dst_end - at);
                            match self.copy_bytes(view, src, sb * BS, dst, at, len, kill, until) {
                                Ok(c) if c == len => {
                                    done += k;
                                    continue;
                                }
                                Ok(c) => return Ok(at - dst_b * BS + c),
                                Err(Error::NoSpace) if done > 0 => break,
                                Err(e) => return Err(e),
                            }
                        }
                        Err(e) => Err(e),
                    }
                }
            };
            match r {
                Ok(k) if k == n => done += n,
                Ok(k) => {
                    // The destination grew past the copy's end meanwhile: its last block
                    // keeps the bytes past the end, so that block is copied, not shared.
                    done += k;
                    let at = (dst_b + done) * BS;
                    let tail = dst_end - at;
                    let src_at = (src_b + done) * BS;
                    let from = snapshot.unwrap_or(self);
                    let copied = self.copy_bytes(from, src, src_at, dst, at, tail, kill, None)?;
                    return Ok(at - dst_b * BS + copied);
                }
                Err(Error::NoSpace) if done > 0 => break,
                Err(e) => return Err(e),
            }
        }
        // Bytes: whole blocks, the last one cut at the copy's end.
        Ok((done * BS).min(dst_end - dst_b * BS))
    }
}

/// Whether `until` has come (never, without one).
fn passed(until: Option<Instant>) -> bool {
    until.is_some_and(|t| Instant::now() >= t)
}

impl Inner {
    fn plan_copy(
        &mut self,
        src: Ino,
        src_off: u64,
        dst: Ino,
        dst_off: u64,
        len: u64,
    ) -> Result<Plan> {
        let s = self.held_inode(src)?;
        check_regular(&s)?;
        let d = self.held_inode(dst)?;
        check_regular(&d)?;
        let size = s.size.get();
        let len = len.min(size.saturating_sub(src_off));
        if len == 0 {
            return Ok(Plan::Nothing);
        }
        if dst_off.checked_add(len).is_none_or(|e| e > MAX_FILE_SIZE) {
            return Err(Error::FileTooBig);
        }
        if src == dst && src_off < dst_off + len && dst_off < src_off + len {
            return Err(Error::Invalid(
                "copy onto an overlapping range of the same file",
            ));
        }
        let files_share = !is_nocow(&s)
            && !is_nocow(&d)
            && !self.is_inline(src, &s)?
            && !self.is_inline(dst, &d)?;
        let sizes = (size, d.size.get());
        Ok(Plan::of(src_off, dst_off, len, sizes, files_share))
    }

    /// One batch: `n` blocks of `src` from file block `sb` become `dst`'s from `db`, whose
    /// old extents and sums there go first; the destination's size becomes at least `end`.
    /// Reserves for itself before the first change. Returns the blocks shared: one fewer
    /// when `end` cuts the last block and the destination has grown past it since the plan
    /// (that block's bytes past `end` are the destination's; the caller copies the rest).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn share_batch(
        &mut self,
        src: From<'_>,
        sb: u64,
        dst: Ino,
        db: u64,
        n: u64,
        end: u64,
        kill: Kill,
    ) -> Result<u64> {
        // Checked again under this lock: either file may have changed since the plan (a
        // snapshot's never does: its plan checked it).
        let d = self.held_inode(dst)?;
        check_regular(&d)?;
        if let From::File(src) = src {
            let s = self.held_inode(src)?;
            if is_nocow(&s) || self.is_inline(src, &s)? {
                return Err(Error::NotSupported("sharing with a NOCOW or inline file"));
            }
        }
        let n = if end.is_multiple_of(BS) || d.size.get() <= end {
            n
        } else {
            n - 1
        };
        let end = end.min((db + n) * BS);
        if n == 0 {
            return Ok(0);
        }
        if is_nocow(&d) || self.is_inline(dst, &d)? {
            return Err(Error::NotSupported("sharing with a NOCOW or inline file"));
        }
        // Extents past the size not freed yet would show below the new size.
        if end > d.size.get() && self.trimming(dst) && !self.finish_trim(dst)? {
            return Err(Error::NoSpace);
        }
        let drops = self.write_drops(dst, kill)?;
        if drops.any() {
            self.reserve(4, Reserve::Shrink)?;
            self.apply_drop(dst, drops)?;
            self.checkpoint();
        }
        // The destination's range is emptied first, in batches of its own.
        if !self.punch_batched(dst, db * BS, (db + n) * BS)? {
            return Err(Error::NoSpace);
        }
        let shared = match src {
            From::File(src) => {
                let pieces = self.written_pieces(src, sb, n)?;
                let sums = self.block_sums(src, sb, sb + n)?;
                self.link_pieces(dst, sb, db, &pieces, &sums, Source::FileSystem)?
            }
            From::Snapshot { pieces, sums } => {
                // The batch read them for `n` blocks; it may take one fewer.
                let cut: Vec<Piece> = pieces
                    .iter()
                    .filter(|p| p.0 < sb + n)
                    .map(|&(fb, disk, k, gen)| (fb, disk, k.min(sb + n - fb), gen))
                    .collect();
                self.link_pieces(dst, sb, db, &cut, sums, Source::Snapshot)?
            }
        };
        let now = self.now();
        self.modify_inode(dst, |i| {
            i.size = i.size.get().max(end).into();
            i.alloc_bytes = (i.alloc_bytes.get() + shared * BS).into();
            i.mtime = now;
            i.ctime = now;
            i.mode = privs::after(i.mode.get(), kill).into();
        })?;
        Ok(n)
    }

    /// The written pieces of `src`'s blocks [sb, sb + n): (file block, disk block, blocks,
    /// generation); holes and preallocated extents are none (they read as zeros). Inline data
    /// cannot be shared.
    pub(super) fn written_pieces(&mut self, src: Ino, sb: u64, n: u64) -> Result<Vec<Piece>> {
        let exts = self.extents(src, sb * BS, (sb + n) * BS)?;
        if exts.iter().any(|e| e.item.kind == EXTENT_INLINE) {
            return Err(Error::NotSupported("sharing inline data"));
        }
        Ok(pieces_in(&exts, sb, n))
    }

    /// How many of a snapshot's file blocks [sb, sb + n), whose written `pieces` they are,
    /// may be linked into the active clone from `sb` on: up to the first block of its
    /// origin's (`clones`) that the clone cannot be shown to name. One the clone's own
    /// extent of the same file block names, it names: a restore gives it one more name (a
    /// count, `shared`), as a copy inside the file system would. Any other may be named by
    /// no extent of the clone, and then it is the origin's alone, held or named for another
    /// tree: no count or unhold may touch it, and the caller copies its bytes. Nothing says
    /// whether another extent of the clone names it (idxfs keeps no back references), so
    /// only the same file and block are asked.
    pub(super) fn named_prefix(
        &mut self,
        ino: Ino,
        pieces: &[Piece],
        sb: u64,
        n: u64,
    ) -> Result<u64> {
        for &(fb, disk, k, gen) in pieces.iter().filter(|p| p.0 < sb + n) {
            if !self.snapshots.clones.of_origin(gen) {
                continue;
            }
            let piece = (fb, disk, k.min(sb + n - fb), gen);
            let named = self.origin_run(ino, piece, fb, true)?;
            if named < piece.2 {
                return Ok(fb + named - sb);
            }
        }
        Ok(n)
    }

    /// From file block `at` of `piece` (a snapshot's piece of file `ino`, as old as the
    /// active clone's origin), how many blocks in a row the clone's extents of the same file
    /// blocks name (`named`), or do not (`named_prefix`).
    pub(super) fn origin_run(
        &mut self,
        ino: Ino,
        piece: Piece,
        at: u64,
        named: bool,
    ) -> Result<u64> {
        let (fb, disk, k, _) = piece;
        let end = fb + k;
        // The clone's written extents there: (first block, end, names the piece's blocks).
        let spans: Vec<(u64, u64, bool)> = (self.extents(ino, at * BS, end * BS)?.iter())
            .filter(|e| e.item.kind == EXTENT_REGULAR)
            .map(|e| {
                let (es, d) = (e.offset / BS, e.item.disk_block.get());
                let et = es + e.item.blocks.get();
                (es.max(at), et.min(end), d + fb == disk + es)
            })
            .filter(|s| s.0 < s.1)
            .collect();
        let (mut x, mut i) = (at, 0);
        while x < end {
            while spans.get(i).is_some_and(|s| s.1 <= x) {
                i += 1;
            }
            let (names, until) = match spans.get(i) {
                Some(&(s, t, same)) if s <= x => (same, t),
                // A hole, or nothing written, up to the next extent.
                Some(&(s, _, _)) => (false, s),
                None => (false, end),
            };
            if names != named {
                break;
            }
            x = until;
        }
        Ok(x - at)
    }

    /// Gives `dst` extents naming `pieces` (of a source's file blocks from `sb`, placed from
    /// `db`), with the source's `sums` beside them, after reserving for it all; `from`
    /// says how the blocks become the file system's again. The destination's range must be
    /// empty. Returns the blocks linked.
    pub(super) fn link_pieces(
        &mut self,
        dst: Ino,
        sb: u64,
        db: u64,
        pieces: &[Piece],
        sums: &[Option<u32>],
        from: Source,
    ) -> Result<u64> {
        self.reserve_nodes(self.link_nodes(pieces, from), 0, Reserve::Grow)?;
        self.link_reserved(dst, sb, db, pieces, sums, from)
    }

    /// What `link_pieces` may allocate: for a caller that reserves for it with more.
    pub(super) fn link_nodes(&self, pieces: &[Piece], from: Source) -> u64 {
        let shared: u64 = pieces.iter().map(|p| p.2).sum();
        let items = pieces.len() as u64 + 2;
        let mut nodes = self.run_nodes(items, items * 57)
            + self.sum_nodes(shared)
            + self.shared_nodes(pieces.len() as u64)
            + 2 * self.item_nodes();
        if from == Source::Snapshot {
            // Each piece may cut a held run in two (`unhold`).
            nodes += self.roots_growth(3 * pieces.len() as u64);
        }
        nodes
    }

    /// `link_pieces` once the caller has reserved `link_nodes` (with whatever else it does).
    pub(super) fn link_reserved(
        &mut self,
        dst: Ino,
        sb: u64,
        db: u64,
        pieces: &[Piece],
        sums: &[Option<u32>],
        from: Source,
    ) -> Result<u64> {
        let shared: u64 = pieces.iter().map(|p| p.2).sum();
        for &(fb, disk, k, gen) in pieces {
            match from {
                Source::FileSystem => self.share(disk, k)?,
                // A clone's origin's blocks, which it names (`named_prefix`): one more name.
                Source::Snapshot if self.snapshots.clones.of_origin(gen) => self.share(disk, k)?,
                Source::Snapshot => self.adopt_blocks(disk, k)?,
            }
            let to = db + (fb - sb);
            self.insert_extent(dst, to * BS, disk, k, gen)?;
            // The source's sums, in runs of blocks that have one.
            let mut at = fb;
            while at < fb + k {
                let i = (at - sb) as usize;
                let run: Vec<u32> = sums
                    .get(i..)
                    .unwrap_or_default()
                    .iter()
                    .take((fb + k - at) as usize)
                    .map_while(|s| *s)
                    .collect();
                if run.is_empty() {
                    at += 1;
                    continue;
                }
                self.put_sums(dst, db + (at - sb), &run)?;
                at += run.len() as u64;
            }
        }
        Ok(shared)
    }
}

/// The written pieces among `exts` (a file's extents, none inline) of its blocks
/// [sb, sb + n): `Inner::written_pieces`.
pub(super) fn pieces_in(exts: &[super::file::Ext], sb: u64, n: u64) -> Vec<Piece> {
    let mut pieces = Vec::new();
    for e in exts {
        if e.item.kind != EXTENT_REGULAR {
            continue;
        }
        let (es, et) = (e.offset / BS, e.offset / BS + e.item.blocks.get());
        let (ps, pt) = (es.max(sb), et.min(sb + n));
        if ps < pt {
            let disk = e.item.disk_block.get() + (ps - es);
            pieces.push((ps, disk, pt - ps, e.item.generation.get()));
        }
    }
    pieces
}

impl Plan {
    /// The plan of a copy of `len` bytes (cut at the source's end, not zero, and checked to
    /// fit the destination) from `src_off` to `dst_off`, between files of `sizes` (source,
    /// destination); `files_share`: neither is NOCOW or inline.
    pub(super) fn of(
        src_off: u64,
        dst_off: u64,
        len: u64,
        sizes: (u64, u64),
        files_share: bool,
    ) -> Plan {
        let dst_end = dst_off + len;
        // The source's partial last block is shared only when the copy ends the destination
        // too, so the bytes past the source's end read as zeros on both sides.
        let whole = len.is_multiple_of(BS) || (src_off + len == sizes.0 && dst_end >= sizes.1);
        let aligned = src_off.is_multiple_of(BS) && dst_off.is_multiple_of(BS);
        if !(aligned && whole && files_share) {
            return Plan::Copy { len };
        }
        Plan::Share {
            src_b: src_off / BS,
            dst_b: dst_off / BS,
            blocks: len.div_ceil(BS),
            dst_end,
        }
    }
}

/// The source of a batch (`Inner::share_batch`).
pub(super) enum From<'a> {
    /// A file of this file system, read under the batch's lock.
    File(Ino),
    /// A snapshot's file, read beforehand under its own lock (`restore`): its written
    /// pieces and data sums, from the batch's first block.
    Snapshot {
        pieces: &'a [Piece],
        sums: &'a [Option<u32>],
    },
}

/// A written piece of a source file: (file block, disk block, blocks, extent generation).
pub(super) type Piece = (u64, u64, u64, u64);

/// Where shared blocks come from (`Inner::link_pieces`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// A file of the file system: the blocks gain a count (`shared`).
    FileSystem,
    /// A snapshot's file (`restore`): the blocks become the file system's again.
    Snapshot,
}
