//! An ordered map with its first entry cached (the `rb_first_cached` idea of seed 001) and a
//! teardown that frees everything without rebalancing.
//!
//! Design, chosen by measurement (`cargo bench -p idxfs-index`, "seed 001" table): a red-black
//! tree pays a descent for `rb_first`, a rebalance for every erase, and one free per entry
//! (about 7 ns here), so the kernel's `while (first) { erase; free }` loop is dominated by
//! per-entry work however `first` is found. A B-tree stores entries inline, a dozen per node, so
//! it frees per node, not per entry, and `BTreeMap::into_iter` walks and frees the nodes in key
//! order without rebalancing. So the map is a `BTreeMap` plus a copy of its first key (O(1)
//! `first`, no descent), and the take-everything loop is `drain_ordered`, which consumes the
//! tree in order with no rebalancing at all. `pop_first` remains for the callers that must stop
//! early; it costs the B-tree's own O(log n) pop.
use std::collections::BTreeMap;

pub struct FirstMap<K: Ord + Copy, V> {
    map: BTreeMap<K, V>,
    first: Option<K>,
}

impl<K: Ord + Copy, V> Default for FirstMap<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Ord + Copy, V> FirstMap<K, V> {
    pub fn new() -> Self {
        FirstMap {
            map: BTreeMap::new(),
            first: None,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn insert(&mut self, k: K, v: V) -> Option<V> {
        if self.first.is_none_or(|f| k < f) {
            self.first = Some(k);
        }
        self.map.insert(k, v)
    }

    pub fn get(&self, k: &K) -> Option<&V> {
        self.map.get(k)
    }

    pub fn remove(&mut self, k: &K) -> Option<V> {
        let v = self.map.remove(k)?;
        if self.first == Some(*k) {
            self.first = self.map.keys().next().copied();
        }
        Some(v)
    }

    /// The smallest key: O(1), no descent.
    pub fn first_key(&self) -> Option<K> {
        self.first
    }

    pub fn first(&self) -> Option<(&K, &V)> {
        let k = self.first?;
        self.map.get_key_value(&k)
    }

    /// The smallest key at or after `k`: one descent. With [`FirstMap::first_key`] for the
    /// wrap-around, a circular search from `k` costs two lookups however many keys lie
    /// outside the map.
    pub fn next_key_from(&self, k: K) -> Option<K> {
        if self.first.is_some_and(|f| k <= f) {
            return self.first;
        }
        self.map.range(k..).next().map(|(k, _)| *k)
    }

    /// The keys at or after `k`, in order.
    pub fn keys_from(&self, k: K) -> impl Iterator<Item = K> + '_ {
        self.map.range(k..).map(|(k, _)| *k)
    }

    /// Removes and returns the smallest entry.
    pub fn pop_first(&mut self) -> Option<(K, V)> {
        let e = self.map.pop_first()?;
        self.first = self.map.keys().next().copied();
        Some(e)
    }

    /// Consumes every entry in key order (the `while (first) { erase; free }` loop), freeing
    /// nodes as it goes and never rebalancing.
    pub fn drain_ordered(&mut self, mut f: impl FnMut(K, V)) {
        self.first = None;
        for (k, v) in std::mem::take(&mut self.map) {
            f(k, v);
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.map.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn first_is_cached_and_correct() {
        let mut m = FirstMap::new();
        assert_eq!(m.first_key(), None);
        for k in [50u64, 20, 70, 10, 60] {
            m.insert(k, k * 2);
        }
        assert_eq!(m.first(), Some((&10, &20)));
        assert_eq!(m.next_key_from(0), Some(10));
        assert_eq!(m.next_key_from(21), Some(50));
        assert_eq!(m.next_key_from(50), Some(50));
        assert_eq!(m.next_key_from(71), None);
        assert_eq!(m.keys_from(55).collect::<Vec<_>>(), vec![60, 70]);
        assert_eq!(m.remove(&10), Some(20));
        assert_eq!(m.first_key(), Some(20));
        assert_eq!(m.pop_first(), Some((20, 40)));
        assert_eq!(m.first_key(), Some(50));
        let mut order = Vec::new();
        m.drain_ordered(|k, _| order.push(k));
        assert_eq!(order, vec![50, 60, 70]);
        assert!(m.is_empty() && m.first_key().is_none());
    }
}
