//! The `idxfs` command: mkfs, fsck, mount, dump, demo and bench. Errors print one line and exit
//! non-zero. Also answers as `mkfs.idxfs` and `fsck.idxfs` (mkfs(8), fsck(8)) and in the form
//! mount.fuse3 runs: `idxfs SOURCE MOUNTPOINT [-o OPTIONS]`.
mod bench;
mod bench_acl;
mod bench_apps;
mod bench_concurrency;
mod bench_data;
mod bench_env;
mod bench_hugedir;
mod bench_import;
mod bench_mount;
mod bench_snapshot;
mod bench_suite;
mod cp;
mod import;
mod logging;
mod mkfs;
mod mount;
mod progress_line;
mod rm;
mod snapshot;
mod sync;

/// The engine allocates many small values per operation; mimalloc's size classes avoid glibc's
/// consolidation slow paths, which took about a tenth of a million-file create run.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand, ValueEnum};
use idxfs_blockdev::{BlockDevice, FileDevice};
use idxfs_engine::dump::{dump, Which};
use idxfs_engine::{fsck, Fs};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "idxfs",
    version,
    about = "idxfs: a file system for directories of millions of small files"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum SubvolumeCmd {
    /// Make an empty writable subvolume named NAME (1 to 255 bytes, no '/'); its root
    /// directory is the caller's.
    Create { target: PathBuf, name: String },
    /// Make a writable snapshot named NAME of the tree TARGET serves (an image's active
    /// tree), in constant time, as `btrfs subvolume snapshot`: a writable subvolume that
    /// starts as that tree is now and changes alone; with -r, a read-only snapshot (as
    /// `idxfs snapshot TARGET NAME`).
    Snapshot {
        target: PathBuf,
        name: String,
        /// A read-only snapshot instead.
        #[arg(short = 'r', long = "read-only")]
        read_only: bool,
    },
    /// List the writable subvolumes: id, name, origin, and which one is active.
    List { target: PathBuf },
    /// Delete a writable subvolume (not the active one, nor the file system's own tree) or a
    /// snapshot, by id or name.
    Delete {
        target: PathBuf,
        #[arg(value_name = "ID|NAME")]
        which: String,
    },
}

