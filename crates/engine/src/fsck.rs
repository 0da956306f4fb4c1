//! fsck as an engine API: reads an image without trusting it and lists every problem found.
//!
//! Checks, in order: superblock copies; every node of every tree (checksum, identity, key
//! order, item bounds, child keys inside the parent's range, pointer generations); every item's
//! value; link counts; both directory indexes and the back references (inline and extended)
//! agree entry for entry; directory sizes; file extents do not overlap and none lies past the
//! size but under a trim orphan; long xattr values have exactly their chunks; ACLs are valid
//! and agree with the mode; symlink targets; data sums name only blocks of a copy-on-write
//! file's regular extents (and, with `check_with(.., data: true)`, match what those blocks
//! hold); the feature bits the items need; every block is accounted for exactly once
//! (referenced by one tree node or extent, or a superblock, exactly when its bitmap bit is
//! set), except data blocks several extents share, which the `SharedBlocks` items count
//! exactly (`check_shared`). With snapshots (`fsck/roots.rs`): the roots tree, every node's
//! count, every held run, and each snapshot's tree checked as the fs tree is.
//!
//! Then the fsync log, if the superblock names one with whole batches: it is replayed in
//! memory (an open through an `OverlayDevice`, so the image is not written) and the state an
//! open would see is checked the same way. A log that does not replay is a problem.
use crate::btree::node::Node;
use crate::error::{Error, Result};
use crate::fs::acl::{self, Acl};
use crate::fs::{NameHash, NOCOW_FL};
use idxfs_blockdev::BlockDevice;
use idxfs_format::items::{block_sum, BlockSums, SUM_GROUP_BLOCKS, S_IFREG};
use idxfs_format::items::{
    decode_block_group, decode_dir_entries, decode_ext_refs, decode_extent, decode_inode,
    decode_names, decode_orphan, decode_shared, decode_xattrs, dtype_of_mode, OrphanKind,
    XattrValue, EXTENT_INLINE, EXTENT_REGULAR, S_IFDIR, S_IFLNK, S_IFMT,
};
use idxfs_format::node::{Expect, KeyRange};
use idxfs_format::superblock::{RootPtr, Superblock};
use idxfs_format::versions::{
    COMPAT_RO_DATA_SUMS, INCOMPAT_EXT_REF, INCOMPAT_ORPHAN_TRIM, INCOMPAT_SHARED_BLOCKS,
    INCOMPAT_XATTR_CHUNKS,
};
use idxfs_format::{
    ItemType, Key, BLOCK_SIZE, ORPHAN_OBJECTID, ROOT_INO, SHARED_OBJECTID, SUPER_COPIES,
    SYMLINK_MAX, TREE_FS, TREE_ROOTS, TREE_SPACE,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

mod roots;
pub(crate) use roots::snapshot_problems;

#[derive(Debug, Default)]
pub struct Report {
    pub problems: Vec<String>,
    /// Things worth saying that are not damage (e.g. a superblock copy torn by a crash).
    pub notes: Vec<String>,
    pub generation: u64,
    pub nodes: u64,
    pub items: u64,
    pub inodes: u64,
    pub dir_entries: u64,
    pub used_blocks: u64,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
    fn problem(&mut self, s: String) {
        // Cap the list: a badly damaged image should not print millions of lines.
        if self.problems.len() < 10_000 {
            self.problems.push(s);
        }
    }
}

#[derive(Default)]
struct InodeInfo {
    mode: u32,
    nlink: u32,
    size: u64,
    alloc_bytes: u64,
    /// The inode item's flags (`FS_NOCOW_FL`).
    flags: u64,
    seen_entries: u32,
    subdirs: u32,
    extent_blocks: u64,
    last_extent_end: u64,
    /// End of the last regular (written) extent: none may lie past the size.
    last_data_end: u64,
    /// Length of an inline extent, if the data is inline.
    inline_len: Option<u64>,
    /// Any extent not inline.
    has_block_extent: bool,
    /// What an ORPHAN item naming this inode says.
    orphan: Option<OrphanKind>,
}

struct Checker<'a> {
    dev: &'a dyn BlockDevice,
    sb: Superblock,
    hash: NameHash,
    report: Report,
    /// What references each block, and what the space bitmaps say.
    blocks: Blocks,
    inodes: BTreeMap<u64, InodeInfo>,
    /// The items that name an inode from a directory, matched at the end.
    names: Names,
    /// Long xattr values and the chunks that hold them, matched at the end.
    xattrs: LongXattrs,
    /// Feature bits the items found need.
    needs: Needs,
    /// Data sums, checked against the extents of the inode whose items the walk is in.
    sums: SumCheck,
    /// Blocks more than one extent names, and the items that count them.
    sharing: Sharing,
    /// The roots tree and the snapshots' trees (`roots`).
    roots: roots::RootsCheck,
    progress: &'a mut dyn FnMut(u64),
}

/// Every block the trees reference, and the space bitmaps that must call exactly those used.
#[derive(Default)]
struct Blocks {
    /// Block -> what references it.
    owners: HashMap<u64, &'static str>,
    /// Space bitmap items: (group start, group length, bitmap).
    bitmaps: Vec<(u64, u64, Vec<u8>)>,
}

