//! XArray against a `BTreeMap` model: inserts, removes, marks, point and range queries, iteration
//! from arbitrary indices, over dense, sparse and near-u64::MAX key sets. Seeded; the seed is
//! printed and `IDXFS_SEED` replays it.
use idxfs_index::XArray;
use std::collections::BTreeMap;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn seed() -> u64 {
    let s = std::env::var("IDXFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("xarray model: seed {s} (replay with IDXFS_SEED={s})");
    s
}

fn key(rng: &mut Rng, kind: u64) -> u64 {
    match kind {
        0 => rng.below(5000),             // dense
        1 => rng.next() >> rng.below(64), // sparse, every magnitude
        _ => u64::MAX - rng.below(300),   // near the top
    }
}

#[test]
fn model_random_ops() {
    let seed = seed();
    let mut rng = Rng(seed);
    let xa = XArray::<u64>::new();
    let mut model: BTreeMap<u64, (u64, [bool; 3])> = BTreeMap::new();
    for i in 0..150_000 {
        let kind = rng.below(3);
        let k = key(&mut rng, kind);
        match rng.below(12) {
            0..=3 => {
                let v = rng.next() >> 1; // values may not encode to u64::MAX
                let old = xa.insert(k, v);
                let m = model.insert(k, (v, [false; 3]));
                assert_eq!(old, m.map(|x| x.0), "seed {seed} op {i}: insert {k}");
                // Replacing keeps no marks in the model... the XArray keeps marks on replace
                // (as the kernel does), so mirror that.
                if let Some((_, marks)) = m {
                    if let Some(e) = model.get_mut(&k) {
                        e.1 = marks;
                    }
                }
            }
            4..=5 => {
                let k = if rng.below(2) == 0 {
                    model.range(k..).next().map(|(k, _)| *k).unwrap_or(k)
                } else {
                    k
                };
                assert_eq!(
                    xa.remove(k),
                    model.remove(&k).map(|x| x.0),
                    "seed {seed} op {i}: remove {k}"
                );
            }
            6 => {
                let m = rng.below(3) as usize;
                let k = if rng.below(2) == 0 {
                    model.range(k..).next().map(|(k, _)| *k).unwrap_or(k)
                } else {
                    k
                };
                let set = rng.below(2) == 0;
                let r = if set {
                    xa.set_mark(k, m)
                } else {
                    xa.clear_mark(k, m)
                };
                assert_eq!(r, model.contains_key(&k), "seed {seed} op {i}: mark {k}");
                if let Some(e) = model.get_mut(&k) {
                    e.1[m] = set;
                }
            }
            7 => {
                assert_eq!(
                    xa.get(k),
                    model.get(&k).map(|x| x.0),
                    "seed {seed} op {i}: get {k}"
                );
                let m = rng.below(3) as usize;
                assert_eq!(
                    xa.get_mark(k, m),
                    model.get(&k).is_some_and(|x| x.1[m]),
                    "seed {seed} op {i}: get_mark {k}"
                );
            }
            8 => {
                let want = model.range(k..).next().map(|(k, v)| (*k, v.0));
                assert_eq!(
                    xa.next_present(k),
                    want,
                    "seed {seed} op {i}: next_present {k}"
                );
            }
            9 => {
                let m = rng.below(3) as usize;
                let want = model
                    .range(k..)
                    .find(|(_, v)| v.1[m])
                    .map(|(k, v)| (*k, v.0));
                assert_eq!(
                    xa.next_marked(k, m),
                    want,
                    "seed {seed} op {i}: next_marked {k} mark {m}"
                );
            }
            10 => {
                let k2 = key(&mut rng, kind);
                let (lo, hi) = if k <= k2 { (k, k2) } else { (k2, k) };
                let got: Vec<(u64, u64)> = xa.range(lo, hi).take(40).collect();
                let want: Vec<(u64, u64)> = model
                    .range(lo..hi)
                    .take(40)
                    .map(|(k, v)| (*k, v.0))
                    .collect();
                assert_eq!(got, want, "seed {seed} op {i}: range {lo}..{hi}");
            }
            _ => {
                // Entry-style update: double the value, or remove odd ones.
                xa.update(k, |v| v.and_then(|v| (v % 2 == 0).then_some(v / 2)))
                    .expect("update");
                match model.get(&k).map(|x| x.0) {
                    Some(v) if v % 2 == 0 => {
                        if let Some(e) = model.get_mut(&k) {
                            e.0 = v / 2;
                        }
                    }
                    Some(_) => {
                        model.remove(&k);
                    }
                    None => {}
                }
            }
        }
        assert_eq!(xa.len(), model.len(), "seed {seed} op {i}: len");
    }
    let all: Vec<(u64, u64)> = xa.iter().collect();
    let want: Vec<(u64, u64)> = model.iter().map(|(k, v)| (*k, v.0)).collect();
    assert_eq!(all, want, "seed {seed}: full iteration");
    for k in model.keys() {
        assert!(xa.remove(*k).is_some());
    }
    assert!(xa.is_empty());
    assert_eq!(
        xa.memory_bytes(),
        0,
        "seed {seed}: every node freed when empty"
    );
}

#[test]
fn memory_per_entry_at_half_density() {
    let xa = XArray::<u64>::new();
    let n = 1_000_000u64;
    for i in 0..n {
        xa.insert(i * 2, i);
    }
    let per = xa.memory_bytes() as f64 / n as f64;
    eprintln!("bytes per entry at 50% density: {per:.1}");
    assert!(per <= 20.0, "{per:.1} bytes per entry at 50% density");
    for i in 0..n {
        xa.remove(i * 2);
    }
    assert_eq!(xa.memory_bytes(), 0);
}
