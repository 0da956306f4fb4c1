//! idxfs through a real FUSE mount, driven by ordinary std::fs and libc calls.
mod common;
use common::*;
use std::ffi::CString;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

fn errno_of(r: std::io::Result<impl Sized>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL")
}

#[test]
fn posix_operations_over_io_uring() {
    enable_fuse_uring();
    let err = posix_operations("uring");
    let served = ring_requests(&err);
    assert!(served > 100, "requests went through the rings: {err}");
    assert!(
        err.contains(" 0 malformed, 0 entries registered again"),
        "{err}"
    );
    // As root every ring worker may drop to SCHED_IDLE and back, so each hands off.
    assert!(err.contains(", 0 workers without handoff"), "{err}");
    // READs of the big file came back from the rings' own reply areas, uncopied.
    let in_place = err
        .lines()
        .find_map(|l| {
            l.split(" replies built in place")
                .next()?
                .rsplit(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .unwrap_or_else(|| panic!("no in-place count in {err}"));
    assert!(in_place > 0, "{err}");
}

#[test]
fn posix_operations_over_dev_fuse() {
    let err = posix_operations("nouring");
    assert_eq!(ring_requests(&err), 0, "{err}");
    // The counters also time the handlers: a lookup takes some time in idxfs.
    let lookup = Mounted::handler_us(&err, "lookup");
    assert!(lookup.is_some_and(|us| us > 0.0), "{err}");
}

/// How many requests the daemon's counters (IDXFS_COUNTERS) say came through io_uring.
fn ring_requests(daemon_stderr: &str) -> u64 {
    daemon_stderr
        .lines()
        .find_map(|l| l.strip_prefix("fuse over io_uring: "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no io_uring counters in {daemon_stderr}"))
}

/// Every kind of request, mounted with `opts`; returns the daemon's stderr (with counters).
fn posix_operations(opts: &str) -> String {
    let mut m = Mounted::new("256M", "");
    m.unmount();
    m.counters = true;
    m.mount(opts);
    let line = mounts_line(&m.mp).expect("in /proc/mounts");
    let image = m.image.to_string_lossy().into_owned();
    assert!(
        line.starts_with(&format!("{image} ")) && line.contains(" fuse.idxfs "),
        "source and type in /proc/mounts: {line}"
    );
    // Files: write, read, append, overwrite, truncate.
    let f = m.path("file");
    fs::write(&f, b"hello world").expect("write");
    assert_eq!(fs::read(&f).expect("read"), b"hello world");
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(&f, &big).expect("write big");
    assert_eq!(fs::read(&f).expect("read big"), big);
    // Once more from the daemon: the kernel drops the cached pages, so every read is a READ.
    {
        let h = fs::File::open(&f).expect("open");
        use std::os::fd::AsRawFd;
        // SAFETY: a valid descriptor; no pointers.
        let r = unsafe { libc::posix_fadvise(h.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(r, 0, "fadvise");
    }
    assert_eq!(fs::read(&f).expect("read big again"), big);
    let mut h = fs::OpenOptions::new().write(true).open(&f).expect("open");
    h.seek(SeekFrom::Start(1_000_000)).expect("seek");
    h.write_all(b"XYZ").expect("overwrite");
    h.set_len(2_000_000).expect("truncate");
    drop(h);
    let got = fs::read(&f).expect("read");
    assert_eq!(got.len(), 2_000_000);
    assert_eq!(&got[1_000_000..1_000_003], b"XYZ");
    assert_eq!(got[999_999], big[999_999]);
    // Directories, rename, links, symlinks.
    fs::create_dir_all(m.path("a/b/c")).expect("mkdir -p");
    fs::rename(&f, m.path("a/b/moved")).expect("rename");
    fs::hard_link(m.path("a/b/moved"), m.path("a/link")).expect("link");
    assert_eq!(fs::metadata(m.path("a/link")).expect("stat").nlink(), 2);
    std::os::unix::fs::symlink("b/moved", m.path("a/sym")).expect("symlink");
    assert_eq!(
        fs::read_link(m.path("a/sym")).expect("readlink"),
        Path::new("b/moved")
    );
    assert_eq!(
        fs::read(m.path("a/sym")).expect("through symlink").len(),
        2_000_000
    );
    let mut names: Vec<String> = fs::read_dir(m.path("a"))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["b", "link", "sym"]);
    // Errors as the kernel's file systems give them.
    let long = "x".repeat(256);
    assert_eq!(errno_of(fs::write(m.path(&long), b"")), libc::ENAMETOOLONG);
    fs::write(m.path(&"y".repeat(255)), b"").expect("255-byte name");
    assert_eq!(errno_of(fs::remove_dir(m.path("a/b"))), libc::ENOTEMPTY);
    assert_eq!(errno_of(fs::create_dir(m.path("a"))), libc::EEXIST);
    assert_eq!(errno_of(fs::read(m.path("nope"))), libc::ENOENT);
    // A name that is not UTF-8.
    let odd = m.mp.join(std::ffi::OsStr::from_bytes(b"\xff\xfeodd"));
    fs::write(&odd, b"x").expect("non-utf8 name");
    assert_eq!(fs::read(&odd).expect("read"), b"x");
    // chmod, chown, utimens with nanoseconds.
    let p = m.path("a/link");
    fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).expect("chmod");
    std::os::unix::fs::chown(&p, Some(1234), Some(5678)).expect("chown");
    let times = [
        libc::timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 123_456_789,
        },
        libc::timespec {
            tv_sec: 1_100_000_000,
            tv_nsec: 987_654_321,
        },
    ];
    // SAFETY: a valid path and two timespecs.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, cpath(&p).as_ptr(), times.as_ptr(), 0) };
    assert_eq!(r, 0, "utimensat");
    let md = fs::metadata(&p).expect("stat");
    assert_eq!(md.mode() & 0o7777, 0o640);
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    assert_eq!((md.atime(), md.atime_nsec()), (1_000_000_000, 123_456_789));
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_100_000_000, 987_654_321));
    // mknod: fifo, socket, char and block devices.
    for (name, mode, dev) in [
        ("fifo", libc::S_IFIFO | 0o644, 0),
        ("sock", libc::S_IFSOCK | 0o644, 0),
        ("chr", libc::S_IFCHR | 0o644, libc::makedev(1, 3)),
        ("blk", libc::S_IFBLK | 0o644, libc::makedev(7, 0)),
    ] {
        // SAFETY: a valid path.
        let r = unsafe { libc::mknod(cpath(&m.path(name)).as_ptr(), mode, dev) };
        assert_eq!(r, 0, "mknod {name}: {}", std::io::Error::last_os_error());
        let md = fs::symlink_metadata(m.path(name)).expect("stat");
        assert_eq!(md.mode() & libc::S_IFMT, mode & libc::S_IFMT, "{name}");
        assert_eq!(md.rdev(), dev, "{name}");
    }
    assert!(fs::symlink_metadata(m.path("fifo"))
        .expect("stat")
        .file_type()
        .is_fifo());
    // xattrs.
    let cp = cpath(&p);
    let (k, v) = (c"user.color", b"blue");
    // SAFETY: valid strings and buffers with their lengths.
    unsafe {
        assert_eq!(
            libc::setxattr(cp.as_ptr(), k.as_ptr(), v.as_ptr().cast(), v.len(), 0),
            0
        );
        let mut buf = [0u8; 16];
        let n = libc::getxattr(cp.as_ptr(), k.as_ptr(), buf.as_mut_ptr().cast(), buf.len());
        assert_eq!(&buf[..n as usize], b"blue");
        let n = libc::listxattr(cp.as_ptr(), buf.as_mut_ptr().cast(), buf.len());
        assert_eq!(&buf[..n as usize], b"user.color\0");
        assert_eq!(libc::removexattr(cp.as_ptr(), k.as_ptr()), 0);
        let n = libc::getxattr(cp.as_ptr(), k.as_ptr(), buf.as_mut_ptr().cast(), buf.len());
        assert_eq!((n, *libc::__errno_location()), (-1, libc::ENODATA));
        // POSIX ACLs are on (an allow_other mount): this file has none (mount_acl.rs).
        let acl = c"system.posix_acl_access";
        let n = libc::getxattr(
            cp.as_ptr(),
            acl.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        );
        assert_eq!((n, *libc::__errno_location()), (-1, libc::ENODATA));
    }
    // statfs.
    // SAFETY: a valid path and a zeroed statvfs to fill.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(cpath(&m.mp).as_ptr(), &mut sv) }, 0);
    assert_eq!((sv.f_bsize, sv.f_namemax), (4096, 255));
    assert!(sv.f_bfree > 0 && sv.f_blocks >= sv.f_bfree);
    let err = m.unmount();
    m.assert_fsck_clean();
    err
}

#[test]
fn fallocate_seek_and_unlinked_open_files() {
    use std::os::fd::AsRawFd;
    // `holes`: SEEK_DATA/SEEK_HOLE from the extents (`mount_seek.rs` has the default).
    let mut m = Mounted::new("256M", "holes");
    let p = m.path("sparse");
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .expect("create");
    let fd = f.as_raw_fd();
    // SAFETY: fallocate, lseek and pwrite on our own descriptor and buffers.
    unsafe {
        assert_eq!(libc::fallocate(fd, 0, 0, 1 << 20), 0, "fallocate");
        assert_eq!(f.metadata().expect("stat").len(), 1 << 20);
        assert_eq!(
            libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, 1 << 20, 1 << 20),
            0
        );
        assert_eq!(f.metadata().expect("stat").len(), 1 << 20);
        assert!(f.metadata().expect("stat").blocks() >= (2 << 20) / 512);
        let data = vec![7u8; 1 << 20];
        assert_eq!(
            libc::pwrite(fd, data.as_ptr().cast(), data.len(), 0),
            1 << 20
        );
        assert_eq!(libc::fsync(fd), 0);
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        assert_eq!(libc::fallocate(fd, mode, 65536, 131072), 0, "punch");
        assert_eq!(libc::lseek(fd, 0, libc::SEEK_HOLE), 65536);
        assert_eq!(libc::lseek(fd, 65536, libc::SEEK_DATA), 196608);
    }
    let mut back = Vec::new();
    fs::File::open(&p)
        .expect("open")
        .read_to_end(&mut back)
        .expect("read");
    assert!(back[65536..196608].iter().all(|&b| b == 0));
    assert!(back[..65536].iter().all(|&b| b == 7));
    assert!(back[196608..].iter().all(|&b| b == 7));
    drop(f);
    // A file unlinked while open stays readable and writable until closed.
    let q = m.path("doomed");
    fs::write(&q, vec![5u8; 500_000]).expect("write");
    let mut h = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&q)
        .expect("open");
    fs::remove_file(&q).expect("unlink");
    assert_eq!(errno_of(fs::metadata(&q)), libc::ENOENT);
    h.write_all(b"still here").expect("write after unlink");
    h.seek(SeekFrom::Start(0)).expect("seek");
    let mut got = vec![0u8; 10];
    h.read_exact(&mut got).expect("read after unlink");
    assert_eq!(&got, b"still here");
    assert_eq!(h.metadata().expect("fstat").nlink(), 0);
    drop(h);
    m.unmount();
    m.assert_fsck_clean();
}

