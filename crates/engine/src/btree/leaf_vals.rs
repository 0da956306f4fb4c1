//! A leaf's values packed in one buffer, the way they sit in the on-disk node, instead of one
//! heap allocation per item.
//!
//! A directory of a million entries keeps millions of small items (names in two indexes, inode
//! items) in cached leaves. One `Vec` per value cost a 24-byte header plus an allocator block
//! each, and a leaf read from disk paid a few hundred allocations; packed, it pays two, and a
//! cached item costs its bytes plus an 8-byte span.
//!
//! Values are appended; removing or shrinking one leaves its old bytes dead until the dead part
//! outgrows half of the live part, when the buffer is rewritten in item order. So memory stays
//! within 1.5x the live bytes (plus the `Vec`'s growth slack), and the rewrite costs O(1)
//! amortised per byte freed.

/// Where value `i` lives in [`LeafVals::bytes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    off: u32,
    len: u32,
}

/// Dead bytes below this are never worth a rewrite.
const MIN_COMPACT: usize = 512;

#[derive(Debug, Clone)]
pub struct LeafVals {
    bytes: Vec<u8>,
    spans: Vec<Span>,
    /// Bytes of `bytes` that no span covers.
    dead: usize,
}

impl Default for LeafVals {
    fn default() -> Self {
        Self::new()
    }
}

impl LeafVals {
    pub const fn new() -> Self {
        LeafVals {
            bytes: Vec::new(),
            spans: Vec::new(),
            dead: 0,
        }
    }

