//! `idxfs mkfs --from DIR IMAGE`: a directory tree copied into a new image through the
//! engine's library API, with no FUSE round trip (and no kernel page cache) per file.
//!
//! Two threads share the work. The reader (`walk`) lists DIR and reads what each entry holds:
//! its metadata, data, symlink target and xattrs. The writer (`Writer`, the calling thread)
//! makes it in the image. They meet in a bounded channel of batches, so a tree of any size is
//! copied in bounded memory (`QUEUE` batches of at most `BATCH_BYTES` data each, and one
//! chunk of a large file at a time), and the threads wake each other once a batch, not once
//! a file.
//!
//! What is kept: every entry's type, permission bits (set-user-ID, set-group-ID and sticky
//! included), owner and group, atime, mtime and ctime to the nanosecond (ctime as
//! `mke2fs -d` keeps it, which `cp -a` cannot), device numbers, symlink targets, extended
//! attributes (POSIX ACLs and `security.capability` included), hard links (one inode, every
//! name) and holes (only a sparse file's data ranges are read and written, found with
//! SEEK_DATA / SEEK_HOLE).
//!
//! Order: a directory's entries are made in name order, all of them before any entry of a
//! subdirectory, so a directory's children get consecutive inode numbers and its readdir,
//! which walks inode order (seed 002), reads them where they sit. An entry's xattrs and
//! attributes are set after everything that would move them: a file's after its data (a
//! write drops `security.capability`), a directory's after its last child is made (each
//! child moves the directory's mtime, and a default ACL set earlier would be inherited by
//! children whose own ACLs are copied as they are). The owner is set with the mode in one
//! setattr, so a chown cannot drop set-user-ID. A name linked to an inode made earlier moves
//! that inode's ctime; such inodes get their attributes again at the end.
//!
//! Not kept: inode flags (`chattr`), and what a file becomes while it is read (a file that
//! changes during the copy is copied as the reads saw it, with the size its `lstat` gave).
//! The walk crosses into file systems mounted below DIR, as `cp -a` does.
use crate::mkfs::MkfsArgs;
use idxfs_engine::fs::{Ino, NewFile, Owner, SetAttr, SetTime, Time, WriteHow, NEW_FILE_MAX};
use idxfs_engine::Fs;
use std::collections::HashMap;
use std::ffi::{CString, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::time::{Duration, Instant};

/// The most file bytes one `Item::Data` carries.
const CHUNK: usize = 1 << 20;
/// A batch goes to the writer once it holds this many items or `BATCH_BYTES` of data.
const BATCH_ITEMS: usize = 512;
const BATCH_BYTES: usize = 4 << 20;
/// Batches in flight between the reader and the writer.
const QUEUE: usize = 8;

/// An entry's attributes, as `lstat` gave them.
#[derive(Clone, Copy)]
struct Attrs {
    /// Type and permission bits (`st_mode`).
    mode: u32,
    uid: u32,
    gid: u32,
    rdev: u64,
    size: u64,
    atime: Time,
    mtime: Time,
    ctime: Time,
}

impl Attrs {
    fn of(m: &std::fs::Metadata) -> Attrs {
        let t = |sec: i64, nsec: i64| Time {
            sec,
            nsec: nsec.clamp(0, 999_999_999) as u32,
        };
        Attrs {
            mode: m.mode(),
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev(),
            size: m.size(),
            atime: t(m.atime(), m.atime_nsec()),
            mtime: t(m.mtime(), m.mtime_nsec()),
            ctime: t(m.ctime(), m.ctime_nsec()),
        }
    }

    fn owner(&self) -> Owner {
        Owner {
            uid: self.uid,
            gid: self.gid,
        }
    }

    /// Everything a setattr can set back: owner, mode and times (the size is the data's).
    fn set(&self) -> SetAttr {
        SetAttr {
            mode: Some(self.mode & 0o7777),
            uid: Some(self.uid),
            gid: Some(self.gid),
            atime: Some(SetTime::At(self.atime)),
            mtime: Some(SetTime::At(self.mtime)),
            ctime: Some(self.ctime),
            ..SetAttr::default()
        }
    }
}

type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// What a new name is.
enum Kind {
    /// A directory; its entries name it by `id`.
    Dir {
        id: usize,
    },
    /// A regular file: all its bytes when it has at most `NEW_FILE_MAX` and no holes, else
    /// none here and its data ranges in the `Item::Data` that follow.
    File {
        whole: Option<Vec<u8>>,
    },
    Symlink(Vec<u8>),
    /// A fifo, socket, or character or block device.
    Special,
    /// Another name of the inode made as `Link::First(id)`.
    Link(u64),
}

/// What the reader sends, in the order the writer acts on it.
enum Item {
    /// A new name in directory `parent` (an id from a `Kind::Dir`, 0 for DIR itself).
    Make {
        parent: usize,
        name: Vec<u8>,
        /// For messages: where it came from.
        path: PathBuf,
        kind: Kind,
        attrs: Attrs,
        xattrs: Xattrs,
        /// The first of several names of one inode: later `Kind::Link(id)` names link to it.
        first_link: Option<u64>,
    },
    /// Bytes at `off` of the file made last.
    Data { off: u64, bytes: Vec<u8> },
    /// Directory `id` has every entry: its own xattrs and attributes.
    DirDone {
        id: usize,
        path: PathBuf,
        attrs: Attrs,
        xattrs: Xattrs,
    },
}

/// What a copy made.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Totals {
    pub dirs: u64,
    pub files: u64,
    pub symlinks: u64,
    pub specials: u64,
    /// Names beyond an inode's first.
    pub links: u64,
    /// File bytes written (holes not counted).
    pub bytes: u64,
}

