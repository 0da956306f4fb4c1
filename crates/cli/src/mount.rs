//! `idxfs mount` and the ways the system mounts things: `mount -t fuse.idxfs` and fstab go
//! through mount.fuse3, which runs `idxfs SOURCE MOUNTPOINT -o OPTIONS` and expects it to
//! return once the mount is up (so that form serves from a background process).
use idxfs_blockdev::{BlockDevice, FileDevice};
use idxfs_engine::{Fs, OpenOptions};
use idxfs_fuse::{block_shutdown_signals, serve_with, MountConfig, Named};
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

pub struct MountArgs<'a> {
    pub image: &'a Path,
    pub mountpoint: &'a Path,
    /// `-o` lists, in order.
    pub options: &'a [String],
    /// Create (and format) the image at this size when it does not exist.
    pub create: Option<u64>,
    /// Return once mounted, serving from a child process.
    pub background: bool,
}

/// The mount point must be a directory that answers: each way it can fail says what to do.
fn check_mountpoint(mp: &Path) -> Result<(), String> {
    let d = mp.display();
    match std::fs::metadata(mp) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("mount point {d} is not a directory")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "mount point {d} does not exist (make it first: mkdir -p {d})"
        )),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Err(format!(
            "mount point {d} still holds a mount whose server stopped (\"transport endpoint \
             is not connected\"); unmount it first: umount {d}"
        )),
        Err(e) => Err(format!("mount point {d}: {e}")),
    }
}

pub fn mount(a: &MountArgs) -> Result<(), String> {
    no_huge_pages();
    let mut cfg = MountConfig::default();
    for o in a.options {
        cfg.apply(o).map_err(|e| e.to_string())?;
    }
    cfg.check().map_err(|e| e.to_string())?;
    if cfg.remount {
        let source = std::fs::canonicalize(a.image)
            .unwrap_or_else(|_| a.image.to_path_buf())
            .display()
            .to_string();
        return idxfs_fuse::remount::remount(&source, a.mountpoint, &cfg)
            .map_err(|e| format!("remount: {e}"));
    }
    check_mountpoint(a.mountpoint)?;
    if a.create.is_none() && !a.image.exists() {
        let i = a.image.display();
        return Err(format!(
            "{i} does not exist (make it with `idxfs mkfs {i} --size 1G`, or mount with \
             --create --size 1G)"
        ));
    }
    if a.background {
        let log = crate::logging::log_path(a.image);
        let pid = daemonize(|notify| {
            crate::logging::init(a.image, a.mountpoint, Some(&log))?;
            run(a, &cfg, notify)
        })?;
        eprintln!(
            "idxfs: serving {} on {} in the background (pid {pid}); messages go to {}",
            a.image.display(),
            a.mountpoint.display(),
            log.display()
        );
        Ok(())
    } else {
        crate::logging::init(a.image, a.mountpoint, None)?;
        run(a, &cfg, &mut |r| {
            if r.is_ok() {
                eprintln!("idxfs: Ctrl-C or umount to unmount");
            }
        })
    }
}

/// Opens the image and serves it; calls `mounted` with Ok once the mount is usable, or with
/// the error if it never gets there.
fn run(
    a: &MountArgs,
    cfg: &MountConfig,
    mounted: &mut dyn FnMut(Result<(), &str>),
) -> Result<(), String> {
    let r = serve_image(a, cfg, &mut |r| {
        if r.is_ok() {
            log::info!("mounted");
        }
        mounted(r)
    });
    match &r {
        Err(e) => {
            log::error!("{e}");
            mounted(Err(e));
        }
        Ok(()) => log::info!("unmounted; the last changes are committed"),
    }
    r
}

fn serve_image(
    a: &MountArgs,
    cfg: &MountConfig,
    mounted: &mut dyn FnMut(Result<(), &str>),
) -> Result<(), String> {
    // Before any thread exists (opening the engine starts one).
    block_shutdown_signals();
    if let Some(size) = a.create {
        if !a.image.exists() {
            crate::mkfs::mkfs(&crate::mkfs::MkfsArgs {
                image: a.image,
                size: Some(size),
                node_size: idxfs_format::DEFAULT_NODE_SIZE,
                force: false,
            })?;
        }
    }
    // One server per image: a second mount (or an old server still committing after its
    // unmount) would interleave transactions. Held until this process exits.
    let _lock = crate::lock_image(a.image, true, std::time::Duration::from_secs(10))?;
    let read_only = cfg.read_only || cfg.snapshot.is_some();
    let dev =
        FileDevice::open(a.image, !read_only).map_err(|e| format!("{}: {e}", a.image.display()))?;
    let dev: Arc<dyn BlockDevice> = Arc::new(dev);
    let (snapshot, subvolume) = (
        named_id(a.image, &dev, cfg.snapshot.as_ref(), true)?,
        named_id(a.image, &dev, cfg.subvolume.as_ref(), false)?,
    );
    let fs = Fs::open(
        dev,
        OpenOptions {
            read_only,
            snapshot,
            subvolume,
            atime: cfg.atime,
            sync: cfg.sync,
            on_damage: cfg.on_damage,
            discard: cfg.discard,
            datasum: cfg.datasum,
            acl: cfg.acl_here(),
            ..OpenOptions::default()
        },
    )
    .map_err(|e| match (e, snapshot, subvolume) {
        (idxfs_engine::Error::NotFound, Some(id), _) => {
            format!(
                "{}: no snapshot {id} (`idxfs snapshot --list`)",
                a.image.display()
            )
        }
        (idxfs_engine::Error::NotFound, None, Some(id)) => {
            format!(
                "{}: no subvolume {id} (`idxfs subvolume list`)",
                a.image.display()
            )
        }
        (e, _, _) => format!("{}: {e}", a.image.display()),
    })?;
    let source = std::fs::canonicalize(a.image)
        .unwrap_or_else(|_| a.image.to_path_buf())
        .display()
        .to_string();
    let mut once = Some(());
    let import: std::sync::Arc<dyn idxfs_fuse::import::ImportServer> =
        std::sync::Arc::new(crate::import::Sessions::default());
    // A snapshot is read-only for the kernel too.
    let cfg = &MountConfig {
        read_only,
        ..cfg.clone()
    };
    serve_with(fs, &source, a.mountpoint, cfg, Some(import), || {
        if once.take().is_some() {
            mounted(Ok(()));
        }
    })
    .map_err(|e| format!("{}: {e}", a.mountpoint.display()))
}

