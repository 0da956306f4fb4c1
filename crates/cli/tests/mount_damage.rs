//! Damaged metadata from the user's side: a leaf of a directory's name-hash index damaged on
//! the image; the mount gives EIO for the names in it, then refuses changes (EROFS,
//! errors=remount-ro) while the rest reads; fsck reports the damage and the errors the mount
//! recorded; `idxfs fsck --repair` rebuilds the lost leaf from the inode-order index and the
//! back references, so every file comes back under its name, and the image is clean and
//! writable again; a writable snapshot sharing the leaf is rebuilt too.
mod common;
use common::*;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;

const FILES: usize = 2000;

/// The first leaf (block) of the fs tree whose items are all `ino`'s name-hash entries.
fn name_index_leaf(image: &str, ino: u64) -> u64 {
    let (code, out, err) = idxfs(&["dump", image, "fs"]);
    assert_eq!(code, 0, "dump: {err}");
    let want = format!("({ino} DIR_HASH ");
    let mut block = None;
    let mut all_ours = false;
    let mut items = 0;
    for line in out.lines().chain(std::iter::once("node end")) {
        if let Some(rest) = line.strip_prefix("node ") {
            if all_ours && items > 0 {
                if let Some(b) = block {
                    return b;
                }
            }
            let mut w = rest.split_whitespace();
            block = w.next().and_then(|b| b.parse().ok());
            all_ours = w.next() == Some("level") && w.next() == Some("0");
            items = 0;
        } else if line.trim_start().starts_with('(') {
            items += 1;
            all_ours &= line.trim_start().starts_with(&want);
        }
    }
    panic!("no leaf holds only the name-hash index of inode {ino}:\n{out}");
}

#[test]
fn damage_is_refused_read_only_then_repaired_with_every_name_back() {
    let mut m = Mounted::new("256M", "");
    let d = m.path("d");
    std::fs::create_dir(&d).expect("mkdir");
    for i in 0..FILES {
        std::fs::write(d.join(format!("f{i}")), format!("file {i}")).expect("write");
    }
    std::fs::write(m.path("outside"), b"outside").expect("write");
    let ino = std::fs::metadata(&d).expect("stat").ino();
    m.unmount();
    let image = m.image.to_str().expect("utf8").to_string();
    // A writable snapshot, which shares the leaf damaged below with the file system.
    let (code, out, err) = idxfs(&["subvolume", "snapshot", &image, "w"]);
    assert_eq!(code, 0, "writable snapshot: {out}{err}");

    let leaf = name_index_leaf(&image, ino);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(&m.image)
        .expect("open image");
    f.seek(SeekFrom::Start(leaf * 4096 + 100)).expect("seek");
    f.write_all(&[0x5a]).expect("damage");
    drop(f);

    m.mount("");
    let mut eio = 0;
    for i in 0..FILES {
        match std::fs::read(d.join(format!("f{i}"))) {
            Ok(b) => assert_eq!(b, format!("file {i}").as_bytes()),
            Err(e) if e.raw_os_error() == Some(libc::EIO) => eio += 1,
            Err(e) => panic!("f{i}: {e}, expect EIO or the contents"),
        }
    }
    assert!(eio > 0, "no name met the damaged leaf");
    assert_eq!(std::fs::read(m.path("outside")).expect("read"), b"outside");
    let refused = std::fs::write(m.path("new"), b"x").expect_err("a change after damage");
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
    let log = m.unmount();
    assert!(
        log.contains("metadata damage") && log.contains("fsck --repair"),
        "the mount says what happened and what to do: {log}"
    );

    let (code, out, _) = idxfs(&["fsck", &image]);
    assert_eq!(code, 1, "fsck finds the damage: {out}");
    assert!(out.contains("met at run time"), "{out}");
    let (code, out, err) = idxfs(&["fsck", "--repair", &image]);
    assert_eq!(code, 0, "repair: {out}{err}");
    assert!(out.contains("clean"), "{out}");
    assert!(
        out.contains("subvolume 257 (w) is damaged (") && out.contains("in 2 trees"),
        "the writable snapshot shares the damaged leaf: {out}"
    );
    let (code, out, _) = idxfs(&["fsck", &image]);
    assert_eq!(code, 0, "clean after the repair: {out}");

    m.mount("");
    for i in 0..FILES {
        let got = std::fs::read(d.join(format!("f{i}"))).expect("every name is back");
        assert_eq!(got, format!("file {i}").as_bytes());
    }
    assert_eq!(
        std::fs::read_dir(&d).expect("readdir").count(),
        FILES,
        "nothing more, nothing less"
    );
    std::fs::write(m.path("new"), b"x").expect("writable again");
    m.unmount();
    m.assert_fsck_clean();
    // The writable snapshot met the same damage: rebuilt too, every name back, its own.
    m.mount("subvol=w");
    for i in 0..FILES {
        let got = std::fs::read(d.join(format!("f{i}"))).expect("every name is back in w");
        assert_eq!(got, format!("file {i}").as_bytes());
    }
    assert!(
        !m.path("new").exists(),
        "the file system's change is not w's"
    );
    std::fs::write(d.join("f0"), b"w's own").expect("w writable");
    m.unmount();
    m.mount("subvol=5");
    assert_eq!(std::fs::read(d.join("f0")).expect("read"), b"file 0");
    m.unmount();
    m.assert_fsck_clean();
}