    /// Room for `items` values of `bytes` bytes in all, as when decoding a node.
    pub fn with_capacity(items: usize, bytes: usize) -> Self {
        LeafVals {
            bytes: Vec::with_capacity(bytes),
            spans: Vec::with_capacity(items),
            dead: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Value `i`. Panics when `i` is out of range, as slice indexing does: callers index by a
    /// position found in the node's key vector, which has the same length.
    pub fn get(&self, i: usize) -> &[u8] {
        let s = self.spans[i];
        &self.bytes[s.off as usize..(s.off + s.len) as usize]
    }

    /// Value `i`, to change in place without changing its length.
    pub fn get_mut(&mut self, i: usize) -> &mut [u8] {
        let s = self.spans[i];
        &mut self.bytes[s.off as usize..(s.off + s.len) as usize]
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &[u8]> + ExactSizeIterator + '_ {
        self.spans
            .iter()
            .map(|s| &self.bytes[s.off as usize..(s.off + s.len) as usize])
    }

    /// Bytes of live values (what the on-disk node holds, without item headers).
    pub fn live_bytes(&self) -> usize {
        self.bytes.len() - self.dead
    }

    fn append_bytes(&mut self, v: &[u8]) -> Span {
        let off = self.bytes.len();
        self.bytes.extend_from_slice(v);
        let span = Span {
            off: u32::try_from(off).expect("leaf values over 4 GiB"),
            len: u32::try_from(v.len()).expect("leaf value over 4 GiB"),
        };
        debug_assert!(span.off.checked_add(span.len).is_some());
        span
    }

    /// Inserts `v` as value `i`, shifting later values up one place.
    pub fn insert(&mut self, i: usize, v: &[u8]) {
        let s = self.append_bytes(v);
        self.spans.insert(i, s);
    }

    pub fn push(&mut self, v: &[u8]) {
        let s = self.append_bytes(v);
        self.spans.push(s);
    }

    /// Removes value `i`, shifting later values down one place.
    pub fn remove(&mut self, i: usize) {
        let s = self.spans.remove(i);
        self.dead += s.len as usize;
        self.maybe_compact();
    }

    /// Replaces value `i` with `v`: in place when it fits, else appended.
    pub fn set(&mut self, i: usize, v: &[u8]) {
        let s = self.spans[i];
        if v.len() <= s.len as usize {
            let start = s.off as usize;
            self.bytes[start..start + v.len()].copy_from_slice(v);
            self.dead += s.len as usize - v.len();
            self.spans[i].len = v.len() as u32;
        } else {
            let n = self.append_bytes(v);
            self.spans[i] = n;
            self.dead += s.len as usize;
        }
        self.maybe_compact();
    }

    /// Moves values `at..` into a new, tightly packed `LeafVals` (a node split).
    pub fn split_off(&mut self, at: usize) -> LeafVals {
        let tail = self.spans.split_off(at);
        let mut right =
            LeafVals::with_capacity(tail.len(), tail.iter().map(|s| s.len as usize).sum());
        for s in &tail {
            right.push(&self.bytes[s.off as usize..(s.off + s.len) as usize]);
            self.dead += s.len as usize;
        }
        self.maybe_compact();
        right
    }

    /// Appends every value of `other` after this node's (a merge).
    pub fn append(&mut self, other: &LeafVals) {
        self.bytes.reserve(other.live_bytes());
        self.spans.reserve(other.len());
        for v in other.iter() {
            self.push(v);
        }
    }

    fn maybe_compact(&mut self) {
        if self.dead >= MIN_COMPACT && self.dead * 2 > self.live_bytes() {
            self.compact();
        }
    }

    /// Rewrites the buffer with only the live values, in item order.
    fn compact(&mut self) {
        let mut bytes = Vec::with_capacity(self.live_bytes());
        for s in &mut self.spans {
            let start = s.off as usize;
            let off = bytes.len();
            bytes.extend_from_slice(&self.bytes[start..start + s.len as usize]);
            s.off = off as u32;
        }
        self.bytes = bytes;
        self.dead = 0;
    }

    /// Checks that spans lie inside the buffer, do not overlap, and that `dead` is what they
    /// leave uncovered (debug builds and tests).
    pub fn assert_invariants(&self) {
        let mut covered: Vec<(u32, u32)> = self.spans.iter().map(|s| (s.off, s.len)).collect();
        covered.sort_unstable();
        let mut end = 0u32;
        let mut live = 0usize;
        for (off, len) in covered {
            assert!(off >= end, "leaf value spans overlap");
            end = off + len;
            live += len as usize;
        }
        assert!(
            end as usize <= self.bytes.len(),
            "leaf value span past the buffer"
        );
        assert_eq!(self.dead, self.bytes.len() - live, "leaf dead-byte count");
    }
}

#[cfg(test)]
mod tests {
    use super::LeafVals;
    use crate::testutil::Rng;

    fn collect(v: &LeafVals) -> Vec<Vec<u8>> {
        v.iter().map(<[u8]>::to_vec).collect()
    }

    /// Every operation against a `Vec<Vec<u8>>` model, with the invariants after each.
    #[test]
    fn matches_model() {
        let (mut rng, seed) = Rng::from_env("leaf_vals matches_model");
        let mut model: Vec<Vec<u8>> = Vec::new();
        let mut v = LeafVals::new();
        let mut compacted = 0;
        for step in 0..20_000u32 {
            let val: Vec<u8> = (0..rng.below(200)).map(|_| step as u8).collect();
            match rng.below(10) {
                0..=3 => {
                    let i = rng.below(model.len() as u64 + 1) as usize;
                    model.insert(i, val.clone());
                    v.insert(i, &val);
                }
                4 | 5 if !model.is_empty() => {
                    let i = rng.below(model.len() as u64) as usize;
                    model.remove(i);
                    v.remove(i);
                }
                6 | 7 if !model.is_empty() => {
                    let i = rng.below(model.len() as u64) as usize;
                    model[i].clone_from(&val);
                    v.set(i, &val);
                }
                8 if !model.is_empty() => {
                    let i = rng.below(model.len() as u64) as usize;
                    if let Some(b) = v.get_mut(i).first_mut() {
                        *b ^= 0xff;
                    }
                    if let Some(b) = model[i].first_mut() {
                        *b ^= 0xff;
                    }
                }
                9 if model.len() > 1 => {
                    let at = rng.below(model.len() as u64) as usize;
                    let mtail = model.split_off(at);
                    let tail = v.split_off(at);
                    tail.assert_invariants();
                    assert_eq!(tail.dead, 0, "seed {seed}: a split-off tail is packed");
                    assert_eq!(collect(&tail), mtail, "seed {seed} step {step}");
                    // Put it back: the merge path.
                    model.extend(mtail);
                    v.append(&tail);
                }
                _ => {}
            }
            if v.dead == 0 {
                compacted += 1;
            }
            v.assert_invariants();
            assert!(
                v.dead < super::MIN_COMPACT || v.dead * 2 <= v.live_bytes(),
                "dead bytes {} over half of live {}",
                v.dead,
                v.live_bytes()
            );
            assert_eq!(v.len(), model.len(), "seed {seed} step {step}");
            assert_eq!(v.live_bytes(), model.iter().map(Vec::len).sum::<usize>());
        }
        assert_eq!(collect(&v), model, "seed {seed}");
        assert!(compacted > 0, "no step left the buffer packed");
    }
}
