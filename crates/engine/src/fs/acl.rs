//! POSIX ACLs (POSIX.1e draft 17, as Linux keeps them): an inode's access ACL in the xattr
//! `system.posix_acl_access`, a directory's default ACL in `system.posix_acl_default`, each in
//! the kernel's xattr format, so that what `getxattr` returns is what the kernel parses and
//! caches (`FUSE_POSIX_ACL`) and what `getfacl` prints.
//!
//! The engine keeps the mode and the ACLs consistent in one operation, as ext4 does in the
//! kernel (`posix_acl_create`, `posix_acl_chmod`, `posix_acl_update_mode`):
//! - **create**: a new inode in a directory with a default ACL gets it as its access ACL,
//!   its permissions cut to the mode asked for, and the umask is not applied; a new directory
//!   also gets it as its own default. Without a default ACL, the umask is applied and no ACL
//!   is made. An access ACL the mode says in full is not stored. Symbolic links get neither.
//! - **chmod** rewrites the access ACL's owner, group-class (the mask, if it has one, else the
//!   owning group) and other entries to the new permission bits.
//! - **setting an access ACL** sets the permission bits to what it says (the mask for the
//!   group bits); one the mode says in full is stored as the mode alone. Setting one may drop
//!   set-group-ID, as the caller's privileges decide (`Fs::setxattr_with`).
//! - a **default ACL** is stored as given, on directories only; removing either ACL leaves
//!   the mode as it is, and removing one that is not there succeeds.
//!
//! Who may do what (the owner or CAP_FOWNER to set an ACL, the entries to open a file) is the
//! kernel's to check: the engine checks no caller, here as everywhere. `OpenOptions::acl`
//! off (`-o noacl`) refuses both names and inherits nothing, as a file system without ACLs
//! does; a chmod still rewrites an access ACL kept from before, so mode and ACL never
//! disagree on disk (fsck checks it).

use super::xattr::XattrPlan;
use super::{Inner, Ino, Reserve};
use crate::error::{Error, Result};
use idxfs_format::items::{S_IFDIR, S_IFLNK, S_IFMT};
use idxfs_format::Corrupt;

const S_ISGID: u32 = 0o2000;

/// The xattr holding an inode's access ACL.
pub const ACCESS: &[u8] = b"system.posix_acl_access";
/// The xattr holding a directory's default ACL.
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

/// Whether `name` is one of the two ACL xattrs.
pub fn is_acl(name: &[u8]) -> bool {
    name == ACCESS || name == DEFAULT
}

/// The xattr format's version (`POSIX_ACL_XATTR_VERSION`).
const VERSION: u32 = 2;
/// The id the kernel writes for entries that name nobody (`ACL_UNDEFINED_ID`).
const UNDEFINED_ID: u32 = u32::MAX;

// Entry tags (`include/uapi/linux/posix_acl.h`), in the order a valid ACL lists them.
pub const USER_OBJ: u16 = 0x01;
pub const USER: u16 = 0x02;
pub const GROUP_OBJ: u16 = 0x04;
pub const GROUP: u16 = 0x08;
pub const MASK: u16 = 0x10;
pub const OTHER: u16 = 0x20;

/// The most entries the kernel accepts in one ACL xattr (`posix_acl_from_xattr` allows what
/// fits XATTR_SIZE_MAX; ext4 far fewer). Bounds the work of a hostile value.
const MAX_ENTRIES: usize = (65536 - 4) / 8;

/// One ACL entry: a tag, rwx permissions, and for USER and GROUP the id they name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub tag: u16,
    pub perm: u16,
    pub id: u32,
}

/// A valid ACL: entries in the order `posix_acl_valid` demands (owner, named users by id,
/// owning group, named groups by id, mask, other), owner, group and other exactly once, a
/// mask exactly when there are named entries (or once at most when there are none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

