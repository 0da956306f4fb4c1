//! The fsync log (seed 003): an fsync writes the items changed since the last fsync or
//! commit, not the transaction's every changed node.
//!
//! A commit writes each tree node a transaction changed, so its cost grows with how spread
//! the changes are: 100 creates in a directory of a million names touch about 100 leaves of
//! the name-hash index. An fsync instead appends one batch to the log (format: `log.rs` of the
//! format crate): the current value, or absence, of each item of the fsynced handle's tree
//! whose key changed since that tree's last batch (`TreeKeys`), and the tree's inode
//! counters; the batch of a tree opened beside the active one starts with a record naming it
//! (`fs::trees`). Its cost follows what changed, never the size of a directory. The next
//! commit makes all of it part of the trees and starts an empty log.
//!
//! What keeps a batch true until that commit:
//! - Data before names: file data is written to newly allocated blocks before the items that
//!   point at it exist; a batch flushes first when data was written since the last flush.
//! - The batch is built under the operation lock and written and flushed without it; how
//!   concurrent batches keep the chain sound is in `crate::log_io`.
//! - No block a batch may name is reused before the commit: once a batch is written, freeing
//!   data allocated in the same transaction pins it (`Log::written`), as freeing committed
//!   data always does. Log blocks are freed only by the commit, pinned too.
//! - A chain is appended to only by the mount whose commit named it: after open (with or
//!   without a replay) fsync commits until this mount's first commit names a fresh chain. So
//!   every block carrying a chain's generation was written into that chain by one writer.
//!
//! Replay at open ([`replay`]): follow the chain, keep whole batches, and apply each item's
//! last state over the committed trees, each in the tree its batch names (a parked
//! subvolume's new root and counters go into its item). Space follows from the items: blocks the logged
//! extents name and the committed ones did not are marked used; blocks only the committed
//! extents named are let go of by those extents' generation, as the operation did (freed,
//! held for a snapshot, or left to a clone's origin: `fs::clones`). Then a commit (on a
//! read-write open) makes the result the new committed state. The replay's tree changes
//! allocate nodes before the freed extents come back, so on a device too full for them the
//! open fails with NoSpace, having written nothing: the image keeps its committed state and
//! its log.
use crate::btree::Tree;
use crate::counters::Counters;
use crate::error::Result;
use crate::fs::Inner;
use crate::log_io::{LogBatch, LogIo, LogSync};
use crate::space::Kind;
use idxfs_format::items::{decode_extent, EXTENT_INLINE};
use idxfs_format::log::{
    decode_log_block, decode_log_records, encode_log_block, encode_log_record, LogExpect,
    LogRecord, LOG_BATCH_END, LOG_PAYLOAD,
};
use idxfs_format::superblock::RootPtr;
use idxfs_format::versions::INCOMPAT_LOG_TREES;
use idxfs_format::{ensure, Corrupt, ItemType, Key, BLOCK_SIZE, MAX_INO, ROOT_INO, SUPER_COPIES};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Most distinct items one batch logs; past it an fsync commits instead, which writes each
/// changed node once (cheaper than logging that many items one by one).
const MAX_BATCH_ITEMS: usize = 1 << 16;

/// Keys of the items of one fs tree changed since that tree's last fsync batch or the
/// commit, repeats included: what its next batch logs. Each open tree has its own
/// (`fs::trees` swaps them with the tree in hand).
#[derive(Debug, Default)]
pub struct TreeKeys {
    keys: Vec<Key>,
    /// More than `KEYS_MAX` changed: the next fsync in this tree commits instead.
    overflow: bool,
}

impl TreeKeys {
    /// Keys kept for the next fsync (about 6 MiB); a transaction that changes more without
    /// an fsync is cheaper to commit than to log.
    const KEYS_MAX: usize = 1 << 18;

    /// Forgets the keys: a commit or an fsync batch took them.
    pub fn clear(&mut self) {
        self.keys.clear();
        self.overflow = false;
    }
}

