//! Bad input: every kind of damage gets a clear error naming it (fsck) or a refusal (open), and
//! never a panic.
mod common;
use common::*;
use idxfs_blockdev::{BlockDevice, MemDevice};
use idxfs_engine::fs::read_superblock;
use idxfs_engine::{fsck, Error, Fs, MkfsOptions};
use idxfs_format::node::{ITEM_HEADER_SIZE, KEY_PTR_SIZE, NODE_HEADER_SIZE};
use std::sync::Arc;

const NS: usize = 4096;

/// A small image whose fs tree has an internal root over several leaves.
fn image() -> Vec<u8> {
    let dev = Arc::new(MemDevice::new(16 << 20));
    Fs::mkfs(
        dev.clone(),
        &MkfsOptions {
            node_size: NS as u32,
            ..Default::default()
        },
    )
    .expect("mkfs");
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    for i in 0..300 {
        let a = fs
            .create(ROOT, format!("file{i}").as_bytes(), 0o644, ME)
            .expect("create");
        fs.write(a.ino, 0, b"data").expect("write");
    }
    fs.close().expect("close");
    assert_clean(&dev);
    let sb = read_superblock(dev.as_ref()).expect("sb");
    assert!(sb.fs_root.level.get() >= 1, "test needs an internal root");
    dev.snapshot()
}

fn fs_root(img: &[u8]) -> (u64, u32) {
    let sb = read_superblock(&MemDevice::from_bytes(img.to_vec())).expect("sb");
    (sb.fs_root.block.get(), sb.fs_root.level.get())
}

fn node_mut(img: &mut [u8], block: u64) -> &mut [u8] {
    let at = block as usize * 4096;
    &mut img[at..at + NS]
}

fn reseal(node: &mut [u8]) {
    let c = crc32c::crc32c(&node[4..]);
    node[..4].copy_from_slice(&c.to_le_bytes());
}

/// The block of the root's child `i` (root must be level 1 for this helper to find a leaf).
fn child(img: &[u8], root: u64, i: usize) -> u64 {
    let at = root as usize * 4096 + NODE_HEADER_SIZE + i * KEY_PTR_SIZE + 17;
    u64::from_le_bytes(img[at..at + 8].try_into().expect("8 bytes"))
}

fn fsck_problems(img: Vec<u8>) -> Vec<String> {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(img));
    fsck::check(&dev, idxfs_format::hash::name_hash, &mut |_| {})
        .expect("fsck reads superblock")
        .problems
}

fn open_err(img: Vec<u8>) -> String {
    match Fs::open(Arc::new(MemDevice::from_bytes(img)), opts()) {
        Ok(_) => panic!("open accepted a damaged image"),
        Err(e) => e.to_string(),
    }
}

/// Every file of the root, read through the API: errors are fine, panics are not.
fn touch_everything(img: Vec<u8>) -> Vec<Error> {
    let Ok(fs) = Fs::open(Arc::new(MemDevice::from_bytes(img)), opts()) else {
        return vec![];
    };
    let mut errs = Vec::new();
    for i in 0..300 {
        match fs.lookup(ROOT, format!("file{i}").as_bytes()) {
            Ok(a) => {
                if let Err(e) = fs.read(a.ino, 0, 10) {
                    errs.push(e);
                }
            }
            Err(e) => errs.push(e),
        }
    }
    if let Err(e) = fs.list(ROOT) {
        errs.push(e);
    }
    errs
}

#[test]
fn foreign_and_empty_images_are_refused() {
    let zeros = vec![0u8; 16 << 20];
    assert!(open_err(zeros.clone()).contains("magic"));
    assert!(fsck::check(
        &(Arc::new(MemDevice::from_bytes(zeros)) as Arc<dyn BlockDevice>),
        idxfs_format::hash::name_hash,
        &mut |_| {}
    )
    .is_err());
    // Something that looks like ext4 (its magic lives at 1080): still not ours.
    let mut ext4 = vec![0u8; 16 << 20];
    ext4[1080] = 0x53;
    ext4[1081] = 0xef;
    assert!(open_err(ext4).contains("not an idxfs image"));
    // Too small to hold even a superblock.
    assert!(open_err(vec![0u8; 100]).contains("device size"));
}

