//! The transport of `idxfs import DIR MOUNT/PATH`: a directory tree copied into a mounted
//! file system by its server, through the engine, instead of file by file through FUSE.
//!
//! The client (the `idxfs` command, run by the user) reads DIR with its own rights and sends
//! what it read as a byte stream of items (`cli/src/import/wire.rs`); the server decodes the
//! stream and makes each entry through the engine (`ImportServer`, implemented by the cli,
//! which owns the item format and the writer `mkfs --from` uses too). So the server never
//! opens a path of the caller's: it only ever gets bytes the caller could read.
//!
//! The stream goes in ioctls on the directory that is to hold PATH, each at most
//! `IOC_BYTES` (the largest size an ioctl command can encode): `Begin` names PATH (a new
//! directory) and opens a session, `Data` carries the next piece of the stream, `End`
//! finishes the copy and commits it. A session belongs to the uid that opened it.
//!
//! Who may: root and the mount's owner, as for a remount or a trim. The copy keeps owners,
//! modes (set-user-ID included), device numbers and every xattr, as `mkfs --from` does,
//! without checking the caller's rights inside the mount: root has them all, and the mount's
//! owner opened the image itself (a user's mount is `nosuid,nodev`, and its owner can write
//! the image's bytes anyway).
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// The bytes of one import ioctl, in and out: the most an ioctl command's size field holds.
pub const IOC_BYTES: usize = (1 << 14) - 1;
/// `_IOWR(0xD7, 3, [u8; IOC_BYTES])`.
pub const IOC_IMPORT: u32 = (3 << 30) | ((IOC_BYTES as u32) << 16) | (0xD7 << 8) | 3;
/// In: op (u32), payload length (u32), session (u64), then the payload.
const HEAD: usize = 16;
/// The most stream bytes one `Data` request carries.
pub const ROOM: usize = IOC_BYTES - HEAD;
/// Out: status (u32: 0 done, 1 failed), session (u64), message length (u32), message.
const OUT_HEAD: usize = 16;

/// What one request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Payload: the new directory's name in the directory the ioctl is sent to.
    Begin = 1,
    /// Payload: the next bytes of the item stream.
    Data = 2,
    /// No payload: the stream is complete.
    End = 3,
}

impl Op {
    fn from_u32(v: u32) -> Option<Op> {
        match v {
            1 => Some(Op::Begin),
            2 => Some(Op::Data),
            3 => Some(Op::End),
            _ => None,
        }
    }
}

/// Who asks: the caller's uid and pid, as the kernel gave them.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// The server's side of an import, given the mount's engine: what the cli implements.
pub trait ImportServer: Send + Sync {
    /// Makes directory `name` in `parent` for the copy and opens a session for it.
    fn begin(
        &self,
        fs: &std::sync::Arc<idxfs_engine::Fs>,
        parent: u64,
        name: &[u8],
        who: Caller,
    ) -> Result<u64, String>;
    /// Takes the next bytes of session `session`'s stream, making every item they complete.
    fn data(&self, session: u64, who: Caller, bytes: &[u8]) -> Result<(), String>;
    /// Finishes session `session` (the attributes still to set, a commit); returns a summary.
    fn end(&self, session: u64, who: Caller) -> Result<String, String>;
}

/// A decoded request.
pub(crate) struct Request<'a> {
    pub op: Op,
    pub session: u64,
    pub payload: &'a [u8],
}

pub(crate) fn decode(input: &[u8]) -> Option<Request<'_>> {
    let u32_at = |at: usize| {
        input
            .get(at..at + 4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_le_bytes)
    };
    let op = Op::from_u32(u32_at(0)?)?;
    let len = u32_at(4)? as usize;
    let session = u64::from_le_bytes(input.get(8..16)?.try_into().ok()?);
    let payload = input.get(HEAD..HEAD.checked_add(len)?)?;
    Some(Request {
        op,
        session,
        payload,
    })
}

/// The reply's bytes: `Ok(message)` or `Err(message)`, with the session.
pub(crate) fn encode_reply(session: u64, r: &Result<String, String>) -> Vec<u8> {
    let (status, msg) = match r {
        Ok(m) => (0u32, m.as_bytes()),
        Err(m) => (1u32, m.as_bytes()),
    };
    let msg = msg
        .get(..msg.len().min(IOC_BYTES - OUT_HEAD))
        .unwrap_or(&[]);
    let mut out = Vec::with_capacity(OUT_HEAD + msg.len());
    out.extend_from_slice(&status.to_le_bytes());
    out.extend_from_slice(&session.to_le_bytes());
    out.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    out.extend_from_slice(msg);
    out
}

/// The client's side: sends one request through `dir` (the directory PATH goes in, opened
/// once for the whole copy). Returns the session and the server's message, or the server's
/// refusal as one line (`Err(Ok(line))`), or the ioctl's own failure (`Err(Err(e))`).
pub fn request(
    dir: &File,
    op: Op,
    session: u64,
    payload: &[u8],
) -> Result<(u64, String), Result<String, io::Error>> {
    if payload.len() > ROOM {
        return Err(Err(io::Error::other("an import request past its room")));
    }
    let mut buf = vec![0u8; IOC_BYTES];
    buf[..4].copy_from_slice(&(op as u32).to_le_bytes());
    buf[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    buf[8..16].copy_from_slice(&session.to_le_bytes());
    buf[HEAD..HEAD + payload.len()].copy_from_slice(payload);
    // SAFETY: IOC_IMPORT encodes `buf`'s length (IOC_BYTES) as its size, and the kernel
    // copies at most that much in and out.
    let r = unsafe { libc::ioctl(dir.as_raw_fd(), IOC_IMPORT as _, buf.as_mut_ptr()) };
    if r != 0 {
        return Err(Err(io::Error::last_os_error()));
    }
    let status = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let session = u64::from_le_bytes(buf[4..12].try_into().unwrap_or_default());
    let len = u32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]) as usize;
    let msg = buf
        .get(OUT_HEAD..OUT_HEAD + len.min(IOC_BYTES - OUT_HEAD))
        .map(|m| String::from_utf8_lossy(m).into_owned())
        .unwrap_or_default();
    match status {
        0 => Ok((session, msg)),
        _ => Err(Ok(msg)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_decode_and_refuse_short_or_unknown_input() {
        let mut buf = vec![0u8; IOC_BYTES];
        buf[..4].copy_from_slice(&2u32.to_le_bytes());
        buf[4..8].copy_from_slice(&3u32.to_le_bytes());
        buf[8..16].copy_from_slice(&77u64.to_le_bytes());
        buf[16..19].copy_from_slice(b"abc");
        let r = decode(&buf).expect("decodes");
        assert_eq!((r.op, r.session, r.payload), (Op::Data, 77, &b"abc"[..]));
        // A length past the buffer, an unknown op, a short header: refused.
        buf[4..8].copy_from_slice(&(IOC_BYTES as u32).to_le_bytes());
        assert!(decode(&buf).is_none());
        buf[4..8].copy_from_slice(&3u32.to_le_bytes());
        buf[..4].copy_from_slice(&9u32.to_le_bytes());
        assert!(decode(&buf).is_none());
        assert!(decode(&buf[..10]).is_none());
        // The command's size field holds the buffer's length.
        assert_eq!(((IOC_IMPORT >> 16) & 0x3fff) as usize, IOC_BYTES);
        assert!(encode_reply(1, &Err("x".repeat(IOC_BYTES))).len() <= IOC_BYTES);
    }
}