/// What the next fsync logs: the keys of the tree in hand, which the trees report each
/// change into (`Store::changes`, `btree::changes`), and whether the transaction changed
/// state no batch can carry.
#[derive(Debug, Default)]
pub struct ChangedKeys {
    /// The tree in hand's.
    pub tree: TreeKeys,
    /// The next fsync in any tree commits instead of logging: the transaction changed state
    /// outside the fs trees that a replay would not redo (held runs let go of: `snapshot`),
    /// which a block another tree's batch names may depend on.
    commit_next: bool,
}

impl ChangedKeys {
    /// Notes that the item `key` of tree `owner` changed; only fs trees are logged.
    #[inline]
    pub fn note(&mut self, owner: u64, key: Key) {
        if owner == idxfs_format::TREE_FS {
            let t = &mut self.tree;
            if t.keys.len() < TreeKeys::KEYS_MAX {
                t.keys.push(key);
            } else {
                t.overflow = true;
            }
        }
    }

    /// The next fsync commits instead of logging (see the field).
    pub fn commit_next(&mut self) {
        self.commit_next = true;
    }

    /// Forgets the tree in hand's keys and whether to commit: the commit took them.
    pub fn clear(&mut self) {
        self.tree.clear();
        self.commit_next = false;
    }
}

/// The running transaction's log chain.
#[derive(Debug, Default)]
pub struct Log {
    /// Where the next batch's first block goes (allocated, not written). None: no chain in
    /// this transaction, so fsync commits.
    next: Option<u64>,
    /// The generation of the commit whose superblock names the chain.
    generation: u64,
    /// Chain position of `next`.
    seq: u64,
    /// Every block of the chain, `next` included: the commit frees them.
    blocks: Vec<u64>,
    /// A batch was built in this transaction (see the module notes on freeing data).
    written: bool,
    /// The chain reuses a lost superblock copy's generation (`TxnState::zero_log_head`):
    /// each block it links to next is zeroed and flushed before the batch naming it is
    /// written, so the replay never follows a link into the lost chain's stale blocks.
    pub zero_next: bool,
    /// The order and durability of batches written outside the lock (`log_io`); one for
    /// the mount's life.
    pub io: Arc<LogIo>,
    /// The last batch numbered before the commit in flight froze: its reap waits until
    /// every batch up to it has ended, so no late write lands on a log block it releases.
    pub fence: u64,
    /// File data was written since the last device flush: a batch that may name it flushes
    /// first, so the data is durable before anything points at it. A commit's flush covers
    /// it (the commit starts a new `Log`).
    pub data_unflushed: bool,
}

impl Log {
    /// Whether file data was written since the last flush, under the lock or outside it
    /// (`LogIo::note_data_written`); the caller flushes it before anything may name it.
    pub fn take_data_unflushed(&mut self) -> bool {
        let outside = self.io.take_data_written();
        std::mem::take(&mut self.data_unflushed) | outside
    }

    /// Whether data freed now may be reused before the commit: not once a batch may name it.
    pub fn frees_must_wait(&self) -> bool {
        self.written
    }
}

impl Inner {
    /// fsync through the log, the part under the lock: builds the batch (see `log_io` for
    /// the part after it). `LogSync::Commit`: no log to append to (or the change is too large
    /// for one batch), so the caller commits. An error fails the file system, as a failed
    /// commit does (so nothing appends to the log again): the keys taken for the batch are
    /// gone, so no later batch could be complete.
    pub(crate) fn log_build(&mut self) -> Result<LogSync> {
        let Some(first) = self.log.next else {
            return Ok(LogSync::Commit);
        };
        let r = self.log_batch(first);
        if let Err(e) = &r {
            self.fail(format!("fsync log write failed: {e}"));
        }
        r
    }

