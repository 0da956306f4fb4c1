//! Copy-on-write B+tree operations: lookup, insert, update, delete, ordered scans.
//!
//! Glossary:
//! - *path*: (block, child index) from the root down to a leaf, every node already COWed, so
//!   changes can walk back up it.
//! - *low key*: an internal node's key for child i is the smallest key in that child's subtree
//!   (btrfs's invariant); `fixup_low_keys` restores it when a leaf's first key changes.
//!
//! Split policy (seed 002): when an insert lands at the right end of a full node, the node
//! stays full and a new right sibling starts with just the new entry, so ascending inserts
//! (inode numbers, directory indexes) fill nodes instead of leaving them half empty. An insert
//! that ends a run of one object's items of one type, with other items after it (a directory's
//! inode-order entries, then the next inode), splits right after itself when that left part
//! fits; so does a new inode's item or back reference that follows the previous number's items
//! with a later object's after it (a directory's run of inode numbers filling in front of
//! another directory's run, `fs::ino_runs`). Anywhere else the node splits at its byte
//! midpoint.
//!
//! Leaf hints: an insert made through a [`LeafHint`] right after one that went to the same leaf
//! skips the descent, checked by a counter of shape changes (`Store::shape_seq`), not trust.
//!
//! Merge policy: after a delete, a node below 1/4 full merges with a neighbour only if the
//! result is at most 3/4 full. A merged node needs a quarter of a node of inserts before it can
//! split again, and each half of a split starts near 1/2, far above the 1/4 trigger, so
//! alternating insert/delete at a boundary cannot thrash.
use super::node::{Node, Ptr};
use super::store::Store;
use crate::counters::Counters;
use crate::error::{Error, Result};
use idxfs_format::node::{
    internal_capacity, leaf_capacity, KeyRange, ITEM_HEADER_SIZE, KEY_PTR_SIZE, MAX_LEVEL,
};
use idxfs_format::{ItemType, Key};
use std::collections::HashSet;
use std::sync::Arc;

#[derive(Debug, Clone, Copy)]
pub struct Tree {
    pub owner: u64,
    pub root: Ptr,
    pub level: u8,
}

type Path = Vec<(u64, usize)>;

/// How far one `drop_node` went.
enum Dropped {
    /// The node and everything under it (or this tree's count of a shared node).
    All,
    /// Every subtree whose keys sort below the key; the rest is left.
    UpTo(Key),
}

/// Where the last insert made through this hint landed: a leaf of the running transaction and
/// the smallest key that belongs to a leaf right of it. An insert through the hint goes straight
/// to that leaf, with no descent, when the hint is still true (same generation, no split, merge
/// or low-key change anywhere since: `Store::shape_seq`), the key falls after the leaf's first
/// key and before the bound, and the item fits without a split. Keys that ascend, such as a
/// directory's inode-order index during creates, take that path until the leaf fills.
#[derive(Debug, Clone, Copy, Default)]
pub struct LeafHint {
    leaf: u64,
    bound: Option<Key>,
    shape_seq: u64,
    /// 0: never set (no transaction has generation 0).
    generation: u64,
    owner: u64,
    /// The tree's root block when the hint was taken: trees sharing nodes (snapshots) have
    /// one owner, and each its own root once it changes (a share moves `shape_seq`).
    root: u64,
}

/// What an `update` closure asks for.
pub enum Change {
    Keep,
    Delete,
}

impl Tree {
    /// A new, empty tree (one empty leaf) in the running transaction.
    pub fn create(store: &mut Store, owner: u64) -> Result<Tree> {
        let leaf = Node::new_leaf(owner, store.generation);
        let block = store.alloc_node(leaf)?;
        Ok(Tree {
            owner,
            root: Ptr {
                block,
                generation: store.generation,
            },
            level: 0,
        })
    }

    /// A second tree holding this one's items, sharing every node (a snapshot): one count,
    /// whatever the tree holds. Either tree may change afterwards; each copies the nodes it
    /// changes and no other (`super::refs`).
    pub fn share(&self, store: &mut Store) -> Tree {
        store.refs.share_root(self.root.block, store.generation);
        // Hints into the shared nodes are stale: a change now copies them first.
        store.changes.shape_seq += 1;
        Counters::inc(&store.counters.tree_shares);
        *self
    }

    /// Drops up to `budget` nodes of this tree, which nothing changes any more, and returns
    /// where the next step starts, or None when the whole tree is gone. `from`: what the
    /// previous step returned, `Key::MIN` for the first. A node shared with another tree
    /// loses one count and is not entered; a node this tree owns alone is entered, its
    /// children dropped, then it is freed, and a leaf's node goes on `leaves` first (what
    /// its items name is the caller's to let go of).
    ///
    /// The tree is not changed while it is dropped: every subtree whose keys all sort below
    /// `from` is gone, and the rest is as it was. So the tree's root and `from` are all a
    /// later step (or a resumed one, after a crash) needs.
    pub fn drop_some(
        &self,
        store: &mut Store,
        from: Key,
        budget: usize,
        leaves: &mut Vec<Arc<Node>>,
    ) -> Result<Option<Key>> {
        assert!(budget >= 1, "a drop step of no nodes");
        let mut left = budget;
        let step = self.drop_node(
            store,
            self.root,
            self.level,
            KeyRange::ANY,
            from,
            &mut left,
            leaves,
        )?;
        Ok(match step {
            Dropped::All => None,
            Dropped::UpTo(k) => Some(k),
        })
    }

