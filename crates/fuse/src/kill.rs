//! What a change drops for its caller (`idxfs_engine::fs::Kill`), from a FUSE request: the
//! kernel says whether the caller lacks CAP_FSETID (FUSE_WRITE_KILL_SUIDGID,
//! FATTR_KILL_SUIDGID); whether the caller is outside the file's group (which decides a
//! set-group-ID without group execute) the server finds out here.
//!
//! A request carries the caller's uid, primary gid and pid, not its supplementary groups, so
//! when the primary gid is not the file's the groups are read from `/proc/PID/status`. That
//! happens only for a file with set-group-ID and without group execute, changed by a caller
//! without CAP_FSETID: a rare file. A caller whose groups cannot be read (it exited) counts
//! as outside, so the bit is dropped: the safe side.
use fuser::Request;
use idxfs_engine::fs::{Attr, Kill};

const S_ISGID: u32 = 0o2000;
const S_IXGRP: u32 = 0o010;

/// `Kill` for a change to the file `a` asked by `req`; `asked`: the kernel's kill flag.
pub fn for_request(req: &Request, a: &Attr, asked: bool) -> Kill {
    if !asked {
        return Kill::default();
    }
    let decides = a.mode & (S_ISGID | S_IXGRP) == S_ISGID;
    Kill {
        suidgid: true,
        outside_group: decides && outside_group(req, a.gid),
    }
}

/// Whether the caller of `req` is outside group `gid` (neither its primary group nor one of
/// its supplementary groups).
pub fn outside_group(req: &Request, gid: u32) -> bool {
    req.gid() != gid && !in_groups(req.pid(), gid)
}

/// Whether process `pid` has `gid` among its supplementary groups.
fn in_groups(pid: u32, gid: u32) -> bool {
    crate::permission::groups_of(pid).is_some_and(|g| g.contains(&gid))
}
