//! The item stream of `idxfs import`: the reader's items (`super::Item`) as bytes, sent to a
//! mount's server in ioctl-sized pieces (`idxfs_fuse::import`) and made whole again there.
//!
//! Every integer is little-endian; a byte string is its length (u32) and its bytes. An item is
//! a tag byte and its fields in the order of `super::Item`. Nothing in an item is trusted: a
//! length past its limit (`Limits`) ends the stream with an error, never a large allocation,
//! and an item cut off at the end of what has arrived waits for the next piece.
use super::{Attrs, Item, Kind, Xattrs, CHUNK};
use idxfs_engine::fs::{Time, NEW_FILE_MAX};
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

const MAKE: u8 = 1;
const DATA: u8 = 2;
const DIR_DONE: u8 = 3;

const DIR: u8 = 1;
const FILE_WHOLE: u8 = 2;
const FILE_DATA: u8 = 3;
const SYMLINK: u8 = 4;
const SPECIAL: u8 = 5;
const LINK: u8 = 6;

/// Longest byte strings an item may hold: a name, a source path (for messages), a symlink
/// target, an xattr's name and value, and the xattrs of one entry.
const NAME_LIMIT: usize = idxfs_format::NAME_MAX;
const PATH_LIMIT: usize = 64 << 10;
const TARGET_LIMIT: usize = idxfs_format::SYMLINK_MAX;
const XATTR_NAME_LIMIT: usize = 255;
const XATTR_VALUE_LIMIT: usize = 64 << 10;
const XATTRS_LIMIT: usize = 1 << 20;

/// Appends `item`'s bytes to `out`.
pub(super) fn encode(item: &Item, out: &mut Vec<u8>) {
    match item {
        Item::Make {
            parent,
            name,
            path,
            kind,
            attrs,
            xattrs,
            first_link,
        } => {
            out.push(MAKE);
            u64s(out, &[*parent as u64]);
            bytes(out, name);
            bytes(out, path.as_os_str().as_bytes());
            match kind {
                Kind::Dir { id } => {
                    out.push(DIR);
                    u64s(out, &[*id as u64]);
                }
                Kind::File { whole: Some(d) } => {
                    out.push(FILE_WHOLE);
                    bytes(out, d);
                }
                Kind::File { whole: None } => out.push(FILE_DATA),
                Kind::Symlink(t) => {
                    out.push(SYMLINK);
                    bytes(out, t);
                }
                Kind::Special => out.push(SPECIAL),
                Kind::Link(id) => {
                    out.push(LINK);
                    u64s(out, &[*id]);
                }
            }
            put_attrs(out, attrs);
            put_xattrs(out, xattrs);
            match first_link {
                Some(id) => {
                    out.push(1);
                    u64s(out, &[*id]);
                }
                None => out.push(0),
            }
        }
        Item::Data { off, bytes: b } => {
            out.push(DATA);
            u64s(out, &[*off]);
            bytes(out, b);
        }
        Item::DirDone {
            id,
            path,
            attrs,
            xattrs,
        } => {
            out.push(DIR_DONE);
            u64s(out, &[*id as u64]);
            bytes(out, path.as_os_str().as_bytes());
            put_attrs(out, attrs);
            put_xattrs(out, xattrs);
        }
    }
}

