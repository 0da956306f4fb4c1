//! idxfs on-disk format, version 1: bytes only, no I/O.
//!
//! Glossary:
//! - *block*: the 4 KiB unit of space allocation; addresses on disk are block numbers.
//! - *node*: one B+tree node, `node_size` bytes (16 KiB by default), a whole number of blocks.
//! - *key*: (object id u64, item type u8, offset u64), ordered in that order, as in btrfs.
//! - *item*: a key and a variable-size value, stored in a leaf.
//! - *tree*: a copy-on-write B+tree; the superblock names the root of each.
//!
//! Every structure here is `#[repr(C)]` of little-endian, alignment-1 fields, so the compiler
//! proves there is no padding (`zerocopy::IntoBytes` refuses padded structs) and the `const`
//! asserts pin every size. Everything read from disk goes through a `check_*`/`decode_*`
//! function that returns [`Corrupt`] rather than trusting a field.
#![deny(clippy::indexing_slicing)]

pub mod corrupt;
pub mod hash;
pub mod items;
pub mod key;
pub mod log;
pub mod node;
pub mod roots;
pub mod superblock;
pub mod versions;

pub use corrupt::Corrupt;
pub use key::{ItemType, Key};

/// Size of an allocation block, in bytes. Fixed in format v1.
pub const BLOCK_SIZE: u64 = 4096;
/// Default B+tree node size, in bytes.
pub const DEFAULT_NODE_SIZE: u32 = 16384;
/// Smallest and largest node size mkfs accepts.
pub const MIN_NODE_SIZE: u32 = 4096;
pub const MAX_NODE_SIZE: u32 = 65536;
/// Superblock copies live at these block numbers; commit `g` writes copy `g % SUPER_COPIES`.
pub const SUPER_COPIES: u64 = 2;
/// Blocks 0..FIRST_USABLE_BLOCK are reserved for the superblock copies.
pub const FIRST_USABLE_BLOCK: u64 = SUPER_COPIES;

/// Tree ids (the `owner` of a node).
pub const TREE_FS: u64 = 1;
pub const TREE_SPACE: u64 = 2;
/// Reserved: an owner id for a log kept as a tree. The fsync log is a chain of blocks instead
/// (`log.rs`), so no node has this owner.
pub const TREE_LOG: u64 = 3;
/// The roots tree: snapshots (`Subvolume` items), the counts of nodes several trees share
/// (`NodeRefs`) and the data blocks held for snapshots (`HeldBlocks`). Incompat bit
/// `INCOMPAT_SUBVOLUMES`; a snapshot's fs tree is a tree of owner `TREE_FS` like the first.
pub const TREE_ROOTS: u64 = 4;
/// Snapshot ids start here (a `Subvolume` item's object id), as btrfs's subvolume ids.
pub const FIRST_SNAPSHOT_ID: u64 = 256;
/// The file system's own tree's id as a subvolume (btrfs's `BTRFS_FS_TREE_OBJECTID`): the
/// object id of its `Subvolume` item while a clone is the active tree, and what a superblock
/// `subvolume` of 0 stands for.
pub const FS_SUBVOL_ID: u64 = 5;

/// Inode number of the root directory (the same number FUSE uses for its root).
pub const ROOT_INO: u64 = 1;
/// First inode number handed out by mkfs after the root.
pub const FIRST_FREE_INO: u64 = 2;
/// Inode numbers must stay below this: the directory inode-order index packs
/// `child_ino << 16 | name_hash_low16` into one key offset.
pub const MAX_INO: u64 = (1 << 48) - 1;
/// Object id under which orphan items live: (ORPHAN_OBJECTID, Orphan, ino).
pub const ORPHAN_OBJECTID: u64 = u64::MAX - 4;
/// Object id under which shared-block items live: (SHARED_OBJECTID, SharedBlocks, block).
pub const SHARED_OBJECTID: u64 = u64::MAX - 5;
/// Object id of node-count items (roots tree): (NODE_REFS_OBJECTID, NodeRefs, block).
pub const NODE_REFS_OBJECTID: u64 = u64::MAX - 6;
/// Object id of held-block items (roots tree): (HELD_OBJECTID, HeldBlocks, first block).
pub const HELD_OBJECTID: u64 = u64::MAX - 7;

/// Longest file name, in bytes (as every Linux file system).
pub const NAME_MAX: usize = 255;
/// Longest symlink target, in bytes.
pub const SYMLINK_MAX: usize = 4095;
