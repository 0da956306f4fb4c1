//! Item values. Fixed-size items are `#[repr(C)]` structs; list items (names that share a key
//! because of hash collisions or hard links) are a sequence of length-prefixed records, each
//! decoded with bounds checks.
use crate::{ensure, Corrupt, NAME_MAX};
use std::fmt;
use zerocopy::little_endian::{I64, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct Timespec {
    pub sec: I64,
    pub nsec: U32,
}
const _: () = assert!(size_of::<Timespec>() == 12);

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct InodeItem {
    /// File type and permission bits, as in `st_mode`.
    pub mode: U32,
    pub nlink: U32,
    pub uid: U32,
    pub gid: U32,
    /// Bytes; for a directory, the number of entries (so rmdir's emptiness test is O(1)).
    pub size: U64,
    /// Bytes of data blocks allocated to the file.
    pub alloc_bytes: U64,
    pub rdev: U64,
    pub flags: U64,
    /// Commit generation at creation: with the inode number, names this inode forever.
    pub generation: U64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub btime: Timespec,
    pub reserved: [U64; 2],
}
pub const INODE_ITEM_SIZE: usize = 16 + 8 * 5 + 12 * 4 + 16;
const _: () = assert!(size_of::<InodeItem>() == INODE_ITEM_SIZE);

pub const S_IFMT: u32 = 0o170000;
pub const S_IFSOCK: u32 = 0o140000;
pub const S_IFLNK: u32 = 0o120000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFBLK: u32 = 0o060000;
pub const S_IFDIR: u32 = 0o040000;
pub const S_IFCHR: u32 = 0o020000;
pub const S_IFIFO: u32 = 0o010000;

/// Checks an inode item's value.
pub fn decode_inode(data: &[u8], ino: u64) -> Result<InodeItem, Corrupt> {
    let what = |f: &str| format!("inode {ino} {f}");
    ensure!(
        data.len() == INODE_ITEM_SIZE,
        what("item size"),
        data.len(),
        INODE_ITEM_SIZE
    );
    let it = InodeItem::read_from_bytes(data)
        .map_err(|_| Corrupt::new(what("item size"), data.len(), INODE_ITEM_SIZE))?;
    let fmt = it.mode.get() & S_IFMT;
    ensure!(
        matches!(
            fmt,
            S_IFSOCK | S_IFLNK | S_IFREG | S_IFBLK | S_IFDIR | S_IFCHR | S_IFIFO
        ),
        what("file type"),
        format!("{fmt:#o}"),
        "one of the seven POSIX file types"
    );
    ensure!(
        it.mode.get() & !(S_IFMT | 0o7777) == 0,
        what("mode"),
        format!("{:#o}", it.mode.get()),
        "no bits outside S_IFMT|07777"
    );
    for (n, t) in [
        ("atime", it.atime),
        ("mtime", it.mtime),
        ("ctime", it.ctime),
        ("btime", it.btime),
    ] {
        ensure!(
            t.nsec.get() < 1_000_000_000,
            what(n),
            t.nsec.get(),
            "nanoseconds < 1e9"
        );
    }
    Ok(it)
}

/// File type code stored in directory entries (the `d_type` values of Linux).
pub fn dtype_of_mode(mode: u32) -> u8 {
    ((mode & S_IFMT) >> 12) as u8
}

/// One directory entry record inside a DirHash or DirIno item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub dtype: u8,
    pub name: Vec<u8>,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct DirEntryHead {
    ino: U64,
    dtype: u8,
    name_len: u8,
}
const DIR_ENTRY_HEAD: usize = 10;
const _: () = assert!(size_of::<DirEntryHead>() == DIR_ENTRY_HEAD);

pub fn dir_entry_size(name_len: usize) -> usize {
    DIR_ENTRY_HEAD + name_len
}

pub fn encode_dir_entry(out: &mut Vec<u8>, e: &DirEntry) {
    assert!(
        !e.name.is_empty() && e.name.len() <= NAME_MAX,
        "dir entry name length {}",
        e.name.len()
    );
    let h = DirEntryHead {
        ino: U64::new(e.ino),
        dtype: e.dtype,
        name_len: e.name.len() as u8,
    };
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(&e.name);
}

/// Decodes every record of a DirHash/DirIno item. `what` names the item for error messages.
pub fn decode_dir_entries(
    mut data: &[u8],
    what: impl fmt::Display,
) -> Result<Vec<DirEntry>, Corrupt> {
    let mut out = Vec::with_capacity(1);
    ensure!(
        !data.is_empty(),
        format!("{what} entry list"),
        "empty",
        "at least one entry"
    );
    while !data.is_empty() {
        let (h, rest) = DirEntryHead::read_from_prefix(data).map_err(|_| {
            Corrupt::new(
                format!("{what} entry header"),
                format!("{} bytes left", data.len()),
                format!(">= {DIR_ENTRY_HEAD}"),
            )
        })?;
        let n = h.name_len as usize;
        ensure!(n >= 1, format!("{what} name length"), n, "1..=255");
        ensure!(
            rest.len() >= n,
            format!("{what} name length"),
            n,
            format!("<= {} bytes left", rest.len())
        );
        let (name, rest) = rest.split_at(n);
        ensure!(
            !name.contains(&b'/') && !name.contains(&0),
            format!("{what} name"),
            String::from_utf8_lossy(name),
            "no '/' or NUL"
        );
        ensure!(h.dtype <= 14, format!("{what} dtype"), h.dtype, "<= 14");
        out.push(DirEntry {
            ino: h.ino.get(),
            dtype: h.dtype,
            name: name.to_vec(),
        });
        data = rest;
    }
    Ok(out)
}

/// Names in an InodeRef item: u8 length + bytes, repeated.
pub fn encode_names(names: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for n in names {
        assert!(!n.is_empty() && n.len() <= NAME_MAX);
        out.push(n.len() as u8);
        out.extend_from_slice(n);
    }
    out
}

pub fn decode_names(mut data: &[u8], what: impl fmt::Display) -> Result<Vec<Vec<u8>>, Corrupt> {
    let mut out = Vec::new();
    ensure!(
        !data.is_empty(),
        format!("{what} name list"),
        "empty",
        "at least one name"
    );
    while let Some((&len, rest)) = data.split_first() {
        let n = len as usize;
        ensure!(
            n >= 1 && n <= rest.len(),
            format!("{what} name length"),
            n,
            format!("1..={}", rest.len())
        );
        let (name, rest) = rest.split_at(n);
        out.push(name.to_vec());
        data = rest;
    }
    Ok(out)
}

/// One extended back reference (an `InodeExtRef` record): a name of the child in `parent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtRef {
    pub parent: u64,
    pub name: Vec<u8>,
}

