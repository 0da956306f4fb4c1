//! The node cache: every node the engine holds, found by block number through an XArray
//! (seed 000: dense integer keys belong in a radix tree), stored in a slab. Dirty nodes (changed
//! in the running transaction) carry the XArray's DIRTY mark, so commit walks them in block
//! order without sorting, and they stay until commit; clean ones are evicted to keep the bound.
//!
//! Nodes are held by `Arc`: a commit freezes its generation by taking a reference to each dirty
//! node and writes them outside the operation lock (`crate::txn`). A node is changed only in
//! the running transaction's generation, which the frozen one never is, so a frozen node is
//! never written through (`Arc::make_mut` would copy it if it were); and a node a commit still
//! holds is not evicted, so nothing reads its block from the device before the commit wrote it.
use super::node::Node;
use idxfs_index::XArray;
use std::alloc::Layout;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

/// XArray mark for dirty entries.
pub const DIRTY: usize = 0;

/// A cheap multiply-shift hasher for u64 keys (for the few hash maps left, e.g. in fsck).
#[derive(Default)]
pub struct BlockHasher(u64);
impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100000001b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<BlockHasher>>;

struct Entry {
    block: u64,
    node: Arc<Node>,
    referenced: bool,
}

/// An XArray from keys to slab slots, and the slab: the shape both engine caches share.
pub struct Slab<E> {
    index: XArray<u32>,
    slots: Vec<Option<E>>,
    free: Vec<u32>,
}

impl<E> Default for Slab<E> {
    fn default() -> Self {
        Slab {
            index: XArray::new(),
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<E> Slab<E> {
    #[inline]
    pub fn get(&mut self, key: u64) -> Option<&mut E> {
        let slot = self.index.get_mut_access(key)?;
        self.slots.get_mut(slot as usize).and_then(|e| e.as_mut())
    }

    pub fn contains(&mut self, key: u64) -> bool {
        self.index.get_mut_access(key).is_some()
    }

    /// Inserts a new key. Out of memory for an index node aborts, as for any std collection.
    pub fn insert(&mut self, key: u64, e: E) {
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(e);
                s
            }
            None => {
                self.slots.push(Some(e));
                (self.slots.len() - 1) as u32
            }
        };
        match self.index.try_insert_mut(key, slot) {
            Ok(None) => {}
            Ok(Some(_)) => panic!("slab key {key} inserted twice"),
            Err(_) => std::alloc::handle_alloc_error(Layout::new::<[u64; 72]>()),
        }
    }

    pub fn remove(&mut self, key: u64) -> Option<E> {
        let slot = self.index.remove_mut(key)?;
        self.free.push(slot);
        self.slots.get_mut(slot as usize).and_then(|e| e.take())
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub fn set_mark(&mut self, key: u64, m: usize) {
        self.index.set_mark_mut(key, m);
    }

    pub fn clear_mark(&mut self, key: u64, m: usize) {
        self.index.clear_mark_mut(key, m);
    }

    /// Keys carrying mark `m`, ascending.
    pub fn marked(&self, m: usize) -> Vec<u64> {
        self.index
            .range_marked(0, u64::MAX, m)
            .map(|(k, _)| k)
            .collect()
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut E> {
        self.slots.iter_mut().flatten()
    }

    pub fn clear(&mut self) {
        self.index = XArray::new();
        self.slots.clear();
        self.free.clear();
    }
}

pub struct NodeCache {
    slab: Slab<Entry>,
    /// Bound on the number of nodes held; an in-memory node costs at most about twice the
    /// on-disk node size, so this is a memory bound of `limit_nodes * 2 * node_size`.
    limit_nodes: usize,
}

impl NodeCache {
    pub fn new(limit_nodes: usize) -> Self {
        NodeCache {
            slab: Slab::default(),
            limit_nodes: limit_nodes.max(64),
        }
    }

    #[inline]
    pub fn get(&mut self, block: u64) -> Option<&Node> {
        self.slab.get(block).map(|e| {
            e.referenced = true;
            &*e.node
        })
    }

    #[inline]
    pub fn get_mut(&mut self, block: u64) -> Option<&mut Node> {
        self.slab.get(block).map(|e| {
            e.referenced = true;
            Arc::make_mut(&mut e.node)
        })
    }

    pub fn contains(&mut self, block: u64) -> bool {
        self.slab.contains(block)
    }

    /// The cached node at `block`, shared: it stays cached as it is.
    pub fn get_arc(&mut self, block: u64) -> Option<Arc<Node>> {
        self.slab.get(block).map(|e| {
            e.referenced = true;
            e.node.clone()
        })
    }

    /// Inserts a node; `dirty` marks it as changed in the running transaction.
    pub fn insert(&mut self, block: u64, node: Node, dirty: bool) {
        self.insert_arc(block, Arc::new(node), dirty);
    }

    /// Inserts a node that may be shared (with a commit writing it).
    pub fn insert_arc(&mut self, block: u64, node: Arc<Node>, dirty: bool) {
        self.slab.insert(
            block,
            Entry {
                block,
                node,
                referenced: true,
            },
        );
        if dirty {
            self.slab.set_mark(block, DIRTY);
        }
    }

    /// Takes a node out; it may still be shared with a commit writing it.
    pub fn remove(&mut self, block: u64) -> Option<Arc<Node>> {
        self.slab.remove(block).map(|e| e.node)
    }

    pub fn len(&self) -> usize {
        self.slab.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slab.is_empty()
    }

    pub fn over_limit(&self) -> bool {
        self.slab.len() > self.limit_nodes
    }

    /// Second-chance eviction of clean nodes (generation < `running`, and no commit writing
    /// them) until under 3/4 of the limit or nothing clean is left. Returns the number evicted.
    pub fn evict(&mut self, running_generation: u64) -> u64 {
        let target = self.limit_nodes / 4 * 3;
        let mut evicted = 0u64;
        for _pass in 0..2 {
            let len = self.slab.len();
            if len <= target {
                break;
            }
            let need = len - target;
            let mut victims = Vec::new();
            for e in self.slab.values_mut() {
                if victims.len() >= need
                    || e.node.generation >= running_generation
                    || Arc::strong_count(&e.node) > 1
                {
                    continue;
                }
                if e.referenced {
                    e.referenced = false;
                } else {
                    victims.push(e.block);
                }
            }
            for b in victims {
                self.slab.remove(b);
                evicted += 1;
            }
        }
        evicted
    }

    /// Every dirty block, ascending (from the DIRTY mark: no scan of the cache, no sort).
    pub fn dirty_blocks(&self) -> Vec<u64> {
        self.slab.marked(DIRTY)
    }

    /// A commit freezes its generation: every dirty node, ascending, shared with the cache and
    /// no longer marked dirty (the next generation's changes copy them first).
    pub fn freeze_dirty(&mut self) -> Vec<(u64, Arc<Node>)> {
        let blocks = self.dirty_blocks();
        let mut out = Vec::with_capacity(blocks.len());
        for b in blocks {
            self.slab.clear_mark(b, DIRTY);
            if let Some(e) = self.slab.get(b) {
                out.push((b, e.node.clone()));
            }
        }
        out
    }

    pub fn clear(&mut self) {
        self.slab.clear();
    }
}