    #[expect(clippy::too_many_arguments, reason = "one recursion step of drop_some")]
    fn drop_node(
        &self,
        store: &mut Store,
        ptr: Ptr,
        level: u8,
        range: KeyRange,
        from: Key,
        left: &mut usize,
        leaves: &mut Vec<Arc<Node>>,
    ) -> Result<Dropped> {
        // A node counts against the budget when it is done with (freed or let go of), so
        // every step with a budget drops at least one node.
        if store.refs.is_shared(ptr.block, ptr.generation) {
            // The other parents keep it, and what is under it.
            store.refs.drop_one(ptr.block);
            *left = left.saturating_sub(1);
            return Ok(Dropped::All);
        }
        store.load(ptr.block, ptr.generation, self.owner, Some(level), range)?;
        let Some(n) = store.cache.get_arc(ptr.block) else {
            panic!("node {} not cached after load", ptr.block);
        };
        if n.is_leaf() {
            leaves.push(n);
        } else {
            for (i, p) in n.ptrs().iter().enumerate() {
                let r = child_range(&n, i, range.below);
                if r.below.is_some_and(|b| b <= from) {
                    continue; // dropped by an earlier step
                }
                if *left == 0 {
                    // Only after a sibling was dropped in this step: the child `from` falls
                    // in, if any, is always entered first. So this child is whole.
                    debug_assert!(n.keys[i] >= from, "a drop step going back");
                    return Ok(Dropped::UpTo(n.keys[i]));
                }
                let below = self.drop_node(store, *p, level - 1, r, from, left, leaves)?;
                if let Dropped::UpTo(k) = below {
                    return Ok(Dropped::UpTo(k));
                }
            }
        }
        store.free_node(ptr.block)?;
        *left = left.saturating_sub(1);
        Ok(Dropped::All)
    }

    /// Counts, in `found`, the parents of every node of this tree from `from` on (as
    /// `drop_some` left it; `Key::MIN` for a tree not being dropped): the tree's root
    /// pointer, and each pointer of an internal node. A node already in `found` (reached
    /// through another tree) is not entered again, so each node's pointers count once, and
    /// `on_leaf` sees each leaf once however many trees share it. fsck compares the result
    /// with the counts the store keeps (`NodeRefs::check`).
    pub fn count_parents(
        &self,
        store: &mut Store,
        from: Key,
        found: &mut std::collections::HashMap<u64, u32>,
        mut on_leaf: impl FnMut(&Node),
    ) -> Result<()> {
        let mut stack = Vec::new();
        let reach = |found: &mut std::collections::HashMap<u64, u32>, p: Ptr| {
            let c = found.entry(p.block).or_insert(0);
            *c += 1;
            *c == 1
        };
        if reach(found, self.root) {
            stack.push((self.root, self.level, KeyRange::ANY));
        }
        while let Some((p, level, range)) = stack.pop() {
            store.load(p.block, p.generation, self.owner, Some(level), range)?;
            let Some(n) = store.cache.get_arc(p.block) else {
                panic!("node {} not cached after load", p.block);
            };
            if n.is_leaf() {
                on_leaf(&n);
                continue;
            }
            for (i, c) in n.ptrs().iter().enumerate() {
                let r = child_range(&n, i, range.below);
                if r.below.is_some_and(|b| b <= from) {
                    continue;
                }
                if reach(found, *c) {
                    stack.push((*c, level - 1, r));
                }
            }
        }
        Ok(())
    }

    fn leaf_cap(store: &Store) -> usize {
        leaf_capacity(store.node_size)
    }

    /// Capacity in `used` units (bytes) of a leaf or internal node.
    fn cap(node_size: u32, leaf: bool) -> usize {
        if leaf {
            leaf_capacity(node_size)
        } else {
            internal_capacity(node_size) * KEY_PTR_SIZE
        }
    }

    /// Descends without changing anything; returns the leaf block for `key`.
    fn find_leaf(&self, store: &mut Store, key: &Key) -> Result<u64> {
        self.descend(store, key, |_| {})
    }

    /// Descends without changing anything, telling `on_pick` the child taken at each internal
    /// node from the root down; returns the leaf block for `key`.
    fn descend(&self, store: &mut Store, key: &Key, mut on_pick: impl FnMut(usize)) -> Result<u64> {
        let (mut block, mut gen, mut level) = (self.root.block, self.root.generation, self.level);
        let mut range = KeyRange::ANY;
        loop {
            store.load(block, gen, self.owner, Some(level), range)?;
            let n = store.node(block);
            if n.is_leaf() {
                return Ok(block);
            }
            let i = n.child_index(key);
            on_pick(i);
            let p = n.ptrs()[i];
            range = child_range(n, i, range.below);
            block = p.block;
            gen = p.generation;
            level -= 1;
        }
    }

    /// Calls `f` with the value of `key`, if present.
    pub fn with<R>(
        &self,
        store: &mut Store,
        key: &Key,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        let leaf = self.find_leaf(store, key)?;
        let n = store.node(leaf);
        Ok(n.keys
            .binary_search(key)
            .ok()
            .map(|i| f(n.leaf_vals().get(i))))
    }

    pub fn get(&self, store: &mut Store, key: &Key) -> Result<Option<Vec<u8>>> {
        self.with(store, key, |v| v.to_vec())
    }

    pub fn contains(&self, store: &mut Store, key: &Key) -> Result<bool> {
        Ok(self.with(store, key, |_| ())?.is_some())
    }

    /// Descends to the leaf for `key`, copying every node on the way (COW).
    fn cow_path(&mut self, store: &mut Store, key: &Key) -> Result<Path> {
        Ok(self.cow_path_bounded(store, key)?.0)
    }