/// Encoded size of an extended back reference: parent u64, name length u8, name.
pub fn ext_ref_size(name_len: usize) -> usize {
    9 + name_len
}

pub fn encode_ext_ref(out: &mut Vec<u8>, parent: u64, name: &[u8]) {
    assert!(!name.is_empty() && name.len() <= NAME_MAX);
    out.extend_from_slice(&parent.to_le_bytes());
    out.push(name.len() as u8);
    out.extend_from_slice(name);
}

pub fn decode_ext_refs(mut data: &[u8], what: impl fmt::Display) -> Result<Vec<ExtRef>, Corrupt> {
    let mut out = Vec::new();
    ensure!(
        !data.is_empty(),
        format!("{what} extended ref list"),
        "empty",
        "at least one reference"
    );
    while !data.is_empty() {
        let (head, rest) = data.split_at(data.len().min(9));
        ensure!(
            head.len() == 9,
            format!("{what} extended ref header"),
            format!("{} bytes", head.len()),
            "9 bytes"
        );
        let (p, l) = head.split_at(8);
        let parent = u64::from_le_bytes(p.try_into().unwrap_or([0; 8]));
        let n = l.first().copied().unwrap_or(0) as usize;
        ensure!(
            n >= 1 && n <= rest.len(),
            format!("{what} extended ref name length"),
            n,
            format!("1..={}", rest.len())
        );
        let (name, rest) = rest.split_at(n);
        out.push(ExtRef {
            parent,
            name: name.to_vec(),
        });
        data = rest;
    }
    Ok(out)
}

/// Largest xattr value (Linux's XATTR_SIZE_MAX).
pub const XATTR_VALUE_MAX: usize = 65536;
/// Pieces one long xattr value may take: a chunk base has its low 8 bits clear, and piece i
/// lives at base + i. 65,536 bytes in the smallest node's pieces (983 bytes) take 67.
pub const XATTR_CHUNKS_MAX: u64 = 256;
/// Header of a long-form xattr record: 0 u8, name length u8, value length u32, chunk base u64.
pub const XATTR_LONG_HEADER: usize = 14;

