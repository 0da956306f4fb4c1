//! The copy-on-write B+tree: in-memory nodes, the node cache, the store that owns device,
//! cache and allocator, what the running transaction changed (`changes`), the node slots
//! taken ahead of need (`pools`), the counts of nodes that trees share (`refs`), and the
//! tree operations.
pub mod cache;
pub mod changes;
pub mod leaf_vals;
pub mod node;
pub mod pools;
pub mod refs;
pub mod store;
pub mod tree;

pub use node::{Node, Ptr};
pub use store::Store;
pub use tree::{Change, Cursor, LeafHint, Tree};
#[cfg(test)]
mod share_tests;
#[cfg(test)]
mod tests;
