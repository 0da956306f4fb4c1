//! `cargo bench -p idxfs-index`: seeds 000, 001 and 004, every contender in one run, each
//! printed as a ratio to idxfs's structure (the machine is shared: only ratios within one run
//! mean anything). Environment: IDXFS_BENCH_KEYS (default 5,000,000).
use idxfs_index::bgtable::BlockGroupTable;
use idxfs_index::first_map::FirstMap;
use idxfs_index::XArray;
use intrusive_collections::{intrusive_adapter, Bound, KeyAdapter, RBTree, RBTreeLink};
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::hint::black_box;
use std::sync::RwLock;
use std::time::Instant;

// ---------- timing ----------

#[cfg(target_arch = "x86_64")]
fn ticks() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86_64.
    unsafe { core::arch::x86_64::_rdtsc() }
}
#[cfg(not(target_arch = "x86_64"))]
fn ticks() -> u64 {
    use std::sync::OnceLock;
    static T0: OnceLock<Instant> = OnceLock::new();
    T0.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Nanoseconds per tick, measured against the monotonic clock.
fn ns_per_tick() -> f64 {
    let (t0, c0) = (Instant::now(), ticks());
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (t1, c1) = (Instant::now(), ticks());
    (t1 - t0).as_nanos() as f64 / (c1 - c0).max(1) as f64
}

struct Stats {
    count: usize,
    mean: f64,
    median: f64,
    stddev: f64,
    min: f64,
    max: f64,
    p90: f64,
    p95: f64,
    p99: f64,
    samples: Vec<f64>,
}

fn stats(mut v: Vec<f64>) -> Stats {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len().max(1);
    let mean = v.iter().sum::<f64>() / n as f64;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
    let pct = |p: f64| {
        v.get(((n as f64 * p) as usize).min(n - 1))
            .copied()
            .unwrap_or(0.0)
    };
    Stats {
        count: v.len(),
        mean,
        median: pct(0.5),
        stddev: var.sqrt(),
        min: pct(0.0),
        max: v.last().copied().unwrap_or(0.0),
        p90: pct(0.9),
        p95: pct(0.95),
        p99: pct(0.99),
        samples: v,
    }
}

/// The seed's histogram: 10 geometric buckets from min to max (Statistics::Histogram style).
fn print_histogram(s: &Stats) {
    let lo = s.min.max(1.0);
    let hi = s.max.max(lo * 1.0001);
    let ratio = (hi / lo).powf(0.1);
    let mut edges = vec![0.0];
    let mut e = lo;
    for _ in 0..9 {
        e *= ratio;
        edges.push(e);
    }
    edges.push(hi);
    let mut counts = [0usize; 10];
    for &x in &s.samples {
        let b = edges.windows(2).position(|w| x < w[1]).unwrap_or(9);
        counts[b] += 1;
    }
    let top = counts.iter().copied().max().unwrap_or(1).max(1);
    for (i, c) in counts.iter().enumerate() {
        let bar = "#".repeat((c * 53).div_ceil(top).min(53));
        println!(
            "  {:>12.3} - {:>12.3}: {:>8} {}",
            edges[i],
            edges[i + 1],
            c,
            if bar.is_empty() { "|".into() } else { bar }
        );
    }
}

fn print_stats(name: &str, s: &Stats) {
    println!("{name}:");
    println!("  Count: {}", s.count);
    println!(
        "  Range: {:.3} - {:.3}; Mean: {:.3}; Median: {:.3}; Stddev: {:.3}",
        s.min, s.max, s.mean, s.median, s.stddev
    );
    println!(
        "  Percentiles: 90th: {:.3}; 95th: {:.3}; 99th: {:.3}",
        s.p90, s.p95, s.p99
    );
    print_histogram(s);
}

// ---------- contenders ----------

#[derive(Default)]
struct FxHasher(u64);
impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, b: &[u8]) {
        for x in b {
            self.0 = (self.0.rotate_left(5) ^ *x as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// An intrusive red-black tree node, as the kernel embeds `rb_node` in the inode.
struct RbNode {
    link: RBTreeLink,
    key: u64,
    value: u64,
}
intrusive_adapter!(RbAdapter = Box<RbNode>: RbNode { link: RBTreeLink });
impl<'a> KeyAdapter<'a> for RbAdapter {
    type Key = u64;
    fn get_key(&self, n: &'a RbNode) -> u64 {
        n.key
    }
}

/// Dense, mostly increasing keys: inode numbers with occasional gaps and a few out of order.
fn inode_keys(n: usize) -> Vec<u64> {
    let mut keys = Vec::with_capacity(n);
    let mut k = 256u64;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        k += 1 + x.is_multiple_of(16) as u64 * (x % 5);
        keys.push(if x.is_multiple_of(64) {
            k.saturating_sub(x % 200)
        } else {
            k
        });
    }
    keys
}

fn time_inserts(keys: &[u64], tick_ns: f64, mut insert: impl FnMut(u64)) -> (Stats, f64) {
    let mut lat = Vec::with_capacity(keys.len());
    let t = Instant::now();
    for &k in keys {
        let a = ticks();
        insert(k);
        let b = ticks();
        lat.push((b - a) as f64 * tick_ns);
    }
    let total = t.elapsed().as_nanos() as f64 / keys.len() as f64;
    (stats(lat), total)
}

/// Mean ns per insert of a whole batch with no per-op timer (the timer costs about as much as
/// the cheapest inserts).
fn batch_mean(keys: &[u64], mut insert: impl FnMut(u64)) -> f64 {
    let t = Instant::now();
    for &k in keys {
        insert(k);
    }
    t.elapsed().as_nanos() as f64 / keys.len() as f64
}

fn time_lookups(probes: &[u64], mut get: impl FnMut(u64) -> bool) -> f64 {
    let t = Instant::now();
    let mut hits = 0usize;
    for &k in probes {
        hits += get(k) as usize;
    }
    black_box(hits);
    t.elapsed().as_nanos() as f64 / probes.len() as f64
}

fn seed000(n: usize, tick_ns: f64) {
    println!("== seed 000: open inodes keyed by inode number, {n} inserts (ns per insert) ==");
    let keys = inode_keys(n);
    let maxk = keys.iter().copied().max().unwrap_or(0) as usize + 1;
    let mut x = 0x9E37_79B9u64;
    let probes: Vec<u64> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            keys[(x % n as u64) as usize]
        })
        .collect();
    // Timer cost, so per-insert numbers can be read against it.
    let overhead = stats(
        (0..100_000)
            .map(|_| (ticks().wrapping_neg().wrapping_add(ticks())) as f64 * tick_ns)
            .collect(),
    );
    println!(
        "(timer overhead per sample: median {:.1} ns, included in every per-insert figure below)",
        overhead.median
    );

    let mut rows: Vec<(&str, f64, f64, f64, Stats)> = Vec::new();
    let mut batch: Vec<f64> = Vec::new();

    let mut xm = XArray::<u64>::new();
    let (s, total) = time_inserts(&keys, tick_ns, |k| {
        let _ = xm.try_insert_mut(k, k);
    });
    drop(xm);
    let mut xm = XArray::<u64>::new();
    let b_excl = batch_mean(&keys, |k| {
        let _ = xm.try_insert_mut(k, k);
    });
    let guard = crossbeam_epoch::pin();
    let look = time_lookups(&probes, |k| xm.get_in(k, &guard).is_some());
    drop(guard);
    let bytes = xm.memory_bytes() as f64 / xm.len() as f64;
    print_stats("XArray insert (exclusive, &mut)", &s);
    rows.push(("XArray &mut (idxfs)", total, look, bytes, s));
    batch.push(b_excl);
    drop(xm);

    let b_shared = {
        let xa = XArray::<u64>::new();
        batch_mean(&keys, |k| {
            xa.insert(k, k);
        })
    };
    let xa = XArray::<u64>::new();
    let (s, total) = time_inserts(&keys, tick_ns, |k| {
        xa.insert(k, k);
    });
    let guard = crossbeam_epoch::pin();
    let look = time_lookups(&probes, |k| xa.get_in(k, &guard).is_some());
    drop(guard);
    let bytes = xa.memory_bytes() as f64 / xa.len() as f64;
    print_stats("XArray insert (shared, writer lock)", &s);
    rows.push(("XArray shared (idxfs)", total, look, bytes, s));
    batch.push(b_shared);
    drop(xa);

    let mut v: Vec<u64> = vec![u64::MAX; maxk];
    batch.push(batch_mean(&keys, |k| v[k as usize] = k));
    let mut v: Vec<u64> = vec![u64::MAX; maxk];
    let (s, total) = time_inserts(&keys, tick_ns, |k| v[k as usize] = k);
    let look = time_lookups(&probes, |k| v[k as usize] != u64::MAX);
    print_stats("Vec indexed by key insert (floor)", &s);
    rows.push((
        "Vec indexed by key (floor)",
        total,
        look,
        8.0 * maxk as f64 / n as f64,
        s,
    ));
    drop(v);

    let mut bt = BTreeMap::new();
    batch.push(batch_mean(&keys, |k| {
        bt.insert(k, k);
    }));
    let mut bt = BTreeMap::new();
    let (s, total) = time_inserts(&keys, tick_ns, |k| {
        bt.insert(k, k);
    });
    let look = time_lookups(&probes, |k| bt.contains_key(&k));
    print_stats("BTreeMap insert", &s);
    rows.push(("std BTreeMap", total, look, f64::NAN, s));
    drop(bt);

    let mut hm: HashMap<u64, u64, BuildHasherDefault<FxHasher>> = HashMap::default();
    batch.push(batch_mean(&keys, |k| {
        hm.insert(k, k);
    }));
    let mut hm: HashMap<u64, u64, BuildHasherDefault<FxHasher>> = HashMap::default();
    let (s, total) = time_inserts(&keys, tick_ns, |k| {
        hm.insert(k, k);
    });
    let look = time_lookups(&probes, |k| hm.contains_key(&k));
    print_stats("HashMap insert", &s);
    rows.push(("HashMap (fx hash)", total, look, f64::NAN, s));
    drop(hm);

    // Intrusive red-black tree: nodes allocated before timing (the kernel's rb_node lives in the
    // already-allocated inode), so only the tree work is timed.
    let mut nodes: Vec<Box<RbNode>> = keys
        .iter()
        .map(|&k| {
            Box::new(RbNode {
                link: RBTreeLink::new(),
                key: k,
                value: k,
            })
        })
        .collect();
    let mut rb = RBTree::new(RbAdapter::new());
    let mut lat = Vec::with_capacity(n);
    let t = Instant::now();
    while let Some(node) = nodes.pop() {
        let a = ticks();
        let k = node.key;
        // Duplicate keys (the few out-of-order inode numbers) replace, as a map would.
        if rb.find(&k).is_null() {
            rb.insert(node);
        }
        lat.push((ticks() - a) as f64 * tick_ns);
    }
    let total = t.elapsed().as_nanos() as f64 / n as f64;
    let look = time_lookups(&probes, |k| {
        rb.lower_bound(Bound::Included(&k))
            .get()
            .is_some_and(|n| n.key == k && n.value == k)
    });
    let s = stats(lat);
    batch.push(f64::NAN);
    print_stats("red-black tree insert (intrusive)", &s);
    rows.push(("red-black tree (intrusive)", total, look, f64::NAN, s));
    rb.fast_clear();

    let base = (rows[0].1, rows[0].2);
    println!();
    println!(
        "{:<28} {:>9} {:>8} {:>8} {:>8} {:>10} {:>8} {:>9} {:>11} {:>8}",
        "structure",
        "mean ns",
        "median",
        "p99",
        "vs XA",
        "untimed ns",
        "vs XA",
        "lookup ns",
        "lookup vsXA",
        "B/entry"
    );
    for (i, (name, total, look, bytes, s)) in rows.iter().enumerate() {
        let b = batch.get(i).copied().unwrap_or(f64::NAN);
        println!(
            "{:<28} {:>9.1} {:>8.1} {:>8.1} {:>7.2}x {:>10.1} {:>7.2}x {:>9.1} {:>10.2}x {:>8}",
            name,
            total,
            s.median,
            s.p99,
            total / base.0,
            b,
            b / batch[0],
            look,
            look / base.1,
            if bytes.is_nan() {
                "-".to_string()
            } else {
                format!("{bytes:.1}")
            }
        );
    }
    println!("(mean, median, p99: per-insert with an rdtsc pair around each, as the seed measured; untimed: a whole batch / count)");
    println!();
}

