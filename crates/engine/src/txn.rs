//! Commit: the steps that make a running transaction durable, and how they run beside new work.
//!
//! Order (each step's durability is what the next relies on):
//! 1. write-back of cached inode changes and new orphans into the fs tree, the fsync log's
//!    blocks freed, the node pools given back, then what changed of the roots tree (node
//!    counts, snapshots, held runs: `fs::snapshot`) (`Inner::commit_begin`);
//! 2. the space tree records every block group whose bitmap changed, repeated until it no
//!    longer changes itself (its own node copies allocate blocks);
//! 3. *freeze*: the dirty nodes are taken (shared, `btree::cache`), the superblock is built
//!    with the new roots and the next transaction's log block, and the generation advances.
//!    Blocks the frozen transaction freed stay pinned (`Allocator::start_commit`). The first
//!    commit of an open that met an unusable superblock copy marks that log block to be
//!    zeroed: it reuses the lost copy's generation, whose log chain may lie there
//!    (`TxnState::zero_log_head`);
//! 4. that log block zeroed, if marked, and every frozen node is encoded and written to its
//!    (new) block, then flush;
//! 5. the superblock copy `generation % 2` is written, then flush: the commit is durable;
//! 6. *reap* (`Inner::reap`): only now do the blocks the committed transaction freed become
//!    reusable.
//!
//! Steps 1-3 run under the operation lock; steps 4-5 (`Frozen::write`) run without it when
//! the commit thread, `sync` or the dirty-node bound start the commit (`Fs::commit_beside`),
//! so operations go on meanwhile in the next transaction, as btrfs's running transaction does
//! beside its committing one. That is safe because the next transaction changes no frozen
//! node in place (its generation is older, so the COW rule copies it to a new block), frees
//! no block the frozen state uses in a way that lets it be reused (a block freed now is pinned
//! until the *next* commit), and never reads a frozen node from the device (the cache keeps
//! every node a commit holds). At most one commit is in flight (`Flight`); a second waits for
//! it. An fsync waits too: the log it appends to is named by the frozen superblock, which must
//! be durable before the fsync may return.
//!
//! **A stalled commit.** A write in steps 4-5 that the device refuses (the file system under
//! an image file is full, a write error) *stalls* the commit instead of stopping the file
//! system: the frozen transaction is kept whole in the flight (`Flight::stall`), nothing of
//! it being referenced on the device before its superblock is, and the next commit writes it
//! again first (`Inner::commit_begin`): the same nodes to the same blocks, the same
//! superblock, so writing it twice is writing it once. Until then it counts as the commit in
//! flight that never ends: its freed blocks stay pinned, no other transaction freezes, an
//! fsync commits (writing the stalled one first) instead of logging, and durability requests
//! that cannot get it written answer `Error::Unwritten` (ENOSPC when the device is full). The
//! commit thread tries again each period, and a commit to bring dirty nodes under their
//! bound at most once per `STALL_RETRY`, so space given back under the image lets the file
//! system go on as if nothing happened. Past twice the bound (the cache cannot drop dirty
//! nodes), operations are refused before their first change with the stall's error
//! (`Fs::write_op_once`). A failed *flush* still stops the file system: after
//! it, the device may have dropped any write since the previous flush, file data included,
//! which is no longer in memory to write again (PostgreSQL's "fsyncgate").
//!
//! An error in step 1-3 or a failed flush stops the file system: the image keeps its
//! previous commit.
//!
//! A crash before step 5 completes leaves the previous superblock copy pointing at the
//! previous trees, all of whose blocks are untouched (nothing they use was reused: step 6
//! releases them).
use crate::btree::{Node, Store, Tree};
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::fs::Inner;
use crate::space::bitmap::Bitmap;
use idxfs_blockdev::BlockDevice;
use idxfs_format::items::{decode_block_group, BlockGroupItem};
use idxfs_format::superblock::{RootPtr, Superblock};
use idxfs_format::{ensure, Corrupt, ItemType, Key, BLOCK_SIZE, SUPER_COPIES};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use zerocopy::IntoBytes;