impl Totals {
    pub fn entries(&self) -> u64 {
        self.dirs + self.files + self.symlinks + self.specials + self.links
    }
}

/// `idxfs mkfs --from DIR`: formats `a.image` (sized for `dir` when new and no size is
/// given), copies the tree in and commits it. Returns what was copied and the seconds it
/// took. An image file this made is removed again when the copy fails.
pub(crate) fn mkfs_from(a: &MkfsArgs, dir: &Path) -> Result<(Totals, f64), String> {
    let start = Instant::now();
    let d = dir.display();
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("{d}: not a directory")),
        Err(e) => return Err(format!("{d}: {e}")),
    }
    let made = !a.image.exists();
    let (size, expect) = match a.size {
        Some(s) => (Some(s), 0),
        None if made => {
            let (s, n) = estimate(dir)?;
            (Some(s), n)
        }
        None => (None, 0),
    };
    let dev = crate::mkfs::mkfs(&MkfsArgs { size, ..*a })?;
    let copied = (|| {
        let _lock = crate::lock_image(a.image, true, Duration::ZERO)?;
        let fs = Fs::open(dev, idxfs_engine::OpenOptions::default())
            .map_err(|e| format!("{}: {e}", a.image.display()))?;
        let totals = import(&fs, dir, expect);
        // Commits what was copied, also after a failure (the image then holds part of it).
        let closed = fs
            .close()
            .map_err(|e| format!("{}: the last commit: {e}", a.image.display()));
        totals.and_then(|t| closed.map(|()| t))
    })();
    if copied.is_err() && made {
        let _ = std::fs::remove_file(a.image);
    }
    copied.map(|t| (t, start.elapsed().as_secs_f64()))
}

/// An estimate of the image size `dir` needs: its data rounded to blocks, room for its
/// metadata, and the share idxfs keeps free (the reserves of `fs::reserve`), by one `lstat`
/// walk. Returns the size and the entries counted.
pub(crate) fn estimate(dir: &Path) -> Result<(u64, u64), String> {
    let mut data = 0u64;
    let mut entries = 0u64;
    let mut names = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for name in list(&d).map_err(|e| format!("{}: {e}", d.display()))? {
            let p = d.join(&name);
            let m = std::fs::symlink_metadata(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            entries += 1;
            names += name.len() as u64;
            if m.is_dir() {
                stack.push(p);
            } else if m.is_file() || m.file_type().is_symlink() {
                // Allocated bytes, so holes cost nothing; a file written since may need more.
                data += (m.blocks() * 512).min(m.size()).div_ceil(4096) * 4096;
            }
        }
    }
    // Per entry: the inode item, an entry in each directory index, a back reference and an
    // extent, with the B+trees' slack (leaves kept from half full), copied on write.
    let meta = entries * 1024 + names * 4;
    let size = (data + meta) / 4 * 5 + (64 << 20);
    Ok((size.div_ceil(1 << 20) << 20, entries))
}