#[derive(Subcommand)]
enum Cmd {
    /// Format an image file (created if missing) or block device; with --from, fill it with
    /// a copy of a directory tree.
    Mkfs {
        image: PathBuf,
        /// Size for a new image, e.g. 1G, 512M (default 1G, or with --from what the tree
        /// needs; an existing file or device keeps its size).
        #[arg(long, value_parser = parse_size)]
        size: Option<u64>,
        /// Copy this directory's tree into the new file system, through the engine (no
        /// mount): owners, modes, times, xattrs and ACLs, hard links, symlinks, device
        /// nodes and holes kept; its own attributes go to the root.
        #[arg(long, value_name = "DIR")]
        from: Option<PathBuf>,
        /// B+tree node size in bytes (4096 to 65536, a power of two).
        #[arg(long, default_value_t = idxfs_format::DEFAULT_NODE_SIZE)]
        node_size: u32,
        /// Format over a file system or data found on the target, and shrink an image file
        /// to --size (never over a target in use: a mounted image or device).
        #[arg(long, short = 'f')]
        force: bool,
    },
    /// Check an image; exit 0 when clean, 1 when problems were found, 2 when it cannot be read.
    /// With --repair (the image not mounted): rebuild what the damage allows when the check
    /// finds problems (names from either directory index or the back references, nameless
    /// inodes into lost+found, what cannot be saved dropped), then check again; exit 0 when
    /// the result is clean.
    Fsck {
        image: PathBuf,
        #[arg(long)]
        repair: bool,
        /// Also read every file block that has a data checksum and report each that does
        /// not match.
        #[arg(long)]
        data: bool,
    },
    /// Give every free block back to the device (punch holes in an image file, BLKDISCARD
    /// on a block device): what `-o nodiscard` or an older idxfs left allocated. TARGET is an
    /// unmounted image, or a directory on an idxfs mount (its server then does the pass).
    Trim { target: PathBuf },
    /// Copy the tree under DIR into a mounted idxfs as the new directory PATH, made by the
    /// mount's server through its engine instead of file by file through FUSE: what
    /// `mkfs --from` keeps is kept. Only root or the mount's owner may. Durable on return.
    Import {
        dir: PathBuf,
        /// A new directory on an idxfs mount.
        path: PathBuf,
    },
    /// Read-only snapshots and writable clones of them: `idxfs snapshot TARGET NAME` makes a
    /// snapshot (in constant time,
    /// whatever the file system holds) and prints its id; --list lists them; --delete ID|NAME
    /// deletes one (its blocks come back before this returns on an unmounted image, in the
    /// background on a mount); --rollback ID|NAME makes the file system what it holds,
    /// every later change gone, every snapshot kept (an unmounted image only). TARGET: an
    /// unmounted image, or a directory on an idxfs mount (root or the mount's owner only). A
    /// mount shows its snapshots at MOUNT/.snapshots/NAME; `-o snapshot=ID` mounts one alone.
    /// --clone ID|NAME NAME makes a writable subvolume from a snapshot, served writable at
    /// MOUNT/.snapshots/NAME, or alone by a mount of the image with `-o subvol=ID` (5: the
    /// file system's own tree again); --delete deletes one (see `idxfs subvolume`).
    Snapshot {
        target: PathBuf,
        /// The new snapshot's name (1 to 255 bytes, no '/').
        #[arg(required_unless_present_any = ["list", "delete", "rollback"])]
        name: Option<String>,
        /// Make a writable subvolume named NAME from this snapshot (id or name).
        #[arg(long, value_name = "ID|NAME", requires = "name", conflicts_with_all = ["list", "delete", "rollback"])]
        clone: Option<String>,
        #[arg(long, conflicts_with_all = ["name", "delete", "rollback"])]
        list: bool,
        /// The snapshot or clone to delete, by id or name.
        #[arg(long, value_name = "ID|NAME", conflicts_with_all = ["name", "rollback"])]
        delete: Option<String>,
        /// The snapshot to roll back to, by id or name.
        #[arg(long, value_name = "ID|NAME", conflicts_with = "name")]
        rollback: Option<String>,
    },
    /// Writable subvolumes: independent file trees in one image, each with its own inode
    /// numbers. `create TARGET NAME` makes an empty one, `snapshot [-r] TARGET NAME` a
    /// writable (or read-only) snapshot of the tree TARGET serves, `list TARGET` lists them,
    /// `delete TARGET ID|NAME` deletes one (or a snapshot: its blocks come back before this
    /// returns on an unmounted image, in the background on a mount); `idxfs snapshot TARGET
    /// --clone SNAP NAME` makes one from a snapshot, in constant time. A mount serves the
    /// image's active tree (`idxfs mount IMAGE DIR -o subvol=ID|NAME` makes one active; 5:
    /// the file system's own), and every other one with a name writable beside it at
    /// MOUNT/.snapshots/NAME, one made on the mount too.
    /// TARGET: an unmounted image, or a directory on an idxfs mount (root or the mount's
    /// owner only).
    Subvolume {
        #[command(subcommand)]
        what: SubvolumeCmd,
    },
    /// Make every change on the idxfs mount holding PATH durable (sync and sync -f cannot:
    /// FUSE does not pass them on; an fsync of any file on the mount does the same).
    Sync { path: PathBuf },
    /// Copy SRC and everything under it to DST on the same idxfs mount, inside the mount's
    /// server (as `cp -a --reflink`, without a request per file through FUSE): file data
    /// is shared, not copied. Into DST/SRC's name when DST is a directory; an existing
    /// name is refused. Root and the mount's owner keep owners and modes; anyone else
    /// copies as their own `cp -a` would (the copies theirs; what they may not read or
    /// make left out, counted, the first named, exit 1).
    Cp { src: PathBuf, dst: PathBuf },
    /// Remove each PATH on an idxfs mount, and everything under it, inside the mount's
    /// server (as `rm -rf`, without a request per file through FUSE), held to the
    /// permission checks rm -rf would meet; it stops at the first refusal. An open file
    /// stays readable until closed, as after rm.
    Rm {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Mount an image through FUSE and serve it in the foreground until unmounted
    /// (umount, or Ctrl-C/SIGTERM, which unmount it); the last changes are committed then.
    Mount {
        image: PathBuf,
        mountpoint: PathBuf,
        /// Mount options: ro, rw, noatime, relatime, strictatime, allow_other,
        /// default_permissions (the kernel checks modes; always so with allow_other or a
        /// non-root mounter), fsname=NAME, nodev, nosuid, noexec, sync (every change durable
        /// on return), dirsync (directory changes durable on return), remount (change a
        /// mounted file system: ro/rw, atime and sync words), nodiratime, lazytime, ttl=SECONDS,
        /// uring/nouring (FUSE over io_uring; default: when the kernel allows it),
        /// handoff/nohandoff (ring replies sent at SCHED_IDLE so callers wake on the same CPU;
        /// default on), threads=N, pin/nopin (/dev/fuse workers pinned one per CPU), writeback,
        /// holes/noholes (SEEK_DATA/SEEK_HOLE report holes, so sparse copies skip them; off
        /// by default, as pages a shared writable mapping holds in the kernel would be
        /// reported as holes; not with writeback), discard/nodiscard (freed blocks given back to an image file or device; default on),
        /// datasum/nodatasum (a crc32c for every block written copy-on-write, checked on
        /// every read; default on),
        /// readdirplus=always|auto (auto: names-only listings skip attributes, but tar, cp and
        /// rm then look up every entry; default always), snapshot=ID|NAME (serve that
        /// read-only snapshot, `idxfs snapshot --list`), subvol=ID|NAME (make that writable
        /// subvolume the image's active one and serve it, `idxfs subvolume list`; 5: the
        /// file system's own tree), snapdir=NAME (the
        /// root's hidden directory showing the snapshots, default .snapshots), nosnapdir
        /// (none).
        #[arg(short = 'o', value_name = "OPTIONS")]
        options: Vec<String>,
        /// Create and format the image first if it does not exist.
        #[arg(long)]
        create: bool,
        /// Size of an image made by --create (default 1G).
        #[arg(long, value_parser = parse_size, requires = "create")]
        size: Option<u64>,
        /// Return once mounted, serving from a background process whose messages go to
        /// IMAGE.log (/var/log/idxfs-NAME.log for a block device).
        #[arg(long)]
        background: bool,
    },
    /// Print trees, nodes and items, and fill statistics.
    Dump {
        image: PathBuf,
        /// Only this tree.
        tree: Option<TreeArg>,
        /// Only statistics, no nodes or items.
        #[arg(long)]
        stats: bool,
    },
    /// Make an image, fill a directory through the library, check it and show its statistics.
    Demo {
        /// Where to put the image (default: a temporary file, removed afterwards).
        #[arg(long)]
        image: Option<PathBuf>,
        #[arg(long, default_value_t = 100_000)]
        files: u64,
    },
    /// Benchmarks (not tests), side by side with ext4, btrfs and XFS in the same run:
    /// `idxfs bench [WORKLOAD ...]` runs the seeds' workloads (fs_mark, dir-fsync, huge-dir,
    /// nocow-write, data, concurrency, apps, acl, mkfs-from, snapshot, micro; all by default); the
    /// subcommands below are single measurements.
    /// Needs root. See docs/benchmarks.md.
    #[command(args_conflicts_with_subcommands = true)]
    Bench {
        #[command(subcommand)]
        what: Option<bench::BenchCmd>,
        /// Workloads to run (default: all).
        workloads: Vec<String>,
        /// test (seconds), small (under 10 minutes), full (the seeds' sizes, hours).
        #[arg(long, default_value = "small")]
        scale: String,
        /// File systems, comma-separated: idxfs, ext4, btrfs, xfs, tmpfs.
        #[arg(long, default_value = "idxfs,ext4,btrfs,xfs")]
        fs: String,
        /// Where the tables (*.txt), raw numbers (bench.json) and plots (*.png) go.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
        /// Number of files for huge-dir and acl (default by scale: 2000, 100000, 1000000).
        #[arg(long)]
        files: Option<u64>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum TreeArg {
    Fs,
    Space,
    /// Snapshots, shared node counts, held blocks.
    Roots,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => (&s[..i], &s[i..]),
        None => (s, ""),
    };
    let n: f64 = num.parse().map_err(|_| format!("not a size: {s:?}"))?;
    let m: u64 = match mult.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        _ => return Err(format!("unknown size suffix {mult:?} (use K, M, G, T)")),
    };
    if !n.is_finite() || n < 0.0 {
        return Err(format!("not a size: {s:?}"));
    }
    Ok((n * m as f64) as u64)
}

fn open_dev(path: &Path, writable: bool) -> Result<Arc<dyn BlockDevice>, String> {
    FileDevice::open(path, writable)
        .map(|d| Arc::new(d) as Arc<dyn BlockDevice>)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Takes an advisory lock on the image: exclusive for a mount, shared for fsck, so neither
/// runs while a server writes it. Waits up to `wait` (a previous server may still be committing
/// after its unmount). The lock lasts as long as the returned file.
pub(crate) fn lock_image(
    image: &Path,
    exclusive: bool,
    wait: std::time::Duration,
) -> Result<std::fs::File, String> {
    lock_or(
        image,
        exclusive,
        wait,
        "in use (mounted by another idxfs process)",
    )
}

/// `lock_image` of an image a command works on unmounted: held by a server, it says so
/// with `then` (what to do instead); any other failure (no such file) as it is.
pub(crate) fn lock_unmounted(image: &Path, then: &str) -> Result<std::fs::File, String> {
    let busy = format!("in use by an idxfs server (mounted); {then}");
    lock_or(image, true, std::time::Duration::ZERO, &busy)
}

/// `lock_image`, saying `busy` after the image's path when another process holds the lock
/// past `wait`.
fn lock_or(
    image: &Path,
    exclusive: bool,
    wait: std::time::Duration,
    busy: &str,
) -> Result<std::fs::File, String> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(image).map_err(|e| format!("{}: {e}", image.display()))?;
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    } | libc::LOCK_NB;
    let t = std::time::Instant::now();
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
            return Ok(f);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(format!("{}: lock: {e}", image.display()));
        }
        if t.elapsed() >= wait {
            return Err(format!("{}: {busy}", image.display()));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `idxfs trim IMAGE`: every free block discarded, the image not mounted meanwhile.
fn run_trim(image: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let p = image.display();
    let _lock = lock_unmounted(image, "trim the mount point, or unmount it first")?;
    let held = || {
        std::fs::metadata(image)
            .map(|m| m.blocks() * 512)
            .unwrap_or(0)
    };
    let before = held();
    let fs = Fs::open(
        open_dev(image, true)?,
        idxfs_engine::OpenOptions {
            commit_interval: None,
            ..Default::default()
        },
    )
    .map_err(|e| format!("{p}: {e}"))?;
    let blocks = fs.trim().map_err(|e| format!("trim {p}: {e}"))?;
    fs.close().map_err(|e| format!("{p}: {e}"))?;
    println!(
        "{p}: {blocks} free blocks discarded; the image file held {before} bytes, now {}",
        held()
    );
    Ok(())
}

fn run_fsck(image: &Path, data: bool) -> Result<bool, String> {
    let _lock = lock_image(image, false, std::time::Duration::from_secs(10))?;
    let dev = open_dev(image, false)?;
    let mut last = std::time::Instant::now();
    let mut progress = |n: u64| {
        if last.elapsed().as_millis() > 500 {
            eprint!("\rfsck: {n} nodes checked");
            last = std::time::Instant::now();
        }
    };
    let r = fsck::check_with(&dev, idxfs_format::hash::name_hash, data, &mut progress)
        .map_err(|e| format!("fsck {}: {e}", image.display()))?;
    eprint!("\r");
    for n in &r.notes {
        println!("note: {n}");
    }
    for p in &r.problems {
        println!("problem: {p}");
    }
    println!(
        "{}: generation {}, {} nodes, {} items, {} inodes, {} directory entries, {} blocks used: {}",
        image.display(),
        r.generation,
        r.nodes,
        r.items,
        r.inodes,
        r.dir_entries,
        r.used_blocks,
        if r.is_clean() { "clean".to_string() } else { format!("{} problems", r.problems.len()) }
    );
    Ok(r.is_clean())
}

/// `idxfs fsck --repair IMAGE`: a check, and when it finds problems a repair
/// (`idxfs_engine::repair`) and a check of the result. None when there was nothing to
/// repair, else whether the image ends clean.
fn run_repair(image: &Path) -> Result<Option<bool>, String> {
    let p = image.display();
    if run_fsck(image, false)? {
        println!("{p}: nothing to repair");
        return Ok(None);
    }
    let _lock = lock_unmounted(image, "unmount it first")?;
    let dev = open_dev(image, true)?;
    println!("{p}: repairing");
    let r = idxfs_engine::repair::repair(&dev, idxfs_format::hash::name_hash)
        .map_err(|e| format!("repair {p}: {e}"))?;
    for n in &r.notes {
        println!("note: {n}");
    }
    for l in &r.lost {
        println!("unreadable: {l}");
    }
    for a in &r.actions {
        println!("repaired: {a}");
    }
    for q in &r.check.problems {
        println!("problem left: {q}");
    }
    let clean = r.check.is_clean();
    let trees = match r.trees {
        1 => String::new(),
        n => format!(" in {n} trees (writable subvolumes)"),
    };
    println!(
        "{p}: rebuilt with {} inodes and {} names{trees}; {}",
        r.inodes,
        r.names,
        if clean {
            "clean".to_string()
        } else {
            format!("{} problems left", r.check.problems.len())
        }
    );
    Ok(Some(clean))
}

fn demo(image: Option<PathBuf>, files: u64) -> Result<(), String> {
    let tmp;
    let path = match image {
        Some(p) => p,
        None => {
            tmp = tempdir_in_shm()?;
            tmp.join("demo.img")
        }
    };
    println!("mkfs {} (2 GiB)", path.display());
    let dev = mkfs::mkfs(&mkfs::MkfsArgs {
        image: &path,
        size: Some(2 << 30),
        node_size: idxfs_format::DEFAULT_NODE_SIZE,
        force: false,
    })?;
    let fs =
        Fs::open(dev.clone(), idxfs_engine::OpenOptions::default()).map_err(|e| e.to_string())?;
    let owner = idxfs_engine::fs::Owner::default();
    let dir = fs
        .mkdir(idxfs_format::ROOT_INO, b"maildir", 0o755, owner)
        .map_err(|e| e.to_string())?;
    let t = std::time::Instant::now();
    for i in 0..files {
        let a = fs
            .create(dir.ino, format!("msg-{i:08}").as_bytes(), 0o644, owner)
            .map_err(|e| e.to_string())?;
        if i % 10 == 0 {
            fs.write(a.ino, 0, format!("message {i}\n").as_bytes())
                .map_err(|e| e.to_string())?;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "created {files} files in one directory in {secs:.2} s ({:.0} files/s, library API)",
        files as f64 / secs
    );
    let t = std::time::Instant::now();
    let mut n = 0u64;
    let mut increasing = 0u64;
    let mut prev = 0;
    fs.readdir(dir.ino, 2, |e| {
        n += 1;
        if e.ino > prev {
            increasing += 1;
        }
        prev = e.ino;
        true
    })
    .map_err(|e| e.to_string())?;
    println!(
        "readdir: {n} entries in {:.3} s, {:.4} of consecutive entries in increasing inode order",
        t.elapsed().as_secs_f64(),
        increasing as f64 / n.max(1) as f64
    );
    fs.close().map_err(|e| e.to_string())?;
    let clean = run_fsck(&path, false)?;
    let stdout = std::io::stdout();
    dump(dev.as_ref(), Some(Which::Fs), true, &mut stdout.lock()).map_err(|e| e.to_string())?;
    if !clean {
        return Err("fsck found problems".into());
    }
    Ok(())
}

pub(crate) fn tempdir_in_shm() -> Result<PathBuf, String> {
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let p = base.join(format!(
        "idxfs-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    Ok(p)
}

/// Whether `word` is one of the `idxfs` command's subcommands (or asks for help), as clap
/// knows them: anything else first is the mount helper's form, `idxfs IMAGE MOUNTPOINT`.
fn is_subcommand(word: &str) -> bool {
    use clap::CommandFactory;
    matches!(word, "help" | "--help") || Cli::command().find_subcommand(word).is_some()
}

/// The other names and forms this binary answers to; `None` when it is the `idxfs` command.
fn other_forms(args: &[std::ffi::OsString]) -> Option<ExitCode> {
    let prog = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let rest: Vec<String> = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if prog == "fsck.idxfs" {
        // fsck(8) passes flags such as -a, -p, -n, -y, -f. Only -y (answer yes to every
        // repair) repairs, as `idxfs fsck --repair`; -a and -p (repair only what is safe
        // without asking) find nothing that safe here, a repair may drop what it cannot
        // save, so they only check. Exit codes are fsck(8)'s: 0 clean, 1 problems repaired,
        // 4 problems left, 8 cannot check.
        let Some(image) = rest.iter().rfind(|a| !a.starts_with('-')) else {
            eprintln!("fsck.idxfs: usage: fsck.idxfs [-a|-p|-n|-y|-f] IMAGE");
            return Some(ExitCode::from(16));
        };
        let yes = rest
            .iter()
            .any(|a| a.starts_with('-') && !a.starts_with("--") && a.contains('y'));
        if yes {
            return Some(match run_repair(Path::new(image)) {
                Ok(None) => ExitCode::SUCCESS,
                Ok(Some(true)) => ExitCode::from(1),
                Ok(Some(false)) => ExitCode::from(4),
                Err(e) => {
                    eprintln!("fsck.idxfs: {e}");
                    ExitCode::from(8)
                }
            });
        }
        return Some(match run_fsck(Path::new(image), false) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(4),
            Err(e) => {
                eprintln!("fsck.idxfs: {e}");
                ExitCode::from(8)
            }
        });
    }
    let helper_form = prog == "mount.idxfs"
        || (prog != "mkfs.idxfs"
            && rest.len() >= 2
            && !rest[0].starts_with('-')
            && !is_subcommand(&rest[0]));
    if !helper_form {
        return None;
    }
    // mount.fuse3 form: SOURCE MOUNTPOINT [-o OPTIONS]...
    let mut pos = Vec::new();
    let mut options = Vec::new();
    let mut it = rest.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => options.extend(it.next()),
            s if s.starts_with("-o") => options.push(s[2..].to_string()),
            // -n (no mtab), -f (fake), -v (verbose) from mount(8) helpers: nothing to do.
            "-n" | "-v" | "-s" => {}
            _ => pos.push(a),
        }
    }
    let [image, mountpoint] = pos.as_slice() else {
        eprintln!("idxfs: usage: idxfs IMAGE MOUNTPOINT [-o OPTIONS]");
        return Some(ExitCode::from(1));
    };
    let r = mount::mount(&mount::MountArgs {
        image: Path::new(image),
        mountpoint: Path::new(mountpoint),
        options: &options,
        create: None,
        background: true,
    });
    Some(match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idxfs: {e}");
            ExitCode::from(1)
        }
    })
}

