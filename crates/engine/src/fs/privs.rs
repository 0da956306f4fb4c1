//! Privileges a change takes away, as Linux's own file systems do: set-user-ID, set-group-ID
//! and file capabilities (`security.capability`) do not outlive a change to the file by
//! somebody who could not have set them.
//!
//! When (FUSE's `FUSE_HANDLE_KILLPRIV_V2` contract, which leaves this to the server and so
//! spares the kernel a getxattr of `security.capability` before writes, and a getattr before
//! each chown):
//! - a *write* drops the file's capabilities whoever writes (as `file_remove_privs`), and
//!   set-user-ID and set-group-ID when the kernel says the writer lacks CAP_FSETID
//!   (`WriteHow::kill`);
//! - a *truncate* drops set-user-ID and set-group-ID when setattr says so the same way
//!   (`SetAttr::kill`); the kernel drops capabilities itself on truncate and chown, by a
//!   removexattr;
//! - *fallocate* drops them as the front end says (`Fs::fallocate_with`): FUSE passes no flag
//!   with it, and the kernel's own attempt (a setattr from `file_modified`) is dropped under
//!   KILLPRIV_V2, so the server decides by the caller;
//! - a *chown* of anything but a directory drops set-user-ID, and set-group-ID of a file its
//!   group may execute, whoever asks (`chown_common`), unless the same setattr sets the mode:
//!   a kernel that works the new mode out itself sends it.
//!
//! Set-group-ID without group execute marks mandatory locking, not a privilege: Linux drops
//! it only when the caller is outside the file's group (`setattr_should_drop_sgid`), which
//! the front end finds out (`Kill::outside_group`); a chown by root keeps it.
use super::{Inner, Ino, Kill};
use crate::error::{Error, Result};
use idxfs_format::items::{S_IFDIR, S_IFMT};

/// The xattr holding a file's capabilities.
pub const CAPS_XATTR: &[u8] = b"security.capability";

const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const S_IXGRP: u32 = 0o010;

/// `mode` without set-user-ID, and without set-group-ID when the group may execute or the
/// caller is outside the file's group.
pub(crate) fn without_suidgid(mode: u32, outside_group: bool) -> u32 {
    let mut m = mode & !S_ISUID;
    if m & S_IXGRP != 0 || outside_group {
        m &= !S_ISGID;
    }
    m
}

/// `mode` after a change asked for with `kill`.
pub(crate) fn after(mode: u32, kill: Kill) -> u32 {
    if kill.suidgid {
        without_suidgid(mode, kill.outside_group)
    } else {
        mode
    }
}

/// Whether a setattr drops set-user-ID and set-group-ID by changing the owner: any chown of a
/// non-directory that does not also set the mode.
pub(crate) fn chown_drops(mode: u32, set: &super::SetAttr) -> bool {
    (set.uid.is_some() || set.gid.is_some()) && set.mode.is_none() && mode & S_IFMT != S_IFDIR
}

/// What a change must take away from an inode before it changes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Drops {
    /// The mode without set-user-ID and set-group-ID, when that differs from the mode.
    pub mode: Option<u32>,
    /// The inode has a `security.capability` xattr.
    pub caps: bool,
}

impl Drops {
    pub fn any(&self) -> bool {
        self.mode.is_some() || self.caps
    }
}

impl Inner {
    /// What a write to `ino` must drop first (see the module notes): its capabilities, and
    /// what `kill` says of set-user-ID and set-group-ID. Changes nothing; refuses anything
    /// but a regular file, as a write does.
    pub(crate) fn write_drops(&mut self, ino: Ino, kill: Kill) -> Result<Drops> {
        let it = self.inode(ino)?;
        // Only files are written; anything else is refused before a drop changes it.
        super::file::check_regular(&it)?;
        let mode = it.mode.get();
        let dropped = after(mode, kill);
        let caps = match self.xattr_value(ino, CAPS_XATTR) {
            Ok(_) => true,
            Err(Error::NoData) => false,
            Err(e) => return Err(e),
        };
        Ok(Drops {
            mode: (dropped != mode).then_some(dropped),
            caps,
        })
    }

    /// Takes away what `d` names, setting the change time. The caller reserved for an inode
    /// change and an xattr removal.
    pub(crate) fn apply_drop(&mut self, ino: Ino, d: Drops) -> Result<()> {
        if d.caps {
            match self.remove_xattr(ino, CAPS_XATTR) {
                // Gone meanwhile: nothing to drop.
                Ok(()) | Err(Error::NoData) => {}
                Err(e) => return Err(e),
            }
        }
        if let Some(m) = d.mode {
            let now = self.now();
            self.modify_inode(ino, |i| {
                i.mode = ((i.mode.get() & S_IFMT) | (m & !S_IFMT)).into();
                i.ctime = now;
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_group_id_goes_with_group_execute_or_from_outside_the_group() {
        assert_eq!(without_suidgid(0o104755, false), 0o100755);
        assert_eq!(without_suidgid(0o102755, false), 0o100755);
        assert_eq!(without_suidgid(0o106755, false), 0o100755);
        // Mandatory-locking marker: kept for a caller in the group, dropped for one outside.
        assert_eq!(without_suidgid(0o102644, false), 0o102644);
        assert_eq!(without_suidgid(0o106744, false), 0o102744);
        assert_eq!(without_suidgid(0o102644, true), 0o100644);
        assert_eq!(without_suidgid(0o100644, true), 0o100644);
        // The sticky bit is no privilege.
        assert_eq!(without_suidgid(0o101777, true), 0o101777);
        let kill = Kill {
            suidgid: true,
            outside_group: false,
        };
        assert_eq!(after(0o106755, kill), 0o100755);
        assert_eq!(after(0o106755, Kill::default()), 0o106755);
    }

    #[test]
    fn chown_drops_only_for_non_directories_without_a_mode() {
        let chown = super::super::SetAttr {
            uid: Some(1),
            ..Default::default()
        };
        assert!(chown_drops(0o104755, &chown));
        assert!(!chown_drops(0o042755, &chown));
        let with_mode = super::super::SetAttr {
            gid: Some(1),
            mode: Some(0o755),
            ..Default::default()
        };
        assert!(!chown_drops(0o104755, &with_mode));
        assert!(!chown_drops(0o104755, &Default::default()));
    }
}
