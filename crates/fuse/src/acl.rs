//! POSIX access ACLs that say no more than the mode bits (`system.posix_acl_access`).
//!
//! idxfs keeps no ACLs. But an ACL whose entries are only the owner, the owning group, other,
//! and perhaps a mask is the mode under another name (POSIX.1e; the kernel's
//! `posix_acl_equiv_mode`), and every Linux file system with ACLs stores such an ACL as the
//! mode and nothing else. idxfs does the same: setting one is a chmod of the permission bits.
//! Any other ACL (a named user or group) is refused with EOPNOTSUPP, as before, and reading an
//! ACL still answers "not supported", so `ls -l` goes on asking once per device (see
//! `xattr_unsupported`); `getfacl` then shows the ACL the mode stands for. Removing either
//! ACL succeeds with nothing to do, as on a file system with ACLs whose file has none: GNU
//! `cp -a` removes the copy's default ACL once it could set the access ACL.
//!
//! Why it matters: `cp -a` and `cp -p` copy a file's permissions by setting the source's ACL on
//! the copy, and only when that fails by chmod. Accepting the ACL spares the chmod, one round
//! trip of the eight `cp -a` pays per file.

use idxfs_engine::fs::Owner;

/// The xattr that carries a file's access ACL.
pub const ACCESS: &[u8] = b"system.posix_acl_access";

/// The xattr that carries a directory's default ACL, which idxfs never keeps: even one that
/// repeats the mode would change how new files get theirs (no umask).
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

/// Version of the kernel's ACL xattr format (`POSIX_ACL_XATTR_VERSION`).
const VERSION: u32 = 2;

// Entry tags (`include/uapi/linux/posix_acl.h`).
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

/// What an access ACL's value says.
#[derive(Debug, PartialEq, Eq)]
pub enum Access {
    /// Equivalent to these permission bits (0o777 at most).
    Mode(u32),
    /// Names a user or group beyond the owner's: not kept here.
    Extended,
    /// Not a well-formed ACL: a wrong version, a length that is no whole number of entries, an
    /// unknown tag, permissions beyond rwx, or an owner, group or other entry missing or twice.
    Malformed,
}

/// Reads an access ACL in the kernel's xattr format: a little-endian u32 version, then
/// entries of (u16 tag, u16 permissions, u32 id).
pub fn access(value: &[u8]) -> Access {
    let Some((head, entries)) = value.split_first_chunk::<4>() else {
        return Access::Malformed;
    };
    if u32::from_le_bytes(*head) != VERSION || entries.len() % 8 != 0 {
        return Access::Malformed;
    }
    let (mut user, mut group, mut other, mut mask) = (None, None, None, None);
    let mut extended = false;
    for e in entries.chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u16::from_le_bytes([e[2], e[3]]);
        if perm > 7 {
            return Access::Malformed;
        }
        let slot = match tag {
            USER_OBJ => &mut user,
            GROUP_OBJ => &mut group,
            OTHER => &mut other,
            MASK => &mut mask,
            USER | GROUP => {
                extended = true;
                continue;
            }
            _ => return Access::Malformed,
        };
        if slot.replace(u32::from(perm)).is_some() {
            return Access::Malformed;
        }
    }
    let (Some(u), Some(g), Some(o)) = (user, group, other) else {
        return Access::Malformed;
    };
    if extended {
        return Access::Extended;
    }
    // With a mask, the group class's bits are the mask's (what `stat` shows for such an ACL).
    Access::Mode(u << 6 | mask.unwrap_or(g) << 3 | o)
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
