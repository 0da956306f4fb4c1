//! `idxfs cp SRC DST`: the server copies SRC and everything under it to DST inside the
//! engine (`idxfs_engine::Fs::copy_tree`: data shared, not read and written), asked through
//! an ioctl on DST's parent directory, instead of the kernel sending a LOOKUP, MKNOD,
//! SETATTR, COPY_FILE_RANGE and xattr requests per name for `cp -a`.
//!
//! Only root and the mount's owner may ask, as for `idxfs import`: the copy keeps owners and
//! modes as it likes, and the engine checks no permission on the way. The source is on the
//! same mount: in the file system, or in a snapshot (`MOUNT/.snapshots/NAME/...`, or a whole
//! snapshot `MOUNT/.snapshots/NAME`), whose blocks the copy then shares: a tree restored out
//! of a snapshot at the cost of its metadata. The snapshots directory itself is not a tree to
//! copy (EXDEV). Afterwards the server tells the kernel to forget DST's name and its
//! parent's attributes, which it may have cached.
//!
//! The argument, `ARG_SIZE` bytes each way: in, the source's parent directory's inode number
//! u64 (its `st_ino` on the mount), then the source's name and the destination's, each a
//! length u8 and the bytes; out, the files u64, directories u64 and file bytes u64 copied
//! (little-endian).
use std::io;
use std::path::Path;

pub const ARG_SIZE: usize = 8 + 2 * 256;
/// `_IOWR(0xD7, 6, [u8; ARG_SIZE])`.
pub const IOC_CPTREE: u32 = (3 << 30) | ((ARG_SIZE as u32) << 16) | (0xD7 << 8) | 6;

/// What one request asks.
#[derive(Debug, PartialEq, Eq)]
pub struct Ask<'a> {
    pub src_parent: u64,
    pub src: &'a [u8],
    pub dst: &'a [u8],
}

/// The request; None for a name no server could take (empty, or over 255 bytes).
pub fn encode(src_parent: u64, src: &[u8], dst: &[u8]) -> Option<Vec<u8>> {
    let mut buf = src_parent.to_le_bytes().to_vec();
    for n in [src, dst] {
        let len = u8::try_from(n.len()).ok().filter(|l| *l > 0)?;
        buf.push(len);
        buf.extend_from_slice(n);
    }
    buf.resize(ARG_SIZE, 0);
    Some(buf)
}

/// The server's side of `encode`.
pub fn decode(buf: &[u8]) -> Option<Ask<'_>> {
    let src_parent = u64::from_le_bytes(buf.get(..8)?.try_into().ok()?);
    let name = |at: usize| -> Option<(&[u8], usize)> {
        let len = *buf.get(at)? as usize;
        let n = buf.get(at + 1..at + 1 + len).filter(|n| !n.is_empty())?;
        Some((n, at + 1 + len))
    };
    let (src, next) = name(8)?;
    let (dst, _) = name(next)?;
    Some(Ask {
        src_parent,
        src,
        dst,
    })
}

/// The reply: files, directories and file bytes copied.
pub fn encode_copied(files: u64, dirs: u64, bytes: u64) -> Vec<u8> {
    [files, dirs, bytes]
        .iter()
        .flat_map(|n| n.to_le_bytes())
        .collect()
}

/// Asks the server of the idxfs mount holding directory `dst_parent` to copy `src` in the
/// directory numbered `src_parent` (on the same mount) to `dst` in `dst_parent`; returns the
/// files, directories and bytes copied.
pub fn copy(dst_parent: &Path, src_parent: u64, src: &[u8], dst: &[u8]) -> io::Result<[u64; 3]> {
    let mut buf =
        encode(src_parent, src, dst).ok_or_else(|| io::Error::other("names of 1 to 255 bytes"))?;
    // The copy's own errors as they are; the usual refusals in words. EINVAL here is the
    // engine's "into itself": the names were checked above, and a server that does not
    // know the command answers ENOTTY.
    crate::root_ioctl::send_raw(dst_parent, IOC_CPTREE, &mut buf).map_err(|e| {
        match e.raw_os_error() {
            Some(libc::EINVAL | libc::EEXIST | libc::ENOENT | libc::EXDEV | libc::ENOSPC) => e,
            _ => crate::root_ioctl::explained(e, dst_parent, "copy a tree in"),
        }
    })?;
    let n = |i: usize| u64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
    Ok([n(0), n(1), n(2)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_goes_there_and_back_and_bad_names_are_refused() {
        let buf = encode(77, b"data", b"data.v2").expect("encode");
        assert_eq!(buf.len(), ARG_SIZE);
        assert_eq!(
            decode(&buf),
            Some(Ask {
                src_parent: 77,
                src: b"data",
                dst: b"data.v2"
            })
        );
        let long = [b'x'; 255];
        let buf = encode(1, &long, &long).expect("the longest names");
        assert_eq!(buf.len(), ARG_SIZE);
        assert_eq!(decode(&buf).map(|a| a.dst.len()), Some(255));
        assert!(encode(1, b"", b"x").is_none());
        assert!(encode(1, b"x", &[b'x'; 256]).is_none());
        assert_eq!(decode(&[0u8; ARG_SIZE]), None);
        assert_eq!(decode(&[1, 2, 3]), None);
    }
}
