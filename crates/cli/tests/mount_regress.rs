//! The reproductions of the "No lost bytes" issue, run through a mount with the tools the
//! issue used (dd, ln, rm, fallocate, df's statvfs). Each failed before its fix.
mod common;
use common::*;
use std::fs;
use std::path::Path;
use std::process::Command;

fn sh(cwd: &Path, script: &str) -> (i32, String) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(cwd)
        .output()
        .expect("run sh");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn statvfs(p: &Path) -> libc::statvfs {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL");
    // SAFETY: a valid path and a zeroed struct for the kernel to fill.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st
}

#[test]
fn inline_bytes_survive_a_write_at_10000() {
    let mut m = Mounted::new("256M", "");
    let (code, out) = sh(
        &m.mp,
        "printf 'hello world\\n' > k && dd if=/dev/zero of=k bs=1 count=1 seek=10000 conv=notrunc 2>/dev/null && head -c 12 k",
    );
    assert_eq!((code, out.as_str()), (0, "hello world\n"));
    m.unmount();
    m.assert_fsck_clean();
    m.mount("");
    assert_eq!(
        &fs::read(m.path("k")).expect("read")[..12],
        b"hello world\n"
    );
}

#[test]
fn many_long_hard_links_leave_the_file_system_writable() {
    let mut m = Mounted::new("256M", "");
    fs::write(m.path("f"), b"data").expect("write");
    let long = "x".repeat(244);
    let (code, out) = sh(
        &m.mp,
        &format!("for i in $(seq 100 160); do ln f {long}$i || exit 1; done"),
    );
    assert_eq!(code, 0, "ln: {out}");
    fs::write(m.path("other"), b"still writable").expect("write after the links");
    m.unmount();
    m.assert_fsck_clean();
    m.mount("");
    assert_eq!(fs::metadata(m.path("f")).expect("stat").len(), 4);
    assert_eq!(
        fs::read(m.path(&format!("{long}130"))).expect("read"),
        b"data"
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(fs::metadata(m.path("f")).expect("stat").nlink(), 62);
}

#[test]
fn rm_works_with_space_to_spare_and_on_a_full_device() {
    let mut m = Mounted::new("256M", "");
    let (code, out) = sh(
        &m.mp,
        "dd if=/dev/zero of=big bs=4k count=3072 2>&1 && rm big",
    );
    assert_eq!(code, 0, "dd + rm of 12 MiB: {out}");
    // Full: dd until ENOSPC, then rm gets everything back.
    let free = statvfs(&m.mp).f_bavail;
    let (_, out) = sh(&m.mp, "dd if=/dev/zero of=fill bs=4k 2>&1; sync fill");
    assert!(out.contains("No space left"), "{out}");
    let (code, out) = sh(&m.mp, "rm fill");
    assert_eq!(code, 0, "rm on a full device: {out}");
    m.unmount();
    m.assert_fsck_clean();
    m.mount("");
    let after = statvfs(&m.mp).f_bavail;
    assert!(
        after + 64 >= free,
        "space back: {free} -> {after} blocks available"
    );
}

#[test]
fn fallocate_gets_what_df_says_is_available() {
    let mut m = Mounted::new("256M", "");
    let st = statvfs(&m.mp);
    let avail = st.f_bavail * st.f_frsize;
    let (code, out) = sh(&m.mp, &format!("fallocate -l {avail} all"));
    assert_eq!(code, 0, "fallocate of the available {avail} bytes: {out}");
    m.unmount();
    m.assert_fsck_clean();
}

#[test]
fn long_symlinks_and_large_xattrs() {
    let mut m = Mounted::new("256M", "");
    let target = "t/".repeat(2047) + "x"; // 4095 bytes
    std::os::unix::fs::symlink(&target, m.path("long")).expect("4095-byte symlink");
    assert_eq!(
        fs::read_link(m.path("long"))
            .expect("readlink")
            .as_os_str()
            .len(),
        4095
    );
    let e = std::os::unix::fs::symlink(target.clone() + "y", m.path("too-long"))
        .expect_err("4096 bytes");
    assert_eq!(e.raw_os_error(), Some(libc::ENAMETOOLONG));
    fs::write(m.path("f"), b"").expect("create");
    let value: Vec<u8> = (0..65536u32).map(|i| (i % 253) as u8).collect();
    let c = std::ffi::CString::new(m.path("f").as_os_str().as_encoded_bytes()).expect("c");
    // SAFETY: valid C strings and buffers of the given lengths.
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            c"user.big".as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "65536-byte xattr: {}",
        std::io::Error::last_os_error()
    );
    m.unmount();
    m.assert_fsck_clean();
    m.mount("");
    let mut got = vec![0u8; 70_000];
    // SAFETY: as above.
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            c"user.big".as_ptr(),
            got.as_mut_ptr().cast(),
            got.len(),
        )
    };
    assert_eq!(n, 65536);
    assert!(got[..65536] == value[..]);
    assert_eq!(
        fs::read_link(m.path("long"))
            .expect("readlink")
            .as_os_str()
            .len(),
        4095
    );
}