    fn log_batch(&mut self, first: u64) -> Result<LogSync> {
        if self.txn.incompat_wanted != 0 || self.txn.compat_ro_wanted != 0 {
            // An item needs a feature bit the committed superblock lacks: only a commit may
            // make it durable (`Inner::require_incompat`).
            return Ok(LogSync::Commit);
        }
        // What a commit would write first: orphan items and cached inode changes.
        self.write_new_orphans()?;
        self.write_back_inodes()?;
        let changed = &self.store.changes.log;
        if changed.commit_next || changed.tree.overflow {
            return Ok(LogSync::Commit);
        }
        // A tree beside the primary names itself in its batches (`LogRecord::Tree`), which
        // only a chain whose superblock has the bit may carry: a commit made while a tree is
        // open beside sets it (`txn`), so the first fsync after the open commits.
        let beside = self.in_hand() != self.trees.primary;
        if beside && self.txn.sb.incompat.get() & INCOMPAT_LOG_TREES == 0 {
            return Ok(LogSync::Commit);
        }
        if changed.tree.keys.is_empty() {
            // Earlier batches may still be on their way: this fsync's changes are in them.
            return Ok(LogSync::Wait {
                upto: self.log.io.issued(),
                flush_data: self.log.take_data_unflushed(),
            });
        }
        let mut keys = std::mem::take(&mut self.store.changes.log.tree.keys);
        keys.sort_unstable();
        keys.dedup();
        if keys.len() > MAX_BATCH_ITEMS {
            return Ok(LogSync::Commit);
        }
        let tree = self.fs_tree;
        let mut payload = Vec::new();
        if beside {
            encode_log_record(
                &LogRecord::Tree(self.snapshots.clones.active_id()),
                &mut payload,
            );
        }
        for k in keys {
            let r = match tree.get(&mut self.store, &k)? {
                Some(v) => LogRecord::Put(k, v),
                None => LogRecord::Delete(k),
            };
            encode_log_record(&r, &mut payload);
        }
        encode_log_record(
            &LogRecord::Counters {
                next_ino: self.txn.next_ino,
                inode_count: self.txn.inode_count,
            },
            &mut payload,
        );
        let nblocks = payload.len().div_ceil(LOG_PAYLOAD);
        // The batch's blocks are `first` and nblocks - 1 more; one more is the next batch's.
        let mut chain = vec![first];
        for _ in 0..nblocks {
            match self.store.alloc.alloc(1, 1, Kind::Meta) {
                Some((b, _)) => chain.push(b),
                None => {
                    for &b in &chain[1..] {
                        self.store.alloc.free(b, 1, true)?;
                    }
                    return Ok(LogSync::Commit);
                }
            }
        }
        let bs = BLOCK_SIZE as usize;
        if self.log.zero_next {
            // Rare (one chain after an open that met an unusable superblock copy): written
            // and flushed under the lock, before the batch that links to it exists. A write
            // the device refuses makes this fsync a commit, as a refused batch does
            // (`Shared::finish_log`); a failed flush stops the file system.
            let dev = &self.store.dev;
            if dev
                .write_at(&vec![0u8; bs], chain[nblocks] * BLOCK_SIZE)
                .is_err()
            {
                for &b in &chain[1..] {
                    self.store.alloc.free(b, 1, true)?;
                }
                return Ok(LogSync::Commit);
            }
            dev.flush()?;
        }
        // Each block encoded where it goes; contiguous blocks go out in one write.
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        for (i, chunk) in payload.chunks(LOG_PAYLOAD).enumerate() {
            let at = LogExpect {
                fsid: self.store.fsid,
                generation: self.log.generation,
                seq: self.log.seq + i as u64,
                block: chain[i],
            };
            let mut out = vec![0u8; bs];
            encode_log_block(&at, chain[i + 1], i + 1 == nblocks, chunk, &mut out);
            match runs.last_mut() {
                Some((start, buf)) if *start + (buf.len() / bs) as u64 == chain[i] => {
                    buf.extend_from_slice(&out)
                }
                _ => runs.push((chain[i], out)),
            }
        }
        self.log.seq += nblocks as u64;
        self.log.next = Some(chain[nblocks]);
        self.log.blocks.extend_from_slice(&chain[1..]);
        self.log.written = true;
        Counters::inc(&self.store.counters.log_batches);
        let flush_data = self.log.take_data_unflushed();
        Ok(LogSync::Write(LogBatch::new(
            self.log.io.clone(),
            flush_data,
            runs,
        )))
    }

