//! B+tree node layout.
//!
//! ```text
//! leaf:     [NodeHeader][ItemHeader 0][ItemHeader 1]...  free  ...[data 1][data 0]
//! internal: [NodeHeader][KeyPtr 0][KeyPtr 1]...                              free
//! ```
//! Leaf item data is packed from the end of the node backwards (as btrfs does): item 0's data ends
//! at the node end and item i's data ends where item i-1's begins. That rule makes overlap
//! impossible to express, so the checker only has to verify it.
use crate::key::{Key, KEY_SIZE};
use crate::{ensure, Corrupt, BLOCK_SIZE};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

pub const NODE_MAGIC: [u8; 4] = *b"IXND";
/// Deepest tree a v1 node may belong to (level 0 = leaf). With 16 KiB nodes, 8 levels address
/// far more items than any device holds; the bound stops a corrupt image from recursing forever.
pub const MAX_LEVEL: u8 = 8;

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct NodeHeader {
    /// crc32c of the node bytes after this field.
    pub csum: U32,
    pub magic: [u8; 4],
    /// The file system's uuid: a node left over from an earlier mkfs of the same device fails this.
    pub fsid: [u8; 16],
    /// Block number this node was written to: catches misdirected writes and reads.
    pub block: U64,
    /// Commit generation that wrote the node; must match the parent's pointer.
    pub generation: U64,
    /// Tree id (`TREE_FS`, `TREE_SPACE`, ...).
    pub owner: U64,
    pub level: u8,
    pub reserved0: u8,
    pub nritems: U16,
    pub reserved: [u8; 12],
}
pub const NODE_HEADER_SIZE: usize = 64;
const _: () = assert!(size_of::<NodeHeader>() == NODE_HEADER_SIZE);

/// Leaf item header: key, and where its data lies within the node.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ItemHeader {
    pub key: [u8; KEY_SIZE],
    pub offset: U32,
    pub size: U32,
}
pub const ITEM_HEADER_SIZE: usize = 25;
const _: () = assert!(size_of::<ItemHeader>() == ITEM_HEADER_SIZE);

/// Internal node entry: the smallest key of the child's subtree, its block, its generation.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct KeyPtr {
    pub key: [u8; KEY_SIZE],
    pub block: U64,
    pub generation: U64,
}
pub const KEY_PTR_SIZE: usize = 33;
const _: () = assert!(size_of::<KeyPtr>() == KEY_PTR_SIZE);

/// Bytes of a leaf available to items (headers + data).
pub const fn leaf_capacity(node_size: u32) -> usize {
    node_size as usize - NODE_HEADER_SIZE
}
/// Pointers an internal node holds.
pub const fn internal_capacity(node_size: u32) -> usize {
    (node_size as usize - NODE_HEADER_SIZE) / KEY_PTR_SIZE
}
/// Largest single item value: a quarter of a leaf, so any leaf split can place any item.
pub const fn max_item_size(node_size: u32) -> usize {
    leaf_capacity(node_size) / 4 - ITEM_HEADER_SIZE
}

/// What the reader expects of a node, from the pointer that led to it.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    pub block: u64,
    pub generation: u64,
    pub owner: u64,
    /// None when the level is not known (fsck scanning, dump).
    pub level: Option<u8>,
    pub fsid: [u8; 16],
    pub total_blocks: u64,
    /// Where the parent places the node in its tree's key order (btrfs checks the same on
    /// every read: `btrfs_verify_level_key`). A node whose keys lie outside it is corrupt even
    /// with a good checksum, and merging it with a sibling would put keys out of order.
    pub range: KeyRange,
}

/// The keys a node may hold, as the pointers above it say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyRange {
    /// The parent's key for the node, which the node's first key equals (the low-key
    /// invariant); None for a root, or when not known (fsck, dump).
    pub first: Option<Key>,
    /// Every key of the node sorts below this: the next key right of it in the nearest
    /// ancestor that has one (None: the node is rightmost, or the bound is not known).
    pub below: Option<Key>,
}

impl KeyRange {
    /// No bound: a root, or a node read without knowing its parent.
    pub const ANY: KeyRange = KeyRange {
        first: None,
        below: None,
    };
}

/// A node whose bytes passed [`check`]; item accessors cannot fail after that.
#[derive(Debug)]
pub struct Checked<'a> {
    pub header: NodeHeader,
    bytes: &'a [u8],
}

