//! Mounting idxfs in tests: a fresh image in a temporary directory, the `idxfs mount` daemon as
//! a child process, and a guard that always unmounts, kills and cleans up, even when the test
//! fails.
#![allow(dead_code)]
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idxfs")
}

/// Bytes in use on the file system that holds `p` (statvfs).
pub fn used_bytes(p: &Path) -> u64 {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: statvfs(3) into a zeroed struct, with a valid C string.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0, "statvfs");
    (s.f_blocks - s.f_bfree) * s.f_frsize
}

/// Runs the idxfs binary; returns (exit code, stdout, stderr).
pub fn idxfs(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin()).args(args).output().expect("run idxfs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn shm_tempdir() -> tempfile::TempDir {
    let base = if Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    };
    tempfile::tempdir_in(base).expect("tempdir")
}

/// Whether `mp` is a mount point now (per /proc/self/mountinfo).
pub fn is_mounted(mp: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = mp.to_string_lossy();
    info.lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|p| p == want))
}

/// The /proc/mounts line for `mp`.
pub fn mounts_line(mp: &Path) -> Option<String> {
    let m = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let want = mp.to_string_lossy().into_owned();
    m.lines()
        .find(|l| l.split(' ').nth(1) == Some(want.as_str()))
        .map(str::to_string)
}