/// Where an xattr's value lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XattrValue {
    /// In the record itself.
    Inline(Vec<u8>),
    /// In `XattrChunk` items (ino, XattrChunk, base + i), `len` bytes in all.
    Chunked { len: u32, base: u64 },
}

/// Xattr records, one of two forms:
/// - short: name length u8 (1..=255), value length u16, name, value;
/// - long: 0 u8, name length u8, value length u32, chunk base u64, name (the value in chunks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XattrEntry {
    pub name: Vec<u8>,
    pub value: XattrValue,
}

/// Encoded size of a short record.
pub fn xattr_entry_size(name_len: usize, value_len: usize) -> usize {
    3 + name_len + value_len
}

impl XattrEntry {
    pub fn encoded_size(&self) -> usize {
        match &self.value {
            XattrValue::Inline(v) => xattr_entry_size(self.name.len(), v.len()),
            XattrValue::Chunked { .. } => XATTR_LONG_HEADER + self.name.len(),
        }
    }
}

pub fn encode_xattrs(xs: &[XattrEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for x in xs {
        assert!(!x.name.is_empty() && x.name.len() <= 255);
        match &x.value {
            XattrValue::Inline(v) => {
                assert!(v.len() <= u16::MAX as usize);
                out.push(x.name.len() as u8);
                out.extend_from_slice(&(v.len() as u16).to_le_bytes());
                out.extend_from_slice(&x.name);
                out.extend_from_slice(v);
            }
            XattrValue::Chunked { len, base } => {
                assert!(*len as usize <= XATTR_VALUE_MAX && base % XATTR_CHUNKS_MAX == 0);
                out.push(0);
                out.push(x.name.len() as u8);
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&base.to_le_bytes());
                out.extend_from_slice(&x.name);
            }
        }
    }
    out
}

pub fn decode_xattrs(mut data: &[u8], what: impl fmt::Display) -> Result<Vec<XattrEntry>, Corrupt> {
    let mut out = Vec::new();
    ensure!(
        !data.is_empty(),
        format!("{what} xattr list"),
        "empty",
        "at least one entry"
    );
    while let Some((&first, _)) = data.split_first() {
        if first == 0 {
            let (h, rest) = data.split_at(data.len().min(XATTR_LONG_HEADER));
            ensure!(
                h.len() == XATTR_LONG_HEADER,
                format!("{what} long xattr header"),
                h.len(),
                format!("{XATTR_LONG_HEADER} bytes")
            );
            let nl = h.get(1).copied().unwrap_or(0) as usize;
            let len = u32::from_le_bytes(
                h.get(2..6)
                    .and_then(|b| b.try_into().ok())
                    .unwrap_or([0; 4]),
            );
            let base = u64::from_le_bytes(
                h.get(6..14)
                    .and_then(|b| b.try_into().ok())
                    .unwrap_or([0; 8]),
            );
            ensure!(
                nl >= 1 && nl <= rest.len(),
                format!("{what} long xattr name length"),
                nl,
                format!("1..={}", rest.len())
            );
            ensure!(
                len >= 1 && len as usize <= XATTR_VALUE_MAX && base % XATTR_CHUNKS_MAX == 0,
                format!("{what} long xattr value"),
                format!("{len} bytes at chunk base {base:#x}"),
                format!("1..={XATTR_VALUE_MAX} bytes, a base with the low 8 bits clear")
            );
            let (name, rest) = rest.split_at(nl);
            out.push(XattrEntry {
                name: name.to_vec(),
                value: XattrValue::Chunked { len, base },
            });
            data = rest;
            continue;
        }
        ensure!(
            data.len() >= 3,
            format!("{what} xattr header"),
            data.len(),
            ">= 3 bytes"
        );
        let (h, rest) = data.split_at(3);
        let nl = h.first().copied().unwrap_or(0) as usize;
        let vl = u16::from_le_bytes([
            h.get(1).copied().unwrap_or(0),
            h.get(2).copied().unwrap_or(0),
        ]) as usize;
        ensure!(
            nl >= 1 && nl + vl <= rest.len(),
            format!("{what} xattr lengths"),
            format!("name {nl} value {vl}"),
            format!("name >= 1, total <= {}", rest.len())
        );
        let (name, rest) = rest.split_at(nl);
        let (value, rest) = rest.split_at(vl);
        out.push(XattrEntry {
            name: name.to_vec(),
            value: XattrValue::Inline(value.to_vec()),
        });
        data = rest;
    }
    Ok(out)
}

