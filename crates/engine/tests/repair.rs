//! `repair`: each node of an image damaged in turn (every leaf and internal node of the fs
//! tree, every node of the space tree), then repaired: the result is fsck clean, opens and
//! takes changes, and every inode whose metadata lay outside the damaged node is still there,
//! reachable, with its contents, symlink target and xattrs; with a space-tree node damaged,
//! nothing at all is lost.
mod common;
use common::*;
use idxfs_blockdev::{BlockDevice, MemDevice};
use idxfs_engine::fs::read_superblock;
use idxfs_engine::testutil::Rng;
use idxfs_engine::{repair, Fs};
use idxfs_format::node::{KEY_PTR_SIZE, NODE_HEADER_SIZE};
use idxfs_format::{ItemType, Key, SHARED_OBJECTID, TREE_FS, TREE_SPACE};
use std::collections::BTreeMap;
use std::sync::Arc;

const NS: usize = 4096;

/// What a user sees of one inode, wherever it is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    mode: u32,
    data: Vec<u8>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    paths: Vec<String>,
}

fn walk(fs: &Fs, dir: u64, path: &str, out: &mut BTreeMap<u64, Seen>) {
    for e in fs.list(dir).expect("list") {
        let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
        let a = fs.getattr(e.ino).expect("getattr");
        if let Some(s) = out.get_mut(&e.ino) {
            s.paths.push(p);
            continue;
        }
        let data = match a.mode & 0o170000 {
            // Bounded: damage may leave a file (rightly) claiming a huge sparse size.
            0o100000 => fs
                .read(e.ino, 0, a.size.min(1 << 20) as usize)
                .expect("read"),
            0o120000 => fs.readlink(e.ino).expect("readlink"),
            _ => Vec::new(),
        };
        let mut xattrs = BTreeMap::new();
        for x in fs.listxattr(e.ino).expect("listxattr") {
            let v = fs.getxattr(e.ino, &x).expect("getxattr");
            xattrs.insert(x, v);
        }
        out.insert(
            e.ino,
            Seen {
                mode: a.mode,
                data,
                xattrs,
                paths: vec![p.clone()],
            },
        );
        if a.mode & 0o170000 == 0o040000 {
            walk(fs, e.ino, &p, out);
        }
    }
}

fn seen(dev: &Arc<MemDevice>) -> BTreeMap<u64, Seen> {
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    let mut out = BTreeMap::new();
    walk(&fs, ROOT, "", &mut out);
    fs.close().expect("close");
    out
}

/// An image with nested directories, empty, inline and multi-block files, copies sharing
/// their sources' blocks, short and long symlinks, hard links (some with long names, past the
/// back-reference item), and small and long (chunked) xattrs.
fn image(rng: &mut Rng) -> Arc<MemDevice> {
    let (dev, fs) = mem_fs_with(24 << 20, NS as u32);
    let mut dirs = vec![ROOT];
    let mut files = Vec::new();
    for i in 0..700u64 {
        let parent = dirs[rng.below(dirs.len() as u64) as usize];
        let name = format!("n{i}");
        match rng.below(10) {
            0 => dirs.push(
                fs.mkdir(parent, name.as_bytes(), 0o755, ME)
                    .expect("mkdir")
                    .ino,
            ),
            1 => {
                let len = if rng.below(2) == 0 { 20 } else { 3000 };
                let target = vec![b't'; len];
                fs.symlink(parent, name.as_bytes(), &target, ME)
                    .expect("symlink");
            }
            2 if !files.is_empty() => {
                let (f, _) = files[rng.below(files.len() as u64) as usize];
                let mut n = format!("link{i}-").into_bytes();
                n.resize(if rng.below(2) == 0 { 12 } else { 250 }, b'l');
                fs.link(f, parent, &n).expect("link");
            }
            // A copy that shares the source's blocks (`SharedBlocks` counts).
            3 if !files.is_empty() => {
                let (src, _) = files[rng.below(files.len() as u64) as usize];
                let f = fs
                    .create(parent, name.as_bytes(), 0o644, ME)
                    .expect("create");
                let len = fs.getattr(src).expect("getattr").size;
                fs.copy_range(src, 0, f.ino, 0, len, Default::default())
                    .expect("copy_range");
                files.push((f.ino, parent));
            }
            _ => {
                let f = fs
                    .create(parent, name.as_bytes(), 0o644, ME)
                    .expect("create");
                let len = [0, 100, 5000, 20000][rng.below(4) as usize];
                let data: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
                fs.write(f.ino, 0, &data).expect("write");
                if rng.below(4) == 0 {
                    let long = rng.below(2) == 0;
                    let v = vec![b'v'; if long { 3000 } else { 10 }];
                    fs.setxattr(f.ino, b"user.x", &v, 0).expect("setxattr");
                }
                files.push((f.ino, parent));
            }
        }
    }
    fs.close().expect("close");
    assert_clean(&dev);
    dev
}

