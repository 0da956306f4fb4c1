#![allow(dead_code)]
pub mod digest;
pub mod workload;
use idxfs_blockdev::{BlockDevice, MemDevice};
use idxfs_engine::fs::{NameHash, Owner};
use idxfs_engine::{fsck, Fs, MkfsOptions, OpenOptions};
use std::sync::Arc;

pub const ROOT: u64 = 1;
pub const ME: Owner = Owner {
    uid: 1000,
    gid: 1000,
};

/// The incompat feature bits of the superblock on `dev`.
pub fn incompat(dev: &MemDevice) -> u64 {
    idxfs_engine::fs::read_superblock(dev)
        .expect("superblock")
        .incompat
        .get()
}

pub fn opts() -> OpenOptions {
    OpenOptions {
        commit_interval: None,
        // Reads must not change the state the tests compare (digests include atime).
        atime: idxfs_engine::fs::Atime::NoAtime,
        ..OpenOptions::default()
    }
}

/// A fresh 16 MiB image with 4 KiB nodes, every later write and flush to it recorded (for
/// crash images).
pub fn recorded() -> Arc<idxfs_blockdev::RecordingDevice> {
    recorded_with(16 << 20, None)
}

/// `recorded` of `bytes`, with this file system id if given (crash images then agree byte
/// for byte from run to run).
pub fn recorded_with(bytes: u64, uuid: Option<[u8; 16]>) -> Arc<idxfs_blockdev::RecordingDevice> {
    let base = Arc::new(MemDevice::new(bytes));
    let mkfs = MkfsOptions {
        node_size: 4096,
        uuid,
        ..MkfsOptions::default()
    };
    Fs::mkfs(base.clone(), &mkfs).expect("mkfs");
    Arc::new(idxfs_blockdev::RecordingDevice::new(base.snapshot()))
}

pub fn mem_fs(bytes: u64) -> (Arc<MemDevice>, Fs) {
    mem_fs_with(bytes, idxfs_format::DEFAULT_NODE_SIZE)
}

/// A fresh image of `bytes` with nodes of `node_size`, opened with `opts()`.
/// A fresh image of `bytes` holding "first" (committed) and "second" (committed at close),
/// its older superblock copy made unusable: an open goes by the newer one and notes the
/// damage, so its first commit reuses the lost copy's generation (`TxnState::zero_log_head`).
pub fn image_with_a_damaged_superblock_copy(bytes: u64) -> Vec<u8> {
    let (dev, fs) = mem_fs(bytes);
    fs.create(ROOT, b"first", 0o644, ME).expect("create");
    fs.sync().expect("commit");
    fs.create(ROOT, b"second", 0o644, ME).expect("create");
    fs.close().expect("close");
    let sb = idxfs_engine::fs::read_superblock(dev.as_ref()).expect("superblock");
    let older = (sb.generation.get() + 1) % idxfs_format::SUPER_COPIES;
    let mut img = dev.snapshot();
    img[older as usize * 4096 + 64] ^= 0xff;
    img
}

pub fn mem_fs_with(bytes: u64, node_size: u32) -> (Arc<MemDevice>, Fs) {
    let dev = Arc::new(MemDevice::new(bytes));
    let mkfs = MkfsOptions {
        node_size,
        ..MkfsOptions::default()
    };
    Fs::mkfs(dev.clone(), &mkfs).expect("mkfs");
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    (dev, fs)
}

/// Adds 1 to 20 hard links with 250-byte names to `ino` in `parent`, past the room of the
/// back-reference item into extended references; numbers the names from `n`, and records
/// each new (parent, ino, name) in `files`.
pub fn link_long_names(
    fs: &Fs,
    rng: &mut idxfs_engine::testutil::Rng,
    (parent, ino): (u64, u64),
    n: &mut u64,
    files: &mut Vec<(u64, u64, Vec<u8>)>,
) {
    for _ in 0..rng.below(20) + 1 {
        *n += 1;
        let mut name = format!("link{n}-").into_bytes();
        name.resize(250, b'l');
        fs.link(ino, parent, &name).expect("link");
        files.push((parent, ino, name));
    }
}

/// Runs fsck (the committed state, and what an open would make of the fsync log, every data
/// block with a checksum read and compared) and panics with every problem listed if the
/// image is not clean.
pub fn assert_clean<D: BlockDevice + 'static>(dev: &Arc<D>) {
    assert_clean_with(dev, idxfs_format::hash::name_hash)
}

pub fn assert_clean_with<D: BlockDevice + 'static>(dev: &Arc<D>, hash: NameHash) {
    let dev: Arc<dyn BlockDevice> = dev.clone();
    let r = fsck::check_with(&dev, hash, true, &mut |_| {}).expect("fsck could not read the image");
    assert!(
        r.is_clean(),
        "fsck found {} problems:\n{}",
        r.problems.len(),
        r.problems.join("\n")
    );
}

