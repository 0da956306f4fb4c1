//! The sequence count under loom (`RUSTFLAGS="--cfg loom"`, run by scripts/test): every
//! interleaving of a writer and a reader, and every value the memory model lets each load
//! return, checked for a reader that accepts a state no write left.
#![cfg(loom)]
use idxfs_index::SeqCount;
use loom::sync::atomic::{AtomicU64, Ordering::Relaxed};
use loom::sync::Arc;

/// Two fields a write changes together (the engine's: a name and its inode's link count).
struct Shared {
    seq: SeqCount,
    a: AtomicU64,
    b: AtomicU64,
}

#[test]
fn a_reader_accepts_only_states_between_writes() {
    loom::model(|| {
        let s = Arc::new(Shared {
            seq: SeqCount::new(),
            a: AtomicU64::new(0),
            b: AtomicU64::new(0),
        });
        let w = {
            let s = s.clone();
            loom::thread::spawn(move || {
                for v in 1..=2 {
                    s.seq.write(|| {
                        s.a.store(v, Relaxed);
                        s.b.store(v, Relaxed);
                    });
                }
            })
        };
        if let Some((a, b)) = s.seq.read(2, || (s.a.load(Relaxed), s.b.load(Relaxed))) {
            assert_eq!(a, b, "a reader accepted a half-done write");
        }
        w.join().expect("writer");
        // After the writer, a read succeeds and sees its last state.
        assert_eq!(
            s.seq.read(1, || (s.a.load(Relaxed), s.b.load(Relaxed))),
            Some((2, 2))
        );
    });
}
