//! A failing device through the mount: a refused write gives the fsync that needed it EIO and
//! stops nothing (the next fsync once the device takes writes makes every change durable); a
//! failed flush gives EIO, every change after it EROFS, reads keep working, and the image
//! keeps its last durable state.
use idxfs_blockdev::{FaultDevice, MemDevice};
use idxfs_engine::{fsck, Fs, MkfsOptions, OpenOptions};
use idxfs_fuse::{serve, unmount, MountConfig};
use std::sync::Arc;
use std::time::Duration;

fn mounted(mp: &std::path::Path) -> bool {
    let want = mp.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

#[test]
fn refused_writes_wait_failed_flushes_stop() {
    let dir = tempfile::tempdir_in("/dev/shm").expect("tempdir");
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).expect("mkdir");
    let dev = Arc::new(FaultDevice::new(MemDevice::new(64 << 20)));
    Fs::mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
    let fs = Fs::open(
        dev.clone(),
        OpenOptions {
            commit_interval: None,
            ..OpenOptions::default()
        },
    )
    .expect("open");
    let server = {
        let mp = mp.clone();
        std::thread::spawn(move || serve(fs, "faulty", &mp, &MountConfig::default(), || {}))
    };
    // Unmounts even when an assertion below fails.
    struct Guard(std::path::PathBuf);
    impl Drop for Guard {
        fn drop(&mut self) {
            if mounted(&self.0) {
                let _ = unmount(&self.0);
            }
        }
    }
    let guard = Guard(mp.clone());
    for _ in 0..500 {
        if mounted(&mp) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(mounted(&mp), "mount did not come up");
    std::fs::write(mp.join("safe"), b"committed").expect("write");
    std::fs::File::open(mp.join("safe"))
        .and_then(|f| f.sync_all())
        .expect("fsync");
    // The device starts refusing writes: the fsync that needs them reports EIO.
    dev.fail_writes_after(0);
    std::fs::write(mp.join("kept"), b"made while refused").expect("write is in memory");
    let err = std::fs::File::open(mp.join("kept"))
        .and_then(|f| f.sync_all())
        .expect_err("fsync on a failing device");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    // The file system goes on: changes in memory, reads as ever.
    std::fs::write(mp.join("later"), b"x").expect("write after the refusal");
    assert_eq!(std::fs::read(mp.join("safe")).expect("read"), b"committed");
    let err = std::fs::File::open(mp.join("later"))
        .and_then(|f| f.sync_all())
        .expect_err("fsync while the device still refuses");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    // The device takes writes again: the next fsync writes every change.
    dev.heal();
    std::fs::File::open(mp.join("later"))
        .and_then(|f| f.sync_all())
        .expect("fsync once the device takes writes");
    // Then a failed flush: the device may have lost anything since the last one, so the
    // file system stops (EIO to the fsync, EROFS to changes after it).
    dev.set_fail_flush(true);
    std::fs::write(mp.join("doomed"), b"never durable").expect("write is in memory");
    let err = std::fs::File::open(mp.join("doomed"))
        .and_then(|f| f.sync_all())
        .expect_err("fsync with a failing flush");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let err = std::fs::write(mp.join("after"), b"x").expect_err("write after the failure");
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    // An fsync after the failure reports the failure itself (EIO), as the kernel's file
    // systems do, not EROFS: what the caller wants durable cannot be.
    let err = std::fs::File::open(mp.join("safe"))
        .and_then(|f| f.sync_all())
        .expect_err("fsync after the failure");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    unmount(&mp).expect("unmount");
    drop(guard);
    // The close at the end cannot commit; the server reports it.
    let r = server.join().expect("server thread");
    assert!(
        r.is_ok() || matches!(r, Err(idxfs_fuse::ServeError::Close(_))),
        "{r:?}"
    );
    dev.heal();
    let report = fsck::check(
        &(dev.clone() as std::sync::Arc<dyn idxfs_blockdev::BlockDevice>),
        idxfs_format::hash::name_hash,
        &mut |_| {},
    )
    .expect("fsck reads the image");
    assert!(report.is_clean(), "{:?}", report.problems);
    let fs = Fs::open(dev, OpenOptions::default()).expect("reopen");
    let root = idxfs_format::ROOT_INO;
    assert!(fs.lookup(root, b"safe").is_ok(), "committed file kept");
    for name in [&b"kept"[..], b"later"] {
        let a = fs
            .lookup(root, name)
            .expect("made while refused, then fsynced: kept");
        assert!(a.size > 0);
    }
    // "doomed" may be there or not: what reached a device whose flush failed is unknown.
}