/// Copies the tree under `dir` (its own attributes onto the root) into `fs`, which must be
/// empty. `expect`: the entries the walk should find, for the progress line (0: not known).
/// Errors are one line naming the source path.
pub(crate) fn import(fs: &Fs, dir: &Path, expect: u64) -> Result<Totals, String> {
    let root = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !root.is_dir() {
        return Err(format!("{}: not a directory", dir.display()));
    }
    let (tx, rx) = sync_channel(QUEUE);
    std::thread::scope(|s| {
        let reader = std::thread::Builder::new()
            .name("idxfs-import-read".into())
            .spawn_scoped(s, move || walk(dir, tx))
            .map_err(|e| format!("a reader thread: {e}"))?;
        let mut w = Writer::new(fs, expect);
        let wrote = w.run(&rx);
        // Unblocks a reader waiting to send, whatever the writer's result.
        drop(rx);
        let read = reader
            .join()
            .unwrap_or_else(|_| Err("the reader thread panicked".into()));
        w.progress.finish();
        // A read error ends the stream early, so it is the cause when both failed.
        read.and(wrote).map(|()| w.totals)
    })
}

// ---------------------------------------------------------------------------------------------
// The reader

/// Items on their way to the writer.
struct Batch {
    tx: SyncSender<Vec<Item>>,
    items: Vec<Item>,
    bytes: usize,
}

impl Batch {
    /// Queues `item`; sends the batch when full. Err: the writer has stopped.
    fn push(&mut self, item: Item) -> Result<(), Stopped> {
        if let Item::Data { bytes, .. } = &item {
            self.bytes += bytes.len();
        }
        self.items.push(item);
        if self.items.len() >= BATCH_ITEMS || self.bytes >= BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), Stopped> {
        self.bytes = 0;
        let items = std::mem::take(&mut self.items);
        if items.is_empty() {
            return Ok(());
        }
        self.tx.send(items).map_err(|_| Stopped)
    }
}

/// The writer stopped taking items (it failed, and says why itself).
struct Stopped;

/// Why the walk ended early.
enum WalkError {
    Stopped,
    /// One line naming the path.
    Failed(String),
}

impl From<Stopped> for WalkError {
    fn from(_: Stopped) -> Self {
        WalkError::Stopped
    }
}

fn failed(path: &Path, e: impl std::fmt::Display) -> WalkError {
    WalkError::Failed(format!("{}: {e}", path.display()))
}

/// Lists `dir` and reads every entry under it into `tx` (see the module notes for the order).
fn walk(dir: &Path, tx: SyncSender<Vec<Item>>) -> Result<(), String> {
    let mut out = Batch {
        tx,
        items: Vec::with_capacity(BATCH_ITEMS),
        bytes: 0,
    };
    match walk_into(dir, &mut out).and_then(|()| Ok(out.flush()?)) {
        Ok(()) | Err(WalkError::Stopped) => Ok(()),
        Err(WalkError::Failed(why)) => Err(why),
    }
}