/// What an orphan item asks of the open that finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrphanKind {
    /// Empty value: the inode has no names left; free it and everything it owns.
    Free,
    /// Value [`ORPHAN_TRIM`]: the inode lives on, but extents past its size are still to be
    /// freed (a truncate done in bounded batches). Incompat bit `INCOMPAT_ORPHAN_TRIM`.
    Trim,
}

/// The one-byte value of a `Trim` orphan item.
pub const ORPHAN_TRIM: u8 = 1;

impl OrphanKind {
    pub fn encode(self) -> Vec<u8> {
        match self {
            OrphanKind::Free => Vec::new(),
            OrphanKind::Trim => vec![ORPHAN_TRIM],
        }
    }
}

pub fn decode_orphan(v: &[u8], ino: u64) -> Result<OrphanKind, Corrupt> {
    match v {
        [] => Ok(OrphanKind::Free),
        [ORPHAN_TRIM] => Ok(OrphanKind::Trim),
        _ => Err(Corrupt::new(
            format!("orphan item of inode {ino}"),
            format!("{v:02x?}"),
            format!("empty or [{ORPHAN_TRIM}]"),
        )),
    }
}

pub const EXTENT_INLINE: u8 = 0;
pub const EXTENT_REGULAR: u8 = 1;
/// Reserved: preallocated (unwritten) extent, reads as zeros.
pub const EXTENT_PREALLOC: u8 = 2;

/// A file extent. For inline extents the data follows this header in the same item.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct ExtentItem {
    pub kind: u8,
    pub reserved: [u8; 7],
    /// Generation that wrote the extent.
    pub generation: U64,
    /// First block on disk (regular) or 0 (inline).
    pub disk_block: U64,
    /// Length in blocks (regular) or 0 (inline).
    pub blocks: U64,
}
pub const EXTENT_ITEM_SIZE: usize = 32;
const _: () = assert!(size_of::<ExtentItem>() == EXTENT_ITEM_SIZE);

pub fn decode_extent(
    data: &[u8],
    what: impl fmt::Display,
    total_blocks: u64,
) -> Result<(ExtentItem, &[u8]), Corrupt> {
    let (e, rest) = ExtentItem::read_from_prefix(data).map_err(|_| {
        Corrupt::new(
            format!("{what} extent size"),
            data.len(),
            format!(">= {EXTENT_ITEM_SIZE}"),
        )
    })?;
    match e.kind {
        EXTENT_INLINE => {
            ensure!(
                e.blocks.get() == 0 && e.disk_block.get() == 0,
                format!("{what} inline extent"),
                e.blocks.get(),
                "no disk blocks"
            );
        }
        EXTENT_REGULAR | EXTENT_PREALLOC => {
            ensure!(
                rest.is_empty(),
                format!("{what} extent size"),
                data.len(),
                EXTENT_ITEM_SIZE
            );
            let (s, n) = (e.disk_block.get(), e.blocks.get());
            ensure!(
                n >= 1
                    && s >= crate::SUPER_COPIES
                    && s.checked_add(n).is_some_and(|end| end <= total_blocks),
                format!("{what} extent range"),
                format!("{s}+{n}"),
                format!("inside {}..{total_blocks}", crate::SUPER_COPIES)
            );
        }
        k => {
            return Err(Corrupt::new(
                format!("{what} extent kind"),
                k,
                "0 (inline), 1 (regular) or 2 (prealloc)",
            ))
        }
    }
    Ok((e, rest))
}

/// File blocks one `DataSum` item covers: the item of group `g` holds the sums of blocks
/// `g * SUM_GROUP_BLOCKS ..` up to the next group.
pub const SUM_GROUP_BLOCKS: u64 = 64;
/// Largest `DataSum` value: the mask and a sum for every block of the group.
pub const BLOCK_SUMS_MAX: usize = 8 + 4 * SUM_GROUP_BLOCKS as usize;

/// The data checksums of one group of `SUM_GROUP_BLOCKS` file blocks: `sums[i]` is the
/// crc32c of block i of the group, for the blocks that have one (written copy-on-write).
/// On disk: mask u64 (bit i set: block i has a sum), then the sums of the set bits in
/// ascending order, u32 each; the mask is never 0 (a group without sums has no item).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSums {
    pub sums: [Option<u32>; SUM_GROUP_BLOCKS as usize],
}