/// The items that name an inode from a directory: every index and every back reference
/// must name the same (directory, inode, name) triples.
#[derive(Default)]
struct Names {
    /// Name-hash index entries: (directory, inode, name).
    by_hash: Vec<(u64, u64, Vec<u8>)>,
    /// Inode-order index entries: (directory, inode, name).
    by_ino: Vec<(u64, u64, Vec<u8>)>,
    /// Back references: (directory, inode, name).
    refs: Vec<(u64, u64, Vec<u8>)>,
    /// (child, dtype in the entry, directory), checked against the inode at the end.
    dtypes: Vec<(u64, u8, u64)>,
}

/// Long xattr values and the chunks that hold them.
#[derive(Default)]
struct LongXattrs {
    /// (ino, chunk base, length, name).
    values: Vec<(u64, u64, u32, Vec<u8>)>,
    /// XattrChunk items: (ino, offset) -> length.
    chunks: BTreeMap<(u64, u64), usize>,
}

/// Feature bits the items found need, checked against the superblock's.
#[derive(Default)]
struct Needs {
    incompat: u64,
    compat_ro: u64,
}

/// How data sums are checked.
#[derive(Default)]
struct SumCheck {
    /// Read every block that has a data sum and compare (`idxfs fsck --data`).
    verify: bool,
    /// The regular extents of the inode whose items the walk is in, as (first file block,
    /// blocks, first device block): what its data sums may name.
    extents_of: (u64, Vec<(u64, u64, u64)>),
}

/// Blocks more than one extent names (`fs::shared`).
#[derive(Default)]
struct Sharing {
    /// Data blocks named by more than one extent: block -> how many.
    refs: HashMap<u64, u64>,
    /// Runs of blocks that must be named by one extent only: (start, length, whose).
    unshared: Vec<(u64, u64, String)>,
    /// `SharedBlocks` items: (first block, blocks, refs).
    items: Vec<(u64, u64, u64)>,
}

/// Checks the image on `dev`, and what an open would make of its fsync log. Returns Err only
/// when not even a superblock can be read.
pub fn check(
    dev: &Arc<dyn BlockDevice>,
    hash: NameHash,
    progress: &mut dyn FnMut(u64),
) -> Result<Report> {
    check_with(dev, hash, false, progress)
}

