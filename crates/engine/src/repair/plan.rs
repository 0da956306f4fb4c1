//! The second step of a repair: from the salvaged items, a set that keeps every invariant fsck
//! checks, saving what idxfs's redundancy allows and dropping what cannot be saved.
//!
//! - **Names** are known three times: the name-hash index, the inode-order index and the
//!   child's back references (`InodeRef`, `InodeExtRef`). A name found in any one of them,
//!   from a directory that exists to an inode that exists, is kept, and the rebuild files it
//!   in all three again; so a lost leaf of either index, or of the back references, loses no
//!   name. When the sources disagree on where a name leads, the name-hash index wins, then
//!   the inode-order index, then the back references.
//! - **Directories** keep one name (the first by that order); a directory no longer reachable
//!   from the root (its name or a parent's lost, or a cycle) goes into `lost+found` as
//!   `#INO`, with everything below it; so does any other inode left with no name.
//! - **Inodes** whose item is lost are gone, with their names, data and xattrs; an inode
//!   with a free orphan item and no links was being deleted and is freed.
//! - **Data**: an extent whose blocks another extent claimed first gets a copy of them (the
//!   rebuild writes it), which is also what becomes of blocks files shared (a copy that
//!   shared, `fs/shared.rs`): the rebuilt image shares nothing, and has no shared-block
//!   items; one that overlaps another in its file, crosses a block group, or
//!   (inline) is not alone at offset 0, is dropped; written blocks past the
//!   block holding the last byte are cut off, as the truncate that left them meant; a
//!   symlink without its whole target is dropped. Extents lost with a leaf read as holes:
//!   the report names the inodes that had extents in a lost range.
//! - **Data sums** are kept for the blocks of kept regular extents that match them, and go
//!   with the rest.
//! - **Counts** follow what is kept: link counts, directory sizes, allocated bytes.
//! - **xattrs** whose record is filed under the wrong hash, or whose long value lacks a
//!   piece, are dropped; pieces no value claims are dropped. A POSIX ACL (`fs::acl`) that
//!   does not decode, a default ACL of a non-directory, and an access ACL the mode says all
//!   of are dropped; an access ACL whose permissions disagree with the mode takes the mode's,
//!   as a chmod leaves it (the mode is in the inode item, checked whole; the ACL may be
//!   what was damaged).
use crate::fs::acl::{self, Acl};
use crate::fs::NameHash;
use crate::space::bitmap::Bitmap;
use idxfs_format::items::{
    block_sum, decode_dir_entries, decode_ext_refs, decode_extent, decode_inode, decode_names,
    decode_orphan, decode_xattrs, encode_xattrs, BlockSums, ExtentItem, InodeItem, OrphanKind,
    Timespec, XattrEntry, XattrValue, EXTENT_INLINE, EXTENT_ITEM_SIZE, EXTENT_REGULAR,
    SUM_GROUP_BLOCKS, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG,
};
use idxfs_format::node::KeyRange;
use idxfs_format::superblock::Superblock;
use idxfs_format::versions::{COMPAT_RO_DATA_SUMS, INCOMPAT_ORPHAN_TRIM, INCOMPAT_XATTR_CHUNKS};
use idxfs_format::{
    ItemType, Key, BLOCK_SIZE, MAX_INO, NAME_MAX, ORPHAN_OBJECTID, ROOT_INO, SYMLINK_MAX,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use zerocopy::{FromBytes, IntoBytes};

/// Lines of `actions` at most: a badly damaged image should not print millions.
const ACTIONS_MAX: usize = 10_000;

/// A consistent set of items to rebuild the fs tree from.
#[derive(Default)]
pub(crate) struct Plan {
    /// Every inode kept, with its counts (link count, size of a directory, allocated bytes)
    /// as the kept items make them.
    pub inodes: BTreeMap<u64, InodeItem>,
    /// Extents, xattrs, xattr pieces and orphan items kept, as they are to be written.
    pub items: BTreeMap<Key, Vec<u8>>,
    /// Every name kept: (directory, child, name), each directory reachable from the root.
    pub entries: Vec<(u64, u64, Vec<u8>)>,
    /// Blocks the kept extents own: (start, length).
    pub data: Vec<(u64, u64)>,
    /// Extents whose blocks an earlier extent claimed too, to get a copy of those blocks of
    /// their own (as e2fsck clones duplicate blocks): both files keep the bytes, whichever
    /// of the two was damaged. The item in `items` still names the shared blocks.
    pub clones: Vec<Key>,
    /// Incompat bits the kept items need.
    pub needs: u64,
    /// Read-only-compat bits the kept items need.
    pub needs_ro: u64,
    /// The next inode number to hand out.
    pub next_ino: u64,
    /// What was changed or dropped, one line each.
    pub actions: Vec<String>,
    /// Lines of `actions` left out past `ACTIONS_MAX`.
    pub actions_left_out: u64,
}

impl Plan {
    pub(super) fn act(&mut self, s: String) {
        if self.actions.len() < ACTIONS_MAX {
            self.actions.push(s);
        } else {
            self.actions_left_out += 1;
        }
    }
}

/// Where a name came from, best first (see the module notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Source {
    NameIndex,
    InodeIndex,
    BackRef,
}

