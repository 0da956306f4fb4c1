//! The kernel's permission checks (`generic_permission`, POSIX ACLs, `may_delete`'s sticky
//! bit), made by the server for a request that stands for many calls: `idxfs rm`'s ioctl
//! (`Fs::remove_tree`), where the kernel checks only that the caller could open the
//! directory it was sent on; and ACCESS, which the kernel sends where it does not check
//! (a root mount without `allow_other`). Everywhere else the kernel checks for itself
//! (`MountConfig::kernel_checks_permissions`).
//!
//! What `rm -rf` as the caller would meet: listing a directory needs read and search on it;
//! removing a name from a directory needs write and search on it, and, when the directory
//! has the sticky bit, the caller must own the directory or the file (EPERM otherwise, as
//! the kernel answers). Root passes every check (CAP_DAC_OVERRIDE and CAP_FOWNER); a
//! process of another uid holding those capabilities is held to the bits here (the server
//! sees uids, not capabilities): stricter than the kernel, never looser.
//!
//! A request carries the caller's uid, primary gid and pid, not its supplementary groups:
//! they are read from `/proc/PID/status` once per request, when a check first needs them.
//! A caller whose groups cannot be read (it exited) counts as in its primary group only.
use fuser::Request;
use idxfs_engine::error::Result;
use idxfs_engine::fs::acl::{Acl, GROUP, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ};
use idxfs_engine::fs::{Attr, CopyAs, Ino, Owner, Permits};
use idxfs_engine::{Error, Fs};
use std::sync::OnceLock;

pub const MAY_EXEC: u32 = 1;
pub const MAY_WRITE: u32 = 2;
pub const MAY_READ: u32 = 4;
const S_ISVTX: u32 = 0o1000;

/// Who asks: a request's uid and groups.
pub struct Caller {
    uid: u32,
    gid: u32,
    pid: u32,
    /// Supplementary groups, read when first needed (`groups_of`).
    groups: OnceLock<Vec<u32>>,
}

impl Caller {
    pub fn of(req: &Request) -> Caller {
        Caller {
            uid: req.uid(),
            gid: req.gid(),
            pid: req.pid(),
            groups: OnceLock::new(),
        }
    }

    /// A caller whose supplementary groups are known (tests).
    #[cfg(test)]
    pub fn with_groups(uid: u32, gid: u32, groups: Vec<u32>) -> Caller {
        Caller {
            uid,
            gid,
            pid: 0,
            groups: OnceLock::from(groups),
        }
    }

    /// Whether the caller is in group `gid`, primary or supplementary (`in_group_p`).
    pub fn in_group(&self, gid: u32) -> bool {
        gid == self.gid
            || self
                .groups
                .get_or_init(|| groups_of(self.pid).unwrap_or_default())
                .contains(&gid)
    }

    /// Whether the caller may do `want` (MAY_READ | MAY_WRITE | MAY_EXEC) to the inode `a`,
    /// whose access ACL is `acl` (None: none, or ACLs off), as `generic_permission` decides
    /// it. Root may anything but execute a file no one may execute.
    pub fn may(&self, a: &Attr, acl: Option<&Acl>, want: u32) -> bool {
        let want = want & 7;
        if self.uid == 0 {
            return want & MAY_EXEC == 0 || a.is_dir() || a.mode & 0o111 != 0;
        }
        if self.uid == a.uid {
            return want & !(a.mode >> 6) & 7 == 0;
        }
        // The kernel reads an ACL only when the mode gives the group some permission: the
        // group bits of a file with an ACL are its mask, and a mask of nothing grants nothing
        // to anyone the ACL names.
        if let Some(acl) = acl.filter(|_| a.mode & 0o070 != 0) {
            return self.acl_grants(a, acl, want);
        }
        let bits = if self.in_group(a.gid) {
            a.mode >> 3
        } else {
            a.mode
        };
        want & !bits & 7 == 0
    }

    /// `posix_acl_permission` for a caller who is not the owner: the first named user entry
    /// that is the caller, else any group entry of the caller's that grants all of `want`
    /// (none granting: refused), else other; a named user's or group's grant is cut by the
    /// mask.
    fn acl_grants(&self, a: &Attr, acl: &Acl, want: u32) -> bool {
        let mask = acl
            .entries()
            .iter()
            .find(|e| e.tag == MASK)
            .map_or(7, |e| u32::from(e.perm));
        let grants = |perm: u16, masked: bool| {
            let p = u32::from(perm) & if masked { mask } else { 7 };
            want & !p == 0
        };
        let mut in_a_group = false;
        for e in acl.entries() {
            match e.tag {
                // The owner was answered by the mode before the ACL was read.
                USER_OBJ => {}
                USER if e.id == self.uid => return grants(e.perm, true),
                GROUP_OBJ if self.in_group(a.gid) => {
                    in_a_group = true;
                    if grants(e.perm, false) {
                        return grants(e.perm, true);
                    }
                }
                GROUP if self.in_group(e.id) => {
                    in_a_group = true;
                    if grants(e.perm, false) {
                        return grants(e.perm, true);
                    }
                }
                OTHER => return !in_a_group && grants(e.perm, false),
                _ => {}
            }
        }
        // A valid ACL (`Acl::parse`) always has an other entry.
        false
    }
}

