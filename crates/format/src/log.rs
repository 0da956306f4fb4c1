//! The fsync log (seed 003): what changed since the last commit, appended at each fsync so that
//! an fsync costs what changed, not a commit of every tree node the change touched.
//!
//! A log is a chain of 4 KiB blocks. The superblock written by commit `g` names the chain's
//! first block in `log_root` (block, generation `g`), allocated but not yet written; each fsync
//! of the transaction after that commit appends one *batch* of blocks. Every block names the
//! next one (allocated ahead, so appending never rewrites a written block), carries the commit
//! generation, its position in the chain and where it lives, and a checksum. A reader follows
//! the chain from `log_root` until a block fails any check: that is the end of the log. Only
//! whole batches count (the last block of each has [`LOG_BATCH_END`]), so a torn fsync leaves
//! the previous batches exactly as they were.
//!
//! A batch's payload, concatenated over its blocks, is a sequence of records:
//! `kind u8, key [17], value length u32, value`. [`LOG_PUT`]: the fs-tree item `key` now holds
//! the value; [`LOG_DELETE`]: it no longer exists (length 0); [`LOG_COUNTERS`]: key zero, value
//! `next_ino u64, inode_count u64`; [`LOG_TREE`]: key zero, value `subvolume id u64`, and the
//! records after it in the same batch are of that writable tree (a parked subvolume opened
//! beside the active one); records before any `LOG_TREE` are the superblock's tree's (its
//! `fs_root`, its `next_ino` and `inode_count`). `LOG_TREE` needs incompat bit
//! `INCOMPAT_LOG_TREES`. Each record is the item's state at the fsync, so later batches
//! override earlier ones and replay order within a batch does not matter.
use crate::key::KEY_SIZE;
use crate::{ensure, Corrupt, Key, BLOCK_SIZE};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

pub const LOG_MAGIC: [u8; 4] = *b"IXLG";
/// Set on the last block of a batch (one fsync).
pub const LOG_BATCH_END: u32 = 1;

pub const LOG_PUT: u8 = 1;
pub const LOG_DELETE: u8 = 2;
pub const LOG_COUNTERS: u8 = 3;
pub const LOG_TREE: u8 = 4;

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct LogBlockHeader {
    /// crc32c of the whole block after this field.
    pub csum: U32,
    pub magic: [u8; 4],
    pub fsid: [u8; 16],
    /// The commit whose superblock names this chain.
    pub generation: U64,
    /// Position in the chain, from 0.
    pub seq: U64,
    /// Where this block lives.
    pub block: U64,
    /// The chain's next block (allocated, maybe never written).
    pub next: U64,
    /// Payload bytes used in this block.
    pub len: U32,
    pub flags: U32,
}
pub const LOG_HEADER_SIZE: usize = 64;
const _: () = assert!(size_of::<LogBlockHeader>() == LOG_HEADER_SIZE);
/// Payload bytes one log block carries.
pub const LOG_PAYLOAD: usize = BLOCK_SIZE as usize - LOG_HEADER_SIZE;
/// Record header: kind, key, value length.
pub const LOG_RECORD_HEADER: usize = 1 + KEY_SIZE + 4;

/// What a reader expects of the block at one position of the chain.
#[derive(Debug, Clone, Copy)]
pub struct LogExpect {
    pub fsid: [u8; 16],
    pub generation: u64,
    pub seq: u64,
    pub block: u64,
}

/// Encodes one log block (`payload` at most [`LOG_PAYLOAD`] bytes) with its checksum.
pub fn encode_log_block(
    at: &LogExpect,
    next: u64,
    batch_end: bool,
    payload: &[u8],
    out: &mut [u8],
) {
    assert!(payload.len() <= LOG_PAYLOAD && out.len() == BLOCK_SIZE as usize);
    let h = LogBlockHeader {
        csum: 0.into(),
        magic: LOG_MAGIC,
        fsid: at.fsid,
        generation: at.generation.into(),
        seq: at.seq.into(),
        block: at.block.into(),
        next: next.into(),
        len: (payload.len() as u32).into(),
        flags: if batch_end { LOG_BATCH_END } else { 0 }.into(),
    };
    out.fill(0);
    let (head, body) = out.split_at_mut(LOG_HEADER_SIZE);
    head.copy_from_slice(h.as_bytes());
    if let Some(dst) = body.get_mut(..payload.len()) {
        dst.copy_from_slice(payload);
    }
    let csum = crc32c::crc32c(out.get(4..).unwrap_or(&[]));
    if let Some(dst) = out.get_mut(..4) {
        dst.copy_from_slice(&csum.to_le_bytes());
    }
}

