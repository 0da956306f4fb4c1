//! setattr: mode, owner, size, times (and what a chown or truncate drops: `privs`; what a
//! chmod changes in the access ACL: `acl`).
use super::{privs, Attr, Durable, Fs, Ino, Reserve, SetAttr, SetTime};
use crate::error::{Error, Result};
use idxfs_format::items::{S_IFDIR, S_IFMT, S_IFREG};

impl Fs {
    pub fn setattr(&self, ino: Ino, set: &SetAttr) -> Result<Attr> {
        if let Some(SetTime::At(t)) = set.atime.or(set.mtime) {
            if t.nsec >= 1_000_000_000 {
                return Err(Error::Invalid("nanoseconds out of range"));
            }
        }
        if set.size.is_some_and(|s| s > super::file::MAX_FILE_SIZE) {
            return Err(Error::FileTooBig);
        }
        let r = self.write_op(4, Reserve::Shrink, Durable::Data, |g| {
            let it = g.inode(ino)?;
            match set.size {
                // As `Fs::truncate`: a cut inside a block copies its head.
                Some(size) if it.mode.get() & S_IFMT == S_IFREG && size < it.size.get() => {
                    g.refuse_in_flight_at(ino, size)?;
                }
                _ => {}
            }
            // A chmod rewrites the access ACL too (`acl`): worked out and reserved for
            // before the first change.
            let acl = match set.mode {
                Some(m) => g.chmod_acl(ino, m)?,
                None => None,
            };
            if let Some(plan) = &acl {
                g.reserve_nodes(4 * g.item_nodes() + plan.nodes, 0, Reserve::Shrink)?;
            }
            if let Some(size) = set.size {
                match it.mode.get() & S_IFMT {
                    S_IFREG => {
                        // As `Fs::truncate`: later freeing batches reserve for themselves.
                        g.reserve_blocks(8, 2, Reserve::Shrink)?;
                        g.truncate(ino, size)?;
                    }
                    S_IFDIR => return Err(Error::IsDir),
                    _ => return Err(Error::Invalid("size of a non-regular file")),
                }
            }
            let now = g.now();
            let chown = privs::chown_drops(it.mode.get(), set);
            let it = g.modify_inode(ino, |i| {
                if set.size.is_some() {
                    i.mode = privs::after(i.mode.get(), set.kill).into();
                }
                if chown {
                    i.mode = privs::without_suidgid(i.mode.get(), false).into();
                }
                if let Some(m) = set.mode {
                    i.mode = ((i.mode.get() & S_IFMT) | (m & 0o7777)).into();
                }
                if let Some(u) = set.uid {
                    i.uid = u.into();
                }
                if let Some(gid) = set.gid {
                    i.gid = gid.into();
                }
                let pick = |s: SetTime| match s {
                    SetTime::Now => now,
                    SetTime::At(t) => t.into(),
                };
                if let Some(a) = set.atime {
                    i.atime = pick(a);
                }
                if let Some(m) = set.mtime {
                    i.mtime = pick(m);
                }
                i.ctime = set.ctime.map(Into::into).unwrap_or(now);
            })?;
            if let Some(plan) = acl {
                g.put_xattr(plan)?;
            }
            Ok(Attr::from_item(ino, &it))
        });
        // A truncate's later batches (`Inner::trim_past_size`).
        self.release_orphans();
        r
    }
}
