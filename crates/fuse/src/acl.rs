//! POSIX ACLs with ACLs off (`-o noacl`): access ACLs that say no more than the mode bits.
//! With ACLs on, the engine keeps them (`idxfs_engine::fs::acl`) and this module only names
//! them.
//!
//! Off, idxfs keeps no ACLs. But an ACL whose entries are only the owner, the owning group,
//! other, and perhaps a mask is the mode under another name (POSIX.1e; the kernel's
//! `posix_acl_equiv_mode`), and every Linux file system with ACLs stores such an ACL as the
//! mode and nothing else. idxfs does the same: setting one is a chmod of the permission bits.
//! Any other ACL (a named user or group) is refused with EOPNOTSUPP, and reading an ACL
//! answers "not supported", so `ls -l` asks once per device (see `xattr_unsupported`);
//! `getfacl` then shows the ACL the mode stands for. Removing either ACL succeeds with
//! nothing to do, as on a file system with ACLs whose file has none: GNU `cp -a` removes the
//! copy's default ACL once it could set the access ACL.
//!
//! Why it matters: `cp -a` and `cp -p` copy a file's permissions by setting the source's ACL on
//! the copy, and only when that fails by chmod. Accepting the ACL spares the chmod, one round
//! trip of the eight `cp -a` pays per file.

use idxfs_engine::fs::acl::{Acl, GROUP, USER};
use idxfs_engine::fs::Owner;

pub use idxfs_engine::fs::acl::{is_acl, ACCESS};

/// What an access ACL's value says.
#[derive(Debug, PartialEq, Eq)]
pub enum Access {
    /// Equivalent to these permission bits (0o777 at most).
    Mode(u32),
    /// Names a user or group beyond the owner's: not kept here.
    Extended,
    /// Not a valid ACL (`Acl::parse`).
    Malformed,
}

/// Reads an access ACL in the kernel's xattr format. A mask without named entries is taken
/// as the group bits, as `stat` shows them.
pub fn access(value: &[u8]) -> Access {
    match Acl::parse(value) {
        Err(_) => Access::Malformed,
        Ok(a) if a.entries().iter().all(|e| e.tag != USER && e.tag != GROUP) => {
            Access::Mode(a.mode_bits())
        }
        Ok(_) => Access::Extended,
    }
}

/// Whether `caller` may set or remove the ACL of a file owned by `file`: its owner or root, as
/// for chmod.
pub fn may_change(file: Owner, caller: Owner) -> bool {
    caller.uid == 0 || caller.uid == file.uid
}

/// The permission and special bits (07777) after setting an ACL equivalent to `bits` on a
/// file of `mode` owned by `file`, asked by `caller`; `None`: the caller may not
/// ([`may_change`]). As chmod, the set-group-ID bit stays only for root or a member of the
/// file's group. Only the caller's primary group is known over FUSE, so a member through a
/// supplementary group loses the bit: the safe way to be wrong.
pub fn chmod(mode: u32, file: Owner, bits: u32, caller: Owner) -> Option<u32> {
    debug_assert!(bits <= 0o777, "{bits:o}");
    if !may_change(file, caller) {
        return None;
    }
    let mut new = mode & 0o7000 | bits;
    if caller.uid != 0 && caller.gid != file.gid {
        new &= !0o2000;
    }
    Some(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use idxfs_engine::fs::acl::{GROUP_OBJ, MASK, OTHER, USER_OBJ};

    const VERSION: u32 = 2;

    fn acl(entries: &[(u16, u16)]) -> Vec<u8> {
        let mut v = VERSION.to_le_bytes().to_vec();
        for &(tag, perm) in entries {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&u32::MAX.to_le_bytes());
        }
        v
    }

    #[test]
    fn a_minimal_acl_is_its_mode() {
        let a = acl(&[(USER_OBJ, 6), (GROUP_OBJ, 4), (OTHER, 4)]);
        assert_eq!(access(&a), Access::Mode(0o644));
        let a = acl(&[(USER_OBJ, 7), (GROUP_OBJ, 0), (OTHER, 1)]);
        assert_eq!(access(&a), Access::Mode(0o701));
    }

    #[test]
    fn a_mask_stands_for_the_group_bits() {
        let a = acl(&[(USER_OBJ, 7), (GROUP_OBJ, 7), (MASK, 5), (OTHER, 0)]);
        assert_eq!(access(&a), Access::Mode(0o750));
    }

    #[test]
    fn named_entries_are_extended() {
        let a = acl(&[
            (USER_OBJ, 6),
            (USER, 6),
            (GROUP_OBJ, 4),
            (MASK, 6),
            (OTHER, 4),
        ]);
        assert_eq!(access(&a), Access::Extended);
        let a = acl(&[
            (USER_OBJ, 6),
            (GROUP_OBJ, 4),
            (GROUP, 4),
            (MASK, 4),
            (OTHER, 0),
        ]);
        assert_eq!(access(&a), Access::Extended);
    }

    #[test]
    fn setting_one_is_a_chmod_of_the_permission_bits() {
        let (root, owner) = (Owner { uid: 0, gid: 0 }, Owner { uid: 7, gid: 8 });
        let file = || Owner { uid: 7, gid: 8 };
        // The special bits stay; the permission bits are the ACL's.
        assert_eq!(chmod(0o106_755, file(), 0o640, owner), Some(0o6640));
        assert_eq!(chmod(0o42_700, file(), 0o750, root), Some(0o2750));
        // Not the owner: refused.
        assert_eq!(
            chmod(0o100_644, file(), 0o600, Owner { uid: 9, gid: 8 }),
            None
        );
        // The owner outside the file's group loses set-group-ID, not set-user-ID.
        let outside = Owner { uid: 7, gid: 1 };
        assert_eq!(chmod(0o106_755, file(), 0o755, outside), Some(0o4755));
    }

    #[test]
    fn malformed_values_are_refused() {
        let good = acl(&[(USER_OBJ, 6), (GROUP_OBJ, 4), (OTHER, 4)]);
        assert_eq!(access(&[]), Access::Malformed);
        assert_eq!(access(&good[..good.len() - 1]), Access::Malformed);
        let mut v1 = good.clone();
        v1[0] = 1;
        assert_eq!(access(&v1), Access::Malformed, "version 1");
        let no_other = acl(&[(USER_OBJ, 6), (GROUP_OBJ, 4)]);
        assert_eq!(access(&no_other), Access::Malformed);
        let twice = acl(&[(USER_OBJ, 6), (USER_OBJ, 7), (GROUP_OBJ, 4), (OTHER, 4)]);
        assert_eq!(access(&twice), Access::Malformed);
        let perm = acl(&[(USER_OBJ, 8), (GROUP_OBJ, 4), (OTHER, 4)]);
        assert_eq!(access(&perm), Access::Malformed);
        let tag = acl(&[(USER_OBJ, 6), (0x40, 4), (GROUP_OBJ, 4), (OTHER, 4)]);
        assert_eq!(access(&tag), Access::Malformed);
        // Every truncation of a good value is refused, never read past its end.
        for n in 0..good.len() {
            assert_eq!(access(&good[..n]), Access::Malformed, "{n} bytes");
        }
    }
}
