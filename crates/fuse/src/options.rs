//! Mount options: the `-o a,b,c=d` strings of mount(8), fstab and mount.fuse3, parsed once into
//! what the engine and fuser need.
use fuser::{Config, MountOption, SessionACL};
use idxfs_engine::fs::{Atime, OnDamage, SyncMode};
use std::fmt;
use std::time::Duration;

/// A snapshot or writable subvolume as a mount option names it: a number is an id (as
/// `idxfs snapshot` reads one), anything else a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    Id(u64),
    Name(String),
}

impl Named {
    fn parse(v: &str) -> Named {
        v.parse()
            .map_or_else(|_| Named::Name(v.to_string()), Named::Id)
    }
}

impl fmt::Display for Named {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Named::Id(id) => write!(f, "{id}"),
            Named::Name(n) => write!(f, "{n}"),
        }
    }
}

/// Everything a mount needs beyond the image and the mount point.
#[derive(Debug, Clone)]
pub struct MountConfig {
    pub read_only: bool,
    pub atime: Atime,
    pub allow_other: bool,
    /// `-o default_permissions`: the kernel checks permissions even on a mount only root can
    /// use (see `kernel_checks_permissions`).
    pub default_permissions: bool,
    /// Source shown in /proc/mounts (default: the image path).
    pub fsname: Option<String>,
    /// Entry and attribute cache lifetime in the kernel.
    pub ttl: Duration,
    /// The kernel's writeback cache: writes gathered in the page cache and sent in large
    /// requests (the kernel then keeps mtime/ctime and sends them by setattr on close). Off by
    /// default: for small files it adds requests (see the crate docs).
    pub writeback: bool,
    /// `-o holes`: lseek's SEEK_DATA and SEEK_HOLE answered from the file's extents, so a
    /// sparse copy (GNU cp, tar, rsync) skips the holes. Off by default: the server cannot
    /// see pages the kernel holds dirty, which a shared writable mapping makes in any mount
    /// (until they are written back, at the latest at munmap), and the writeback cache in
    /// every write until close. An answer from the extents alone calls such pages a hole,
    /// and a copy made meanwhile gets zeros where the file has data (ZFS's "SEEK_DATA races
    /// with writes" bug of 2023). Off, the kernel answers from its own size (the whole file
    /// is data; a sparse copy reads the holes and still writes them as holes), as on every
    /// FUSE file system without lseek. Refused with `writeback`, whose dirty pages no mapping
    /// is needed for (`check`).
    pub holes: bool,
    /// Freed blocks are discarded once nothing can read them, so an image file gives their
    /// space back (`-o discard`, the default; `nodiscard` keeps every block the image ever
    /// used allocated). See `idxfs_engine::space::discard`.
    pub discard: bool,
    /// Data checksums for new copy-on-write blocks (`-o datasum`, the default; `nodatasum`
    /// writes none). See `idxfs_engine::OpenOptions::datasum`.
    pub datasum: bool,
    /// FUSE worker threads reading /dev/fuse (each with its own cloned fd). None: 2, or 1
    /// beside io_uring, where only FORGET and INTERRUPT come that way.
    pub threads: Option<usize>,
    /// Pin worker i to the i-th allowed CPU (`pin.rs`); None: when the workers cover every CPU.
    pub pin: Option<bool>,
    /// FUSE over io_uring (`uring.rs`): None: when the kernel allows it (`fuse.enable_uring`);
    /// `-o uring` insists (the mount fails without it), `-o nouring` stays on /dev/fuse.
    pub uring: Option<bool>,
    /// Ring workers send replies at SCHED_IDLE so callers wake on the worker's CPU
    /// (`handoff.rs`); `-o nohandoff` turns it off.
    pub handoff: bool,
    /// `-o readdirplus=auto` (`FUSE_READDIRPLUS_AUTO`): after a listing's first request the
    /// kernel asks with plain READDIR, and goes back to READDIRPLUS only once entries it
    /// listed are being looked up. A listing of names alone (`ls -f`, `find -name`) then
    /// costs the kernel no inode per entry, but a tool that reads the whole directory before
    /// it stats (GNU tar, cp, rm, du) pays a LOOKUP round trip per entry. Measured here with
    /// 200,000 files, cold: readdir 0.60-0.70 -> 0.07-0.10 s, tar 1.3 -> 3.6 s, cp -a +13%,
    /// rm -rf +50%. So the default is `readdirplus=always`.
    pub readdirplus_auto: bool,
    /// When operations are durable on return: `-o sync` (all), `-o dirsync` (directory
    /// changes). The kernel gets the flags too (it then fsyncs after each write, and shows
    /// them), but it does not make FUSE's other requests synchronous: the engine does
    /// (`idxfs_engine::fs::SyncMode`).
    pub sync: SyncMode,
    /// `-o errors=remount-ro` (the default) or `errors=continue`: what the mount does after
    /// it meets damaged metadata (`idxfs_engine::fs::OnDamage`).
    pub on_damage: OnDamage,
    /// `-o remount`: change a mounted file system (through its server, then the kernel's
    /// flags) instead of mounting one.
    pub remount: bool,
    /// POSIX ACLs: `-o acl`, `-o noacl`, or None: on wherever the kernel checks permissions
    /// anyway (`acl_on`). On, they are kept by the engine (`idxfs_engine::fs::acl`), cached
    /// and enforced by the kernel (`FUSE_POSIX_ACL`). Off, the ACL xattrs are refused as on a
    /// file system without ACLs, except that one the mode says in full is taken as a chmod
    /// (`acl.rs`).
    pub acl: Option<bool>,
    /// Kernel mount flags passed through (nodev, nosuid, noexec, sync, dirsync, ...).
    pub flags: Vec<MountOption>,
    /// `-o snapshot=ID|NAME`: serve this read-only snapshot of the image instead of its file
    /// system (read-only whatever else is asked).
    pub snapshot: Option<Named>,
    /// `-o subvol=ID|NAME`: make this writable subvolume (a clone, one made empty, or 5 for
    /// the file system's own tree) the image's active one and serve it
    /// (`idxfs_engine::fs::clones`).
    pub subvolume: Option<Named>,
    /// `-o snapdir=NAME`: the root's name for the snapshots directory (`snapdir.rs`),
    /// `.snapshots` unless asked; None with `-o nosnapdir`.
    pub snapdir: Option<String>,
}

