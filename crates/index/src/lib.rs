//! In-memory indexes for idxfs (seeds 000, 001, 004). No dependency on the engine.
//!
//! - [`xarray::XArray`]: open inodes and cached nodes keyed by number, in a 64-way radix tree
//!   with lock-free lookups (seed 000).
//! - [`first_map::FirstMap`]: an ordered map whose first entry is O(1) and whose teardown frees
//!   everything without rebalancing (seed 001).
//! - [`bgtable::BlockGroupTable`]: block groups found by byte offset from an immutable snapshot
//!   that writers replace, so readers never contend (seed 004).
pub mod bgtable;
pub mod first_map;
pub mod xarray;

pub use xarray::{AllocError, XArray};