/// Every node of a tree: (block, the keys it holds as [first, below), level).
fn nodes(img: &[u8], root: u64, level: u32) -> Vec<(u64, Option<Key>, Option<Key>, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![(root, None, None, level)];
    while let Some((block, first, below, level)) = stack.pop() {
        out.push((block, first, below, level));
        if level == 0 {
            continue;
        }
        let at = block as usize * 4096;
        let n = u16::from_le_bytes([img[at + 50], img[at + 51]]) as usize;
        let key = |i: usize| {
            let k = at + NODE_HEADER_SIZE + i * KEY_PTR_SIZE;
            Key::decode(img[k..k + 17].try_into().expect("key"))
        };
        for i in 0..n {
            let k = at + NODE_HEADER_SIZE + i * KEY_PTR_SIZE + 17;
            let child = u64::from_le_bytes(img[k..k + 8].try_into().expect("8 bytes"));
            let next = if i + 1 < n { Some(key(i + 1)) } else { below };
            stack.push((child, Some(key(i)), next, level - 1));
        }
    }
    out
}

/// True when an item of `ino` of one of `types` may lie in [first, below).
fn touched(ino: u64, types: &[ItemType], first: Option<Key>, below: Option<Key>) -> bool {
    types.iter().any(|t| {
        let lo = Key::new(ino, *t, 0);
        let hi = Key::new(ino, *t, u64::MAX);
        first.is_none_or(|f| f <= hi) && below.is_none_or(|b| b > lo)
    })
}

