//! The ioctls `idxfs` sends to its own server through a mount's root directory (remount,
//! trim): FUSE passes them on with the caller's uid, and the server answers only root and
//! the mount's owner.
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Sends `cmd` with `buf` (in and/or out, as `cmd` says; its size is `cmd`'s) to the server of
/// the mount at `mp`. `what` names the request in the messages of the usual refusals.
pub(crate) fn send(mp: &Path, cmd: u32, buf: &mut [u8], what: &str) -> io::Result<()> {
    send_raw(mp, cmd, buf).map_err(|e| explained(e, mp, what))
}

/// `send` without the messages: the error as the kernel or the server gave it.
pub(crate) fn send_raw(mp: &Path, cmd: u32, buf: &mut [u8]) -> io::Result<()> {
    // Not the server's answer: said so, without the errno the callers read as one.
    let dir = std::fs::File::open(mp)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot open {}: {e}", mp.display())))?;
    // SAFETY: every command sent here encodes `buf`'s length as its size, and the kernel
    // copies at most that much in and out.
    let r = unsafe { libc::ioctl(dir.as_raw_fd(), cmd as _, buf.as_mut_ptr()) };
    if r == 0 {
        return Ok(());
    }
    Err(io::Error::last_os_error())
}

/// The usual refusals of a request sent to `mp`'s server, in words.
pub(crate) fn explained(e: io::Error, mp: &Path, what: &str) -> io::Error {
    let m = mp.display();
    match e.raw_os_error() {
        Some(libc::ENOTTY) | Some(libc::ENOSYS) | Some(libc::EINVAL) => io::Error::other(format!(
            "{m}: not an idxfs mount (or its server is too old to {what})"
        )),
        Some(libc::EPERM) | Some(libc::EACCES) => {
            io::Error::other(format!("{m}: only root or the mount's owner may {what} it"))
        }
        Some(libc::EROFS) => io::Error::other(format!(
            "{m}: mounted read-only; remount it read-write to {what}"
        )),
        _ => e,
    }
}