fn main() -> ExitCode {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(code) = other_forms(&args) {
        return code;
    }
    if args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .is_some_and(|n| n == "mkfs.idxfs")
    {
        args.insert(1, "mkfs".into());
    }
    let cli = Cli::parse_from(args);
    let r: Result<ExitCode, String> = match cli.cmd {
        Cmd::Mount {
            image,
            mountpoint,
            options,
            create,
            size,
            background,
        } => mount::mount(&mount::MountArgs {
            image: &image,
            mountpoint: &mountpoint,
            options: &options,
            create: create.then_some(size.unwrap_or(1 << 30)),
            background,
        })
        .map(|_| ExitCode::SUCCESS),
        Cmd::Mkfs {
            image,
            size,
            node_size,
            force,
            from: Some(dir),
        } => import::mkfs_from(
            &mkfs::MkfsArgs {
                image: &image,
                size,
                node_size,
                force,
            },
            &dir,
        )
        .map(|(t, secs)| {
            println!(
                "{}: idxfs formatted from {}: {}",
                image.display(),
                dir.display(),
                t.describe(secs)
            );
            ExitCode::SUCCESS
        }),
        Cmd::Mkfs {
            image,
            size,
            node_size,
            force,
            from: None,
        } => mkfs::mkfs(&mkfs::MkfsArgs {
            image: &image,
            size,
            node_size,
            force,
        })
        .map(|d| {
            println!(
                "{}: idxfs formatted, {} bytes, node size {node_size}",
                image.display(),
                d.size()
            );
            ExitCode::SUCCESS
        }),
        Cmd::Import { dir, path } => import::import_into(&dir, &path).map(|(t, secs)| {
            println!(
                "{}: imported from {}: {}",
                path.display(),
                dir.display(),
                t.describe(secs)
            );
            ExitCode::SUCCESS
        }),
        Cmd::Trim { target } if target.is_dir() => sync::trim_mount(&target).map(|(mp, n)| {
            println!("{}: {n} free blocks discarded", mp.display());
            ExitCode::SUCCESS
        }),
        Cmd::Trim { target } => run_trim(&target).map(|()| ExitCode::SUCCESS),
        Cmd::Snapshot {
            target,
            name,
            clone,
            list,
            delete,
            rollback,
        } => {
            let ask = match (&name, list, &delete, &rollback) {
                (Some(n), _, _, _) if clone.is_some() => {
                    snapshot::Ask::Clone(clone.as_deref().unwrap_or_default(), n)
                }
                (_, true, _, _) => snapshot::Ask::List,
                (_, _, Some(which), _) => snapshot::Ask::Delete(which),
                (_, _, _, Some(which)) => snapshot::Ask::Rollback(which),
                (Some(n), _, _, _) => snapshot::Ask::Make(n),
                (None, false, None, None) => {
                    unreachable!("clap requires a name, --list, --delete or --rollback")
                }
            };
            match target.is_dir() {
                true => snapshot::run_mounted(&target, ask),
                false => snapshot::run(&target, ask),
            }
            .map(|()| ExitCode::SUCCESS)
        }
        Cmd::Subvolume { what } => {
            let (target, ask) = match &what {
                SubvolumeCmd::Create { target, name } => (target, snapshot::Ask::Create(name)),
                SubvolumeCmd::Snapshot {
                    target,
                    name,
                    read_only,
                } => match read_only {
                    true => (target, snapshot::Ask::Make(name)),
                    false => (target, snapshot::Ask::Writable(name)),
                },
                SubvolumeCmd::List { target } => (target, snapshot::Ask::Subvolumes),
                SubvolumeCmd::Delete { target, which } => (target, snapshot::Ask::Delete(which)),
            };
            match target.is_dir() {
                true => snapshot::run_mounted(target, ask),
                false => snapshot::run(target, ask),
            }
            .map(|()| ExitCode::SUCCESS)
        }
        Cmd::Cp { src, dst } => cp::run(&src, &dst).map(|()| ExitCode::SUCCESS),
        Cmd::Rm { paths } => rm::run(&paths).map(|()| ExitCode::SUCCESS),
        Cmd::Sync { path } => sync::sync(&path).map(|mp| {
            println!("{}: every change is durable", mp.display());
            ExitCode::SUCCESS
        }),
        Cmd::Fsck {
            image,
            repair: true,
            ..
        } => match run_repair(&image) {
            Ok(None | Some(true)) => Ok(ExitCode::SUCCESS),
            Ok(Some(false)) => Ok(ExitCode::from(1)),
            Err(e) => {
                eprintln!("idxfs: {e}");
                return ExitCode::from(2);
            }
        },
        Cmd::Fsck { image, data, .. } => match run_fsck(&image, data) {
            Ok(true) => Ok(ExitCode::SUCCESS),
            Ok(false) => Ok(ExitCode::from(1)),
            Err(e) => {
                eprintln!("idxfs: {e}");
                return ExitCode::from(2);
            }
        },
        Cmd::Dump { image, tree, stats } => open_dev(&image, false).and_then(|dev| {
            let which = tree.map(|t| match t {
                TreeArg::Fs => Which::Fs,
                TreeArg::Space => Which::Space,
                TreeArg::Roots => Which::Roots,
            });
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let r = dump(dev.as_ref(), which, stats, &mut out)
                .map(|_| ExitCode::SUCCESS)
                .map_err(|e| format!("dump {}: {e}", image.display()));
            let _ = out.flush();
            r
        }),
        Cmd::Demo { image, files } => demo(image, files).map(|_| ExitCode::SUCCESS),
        Cmd::Bench {
            what: Some(what), ..
        } => bench::run(what).map(|_| ExitCode::SUCCESS),
        Cmd::Bench {
            what: None,
            workloads,
            scale,
            fs,
            out,
            files,
        } => (|| {
            let suite = bench_suite::Suite {
                workloads: if workloads.is_empty() {
                    bench_suite::WORKLOADS
                        .iter()
                        .map(|w| w.to_string())
                        .collect()
                } else {
                    workloads
                },
                scale: bench_suite::Scale::parse(&scale)?,
                fs: bench_env::FsKind::parse_list(&fs)?,
                out,
                files,
            };
            bench_suite::run(&suite)
        })()
        .map(|_| ExitCode::SUCCESS),
    };
    match r {
        Ok(c) => c,
        Err(e) => {
            eprintln!("idxfs: {e}");
            ExitCode::from(1)
        }
    }
}