/// VFS words passed to the kernel as they are: (word, flag, set or clear). They concern the
/// kernel's own behaviour (directory atime is never kept by idxfs, so `nodiratime` changes
/// nothing it does).
const VFS_FLAGS: [(&str, libc::c_ulong, bool); 6] = [
    ("nodiratime", libc::MS_NODIRATIME, true),
    ("diratime", libc::MS_NODIRATIME, false),
    ("lazytime", libc::MS_LAZYTIME, true),
    ("nolazytime", libc::MS_LAZYTIME, false),
    ("nosymfollow", libc::MS_NOSYMFOLLOW, true),
    ("symfollow", libc::MS_NOSYMFOLLOW, false),
];

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig {
            read_only: false,
            atime: Atime::Relatime,
            allow_other: false,
            default_permissions: false,
            fsname: None,
            ttl: Duration::from_secs(3600),
            writeback: false,
            holes: false,
            discard: true,
            datasum: true,
            threads: None,
            pin: None,
            uring: None,
            handoff: true,
            readdirplus_auto: false,
            sync: SyncMode::Async,
            on_damage: OnDamage::ReadOnly,
            remount: false,
            acl: None,
            flags: Vec::new(),
            snapshot: None,
            subvolume: None,
            snapdir: Some(DEFAULT_SNAPDIR.to_string()),
        }
    }
}

/// Where the mount shows the image's snapshots unless `-o snapdir=NAME` says otherwise.
pub const DEFAULT_SNAPDIR: &str = ".snapshots";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionError(pub String);

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for OptionError {}