fn u64s(out: &mut Vec<u8>, v: &[u64]) {
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_time(out: &mut Vec<u8>, t: Time) {
    out.extend_from_slice(&t.sec.to_le_bytes());
    out.extend_from_slice(&t.nsec.to_le_bytes());
}

fn put_attrs(out: &mut Vec<u8>, a: &Attrs) {
    for v in [a.mode, a.uid, a.gid] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    u64s(out, &[a.rdev, a.size]);
    for t in [a.atime, a.mtime, a.ctime] {
        put_time(out, t);
    }
}

fn put_xattrs(out: &mut Vec<u8>, x: &Xattrs) {
    out.extend_from_slice(&(x.len() as u32).to_le_bytes());
    for (n, v) in x {
        bytes(out, n);
        bytes(out, v);
    }
}

/// Why no item came out.
enum Stop {
    /// The item goes on past what has arrived.
    Short,
    /// The stream is not one `encode` writes.
    Bad(String),
}

/// Reads one item's fields from the front of `buf`.
struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], Stop> {
        let end = self.at.checked_add(n).ok_or(Stop::Short)?;
        let b = self.buf.get(self.at..end).ok_or(Stop::Short)?;
        self.at = end;
        Ok(b)
    }

    fn u8(&mut self) -> Result<u8, Stop> {
        Ok(self.take(1)?.first().copied().unwrap_or(0))
    }

    fn u32(&mut self) -> Result<u32, Stop> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes(b.try_into().unwrap_or([0; 4])))
    }

    fn u64(&mut self) -> Result<u64, Stop> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
    }

    fn index(&mut self, what: &str) -> Result<usize, Stop> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| Stop::Bad(format!("{what} {v} out of range")))
    }

    /// A byte string of at most `limit` bytes.
    fn bytes(&mut self, limit: usize, what: &str) -> Result<Vec<u8>, Stop> {
        let n = self.u32()? as usize;
        if n > limit {
            return Err(Stop::Bad(format!("{what} of {n} bytes (at most {limit})")));
        }
        Ok(self.take(n)?.to_vec())
    }

    fn path(&mut self) -> Result<PathBuf, Stop> {
        Ok(PathBuf::from(OsString::from_vec(
            self.bytes(PATH_LIMIT, "a path")?,
        )))
    }

    fn time(&mut self) -> Result<Time, Stop> {
        let sec = self.u64()? as i64;
        let nsec = self.u32()?;
        if nsec > 999_999_999 {
            return Err(Stop::Bad(format!("a time of {nsec} nanoseconds")));
        }
        Ok(Time { sec, nsec })
    }

    fn attrs(&mut self) -> Result<Attrs, Stop> {
        Ok(Attrs {
            mode: self.u32()?,
            uid: self.u32()?,
            gid: self.u32()?,
            rdev: self.u64()?,
            size: self.u64()?,
            atime: self.time()?,
            mtime: self.time()?,
            ctime: self.time()?,
        })
    }

    fn xattrs(&mut self) -> Result<Xattrs, Stop> {
        let n = self.u32()? as usize;
        let mut out = Vec::new();
        let mut total = 0usize;
        for _ in 0..n {
            let name = self.bytes(XATTR_NAME_LIMIT, "an xattr name")?;
            let value = self.bytes(XATTR_VALUE_LIMIT, "an xattr value")?;
            total += name.len() + value.len();
            if total > XATTRS_LIMIT {
                return Err(Stop::Bad(format!(
                    "xattrs of over {XATTRS_LIMIT} bytes on one entry"
                )));
            }
            out.push((name, value));
        }
        Ok(out)
    }

    fn item(&mut self) -> Result<Item, Stop> {
        match self.u8()? {
            MAKE => {
                let parent = self.index("a directory id")?;
                let name = self.bytes(NAME_LIMIT, "a name")?;
                let path = self.path()?;
                let kind = match self.u8()? {
                    DIR => Kind::Dir {
                        id: self.index("a directory id")?,
                    },
                    FILE_WHOLE => Kind::File {
                        whole: Some(self.bytes(NEW_FILE_MAX, "a small file")?),
                    },
                    FILE_DATA => Kind::File { whole: None },
                    SYMLINK => Kind::Symlink(self.bytes(TARGET_LIMIT, "a symlink target")?),
                    SPECIAL => Kind::Special,
                    LINK => Kind::Link(self.u64()?),
                    k => return Err(Stop::Bad(format!("an entry of kind {k}"))),
                };
                let attrs = self.attrs()?;
                let xattrs = self.xattrs()?;
                let first_link = match self.u8()? {
                    0 => None,
                    1 => Some(self.u64()?),
                    f => return Err(Stop::Bad(format!("a link flag of {f}"))),
                };
                Ok(Item::Make {
                    parent,
                    name,
                    path,
                    kind,
                    attrs,
                    xattrs,
                    first_link,
                })
            }
            DATA => Ok(Item::Data {
                off: self.u64()?,
                bytes: self.bytes(CHUNK, "a piece of file data")?,
            }),
            DIR_DONE => Ok(Item::DirDone {
                id: self.index("a directory id")?,
                path: self.path()?,
                attrs: self.attrs()?,
                xattrs: self.xattrs()?,
            }),
            t => Err(Stop::Bad(format!("an item of tag {t}"))),
        }
    }
}

/// Makes items of a stream that arrives in pieces.
#[derive(Default)]
pub(super) struct Decoder {
    /// What has arrived and is not yet an item: the front of an item cut off by the end of
    /// the last piece.
    buf: Vec<u8>,
}

impl Decoder {
    /// Takes the next piece; calls `each` with every item it completes, in order. Err: the
    /// stream is broken (one line), or `each` failed.
    pub(super) fn feed(
        &mut self,
        piece: &[u8],
        mut each: impl FnMut(Item) -> Result<(), String>,
    ) -> Result<(), String> {
        self.buf.extend_from_slice(piece);
        let mut at = 0;
        let r = loop {
            let mut c = Cursor {
                buf: self.buf.get(at..).unwrap_or(&[]),
                at: 0,
            };
            if c.buf.is_empty() {
                break Ok(());
            }
            match c.item() {
                Ok(item) => {
                    at += c.at;
                    if let Err(e) = each(item) {
                        break Err(e);
                    }
                }
                Err(Stop::Short) => break Ok(()),
                Err(Stop::Bad(why)) => break Err(format!("a broken import stream: {why}")),
            }
        };
        self.buf.drain(..at);
        r
    }

