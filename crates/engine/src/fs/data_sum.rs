//! Data checksums: the crc32c of every file block written copy-on-write, kept in `DataSum`
//! items beside the file's extents (docs/format.md), checked on every read from the device.
//!
//! Which blocks have one: a block gets its sum in the same operation that links it, so no
//! durable state (commit or fsync batch) names a new block without its sum, nor a sum
//! without its block. Sums are keyed by file block, so an extent that is cut, merged or
//! converted keeps its blocks' sums where they are; removing an extent removes the sums of
//! its range in the same operation (the freeing batches of holes and truncates,
//! `clear_sum_edges` and `clear_sum_batch`), except where a write replaces the range's
//! blocks (`Inner::punch_now`): its own sums then replace theirs (`put_sums`). Deleting a
//! file deletes them with its other items.
//!
//! Which blocks have none, as btrfs: inline data (the node's checksum covers it),
//! preallocated blocks (they read as zeros), and blocks written in place without the
//! copy-on-write guarantee, which a crash may tear so that no one sum could be right
//! afterwards: a NOCOW file's (it never has any: the flag is set only on an empty file) and
//! a block a full device made a copy-on-write file overwrite in place (its sum goes in that
//! operation). A preallocated block a write fills in place does get one: until the
//! conversion is durable every durable state calls it preallocated, so its sum and its bytes
//! become durable together.
//!
//! A mismatch on a read answers EIO (`Error::DataSum`), counts `data_sum_errors` and logs one
//! line. It is not metadata damage: the file system goes on, and other blocks read as usual.
//! `OpenOptions::datasum` off (`-o nodatasum`) writes no new sums, but still removes the
//! sums of every range it rewrites, so a sum never outlives its bytes.
//!
//! An image that never had a sum (`COMPAT_RO_DATA_SUMS` unset and not wanted) takes no
//! lookups for them.
use super::inode_flags::is_nocow;
use super::{Inner, Ino};
use crate::counters::Counters;
use crate::error::{Error, Result};
use idxfs_blockdev::BlockDevice;
use idxfs_format::items::{block_sum, BlockSums, SUM_GROUP_BLOCKS};
use idxfs_format::versions::COMPAT_RO_DATA_SUMS;
use idxfs_format::{ItemType, Key, BLOCK_SIZE};

const G: u64 = SUM_GROUP_BLOCKS;
const BS: u64 = BLOCK_SIZE;

pub(crate) fn sum_key(ino: Ino, group: u64) -> Key {
    Key::new(ino, ItemType::DataSum, group)
}

/// The sums of whole blocks, in order.
pub(crate) fn sums_of(blocks: &[u8]) -> Vec<u32> {
    debug_assert!(blocks.len().is_multiple_of(BS as usize));
    blocks.chunks(BS as usize).map(block_sum).collect()
}

/// Where a mismatch was found, for its log line and error.
pub(crate) struct SumCheck<'a> {
    pub ino: Ino,
    pub counters: &'a Counters,
    /// Count and log a mismatch. Off for a read outside the lock, which may meet a block
    /// a full device's in-place overwrite changed after the read mapped it (`in_place`):
    /// such a read runs again under the lock, which reports what it finds.
    pub report: bool,
}

impl SumCheck<'_> {
    /// Reads `len` bytes at device byte `disk` into `out`, checking every block that has a sum
    /// (`sums[i]` for the device block `disk / BS + i`): the whole block is read for one
    /// read only in part. `file_block` is the file's block at `disk / BS`, for the message.
    pub fn read(
        &self,
        dev: &dyn BlockDevice,
        out: &mut [u8],
        disk: u64,
        file_block: u64,
        sums: &[Option<u32>],
    ) -> Result<()> {
        if sums.iter().all(Option::is_none) {
            dev.read_at(out, disk)?;
            return Ok(());
        }
        let d0 = disk / BS * BS;
        let d1 = (disk + out.len() as u64).div_ceil(BS) * BS;
        if d0 == disk && d1 == disk + out.len() as u64 {
            dev.read_at(out, d0)?;
            return self.verify(out, d0, file_block, sums);
        }
        let mut buf = vec![0u8; (d1 - d0) as usize];
        dev.read_at(&mut buf, d0)?;
        self.verify(&buf, d0, file_block, sums)?;
        let at = (disk - d0) as usize;
        let n = out.len();
        out.copy_from_slice(&buf[at..at + n]);
        Ok(())
    }

    /// Checks whole blocks read from device byte `d0` against `sums`.
    fn verify(&self, buf: &[u8], d0: u64, file_block: u64, sums: &[Option<u32>]) -> Result<()> {
        for (i, (block, want)) in buf.chunks(BS as usize).zip(sums).enumerate() {
            let Some(want) = *want else { continue };
            let have = block_sum(block);
            let fb = file_block + i as u64;
            if have == want {
                continue;
            }
            if self.report {
                Counters::inc(&self.counters.data_sum_errors);
                log::error!(
                    "data checksum mismatch: inode {} block {fb} (device block {}): crc32c {have:08x}, expected {want:08x}; the read gives EIO",
                    self.ino,
                    d0 / BS + i as u64
                );
            }
            return Err(Error::DataSum {
                ino: self.ino,
                block: fb,
            });
        }
        Ok(())
    }
}