/// Validates everything about a node: checksum, identity, item bounds, key order, pointers.
pub fn check<'a>(bytes: &'a [u8], exp: &Expect) -> Result<Checked<'a>, Corrupt> {
    let b = exp.block;
    let what = |f: &str| format!("node {b} {f}");
    let (h, _) = NodeHeader::read_from_prefix(bytes)
        .map_err(|_| Corrupt::new(what("length"), bytes.len(), NODE_HEADER_SIZE))?;
    ensure!(
        h.magic == NODE_MAGIC,
        what("magic"),
        format!("{:02x?}", h.magic),
        format!("{NODE_MAGIC:02x?}")
    );
    let csum = crc32c::crc32c(bytes.get(4..).unwrap_or(&[]));
    ensure!(
        h.csum.get() == csum,
        what("checksum"),
        format!("{:#010x}", h.csum.get()),
        format!("{csum:#010x}")
    );
    ensure!(
        h.fsid == exp.fsid,
        what("fsid"),
        hex(&h.fsid),
        hex(&exp.fsid)
    );
    ensure!(h.block.get() == b, what("block number"), h.block.get(), b);
    ensure!(
        h.generation.get() == exp.generation,
        what("generation"),
        h.generation.get(),
        exp.generation
    );
    ensure!(
        h.owner.get() == exp.owner,
        what("owner tree"),
        h.owner.get(),
        exp.owner
    );
    ensure!(
        h.level < MAX_LEVEL,
        what("level"),
        h.level,
        format!("< {MAX_LEVEL}")
    );
    if let Some(l) = exp.level {
        ensure!(h.level == l, what("level"), h.level, l);
    }
    let n = h.nritems.get() as usize;
    let size = bytes.len();
    let c = Checked { header: h, bytes };
    // The first and (after the loop) last key, for the range check at the end.
    let mut first: Option<Key> = None;
    let mut prev: Option<Key> = None;
    if h.level == 0 {
        ensure!(
            NODE_HEADER_SIZE + n * ITEM_HEADER_SIZE <= size,
            what("item count"),
            n,
            format!("<= {}", (size - NODE_HEADER_SIZE) / ITEM_HEADER_SIZE)
        );
        let mut end = size;
        let floor = NODE_HEADER_SIZE + n * ITEM_HEADER_SIZE;
        for i in 0..n {
            let ih = c.item_header(i);
            let key = Key::decode(&ih.key);
            // The message is built only for a bad type: this loop runs for every item read.
            if key.item_type().is_none() {
                key.check_type(&what(&format!("item {i}")))?;
            }
            let (off, len) = (ih.offset.get() as usize, ih.size.get() as usize);
            ensure!(
                off.checked_add(len) == Some(end),
                what(&format!("item {i} data end")),
                off as u128 + len as u128,
                end
            );
            ensure!(
                off >= floor,
                what(&format!("item {i} data offset")),
                off,
                format!(">= {floor} (end of item headers)")
            );
            end = off;
            if let Some(p) = prev {
                ensure!(
                    p < key,
                    what(&format!("item {i} key order")),
                    key,
                    format!("> {p}")
                );
            }
            first = first.or(Some(key));
            prev = Some(key);
        }
    } else {
        ensure!(n >= 1, what("pointer count"), n, ">= 1");
        ensure!(
            NODE_HEADER_SIZE + n * KEY_PTR_SIZE <= size,
            what("pointer count"),
            n,
            format!("<= {}", (size - NODE_HEADER_SIZE) / KEY_PTR_SIZE)
        );
        let node_blocks = size as u64 / BLOCK_SIZE;
        for i in 0..n {
            let kp = c.key_ptr(i);
            let key = Key::decode(&kp.key);
            let blk = kp.block.get();
            ensure!(
                blk >= crate::SUPER_COPIES
                    && blk
                        .checked_add(node_blocks)
                        .is_some_and(|e| e <= exp.total_blocks),
                what(&format!("pointer {i} block")),
                blk,
                format!(
                    "in {}..{} (inside the device)",
                    crate::SUPER_COPIES,
                    exp.total_blocks
                )
            );
            ensure!(
                kp.generation.get() <= h.generation.get(),
                what(&format!("pointer {i} generation")),
                kp.generation.get(),
                format!("<= {}", h.generation.get())
            );
            if let Some(p) = prev {
                ensure!(
                    p < key,
                    what(&format!("pointer {i} key order")),
                    key,
                    format!("> {p}")
                );
            }
            first = first.or(Some(key));
            prev = Some(key);
        }
    }
    if let Some(want) = exp.range.first {
        ensure!(
            first == Some(want),
            what("first key"),
            first.map_or_else(|| "none (empty node)".to_string(), |k| k.to_string()),
            format!("{want} (its parent's key for it)")
        );
    }
    if let (Some(below), Some(last)) = (exp.range.below, prev) {
        ensure!(
            last < below,
            what("last key"),
            last,
            format!("< {below} (the next key right of it in its parent or above)")
        );
    }
    Ok(c)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl<'a> Checked<'a> {
    pub fn nritems(&self) -> usize {
        self.header.nritems.get() as usize
    }
    pub fn level(&self) -> u8 {
        self.header.level
    }
    fn item_header(&self, i: usize) -> ItemHeader {
        let at = NODE_HEADER_SIZE + i * ITEM_HEADER_SIZE;
        self.bytes
            .get(at..)
            .and_then(|s| ItemHeader::read_from_prefix(s).ok())
            .map(|(h, _)| h)
            .unwrap_or_else(ItemHeader::new_zeroed)
    }
    fn key_ptr(&self, i: usize) -> KeyPtr {
        let at = NODE_HEADER_SIZE + i * KEY_PTR_SIZE;
        self.bytes
            .get(at..)
            .and_then(|s| KeyPtr::read_from_prefix(s).ok())
            .map(|(h, _)| h)
            .unwrap_or_else(KeyPtr::new_zeroed)
    }
    /// Leaf item `i`: key and data. Bounds were checked by [`check`].
    pub fn item(&self, i: usize) -> (Key, &'a [u8]) {
        let ih = self.item_header(i);
        let (off, len) = (ih.offset.get() as usize, ih.size.get() as usize);
        (
            Key::decode(&ih.key),
            self.bytes.get(off..off + len).unwrap_or(&[]),
        )
    }
    /// Internal pointer `i`: key, child block, child generation.
    pub fn ptr(&self, i: usize) -> (Key, u64, u64) {
        let kp = self.key_ptr(i);
        (Key::decode(&kp.key), kp.block.get(), kp.generation.get())
    }
}

