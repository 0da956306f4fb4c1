//! Regression: a small file stored inline lost its bytes when a later write started at or
//! past offset 4096. The write moved the data out by reading back only its own blocks, then
//! dropped the inline extent; fsck called the result clean.
mod common;
use common::*;

#[test]
fn inline_bytes_survive_a_write_far_past_them() {
    let (dev, fs) = mem_fs(32 << 20);
    for (i, at) in [4095u64, 4096, 8191, 10_000, 1 << 20, 5 << 30]
        .into_iter()
        .enumerate()
    {
        let name = format!("k{i}");
        let a = fs.create(ROOT, name.as_bytes(), 0o644, ME).expect("create");
        fs.write(a.ino, 0, b"hello world\n").expect("write");
        fs.write(a.ino, at, &[0]).expect("write far");
        let mut want = vec![0u8; at as usize + 1];
        want[..12].copy_from_slice(b"hello world\n");
        assert_eq!(
            fs.read(a.ino, 0, 12).expect("read"),
            b"hello world\n",
            "write at {at}"
        );
        let attr = fs.getattr(a.ino).expect("getattr");
        assert_eq!(attr.size, at + 1, "write at {at}");
        if at < 1 << 20 {
            assert_eq!(fs.read(a.ino, 0, want.len()).expect("read"), want);
        }
    }
    // Also a fallocate and a truncate past the inline limit keep the bytes.
    let a = fs.create(ROOT, b"t", 0o644, ME).expect("create");
    fs.write(a.ino, 0, b"abc").expect("write");
    fs.truncate(a.ino, 100_000).expect("truncate");
    fs.fallocate(a.ino, 200_000, 4096, 0).expect("fallocate");
    assert_eq!(fs.read(a.ino, 0, 3).expect("read"), b"abc");
    fs.close().expect("close");
    assert_clean(&dev);
    let fs = idxfs_engine::Fs::open(dev.clone(), opts()).expect("reopen");
    let e = fs.lookup(ROOT, b"k4").expect("lookup");
    assert_eq!(fs.read(e.ino, 0, 12).expect("read"), b"hello world\n");
}
