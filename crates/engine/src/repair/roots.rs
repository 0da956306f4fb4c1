//! Snapshots through a repair: which of them the rebuilt file system keeps, and what they
//! hold of the device.
//!
//! A snapshot's tree is never written after it is made, so a repair does not rebuild it: it
//! keeps it as it is when the tree checks whole as a file system of its own (every node and
//! item, as fsck checks a snapshot), and deletes it otherwise, saying so. One being deleted
//! when the image was damaged is deleted (its drop finished by forgetting what is left).
//! One whose nodes a block the rebuilt file system keeps for its data is, is deleted too
//! (two owners of one block cannot both be right, and the file system comes first).
//!
//! What the kept ones hold is found anew, not read from the old roots tree (which may be
//! what was damaged): the parents of each of their nodes (the rebuilt fs tree shares none),
//! and the blocks their written extents name. The rebuild keeps all of it, and holds the
//! blocks the rebuilt fs tree does not name for every kept snapshot (`adopt_snapshots`).
use super::salvage;
use crate::btree::node::Node;
use crate::fs::{NameHash, Snap};
use idxfs_blockdev::BlockDevice;
use idxfs_format::items::{decode_extent, EXTENT_REGULAR};
use idxfs_format::node::{Expect, KeyRange};
use idxfs_format::roots::{decode_subvolume, SUBVOL_DROPPING};
use idxfs_format::superblock::Superblock;
use idxfs_format::{ItemType, BLOCK_SIZE, TREE_FS, TREE_ROOTS};
use std::collections::{BTreeMap, HashMap};

/// The snapshots a repair keeps, and what they hold.
#[derive(Default)]
pub(crate) struct Kept {
    pub list: BTreeMap<u64, Snap>,
    /// Pointers to each of their nodes (roots and internal nodes' children), each node
    /// entered once however many trees share it.
    pub parents: HashMap<u64, u32>,
    /// Runs of blocks their written extents name: (start, blocks).
    pub data: Vec<(u64, u64)>,
}

impl Kept {
    /// Every block their nodes take: (start, blocks).
    pub fn node_runs(&self, blocks_per_node: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.parents.keys().map(move |&b| (b, blocks_per_node))
    }
}

/// The snapshots of the image `sb` describes that a repair keeps (module notes); what it
/// deletes goes into `actions`. `fs_data`: the runs the rebuilt file system keeps.
pub(crate) fn keep(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    hash: NameHash,
    fs_data: &[(u64, u64)],
    actions: &mut Vec<String>,
) -> Kept {
    let mut out = Kept::default();
    if sb.roots_root.block.get() == 0 {
        return out;
    }
    let mut found = Vec::new();
    let mut lost = salvage::Salvaged::default();
    salvage::walk(
        dev,
        sb,
        &sb.roots_root,
        TREE_ROOTS,
        &mut lost,
        &mut |k, v| {
            if k.item_type() == Some(ItemType::Subvolume) && k.offset == 0 {
                found.push((
                    k.objectid,
                    decode_subvolume(v, k.objectid).map(|(it, n)| (it, n.to_vec())),
                ));
            }
        },
    );
    for l in lost.lost {
        actions.push(format!("snapshots: {l}; the snapshots it held are deleted"));
    }
    let mut fs_blocks: Vec<(u64, u64)> = fs_data.to_vec();
    fs_blocks.sort_unstable();
    let in_fs_data = |b: u64| {
        let i = fs_blocks.partition_point(|r| r.0 <= b);
        i > 0 && b < fs_blocks[i - 1].0 + fs_blocks[i - 1].1
    };
    for (id, decoded) in found {
        let (item, name) = match decoded {
            Ok(x) => x,
            Err(e) => {
                actions.push(format!("snapshot {id}: {e}: deleted"));
                continue;
            }
        };
        let shown = String::from_utf8_lossy(&name).into_owned();
        if item.flags.get() & SUBVOL_DROPPING != 0 {
            actions.push(format!(
                "snapshot {id} ({shown}) was being deleted: its delete is finished"
            ));
            continue;
        }
        let problems = crate::fsck::snapshot_problems(dev, sb, hash, false, &item);
        if let Some(p) = problems.first() {
            actions.push(format!(
                "snapshot {id} ({shown}) is damaged ({p}{}): deleted",
                match problems.len() {
                    1 => String::new(),
                    n => format!(", and {} more problems", n - 1),
                }
            ));
            continue;
        }
        let mut mine = Kept::default();
        if let Err(why) = walk(dev, sb, &item, &out.parents, &mut mine) {
            actions.push(format!("snapshot {id} ({shown}): {why}: deleted"));
            continue;
        }
        let bpn = sb.blocks_per_node();
        if let Some(b) = mine
            .node_runs(bpn)
            .flat_map(|(s, n)| s..s + n)
            .find(|&b| in_fs_data(b))
        {
            actions.push(format!(
                "snapshot {id} ({shown}): its node at block {b} is data the file system \
                 keeps: deleted"
            ));
            continue;
        }
        for (b, n) in mine.parents {
            *out.parents.entry(b).or_insert(0) += n;
        }
        out.data.extend(mine.data);
        out.list.insert(id, Snap { item, name });
    }
    out.data.sort_unstable();
    out.data.dedup();
    out
}

/// Walks one snapshot's tree into `mine`: its pointers, and its written extents' runs. A
/// node `before` holds (another kept snapshot's) gains a parent and is not entered again.
fn walk(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    item: &idxfs_format::roots::SubvolumeItem,
    before: &HashMap<u64, u32>,
    mine: &mut Kept,
) -> Result<(), String> {
    let root = &item.root;
    let mut buf = vec![0u8; sb.node_size.get() as usize];
    let mut stack = vec![(
        root.block.get(),
        root.generation.get(),
        root.level.get() as u8,
    )];
    *mine.parents.entry(root.block.get()).or_insert(0) += 1;
    while let Some((block, generation, level)) = stack.pop() {
        if before.contains_key(&block) {
            continue;
        }
        dev.read_at(&mut buf, block * BLOCK_SIZE)
            .map_err(|e| format!("node {block}: {e}"))?;
        let exp = Expect {
            block,
            generation,
            owner: TREE_FS,
            level: Some(level),
            fsid: sb.uuid,
            total_blocks: sb.total_blocks.get(),
            range: KeyRange::ANY,
        };
        let node = Node::decode(&buf, &exp).map_err(|e| e.to_string())?;
        if node.is_leaf() {
            for (k, v) in node.keys.iter().zip(node.leaf_vals().iter()) {
                if k.item_type() != Some(ItemType::Extent) {
                    continue;
                }
                let (e, _) = decode_extent(v, format_args!("extent {k}"), sb.total_blocks.get())
                    .map_err(|e| e.to_string())?;
                if e.kind == EXTENT_REGULAR {
                    mine.data.push((e.disk_block.get(), e.blocks.get()));
                }
            }
            continue;
        }
        for p in node.ptrs() {
            let c = mine.parents.entry(p.block).or_insert(0);
            *c += 1;
            if *c == 1 {
                stack.push((p.block, p.generation, level - 1));
            }
        }
    }
    Ok(())
}