fn seed001(n: usize) {
    println!("== seed 001: take every entry in order and free it, {n} entries (ns per entry) ==");
    let mut x = 7u64;
    let keys: Vec<u64> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        })
        .collect();
    let mut results: Vec<(&str, f64)> = Vec::new();

    let mut fm = FirstMap::new();
    for &k in &keys {
        fm.insert(k, [k; 4]);
    }
    let t = Instant::now();
    let mut sum = 0u64;
    fm.drain_ordered(|k, v| sum = sum.wrapping_add(k ^ v[0]));
    results.push((
        "FirstMap::drain_ordered (idxfs)",
        t.elapsed().as_nanos() as f64 / n as f64,
    ));

    let mut fm = FirstMap::new();
    for &k in &keys {
        fm.insert(k, [k; 4]);
    }
    let t = Instant::now();
    while let Some((k, v)) = fm.pop_first() {
        sum = sum.wrapping_add(k ^ v[0]);
    }
    results.push((
        "FirstMap first+pop_first loop",
        t.elapsed().as_nanos() as f64 / n as f64,
    ));

    let mut bt = BTreeMap::new();
    for &k in &keys {
        bt.insert(k, [k; 4]);
    }
    let t = Instant::now();
    while let Some((k, v)) = bt.pop_first() {
        sum = sum.wrapping_add(k ^ v[0]);
    }
    results.push((
        "std BTreeMap pop_first loop",
        t.elapsed().as_nanos() as f64 / n as f64,
    ));

    // The kernel loop: rb_first, erase, free — on an intrusive rb-tree.
    let mut rb = RBTree::new(RbAdapter::new());
    for &k in &keys {
        if rb.find(&k).is_null() {
            rb.insert(Box::new(RbNode {
                link: RBTreeLink::new(),
                key: k,
                value: k,
            }));
        }
    }
    let t = Instant::now();
    loop {
        let mut c = rb.front_mut();
        let Some(node) = c.remove() else { break };
        sum = sum.wrapping_add(node.key ^ node.value);
        drop(node);
    }
    results.push((
        "rb-tree rb_first+erase+free loop",
        t.elapsed().as_nanos() as f64 / n as f64,
    ));
    black_box(sum);
    let base = results[0].1;
    for (name, ns) in &results {
        println!("{name:<34} {ns:>8.2} ns/entry {:>8.2}x", ns / base);
    }
    println!();
}

