//! Types of the library API.
use idxfs_format::items::{InodeItem, Timespec, S_IFMT};

pub type Ino = u64;

/// A point in time: seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Time {
    pub sec: i64,
    pub nsec: u32,
}

impl From<Timespec> for Time {
    fn from(t: Timespec) -> Time {
        Time {
            sec: t.sec.get(),
            nsec: t.nsec.get(),
        }
    }
}
impl From<Time> for Timespec {
    fn from(t: Time) -> Timespec {
        Timespec {
            sec: t.sec.into(),
            nsec: t.nsec.into(),
        }
    }
}

/// Attributes of an inode, as `stat` reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub size: u64,
    /// 512-byte units allocated.
    pub blocks: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub btime: Time,
    /// Type and permission bits.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    /// With `ino`, names this inode forever (inode numbers are never reused).
    pub generation: u64,
}

impl Attr {
    pub fn from_item(ino: Ino, it: &InodeItem) -> Attr {
        Attr {
            ino,
            size: it.size.get(),
            blocks: it.alloc_bytes.get() / 512,
            atime: it.atime.into(),
            mtime: it.mtime.into(),
            ctime: it.ctime.into(),
            btime: it.btime.into(),
            mode: it.mode.get(),
            nlink: it.nlink.get(),
            uid: it.uid.get(),
            gid: it.gid.get(),
            rdev: it.rdev.get(),
            generation: it.generation.get(),
        }
    }
    pub fn file_type(&self) -> u32 {
        self.mode & S_IFMT
    }
    pub fn is_dir(&self) -> bool {
        self.file_type() == idxfs_format::items::S_IFDIR
    }
}

/// How to set a time in `setattr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(Time),
}

/// How `Fs::write_with` writes.
#[derive(Debug, Clone, Copy)]
pub struct WriteHow {
    /// Set the modification and change times. False for a front end whose kernel keeps those
    /// times itself and sends them by setattr (FUSE's writeback cache, where a write request
    /// may arrive after the times it must not override).
    pub times: bool,
    /// What the write drops for its writer (FUSE's `FUSE_WRITE_KILL_SUIDGID`). Capabilities
    /// go whoever writes.
    pub kill: Kill,
}

/// What a change drops for who asks for it, besides what it changes (see `privs`): FUSE's
/// kill flags, which the kernel sets when the caller lacks CAP_FSETID.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kill {
    /// Set-user-ID goes, and set-group-ID of a file its group may execute.
    pub suidgid: bool,
    /// With `suidgid`: the caller is outside the file's group, so set-group-ID goes even
    /// without group execute (the kernel's `setattr_should_drop_sgid`).
    pub outside_group: bool,
}

/// Changes for `setattr`; `None` leaves a field alone.
#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    /// Permission bits only (07777); the file type never changes.
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub ctime: Option<Time>,
    /// With a size: what the truncate drops for its caller (FUSE's `FATTR_KILL_SUIDGID`).
    pub kill: Kill,
}

/// A regular file as `Fs::create_file` makes it, whole: what a copy of a file made elsewhere
/// knows of it before it starts.
#[derive(Debug, Clone, Copy)]
pub struct NewFile<'a> {
    /// Permission bits (07777).
    pub mode: u32,
    pub owner: Owner,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    /// Its bytes, at most `NEW_FILE_MAX`.
    pub data: &'a [u8],
}

/// The most bytes `Fs::create_file` writes: its data is written under the operation lock,
/// where `write` writes without it.
pub const NEW_FILE_MAX: usize = 1 << 20;

/// Who creates an inode.
#[derive(Debug, Clone, Copy, Default)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// One readdir entry. `cookie` resumes the listing after this entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntryOut {
    pub ino: Ino,
    /// `d_type` (DT_REG = 8, DT_DIR = 4, ...).
    pub dtype: u8,
    pub name: Vec<u8>,
    pub cookie: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub block_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    /// Free blocks an unprivileged caller may fill (the rest: the reserve for deletes, the
    /// root reserve, and what the next commit needs).
    pub blocks_avail: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
}

/// rename(2) flags, Linux values.
pub const RENAME_NOREPLACE: u32 = 1;
pub const RENAME_EXCHANGE: u32 = 2;

/// setxattr(2) flags, Linux values.
pub const XATTR_CREATE: u32 = 1;
pub const XATTR_REPLACE: u32 = 2;

/// fallocate(2) mode bits, Linux values.
pub const FALLOC_KEEP_SIZE: u32 = 1;
pub const FALLOC_PUNCH_HOLE: u32 = 2;
/// fallocate(2)'s FALLOC_FL_ZERO_RANGE.
pub const FALLOC_ZERO_RANGE: u32 = 0x10;

/// What `seek` looks for (lseek's SEEK_DATA / SEEK_HOLE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seek {
    Data,
    Hole,
}

/// When reads update the access time (the mount options of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Atime {
    /// Never.
    NoAtime,
    /// When the access time is not newer than the change or modification time, or is a day old.
    #[default]
    Relatime,
    /// On every read.
    Strict,
}