    /// `cow_path`, and the smallest key that belongs right of the leaf (None: rightmost).
    fn cow_path_bounded(&mut self, store: &mut Store, key: &Key) -> Result<(Path, Option<Key>)> {
        self.cow_descend(store, |n, _| n.child_index(key))
    }

    /// Descends from the root to a leaf, copying every node on the way (COW), taking child
    /// `pick(node, depth)` of each internal node; returns the path and the smallest key that
    /// belongs right of the leaf (None: rightmost).
    fn cow_descend(
        &mut self,
        store: &mut Store,
        mut pick: impl FnMut(&Node, usize) -> usize,
    ) -> Result<(Path, Option<Key>)> {
        let gen = store.generation;
        let root = store.load_cow(
            self.root.block,
            self.root.generation,
            self.owner,
            Some(self.level),
            KeyRange::ANY,
        )?;
        self.root = Ptr {
            block: root,
            generation: gen,
        };
        let mut path = Vec::with_capacity(self.level as usize + 1);
        let mut bound = None;
        let mut block = root;
        loop {
            let n = store.node(block);
            if n.is_leaf() {
                path.push((block, 0));
                return Ok((path, bound));
            }
            let i = pick(n, path.len());
            let range = child_range(n, i, bound);
            bound = range.below;
            let p = n.ptrs()[i];
            let level = n.level - 1;
            let c = store.load_cow(p.block, p.generation, self.owner, Some(level), range)?;
            if c != p.block || p.generation != gen {
                store.node_mut(block).ptrs_mut()[i] = Ptr {
                    block: c,
                    generation: gen,
                };
            }
            path.push((block, i));
            block = c;
        }
    }

    /// Descends without changing anything: the child taken at each internal node, and where
    /// `key` sits in the leaf (None: absent).
    fn find_in_leaf(&self, store: &mut Store, key: &Key) -> Result<(Vec<usize>, Option<usize>)> {
        let mut picks = Vec::with_capacity(self.level as usize);
        let leaf = self.descend(store, key, |i| picks.push(i))?;
        let pos = store.node(leaf).keys.binary_search(key).ok();
        Ok((picks, pos))
    }

    /// One descent for insert-or-change: `f` gets the current value (None if absent) and may
    /// change it in place; when absent it may return a value to insert. Returns what `f` said.
    pub fn upsert(
        &mut self,
        store: &mut Store,
        key: Key,
        f: impl FnOnce(Option<&mut Vec<u8>>) -> Option<Vec<u8>>,
    ) -> Result<()> {
        let path = self.cow_path(store, &key)?;
        let d = path.len() - 1;
        let leaf = path[d].0;
        let n = store.node_mut(leaf);
        match n.keys.binary_search(&key) {
            Ok(pos) => {
                // Values are packed in the leaf: `f` changes a copy, written back after.
                let mut v = n.leaf_vals().get(pos).to_vec();
                let before = v.len();
                let r = f(Some(&mut v));
                debug_assert!(r.is_none(), "upsert returned a value for an existing key");
                let after = v.len();
                assert!(
                    after <= idxfs_format::node::max_item_size(store.node_size),
                    "item grew to {after} bytes"
                );
                let n = store.node_mut(leaf);
                n.leaf_vals_mut().set(pos, &v);
                n.used = n.used + after - before;
                let over = n.used > Self::leaf_cap(store);
                store.changes.mod_seq += 1;
                store.changes.log.note(self.owner, key);
                if over {
                    self.split(store, &path, d, pos)?;
                } else if after < before {
                    self.rebalance(store, &path, d)?;
                }
            }
            Err(pos) => {
                let Some(val) = f(None) else { return Ok(()) };
                assert!(
                    val.len() <= idxfs_format::node::max_item_size(store.node_size),
                    "item of {} bytes",
                    val.len()
                );
                self.insert_at(store, &path, pos, key, val)?;
            }
        }
        Ok(())
    }

    /// Puts a new item at `pos` of the leaf at the end of `path`, then restores the low-key
    /// invariant and splits if the leaf overflowed.
    fn insert_at(
        &mut self,
        store: &mut Store,
        path: &Path,
        pos: usize,
        key: Key,
        val: Vec<u8>,
    ) -> Result<()> {
        let d = path.len() - 1;
        let n = store.node_mut(path[d].0);
        n.used += ITEM_HEADER_SIZE + val.len();
        n.keys.insert(pos, key);
        n.leaf_vals_mut().insert(pos, &val);
        let over = n.used > Self::leaf_cap(store);
        store.changes.mod_seq += 1;
        store.changes.log.note(self.owner, key);
        if pos == 0 {
            self.fixup_low_keys(store, path, d, key);
        }
        if over {
            self.split(store, path, d, pos)?;
        }
        Ok(())
    }

    /// Inserts `key` unless it exists, in which case `val` comes back. Through `hint`, an insert
    /// next to the previous one costs one cache lookup instead of a descent (see [`LeafHint`]).
    pub fn insert_near(
        &mut self,
        store: &mut Store,
        key: Key,
        val: Vec<u8>,
        hint: &mut LeafHint,
    ) -> Result<Option<Vec<u8>>> {
        let add = ITEM_HEADER_SIZE + val.len();
        assert!(
            val.len() <= idxfs_format::node::max_item_size(store.node_size),
            "item of {} bytes",
            val.len()
        );
        match self.hinted_pos(store, &key, add, hint) {
            Some(Ok(_)) => return Ok(Some(val)),
            Some(Err(pos)) => {
                let n = store.node_mut(hint.leaf);
                n.used += add;
                n.keys.insert(pos, key);
                n.leaf_vals_mut().insert(pos, &val);
                store.changes.mod_seq += 1;
                store.changes.log.note(self.owner, key);
                Counters::inc(&store.counters.leaf_hint_hits);
                return Ok(None);
            }
            None => Counters::inc(&store.counters.leaf_hint_misses),
        }
        let (path, bound) = self.cow_path_bounded(store, &key)?;
        let leaf = path[path.len() - 1].0;
        // Taken before the insert: if it splits the leaf or changes its first key, the hint
        // is stale at once and the next insert descends.
        *hint = LeafHint {
            leaf,
            bound,
            shape_seq: store.changes.shape_seq,
            generation: store.generation,
            owner: self.owner,
            root: self.root.block,
        };
        let pos = match store.node(leaf).keys.binary_search(&key) {
            Ok(_) => return Ok(Some(val)),
            Err(p) => p,
        };
        self.insert_at(store, &path, pos, key, val)?;
        Ok(None)
    }