#[test]
fn every_node_damaged_in_turn_repairs_clean_keeping_what_survived() {
    let seed = std::env::var("IDXFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::process::id() as u64);
    eprintln!("IDXFS_SEED={seed}");
    let mut rng = Rng::new(seed);
    let dev = image(&mut rng);
    let before = seen(&dev);
    let base = dev.snapshot();
    let sb = read_superblock(dev.as_ref()).expect("sb");
    let fs_nodes = nodes(&base, sb.fs_root.block.get(), sb.fs_root.level.get());
    let space_nodes = nodes(&base, sb.space_root.block.get(), sb.space_root.level.get());
    assert!(
        sb.fs_root.level.get() >= 1 && fs_nodes.len() > 20,
        "the test wants a tree of many leaves"
    );
    assert!(
        fs_nodes.iter().any(|&(_, first, below, level)| level == 0
            && touched(SHARED_OBJECTID, &[ItemType::SharedBlocks], first, below)),
        "the test wants blocks that copies share"
    );
    let all = fs_nodes
        .iter()
        .map(|n| (TREE_FS, *n))
        .chain(space_nodes.iter().map(|n| (TREE_SPACE, *n)));
    let mut repaired_with_losses = 0;
    // Each node twice: bits flipped (its checksum fails), and bits flipped past its header
    // with the checksum made good again (what is read is valid-looking garbage: the checks of
    // structure and of every item's value must catch it).
    for ((owner, (block, first, below, level)), reseal) in all.flat_map(|n| [(n, false), (n, true)])
    {
        let mut img = base.clone();
        let node = &mut img[block as usize * 4096..][..NS];
        for _ in 0..1 + rng.below(4) {
            let at = if reseal {
                NODE_HEADER_SIZE + rng.below((NS - NODE_HEADER_SIZE) as u64) as usize
            } else {
                rng.below(NS as u64) as usize
            };
            node[at] ^= 1 << rng.below(8);
        }
        if reseal {
            let c = crc32c::crc32c(&node[4..]);
            node[..4].copy_from_slice(&c.to_le_bytes());
        }
        let dev = Arc::new(MemDevice::from_bytes(img));
        let d: Arc<dyn BlockDevice> = dev.clone();
        let what = format!(
            "owner {owner} node {block} (level {level}, {first:?}..{below:?}, resealed: {reseal})"
        );
        let r = repair::repair(&d, idxfs_format::hash::name_hash)
            .unwrap_or_else(|e| panic!("{what}: repair failed: {e}"));
        assert!(
            r.check.is_clean(),
            "{what}: not clean after repair:\n{}",
            r.check.problems.join("\n")
        );
        assert_clean(&dev);
        let after = seen(&dev);
        for (ino, b) in &before {
            let lost = owner == TREE_FS
                && touched(*ino, &[ItemType::Inode, ItemType::Extent], first, below);
            if lost {
                continue;
            }
            let Some(a) = after.get(ino) else {
                panic!("{what}: inode {ino} ({:?}) is gone", b.paths);
            };
            assert_eq!(a.mode, b.mode, "{what}: inode {ino} mode");
            assert!(
                a.data == b.data,
                "{what}: inode {ino} {:?}: contents differ",
                b.paths
            );
            let xlost = owner == TREE_FS
                && touched(*ino, &[ItemType::Xattr, ItemType::XattrChunk], first, below);
            if !xlost {
                assert_eq!(a.xattrs, b.xattrs, "{what}: inode {ino} xattrs");
            }
            if owner == TREE_SPACE {
                assert_eq!(a.paths, b.paths, "{what}: inode {ino} names");
            }
        }
        if after.len() < before.len() || r.actions.iter().any(|a| a.contains("lost+found")) {
            repaired_with_losses += 1;
        }
        // The repaired image takes changes.
        let fs = Fs::open(dev.clone(), opts()).expect("open after repair");
        fs.create(ROOT, b"after-repair", 0o644, ME)
            .expect("create after repair");
        fs.close().expect("close");
        assert_clean(&dev);
    }
    assert!(
        repaired_with_losses > 0,
        "no damage cost anything: the test damaged nothing"
    );
}

#[test]
fn a_lost_leaf_of_one_directory_index_loses_no_name() {
    // Every leaf that holds only name-hash items, or only inode-order items, of a directory:
    // the other index and the back references still hold every name, so the repaired image
    // lists exactly what the undamaged one did.
    let mut rng = Rng::new(7);
    let (dev, fs) = mem_fs_with(16 << 20, NS as u32);
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir").ino;
    for i in 0..600 {
        let f = fs.create(
            d,
            format!("file-{i}-{}", rng.below(1000)).as_bytes(),
            0o644,
            ME,
        );
        fs.write(f.expect("create").ino, 0, format!("{i}").as_bytes())
            .expect("write");
    }
    fs.close().expect("close");
    let before = seen(&dev);
    let base = dev.snapshot();
    let sb = read_superblock(dev.as_ref()).expect("sb");
    let mut tried = 0;
    for (block, first, below, level) in nodes(&base, sb.fs_root.block.get(), sb.fs_root.level.get())
    {
        let index_only = level == 0
            && [ItemType::DirHash, ItemType::DirIno].iter().any(|t| {
                first.is_some_and(|f| f.objectid == d && f.item_type() == Some(*t))
                    && below.is_some_and(|b| b.objectid == d && b.item_type() == Some(*t))
            });
        if !index_only {
            continue;
        }
        tried += 1;
        let mut img = base.clone();
        img[block as usize * 4096 + 100] ^= 0x10;
        let dev = Arc::new(MemDevice::from_bytes(img));
        let dd: Arc<dyn BlockDevice> = dev.clone();
        let r = repair::repair(&dd, idxfs_format::hash::name_hash).expect("repair");
        assert!(r.check.is_clean(), "{:?}", r.check.problems);
        assert!(!r.lost.is_empty(), "the damaged leaf was read");
        assert_eq!(seen(&dev), before, "leaf {block} ({first:?}..{below:?})");
    }
    assert!(
        tried >= 2,
        "the directory should span leaves of both indexes: {tried}"
    );
}

/// An image with two snapshots, the file system damaged (a wrong link count) and the second
/// snapshot damaged too (in a leaf only it names): the repair keeps the first snapshot as it
/// was, deletes the second and says so, and repairs the file system; all fsck clean. The
/// file system then changes beside the kept snapshot, which shows what it always showed;
/// once it is deleted, every block is back (fsck finds none held or leaked).
#[test]
fn repair_keeps_whole_snapshots_and_deletes_a_damaged_one() {
    use common::digest::digest;
    let (mut rng, seed) = Rng::from_env("repair with snapshots");
    let dev = image(&mut rng);
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    let a_state = digest(&fs);
    let a = fs.snapshot(b"a").expect("snapshot");
    // Changes between the two: files go, a file comes (only b and the file system have it).
    for e in fs.list(ROOT).expect("list").iter().take(40) {
        let _ = fs.unlink(ROOT, &e.name);
    }
    let b_only = fs.create(ROOT, b"b-only", 0o644, ME).expect("create").ino;
    let live_victim = fs.create(ROOT, b"victim", 0o644, ME).expect("create").ino;
    fs.write(live_victim, 0, &vec![3u8; 9000]).expect("write");
    let b = fs.snapshot(b"b").expect("snapshot");
    // After b, both victims change mode in the file system: their old leaves are b's alone.
    for ino in [b_only, live_victim] {
        fs.setattr(
            ino,
            &idxfs_engine::fs::SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .expect("chmod");
    }
    fs.close().expect("close");
    assert_clean(&dev);
    let mut img = dev.snapshot();
    assert!(
        set_link_count(&mut img, NS, b_only, 0o644, 5) > 0,
        "b's leaf"
    );
    assert!(
        set_link_count(&mut img, NS, live_victim, 0o600, 9) > 0,
        "the file system's leaf"
    );
    let (dev, r) = repaired(img, seed);
    assert!(
        r.actions
            .iter()
            .any(|l| l.starts_with(&format!("snapshot {b} (b) is damaged"))),
        "seed {seed}: {:?}",
        r.actions
    );
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains(&format!("kept as they were: {a}"))),
        "seed {seed}: {:?}",
        r.notes
    );
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    let listed: Vec<u64> = fs.snapshots().expect("list").iter().map(|s| s.id).collect();
    assert_eq!(listed, [a]);
    assert_eq!(fs.getattr(live_victim).expect("victim").nlink, 1);
    assert_eq!(
        fs.read(live_victim, 0, 9000).expect("read"),
        vec![3u8; 9000]
    );
    // The file system changes everything a shares with it: a stays as it was.
    let view = fs.open_snapshot(a, 1 << 20).expect("view");
    assert_eq!(
        digest(&view),
        a_state,
        "seed {seed}: snapshot a after the repair"
    );
    for e in fs.list(ROOT).expect("list") {
        let at = fs.getattr(e.ino).expect("getattr");
        if at.mode & 0o170000 == 0o100000 {
            fs.write(e.ino, 0, b"rewritten after the repair")
                .expect("write");
        } else if at.mode & 0o170000 != 0o040000 {
            fs.unlink(ROOT, &e.name).expect("unlink");
        }
    }
    fs.sync().expect("commit");
    assert_eq!(
        digest(&view),
        a_state,
        "seed {seed}: snapshot a beside changes"
    );
    drop(view);
    fs.close().expect("close");
    assert_clean(&dev);
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    fs.delete_snapshot(a).expect("delete");
    fs.finish_drops().expect("drops");
    fs.close().expect("close");
    assert_clean(&dev);
}