fn valid_name(n: &[u8]) -> bool {
    !n.is_empty()
        && n.len() <= NAME_MAX
        && n != b"."
        && n != b".."
        && !n.contains(&b'/')
        && !n.contains(&0)
}

fn is_dir(it: &InodeItem) -> bool {
    it.mode.get() & S_IFMT == S_IFDIR
}

/// Builds the plan from the salvaged fs-tree items. `now` stamps what the repair creates
/// (a root or lost+found that was missing); `lost` are the key ranges no leaf could be read
/// for; `block` reads a data block (a symlink's target).
pub(crate) fn plan(
    items: BTreeMap<Key, Vec<u8>>,
    sb: &Superblock,
    hash: NameHash,
    now: Timespec,
    lost: &[KeyRange],
    block: &dyn Fn(u64) -> Option<Vec<u8>>,
) -> Plan {
    let mut p = Plan::default();
    let total = sb.total_blocks.get();
    let mut dropped: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut drop = |what: &'static str| *dropped.entry(what).or_default() += 1;
    let mut inodes: BTreeMap<u64, InodeItem> = BTreeMap::new();
    let mut orphans: BTreeMap<u64, OrphanKind> = BTreeMap::new();
    let mut extents: BTreeMap<u64, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
    let mut sums: BTreeMap<u64, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
    let mut xattrs: BTreeMap<u64, Vec<(Key, Vec<u8>)>> = BTreeMap::new();
    let mut chunks: BTreeMap<(u64, u64), Vec<u8>> = BTreeMap::new();
    let mut names: BTreeMap<(u64, Vec<u8>), (u64, Source)> = BTreeMap::new();
    let mut conflicts = 0u64;
    let mut note = |dir: u64, name: Vec<u8>, child: u64, src: Source| {
        if !valid_name(&name) {
            return false;
        }
        match names.get(&(dir, name.clone())) {
            Some(&(c, s)) if c == child => {
                if src < s {
                    names.insert((dir, name), (child, src));
                }
            }
            Some(&(_, s)) => {
                conflicts += 1;
                if src < s {
                    names.insert((dir, name), (child, src));
                }
            }
            None => {
                names.insert((dir, name), (child, src));
            }
        }
        true
    };
    for (k, v) in items {
        let what = format!("item {k}");
        match k.item_type() {
            Some(ItemType::Inode)
                if k.offset == 0 && (ROOT_INO..=MAX_INO).contains(&k.objectid) =>
            {
                match decode_inode(&v, k.objectid) {
                    Ok(it) => {
                        inodes.insert(k.objectid, it);
                    }
                    Err(_) => drop("inode items that do not decode"),
                }
            }
            Some(t @ (ItemType::DirHash | ItemType::DirIno)) => {
                let src = if t == ItemType::DirHash {
                    Source::NameIndex
                } else {
                    Source::InodeIndex
                };
                match decode_dir_entries(&v, &what) {
                    Ok(es) => {
                        for e in es {
                            if !note(k.objectid, e.name, e.ino, src) {
                                drop("directory entries with invalid names");
                            }
                        }
                    }
                    Err(_) => drop("directory index items that do not decode"),
                }
            }
            Some(ItemType::InodeRef) => match decode_names(&v, &what) {
                Ok(ns) => {
                    for n in ns {
                        if !note(k.offset, n, k.objectid, Source::BackRef) {
                            drop("back references with invalid names");
                        }
                    }
                }
                Err(_) => drop("back reference items that do not decode"),
            },
            Some(ItemType::InodeExtRef) => match decode_ext_refs(&v, &what) {
                Ok(rs) => {
                    for r in rs {
                        if !note(r.parent, r.name, k.objectid, Source::BackRef) {
                            drop("back references with invalid names");
                        }
                    }
                }
                Err(_) => drop("back reference items that do not decode"),
            },
            Some(ItemType::Extent) => extents.entry(k.objectid).or_default().push((k.offset, v)),
            Some(ItemType::DataSum) => sums.entry(k.objectid).or_default().push((k.offset, v)),
            Some(ItemType::Xattr) => xattrs.entry(k.objectid).or_default().push((k, v)),
            Some(ItemType::XattrChunk) => {
                chunks.insert((k.objectid, k.offset), v);
            }
            Some(ItemType::Orphan) if k.objectid == ORPHAN_OBJECTID => {
                match decode_orphan(&v, k.offset) {
                    Ok(kind) => {
                        orphans.insert(k.offset, kind);
                    }
                    Err(_) => drop("orphan items that do not decode"),
                }
            }
            // Rebuilt images share no block (module docs): the counts go with the sharing.
            Some(ItemType::SharedBlocks) if k.objectid == idxfs_format::SHARED_OBJECTID => {}
            _ => drop("items of a type the fs tree does not hold"),
        }
    }
    if conflicts > 0 {
        p.act(format!(
            "{conflicts} names led to different inodes in different indexes: kept the name-hash \
             index's, else the inode-order index's"
        ));
    }

    // Inode numbers are never handed out twice, also not those of inodes dropped here.
    let next = inodes.keys().next_back().map_or(ROOT_INO, |i| *i) + 1;
    p.next_ino = sb.next_ino.get().max(next);

    // The root.
    if !inodes.get(&ROOT_INO).is_some_and(is_dir) {
        p.act("root directory lost: made a new, empty one (mode 0755, owner root)".into());
        inodes.insert(ROOT_INO, new_dir(now, 0o755));
    }

    // Inodes being deleted.
    for (&ino, &kind) in &orphans {
        match (inodes.get(&ino), kind) {
            (Some(it), OrphanKind::Free) if it.nlink.get() == 0 && ino != ROOT_INO => {
                inodes.remove(&ino);
                p.act(format!("inode {ino}: was being deleted (orphan): freed"));
            }
            (Some(it), OrphanKind::Trim) if it.mode.get() & S_IFMT == S_IFREG => {
                p.items.insert(orphan_key(ino), kind.encode());
                p.needs |= INCOMPAT_ORPHAN_TRIM;
            }
            _ => drop("orphan items that name no inode being deleted or trimmed"),
        }
    }
    // An inode that lost its item takes its extents, xattrs and names with it.
    let trimming = |ino: u64| orphans.get(&ino) == Some(&OrphanKind::Trim);

    // Data.
    let mut claimed = Bitmap::new(total);
    for (ino, list) in extents {
        let Some(it) = inodes.get(&ino).copied() else {
            drop("extents of inodes that are gone");
            continue;
        };
        let fmt = it.mode.get() & S_IFMT;
        if fmt != S_IFREG && fmt != S_IFLNK {
            drop("extents of inodes that hold no data");
            continue;
        }
        let kept = keep_extents(&mut p, &mut claimed, sb, ino, &it, trimming(ino), list);
        let blocks: u64 = kept.iter().map(|k| k.blocks).sum();
        let mut kept = kept;
        let mut inline = kept.iter().find(|k| k.inline).map(|k| k.len);
        if fmt == S_IFLNK {
            let mut size = it.size.get();
            // A target ends at the size and holds no NUL: one that does (a damaged size) is
            // cut at its first NUL, where the target written most likely ended.
            let target = match kept.first() {
                Some(k) if k.inline => k.value.get(EXTENT_ITEM_SIZE..).map(<[u8]>::to_vec),
                Some(k) => block(k.disk),
                None => None,
            };
            let end = target.map(|t| {
                let t = t.get(..size.min(t.len() as u64) as usize).unwrap_or(&[]);
                t.iter().position(|b| *b == 0).unwrap_or(t.len()) as u64
            });
            if let Some(end) = end.filter(|e| *e < size && *e > 0) {
                p.act(format!(
                    "symlink {ino}: target cut at its first NUL byte ({end} bytes)"
                ));
                size = end;
                if let Some(k) = kept.first_mut().filter(|k| k.inline) {
                    k.value.truncate(EXTENT_ITEM_SIZE + end as usize);
                    k.len = end;
                    inline = Some(end);
                }
                if let Some(i) = inodes.get_mut(&ino) {
                    i.size = end.into();
                }
            }
            let whole = end.is_some_and(|e| e > 0)
                && (1..=SYMLINK_MAX as u64).contains(&size)
                && match inline {
                    Some(len) => len == size && kept.len() == 1,
                    None => blocks == 1 && kept.len() == 1,
                };
            if !whole {
                p.act(format!("symlink {ino}: target lost: dropped"));
                inodes.remove(&ino);
                for k in kept.iter().filter(|k| !k.clone) {
                    if k.blocks > 0 {
                        claimed.set_range(k.disk, k.blocks, false);
                    }
                }
                continue;
            }
        }
        if let Some(i) = inodes.get_mut(&ino) {
            i.alloc_bytes = (blocks * BLOCK_SIZE).into();
        }
        if fmt == S_IFREG && it.flags.get() & crate::fs::NOCOW_FL == 0 {
            keep_sums(
                &mut p,
                ino,
                &kept,
                sums.remove(&ino).unwrap_or_default(),
                block,
            );
        }
        for k in kept {
            let key = Key::new(ino, ItemType::Extent, k.offset);
            if k.clone {
                p.clones.push(key);
            } else if k.blocks > 0 {
                p.data.push((k.disk, k.blocks));
            }
            p.items.insert(key, k.value);
        }
    }
    // A symlink with no extent at all, and the counts of inodes whose extents all went.
    let no_target: Vec<u64> = inodes
        .iter()
        .filter(|(ino, it)| {
            it.mode.get() & S_IFMT == S_IFLNK
                && !p.items.contains_key(&Key::new(**ino, ItemType::Extent, 0))
        })
        .map(|(ino, _)| *ino)
        .collect();
    for ino in no_target {
        p.act(format!("symlink {ino}: target lost: dropped"));
        inodes.remove(&ino);
    }
    for (ino, it) in inodes.iter_mut() {
        let fmt = it.mode.get() & S_IFMT;
        let has = p
            .items
            .range(Key::new(*ino, ItemType::Extent, 0)..=Key::new(*ino, ItemType::Extent, u64::MAX))
            .next()
            .is_some();
        // fsck counts allocated bytes of everything but directories.
        if fmt != S_IFDIR && !has {
            it.alloc_bytes = 0.into();
        }
        let lo = Key::new(*ino, ItemType::Extent, 0);
        let hi = Key::new(*ino, ItemType::Extent, u64::MAX);
        let touched = lost
            .iter()
            .any(|r| r.first.is_none_or(|f| f <= hi) && r.below.is_none_or(|b| b > lo));
        if fmt == S_IFREG && touched && it.size.get() > 0 {
            p.act(format!(
                "inode {ino}: some of its extents were in damaged metadata: those bytes now \
                 read as zeros"
            ));
        }
    }

    // xattrs.
    keep_xattrs(&mut p, &inodes, xattrs, chunks, hash, &mut drop);

    // Names, then reachability.
    let mut entries: BTreeMap<(u64, Vec<u8>), u64> = BTreeMap::new();
    let mut dir_parent: BTreeMap<u64, ((u64, Vec<u8>), Source)> = BTreeMap::new();
    for ((dir, name), (child, src)) in names {
        let ok = inodes.get(&dir).is_some_and(is_dir) && inodes.contains_key(&child);
        if !ok || child == ROOT_INO {
            drop("names in or of inodes that are gone");
            continue;
        }
        if inodes.get(&child).is_some_and(is_dir) {
            // One name per directory: the best source, then the first.
            match dir_parent.get(&child) {
                Some((_, s)) if *s <= src => {
                    p.act(format!(
                        "directory {child}: second name {:?} in {dir} dropped",
                        String::from_utf8_lossy(&name)
                    ));
                    continue;
                }
                Some((old, _)) => {
                    let old = old.clone();
                    entries.remove(&old);
                    p.act(format!(
                        "directory {child}: second name {:?} in {} dropped",
                        String::from_utf8_lossy(&old.1),
                        old.0
                    ));
                }
                None => {}
            }
            dir_parent.insert(child, ((dir, name.clone()), src));
        }
        entries.insert((dir, name), child);
    }
    attach_unreachable(&mut p, &mut inodes, &mut entries, now);

    // Counts.
    let mut links: BTreeMap<u64, u32> = BTreeMap::new();
    let mut size: BTreeMap<u64, u64> = BTreeMap::new();
    for ((dir, _), child) in &entries {
        *size.entry(*dir).or_default() += 1;
        if inodes.get(child).is_some_and(is_dir) {
            *links.entry(*dir).or_default() += 1;
        } else {
            *links.entry(*child).or_default() += 1;
        }
    }
    let mut recounted = 0u64;
    for (ino, it) in inodes.iter_mut() {
        let (nlink, sz) = if is_dir(it) {
            (
                2 + links.get(ino).copied().unwrap_or(0),
                size.get(ino).copied().unwrap_or(0),
            )
        } else {
            (links.get(ino).copied().unwrap_or(0), it.size.get())
        };
        if it.nlink.get() != nlink || it.size.get() != sz {
            recounted += 1;
        }
        it.nlink = nlink.into();
        it.size = sz.into();
    }
    if recounted > 0 {
        p.act(format!(
            "{recounted} inodes: link count or directory size set to what their names make"
        ));
    }
    for (what, n) in dropped {
        p.act(format!("dropped {n} {what}"));
    }
    p.entries = entries
        .into_iter()
        .map(|((dir, name), child)| (dir, child, name))
        .collect();
    // Inode order within each directory: the inode-order index fills by appending.
    p.entries.sort_by_key(|e| (e.0, e.1));
    p.inodes = inodes;
    p
}

