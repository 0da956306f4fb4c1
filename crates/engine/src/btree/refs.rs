//! Nodes that more than one parent points at, and how many: what lets trees share nodes
//! (a snapshot), with Rodeh's lazy reference counts as btrfs keeps them.
//!
//! A snapshot makes a second tree whose root is the first tree's root ([`super::Tree::share`]):
//! one count goes up, nothing is copied. The trees part node by node as either one changes:
//! - **Copy of a shared node** (`Store::cow`): a node counted more than once is copied for
//!   the tree that changes it and is not freed; its count drops by one, and every node it
//!   points at gains one, since the copy points at them too. A leaf's copy goes on the list
//!   of copied leaves instead, when the caller asks: what its items name (data blocks) is
//!   the caller's to count ([`NodeRefs::take_copied_leaves`]).
//! - **A node counted once** is the one tree's own, copied and freed as if nothing were
//!   shared, even when it once was: its other parents have let go of it.
//! - **Dropping a tree** ([`super::Tree::drop_some`]): from the root down, a node counted
//!   more than once loses one and is not entered; a node counted once is entered, its
//!   children dropped, then it is freed.
//!
//! Only counts above one are kept: a node no entry names has one parent, so trees that never
//! shared anything keep an empty map, and `Store::cow` then looks nothing up.
//!
//! The shortcut: every node counted more than once is at least as old as the snapshot that
//! shared it or one of its ancestors, so a node written after the last share (`newest`) is
//! its tree's own and needs no look-up. A node of the running transaction is changed in
//! place only when it is its tree's own; that needs a look-up only in a transaction that
//! shared something.
//!
//! The counts live in memory while the image is open, loaded from the roots tree's
//! `NodeRefs` items at open; each commit writes the ones that changed (`changed`) back
//! (`fs::snapshot`).
use super::node::Node;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

#[derive(Default)]
pub struct NodeRefs {
    /// Node block -> parents pointing at it, for counts of 2 and more.
    counts: HashMap<u64, u32>,
    /// The generation of the last share; 0: nothing was ever shared.
    newest: u64,
    /// Shared leaves copied for one of their trees since the caller last took them, kept
    /// only when `track_copied` (a caller that counts what leaves name per leaf; the engine
    /// holds data blocks by generation instead, `fs::snapshot`).
    copied_leaves: Vec<Arc<Node>>,
    pub track_copied: bool,
    /// Blocks whose count changed since the last commit wrote them back.
    changed: BTreeSet<u64>,
}

impl NodeRefs {
    /// How many parents point at the node at `block` (1 when no entry names it).
    pub fn count(&self, block: u64) -> u32 {
        self.counts.get(&block).copied().unwrap_or(1)
    }

    /// Whether a node written in `generation` may have more than one parent: false for
    /// every node written after the last share.
    #[inline]
    pub fn may_share(&self, generation: u64) -> bool {
        generation <= self.newest && !self.counts.is_empty()
    }

    /// Whether the node at `block`, written in `generation`, has more than one parent.
    #[inline]
    pub fn is_shared(&self, block: u64, generation: u64) -> bool {
        self.may_share(generation) && self.counts.contains_key(&block)
    }

    /// One more parent points at `block`: a child of a shared node that was copied.
    pub fn add(&mut self, block: u64) {
        *self.counts.entry(block).or_insert(1) += 1;
        self.changed.insert(block);
    }

    /// A count read from the image (open): not a change.
    pub fn load(&mut self, block: u64, count: u32, newest: u64) {
        debug_assert!(count >= 2);
        self.counts.insert(block, count);
        self.newest = self.newest.max(newest);
    }

    /// A count found anew (a repair, which rebuilds the roots tree): the next commit
    /// writes it.
    pub fn restore(&mut self, block: u64, count: u32, newest: u64) {
        debug_assert!(count >= 2);
        self.counts.insert(block, count);
        self.changed.insert(block);
        self.newest = self.newest.max(newest);
    }

    /// The generation of the last share; a node written after it is its tree's own.
    pub fn note_newest(&mut self, generation: u64) {
        self.newest = self.newest.max(generation);
    }

    /// The blocks whose count changed since the last call, ascending: what a commit writes.
    pub fn take_changed(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.changed).into_iter().collect()
    }

    /// A tree shares the root at `block` in the running transaction `generation`.
    pub fn share_root(&mut self, block: u64, generation: u64) {
        self.add(block);
        self.newest = self.newest.max(generation);
    }

    /// One parent let go of `block`, which had more than one; returns how many are left.
    pub fn drop_one(&mut self, block: u64) -> u32 {
        let Some(c) = self.counts.get_mut(&block) else {
            panic!("node {block} let go of as shared, but it has one parent");
        };
        debug_assert!(*c >= 2, "node {block} counted {c} in the map");
        *c -= 1;
        let left = *c;
        self.changed.insert(block);
        if left == 1 {
            self.counts.remove(&block);
        }
        left
    }

    /// Notes a shared leaf that was copied for one of its trees: both now name its items.
    pub fn copied_leaf(&mut self, leaf: Arc<Node>) {
        debug_assert!(leaf.is_leaf());
        if self.track_copied {
            self.copied_leaves.push(leaf);
        }
    }

    /// The shared leaves copied since the last call: the caller adds one reference to what
    /// their items name, before anything that item names can be freed.
    pub fn take_copied_leaves(&mut self) -> Vec<Arc<Node>> {
        std::mem::take(&mut self.copied_leaves)
    }

    /// Every count above one, by block: what fsck checks against the parents it finds.
    pub fn shared(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.counts.iter().map(|(b, c)| (*b, *c))
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Blocks whose count changed since the last commit wrote them back.
    pub fn changed_len(&self) -> usize {
        self.changed.len()
    }

    /// What disagrees between these counts and `found`, the parents a walk of every tree
    /// found (`Tree::count_parents`): one line per node, in block order.
    pub fn check(&self, found: &HashMap<u64, u32>) -> Vec<String> {
        let mut bad: Vec<(u64, String)> = Vec::new();
        for (&b, &n) in found {
            let kept = self.count(b);
            if kept != n {
                bad.push((
                    b,
                    format!("node {b}: {n} parents point at it, counted {kept}"),
                ));
            }
        }
        for (&b, &kept) in &self.counts {
            if !found.contains_key(&b) {
                bad.push((b, format!("node {b}: counted {kept}, no tree points at it")));
            }
        }
        bad.sort();
        bad.into_iter().map(|(_, s)| s).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_above_one_only() {
        let mut r = NodeRefs::default();
        assert_eq!(r.count(7), 1);
        assert!(!r.may_share(1));
        r.share_root(7, 5);
        assert_eq!(r.count(7), 2);
        assert!(r.is_shared(7, 5));
        assert!(
            !r.is_shared(7, 6),
            "written after the last share: its tree's own"
        );
        r.add(7);
        assert_eq!(r.drop_one(7), 2);
        assert_eq!(r.drop_one(7), 1);
        assert!(r.is_empty());
        assert_eq!(r.count(7), 1);
    }

    #[test]
    #[should_panic(expected = "has one parent")]
    fn letting_go_of_a_node_with_one_parent_is_a_bug() {
        NodeRefs::default().drop_one(3);
    }
}