fn walk_into(dir: &Path, out: &mut Batch) -> Result<(), WalkError> {
    // (dev, ino) of inodes with several names seen so far, to the id of their first name.
    let mut linked: HashMap<(u64, u64), u64> = HashMap::new();
    let mut next_dir = 1usize;
    let root = std::fs::symlink_metadata(dir).map_err(|e| failed(dir, e))?;
    // Directories whose entries are still to be made, the next one last.
    let mut todo = vec![(0usize, dir.to_path_buf(), root)];
    while let Some((id, path, meta)) = todo.pop() {
        let mut names = list(&path).map_err(|e| failed(&path, e))?;
        names.sort_unstable();
        let mut subdirs = Vec::new();
        for name in names {
            let p = path.join(&name);
            let m = std::fs::symlink_metadata(&p).map_err(|e| failed(&p, e))?;
            let attrs = Attrs::of(&m);
            let mut first_link = None;
            let ft = m.file_type();
            let kind = if ft.is_dir() {
                let kid = next_dir;
                next_dir += 1;
                subdirs.push((kid, p.clone(), m.clone()));
                Kind::Dir { id: kid }
            } else {
                // A name of an inode seen before is a link to it, whatever its type.
                if m.nlink() > 1 {
                    let n = linked.len() as u64;
                    match linked.entry((m.dev(), m.ino())) {
                        std::collections::hash_map::Entry::Occupied(o) => {
                            out.push(Item::Make {
                                parent: id,
                                name: name.into_vec(),
                                path: p,
                                kind: Kind::Link(*o.get()),
                                attrs,
                                xattrs: Vec::new(),
                                first_link: None,
                            })?;
                            continue;
                        }
                        std::collections::hash_map::Entry::Vacant(v) => {
                            v.insert(n);
                            first_link = Some(n);
                        }
                    }
                }
                if ft.is_file() {
                    Kind::File {
                        whole: read_whole(&p, &m)?,
                    }
                } else if ft.is_symlink() {
                    let t = std::fs::read_link(&p).map_err(|e| failed(&p, e))?;
                    Kind::Symlink(t.into_os_string().into_vec())
                } else {
                    Kind::Special
                }
            };
            let xattrs = xattrs_of(&p)?;
            let streamed = matches!(kind, Kind::File { whole: None });
            out.push(Item::Make {
                parent: id,
                name: name.into_vec(),
                path: p.clone(),
                kind,
                attrs,
                xattrs,
                first_link,
            })?;
            if streamed {
                read_data(&p, &m, out)?;
            }
        }
        let xattrs = xattrs_of(&path)?;
        out.push(Item::DirDone {
            id,
            attrs: Attrs::of(&meta),
            path,
            xattrs,
        })?;
        // Popped in name order.
        todo.extend(subdirs.into_iter().rev());
    }
    Ok(())
}

/// Opens `p` with `flags` and O_NOATIME, so reading it leaves its atime alone; without
/// O_NOATIME when the caller may not use it (only the owner or CAP_FOWNER may).
fn open_noatime(p: &Path, flags: i32) -> std::io::Result<std::fs::File> {
    let open = |more: i32| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags | more)
            .open(p)
    };
    open(libc::O_NOATIME).or_else(|e| match e.raw_os_error() {
        Some(libc::EPERM) => open(0),
        _ => Err(e),
    })
}

/// The names in directory `p` (not "." and ".."), read without moving its atime.
fn list(p: &Path) -> std::io::Result<Vec<OsString>> {
    use std::os::fd::IntoRawFd;
    let fd = open_noatime(p, libc::O_DIRECTORY | libc::O_NOFOLLOW)?.into_raw_fd();
    // SAFETY: an open directory descriptor, which the stream owns from here (closedir).
    let d = unsafe { libc::fdopendir(fd) };
    if d.is_null() {
        let e = std::io::Error::last_os_error();
        // SAFETY: fdopendir failed, so the descriptor is still ours.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    let mut names = Vec::new();
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
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) }.to_bytes();
        if name != b"." && name != b".." {
            names.push(OsString::from_vec(name.to_vec()));
        }
    };
    // SAFETY: the stream opened above, closed once.
    unsafe { libc::closedir(d) };
    r.map(|()| names)
}

/// Whether `m` may have holes: fewer blocks than its size needs.
fn maybe_sparse(m: &std::fs::Metadata) -> bool {
    m.blocks() * 512 < m.size()
}

/// All the bytes of the regular file at `p` when it is small and has no holes (see
/// `Kind::File`); None for the others, whose data `read_data` sends.
fn read_whole(p: &Path, m: &std::fs::Metadata) -> Result<Option<Vec<u8>>, WalkError> {
    let size = m.size();
    if size == 0 {
        return Ok(Some(Vec::new()));
    }
    if size > NEW_FILE_MAX as u64 || maybe_sparse(m) {
        return Ok(None);
    }
    let f = open_noatime(p, libc::O_NOFOLLOW).map_err(|e| failed(p, e))?;
    let mut bytes = vec![0u8; size as usize];
    let got = read_at(&f, 0, &mut bytes).map_err(|e| failed(p, e))?;
    // A file that shrank since its lstat: what was read is what there is.
    bytes.truncate(got);
    Ok(Some(bytes))
}