fn orphan_key(ino: u64) -> Key {
    Key::new(ORPHAN_OBJECTID, ItemType::Orphan, ino)
}

fn new_dir(now: Timespec, perm: u32) -> InodeItem {
    let mut it = crate::fs::new_inode_item(S_IFDIR | perm, crate::fs::Owner::default(), 0, 1, now);
    it.nlink = 2.into();
    it
}

/// One extent kept.
struct Kept {
    offset: u64,
    value: Vec<u8>,
    inline: bool,
    /// Inline: its data's length. Else 0.
    len: u64,
    disk: u64,
    blocks: u64,
    /// Its blocks are another extent's too: it gets a copy (`Plan::clones`).
    clone: bool,
}

/// The data sums of `ino` that name blocks of its kept regular extents and match what those
/// blocks hold (a clone gets a copy of the same bytes, so they hold for it too). A sum that
/// does not match goes, with a line naming the block: damaged metadata (a resealed extent
/// that points elsewhere, a resealed sum) and damaged data look the same from here, and a
/// repaired image reads every block it kept (`idxfs fsck --data` before a repair tells data
/// damage apart). The rest go with their blocks.
fn keep_sums(
    p: &mut Plan,
    ino: u64,
    kept: &[Kept],
    list: Vec<(u64, Vec<u8>)>,
    block: &dyn Fn(u64) -> Option<Vec<u8>>,
) {
    let regular: Vec<(u64, u64, u64)> = kept
        .iter()
        .filter(|k| !k.inline && k.value.first() == Some(&EXTENT_REGULAR))
        .map(|k| (k.offset / BLOCK_SIZE, k.blocks, k.disk))
        .collect();
    let mut lost = 0u64;
    let mut wrong = Vec::new();
    for (g, v) in list {
        let Ok(mut s) = BlockSums::decode(&v, "") else {
            p.act(format!(
                "inode {ino}: data sums of group {g} do not decode: dropped (those blocks are read unchecked)"
            ));
            continue;
        };
        for (i, sum) in s.sums.iter_mut().enumerate() {
            let Some(want) = *sum else { continue };
            let b = g.saturating_mul(SUM_GROUP_BLOCKS).saturating_add(i as u64);
            let disk = regular
                .iter()
                .find(|(f, n, _)| (*f..f + n).contains(&b))
                .map(|(f, _, d)| d + (b - f));
            match disk {
                None => {
                    *sum = None;
                    lost += 1;
                }
                Some(d) if block(d).is_none_or(|data| block_sum(&data) != want) => {
                    *sum = None;
                    wrong.push(b);
                }
                Some(_) => {}
            }
        }
        if let Some(v) = s.encode() {
            p.needs_ro |= COMPAT_RO_DATA_SUMS;
            p.items.insert(Key::new(ino, ItemType::DataSum, g), v);
        }
    }
    if lost > 0 {
        p.act(format!(
            "inode {ino}: {lost} data sums named blocks no kept extent holds: dropped"
        ));
    }
    if !wrong.is_empty() {
        p.act(format!(
            "inode {ino}: blocks {wrong:?} do not match their data sums (damaged data, or an extent or sum damaged): their sums dropped, the bytes read as they are"
        ));
    }
}