    /// Commit, before the space tree is written: the chain's blocks are free in the new
    /// commit (pinned until it is durable, so a crash before then still finds the chain).
    pub(crate) fn log_release(&mut self) -> Result<()> {
        for b in std::mem::take(&mut self.log.blocks) {
            self.store.alloc.free(b, 1, false)?;
        }
        self.log.next = None;
        Ok(())
    }

    /// Commit, once the superblock's other fields are set: a block for the next
    /// transaction's chain, named by the superblock of generation `gen`. Allocated after the
    /// space tree was written, so the committed bitmaps call it free (nothing in the
    /// committed state uses it). None when no block is free: fsync then commits.
    pub(crate) fn log_start(&mut self, gen: u64) -> RootPtr {
        self.store.changes.log.clear();
        let io = self.log.io.clone();
        let fence = io.issued();
        // A new chain, with no data unflushed: the commit's flush (its step 4) covers the data
        // written before its freeze, which is now, outside the lock too.
        io.take_data_written();
        self.log = Log {
            io,
            fence,
            ..Log::default()
        };
        let Some((b, _)) = self.store.alloc.alloc(1, 1, Kind::Meta) else {
            return RootPtr::default();
        };
        self.log.next = Some(b);
        self.log.generation = gen;
        self.log.blocks = vec![b];
        RootPtr {
            block: b.into(),
            generation: gen.into(),
            level: 0.into(),
            reserved: 0.into(),
        }
    }
}

/// A log chain as found on the device: its whole batches and the blocks that hold them.
pub struct Chain {
    /// Each whole batch's payload, in order.
    pub batches: Vec<Vec<u8>>,
    /// The blocks of the whole batches, in chain order.
    pub blocks: Vec<u64>,
}

/// Follows the chain from `head` while blocks check out (checksum, fsid, the superblock's
/// generation, seq, block number); a block that fails ends it (never written, or torn), and
/// only whole batches count.
pub fn read_chain(
    dev: &dyn idxfs_blockdev::BlockDevice,
    fsid: [u8; 16],
    generation: u64,
    head: u64,
    total: u64,
) -> Result<Chain> {
    let mut exp = LogExpect {
        fsid,
        generation,
        seq: 0,
        block: head,
    };
    let (mut batches, mut stream, mut chain, mut whole) = (Vec::new(), Vec::new(), Vec::new(), 0);
    let mut buf = vec![0u8; BLOCK_SIZE as usize];
    loop {
        dev.read_at(&mut buf, exp.block * BLOCK_SIZE)?;
        let Ok((h, payload)) = decode_log_block(&buf, &exp) else {
            break;
        };
        chain.push(exp.block);
        stream.extend_from_slice(payload);
        if h.flags.get() & LOG_BATCH_END != 0 {
            batches.push(std::mem::take(&mut stream));
            whole = chain.len();
        }
        let next = h.next.get();
        if !(SUPER_COPIES..total).contains(&next) || chain.len() as u64 >= total {
            break;
        }
        exp.seq += 1;
        exp.block = next;
    }
    chain.truncate(whole);
    Ok(Chain {
        batches,
        blocks: chain,
    })
}

/// One tree's share of the log: each item's last logged state, and its last counters.
#[derive(Default)]
struct TreeLog {
    items: BTreeMap<Key, Option<Vec<u8>>>,
    counters: Option<(u64, u64)>,
}

/// A tree the log names, as the replay changes it.
struct Target {
    /// Its subvolume id (`Clones::active_id`).
    id: u64,
    /// `Clones::active`'s value for it: the rules on whose blocks are whose are its.
    active: u64,
    /// Its committed root, then the replayed one.
    tree: Tree,
    /// Its committed counters (next inode number, inode count).
    counters: (u64, u64),
    log: TreeLog,
    /// The committed extents' blocks its changed items named, each with its generation.
    old: Vec<(u64, u64, u64)>,
    counts: Vec<Count>,
}