/// `img` repaired, on a device of its own; the repair's check of the result clean.
fn repaired(img: Vec<u8>, seed: u64) -> (Arc<MemDevice>, repair::Repaired) {
    let dev = Arc::new(MemDevice::from_bytes(img));
    let r = repair::repair(
        &(dev.clone() as Arc<dyn BlockDevice>),
        idxfs_format::hash::name_hash,
    )
    .unwrap_or_else(|e| panic!("seed {seed}: repair: {e}"));
    assert!(r.check.is_clean(), "seed {seed}: {:?}", r.check.problems);
    (dev, r)
}

fn open_tree(dev: &Arc<MemDevice>, id: u64) -> Fs {
    let o = idxfs_engine::fs::OpenOptions {
        subvolume: Some(id),
        ..opts()
    };
    Fs::open(dev.clone(), o).expect("open the subvolume")
}

/// Files only tree `fs` has: `n` files of 9,000 bytes of `byte`, and changes to files it
/// shares (rewritten, removed), so its own leaves and blocks lie beside its origin's.
fn own_files(fs: &Fs, tag: &str, byte: u8, rng: &mut Rng) {
    for i in 0..20 {
        let f = fs
            .create(ROOT, format!("{tag}{i}").as_bytes(), 0o644, ME)
            .expect("create");
        fs.write(f.ino, 0, &vec![byte; 9000]).expect("write");
    }
    for e in fs.list(ROOT).expect("list") {
        let a = fs.getattr(e.ino).expect("getattr");
        if a.mode & 0o170000 != 0o100000 || e.name.starts_with(tag.as_bytes()) {
            continue;
        }
        match rng.below(6) {
            0 => fs.unlink(ROOT, &e.name).expect("unlink"),
            1 => fs
                .write(e.ino, 0, &[byte; 5000])
                .map(|_| ())
                .expect("write"),
            _ => {}
        }
    }
}