/// Step 2: rewrite the block-group and bitmap items of every changed group.
pub fn persist_space(store: &mut Store, space: &mut Tree) -> Result<()> {
    for _round in 0..64 {
        let dirty = store.alloc.take_dirty_groups();
        if dirty.is_empty() {
            return Ok(());
        }
        for gi in dirty {
            let g = &store.alloc.groups[gi];
            let (start, len) = (g.start, g.len);
            let item = BlockGroupItem {
                used_blocks: g.used_count.into(),
                flags: g.flags.into(),
            };
            let bits = g.used.to_bytes();
            space.put(
                store,
                Key::new(start, ItemType::BlockGroup, len),
                item.as_bytes().to_vec(),
            )?;
            space.put(store, Key::new(start, ItemType::FreeSpaceBitmap, len), bits)?;
        }
    }
    // Each round only copies nodes not yet copied in this transaction, so this converges in a
    // few rounds; not converging means the allocator keeps moving, an engine bug.
    panic!("space tree did not converge in 64 rounds");
}

/// Loads every group's bitmap from the space tree (mount), validating it.
pub fn load_space(store: &mut Store, space: &Tree) -> Result<()> {
    let ngroups = store.alloc.groups.len();
    let mut seen = vec![false; ngroups];
    let mut found: Vec<(usize, u64, Bitmap)> = Vec::new();
    let mut pending: Option<(u64, u64, BlockGroupItem)> = None;
    let gb = store.alloc.group_blocks;
    let total = store.total_blocks;
    space.scan(store, Key::MIN, Key::MAX, |k, v| {
        let gi = (k.objectid / gb) as usize;
        ensure!(
            k.objectid % gb == 0 && gi < ngroups,
            format!("space item {k}"),
            k.objectid,
            format!("a group start below {total}")
        );
        let len = gb.min(total - k.objectid);
        ensure!(
            k.offset == len,
            format!("space item {k} length"),
            k.offset,
            len
        );
        match k.item_type() {
            Some(ItemType::BlockGroup) => {
                pending = Some((k.objectid, len, decode_block_group(v, k.objectid, len)?))
            }
            Some(ItemType::FreeSpaceBitmap) => {
                let Some((start, _, bg)) = pending.take().filter(|p| p.0 == k.objectid) else {
                    return Err(Corrupt::new(
                        format!("space item {k}"),
                        "bitmap without block group item",
                        "block group item first",
                    )
                    .into());
                };
                let bm = Bitmap::from_bytes(v, len).ok_or_else(|| {
                    Corrupt::new(
                        format!("free-space bitmap {start}"),
                        v.len(),
                        len.div_ceil(8),
                    )
                })?;
                ensure!(
                    bm.count_ones() == bg.used_blocks.get(),
                    format!("block group {start} used count"),
                    bg.used_blocks.get(),
                    format!("{} (bits set in its bitmap)", bm.count_ones())
                );
                ensure!(
                    !seen[gi],
                    format!("block group {start}"),
                    "listed twice",
                    "once"
                );
                seen[gi] = true;
                found.push((gi, bg.flags.get(), bm));
            }
            _ => {
                return Err(Corrupt::new(
                    format!("space item {k}"),
                    k.ty,
                    "BLOCK_GROUP or FREE_SPACE_BITMAP",
                )
                .into())
            }
        }
        Ok(true)
    })?;
    if let Some(missing) = seen.iter().position(|s| !s) {
        return Err(Corrupt::new(
            format!("block group {}", missing as u64 * gb),
            "missing",
            "a block group and bitmap item",
        )
        .into());
    }
    for (gi, flags, bm) in found {
        store.alloc.load_group(gi, bm, flags);
    }
    Ok(())
}

/// A transaction frozen for writing: its dirty nodes and the superblock that names them.
pub struct Frozen {
    nodes: Vec<(u64, Arc<Node>)>,
    sb: Superblock,
    dev: Arc<dyn BlockDevice>,
    fsid: [u8; 16],
    node_size: usize,
    counters: Arc<Counters>,
    started: std::time::Instant,
    /// The block its log chain starts at, when it reuses a lost superblock copy's generation
    /// (`TxnState::zero_log_head`): zeroed with the nodes, before the flush that precedes
    /// the superblock, so a refused write of it stalls the commit as a node's does.
    zero_log_head: Option<u64>,
    /// Writes of it the device refused so far (`Flight::stall`).
    tries: u64,
}

