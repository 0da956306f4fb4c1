//! `cargo bench -p idxfs-engine --bench alloc`: seed 004 in the allocator. How long finding
//! space takes as the device grows to thousands of block groups, against the linear search
//! from the cursor the allocator used before (rebuilt here as the baseline), in one run on the
//! same allocator states.
//!
//! The state is the one that made the linear search long: most groups full of data, the
//! metadata groups near the end, and the metadata cursor moved back by a commit into a group
//! that is full again (`Allocator::commit_done` moves it to the lowest released block). The
//! linear search then looks at every full group in between on the next allocation; the
//! indexed one never sees a full group.
use idxfs_engine::counters::Counters;
use idxfs_engine::space::alloc::{find_run, Allocator, Group};
use idxfs_engine::space::Kind;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

/// The search the allocator did before seed 004 (commit 2fe2970): every group from the
/// cursor's, circularly, first those of the kind (or unclaimed), then any.
fn linear_find(a: &Allocator, min: u64, max: u64, kind: Kind) -> Option<(u64, u64)> {
    let groups: &[Group] = &a.groups;
    let n = groups.len();
    let cur = a.cursor(kind);
    let first = a.group_of(cur).min(n.saturating_sub(1));
    for pass in 0..2 {
        for step in 0..=n {
            let gi = (first + step) % n;
            let g = &groups[gi];
            let ok_kind = g.flags == 0 || g.flags & kind as u64 != 0;
            if (pass == 0 && !ok_kind) || g.len - g.busy_count < min {
                continue;
            }
            let from = if step == 0 && cur >= g.start {
                cur - g.start
            } else {
                0
            };
            if let Some((s, len)) = find_run(&g.busy, from, min, max) {
                return Some((g.start + s, len));
            }
            if step == 0 && from > 0 {
                if let Some((s, len)) = find_run(&g.busy, 0, min, max) {
                    return Some((g.start + s, len));
                }
            }
        }
    }
    None
}

/// `groups` groups of `gb` blocks: all but the last 4 full of data, one metadata block freed
/// and committed in group 0 (so the metadata cursor sits there), and that block taken again.
fn aged(groups: u64, gb: u64) -> Allocator {
    let mut a = Allocator::new(groups * gb, gb, Arc::new(Counters::default()));
    let (m, _) = a.alloc(1, 1, Kind::Meta).expect("meta");
    while a
        .find(1, gb, Kind::Data)
        .is_some_and(|(s, _)| a.group_of(s) < groups as usize - 4)
    {
        a.alloc(1, gb, Kind::Data);
    }
    // Fill the rest of group 0 with metadata, then free one block there and commit.
    while a
        .find(1, 1, Kind::Meta)
        .is_some_and(|(s, _)| a.group_of(s) == 0)
    {
        a.alloc(1, 1, Kind::Meta);
    }
    a.free(m, 1, false).expect("free");
    a.start_commit();
    a.commit_done();
    assert_eq!(
        a.alloc(1, 1, Kind::Meta),
        Some((m, 1)),
        "the released block first"
    );
    a
}

fn ns_per(iters: u32, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed().as_nanos() as f64 / iters as f64
}

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let gb = 16384; // a 16 KiB node's group: 64 MiB
    println!("== seed 004: find space for one metadata block (ns per search, same states) ==");
    println!(
        "{:>8} {:>12} {:>12} {:>8}",
        "groups", "linear", "indexed", "ratio"
    );
    let sizes: &[u64] = if quick {
        &[64, 512]
    } else {
        &[64, 512, 3500, 8192]
    };
    for &groups in sizes {
        let a = aged(groups, gb);
        let want = linear_find(&a, 1, 1, Kind::Meta);
        assert_eq!(
            a.find(1, 1, Kind::Meta),
            want,
            "both searches pick the same run"
        );
        let iters = if quick { 100 } else { 2000 };
        let lin = ns_per(iters, || {
            black_box(linear_find(black_box(&a), 1, 1, Kind::Meta));
        });
        let idx = ns_per(iters * 10, || {
            black_box(black_box(&a).find(1, 1, Kind::Meta));
        });
        println!("{groups:>8} {lin:>12.0} {idx:>12.0} {:>7.1}x", lin / idx);
    }
}