/// Sends the data ranges of the regular file at `p` as `Item::Data`.
fn read_data(p: &Path, m: &std::fs::Metadata, out: &mut Batch) -> Result<(), WalkError> {
    let f = open_noatime(p, libc::O_NOFOLLOW).map_err(|e| failed(p, e))?;
    let size = m.size();
    let ranges = if maybe_sparse(m) {
        data_ranges(&f, size).map_err(|e| failed(p, e))?
    } else {
        vec![(0, size)]
    };
    for (start, end) in ranges {
        let mut off = start;
        while off < end {
            let want = (end - off).min(CHUNK as u64) as usize;
            let mut bytes = vec![0u8; want];
            let got = read_at(&f, off, &mut bytes).map_err(|e| failed(p, e))?;
            bytes.truncate(got);
            if got > 0 {
                out.push(Item::Data { off, bytes })?;
            }
            if got < want {
                // The file shrank since its lstat: what was read is what there is.
                return Ok(());
            }
            off += got as u64;
        }
    }
    Ok(())
}

/// Reads from `off` until `buf` is full or the file ends; the bytes read.
fn read_at(f: &std::fs::File, off: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// The `[start, end)` ranges of `f` that hold data, below `size` (SEEK_DATA / SEEK_HOLE).
fn data_ranges(f: &std::fs::File, size: u64) -> std::io::Result<Vec<(u64, u64)>> {
    use std::os::fd::AsRawFd;
    let seek = |off: u64, whence: i32| -> std::io::Result<Option<u64>> {
        // SAFETY: lseek on a descriptor we own changes only its offset.
        let r = unsafe { libc::lseek(f.as_raw_fd(), off as libc::off_t, whence) };
        if r >= 0 {
            return Ok(Some(r as u64));
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            // No data at or past `off`.
            Some(libc::ENXIO) => Ok(None),
            _ => Err(e),
        }
    };
    let mut ranges = Vec::new();
    let mut off = 0;
    while off < size {
        let Some(start) = seek(off, libc::SEEK_DATA)? else {
            break;
        };
        if start >= size {
            break;
        }
        let end = seek(start, libc::SEEK_HOLE)?.unwrap_or(size).min(size);
        ranges.push((start, end));
        off = end;
    }
    Ok(ranges)
}

/// The extended attributes of `p` (not followed if a symlink), every namespace the caller may
/// read; none where the source file system has none.
fn xattrs_of(p: &Path) -> Result<Xattrs, WalkError> {
    let c = CString::new(p.as_os_str().as_bytes()).map_err(|e| failed(p, e))?;
    let mut list = vec![0u8; 1024];
    let len = loop {
        // SAFETY: the buffer is valid for its length; the path is NUL-terminated.
        let n = unsafe { libc::llistxattr(c.as_ptr(), list.as_mut_ptr().cast(), list.len()) };
        if n >= 0 {
            break n as usize;
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOTSUP) => return Ok(Vec::new()),
            Some(libc::ERANGE) => list.resize(list.len() * 4, 0),
            _ => return Err(failed(p, format!("listing xattrs: {e}"))),
        }
    };
    let mut out = Vec::new();
    for name in list[..len].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let cn = CString::new(name).map_err(|e| failed(p, e))?;
        let mut val = vec![0u8; 256];
        loop {
            // SAFETY: as above.
            let n = unsafe {
                libc::lgetxattr(c.as_ptr(), cn.as_ptr(), val.as_mut_ptr().cast(), val.len())
            };
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
                    return Err(failed(p, format!("reading xattr {n}: {e}")));
                }
            }
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// The writer

/// The file whose data is arriving: its attributes are set when the next item comes.
struct OpenFile {
    ino: Ino,
    path: PathBuf,
    attrs: Attrs,
    xattrs: Xattrs,
    /// The end of the data written so far.
    end: u64,
}

struct Writer<'a> {
    fs: &'a Fs,
    /// A directory's id (`Kind::Dir`) to its inode.
    dirs: Vec<Ino>,
    /// The first name's id of an inode with several names, to the inode and its attributes.
    links: HashMap<u64, (Ino, Attrs)>,
    /// Inodes that got another name after their attributes were set.
    relinked: Vec<u64>,
    open: Option<OpenFile>,
    totals: Totals,
    progress: Progress,
}

/// One line naming the source path of what failed.
fn at(path: &Path, what: &str, e: idxfs_engine::Error) -> String {
    match e {
        idxfs_engine::Error::NoSpace => format!(
            "{}: the image is full ({what}); give mkfs a larger --size",
            path.display()
        ),
        e => format!("{}: {what}: {e}", path.display()),
    }
}

