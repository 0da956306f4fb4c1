//! Model-based test of the B+tree against `BTreeMap`: random inserts, updates, deletes and range
//! scans, with commits and cache drops so nodes round-trip through the device.
use super::*;
use crate::counters::Counters;
use crate::space::Allocator;
use crate::testutil::Rng;
use crate::txn;
use idxfs_blockdev::MemDevice;
use idxfs_format::node::{Expect, KeyRange};
use idxfs_format::{ItemType, Key};
use std::collections::BTreeMap;
use std::sync::Arc;

pub(super) fn store(node_size: u32, blocks: u64) -> Store {
    let dev = Arc::new(MemDevice::new(blocks * 4096));
    let counters = Arc::new(Counters::default());
    let alloc = Allocator::new(blocks, 8192, counters.clone());
    Store::new(dev, [9; 16], node_size, blocks, 1, 4096, alloc, counters)
}

fn commit(s: &mut Store, drop_cache: bool) {
    txn::commit_store(s).expect("write");
    if drop_cache {
        s.cache.clear();
    }
}

fn check_all(t: &Tree, s: &mut Store, model: &BTreeMap<Key, Vec<u8>>, seed: u64) {
    let mut got = Vec::new();
    t.scan(s, Key::MIN, Key::MAX, |k, v| {
        got.push((*k, v.to_vec()));
        Ok(true)
    })
    .expect("scan");
    let want: Vec<(Key, Vec<u8>)> = model.iter().map(|(k, v)| (*k, v.clone())).collect();
    assert_eq!(got.len(), want.len(), "seed {seed}: item count");
    assert!(got == want, "seed {seed}: full scan differs from model");
}

#[test]
fn model_random_ops() {
    let (mut rng, seed) = Rng::from_env("btree model_random_ops");
    let mut s = store(4096, 1 << 16);
    let mut t = Tree::create(&mut s, 1).expect("create");
    let mut model = BTreeMap::new();
    let ops = 120_000;
    // Keys from a few objects with a dense and a sparse offset range, so both sequential runs
    // and random scatter occur.
    let key = |rng: &mut Rng| {
        let obj = rng.below(6);
        let off = if obj < 3 {
            rng.below(3000)
        } else {
            rng.next_u64() >> rng.below(64)
        };
        Key::new(obj, ItemType::Inode, off)
    };
    for i in 0..ops {
        let k = key(&mut rng);
        match rng.below(10) {
            0..=3 => {
                let n = rng.below(120) as usize;
                let v = rng.bytes(n);
                let r = t.insert(&mut s, k, v.clone());
                match model.entry(k) {
                    std::collections::btree_map::Entry::Vacant(e) => {
                        r.expect("insert");
                        e.insert(v);
                    }
                    std::collections::btree_map::Entry::Occupied(_) => {
                        assert!(matches!(r, Err(crate::Error::Exists)), "seed {seed} op {i}")
                    }
                }
            }
            4 => {
                let n = rng.below(200) as usize;
                let v = rng.bytes(n);
                t.put(&mut s, k, v.clone()).expect("put");
                model.insert(k, v);
            }
            5..=7 => {
                // Delete, biased toward existing keys so trees shrink as well as grow.
                let k = if rng.chance(70) {
                    model.range(k..).next().map(|(k, _)| *k).unwrap_or(k)
                } else {
                    k
                };
                let got = t.delete(&mut s, &k).expect("delete");
                assert_eq!(got, model.remove(&k), "seed {seed} op {i}: delete {k}");
            }
            8 if rng.chance(50) => {
                assert_eq!(
                    t.get(&mut s, &k).expect("get"),
                    model.get(&k).cloned(),
                    "seed {seed} op {i}: get {k}"
                );
            }
            8 => {
                // A batch: the last items of a range, all from one leaf, at most `max`.
                let b = key(&mut rng);
                let (lo, hi) = if k <= b { (k, b) } else { (b, k) };
                let max = rng.below(40) as usize + 1;
                let got = t.delete_batch(&mut s, lo, hi, max).expect("delete_batch");
                let in_range: Vec<Key> = model.range(lo..hi).map(|(k, _)| *k).collect();
                assert!(
                    got.len() <= max,
                    "seed {seed} op {i}: batch of {}",
                    got.len()
                );
                assert_eq!(
                    got.is_empty(),
                    in_range.is_empty(),
                    "seed {seed} op {i}: batch {lo}..{hi}"
                );
                // A suffix of the range, in key order, with the model's values.
                let tail = &in_range[in_range.len() - got.len()..];
                for ((gk, gv), want) in got.iter().zip(tail) {
                    assert_eq!(gk, want, "seed {seed} op {i}: batch keys");
                    assert_eq!(Some(gv), model.get(gk), "seed {seed} op {i}: batch value");
                }
                for (gk, _) in &got {
                    model.remove(gk);
                }
            }
            _ => {
                let a = key(&mut rng);
                let b = key(&mut rng);
                let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
                let mut got = Vec::new();
                let limit = rng.below(50) as usize + 1;
                t.scan(&mut s, lo, hi, |k, _| {
                    got.push(*k);
                    Ok(got.len() < limit)
                })
                .expect("scan");
                let want: Vec<Key> = model.range(lo..hi).map(|(k, _)| *k).take(limit).collect();
                assert_eq!(got, want, "seed {seed} op {i}: scan {lo}..{hi}");
            }
        }
        if i % 5000 == 4999 {
            check_all(&t, &mut s, &model, seed);
            commit(&mut s, rng.chance(50));
        }
    }
    check_all(&t, &mut s, &model, seed);
    // Delete everything: the tree must come back to one empty leaf and give every block back.
    let keys: Vec<Key> = model.keys().copied().collect();
    for k in keys {
        assert!(t.delete(&mut s, &k).expect("delete").is_some());
    }
    commit(&mut s, true);
    assert_eq!(t.level, 0, "seed {seed}: empty tree height");
    // Superblocks + the one root leaf.
    assert_eq!(s.alloc.used_blocks(), 2 + 1, "seed {seed}: leaked blocks");
}