/// Runs `f` with the tree `tree` in hand, with the clone rules of tree `active`, as the
/// operations that logged it ran; the primary's come back after. `tree` is the tree as `f`
/// left it.
fn in_tree<R>(
    inner: &mut Inner,
    tree: &mut Tree,
    active: &mut u64,
    f: impl FnOnce(&mut Inner) -> Result<R>,
) -> Result<R> {
    std::mem::swap(&mut inner.fs_tree, tree);
    std::mem::swap(&mut inner.snapshots.clones.active, active);
    inner.store.changes.shape_seq += 1;
    let r = f(inner);
    std::mem::swap(&mut inner.fs_tree, tree);
    std::mem::swap(&mut inner.snapshots.clones.active, active);
    inner.store.changes.shape_seq += 1;
    r
}

/// Replays the log the superblock names, if any, over the just-opened trees. Returns how many
/// batches were applied; the caller commits when there were any.
pub(crate) fn replay(inner: &mut Inner) -> Result<u64> {
    let head = inner.txn.sb.log_root.block.get();
    if head == 0 {
        return Ok(0);
    }
    let total = inner.store.total_blocks;
    let Chain {
        batches,
        blocks: chain,
    } = read_chain(
        inner.store.dev.as_ref(),
        inner.store.fsid,
        inner.txn.sb.generation.get(),
        head,
        total,
    )?;
    if batches.is_empty() {
        // Nothing to replay. The head block stays reserved until this mount's first commit
        // frees it, as it would have been in the mount that named it (so free space reads
        // the same before and after that commit).
        reserve(inner, &[(head, 1)])?;
        inner.log.blocks = vec![head];
        return Ok(0);
    }
    // Each record is an item's state at its fsync: the last one wins, per tree.
    let primary = inner.snapshots.clones.active_id();
    let mut logs: BTreeMap<u64, TreeLog> = BTreeMap::new();
    let max_item = idxfs_format::node::max_item_size(inner.store.node_size);
    for (i, b) in batches.iter().enumerate() {
        // A batch's records are the superblock's tree's until a tree record says otherwise.
        let mut log = logs.entry(primary).or_default();
        for r in decode_log_records(b, &format!("log batch {i}"))? {
            match r {
                LogRecord::Put(k, v) => {
                    check_key(&k)?;
                    ensure!(
                        v.len() <= max_item,
                        format!("log item {k} size"),
                        v.len(),
                        format!("<= {max_item}")
                    );
                    log.items.insert(k, Some(v));
                }
                LogRecord::Delete(k) => {
                    check_key(&k)?;
                    log.items.insert(k, None);
                }
                LogRecord::Counters {
                    next_ino,
                    inode_count,
                } => log.counters = Some((next_ino, inode_count)),
                LogRecord::Tree(id) => {
                    ensure!(
                        inner.txn.sb.incompat.get() & INCOMPAT_LOG_TREES != 0,
                        format!("fsync log batch {i}: a record naming tree {id}"),
                        "in an image without incompat bit INCOMPAT_LOG_TREES",
                        "none"
                    );
                    log = logs.entry(id).or_default();
                }
            }
        }
    }
    let mut targets = Vec::new();
    for (id, log) in logs {
        let (tree, active, counters) = match id == primary {
            true => (
                inner.fs_tree,
                inner.snapshots.clones.active,
                (inner.txn.next_ino, inner.txn.inode_count),
            ),
            false => inner.parked_for_replay(id)?,
        };
        targets.push(Target {
            id,
            active,
            tree,
            counters,
            log,
            old: Vec::new(),
            counts: Vec::new(),
        });
    }
    // Space: each block's count of naming extents, per tree, moves by what the changed
    // extent items name after the log less what they named before (`counts`). Blocks that
    // go from no extent to some, in any tree, are taken before any tree change can allocate
    // them; blocks left with none are let go of after every tree changed. The counts the
    // log's shared-block items then give must be exactly those (`check_counts`): a log that
    // names a block already in use without saying it is shared is damaged. A block is new
    // to at most one tree: a block the committed state names is not reused before the next
    // commit (pinned when freed), and a tree never shares blocks with another it did not
    // name already (`fs::clones`); two trees taking one block fails `reserve`.
    let mut taken: Vec<(u64, u64)> = chain.iter().map(|&b| (b, 1)).collect();
    for t in &mut targets {
        let items = &t.log.items;
        let (old, counts) = in_tree(inner, &mut t.tree, &mut t.active, |inner| {
            let tree = inner.fs_tree;
            // `old`: the committed extents' blocks, with each extent's generation (`born`).
            let (mut old, mut new) = (Vec::new(), Vec::new());
            for (k, v) in items
                .iter()
                .filter(|(k, _)| k.item_type() == Some(ItemType::Extent))
            {
                if let Some(o) = tree.get(&mut inner.store, k)? {
                    old.extend(extent_blocks(&o, k, total)?);
                }
                if let Some(v) = v {
                    new.extend(extent_blocks(v, k, total)?.map(|(s, n, _)| (s, n)));
                }
            }
            let old_runs: Vec<(u64, u64)> = old.iter().map(|&(s, n, _)| (s, n)).collect();
            let counts = counts_before(inner, &deltas(&new, &old_runs))?;
            Ok((old, counts))
        })?;
        taken.extend(
            (counts.iter())
                .filter(|c| c.before == 0)
                .map(|c| (c.start, c.blocks)),
        );
        (t.old, t.counts) = (old, counts);
    }
    reserve(inner, &taken)?;
    for t in &mut targets {
        let items = std::mem::take(&mut t.log.items);
        let counts = &t.counts;
        in_tree(inner, &mut t.tree, &mut t.active, |inner| {
            let mut tree = inner.fs_tree;
            for (k, v) in items {
                match v {
                    Some(v) => tree.put(&mut inner.store, k, v)?,
                    None => {
                        tree.delete(&mut inner.store, &k)?;
                    }
                }
            }
            inner.fs_tree = tree;
            check_counts(inner, counts)
        })?;
    }
    // Blocks no extent names any more are let go of as the operation that let go of them
    // did: by the generation of the committed extents that named them, which says whether
    // a snapshot may name them (held) and, in a clone, whether they are its origin's (kept).
    for t in &mut targets {
        let freed: Vec<(u64, u64)> = (t.counts.iter())
            .filter(|c| c.after == 0)
            .map(|c| (c.start, c.blocks))
            .collect();
        let old = &t.old;
        in_tree(inner, &mut t.tree, &mut t.active, |inner| {
            for (start, n, born) in born_pieces(old, &freed) {
                inner.free_or_hold(start, n, false, born)?;
            }
            Ok(())
        })?;
    }
    for t in targets {
        let (mut next_ino, mut inode_count) = t.counters;
        if let Some((next, count)) = t.log.counters {
            ensure!(
                next > ROOT_INO && next <= MAX_INO && next >= next_ino,
                format!("fsync log next inode of tree {}", t.id),
                next,
                format!("in {next_ino}..={MAX_INO}")
            );
            (next_ino, inode_count) = (next, count);
        }
        match t.id == primary {
            true => {
                inner.fs_tree = t.tree;
                inner.txn.next_ino = next_ino;
                inner.txn.inode_count = inode_count;
            }
            false => inner.park_replayed(t.id, &t.tree, next_ino, inode_count)?,
        }
    }
    // The chain's blocks stay used until the commit after the replay is durable.
    inner.log.blocks = chain;
    inner.txn.changed = true;
    inner.store.changes.log.clear();
    Counters::add(
        &inner.store.counters.log_replayed_batches,
        batches.len() as u64,
    );
    Ok(batches.len() as u64)
}