/// Forks; the child runs `f` and reports through a pipe when the mount is up (or why it failed);
/// the parent waits for that report and returns the child's pid. Called before any thread
/// exists.
fn daemonize(
    f: impl FnOnce(&mut dyn FnMut(Result<(), &str>)) -> Result<(), String>,
) -> Result<i32, String> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: both descriptors were just created and are owned here alone.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the process has one thread here, so the child may run arbitrary code.
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            drop(rd);
            // SAFETY: setsid has no memory effects; detaches from the terminal's session.
            unsafe { libc::setsid() };
            let mut pipe = Some(std::fs::File::from(wr));
            let mut report = |r: Result<(), &str>| {
                if let Some(mut p) = pipe.take() {
                    let msg = match r {
                        Ok(()) => "ok".to_string(),
                        Err(e) => format!("error: {e}"),
                    };
                    let _ = p.write_all(msg.as_bytes());
                    if r.is_ok() {
                        detach_stdio();
                    }
                }
            };
            let code = match f(&mut report) {
                Ok(()) => 0,
                Err(_) => 1,
            };
            std::process::exit(code);
        }
        child => {
            drop(wr);
            let mut msg = String::new();
            std::fs::File::from(rd)
                .read_to_string(&mut msg)
                .map_err(|e| format!("waiting for the mount: {e}"))?;
            match msg.as_str() {
                "ok" => Ok(child),
                "" => Err("the mount process died before mounting".into()),
                m => Err(m.trim_start_matches("error: ").to_string()),
            }
        }
    }
}

/// Points stdin, stdout and stderr at /dev/null: a background server has no terminal.
fn detach_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        use std::os::fd::AsRawFd;
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors, which this process owns.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

/// The daemon's memory in 4 KiB pages, not transparent huge pages. Its heap grows in small
/// steps (node and inode caches, published copies, request buffers), and a huge page is
/// zeroed whole at its first touch: 2 MiB for every fresh region of the allocator, paid
/// inside whichever request grew the heap, while most of it stays unused (docs/benchmarks.md,
/// "apps", for what it saves). A failure leaves the default.
fn no_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and changes only this process's
    // memory policy.
    let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

/// The id of the snapshot (`snapshot`) or writable subvolume a mount option names: a name
/// is looked up in a read-only open of the image (which writes nothing), an id is taken as
/// it is (the open that uses it says whether it exists).
fn named_id(
    image: &Path,
    dev: &Arc<dyn BlockDevice>,
    named: Option<&Named>,
    snapshot: bool,
) -> Result<Option<u64>, String> {
    let name = match named {
        None => return Ok(None),
        Some(Named::Id(id)) => return Ok(Some(*id)),
        Some(Named::Name(n)) => n,
    };
    let p = image.display();
    let o = OpenOptions {
        read_only: true,
        commit_interval: None,
        ..OpenOptions::default()
    };
    let fs = Fs::open(dev.clone(), o).map_err(|e| format!("{p}: {e}"))?;
    let id = match snapshot {
        true => (fs.snapshots().map_err(|e| format!("{p}: {e}"))?)
            .into_iter()
            .find(|s| !s.dropping && s.name == name.as_bytes())
            .map(|s| s.id),
        false => (fs.subvolumes().into_iter())
            .find(|s| s.id != idxfs_format::FS_SUBVOL_ID && s.name == name.as_bytes())
            .map(|s| s.id),
    };
    fs.close().map_err(|e| format!("{p}: {e}"))?;
    id.map(Some).ok_or_else(|| match snapshot {
        true => format!("{p}: no snapshot {name} (`idxfs snapshot --list`)"),
        false => format!("{p}: no subvolume {name} (`idxfs subvolume list`)"),
    })
}