/// `check`; with `data`, also reads every file block that has a data checksum and reports
/// each that does not match (`idxfs fsck --data`).
pub fn check_with(
    dev: &Arc<dyn BlockDevice>,
    hash: NameHash,
    data: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<Report> {
    let mut report = check_state(dev.as_ref(), hash, data, progress)?;
    if let Some(sb) = crate::fs::superblock_copies(dev.as_ref())?.0 {
        check_log(dev, &sb, hash, data, progress, &mut report);
    }
    Ok(report)
}

/// Checks the committed state of the image on `dev` (the trees the newest valid superblock
/// names), from the bytes up.
pub fn check_committed(
    dev: &dyn BlockDevice,
    hash: NameHash,
    progress: &mut dyn FnMut(u64),
) -> Result<Report> {
    check_state(dev, hash, false, progress)
}

fn check_state(
    dev: &dyn BlockDevice,
    hash: NameHash,
    verify_data: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<Report> {
    let mut report = Report::default();
    let (best, bad) = crate::fs::superblock_copies(dev)?;
    for (copy, e) in &bad {
        report.notes.push(format!("superblock copy {copy} unusable ({e}); the other copy is used and the next commit rewrites this one"));
    }
    let Some(sb) = best else {
        return Err(bad
            .into_iter()
            .next()
            .map(|(_, e)| Error::Corrupt(e))
            .unwrap_or(Error::Invalid("no superblock")));
    };
    report.generation = sb.generation.get();
    if sb.errors.get() > 0 {
        report.problem(format!(
            "superblock: {} metadata error(s) met at run time since the last repair (first at \
             {} s since the epoch); `idxfs fsck --repair` checks and clears this",
            sb.errors.get(),
            sb.first_error_time.get()
        ));
    }
    let mut c = Checker::new(dev, sb, hash, verify_data, report, progress);
    for b in 0..SUPER_COPIES {
        c.blocks.owners.insert(b, "superblock");
    }
    c.roots.parent(sb.fs_root.block.get());
    // The roots tree first: which clone the fs tree is, if any, decides whose blocks its
    // extents name (`roots`).
    if sb.roots_root.block.get() != 0 {
        c.walk(&sb.roots_root, TREE_ROOTS, "roots tree");
        c.active_clone();
    }
    c.walk(&sb.fs_root, TREE_FS, "fs tree");
    c.walk(&sb.space_root, TREE_SPACE, "space tree");
    if sb.roots_root.block.get() != 0 {
        c.check_snapshots();
    }
    c.cross_check();
    c.check_chunks();
    c.check_shared();
    c.check_features();
    c.check_space();
    Ok(c.report)
}

/// The fsync log's part of the report: how many whole batches it holds and, when there are
/// any, what an open that replays them would see, checked like the committed state.
fn check_log(
    dev: &Arc<dyn BlockDevice>,
    sb: &Superblock,
    hash: NameHash,
    data: bool,
    progress: &mut dyn FnMut(u64),
    report: &mut Report,
) {
    let head = sb.log_root.block.get();
    if head == 0 {
        report.notes.push("fsync log: none".into());
        return;
    }
    let chain = match crate::log::read_chain(
        dev.as_ref(),
        sb.uuid,
        sb.generation.get(),
        head,
        sb.total_blocks.get(),
    ) {
        Ok(c) => c,
        Err(e) => {
            report.problem(format!("fsync log: cannot be read: {e}"));
            return;
        }
    };
    if chain.batches.is_empty() {
        report
            .notes
            .push("fsync log: empty (nothing was fsynced after the last commit)".into());
        return;
    }
    let records: usize = chain.batches.iter().map(Vec::len).sum();
    report.notes.push(format!(
        "fsync log: {} batches ({records} bytes of records) in {} blocks; an open replays them; the state it would see was checked too (problems in it say \"after replay\")",
        chain.batches.len(),
        chain.blocks.len()
    ));
    // Replay through a copy-on-write view: what an open would do, without writing the image.
    let overlay: Arc<dyn BlockDevice> = Arc::new(idxfs_blockdev::OverlayDevice::new(dev.clone()));
    let opts = crate::OpenOptions {
        commit_interval: None,
        name_hash: hash,
        cache_bytes: 64 << 20,
        ..crate::OpenOptions::default()
    };
    let replayed = crate::Fs::open(overlay.clone(), opts).and_then(|fs| fs.close());
    if let Err(e) = replayed {
        report.problem(format!("fsync log: an open cannot replay it: {e}"));
        return;
    }
    match check_state(overlay.as_ref(), hash, data, progress) {
        Ok(after) => {
            for p in after.problems {
                report.problem(format!("after replay: {p}"));
            }
        }
        Err(e) => report.problem(format!("after replay: unreadable: {e}")),
    }
}

impl<'a> Checker<'a> {
    fn new(
        dev: &'a dyn BlockDevice,
        sb: Superblock,
        hash: NameHash,
        verify_data: bool,
        report: Report,
        progress: &'a mut dyn FnMut(u64),
    ) -> Checker<'a> {
        Checker {
            dev,
            sb,
            hash,
            report,
            blocks: Blocks::default(),
            inodes: BTreeMap::new(),
            names: Names::default(),
            xattrs: LongXattrs::default(),
            needs: Needs::default(),
            sums: SumCheck {
                verify: verify_data,
                extents_of: (0, Vec::new()),
            },
            sharing: Sharing::default(),
            roots: Default::default(),
            progress,
        }
    }

    fn claim(&mut self, start: u64, n: u64, what: &'static str) {
        for b in start..start + n {
            if let Some(prev) = self.blocks.owners.insert(b, what) {
                self.report.problem(format!(
                    "block {b} referenced twice: by {prev} and by {what}"
                ));
            }
        }
    }

    /// A file extent of generation `gen` names blocks [start, start + n): the first extent
    /// owns them as `claim` says, each further one adds to their count of naming extents
    /// (`Sharing::refs`). In a clone, blocks as old as its origin are its origin's: counted,
    /// not owned, and found owned or held at the end (`roots`).
    fn claim_data(&mut self, start: u64, n: u64, gen: u64) {
        if gen <= self.roots.floor {
            let whose = self.roots.active_name.clone();
            self.roots.borrowed.push((start, n, whose));
            for b in start..start + n {
                let named = self.roots.borrowed_named.entry(b).or_insert(0);
                *named += 1;
                if *named >= 2 {
                    self.sharing.refs.insert(b, *named);
                }
            }
            return;
        }
        for b in start..start + n {
            match self.blocks.owners.get(&b) {
                None => {
                    self.blocks.owners.insert(b, "file extent");
                }
                Some(&"file extent") => *self.sharing.refs.entry(b).or_insert(1) += 1,
                Some(prev) => self.report.problem(format!(
                    "block {b} referenced twice: by {prev} and by file extent"
                )),
            }
        }
    }

    /// Blocks several extents name agree with the `SharedBlocks` items: the items do not
    /// overlap, each names blocks exactly `refs` extents name, every block named more than
    /// once has one, and no preallocated or NOCOW extent's block is shared.
    fn check_shared(&mut self) {
        let mut items = std::mem::take(&mut self.sharing.items);
        items.sort_unstable();
        let mut covered: HashMap<u64, u64> = HashMap::new();
        let mut end = 0;
        for &(s, n, refs) in &items {
            if s < end {
                self.report.problem(format!(
                    "shared blocks at {s}: overlaps the item before (which ends at {end})"
                ));
            }
            end = end.max(s + n);
            let mut wrong = None;
            for b in s..s + n {
                covered.insert(b, refs);
                let have = match self.sharing.refs.get(&b) {
                    Some(&c) => c,
                    None => u64::from(
                        self.blocks.owners.get(&b) == Some(&"file extent")
                            || self.roots.borrowed_named.contains_key(&b),
                    ),
                };
                if have != refs && wrong.is_none() {
                    wrong = Some((b, have));
                }
            }
            if let Some((b, have)) = wrong {
                self.report.problem(format!(
                    "shared blocks at {s}+{n}: {refs} references, but block {b} is named by {have} extents"
                ));
            }
        }
        let mut missing: Vec<(u64, u64)> = self
            .sharing
            .refs
            .iter()
            .filter(|(b, _)| !covered.contains_key(b))
            .map(|(&b, &c)| (b, c))
            .collect();
        missing.sort_unstable();
        for (b, c) in missing.into_iter().take(100) {
            self.report.problem(format!(
                "block {b} is named by {c} extents, and no shared-blocks item counts them"
            ));
        }
        for (s, n, whose) in std::mem::take(&mut self.sharing.unshared) {
            if let Some(b) = (s..s + n).find(|b| self.sharing.refs.contains_key(b)) {
                self.report.problem(format!(
                    "{whose}: block {b} is shared, which only copy-on-write files' written blocks may be"
                ));
            }
        }
    }

    /// Reads and decodes the node a pointer leads to (`gen`, `owner`, `level`, `range` as
    /// the pointer says), counting it; None after reporting why it cannot be used.
    fn read_node(
        &mut self,
        block: u64,
        gen: u64,
        owner: u64,
        level: u8,
        range: KeyRange,
        name: &str,
    ) -> Option<Node> {
        let mut buf = vec![0u8; self.sb.node_size.get() as usize];
        // A damaged pointer may name a block past any device.
        let Some(at) = block.checked_mul(BLOCK_SIZE) else {
            self.report
                .problem(format!("{name} node {block}: past the largest offset"));
            return None;
        };
        if let Err(e) = self.dev.read_at(&mut buf, at) {
            self.report
                .problem(format!("{name} node {block}: read failed: {e}"));
            return None;
        }
        let exp = Expect {
            block,
            generation: gen,
            owner,
            level: Some(level),
            fsid: self.sb.uuid,
            total_blocks: self.sb.total_blocks.get(),
            range,
        };
        match Node::decode(&buf, &exp) {
            Ok(n) => {
                self.report.nodes += 1;
                if self.report.nodes.is_multiple_of(4096) {
                    (self.progress)(self.report.nodes);
                }
                Some(n)
            }
            Err(e) => {
                self.report.problem(format!("{name}: {e}"));
                None
            }
        }
    }

    fn walk(&mut self, root: &RootPtr, owner: u64, name: &'static str) {
        let bpn = self.sb.blocks_per_node();
        // (block, generation, level, low bound, high bound (exclusive, None = unbounded), parent key)
        let mut stack = vec![(
            root.block.get(),
            root.generation.get(),
            root.level.get() as u8,
            Key::MIN,
            None::<Key>,
            None::<Key>,
        )];
        while let Some((block, gen, level, lo, hi, pkey)) = stack.pop() {
            self.claim(block, bpn, name);
            // fsck checks the range below, naming each key out of place, and goes on
            // reading the node's subtree.
            let Some(node) = self.read_node(block, gen, owner, level, KeyRange::ANY, name) else {
                continue;
            };
            if let (Some(first), Some(pk)) = (node.keys.first(), pkey) {
                if *first != pk {
                    self.report.problem(format!(
                        "{name} node {block}: first key {first} differs from its parent's key {pk}"
                    ));
                }
            }
            if node.keys.is_empty() && !(level == 0 && pkey.is_none()) {
                self.report
                    .problem(format!("{name} node {block}: empty non-root node"));
            }
            for k in &node.keys {
                if *k < lo || hi.is_some_and(|h| *k >= h) {
                    self.report.problem(format!(
                        "{name} node {block}: key {k} outside its parent's range"
                    ));
                }
            }
            if node.is_leaf() {
                for (k, v) in node.keys.iter().zip(node.leaf_vals().iter()) {
                    self.report.items += 1;
                    match owner {
                        TREE_FS => self.fs_item(k, v),
                        TREE_ROOTS => self.roots_item(k, v),
                        _ => self.space_item(k, v),
                    }
                }
            } else {
                let n = node.keys.len();
                for i in (0..n).rev() {
                    let p = node.ptrs()[i];
                    if owner == TREE_FS {
                        self.roots.parent(p.block);
                    }
                    let chi = if i + 1 < n {
                        Some(node.keys[i + 1])
                    } else {
                        hi
                    };
                    stack.push((
                        p.block,
                        p.generation,
                        level - 1,
                        node.keys[i],
                        chi,
                        Some(node.keys[i]),
                    ));
                }
            }
        }
    }

    fn fs_item(&mut self, k: &Key, v: &[u8]) {
        let what = format!("item {k}");
        let total = self.sb.total_blocks.get();
        match k.item_type() {
            Some(ItemType::Inode) => match decode_inode(v, k.objectid) {
                Ok(it) => {
                    if k.offset != 0 {
                        self.report
                            .problem(format!("{what}: inode key offset must be 0"));
                    }
                    if k.objectid >= self.sb.next_ino.get() {
                        self.report.problem(format!(
                            "{what}: inode number not below next_ino {}",
                            self.sb.next_ino.get()
                        ));
                    }
                    let e = self.inodes.entry(k.objectid).or_default();
                    e.mode = it.mode.get();
                    e.nlink = it.nlink.get();
                    e.size = it.size.get();
                    e.alloc_bytes = it.alloc_bytes.get();
                    e.flags = it.flags.get();
                    self.report.inodes += 1;
                }
                Err(e) => self.report.problem(format!("{e}")),
            },
            Some(t @ (ItemType::DirHash | ItemType::DirIno)) => {
                match decode_dir_entries(v, &what) {
                    Ok(es) => {
                        if t == ItemType::DirIno && es.len() != 1 {
                            self.report.problem(format!(
                                "{what}: {} entries, an inode-order item holds exactly one",
                                es.len()
                            ));
                        }
                        for e in es {
                            let h = (self.hash)(&e.name);
                            // Inode order: the high bits are the child; the low 16 are its slot
                            // among that child's names in this directory (any free one).
                            let ok = match t {
                                ItemType::DirHash => k.offset == h,
                                _ => k.offset >> 16 == e.ino,
                            };
                            if !ok {
                                self.report.problem(format!(
                                    "{what}: entry {:?} -> {} is filed under the wrong key",
                                    String::from_utf8_lossy(&e.name),
                                    e.ino
                                ));
                            }
                            let list = if t == ItemType::DirHash {
                                &mut self.names.by_hash
                            } else {
                                &mut self.names.by_ino
                            };
                            list.push((k.objectid, e.ino, e.name.clone()));
                            if t == ItemType::DirHash {
                                self.report.dir_entries += 1;
                                let child = self.inodes.entry(e.ino).or_default();
                                child.seen_entries += 1;
                                // dtype is checked once both the entry and the inode are known.
                                self.names.dtypes.push((e.ino, e.dtype, k.objectid));
                            }
                        }
                    }
                    Err(e) => self.report.problem(format!("{e}")),
                }
            }
            Some(ItemType::InodeRef) => match decode_names(v, &what) {
                Ok(names) => {
                    for n in names {
                        self.names.refs.push((k.offset, k.objectid, n));
                    }
                }
                Err(e) => self.report.problem(format!("{e}")),
            },
            Some(ItemType::InodeExtRef) => {
                self.needs.incompat |= INCOMPAT_EXT_REF;
                match decode_ext_refs(v, &what) {
                    Ok(refs) => {
                        for r in refs {
                            if idxfs_format::hash::ext_ref_hash(r.parent, &r.name) != k.offset {
                                self.report.problem(format!(
                                    "{what}: reference {}/{:?} filed under the wrong hash",
                                    r.parent,
                                    String::from_utf8_lossy(&r.name)
                                ));
                            }
                            self.names.refs.push((r.parent, k.objectid, r.name));
                        }
                    }
                    Err(e) => self.report.problem(format!("{e}")),
                }
            }
            Some(ItemType::XattrChunk) => {
                self.needs.incompat |= INCOMPAT_XATTR_CHUNKS;
                self.xattrs.chunks.insert((k.objectid, k.offset), v.len());
            }
            Some(ItemType::Xattr) => match decode_xattrs(v, &what) {
                Ok(xs) => {
                    for x in xs {
                        if (self.hash)(&x.name) != k.offset {
                            self.report.problem(format!(
                                "{what}: xattr {:?} filed under the wrong hash",
                                String::from_utf8_lossy(&x.name)
                            ));
                        }
                        match x.value {
                            XattrValue::Chunked { len, base } => {
                                self.needs.incompat |= INCOMPAT_XATTR_CHUNKS;
                                self.xattrs.values.push((k.objectid, base, len, x.name));
                            }
                            XattrValue::Inline(v) => self.check_acl(k.objectid, &x.name, &v),
                        }
                    }
                }
                Err(e) => self.report.problem(format!("{e}")),
            },
            Some(ItemType::Extent) => match decode_extent(v, &what, total) {
                Ok((e, inline)) => {
                    let info = self.inodes.entry(k.objectid).or_default();
                    if k.offset < info.last_extent_end {
                        self.report.problem(format!(
                            "{what}: overlaps the previous extent (ends at {})",
                            info.last_extent_end
                        ));
                    }
                    let info = self.inodes.entry(k.objectid).or_default();
                    if e.kind == EXTENT_INLINE {
                        if info.mode & S_IFMT == S_IFLNK && inline.contains(&0) {
                            self.report.problem(format!(
                                "{what}: symlink target holds a NUL byte (readlink fails)"
                            ));
                        }
                        let info = self.inodes.entry(k.objectid).or_default();
                        info.last_extent_end = k.offset + inline.len() as u64;
                        info.inline_len = Some(inline.len() as u64);
                        if k.offset != 0 {
                            self.report
                                .problem(format!("{what}: inline extent not at offset 0"));
                        }
                    } else {
                        let n = e.blocks.get();
                        let (d, gb) = (e.disk_block.get(), self.sb.group_blocks.get());
                        if d / gb != (d + n - 1) / gb {
                            self.report.problem(format!(
                                "{what}: blocks {d}+{n} cross a block group boundary (every allocation lies in one group)"
                            ));
                        }
                        let info = self.inodes.entry(k.objectid).or_default();
                        info.last_extent_end =
                            k.offset.saturating_add(n.saturating_mul(BLOCK_SIZE));
                        info.has_block_extent = true;
                        if e.kind == EXTENT_REGULAR {
                            info.last_data_end = info.last_extent_end;
                        }
                        info.extent_blocks += n;
                        if e.kind == EXTENT_REGULAR {
                            if self.sums.extents_of.0 != k.objectid {
                                self.sums.extents_of = (k.objectid, Vec::new());
                            }
                            self.sums.extents_of.1.push((k.offset / BLOCK_SIZE, n, d));
                        }
                        if !k.offset.is_multiple_of(BLOCK_SIZE) {
                            self.report
                                .problem(format!("{what}: regular extent at unaligned offset"));
                        }
                        let nocow = info.flags & NOCOW_FL != 0;
                        if e.kind != EXTENT_REGULAR || nocow {
                            self.sharing.unshared.push((
                                d,
                                n,
                                format!(
                                    "{what} ({})",
                                    if nocow { "NOCOW" } else { "preallocated" }
                                ),
                            ));
                        }
                        self.claim_data(d, n, e.generation.get());
                    }
                }
                Err(e) => self.report.problem(format!("{e}")),
            },
            Some(ItemType::DataSum) => match BlockSums::decode(v, &what) {
                Ok(sums) => {
                    self.needs.compat_ro |= COMPAT_RO_DATA_SUMS;
                    self.data_sums(k, &sums);
                }
                Err(e) => self.report.problem(format!("{e}")),
            },
            Some(ItemType::Orphan) if k.objectid == ORPHAN_OBJECTID => {
                match decode_orphan(v, k.offset) {
                    Ok(kind) => {
                        if kind == OrphanKind::Trim {
                            self.needs.incompat |= INCOMPAT_ORPHAN_TRIM;
                        }
                        self.inodes.entry(k.offset).or_default().orphan = Some(kind);
                    }
                    Err(e) => self.report.problem(format!("{e}")),
                }
            }
            Some(ItemType::SharedBlocks) if k.objectid == SHARED_OBJECTID => {
                match decode_shared(v, k.offset, total) {
                    Ok(it) => {
                        self.needs.incompat |= INCOMPAT_SHARED_BLOCKS;
                        self.sharing
                            .items
                            .push((k.offset, it.blocks.get(), it.refs.get()));
                    }
                    Err(e) => self.report.problem(format!("{e}")),
                }
            }
            _ => self
                .report
                .problem(format!("{what}: item type not allowed in the fs tree")),
        }
    }

    fn space_item(&mut self, k: &Key, v: &[u8]) {
        let gb = self.sb.group_blocks.get();
        let total = self.sb.total_blocks.get();
        let len = if k.objectid < total {
            gb.min(total - k.objectid)
        } else {
            0
        };
        match k.item_type() {
            Some(ItemType::BlockGroup) => {
                if let Err(e) = decode_block_group(v, k.objectid, len) {
                    self.report.problem(format!("{e}"));
                }
            }
            Some(ItemType::FreeSpaceBitmap) => {
                self.blocks.bitmaps.push((k.objectid, k.offset, v.to_vec()))
            }
            _ => self.report.problem(format!(
                "space item {k}: type not allowed in the space tree"
            )),
        }
        if !k.objectid.is_multiple_of(gb) || k.offset != len {
            self.report.problem(format!(
                "space item {k}: not a block group boundary (groups are {gb} blocks)"
            ));
        }
    }

    fn cross_check(&mut self) {
        let name = |n: &[u8]| String::from_utf8_lossy(n).into_owned();
        let mut by_hash = std::mem::take(&mut self.names.by_hash);
        let mut by_ino = std::mem::take(&mut self.names.by_ino);
        let mut refs = std::mem::take(&mut self.names.refs);
        by_hash.sort_unstable();
        by_ino.sort_unstable();
        refs.sort_unstable();
        for (a, an, b, bn) in [
            (&by_hash, "name-hash index", &by_ino, "inode-order index"),
            (&by_hash, "name-hash index", &refs, "back references"),
        ] {
            let (mut i, mut j) = (0, 0);
            while i < a.len() || j < b.len() {
                match (a.get(i), b.get(j)) {
                    (Some(x), Some(y)) if x == y => {
                        i += 1;
                        j += 1;
                    }
                    (Some(x), y) if y.is_none_or(|y| x < y) => {
                        self.report.problem(format!(
                            "directory {} entry {:?} -> {} is in the {an} but not in the {bn}",
                            x.0,
                            name(&x.2),
                            x.1
                        ));
                        i += 1;
                    }
                    (_, Some(y)) => {
                        self.report.problem(format!(
                            "directory {} entry {:?} -> {} is in the {bn} but not in the {an}",
                            y.0,
                            name(&y.2),
                            y.1
                        ));
                        j += 1;
                    }
                    _ => break,
                }
            }
        }
        // Entry counts per directory and subdirectory counts.
        let mut entries: HashMap<u64, u64> = HashMap::new();
        for (dir, child, _) in &by_hash {
            *entries.entry(*dir).or_default() += 1;
            if self
                .inodes
                .get(child)
                .is_some_and(|c| c.mode & S_IFMT == S_IFDIR)
            {
                if let Some(d) = self.inodes.get_mut(dir) {
                    d.subdirs += 1;
                }
            }
        }
        for (child, dtype, dir) in std::mem::take(&mut self.names.dtypes) {
            match self.inodes.get(&child) {
                Some(c) if c.mode != 0 => {
                    if dtype_of_mode(c.mode) != dtype {
                        self.report.problem(format!(
                            "directory {dir} entry -> {child}: type {dtype} but the inode is {:#o}",
                            c.mode & S_IFMT
                        ));
                    }
                }
                _ => self.report.problem(format!(
                    "directory {dir} has an entry for inode {child}, which does not exist"
                )),
            }
        }
        let mut count = 0u64;
        for (ino, i) in &self.inodes {
            if i.mode == 0 {
                if i.extent_blocks > 0 || i.last_extent_end > 0 {
                    self.report
                        .problems
                        .push(format!("inode {ino}: extents but no inode item"));
                }
                if i.orphan.is_some() {
                    self.report
                        .problems
                        .push(format!("orphan item for inode {ino}, which does not exist"));
                }
                continue;
            }
            count += 1;
            let is_dir = i.mode & S_IFMT == S_IFDIR;
            extent_problems(*ino, i, &mut self.report.problems);
            if i.orphan == Some(OrphanKind::Trim) && i.nlink == 0 {
                self.report.problems.push(format!(
                    "inode {ino}: trim orphan item but link count 0 (expect a free orphan)"
                ));
            }
            if i.orphan == Some(OrphanKind::Free) || i.nlink == 0 {
                // Unlinked while held: no names, no links, and an orphan item to free it.
                if i.orphan.is_none() {
                    self.report.problems.push(format!(
                        "inode {ino}: link count 0 but no orphan item (it would leak)"
                    ));
                } else if i.nlink != 0 || i.seen_entries != 0 {
                    self.report.problems.push(format!(
                        "inode {ino}: orphan item but link count {} and {} names, expect 0 and 0",
                        i.nlink, i.seen_entries
                    ));
                }
                if is_dir && i.size != 0 {
                    self.report
                        .problems
                        .push(format!("orphan directory {ino}: size {}, expect 0", i.size));
                }
                if !is_dir && i.alloc_bytes != i.extent_blocks.saturating_mul(BLOCK_SIZE) {
                    self.report.problems.push(format!(
                        "inode {ino}: allocated bytes {}, expect {} (sum of extents)",
                        i.alloc_bytes,
                        i.extent_blocks.saturating_mul(BLOCK_SIZE)
                    ));
                }
                continue;
            }
            if is_dir {
                let want_links = if *ino == ROOT_INO { 0 } else { 1 };
                if i.seen_entries != want_links {
                    self.report.problems.push(format!(
                        "directory {ino}: {} names, expect {want_links}",
                        i.seen_entries
                    ));
                }
                if i.nlink != 2 + i.subdirs {
                    self.report.problems.push(format!(
                        "directory {ino}: link count {}, expect {} (2 + subdirectories)",
                        i.nlink,
                        2 + i.subdirs
                    ));
                }
                let n = entries.get(ino).copied().unwrap_or(0);
                if i.size != n {
                    self.report.problems.push(format!(
                        "directory {ino}: size {}, expect {n} (entries)",
                        i.size
                    ));
                }
            } else {
                if i.nlink != i.seen_entries {
                    self.report.problems.push(format!(
                        "inode {ino}: link count {}, expect {} (names found)",
                        i.nlink, i.seen_entries
                    ));
                }
                if i.alloc_bytes != i.extent_blocks.saturating_mul(BLOCK_SIZE) {
                    self.report.problems.push(format!(
                        "inode {ino}: allocated bytes {}, expect {} (sum of extents)",
                        i.alloc_bytes,
                        i.extent_blocks.saturating_mul(BLOCK_SIZE)
                    ));
                }
            }
        }
        if count != self.sb.inode_count.get() {
            self.report.problem(format!(
                "superblock inode count {}, expect {count} (inode items)",
                self.sb.inode_count.get()
            ));
        }
        if self
            .inodes
            .get(&ROOT_INO)
            .is_none_or(|r| r.mode & S_IFMT != S_IFDIR)
        {
            self.report
                .problem("root inode missing or not a directory".into());
        }
    }

    /// An ACL xattr (`fs::acl`; a long one is not read here) is a valid ACL; an access ACL
    /// says more than the mode and agrees with its permission bits; a default ACL is a
    /// directory's. The inode item came first (its key sorts before its xattrs).
    fn check_acl(&mut self, ino: u64, name: &[u8], value: &[u8]) {
        if !acl::is_acl(name) {
            return;
        }
        let mode = self.inodes.get(&ino).map_or(0, |i| i.mode);
        let what = format!("inode {ino} {}", String::from_utf8_lossy(name));
        let a = match Acl::parse(value) {
            Ok(a) => a,
            Err(why) => return self.report.problem(format!("{what}: {why}")),
        };
        if name == acl::DEFAULT {
            if mode & S_IFMT != S_IFDIR {
                self.report
                    .problem(format!("{what}: a default ACL on mode {mode:o}"));
            }
        } else if a.is_mode() {
            self.report
                .problem(format!("{what}: stored although the mode says it all"));
        } else if a.mode_bits() != mode & 0o777 {
            self.report.problem(format!(
                "{what}: gives {:o}, the mode {:o}",
                a.mode_bits(),
                mode & 0o777
            ));
        }
    }

    /// Every long xattr value has its chunks, consecutive from its base, adding up to its
    /// length; every chunk belongs to one value.
    fn check_chunks(&mut self) {
        let mut claimed: BTreeMap<(u64, u64), ()> = BTreeMap::new();
        for (ino, base, len, name) in std::mem::take(&mut self.xattrs.values) {
            let mut total = 0usize;
            let mut at = base;
            while total < len as usize {
                match self.xattrs.chunks.get(&(ino, at)) {
                    Some(&n) if n > 0 => {
                        if claimed.insert((ino, at), ()).is_some() {
                            self.report.problem(format!(
                                "xattr chunk {at:#x} of inode {ino} belongs to two values"
                            ));
                        }
                        total += n;
                        at += 1;
                    }
                    _ => break,
                }
            }
            if total != len as usize {
                self.report.problem(format!(
                    "inode {ino} xattr {:?}: {total} bytes in its chunks from {base:#x}, expect {len}",
                    String::from_utf8_lossy(&name)
                ));
            }
        }
        for (ino, at) in self.xattrs.chunks.keys() {
            if !claimed.contains_key(&(*ino, *at)) {
                self.report.problem(format!(
                    "xattr chunk {at:#x} of inode {ino} belongs to no value"
                ));
            }
        }
    }

    /// The superblock carries every incompat bit the items need.
    fn check_features(&mut self) {
        let missing = self.needs.incompat & !self.sb.incompat.get();
        if missing != 0 {
            self.report.problem(format!(
                "superblock incompat features {:#x} lack {missing:#x}, which items of the fs tree need",
                self.sb.incompat.get()
            ));
        }
        let missing = self.needs.compat_ro & !self.sb.compat_ro.get();
        if missing != 0 {
            self.report.problem(format!(
                "superblock compat_ro features {:#x} lack {missing:#x}, which items of the fs tree need",
                self.sb.compat_ro.get()
            ));
        }
    }

    /// A `DataSum` item names only blocks of its inode's regular extents (which the walk
    /// passed just before it, in key order), of a regular file that is not NOCOW; with
    /// `SumCheck::verify`, each such block is read and must match.
    fn data_sums(&mut self, k: &Key, sums: &BlockSums) {
        let ino = k.objectid;
        let info = self.inodes.entry(ino).or_default();
        if info.mode & S_IFMT != S_IFREG || info.flags & NOCOW_FL != 0 {
            self.report.problem(format!(
                "data sums {k}: inode {ino} is not a copy-on-write regular file (mode {:o}, flags {:#x})",
                info.mode, info.flags
            ));
            return;
        }
        let Some(first) = k.offset.checked_mul(SUM_GROUP_BLOCKS) else {
            self.report
                .problem(format!("data sums {k}: group past any file block"));
            return;
        };
        let exts = if self.sums.extents_of.0 == ino {
            std::mem::take(&mut self.sums.extents_of.1)
        } else {
            Vec::new()
        };
        let mut block = vec![0u8; BLOCK_SIZE as usize];
        for (i, want) in sums.sums.iter().enumerate() {
            let Some(want) = *want else { continue };
            let b = first + i as u64;
            let disk = exts
                .iter()
                .find(|(f, n, _)| (*f..f + n).contains(&b))
                .map(|(f, _, d)| d + (b - f));
            let Some(disk) = disk else {
                self.report.problem(format!(
                    "data sums {k}: a sum for block {b} of inode {ino}, which no regular extent holds"
                ));
                continue;
            };
            if !self.sums.verify {
                continue;
            }
            if let Err(e) = self.dev.read_at(&mut block, disk * BLOCK_SIZE) {
                self.report.problem(format!(
                    "inode {ino} block {b} (device block {disk}): read failed: {e}"
                ));
                continue;
            }
            let have = block_sum(&block);
            if have != want {
                self.report.problem(format!(
                    "inode {ino} block {b} (device block {disk}): data checksum mismatch (crc32c {have:08x}, expected {want:08x}): its bytes are damaged and a read gives EIO"
                ));
            }
        }
        if self.sums.extents_of.0 == ino {
            self.sums.extents_of.1 = exts;
        }
    }

    fn check_space(&mut self) {
        let total = self.sb.total_blocks.get();
        let gb = self.sb.group_blocks.get();
        let ngroups = total.div_ceil(gb);
        let mut used_total = 0u64;
        let mut seen = vec![false; ngroups as usize];
        for (start, len, bits) in std::mem::take(&mut self.blocks.bitmaps) {
            let gi = (start / gb) as usize;
            if gi >= seen.len() || bits.len() as u64 != len.div_ceil(8) {
                self.report.problem(format!(
                    "free-space bitmap {start}: {} bytes, expect {}",
                    bits.len(),
                    len.div_ceil(8)
                ));
                continue;
            }
            seen[gi] = true;
            for i in 0..len {
                let used = bits[(i / 8) as usize] >> (i % 8) & 1 == 1;
                let b = start + i;
                let referenced = self.blocks.owners.contains_key(&b);
                if used {
                    used_total += 1;
                }
                match (used, referenced) {
                    (true, false) => self.report.problem(format!(
                        "block {b} is marked used but nothing references it (leak)"
                    )),
                    (false, true) => self.report.problem(format!(
                        "block {b} is referenced by {} but marked free",
                        self.blocks.owners[&b]
                    )),
                    _ => {}
                }
            }
        }
        for (gi, s) in seen.iter().enumerate() {
            if !s {
                self.report.problem(format!(
                    "block group {} has no free-space bitmap",
                    gi as u64 * gb
                ));
            }
        }
        if used_total != self.sb.used_blocks.get() {
            self.report.problem(format!(
                "superblock used blocks {}, expect {used_total} (bitmaps)",
                self.sb.used_blocks.get()
            ));
        }
        self.report.used_blocks = used_total;
    }
}

/// Where a file's data may be: no written extent past the block holding its last byte
/// (unless a trim orphan says those are still being freed), inline data only alone and
/// within the size, and a symlink's target of 1..=4095 bytes, inline or in one block.
fn extent_problems(ino: u64, i: &InodeInfo, problems: &mut Vec<String>) {
    let size_blocks_end = i.size.div_ceil(BLOCK_SIZE).saturating_mul(BLOCK_SIZE);
    let trimming = i.orphan.is_some();
    if i.mode & S_IFMT != S_IFDIR && !trimming && i.last_data_end > size_blocks_end {
        problems.push(format!(
            "inode {ino}: data extents end at {}, past its size {} (stale data would show if it grew)",
            i.last_data_end, i.size
        ));
    }
    if let Some(len) = i.inline_len {
        if i.has_block_extent {
            problems.push(format!("inode {ino}: inline data beside block extents"));
        }
        if len > i.size {
            problems.push(format!(
                "inode {ino}: {len} bytes of inline data, more than its size {}",
                i.size
            ));
        }
    }
    if i.mode & S_IFMT == S_IFLNK {
        let ok_size = (1..=SYMLINK_MAX as u64).contains(&i.size);
        let ok_data = match i.inline_len {
            Some(len) => len == i.size,
            None => i.extent_blocks == 1,
        };
        if !ok_size || !ok_data {
            problems.push(format!(
                "symlink {ino}: size {} with {} bytes inline and {} blocks, expect 1..={SYMLINK_MAX} bytes, inline or in one block",
                i.size,
                i.inline_len.unwrap_or(0),
                i.extent_blocks
            ));
        }
    }
}