impl Inner {
    /// Whether any item of this image may be a sum: the feature is on or wanted.
    pub(crate) fn may_have_sums(&self) -> bool {
        (self.txn.sb.compat_ro.get() | self.txn.compat_ro_wanted) & COMPAT_RO_DATA_SUMS != 0
    }

    /// The sums of blocks [b0, b1) of `ino`: entry i for block b0 + i.
    pub(crate) fn block_sums(&mut self, ino: Ino, b0: u64, b1: u64) -> Result<Vec<Option<u32>>> {
        let mut out = vec![None; (b1 - b0) as usize];
        if b1 <= b0 || !self.may_have_sums() {
            return Ok(out);
        }
        let tree = self.fs_tree;
        let mut err = None;
        tree.scan(
            &mut self.store,
            sum_key(ino, b0 / G),
            sum_key(ino, (b1 - 1) / G + 1),
            |k, v| match BlockSums::decode(v, format_args!("data sums {k}")) {
                Ok(s) => {
                    for (i, sum) in s.sums.iter().enumerate() {
                        let b = k.offset * G + i as u64;
                        if (b0..b1).contains(&b) {
                            out[(b - b0) as usize] = *sum;
                        }
                    }
                    Ok(true)
                }
                Err(c) => {
                    err = Some(c);
                    Ok(false)
                }
            },
        )?;
        match err {
            Some(c) => Err(c.into()),
            None => Ok(out),
        }
    }

    /// Rewrites the group item `g` of `ino` with `f` applied (deleting it when no sum is
    /// left).
    fn edit_group(&mut self, ino: Ino, g: u64, f: impl FnOnce(&mut BlockSums)) -> Result<()> {
        let key = sum_key(ino, g);
        let tree = self.fs_tree;
        let old = tree.get(&mut self.store, &key)?;
        let mut s = match &old {
            Some(v) => BlockSums::decode(v, format_args!("data sums {key}"))?,
            None => BlockSums::default(),
        };
        f(&mut s);
        match s.encode() {
            Some(v) => self.fs_tree.put(&mut self.store, key, v),
            None if old.is_some() => self.fs_tree.delete(&mut self.store, &key).map(|_| ()),
            None => Ok(()),
        }
    }

    /// Gives blocks `b0..` of `ino` the sums `sums` (what a write just linked there), or, with
    /// sums off, takes away the ones they had.
    pub(crate) fn put_sums(&mut self, ino: Ino, b0: u64, sums: &[u32]) -> Result<()> {
        let b1 = b0 + sums.len() as u64;
        if sums.is_empty() || is_nocow(&self.inode(ino)?) {
            // A NOCOW file has none, ever (its blocks are overwritten in place): its copy-on-
            // write parts, the holes it fills, get none either.
            return Ok(());
        }
        if !self.policy.datasum {
            return self.clear_sums(ino, b0, b1);
        }
        if self.txn.sb.compat_ro.get() & COMPAT_RO_DATA_SUMS == 0 {
            self.txn.compat_ro_wanted |= COMPAT_RO_DATA_SUMS;
        }
        let mut g = b0 / G;
        while g * G < b1 {
            self.edit_group(ino, g, |s| {
                for b in (g * G).max(b0)..((g + 1) * G).min(b1) {
                    s.sums[(b - g * G) as usize] = Some(sums[(b - b0) as usize]);
                }
            })?;
            g += 1;
        }
        Ok(())
    }

    /// Takes the sums of blocks [b0, b1) of `ino` away in one go: for a range the caller's
    /// reservation covers (a write's).
    pub(crate) fn clear_sums(&mut self, ino: Ino, b0: u64, b1: u64) -> Result<()> {
        self.clear_sum_edges(ino, b0, b1)?;
        while self.clear_sum_batch(ino, b0, b1)? {}
        Ok(())
    }

    /// Takes the sums of [b0, b1) out of the (at most two) group items the range covers in
    /// part; `clear_sum_batch` removes the groups it covers whole.
    pub(crate) fn clear_sum_edges(&mut self, ino: Ino, b0: u64, b1: u64) -> Result<()> {
        if b1 <= b0 || !self.may_have_sums() {
            return Ok(());
        }
        let mut edges = vec![b0 / G];
        if !b1.is_multiple_of(G) && (b1 - 1) / G != b0 / G {
            edges.push((b1 - 1) / G);
        }
        for g in edges {
            let (s, t) = ((g * G).max(b0), ((g + 1) * G).min(b1));
            if s == g * G && t == (g + 1) * G {
                continue; // whole: the batch takes it
            }
            // A group without an item stays without one (`edit_group` writes nothing).
            self.edit_group(ino, g, |sums| {
                for b in s..t {
                    sums.sums[(b - g * G) as usize] = None;
                }
            })?;
        }
        Ok(())
    }

    /// Removes one leaf's worth of the group items [b0, b1) covers whole. Returns whether any
    /// went (more may remain).
    pub(crate) fn clear_sum_batch(&mut self, ino: Ino, b0: u64, b1: u64) -> Result<bool> {
        if b1 <= b0 || !self.may_have_sums() {
            return Ok(false);
        }
        let (g0, g1) = (b0.div_ceil(G), b1 / G);
        if g0 >= g1 {
            return Ok(false);
        }
        let removed = self.fs_tree.delete_batch(
            &mut self.store,
            sum_key(ino, g0),
            sum_key(ino, g1),
            super::file::FREE_BATCH_ITEMS,
        )?;
        Ok(!removed.is_empty())
    }
}
