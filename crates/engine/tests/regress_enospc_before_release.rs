//! Regression: on a full file system, `rm big; dd of=new` through a FUSE mount failed with
//! ENOSPC now and then (CI's hostile-user test, under load). The kernel held the removed
//! file (a lookup count), so the unlink kept it for its holder, and the FORGET that lets go
//! of it comes asynchronously, after the next request may already have been refused. An
//! operation refused for space now waits briefly for a kept inode's release and runs again.
mod common;
use common::*;
use idxfs_engine::Error;

#[test]
fn a_write_refused_for_space_runs_again_once_a_kept_file_is_released() {
    let (dev, fs) = mem_fs(32 << 20);
    let big = fs.create(ROOT, b"big", 0o644, ME).expect("create").ino;
    fs.write(big, 0, &vec![1u8; 4 << 20]).expect("write big");
    let filler = fs.create(ROOT, b"filler", 0o644, ME).expect("create").ino;
    let mut off = 0u64;
    loop {
        match fs.write(filler, off, &[2u8; 65536]) {
            Ok(_) => off += 65536,
            Err(Error::NoSpace) => break,
            Err(e) => panic!("filling: {e}"),
        }
    }
    fs.sync().expect("sync");
    // The kernel's lookup count: the unlink keeps the file for it.
    assert!(fs.pin(big));
    fs.unlink(ROOT, b"big").expect("unlink");
    let new = fs.create(ROOT, b"new", 0o644, ME).expect("create new").ino;
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            // The FORGET, a moment later.
            fs.unpin(big, 1).expect("unpin");
        });
        fs.write(new, 0, &vec![3u8; 1 << 20])
            .expect("1 MiB into the 4 MiB the removed file gives back");
    });
    assert_eq!(
        fs.counters().space_waits_for_release.get(),
        1,
        "the write waited for the release once"
    );
    // A refusal with nothing kept does not wait: the count stays.
    assert!(matches!(
        fs.write(filler, off, &vec![2u8; 8 << 20]),
        Err(Error::NoSpace)
    ));
    assert_eq!(fs.counters().space_waits_for_release.get(), 1);
    assert_eq!(fs.read(new, 0, 1 << 20).expect("read"), vec![3u8; 1 << 20]);
    fs.close().expect("close");
    assert_clean(&dev);
}
