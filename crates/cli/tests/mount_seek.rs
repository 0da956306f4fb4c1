//! SEEK_DATA and SEEK_HOLE through the mount, against pages the kernel holds dirty.
//!
//! The server sees a page a shared writable mapping dirtied only when the kernel writes it
//! back, and with the writeback cache a written page only at the file's close or fsync. An
//! lseek answered from the extents called those pages holes, so a sparse copy (GNU cp) of a
//! file another process was writing got zeros for them. By default the kernel answers lseek
//! itself now (`MountConfig::holes`); `-o holes` answers from the extents and is refused
//! beside `-o writeback`.
mod common;
use common::*;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

/// Where SEEK_DATA and SEEK_HOLE from 0 land on a fresh descriptor of `p`.
fn data_and_hole(p: &Path) -> (i64, i64) {
    let f = fs::File::open(p).expect("open");
    // SAFETY: lseek on a descriptor we hold.
    unsafe {
        (
            libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA),
            libc::lseek(f.as_raw_fd(), 0, libc::SEEK_HOLE),
        )
    }
}

/// `cp SRC DST` run by another process, as a user would copy a file someone is writing.
fn cp(src: &Path, dst: &Path) {
    let st = Command::new("cp")
        .arg(src)
        .arg(dst)
        .status()
        .expect("run cp");
    assert!(st.success(), "cp {} failed", src.display());
}

/// A file of `size` bytes, ftruncated (so it has no extents), then written through a shared
/// mapping and not synced: while the mapping lives, only the kernel holds the bytes.
#[test]
fn a_copy_of_a_mapped_file_gets_its_unsynced_pages() {
    let m = Mounted::new("256M", "");
    let p = m.path("mapped");
    let size = 2usize << 20;
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .expect("create");
    f.set_len(size as u64).expect("size");
    // SAFETY: a shared mapping of a file we hold, `size` bytes long, unmapped below; the
    // slice is used only while it is mapped.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED, "mmap");
    // SAFETY: `map` is `size` writable bytes until the munmap below.
    let bytes = unsafe { std::slice::from_raw_parts_mut(map as *mut u8, size) };
    bytes[..4096].fill(b'x');
    bytes[1 << 20..(1 << 20) + 4096].fill(b'y');
    assert_eq!(data_and_hole(&p), (0, size as i64), "the kernel's answer");
    let copy = m.dir.path().join("copy");
    cp(&p, &copy);
    let got = fs::read(&copy).expect("read copy");
    assert_eq!(got.len(), size);
    assert!(got[..4096].iter().all(|&b| b == b'x'), "first page");
    assert!(
        got[1 << 20..(1 << 20) + 4096].iter().all(|&b| b == b'y'),
        "page at 1 MiB"
    );
    // SAFETY: the mapping made above, no longer used.
    assert_eq!(unsafe { libc::munmap(map, size) }, 0);
}

/// With the writeback cache, written pages wait in the kernel until the writer's close.
#[test]
fn a_copy_through_the_writeback_cache_gets_unflushed_writes() {
    let m = Mounted::new("256M", "writeback");
    let p = m.path("written");
    let f = fs::File::create(&p).expect("create");
    f.write_all_at(&[b'a'; 4096], 0).expect("write");
    f.write_all_at(&[b'b'; 4096], 1 << 20).expect("write");
    let size = (1 << 20) + 4096;
    assert_eq!(data_and_hole(&p), (0, size), "the kernel's answer");
    let copy = m.dir.path().join("copy");
    cp(&p, &copy);
    let got = fs::read(&copy).expect("read copy");
    assert_eq!(got.len() as i64, size);
    assert!(got[..4096].iter().all(|&b| b == b'a'), "first block");
    assert!(got[1 << 20..].iter().all(|&b| b == b'b'), "block at 1 MiB");
    drop(f);
}

/// `-o holes` reports holes once the data is the server's; beside `-o writeback`, whose
/// written pages it would call holes, the mount is refused with a message.
#[test]
fn holes_are_reported_when_asked_and_refused_with_writeback() {
    let mut m = Mounted::new("256M", "holes");
    let p = m.path("sparse");
    let f = fs::File::create(&p).expect("create");
    f.write_all_at(&[1; 4096], 1 << 20).expect("write");
    drop(f);
    assert_eq!(data_and_hole(&p), (1 << 20, 0));
    m.unmount();
    let (img, mp) = (
        m.image.to_str().expect("utf8"),
        m.mp.to_str().expect("utf8"),
    );
    let (code, _, err) = idxfs(&["mount", img, mp, "-o", "holes,writeback"]);
    assert_ne!(code, 0, "holes with writeback mounted");
    assert!(
        err.contains("holes and writeback cannot go together"),
        "{err}"
    );
    assert!(!is_mounted(&m.mp));
    m.mount("");
}