impl MountConfig {
    /// Applies one comma-separated option list (later options win, as in mount(8)).
    pub fn apply<'a>(&mut self, list: &'a str) -> Result<(), OptionError> {
        for opt in list.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            let (key, value) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            let need = |v: Option<&'a str>| -> Result<&'a str, OptionError> {
                v.ok_or_else(|| OptionError(format!("mount option {key} needs a value")))
            };
            match key {
                "ro" => self.read_only = true,
                "rw" => self.read_only = false,
                "noatime" => self.atime = Atime::NoAtime,
                "relatime" | "atime" | "nostrictatime" => self.atime = Atime::Relatime,
                "strictatime" | "norelatime" => self.atime = Atime::Strict,
                "remount" => self.remount = true,
                "allow_other" => self.allow_other = true,
                "writeback" => self.writeback = true,
                "nowriteback" => self.writeback = false,
                "holes" => self.holes = true,
                "noholes" => self.holes = false,
                "discard" => self.discard = true,
                "nodiscard" => self.discard = false,
                "datasum" => self.datasum = true,
                "nodatasum" => self.datasum = false,
                "default_permissions" => self.default_permissions = true,
                "acl" => self.acl = Some(true),
                "noacl" => self.acl = Some(false),
                "fsname" => self.fsname = Some(need(value)?.to_string()),
                "snapshot" => self.snapshot = Some(Named::parse(need(value)?)),
                "subvol" => self.subvolume = Some(Named::parse(need(value)?)),
                "snapdir" => {
                    let v = need(value)?;
                    if v.is_empty() || v.len() > 255 || v == "." || v == ".." {
                        return Err(OptionError(format!(
                            "bad snapdir {v:?}: a name of 1 to 255 bytes, not . or .."
                        )));
                    }
                    self.snapdir = Some(v.to_string());
                }
                "nosnapdir" => self.snapdir = None,
                "ttl" => {
                    let v = need(value)?;
                    let secs: f64 = v
                        .parse()
                        .ok()
                        .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                        .ok_or_else(|| OptionError(format!("bad ttl {v:?}: seconds expected")))?;
                    self.ttl = Duration::from_secs_f64(secs);
                }
                "threads" => {
                    let v = need(value)?;
                    self.threads = Some(
                        v.parse()
                            .ok()
                            .filter(|n| (1..=64).contains(n))
                            .ok_or_else(|| OptionError(format!("bad threads {v:?}: 1 to 64")))?,
                    );
                }
                "pin" => self.pin = Some(true),
                "nopin" => self.pin = Some(false),
                "uring" => self.uring = Some(true),
                "nouring" => self.uring = Some(false),
                "handoff" => self.handoff = true,
                "nohandoff" => self.handoff = false,
                "readdirplus" => {
                    self.readdirplus_auto = match need(value)? {
                        "always" => false,
                        "auto" => true,
                        v => {
                            return Err(OptionError(format!(
                                "bad readdirplus {v:?}: always or auto"
                            )))
                        }
                    }
                }
                "errors" => {
                    self.on_damage = match need(value)? {
                        "remount-ro" => OnDamage::ReadOnly,
                        "continue" => OnDamage::Continue,
                        v => {
                            return Err(OptionError(format!(
                                "bad errors {v:?}: remount-ro or continue (idxfs has no \
                                 errors=panic)"
                            )))
                        }
                    }
                }
                "dev" => self.flags.push(MountOption::Dev),
                "nodev" => self.flags.push(MountOption::NoDev),
                "suid" => self.flags.push(MountOption::Suid),
                "nosuid" => self.flags.push(MountOption::NoSuid),
                "exec" => self.flags.push(MountOption::Exec),
                "noexec" => self.flags.push(MountOption::NoExec),
                "sync" => {
                    self.sync = SyncMode::All;
                    self.flags.push(MountOption::Sync);
                }
                "async" => {
                    self.sync = SyncMode::Async;
                    self.flags.retain(|f| *f != MountOption::DirSync);
                    self.flags.push(MountOption::Async);
                }
                "dirsync" => {
                    if self.sync != SyncMode::All {
                        self.sync = SyncMode::Dirs;
                    }
                    self.flags.push(MountOption::DirSync);
                }
                k if VFS_FLAGS.iter().any(|(w, _, _)| *w == k) => {
                    self.flags
                        .retain(|f| !vfs_word_of(f).is_some_and(|w| same_flag(w, k)));
                    self.flags.push(MountOption::CUSTOM(k.to_string()));
                }
                // Words mount(8) and mount.fuse3 pass that change nothing here: i_version is
                // the kernel's, mandatory locks are gone from Linux, and the FUSE parameters
                // (on a remount, from /proc/mounts) are set by idxfs itself at mount.
                "iversion" | "noiversion" | "mand" | "nomand" | "silent" | "loud" | "user_id"
                | "group_id" | "rootmode" | "blksize" | "max_read" => {}
                // fstab and mount(8) words that concern mount(8) itself, not the file system.
                "defaults" | "auto" | "noauto" | "user" | "users" | "nouser" | "owner"
                | "group" | "_netdev" | "nofail" | "subtype" => {}
                k if k.starts_with("x-") || k.starts_with("comment") => {}
                _ => return Err(OptionError(format!("unknown mount option {opt:?}"))),
            }
        }
        Ok(())
    }

    /// Refuses options that cannot go together, once all are applied.
    pub fn check(&self) -> Result<(), OptionError> {
        if self.holes && self.writeback {
            return Err(OptionError(
                "mount options holes and writeback cannot go together: with the writeback \
                 cache, data written until a file's close is only in the kernel, and SEEK_DATA \
                 would call it a hole"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Whether the mount asks the kernel to check permissions (`default_permissions`) from the
    /// attributes idxfs returns, for a mount whose `user_id` is `uid` (`real_uid`).
    ///
    /// Yes when anyone but root can reach the file system: with `allow_other`, or when the
    /// mounter is not root (the kernel then admits only the mounter's uid, whose own mode bits
    /// still apply). idxfs does not check permissions itself: with no-open, opening a file
    /// sends no request, so the kernel is the only place a check can happen.
    ///
    /// No on a root mount without `allow_other`: the kernel admits only processes whose real,
    /// effective and saved uids and gids are all 0 (`fuse_allow_current_process`), and for
    /// them mode bits decide nothing except execution, which the kernel checks even without
    /// `default_permissions` (a regular file needs an x bit; idxfs answers `access(X_OK)` the
    /// same way). What it saves: `default_permissions` makes the kernel fetch a directory's
    /// attributes again after every change in it, a GETATTR round trip per create, unlink or
    /// rename. The cost: a uid-0 process that dropped CAP_DAC_OVERRIDE or CAP_FOWNER is not
    /// held to the mode bits, as it would be on ext4; `-o default_permissions` restores that.
    ///
    /// `-o acl` on a root mount makes it yes too: the kernel turns `default_permissions` on
    /// itself when it takes `FUSE_POSIX_ACL`, for it enforces the ACLs.
    pub fn kernel_checks_permissions(&self, uid: u32) -> bool {
        self.acl == Some(true) || self.others_checked(uid)
    }

    /// Whether the kernel checks permissions without ACLs in the picture: the mount is
    /// reachable by someone but root, or `default_permissions` was asked for.
    fn others_checked(&self, uid: u32) -> bool {
        self.default_permissions || self.allow_other || uid != 0
    }

    /// Whether POSIX ACLs are on for a mount whose `user_id` is `uid`: as `-o acl` or
    /// `-o noacl` say, else wherever the kernel checks permissions anyway.
    ///
    /// Why not on a root-only mount by default: only root's processes reach it, whom no ACL
    /// restricts or grants anything, and ACLs would cost a round trip per create there. The
    /// kernel checks permissions itself whenever it takes ACLs, and it fetches a directory's
    /// attributes again after every change in it to do so (measured in docs/benchmarks.md,
    /// "ACLs"). Where permissions are checked already (`allow_other`, a user's mount,
    /// `default_permissions`) that round trip is paid with or without ACLs, and ACLs cost one
    /// GETXATTR per file the first time `ls -l` lists it: the kernel forgets a file's cached
    /// ACL whenever it refreshes the file's attributes, and a file just listed has none.
    pub fn acl_on(&self, uid: u32) -> bool {
        self.acl.unwrap_or_else(|| self.others_checked(uid))
    }

    /// `acl_on` for the mount this process makes.
    pub fn acl_here(&self) -> bool {
        self.acl_on(real_uid())
    }

    /// Whether workers are pinned one per CPU: as asked, else when there are at least as many
    /// workers as allowed CPUs.
    pub fn pins_threads(&self) -> bool {
        self.pin
            .unwrap_or_else(|| self.threads() >= crate::pin::allowed_cpus().len().max(1))
    }

    /// /dev/fuse worker threads: as asked, else 2.
    pub fn threads(&self) -> usize {
        self.threads.unwrap_or(2)
    }

    /// The configuration beside io_uring: unless asked otherwise, one unpinned /dev/fuse worker
    /// for FORGET and INTERRUPT. Measured here, `rm -rf` of 20,000 files ran 15-40% slower
    /// with two pinned /dev/fuse workers next to the rings: each FORGET woke a worker on a
    /// CPU the caller and the ring worker were using.
    pub fn beside_uring(&self) -> MountConfig {
        let mut c = self.clone();
        if c.threads.is_none() {
            c.threads = Some(1);
            c.pin.get_or_insert(false);
        }
        c
    }

    /// mount(2) flags: nodev and nosuid unless `dev` / `suid` (as fuser and libfuse do).
    pub fn kernel_flags(&self) -> libc::c_ulong {
        let has = |o: &MountOption| {
            self.flags.iter().rev().find(|f| {
                use MountOption::*;
                matches!(
                    (*f, o),
                    (Dev | NoDev, Dev)
                        | (Suid | NoSuid, Suid)
                        | (Exec | NoExec, Exec)
                        | (Sync | Async, Sync)
                )
            })
        };
        let mut f = 0;
        if has(&MountOption::Dev) != Some(&MountOption::Dev) {
            f |= libc::MS_NODEV;
        }
        if has(&MountOption::Suid) != Some(&MountOption::Suid) {
            f |= libc::MS_NOSUID;
        }
        if has(&MountOption::Exec) == Some(&MountOption::NoExec) {
            f |= libc::MS_NOEXEC;
        }
        if has(&MountOption::Sync) == Some(&MountOption::Sync) {
            f |= libc::MS_SYNCHRONOUS;
        }
        if self.flags.contains(&MountOption::DirSync) {
            f |= libc::MS_DIRSYNC;
        }
        for o in &self.flags {
            if let Some((_, flag, on)) =
                vfs_word_of(o).and_then(|w| VFS_FLAGS.iter().find(|(x, _, _)| *x == w))
            {
                if *on {
                    f |= flag;
                }
            }
        }
        if self.read_only {
            f |= libc::MS_RDONLY;
        }
        f |= match self.atime {
            Atime::NoAtime => libc::MS_NOATIME,
            Atime::Relatime => libc::MS_RELATIME,
            Atime::Strict => libc::MS_STRICTATIME,
        };
        f
    }

    /// The fuser session configuration for an image at `source`.
    pub fn fuser_config(&self, source: &str) -> Config {
        let mut mount_options = vec![
            MountOption::FSName(self.fsname.clone().unwrap_or_else(|| source.to_string())),
            MountOption::Subtype("idxfs".into()),
            if self.read_only {
                MountOption::RO
            } else {
                MountOption::RW
            },
        ];
        if self.atime == Atime::NoAtime {
            mount_options.push(MountOption::NoAtime);
        }
        if self.kernel_checks_permissions(real_uid()) {
            mount_options.push(MountOption::DefaultPermissions);
        }
        // Later flags override earlier conflicting ones, as mount(8) reads them.
        for f in &self.flags {
            let opposite = |a: &MountOption, b: &MountOption| {
                use MountOption::*;
                matches!(
                    (a, b),
                    (Dev, NoDev)
                        | (NoDev, Dev)
                        | (Suid, NoSuid)
                        | (NoSuid, Suid)
                        | (Exec, NoExec)
                        | (NoExec, Exec)
                        | (Sync, Async)
                        | (Async, Sync)
                )
            };
            mount_options.retain(|m| m != f && !opposite(m, f));
            mount_options.push(f.clone());
        }
        let mut c = Config::default();
        c.mount_options = mount_options;
        c.acl = if self.allow_other {
            SessionACL::All
        } else {
            SessionACL::Owner
        };
        c.n_threads = Some(self.threads());
        c.clone_fd = true;
        c
    }
}

/// The VFS word a custom option carries, if it is one of `VFS_FLAGS`.
fn vfs_word_of(o: &MountOption) -> Option<&str> {
    match o {
        MountOption::CUSTOM(w) if VFS_FLAGS.iter().any(|(x, _, _)| x == w) => Some(w),
        _ => None,
    }
}

/// Whether two VFS words set or clear the same flag (the later one wins).
fn same_flag(a: &str, b: &str) -> bool {
    let flag = |w: &str| VFS_FLAGS.iter().find(|(x, _, _)| *x == w).map(|f| f.1);
    flag(a).is_some() && flag(a) == flag(b)
}

/// The real uid of this process: the `user_id` of the mount (mount(2) here, or fusermount3),
/// whose processes the kernel admits without `allow_other`.
fn real_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_standard_options() {
        let mut c = MountConfig::default();
        c.apply("ro,noatime,allow_other,default_permissions,fsname=img,nodev,defaults,_netdev")
            .expect("valid");
        assert!(c.read_only && c.allow_other);
        assert_eq!(c.atime, Atime::NoAtime);
        assert_eq!(c.fsname.as_deref(), Some("img"));
        c.apply("rw,strictatime,ttl=0.5,threads=4").expect("valid");
        assert!(!c.read_only);
        assert_eq!(c.atime, Atime::Strict);
        assert_eq!(c.ttl, Duration::from_millis(500));
        assert_eq!(c.threads(), 4);
        assert_eq!(c.beside_uring().threads(), 4, "as asked");
        let f = c.fuser_config("/x.img");
        assert!(f.mount_options.contains(&MountOption::NoDev));
        assert!(f.mount_options.contains(&MountOption::FSName("img".into())));
        assert_eq!(f.acl, SessionACL::All);
        let k = c.kernel_flags();
        assert_eq!(k & libc::MS_NODEV, libc::MS_NODEV);
        assert_eq!(k & libc::MS_STRICTATIME, libc::MS_STRICTATIME);
        c.apply("threads=64").expect("valid");
        assert_eq!(
            c.pins_threads(),
            64 >= crate::pin::allowed_cpus().len(),
            "pinned when the workers cover the CPUs"
        );
        c.apply("nopin").expect("valid");
        assert!(!c.pins_threads());
        c.apply("threads=1,pin").expect("valid");
        assert!(c.pins_threads());
        assert_eq!(c.uring, None, "io_uring when the kernel allows it");
        let d = MountConfig::default();
        assert_eq!((d.threads(), d.beside_uring().threads()), (2, 1));
        assert!(!d.beside_uring().pins_threads());
        c.apply("uring").expect("valid");
        assert_eq!(c.uring, Some(true));
        c.apply("nouring").expect("valid");
        assert_eq!(c.uring, Some(false));
        assert!(!c.readdirplus_auto, "readdirplus always by default");
        c.apply("readdirplus=auto").expect("valid");
        assert!(c.readdirplus_auto);
        c.apply("readdirplus=always").expect("valid");
        assert!(!c.readdirplus_auto);
        assert_eq!(
            c.on_damage,
            OnDamage::ReadOnly,
            "errors=remount-ro by default"
        );
        c.apply("errors=continue").expect("valid");
        assert_eq!(c.on_damage, OnDamage::Continue);
        c.apply("errors=remount-ro").expect("valid");
        assert_eq!(c.on_damage, OnDamage::ReadOnly);
        assert!(c.apply("errors=panic").is_err());
        c.apply("dev,suid,noexec").expect("valid");
        let k = c.kernel_flags();
        assert_eq!(k & (libc::MS_NODEV | libc::MS_NOSUID), 0);
        assert_eq!(k & libc::MS_NOEXEC, libc::MS_NOEXEC);
    }

    #[test]
    fn holes_are_asked_for_and_never_beside_writeback() {
        let mut c = MountConfig::default();
        assert!(!c.holes, "the kernel answers lseek by default");
        c.apply("holes").expect("valid");
        assert!(c.holes && c.check().is_ok());
        c.apply("writeback").expect("valid");
        assert!(c.check().is_err(), "holes beside writeback");
        c.apply("noholes").expect("valid");
        assert!(!c.holes && c.check().is_ok());
    }

    #[test]
    fn the_kernel_checks_permissions_unless_only_root_can_reach_the_mount() {
        let mut d = MountConfig::default();
        assert!(
            !d.kernel_checks_permissions(0),
            "root mount, root callers only"
        );
        d.apply("acl").expect("valid");
        assert!(d.kernel_checks_permissions(0), "ACLs asked for");
        let d = MountConfig::default();
        assert!(
            d.kernel_checks_permissions(1000),
            "a user's mount: its own mode bits apply"
        );
        let mut c = MountConfig::default();
        c.apply("noacl,allow_other").expect("valid");
        assert!(c.kernel_checks_permissions(0), "other users reach it");
        let mut c = MountConfig::default();
        c.apply("default_permissions").expect("valid");
        assert!(c.kernel_checks_permissions(0), "asked for");
        let asked = c.fuser_config("/x.img").mount_options;
        assert!(asked.contains(&MountOption::DefaultPermissions));
    }

    #[test]
    fn acls_are_on_where_the_kernel_checks_permissions_unless_said() {
        let d = MountConfig::default();
        assert!(!d.acl_on(0), "root-only mount");
        assert!(d.acl_on(1000), "a user's mount");
        for (opts, root) in [
            ("allow_other", true),
            ("default_permissions", true),
            ("acl", true),
            ("allow_other,noacl", false),
            ("noacl,acl", true),
        ] {
            let mut c = MountConfig::default();
            c.apply(opts).expect("valid");
            assert_eq!(c.acl_on(0), root, "{opts}");
        }
        let mut c = MountConfig::default();
        c.apply("noacl").expect("valid");
        assert!(!c.acl_on(1000), "noacl wins on a user's mount too");
    }

    #[test]
    fn standard_vfs_words_are_accepted_and_sync_modes_reach_the_engine() {
        let mut c = MountConfig::default();
        c.apply("nodiratime,lazytime,iversion,nomand,silent,norelatime")
            .expect("valid");
        assert_eq!(c.atime, Atime::Strict, "norelatime is strictatime");
        let k = c.kernel_flags();
        assert_eq!(k & libc::MS_NODIRATIME, libc::MS_NODIRATIME);
        assert_eq!(k & libc::MS_LAZYTIME, libc::MS_LAZYTIME);
        c.apply("diratime").expect("valid");
        assert_eq!(
            c.kernel_flags() & libc::MS_NODIRATIME,
            0,
            "the later word wins"
        );
        assert_eq!(c.sync, SyncMode::Async);
        c.apply("dirsync").expect("valid");
        assert_eq!(c.sync, SyncMode::Dirs);
        assert_eq!(c.kernel_flags() & libc::MS_DIRSYNC, libc::MS_DIRSYNC);
        c.apply("sync,dirsync").expect("valid");
        assert_eq!(c.sync, SyncMode::All, "sync covers dirsync");
        c.apply("async").expect("valid");
        assert_eq!(c.sync, SyncMode::Async);
        assert_eq!(
            c.kernel_flags() & (libc::MS_SYNCHRONOUS | libc::MS_DIRSYNC),
            0
        );
        // What mount.fuse3 passes on `mount -o remount,ro DIR`.
        let mut r = MountConfig::default();
        r.apply("ro,nosuid,nodev,relatime,remount,nodiratime,user_id=0,group_id=0")
            .expect("valid");
        assert!(r.remount && r.read_only);
    }

    #[test]
    fn rejects_unknown_and_bad_values() {
        let mut c = MountConfig::default();
        assert!(c.apply("frobnicate").is_err());
        assert!(c.apply("threads=0").is_err());
        assert!(c.apply("ttl=-1").is_err());
        assert!(c.apply("fsname").is_err());
        assert!(c.apply("readdirplus").is_err());
        assert!(c.apply("readdirplus=never").is_err());
    }
}