impl Acl {
    /// Reads a value in the kernel's xattr format: a little-endian u32 version, then entries
    /// of (u16 tag, u16 permissions, u32 id). Refuses with what is wrong: a wrong version, a
    /// length that is no whole number of entries, an unknown tag, permissions beyond rwx, or
    /// entries out of order, repeated or missing.
    pub fn parse(value: &[u8]) -> std::result::Result<Acl, &'static str> {
        let Some((head, body)) = value.split_first_chunk::<4>() else {
            return Err("an ACL shorter than its header");
        };
        if u32::from_le_bytes(*head) != VERSION {
            return Err("an ACL of another version");
        }
        if body.len() % 8 != 0 {
            return Err("an ACL that is no whole number of entries");
        }
        if body.len() / 8 > MAX_ENTRIES {
            return Err("an ACL of too many entries");
        }
        let mut entries = Vec::with_capacity(body.len() / 8);
        for e in body.chunks_exact(8) {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let perm = u16::from_le_bytes([e[2], e[3]]);
            let named = tag == USER || tag == GROUP;
            let id = if named {
                u32::from_le_bytes([e[4], e[5], e[6], e[7]])
            } else {
                UNDEFINED_ID
            };
            if perm > 7 {
                return Err("ACL permissions beyond rwx");
            }
            entries.push(Entry { tag, perm, id });
        }
        let acl = Acl { entries };
        acl.check()?;
        Ok(acl)
    }

    /// `posix_acl_valid`: the order and counts described on [`Acl`].
    fn check(&self) -> std::result::Result<(), &'static str> {
        // The place of each tag in the order; named entries may repeat, sorted by id.
        let rank = |tag| match tag {
            USER_OBJ => Some(0),
            USER => Some(1),
            GROUP_OBJ => Some(2),
            GROUP => Some(3),
            MASK => Some(4),
            OTHER => Some(5),
            _ => None,
        };
        let mut last: Option<(u8, u32)> = None;
        let mut seen = [0usize; 6];
        for e in &self.entries {
            let r = rank(e.tag).ok_or("an ACL entry of an unknown tag")?;
            let named = e.tag == USER || e.tag == GROUP;
            if let Some((lr, lid)) = last {
                let in_order = r > lr || (r == lr && named && e.id > lid);
                if !in_order {
                    return Err("ACL entries out of order or repeated");
                }
            }
            seen[r as usize] += 1;
            last = Some((r, e.id));
        }
        if seen[0] != 1 || seen[2] != 1 || seen[5] != 1 {
            return Err("an ACL without its owner, group and other entries");
        }
        if seen[1] + seen[3] > 0 && seen[4] == 0 {
            return Err("an ACL with named entries and no mask");
        }
        Ok(())
    }

    /// The value in the kernel's xattr format.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(4 + 8 * self.entries.len());
        v.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.entries {
            v.extend_from_slice(&e.tag.to_le_bytes());
            v.extend_from_slice(&e.perm.to_le_bytes());
            v.extend_from_slice(&e.id.to_le_bytes());
        }
        v
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The permission bits (0o777) the ACL gives the owner, group class and others: the
    /// mask's for the group class when there is one (`posix_acl_equiv_mode`).
    pub fn mode_bits(&self) -> u32 {
        let (mut u, mut g, mut m, mut o) = (0, 0, None, 0);
        for e in &self.entries {
            let p = u32::from(e.perm);
            match e.tag {
                USER_OBJ => u = p,
                GROUP_OBJ => g = p,
                MASK => m = Some(p),
                OTHER => o = p,
                _ => {}
            }
        }
        u << 6 | m.unwrap_or(g) << 3 | o
    }

    /// Whether the mode says all the ACL says: no named entry and no mask.
    pub fn is_mode(&self) -> bool {
        self.entries
            .iter()
            .all(|e| matches!(e.tag, USER_OBJ | GROUP_OBJ | OTHER))
    }

    /// The entries a mode's three classes stand for, each with its class's shift in a mode:
    /// the owner (6), the group class (3: the mask when there is one, else the owning group),
    /// and other (0).
    fn classes(&mut self) -> impl Iterator<Item = (&mut Entry, u32)> {
        let has_mask = self.entries.iter().any(|e| e.tag == MASK);
        self.entries.iter_mut().filter_map(move |e| {
            let shift = match e.tag {
                USER_OBJ => 6,
                MASK => 3,
                GROUP_OBJ if !has_mask => 3,
                OTHER => 0,
                _ => return None,
            };
            Some((e, shift))
        })
    }

    /// `posix_acl_chmod`: the owner, group-class and other entries take `mode`'s bits.
    pub fn chmod(&mut self, mode: u32) {
        for (e, shift) in self.classes() {
            e.perm = ((mode >> shift) & 7) as u16;
        }
    }

    /// `posix_acl_create_masq`: a default ACL becomes a new inode's access ACL, each class's
    /// permissions cut to what `mode` asks for it, and the mode's cut to what the ACL gives.
    /// Returns the new mode (special bits kept).
    fn masq(&mut self, mode: u32) -> u32 {
        let mut m = mode & 0o777;
        for (e, shift) in self.classes() {
            let asked = (m >> shift) & 7;
            e.perm &= asked as u16;
            m &= !(7 << shift) | (u32::from(e.perm) << shift);
        }
        mode & !0o777 | m
    }
}

