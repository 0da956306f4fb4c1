//! idxfs engine: copy-on-write B+trees, transactions, space allocation, caches and the POSIX
//! file-system operations, over a `BlockDevice`. No FUSE, no async runtime.
//!
//! Reading order: `btree` (node, store, tree) -> `space` -> `txn` (commit) -> `fs` (operations)
//! -> `log` (fsync) -> `fsck` and `dump`.
pub mod btree;
pub mod caller;
pub mod clock;
pub mod counters;
pub mod dir_parents;
pub mod dump;
pub mod error;
pub mod fs;
pub mod fsck;
pub mod inode_cache;
pub mod log;
pub mod log_io;
pub mod repair;
pub mod space;
pub mod testutil;
pub mod txn;

pub use error::{Error, Result};
pub use fs::{Fs, MkfsOptions, OpenOptions, SnapshotInfo};