#[test]
fn sequential_inserts_fill_leaves() {
    let mut s = store(16384, 1 << 16);
    let mut t = Tree::create(&mut s, 1).expect("create");
    for i in 0..100_000u64 {
        t.insert(&mut s, Key::new(i, ItemType::Inode, 0), vec![7; 100])
            .expect("insert");
    }
    let (mut leaves, mut used) = (0usize, 0usize);
    t.walk_nodes(&mut s, |_, _, n| {
        if n.is_leaf() {
            leaves += 1;
            used += n.used;
        }
        Ok(())
    })
    .expect("walk");
    let fill = used as f64 / (leaves * idxfs_format::node::leaf_capacity(16384)) as f64;
    assert!(
        fill > 0.97,
        "ascending inserts should fill leaves, got {fill:.3}"
    );
    assert_eq!(s.counters.leaf_splits_half.get(), 0);
}

#[test]
fn alternating_insert_delete_does_not_thrash() {
    let mut s = store(4096, 1 << 14);
    let mut t = Tree::create(&mut s, 1).expect("create");
    for i in 0..2000u64 {
        t.insert(&mut s, Key::new(i, ItemType::Inode, 0), vec![1; 60])
            .expect("insert");
    }
    let c = s.counters.clone();
    let before = c.leaf_merges.get() + c.leaf_splits_half.get() + c.leaf_splits_append.get();
    for _ in 0..10_000 {
        t.insert(&mut s, Key::new(1000, ItemType::Inode, 1), vec![1; 60])
            .expect("insert");
        t.delete(&mut s, &Key::new(1000, ItemType::Inode, 1))
            .expect("delete");
    }
    let after = c.leaf_merges.get() + c.leaf_splits_half.get() + c.leaf_splits_append.get();
    assert!(
        after - before <= 2,
        "insert/delete at one spot split or merged {} times",
        after - before
    );
}

/// `insert_near` against the model: ascending streams (one hint each, like directories'
/// inode-order indexes during creates) interleaved with random inserts, deletes, value growth,
/// commits and cache drops, which move, split, merge and re-key the hinted leaves under the
/// hints. A hinted insert into the wrong leaf would break key order, which the scans catch.
#[test]
fn hinted_inserts_match_model() {
    let (mut rng, seed) = Rng::from_env("btree hinted_inserts_match_model");
    let mut s = store(4096, 1 << 16);
    let mut t = Tree::create(&mut s, 1).expect("create");
    let mut model = BTreeMap::new();
    let mut hints = [LeafHint::default(); 3];
    let mut next = [0u64; 3];
    for i in 0..60_000u64 {
        match rng.below(10) {
            0..=5 => {
                // Stream h: object 10 + h, mostly ascending offsets, sometimes a step back.
                let h = rng.below(3) as usize;
                next[h] += 1 + rng.below(3);
                let off = if rng.chance(10) {
                    rng.below(next[h] + 1)
                } else {
                    next[h]
                };
                let k = Key::new(10 + h as u64, ItemType::DirIno, off);
                let n = rng.below(80) as usize;
                let v = rng.bytes(n);
                let back = t
                    .insert_near(&mut s, k, v.clone(), &mut hints[h])
                    .expect("insert_near");
                match model.entry(k) {
                    std::collections::btree_map::Entry::Vacant(e) => {
                        assert!(back.is_none(), "seed {seed} op {i}: {k} not inserted");
                        e.insert(v);
                    }
                    std::collections::btree_map::Entry::Occupied(_) => {
                        assert_eq!(back, Some(v), "seed {seed} op {i}: {k} existed");
                    }
                }
            }
            6 => {
                let k = Key::new(rng.below(15), ItemType::DirIno, rng.below(4000));
                let n = rng.below(300) as usize;
                let v = rng.bytes(n);
                t.put(&mut s, k, v.clone()).expect("put");
                model.insert(k, v);
            }
            7 | 8 => {
                let k = Key::new(rng.below(15), ItemType::DirIno, rng.below(4000));
                let k = model.range(k..).next().map(|(k, _)| *k).unwrap_or(k);
                let got = t.delete(&mut s, &k).expect("delete");
                assert_eq!(got, model.remove(&k), "seed {seed} op {i}: delete {k}");
            }
            _ => {
                let k = Key::new(10 + rng.below(3), ItemType::DirIno, rng.below(4000));
                assert_eq!(
                    t.get(&mut s, &k).expect("get"),
                    model.get(&k).cloned(),
                    "seed {seed} op {i}: get {k}"
                );
            }
        }
        if i % 4000 == 3999 {
            check_all(&t, &mut s, &model, seed);
            commit(&mut s, rng.chance(50));
        }
    }
    check_all(&t, &mut s, &model, seed);
    let hits = s.counters.leaf_hint_hits.get();
    let misses = s.counters.leaf_hint_misses.get();
    // The fast path must actually run, and the slow one too (stale hints after splits).
    assert!(
        hits > misses && misses > 100,
        "seed {seed}: {hits} hinted inserts, {misses} descents"
    );
}