#[test]
fn persistence_across_remount_byte_for_byte() {
    persistence("");
}

#[test]
fn persistence_with_writeback_cache() {
    persistence("writeback");
}

fn persistence(opts: &str) {
    let mut m = Mounted::new("512M", opts);
    let mut rng = 0x9e3779b97f4a7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut want = Vec::new();
    for d in 0..8 {
        let dir = m.path(&format!("d{d}"));
        fs::create_dir(&dir).expect("mkdir");
        for i in 0..60 {
            let len = [0usize, 100, 4096, 5000, 70_000, 300_000][(next() % 6) as usize];
            let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let p = dir.join(format!("f{i}"));
            fs::write(&p, &data).expect("write");
            fs::set_permissions(&p, fs::Permissions::from_mode(0o600 + (i % 8) as u32))
                .expect("chmod");
            want.push((p, data));
        }
    }
    std::os::unix::fs::symlink("d0/f0", m.path("link")).expect("symlink");
    let stat = |p: &Path| {
        let md = fs::symlink_metadata(p).expect("stat");
        (
            md.ino(),
            md.mode(),
            md.nlink(),
            md.uid(),
            md.gid(),
            md.size(),
            md.mtime(),
            md.mtime_nsec(),
            md.ctime(),
            md.ctime_nsec(),
        )
    };
    let before: Vec<_> = want.iter().map(|(p, _)| stat(p)).collect();
    m.unmount();
    m.assert_fsck_clean();
    m.mount(opts);
    for ((p, data), st) in want.iter().zip(&before) {
        assert_eq!(&fs::read(p).expect("read"), data, "{}", p.display());
        assert_eq!(&stat(p), st, "metadata of {}", p.display());
    }
    assert_eq!(
        fs::read_link(m.path("link")).expect("readlink"),
        Path::new("d0/f0")
    );
    m.unmount();
}