/// Lists `dir` in readdir calls of `run()` entries each, every call resumed from the last
/// entry's cookie, as a front end with a small buffer reads it (so a listing is read, and
/// published, in several runs): every entry, "." and ".." first.
pub fn list_in_runs(
    fs: &Fs,
    dir: u64,
    mut run: impl FnMut() -> usize,
) -> Vec<idxfs_engine::fs::DirEntryOut> {
    let mut got = Vec::new();
    let mut cookie = 0;
    loop {
        let run = run();
        let mut taken = 0;
        fs.readdir(dir, cookie, |e| {
            if taken == run {
                return false;
            }
            taken += 1;
            cookie = e.cookie;
            got.push(e.clone());
            true
        })
        .expect("readdir");
        if taken < run {
            return got;
        }
    }
}

/// A POSIX ACL in the kernel's xattr format (version 2, then (tag, permissions, id) entries):
/// what `system.posix_acl_access` and `system.posix_acl_default` hold.
pub fn acl_xattr(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// Every block of `ino`'s block extents, in file order: (file block, device block, extent
/// kind: `EXTENT_REGULAR` or `EXTENT_PREALLOC`).
pub fn extent_blocks(fs: &idxfs_engine::Fs, ino: u64) -> Vec<(u64, u64, u8)> {
    use idxfs_format::{items::decode_extent, ItemType, Key};
    fs.with_store(|s, t, _| {
        let mut out = Vec::new();
        t.scan(
            s,
            Key::new(ino, ItemType::Extent, 0),
            Key::new(ino, ItemType::Extent, u64::MAX),
            |k, v| {
                let (e, _) = decode_extent(v, "extent", u64::MAX).expect("extent");
                let (f, d) = (k.offset / idxfs_format::BLOCK_SIZE, e.disk_block.get());
                out.extend((0..e.blocks.get()).map(|i| (f + i, d + i, e.kind)));
                Ok(true)
            },
        )
        .expect("scan");
        out
    })
}

/// The file blocks of `ino` that have a data sum, in order.
pub fn summed_blocks(fs: &Fs, ino: u64) -> Vec<u64> {
    use idxfs_format::items::{BlockSums, SUM_GROUP_BLOCKS};
    use idxfs_format::{ItemType, Key};
    fs.with_store(|s, t, _| {
        let mut out = Vec::new();
        t.scan(
            s,
            Key::new(ino, ItemType::DataSum, 0),
            Key::new(ino, ItemType::DataSum, u64::MAX),
            |k, v| {
                let sums = BlockSums::decode(v, "sums").expect("sums");
                for (i, x) in sums.sums.iter().enumerate() {
                    if x.is_some() {
                        out.push(k.offset * SUM_GROUP_BLOCKS + i as u64);
                    }
                }
                Ok(true)
            },
        )
        .expect("scan");
        out
    })
}

/// Sets the link count of `ino`'s inode item to `nlink` in every leaf of `img` (nodes of
/// `node_size`) holding it with permission bits `perm`: the leaf of the tree that has that
/// version, and stale copies in free blocks, which nothing reads. Returns how many it
/// changed; each is resealed, so only a check of what the items mean finds the damage.
pub fn set_link_count(img: &mut [u8], node_size: usize, ino: u64, perm: u32, nlink: u32) -> usize {
    use idxfs_format::node::{ITEM_HEADER_SIZE, NODE_HEADER_SIZE};
    let key = idxfs_format::Key::new(ino, idxfs_format::ItemType::Inode, 0).encode();
    let mut done = 0;
    for n in img.chunks_exact_mut(node_size) {
        if &n[4..8] != b"IXND" || n[48] != 0 {
            continue;
        }
        let items = u16::from_le_bytes([n[50], n[51]]) as usize;
        for i in 0..items.min(node_size / ITEM_HEADER_SIZE) {
            let h = NODE_HEADER_SIZE + i * ITEM_HEADER_SIZE;
            if n.get(h..h + 17) != Some(&key[..]) {
                continue;
            }
            let off = u32::from_le_bytes(n[h + 17..h + 21].try_into().expect("4")) as usize;
            let mode = u32::from_le_bytes(n[off..off + 4].try_into().expect("4"));
            if mode & 0o7777 == perm {
                n[off + 4..off + 8].copy_from_slice(&nlink.to_le_bytes());
                let c = crc32c::crc32c(&n[4..]);
                n[..4].copy_from_slice(&c.to_le_bytes());
                done += 1;
            }
        }
    }
    done
}

/// The free blocks every block comes back to once all made after this call is gone, with
/// snapshots made and deleted meanwhile: taken after one snapshot is made and deleted, since
/// the roots tree the first snapshot makes stays after its delete.
pub fn free_blocks_with_roots_tree(fs: &Fs) -> u64 {
    let first = fs.snapshot(b"first").expect("snapshot");
    fs.delete_snapshot(first).expect("delete");
    fs.finish_drops().expect("drops");
    fs.sync().expect("sync");
    fs.statfs().expect("statfs").blocks_free
}