/// The supplementary groups of process `pid`, from `/proc/PID/status`; None if it cannot be
/// read (the process exited).
pub fn groups_of(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Groups:"))?;
    Some(
        line.split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect(),
    )
}

/// `Fs::remove_tree`'s checks for a caller who is not root: those `rm -rf` would meet
/// (module docs).
pub struct RemoveChecks {
    pub caller: Caller,
    /// ACLs are kept and enforced (`MountConfig::acl`): a directory's access ACL counts.
    pub acl: bool,
}

impl Caller {
    /// Whether the caller may do `want` to `a` of `fs`, its access ACL read when it can
    /// matter (`acl`: ACLs are kept and enforced, `MountConfig::acl`).
    fn may_in(&self, fs: &Fs, a: &Attr, acl: bool, want: u32) -> Result<bool> {
        let acl = if !acl || self.uid == a.uid || self.uid == 0 {
            None
        } else {
            match fs.getxattr(a.ino, idxfs_engine::fs::acl::ACCESS) {
                // A stored ACL the engine wrote is valid; one that does not parse grants
                // nothing beyond the mode.
                Ok(v) => Acl::parse(&v).ok(),
                Err(Error::NoData) => None,
                Err(e) => return Err(e),
            }
        };
        Ok(self.may(a, acl.as_ref(), want))
    }

    /// `may_in`, a refusal as `Error::Denied(why)`.
    fn must(&self, fs: &Fs, a: &Attr, acl: bool, want: u32, why: &'static str) -> Result<()> {
        match self.may_in(fs, a, acl, want)? {
            true => Ok(()),
            false => Err(Error::Denied(why)),
        }
    }
}

impl Permits for RemoveChecks {
    fn list(&self, fs: &Fs, dir: &Attr) -> Result<()> {
        let why = "a directory the caller may not list";
        self.caller
            .must(fs, dir, self.acl, MAY_READ | MAY_EXEC, why)
    }

    fn change(&self, fs: &Fs, dir: &Attr) -> Result<()> {
        let why = "a directory the caller may not change";
        self.caller
            .must(fs, dir, self.acl, MAY_WRITE | MAY_EXEC, why)
    }

    fn remove(&self, fs: &Fs, dir: &Attr, child: Ino) -> Result<()> {
        let uid = self.caller.uid;
        if dir.mode & S_ISVTX != 0 && uid != 0 && uid != dir.uid {
            let owner = match fs.getattr(child) {
                Ok(a) => a.uid,
                // Gone meanwhile: the walk skips it.
                Err(Error::NotFound) => return Ok(()),
                Err(e) => return Err(e),
            };
            if owner != uid {
                return Err(Error::NotPermitted(
                    "another user's file in a sticky directory",
                ));
            }
        }
        Ok(())
    }
}

/// `Fs::copy_tree`'s rules for a caller who is neither root nor the mount's owner: what
/// `cp -a` run by them would meet and make (module docs of `idxfs_engine::fs::copy_tree`).
///
/// - The destination's directory needs write and search; a source directory read to be
///   listed and search for its entries to be looked at; a file read.
/// - Device nodes cannot be made (`mknod` needs CAP_MKNOD: EPERM); FIFOs and sockets can.
/// - A copy is the caller's. `cp -a` then gives it the source's group when the caller is
///   in it (`fchown(fd, -1, gid)`; a symlink gets both or neither), and, when the
///   source's owner and group were not both
///   kept, leaves out a file's set-user-ID, set-group-ID and sticky bits and a directory's
///   first two (what coreutils 9.1 does, measured by `cli/tests/mount_cp_user.rs`); a
///   set-group-ID bit on a copy whose group is not the caller's is dropped by the kernel's
///   chmod.
/// - ACLs are copied, and `user.` xattrs of what the caller may read (reading one needs
///   read permission, `xattr_permission`); `trusted.` and `security.` ones are not
///   (CAP_SYS_ADMIN, CAP_SETFCAP). `cp -a` leaves out each of those without a word.
pub struct CopyChecks {
    pub caller: Caller,
    pub acl: bool,
    /// The first refusal: its path under the copy's top, and errno.
    pub first: std::sync::Mutex<Option<(Vec<u8>, i32)>>,
}