    /// Whether a piece of an item is still waiting for the rest.
    pub(super) fn pending(&self) -> bool {
        !self.buf.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(n: u32) -> Attrs {
        let t = |s| Time {
            sec: s,
            nsec: 999_999_999,
        };
        Attrs {
            mode: 0o104755,
            uid: n,
            gid: n + 1,
            rdev: 0x0801,
            size: 1 << 40,
            atime: t(-5),
            mtime: t(i64::MAX),
            ctime: t(0),
        }
    }

    fn items() -> Vec<Item> {
        let x = vec![
            (b"user.a".to_vec(), vec![0u8; 300]),
            (b"trusted.b".to_vec(), vec![]),
        ];
        vec![
            Item::Make {
                parent: 0,
                name: vec![0xff; 255],
                path: PathBuf::from(OsString::from_vec(b"/src/\xff".to_vec())),
                kind: Kind::Dir { id: 1 },
                attrs: attrs(1),
                xattrs: x.clone(),
                first_link: None,
            },
            Item::Make {
                parent: 1,
                name: b"f".to_vec(),
                path: PathBuf::from("/src/f"),
                kind: Kind::File {
                    whole: Some(vec![7; 5000]),
                },
                attrs: attrs(2),
                xattrs: Vec::new(),
                first_link: Some(9),
            },
            Item::Make {
                parent: 1,
                name: b"g".to_vec(),
                path: PathBuf::from("/src/g"),
                kind: Kind::File { whole: None },
                attrs: attrs(3),
                xattrs: Vec::new(),
                first_link: None,
            },
            Item::Data {
                off: 1 << 30,
                bytes: vec![3; CHUNK],
            },
            Item::Make {
                parent: 1,
                name: b"l".to_vec(),
                path: PathBuf::from("/src/l"),
                kind: Kind::Symlink(vec![b't'; 4095]),
                attrs: attrs(4),
                xattrs: Vec::new(),
                first_link: None,
            },
            Item::Make {
                parent: 1,
                name: b"h".to_vec(),
                path: PathBuf::from("/src/h"),
                kind: Kind::Link(9),
                attrs: attrs(5),
                xattrs: Vec::new(),
                first_link: None,
            },
            Item::Make {
                parent: 1,
                name: b"dev".to_vec(),
                path: PathBuf::from("/src/dev"),
                kind: Kind::Special,
                attrs: attrs(6),
                xattrs: Vec::new(),
                first_link: None,
            },
            Item::DirDone {
                id: 1,
                path: PathBuf::from("/src/d"),
                attrs: attrs(7),
                xattrs: x,
            },
        ]
    }

    /// Every item comes out as it went in, whatever the pieces are cut at.
    #[test]
    fn items_survive_any_cut() {
        let mut stream = Vec::new();
        for it in items() {
            encode(&it, &mut stream);
        }
        let want: Vec<Vec<u8>> = items()
            .iter()
            .map(|it| {
                let mut b = Vec::new();
                encode(it, &mut b);
                b
            })
            .collect();
        for piece in [1usize, 7, 4096, idxfs_fuse::import::ROOM, stream.len()] {
            let mut d = Decoder::default();
            let mut got = Vec::new();
            for p in stream.chunks(piece) {
                d.feed(p, |it| {
                    let mut b = Vec::new();
                    encode(&it, &mut b);
                    got.push(b);
                    Ok(())
                })
                .expect("feed");
            }
            assert!(!d.pending(), "piece {piece}: bytes left over");
            assert!(got == want, "piece {piece}: items differ");
        }
    }

    /// Lengths past their limits and unknown tags are errors, never allocations or panics;
    /// every truncation of a good stream is only short.
    #[test]
    fn broken_streams_are_refused() {
        let mut stream = Vec::new();
        for it in items() {
            encode(&it, &mut stream);
        }
        for cut in 0..stream.len().min(20_000) {
            let mut d = Decoder::default();
            d.feed(&stream[..cut], |_| Ok(()))
                .expect("a cut stream is short");
        }
        let mut name = vec![MAKE];
        name.extend_from_slice(&0u64.to_le_bytes());
        name.extend_from_slice(&u32::MAX.to_le_bytes());
        for bad in [
            vec![9u8],
            vec![DATA, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff],
            name,
        ] {
            let mut d = Decoder::default();
            let e = d.feed(&bad, |_| Ok(())).expect_err("refused");
            assert!(e.contains("broken"), "{e}");
        }
    }
}
