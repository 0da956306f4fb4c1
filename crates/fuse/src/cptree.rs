//! `idxfs cp SRC DST`: the server copies SRC and everything under it to DST inside the
//! engine (`idxfs_engine::Fs::copy_tree`: data shared, not read and written), asked through
//! an ioctl on DST's parent directory, instead of the kernel sending a LOOKUP, MKNOD,
//! SETATTR, COPY_FILE_RANGE and xattr requests per name for `cp -a`.
//!
//! Anyone may ask. Root and the mount's owner copy as root's `cp -a` does, owners and modes
//! kept; anyone else as their own `cp -a` would, the server making the checks the kernel
//! would have made for each call (`permission::CopyChecks`): what they may not read or make
//! is left out and counted, as `cp -a` reports it and goes on. The source is on the
//! same mount: in the file system, or in a snapshot (`MOUNT/.snapshots/NAME/...`, or a whole
//! snapshot `MOUNT/.snapshots/NAME`), whose blocks the copy then shares: a tree restored out
//! of a snapshot at the cost of its metadata. The snapshots directory itself is not a tree to
//! copy (EXDEV). Afterwards the server tells the kernel to forget DST's name and its
//! parent's attributes, which it may have cached.
//!
//! The argument, `ARG_SIZE` bytes each way: in, the source's parent directory's inode number
//! u64 (its `st_ino` on the mount), then the source's name and the destination's, each a
//! length u8 and the bytes; out, the files u64, directories u64, file bytes u64 and entries
//! refused u64 so far, the token u64 to go on with (0: done), then the first refusal's
//! errno u32 and its path under the copy's top (a length u16 and the bytes, its end kept
//! when it is longer than the rest of the buffer) (little-endian).
//!
//! The server copies for a slice at a time (`slices`): while the reply's token is not 0, the
//! client sends it back in `IOC_CPTREE_MORE` (the token u64, the rest zeros) on the same
//! directory, and gets the same reply.
use std::io;
use std::path::Path;

pub const ARG_SIZE: usize = 8 + 2 * 256;
/// `_IOWR(0xD7, 6, [u8; ARG_SIZE])`.
pub const IOC_CPTREE: u32 = (3 << 30) | ((ARG_SIZE as u32) << 16) | (0xD7 << 8) | 6;
/// `_IOWR(0xD7, 7, [u8; ARG_SIZE])`: the next slice of a copy.
pub const IOC_CPTREE_MORE: u32 = (3 << 30) | ((ARG_SIZE as u32) << 16) | (0xD7 << 8) | 7;

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

/// Bytes of the reply before the first refusal's path.
const REPLY_HEAD: usize = 5 * 8 + 4 + 2;

/// What a copy did, as the reply carries it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Copied {
    pub files: u64,
    pub dirs: u64,
    pub bytes: u64,
    /// Entries left out, each refused.
    pub refused: u64,
    /// The first refusal: its path under the copy's top (empty for the top), and errno.
    pub first: Option<(Vec<u8>, i32)>,
    /// What to send in `IOC_CPTREE_MORE` for the next slice; 0 when the copy is done.
    pub token: u64,
}

/// The reply: the counts, the token for the next slice (0: done), and the first refusal
/// (`first`) if any.
pub fn encode_copied(
    c: &idxfs_engine::fs::Copied,
    token: u64,
    first: Option<&(Vec<u8>, i32)>,
) -> Vec<u8> {
    let mut out: Vec<u8> = [c.files, c.dirs, c.bytes, c.refused, token]
        .iter()
        .flat_map(|n| n.to_le_bytes())
        .collect();
    let (path, errno) = first.map_or((&[][..], 0), |(p, e)| (&p[..], *e));
    // A path longer than the buffer keeps its end: the name refused.
    let path = &path[path.len().saturating_sub(ARG_SIZE - REPLY_HEAD)..];
    out.extend_from_slice(&(errno as u32).to_le_bytes());
    out.extend_from_slice(&(path.len() as u16).to_le_bytes());
    out.extend_from_slice(path);
    out
}

