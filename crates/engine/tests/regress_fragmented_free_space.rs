//! Regression: reservations counted free blocks, but a node needs `blocks_per_node` of them in
//! a row. A user who fills the device with one-block files and deletes every other one leaves
//! free space in single blocks; an unlink then found no contiguous room for a node after its
//! first change and stopped the file system. Reservations now take their node slots up front
//! (`Store::node_pool`): an operation gets its nodes or is refused before it changes anything.
mod common;
use common::*;
use idxfs_engine::Error;

#[test]
fn free_space_in_single_blocks_never_stops_the_file_system() {
    let (dev, fs) = mem_fs(64 << 20);
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir").ino;
    let mut n = 0u64;
    loop {
        let r = fs
            .create(d, format!("f{n}").as_bytes(), 0o644, ME)
            .and_then(|a| fs.write(a.ino, 0, &[1u8; 3000]));
        match r {
            Ok(_) => n += 1,
            Err(Error::NoSpace) => break,
            Err(e) => panic!("create {n}: {e}"),
        }
    }
    assert!(n > 10_000, "{n} one-block files");
    for i in (0..n).step_by(2) {
        fs.unlink(d, format!("f{i}").as_bytes())
            .unwrap_or_else(|e| panic!("unlink {i} of a full device: {e}"));
    }
    assert!(fs.failure().is_none());
    // Metadata in single-block holes: refused when no node fits, never stopped.
    let mut m = 0u64;
    let e = loop {
        let name = format!("new-{m:08}-{}", "x".repeat(200));
        match fs.mkdir(ROOT, name.as_bytes(), 0o755, ME) {
            Ok(_) => m += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(e, Error::NoSpace), "{e}");
    assert!(fs.failure().is_none(), "stopped: {:?}", fs.failure());
    // Everything can still be removed, and the space comes back.
    for i in (1..n).step_by(2) {
        fs.unlink(d, format!("f{i}").as_bytes()).expect("unlink");
    }
    for k in 0..m {
        let name = format!("new-{k:08}-{}", "x".repeat(200));
        fs.rmdir(ROOT, name.as_bytes()).expect("rmdir");
    }
    fs.sync().expect("sync");
    assert!(fs.statfs().expect("statfs").blocks_avail > 14_000);
    fs.close().expect("close");
    assert_clean(&dev);
}