/// Marks blocks the log names used; each must be free in the committed bitmaps.
fn reserve(inner: &mut Inner, ranges: &[(u64, u64)]) -> Result<()> {
    for &(s, n) in ranges {
        if let Some(b) = (s..s + n).find(|&b| inner.store.alloc.is_used(b)) {
            return Err(Corrupt::new(
                format!("block {b} named by the fsync log"),
                "in use by the committed trees",
                "free",
            )
            .into());
        }
        inner.store.alloc.mark_used(s, n);
    }
    Ok(())
}

/// Only fs-tree items are logged.
fn check_key(k: &Key) -> Result<()> {
    let ok = matches!(
        k.item_type(),
        Some(
            ItemType::Inode
                | ItemType::InodeRef
                | ItemType::InodeExtRef
                | ItemType::Xattr
                | ItemType::XattrChunk
                | ItemType::Orphan
                | ItemType::DirHash
                | ItemType::DirIno
                | ItemType::Extent
                | ItemType::DataSum
                | ItemType::SharedBlocks
        )
    );
    ensure!(
        ok,
        format!("fsync log key {k}"),
        k.ty,
        "an fs-tree item type"
    );
    Ok(())
}

/// The blocks an extent item owns (none for inline data), and its generation.
fn extent_blocks(v: &[u8], k: &Key, total: u64) -> Result<Option<(u64, u64, u64)>> {
    let (e, _) = decode_extent(v, k, total)?;
    Ok((e.kind != EXTENT_INLINE).then(|| (e.disk_block.get(), e.blocks.get(), e.generation.get())))
}