/// The digest of writable tree or snapshot `id` seen read-only beside the file system.
fn digest_of(dev: &Arc<MemDevice>, id: u64) -> String {
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    let view = fs.open_snapshot(id, 1 << 20).expect("view");
    let d = common::digest::digest(&view);
    drop(view);
    fs.close().expect("close");
    d
}

/// Makes a victim of `mode` with a link count of 1 in the open tree: its item's leaf is the
/// tree's alone once the mode is set after everything else.
fn victim(fs: &Fs, name: &[u8], mode: u32) -> u64 {
    let ino = fs.create(ROOT, name, 0o644, ME).expect("create").ino;
    fs.write(ino, 0, &vec![7u8; 12_000]).expect("write");
    fs.setattr(
        ino,
        &idxfs_engine::fs::SetAttr {
            mode: Some(mode),
            ..Default::default()
        },
    )
    .expect("chmod");
    ino
}

/// Beside writable subvolumes: an image whose file system has a snapshot, a writable
/// snapshot (a clone of it through a hidden origin), an empty subvolume and a clone of the
/// snapshot, each with files of its own, the file system's tree damaged (a wrong link count)
/// and the clone's too. The repair rebuilds the file system's tree and the clone's (parked),
/// keeps the snapshot, the writable snapshot and the empty subvolume as they were, and says
/// so; fsck clean, every tree showing what it showed. Each is then served in turn and
/// changed, fsck clean; once everything is deleted every block is back.
#[test]
fn repair_keeps_whole_subvolumes_beside_the_tree_it_rebuilds() {
    use common::digest::digest;
    let (mut rng, seed) = Rng::from_env("repair beside subvolumes");
    let dev = image(&mut rng);
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    let s = fs.snapshot(b"s").expect("snapshot");
    let w = fs.writable_snapshot(b"w").expect("writable snapshot");
    let e = fs.make_subvolume(b"e", ME).expect("subvolume");
    let c = fs.make_clone(s, b"c").expect("clone");
    fs.close().expect("close");
    for (id, tag, byte) in [(w, "w", 1u8), (e, "e", 2), (c, "c", 3)] {
        let fs = open_tree(&dev, id);
        own_files(&fs, tag, byte, &mut rng);
        fs.close().expect("close");
    }
    let fs = open_tree(&dev, c);
    let c_victim = victim(&fs, b"c-victim", 0o641);
    fs.close().expect("close");
    let fs = open_tree(&dev, idxfs_format::FS_SUBVOL_ID);
    own_files(&fs, "fs", 4, &mut rng);
    let fs_victim = victim(&fs, b"victim", 0o611);
    let fs_state = digest(&fs);
    fs.close().expect("close");
    assert_clean(&dev);
    let before: Vec<(u64, String)> = [s, w, e, c]
        .iter()
        .map(|&i| (i, digest_of(&dev, i)))
        .collect();

    let mut img = dev.snapshot();
    assert!(
        set_link_count(&mut img, NS, fs_victim, 0o611, 9) > 0,
        "the file system's leaf"
    );
    assert!(
        set_link_count(&mut img, NS, c_victim, 0o641, 5) > 0,
        "the clone's leaf"
    );
    let (dev, r) = repaired(img, seed);
    assert!(
        r.actions
            .iter()
            .any(|l| l.starts_with(&format!("subvolume {c} (c) is damaged"))
                && l.ends_with("rebuilt")),
        "seed {seed}: {:?}",
        r.actions
    );
    assert!(
        !r.actions.iter().any(|l| l.contains("another tree's")),
        "seed {seed}: {:?}",
        r.actions
    );
    assert!(
        r.notes
            .iter()
            .any(|n| n.ends_with(&format!("kept as they were: {w}, {e}"))),
        "seed {seed}: {:?}",
        r.notes
    );
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    assert_eq!(
        digest(&fs),
        fs_state,
        "seed {seed}: the file system, repaired"
    );
    let subvols: Vec<u64> = fs.subvolumes().iter().map(|v| v.id).collect();
    assert_eq!(
        subvols,
        [idxfs_format::FS_SUBVOL_ID, w, e, c],
        "seed {seed}"
    );
    let listed: Vec<u64> = fs.snapshots().expect("list").iter().map(|s| s.id).collect();
    assert_eq!(listed, [s], "seed {seed}");
    fs.close().expect("close");
    for (id, d) in &before {
        assert_eq!(
            &digest_of(&dev, *id),
            d,
            "seed {seed}: tree {id} after the repair"
        );
    }
    // Every tree takes changes; the snapshot stays as it was.
    for id in [w, e, c, idxfs_format::FS_SUBVOL_ID] {
        let fs = open_tree(&dev, id);
        own_files(&fs, "after", 5, &mut rng);
        fs.close().expect("close");
        assert_clean(&dev);
    }
    assert_eq!(
        digest_of(&dev, s),
        before[0].1,
        "seed {seed}: the snapshot beside changes"
    );
    // Everything deleted: every block back (fsck finds none held or leaked), the writable
    // snapshot's hidden origin gone with it.
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    for id in [w, e, c, s] {
        fs.delete_snapshot(id).expect("delete");
        fs.finish_drops().expect("drops");
    }
    assert!(fs.subvolumes().len() == 1 && fs.snapshots().expect("list").is_empty());
    fs.close().expect("close");
    assert_clean(&dev);
}