/// Waits until `cond` holds, up to `secs`.
pub fn wait_for(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(secs) {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Turns on FUSE over io_uring in the kernel (`fuse.enable_uring`, as `scripts/setup` does),
/// so a mount with `-o uring` can use it. Tests run as root here.
pub fn enable_fuse_uring() {
    assert!(
        idxfs_fuse::uring::kernel_enable(),
        "turn on {} (needs root)",
        idxfs_fuse::uring::PARAM
    );
}

/// Lazy unmount: works on a busy mount and on one whose daemon is dead.
pub fn force_unmount(mp: &Path) {
    let _ = Command::new("umount")
        .arg("-l")
        .arg(mp)
        .stderr(Stdio::null())
        .status();
}

/// A mounted image. Dropping it unmounts, stops the daemon and deletes the image.
pub struct Mounted {
    pub dir: tempfile::TempDir,
    pub image: PathBuf,
    pub mp: PathBuf,
    child: Option<Child>,
    /// Mount with IDXFS_COUNTERS=1: the daemon prints request counts when it exits.
    pub counters: bool,
    /// Mount with `-o allow_other` (other users reach it; the kernel checks permissions).
    pub allow_other: bool,
    /// More environment for the daemon.
    pub env: Vec<(&'static str, String)>,
}

impl Mounted {
    /// A new image of `size` (e.g. "256M") mounted with `-o allow_other` plus `opts`.
    pub fn new(size: &str, opts: &str) -> Mounted {
        Mounted::with(size, opts, true)
    }

    /// A new image of `size` mounted without `allow_other`: only root's processes reach it.
    pub fn root_only(size: &str, opts: &str) -> Mounted {
        Mounted::with(size, opts, false)
    }

    fn with(size: &str, opts: &str, allow_other: bool) -> Mounted {
        Mounted::in_dir(shm_tempdir(), size, opts, allow_other)
    }

    /// A new image of `size` in `dir` (which the mount deletes when dropped), mounted with
    /// `opts` (and `-o allow_other` when asked).
    pub fn in_dir(dir: tempfile::TempDir, size: &str, opts: &str, allow_other: bool) -> Mounted {
        let image = dir.path().join("fs.img");
        let mp = dir.path().join("mnt");
        std::fs::create_dir(&mp).expect("mkdir mount point");
        let (code, out, err) = idxfs(&["mkfs", image.to_str().expect("utf8"), "--size", size]);
        assert_eq!(code, 0, "mkfs: {out}{err}");
        let mut m = Mounted {
            dir,
            image,
            mp,
            child: None,
            counters: false,
            allow_other,
            env: Vec::new(),
        };
        m.mount(opts);
        m
    }

    /// Mounts the image again (after `unmount`).
    pub fn mount(&mut self, opts: &str) {
        assert!(self.child.is_none(), "already mounted");
        let o = match (self.allow_other, opts.is_empty()) {
            (true, true) => "allow_other".to_string(),
            (true, false) => format!("allow_other,{opts}"),
            (false, _) => opts.to_string(),
        };
        let mut cmd = Command::new(bin());
        if self.counters {
            cmd.env("IDXFS_COUNTERS", "1");
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd
            .arg("mount")
            .arg(&self.image)
            .arg(&self.mp)
            .arg("-o")
            .arg(&o)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn idxfs mount");
        let mp = self.mp.clone();
        let up = wait_for(20, || {
            is_mounted(&mp) || child.try_wait().ok().flatten().is_some()
        });
        if !up || !is_mounted(&self.mp) {
            let _ = child.kill();
            let out = child.wait_with_output().expect("wait");
            panic!(
                "idxfs mount did not come up: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.child = Some(child);
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mp.join(rel)
    }

    /// Unmounts with umount(8) and waits for the daemon to commit and exit; returns its stderr.
    /// A file closed just before may keep the mount busy for a moment (umount's exit 32;
    /// FUSE releases files to the daemon asynchronously; seen once in CI right after a
    /// test's last close): tried again for up to 5 s, so a file really left open still
    /// fails the test.
    pub fn unmount(&mut self) -> String {
        let mut tries = 0;
        loop {
            let st = Command::new("umount")
                .arg(&self.mp)
                .status()
                .expect("run umount");
            if st.success() {
                break;
            }
            tries += 1;
            assert!(
                st.code() == Some(32) && tries < 50,
                "umount failed: {st} (after {tries} tries)"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        self.wait_exit()
    }

    /// Waits for the daemon to exit by itself, which must be a success; returns its stderr.
    pub fn wait_exit(&mut self) -> String {
        let child = self.child.take().expect("mounted");
        let out = child.wait_with_output().expect("wait for the daemon");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "daemon exited with {}: {err}",
            out.status
        );
        err
    }

    /// Kills the daemon with SIGKILL (no commit) and clears the dead mount.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("mounted");
        child.kill().expect("SIGKILL");
        let _ = child.wait();
        force_unmount(&self.mp);
        assert!(wait_for(10, || !is_mounted(&self.mp)), "dead mount stays");
    }

    /// How many requests of kind `op` the daemon's counters (stderr at exit) report.
    pub fn requests(stderr: &str, op: &str) -> u64 {
        stderr
            .lines()
            .find_map(|l| l.strip_prefix(&format!("fuse requests {op}: ")))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    /// Mean microseconds a request of kind `op` spent in idxfs's handler, as the counters
    /// report it ("N (S s in idxfs, U us each)"); None when the line or the figure is missing.
    pub fn handler_us(stderr: &str, op: &str) -> Option<f64> {
        let line = stderr
            .lines()
            .find_map(|l| l.strip_prefix(&format!("fuse requests {op}: ")))?;
        let each = line.strip_suffix(" us each)")?;
        each.rsplit(' ').next()?.parse().ok()
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("mounted").id()
    }

    /// Runs `idxfs fsck --data` on the (unmounted) image (every data block with a checksum
    /// read and compared too); panics with its output unless clean.
    pub fn assert_fsck_clean(&self) {
        let (code, out, err) = idxfs(&["fsck", "--data", self.image.to_str().expect("utf8")]);
        assert_eq!(code, 0, "fsck: {out}{err}");
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Ask nicely first (SIGTERM unmounts and commits), then insist.
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            if !wait_for(10, || child.try_wait().ok().flatten().is_some()) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if is_mounted(&self.mp) {
            force_unmount(&self.mp);
        }
    }
}

/// setxattr(2) of `name` on `p`; panics with the errno when it fails.
pub fn setxattr(p: &std::path::Path, name: &str, value: &[u8]) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL");
    let n = std::ffi::CString::new(name).expect("no NUL");
    // SAFETY: valid C strings and a buffer of the given length.
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(r, 0, "setxattr: {}", std::io::Error::last_os_error());
}

/// A loop device over a file, detached on drop.
pub struct Loop(pub String);
impl Loop {
    pub fn new(file: &Path) -> Loop {
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(file)
            .output()
            .expect("losetup");
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Loop(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}
impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// A kernel mount, unmounted on drop.
pub struct KernelMount(pub PathBuf);
impl Drop for KernelMount {
    fn drop(&mut self) {
        // A plain unmount, so the device is free when it returns; lazily if that fails.
        let ok = Command::new("umount").arg(&self.0).status();
        if !ok.is_ok_and(|s| s.success()) {
            force_unmount(&self.0);
        }
    }
}

/// ext4 on a loop device over a `bytes` image in `dir`, mounted at `dir/mnt`; None when this
/// machine has no mkfs.ext4. Field order is drop order: unmounted, then detached.
pub struct Ext4 {
    pub mp: PathBuf,
    _mount: KernelMount,
    _loop: Loop,
}

impl Ext4 {
    pub fn new(dir: &Path, bytes: u64) -> Option<Ext4> {
        Command::new("mkfs.ext4").arg("-V").output().ok()?;
        let img = dir.join("ext4.img");
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(bytes))
            .expect("image");
        let ok = Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&img)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mkfs.ext4");
        let lo = Loop::new(&img);
        let mp = dir.join("mnt");
        std::fs::create_dir_all(&mp).expect("mkdir");
        let ok = Command::new("mount")
            .arg(&lo.0)
            .arg(&mp)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mount ext4");
        Some(Ext4 {
            mp: mp.clone(),
            _mount: KernelMount(mp),
            _loop: lo,
        })
    }
}

/// Runs `cmd args` as uid 65534 (group 65534, with group 1000 among its groups): whether it
/// succeeded, and its standard error.
pub fn as_user(cmd: &str, args: &[&Path]) -> (bool, String) {
    let out = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--groups", "1000"])
        .arg(cmd)
        .args(args)
        .output()
        .expect("setpriv");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