#[test]
fn sigkill_mid_workload_keeps_everything_fsynced() {
    sigkill_mid_workload("");
}

/// The same with the kernel's writeback cache, where written pages stay in the kernel until
/// fsync (or memory pressure) sends them: an fsync must still leave nothing behind.
#[test]
fn sigkill_mid_workload_keeps_everything_fsynced_with_writeback_cache() {
    sigkill_mid_workload("writeback");
}

fn sigkill_mid_workload(opts: &str) {
    let mut m = Mounted::new("512M", opts);
    let dir = m.path("work");
    fs::create_dir(&dir).expect("mkdir");
    // A writer keeps creating files; every tenth is fsynced and recorded as durable.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let durable = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let writer = {
        let (dir, stop, durable) = (dir.clone(), stop.clone(), durable.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let p = dir.join(format!("f{i}"));
                let data = format!("file {i} ").repeat((i % 50) as usize + 1);
                let Ok(mut f) = fs::File::create(&p) else {
                    break;
                };
                if f.write_all(data.as_bytes()).is_err() {
                    break;
                }
                if i.is_multiple_of(10) {
                    if f.sync_all().is_err() {
                        break;
                    }
                    if let Ok(mut d) = durable.lock() {
                        d.push((p, data));
                    }
                }
                i += 1;
            }
        })
    };
    assert!(
        wait_for(30, || durable.lock().map(|d| d.len() >= 50).unwrap_or(true)),
        "the writer made no progress"
    );
    m.kill();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().expect("writer");
    m.assert_fsck_clean();
    m.mount(opts);
    let durable = durable.lock().expect("lock").clone();
    assert!(durable.len() >= 50);
    for (p, data) in &durable {
        let got = fs::read(p).unwrap_or_else(|e| panic!("{} lost after SIGKILL: {e}", p.display()));
        assert_eq!(got, data.as_bytes(), "{}", p.display());
    }
    m.unmount();
    m.assert_fsck_clean();
}

