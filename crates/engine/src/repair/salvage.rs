//! The first step of a repair: every item of the fs tree that can still be read, and every
//! block the image may still use, without trusting anything.
//!
//! Each tree is walked from its root as a mount reads it: every node must pass all of
//! `format::node::check` (checksum, identity, generation from its parent, level, packing,
//! key order, place in its parent's range). A node that fails is not used, and nor is anything
//! below it: its key range is reported as lost. Nothing tries to find a lost subtree's
//! children by scanning the device; copy-on-write leaves old versions of nodes lying about,
//! and nothing but the parent pointer's generation tells a current node from a stale one.
use crate::btree::node::Node;
use crate::space::bitmap::Bitmap;
use idxfs_blockdev::BlockDevice;
use idxfs_format::node::{Expect, KeyRange};
use idxfs_format::superblock::{RootPtr, Superblock};
use idxfs_format::{ItemType, Key, BLOCK_SIZE, TREE_FS, TREE_ROOTS, TREE_SPACE};
use std::collections::BTreeMap;

/// What could be read of an image.
#[derive(Default)]
pub(crate) struct Salvaged {
    /// Every fs-tree item of every node that checked out.
    pub items: BTreeMap<Key, Vec<u8>>,
    /// Blocks the old state may still use: its readable nodes (fs and space trees), what its
    /// readable bitmaps call used, and its fsync log's first block. Nothing of the rebuild
    /// is written over them before the rebuild's superblock is durable (`super`), so a crash
    /// during a repair leaves the image as it was.
    pub busy: Vec<(u64, u64)>,
    /// One line per subtree that could not be read: where, why, and which keys it held.
    pub lost: Vec<String>,
    /// The key ranges of the fs tree those subtrees held.
    pub lost_ranges: Vec<KeyRange>,
}

/// Reads what can be read of the trees `sb` names.
pub(crate) fn salvage(dev: &dyn BlockDevice, sb: &Superblock) -> Salvaged {
    let mut out = Salvaged::default();
    let gb = sb.group_blocks.get();
    let mut items = BTreeMap::new();
    walk(dev, sb, &sb.fs_root, TREE_FS, &mut out, &mut |k, v| {
        items.insert(k, v.to_vec());
    });
    out.items = items;
    let mut bitmaps = Vec::new();
    walk(
        dev,
        sb,
        &sb.space_root,
        TREE_SPACE,
        &mut out,
        &mut |k, v| {
            if k.item_type() == Some(ItemType::FreeSpaceBitmap) && k.objectid.is_multiple_of(gb) {
                bitmaps.push((k.objectid, k.offset, v.to_vec()));
            }
        },
    );
    let total = sb.total_blocks.get();
    for (start, len, bits) in bitmaps {
        let Some(bm) = Bitmap::from_bytes(&bits, len) else {
            continue;
        };
        for i in 0..len.min(total.saturating_sub(start)) {
            if bm.get(i) {
                out.busy.push((start + i, 1));
            }
        }
    }
    let log = sb.log_root.block.get();
    if log != 0 && log < total {
        out.busy.push((log, 1));
    }
    out
}

/// Walks one tree, handing each item of each readable leaf to `item`.
pub(super) fn walk(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    root: &RootPtr,
    owner: u64,
    out: &mut Salvaged,
    item: &mut dyn FnMut(Key, &[u8]),
) {
    let name = match owner {
        TREE_FS => "fs tree",
        TREE_ROOTS => "roots tree",
        _ => "space tree",
    };
    let ns = sb.node_size.get() as usize;
    let bpn = sb.blocks_per_node();
    let mut buf = vec![0u8; ns];
    // (block, generation, level, range)
    let mut stack = vec![(
        root.block.get(),
        root.generation.get(),
        root.level.get() as u8,
        KeyRange::ANY,
    )];
    while let Some((block, generation, level, range)) = stack.pop() {
        let keys = |r: &KeyRange| {
            let lo = r.first.map_or("the start".to_string(), |k| k.to_string());
            let hi = r.below.map_or("the end".to_string(), |k| k.to_string());
            format!("keys from {lo} to {hi}")
        };
        // A pointer from damaged metadata (a root in the superblock or an item) may name a
        // block past the device: lost, as a node that cannot be read.
        if block
            .checked_add(bpn)
            .is_none_or(|end| end > sb.total_blocks.get())
        {
            out.lost.push(format!(
                "{name} node {block}: past the device's {} blocks: {} lost",
                sb.total_blocks.get(),
                keys(&range)
            ));
            if owner == TREE_FS {
                out.lost_ranges.push(range);
            }
            continue;
        }
        if let Err(e) = dev.read_at(&mut buf, block * BLOCK_SIZE) {
            out.lost.push(format!(
                "{name} node {block}: read failed ({e}): {} lost",
                keys(&range)
            ));
            if owner == TREE_FS {
                out.lost_ranges.push(range);
            }
            continue;
        }
        let exp = Expect {
            block,
            generation,
            owner,
            level: Some(level),
            fsid: sb.uuid,
            total_blocks: sb.total_blocks.get(),
            range,
        };
        let node = match Node::decode(&buf, &exp) {
            Ok(n) => n,
            Err(e) => {
                out.lost.push(format!("{name}: {e}: {} lost", keys(&range)));
                if owner == TREE_FS {
                    out.lost_ranges.push(range);
                }
                continue;
            }
        };
        out.busy.push((block, bpn));
        if node.is_leaf() {
            for (k, v) in node.keys.iter().zip(node.leaf_vals().iter()) {
                item(*k, v);
            }
            continue;
        }
        let n = node.keys.len();
        for i in (0..n).rev() {
            let p = node.ptrs()[i];
            let below = if i + 1 < n {
                Some(node.keys[i + 1])
            } else {
                range.below
            };
            stack.push((
                p.block,
                p.generation,
                level - 1,
                KeyRange {
                    first: Some(node.keys[i]),
                    below,
                },
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{walk, Salvaged};
    use idxfs_blockdev::MemDevice;
    use idxfs_format::superblock::{RootPtr, Superblock};
    use idxfs_format::{BLOCK_SIZE, TREE_FS};
    use zerocopy::FromZeros;

    /// A root pointer from damaged metadata may name any block: one past the device, or so
    /// far that its byte offset overflows, is a lost subtree, not a panic (the image fuzz
    /// test met the overflow in a repair).
    #[test]
    fn a_root_past_the_device_is_lost_not_a_panic() {
        let dev = MemDevice::new(64 * BLOCK_SIZE);
        let mut sb = Superblock::new_zeroed();
        sb.node_size = 4096.into();
        sb.total_blocks = 64.into();
        for block in [64, 1 << 60, u64::MAX] {
            let root = RootPtr {
                block: block.into(),
                ..RootPtr::default()
            };
            let mut out = Salvaged::default();
            walk(&dev, &sb, &root, TREE_FS, &mut out, &mut |_, _| {});
            assert_eq!(out.lost.len(), 1, "block {block}: {:?}", out.lost);
            assert!(out.lost[0].contains("past the device"), "{:?}", out.lost);
            assert_eq!(out.lost_ranges.len(), 1);
            assert!(out.busy.is_empty() && out.items.is_empty());
        }
    }
}
