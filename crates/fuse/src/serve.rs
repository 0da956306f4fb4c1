//! Running a mount: mount, serve until unmounted or signalled, then commit and close.
use crate::{IdxFuse, MountConfig};
use idxfs_engine::Fs;
use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug)]
pub enum ServeError {
    /// mount(2) or the FUSE handshake failed.
    Mount(io::Error),
    /// The request loop ended with an error.
    Session(io::Error),
    /// The final commit failed: the image keeps its previous committed state.
    Close(idxfs_engine::Error),
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::Mount(e) => write!(f, "mount failed: {e}"),
            ServeError::Session(e) => write!(f, "FUSE session failed: {e}"),
            ServeError::Close(e) => write!(f, "final commit failed: {e}"),
        }
    }
}
impl std::error::Error for ServeError {}

const SHUTDOWN_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn shutdown_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset only write the set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in SHUTDOWN_SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread and every thread it starts later,
/// so they are taken by `serve`'s signal thread and end the mount cleanly. Call it before
/// anything starts a thread (opening the engine does).
pub fn block_shutdown_signals() {
    let set = shutdown_set();
    // SAFETY: the set is initialised; a null old-set pointer is allowed.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Unmounts `mp`: normally, or lazily when it is busy (the kernel then finishes the unmount
/// when the last user lets go, and the session ends after that).
pub fn unmount(mp: &Path) -> io::Result<()> {
    let c = CString::new(mp.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "mount point has a NUL byte"))?;
    // SAFETY: a valid C string; umount2 does not keep the pointer.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // SAFETY: as above.
        Some(libc::EBUSY) if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 => Ok(()),
        Some(libc::EPERM) => {
            // Not root: the setuid helper may unmount what this user mounted.
            let st = std::process::Command::new("fusermount3")
                .arg("-uz")
                .arg(mp)
                .status()?;
            if st.success() {
                Ok(())
            } else {
                Err(io::Error::other(format!("fusermount3 -uz failed: {st}")))
            }
        }
        _ => Err(e),
    }
}

fn spawn_signal_thread(mp: PathBuf) -> io::Result<()> {
    std::thread::Builder::new()
        .name("idxfs-signals".into())
        .spawn(move || {
            let set = shutdown_set();
            loop {
                let mut sig: libc::c_int = 0;
                // SAFETY: the set is initialised and `sig` is ours to write.
                if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                    continue;
                }
                log::info!("signal {sig}: unmounting");
                if let Err(e) = unmount(&mp) {
                    log::warn!("unmount after signal {sig} failed: {e}");
                }
            }
        })?;
    Ok(())
}