    /// Where `key` goes in the hint's leaf (`Ok`: it is there already), if the hint still
    /// holds for it, the key sorts after the leaf's first key (so no low key changes) and
    /// `add` more bytes fit (so no split). None: descend.
    fn hinted_pos(
        &self,
        store: &mut Store,
        key: &Key,
        add: usize,
        hint: &LeafHint,
    ) -> Option<std::result::Result<usize, usize>> {
        if hint.generation != store.generation
            || hint.shape_seq != store.changes.shape_seq
            || hint.owner != self.owner
            || hint.root != self.root.block
            || hint.bound.is_some_and(|b| *key >= b)
        {
            return None;
        }
        let (gen, cap) = (store.generation, Self::leaf_cap(store));
        let n = store.cache.get(hint.leaf)?;
        // While shape_seq stands still the hinted block is the same dirty leaf of this tree
        // (blocks change owner only by merges and frees, which bump it); checked anyway.
        debug_assert!(n.is_leaf() && n.generation == gen && n.owner == self.owner);
        if !n.is_leaf() || n.generation != gen || n.owner != self.owner {
            return None;
        }
        // A share since the hint moved `shape_seq`, so the leaf is this tree's own; checked
        // anyway, since a change to a shared leaf would show in every tree sharing it.
        if store.refs.is_shared(hint.leaf, gen) {
            return None;
        }
        if *key <= *n.keys.first()? {
            return None;
        }
        let at = match n.keys.last() {
            Some(last) if last < key => Err(n.keys.len()),
            _ => n.keys.binary_search(key),
        };
        match at {
            Ok(i) => Some(Ok(i)),
            Err(_) if n.used + add > cap => None,
            Err(p) => Some(Err(p)),
        }
    }

    /// Inserts a new item. The key must not exist (callers look first; a duplicate is a bug in
    /// the caller, reported as `Error::Exists`).
    pub fn insert(&mut self, store: &mut Store, key: Key, val: Vec<u8>) -> Result<()> {
        assert!(
            val.len() <= idxfs_format::node::max_item_size(store.node_size),
            "item of {} bytes",
            val.len()
        );
        let path = self.cow_path(store, &key)?;
        let leaf = path[path.len() - 1].0;
        let n = store.node_mut(leaf);
        let pos = match n.keys.binary_search(&key) {
            Ok(_) => return Err(Error::Exists),
            Err(p) => p,
        };
        self.insert_at(store, &path, pos, key, val)
    }

    /// Changes the value of `key` in place (`f` gets it mutably), or deletes it. Returns false
    /// when the key does not exist.
    pub fn update(
        &mut self,
        store: &mut Store,
        key: &Key,
        f: impl FnOnce(&mut Vec<u8>) -> Change,
    ) -> Result<bool> {
        // One search per node: a read-only descent finds the key (a miss copies nothing), then
        // the COW descent retraces the same children without searching again.
        let (picks, Some(pos)) = self.find_in_leaf(store, key)? else {
            return Ok(false);
        };
        let (path, _) = self.cow_descend(store, |_, depth| picks[depth])?;
        let d = path.len() - 1;
        let leaf = path[d].0;
        let n = store.node_mut(leaf);
        // COW moves nodes, it does not change them: the key is where the first descent saw it.
        debug_assert_eq!(n.keys.binary_search(key), Ok(pos));
        // Values are packed in the leaf: `f` changes a copy, written back if kept.
        let mut v = n.leaf_vals().get(pos).to_vec();
        let before = v.len();
        let change = f(&mut v);
        let after = v.len();
        store.changes.mod_seq += 1;
        store.changes.log.note(self.owner, *key);
        match change {
            Change::Delete => {
                self.remove_at(store, &path, pos, before)?;
            }
            Change::Keep => {
                assert!(
                    after <= idxfs_format::node::max_item_size(store.node_size),
                    "item grew to {after} bytes"
                );
                let n = store.node_mut(leaf);
                n.leaf_vals_mut().set(pos, &v);
                n.used = n.used + after - before;
                if n.used > Self::leaf_cap(store) {
                    self.split(store, &path, d, pos)?;
                } else if after < before {
                    self.rebalance(store, &path, d)?;
                }
            }
        }
        Ok(true)
    }

    /// Inserts or replaces.
    pub fn put(&mut self, store: &mut Store, key: Key, val: Vec<u8>) -> Result<()> {
        let mut val = Some(val);
        let replaced = self.update(store, &key, |v| {
            *v = val.take().unwrap_or_default();
            Change::Keep
        })?;
        match (replaced, val) {
            (false, Some(v)) => self.insert(store, key, v),
            _ => Ok(()),
        }
    }