/// How a frozen transaction's write ended.
enum Written {
    /// Durable: reap it.
    Done,
    /// The device refused a write: the transaction, kept whole, is written again later.
    Stalled(Box<Frozen>, std::io::Error),
    /// A flush failed: the file system stops.
    Failed(Error),
}

impl Frozen {
    /// A stalled commit, written again (`Inner::commit_begin`).
    pub fn resumed(&self) -> bool {
        self.tries > 0
    }

    /// Steps 4 and 5, the outcome posted to `flight` (whose commit this is).
    pub fn write_to(self, flight: &Flight) {
        let posting = Posting(flight, false);
        let tries = self.tries;
        let w = self.write();
        if matches!(w, Written::Done) && tries > 0 {
            log::info!("a stalled commit was written, after {tries} refused tries");
        }
        posting.written(w);
    }

    /// Steps 4 and 5. Consumes the frozen nodes when it succeeds, so the cache may evict them
    /// then; a refused write gives them back to be written again (module notes).
    fn write(self) -> Written {
        let zeroed = match self.zero_log_head {
            Some(b) => self
                .dev
                .write_at(&[0u8; BLOCK_SIZE as usize], b * BLOCK_SIZE),
            None => Ok(()),
        };
        let encoded = zeroed
            .and_then(|()| write_nodes(self.dev.as_ref(), &self.nodes, self.fsid, self.node_size));
        if let Err(e) = encoded {
            return Written::Stalled(Box::new(self), e);
        }
        Counters::add(&self.counters.node_writes, self.nodes.len() as u64);
        if let Err(e) = self.dev.flush() {
            return Written::Failed(e.into());
        }
        let gen = self.sb.generation.get();
        let sb = self
            .dev
            .write_at(&self.sb.encode(), (gen % SUPER_COPIES) * BLOCK_SIZE);
        if let Err(e) = sb {
            return Written::Stalled(Box::new(self), e);
        }
        if let Err(e) = self.dev.flush() {
            return Written::Failed(e.into());
        }
        Counters::add(
            &self.counters.commit_us,
            self.started.elapsed().as_micros() as u64,
        );
        Written::Done
    }
}

/// Step 4: every frozen node to its block, contiguous nodes in one write of up to 1 MiB to
/// keep the device busy with large I/O (the caller flushes).
fn write_nodes(
    dev: &dyn BlockDevice,
    nodes: &[(u64, Arc<Node>)],
    fsid: [u8; 16],
    node_size: usize,
) -> std::io::Result<()> {
    let bpn = (node_size as u64 / BLOCK_SIZE).max(1);
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut run_start = 0u64;
    let mut next = u64::MAX;
    for (b, node) in nodes {
        let b = *b;
        if b != next || buf.len() >= (1 << 20) {
            if !buf.is_empty() {
                dev.write_at(&buf, run_start * BLOCK_SIZE)?;
                buf.clear();
            }
            run_start = b;
        }
        let at = buf.len();
        buf.resize(at + node_size, 0);
        node.encode(&mut buf[at..], b, fsid);
        next = b + bpn;
    }
    if !buf.is_empty() {
        dev.write_at(&buf, run_start * BLOCK_SIZE)?;
    }
    Ok(())
}

/// Step 3 on a bare store: the dirty nodes, checked and shared; the generation advances and
/// the blocks this transaction freed move to the commit's pinned set.
pub fn freeze_store(store: &mut Store) -> Vec<(u64, Arc<Node>)> {
    let nodes = store.cache.freeze_dirty();
    assert_eq!(
        nodes.len(),
        store.changes.dirty_nodes,
        "dirty node count drifted from the cache"
    );
    for (b, _) in &nodes {
        assert!(
            store.alloc.is_used(*b),
            "writing node {b} whose block is not allocated"
        );
    }
    store.generation += 1;
    store.changes.dirty_nodes = 0;
    store.alloc.start_commit();
    nodes
}

/// Step 6 on a bare store: the commit is durable.
pub fn reap_store(store: &mut Store) {
    store.alloc.commit_done();
    Counters::inc(&store.counters.commits);
    if store.cache.over_limit() {
        let n = store.cache.evict(store.generation);
        Counters::add(&store.counters.node_evictions, n);
    }
}

