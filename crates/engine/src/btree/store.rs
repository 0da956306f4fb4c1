//! The store: device, node cache and allocator, plus the copy-on-write rule.
//!
//! COW rule: a node whose generation equals the running transaction's was written by nobody yet
//! and is changed in place; any other node is copied to a newly allocated block first, and its
//! old block is freed (pinned until the commit is durable, see `space::alloc`). A node that
//! more than one parent points at (trees sharing it, `super::refs`) is copied whatever its
//! generation and its block is kept for the other parents.
use super::cache::NodeCache;
use super::changes::Changes;
use super::node::Node;
use super::pools::NodePools;
use super::refs::NodeRefs;
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::space::Allocator;
use idxfs_blockdev::BlockDevice;
use idxfs_format::node::{Expect, KeyRange};
use idxfs_format::BLOCK_SIZE;
use std::sync::Arc;

pub struct Store {
    pub dev: Arc<dyn BlockDevice>,
    pub fsid: [u8; 16],
    pub node_size: u32,
    pub total_blocks: u64,
    /// The running transaction's generation (last committed + 1).
    pub generation: u64,
    pub cache: NodeCache,
    pub alloc: Allocator,
    pub counters: Arc<Counters>,
    /// What the running transaction changed, for cursors, hints, operations and the fsync
    /// log (`super::changes`).
    pub changes: Changes,
    /// Node slots taken ahead of need, and those kept for deletes (`super::pools`).
    pub pools: NodePools,
    /// Nodes more than one parent points at (`super::refs`).
    pub refs: NodeRefs,
    /// Nodes that failed to read or failed their checks since open, and the first such
    /// failure: what `fs::damage` acts on (records it in the superblock, goes read-only).
    pub damage: crate::fs::Damage,
    scratch: Vec<u8>,
}