    /// Deletes `key`; returns its value if it existed.
    pub fn delete(&mut self, store: &mut Store, key: &Key) -> Result<Option<Vec<u8>>> {
        let mut out = None;
        self.update(store, key, |v| {
            out = Some(std::mem::take(v));
            Change::Delete
        })?;
        Ok(out)
    }

    /// Deletes up to `max` items with `lo <= key < hi`, all from the leaf that holds the last
    /// of them, from the last one down; returns them in key order (empty: none in range).
    ///
    /// One descent, one copied path and one rebalance whatever their number, so a caller that
    /// frees a long range in such batches needs the space of one item change per batch, not
    /// per item: what keeps deleting a file of a million extents bounded.
    pub fn delete_batch(
        &mut self,
        store: &mut Store,
        lo: Key,
        hi: Key,
        max: usize,
    ) -> Result<Vec<(Key, Vec<u8>)>> {
        assert!(max >= 1, "a batch of no items");
        let Some(at) = hi.predecessor() else {
            return Ok(Vec::new());
        };
        if at < lo {
            return Ok(Vec::new());
        }
        let Some((last, _)) = self.last_at_or_before(store, lo, at)? else {
            return Ok(Vec::new());
        };
        let path = self.cow_path(store, &last)?;
        let d = path.len() - 1;
        let n = store.node_mut(path[d].0);
        // `last` was found in the leaf this descent reaches (the leaf for `at` holds it, and
        // a COW moves nodes without changing them), unless a parent's keys disagree with its
        // children's: damage no single node shows, reported as such.
        let end = match n.keys.binary_search(&last) {
            Ok(i) => i + 1,
            Err(_) => {
                return Err(idxfs_format::Corrupt::new(
                    format!("tree {} keys above leaf {}", self.owner, path[d].0),
                    format!("no {last} where a search for it ends"),
                    "each parent key the smallest of its child",
                )
                .into())
            }
        };
        let start = n.keys[..end]
            .partition_point(|k| *k < lo)
            .max(end.saturating_sub(max));
        let mut out = Vec::with_capacity(end - start);
        for i in (start..end).rev() {
            let v = n.leaf_vals().get(i).to_vec();
            n.leaf_vals_mut().remove(i);
            n.used -= ITEM_HEADER_SIZE + v.len();
            out.push((n.keys[i], v));
        }
        n.keys.drain(start..end);
        let first = n.keys.first().copied();
        out.reverse();
        store.changes.mod_seq += 1;
        for (k, _) in &out {
            store.changes.log.note(self.owner, *k);
        }
        if let (0, Some(k)) = (start, first) {
            self.fixup_low_keys(store, &path, d, k);
        }
        self.rebalance(store, &path, d)?;
        Ok(out)
    }

    /// Removes leaf item `pos`, whose value was `len` bytes when last accounted in `used`.
    fn remove_at(&mut self, store: &mut Store, path: &Path, pos: usize, len: usize) -> Result<()> {
        let d = path.len() - 1;
        let n = store.node_mut(path[d].0);
        n.keys.remove(pos);
        n.leaf_vals_mut().remove(pos);
        n.used -= ITEM_HEADER_SIZE + len;
        let first = n.keys.first().copied();
        if let (0, Some(k)) = (pos, first) {
            self.fixup_low_keys(store, path, d, k);
        }
        self.rebalance(store, path, d)
    }

    /// Restores the low-key invariant above path[d] after node d's first key became `key`.
    fn fixup_low_keys(&mut self, store: &mut Store, path: &Path, d: usize, key: Key) {
        store.changes.shape_seq += 1;
        for j in (0..d).rev() {
            let (b, i) = path[j];
            store.node_mut(b).keys[i] = key;
            if i != 0 {
                break;
            }
        }
    }

