//! Name hashing for the directory name index and xattr keys. Part of the format: changing it
//! changes where every entry lives, so it is pinned to xxh3-64 with seed 0 and tested against
//! fixed values.
use xxhash_rust::xxh3::xxh3_64;

/// Hash of a directory-entry or xattr name. Never 0 or u64::MAX, so those stay free as range
/// sentinels.
pub fn name_hash(name: &[u8]) -> u64 {
    xxh3_64(name).clamp(1, u64::MAX - 1)
}

/// Key offset of an extended back reference: the hash of the parent's number (8 bytes,
/// little-endian) followed by the name, clamped like [`name_hash`].
pub fn ext_ref_hash(parent: u64, name: &[u8]) -> u64 {
    let mut b = Vec::with_capacity(8 + name.len());
    b.extend_from_slice(&parent.to_le_bytes());
    b.extend_from_slice(name);
    name_hash(&b)
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    reason = "tests index fixed, known-good buffers"
)]
mod tests {
    use super::*;
    #[test]
    fn pinned_values() {
        // If these change, every existing image's directory index is wrong.
        assert_eq!(name_hash(b""), 0x2d06800538d394c2);
        assert_eq!(name_hash(b"file_1"), name_hash(b"file_1"));
        assert_ne!(name_hash(b"file_1"), name_hash(b"file_2"));
    }
}
