//! An image file or block device, with positioned I/O (pread/pwrite) and fdatasync as flush.
use crate::{check_range, BlockDevice};
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
#[cfg(test)]
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::Path;

pub struct FileDevice {
    file: File,
    size: u64,
    writable: bool,
    /// A block device (discard is BLKDISCARD), not an image file (discard punches a hole).
    block_device: bool,
}

impl FileDevice {
    /// Opens an existing image file or block device. Its size is fixed at open.
    pub fn open(path: &Path, writable: bool) -> io::Result<FileDevice> {
        let mut file = OpenOptions::new().read(true).write(writable).open(path)?;
        // Seek works for regular files and block devices alike (metadata().len() is 0 for the latter).
        let size = file.seek(SeekFrom::End(0))?;
        let block_device = file.metadata()?.file_type().is_block_device();
        Ok(FileDevice {
            file,
            size,
            writable,
            block_device,
        })
    }

    /// Creates (or truncates) an image file of `size` bytes.
    pub fn create(path: &Path, size: u64) -> io::Result<FileDevice> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        file.set_len(size)?;
        Ok(FileDevice {
            file,
            size,
            writable: true,
            block_device: false,
        })
    }
}

impl BlockDevice for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(buf.len(), offset, self.size)?;
        self.file.read_exact_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(buf.len(), offset, self.size)?;
        self.file.write_all_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn writable(&self) -> bool {
        self.writable
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(0, offset.saturating_add(len), self.size)?;
        let fd = self.file.as_raw_fd();
        let r = if self.block_device {
            let range = [offset, len];
            // SAFETY: BLKDISCARD reads two u64s (start, length) from the pointer.
            unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) }
        } else {
            // SAFETY: fallocate on a descriptor we own; the range is inside the file.
            unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            }
        };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            // Nothing to give back to: the bytes stay, which discard allows.
            Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::EINVAL) => Ok(()),
            _ => Err(e),
        }
    }
}

/// `_IO(0x12, 119)` from linux/fs.h: discard a byte range of a block device.
const BLKDISCARD: libc::c_ulong = 0x1277;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discard_gives_an_image_files_space_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("img");
        let d = FileDevice::create(&p, 1 << 20).expect("create");
        d.write_at(&vec![7u8; 1 << 20], 0).expect("write");
        d.flush().expect("flush");
        let allocated = || {
            std::fs::metadata(&p)
                .map(|m| m.blocks() * 512)
                .expect("stat")
        };
        assert!(allocated() >= 1 << 20);
        d.discard(4096, (1 << 20) - 8192).expect("discard");
        assert!(
            allocated() <= 64 << 10,
            "{} bytes still allocated",
            allocated()
        );
        // The edges kept their bytes, the hole reads zeros, the size stays.
        let mut b = [0u8; 4096];
        d.read_at(&mut b, 0).expect("read");
        assert!(b.iter().all(|&x| x == 7));
        d.read_at(&mut b, 8192).expect("read");
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(std::fs::metadata(&p).expect("stat").len(), 1 << 20);
        assert!(d.discard(1 << 20, 4096).is_err(), "past the end");
    }
    #[test]
    fn roundtrip_and_bounds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("img");
        let d = FileDevice::create(&p, 8192).expect("create");
        d.write_at(b"hello", 4096).expect("write");
        d.flush().expect("flush");
        let d = FileDevice::open(&p, false).expect("open");
        let mut b = [0u8; 5];
        d.read_at(&mut b, 4096).expect("read");
        assert_eq!(&b, b"hello");
        assert!(d.read_at(&mut b, 8190).is_err());
        assert!(
            d.write_at(b"x", 0).is_err(),
            "read-only open must refuse writes"
        );
    }
}