/// Checks one block read at a position of the chain. An error means the log ends before it
/// (never written in this chain, or torn): it is the normal way a log ends.
pub fn decode_log_block<'a>(
    buf: &'a [u8],
    exp: &LogExpect,
) -> Result<(LogBlockHeader, &'a [u8]), Corrupt> {
    let what = |f: &str| format!("log block {} {f}", exp.block);
    ensure!(
        buf.len() == BLOCK_SIZE as usize,
        what("length"),
        buf.len(),
        BLOCK_SIZE
    );
    let (h, body) = LogBlockHeader::read_from_prefix(buf)
        .map_err(|_| Corrupt::new(what("length"), buf.len(), LOG_HEADER_SIZE))?;
    ensure!(h.magic == LOG_MAGIC, what("magic"), "other", "IXLG");
    let csum = crc32c::crc32c(buf.get(4..).unwrap_or(&[]));
    ensure!(
        h.csum.get() == csum,
        what("checksum"),
        format!("{:#010x}", h.csum.get()),
        format!("{csum:#010x}")
    );
    ensure!(h.fsid == exp.fsid, what("fsid"), "another", "this image's");
    ensure!(
        h.generation.get() == exp.generation,
        what("generation"),
        h.generation.get(),
        exp.generation
    );
    ensure!(h.seq.get() == exp.seq, what("seq"), h.seq.get(), exp.seq);
    ensure!(
        h.block.get() == exp.block,
        what("block"),
        h.block.get(),
        exp.block
    );
    let len = h.len.get() as usize;
    ensure!(
        len <= LOG_PAYLOAD,
        what("length"),
        len,
        format!("<= {LOG_PAYLOAD}")
    );
    let payload = body.get(..len).unwrap_or(&[]);
    Ok((h, payload))
}

/// One record of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogRecord {
    Put(Key, Vec<u8>),
    Delete(Key),
    Counters {
        next_ino: u64,
        inode_count: u64,
    },
    /// The records after it, to the end of the batch or the next one, are of subvolume `id`.
    Tree(u64),
}