/// The client's side of `encode_copied`; None for a reply too short for its counts.
pub fn decode_copied(buf: &[u8]) -> Option<Copied> {
    let n = |i: usize| -> Option<u64> {
        Some(u64::from_le_bytes(
            buf.get(i * 8..i * 8 + 8)?.try_into().ok()?,
        ))
    };
    let errno = u32::from_le_bytes(buf.get(40..44)?.try_into().ok()?) as i32;
    let len = u16::from_le_bytes(buf.get(44..46)?.try_into().ok()?) as usize;
    let path = buf.get(REPLY_HEAD..REPLY_HEAD + len)?.to_vec();
    Some(Copied {
        files: n(0)?,
        dirs: n(1)?,
        bytes: n(2)?,
        refused: n(3)?,
        first: (errno != 0).then_some((path, errno)),
        token: n(4)?,
    })
}

/// The request for the slice after a reply with `token`.
pub fn encode_more(token: u64) -> Vec<u8> {
    crate::slices::more_request(token, ARG_SIZE)
}

/// The server's side of `encode_more`.
pub fn decode_more(buf: &[u8]) -> Option<u64> {
    crate::slices::token_of(buf)
}

/// Asks the server of the idxfs mount holding directory `dst_parent` to copy `src` in the
/// directory numbered `src_parent` (on the same mount) to `dst` in `dst_parent`, a slice at
/// a time until it is done; `slice` is told the counts after each; returns what it copied
/// and refused.
pub fn copy(
    dst_parent: &Path,
    src_parent: u64,
    src: &[u8],
    dst: &[u8],
    mut slice: impl FnMut(&Copied),
) -> io::Result<Copied> {
    let mut buf =
        encode(src_parent, src, dst).ok_or_else(|| io::Error::other("names of 1 to 255 bytes"))?;
    let mut cmd = IOC_CPTREE;
    loop {
        send(dst_parent, cmd, &mut buf)?;
        let c = decode_copied(&buf).ok_or_else(|| io::Error::other("a reply too short"))?;
        if c.token == 0 {
            return Ok(c);
        }
        slice(&c);
        (cmd, buf) = (IOC_CPTREE_MORE, encode_more(c.token));
    }
}

/// One request: the copy's own errors as they are; the usual refusals in words. EINVAL
/// here is the engine's "into itself" (the names were checked before, and a server that
/// does not know the command answers ENOTTY), or a token the server no longer holds.
fn send(dst_parent: &Path, cmd: u32, buf: &mut [u8]) -> io::Result<()> {
    crate::root_ioctl::send_raw(dst_parent, cmd, buf).map_err(|e| match e.raw_os_error() {
        Some(
            libc::EINVAL
            | libc::EEXIST
            | libc::ENOENT
            | libc::EXDEV
            | libc::ENOSPC
            | libc::EACCES
            | libc::EPERM
            | libc::EAGAIN,
        ) => e,
        _ => crate::root_ioctl::explained(e, dst_parent, "copy a tree in"),
    })
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

    #[test]
    fn a_reply_carries_the_counts_and_the_end_of_the_first_refusal() {
        let c = idxfs_engine::fs::Copied {
            files: 1,
            dirs: 2,
            bytes: 3,
            refused: 4,
        };
        let mut buf = encode_copied(&c, 77, None);
        buf.resize(ARG_SIZE, 0);
        let none = decode_copied(&buf).expect("decode");
        assert_eq!(
            (none.files, none.dirs, none.bytes, none.refused),
            (1, 2, 3, 4)
        );
        assert_eq!(none.token, 77);
        assert_eq!(none.first, None);
        let first = (b"a/b/secret".to_vec(), libc::EACCES);
        let mut buf = encode_copied(&c, 0, Some(&first));
        buf.resize(ARG_SIZE, 0);
        assert_eq!(decode_copied(&buf).expect("decode").first, Some(first));
        // A path longer than the buffer keeps its end.
        let mut long = vec![b'd'; 600];
        long.extend_from_slice(b"/name");
        let buf = encode_copied(&c, 0, Some(&(long.clone(), libc::EPERM)));
        assert!(buf.len() <= ARG_SIZE);
        let (path, errno) = decode_copied(&buf).expect("decode").first.expect("first");
        assert_eq!(errno, libc::EPERM);
        assert!(path.ends_with(b"/name") && long.ends_with(&path));
        assert_eq!(decode_copied(&buf[..20]), None);
        assert_eq!(decode_more(&encode_more(9)), Some(9));
        assert_eq!(decode_more(&[0u8; ARG_SIZE]), None);
    }
}