/// The extents of `ino` (in file order) that may stay, claiming their blocks.
fn keep_extents(
    p: &mut Plan,
    claimed: &mut Bitmap,
    sb: &Superblock,
    ino: u64,
    it: &InodeItem,
    trimming: bool,
    list: Vec<(u64, Vec<u8>)>,
) -> Vec<Kept> {
    let total = sb.total_blocks.get();
    let gb = sb.group_blocks.get();
    let size = it.size.get();
    let limit = size.div_ceil(BLOCK_SIZE).saturating_mul(BLOCK_SIZE);
    let has_blocks = list
        .iter()
        .any(|(_, v)| decode_extent(v, "", total).is_ok_and(|(e, _)| e.kind != EXTENT_INLINE));
    let mut kept = Vec::new();
    let mut end = 0u64;
    for (offset, mut value) in list {
        let Ok((e, data)) = decode_extent(&value, "", total) else {
            p.act(format!(
                "inode {ino}: extent at {offset} does not decode: dropped"
            ));
            continue;
        };
        if offset < end {
            p.act(format!(
                "inode {ino}: extent at {offset} overlaps the one before: dropped"
            ));
            continue;
        }
        if e.kind == EXTENT_INLINE {
            if offset != 0 || has_blocks {
                p.act(format!(
                    "inode {ino}: inline data beside block extents: dropped"
                ));
                continue;
            }
            let len = (data.len() as u64).min(size);
            value.truncate(EXTENT_ITEM_SIZE + len as usize);
            end = len;
            kept.push(Kept {
                offset,
                value,
                inline: true,
                len,
                disk: 0,
                blocks: 0,
                clone: false,
            });
            continue;
        }
        let (disk, mut blocks) = (e.disk_block.get(), e.blocks.get());
        if !offset.is_multiple_of(BLOCK_SIZE) || disk / gb != (disk + blocks - 1) / gb {
            p.act(format!(
                "inode {ino}: extent at {offset} misplaced: dropped"
            ));
            continue;
        }
        if e.kind == EXTENT_REGULAR && !trimming {
            if offset >= limit {
                p.act(format!(
                    "inode {ino}: extent at {offset} lies past the size: dropped"
                ));
                continue;
            }
            let fit = (limit - offset) / BLOCK_SIZE;
            if blocks > fit {
                p.act(format!("inode {ino}: extent at {offset} cut to the size"));
                blocks = fit;
            }
        }
        let clone = (disk..disk + blocks).any(|b| claimed.get(b));
        if clone {
            p.act(format!(
                "inode {ino}: extent at {offset} shares blocks with another extent: given a \
                 copy of its own"
            ));
        } else {
            claimed.set_range(disk, blocks, true);
        }
        if blocks != e.blocks.get() {
            if let Ok(mut x) = ExtentItem::read_from_bytes(&value) {
                x.blocks = blocks.into();
                value = x.as_bytes().to_vec();
            }
        }
        end = offset + blocks * BLOCK_SIZE;
        kept.push(Kept {
            offset,
            value,
            inline: false,
            len: 0,
            disk,
            blocks,
            clone,
        });
    }
    kept
}

