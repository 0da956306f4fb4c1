//! What the running transaction has changed in the trees, as the rest of the engine watches
//! it: counters that tell a cursor, a leaf hint or an operation whether anything moved since
//! it last looked, the count of dirty nodes that bounds a transaction, and the keys the next
//! fsync batch must log. The store carries them because every tree change has the store in
//! hand and nothing else; none of them is the store's own state (device, cache, space).
use crate::log::ChangedKeys;

#[derive(Default)]
pub struct Changes {
    /// Bumped on every tree change (and inode change): cursors re-seek when it moved, and an
    /// operation that moved it since its last checkpoint is half-applied if it fails
    /// (`crate::fs`).
    pub mod_seq: u64,
    /// Bumped whenever a node's key range can change (splits, merges, low-key fixups, root
    /// changes): a [`super::tree::LeafHint`] is trusted only while it stands still.
    pub shape_seq: u64,
    /// Nodes changed in the running transaction (exact: kept by alloc_node, cow and frees).
    pub dirty_nodes: usize,
    /// The fs-tree keys changed since the last fsync batch or commit: what the next batch
    /// logs (`crate::log`).
    pub log: ChangedKeys,
}
