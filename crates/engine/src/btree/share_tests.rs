//! Model test of trees that share nodes (snapshots, `super::refs`): random changes to several
//! trees made from one another by `Tree::share`, each against a `BTreeMap` of its own, with
//! commits and cache drops so shared nodes round-trip through the device, and trees dropped
//! a few nodes at a time (`Tree::drop_some`) between the other changes.
//!
//! Every item names a data block of its own (the first 8 bytes of its value), counted as the
//! engine counts shared data: a block no count names is named once; a shared leaf copied for
//! one tree adds one to each block its items name; an item deleted, replaced or dropped with
//! its leaf lets go of one, and the last to let go frees it. After every check point:
//! - every tree holds exactly its model's items;
//! - the node counts the store keeps equal the parents a walk of every tree finds;
//! - each data block's count equals the leaves that name it, and no named block is freed.
//!
//! At the end every tree is dropped: every node block and every data block comes back, each
//! exactly once, and no count is left.
use super::*;
use crate::testutil::Rng;
use crate::txn;
use idxfs_format::{ItemType, Key};
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};

type Model = BTreeMap<Key, Vec<u8>>;

/// The test's data blocks, counted lazily as the engine counts shared ones.
#[derive(Default)]
struct Data {
    /// Counts of 2 and more (absent: 1).
    counts: HashMap<u64, u32>,
    /// Every block an item was made with.
    made: HashSet<u64>,
    freed: HashSet<u64>,
    next: u64,
}

impl Data {
    fn value(&mut self, rng: &mut Rng) -> (u64, Vec<u8>) {
        self.next += 1;
        let mut v = self.next.to_le_bytes().to_vec();
        let n = rng.below(70) as usize;
        v.extend(rng.bytes(n));
        (self.next, v)
    }

    fn block_of(v: &[u8]) -> u64 {
        let b: [u8; 8] = v[..8].try_into().expect("values start with their block");
        u64::from_le_bytes(b)
    }

    fn add(&mut self, b: u64) {
        *self.counts.entry(b).or_insert(1) += 1;
    }

    fn release(&mut self, b: u64, why: &str) {
        match self.counts.get_mut(&b) {
            Some(c) => {
                *c -= 1;
                if *c == 1 {
                    self.counts.remove(&b);
                }
            }
            None => assert!(self.freed.insert(b), "{why}: data block {b} freed twice"),
        }
    }

    /// The store's copied shared leaves: both copies name their items' blocks now. Taken
    /// before any release, as the engine must.
    fn take_copied(&mut self, s: &mut Store) {
        for leaf in s.refs.take_copied_leaves() {
            for v in leaf.leaf_vals().iter() {
                self.add(Self::block_of(v));
            }
        }
    }
}

/// 4 KiB nodes, so trees of a few thousand items are three levels deep.
fn store() -> Store {
    super::tests::store(4096, 1 << 16)
}

fn key(rng: &mut Rng) -> Key {
    let obj = rng.below(4);
    let off = if obj < 2 {
        rng.below(2500)
    } else {
        rng.next_u64() >> rng.below(64)
    };
    Key::new(obj, ItemType::Inode, off)
}

/// Every check named in the module docs, over the live trees and those being dropped.
fn check(s: &mut Store, live: &[(Tree, Model)], dying: &[(Tree, Key)], data: &Data, at: &str) {
    let mut found = HashMap::new();
    let mut named: HashMap<u64, u32> = HashMap::new();
    let mut leaf = |n: &Node| {
        for v in n.leaf_vals().iter() {
            *named.entry(Data::block_of(v)).or_insert(0) += 1;
        }
    };
    for (t, model) in live {
        let mut got = Vec::new();
        t.scan(s, Key::MIN, Key::MAX, |k, v| {
            got.push((*k, v.to_vec()));
            Ok(true)
        })
        .expect("scan");
        let want: Vec<(Key, Vec<u8>)> = model.iter().map(|(k, v)| (*k, v.clone())).collect();
        assert!(got == want, "{at}: a tree differs from its model");
        t.count_parents(s, Key::MIN, &mut found, &mut leaf)
            .expect("walk");
    }
    for (t, from) in dying {
        t.count_parents(s, *from, &mut found, &mut leaf)
            .expect("walk");
    }
    let bad = s.refs.check(&found);
    assert!(bad.is_empty(), "{at}: node counts: {bad:?}");
    for (b, n) in &named {
        assert!(
            !data.freed.contains(b),
            "{at}: data block {b} named but freed"
        );
        let kept = data.counts.get(b).copied().unwrap_or(1);
        assert_eq!(kept, *n, "{at}: data block {b} named by {n} leaves");
    }
    for b in data.counts.keys() {
        assert!(
            named.contains_key(b),
            "{at}: data block {b} counted, named by no leaf"
        );
    }
}