/// Opens /dev/fuse and mounts it at `mp` as type fuse.idxfs; returns the connection's fd.
fn mount_fuse(source: &str, mp: &Path, cfg: &MountConfig) -> io::Result<OwnedFd> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let rootmode = std::fs::metadata(mp)?.mode() & libc::S_IFMT;
    let fd: OwnedFd = dev.into();
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = format!(
        "fd={},rootmode={rootmode:o},user_id={uid},group_id={gid}",
        fd.as_raw_fd()
    );
    if cfg.kernel_checks_permissions(uid) {
        data.push_str(",default_permissions");
    }
    if cfg.allow_other {
        data.push_str(",allow_other");
    }
    let cstr = |s: &[u8]| {
        CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte"))
    };
    let (src, target, fstype, data) = (
        cstr(source.as_bytes())?,
        cstr(mp.as_os_str().as_bytes())?,
        cstr(b"fuse.idxfs")?,
        cstr(data.as_bytes())?,
    );
    // SAFETY: valid C strings that outlive the call.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            cfg.kernel_flags(),
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Mounts `fs` at `mountpoint` and serves it until it is unmounted (umount, fusermount3 -u, or
/// SIGINT/SIGTERM/SIGHUP, which unmount it), then commits and closes. `on_mounted` runs once
/// the kernel has completed the FUSE handshake, i.e. when the mount is usable.
pub fn serve(
    fs: Fs,
    source: &str,
    mountpoint: &Path,
    cfg: &MountConfig,
    on_mounted: impl FnOnce(),
) -> Result<(), ServeError> {
    serve_with(fs, source, mountpoint, cfg, None, on_mounted)
}

/// `serve`, taking `idxfs import` requests made by `import` (`import.rs`).
pub fn serve_with(
    fs: Fs,
    source: &str,
    mountpoint: &Path,
    cfg: &MountConfig,
    import: Option<Arc<dyn crate::import::ImportServer>>,
    on_mounted: impl FnOnce(),
) -> Result<(), ServeError> {
    let fs = Arc::new(fs);
    let requests = Arc::new(if std::env::var_os("IDXFS_COUNTERS").is_some() {
        crate::Requests::timed()
    } else {
        crate::Requests::default()
    });
    let want_uring = match cfg.uring {
        Some(false) => false,
        None => crate::uring::kernel_enabled(),
        Some(true) if crate::uring::kernel_enabled() => true,
        Some(true) => {
            return Err(ServeError::Mount(io::Error::other(format!(
                "-o uring: FUSE over io_uring is off in this kernel (write Y to {})",
                crate::uring::PARAM
            ))))
        }
    };
    let resolved;
    let cfg = if want_uring {
        resolved = cfg.beside_uring();
        &resolved
    } else {
        cfg
    };
    let granted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let recent = Arc::new(crate::handoff::Recent::default());
    let fuse = IdxFuse::new(
        fs.clone(),
        cfg,
        requests.clone(),
        want_uring.then(|| granted.clone()),
        want_uring.then(|| recent.clone()),
    )
    .with_import(import);
    let notifier = fuse.notifier_slot();
    let config = cfg.fuser_config(source);
    // SAFETY: geteuid has no preconditions.
    let session = if unsafe { libc::geteuid() } == 0 {
        // As root, mount(2) directly with the type "fuse.idxfs" (fuser would say "fuse"), so
        // /proc/mounts, findmnt -t and umount -t know the file system.
        let fd = mount_fuse(source, mountpoint, cfg).map_err(ServeError::Mount)?;
        match fuser::Session::from_fd(fuse, fd, config.acl, config) {
            Ok(s) => s,
            Err(e) => {
                let _ = unmount(mountpoint);
                return Err(ServeError::Mount(e));
            }
        }
    } else {
        fuser::Session::new(fuse, mountpoint, &config).map_err(ServeError::Mount)?
    };
    // The slot is new and set only here.
    let _ = notifier.set(session.notifier());
    if let Err(e) = spawn_signal_thread(mountpoint.to_path_buf()) {
        let _ = unmount(mountpoint);
        return Err(ServeError::Session(e));
    }
    let uring_stats = Arc::new(crate::uring::Stats::default());
    let ring_fd = if granted.load(std::sync::atomic::Ordering::Relaxed) {
        match session.as_fd().try_clone_to_owned() {
            Ok(fd) => Some(fd),
            Err(e) => {
                let _ = unmount(mountpoint);
                return Err(ServeError::Session(e));
            }
        }
    } else if want_uring {
        log::info!("the kernel did not offer FUSE over io_uring; serving /dev/fuse");
        None
    } else {
        None
    };
    on_mounted();
    let ran = match ring_fd {
        Some(fd) => {
            let stats = uring_stats.clone();
            let handoff = cfg.handoff;
            session.run_with(move |d| Ok(crate::uring::start(fd, d, stats, handoff, recent)))
        }
        None => session.run(),
    };
    if std::env::var_os("IDXFS_COUNTERS").is_some() {
        for (op, n, secs) in requests.snapshot() {
            eprintln!(
                "fuse requests {op}: {n} ({secs:.3} s in idxfs, {:.2} us each)",
                secs * 1e6 / n as f64
            );
        }
        let n = |a: &idxfs_engine::counters::Counter| a.get();
        eprintln!(
            "readdirplus read ahead: {} replies from a batch read ahead, {} batches void (a change came)",
            n(&requests.plus_read_ahead),
            n(&requests.plus_ahead_stale),
        );
        eprintln!(
            "fuse over io_uring: {} requests, {} malformed, {} entries registered again, {} workers without handoff, {} requests served at SCHED_IDLE after a handoff, {} stays at SCHED_IDLE starved (handoffs paused), {} replies built in place, {} requests parked while a thread of their own worked",
            n(&uring_stats.requests),
            n(&uring_stats.malformed),
            n(&uring_stats.reregistered),
            n(&uring_stats.no_handoff),
            n(&uring_stats.served_idle),
            n(&uring_stats.starved),
            n(&uring_stats.in_place),
            n(&uring_stats.parked),
        );
        eprintln!("{}", fs.counters());
    }
    // The session dropped its handle when it ended, so this is normally the last one.
    let closed = match Arc::try_unwrap(fs) {
        Ok(fs) => fs.close(),
        Err(fs) => fs.sync(),
    };
    ran.map_err(ServeError::Session)?;
    closed.map_err(ServeError::Close)
}