/// A whole commit of a bare store with no superblock (the B+tree tests).
pub fn commit_store(store: &mut Store) -> Result<()> {
    let nodes = freeze_store(store);
    let ns = store.node_size as usize;
    write_nodes(store.dev.as_ref(), &nodes, store.fsid, ns)?;
    Counters::add(&store.counters.node_writes, nodes.len() as u64);
    store.dev.flush()?;
    drop(nodes);
    reap_store(store);
    Ok(())
}

/// The commit in flight, if any: at most one is written at a time.
#[derive(Default)]
pub struct Flight {
    state: Mutex<FlightState>,
    changed: Condvar,
    /// A result waits to be reaped: lets `Inner::reap` skip the mutex on every operation.
    posted: AtomicBool,
}

#[derive(Default)]
enum FlightState {
    #[default]
    Idle,
    Writing,
    Done(Result<()>),
    /// The device refused a write of this commit: it waits to be written again (module
    /// notes, "A stalled commit"). `tried`: when its last write ended.
    Stalled {
        frozen: Box<Frozen>,
        error: std::io::Error,
        tried: std::time::Instant,
    },
}

impl Flight {
    fn lock(&self) -> std::sync::MutexGuard<'_, FlightState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn begin(&self) {
        let mut s = self.lock();
        assert!(
            matches!(*s, FlightState::Idle),
            "a commit began beside another"
        );
        *s = FlightState::Writing;
    }

    /// Steps 4-5 finished (or failed): the result waits for `Inner::reap`.
    pub fn post(&self, r: Result<()>) {
        let mut s = self.lock();
        *s = FlightState::Done(r);
        self.posted.store(true, Ordering::Release);
        self.changed.notify_all();
    }

    /// The device refused a write of `frozen`: it waits for `resume`. Not posted (nothing for
    /// `Inner::reap` to do); a waiter for the flight gets `Error::Unwritten`.
    fn stall(&self, mut frozen: Box<Frozen>, error: std::io::Error) {
        let mut s = self.lock();
        frozen.tries += 1;
        if frozen.tries == 1 {
            log::warn!(
                "a commit's write was refused ({error}): kept in memory, written again at the \
                 next commit or durability request; fsync answers the error until then"
            );
        }
        Counters::inc(&frozen.counters.commit_stalls);
        *s = FlightState::Stalled {
            frozen,
            error,
            tried: std::time::Instant::now(),
        };
        self.changed.notify_all();
    }

    /// The stalled commit, to be written again: the flight is `Writing` again. None when
    /// none is stalled.
    fn resume(&self) -> Option<Frozen> {
        let mut s = self.lock();
        match std::mem::replace(&mut *s, FlightState::Writing) {
            FlightState::Stalled { frozen, .. } => Some(*frozen),
            other => {
                *s = other;
                None
            }
        }
    }

    /// When the stalled commit's last write ended, if one is stalled.
    pub fn stalled_since(&self) -> Option<std::time::Instant> {
        match &*self.lock() {
            FlightState::Stalled { tried, .. } => Some(*tried),
            _ => None,
        }
    }

    /// The result of the commit in flight once it ended (waiting for it with `wait`): a
    /// stalled one stays, its answer `Error::Unwritten`.
    fn take(&self, wait: bool) -> Option<Result<()>> {
        if !wait && !self.posted.load(Ordering::Acquire) {
            return None;
        }
        let mut s = self.lock();
        while wait && matches!(*s, FlightState::Writing) {
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        if let FlightState::Stalled { error, .. } = &*s {
            let answer = std::io::Error::new(error.kind(), error.to_string());
            return Some(Err(Error::Unwritten(answer)));
        }
        match std::mem::take(&mut *s) {
            FlightState::Done(r) => {
                self.posted.store(false, Ordering::Release);
                Some(r)
            }
            other => {
                *s = other;
                None
            }
        }
    }

    /// Waits, without taking anything, until no commit is being written (a stalled one is
    /// not being written).
    pub fn wait_written(&self) {
        let mut s = self.lock();
        while matches!(*s, FlightState::Writing) {
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    pub fn writing(&self) -> bool {
        matches!(*self.lock(), FlightState::Writing)
    }
}

/// Posts an error if the writer of a frozen transaction unwinds before posting, so nobody
/// waits for it forever.
pub struct Posting<'a>(pub &'a Flight, pub bool);

impl Drop for Posting<'_> {
    fn drop(&mut self) {
        if !self.1 {
            self.0.post(Err(Error::Io(std::io::Error::other(
                "the commit writer panicked",
            ))));
        }
    }
}

