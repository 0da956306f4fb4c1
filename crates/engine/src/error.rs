//! Engine errors: fine-grained here, converted to errno only at the FUSE edge (`Error::errno`
//! exists for that edge and for the CLI; nothing inside the engine looks at numbers).
use idxfs_format::Corrupt;
use std::fmt;

#[derive(Debug)]
pub enum Error {
    NotFound,
    Exists,
    NotDir,
    IsDir,
    NotEmpty,
    NameTooLong,
    /// Name is empty, ".", "..", or contains '/' or NUL.
    InvalidName,
    NoSpace,
    /// Mounted read-only, or gone read-only after an I/O error (the error that caused it is kept
    /// in `Fs::failure`).
    ReadOnly,
    TooManyLinks,
    FileTooBig,
    /// An xattr does not exist (ENODATA).
    NoData,
    /// A value or list does not fit the caller's buffer or the format's item (ERANGE / E2BIG).
    TooBig,
    /// The operation makes no sense for these arguments (EINVAL), e.g. renaming a directory into
    /// its own subtree.
    Invalid(&'static str),
    NotSupported(&'static str),
    /// A seek for data or a hole at or past the end of the file (ENXIO).
    NoSuchOffset,
    Io(std::io::Error),
    /// The device refused a commit's write (a full disk under an image file, a write error):
    /// the commit waits, whole, in memory and is written again at the next durability
    /// request or commit (`txn`, "A stalled commit"). The file system goes on; what was asked
    /// to be durable is not yet (ENOSPC when the device said it is full, else EIO).
    Unwritten(std::io::Error),
    /// The device refused a write of file data before the operation changed anything (a
    /// full disk under an image file, a write error): ENOSPC when the device is full, else
    /// EIO. The file system goes on.
    WriteRefused(std::io::Error),
    Corrupt(Corrupt),
    /// A file block read from the device does not match its checksum (`fs::data_sum`):
    /// EIO for this read, but not damage that stops the file system.
    DataSum {
        ino: u64,
        block: u64,
    },
    /// The operation, before changing anything, met blocks a write is writing without the
    /// operation lock (`fs::in_place`): `Fs::write_op` runs it again once that write is done.
    /// Never returned to a caller (EBUSY if it were).
    InFlight,
    /// The object is in use and cannot go now (EBUSY): a snapshot deleted while it is open
    /// beside its file system (`Fs::open_snapshot`).
    Busy(&'static str),
    /// A front end's permission check refused it (EACCES): the engine checks no permission
    /// itself, but asks a front end's check where one walk does many changes
    /// (`fs::remove_tree::Permits`).
    Denied(&'static str),
    /// A front end's check refused it for want of ownership or privilege (EPERM), as the
    /// sticky bit refuses a removal.
    NotPermitted(&'static str),
}

pub type Result<T> = std::result::Result<T, Error>;

impl From<Corrupt> for Error {
    fn from(c: Corrupt) -> Self {
        Error::Corrupt(c)
    }
}
impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

impl Error {
    /// The Linux errno for this error, for front ends.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc_consts::ENOENT,
            Error::Exists => libc_consts::EEXIST,
            Error::NotDir => libc_consts::ENOTDIR,
            Error::IsDir => libc_consts::EISDIR,
            Error::NotEmpty => libc_consts::ENOTEMPTY,
            Error::NameTooLong => libc_consts::ENAMETOOLONG,
            Error::InvalidName | Error::Invalid(_) => libc_consts::EINVAL,
            Error::NoSpace => libc_consts::ENOSPC,
            Error::ReadOnly => libc_consts::EROFS,
            Error::TooManyLinks => libc_consts::EMLINK,
            Error::FileTooBig => libc_consts::EFBIG,
            Error::NoData => libc_consts::ENODATA,
            Error::TooBig => libc_consts::E2BIG,
            Error::NotSupported(_) => libc_consts::EOPNOTSUPP,
            Error::NoSuchOffset => libc_consts::ENXIO,
            Error::Io(_) | Error::Corrupt(_) | Error::DataSum { .. } => libc_consts::EIO,
            Error::Unwritten(e) | Error::WriteRefused(e) => match device_full(e) {
                true => libc_consts::ENOSPC,
                false => libc_consts::EIO,
            },
            Error::InFlight | Error::Busy(_) => libc_consts::EBUSY,
            Error::Denied(_) => libc_consts::EACCES,
            Error::NotPermitted(_) => libc_consts::EPERM,
        }
    }

    /// True for errors that mean the device or image is bad (the file system stops writing).
    pub fn is_fatal(&self) -> bool {
        matches!(self, Error::Io(_) | Error::Corrupt(_))
    }
}

/// The device is out of space (or over a quota): what a sparse image file's writes meet when
/// the file system holding it fills.
pub fn device_full(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// The few errno values the engine names (Linux numbering), kept here so the engine needs no libc.
mod libc_consts {
    pub const EPERM: i32 = 1;
    pub const ENOENT: i32 = 2;
    pub const EIO: i32 = 5;
    pub const ENXIO: i32 = 6;
    pub const E2BIG: i32 = 7;
    pub const EACCES: i32 = 13;
    pub const EBUSY: i32 = 16;
    pub const EEXIST: i32 = 17;
    pub const ENOTDIR: i32 = 20;
    pub const EISDIR: i32 = 21;
    pub const EINVAL: i32 = 22;
    pub const EFBIG: i32 = 27;
    pub const ENOSPC: i32 = 28;
    pub const EROFS: i32 = 30;
    pub const EMLINK: i32 = 31;
    pub const ENAMETOOLONG: i32 = 36;
    pub const ENOTEMPTY: i32 = 39;
    pub const ENODATA: i32 = 61;
    pub const EOPNOTSUPP: i32 = 95;
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotFound => write!(f, "no such file or directory"),
            Error::Exists => write!(f, "file exists"),
            Error::NotDir => write!(f, "not a directory"),
            Error::IsDir => write!(f, "is a directory"),
            Error::NotEmpty => write!(f, "directory not empty"),
            Error::NameTooLong => write!(f, "file name too long (over 255 bytes)"),
            Error::InvalidName => write!(f, "invalid file name"),
            Error::NoSpace => write!(f, "no space left on device"),
            Error::ReadOnly => write!(f, "read-only file system"),
            Error::TooManyLinks => write!(f, "too many links"),
            Error::FileTooBig => write!(f, "file too big"),
            Error::NoData => write!(f, "no such attribute"),
            Error::TooBig => write!(f, "value too big"),
            Error::Invalid(why) => write!(f, "invalid argument: {why}"),
            Error::NotSupported(what) => write!(f, "not supported: {what}"),
            Error::NoSuchOffset => write!(f, "no data or hole past the end of the file"),
            Error::Io(e) => write!(f, "I/O error: {e}"),
            Error::WriteRefused(e) => write!(f, "the device refused a write of file data: {e}"),
            Error::Unwritten(e) => write!(
                f,
                "the device refused a commit's write ({e}); the changes are kept in memory \
                 and written at the next commit"
            ),
            Error::Corrupt(c) => write!(f, "{c}"),
            Error::DataSum { ino, block } => write!(
                f,
                "data checksum mismatch in inode {ino}, file block {block}"
            ),
            Error::InFlight => write!(f, "blocks busy with a write without the lock"),
            Error::Busy(what) => write!(f, "busy: {what}"),
            Error::Denied(what) => write!(f, "permission denied: {what}"),
            Error::NotPermitted(what) => write!(f, "operation not permitted: {what}"),
        }
    }
}

impl std::error::Error for Error {}