fn seed004() {
    let groups = 3500u64;
    let shift = 30; // 1 GiB groups, as btrfs data block groups
    println!(
        "== seed 004: find the block group of an offset among {groups} groups (ns per lookup) =="
    );
    let table = BlockGroupTable::new();
    let mut bt = BTreeMap::new();
    let mut sorted = Vec::new();
    let mut direct = Vec::new();
    let mut direct_ptrs: Vec<std::sync::Arc<(u64, u64, u64)>> = Vec::new();
    for i in 0..groups {
        table.insert(i << shift, 1 << shift, i).expect("insert");
        bt.insert(i << shift, (1u64 << shift, i));
        sorted.push((i << shift, 1u64 << shift, i));
        direct.push(i);
        direct_ptrs.push(std::sync::Arc::new((i << shift, 1u64 << shift, i)));
    }
    let locked = RwLock::new(bt.clone());
    let mut x = 3u64;
    let probes: Vec<u64> = (0..2_000_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % (groups << shift)
        })
        .collect();
    let mut rows: Vec<(&str, f64)> = Vec::new();
    let guard = crossbeam_epoch::pin();
    rows.push((
        "BlockGroupTable snapshot (idxfs)",
        time_lookups(&probes, |o| {
            table.lookup(o, &guard).is_some_and(|g| g.data < groups)
        }),
    ));
    drop(guard);
    rows.push((
        "direct table [offset >> shift]",
        time_lookups(&probes, |o| {
            direct
                .get((o >> shift) as usize)
                .is_some_and(|g| *g < groups)
        }),
    ));
    rows.push((
        "direct table of group pointers",
        time_lookups(&probes, |o| {
            direct_ptrs
                .get((o >> shift) as usize)
                .is_some_and(|g| o - g.0 < g.1 && g.2 < groups)
        }),
    ));
    rows.push((
        "sorted array, binary search",
        time_lookups(&probes, |o| {
            let i = sorted.partition_point(|g| g.0 <= o);
            i > 0 && o - sorted[i - 1].0 < sorted[i - 1].1
        }),
    ));
    rows.push((
        "std BTreeMap range",
        time_lookups(&probes, |o| {
            bt.range(..=o)
                .next_back()
                .is_some_and(|(s, (l, _))| o - s < *l)
        }),
    ));
    rows.push((
        "RwLock<BTreeMap> (the kernel's shape)",
        time_lookups(&probes, |o| {
            let g = locked.read().unwrap_or_else(|e| e.into_inner());
            g.range(..=o)
                .next_back()
                .is_some_and(|(s, (l, _))| o - s < *l)
        }),
    ));
    let (base, base_ptr) = (rows[1].1, rows[2].1);
    for (name, ns) in &rows {
        println!(
            "{name:<40} {ns:>7.2} ns {:>7.2}x of the direct table, {:>6.2}x of the pointer table",
            ns / base,
            ns / base_ptr
        );
    }
    // Two readers at once: the snapshot has no shared write; the RwLock bounces its counter.
    let two = |f: &(dyn Fn(u64) -> bool + Sync)| {
        let t = Instant::now();
        std::thread::scope(|s| {
            for part in probes.chunks(probes.len() / 2) {
                s.spawn(move || {
                    let mut h = 0usize;
                    for &o in part {
                        h += f(o) as usize;
                    }
                    black_box(h);
                });
            }
        });
        t.elapsed().as_nanos() as f64 / probes.len() as f64 * 2.0
    };
    let snap2 = two(&|o| {
        let g = crossbeam_epoch::pin();
        table.lookup(o, &g).is_some()
    });
    let lock2 = two(&|o| {
        let g = locked.read().unwrap_or_else(|e| e.into_inner());
        g.range(..=o).next_back().is_some()
    });
    println!("two threads, ns per lookup per thread: snapshot (pin per lookup) {snap2:.2}, RwLock<BTreeMap> {lock2:.2} ({:.2}x)", lock2 / snap2);
    println!();
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` would pass nothing: run small then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::var("IDXFS_BENCH_KEYS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if quick { 20_000 } else { 5_000_000 });
    let tick_ns = ns_per_tick();
    seed000(n, tick_ns);
    seed001(10_000);
    seed001(if quick { 20_000 } else { 1_000_000 });
    seed004();
}
