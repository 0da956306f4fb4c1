//! Keys and item types. Keys order by (object id, item type, offset), as in btrfs, so all items
//! of one inode sit together and inode items sort by inode number.
use crate::Corrupt;
use std::fmt;

/// Item types, in key order. The numbers are on disk; never renumber, only add.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum ItemType {
    /// (ino, Inode, 0) -> [`crate::items::InodeItem`]
    Inode = 1,
    /// (child ino, InodeRef, parent ino) -> list of names: back references for hard links/fsck.
    InodeRef = 12,
    /// (child ino, InodeExtRef, hash of (parent, name)) -> list of (parent, name): the back
    /// references that no longer fit the child's InodeRef item for that parent (many hard links
    /// of one inode in one directory), as btrfs's extended refs. Incompat bit `INCOMPAT_EXT_REF`.
    InodeExtRef = 13,
    /// (dir ino, DirHash, name hash) -> list of [`crate::items::DirEntry`] (hash collisions share).
    DirHash = 84,
    /// (dir ino, DirIno, child ino << 16 | hash & 0xffff) -> list of DirEntry: the readdir order
    /// of seed 002, so whole-directory passes walk inodes in on-disk order.
    DirIno = 96,
    /// (ino, Xattr, name hash) -> list of xattr entries.
    Xattr = 24,
    /// (ino, XattrChunk, chunk base + i) -> piece i of a long xattr value, which its entry in
    /// the Xattr item names by the base. Incompat bit `INCOMPAT_XATTR_CHUNKS`.
    XattrChunk = 25,
    /// (ino, Extent, file byte offset) -> [`crate::items::ExtentItem`] (inline data for small files).
    Extent = 108,
    /// (ino, DataSum, file block / SUM_GROUP_BLOCKS) -> [`crate::items::BlockSums`]: crc32c of
    /// the group's blocks that were written copy-on-write. Read-only-compat bit
    /// `COMPAT_RO_DATA_SUMS`.
    DataSum = 120,
    /// (ORPHAN_OBJECTID, Orphan, ino): an inode unlinked while open, reclaimed at next mount.
    Orphan = 48,
    /// (first block, BlockGroup, length in blocks) -> [`crate::items::BlockGroupItem`] (space tree).
    BlockGroup = 192,
    /// (first block, FreeSpaceBitmap, length in blocks) -> one bit per block, 1 = in use.
    FreeSpaceBitmap = 200,
    /// Reserved for the fsync log tree (seed 003); no v1 image contains it.
    LogEntry = 144,
    /// (SHARED_OBJECTID, SharedBlocks, first device block) -> [`crate::items::SharedItem`]:
    /// data blocks that more than one file extent names (copies that share, `copy_file_range`),
    /// with how many. A data block no such item covers is named by exactly one extent. Incompat
    /// bit `INCOMPAT_SHARED_BLOCKS`.
    SharedBlocks = 176,
    /// (snapshot id, Subvolume, 0) -> [`crate::items::SubvolumeItem`], then the name (roots
    /// tree). Incompat bit `INCOMPAT_SUBVOLUMES`.
    Subvolume = 132,
    /// (subvolume id, SubvolumeOrigin, 0) -> [`crate::roots::OriginItem`]: the read-only
    /// snapshot a writable subvolume was made from (roots tree). Incompat bit
    /// `INCOMPAT_CLONES`.
    SubvolumeOrigin = 134,
    /// (NODE_REFS_OBJECTID, NodeRefs, node block) -> [`crate::items::NodeRefsItem`]: a node
    /// that more than one parent points at (trees sharing it), with how many (roots tree).
    NodeRefs = 180,
    /// (HELD_OBJECTID, HeldBlocks, first block) -> [`crate::items::HeldItem`]: data blocks
    /// the first fs tree let go of while a snapshot may still name them (roots tree).
    HeldBlocks = 184,
}

impl ItemType {
    pub const ALL: [ItemType; 18] = [
        ItemType::Inode,
        ItemType::InodeRef,
        ItemType::InodeExtRef,
        ItemType::Xattr,
        ItemType::XattrChunk,
        ItemType::Orphan,
        ItemType::DirHash,
        ItemType::DirIno,
        ItemType::Extent,
        ItemType::DataSum,
        ItemType::LogEntry,
        ItemType::SharedBlocks,
        ItemType::Subvolume,
        ItemType::SubvolumeOrigin,
        ItemType::NodeRefs,
        ItemType::HeldBlocks,
        ItemType::BlockGroup,
        ItemType::FreeSpaceBitmap,
    ];

    pub fn from_u8(v: u8) -> Option<ItemType> {
        ItemType::ALL.iter().copied().find(|t| *t as u8 == v)
    }