/// A clone active and damaged: the repair rebuilds it beside the file system's own tree
/// (parked) and its origin, the blocks it shares with them still theirs; then both trees
/// take changes in turn, and once the clone and its origin are deleted every block is back.
/// With the file system's own tree damaged instead, parked, that tree is rebuilt where it is
/// (parked), the clone kept as it was and still active.
#[test]
fn repair_rebuilds_an_active_clone_or_the_parked_own_tree() {
    use common::digest::digest;
    let (mut rng, seed) = Rng::from_env("repair of an active clone");
    let dev = image(&mut rng);
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    let w = fs.writable_snapshot(b"w").expect("writable snapshot");
    let fs_victim = victim(&fs, b"fs-victim", 0o612);
    let fs_state = digest(&fs);
    fs.close().expect("close");
    let fs = open_tree(&dev, w);
    own_files(&fs, "w", 1, &mut rng);
    let w_victim = victim(&fs, b"w-victim", 0o613);
    let w_state = digest(&fs);
    fs.close().expect("close");
    assert_clean(&dev);

    // The parked own tree damaged: rebuilt where it is, the clone still the active tree.
    let mut img = dev.snapshot();
    assert!(
        set_link_count(&mut img, NS, fs_victim, 0o612, 9) > 0,
        "the own tree's leaf"
    );
    let (broken, r) = repaired(img, seed);
    assert!(
        r.actions
            .iter()
            .any(|l| l.starts_with("the file system's own tree is damaged")
                && l.ends_with("rebuilt")),
        "seed {seed}: {:?}",
        r.actions
    );
    assert!(
        !r.actions.iter().any(|l| l.contains("another tree's")),
        "seed {seed}: {:?}",
        r.actions
    );
    let fs = Fs::open(broken.clone(), opts()).expect("open");
    assert_eq!(fs.active_subvolume(), w);
    assert_eq!(digest(&fs), w_state, "seed {seed}: the clone kept");
    fs.close().expect("close");
    assert_eq!(
        seen_tree(&broken, idxfs_format::FS_SUBVOL_ID),
        fs_state,
        "seed {seed}: the own tree, repaired"
    );
    for id in [idxfs_format::FS_SUBVOL_ID, w] {
        let fs = open_tree(&broken, id);
        own_files(&fs, "after", 7, &mut rng);
        fs.close().expect("close");
        assert_clean(&broken);
    }

    // The active clone damaged: rebuilt.
    let mut img = dev.snapshot();
    assert!(
        set_link_count(&mut img, NS, w_victim, 0o613, 7) > 0,
        "the clone's leaf"
    );
    let (dev, r) = repaired(img, seed);
    // What the clone shares with its origin stays shared: nothing is copied.
    assert!(
        !r.actions.iter().any(|l| l.contains("another tree's")),
        "seed {seed}: {:?}",
        r.actions
    );
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    assert_eq!(fs.active_subvolume(), w, "seed {seed}");
    assert_eq!(digest(&fs), w_state, "seed {seed}: the clone, repaired");
    own_files(&fs, "after", 5, &mut rng);
    fs.close().expect("close");
    assert_clean(&dev);
    let fs = open_tree(&dev, idxfs_format::FS_SUBVOL_ID);
    assert_eq!(
        digest(&fs),
        fs_state,
        "seed {seed}: the file system's own tree"
    );
    own_files(&fs, "after", 6, &mut rng);
    fs.delete_snapshot(w).expect("delete the clone");
    fs.finish_drops().expect("drops");
    assert!(
        fs.snapshots().expect("list").is_empty(),
        "the hidden origin goes with it"
    );
    fs.close().expect("close");
    assert_clean(&dev);
}