impl Default for BlockSums {
    fn default() -> Self {
        BlockSums {
            sums: [None; SUM_GROUP_BLOCKS as usize],
        }
    }
}

impl BlockSums {
    pub fn is_empty(&self) -> bool {
        self.sums.iter().all(Option::is_none)
    }

    /// The value to store; None when no block has a sum (the item goes).
    pub fn encode(&self) -> Option<Vec<u8>> {
        let mask = self
            .sums
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_some())
            .fold(0u64, |m, (i, _)| m | 1 << i);
        let mut out = mask.to_le_bytes().to_vec();
        for s in self.sums.iter().flatten() {
            out.extend_from_slice(&s.to_le_bytes());
        }
        (mask != 0).then_some(out)
    }

    pub fn decode(v: &[u8], what: impl fmt::Display) -> Result<BlockSums, Corrupt> {
        let (mask, rest) = match v.split_first_chunk::<8>() {
            Some((m, rest)) if *m != [0; 8] => (u64::from_le_bytes(*m), rest),
            _ => {
                return Err(Corrupt::new(
                    format!("{what} mask"),
                    format!("{:02x?}", v.get(..8).unwrap_or(v)),
                    "8 bytes, not all zero",
                ))
            }
        };
        let n = mask.count_ones() as usize;
        ensure!(
            rest.len() == 4 * n,
            format!("{what} size"),
            v.len(),
            format!("{} (8 + 4 per bit of mask {mask:#x})", 8 + 4 * n)
        );
        let mut out = BlockSums::default();
        let mut sums = rest.chunks_exact(4);
        for (i, slot) in out.sums.iter_mut().enumerate() {
            if mask >> i & 1 == 1 {
                let b = sums.next().and_then(|c| c.first_chunk::<4>());
                *slot = b.map(|b| u32::from_le_bytes(*b));
            }
        }
        Ok(out)
    }
}

/// The checksum of one data block, as `DataSum` items hold it.
pub fn block_sum(block: &[u8]) -> u32 {
    crc32c::crc32c(block)
}

/// A run of data blocks that `refs` file extents name (`refs` >= 2): the value of a
/// `SharedBlocks` item keyed by the run's first block. Runs never overlap; a data block that
/// no run covers is named by one extent.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct SharedItem {
    /// Length of the run, in blocks (>= 1).
    pub blocks: U64,
    /// How many extents name each block of the run (>= 2).
    pub refs: U64,
}
pub const SHARED_ITEM_SIZE: usize = 16;
const _: () = assert!(size_of::<SharedItem>() == SHARED_ITEM_SIZE);

/// A run of `n` data blocks from `start` (an item's key and length) lies inside the device,
/// past the superblocks, and holds at least one block.
pub fn check_run(what: &str, start: u64, n: u64, total_blocks: u64) -> Result<(), Corrupt> {
    ensure!(
        n >= 1
            && start >= crate::SUPER_COPIES
            && start.checked_add(n).is_some_and(|end| end <= total_blocks),
        format!("{what} range"),
        format!("{start}+{n}"),
        format!("inside {}..{total_blocks}", crate::SUPER_COPIES)
    );
    Ok(())
}

