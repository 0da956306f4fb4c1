//! The in-memory form of a B+tree node: keys in one vector (binary search touches only keys),
//! values packed in one buffer ([`LeafVals`]) or child pointers in another. Decoded once when
//! read, encoded once at commit.
use super::leaf_vals::LeafVals;
use idxfs_format::node::{self, Checked, Expect, Identity, ITEM_HEADER_SIZE, KEY_PTR_SIZE};
use idxfs_format::{Corrupt, Key};

/// A pointer from an internal node: child block and the generation that wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ptr {
    pub block: u64,
    pub generation: u64,
}

#[derive(Debug, Clone)]
pub enum Body {
    Leaf(LeafVals),
    Internal(Vec<Ptr>),
}

#[derive(Debug, Clone)]
pub struct Node {
    pub level: u8,
    pub owner: u64,
    /// Generation that allocated this node's block. Equal to the running transaction's
    /// generation exactly when the node is dirty (changed since the last commit).
    pub generation: u64,
    pub keys: Vec<Key>,
    pub body: Body,
    /// Leaf: bytes of item headers + data. Internal: bytes of key pointers.
    pub used: usize,
}

impl Node {
    pub fn new_leaf(owner: u64, generation: u64) -> Node {
        Node {
            level: 0,
            owner,
            generation,
            keys: Vec::new(),
            body: Body::Leaf(LeafVals::new()),
            used: 0,
        }
    }

    pub fn new_internal(owner: u64, generation: u64, level: u8) -> Node {
        Node {
            level,
            owner,
            generation,
            keys: Vec::new(),
            body: Body::Internal(Vec::new()),
            used: 0,
        }
    }

    pub fn is_leaf(&self) -> bool {
        self.level == 0
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn leaf_vals(&self) -> &LeafVals {
        static NONE: LeafVals = LeafVals::new();
        match &self.body {
            Body::Leaf(v) => v,
            Body::Internal(_) => &NONE,
        }
    }

    pub fn leaf_vals_mut(&mut self) -> &mut LeafVals {
        match &mut self.body {
            Body::Leaf(v) => v,
            Body::Internal(_) => panic!("leaf_vals_mut on an internal node (level {})", self.level),
        }
    }

    pub fn ptrs(&self) -> &[Ptr] {
        match &self.body {
            Body::Internal(p) => p,
            Body::Leaf(_) => &[],
        }
    }

    pub fn ptrs_mut(&mut self) -> &mut Vec<Ptr> {
        match &mut self.body {
            Body::Internal(p) => p,
            Body::Leaf(_) => panic!("ptrs_mut on a leaf"),
        }
    }

    /// Index of the child whose subtree may hold `key`: the last pointer whose key is <= key,
    /// or 0 when key sorts before every separator.
    pub fn child_index(&self, key: &Key) -> usize {
        self.keys.partition_point(|k| k <= key).saturating_sub(1)
    }

    /// Decodes a node that passed [`node::check`].
    pub fn decode(bytes: &[u8], exp: &Expect) -> Result<Node, Corrupt> {
        let c: Checked<'_> = node::check(bytes, exp)?;
        let n = c.nritems();
        let level = c.level();
        let mut keys = Vec::with_capacity(n);
        let (body, used) = if level == 0 {
            let bytes = (0..n).map(|i| c.item(i).1.len()).sum();
            let mut vals = LeafVals::with_capacity(n, bytes);
            for i in 0..n {
                let (k, v) = c.item(i);
                keys.push(k);
                vals.push(v);
            }
            let used = n * ITEM_HEADER_SIZE + bytes;
            (Body::Leaf(vals), used)
        } else {
            let mut ptrs = Vec::with_capacity(n);
            for i in 0..n {
                let (k, block, generation) = c.ptr(i);
                keys.push(k);
                ptrs.push(Ptr { block, generation });
            }
            (Body::Internal(ptrs), n * KEY_PTR_SIZE)
        };
        Ok(Node {
            level,
            owner: exp.owner,
            generation: exp.generation,
            keys,
            body,
            used,
        })
    }

    /// Encodes into `out` (exactly one node) for block `block`.
    pub fn encode(&self, out: &mut [u8], block: u64, fsid: [u8; 16]) {
        let id = Identity {
            block,
            generation: self.generation,
            owner: self.owner,
            fsid,
        };
        match &self.body {
            Body::Leaf(vals) => node::encode_leaf(out, &id, self.keys.iter().zip(vals.iter())),
            Body::Internal(ptrs) => node::encode_internal(
                out,
                &id,
                self.level,
                self.keys
                    .iter()
                    .zip(ptrs.iter())
                    .map(|(k, p)| (*k, p.block, p.generation)),
            ),
        }
    }

    /// Checks the in-memory invariants (cheap enough for every split and merge).
    pub fn assert_invariants(&self, capacity: usize) {
        debug_assert!(
            self.keys.windows(2).all(|w| w[0] < w[1]),
            "keys out of order in node"
        );
        match &self.body {
            Body::Leaf(v) => {
                assert_eq!(v.len(), self.keys.len(), "leaf value count");
                assert_eq!(self.used, v.live_bytes() + v.len() * ITEM_HEADER_SIZE);
                #[cfg(debug_assertions)]
                v.assert_invariants();
            }
            Body::Internal(p) => {
                assert_eq!(p.len(), self.keys.len(), "internal pointer count");
                assert_eq!(self.used, p.len() * KEY_PTR_SIZE);
            }
        }
        assert!(
            self.used <= capacity,
            "node over capacity: {} > {capacity}",
            self.used
        );
    }
}
