//! An image file or block device, with positioned I/O (pread/pwrite) and fdatasync as flush.
use crate::{check_range, BlockDevice};
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;

pub struct FileDevice {
    file: File,
    size: u64,
    writable: bool,
}

impl FileDevice {
    /// Opens an existing image file or block device. Its size is fixed at open.
    pub fn open(path: &Path, writable: bool) -> io::Result<FileDevice> {
        let mut file = OpenOptions::new().read(true).write(writable).open(path)?;
        // Seek works for regular files and block devices alike (metadata().len() is 0 for the latter).
        let size = file.seek(SeekFrom::End(0))?;
        Ok(FileDevice {
            file,
            size,
            writable,
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
}

#[cfg(test)]
mod tests {
    use super::*;
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
