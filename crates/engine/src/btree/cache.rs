//! The node cache: every node the engine holds, keyed by block number. Dirty nodes (changed in
//! the running transaction) stay until commit; clean ones are evicted to keep the memory bound.
//! Keyed by block number behind this one type so the XArray of the index issue can replace the
//! hash map without touching callers.
use super::node::Node;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Block numbers are already well spread; a multiply-shift hash is enough and far cheaper than
/// SipHash.
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
    node: Node,
    referenced: bool,
}

pub struct NodeCache {
    map: FastMap<u64, Entry>,
    /// Bound on the number of nodes held; an in-memory node costs at most about twice the
    /// on-disk node size, so this is a memory bound of `limit_nodes * 2 * node_size`.
    limit_nodes: usize,
}

impl NodeCache {
    pub fn new(limit_nodes: usize) -> Self {
        NodeCache {
            map: FastMap::default(),
            limit_nodes: limit_nodes.max(64),
        }
    }

    #[inline]
    pub fn get(&mut self, block: u64) -> Option<&Node> {
        self.map.get_mut(&block).map(|e| {
            e.referenced = true;
            &e.node
        })
    }

    #[inline]
    pub fn get_mut(&mut self, block: u64) -> Option<&mut Node> {
        self.map.get_mut(&block).map(|e| {
            e.referenced = true;
            &mut e.node
        })
    }

    pub fn contains(&self, block: u64) -> bool {
        self.map.contains_key(&block)
    }

    pub fn insert(&mut self, block: u64, node: Node) {
        let old = self.map.insert(
            block,
            Entry {
                node,
                referenced: true,
            },
        );
        assert!(old.is_none(), "node cache already held block {block}");
    }

    pub fn remove(&mut self, block: u64) -> Option<Node> {
        self.map.remove(&block).map(|e| e.node)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn over_limit(&self) -> bool {
        self.map.len() > self.limit_nodes
    }

    /// Second-chance eviction of clean nodes (generation < `running`) until under 3/4 of the
    /// limit or nothing clean is left. Returns the number evicted.
    pub fn evict(&mut self, running_generation: u64) -> u64 {
        let target = self.limit_nodes / 4 * 3;
        let mut evicted = 0u64;
        for _pass in 0..2 {
            let len = self.map.len();
            if len <= target {
                break;
            }
            let need = (len - target) as u64;
            let mut dropped = 0u64;
            self.map.retain(|_, e| {
                if dropped >= need || e.node.generation >= running_generation {
                    return true;
                }
                if e.referenced {
                    e.referenced = false;
                    return true;
                }
                dropped += 1;
                false
            });
            evicted += dropped;
        }
        evicted
    }

    /// Every dirty block (generation == running), sorted, for commit.
    pub fn dirty_blocks(&self, running_generation: u64) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .map
            .iter()
            .filter(|(_, e)| e.node.generation == running_generation)
            .map(|(b, _)| *b)
            .collect();
        v.sort_unstable();
        v
    }

    pub fn clear(&mut self) {
        self.map.clear();
    }
}
