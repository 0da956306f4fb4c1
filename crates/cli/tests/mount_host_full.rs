//! The file system holding the image fills up: a sparse image file's writes then get ENOSPC
//! from it. Through the mount: the writes and fsyncs that need the device answer ENOSPC,
//! nothing turns read-only, and once the host has room again the next fsync makes every
//! change durable, the commit that was refused first (`engine::txn`, "A stalled commit").
mod common;
use common::*;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs of `size`, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn new(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir(at).expect("mkdir host");
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .expect("mount tmpfs");
        assert!(st.success(), "mount tmpfs");
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        force_unmount(&self.0);
    }
}

fn fsync(p: &Path) -> std::io::Result<()> {
    std::fs::File::open(p)?.sync_all()
}

#[test]
fn a_full_host_answers_enospc_and_loses_nothing_once_it_has_room() {
    let base = shm_tempdir();
    // Declared first, dropped last: after the mount and its image are gone.
    let host = Tmpfs::new(&base.path().join("host"), "48m");
    // Room the host's user gives back later.
    std::fs::write(host.0.join("filler"), vec![1u8; 16 << 20]).expect("filler");
    let dir = tempfile::tempdir_in(&host.0).expect("tempdir on the host");
    let mut m = Mounted::in_dir(dir, "256M", "", false);
    std::fs::write(m.path("safe"), vec![7u8; 1 << 20]).expect("write");
    fsync(&m.path("safe")).expect("fsync");

    // Fill the host through a file of the mount: ENOSPC, not EIO.
    let mut big = std::fs::File::create(m.path("big")).expect("create");
    let chunk = vec![9u8; 1 << 20];
    let mut written = 0u64;
    let err = loop {
        match big.write_all(&chunk).and_then(|()| big.sync_data()) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
        assert!(written < 64, "the host never filled");
    };
    drop(big);
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");

    // Changes go on; what needs the device answers ENOSPC.
    std::fs::write(m.path("made while full"), b"kept").expect("a small file in memory");
    std::fs::create_dir(m.path("dir")).expect("mkdir while full: not read-only");
    let err = fsync(&m.path("made while full")).expect_err("fsync while the host is full");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");

    // The host has room again: the next fsync writes every change.
    std::fs::remove_file(host.0.join("filler")).expect("free the host");
    fsync(&m.path("made while full")).expect("fsync once there is room");
    std::fs::write(m.path("dir/after"), b"after").expect("write");
    m.unmount();
    m.assert_fsck_clean();
    m.mount("");
    assert_eq!(
        std::fs::read(m.path("safe")).expect("read"),
        vec![7u8; 1 << 20]
    );
    assert_eq!(
        std::fs::read(m.path("made while full")).expect("read"),
        b"kept"
    );
    assert_eq!(std::fs::read(m.path("dir/after")).expect("read"), b"after");
    // The big file keeps what its fsyncs made durable, and reads back whole.
    let got = std::fs::read(m.path("big")).expect("read big");
    assert!(
        got.len() as u64 >= written << 20,
        "{} bytes, {written} MiB fsynced",
        got.len()
    );
    assert!(got.iter().all(|&b| b == 9), "the big file's bytes");
    let md = std::fs::metadata(m.path("big")).expect("stat");
    assert_eq!(md.size(), got.len() as u64);
    m.unmount();
    m.assert_fsck_clean();
}
