//! `idxfs rm PATH`: the server removes PATH and everything under it inside the engine
//! (`idxfs_engine::Fs::remove_tree`), asked through an ioctl on PATH's parent directory,
//! instead of the kernel sending an UNLINK or RMDIR (and a LOOKUP or a listing) per name.
//! Anyone who can open PATH's parent may ask; the server holds every caller but root to the
//! checks `rm -rf` would meet on the way down (`permission::RemoveChecks`: read and search
//! to list a directory, write and search to remove from one, the sticky bit), since the
//! kernel checks nothing past the ioctl's open. The first refusal ends the removal with
//! EACCES or EPERM, what went before it gone (`rm -rf` would go on with the rest). Unlike
//! `rm`, it needs read permission on PATH's parent, which it opens to send the ioctl.
//! The server then tells the kernel to forget the name, which
//! drops what it cached of the tree (a file still open stays readable until closed, as
//! after `rm`).
//!
//! The argument, `ARG_SIZE` bytes each way: in, the name's length u8 and the name; out, the
//! files removed u64 and the directories removed u64 so far, and the token u64 to go on
//! with (0: done) (little-endian). The server removes for a slice at a time (`slices`):
//! while the reply's token is not 0, the client sends it back in `IOC_RMTREE_MORE` (the
//! token u64, the rest zeros) on the same directory, and gets the same reply.
use std::io;
use std::path::Path;

pub const ARG_SIZE: usize = 264;
/// `_IOWR(0xD7, 5, [u8; ARG_SIZE])`.
pub const IOC_RMTREE: u32 = (3 << 30) | ((ARG_SIZE as u32) << 16) | (0xD7 << 8) | 5;
/// `_IOWR(0xD7, 8, [u8; ARG_SIZE])`: the next slice of a removal.
pub const IOC_RMTREE_MORE: u32 = (3 << 30) | ((ARG_SIZE as u32) << 16) | (0xD7 << 8) | 8;

/// The request for `name` (1 to 255 bytes); None for a name no server could take.
pub fn encode(name: &[u8]) -> Option<Vec<u8>> {
    let len = u8::try_from(name.len()).ok().filter(|l| *l > 0)?;
    let mut buf = vec![0u8; ARG_SIZE];
    buf[0] = len;
    buf.get_mut(1..1 + name.len())?.copy_from_slice(name);
    Some(buf)
}

/// The server's side of `encode`.
pub fn decode(buf: &[u8]) -> Option<&[u8]> {
    let len = *buf.first()? as usize;
    buf.get(1..1 + len).filter(|n| !n.is_empty())
}

/// The reply: files and directories removed so far, and the token for the next slice (0:
/// done).
pub fn encode_removed(files: u64, dirs: u64, token: u64) -> Vec<u8> {
    [files, dirs, token]
        .iter()
        .flat_map(|n| n.to_le_bytes())
        .collect()
}

/// The client's side of `encode_removed`.
fn decode_removed(buf: &[u8]) -> Option<[u64; 3]> {
    let n = |i: usize| -> Option<u64> {
        Some(u64::from_le_bytes(
            buf.get(i * 8..i * 8 + 8)?.try_into().ok()?,
        ))
    };
    Some([n(0)?, n(1)?, n(2)?])
}

/// The request for the slice after a reply with `token`.
pub fn encode_more(token: u64) -> Vec<u8> {
    crate::slices::more_request(token, ARG_SIZE)
}

/// The server's side of `encode_more`.
pub fn decode_more(buf: &[u8]) -> Option<u64> {
    crate::slices::token_of(buf)
}

/// Asks the server of the idxfs mount holding directory `parent` to remove `name` in it and
/// everything under it, a slice at a time until it is done; `slice` is told the files and
/// directories removed after each; returns the files and directories removed.
pub fn remove(
    parent: &Path,
    name: &[u8],
    mut slice: impl FnMut(u64, u64),
) -> io::Result<(u64, u64)> {
    let mut buf = encode(name).ok_or_else(|| io::Error::other("a name of 1 to 255 bytes"))?;
    let mut cmd = IOC_RMTREE;
    loop {
        // EACCES and EPERM are the checks' on the way down, not the usual refusal of a
        // caller; EAGAIN, a user running as many removals as one may.
        crate::root_ioctl::send_raw(parent, cmd, &mut buf).map_err(|e| match e.raw_os_error() {
            Some(libc::EACCES | libc::EPERM | libc::EAGAIN) => e,
            _ => crate::root_ioctl::explained(e, parent, "remove a tree in"),
        })?;
        let [files, dirs, token] =
            decode_removed(&buf).ok_or_else(|| io::Error::other("a reply too short"))?;
        if token == 0 {
            return Ok((files, dirs));
        }
        slice(files, dirs);
        (cmd, buf) = (IOC_RMTREE_MORE, encode_more(token));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_goes_there_and_back_and_bad_ones_are_refused() {
        let buf = encode(b"build-cache").expect("encode");
        assert_eq!(buf.len(), ARG_SIZE);
        assert_eq!(decode(&buf), Some(&b"build-cache"[..]));
        assert!(encode(b"").is_none());
        assert!(encode(&[b'x'; 256]).is_none());
        assert_eq!(encode(&[b'x'; 255]).map(|b| b.len()), Some(ARG_SIZE));
        assert_eq!(decode(&[0u8; ARG_SIZE]), None);
        assert_eq!(decode(&[]), None);
        let mut buf = encode_removed(3, 4, 5);
        buf.resize(ARG_SIZE, 0);
        assert_eq!(decode_removed(&buf), Some([3, 4, 5]));
        assert_eq!(decode_removed(&buf[..20]), None);
        assert_eq!(decode_more(&encode_more(9)), Some(9));
        assert_eq!(decode_more(&[0u8; ARG_SIZE]), None);
    }
}