/// What `Inner::inherit` gives a new inode.
#[derive(Debug, Default)]
pub(crate) struct NewAcls {
    /// Its full mode.
    pub mode: u32,
    /// The ACL xattrs to store with it.
    pub xattrs: Vec<(&'static [u8], Vec<u8>)>,
    /// New nodes storing them may allocate.
    pub nodes: u64,
}

/// What a new inode gets from its directory: its mode, and the ACLs to store with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inherited {
    /// The full mode (type, special and permission bits).
    pub mode: u32,
    /// The access ACL to store (None: the mode says it all).
    pub access: Option<Vec<u8>>,
    /// The default ACL to store (directories only).
    pub default: Option<Vec<u8>>,
}

/// `posix_acl_create`: what an inode of `mode` made with `umask` in a directory whose default
/// ACL is `dir_default` gets. `mode` carries the file type.
pub fn inherit(dir_default: Option<&Acl>, mode: u32, umask: u32) -> Inherited {
    let Some(default) = dir_default else {
        return Inherited {
            mode: mode & !(umask & 0o777),
            access: None,
            default: None,
        };
    };
    let mut access = default.clone();
    let mode = access.masq(mode);
    Inherited {
        mode,
        access: (!access.is_mode()).then(|| access.encode()),
        default: (mode & S_IFMT == S_IFDIR).then(|| default.encode()),
    }
}

impl Inner {
    /// `ino`'s ACL in xattr `name`, if it has one. A stored value that is no valid ACL is
    /// damage: only this module writes these names.
    fn acl_of(&mut self, ino: Ino, name: &'static [u8]) -> Result<Option<Acl>> {
        let value = match self.xattr_value(ino, name) {
            Ok(v) => v,
            Err(Error::NoData) => return Ok(None),
            Err(e) => return Err(e),
        };
        Acl::parse(&value).map(Some).map_err(|why| {
            Corrupt::new(
                format!("{} of inode {ino}", String::from_utf8_lossy(name)),
                why,
                "a valid POSIX ACL",
            )
            .into()
        })
    }

    /// What an inode of `mode` made in `dir` with `umask` gets (see the module notes): its
    /// mode, and the ACLs to store with it (`store_inherited`), which may allocate `nodes`
    /// new nodes: the caller reserves them before its first change.
    pub(crate) fn inherit(&mut self, dir: Ino, mode: u32, umask: u32) -> Result<NewAcls> {
        if mode & S_IFMT == S_IFLNK {
            return Ok(NewAcls {
                mode,
                ..NewAcls::default()
            });
        }
        let default = if self.policy.acl {
            self.acl_of(dir, DEFAULT)?
        } else {
            None
        };
        let got = inherit(default.as_ref(), mode, umask);
        let mut new = NewAcls {
            mode: got.mode,
            ..NewAcls::default()
        };
        for (name, value) in [(ACCESS, got.access), (DEFAULT, got.default)] {
            if let Some(v) = value {
                new.nodes += self.xattr_nodes(name.len(), v.len());
                new.xattrs.push((name, v));
            }
        }
        Ok(new)
    }

    /// Stores the ACLs `inherit` gave new inode `ino` (the caller reserved their nodes).
    /// One after the other: both may share an xattr item.
    pub(crate) fn store_inherited(
        &mut self,
        ino: Ino,
        xattrs: Vec<(&[u8], Vec<u8>)>,
    ) -> Result<()> {
        for (name, value) in xattrs {
            let plan = self.plan_xattr(ino, name, &value, 0)?;
            self.put_xattr(plan)?;
        }
        Ok(())
    }