impl Posting<'_> {
    pub fn post(mut self, r: Result<()>) {
        self.1 = true;
        self.0.post(r);
    }

    /// Posts how a commit's write ended.
    fn written(mut self, w: Written) {
        self.1 = true;
        match w {
            Written::Done => self.0.post(Ok(())),
            Written::Failed(e) => self.0.post(Err(e)),
            Written::Stalled(frozen, e) => self.0.stall(frozen, e),
        }
    }
}

/// The transaction side of a mounted image: the last committed superblock, what the running
/// transaction changes of it, and the commit in flight.
pub(crate) struct TxnState {
    /// The superblock of the last commit (of the one in flight, once it is frozen).
    pub sb: Superblock,
    /// The running transaction has changes that move no tree (an atime, a superblock field).
    /// A tree change counts without it: `Store::mod_seq` differs from `frozen_seq`.
    pub changed: bool,
    /// `Store::mod_seq` when the last commit froze: the trees changed since exactly when it
    /// moved. So a commit inside an operation (to reclaim space, or between freeing
    /// batches) takes what the operation changed so far, though the operation has not ended.
    pub frozen_seq: u64,
    /// The inode number sequence's next number, and the inodes that exist (the superblock's,
    /// as the running transaction has them). New inodes take their numbers through
    /// `ino_runs`, which moves `next_ino` past every run it hands out.
    pub next_ino: u64,
    pub inode_count: u64,
    /// Runs of inode numbers below `next_ino` reserved for the directories that create
    /// (`crate::fs::ino_runs`); in memory only.
    pub ino_runs: crate::fs::ino_runs::InoRuns,
    /// Incompat bits the next commit adds to the superblock: an item needing them exists in
    /// the running transaction (`Inner::require_incompat`).
    pub incompat_wanted: u64,
    /// The same for read-only-compatible bits (`fs::data_sum`).
    pub compat_ro_wanted: u64,
    /// Nodes of the space tree: every commit may copy each once (`fs::reserve`).
    pub space_nodes: u64,
    /// The commit being written outside the lock, if any.
    pub flight: Arc<Flight>,
    /// The open found a superblock copy it could not use, so the next commit reuses a
    /// generation that copy may have had: the fsync log chain that copy named carries the
    /// same generation, and the new chain's blocks may be some of its blocks. That commit
    /// writes zeros over its chain's first block, and the chain zeroes each block before
    /// linking to it (`Log::zero_next`), so no stale batch of the lost chain is ever
    /// replayed (`log::read_chain` stops at the first block that does not check).
    pub zero_log_head: bool,
}

impl TxnState {
    /// The number the next inode made in `dir` gets (not taken yet); None when none is left.
    pub fn peek_ino(&self, dir: u64) -> Option<u64> {
        self.ino_runs.peek(dir, self.next_ino)
    }

    /// Takes `ino`, the number `peek_ino(dir)` gave, for an inode made now. Nothing between
    /// the two may take a number or commit (which ends the runs): an error says the engine
    /// broke that.
    pub fn take_ino(&mut self, dir: u64, ino: u64) -> crate::error::Result<()> {
        if self.ino_runs.take(dir, &mut self.next_ino) != Some(ino) {
            return Err(crate::error::Error::Invalid(
                "engine bug: an inode number was taken between its plan and its use",
            ));
        }
        self.inode_count += 1;
        Ok(())
    }

    /// The state of an image whose last commit wrote `sb`.
    pub fn new(sb: Superblock) -> TxnState {
        TxnState {
            sb,
            changed: false,
            frozen_seq: 0,
            next_ino: sb.next_ino.get(),
            inode_count: sb.inode_count.get(),
            ino_runs: Default::default(),
            incompat_wanted: 0,
            compat_ro_wanted: 0,
            space_nodes: 0,
            flight: Default::default(),
            zero_log_head: false,
        }
    }
}

