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
pub const INCOMPAT_SUPPORTED: u64 = INCOMPAT_LOG;
/// (2026-11-21) The superblock's `log_root` names an fsync log chain (seed 003, `log.rs`): a
/// reader that does not replay it would miss what was fsynced after the commit. Set by every
/// commit that names a log.
pub const INCOMPAT_LOG: u64 = 1;
/// Read-only-compatible features: unknown bits allow a read-only open.
pub const COMPAT_RO_SUPPORTED: u64 = 0;
