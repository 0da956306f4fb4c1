//! Regression: a walk of a tree larger than the node cache (`Tree::scan`) came back to an
//! internal node the cache had evicted meanwhile and panicked ("node used before load"). A
//! snapshot opened beside the file system has a small cache of its own, so the mount's
//! `.snapshots` met it first; the file system's own cache met it with a large enough tree.
//!
//! Here every read and change runs with the smallest cache (64 nodes) over a tree of many
//! more: the same state as with the default cache, read and written.
mod common;
use common::digest::digest;
use common::*;
use idxfs_engine::{Fs, OpenOptions};

/// The smallest cache a mount can have: 64 nodes of 4 KiB.
fn tiny() -> OpenOptions {
    OpenOptions {
        cache_bytes: 64 * 4096 * 2,
        ..opts()
    }
}

#[test]
fn a_cache_far_smaller_than_the_tree_reads_and_changes_it_whole() {
    let (dev, fs) = mem_fs_with(64 << 20, 4096);
    // One directory far larger than the cache: its listing walks hundreds of leaves under
    // the same parents; the others are smaller, in a deeper tree.
    let big = fs.mkdir(ROOT, b"big", 0o755, ME).expect("mkdir").ino;
    for i in 0..20_000u64 {
        fs.create(big, format!("entry-{i:08}").as_bytes(), 0o644, ME)
            .expect("create");
    }
    let mut dirs = vec![ROOT];
    for i in 0..3000u64 {
        let parent = dirs[(i % dirs.len() as u64) as usize];
        if i % 100 == 0 {
            dirs.push(
                fs.mkdir(parent, format!("d{i}").as_bytes(), 0o755, ME)
                    .expect("mkdir")
                    .ino,
            );
            continue;
        }
        let f = fs
            .create(
                parent,
                format!("file-with-a-longer-name-{i}").as_bytes(),
                0o644,
                ME,
            )
            .expect("create");
        fs.write(f.ino, 0, &vec![(i % 251) as u8; (i % 7) as usize * 1000])
            .expect("write");
        if i % 3 == 0 {
            fs.setxattr(f.ino, b"user.k", &[b'v'; 200], 0)
                .expect("setxattr");
        }
    }
    let want = digest(&fs);
    fs.close().expect("close");
    let nodes = {
        let fs = Fs::open(dev.clone(), opts()).expect("open");
        fs.with_store(|s, t, _| t.count_nodes(s)).expect("count")
    };
    assert!(
        nodes > 4 * 64,
        "the tree ({nodes} nodes) must dwarf the cache"
    );
    let fs = Fs::open(dev.clone(), tiny()).expect("open with a tiny cache");
    assert_eq!(digest(&fs), want, "read through a tiny cache");
    // Changes through the tiny cache, then read back through a large one.
    for e in fs.list(ROOT).expect("list") {
        if e.name.starts_with(b"file") {
            fs.unlink(ROOT, &e.name).expect("unlink");
        }
    }
    let after = digest(&fs);
    let id = fs.snapshot(b"s").expect("snapshot");
    let view = fs.open_snapshot(id, 64 * 4096 * 2).expect("view");
    assert_eq!(digest(&view), after, "a snapshot read through a tiny cache");
    drop(view);
    fs.close().expect("close");
    assert_clean(&dev);
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    assert_eq!(digest(&fs), after);
    fs.close().expect("close");
}