    /// The access ACL change a chmod of `ino` to `mode` makes (`Acl::chmod`), checked and not
    /// yet made; None when it has no access ACL.
    /// Also with ACLs off: an ACL kept from a mount with them stays in step with the mode
    /// (what fsck checks), and says the new mode when they are on again.
    pub(crate) fn chmod_acl(&mut self, ino: Ino, mode: u32) -> Result<Option<XattrPlan>> {
        let Some(mut acl) = self.acl_of(ino, ACCESS)? else {
            return Ok(None);
        };
        acl.chmod(mode);
        self.plan_xattr(ino, ACCESS, &acl.encode(), 0).map(Some)
    }

    /// Sets `ino`'s ACL `name` (see the module notes). XATTR_CREATE and XATTR_REPLACE mean
    /// nothing for ACLs, as in the kernel's ACL calls.
    pub(crate) fn set_acl(
        &mut self,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        kill_sgid: bool,
    ) -> Result<()> {
        if !self.policy.acl {
            return Err(Error::NotSupported("ACLs are off (-o noacl)"));
        }
        let acl = Acl::parse(value).map_err(Error::Invalid)?;
        let mode = self.inode(ino)?.mode.get();
        let now = self.now();
        if name == DEFAULT {
            if mode & S_IFMT != S_IFDIR {
                return Err(Error::Invalid("a default ACL on a non-directory"));
            }
            let plan = self.plan_xattr(ino, DEFAULT, &acl.encode(), 0)?;
            self.reserve_nodes(plan.nodes, 0, Reserve::Grow)?;
            self.put_xattr(plan)?;
            self.modify_inode(ino, |i| i.ctime = now)?;
            return Ok(());
        }
        let mut new = mode & !0o777 | acl.mode_bits();
        if kill_sgid {
            new &= !S_ISGID;
        }
        if acl.is_mode() {
            // Said by the mode alone: any access ACL stored goes.
            self.reserve(4, Reserve::Grow)?;
            match self.remove_xattr(ino, ACCESS) {
                Ok(()) | Err(Error::NoData) => {}
                Err(e) => return Err(e),
            }
        } else {
            let plan = self.plan_xattr(ino, ACCESS, &acl.encode(), 0)?;
            self.reserve_nodes(plan.nodes, 0, Reserve::Grow)?;
            self.put_xattr(plan)?;
        }
        self.modify_inode(ino, |i| {
            i.mode = new.into();
            i.ctime = now;
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = VERSION.to_le_bytes().to_vec();
        for &(tag, perm, id) in entries {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    const U: u32 = UNDEFINED_ID;

    fn named() -> Vec<u8> {
        acl(&[
            (USER_OBJ, 7, U),
            (USER, 6, 1000),
            (USER, 4, 1001),
            (GROUP_OBJ, 5, U),
            (GROUP, 7, 50),
            (MASK, 6, U),
            (OTHER, 1, U),
        ])
    }

    #[test]
    fn a_valid_acl_reads_and_writes_back_the_same_bytes() {
        let v = named();
        let a = Acl::parse(&v).expect("valid");
        assert_eq!(a.encode(), v);
        assert_eq!(a.mode_bits(), 0o761, "the mask stands for the group bits");
        assert!(!a.is_mode());
        let minimal = acl(&[(USER_OBJ, 6, U), (GROUP_OBJ, 4, U), (OTHER, 0, U)]);
        let m = Acl::parse(&minimal).expect("valid");
        assert!(m.is_mode());
        assert_eq!(m.mode_bits(), 0o640);
    }

    #[test]
    fn invalid_acls_are_refused_as_the_kernel_refuses_them() {
        let good = named();
        for n in 0..good.len() {
            assert!(Acl::parse(&good[..n]).is_err(), "{n} bytes");
        }
        let mut v1 = good.clone();
        v1[0] = 1;
        assert!(Acl::parse(&v1).is_err(), "version 1");
        let cases: &[&[(u16, u16, u32)]] = &[
            // other missing
            &[(USER_OBJ, 6, U), (GROUP_OBJ, 4, U)],
            // owner twice
            &[
                (USER_OBJ, 6, U),
                (USER_OBJ, 6, U),
                (GROUP_OBJ, 4, U),
                (OTHER, 4, U),
            ],
            // out of order
            &[(GROUP_OBJ, 4, U), (USER_OBJ, 6, U), (OTHER, 4, U)],
            // named users not sorted, or repeated
            &[
                (USER_OBJ, 6, U),
                (USER, 6, 9),
                (USER, 6, 8),
                (GROUP_OBJ, 4, U),
                (MASK, 6, U),
                (OTHER, 4, U),
            ],
            &[
                (USER_OBJ, 6, U),
                (USER, 6, 8),
                (USER, 6, 8),
                (GROUP_OBJ, 4, U),
                (MASK, 6, U),
                (OTHER, 4, U),
            ],
            // named entry without a mask
            &[
                (USER_OBJ, 6, U),
                (USER, 6, 8),
                (GROUP_OBJ, 4, U),
                (OTHER, 4, U),
            ],
            // permissions beyond rwx
            &[(USER_OBJ, 8, U), (GROUP_OBJ, 4, U), (OTHER, 4, U)],
            // an unknown tag
            &[
                (USER_OBJ, 6, U),
                (0x40, 4, U),
                (GROUP_OBJ, 4, U),
                (OTHER, 4, U),
            ],
        ];
        for c in cases {
            assert!(Acl::parse(&acl(c)).is_err(), "{c:?}");
        }
    }

    #[test]
    fn chmod_sets_the_mask_not_the_owning_group_when_there_is_one() {
        let mut a = Acl::parse(&named()).expect("valid");
        a.chmod(0o640);
        let e = a.entries();
        assert_eq!((e[0].tag, e[0].perm), (USER_OBJ, 6));
        assert_eq!((e[3].tag, e[3].perm), (GROUP_OBJ, 5), "owning group kept");
        assert_eq!((e[5].tag, e[5].perm), (MASK, 4));
        assert_eq!((e[6].tag, e[6].perm), (OTHER, 0));
        assert_eq!(a.mode_bits(), 0o640);
        let mut m =
            Acl::parse(&acl(&[(USER_OBJ, 6, U), (GROUP_OBJ, 4, U), (OTHER, 0, U)])).expect("valid");
        m.chmod(0o751);
        assert_eq!(m.mode_bits(), 0o751);
    }

    #[test]
    fn a_new_inode_takes_the_default_acl_cut_to_its_mode_and_ignores_the_umask() {
        let d = Acl::parse(&named()).expect("valid");
        // A file asked for 0666: rw for each class, cut by the ACL (owner 7, mask 6, other 1).
        let f = inherit(Some(&d), 0o100_666, 0o077);
        assert_eq!(f.mode, 0o100_660, "umask ignored, mode cut by the ACL");
        let access = Acl::parse(f.access.as_deref().expect("extended")).expect("valid");
        let e = access.entries();
        assert_eq!((e[0].tag, e[0].perm), (USER_OBJ, 6));
        assert_eq!((e[1].tag, e[1].perm), (USER, 6), "named entries unchanged");
        assert_eq!((e[5].tag, e[5].perm), (MASK, 6));
        assert_eq!((e[6].tag, e[6].perm), (OTHER, 0));
        assert_eq!(f.default, None, "files get no default ACL");
        // A directory also keeps the default ACL as its own, unchanged.
        let dir = inherit(Some(&d), 0o042_777, 0o022);
        assert_eq!(dir.mode, 0o042_761, "special bits kept");
        assert_eq!(dir.default, Some(named()));
        // A minimal default ACL gives a mode and no access ACL.
        let min =
            Acl::parse(&acl(&[(USER_OBJ, 7, U), (GROUP_OBJ, 5, U), (OTHER, 0, U)])).expect("ok");
        let f = inherit(Some(&min), 0o100_666, 0o022);
        assert_eq!((f.mode, f.access), (0o100_640, None));
        // No default ACL: the umask, and nothing stored.
        let f = inherit(None, 0o100_666, 0o027);
        assert_eq!(
            f,
            Inherited {
                mode: 0o100_640,
                access: None,
                default: None
            }
        );
    }
}
