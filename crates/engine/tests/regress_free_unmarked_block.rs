//! Regression: freeing a block that the bitmap already calls free (an image whose extents and
//! bitmaps disagree) used to hit an assertion and panic. It must be reported as corruption, and
//! the file system must stop writing.
mod common;
use common::*;
use idxfs_engine::Error;

#[test]
fn truncating_over_blocks_the_bitmap_calls_free_is_corruption_not_a_panic() {
    let (_dev, fs) = mem_fs(32 << 20);
    let a = fs.create(ROOT, b"f", 0o644, ME).expect("create");
    fs.write(a.ino, 0, &vec![9u8; 64 << 10]).expect("write");
    fs.sync().expect("sync");
    // Make the in-memory bitmap disagree with the tree, as a damaged image would: release every
    // data block the allocator holds in groups of data.
    fs.with_store(|s, _, _| {
        let data_groups: Vec<(u64, u64)> = s
            .alloc
            .groups
            .iter()
            .filter(|g| g.flags & 2 != 0)
            .map(|g| (g.start, g.len))
            .collect();
        for (start, len) in data_groups {
            for b in start..start + len {
                if s.alloc.is_used(b) {
                    s.alloc.free(b, 1, true).expect("first free is fine");
                }
            }
        }
    });
    let r = fs.truncate(a.ino, 0);
    assert!(matches!(r, Err(Error::Corrupt(_))), "got {r:?}");
    assert!(
        fs.failure().is_some(),
        "the file system stops writing after corruption"
    );
    assert!(matches!(
        fs.create(ROOT, b"g", 0o644, ME),
        Err(Error::ReadOnly)
    ));
}