#[test]
fn superblock_damage() {
    let img = image();
    // One copy bad: the other is used; fsck notes it but finds no problem.
    let mut one = img.clone();
    one[100] ^= 0xff;
    let fs = Fs::open(Arc::new(MemDevice::from_bytes(one.clone())), opts())
        .expect("open with one good copy");
    drop(fs);
    let r = fsck::check(
        &(Arc::new(MemDevice::from_bytes(one)) as Arc<dyn BlockDevice>),
        idxfs_format::hash::name_hash,
        &mut |_| {},
    )
    .expect("fsck");
    assert!(
        r.is_clean() && r.notes.iter().any(|n| n.contains("superblock copy")),
        "{:?}",
        r.notes
    );
    // Both bad: refused, naming the checksum.
    let mut both = img.clone();
    both[100] ^= 0xff;
    both[4096 + 100] ^= 0xff;
    assert!(open_err(both).contains("checksum"));
}

#[test]
fn truncated_image_is_refused() {
    let img = image();
    let cut = img[..8 << 20].to_vec();
    let e = open_err(cut);
    assert!(e.contains("truncated"), "{e}");
}

#[test]
fn leaf_checksum() {
    let mut img = image();
    let (root, _) = fs_root(&img);
    let leaf = child(&img, root, 1);
    node_mut(&mut img, leaf)[2000] ^= 0x40;
    let p = fsck_problems(img.clone());
    assert!(
        p.iter()
            .any(|p| p.contains(&format!("node {leaf} checksum"))),
        "{p:?}"
    );
    let errs = touch_everything(img);
    assert!(
        errs.iter().any(|e| matches!(e, Error::Corrupt(_))),
        "reading the damaged leaf reports corruption"
    );
}

#[test]
fn key_order() {
    let mut img = image();
    let (root, _) = fs_root(&img);
    let leaf = child(&img, root, 1);
    let n = node_mut(&mut img, leaf);
    // Swap the keys of items 0 and 1 (keys are the first 17 bytes of each item header).
    let (a, b) = (NODE_HEADER_SIZE, NODE_HEADER_SIZE + ITEM_HEADER_SIZE);
    let ka: Vec<u8> = n[a..a + 17].to_vec();
    let kb: Vec<u8> = n[b..b + 17].to_vec();
    n[a..a + 17].copy_from_slice(&kb);
    n[b..b + 17].copy_from_slice(&ka);
    reseal(n);
    let p = fsck_problems(img.clone());
    assert!(p.iter().any(|p| p.contains("key order")), "{p:?}");
    touch_everything(img);
}

#[test]
fn item_out_of_bounds() {
    let mut img = image();
    let (root, _) = fs_root(&img);
    let leaf = child(&img, root, 1);
    let n = node_mut(&mut img, leaf);
    let at = NODE_HEADER_SIZE + 17 + 4; // item 0's size field
    n[at..at + 4].copy_from_slice(&100_000u32.to_le_bytes());
    reseal(n);
    let p = fsck_problems(img.clone());
    assert!(p.iter().any(|p| p.contains("item 0 data")), "{p:?}");
    touch_everything(img);
}

