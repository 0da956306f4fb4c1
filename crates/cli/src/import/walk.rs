//! The reader of `mkfs --from`: lists the source tree and reads each entry into batches for
//! the writer, in the order the module notes of `super` give.
use super::source::{DirPath, Entry, Stat, XattrsOf};
use super::{Attrs, Item, Kind, BATCH_BYTES, BATCH_ITEMS, CHUNK};
use idxfs_engine::fs::NEW_FILE_MAX;
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
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
    let top = DirPath::new(dir);
    let root = top
        .open()
        .and_then(|d| d.stat_self())
        .map_err(|e| failed(dir, e))?;
    // Directories whose entries are still to be made, the next one last.
    let mut todo = vec![(0usize, top, root)];
    while let Some((id, at, meta)) = todo.pop() {
        let path = at.shown();
        let d = at.open().map_err(|e| failed(&path, e))?;
        let mut entries = d.entries().map_err(|e| failed(&path, e))?;
        entries.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        let mut subdirs = Vec::new();
        for Entry { name, dtype } in entries {
            let p = path.join(&name);
            // A regular file is opened first and stat'ed through its descriptor (fstatat
            // then openat looked its name up twice); anything else, or a name whose type
            // changed since the listing, is stat'ed by name and never opened.
            let opened = match dtype {
                libc::DT_REG => d.open_regular(&name).map_err(|e| failed(&p, e))?,
                _ => None,
            };
            let m = match &opened {
                Some((_, m)) => *m,
                None => d.stat(&name).map_err(|e| failed(&p, e))?,
            };
            // A name of an inode seen before is a link to it, whatever its type.
            let mut first_link = None;
            let mut linked_to = None;
            if !m.is_dir() && m.nlink() > 1 {
                let n = linked.len() as u64;
                match linked.entry((m.dev(), m.ino())) {
                    std::collections::hash_map::Entry::Occupied(o) => linked_to = Some(*o.get()),
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(n);
                        first_link = Some(n);
                    }
                }
            }
            // What it is, its xattrs, and the file whose data follows it in `Item::Data`.
            let (kind, xattrs, streamed) = if let Some(first) = linked_to {
                (Kind::Link(first), Vec::new(), None)
            } else if m.is_dir() {
                let kid = next_dir;
                next_dir += 1;
                subdirs.push((kid, at.child(&d, &name), m));
                // Its xattrs go with its attributes, once its entries are made (`DirDone`).
                (Kind::Dir { id: kid }, Vec::new(), None)
            } else if m.is_file() {
                let f = match opened {
                    Some((f, _)) => f,
                    None => d.open_file(&name).map_err(|e| failed(&p, e))?,
                };
                let whole = read_whole(&f, &m).map_err(|e| failed(&p, e))?;
                let xattrs = XattrsOf::Fd(f.as_raw_fd())
                    .read()
                    .map_err(|e| failed(&p, e))?;
                let streamed = whole.is_none().then_some(f);
                (Kind::File { whole }, xattrs, streamed)
            } else {
                let kind = if m.is_symlink() {
                    Kind::Symlink(d.read_link(&name).map_err(|e| failed(&p, e))?)
                } else {
                    Kind::Special
                };
                let c = at.entry(&name).map_err(|e| failed(&p, e))?;
                let xattrs = XattrsOf::Path(&c).read().map_err(|e| failed(&p, e))?;
                (kind, xattrs, None)
            };
            out.push(Item::Make {
                parent: id,
                name: name.into_vec(),
                path: p.clone(),
                kind,
                attrs: Attrs::of(&m),
                xattrs,
                first_link,
            })?;
            if let Some(f) = streamed {
                read_data(&f, &m, out).map_err(|e| match e {
                    ReadError::Stopped => WalkError::Stopped,
                    ReadError::Io(e) => failed(&p, e),
                })?;
            }
        }
        let xattrs = d.xattrs().map_err(|e| failed(&path, e))?;
        drop(d);
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

/// Whether `m` may have holes: fewer blocks than its size needs.
fn maybe_sparse(m: &Stat) -> bool {
    m.blocks() * 512 < m.size()
}

/// All the bytes of the regular file `f` when it is small and has no holes (see
/// `Kind::File`); None for the others, whose data `read_data` sends.
fn read_whole(f: &std::fs::File, m: &Stat) -> std::io::Result<Option<Vec<u8>>> {
    let size = m.size();
    if size == 0 {
        return Ok(Some(Vec::new()));
    }
    if size > NEW_FILE_MAX as u64 || maybe_sparse(m) {
        return Ok(None);
    }
    let mut bytes = vec![0u8; size as usize];
    let got = read_at(f, 0, &mut bytes)?;
    // A file that shrank since its stat: what was read is what there is.
    bytes.truncate(got);
    Ok(Some(bytes))
}

/// Why `read_data` ended early.
enum ReadError {
    Stopped,
    Io(std::io::Error),
}

impl From<Stopped> for ReadError {
    fn from(_: Stopped) -> Self {
        ReadError::Stopped
    }
}

impl From<std::io::Error> for ReadError {
    fn from(e: std::io::Error) -> Self {
        ReadError::Io(e)
    }
}

/// Sends the data ranges of the regular file `f` as `Item::Data`.
fn read_data(f: &std::fs::File, m: &Stat, out: &mut Batch) -> Result<(), ReadError> {
    let size = m.size();
    let ranges = if maybe_sparse(m) {
        data_ranges(f, size)?
    } else {
        vec![(0, size)]
    };
    for (start, end) in ranges {
        let mut off = start;
        while off < end {
            let want = (end - off).min(CHUNK as u64) as usize;
            let mut bytes = vec![0u8; want];
            let got = read_at(f, off, &mut bytes)?;
            bytes.truncate(got);
            if got > 0 {
                out.push(Item::Data { off, bytes })?;
            }
            if got < want {
                // The file shrank since its stat: what was read is what there is.
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
