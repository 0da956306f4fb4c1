//! Commit: the steps that make a running transaction durable.
//!
//! Order (each step's durability is what the next relies on):
//! 1. write-back of cached inode changes into the fs tree (`fs::commit`);
//! 2. the space tree records every block group whose bitmap changed, repeated until it no
//!    longer changes itself (its own node copies allocate blocks);
//! 3. every dirty node is encoded and written to its (new) block;
//! 4. flush: all nodes durable;
//! 5. the superblock copy `generation % 2` is written with the new roots;
//! 6. flush: the commit is durable. Only now do pinned blocks (freed by this transaction)
//!    become reusable, and the generation advances.
//!
//! A crash before 6 completes leaves the previous superblock copy pointing at the previous
//! trees, all of whose blocks are untouched (nothing they use was reused: step 6 releases them).
use crate::btree::{Store, Tree};
use crate::counters::Counters;
use crate::error::Result;
use crate::space::bitmap::Bitmap;
use idxfs_format::items::{decode_block_group, BlockGroupItem};
use idxfs_format::{ensure, Corrupt, ItemType, Key, BLOCK_SIZE};
use zerocopy::IntoBytes;

/// Step 2: rewrite the block-group and bitmap items of every changed group.
pub fn persist_space(store: &mut Store, space: &mut Tree) -> Result<()> {
    for _round in 0..64 {
        let dirty = store.alloc.dirty_groups();
        if dirty.is_empty() {
            return Ok(());
        }
        for gi in dirty {
            let g = &mut store.alloc.groups[gi];
            g.dirty = false;
            let (start, len) = (g.start, g.len);
            let item = BlockGroupItem {
                used_blocks: g.used_count.into(),
                flags: g.flags.into(),
            };
            let bits = g.used.to_bytes();
            space.put(
                store,
                Key::new(start, ItemType::BlockGroup, len),
                item.as_bytes().to_vec(),
            )?;
            space.put(store, Key::new(start, ItemType::FreeSpaceBitmap, len), bits)?;
        }
    }
    // Each round only copies nodes not yet copied in this transaction, so this converges in a
    // few rounds; not converging means the allocator keeps moving, an engine bug.
    panic!("space tree did not converge in 64 rounds");
}

/// Loads every group's bitmap from the space tree (mount), validating it.
pub fn load_space(store: &mut Store, space: &Tree) -> Result<()> {
    let ngroups = store.alloc.groups.len();
    let mut seen = vec![false; ngroups];
    let mut found: Vec<(usize, u64, Bitmap)> = Vec::new();
    let mut pending: Option<(u64, u64, BlockGroupItem)> = None;
    let gb = store.alloc.group_blocks;
    let total = store.total_blocks;
    space.scan(store, Key::MIN, Key::MAX, |k, v| {
        let gi = (k.objectid / gb) as usize;
        ensure!(
            k.objectid % gb == 0 && gi < ngroups,
            format!("space item {k}"),
            k.objectid,
            format!("a group start below {total}")
        );
        let len = gb.min(total - k.objectid);
        ensure!(
            k.offset == len,
            format!("space item {k} length"),
            k.offset,
            len
        );
        match k.item_type() {
            Some(ItemType::BlockGroup) => {
                pending = Some((k.objectid, len, decode_block_group(v, k.objectid, len)?))
            }
            Some(ItemType::FreeSpaceBitmap) => {
                let Some((start, _, bg)) = pending.take().filter(|p| p.0 == k.objectid) else {
                    return Err(Corrupt::new(
                        format!("space item {k}"),
                        "bitmap without block group item",
                        "block group item first",
                    )
                    .into());
                };
                let bm = Bitmap::from_bytes(v, len).ok_or_else(|| {
                    Corrupt::new(
                        format!("free-space bitmap {start}"),
                        v.len(),
                        len.div_ceil(8),
                    )
                })?;
                ensure!(
                    bm.count_ones() == bg.used_blocks.get(),
                    format!("block group {start} used count"),
                    bg.used_blocks.get(),
                    format!("{} (bits set in its bitmap)", bm.count_ones())
                );
                ensure!(
                    !seen[gi],
                    format!("block group {start}"),
                    "listed twice",
                    "once"
                );
                seen[gi] = true;
                found.push((gi, bg.flags.get(), bm));
            }
            _ => {
                return Err(Corrupt::new(
                    format!("space item {k}"),
                    k.ty,
                    "BLOCK_GROUP or FREE_SPACE_BITMAP",
                )
                .into())
            }
        }
        Ok(true)
    })?;
    if let Some(missing) = seen.iter().position(|s| !s) {
        return Err(Corrupt::new(
            format!("block group {}", missing as u64 * gb),
            "missing",
            "a block group and bitmap item",
        )
        .into());
    }
    for (gi, flags, bm) in found {
        store.alloc.load_group(gi, bm, flags);
    }
    Ok(())
}

/// Steps 3 and 4: write every dirty node, then flush.
pub fn write_dirty_nodes(store: &mut Store) -> Result<u64> {
    let blocks = store.cache.dirty_blocks();
    assert_eq!(
        blocks.len(),
        store.dirty_nodes,
        "dirty node count drifted from the cache"
    );
    let ns = store.node_size as usize;
    // Contiguous nodes go out in one write (up to 1 MiB) to keep the device busy with large I/O.
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut run_start = 0u64;
    let mut next = u64::MAX;
    let fsid = store.fsid;
    let bpn = store.blocks_per_node();
    let mut written = 0;
    for b in blocks {
        if b != next || buf.len() >= (1 << 20) {
            if !buf.is_empty() {
                store.dev.write_at(&buf, run_start * BLOCK_SIZE)?;
                buf.clear();
            }
            run_start = b;
        }
        let at = buf.len();
        buf.resize(at + ns, 0);
        assert!(
            store.alloc.is_used(b),
            "writing node {b} whose block is not allocated"
        );
        let node = store.node(b);
        node.encode(&mut buf[at..], b, fsid);
        next = b + bpn;
        written += 1;
    }
    if !buf.is_empty() {
        store.dev.write_at(&buf, run_start * BLOCK_SIZE)?;
    }
    store
        .counters
        .node_writes
        .fetch_add(written, std::sync::atomic::Ordering::Relaxed);
    store.dev.flush()?;
    store.data_unflushed = false;
    Ok(written)
}

/// Step 6's bookkeeping once the superblock is durable.
pub fn finish(store: &mut Store) {
    store.alloc.commit_done();
    let dirty = store.cache.dirty_blocks();
    store.cache.clear_dirty(&dirty);
    store.generation += 1;
    store.dirty_nodes = 0;
    Counters::inc(&store.counters.commits);
    if store.cache.over_limit() {
        let n = store.cache.evict(store.generation);
        store
            .counters
            .node_evictions
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
}
