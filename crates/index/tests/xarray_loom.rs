//! The XArray's lock-free reads and their reclamation under loom (`RUSTFLAGS="--cfg loom
//! --cfg crossbeam_loom"`, run by scripts/test): every interleaving of a reader with a writer
//! that grows the tree by a level, shrinks it again and drives the epoch's reclamation, and
//! every value the memory model lets each load return. A reader must always find an entry
//! that is never removed, must see another entry whole or not at all, and must never reach
//! a node whose reclamation ran (under loom a reclaimed node is marked and leaked, and every
//! read checks the mark: `Node::check_live`).
#![cfg(loom)]
use crossbeam_epoch as epoch;
use idxfs_index::xarray::LOOM_RECLAIMED;
use idxfs_index::XArray;
use loom::sync::Arc;

/// In the first leaf: always present.
const STAYS: u64 = 5;
/// Past the first leaf: its insert adds a level above it (a new root and a new leaf), and its
/// removal takes both away again, retiring them.
const COMES_AND_GOES: u64 = 70;

#[test]
fn readers_never_miss_an_entry_nor_reach_a_reclaimed_node() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(|| {
        let xa = Arc::new(XArray::<u64>::new());
        xa.insert(STAYS, 1);
        let w = {
            let xa = xa.clone();
            loom::thread::spawn(move || {
                xa.insert(COMES_AND_GOES, 2);
                xa.remove(COMES_AND_GOES);
                // Reclamation runs when the epoch has moved on past every pin: push what this
                // thread retired to the collector and let it try.
                for _ in 0..2 {
                    epoch::pin().flush();
                }
            })
        };
        for _ in 0..2 {
            assert_eq!(
                xa.get(STAYS),
                Some(1),
                "an entry never removed went missing"
            );
            let v = xa.get(COMES_AND_GOES);
            assert!(v.is_none() || v == Some(2), "{v:?}");
        }
        w.join().expect("writer");
        assert_eq!(xa.get(STAYS), Some(1));
        assert_eq!(xa.get(COMES_AND_GOES), None);
    });
    assert!(
        LOOM_RECLAIMED.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no execution reached reclamation: the model tests less than it says"
    );
}
