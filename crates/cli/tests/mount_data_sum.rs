//! Data checksums from the user's side: a bit flipped in a file's block on the image gives
//! EIO for reads of that block through the mount (and the log says which inode and block),
//! never the wrong bytes; the rest of the file and the file system go on; `idxfs fsck`
//! without `--data` finds nothing (the metadata is whole), `idxfs fsck --data` names the
//! block and exits 1.
mod common;
use common::*;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;

const BS: usize = 4096;

/// The device block holding file block `block` of inode `ino`, from `idxfs dump`.
fn device_block(image: &str, ino: u64, block: u64) -> u64 {
    let (code, out, err) = idxfs(&["dump", image, "fs"]);
    assert_eq!(code, 0, "dump: {err}");
    let want = format!("({ino} EXTENT ");
    for line in out.lines().map(str::trim_start) {
        let Some(rest) = line.strip_prefix(&want) else {
            continue;
        };
        // "(ino EXTENT offset) ... kind 1 blocks D+N gen G"
        let offset: u64 = rest
            .split(')')
            .next()
            .and_then(|o| o.trim().parse().ok())
            .expect("offset");
        let Some(d) = line.split("blocks ").nth(1) else {
            continue;
        };
        let (d, n) = d
            .split_whitespace()
            .next()
            .and_then(|r| r.split_once('+'))
            .expect("d+n");
        let (d, n): (u64, u64) = (d.parse().expect("d"), n.parse().expect("n"));
        let first = offset / BS as u64;
        if (first..first + n).contains(&block) {
            return d + (block - first);
        }
    }
    panic!("no extent of inode {ino} holds block {block}:\n{out}");
}

#[test]
fn a_flipped_bit_in_file_data_is_eio_through_the_mount_and_an_fsck_data_problem() {
    let mut m = Mounted::new("64M", "");
    let data: Vec<u8> = (0..16 * BS).map(|i| (i * 7 + i / 4096) as u8).collect();
    std::fs::write(m.path("f"), &data).expect("write");
    std::fs::write(m.path("other"), &data).expect("write");
    let ino = std::fs::metadata(m.path("f")).expect("stat").ino();
    m.unmount();
    let image = m.image.to_str().expect("utf8").to_string();
    let (code, out, _) = idxfs(&["fsck", "--data", &image]);
    assert_eq!(code, 0, "a whole image: {out}");

    let disk = device_block(&image, ino, 5);
    let mut img = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&m.image)
        .expect("open image");
    let mut b = [0u8; 1];
    img.seek(SeekFrom::Start(disk * BS as u64 + 1234))
        .expect("seek");
    img.read_exact(&mut b).expect("read");
    b[0] ^= 0x10;
    img.seek(SeekFrom::Start(disk * BS as u64 + 1234))
        .expect("seek");
    img.write_all(&b).expect("damage");
    drop(img);

    m.mount("");
    let err = std::fs::read(m.path("f")).expect_err("a read of the damaged block");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    // The blocks before it read, and so does every other file; the file system takes writes.
    let mut f = std::fs::File::open(m.path("f")).expect("open");
    let mut head = vec![0u8; 5 * BS];
    f.read_exact(&mut head)
        .expect("read the blocks before the damage");
    assert_eq!(head, data[..5 * BS]);
    drop(f);
    assert_eq!(std::fs::read(m.path("other")).expect("read"), data);
    std::fs::write(m.path("new"), b"still writable").expect("write after a data error");
    let log = m.unmount();
    assert!(
        log.contains(&format!("data checksum mismatch: inode {ino} block 5")),
        "the log names the inode and block: {log}"
    );

    let (code, out, _) = idxfs(&["fsck", &image]);
    assert_eq!(code, 0, "metadata is whole without --data: {out}");
    let (code, out, _) = idxfs(&["fsck", "--data", &image]);
    assert_eq!(code, 1, "fsck --data finds the damage: {out}");
    let problems: Vec<&str> = out.lines().filter(|l| l.starts_with("problem:")).collect();
    assert_eq!(problems.len(), 1, "{out}");
    assert!(
        problems[0].contains(&format!("inode {ino} block 5 (device block {disk})"))
            && problems[0].contains("data checksum mismatch"),
        "{out}"
    );
}