/// One drop step of `dying[i]`; true when that tree is gone.
fn drop_step(
    s: &mut Store,
    dying: &mut [(Tree, Key)],
    i: usize,
    budget: usize,
    d: &mut Data,
) -> bool {
    let mut leaves = Vec::new();
    let (t, from) = dying[i];
    let next = t.drop_some(s, from, budget, &mut leaves).expect("drop");
    d.take_copied(s);
    for leaf in leaves {
        for v in leaf.leaf_vals().iter() {
            d.release(Data::block_of(v), "drop");
        }
    }
    match next {
        Some(k) => {
            assert!(
                k > from || from == Key::MIN,
                "a drop step went back: {from} then {k}"
            );
            dying[i].1 = k;
            false
        }
        None => true,
    }
}

fn run(seed: u64, mut rng: Rng) {
    let mut s = store();
    s.refs.track_copied = true;
    let base = s.alloc.used_blocks();
    let mut data = Data::default();
    let first = Tree::create(&mut s, 1).expect("create");
    let mut live: Vec<(Tree, Model)> = vec![(first, Model::new())];
    let mut dying: Vec<(Tree, Key)> = Vec::new();
    let ops = 60_000;
    let (mut max_level, mut partial, mut max_items) = (0, 0, 0);
    let mut hint = LeafHint::default();
    for i in 0..ops {
        max_level = live.iter().map(|(t, _)| t.level).fold(max_level, u8::max);
        max_items = live
            .iter()
            .map(|(_, m)| m.len())
            .fold(max_items, usize::max);
        let at = format!("seed {seed} op {i}");
        // Per mille: shares and drops are rare enough that trees grow three levels deep.
        let r = rng.below(1000);
        if live.is_empty() || (r < 3 && live.len() < 5) {
            // Share a tree (or start a new one when none is left).
            let t = match live.is_empty() {
                true => (Tree::create(&mut s, 1).expect("create"), Model::new()),
                false => {
                    let (t, m) = &live[rng.below(live.len() as u64) as usize];
                    (t.share(&mut s), m.clone())
                }
            };
            live.push(t);
            continue;
        }
        if r < 5 && live.len() > 1 {
            let (t, _) = live.swap_remove(rng.below(live.len() as u64) as usize);
            dying.push((t, Key::MIN));
            continue;
        }
        if r < 60 && !dying.is_empty() {
            let j = rng.below(dying.len() as u64) as usize;
            if drop_step(&mut s, &mut dying, j, rng.below(12) as usize + 1, &mut data) {
                dying.swap_remove(j);
            } else {
                partial += 1;
            }
            continue;
        }
        if r < 70 {
            txn::commit_store(&mut s).expect("commit");
            if rng.chance(50) {
                s.cache.clear();
            }
            continue;
        }
        let ti = rng.below(live.len() as u64) as usize;
        let k = key(&mut rng);
        let (t, model) = &mut live[ti];
        // What the change let go of, released after the copied leaves are counted.
        let mut gone: Vec<Vec<u8>> = Vec::new();
        match r {
            70..=619 => {
                let (_, v) = data.value(&mut rng);
                let res = t.insert(&mut s, k, v.clone());
                match model.entry(k) {
                    Entry::Occupied(_) => {
                        assert!(matches!(res, Err(crate::Error::Exists)), "{at}: insert")
                    }
                    Entry::Vacant(e) => {
                        res.expect("insert");
                        data.made.insert(Data::block_of(&v));
                        e.insert(v);
                    }
                }
            }
            620..=719 => {
                let (b, v) = data.value(&mut rng);
                t.put(&mut s, k, v.clone()).expect("put");
                data.made.insert(b);
                gone.extend(model.insert(k, v));
            }
            720..=799 => {
                let k = if rng.chance(80) {
                    model.range(k..).next().map(|(k, _)| *k).unwrap_or(k)
                } else {
                    k
                };
                let got = t.delete(&mut s, &k).expect("delete");
                let want = model.remove(&k);
                assert_eq!(got, want, "{at}: delete");
                gone.extend(got);
            }
            800..=819 => {
                let b = key(&mut rng);
                let (lo, hi) = if k <= b { (k, b) } else { (b, k) };
                let max = rng.below(12) as usize + 1;
                let got = t.delete_batch(&mut s, lo, hi, max).expect("delete_batch");
                for (gk, gv) in got {
                    assert_eq!(model.remove(&gk).as_ref(), Some(&gv), "{at}: batch");
                    gone.push(gv);
                }
            }
            820..=899 => {
                // Through one hint for every tree: a hint taken in one tree must never put
                // an item into another's leaf, nor into a leaf two trees share.
                // A run of ascending keys, as a directory's creates make.
                let from = rng.below(2500);
                for off in from..from + rng.below(16) + 1 {
                    let (_, v) = data.value(&mut rng);
                    let k = Key::new(1, ItemType::Inode, off);
                    let res = t.insert_near(&mut s, k, v.clone(), &mut hint);
                    match model.entry(k) {
                        Entry::Occupied(_) => {
                            assert_eq!(res.expect("insert_near"), Some(v), "{at}: a key there")
                        }
                        Entry::Vacant(e) => {
                            assert_eq!(res.expect("insert_near"), None, "{at}: insert_near");
                            data.made.insert(Data::block_of(&v));
                            e.insert(v);
                        }
                    }
                    data.take_copied(&mut s);
                }
            }
            _ => {
                assert_eq!(
                    t.get(&mut s, &k).expect("get"),
                    model.get(&k).cloned(),
                    "{at}: get"
                );
            }
        }
        data.take_copied(&mut s);
        for v in gone {
            data.release(Data::block_of(&v), &at);
        }
        if i % 2000 == 1999 {
            check(&mut s, &live, &dying, &data, &at);
        }
    }
    let at = format!("seed {seed} end");
    check(&mut s, &live, &dying, &data, &at);
    // Drop everything: every node and data block comes back, each once.
    dying.extend(live.drain(..).map(|(t, _)| (t, Key::MIN)));
    while !dying.is_empty() {
        let j = rng.below(dying.len() as u64) as usize;
        if drop_step(&mut s, &mut dying, j, rng.below(40) as usize + 1, &mut data) {
            dying.swap_remove(j);
        }
        if rng.chance(5) {
            check(&mut s, &live, &dying, &data, &at);
        }
    }
    txn::commit_store(&mut s).expect("commit");
    assert!(
        s.refs.is_empty(),
        "{at}: node counts left: {:?}",
        s.refs.shared().collect::<Vec<_>>()
    );
    assert!(data.counts.is_empty(), "{at}: data counts left");
    assert_eq!(data.freed, data.made, "{at}: data blocks not freed");
    assert_eq!(s.alloc.used_blocks(), base, "{at}: node blocks leaked");
    assert!(
        s.counters.node_unshares.get() > 0,
        "{at}: no shared node was ever copied"
    );
    eprintln!(
        "{at}: {} shares, {} shared nodes copied, {} levels at most, {max_items} items at most, \
         {} partial drop steps, {} hinted inserts",
        s.counters.tree_shares.get(),
        s.counters.node_unshares.get(),
        max_level,
        partial,
        s.counters.leaf_hint_hits.get()
    );
}