impl Inner {
    /// Commits the running transaction and returns once it is durable, all under the caller's
    /// lock (mkfs, open, close, fsync's fallback, operations that need pinned space back).
    /// The blocks the commit released are discarded before it returns (see
    /// `space::discard`), so what it frees is free when it returns.
    pub fn commit(&mut self) -> Result<()> {
        // A stalled commit is written first, then the running transaction.
        while let Some(frozen) = self.commit_begin()? {
            let resumed = frozen.resumed();
            frozen.write_to(&self.txn.flight.clone());
            self.reap_wait()?;
            if !resumed {
                break;
            }
        }
        let ranges = self.store.alloc.take_discards();
        if !ranges.is_empty() {
            crate::space::discard::send(self.store.dev.as_ref(), &ranges, &self.store.counters);
            self.store.alloc.discarded(&ranges);
        }
        Ok(())
    }

    /// Whether the running transaction changed a tree or a superblock field (not counting
    /// dirty cached inodes and pending orphans, which the commit writes too).
    pub(crate) fn trees_changed(&self) -> bool {
        self.txn.changed || self.store.changes.mod_seq != self.txn.frozen_seq
    }

    /// The superblock lets its log name trees while no tree is open beside any more: the
    /// next commit clears the bit (`freeze_primary`) even with nothing else to write, so an
    /// image whose subvolumes were all closed opens in code that does not know the bit.
    fn log_trees_bit_stale(&self) -> bool {
        self.trees.alone()
            && !self.policy.read_only
            && self.txn.sb.incompat.get() & idxfs_format::versions::INCOMPAT_LOG_TREES != 0
    }

    /// Steps 1-3: waits for a commit in flight, then freezes the running transaction.
    /// None when nothing changed. A stalled commit instead, if there is one (`resumed`): the
    /// running transaction freezes only after it is written. The caller writes the result
    /// (`Frozen::write_to`), and reaps.
    pub(crate) fn commit_begin(&mut self) -> Result<Option<Frozen>> {
        match self.reap_wait() {
            Err(Error::Unwritten(_)) => {}
            r => r?,
        }
        if let Some(why) = &self.failed {
            return Err(Error::Io(std::io::Error::other(format!(
                "file system stopped after an error: {why}"
            ))));
        }
        if let Some(stalled) = self.txn.flight.resume() {
            return Ok(Some(stalled));
        }
        if !self.trees_changed()
            && self.inodes.dirty_count() == 0
            && self.lives.orphans.pending_len() == 0
            && self.others_commit_need() == 0
            && self.txn.incompat_wanted == 0
            && self.txn.compat_ro_wanted == 0
            && !self.log_trees_bit_stale()
        {
            return Ok(None);
        }
        // A commit is not a change by an operation: keep `mod_seq` as the operation saw it, so
        // a commit inside an operation (to reclaim pinned space) does not look like a change.
        let seq = self.store.changes.mod_seq;
        let r = self.freeze();
        self.store.changes.mod_seq = seq;
        self.txn.frozen_seq = seq;
        match r {
            Ok(f) => {
                self.txn.flight.begin();
                Ok(Some(f))
            }
            Err(e) => {
                self.fail(format!("commit failed: {e}"));
                Err(e)
            }
        }
    }

    /// Step 1 for every open tree (`fs::trees`), then the rest with the primary in hand;
    /// the tree that was in hand is in hand again after.
    fn freeze(&mut self) -> Result<Frozen> {
        let held = self.in_hand();
        let r = self.settle_trees(self.store.generation);
        let r = r.and_then(|()| self.freeze_primary());
        self.hand(held)?;
        r
    }