/// Splits each of `runs` (sorted, apart) where the generation of the extents in `olds`
/// (start, blocks, generation; overlapping where extents share blocks) that cover it
/// changes: (start, blocks, the oldest covering generation). A block no extent covers gets
/// 0, as old as any snapshot, which holds rather than frees. Copies keep their source's
/// generation (`clone`), so extents sharing a block agree on it.
fn born_pieces(olds: &[(u64, u64, u64)], runs: &[(u64, u64)]) -> Vec<(u64, u64, u64)> {
    // Where a covering extent starts (+1) or ends (-1), by position.
    let mut edges: Vec<(u64, i32, u64)> = olds
        .iter()
        .flat_map(|&(s, n, g)| [(s, 1, g), (s + n, -1, g)])
        .collect();
    edges.sort_unstable();
    let mut covering: BTreeMap<u64, u32> = BTreeMap::new();
    let mut next = 0;
    let mut pass = |upto: u64, covering: &mut BTreeMap<u64, u32>| {
        while let Some(&(_, step, g)) = edges.get(next).filter(|e| e.0 <= upto) {
            if step > 0 {
                *covering.entry(g).or_default() += 1;
            } else if let Some(c) = covering.get_mut(&g) {
                *c -= 1;
                if *c == 0 {
                    covering.remove(&g);
                }
            }
            next += 1;
        }
        edges.get(next).map(|e| e.0)
    };
    let mut out: Vec<(u64, u64, u64)> = Vec::new();
    for &(start, n) in runs {
        let end = start + n;
        let mut at = start;
        let mut upcoming = pass(at, &mut covering);
        while at < end {
            let to = upcoming.filter(|&u| u < end).unwrap_or(end);
            let born = covering.keys().next().copied().unwrap_or(0);
            match out.last_mut() {
                Some((s, k, b)) if *s + *k == at && *b == born => *k += to - at,
                _ => out.push((at, to - at, born)),
            }
            at = to;
            upcoming = pass(at, &mut covering);
        }
    }
    out
}

/// Blocks whose count of naming extents a replay changes: before and after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Count {
    start: u64,
    blocks: u64,
    before: u64,
    after: u64,
}

/// The net change in naming extents per block, as runs (start, length, change != 0), from
/// the ranges the changed items name after (`plus`) and before (`minus`). Within each list
/// ranges may overlap (two extents sharing blocks).
fn deltas(plus: &[(u64, u64)], minus: &[(u64, u64)]) -> Vec<(u64, u64, i64)> {
    let mut edges: BTreeMap<u64, i64> = BTreeMap::new();
    for (list, sign) in [(plus, 1i64), (minus, -1)] {
        for &(s, n) in list {
            *edges.entry(s).or_default() += sign;
            *edges.entry(s + n).or_default() -= sign;
        }
    }
    let mut out = Vec::new();
    let mut level = 0i64;
    let mut from = 0u64;
    for (&at, &step) in &edges {
        if level != 0 && at > from {
            out.push((from, at - from, level));
        }
        level += step;
        from = at;
    }
    out
}