/// Identity fields written into every node header.
#[derive(Debug, Clone, Copy)]
pub struct Identity {
    pub block: u64,
    pub generation: u64,
    pub owner: u64,
    pub fsid: [u8; 16],
}

fn finish(out: &mut [u8], id: &Identity, level: u8, n: usize) {
    let h = NodeHeader {
        csum: U32::new(0),
        magic: NODE_MAGIC,
        fsid: id.fsid,
        block: U64::new(id.block),
        generation: U64::new(id.generation),
        owner: U64::new(id.owner),
        level,
        reserved0: 0,
        nritems: U16::new(n as u16),
        reserved: [0; 12],
    };
    if let Some(d) = out.get_mut(..NODE_HEADER_SIZE) {
        d.copy_from_slice(h.as_bytes());
    }
    let csum = crc32c::crc32c(out.get(4..).unwrap_or(&[]));
    if let Some(d) = out.get_mut(..4) {
        d.copy_from_slice(&csum.to_le_bytes());
    }
}

/// Encodes a leaf. Panics (a programming error, not disk input) if the items do not fit.
pub fn encode_leaf<'k>(
    out: &mut [u8],
    id: &Identity,
    items: impl ExactSizeIterator<Item = (&'k Key, &'k [u8])>,
) {
    let size = out.len();
    out.fill(0);
    let n = items.len();
    assert!(n <= u16::MAX as usize, "leaf item count {n} overflows u16");
    let mut end = size;
    for (i, (key, data)) in items.enumerate() {
        let off = end - data.len();
        assert!(
            off >= NODE_HEADER_SIZE + (i + 1) * ITEM_HEADER_SIZE,
            "leaf overflow at item {i}"
        );
        if let Some(d) = out.get_mut(off..end) {
            d.copy_from_slice(data);
        }
        let ih = ItemHeader {
            key: key.encode(),
            offset: U32::new(off as u32),
            size: U32::new(data.len() as u32),
        };
        let at = NODE_HEADER_SIZE + i * ITEM_HEADER_SIZE;
        if let Some(d) = out.get_mut(at..at + ITEM_HEADER_SIZE) {
            d.copy_from_slice(ih.as_bytes());
        }
        end = off;
    }
    finish(out, id, 0, n);
}