    fn freeze_primary(&mut self) -> Result<Frozen> {
        let started = std::time::Instant::now();
        self.log_release()?;
        // Whole node slots, free again: what the roots and space trees' copies below may
        // take.
        self.store.release_node_pool()?;
        let roots = self.persist_roots()?;
        persist_space(&mut self.store, &mut self.space_tree)?;
        let gen = self.store.generation;
        let mut sb = self.txn.sb;
        sb.generation = gen.into();
        sb.copy_index = (gen % SUPER_COPIES).into();
        let root = |t: &Tree| RootPtr {
            block: t.root.block.into(),
            generation: t.root.generation.into(),
            level: (t.level as u32).into(),
            reserved: 0.into(),
        };
        sb.fs_root = root(&self.fs_tree);
        sb.space_root = root(&self.space_tree);
        if let Some(r) = roots {
            sb.roots_root = r;
        }
        sb.next_ino = self.txn.next_ino.into();
        sb.inode_count = self.txn.inode_count.into();
        sb.subvolume = self.snapshots.clones.active.into();
        sb.used_blocks = self.store.alloc.used_blocks().into();
        let nodes = freeze_store(&mut self.store);
        // After used_blocks: the committed bitmaps call the log's first block free. After the
        // freeze: the block is the next transaction's, so it stays busy until that commits.
        sb.log_root = self.log_start(gen);
        let head = sb.log_root.block.get();
        // Zeroed by the write, before the flush that makes the superblock naming it durable
        // (step 4); the blocks the chain links to later are zeroed as it does
        // (`Log::zero_next`).
        let zero_log_head = (std::mem::take(&mut self.txn.zero_log_head) && head != 0).then(|| {
            self.log.zero_next = true;
            head
        });
        let mut incompat = sb.incompat.get() | self.txn.incompat_wanted;
        if sb.log_root.block.get() != 0 {
            incompat |= idxfs_format::versions::INCOMPAT_LOG;
        }
        // Only a chain this commit names while a tree is open beside may name trees (`log`).
        match self.trees.alone() {
            true => incompat &= !idxfs_format::versions::INCOMPAT_LOG_TREES,
            false => incompat |= idxfs_format::versions::INCOMPAT_LOG_TREES,
        }
        // Clones are what the bit keeps older readers from: none left, none kept from.
        let clones = &self.snapshots.clones;
        if !clones.any() && clones.items.is_empty() && clones.active == 0 {
            incompat &= !idxfs_format::versions::INCOMPAT_CLONES;
        }
        if !self.snapshots.list.values().any(|s| s.hidden()) {
            incompat &= !idxfs_format::versions::INCOMPAT_HIDDEN_ORIGINS;
        }
        sb.incompat = incompat.into();
        sb.compat_ro = (sb.compat_ro.get() | self.txn.compat_ro_wanted).into();
        // The frozen superblock is the one every later step builds on; nothing durable
        // depends on it before `reap` (an fsync waits for the flight first).
        self.txn.sb = sb;
        self.txn.incompat_wanted = 0;
        self.txn.compat_ro_wanted = 0;
        self.txn.changed = false;
        Ok(Frozen {
            nodes,
            sb,
            dev: self.store.dev.clone(),
            fsid: self.store.fsid,
            node_size: self.store.node_size as usize,
            counters: self.store.counters.clone(),
            started,
            zero_log_head,
            tries: 0,
        })
    }

    /// Step 6 for a commit whose write finished, if one did; never waits.
    pub(crate) fn reap(&mut self) {
        if let Some(r) = self.txn.flight.take(false) {
            let _ = self.finish_flight(r);
        }
    }

    /// Waits for a commit in flight and reaps it; Err when it failed (the file system has
    /// stopped then) or stalled (`Error::Unwritten`: it goes on).
    pub(crate) fn reap_wait(&mut self) -> Result<()> {
        match self.txn.flight.take(true) {
            Some(r) => self.finish_flight(r),
            None => Ok(()),
        }
    }

    fn finish_flight(&mut self, r: Result<()>) -> Result<()> {
        match r {
            Ok(()) => {
                // The blocks of the chain the commit released become reusable now: first
                // every log batch built before the freeze must have ended (`log_io`).
                self.log.io.wait_ended(self.log.fence);
                self.log.io.chain_replaced(self.log.fence);
                reap_store(&mut self.store);
                Ok(())
            }
            Err(e @ Error::Unwritten(_)) => Err(e),
            Err(e) => {
                self.fail(format!("commit failed: {e}"));
                Err(e)
            }
        }
    }
}