/// Appends `r` to a batch's payload.
pub fn encode_log_record(r: &LogRecord, out: &mut Vec<u8>) {
    let (kind, key, val): (u8, Key, &[u8]) = match r {
        LogRecord::Put(k, v) => (LOG_PUT, *k, v),
        LogRecord::Delete(k) => (LOG_DELETE, *k, &[]),
        LogRecord::Counters { .. } => (LOG_COUNTERS, Key::MIN, &[]),
        LogRecord::Tree(_) => (LOG_TREE, Key::MIN, &[]),
    };
    out.push(kind);
    out.extend_from_slice(&key.encode());
    match r {
        LogRecord::Counters {
            next_ino,
            inode_count,
        } => {
            out.extend_from_slice(&16u32.to_le_bytes());
            out.extend_from_slice(&next_ino.to_le_bytes());
            out.extend_from_slice(&inode_count.to_le_bytes());
        }
        LogRecord::Tree(id) => {
            out.extend_from_slice(&8u32.to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
        }
        _ => {
            out.extend_from_slice(&(val.len() as u32).to_le_bytes());
            out.extend_from_slice(val);
        }
    }
}

/// Decodes a whole batch's payload. The batch passed its block checksums, so an error here is
/// corruption (or a writer bug), not a torn write.
pub fn decode_log_records(mut data: &[u8], what: &str) -> Result<Vec<LogRecord>, Corrupt> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let at = |f: &str| format!("{what} record {} {f}", out.len());
        let (head, rest) = data
            .split_at_checked(LOG_RECORD_HEADER)
            .ok_or_else(|| Corrupt::new(at("header"), data.len(), LOG_RECORD_HEADER))?;
        let (kind, head) = head.split_at(1);
        let (key, len) = head.split_at(KEY_SIZE);
        let key = Key::decode(key.try_into().unwrap_or(&[0; KEY_SIZE]));
        let len = u32::from_le_bytes(len.try_into().unwrap_or([0; 4])) as usize;
        let (val, rest) = rest
            .split_at_checked(len)
            .ok_or_else(|| Corrupt::new(at("value length"), len, format!("<= {}", rest.len())))?;
        let r = match kind.first().copied().unwrap_or(0) {
            LOG_PUT => LogRecord::Put(key, val.to_vec()),
            LOG_DELETE => {
                ensure!(len == 0, at("delete length"), len, 0);
                LogRecord::Delete(key)
            }
            LOG_COUNTERS => {
                ensure!(len == 16, at("counters length"), len, 16);
                let (a, b) = val.split_at(8);
                LogRecord::Counters {
                    next_ino: u64::from_le_bytes(a.try_into().unwrap_or([0; 8])),
                    inode_count: u64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
                }
            }
            LOG_TREE => {
                ensure!(len == 8, at("tree length"), len, 8);
                LogRecord::Tree(u64::from_le_bytes(val.try_into().unwrap_or([0; 8])))
            }
            k => {
                return Err(Corrupt::new(
                    at("kind"),
                    k,
                    "1 (put), 2 (delete), 3 (counters) or 4 (tree)",
                ))
            }
        };
        out.push(r);
        data = rest;
    }
    Ok(out)
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    reason = "tests index fixed, known-good buffers"
)]
mod tests {
    use super::*;
    use crate::ItemType;

    fn exp() -> LogExpect {
        LogExpect {
            fsid: [7; 16],
            generation: 9,
            seq: 3,
            block: 100,
        }
    }

    #[test]
    fn block_roundtrip_and_every_check() {
        let mut buf = vec![0u8; BLOCK_SIZE as usize];
        encode_log_block(&exp(), 101, true, b"payload", &mut buf);
        let (h, p) = decode_log_block(&buf, &exp()).expect("valid");
        assert_eq!(
            (h.next.get(), h.flags.get(), p),
            (101, LOG_BATCH_END, &b"payload"[..])
        );
        for bad in [
            LogExpect { seq: 4, ..exp() },
            LogExpect {
                generation: 8,
                ..exp()
            },
            LogExpect { block: 99, ..exp() },
            LogExpect {
                fsid: [6; 16],
                ..exp()
            },
        ] {
            assert!(decode_log_block(&buf, &bad).is_err(), "{bad:?}");
        }
        let mut torn = buf.clone();
        torn[LOG_HEADER_SIZE + 2] ^= 1;
        let e = decode_log_block(&torn, &exp()).expect_err("torn");
        assert!(e.what.contains("checksum"), "{e}");
        assert!(decode_log_block(&vec![0u8; BLOCK_SIZE as usize], &exp()).is_err());
    }

    #[test]
    fn records_roundtrip_and_reject_garbage() {
        let rs = vec![
            LogRecord::Put(Key::new(5, ItemType::Inode, 0), vec![1, 2, 3]),
            LogRecord::Delete(Key::new(6, ItemType::DirHash, 77)),
            LogRecord::Counters {
                next_ino: 10,
                inode_count: 4,
            },
            LogRecord::Tree(257),
            LogRecord::Delete(Key::new(6, ItemType::DirHash, 77)),
        ];
        let mut b = Vec::new();
        for r in &rs {
            encode_log_record(r, &mut b);
        }
        assert_eq!(decode_log_records(&b, "t").expect("valid"), rs);
        assert!(
            decode_log_records(&b[..b.len() - 1], "t").is_err(),
            "cut short"
        );
        let mut k = b.clone();
        k[0] = 9;
        assert!(decode_log_records(&k, "t").is_err(), "unknown kind");
        // A tree record whose value is not one u64.
        let mut t = Vec::new();
        encode_log_record(&LogRecord::Tree(3), &mut t);
        t[1 + KEY_SIZE] = 7;
        assert!(decode_log_records(&t, "t").is_err(), "tree length");
    }
}