#[test]
fn read_only_mount_and_full_device() {
    let mut m = Mounted::new("64M", "");
    fs::write(m.path("keep"), b"precious").expect("write");
    // Fill the device: ENOSPC, nothing corrupted, earlier data intact, deletes work. With the
    // writeback cache the error may come from write or only from fsync (or close), as on any
    // file system that caches writes; fsync makes it certain.
    let chunk = vec![1u8; 1 << 20];
    let mut n = 0;
    let write_synced = |p: &Path| -> std::io::Result<()> {
        let mut f = fs::File::create(p)?;
        f.write_all(&chunk)?;
        f.sync_all()
    };
    let err = loop {
        match write_synced(&m.path(&format!("fill{n}"))) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 200, "a 64M device took 200 MiB");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert_eq!(fs::read(m.path("keep")).expect("read"), b"precious");
    for i in 0..n {
        fs::remove_file(m.path(&format!("fill{i}"))).expect("delete when full");
    }
    let _ = fs::remove_file(m.path(&format!("fill{n}")));
    fs::write(m.path("after"), &chunk).expect("space came back");
    m.unmount();
    m.assert_fsck_clean();
    m.mount("ro");
    assert_eq!(fs::read(m.path("keep")).expect("read"), b"precious");
    assert_eq!(errno_of(fs::write(m.path("new"), b"x")), libc::EROFS);
    assert_eq!(errno_of(fs::remove_file(m.path("keep"))), libc::EROFS);
    m.unmount();
    m.assert_fsck_clean();
}