impl CopyChecks {
    pub fn new(caller: Caller, acl: bool) -> CopyChecks {
        CopyChecks {
            caller,
            acl,
            first: std::sync::Mutex::new(None),
        }
    }
}

const S_ISGID: u32 = 0o2000;

impl CopyAs for CopyChecks {
    fn create(&self, fs: &Fs, dir: &Attr) -> Result<()> {
        let why = "a directory the caller may not create in";
        self.caller
            .must(fs, dir, self.acl, MAY_WRITE | MAY_EXEC, why)
    }

    fn list(&self, from: &Fs, dir: &Attr) -> Result<()> {
        let why = "a directory the caller may not read";
        self.caller.must(from, dir, self.acl, MAY_READ, why)
    }

    fn search(&self, from: &Fs, dir: &Attr) -> Result<()> {
        let why = "a directory the caller may not search";
        self.caller.must(from, dir, self.acl, MAY_EXEC, why)
    }

    fn read(&self, from: &Fs, file: &Attr) -> Result<()> {
        let why = "a file the caller may not read";
        self.caller.must(from, file, self.acl, MAY_READ, why)
    }

    fn make(&self, src: &Attr) -> Result<()> {
        match src.mode & 0o170000 {
            0o020000 | 0o060000 => Err(Error::NotPermitted("a device node made by a user")),
            _ => Ok(()),
        }
    }

    fn owned(&self, src: &Attr, top_dir: &Attr) -> (Owner, u32) {
        let c = &self.caller;
        // The group cp's new file gets: every directory it makes is set-group-ID while it
        // copies into it only when the destination's directory is (its own bits come
        // after its contents).
        let made_gid = if top_dir.mode & S_ISGID != 0 {
            top_dir.gid
        } else {
            c.gid
        };
        let mine = src.uid == c.uid;
        let (gid, kept) = if mine && src.gid == made_gid {
            // Made so already: cp changes no owner.
            (made_gid, true)
        } else if c.in_group(src.gid) && (mine || src.mode & 0o170000 != 0o120000) {
            // cp tries the group alone (`fchown(fd, -1, gid)`) when both fail, but not for
            // a symlink, which it gives both or neither (`lchown`).
            (src.gid, mine)
        } else {
            (made_gid, false)
        };
        let mut mode = src.mode & 0o7777;
        if !kept {
            // What cp (coreutils 9) leaves out then: of a file, set-user-ID, set-group-ID
            // and sticky; of a directory, the first two; of anything else, nothing.
            mode &= !match src.mode & 0o170000 {
                0o100000 => 0o7000,
                0o040000 => 0o6000,
                _ => 0,
            };
        }
        if !c.in_group(gid) {
            mode &= !S_ISGID;
        }
        (Owner { uid: c.uid, gid }, mode)
    }

    fn xattr(&self, from: &Fs, src: &Attr, name: &[u8]) -> Result<bool> {
        if name.starts_with(b"system.posix_acl_") {
            return Ok(true);
        }
        // A user xattr is read as the file is (`xattr_permission`).
        Ok(name.starts_with(b"user.") && self.caller.may_in(from, src, self.acl, MAY_READ)?)
    }