/// Each changed run's count in the committed state: what its shared-block items say, else
/// one extent if the block is in use and none if it is free.
fn counts_before(inner: &mut Inner, deltas: &[(u64, u64, i64)]) -> Result<Vec<Count>> {
    let mut out = Vec::new();
    for &(start, n, d) in deltas {
        for r in inner.block_refs(start, n)? {
            let mut at = r.start;
            while at < r.start + r.blocks {
                let used = inner.store.alloc.is_used(at);
                let mut end = at + 1;
                while end < r.start + r.blocks && inner.store.alloc.is_used(end) == used {
                    end += 1;
                }
                let before = if used { r.refs } else { 0 };
                let after = before.checked_add_signed(d).ok_or_else(|| {
                    Corrupt::new(
                        format!("blocks {at}+{} in the fsync log", end - at),
                        format!("named by {before} extents, {d:+} by the log"),
                        "a count >= 0",
                    )
                })?;
                out.push(Count {
                    start: at,
                    blocks: end - at,
                    before,
                    after,
                });
                at = end;
            }
        }
    }
    Ok(out)
}

/// After the items are applied: the shared-block items give every changed run the count
/// its extents say (none for a count of 0 or 1).
fn check_counts(inner: &mut Inner, counts: &[Count]) -> Result<()> {
    for c in counts {
        let want = c.after.max(1);
        for r in inner.block_refs(c.start, c.blocks)? {
            ensure!(
                r.refs == want,
                format!(
                    "shared-block count of blocks {}+{} after the fsync log",
                    r.start, r.blocks
                ),
                r.refs,
                format!("{want} (as its extents say)")
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{born_pieces, deltas};

    #[test]
    fn born_pieces_take_the_oldest_covering_generation() {
        assert_eq!(born_pieces(&[(10, 10, 7)], &[(10, 10)]), vec![(10, 10, 7)]);
        // Two extents one after the other, a run across both.
        assert_eq!(
            born_pieces(&[(10, 4, 7), (14, 4, 9)], &[(12, 4)]),
            vec![(12, 2, 7), (14, 2, 9)]
        );
        // Overlapping (shared) extents: the oldest wins where both cover.
        assert_eq!(
            born_pieces(&[(10, 10, 9), (12, 4, 7)], &[(10, 10)]),
            vec![(10, 2, 9), (12, 4, 7), (16, 4, 9)]
        );
        // Runs apart, one nothing covers.
        assert_eq!(
            born_pieces(&[(10, 2, 5), (30, 5, 6)], &[(10, 2), (20, 3), (31, 2)]),
            vec![(10, 2, 5), (20, 3, 0), (31, 2, 6)]
        );
        // Neighbouring pieces of one generation are one.
        assert_eq!(
            born_pieces(&[(10, 2, 5), (12, 2, 5)], &[(10, 4)]),
            vec![(10, 4, 5)]
        );
        assert_eq!(born_pieces(&[], &[]), vec![]);
    }

    #[test]
    fn deltas_of_ranges() {
        assert_eq!(deltas(&[(10, 10)], &[]), vec![(10, 10, 1)]);
        assert_eq!(deltas(&[(10, 10)], &[(10, 10)]), vec![]);
        assert_eq!(
            deltas(&[(10, 10)], &[(12, 3)]),
            vec![(10, 2, 1), (15, 5, 1)]
        );
        assert_eq!(
            deltas(&[(10, 3)], &[(12, 3)]),
            vec![(10, 2, 1), (13, 2, -1)]
        );
        // A clone: the same blocks named twice after, once before.
        assert_eq!(deltas(&[(10, 4), (10, 4)], &[(10, 4)]), vec![(10, 4, 1)]);
        assert_eq!(
            deltas(&[(10, 4), (12, 4)], &[]),
            vec![(10, 2, 1), (12, 2, 2), (14, 2, 1)]
        );
    }
}