    /// Splits the over-full node path[d]; `pos` is where the entry that overflowed it went.
    fn split(&mut self, store: &mut Store, path: &Path, d: usize, pos: usize) -> Result<()> {
        store.changes.shape_seq += 1;
        let gen = store.generation;
        let block = path[d].0;
        let counters = store.counters.clone();
        let leaf = store.node(block).is_leaf();
        let cap = Self::cap(store.node_size, leaf);
        let node = store.node_mut(block);
        let n = node.len();
        assert!(n >= 2, "cannot split a node of {n} entries");
        // Where the entry that overflowed the node sits decides the split:
        // - at the right end: keep this node full, start the right sibling with the new entry;
        // - at the end of its (object id, type) run with other items after it (a directory's
        //   inode-order entries followed by the next inode's items): split right after it, so
        //   the run's later inserts append to a node that fills, instead of splitting it in half
        //   again and again;
        // - a new inode's item or back reference right after the previous number's items, with
        //   a later object's after it: inode numbers come in runs per directory
        //   (`fs::ino_runs`), so while two directories fill, one's run goes on in front of the
        //   other's; split right after it too, for the same reason;
        // - anywhere else (random keys such as name hashes): at the byte midpoint.
        let inner = node.is_leaf() && pos + 1 < n && pos > 0;
        let ends_run = inner
            && (node.keys[pos + 1].objectid, node.keys[pos + 1].ty)
                != (node.keys[pos].objectid, node.keys[pos].ty)
            && (node.keys[pos - 1].objectid, node.keys[pos - 1].ty)
                == (node.keys[pos].objectid, node.keys[pos].ty);
        let run_goes_on = inner && {
            let (before, new, after) = (node.keys[pos - 1], node.keys[pos], node.keys[pos + 1]);
            (new.ty == ItemType::Inode as u8 || new.ty == ItemType::InodeRef as u8)
                && after.objectid > new.objectid
                && (before.objectid == new.objectid
                    || new.objectid.checked_sub(1) == Some(before.objectid))
        };
        let after_new = (ends_run || run_goes_on)
            // The left part keeps the new item: it must fit (a large new item followed by
            // small ones need not, and then the byte midpoint is the only safe split).
            && node.leaf_vals()
                .iter()
                .skip(pos + 1)
                .map(|v| ITEM_HEADER_SIZE + v.len())
                .sum::<usize>()
                >= node.used.saturating_sub(cap);
        let at = if pos == n - 1 {
            n - 1
        } else if after_new {
            pos + 1
        } else {
            let half = node.used / 2;
            let mut acc = 0;
            let mut at = n - 1;
            for i in 0..n {
                acc += match &node.body {
                    super::node::Body::Leaf(v) => ITEM_HEADER_SIZE + v.get(i).len(),
                    super::node::Body::Internal(_) => KEY_PTR_SIZE,
                };
                if acc >= half {
                    at = (i + 1).clamp(1, n - 1);
                    break;
                }
            }
            at
        };
        let mut right = if node.is_leaf() {
            Node::new_leaf(self.owner, gen)
        } else {
            Node::new_internal(self.owner, gen, node.level)
        };
        right.keys = node.keys.split_off(at);
        match (&mut node.body, &mut right.body) {
            (super::node::Body::Leaf(l), super::node::Body::Leaf(r)) => {
                *r = l.split_off(at);
                right.used = r.live_bytes() + r.len() * ITEM_HEADER_SIZE;
                if at == n - 1 || after_new {
                    Counters::inc(&counters.leaf_splits_append);
                } else {
                    Counters::inc(&counters.leaf_splits_half);
                }
            }
            (super::node::Body::Internal(l), super::node::Body::Internal(r)) => {
                *r = l.split_off(at);
                right.used = r.len() * KEY_PTR_SIZE;
                Counters::inc(&counters.internal_splits);
            }
            _ => unreachable!("split node and new sibling differ in kind"),
        }
        node.used -= right.used;
        let level = node.level;
        node.assert_invariants(cap);
        right.assert_invariants(cap);
        let left_first = node.keys[0];
        let right_first = right.keys[0];
        let rblock = store.alloc_node(right)?;
        let rptr = Ptr {
            block: rblock,
            generation: gen,
        };
        if d == 0 {
            // Root split: the tree grows a level.
            assert!(level + 1 < MAX_LEVEL, "tree deeper than {MAX_LEVEL}");
            let mut root = Node::new_internal(self.owner, gen, level + 1);
            root.keys = vec![left_first, right_first];
            root.body = super::node::Body::Internal(vec![
                Ptr {
                    block,
                    generation: gen,
                },
                rptr,
            ]);
            root.used = 2 * KEY_PTR_SIZE;
            let rb = store.alloc_node(root)?;
            self.root = Ptr {
                block: rb,
                generation: gen,
            };
            self.level = level + 1;
            Counters::inc(&store.counters.root_grows);
            return Ok(());
        }
        let (pb, pi) = path[d - 1];
        let icap = internal_capacity(store.node_size);
        let p = store.node_mut(pb);
        p.keys.insert(pi + 1, right_first);
        p.ptrs_mut().insert(pi + 1, rptr);
        p.used += KEY_PTR_SIZE;
        if p.len() > icap {
            self.split(store, path, d - 1, pi + 1)?;
        }
        Ok(())
    }

    /// Restores fill after path[d] shrank: drop it if empty, merge it with a neighbour if it is
    /// under 1/4 full and the pair fits in 3/4, collapse a root with one child.
    fn rebalance(&mut self, store: &mut Store, path: &Path, d: usize) -> Result<()> {
        let gen = store.generation;
        let block = path[d].0;
        if d == 0 {
            let n = store.node(block);
            if !n.is_leaf() && n.len() == 1 {
                let child = n.ptrs()[0];
                let level = n.level - 1;
                let range = child_range(n, 0, None);
                store.changes.shape_seq += 1;
                store.load(
                    child.block,
                    child.generation,
                    self.owner,
                    Some(level),
                    range,
                )?;
                store.free_node(block)?;
                self.root = child;
                self.level -= 1;
                Counters::inc(&store.counters.root_shrinks);
            }
            return Ok(());
        }
        let (pb, pi) = path[d - 1];
        let node = store.node(block);
        let (len, used, is_leaf) = (node.len(), node.used, node.is_leaf());
        let cap = Self::cap(store.node_size, is_leaf);
        if len == 0 {
            store.changes.shape_seq += 1;
            store.free_node(block)?;
            return self.remove_ptr(store, path, d - 1, pi);
        }
        if used >= cap / 4 {
            return Ok(());
        }
        let plen = store.node(pb).len();
        let (li, ri) = if pi > 0 {
            (pi - 1, pi)
        } else if pi + 1 < plen {
            (pi, pi + 1)
        } else {
            return Ok(());
        };
        let sib_i = if li == pi { ri } else { li };
        let sp = store.node(pb).ptrs()[sib_i];
        let level = store.node(block).level;
        let below = path_below(store, path, d - 1);
        let range = child_range(store.node(pb), sib_i, below);
        store.load(sp.block, sp.generation, self.owner, Some(level), range)?;
        if used + store.node(sp.block).used > cap / 4 * 3 {
            return Ok(());
        }
        store.changes.shape_seq += 1;
        let sb = store.cow(sp.block)?;
        store.node_mut(pb).ptrs_mut()[sib_i] = Ptr {
            block: sb,
            generation: gen,
        };
        let (lb, rb) = if li == pi { (block, sb) } else { (sb, block) };
        let right = match store.cache.remove(rb) {
            Some(r) => std::sync::Arc::unwrap_or_clone(r),
            None => panic!("merge source {rb} not cached"),
        };
        let r_used = right.used;
        {
            let left = store.node_mut(lb);
            left.keys.extend(right.keys);
            match (&mut left.body, right.body) {
                (super::node::Body::Leaf(l), super::node::Body::Leaf(r)) => l.append(&r),
                (super::node::Body::Internal(l), super::node::Body::Internal(r)) => l.extend(r),
                _ => unreachable!("merging nodes of different kinds"),
            }
            left.used += r_used;
            left.assert_invariants(cap);
        }
        // Both halves were COWed in this transaction, so the emptied block is reusable at once.
        store.free_dirty_block(rb)?;
        if is_leaf {
            Counters::inc(&store.counters.leaf_merges);
        } else {
            Counters::inc(&store.counters.internal_merges);
        }
        self.remove_ptr(store, path, d - 1, ri)
    }