#[test]
fn trees_sharing_nodes_match_their_models_and_give_every_block_back() {
    let (rng, seed) = Rng::from_env("btree trees_sharing_nodes");
    run(seed, rng);
}

/// A snapshot of a tree of three levels, then one change on each side: each copies only its
/// path, and the rest stays shared.
#[test]
fn a_change_after_a_share_copies_only_its_path() {
    let mut s = store();
    let mut a = Tree::create(&mut s, 1).expect("create");
    for i in 0..20_000u64 {
        a.insert(&mut s, Key::new(1, ItemType::Inode, i), vec![0; 40])
            .expect("insert");
    }
    txn::commit_store(&mut s).expect("commit");
    assert!(a.level >= 2, "a tree of three levels");
    let nodes = a.count_nodes(&mut s).expect("count");
    let mut b = a.share(&mut s);
    let used = s.alloc.used_blocks();
    b.put(&mut s, Key::new(1, ItemType::Inode, 7), vec![1; 40])
        .expect("put");
    a.put(&mut s, Key::new(1, ItemType::Inode, 19_000), vec![2; 40])
        .expect("put");
    let path = a.level as u64 + 1;
    // Each side copied its path. The old root was `a`'s alone once `b` had its own copy, so
    // `a`'s copy freed it; every other node of the two paths stays for the other side.
    assert_eq!(
        s.alloc.used_blocks(),
        used + 2 * path - 1,
        "only the two paths were copied"
    );
    assert_eq!(s.counters.node_unshares.get(), 2 * path - 1);
    assert_eq!(
        a.get(&mut s, &Key::new(1, ItemType::Inode, 7))
            .expect("get"),
        Some(vec![0; 40])
    );
    assert_eq!(
        b.get(&mut s, &Key::new(1, ItemType::Inode, 19_000))
            .expect("get"),
        Some(vec![0; 40])
    );
    assert_eq!(b.count_nodes(&mut s).expect("count"), nodes);
}
