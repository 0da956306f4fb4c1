//! The test bed of benchmarks that run idxfs beside the kernel's file systems: memory-backed
//! images on /dev/shm, loop devices, mounts, cold caches, CPU accounting, and undoing all of it
//! when a benchmark ends, fails, or is interrupted (Ctrl-C sets a flag the loops poll, so the
//! `Drop` impls below still run).
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// From now on SIGINT/SIGTERM/SIGHUP set a flag instead of killing this process; `interrupted`
/// turns it into an error, and unwinding undoes what was made.
pub fn catch_interrupts() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

pub fn interrupted() -> Result<(), String> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        return Err("interrupted".into());
    }
    Ok(())
}

/// Runs a command to completion; its stdout, or an error with its stderr.
pub fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    interrupted()?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub fn is_mounted(mp: &Path) -> bool {
    let want = mp.to_string_lossy().into_owned();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

pub fn wait_mounted(mp: &Path) -> bool {
    for _ in 0..1000 {
        if is_mounted(mp) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

pub fn check(r: libc::c_int, what: &str, p: &Path) -> Result<libc::c_int, String> {
    if r < 0 {
        return Err(format!(
            "{what} {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(r)
}

/// creat(2) + close(2): an empty file.
pub fn create_close(p: &CString, path: &Path) -> Result<(), String> {
    // SAFETY: a valid C path; the descriptor is closed right away.
    let fd = unsafe {
        libc::open(
            p.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
            0o644,
        )
    };
    check(fd, "create", path)?;
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    Ok(())
}

/// sync, then drop the page, dentry and inode caches.
pub fn drop_caches() -> Result<(), String> {
    // SAFETY: sync(2) has no arguments.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").map_err(|e| format!("drop_caches: {e}"))
}

pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split(' ').next().and_then(|x| x.parse().ok()))
        .unwrap_or(f64::NAN)
}

fn rusage(who: libc::c_int) -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU seconds of this process: CPU time moves far less than wall time on a shared machine.
pub fn self_cpu() -> f64 {
    rusage(libc::RUSAGE_SELF)
}

/// CPU seconds of this process and of its children that have been waited for.
pub fn self_and_children_cpu() -> f64 {
    rusage(libc::RUSAGE_SELF) + rusage(libc::RUSAGE_CHILDREN)
}

/// CPU seconds (user + system, all threads) of a running process, from /proc.
pub fn process_cpu(pid: u32) -> f64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the parenthesized command name: state is field 3; utime, stime are 14, 15.
    let Some(rest) = s.rsplit_once(')').map(|x| x.1) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / hz
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsKind {
    Idxfs,
    Ext4,
    Btrfs,
    Xfs,
    Tmpfs,
}

impl FsKind {
    pub fn name(self) -> &'static str {
        match self {
            FsKind::Idxfs => "idxfs",
            FsKind::Ext4 => "ext4",
            FsKind::Btrfs => "btrfs",
            FsKind::Xfs => "xfs",
            FsKind::Tmpfs => "tmpfs",
        }
    }

    pub fn parse_list(s: &str) -> Result<Vec<FsKind>, String> {
        s.split(',')
            .filter(|x| !x.is_empty())
            .map(|x| match x {
                "idxfs" => Ok(FsKind::Idxfs),
                "ext4" => Ok(FsKind::Ext4),
                "btrfs" => Ok(FsKind::Btrfs),
                "xfs" => Ok(FsKind::Xfs),
                "tmpfs" => Ok(FsKind::Tmpfs),
                _ => Err(format!(
                    "unknown file system {x:?} (idxfs, ext4, btrfs, xfs, tmpfs)"
                )),
            })
            .collect()
    }

    /// A kernel file system on a loop device (the ones idxfs is compared with).
    pub fn is_kernel_disk_fs(self) -> bool {
        matches!(self, FsKind::Ext4 | FsKind::Btrfs | FsKind::Xfs)
    }
}

/// Installs the Debian packages whose commands are missing (`apt-get`, needs root).
pub fn ensure_tools(tools: &[(&str, &str)]) -> Result<(), String> {
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(cmd, _)| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {cmd}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(|(_, pkg)| *pkg)
        .collect();
    apt_install(&missing)
}

/// `apt-get install -y` (after `apt-get update` if the first try fails).
pub fn apt_install(pkgs: &[&str]) -> Result<(), String> {
    if pkgs.is_empty() {
        return Ok(());
    }
    eprintln!("installing {}...", pkgs.join(" "));
    let install = || {
        let mut c = Command::new("apt-get");
        c.args(["install", "-y", "-q"])
            .args(pkgs)
            .env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    if install().output().is_ok_and(|o| o.status.success()) {
        return Ok(());
    }
    let _ = Command::new("apt-get").args(["update", "-q"]).output();
    run(&mut install()).map(|_| ())
}

/// This very binary, for the idxfs children (mkfs, mount). When the file was replaced while
/// this ran (a rebuild during an hour-long run), `current_exe()` is a path ending in
/// " (deleted)"; `/proc/self/exe` still names the running image, so that is used instead.
pub fn self_exe() -> PathBuf {
    match std::env::current_exe() {
        Ok(p) if p.exists() => p,
        _ => PathBuf::from("/proc/self/exe"),
    }
}

/// One mounted file system under test, with everything made for it; dropping it unmounts,
/// stops the idxfs daemon, detaches the loop device and deletes the image.
pub struct Target {
    pub kind: FsKind,
    pub mp: PathBuf,
    image: Option<PathBuf>,
    loopdev: Option<String>,
    daemon: Option<Child>,
    mounted: bool,
    /// idxfs's mount options (`make_with`), kept for a remount (`cold`).
    idxfs_opts: Option<String>,
    /// The idxfs daemon counts its requests and reports them at exit (`IDXFS_COUNTERS=1`),
    /// for `cold_report`.
    counters: bool,
}

impl Target {
    /// Makes and mounts `kind` under `base` on a sparse image of `bytes` (kernel file systems
    /// on a loop device; idxfs through this binary's `mount`; tmpfs directly). `inodes` sizes
    /// ext4's inode table.
    pub fn make(base: &Path, kind: FsKind, bytes: u64, inodes: u64) -> Result<Target, String> {
        Target::make_with(base, kind, bytes, inodes, None)
    }

    /// `make`, with these mount options for idxfs (the kernel file systems take none).
    pub fn make_with(
        base: &Path,
        kind: FsKind,
        bytes: u64,
        inodes: u64,
        idxfs_opts: Option<&str>,
    ) -> Result<Target, String> {
        Target::make_full(base, kind, bytes, inodes, idxfs_opts, false)
    }

    /// `make_with`, with an idxfs daemon that counts its requests (`cold_report`).
    pub fn make_counted(
        base: &Path,
        kind: FsKind,
        bytes: u64,
        inodes: u64,
        idxfs_opts: Option<&str>,
    ) -> Result<Target, String> {
        Target::make_full(base, kind, bytes, inodes, idxfs_opts, true)
    }

    fn make_full(
        base: &Path,
        kind: FsKind,
        bytes: u64,
        inodes: u64,
        idxfs_opts: Option<&str>,
        counters: bool,
    ) -> Result<Target, String> {
        let mp = base.join(format!("mnt-{}", kind.name()));
        std::fs::create_dir_all(&mp).map_err(|e| format!("{}: {e}", mp.display()))?;
        let mut t = Target {
            kind,
            mp: mp.clone(),
            image: None,
            loopdev: None,
            daemon: None,
            mounted: false,
            idxfs_opts: idxfs_opts.map(str::to_string),
            counters,
        };
        if kind == FsKind::Tmpfs {
            run(Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={bytes}")])
                .arg("tmpfs")
                .arg(&mp))?;
            t.mounted = true;
            return Ok(t);
        }
        let img = base.join(format!("{}.img", kind.name()));
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(bytes))
            .map_err(|e| format!("{}: {e}", img.display()))?;
        t.image = Some(img.clone());
        if kind == FsKind::Idxfs {
            run(Command::new(self_exe()).arg("mkfs").arg(&img))?;
            t.start_daemon()?;
            return Ok(t);
        }
        let dev = run(Command::new("losetup").arg("-f").arg("--show").arg(&img))?;
        t.loopdev = Some(dev.clone());
        match kind {
            FsKind::Ext4 => run(Command::new("mkfs.ext4")
                .args(["-q", "-F", "-N", &inodes.to_string()])
                .args(["-E", "lazy_itable_init=0,lazy_journal_init=0"])
                .arg(&dev))?,
            FsKind::Btrfs => run(Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(&dev))?,
            _ => run(Command::new("mkfs.xfs").args(["-q", "-f"]).arg(&dev))?,
        };
        run(Command::new("mount").arg(&dev).arg(&mp))?;
        t.mounted = true;
        Ok(t)
    }

    fn start_daemon(&mut self) -> Result<(), String> {
        let exe = self_exe();
        let img = self.image.clone().ok_or("idxfs without an image")?;
        // The daemon's messages go to a log beside the image (one "mounted on" line per
        // remount would bury the progress lines); its tail is shown when something fails.
        let log = img.with_extension("log");
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let mut cmd = Command::new(exe);
        cmd.arg("mount");
        if self.counters {
            cmd.env("IDXFS_COUNTERS", "1");
        }
        // Mount options for A/B runs of one build, e.g. IDXFS_BENCH_MOUNT_OPTS=nohandoff.
        if let Some(o) = std::env::var_os("IDXFS_BENCH_MOUNT_OPTS").filter(|o| !o.is_empty()) {
            cmd.arg("-o").arg(o);
        }
        if let Some(o) = &self.idxfs_opts {
            cmd.arg("-o").arg(o);
        }
        let child = cmd
            .arg(&img)
            .arg(&self.mp)
            .stdin(std::process::Stdio::null())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("idxfs mount: {e}"))?;
        self.daemon = Some(child);
        if !wait_mounted(&self.mp) {
            return Err(format!(
                "idxfs did not mount on {}: {}",
                self.mp.display(),
                self.daemon_log_tail()
            ));
        }
        self.mounted = true;
        Ok(())
    }

    /// The last lines the idxfs daemon wrote, for an error message.
    fn daemon_log_tail(&self) -> String {
        let Some(img) = &self.image else {
            return String::new();
        };
        let text = std::fs::read_to_string(img.with_extension("log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" / ")
    }

    /// The idxfs daemon's pid (its CPU time is part of idxfs's cost).
    pub fn daemon_pid(&self) -> Option<u32> {
        self.daemon.as_ref().map(|c| c.id())
    }

    /// Unmounts (and for idxfs waits for its daemon's last commit and exit): after it, what
    /// was written is on the image. Dropping the target does it too.
    pub fn unmount(&mut self) {
        if !self.mounted {
            return;
        }
        let ok = Command::new("umount")
            .arg(&self.mp)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.mp).status();
        }
        self.mounted = false;
        if let Some(mut c) = self.daemon.take() {
            // The daemon commits and exits after the unmount; give a big image time.
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(120) {
                if let Ok(Some(st)) = c.try_wait() {
                    if !st.success() {
                        eprintln!("idxfs daemon {st}: {}", self.daemon_log_tail());
                    }
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `cold`, and what the idxfs daemon that stopped for it reported at its exit (with
    /// `make_counted`: its request counts since it started; empty for other file systems).
    pub fn cold_report(&mut self) -> Result<String, String> {
        let log = self.image.as_ref().map(|i| i.with_extension("log"));
        let read = |l: &Option<PathBuf>| {
            l.as_ref()
                .and_then(|l| std::fs::read_to_string(l).ok())
                .unwrap_or_default()
        };
        let before = read(&log).len();
        self.cold()?;
        Ok(read(&log).get(before..).unwrap_or_default().to_string())
    }

    /// Cold caches for the next step: sync and drop the kernel's caches; idxfs is also
    /// unmounted and mounted again, so its own caches start empty.
    pub fn cold(&mut self) -> Result<(), String> {
        if self.kind == FsKind::Idxfs {
            self.unmount();
            drop_caches()?;
            return self.start_daemon();
        }
        drop_caches()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.unmount();
        if let Some(dev) = self.loopdev.take() {
            let _ = Command::new("losetup").arg("-d").arg(&dev).status();
        }
        if let Some(img) = self.image.take() {
            let _ = std::fs::remove_file(&img);
            let _ = std::fs::remove_file(img.with_extension("log"));
        }
        let _ = std::fs::remove_dir(&self.mp);
    }
}

/// A scratch directory on /dev/shm, removed (with anything left in it) on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// `/dev/shm/idxb<pid>-<n>`: short, because fs_mark refuses directory paths of 40 bytes
    /// or more, and the mount points and fs_mark's directories live below it.
    pub fn new() -> Result<Scratch, String> {
        use std::sync::atomic::AtomicU32;
        static N: AtomicU32 = AtomicU32::new(0);
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let p = base.join(format!(
            "idxb{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(Scratch(p))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Never recurse into something still mounted below.
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let base = self.0.to_string_lossy().into_owned();
        let busy = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .any(|m| m.starts_with(&base));
        if !busy {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// How an idxfs mount started now talks to the kernel.
pub fn fuse_transport() -> &'static str {
    if idxfs_fuse::uring::kernel_enabled() {
        "io_uring"
    } else {
        "/dev/fuse"
    }
}

/// Lets idxfs mounts use FUSE over io_uring (as `scripts/setup` does), and says which transport
/// they will use.
pub fn ensure_fuse_uring() {
    if !idxfs_fuse::uring::kernel_enabled() && idxfs_fuse::uring::kernel_enable() {
        eprintln!(
            "bench: turned on FUSE over io_uring ({}=Y)",
            idxfs_fuse::uring::PARAM
        );
    }
    eprintln!(
        "bench: idxfs mounts talk to the kernel through {}",
        fuse_transport()
    );
}

/// What a reader needs to compare a result: kernel, CPU, cores, memory, load.
pub fn machine() -> serde_json::Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|x| x.1.trim().to_string())
        })
        .unwrap_or_default();
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|x| x.parse::<u64>().ok())
                })
        })
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    serde_json::json!({
        "kernel": kernel,
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "memory_gib": mem_kib as f64 / (1u64 << 20) as f64,
        "load_average": load_average(),
        "idxfs_version": env!("CARGO_PKG_VERSION"),
        "fuse_transport": fuse_transport(),
    })
}

/// A progress bar on stderr for a loop of known length. On a terminal it redraws one line in
/// place (at most five times a second); into a log it writes a plain line every 30 seconds, so
/// a long run shows it is alive without flooding the log.
pub struct Progress {
    label: String,
    total: u64,
    start: Instant,
    last: Instant,
    tty: bool,
    drawn: bool,
}

impl Progress {
    pub fn new(label: impl Into<String>, total: u64) -> Progress {
        let now = Instant::now();
        Progress {
            label: label.into(),
            total: total.max(1),
            start: now,
            last: now,
            // SAFETY: isatty only inspects the descriptor.
            tty: unsafe { libc::isatty(2) } == 1,
            drawn: false,
        }
    }

    /// `done` of `total` units are finished.
    pub fn set(&mut self, done: u64) {
        let every = if self.tty {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(30)
        };
        if self.last.elapsed() < every {
            return;
        }
        self.last = Instant::now();
        let frac = (done as f64 / self.total as f64).min(1.0);
        let secs = self.start.elapsed().as_secs_f64();
        let eta = if frac > 0.0 {
            format!("{:.0} s left", secs * (1.0 - frac) / frac)
        } else {
            "?".into()
        };
        let width = 30;
        let full = (frac * width as f64) as usize;
        let bar = format!("{}{}", "#".repeat(full), ".".repeat(width - full));
        let line = format!(
            "{} [{bar}] {done}/{} {:.0}%, {eta}",
            self.label,
            self.total,
            frac * 100.0
        );
        if self.tty {
            eprint!("\r{line}\x1b[K");
            self.drawn = true;
        } else {
            eprintln!("{line}");
        }
    }
}

impl Drop for Progress {
    /// Clears the bar, so the result line that follows starts on a clean line.
    fn drop(&mut self) {
        if self.drawn {
            eprint!("\r\x1b[K");
        }
    }
}

/// How many `op` requests (FUSE's name for it, as `IDXFS_COUNTERS` prints them) a daemon's
/// report (`Target::cold_report`) counted.
pub fn requests_of(report: &str, op: &str) -> u64 {
    report
        .lines()
        .find_map(|l| l.strip_prefix(&format!("fuse requests {op}: ")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The requests in a daemon's report that the kernel waits a reply for: all but FORGET and
/// BATCH_FORGET, which have none. At one round trip each, times the FUSE round trip, they give
/// the time no server could go below on this transport.
pub fn round_trips(report: &str) -> u64 {
    report
        .lines()
        .filter_map(|l| l.strip_prefix("fuse requests "))
        .filter_map(|l| l.split_once(": "))
        .filter(|(op, _)| !op.contains("forget"))
        .filter_map(|(_, v)| v.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Writes and deletes a file of `big` bytes where the images are (/dev/shm): the first large
/// write of a run into fresh memory is slower, whichever file system makes it (measured in
/// docs/benchmarks.md, "nocow-write and data": this PVM guest makes a fresh page slow to
/// touch first), and would count against whoever runs first.
pub fn warm_up(base: &Path, big: u64) -> Result<(), String> {
    use std::io::Write;
    let p = base.join("warm-up");
    let err = |e: std::io::Error| format!("{}: {e}", p.display());
    let buf = vec![1u8; 1 << 20];
    let mut f = std::fs::File::create(&p).map_err(err)?;
    for _ in 0..big >> 20 {
        f.write_all(&buf).map_err(err)?;
    }
    drop(f);
    std::fs::remove_file(&p).map_err(err)
}