/// Encodes an internal node from (key, child block, child generation).
pub fn encode_internal(
    out: &mut [u8],
    id: &Identity,
    level: u8,
    ptrs: impl ExactSizeIterator<Item = (Key, u64, u64)>,
) {
    out.fill(0);
    let n = ptrs.len();
    assert!(level > 0 && level < MAX_LEVEL, "internal level {level}");
    assert!(
        NODE_HEADER_SIZE + n * KEY_PTR_SIZE <= out.len(),
        "internal node overflow: {n} pointers"
    );
    for (i, (key, block, gen)) in ptrs.enumerate() {
        let kp = KeyPtr {
            key: key.encode(),
            block: U64::new(block),
            generation: U64::new(gen),
        };
        let at = NODE_HEADER_SIZE + i * KEY_PTR_SIZE;
        if let Some(d) = out.get_mut(at..at + KEY_PTR_SIZE) {
            d.copy_from_slice(kp.as_bytes());
        }
    }
    finish(out, id, level, n);
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    reason = "tests index fixed, known-good buffers"
)]
mod tests {
    use super::*;
    use crate::ItemType;

    fn id() -> Identity {
        Identity {
            block: 10,
            generation: 3,
            owner: 1,
            fsid: [7; 16],
        }
    }
    fn exp() -> Expect {
        Expect {
            block: 10,
            generation: 3,
            owner: 1,
            level: None,
            fsid: [7; 16],
            total_blocks: 1000,
            range: KeyRange::ANY,
        }
    }

    #[test]
    fn leaf_roundtrip_and_checks() {
        let keys: Vec<Key> = (0..10).map(|i| Key::new(i, ItemType::Inode, 0)).collect();
        let datas: Vec<Vec<u8>> = (0..10).map(|i| vec![i as u8; i as usize * 3]).collect();
        let mut buf = vec![0u8; 4096];
        encode_leaf(
            &mut buf,
            &id(),
            keys.iter().zip(datas.iter().map(|d| d.as_slice())),
        );
        let c = check(&buf, &exp()).expect("valid");
        assert_eq!(c.nritems(), 10);
        for i in 0..10 {
            assert_eq!(c.item(i), (keys[i], datas[i].as_slice()));
        }
        // A flipped bit anywhere fails the checksum.
        let mut bad = buf.clone();
        bad[2000] ^= 1;
        assert!(check(&bad, &exp())
            .expect_err("bad checksum")
            .what
            .contains("checksum"));
        // Wrong expected generation is reported as such.
        let e = Expect {
            generation: 4,
            ..exp()
        };
        assert!(check(&buf, &e)
            .expect_err("wrong generation")
            .what
            .contains("generation"));
    }

    #[test]
    fn a_node_outside_its_parents_range_is_corrupt() {
        let keys: Vec<Key> = (10..20).map(|i| Key::new(i, ItemType::Inode, 0)).collect();
        let mut buf = vec![0u8; 4096];
        encode_leaf(&mut buf, &id(), keys.iter().map(|k| (k, &[][..])));
        let within = |first: u64, below: Option<u64>| Expect {
            range: KeyRange {
                first: Some(Key::new(first, ItemType::Inode, 0)),
                below: below.map(|b| Key::new(b, ItemType::Inode, 0)),
            },
            ..exp()
        };
        check(&buf, &within(10, Some(20))).expect("inside its range");
        check(&buf, &within(10, None)).expect("rightmost");
        let err = check(&buf, &within(9, Some(20))).expect_err("first key differs");
        assert!(err.what.contains("first key"), "{err}");
        let err = check(&buf, &within(10, Some(19))).expect_err("last key too high");
        assert!(err.what.contains("last key"), "{err}");
        // An empty leaf below a parent has no first key to match.
        let mut empty = vec![0u8; 4096];
        encode_leaf(&mut empty, &id(), std::iter::empty());
        check(&empty, &exp()).expect("an empty root leaf");
        let err = check(&empty, &within(10, None)).expect_err("an empty child");
        assert!(err.what.contains("first key"), "{err}");
    }

    #[test]
    fn internal_pointer_past_device_is_corrupt() {
        let mut buf = vec![0u8; 4096];
        encode_internal(&mut buf, &id(), 1, [(Key::MIN, 5000u64, 1u64)].into_iter());
        let err = check(&buf, &exp()).expect_err("must fail");
        assert!(err.what.contains("pointer 0 block"), "{err}");
    }
}