    /// Removes pointer `i` from path[d]'s node and rebalances upward.
    fn remove_ptr(&mut self, store: &mut Store, path: &Path, d: usize, i: usize) -> Result<()> {
        store.changes.shape_seq += 1;
        let b = path[d].0;
        let n = store.node_mut(b);
        n.keys.remove(i);
        n.ptrs_mut().remove(i);
        n.used -= KEY_PTR_SIZE;
        let first = n.keys.first().copied();
        if let (0, Some(k)) = (i, first) {
            self.fixup_low_keys(store, path, d, k);
        }
        if store.node(b).is_empty() {
            if d > 0 {
                // An internal node that had one child (its neighbours were too full to merge
                // with) lost it: drop the node from its parent in turn.
                store.free_node(b)?;
                let (_, pi) = path[d - 1];
                return self.remove_ptr(store, path, d - 1, pi);
            }
            // The root's last child went away: the tree is empty again.
            store.free_node(b)?;
            let leaf = Node::new_leaf(self.owner, store.generation);
            let lb = store.alloc_node(leaf)?;
            self.root = Ptr {
                block: lb,
                generation: store.generation,
            };
            self.level = 0;
            return Ok(());
        }
        self.rebalance(store, path, d)
    }

    /// Calls `f(key, value)` for every item with `from <= key < to`, in key order, until it
    /// returns false.
    pub fn scan(
        &self,
        store: &mut Store,
        from: Key,
        to: Key,
        mut f: impl FnMut(&Key, &[u8]) -> Result<bool>,
    ) -> Result<()> {
        // (internal node, its generation, level and key range, child taken). A node is loaded
        // again when the walk comes back to it: the cache may have evicted it meanwhile (a
        // small cache, or a large walk).
        let mut stack: Vec<(u64, u64, u8, KeyRange, usize)> =
            Vec::with_capacity(self.level as usize + 1);
        let (mut block, mut gen, mut level) = (self.root.block, self.root.generation, self.level);
        let mut range = KeyRange::ANY;
        // Descend to the first leaf that may hold `from`.
        loop {
            store.load(block, gen, self.owner, Some(level), range)?;
            let n = store.node(block);
            if n.is_leaf() {
                break;
            }
            let i = n.child_index(&from);
            let p = n.ptrs()[i];
            stack.push((block, gen, level, range, i));
            range = child_range(n, i, range.below);
            block = p.block;
            gen = p.generation;
            level -= 1;
        }
        let mut start = store.node(block).keys.partition_point(|k| *k < from);
        loop {
            {
                let n = store.node(block);
                let vals = n.leaf_vals();
                for (k, v) in n.keys.iter().zip(vals.iter()).skip(start) {
                    if *k >= to {
                        return Ok(());
                    }
                    if !f(k, v)? {
                        return Ok(());
                    }
                }
            }
            // Next leaf: climb to the first ancestor with a next child, then down its left edge.
            loop {
                let Some((b, g, l, r, i)) = stack.pop() else {
                    return Ok(());
                };
                store.load(b, g, self.owner, Some(l), r)?;
                let n = store.node(b);
                if i + 1 < n.len() {
                    if n.keys[i + 1] >= to {
                        return Ok(());
                    }
                    let p = n.ptrs()[i + 1];
                    let mut range = child_range(n, i + 1, r.below);
                    stack.push((b, g, l, r, i + 1));
                    let (mut cb, mut cg, mut cl) = (p.block, p.generation, l - 1);
                    loop {
                        store.load(cb, cg, self.owner, Some(cl), range)?;
                        let c = store.node(cb);
                        if c.is_leaf() {
                            break;
                        }
                        let p0 = c.ptrs()[0];
                        stack.push((cb, cg, cl, range, 0));
                        range = child_range(c, 0, range.below);
                        cb = p0.block;
                        cg = p0.generation;
                        cl -= 1;
                    }
                    block = cb;
                    start = 0;
                    break;
                }
            }
        }
    }

    /// The last item with `floor <= key <= at`, if any.
    pub fn last_at_or_before(
        &self,
        store: &mut Store,
        floor: Key,
        at: Key,
    ) -> Result<Option<(Key, Vec<u8>)>> {
        // By the low-key invariant the leaf chosen for `at` starts at or before `at` unless it
        // is the leftmost leaf, so the answer, if any, is in this leaf.
        let leaf = self.find_leaf(store, &at)?;
        let n = store.node(leaf);
        let i = n.keys.partition_point(|k| *k <= at);
        if i == 0 {
            return Ok(None);
        }
        let k = n.keys[i - 1];
        Ok((k >= floor).then(|| (k, n.leaf_vals().get(i - 1).to_vec())))
    }

