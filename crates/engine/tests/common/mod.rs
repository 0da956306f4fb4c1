#![allow(dead_code)]
pub mod digest;
use idxfs_blockdev::{BlockDevice, MemDevice};
use idxfs_engine::fs::{NameHash, Owner};
use idxfs_engine::{fsck, Fs, MkfsOptions, OpenOptions};
use std::sync::Arc;

pub const ROOT: u64 = 1;
pub const ME: Owner = Owner {
    uid: 1000,
    gid: 1000,
};

pub fn opts() -> OpenOptions {
    OpenOptions {
        commit_interval: None,
        // Reads must not change the state the tests compare (digests include atime).
        atime: idxfs_engine::fs::Atime::NoAtime,
        ..OpenOptions::default()
    }
}

pub fn mem_fs(bytes: u64) -> (Arc<MemDevice>, Fs) {
    let dev = Arc::new(MemDevice::new(bytes));
    Fs::mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    (dev, fs)
}

/// Runs fsck (the committed state, and what an open would make of the fsync log) and panics
/// with every problem listed if the image is not clean.
pub fn assert_clean<D: BlockDevice + 'static>(dev: &Arc<D>) {
    assert_clean_with(dev, idxfs_format::hash::name_hash)
}

pub fn assert_clean_with<D: BlockDevice + 'static>(dev: &Arc<D>, hash: NameHash) {
    let dev: Arc<dyn BlockDevice> = dev.clone();
    let r = fsck::check(&dev, hash, &mut |_| {}).expect("fsck could not read the image");
    assert!(
        r.is_clean(),
        "fsck found {} problems:\n{}",
        r.problems.len(),
        r.problems.join("\n")
    );
}
