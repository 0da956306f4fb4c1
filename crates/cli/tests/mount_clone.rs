//! Copies inside the mount share blocks (issue 25): GNU `cp` of a large file sends one
//! COPY_FILE_RANGE and no WRITE, the copy takes almost no space, reads the same bytes, and
//! either side changes alone; an unaligned copy_file_range copies bytes instead; everything
//! survives a remount, and `fsck --data` is clean.
mod common;
use common::*;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::process::Command;

/// copy_file_range(2) of `len` bytes from `src` to `dst` (made), from offsets `at`, called
/// until all are copied; each call's count.
fn copy_all(
    src: &std::path::Path,
    dst: &std::path::Path,
    at: (i64, i64),
    len: usize,
) -> Vec<usize> {
    let src = std::fs::File::open(src).expect("open");
    let dst = std::fs::File::create(dst).expect("create");
    let (mut off_in, mut off_out) = at;
    let (mut done, mut calls) = (0, Vec::new());
    while done < len {
        // SAFETY: copy_file_range(2) between two open files with valid offset pointers.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut off_in,
                dst.as_raw_fd(),
                &mut off_out,
                len - done,
                0,
            )
        };
        assert!(
            n > 0,
            "copy_file_range: {}",
            std::io::Error::last_os_error()
        );
        done += n as usize;
        calls.push(n as usize);
    }
    calls
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i / 4096) as u8).wrapping_mul(7) ^ (i as u8))
        .collect()
}

#[test]
fn cp_shares_blocks_and_either_side_changes_alone() {
    const SIZE: usize = (256 << 20) + 1234;
    let mut m = Mounted::new("1G", "");
    let data = pattern(SIZE);
    std::fs::write(m.path("big"), &data).expect("write");
    m.unmount();
    m.counters = true;
    m.mount("");
    let before = used_bytes(&m.mp);
    let st = Command::new("cp")
        .arg(m.path("big"))
        .arg(m.path("copy"))
        .status()
        .expect("run cp");
    assert!(st.success(), "cp: {st}");
    let grew = used_bytes(&m.mp) - before;
    assert!(
        grew < 4 << 20,
        "a 256 MiB copy took {grew} bytes (only its extents and sums should)"
    );
    assert!(
        std::fs::read(m.path("copy")).expect("read") == data,
        "copy differs"
    );
    // A change to the copy leaves the source alone, and the other way round.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(m.path("copy"))
        .expect("open");
    f.write_all_at(b"copy changed", 5000).expect("pwrite");
    drop(f);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(m.path("big"))
        .expect("open");
    f.write_all_at(b"source changed", 9000).expect("pwrite");
    drop(f);
    let mut want_copy = data.clone();
    want_copy[5000..5012].copy_from_slice(b"copy changed");
    let mut want_big = data.clone();
    want_big[9000..9014].copy_from_slice(b"source changed");
    // Unaligned: copied byte by byte inside the daemon.
    copy_all(&m.path("big"), &m.path("odd"), (4097, 3), 3 << 20);
    let mut want_odd = vec![0u8; 3];
    want_odd.extend_from_slice(&want_big[4097..4097 + (3 << 20)]);
    for (name, want) in [("big", &want_big), ("copy", &want_copy), ("odd", &want_odd)] {
        assert!(
            std::fs::read(m.path(name)).expect("read") == *want,
            "{name} differs"
        );
    }
    let err = m.unmount();
    assert!(
        Mounted::requests(&err, "copy_file_range") >= 2,
        "cp and the odd copy used copy_file_range: {err}"
    );
    assert!(
        Mounted::requests(&err, "write") <= 4,
        "no data went through WRITE requests but the two pwrites: {err}"
    );
    m.assert_fsck_clean();
    m.mount("");
    for (name, want) in [("big", &want_big), ("copy", &want_copy), ("odd", &want_odd)] {
        assert!(
            std::fs::read(m.path(name)).expect("read") == *want,
            "{name} differs after a remount"
        );
    }
    // Removing both gives the space back.
    std::fs::remove_file(m.path("big")).expect("rm");
    std::fs::remove_file(m.path("copy")).expect("rm");
    std::fs::remove_file(m.path("odd")).expect("rm");
    m.unmount();
    m.assert_fsck_clean();
    m.mount("");
    assert!(
        used_bytes(&m.mp) < before - (200 << 20),
        "the shared blocks were freed with the last file naming them"
    );
    m.unmount();
}

/// A copy_file_range request works for a slice and answers with a short copy (`slices.rs`):
/// with slices of no time (`IDXFS_SLICE_US=0`), one batch (8 MiB) a request, the caller
/// asking again for the rest; `cp` gets the whole file, shared.
#[test]
fn a_copy_answers_a_batch_a_request_when_its_slice_is_up() {
    const SIZE: usize = (24 << 20) + 5000;
    let mut m = Mounted::new("256M", "");
    m.unmount();
    m.env.push(("IDXFS_SLICE_US", "0".into()));
    m.mount("");
    let data = pattern(SIZE);
    std::fs::write(m.path("big"), &data).expect("write");
    let calls = copy_all(&m.path("big"), &m.path("copy"), (0, 0), SIZE);
    assert_eq!(
        calls,
        [8 << 20, 8 << 20, 8 << 20, 5000],
        "one batch a request"
    );
    assert!(
        std::fs::read(m.path("copy")).expect("read") == data,
        "copy differs"
    );
    let st = Command::new("cp")
        .arg(m.path("big"))
        .arg(m.path("cp"))
        .status()
        .expect("run cp");
    assert!(st.success(), "cp: {st}");
    assert!(
        std::fs::read(m.path("cp")).expect("read") == data,
        "cp's copy differs"
    );
    m.unmount();
    m.assert_fsck_clean();
}