impl<'a> Writer<'a> {
    fn new(fs: &'a Fs, expect: u64) -> Writer<'a> {
        Writer {
            fs,
            dirs: vec![idxfs_format::ROOT_INO],
            links: HashMap::new(),
            relinked: Vec::new(),
            open: None,
            totals: Totals::default(),
            progress: Progress::new(expect),
        }
    }

    fn run(&mut self, rx: &Receiver<Vec<Item>>) -> Result<(), String> {
        for batch in rx.iter() {
            for item in batch {
                self.item(item)?;
            }
            self.progress.show(&self.totals);
        }
        self.close_file()?;
        for id in std::mem::take(&mut self.relinked) {
            if let Some(&(ino, attrs)) = self.links.get(&id) {
                self.fs
                    .setattr(ino, &attrs.set())
                    .map_err(|e| format!("inode {ino}: setting its attributes: {e}"))?;
            }
        }
        Ok(())
    }

    fn item(&mut self, item: Item) -> Result<(), String> {
        let item = match item {
            Item::Data { off, bytes } => return self.data(off, &bytes),
            other => other,
        };
        self.close_file()?;
        match item {
            Item::Make {
                parent,
                name,
                path,
                kind,
                attrs,
                xattrs,
                first_link,
            } => self.make(parent, &name, path, kind, attrs, xattrs, first_link),
            Item::DirDone {
                id,
                path,
                attrs,
                xattrs,
            } => {
                let ino = self.dir(id, &path)?;
                self.finish(ino, &path, &attrs, &xattrs)
            }
            Item::Data { .. } => Ok(()),
        }
    }

    fn dir(&self, id: usize, path: &Path) -> Result<Ino, String> {
        self.dirs
            .get(id)
            .copied()
            .ok_or_else(|| format!("{}: its directory was not made (id {id})", path.display()))
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "the fields of one Item::Make, taken apart by `item`"
    )]
    fn make(
        &mut self,
        parent: usize,
        name: &[u8],
        path: PathBuf,
        kind: Kind,
        attrs: Attrs,
        xattrs: Xattrs,
        first_link: Option<u64>,
    ) -> Result<(), String> {
        let dir = self.dir(parent, &path)?;
        let fs = self.fs;
        let ino = match kind {
            Kind::Link(id) => {
                let Some(&(ino, _)) = self.links.get(&id) else {
                    return Err(format!("{}: its first name was not made", path.display()));
                };
                fs.link(ino, dir, name)
                    .map_err(|e| at(&path, "a hard link", e))?;
                self.relinked.push(id);
                self.totals.links += 1;
                return Ok(());
            }
            Kind::Dir { id } => {
                let a = fs
                    .mkdir(dir, name, attrs.mode, attrs.owner())
                    .map_err(|e| at(&path, "mkdir", e))?;
                if id != self.dirs.len() {
                    return Err(format!(
                        "{}: directory id {id} out of order",
                        path.display()
                    ));
                }
                self.dirs.push(a.ino);
                self.totals.dirs += 1;
                // Its xattrs and attributes come with `Item::DirDone`.
                return Ok(());
            }
            Kind::File { whole: Some(data) } => {
                let new = NewFile {
                    mode: attrs.mode,
                    owner: attrs.owner(),
                    atime: attrs.atime,
                    mtime: attrs.mtime,
                    ctime: attrs.ctime,
                    data: &data,
                };
                let a = fs
                    .create_file(dir, name, &new)
                    .map_err(|e| at(&path, "create", e))?;
                self.totals.files += 1;
                self.totals.bytes += data.len() as u64;
                if let Some(id) = first_link {
                    self.links.insert(id, (a.ino, attrs));
                }
                // Made whole, times included, unless there is more to set: xattrs (which
                // move the ctime), a size the reads did not reach, or an owner or mode that
                // the directory's set-group-ID bit or default ACL changed.
                let done = xattrs.is_empty()
                    && data.len() as u64 == attrs.size
                    && (a.mode, a.uid, a.gid) == (attrs.mode, attrs.uid, attrs.gid);
                if done {
                    return Ok(());
                }
                self.open = Some(OpenFile {
                    ino: a.ino,
                    path,
                    attrs,
                    xattrs,
                    end: data.len() as u64,
                });
                return Ok(());
            }
            Kind::File { whole: None } => {
                let a = fs
                    .create(dir, name, attrs.mode & 0o7777, attrs.owner())
                    .map_err(|e| at(&path, "create", e))?;
                self.totals.files += 1;
                if let Some(id) = first_link {
                    self.links.insert(id, (a.ino, attrs));
                }
                self.open = Some(OpenFile {
                    ino: a.ino,
                    path,
                    attrs,
                    xattrs,
                    end: 0,
                });
                return Ok(());
            }
            Kind::Symlink(target) => {
                self.totals.symlinks += 1;
                fs.symlink(dir, name, &target, attrs.owner())
                    .map_err(|e| at(&path, "symlink", e))?
                    .ino
            }
            Kind::Special => {
                self.totals.specials += 1;
                fs.mknod(dir, name, attrs.mode, attrs.owner(), attrs.rdev)
                    .map_err(|e| at(&path, "mknod", e))?
                    .ino
            }
        };
        if let Some(id) = first_link {
            self.links.insert(id, (ino, attrs));
        }
        self.finish(ino, &path, &attrs, &xattrs)
    }