/// What writable tree `id` holds, opened read-only.
fn seen_tree(dev: &Arc<MemDevice>, id: u64) -> String {
    let o = idxfs_engine::fs::OpenOptions {
        subvolume: Some(id),
        read_only: true,
        ..opts()
    };
    let fs = Fs::open(dev.clone(), o).expect("open read-only");
    let d = common::digest::digest(&fs);
    fs.close().expect("close");
    d
}

/// A crash at every point of a repair beside subvolumes (the file system and a clone both
/// damaged, so both are rebuilt, beside a snapshot and a writable snapshot kept): each
/// crash image is the damaged image as it was (fsck finds the same problems) or the
/// repaired one (clean), and a repair of it then ends clean with every tree showing what
/// it showed before the damage.
#[test]
fn every_crash_of_a_repair_beside_subvolumes_leaves_the_old_or_the_new_image() {
    use idxfs_blockdev::{RecordingDevice, Tear};
    let (mut rng, seed) = Rng::from_env("repair crash");
    let (dev, fs) = mem_fs_with(8 << 20, NS as u32);
    for i in 0..30u64 {
        let f = fs
            .create(ROOT, format!("f{i}").as_bytes(), 0o644, ME)
            .expect("create");
        let len = [0usize, 100, 5000][rng.below(3) as usize];
        fs.write(f.ino, 0, &vec![i as u8; len]).expect("write");
    }
    let s = fs.snapshot(b"s").expect("snapshot");
    let w = fs.writable_snapshot(b"w").expect("writable snapshot");
    let c = fs.make_clone(s, b"c").expect("clone");
    fs.close().expect("close");
    let fs = open_tree(&dev, c);
    own_files(&fs, "c", 3, &mut rng);
    let c_victim = victim(&fs, b"c-victim", 0o641);
    fs.close().expect("close");
    let fs = open_tree(&dev, idxfs_format::FS_SUBVOL_ID);
    let fs_victim = victim(&fs, b"victim", 0o611);
    fs.close().expect("close");
    let trees = [idxfs_format::FS_SUBVOL_ID, w, c];
    let want: Vec<String> = trees.iter().map(|&t| seen_tree(&dev, t)).collect();
    let snap = digest_of(&dev, s);
    let mut img = dev.snapshot();
    assert!(set_link_count(&mut img, NS, fs_victim, 0o611, 9) > 0);
    assert!(set_link_count(&mut img, NS, c_victim, 0o641, 5) > 0);
    let problems = |d: &Arc<MemDevice>| {
        let d: Arc<dyn BlockDevice> = d.clone();
        idxfs_engine::fsck::check(&d, idxfs_format::hash::name_hash, &mut |_| {})
            .expect("fsck reads it")
            .problems
    };
    let damaged = problems(&Arc::new(MemDevice::from_bytes(img.clone())));
    assert!(!damaged.is_empty());
    let rec = Arc::new(RecordingDevice::new(img));
    let r = repair::repair(
        &(rec.clone() as Arc<dyn BlockDevice>),
        idxfs_format::hash::name_hash,
    )
    .expect("repair");
    assert!(r.check.is_clean(), "seed {seed}: {:?}", r.check.problems);
    let events = rec.events().len();
    let (mut old, mut new) = (0, 0);
    for prefix in 0..=events {
        for tear in [Tear::None, Tear::TornLast(1), Tear::Drop(rng.next_u64())] {
            let at = format!("seed {seed} prefix {prefix} {tear:?}");
            let crashed = Arc::new(MemDevice::from_bytes(rec.crash_image(prefix, tear).bytes));
            match problems(&crashed) {
                p if p.is_empty() => new += 1,
                p if p == damaged => old += 1,
                p => panic!("{at}: neither the old image nor the repaired one: {p:?}"),
            }
            let (after, _) = repaired(crashed.snapshot(), seed);
            for (t, want) in trees.iter().zip(&want) {
                assert_eq!(&seen_tree(&after, *t), want, "{at}: tree {t}");
            }
            assert_eq!(digest_of(&after, s), snap, "{at}: the snapshot");
        }
    }
    eprintln!("seed {seed}: {events} device events, {old} crash images old, {new} repaired");
    assert!(old > 0 && new > 0, "seed {seed}: {old} old, {new} repaired");
}

