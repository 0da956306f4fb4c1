//! Remount: changing a mounted file system.
//!
//! `mount -o remount,ro DIR` runs `idxfs SRC DIR -o ro,...,remount,...` through mount.fuse3.
//! The kernel's half is a mount(2) with MS_REMOUNT (read-only, the atime words and the other
//! VFS flags; FUSE's reconfigure accepts those), but the server must hear of it too: the
//! engine keeps its own read-only state, atime policy and sync mode, and a server that went
//! on writing under a read-only mount, or stopped committing under a writable one, would be
//! wrong either way. The server hears through an ioctl on the mount's root directory, which
//! FUSE passes on with the caller's uid: only root and the mount's owner may make it.
//!
//! Order: the server first (it commits before it goes read-only, and may refuse to become
//! writable), then the kernel; if the kernel refuses, the server is put back as it was (the
//! ioctl answers with the settings it replaced).
use crate::MountConfig;
use idxfs_engine::fs::{Atime, SyncMode};
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The settings a remount changes, as the ioctl carries them (16 bytes, little-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub read_only: bool,
    pub atime: Atime,
    pub sync: SyncMode,
}

const ARG_SIZE: u32 = 16;
/// `_IOWR(0xD7, 1, [u8; 16])`: in, the new settings; out, the ones they replaced.
pub const IOC_REMOUNT: u32 = (3 << 30) | (ARG_SIZE << 16) | (0xD7 << 8) | 1;

impl Settings {
    pub fn of(cfg: &MountConfig) -> Settings {
        Settings {
            read_only: cfg.read_only,
            atime: cfg.atime,
            sync: cfg.sync,
        }
    }

    pub fn encode(&self) -> [u8; ARG_SIZE as usize] {
        let mut b = [0u8; ARG_SIZE as usize];
        b[0] = u8::from(self.read_only);
        b[4] = match self.atime {
            Atime::NoAtime => 0,
            Atime::Relatime => 1,
            Atime::Strict => 2,
        };
        b[8] = match self.sync {
            SyncMode::Async => 0,
            SyncMode::Dirs => 1,
            SyncMode::All => 2,
        };
        b
    }

    /// None for anything but what `encode` makes.
    pub fn decode(b: &[u8]) -> Option<Settings> {
        let b: &[u8; ARG_SIZE as usize] = b.try_into().ok()?;
        let zero = |r: std::ops::Range<usize>| b.get(r).is_some_and(|s| s.iter().all(|&x| x == 0));
        if !(zero(1..4) && zero(5..8) && zero(9..16)) {
            return None;
        }
        Some(Settings {
            read_only: match b[0] {
                0 => false,
                1 => true,
                _ => return None,
            },
            atime: match b[4] {
                0 => Atime::NoAtime,
                1 => Atime::Relatime,
                2 => Atime::Strict,
                _ => return None,
            },
            sync: match b[8] {
                0 => SyncMode::Async,
                1 => SyncMode::Dirs,
                2 => SyncMode::All,
                _ => return None,
            },
        })
    }
}

/// Asks the server of the mount at `mp` for `s`; returns the settings it had.
fn tell_server(mp: &Path, s: Settings) -> io::Result<Settings> {
    let mut buf = s.encode();
    crate::root_ioctl::send(mp, IOC_REMOUNT, &mut buf, "remount")?;
    Settings::decode(&buf).ok_or_else(|| io::Error::other("the server answered the remount oddly"))
}

/// The kernel's half: MS_REMOUNT with the flags `cfg` makes.
fn remount_kernel(source: &str, mp: &Path, cfg: &MountConfig) -> io::Result<()> {
    let cstr = |b: &[u8]| {
        CString::new(b).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte"))
    };
    let (src, target) = (cstr(source.as_bytes())?, cstr(mp.as_os_str().as_bytes())?);
    // SAFETY: valid C strings that outlive the call; no data string.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | cfg.kernel_flags(),
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Remounts the idxfs mount at `mp` (image `source`) as `cfg` says.
pub fn remount(source: &str, mp: &Path, cfg: &MountConfig) -> io::Result<()> {
    let old = tell_server(mp, Settings::of(cfg))?;
    if let Err(e) = remount_kernel(source, mp, cfg) {
        // Put the server back as it was; the error to report is the kernel's.
        let _ = tell_server(mp, old);
        return Err(io::Error::new(
            e.kind(),
            format!("{}: the kernel refused the remount: {e}", mp.display()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_roundtrip_and_reject_garbage() {
        for read_only in [false, true] {
            for atime in [Atime::NoAtime, Atime::Relatime, Atime::Strict] {
                for sync in [SyncMode::Async, SyncMode::Dirs, SyncMode::All] {
                    let s = Settings {
                        read_only,
                        atime,
                        sync,
                    };
                    assert_eq!(Settings::decode(&s.encode()), Some(s));
                }
            }
        }
        assert_eq!(Settings::decode(&[0; 15]), None);
        let mut b = [0u8; 16];
        b[0] = 2;
        assert_eq!(Settings::decode(&b), None);
        b[0] = 0;
        b[12] = 1;
        assert_eq!(Settings::decode(&b), None);
        assert_eq!(IOC_REMOUNT, 0xC010_D701);
    }
}