impl Store {
    #[expect(
        clippy::too_many_arguments,
        reason = "a store is made in two places (mkfs, open), each naming every part"
    )]
    pub fn new(
        dev: Arc<dyn BlockDevice>,
        fsid: [u8; 16],
        node_size: u32,
        total_blocks: u64,
        generation: u64,
        cache_nodes: usize,
        alloc: Allocator,
        counters: Arc<Counters>,
    ) -> Store {
        Store {
            dev,
            fsid,
            node_size,
            total_blocks,
            generation,
            cache: NodeCache::new(cache_nodes),
            alloc,
            counters,
            changes: Changes::default(),
            pools: NodePools::default(),
            refs: NodeRefs::default(),
            damage: Default::default(),
            scratch: vec![0; node_size as usize],
        }
    }

    pub fn blocks_per_node(&self) -> u64 {
        self.node_size as u64 / BLOCK_SIZE
    }

    /// Whether the node at `block` is cached, and if so that it is the tree's (`owner`) and
    /// at `level`. A cached node was checked when read, but a damaged parent may point at
    /// another node already in the cache (itself, an ancestor, a node of the other tree):
    /// refused here, so every descent goes one level down per step and ends.
    fn cached_as(&mut self, block: u64, owner: u64, level: Option<u8>) -> Result<bool> {
        let Some(n) = self.cache.get(block) else {
            return Ok(false);
        };
        if n.owner == owner && level.is_none_or(|l| l == n.level) {
            Counters::inc(&self.counters.node_cache_hits);
            return Ok(true);
        }
        let e = Error::Corrupt(idxfs_format::Corrupt::new(
            format!("pointer to node {block}"),
            format!("a cached node of tree {} at level {}", n.owner, n.level),
            format!("tree {owner} at level {level:?}"),
        ));
        self.damage.met(block, &e);
        Err(e)
    }

    /// Makes sure the node at `block` is cached, reading and validating it if needed: a
    /// node read from disk must also lie in `range`, where its parent places it. A cached
    /// node was checked when read (and for its tree and level here, `cached_as`), and the
    /// tree's changes keep every node inside its range.
    pub fn load(
        &mut self,
        block: u64,
        generation: u64,
        owner: u64,
        level: Option<u8>,
        range: KeyRange,
    ) -> Result<()> {
        if self.cached_as(block, owner, level)? {
            return Ok(());
        }
        // A damaged pointer may name a block past any device.
        let Some(at) = block.checked_mul(BLOCK_SIZE) else {
            return Err(Error::Corrupt(idxfs_format::Corrupt::new(
                format!("node pointer to block {block}"),
                block,
                "a block on the device",
            )));
        };
        let mut buf = std::mem::take(&mut self.scratch);
        let r = self.dev.read_at(&mut buf, at);
        let exp = Expect {
            block,
            generation,
            owner,
            level,
            fsid: self.fsid,
            total_blocks: self.total_blocks,
            range,
        };
        let decoded = r
            .map_err(Error::Io)
            .and_then(|()| Node::decode(&buf, &exp).map_err(Error::Corrupt));
        self.scratch = buf;
        let node = match decoded {
            Ok(n) => n,
            Err(e) => {
                self.damage.met(block, &e);
                return Err(e);
            }
        };
        Counters::inc(&self.counters.node_reads);
        if self.cache.over_limit() {
            let n = self.cache.evict(self.generation);
            self.counters.node_evictions.add(n);
        }
        self.cache.insert(block, node, false);
        Ok(())
    }

    /// The cached node at `block`. Callers `load` first; a miss here is an engine bug.
    #[inline]
    pub fn node(&mut self, block: u64) -> &Node {
        match self.cache.get(block) {
            Some(n) => n,
            None => panic!("node {block} used before load"),
        }
    }

    #[inline]
    pub fn node_mut(&mut self, block: u64) -> &mut Node {
        match self.cache.get_mut(block) {
            Some(n) => {
                assert!(
                    n.generation == self.generation,
                    "changing clean node {block} without COW"
                );
                debug_assert!(
                    !self.refs.is_shared(block, n.generation),
                    "changing shared node {block} without COW"
                );
                n
            }
            None => panic!("node {block} used before load"),
        }
    }

    fn take_node_block(&mut self) -> Result<u64> {
        let bpn = self.blocks_per_node();
        self.pools.take(&mut self.alloc, bpn)
    }

    /// `NodePools::fill` with this store's allocator.
    pub fn fill_node_pool(&mut self, target: usize, reserve: usize, use_reserve: bool) -> bool {
        let bpn = self.blocks_per_node();
        self.pools
            .fill(&mut self.alloc, bpn, target, reserve, use_reserve)
    }

    /// Blocks the pools hold.
    pub fn node_pool_blocks(&self) -> u64 {
        self.pools.blocks(self.blocks_per_node())
    }

    /// `NodePools::release` to this store's allocator (commit).
    pub fn release_node_pool(&mut self) -> Result<()> {
        let bpn = self.blocks_per_node();
        self.pools.release(&mut self.alloc, bpn)
    }

    /// Allocates a block for a new node of the running transaction.
    pub fn alloc_node(&mut self, node: Node) -> Result<u64> {
        assert_eq!(node.generation, self.generation);
        let start = self.take_free_node_block()?;
        self.cache.insert(start, node, true);
        self.changes.dirty_nodes += 1;
        Ok(start)
    }

    /// `take_node_block` for a node about to be put in the cache there (a new node, or a
    /// copy). Free space said free, yet a node in the cache lies on these blocks: damaged
    /// space maps (a freed node leaves the cache as it is freed). Refused as corruption
    /// rather than one node written over another; the slot stays taken, since the node
    /// uses it.
    fn take_free_node_block(&mut self) -> Result<u64> {
        let start = self.take_node_block()?;
        let bpn = self.blocks_per_node();
        if let Some(b) =
            (start.saturating_sub(bpn - 1)..start + bpn).find(|&b| self.cache.contains(b))
        {
            let e = Error::Corrupt(idxfs_format::Corrupt::new(
                format!("free space at block {start}"),
                format!("the node at block {b} on it"),
                "no node",
            ));
            self.damage.met(start, &e);
            return Err(e);
        }
        Ok(start)
    }

    /// Frees a node's block and drops it from the cache. Only a node its tree owns alone is
    /// freed: a tree lets go of a shared one by its count (`super::refs`).
    pub fn free_node(&mut self, block: u64) -> Result<()> {
        let n = self.cache.remove(block);
        debug_assert!(
            n.as_ref()
                .is_none_or(|n| !self.refs.is_shared(block, n.generation)),
            "freeing shared node {block}"
        );
        let now = n.as_ref().is_some_and(|n| n.generation == self.generation);
        if now {
            self.changes.dirty_nodes -= 1;
        }
        self.alloc.free(block, self.blocks_per_node(), now)?;
        Ok(())
    }

    /// Frees a block allocated in the running transaction whose node was already taken out of
    /// the cache; no committed state references it, so it is reusable at once.
    pub fn free_dirty_block(&mut self, block: u64) -> Result<()> {
        debug_assert!(!self.cache.contains(block));
        self.changes.dirty_nodes -= 1;
        self.alloc.free(block, self.blocks_per_node(), true)?;
        Ok(())
    }

    /// Loads (if needed) and COWs in one step (a node already dirty is returned as it is).
    pub fn load_cow(
        &mut self,
        block: u64,
        generation: u64,
        owner: u64,
        level: Option<u8>,
        range: KeyRange,
    ) -> Result<u64> {
        self.load(block, generation, owner, level, range)?;
        self.cow(block)
    }

    /// Copy-on-write: returns the block that now holds a writable copy of the (loaded) node.
    pub fn cow(&mut self, block: u64) -> Result<u64> {
        let gen = self.generation;
        let node_gen = self.node(block).generation;
        if self.refs.is_shared(block, node_gen) {
            return self.cow_shared(block);
        }
        if node_gen == gen {
            return Ok(block);
        }
        let bpn = self.blocks_per_node();
        let new = self.take_free_node_block()?;
        // A node a commit is still writing is shared: the copy is this generation's own.
        let mut node = match self.cache.remove(block) {
            Some(n) => Arc::unwrap_or_clone(n),
            None => panic!("cow of uncached node {block}"),
        };
        node.generation = gen;
        self.cache.insert(new, node, true);
        self.changes.dirty_nodes += 1;
        self.alloc.free(block, bpn, false)?;
        Counters::inc(&self.counters.node_cows);
        Ok(new)
    }

    /// Copies a node that more than one parent points at, for the tree descending to it:
    /// the copy is that tree's own, the node stays for its other parents with one fewer, and
    /// each node it points at gains the copy as a parent (`super::refs`). A copied leaf goes
    /// on the list of copied leaves: its items are now named twice.
    fn cow_shared(&mut self, block: u64) -> Result<u64> {
        let gen = self.generation;
        let new = self.take_free_node_block()?;
        let Some(old) = self.cache.get_arc(block) else {
            panic!("cow of uncached node {block}");
        };
        let mut node = Node::clone(&old);
        node.generation = gen;
        for p in node.ptrs() {
            self.refs.add(p.block);
        }
        if old.is_leaf() {
            self.refs.copied_leaf(old);
        }
        self.refs.drop_one(block);
        self.cache.insert(new, node, true);
        self.changes.dirty_nodes += 1;
        // No leaf hint is stale for this: a hint names a leaf its tree owns alone (taken
        // through a copying descent), which only a share, moving `shape_seq`, makes shared.
        Counters::inc(&self.counters.node_unshares);
        Ok(new)
    }
}
