//! The source tree of a copy, read relative to open directories: every entry is stat'ed,
//! opened and read by its name in its directory's descriptor (`fstatat`, `openat`,
//! `readlinkat`), and a regular file's xattrs through its open descriptor, so a file costs
//! no walk of its whole path: by path, each of lstat, open and llistxattr would look up every
//! component of `DIR/d00042/f0042137` again, for every file.
//!
//! Directories are opened by path (once each, when the walk reaches them; `DirPath`), so the
//! walk holds one directory descriptor at a time however wide the tree is. A path that would
//! grow past `ANCHOR_BYTES` starts again from an open ancestor instead, so a tree deeper than
//! PATH_MAX is copied too (as `cp -a` and tar copy it), with one descriptor held per
//! `ANCHOR_BYTES` of the deepest path, and no open resolving more than that many bytes.
use std::ffi::{CStr, CString, OsStr, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One entry of a listing: its name and the type `getdents` gave (`libc::DT_*`;
/// `DT_UNKNOWN` where the source file system does not say).
pub(super) struct Entry {
    pub name: OsString,
    pub dtype: u8,
}

/// What `fstat` gave for an entry (not followed if a symlink).
#[derive(Clone, Copy)]
pub(super) struct Stat(libc::stat64);

impl Stat {
    pub fn mode(&self) -> u32 {
        self.0.st_mode
    }
    fn kind(&self) -> u32 {
        self.0.st_mode & libc::S_IFMT
    }
    pub fn is_dir(&self) -> bool {
        self.kind() == libc::S_IFDIR
    }
    pub fn is_file(&self) -> bool {
        self.kind() == libc::S_IFREG
    }
    pub fn is_symlink(&self) -> bool {
        self.kind() == libc::S_IFLNK
    }
    pub fn uid(&self) -> u32 {
        self.0.st_uid
    }
    pub fn gid(&self) -> u32 {
        self.0.st_gid
    }
    pub fn rdev(&self) -> u64 {
        self.0.st_rdev
    }
    pub fn size(&self) -> u64 {
        self.0.st_size.max(0) as u64
    }
    /// 512-byte blocks allocated.
    pub fn blocks(&self) -> u64 {
        self.0.st_blocks.max(0) as u64
    }
    pub fn nlink(&self) -> u64 {
        self.0.st_nlink
    }
    pub fn dev(&self) -> u64 {
        self.0.st_dev
    }
    pub fn ino(&self) -> u64 {
        self.0.st_ino
    }
    /// (seconds, nanoseconds) of the access, modification and change times.
    pub fn times(&self) -> [(i64, i64); 3] {
        let s = &self.0;
        [
            (s.st_atime, s.st_atime_nsec),
            (s.st_mtime, s.st_mtime_nsec),
            (s.st_ctime, s.st_ctime_nsec),
        ]
    }
}

fn cstr(name: &OsStr) -> std::io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

/// `r` as a result: the errno of the call when it is negative.
fn check(r: libc::c_int) -> std::io::Result<libc::c_int> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Opens `name` in `dir` (or the path itself when `dir` is None) with `flags` and O_NOATIME,
/// so reading it leaves its atime alone; without O_NOATIME when the caller may not use it
/// (only the owner or CAP_FOWNER may).
fn open_noatime(dir: Option<RawFd>, name: &CStr, flags: i32) -> std::io::Result<OwnedFd> {
    let open = |more: i32| {
        let at = dir.unwrap_or(libc::AT_FDCWD);
        // SAFETY: a NUL-terminated name; the descriptor returned is owned by the caller.
        check(unsafe { libc::openat(at, name.as_ptr(), flags | more | libc::O_CLOEXEC) })
            // SAFETY: a descriptor openat just returned, owned by nobody else.
            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
    };
    open(libc::O_NOATIME).or_else(|e| match e.raw_os_error() {
        Some(libc::EPERM) => open(0),
        _ => Err(e),
    })
}

/// The longest path a `DirPath` resolves from its anchor (or the working directory): a
/// quarter of PATH_MAX, so an entry's name (at most 255 bytes) always fits after it.
const ANCHOR_BYTES: usize = libc::PATH_MAX as usize / 4;

/// Where a directory of the source tree is: a path from the working directory (the one
/// given, then its subdirectories' names appended), or, once that would pass `ANCHOR_BYTES`,
/// a path from an open ancestor. An anchor is shared by every directory below it until the
/// next one, and closed when the last of them is done.
#[derive(Clone)]
pub(super) struct DirPath {
    anchor: Option<Arc<OwnedFd>>,
    /// From the anchor, or from the working directory without one.
    rel: PathBuf,
    /// The path the walk started from, for messages.
    given: Arc<PathBuf>,
}

impl DirPath {
    /// The directory at `path`.
    pub fn new(path: &Path) -> DirPath {
        DirPath {
            anchor: None,
            rel: path.to_path_buf(),
            given: Arc::new(path.to_path_buf()),
        }
    }

    /// For messages: the whole path while it has no anchor, else the path the walk started
    /// from and the part below the deepest anchor, joined by "…", so that a message stays
    /// one line of bounded length however deep the tree.
    pub fn shown(&self) -> PathBuf {
        match &self.anchor {
            None => self.rel.clone(),
            Some(_) => self.given.join("…").join(&self.rel),
        }
    }

    /// Opens it (not followed if a symlink).
    pub fn open(&self) -> std::io::Result<Dir> {
        let c = cstr(self.rel.as_os_str())?;
        let fd = open_noatime(
            self.anchor.as_ref().map(|a| a.as_raw_fd()),
            &c,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        )?;
        Ok(Dir { fd: Arc::new(fd) })
    }

    /// Its subdirectory `name`; `open` is this directory, open (the next anchor, should the
    /// path grow too long).
    pub fn child(&self, open: &Dir, name: &OsStr) -> DirPath {
        if self.rel.as_os_str().len() + 1 + name.len() <= ANCHOR_BYTES {
            return DirPath {
                anchor: self.anchor.clone(),
                rel: self.rel.join(name),
                given: self.given.clone(),
            };
        }
        DirPath {
            anchor: Some(open.fd.clone()),
            rel: PathBuf::from(name),
            given: self.given.clone(),
        }
    }

    /// The path of entry `name` of this directory for the calls that take one (llistxattr,
    /// lgetxattr): below an anchor, through the anchor's descriptor in /proc.
    pub fn entry(&self, name: &OsStr) -> std::io::Result<CString> {
        let p = self.rel.join(name);
        match &self.anchor {
            None => cstr(p.as_os_str()),
            Some(a) => {
                let proc = PathBuf::from(format!("/proc/self/fd/{}", a.as_raw_fd()));
                cstr(proc.join(p).as_os_str())
            }
        }
    }
}

/// An open directory of the source tree; shared as the anchor of the directories below it
/// whose paths from the last anchor grew too long (`DirPath::child`).
pub(super) struct Dir {
    fd: Arc<OwnedFd>,
}

impl Dir {
    /// The directory's own extended attributes (`XattrsOf::read`).
    pub fn xattrs(&self) -> Result<super::Xattrs, String> {
        XattrsOf::Fd(self.fd.as_raw_fd()).read()
    }

    /// The directory's own attributes.
    pub fn stat_self(&self) -> std::io::Result<Stat> {
        fd_stat(self.fd.as_raw_fd())
    }

    /// The entries of the directory (not "." and ".."), read without moving its atime.
    pub fn entries(&self) -> std::io::Result<Vec<Entry>> {
        // The stream gets a descriptor of its own (closedir closes it); both share one open
        // file, whose position only the stream moves.
        // SAFETY: dup of a descriptor we own.
        let fd = check(unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) })?;
        // SAFETY: a descriptor of our own, which the stream owns from here.
        let d = unsafe { libc::fdopendir(fd) };
        if d.is_null() {
            let e = std::io::Error::last_os_error();
            // SAFETY: fdopendir failed, so the descriptor is still ours.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        // SAFETY: the stream was just opened: start from its first entry.
        unsafe { libc::rewinddir(d) };
        let mut out = Vec::new();
        let r = loop {
            // readdir reports an error only through errno, which it leaves alone at the end.
            // SAFETY: errno is this thread's.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: a stream we opened; the entry is used before the next call.
            let e = unsafe { libc::readdir64(d) };
            if e.is_null() {
                let err = std::io::Error::last_os_error();
                break if err.raw_os_error() == Some(0) {
                    Ok(())
                } else {
                    Err(err)
                };
            }
            // SAFETY: d_name is NUL-terminated within the entry.
            let name = unsafe { CStr::from_ptr((*e).d_name.as_ptr()) }.to_bytes();
            if name != b"." && name != b".." {
                out.push(Entry {
                    name: OsString::from_vec(name.to_vec()),
                    // SAFETY: the entry is valid until the next readdir.
                    dtype: unsafe { (*e).d_type },
                });
            }
        };
        // SAFETY: the stream opened above, closed once.
        unsafe { libc::closedir(d) };
        r.map(|()| out)
    }

    /// `name`'s attributes (not followed if a symlink).
    pub fn stat(&self, name: &OsStr) -> std::io::Result<Stat> {
        let c = cstr(name)?;
        let mut st = std::mem::MaybeUninit::<libc::stat64>::zeroed();
        // SAFETY: a NUL-terminated name and a stat buffer to fill.
        check(unsafe {
            libc::fstatat64(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                st.as_mut_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })?;
        // SAFETY: fstatat filled it.
        Ok(Stat(unsafe { st.assume_init() }))
    }

    /// Opens the regular file `name` for reading (never following a symlink, never
    /// blocking on a FIFO put in its place since its stat).
    pub fn open_file(&self, name: &OsStr) -> std::io::Result<std::fs::File> {
        let c = cstr(name)?;
        let fd = open_noatime(
            Some(self.fd.as_raw_fd()),
            &c,
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        )?;
        Ok(std::fs::File::from(fd))
    }

    /// Opens `name` as `open_file` does and stats it through the descriptor: the file and
    /// its attributes when it is a regular file, None when it is something else now (the
    /// caller then stats it by name; it was closed unread).
    pub fn open_regular(&self, name: &OsStr) -> std::io::Result<Option<(std::fs::File, Stat)>> {
        let f = match self.open_file(name) {
            Ok(f) => f,
            // A symlink now (O_NOFOLLOW), or a device or FIFO whose driver refused.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENXIO)) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        let m = fd_stat(f.as_raw_fd())?;
        Ok(m.is_file().then_some((f, m)))
    }

    /// The target of the symlink `name`.
    pub fn read_link(&self, name: &OsStr) -> std::io::Result<Vec<u8>> {
        let c = cstr(name)?;
        let mut buf = vec![0u8; 256];
        loop {
            // SAFETY: the buffer is valid for its length; the name is NUL-terminated.
            let n = unsafe {
                libc::readlinkat(
                    self.fd.as_raw_fd(),
                    c.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            if n < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let n = n as usize;
            if n < buf.len() {
                buf.truncate(n);
                return Ok(buf);
            }
            // Perhaps cut short: again with room to spare (a target is at most PATH_MAX).
            if buf.len() > libc::PATH_MAX as usize {
                return Err(std::io::Error::from_raw_os_error(libc::ENAMETOOLONG));
            }
            buf.resize(buf.len() * 4, 0);
        }
    }
}

/// `fstat` of an open descriptor.
pub(super) fn fd_stat(fd: RawFd) -> std::io::Result<Stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat64>::zeroed();
    // SAFETY: a descriptor we hold and a stat buffer to fill.
    check(unsafe { libc::fstat64(fd, st.as_mut_ptr()) })?;
    // SAFETY: fstat filled it.
    Ok(Stat(unsafe { st.assume_init() }))
}

/// Where the xattrs of an entry are read from.
pub(super) enum XattrsOf<'a> {
    /// An open descriptor of it (a regular file being read, a directory).
    Fd(RawFd),
    /// Its path (symlinks and special files, which are not opened).
    Path(&'a CStr),
}

impl XattrsOf<'_> {
    fn list(&self, buf: &mut [u8]) -> isize {
        match self {
            // SAFETY: the buffer is valid for its length; the descriptor is open.
            XattrsOf::Fd(fd) => unsafe {
                libc::flistxattr(*fd, buf.as_mut_ptr().cast(), buf.len())
            },
            // SAFETY: as above, with a NUL-terminated path.
            XattrsOf::Path(p) => unsafe {
                libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
            },
        }
    }

    fn get(&self, name: &CStr, buf: &mut [u8]) -> isize {
        match self {
            // SAFETY: the buffer is valid for its length; the descriptor is open; the name
            // is NUL-terminated.
            XattrsOf::Fd(fd) => unsafe {
                libc::fgetxattr(*fd, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
            },
            // SAFETY: as above, with a NUL-terminated path.
            XattrsOf::Path(p) => unsafe {
                libc::lgetxattr(
                    p.as_ptr(),
                    name.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            },
        }
    }

    /// Every extended attribute the caller may read, as (name, value); none where the source
    /// file system keeps none. Err: one line saying which call failed.
    pub fn read(&self) -> Result<super::Xattrs, String> {
        let mut list = vec![0u8; 1024];
        let len = loop {
            let n = self.list(&mut list);
            if n >= 0 {
                break n as usize;
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ENOTSUP) => return Ok(Vec::new()),
                Some(libc::ERANGE) => list.resize(list.len() * 4, 0),
                _ => return Err(format!("listing xattrs: {e}")),
            }
        };
        let mut out = Vec::new();
        for name in list[..len].split(|&b| b == 0).filter(|n| !n.is_empty()) {
            let cn = CString::new(name).map_err(|e| format!("xattr name: {e}"))?;
            let mut val = vec![0u8; 256];
            loop {
                let n = self.get(&cn, &mut val);
                if n >= 0 {
                    val.truncate(n as usize);
                    out.push((name.to_vec(), val));
                    break;
                }
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    // Removed since the list: not there to copy.
                    Some(libc::ENODATA) => break,
                    Some(libc::ERANGE) if val.len() < 1 << 20 => val.resize(val.len() * 4, 0),
                    _ => {
                        let n = String::from_utf8_lossy(name);
                        return Err(format!("reading xattr {n}: {e}"));
                    }
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_past_path_max_opens_from_anchors_and_shows_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let name = |i: usize| OsString::from(format!("level-{i:05}"));
        let levels = 3 * libc::PATH_MAX as usize / name(0).len();
        // Made through the walk's own handles, each level's name from the one above.
        let mut at = DirPath::new(dir.path());
        for i in 0..levels {
            let d = at.open().expect("open");
            let c = cstr(&name(i)).expect("name");
            // SAFETY: a NUL-terminated name in an open directory.
            let r = unsafe { libc::mkdirat(d.fd.as_raw_fd(), c.as_ptr(), 0o755) };
            assert_eq!(r, 0, "mkdirat: {}", std::io::Error::last_os_error());
            at = at.child(&d, &name(i));
            let shown = at.shown();
            assert!(shown.ends_with(name(i)), "{}", shown.display());
            let bound = dir.path().as_os_str().len() + ANCHOR_BYTES + 8;
            assert!(shown.as_os_str().len() <= bound, "{}", shown.display());
        }
        assert!(at.shown().to_string_lossy().contains("/…/"));
        let d = at.open().expect("the bottom opens");
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC;
        // SAFETY: a NUL-terminated name in an open directory; the descriptor is closed here.
        let fd = check(unsafe { libc::openat(d.fd.as_raw_fd(), c"bottom".as_ptr(), flags, 0o644) });
        // SAFETY: just opened, closed once.
        unsafe { libc::close(fd.expect("create")) };
        assert!(d.stat(OsStr::new("bottom")).expect("stat").is_file());
        let mut st = std::mem::MaybeUninit::<libc::stat64>::zeroed();
        let p = at.entry(OsStr::new("bottom")).expect("path");
        assert!(p.as_bytes().len() < libc::PATH_MAX as usize);
        // SAFETY: a NUL-terminated path and a stat buffer.
        let r = unsafe { libc::lstat64(p.as_ptr(), st.as_mut_ptr()) };
        assert_eq!(
            r,
            0,
            "lstat by entry(): {}",
            std::io::Error::last_os_error()
        );
    }
}
