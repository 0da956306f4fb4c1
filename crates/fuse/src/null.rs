//! An empty FUSE file system: a root directory and nothing else, answered with no caching.
//! It measures the transport's floor: `stat` of its root is one FUSE round trip with no file
//! system work behind it (benchmarks print it beside idxfs's own numbers).
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, INodeNo, KernelConfig, ReplyAttr,
    ReplyEntry, Request,
};
use std::ffi::OsStr;
use std::time::{Duration, UNIX_EPOCH};

pub struct NullFs;

impl Filesystem for NullFs {
    fn init(&mut self, _req: &Request, _config: &mut KernelConfig) -> std::io::Result<()> {
        Ok(())
    }

    fn lookup(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEntry) {
        reply.error(Errno::ENOENT);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino.0 != 1 {
            return reply.error(Errno::ENOENT);
        }
        let attr = FileAttr {
            ino,
            size: 0,
            blocks: 0,
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind: FileType::Directory,
            perm: 0o755,
            nlink: 2,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        };
        // TTL 0: every stat is a round trip.
        reply.attr(&Duration::ZERO, &attr);
    }
}

/// A mounted `NullFs`, served by a background thread of this process; dropping it unmounts.
pub struct NullMount {
    session: Option<fuser::BackgroundSession>,
}

impl NullMount {
    pub fn mount(mountpoint: &std::path::Path) -> std::io::Result<NullMount> {
        let mut cfg = fuser::Config::default();
        cfg.mount_options = vec![
            fuser::MountOption::FSName("idxfs-null".into()),
            fuser::MountOption::RO,
        ];
        cfg.n_threads = Some(2);
        cfg.clone_fd = true;
        let session = fuser::Session::new(NullFs, mountpoint, &cfg)?.spawn()?;
        Ok(NullMount {
            session: Some(session),
        })
    }

    pub fn unmount(mut self) -> std::io::Result<()> {
        match self.session.take() {
            Some(s) => s.umount_and_join(),
            None => Ok(()),
        }
    }
}

impl Drop for NullMount {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            let _ = s.umount_and_join();
        }
    }
}