/// Decodes the `SharedBlocks` item of the run starting at device block `start`.
pub fn decode_shared(v: &[u8], start: u64, total_blocks: u64) -> Result<SharedItem, Corrupt> {
    let what = format!("shared blocks at {start}");
    let it = SharedItem::read_from_bytes(v)
        .map_err(|_| Corrupt::new(format!("{what} item size"), v.len(), SHARED_ITEM_SIZE))?;
    check_run(&what, start, it.blocks.get(), total_blocks)?;
    ensure!(
        it.refs.get() >= 2,
        format!("{what} references"),
        it.refs.get(),
        ">= 2 (one reference has no item)"
    );
    Ok(it)
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct BlockGroupItem {
    pub used_blocks: U64,
    pub flags: U64,
}
pub const BLOCK_GROUP_ITEM_SIZE: usize = 16;
const _: () = assert!(size_of::<BlockGroupItem>() == BLOCK_GROUP_ITEM_SIZE);

pub fn decode_block_group(data: &[u8], start: u64, len: u64) -> Result<BlockGroupItem, Corrupt> {
    let what = format!("block group {start}+{len}");
    let bg = BlockGroupItem::read_from_bytes(data).map_err(|_| {
        Corrupt::new(
            format!("{what} item size"),
            data.len(),
            BLOCK_GROUP_ITEM_SIZE,
        )
    })?;
    ensure!(
        bg.used_blocks.get() <= len,
        format!("{what} used"),
        bg.used_blocks.get(),
        format!("<= {len}")
    );
    Ok(bg)
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    reason = "tests index fixed, known-good buffers"
)]
mod tests {
    use super::*;
    #[test]
    fn dir_entries_roundtrip_and_reject_garbage() {
        let es = vec![
            DirEntry {
                ino: 5,
                dtype: 8,
                name: b"a".to_vec(),
            },
            DirEntry {
                ino: 9,
                dtype: 4,
                name: vec![0xff, 0xfe],
            },
        ];
        let mut buf = Vec::new();
        for e in &es {
            encode_dir_entry(&mut buf, e);
        }
        assert_eq!(decode_dir_entries(&buf, "t").expect("ok"), es);
        assert!(decode_dir_entries(&buf[..buf.len() - 1], "t").is_err());
        assert!(decode_dir_entries(&[], "t").is_err());
    }
    #[test]
    fn xattrs_roundtrip() {
        let xs = vec![
            XattrEntry {
                name: b"user.a".to_vec(),
                value: XattrValue::Inline(vec![1, 2, 3]),
            },
            XattrEntry {
                name: b"user.long".to_vec(),
                value: XattrValue::Chunked {
                    len: 65536,
                    base: 0x1234_5600,
                },
            },
            XattrEntry {
                name: b"user.b".to_vec(),
                value: XattrValue::Inline(Vec::new()),
            },
        ];
        let enc = encode_xattrs(&xs);
        assert_eq!(decode_xattrs(&enc, "t").expect("ok"), xs);
        assert_eq!(
            enc.len(),
            xs.iter().map(XattrEntry::encoded_size).sum::<usize>()
        );
        assert!(decode_xattrs(&[5, 0, 0], "t").is_err());
        // A long record cut short, one longer than the limit, one with a misaligned base.
        assert!(decode_xattrs(&enc[9..20], "t").is_err());
        let mut bad = encode_xattrs(&xs[1..2]);
        bad[2..6].copy_from_slice(&65537u32.to_le_bytes());
        assert!(decode_xattrs(&bad, "t").is_err());
        let mut bad = encode_xattrs(&xs[1..2]);
        bad[6] = 1;
        assert!(decode_xattrs(&bad, "t").is_err());
    }

    #[test]
    fn ext_refs_and_orphans_roundtrip() {
        let mut buf = Vec::new();
        encode_ext_ref(&mut buf, 7, b"a");
        encode_ext_ref(&mut buf, u64::MAX - 1, &[0xff; 255]);
        let refs = decode_ext_refs(&buf, "t").expect("ok");
        assert_eq!(refs.len(), 2);
        assert_eq!((refs[0].parent, refs[0].name.as_slice()), (7, &b"a"[..]));
        assert_eq!(refs[1].name.len(), 255);
        assert_eq!(buf.len(), ext_ref_size(1) + ext_ref_size(255));
        assert!(decode_ext_refs(&buf[..buf.len() - 1], "t").is_err());
        assert!(decode_ext_refs(&[], "t").is_err());
        for k in [OrphanKind::Free, OrphanKind::Trim] {
            assert_eq!(decode_orphan(&k.encode(), 1), Ok(k));
        }
        assert!(decode_orphan(&[2], 1).is_err());
        assert!(decode_orphan(&[1, 1], 1).is_err());
    }
}

#[cfg(test)]
mod sums_tests {
    use super::*;

    #[test]
    fn block_sums_round_trip_and_refuse_bad_values() {
        let mut s = BlockSums::default();
        assert_eq!(s.encode(), None, "no sum, no item");
        s.sums[0] = Some(7);
        s.sums[63] = Some(0xdead_beef);
        let v = s.encode().expect("two sums");
        assert_eq!(v.len(), 16);
        assert_eq!(BlockSums::decode(&v, "t").expect("decodes"), s);
        let short = v.split_last().map_or(&[][..], |(_, r)| r);
        assert!(BlockSums::decode(short, "t").is_err(), "short");
        assert!(BlockSums::decode(&[0u8; 8], "t").is_err(), "empty mask");
        assert!(BlockSums::decode(&[1, 0, 0], "t").is_err(), "no mask");
        let mut long = v.clone();
        long.extend_from_slice(&[0; 4]);
        assert!(
            BlockSums::decode(&long, "t").is_err(),
            "more sums than bits"
        );
    }
}