#[test]
fn signals_unmount_and_commit() {
    let mut m = Mounted::new("128M", "");
    fs::write(m.path("f"), b"before the signal").expect("write");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(m.pid() as i32, libc::SIGTERM) };
    assert!(
        wait_for(20, || !is_mounted(&m.mp)),
        "SIGTERM did not unmount"
    );
    m.wait_exit();
    m.assert_fsck_clean();
    m.mount("");
    assert_eq!(fs::read(m.path("f")).expect("read"), b"before the signal");
    m.unmount();
}

/// Creates and unlinks 200 files in a new directory; returns the daemon's GETATTR count.
fn getattrs_for_creates_and_unlinks(m: &mut Mounted, opts: &str) -> u64 {
    m.counters = true;
    m.mount(opts);
    let d = m.path(&format!("d-{}", opts.replace(',', "-")));
    fs::create_dir(&d).expect("mkdir");
    for i in 0..200 {
        fs::File::create(d.join(format!("f{i}"))).expect("create");
    }
    for i in 0..200 {
        fs::remove_file(d.join(format!("f{i}"))).expect("unlink");
    }
    let err = m.unmount();
    Mounted::requests(&err, "getattr")
}

/// A root mount without allow_other admits only root's processes, so idxfs does not ask the
/// kernel to check modes (`MountConfig::kernel_checks_permissions`): root's semantics hold as
/// on ext4, other users are turned away, and a change in a directory is not followed by a
/// GETATTR of it, which `-o default_permissions` brings back.
#[test]
fn a_root_only_mount_keeps_root_semantics_without_kernel_mode_checks() {
    let mut m = Mounted::root_only("256M", "");
    let line = mounts_line(&m.mp).expect("in /proc/mounts");
    assert!(!line.contains("default_permissions"), "{line}");
    assert!(!line.contains("allow_other"), "{line}");
    // Root reads and writes whatever the mode; executes only a file with an x bit.
    let f = m.path("script");
    fs::write(&f, b"#!/bin/sh\nexit 7\n").expect("write");
    fs::set_permissions(&f, fs::Permissions::from_mode(0o000)).expect("chmod 000");
    assert_eq!(
        fs::read(&f).expect("root reads mode 000"),
        b"#!/bin/sh\nexit 7\n"
    );
    fs::OpenOptions::new()
        .append(true)
        .open(&f)
        .expect("root writes mode 000");
    let access = |mask| {
        // SAFETY: a valid C string; access(2) only reads it.
        let r = unsafe { libc::access(cpath(&f).as_ptr(), mask) };
        if r == 0 {
            0
        } else {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
        }
    };
    assert_eq!(access(libc::R_OK | libc::W_OK), 0);
    assert_eq!(access(libc::X_OK), libc::EACCES, "no x bit");
    assert_eq!(
        errno_of(std::process::Command::new(&f).status()),
        libc::EACCES
    );
    fs::set_permissions(&f, fs::Permissions::from_mode(0o100)).expect("chmod 100");
    assert_eq!(access(libc::X_OK), 0);
    let st = std::process::Command::new(&f).status().expect("exec");
    assert_eq!(st.code(), Some(7));
    // Another user is refused by the kernel before idxfs sees a request. The way there is
    // opened to everyone, and stat of the mount point's parent succeeds, so the refusal is
    // the mount's own.
    use std::os::unix::process::CommandExt;
    fs::set_permissions(m.dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod 755");
    let stat_as_nobody = |p: &Path| {
        std::process::Command::new("stat")
            .arg(p)
            .uid(65534)
            .gid(65534)
            .output()
            .expect("run stat as nobody")
    };
    let parent = stat_as_nobody(m.dir.path());
    assert!(
        parent.status.success(),
        "{}",
        String::from_utf8_lossy(&parent.stderr)
    );
    let out = stat_as_nobody(&f);
    assert!(!out.status.success(), "nobody reached a root-only mount");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    m.unmount();
    // Without kernel checks, a change leaves the directory's attributes to their TTL; with
    // them, the next path walk through the directory fetches them again, once per change.
    let without = getattrs_for_creates_and_unlinks(&mut m, "");
    let with = getattrs_for_creates_and_unlinks(&mut m, "default_permissions");
    assert!(without < 50, "{without} GETATTRs for 400 changes");
    assert!(
        with >= 400,
        "{with} GETATTRs for 400 changes with default_permissions"
    );
    m.assert_fsck_clean();
}

/// An access ACL as the kernel passes it: version 2, then (tag, permissions, id) entries.
fn acl_value(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// setxattr(2) of `system.posix_acl_access`: 0 or the errno.
fn set_acl(p: &Path, value: &[u8]) -> i32 {
    let (cp, name) = (cpath(p), c"system.posix_acl_access");
    // SAFETY: valid C strings and a buffer with its length.
    let r = unsafe {
        libc::setxattr(
            cp.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r == 0 {
        0
    } else {
        last_errno()
    }
}

/// Runs `f` in a child process that became nobody: what `f` returns (0 or an errno), or 255
/// when the child could not become nobody.
fn as_nobody(f: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child only makes system calls and leaves by _exit.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let became = libc::setgid(65534) == 0 && libc::setuid(65534) == 0;
            libc::_exit(if became { f() } else { 255 });
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        libc::WEXITSTATUS(status)
    }
}

/// The errno of the last failed call.
fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
}

/// Mounted `noacl`, idxfs keeps no ACLs, but one that says no more than the mode (owner,
/// group, other) is the mode: setting it is a chmod, seen at once by permission checks, stat and exec although the
/// kernel caches attributes for an hour. So `cp -a` copies permissions without its chmod
/// fallback.
#[test]
fn access_acls_that_repeat_the_mode_are_a_chmod() {
    // The kernel is told by a notification, which goes by /dev/fuse in both transports.
    enable_fuse_uring();
    acls_as_mode("uring,noacl");
    acls_as_mode("nouring,noacl");
}

fn acls_as_mode(opts: &str) {
    const ANY: u32 = u32::MAX;
    let (user_obj, user, group_obj, mask, other) = (1u16, 2u16, 4u16, 0x10u16, 0x20u16);
    let mut m = Mounted::new("64M", opts);
    // The way to the files is open to everyone, so a refusal below is the file's own.
    fs::set_permissions(m.dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod 755");
    fs::set_permissions(&m.mp, fs::Permissions::from_mode(0o755)).expect("chmod 755");
    let f = m.path("script");
    fs::write(&f, b"#!/bin/sh\nexit 7\n").expect("write");
    fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).expect("chmod 644");
    let (cp, name) = (cpath(&f), c"system.posix_acl_access");
    // SAFETY (both): a valid C string; the descriptor is closed at once.
    let nobody_reads = || {
        as_nobody(|| unsafe {
            let fd = libc::open(cp.as_ptr(), libc::O_RDONLY);
            if fd < 0 {
                last_errno()
            } else {
                libc::close(fd);
                0
            }
        })
    };
    assert_eq!(nobody_reads(), 0, "0644: the kernel caches a readable mode");
    // Taking the read bit away is seen by the kernel's next check (the daemon does not check
    // reads: the kernel does, with the mode it cached).
    let rw_0_0 = acl_value(&[(user_obj, 6, ANY), (group_obj, 0, ANY), (other, 0, ANY)]);
    assert_eq!(set_acl(&f, &rw_0_0), 0);
    assert_eq!(nobody_reads(), libc::EACCES, "0600 after the ACL");
    let mode = |p: &Path| fs::metadata(p).expect("stat").mode() & 0o7777;
    assert_eq!(mode(&f), 0o600);
    let rwx_rx_rx = acl_value(&[(user_obj, 7, ANY), (group_obj, 5, ANY), (other, 5, ANY)]);
    assert_eq!(set_acl(&f, &rwx_rx_rx), 0);
    let st = std::process::Command::new(&f).status().expect("exec");
    assert_eq!(st.code(), Some(7), "exec right after the ACL gave an x bit");
    assert_eq!(mode(&f), 0o755);
    // With a mask, the group bits are the mask's.
    let masked = acl_value(&[
        (user_obj, 6, ANY),
        (group_obj, 7, ANY),
        (mask, 4, ANY),
        (other, 0, ANY),
    ]);
    assert_eq!(set_acl(&f, &masked), 0);
    assert_eq!(mode(&f), 0o640);
    // An ACL naming another user is not kept, and changes nothing.
    let named = acl_value(&[
        (user_obj, 7, ANY),
        (user, 4, 65534),
        (group_obj, 5, ANY),
        (mask, 5, ANY),
        (other, 5, ANY),
    ]);
    assert_eq!(set_acl(&f, &named), libc::EOPNOTSUPP);
    assert_eq!(mode(&f), 0o640);
    // Removing the ACL leaves the mode, as on a file system whose file has only the mode.
    // SAFETY: valid C strings.
    assert_eq!(unsafe { libc::removexattr(cp.as_ptr(), name.as_ptr()) }, 0);
    assert_eq!(mode(&f), 0o640);
    // Another user may not set it.
    let refused = as_nobody(|| set_acl(&f, &rwx_rx_rx));
    assert_eq!(refused, libc::EPERM, "nobody setting root's ACL");
    assert_eq!(mode(&f), 0o640);
    m.unmount();
    // `cp -a` of files and a set-group-ID directory: the modes arrive, cp reports nothing,
    // and each file costs one SETATTR (its times), not a second for a chmod.
    m.mount(opts);
    let src = m.path("src");
    fs::create_dir(&src).expect("mkdir");
    for i in 0..40 {
        let p = src.join(format!("f{i}"));
        fs::write(&p, b"#!/bin/sh\nexit 3\n").expect("write");
        let mode = if i % 2 == 0 { 0o750 } else { 0o604 };
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).expect("chmod");
    }
    fs::set_permissions(&src, fs::Permissions::from_mode(0o2751)).expect("chmod dir");
    m.unmount();
    m.counters = true;
    m.mount(opts);
    let dst = m.path("dst");
    let out = std::process::Command::new("cp")
        .arg("-a")
        .arg(&src)
        .arg(&dst)
        .output()
        .expect("run cp -a");
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    assert_eq!(mode(&dst), 0o2751);
    for i in 0..40 {
        let p = dst.join(format!("f{i}"));
        assert_eq!(mode(&p), if i % 2 == 0 { 0o750 } else { 0o604 }, "{p:?}");
    }
    let st = std::process::Command::new(dst.join("f0"))
        .status()
        .expect("exec");
    assert_eq!(st.code(), Some(3));
    let err = m.unmount();
    assert_eq!(
        ring_requests(&err) > 0,
        opts.starts_with("uring"),
        "{opts}: {err}"
    );
    let setattrs = Mounted::requests(&err, "setattr");
    assert!(
        setattrs < 50,
        "{setattrs} SETATTR for cp -a of 40 files\n{err}"
    );
    m.assert_fsck_clean();
}
