//! Regression: `df` promised more than fallocate could take. A fallocate of (available -
//! 512 KiB) failed; on 8 GiB it succeeded only with about 32 MiB to spare, because every
//! reservation counted each extent item as a worst-case change anywhere in the tree, and the
//! commit after it as a copy of every block group's items. Now a run of extents costs its
//! bytes, the commit's bound is the space tree's size, and `statfs` subtracts exactly what
//! reservations keep back.
mod common;
use common::*;
use idxfs_engine::caller::as_caller;
use idxfs_engine::Error;

#[test]
fn fallocate_takes_all_that_statfs_says_is_available() {
    for (bytes, ns) in [(256u64 << 20, 16384), (8 << 30, 16384), (64 << 20, 4096)] {
        let (dev, fs) = mem_fs_with(bytes, ns);
        let avail = fs.statfs().expect("statfs").blocks_avail;
        // As an unprivileged caller, whose share statfs reports.
        as_caller(false, || {
            let f = fs.create(ROOT, b"f", 0o644, ME).expect("create");
            fs.fallocate(f.ino, 0, avail * 4096, 0)
                .unwrap_or_else(|e| panic!("{bytes} bytes, {ns} node: fallocate of avail: {e}"));
            let after = fs.statfs().expect("statfs");
            // statfs keeps aside the share data sums take of what is written (0.4%, the
            // `reserve` docs); a fallocate takes none, so that much stays available.
            assert!(
                after.blocks_avail < 64 + avail / 200,
                "{bytes}: {} blocks still available after taking all {avail}",
                after.blocks_avail
            );
            // And the promise is not far below what can really be had: a MiB more fails.
            let g = fs.create(ROOT, b"g", 0o644, ME).expect("create");
            assert!(matches!(
                fs.fallocate(g.ino, 0, (after.blocks_avail + 1) * 4096 + (1 << 20), 0),
                Err(Error::NoSpace)
            ));
        });
        // Root may go on into the root reserve (1% of the device).
        let h = fs.create(ROOT, b"h", 0o644, ME).expect("create as root");
        fs.fallocate(h.ino, 0, bytes / 200, 0)
            .expect("root writes past what an unprivileged caller could");
        fs.close().expect("close");
        assert_clean(&dev);
    }
}

#[test]
fn writes_get_what_statfs_says_is_available() {
    let (dev, fs) = mem_fs_with(256 << 20, 16384);
    let avail = fs.statfs().expect("statfs").blocks_avail * 4096;
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create");
    let chunk = vec![1u8; 1 << 20];
    let mut written = 0u64;
    as_caller(false, || loop {
        match fs.write(f.ino, written, &chunk) {
            Ok(n) => written += n as u64,
            Err(Error::NoSpace) => break,
            Err(e) => panic!("write: {e}"),
        }
    });
    // 1 MiB writes until ENOSPC get all that was promised, less at most one write.
    assert!(
        written + (1 << 20) >= avail,
        "promised {avail}, written {written}"
    );
    fs.close().expect("close");
    assert_clean(&dev);
}

/// Once blocks may be shared (a copy shared some), every reservation also covers the count
/// changes of a freeing batch (`shared_nodes`); `statfs` must leave that out too, or a
/// fallocate or the writes of what it promised fail short.
#[test]
fn promises_hold_once_blocks_are_shared() {
    for ns in [16384u32, 4096] {
        let (dev, fs) = mem_fs_with(256 << 20, ns);
        let a = fs.create(ROOT, b"a", 0o644, ME).expect("create");
        fs.write(a.ino, 0, &vec![7u8; 1 << 20]).expect("write");
        let b = fs.create(ROOT, b"b", 0o644, ME).expect("create");
        let n = fs
            .copy_range(a.ino, 0, b.ino, 0, 1 << 20, Default::default())
            .expect("copy");
        assert_eq!(n, 1 << 20);
        assert_eq!(
            extent_blocks(&fs, a.ino),
            extent_blocks(&fs, b.ino),
            "the copy shares"
        );
        let avail = fs.statfs().expect("statfs").blocks_avail;
        as_caller(false, || {
            let f = fs.create(ROOT, b"f", 0o644, ME).expect("create");
            fs.fallocate(f.ino, 0, avail * 4096, 0)
                .unwrap_or_else(|e| panic!("{ns} node: fallocate of avail {avail}: {e}"));
        });
        fs.unlink(ROOT, b"f").expect("unlink");
        fs.sync().expect("sync");
        let avail = fs.statfs().expect("statfs").blocks_avail * 4096;
        let g = fs.create(ROOT, b"g", 0o644, ME).expect("create");
        let chunk = vec![1u8; 1 << 20];
        let mut written = 0u64;
        as_caller(false, || loop {
            match fs.write(g.ino, written, &chunk) {
                Ok(n) => written += n as u64,
                Err(Error::NoSpace) => break,
                Err(e) => panic!("write: {e}"),
            }
        });
        assert!(
            written + (1 << 20) >= avail,
            "{ns} node: promised {avail}, written {written}"
        );
        fs.close().expect("close");
        assert_clean(&dev);
    }
}