/// A leaf whose checksum is good but whose keys reach into its right sibling's range (a
/// misdirected or stale write, or a hostile image) is refused when read, as Corrupt: merging
/// it with that sibling after a delete would have put keys out of order.
#[test]
fn a_leaf_outside_its_parents_range_is_corrupt_when_read() {
    let mut s = store(4096, 1 << 14);
    let mut t = Tree::create(&mut s, 1).expect("create");
    let key = |i: u64| Key::new(i, ItemType::Inode, 0);
    for i in 0..200u64 {
        t.insert(&mut s, key(i), vec![1; 100]).expect("insert");
    }
    commit(&mut s, true);
    assert_eq!(t.level, 1, "the test wants a root over leaves");
    s.load(t.root.block, t.root.generation, 1, Some(1), KeyRange::ANY)
        .expect("root");
    let root = s.node(t.root.block).clone();
    let (leaf, next_first) = (root.ptrs()[0], root.keys[1]);
    // Rewrite the leftmost leaf with its last key changed to its right sibling's first, sealed
    // afresh: in order within the leaf, out of place in the tree.
    let mut buf = vec![0u8; 4096];
    s.dev.read_at(&mut buf, leaf.block * 4096).expect("read");
    let exp = Expect {
        block: leaf.block,
        generation: leaf.generation,
        owner: 1,
        level: Some(0),
        fsid: s.fsid,
        total_blocks: s.total_blocks,
        range: KeyRange::ANY,
    };
    let mut bad = Node::decode(&buf, &exp).expect("decode");
    *bad.keys.last_mut().expect("a full leaf") = next_first;
    bad.encode(&mut buf, leaf.block, s.fsid);
    s.dev.write_at(&buf, leaf.block * 4096).expect("write");
    s.cache.clear();

    let corrupt = |r: crate::Result<()>| match r {
        Err(crate::Error::Corrupt(c)) => assert!(c.what.contains("last key"), "{c}"),
        other => panic!("want Corrupt (last key), got {other:?}"),
    };
    corrupt(t.get(&mut s, &key(0)).map(|_| ()));
    corrupt(t.scan(&mut s, Key::MIN, Key::MAX, |_, _| Ok(true)));
    corrupt(t.delete(&mut s, &key(1)).map(|_| ()));
    // Its right sibling, in range, still reads.
    assert!(t.get(&mut s, &next_first).expect("sibling").is_some());
}

/// Found by the image fuzz (a panic, "slab key inserted twice"): damaged space maps that call
/// a live node's blocks free handed them to a new node. Now a corruption error, and the live
/// node is left as it was.
#[test]
fn a_new_node_on_a_live_node_is_corruption_not_a_panic() {
    let mut s = store(16384, 1 << 12);
    let bpn = s.blocks_per_node();
    let live = Tree::create(&mut s, 1).expect("create").root.block;
    // The damage: the allocator believes the live node's blocks free, and hands them out
    // next (the rest is taken).
    while s.alloc.alloc(1, 1, crate::space::Kind::Meta).is_some() {}
    s.alloc.free(live, bpn, true).expect("free");
    let e = Tree::create(&mut s, 2).expect_err("a node over a live one");
    assert!(matches!(e, crate::Error::Corrupt(_)), "{e}");
    assert_eq!(s.node(live).owner, 1, "the live node is untouched");
    assert!(
        s.damage.first().is_some_and(|f| f.contains("free space")),
        "recorded as damage"
    );
}