#[test]
fn pointer_past_device_end() {
    let mut img = image();
    let (root, _) = fs_root(&img);
    let n = node_mut(&mut img, root);
    let at = NODE_HEADER_SIZE + 17; // pointer 0's block
    n[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    reseal(n);
    let p = fsck_problems(img.clone());
    assert!(p.iter().any(|p| p.contains("pointer 0 block")), "{p:?}");
    // The root is read at open (to find the root inode): open refuses.
    assert!(open_err(img).contains("pointer 0 block"));
}

#[test]
fn wrong_link_count() {
    let img = image();
    // Find file0's inode item in some leaf and change its link count.
    let dev = MemDevice::from_bytes(img.clone());
    let fs = Fs::open(Arc::new(MemDevice::from_bytes(img.clone())), opts()).expect("open");
    let ino = fs.lookup(ROOT, b"file0").expect("file0").ino;
    drop(fs);
    let mut img2 = img.clone();
    let ns = NS;
    let key = idxfs_format::Key::new(ino, idxfs_format::ItemType::Inode, 0).encode();
    let mut done = false;
    for blk in 0..(dev.size() as usize / 4096 - 1) {
        let n = &mut img2[blk * 4096..blk * 4096 + ns];
        if &n[4..8] != b"IXND" || n[48] != 0 {
            continue;
        }
        let items = u16::from_le_bytes([n[50], n[51]]) as usize;
        for i in 0..items {
            let h = NODE_HEADER_SIZE + i * ITEM_HEADER_SIZE;
            if n[h..h + 17] == key {
                let off = u32::from_le_bytes(n[h + 17..h + 21].try_into().expect("4")) as usize;
                n[off + 4..off + 8].copy_from_slice(&7u32.to_le_bytes()); // nlink
                reseal(n);
                done = true;
            }
        }
    }
    assert!(done, "inode item found");
    let p = fsck_problems(img2);
    assert!(
        p.iter()
            .any(|p| p.contains(&format!("inode {ino}: link count 7"))),
        "{p:?}"
    );
}

/// An image with a file whose access ACL names user 0xABCD1234 (rwx for the owner), and
/// where each stored copy of the ACL value begins (nodes are 4 KiB here, so one block each).
fn image_with_acl() -> (Vec<u8>, Vec<usize>) {
    let dev = Arc::new(MemDevice::new(16 << 20));
    let mkfs = MkfsOptions {
        node_size: NS as u32,
        ..Default::default()
    };
    Fs::mkfs(dev.clone(), &mkfs).expect("mkfs");
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    let acl = acl_xattr(&[
        (1, 7, u32::MAX),
        (2, 6, 0xABCD_1234),
        (4, 4, u32::MAX),
        (0x10, 6, u32::MAX),
        (0x20, 4, u32::MAX),
    ]);
    fs.setxattr(f, idxfs_engine::fs::ACL_ACCESS, &acl, 0)
        .expect("set ACL");
    fs.close().expect("close");
    assert_clean(&dev);
    let img = dev.snapshot();
    let named = &acl[12..20];
    let at: Vec<usize> = img
        .windows(named.len())
        .enumerate()
        .filter(|(_, w)| *w == named)
        .map(|(i, _)| i - 12)
        .collect();
    assert!(!at.is_empty(), "the ACL is in the image");
    (img, at)
}

/// Changes the byte at `off` of every stored copy of the ACL, and reseals their nodes.
fn damage_acl(img: &mut [u8], copies: &[usize], off: usize, value: u8) {
    for &at in copies {
        img[at + off] = value;
        let block = (at / NS) as u64;
        reseal(node_mut(img, block));
    }
}

#[test]
fn acls_that_are_invalid_or_disagree_with_the_mode_are_problems() {
    let (img, copies) = image_with_acl();
    let mut version = img.clone();
    damage_acl(&mut version, &copies, 0, 3);
    let p = fsck_problems(version);
    assert!(
        p.iter()
            .any(|p| p.contains("posix_acl_access") && p.contains("another version")),
        "{p:?}"
    );
    // The owner's entry says r-x where the mode says rwx.
    let mut owner = img;
    damage_acl(&mut owner, &copies, 6, 5);
    let p = fsck_problems(owner.clone());
    assert!(
        p.iter().any(|p| p.contains("gives 564, the mode 764")),
        "{p:?}"
    );
    // The library reads such an ACL back as it is (the kernel checks what it gets), and a
    // chmod puts the two in step again.
    let dev = Arc::new(MemDevice::from_bytes(owner));
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    let f = fs.lookup(ROOT, b"f").expect("lookup").ino;
    assert!(fs.getxattr(f, idxfs_engine::fs::ACL_ACCESS).is_ok());
    let chmod = idxfs_engine::fs::SetAttr {
        mode: Some(0o750),
        ..Default::default()
    };
    fs.setattr(f, &chmod).expect("chmod");
    fs.close().expect("close");
    assert_clean(&dev);
}
