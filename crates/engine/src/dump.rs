//! Human-readable dump of any tree, with fill statistics per tree and level.
use crate::btree::node::Node;
use crate::error::Result;
use crate::fs::read_superblock;
use idxfs_blockdev::BlockDevice;
use idxfs_format::items::{
    decode_block_group, decode_dir_entries, decode_ext_refs, decode_extent, decode_inode,
    decode_names, decode_orphan, decode_xattrs, XattrValue, EXTENT_INLINE,
};
use idxfs_format::node::{internal_capacity, leaf_capacity, Expect, KeyRange, KEY_PTR_SIZE};
use idxfs_format::superblock::{RootPtr, Superblock};
use idxfs_format::{ItemType, Key, BLOCK_SIZE, TREE_FS, TREE_ROOTS, TREE_SPACE};
use std::collections::BTreeMap;
use std::io::Write;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Fs,
    Space,
    /// Snapshots, shared node counts and held blocks (when the image has them).
    Roots,
}

/// Fill statistics of one tree.
#[derive(Debug, Default, Clone)]
pub struct TreeStats {
    /// level -> (nodes, used bytes, capacity bytes)
    pub levels: BTreeMap<u8, (u64, u64, u64)>,
    pub items_by_type: BTreeMap<&'static str, u64>,
    /// Leaves under half full (coarse fullness levels: <25%, <50%, <75%, <=100%).
    pub leaf_fill_buckets: [u64; 4],
    /// Leaves by the item type holding most of their bytes -> (leaves, used bytes, capacity):
    /// the fill of each index on its own (a huge directory's DIR_HASH and DIR_INO leaves).
    pub leaf_fill_by_kind: BTreeMap<&'static str, (u64, u64, u64)>,
}

impl TreeStats {
    /// Fill of the leaves whose bytes are mostly items of type `kind` (e.g. "DIR_INO").
    pub fn leaf_fill_of(&self, kind: &str) -> Option<f64> {
        self.leaf_fill_by_kind
            .get(kind)
            .map(|(_, u, c)| *u as f64 / (*c).max(1) as f64)
    }

    pub fn leaf_fill(&self) -> f64 {
        self.levels
            .get(&0)
            .map(|(_, u, c)| *u as f64 / (*c).max(1) as f64)
            .unwrap_or(0.0)
    }
}