    pub fn name(self) -> &'static str {
        match self {
            ItemType::Inode => "INODE",
            ItemType::InodeRef => "INODE_REF",
            ItemType::InodeExtRef => "INODE_EXT_REF",
            ItemType::XattrChunk => "XATTR_CHUNK",
            ItemType::DirHash => "DIR_HASH",
            ItemType::DirIno => "DIR_INO",
            ItemType::Xattr => "XATTR",
            ItemType::Extent => "EXTENT",
            ItemType::DataSum => "DATA_SUM",
            ItemType::Orphan => "ORPHAN",
            ItemType::BlockGroup => "BLOCK_GROUP",
            ItemType::FreeSpaceBitmap => "FREE_SPACE_BITMAP",
            ItemType::LogEntry => "LOG_ENTRY",
            ItemType::SharedBlocks => "SHARED_BLOCKS",
            ItemType::Subvolume => "SUBVOLUME",
            ItemType::SubvolumeOrigin => "SUBVOLUME_ORIGIN",
            ItemType::NodeRefs => "NODE_REFS",
            ItemType::HeldBlocks => "HELD_BLOCKS",
        }
    }
}

/// Encoded key size: objectid (8) + type (1) + offset (8), little-endian, unaligned.
pub const KEY_SIZE: usize = 17;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Key {
    pub objectid: u64,
    pub ty: u8,
    pub offset: u64,
}

impl Key {
    pub const MIN: Key = Key {
        objectid: 0,
        ty: 0,
        offset: 0,
    };
    pub const MAX: Key = Key {
        objectid: u64::MAX,
        ty: u8::MAX,
        offset: u64::MAX,
    };

    pub const fn new(objectid: u64, ty: ItemType, offset: u64) -> Key {
        Key {
            objectid,
            ty: ty as u8,
            offset,
        }
    }

    pub fn item_type(&self) -> Option<ItemType> {
        ItemType::from_u8(self.ty)
    }

    pub fn encode(&self) -> [u8; KEY_SIZE] {
        let mut b = [0u8; KEY_SIZE];
        b[..8].copy_from_slice(&self.objectid.to_le_bytes());
        b[8] = self.ty;
        b[9..].copy_from_slice(&self.offset.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; KEY_SIZE]) -> Key {
        let (o, rest) = b.split_at(8);
        let (t, off) = rest.split_at(1);
        Key {
            objectid: u64::from_le_bytes(o.try_into().unwrap_or([0; 8])),
            ty: t.first().copied().unwrap_or(0),
            offset: u64::from_le_bytes(off.try_into().unwrap_or([0; 8])),
        }
    }

    /// The smallest key greater than this one, or None at [`Key::MAX`].
    pub fn successor(&self) -> Option<Key> {
        if let Some(o) = self.offset.checked_add(1) {
            return Some(Key { offset: o, ..*self });
        }
        if let Some(t) = self.ty.checked_add(1) {
            return Some(Key {
                objectid: self.objectid,
                ty: t,
                offset: 0,
            });
        }
        self.objectid.checked_add(1).map(|o| Key {
            objectid: o,
            ty: 0,
            offset: 0,
        })
    }

    /// The largest key smaller than this one, or None at [`Key::MIN`].
    pub fn predecessor(&self) -> Option<Key> {
        if let Some(o) = self.offset.checked_sub(1) {
            return Some(Key { offset: o, ..*self });
        }
        if let Some(t) = self.ty.checked_sub(1) {
            return Some(Key {
                objectid: self.objectid,
                ty: t,
                offset: u64::MAX,
            });
        }
        self.objectid.checked_sub(1).map(|o| Key {
            objectid: o,
            ty: u8::MAX,
            offset: u64::MAX,
        })
    }

    /// Checks that the item type is one format v1 knows.
    pub fn check_type(&self, what: &str) -> Result<ItemType, Corrupt> {
        self.item_type()
            .ok_or_else(|| Corrupt::new(format!("{what} item type"), self.ty, "a known item type"))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.item_type() {
            Some(t) => write!(f, "({} {} {})", self.objectid, t.name(), self.offset),
            None => write!(f, "({} type{} {})", self.objectid, self.ty, self.offset),
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    reason = "tests index fixed, known-good buffers"
)]
mod tests {
    use super::*;
    #[test]
    fn order_and_roundtrip() {
        let a = Key::new(5, ItemType::Inode, 0);
        let b = Key::new(5, ItemType::DirHash, 1);
        let c = Key::new(6, ItemType::Inode, 0);
        assert!(a < b && b < c);
        assert_eq!(Key::decode(&b.encode()), b);
        assert_eq!(Key::MAX.successor(), None);
        assert_eq!(a.successor(), Some(Key::new(5, ItemType::Inode, 1)));
        assert_eq!(Key::MIN.predecessor(), None);
        for k in [a, b, c, Key::new(7, ItemType::Inode, u64::MAX), Key::MAX] {
            let p = k.predecessor().expect("not MIN");
            assert!(p < k && p.successor() == Some(k), "{p} then {k}");
        }
    }
}