    fn data(&mut self, off: u64, bytes: &[u8]) -> Result<(), String> {
        let Some(f) = self.open.as_mut() else {
            return Err("file data without its file".into());
        };
        let how = WriteHow {
            times: false,
            kill: Default::default(),
        };
        let mut done = 0;
        while done < bytes.len() {
            let n = self
                .fs
                .write_with(f.ino, off + done as u64, &bytes[done..], how)
                .map_err(|e| at(&f.path, "write", e))?;
            if n == 0 {
                return Err(format!("{}: a write took no bytes", f.path.display()));
            }
            done += n;
        }
        f.end = f.end.max(off + bytes.len() as u64);
        self.totals.bytes += bytes.len() as u64;
        Ok(())
    }

    /// Sets the attributes of the file whose data came last: its size too when it ends in a
    /// hole (or shrank while it was read, then its data ends short of the size `lstat` gave).
    fn close_file(&mut self) -> Result<(), String> {
        let Some(f) = self.open.take() else {
            return Ok(());
        };
        if f.end != f.attrs.size {
            let size = SetAttr {
                size: Some(f.attrs.size),
                ..SetAttr::default()
            };
            self.fs
                .setattr(f.ino, &size)
                .map_err(|e| at(&f.path, "setting the size", e))?;
        }
        self.finish(f.ino, &f.path, &f.attrs, &f.xattrs)
    }

    /// Copies an entry's xattrs, then its owner, mode and times (which the xattrs' change
    /// would move).
    fn finish(
        &mut self,
        ino: Ino,
        path: &Path,
        attrs: &Attrs,
        xattrs: &Xattrs,
    ) -> Result<(), String> {
        for (name, value) in xattrs {
            self.fs.setxattr(ino, name, value, 0).map_err(|e| {
                let n = String::from_utf8_lossy(name);
                at(path, &format!("setting xattr {n}"), e)
            })?;
        }
        self.fs
            .setattr(ino, &attrs.set())
            .map_err(|e| at(path, "setting its attributes", e))?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------

/// The progress line on a terminal: entries made (of how many, when known), bytes, rate.
struct Progress {
    tty: bool,
    expect: u64,
    start: Instant,
    last: Instant,
}

impl Progress {
    const EVERY: Duration = Duration::from_millis(200);

    fn new(expect: u64) -> Progress {
        let now = Instant::now();
        Progress {
            // SAFETY: isatty only inspects the descriptor.
            tty: unsafe { libc::isatty(2) } == 1,
            expect,
            start: now,
            last: now,
        }
    }

    fn show(&mut self, t: &Totals) {
        if !self.tty || self.last.elapsed() < Self::EVERY {
            return;
        }
        self.last = Instant::now();
        let n = t.entries();
        let rate = n as f64 / self.start.elapsed().as_secs_f64().max(1e-9);
        let bar = match (n * 100).checked_div(self.expect) {
            Some(pct) => {
                let pct = pct.min(100);
                let filled = (pct / 4) as usize;
                format!(
                    "[{}{}] {pct:3}% ",
                    "#".repeat(filled),
                    ".".repeat(25 - filled)
                )
            }
            None => String::new(),
        };
        eprint!(
            "\r{bar}{n} entries, {} MiB, {rate:.0} entries/s ",
            t.bytes >> 20
        );
    }

    fn finish(&self) {
        if self.tty && self.last != self.start {
            eprint!("\r\x1b[K");
        }
    }
}
