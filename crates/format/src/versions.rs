//! The format version and feature table. It only grows; each entry says what it means and when
//! it was added (after bcachefs `BCH_METADATA_VERSIONS`).

pub const MAGIC: [u8; 8] = *b"IDXFS\x00\x01\x00";

pub struct Version {
    pub number: u32,
    pub date: &'static str,
    pub description: &'static str,
}

pub const VERSIONS: &[Version] = &[Version {
    number: 1,
    date: "2026-11-21",
    description: "copy-on-write B+trees (fs, space); superblock pair; dual directory index \
                  (name hash + inode order); bitmap free space per block group",
}];

pub const CURRENT_VERSION: u32 = 1;

/// Incompatible features: an image with a bit set that this code does not know must not be
/// opened at all.
pub const INCOMPAT_SUPPORTED: u64 = INCOMPAT_LOG
    | INCOMPAT_EXT_REF
    | INCOMPAT_XATTR_CHUNKS
    | INCOMPAT_ORPHAN_TRIM
    | INCOMPAT_SHARED_BLOCKS
    | INCOMPAT_SUBVOLUMES
    | INCOMPAT_CLONES
    | INCOMPAT_HIDDEN_ORIGINS
    | INCOMPAT_LOG_TREES;
/// (2026-11-21) The superblock's `log_root` names an fsync log chain (seed 003, `log.rs`): a
/// reader that does not replay it would miss what was fsynced after the commit. Set by every
/// commit that names a log.
pub const INCOMPAT_LOG: u64 = 1;
/// (2026-11-24) `InodeExtRef` items: back references that did not fit their InodeRef item
/// (more than about 16 long names of one inode in one directory). A reader without them would
/// miss names and call the link counts wrong. Set by the commit before the first such item.
pub const INCOMPAT_EXT_REF: u64 = 2;
/// (2026-11-24) Long xattr values (over a quarter of a leaf, up to 65,536 bytes) in
/// `XattrChunk` items, named by a long-form record in the Xattr item (first byte 0). Set by
/// the commit before the first such record.
pub const INCOMPAT_XATTR_CHUNKS: u64 = 4;
/// (2026-11-24) Orphan items whose value is `ORPHAN_TRIM`: a linked inode whose extents past
/// its size are still being freed (a truncate of many extents, done in bounded batches). A
/// reader that took every orphan item for an unlinked inode would delete a live file. Set by
/// the commit before the first such item.
pub const INCOMPAT_ORPHAN_TRIM: u64 = 8;
/// (2026-11-25) `SharedBlocks` items: data blocks that several file extents name (a copy that
/// shares its source's blocks). A reader that does not know them would free a shared block
/// when one of its files lets go of it, while the others still read it. Set by the commit
/// before the first such item.
pub const INCOMPAT_SHARED_BLOCKS: u64 = 16;
/// (2026-11-27) The superblock's `roots_root` names a roots tree: snapshots, whose fs trees
/// share nodes with the first one (`NodeRefs` items count the parents of a shared node), and
/// data blocks held for them (`HeldBlocks`). A reader that does not know them would free a
/// shared node or a held block while a snapshot still uses it. Set by the commit that makes
/// the first snapshot.
pub const INCOMPAT_SUBVOLUMES: u64 = 32;
/// (2026-11-27) Writable subvolumes made from snapshots (clones): `Subvolume` items flagged
/// `SUBVOL_WRITABLE` and their `SubvolumeOrigin` items, and the superblock's `subvolume`
/// naming which writable tree `fs_root` is. Several writable trees name the same data
/// blocks, and a clone lets go only of blocks younger than its origin: a reader that does
/// not know this would free blocks another tree still names. Set by the commit that makes
/// the first clone.
pub const INCOMPAT_CLONES: u64 = 64;
/// (2026-11-27) Snapshots flagged `SUBVOL_HIDDEN`: made only as a writable snapshot's
/// origin, and deleted by the drop that ends their last use. A reader that does not know
/// them would list them, and nothing would delete them once their clone is gone, so their
/// blocks would never come back. Set by the commit that makes the first one, cleared by the
/// commit after the last is gone.
pub const INCOMPAT_HIDDEN_ORIGINS: u64 = 128;
/// (2026-11-28) The fsync log names the tree of its records (`log::LOG_TREE`): an fsync in a
/// subvolume opened beside the active tree appends its items to the log, to be replayed into
/// that subvolume's tree. A reader that does not know the record would refuse the log, or
/// replay another tree's items into the active one. Set by every commit made while a
/// subvolume is open beside the active tree (only a chain those commits name may carry the
/// record), cleared by the others.
pub const INCOMPAT_LOG_TREES: u64 = 256;
/// Read-only-compatible features: unknown bits allow a read-only open.
pub const COMPAT_RO_SUPPORTED: u64 = COMPAT_RO_DATA_SUMS;
/// (2026-11-24) `DataSum` items: crc32c of file blocks written copy-on-write. A reader that
/// does not know them reads every byte correctly, but a writer that does not would leave
/// sums that no longer match its data: such code may open the image read-only only. Set by
/// the commit before the first such item.
pub const COMPAT_RO_DATA_SUMS: u64 = 1;
