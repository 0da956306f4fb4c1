//! The reader of `mkfs --from`: lists the source tree and reads each entry into batches for
//! the writer, in the order the module notes of `super` give.
use super::{Attrs, Item, Kind, Xattrs, BATCH_BYTES, BATCH_ITEMS, CHUNK};
use idxfs_engine::fs::NEW_FILE_MAX;
use std::collections::HashMap;
use std::ffi::{CString, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::mpsc::SyncSender;

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
pub(super) fn walk(dir: &Path, tx: SyncSender<Vec<Item>>) -> Result<(), String> {
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
pub(super) fn list(p: &Path) -> std::io::Result<Vec<OsString>> {
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