/// A leaf the file system, a writable snapshot (active) and its hidden origin share, damaged:
/// all three meet it. The origin is deleted, the file system (parked) and the writable
/// snapshot are rebuilt, and the blocks both name stay the file system's: the writable
/// snapshot, whose origin went, is the one whose extents get copies. Both show what they
/// showed; every block is back once the writable snapshot is deleted.
#[test]
fn a_writable_snapshot_whose_origin_went_copies_what_it_shared() {
    use common::digest::digest;
    let (mut rng, seed) = Rng::from_env("repair of a shared leaf");
    let dev = image(&mut rng);
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    let shared = (fs.list(ROOT).expect("list").into_iter())
        .map(|e| e.ino)
        .find(|&i| {
            fs.getattr(i)
                .is_ok_and(|a| a.mode == 0o100644 && a.nlink == 1)
        })
        .expect("a file");
    let w = fs.writable_snapshot(b"w").expect("writable snapshot");
    let fs_state = digest(&fs);
    fs.close().expect("close");
    let fs = open_tree(&dev, w);
    let w_state = digest(&fs);
    fs.close().expect("close");
    let mut img = dev.snapshot();
    assert!(
        set_link_count(&mut img, NS, shared, 0o644, 4) > 0,
        "the shared leaf"
    );
    let (dev, r) = repaired(img, seed);
    let copied = |l: &String| l.contains("another tree's");
    assert!(
        r.actions
            .iter()
            .any(|l| !l.starts_with("subvolume ") && copied(l)),
        "seed {seed}: the writable snapshot's extents copied: {:?}",
        r.actions
    );
    assert!(
        !r.actions
            .iter()
            .any(|l| l.starts_with("subvolume 5: ") && copied(l)),
        "seed {seed}: nothing of the file system's copied: {:?}",
        r.actions
    );
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    assert_eq!(fs.active_subvolume(), w);
    assert_eq!(digest(&fs), w_state, "seed {seed}: the writable snapshot");
    assert!(fs.snapshots().expect("list").is_empty(), "its origin went");
    fs.close().expect("close");
    let fs = open_tree(&dev, idxfs_format::FS_SUBVOL_ID);
    assert_eq!(digest(&fs), fs_state, "seed {seed}: the file system");
    fs.delete_snapshot(w).expect("delete");
    fs.finish_drops().expect("drops");
    fs.close().expect("close");
    assert_clean(&dev);
}
