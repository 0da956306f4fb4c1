//! In-memory indexes for idxfs (seeds 000, 001, 004). No dependency on the engine.
//!
//! - [`xarray::XArray`]: open inodes and cached nodes keyed by number, in a 64-way radix tree
//!   with lock-free lookups (seed 000).
//! - [`boxed::BoxedMap`]: values larger than a word published through an XArray, replaced
//!   whole and freed after every reader unpinned (the engine's lock-free inode attributes).
//! - [`first_map::FirstMap`]: an ordered map whose first entry is O(1) and whose teardown frees
//!   everything without rebalancing (seed 001).
//! - [`seqcount::SeqCount`]: a group of stores made one step for lock-free readers (the
//!   engine publishes each operation's inode and name changes through it).
//! - [`bgtable::BlockGroupTable`]: block groups found by byte offset from an immutable snapshot
//!   that writers replace, so readers never contend (seed 004).
pub mod bgtable;
pub mod boxed;
pub mod first_map;
pub mod seqcount;
mod sync;
pub mod xarray;

pub use boxed::BoxedMap;
pub use seqcount::SeqCount;
pub use xarray::{AllocError, XArray};