    /// The number of nodes in the tree. Reads only internal nodes: the leaves are counted
    /// from their parents' pointers.
    pub fn count_nodes(&self, store: &mut Store) -> Result<u64> {
        let mut count = 0;
        let mut stack = vec![(self.root, self.level, KeyRange::ANY)];
        while let Some((p, level, range)) = stack.pop() {
            count += 1;
            if level == 0 {
                continue;
            }
            store.load(p.block, p.generation, self.owner, Some(level), range)?;
            let n = store.node(p.block);
            if level == 1 {
                count += n.len() as u64;
            } else {
                let children = n.ptrs().iter().enumerate();
                let children: Vec<_> = children
                    .map(|(i, c)| (*c, level - 1, child_range(n, i, range.below)))
                    .collect();
                stack.extend(children);
            }
        }
        Ok(count)
    }

    /// Visits the leaves each of two trees has that the other has not (`on_leaf` is told
    /// which tree's: true for `self`'s), reading only the nodes that differ and the paths to
    /// them, and returns how many nodes it read. The trees may share nodes (a snapshot and
    /// its file system): a node both point to at the same level is the same subtree in both,
    /// so the walk goes down both trees a level at a time, with every node of that level not
    /// under one they share, and leaves out those both have. Each list holds every node of
    /// its tree at that level that is under no shared node, so a node both trees have either
    /// lies under one they share (and is never listed) or is met in both lists at its level,
    /// and left out there. A tree whose root is block 0 is empty (no node, no leaf).
    pub fn own_leaves(
        &self,
        other: &Tree,
        store: &mut Store,
        mut on_leaf: impl FnMut(bool, &Node) -> Result<()>,
    ) -> Result<u64> {
        let top = |t: &Tree| match t.root.block {
            0 => Vec::new(),
            _ => vec![(t.root, KeyRange::ANY)],
        };
        let mut sides = [
            (*self, top(self), self.level),
            (*other, top(other), other.level),
        ];
        let mut read = 0;
        loop {
            if sides[0].2 == sides[1].2 {
                let key = |p: &Ptr| (p.block, p.generation);
                let [a, b] = [0, 1].map(|i| {
                    sides[i]
                        .1
                        .iter()
                        .map(|(p, _)| key(p))
                        .collect::<HashSet<_>>()
                });
                sides[0].1.retain(|(p, _)| !b.contains(&key(p)));
                sides[1].1.retain(|(p, _)| !a.contains(&key(p)));
            }
            let top = sides[0].2.max(sides[1].2);
            for (i, (tree, frontier, level)) in sides.iter_mut().enumerate() {
                if *level != top {
                    continue;
                }
                let mut below = Vec::new();
                for (p, range) in std::mem::take(frontier) {
                    read += 1;
                    store.load(p.block, p.generation, tree.owner, Some(*level), range)?;
                    let Some(n) = store.cache.get_arc(p.block) else {
                        panic!("node {} not cached after load", p.block);
                    };
                    if n.is_leaf() {
                        on_leaf(i == 0, &n)?;
                        continue;
                    }
                    let children = n.ptrs().iter().enumerate();
                    below.extend(children.map(|(c, cp)| (*cp, child_range(&n, c, range.below))));
                }
                *frontier = below;
                *level = level.saturating_sub(1);
            }
            if top == 0 {
                return Ok(read);
            }
        }
    }

    /// Visits every node (pre-order) with its level, reading each once: fsck and dump.
    pub fn walk_nodes(
        &self,
        store: &mut Store,
        mut f: impl FnMut(&mut Store, u64, &Node) -> Result<()>,
    ) -> Result<()> {
        let mut stack = vec![(self.root, self.level, KeyRange::ANY)];
        while let Some((p, level, range)) = stack.pop() {
            store.load(p.block, p.generation, self.owner, Some(level), range)?;
            let n = store.node(p.block).clone();
            for (i, cp) in n.ptrs().iter().enumerate().rev() {
                stack.push((*cp, level - 1, child_range(&n, i, range.below)));
            }
            f(store, p.block, &n)?;
        }
        Ok(())
    }
}

/// Where internal node `n`, whose keys sort below `below`, places its child `i`.
fn child_range(n: &Node, i: usize, below: Option<Key>) -> KeyRange {
    KeyRange {
        first: n.keys.get(i).copied(),
        below: n.keys.get(i + 1).copied().or(below),
    }
}

/// What the keys of node path[d] sort below: the key right of it in the nearest ancestor
/// that has one (None: the node is rightmost in the tree).
fn path_below(store: &mut Store, path: &Path, d: usize) -> Option<Key> {
    path.get(..d)?
        .iter()
        .rev()
        .find_map(|&(b, i)| store.node(b).keys.get(i + 1).copied())
}

/// A resumable ordered cursor: returns items in batches and re-seeks by key, so it stays valid
/// across changes to the tree between batches.
pub struct Cursor {
    next: Option<Key>,
    end: Key,
}

impl Cursor {
    pub fn new(from: Key, to: Key) -> Cursor {
        Cursor {
            next: Some(from),
            end: to,
        }
    }

    /// Up to `max` items from where the cursor stands; empty when done.
    pub fn next_batch(
        &mut self,
        tree: &Tree,
        store: &mut Store,
        max: usize,
    ) -> Result<Vec<(Key, Vec<u8>)>> {
        let Some(from) = self.next else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        tree.scan(store, from, self.end, |k, v| {
            out.push((*k, v.to_vec()));
            Ok(out.len() < max)
        })?;
        self.next = match out.last() {
            Some((k, _)) if out.len() == max => k.successor(),
            _ => None,
        };
        Ok(out)
    }
}