/// The xattr records and pieces that may stay.
fn keep_xattrs(
    p: &mut Plan,
    inodes: &BTreeMap<u64, InodeItem>,
    xattrs: BTreeMap<u64, Vec<(Key, Vec<u8>)>>,
    mut chunks: BTreeMap<(u64, u64), Vec<u8>>,
    hash: NameHash,
    drop: &mut impl FnMut(&'static str),
) {
    let mut pieces: BTreeSet<(u64, u64)> = BTreeSet::new();
    for (ino, list) in xattrs {
        if !inodes.contains_key(&ino) {
            drop("xattr items of inodes that are gone");
            continue;
        }
        for (k, v) in list {
            let Ok(xs) = decode_xattrs(&v, "") else {
                drop("xattr items that do not decode");
                continue;
            };
            let n = xs.len();
            let mut keep = Vec::new();
            for x in xs {
                if hash(&x.name) != k.offset {
                    continue;
                }
                if let XattrValue::Chunked { len, base } = x.value {
                    let mut got = 0usize;
                    let mut at = base;
                    let mut mine = Vec::new();
                    while got < len as usize {
                        match chunks.get(&(ino, at)) {
                            Some(c) if !c.is_empty() && !pieces.contains(&(ino, at)) => {
                                got += c.len();
                                mine.push(at);
                                at += 1;
                            }
                            _ => break,
                        }
                    }
                    if got != len as usize {
                        continue;
                    }
                    pieces.extend(mine.into_iter().map(|a| (ino, a)));
                    p.needs |= INCOMPAT_XATTR_CHUNKS;
                }
                let mode = inodes.get(&ino).map_or(0, |it| it.mode.get());
                if let Some(x) = checked_acl(p, ino, mode, x) {
                    keep.push(x);
                }
            }
            if keep.len() != n {
                p.act(format!(
                    "inode {ino}: {} xattrs filed under the wrong hash or missing pieces of \
                     their value: dropped",
                    n - keep.len()
                ));
            }
            if !keep.is_empty() {
                p.items.insert(k, encode_xattrs(&keep));
            }
        }
    }
    let all: Vec<(u64, u64)> = chunks.keys().copied().collect();
    for key in all {
        match chunks.remove(&key) {
            Some(v) if pieces.contains(&key) => {
                p.items
                    .insert(Key::new(key.0, ItemType::XattrChunk, key.1), v);
            }
            _ => drop("xattr value pieces no value claims"),
        }
    }
}

/// `x` as the rebuilt inode `ino` (of `mode`) keeps it: as it is unless it is an ACL fsck
/// would refuse (module notes); None when it goes. A long ACL (in chunks) is kept as it is,
/// as fsck does not read it.
fn checked_acl(p: &mut Plan, ino: u64, mode: u32, x: XattrEntry) -> Option<XattrEntry> {
    let XattrValue::Inline(v) = &x.value else {
        return Some(x);
    };
    if !acl::is_acl(&x.name) {
        return Some(x);
    }
    let what = format!("inode {ino}: {}", String::from_utf8_lossy(&x.name));
    let mut a = match Acl::parse(v.as_slice()) {
        Ok(a) => a,
        Err(why) => {
            p.act(format!("{what}: {why}: dropped"));
            return None;
        }
    };
    if x.name == acl::DEFAULT {
        if mode & S_IFMT != S_IFDIR {
            p.act(format!("{what}: a default ACL on a non-directory: dropped"));
            return None;
        }
        return Some(x);
    }
    if a.is_mode() {
        p.act(format!("{what}: says no more than the mode: dropped"));
        return None;
    }
    if a.mode_bits() != mode & 0o777 {
        p.act(format!(
            "{what}: gave {:o} where the mode gives {:o}: set to the mode's",
            a.mode_bits(),
            mode & 0o777
        ));
        a.chmod(mode);
        return Some(XattrEntry {
            name: x.name,
            value: XattrValue::Inline(a.encode()),
        });
    }
    Some(x)
}

/// Puts every directory the root cannot reach, and every other inode left without a name,
/// into lost+found as `#INO` (made when first needed).
fn attach_unreachable(
    p: &mut Plan,
    inodes: &mut BTreeMap<u64, InodeItem>,
    entries: &mut BTreeMap<(u64, Vec<u8>), u64>,
    now: Timespec,
) {
    let mut children: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut parent: BTreeMap<u64, (u64, Vec<u8>)> = BTreeMap::new();
    let mut named: BTreeSet<u64> = BTreeSet::new();
    for ((dir, name), child) in entries.iter() {
        children.entry(*dir).or_default().push(*child);
        named.insert(*child);
        if inodes.get(child).is_some_and(is_dir) {
            parent.insert(*child, (*dir, name.clone()));
        }
    }
    let dirs: BTreeSet<u64> = inodes
        .iter()
        .filter(|(_, it)| is_dir(it))
        .map(|(i, _)| *i)
        .collect();
    let mut reached: BTreeSet<u64> = BTreeSet::new();
    let reach = |from: u64, reached: &mut BTreeSet<u64>| {
        let mut q = VecDeque::from([from]);
        while let Some(d) = q.pop_front() {
            if !reached.insert(d) {
                continue;
            }
            for c in children.get(&d).into_iter().flatten() {
                if dirs.contains(c) {
                    q.push_back(*c);
                }
            }
        }
    };
    reach(ROOT_INO, &mut reached);
    let mut lost_found: Option<u64> = None;
    for &d in &dirs {
        if reached.contains(&d) {
            continue;
        }
        // Up to the top of its detached subtree (or round its cycle).
        let mut top = d;
        let mut seen = BTreeSet::from([d]);
        while let Some((up, _)) = parent.get(&top) {
            if !seen.insert(*up) {
                break;
            }
            top = *up;
        }
        if let Some(old) = parent.remove(&top) {
            entries.remove(&old);
        }
        let lf = lost_and_found(p, inodes, entries, &mut lost_found, &mut reached, now);
        link_found(p, entries, lf, top);
        reach(top, &mut reached);
    }
    let nameless: Vec<u64> = inodes
        .iter()
        .filter(|(i, it)| **i != ROOT_INO && !is_dir(it) && !named.contains(i))
        .map(|(i, _)| *i)
        .collect();
    for ino in nameless {
        let lf = lost_and_found(p, inodes, entries, &mut lost_found, &mut reached, now);
        link_found(p, entries, lf, ino);
    }
}

/// lost+found: the root's directory of that name, or a new one.
fn lost_and_found(
    p: &mut Plan,
    inodes: &mut BTreeMap<u64, InodeItem>,
    entries: &mut BTreeMap<(u64, Vec<u8>), u64>,
    found: &mut Option<u64>,
    reached: &mut BTreeSet<u64>,
    now: Timespec,
) -> u64 {
    if let Some(lf) = *found {
        return lf;
    }
    let name = b"lost+found".to_vec();
    let lf = match entries.get(&(ROOT_INO, name.clone())) {
        Some(c) if inodes.get(c).is_some_and(is_dir) => *c,
        taken => {
            let ino = p.next_ino;
            p.next_ino += 1;
            inodes.insert(ino, new_dir(now, 0o700));
            let name = if taken.is_some() {
                format!("lost+found.{ino}").into_bytes()
            } else {
                name
            };
            p.act(format!(
                "made /{} for what lost its place",
                String::from_utf8_lossy(&name)
            ));
            entries.insert((ROOT_INO, name), ino);
            reached.insert(ino);
            ino
        }
    };
    *found = Some(lf);
    lf
}

fn link_found(p: &mut Plan, entries: &mut BTreeMap<(u64, Vec<u8>), u64>, lf: u64, ino: u64) {
    let mut name = format!("#{ino}").into_bytes();
    let mut n = 1;
    while entries.contains_key(&(lf, name.clone())) {
        name = format!("#{ino}.{n}").into_bytes();
        n += 1;
    }
    p.act(format!(
        "inode {ino}: no name left in a reachable directory: now lost+found/{}",
        String::from_utf8_lossy(&name)
    ));
    entries.insert((lf, name), ino);
}

#[cfg(test)]
mod tests {
    use super::*;
    use idxfs_format::items::{encode_dir_entry, encode_names, DirEntry, S_IFREG};

    const DEV_BLOCKS: u64 = 4096;

    fn sb() -> Superblock {
        let mut sb = Superblock::read_from_bytes(&[0u8; idxfs_format::superblock::SUPERBLOCK_SIZE])
            .expect("zeroed superblock");
        sb.total_blocks = DEV_BLOCKS.into();
        sb.group_blocks = 1024.into();
        sb.next_ino = 2.into();
        sb
    }

    fn now() -> Timespec {
        Timespec {
            sec: 1.into(),
            nsec: 0.into(),
        }
    }

    fn inode(items: &mut BTreeMap<Key, Vec<u8>>, ino: u64, mode: u32, size: u64) {
        let mut it = crate::fs::new_inode_item(mode, Default::default(), 0, 1, now());
        it.size = size.into();
        items.insert(Key::new(ino, ItemType::Inode, 0), it.as_bytes().to_vec());
    }

    fn extent(items: &mut BTreeMap<Key, Vec<u8>>, ino: u64, off: u64, disk: u64, n: u64) {
        let e = ExtentItem {
            kind: EXTENT_REGULAR,
            reserved: [0; 7],
            generation: 1.into(),
            disk_block: disk.into(),
            blocks: n.into(),
        };
        items.insert(Key::new(ino, ItemType::Extent, off), e.as_bytes().to_vec());
    }

    fn name_in(items: &mut BTreeMap<Key, Vec<u8>>, dir: u64, child: u64, dtype: u8, name: &[u8]) {
        let mut v = Vec::new();
        encode_dir_entry(
            &mut v,
            &DirEntry {
                ino: child,
                dtype,
                name: name.to_vec(),
            },
        );
        let h = idxfs_format::hash::name_hash(name);
        items.insert(Key::new(dir, ItemType::DirHash, h), v);
    }

    fn run(items: BTreeMap<Key, Vec<u8>>) -> Plan {
        plan(
            items,
            &sb(),
            idxfs_format::hash::name_hash,
            now(),
            &[],
            &|_| None,
        )
    }

    fn names(p: &Plan) -> Vec<(u64, u64, String)> {
        p.entries
            .iter()
            .map(|(d, c, n)| (*d, *c, String::from_utf8_lossy(n).into_owned()))
            .collect()
    }

    #[test]
    fn blocks_two_extents_claim_are_copied_for_the_second_and_overlaps_in_a_file_are_dropped() {
        let mut items = BTreeMap::new();
        inode(&mut items, ROOT_INO, S_IFDIR | 0o755, 0);
        for ino in [2, 3] {
            inode(&mut items, ino, S_IFREG | 0o644, 8 * BLOCK_SIZE);
            name_in(&mut items, ROOT_INO, ino, 8, format!("f{ino}").as_bytes());
        }
        extent(&mut items, 2, 0, 100, 4);
        extent(&mut items, 2, 2 * BLOCK_SIZE, 200, 2); // overlaps the one before in the file
        extent(&mut items, 3, 0, 102, 4); // shares blocks 102..104 with inode 2
        extent(&mut items, 3, 4 * BLOCK_SIZE, 300, 1);
        let p = run(items);
        assert_eq!(p.data, vec![(100, 4), (300, 1)], "blocks owned as they are");
        assert_eq!(p.clones, vec![Key::new(3, ItemType::Extent, 0)]);
        assert!(!p
            .items
            .contains_key(&Key::new(2, ItemType::Extent, 2 * BLOCK_SIZE)));
        assert_eq!(p.inodes[&2].alloc_bytes.get(), 4 * BLOCK_SIZE);
        assert_eq!(
            p.inodes[&3].alloc_bytes.get(),
            5 * BLOCK_SIZE,
            "its copy counts"
        );
    }

    #[test]
    fn a_name_only_in_the_back_references_is_kept_and_a_nameless_inode_goes_to_lost_found() {
        let mut items = BTreeMap::new();
        inode(&mut items, ROOT_INO, S_IFDIR | 0o755, 0);
        inode(&mut items, 2, S_IFREG | 0o644, 0);
        inode(&mut items, 3, S_IFREG | 0o644, 0);
        items.insert(
            Key::new(2, ItemType::InodeRef, ROOT_INO),
            encode_names(&[b"only-here".to_vec()]),
        );
        let p = run(items);
        let ns = names(&p);
        assert!(ns.contains(&(ROOT_INO, 2, "only-here".into())), "{ns:?}");
        let lf = ns
            .iter()
            .find(|n| n.0 == ROOT_INO && n.2 == "lost+found")
            .expect("lost+found made")
            .1;
        assert!(ns.contains(&(lf, 3, "#3".into())), "{ns:?}");
        assert_eq!(p.inodes[&2].nlink.get(), 1);
        assert_eq!(p.inodes[&ROOT_INO].nlink.get(), 3, "root: 2 + lost+found");
        assert_eq!(p.inodes[&ROOT_INO].size.get(), 2);
    }

    #[test]
    fn a_cycle_of_directories_is_broken_into_lost_found_and_a_deleted_inode_is_freed() {
        let mut items = BTreeMap::new();
        inode(&mut items, ROOT_INO, S_IFDIR | 0o755, 0);
        inode(&mut items, 2, S_IFDIR | 0o755, 0);
        inode(&mut items, 3, S_IFDIR | 0o755, 0);
        name_in(&mut items, 2, 3, 4, b"b");
        name_in(&mut items, 3, 2, 4, b"a");
        // Inode 4: unlinked while open (link count 0, a free orphan item).
        let mut it = crate::fs::new_inode_item(S_IFREG | 0o644, Default::default(), 0, 1, now());
        it.nlink = 0.into();
        items.insert(Key::new(4, ItemType::Inode, 0), it.as_bytes().to_vec());
        items.insert(orphan_key(4), Vec::new());
        let p = run(items);
        assert!(
            !p.inodes.contains_key(&4),
            "the deleted inode is freed: {:?}",
            p.actions
        );
        let ns = names(&p);
        // Exactly one of the two lost its name to break the cycle, and went to lost+found;
        // each directory has exactly one name.
        for d in [2u64, 3] {
            assert_eq!(ns.iter().filter(|n| n.1 == d).count(), 1, "{ns:?}");
        }
        assert!(ns.iter().any(|n| n.2.starts_with('#')), "{ns:?}");
    }
}