fn describe(k: &Key, v: &[u8], total: u64) -> String {
    let what = format!("item {k}");
    let names = |es: Vec<idxfs_format::items::DirEntry>| {
        es.iter()
            .map(|e| format!("{:?}->{}", String::from_utf8_lossy(&e.name), e.ino))
            .collect::<Vec<_>>()
            .join(" ")
    };
    match k.item_type() {
        Some(ItemType::Inode) => match decode_inode(v, k.objectid) {
            Ok(i) => format!(
                "mode {:o} nlink {} uid {} gid {} size {} alloc {} gen {}",
                i.mode.get(),
                i.nlink.get(),
                i.uid.get(),
                i.gid.get(),
                i.size.get(),
                i.alloc_bytes.get(),
                i.generation.get()
            ),
            Err(e) => format!("BAD {e}"),
        },
        Some(ItemType::DirHash | ItemType::DirIno) => decode_dir_entries(v, &what)
            .map(names)
            .unwrap_or_else(|e| format!("BAD {e}")),
        Some(ItemType::InodeRef) => decode_names(v, &what)
            .map(|ns| {
                ns.iter()
                    .map(|n| format!("{:?}", String::from_utf8_lossy(n)))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_else(|e| format!("BAD {e}")),
        Some(ItemType::Xattr) => decode_xattrs(v, &what)
            .map(|xs| {
                xs.iter()
                    .map(|x| match &x.value {
                        XattrValue::Inline(v) => {
                            format!("{:?}={} bytes", String::from_utf8_lossy(&x.name), v.len())
                        }
                        XattrValue::Chunked { len, base } => format!(
                            "{:?}={len} bytes in chunks at {base:#x}",
                            String::from_utf8_lossy(&x.name),
                        ),
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_else(|e| format!("BAD {e}")),
        Some(ItemType::Extent) => match decode_extent(v, &what, total) {
            Ok((e, inline)) if e.kind == EXTENT_INLINE => format!("inline {} bytes", inline.len()),
            Ok((e, _)) => format!(
                "kind {} blocks {}+{} gen {}",
                e.kind,
                e.disk_block.get(),
                e.blocks.get(),
                e.generation.get()
            ),
            Err(e) => format!("BAD {e}"),
        },
        Some(ItemType::InodeExtRef) => decode_ext_refs(v, &what)
            .map(|rs| {
                rs.iter()
                    .map(|r| format!("{}/{:?}", r.parent, String::from_utf8_lossy(&r.name)))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_else(|e| format!("BAD {e}")),
        Some(ItemType::DataSum) => match idxfs_format::items::BlockSums::decode(v, &what) {
            Ok(s) => {
                let n = idxfs_format::items::SUM_GROUP_BLOCKS;
                let first = k.offset.saturating_mul(n);
                let have = s.sums.iter().filter(|x| x.is_some()).count();
                format!(
                    "sums of {have} blocks in {first}..{}",
                    first.saturating_add(n)
                )
            }
            Err(e) => format!("BAD {e}"),
        },
        Some(ItemType::Orphan) => match decode_orphan(v, k.offset) {
            Ok(kind) => format!("{kind:?}"),
            Err(e) => format!("BAD {e}"),
        },
        Some(ItemType::SharedBlocks) => {
            match idxfs_format::items::decode_shared(v, k.offset, u64::MAX) {
                Ok(it) => format!(
                    "blocks {}+{} named by {} extents",
                    k.offset,
                    it.blocks.get(),
                    it.refs.get()
                ),
                Err(e) => format!("BAD {e}"),
            }
        }
        Some(ItemType::BlockGroup) => decode_block_group(v, k.objectid, k.offset)
            .map(|b| format!("used {} flags {}", b.used_blocks.get(), b.flags.get()))
            .unwrap_or_else(|e| format!("BAD {e}")),
        Some(ItemType::FreeSpaceBitmap) => {
            format!("{} bits set", v.iter().map(|b| b.count_ones()).sum::<u32>())
        }
        _ => format!("{} bytes", v.len()),
    }
}

/// Dumps `which` (or every tree) to `out`: the superblock, then (unless `stats_only`) every
/// node and item, then fill statistics.
pub fn dump(
    dev: &dyn BlockDevice,
    which: Option<Which>,
    stats_only: bool,
    out: &mut dyn Write,
) -> Result<Vec<(Which, TreeStats)>> {
    let sb = read_superblock(dev)?;
    writeln!(out, "superblock: generation {} uuid {} blocks {} node_size {} group_blocks {} next_ino {} inodes {} used_blocks {}", sb.generation.get(), sb.uuid.iter().map(|b| format!("{b:02x}")).collect::<String>(), sb.total_blocks.get(), sb.node_size.get(), sb.group_blocks.get(), sb.next_ino.get(), sb.inode_count.get(), sb.used_blocks.get())?;
    let mut all = Vec::new();
    for (w, root, owner, name) in [
        (Which::Fs, sb.fs_root, TREE_FS, "fs"),
        (Which::Space, sb.space_root, TREE_SPACE, "space"),
        (Which::Roots, sb.roots_root, TREE_ROOTS, "roots"),
    ] {
        if which.is_some_and(|x| x != w) {
            continue;
        }
        if root.block.get() == 0 {
            writeln!(out, "tree {name}: none (no snapshot was ever made)")?;
            continue;
        }
        writeln!(
            out,
            "tree {name}: root {} level {}",
            root.block.get(),
            root.level.get()
        )?;
        let stats = dump_tree(dev, &sb, &root, owner, stats_only, out)?;
        for (level, (n, used, cap)) in stats.levels.iter().rev() {
            writeln!(
                out,
                "  {name} level {level}: {n} nodes, fill {:.1}%",
                *used as f64 * 100.0 / (*cap).max(1) as f64
            )?;
        }
        let b = stats.leaf_fill_buckets;
        writeln!(
            out,
            "  {name} leaves by fill: <25% {} | <50% {} | <75% {} | >=75% {}",
            b[0], b[1], b[2], b[3]
        )?;
        for (t, n) in &stats.items_by_type {
            writeln!(out, "  {name} items {t}: {n}")?;
        }
        for (t, (n, used, cap)) in &stats.leaf_fill_by_kind {
            writeln!(
                out,
                "  {name} leaves mostly {t}: {n}, fill {:.1}%",
                *used as f64 * 100.0 / (*cap).max(1) as f64
            )?;
        }
        writeln!(out, "  {name} leaf fill: {:.1}%", stats.leaf_fill() * 100.0)?;
        all.push((w, stats));
    }
    Ok(all)
}

fn dump_tree(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    root: &RootPtr,
    owner: u64,
    stats_only: bool,
    out: &mut dyn Write,
) -> Result<TreeStats> {
    let ns = sb.node_size.get();
    let total = sb.total_blocks.get();
    let mut st = TreeStats::default();
    let mut stack = vec![(
        root.block.get(),
        root.generation.get(),
        root.level.get() as u8,
    )];
    let mut buf = vec![0u8; ns as usize];
    while let Some((block, gen, level)) = stack.pop() {
        dev.read_at(&mut buf, block * BLOCK_SIZE)?;
        let exp = Expect {
            block,
            generation: gen,
            owner,
            level: Some(level),
            fsid: sb.uuid,
            total_blocks: total,
            // A dump shows what is there, in or out of place.
            range: KeyRange::ANY,
        };
        let node = Node::decode(&buf, &exp)?;
        let cap = if node.is_leaf() {
            leaf_capacity(ns)
        } else {
            internal_capacity(ns) * KEY_PTR_SIZE
        };
        let e = st.levels.entry(level).or_default();
        e.0 += 1;
        e.1 += node.used as u64;
        e.2 += cap as u64;
        if !stats_only {
            writeln!(
                out,
                "node {block} level {level} gen {gen} items {} fill {:.1}%",
                node.len(),
                node.used as f64 * 100.0 / cap as f64
            )?;
        }
        if node.is_leaf() {
            let q = (node.used * 4 / cap.max(1)).min(3);
            st.leaf_fill_buckets[q] += 1;
            let mut bytes: BTreeMap<&'static str, usize> = BTreeMap::new();
            for (k, v) in node.keys.iter().zip(node.leaf_vals().iter()) {
                let t = k.item_type().map_or("UNKNOWN", |t| t.name());
                *st.items_by_type.entry(t).or_default() += 1;
                *bytes.entry(t).or_default() += v.len();
                if !stats_only {
                    writeln!(out, "  {k} {}", describe(k, v, total))?;
                }
            }
            if let Some((t, _)) = bytes.iter().max_by_key(|(_, b)| **b) {
                let e = st.leaf_fill_by_kind.entry(t).or_default();
                e.0 += 1;
                e.1 += node.used as u64;
                e.2 += cap as u64;
            }
        } else {
            for (k, p) in node.keys.iter().zip(node.ptrs()).rev() {
                stack.push((p.block, p.generation, level - 1));
                let _ = k;
            }
            if !stats_only {
                for (k, p) in node.keys.iter().zip(node.ptrs()) {
                    writeln!(out, "  {k} -> node {} gen {}", p.block, p.generation)?;
                }
            }
        }
    }
    Ok(st)
}