    fn refused(&self, path: &[u8], why: &Error) {
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some((path.to_vec(), crate::errno(why).code()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idxfs_engine::fs::acl::Entry;
    use idxfs_engine::fs::Time;

    fn attr(mode: u32, uid: u32, gid: u32) -> Attr {
        let t = Time { sec: 0, nsec: 0 };
        Attr {
            ino: 5,
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            btime: t,
            mode: 0o040000 | mode,
            nlink: 2,
            uid,
            gid,
            rdev: 0,
            generation: 1,
        }
    }

    fn acl(entries: &[(u16, u16, u32)]) -> Acl {
        let mut v = 2u32.to_le_bytes().to_vec();
        for &(tag, perm, id) in entries {
            let e = Entry { tag, perm, id };
            v.extend_from_slice(&e.tag.to_le_bytes());
            v.extend_from_slice(&e.perm.to_le_bytes());
            v.extend_from_slice(&e.id.to_le_bytes());
        }
        Acl::parse(&v).expect("a valid ACL")
    }

    const WX: u32 = MAY_WRITE | MAY_EXEC;

    #[test]
    fn the_mode_decides_by_owner_then_group_then_other() {
        let d = attr(0o750, 1000, 100);
        let owner = Caller::with_groups(1000, 1, vec![]);
        let member = Caller::with_groups(2000, 1, vec![100]);
        let other = Caller::with_groups(3000, 1, vec![7]);
        assert!(owner.may(&d, None, MAY_READ | WX));
        assert!(member.may(&d, None, MAY_READ | MAY_EXEC));
        assert!(!member.may(&d, None, WX));
        assert!(!other.may(&d, None, MAY_EXEC));
        // The owner is held to the owner's bits even where the group's grant more.
        let odd = attr(0o070, 1000, 100);
        let owner_in_group = Caller::with_groups(1000, 100, vec![]);
        assert!(!owner_in_group.may(&odd, None, MAY_READ));
        assert!(Caller::with_groups(0, 0, vec![]).may(&attr(0, 1, 1), None, MAY_READ | WX));
    }

    #[test]
    fn named_entries_count_through_the_mask_and_a_group_refusal_is_final() {
        // u::rwx, u:2000:rwx, g::r-x, g:300:rwx, m::r-x, o::rwx
        let a = acl(&[
            (USER_OBJ, 7, u32::MAX),
            (USER, 7, 2000),
            (GROUP_OBJ, 5, u32::MAX),
            (GROUP, 7, 300),
            (MASK, 5, u32::MAX),
            (OTHER, 7, u32::MAX),
        ]);
        let d = attr(0o757, 1000, 100);
        let named = Caller::with_groups(2000, 1, vec![]);
        assert!(named.may(&d, Some(&a), MAY_READ | MAY_EXEC));
        assert!(!named.may(&d, Some(&a), WX), "the mask takes write away");
        let in_300 = Caller::with_groups(4000, 1, vec![300]);
        assert!(!in_300.may(&d, Some(&a), WX), "masked group entry");
        assert!(in_300.may(&d, Some(&a), MAY_EXEC));
        // In the owning group, which does not grant write: refused, though other would grant it.
        let in_100 = Caller::with_groups(4000, 100, vec![]);
        assert!(!in_100.may(&d, Some(&a), WX));
        // In no group the ACL names: other's entry.
        let stranger = Caller::with_groups(4000, 1, vec![]);
        assert!(stranger.may(&d, Some(&a), WX | MAY_READ));
        // Without an ACL the same mode lets the group write nothing either but other all.
        assert!(stranger.may(&d, None, WX));
        // A mode whose group bits are empty: the ACL is not read (its mask grants nothing),
        // and the mode's other bits answer everyone outside the owning group.
        let masked_off = attr(0o707, 1000, 100);
        assert!(named.may(&masked_off, Some(&a), WX));
        assert!(!in_100.may(&masked_off, Some(&a), MAY_EXEC));
    }

    /// `cp -a`'s ownership rules for a user, as `mount_cp_user.rs` found them against
    /// coreutils 9.1 (here without a file system: the rules alone).
    #[test]
    fn a_copy_is_owned_as_cp_a_run_by_the_caller_would_own_it() {
        let checks = CopyChecks::new(Caller::with_groups(1000, 1000, vec![50]), true);
        let file = |mode: u32, uid, gid| Attr {
            mode: 0o100000 | mode,
            ..attr(0, uid, gid)
        };
        let link = |uid, gid| Attr {
            mode: 0o120777,
            ..attr(0, uid, gid)
        };
        let top = attr(0o755, 1000, 1000);
        let own = |a: &Attr, top: &Attr| {
            let (o, mode) = checks.owned(a, top);
            (o.uid, o.gid, mode)
        };
        // Owner and group kept: every bit kept.
        assert_eq!(own(&file(0o6755, 1000, 50), &top), (1000, 50, 0o6755));
        // Another's file in a group of the caller's: the group, not the bits.
        assert_eq!(own(&file(0o7755, 0, 50), &top), (1000, 50, 0o755));
        // Neither: the caller's group, no bits.
        assert_eq!(own(&file(0o4755, 0, 7), &top), (1000, 1000, 0o755));
        // A directory keeps its sticky bit; a FIFO every bit.
        assert_eq!(own(&attr(0o7777, 0, 7), &top), (1000, 1000, 0o1777));
        let fifo = Attr {
            mode: 0o010000 | 0o7644,
            ..attr(0, 0, 7)
        };
        assert_eq!(own(&fifo, &top), (1000, 1000, 0o7644));
        // A symlink: both or neither.
        assert_eq!(own(&link(0, 50), &top).1, 1000);
        assert_eq!(own(&link(1000, 50), &top).1, 50);
        // In a set-group-ID destination a new file takes its group; kept when the source
        // has it, though the caller is not in it (cp changes no owner then), but the bit
        // goes with a group not the caller's.
        let sgid = attr(0o2775, 0, 7);
        assert_eq!(own(&file(0o2755, 1000, 7), &sgid), (1000, 7, 0o0755));
        assert_eq!(own(&file(0o644, 0, 8), &sgid), (1000, 7, 0o644));
    }
}
