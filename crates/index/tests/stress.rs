//! Readers during writes never see a torn or freed entry: readers run lock-free lookups and
//! iteration while writers insert, replace, remove (growing and shrinking the tree). Every value
//! a writer stores for index i is 7i+1 or 7i+2, so a reader can check any value it sees.
use idxfs_index::XArray;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn ok(i: u64, v: u64) -> bool {
    v == i.wrapping_mul(7).wrapping_add(1) || v == i.wrapping_mul(7).wrapping_add(2)
}

#[test]
fn readers_never_see_torn_or_freed_entries() {
    let xa = Arc::new(XArray::<u64>::new());
    let done = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for r in 0..2u64 {
        let xa = xa.clone();
        let done = done.clone();
        readers.push(std::thread::spawn(move || {
            let mut x = 0x1234_5678u64 + r;
            let mut seen = 0u64;
            while !done.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = if x & 1 == 0 {
                    x % 100_000
                } else {
                    x >> (x % 64)
                };
                if let Some(v) = xa.get(i) {
                    assert!(ok(i, v), "index {i}: torn or wrong value {v}");
                    seen += 1;
                }
                if let Some((j, v)) = xa.next_present(i) {
                    assert!(j >= i && ok(j, v), "next_present({i}) = ({j}, {v})");
                }
            }
            seen
        }));
    }
    let mut x = 99u64;
    for round in 0..400_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = if round % 3 == 0 {
            x >> (x % 64)
        } else {
            x % 100_000
        };
        match x % 5 {
            0 | 1 => {
                xa.insert(i, i.wrapping_mul(7).wrapping_add(1 + (x >> 60) % 2));
            }
            2 => {
                xa.set_mark(i, (x % 3) as usize);
            }
            _ => {
                xa.remove(i);
            }
        }
    }
    done.store(true, Ordering::Relaxed);
    let seen: u64 = readers
        .into_iter()
        .map(|h| h.join().expect("reader panicked"))
        .sum();
    assert!(seen > 0, "readers saw nothing: the test did not test");
}
