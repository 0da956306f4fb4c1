//! Directory entries, indexed twice (seed 002):
//! - by name hash, `(dir, DirHash, hash(name))`, for lookup;
//! - by inode number, `(dir, DirIno, child << 16 | slot)`, for readdir, so a listing returns
//!   entries in inode order and a pass over the directory (readdir+stat, cp, tar, rm) walks
//!   inode items in on-disk order. `slot` keeps hard links of one inode in one directory apart
//!   (the compound key of the RFC): it starts at the name hash's low 16 bits and, when another
//!   name of the same inode already has that slot, takes the next free one. So every DirIno
//!   item holds exactly one entry, and its key is a readdir cookie no other entry shares.
//!
//! and back references for hard links, `..` and fsck: one item per (child, parent) pair,
//! `(child, InodeRef, parent)`, listing the names while they fit one item (about 16 names of
//! 250 bytes), and past that one extended reference per name, `(child, InodeExtRef,
//! hash(parent, name))`, as btrfs's extended refs, so one inode may have `LINK_MAX` names in
//! one directory. The three are changed together, always.
//!
//! An entry is planned before anything changes ([`Inner::plan_entry`]): every item it will
//! grow is checked to have room, so an entry that cannot be added (names colliding on one
//! 64-bit hash until their item is full) is refused with nothing half-applied.
use super::Inner;
use crate::btree::Change;
use crate::counters::Counters;
use crate::error::{Error, Result};
use idxfs_format::items::{
    decode_dir_entries, decode_ext_refs, decode_names, dir_entry_size, encode_dir_entry,
    encode_ext_ref, encode_names, ext_ref_size, DirEntry,
};
use idxfs_format::{ItemType, Key};
use zerocopy::IntoBytes;

/// Where a planned entry's back reference goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BackRef {
    /// Appended to the `(child, InodeRef, parent)` item.
    Inline,
    /// An extended reference of its own (the InodeRef item is full).
    Ext,
}

/// An entry checked to fit (`Inner::plan_entry`): what `add_entry` needs to add it.
#[derive(Debug, Clone, Copy)]
#[must_use]
pub(crate) struct EntryPlan {
    back_ref: BackRef,
}

/// Slots per inode in one directory's inode-order index (the key's low 16 bits).
const SLOTS: u64 = 1 << 16;
const _: () = assert!(
    super::create::LINK_MAX as u64 <= SLOTS,
    "a slot for every link"
);

pub(crate) fn dir_ino_offset(child: u64, slot: u64) -> u64 {
    child << 16 | (slot & (SLOTS - 1))
}

/// The key just past slot `slot - 1` of `child` in `dir` (`slot` up to SLOTS).
fn slot_bound(dir: u64, child: u64, slot: u64) -> Key {
    if slot >= SLOTS {
        Key::new(dir, ItemType::DirIno, dir_ino_offset(child + 1, 0))
    } else {
        Key::new(dir, ItemType::DirIno, dir_ino_offset(child, slot))
    }
}

impl Inner {
    fn hash_key(&self, dir: u64, name: &[u8]) -> (Key, u64) {
        let h = (self.policy.hash)(name);
        (Key::new(dir, ItemType::DirHash, h), h)
    }

    /// The entry `name` in `dir`, if any.
    pub fn lookup_entry(&mut self, dir: u64, name: &[u8]) -> Result<Option<DirEntry>> {
        Ok(self.lookup_slot(dir, name)?.0)
    }

    /// The entry `name` in `dir`, if any, and the size of the name-hash item it would share
    /// (0: none), which `plan_entry` needs.
    pub fn lookup_slot(&mut self, dir: u64, name: &[u8]) -> Result<(Option<DirEntry>, usize)> {
        let (key, _) = self.hash_key(dir, name);
        let tree = self.fs_tree;
        let found = tree.with(&mut self.store, &key, |v| {
            decode_dir_entries(v, "dir hash item")
                .map(|es| (es.into_iter().find(|e| e.name == name), v.len()))
        })?;
        match found {
            None => Ok((None, 0)),
            Some(r) => Ok(r?),
        }
    }

    /// Checks that `name -> child` can be added to `dir`, changing nothing: the name-hash
    /// item (now `hash_item_len` bytes, as `lookup_slot` said, less any record the caller
    /// removes first) has room, and the back reference has a place. `new_child`: the inode
    /// was just made and has no back references yet (no lookup needed). Past the InodeRef
    /// item's room the name takes an extended reference, whose feature bit is committed first
    /// if the image lacks it.
    pub fn plan_entry(
        &mut self,
        dir: u64,
        name: &[u8],
        child: u64,
        hash_item_len: usize,
        new_child: bool,
    ) -> Result<EntryPlan> {
        let max = idxfs_format::node::max_item_size(self.store.node_size);
        if hash_item_len + dir_entry_size(name.len()) > max {
            // Only names colliding on one 64-bit hash share an item: refused, as a full
            // directory block is on other file systems.
            return Err(Error::NoSpace);
        }
        let tree = self.fs_tree;
        let rkey = Key::new(child, ItemType::InodeRef, dir);
        let rlen = if new_child {
            0
        } else {
            tree.with(&mut self.store, &rkey, |v| v.len())?.unwrap_or(0)
        };
        if rlen + 1 + name.len() <= max {
            return Ok(EntryPlan {
                back_ref: BackRef::Inline,
            });
        }
        let ekey = ext_ref_key(child, dir, name);
        let elen = tree.with(&mut self.store, &ekey, |v| v.len())?.unwrap_or(0);
        if elen + ext_ref_size(name.len()) > max {
            return Err(Error::NoSpace);
        }
        self.require_incompat(idxfs_format::versions::INCOMPAT_EXT_REF);
        Ok(EntryPlan {
            back_ref: BackRef::Ext,
        })
    }

    /// Adds `name -> child` to `dir` in both indexes and the back reference, as `plan`
    /// (made for exactly this entry, with nothing changed since but removals) says; bumps the
    /// directory's size and times. The caller has checked that `name` is free.
    pub fn add_entry(
        &mut self,
        dir: u64,
        name: &[u8],
        child: u64,
        dtype: u8,
        plan: EntryPlan,
    ) -> Result<()> {
        let (hkey, h) = self.hash_key(dir, name);
        let e = DirEntry {
            ino: child,
            dtype,
            name: name.to_vec(),
        };
        let mut rec = Vec::with_capacity(10 + name.len());
        encode_dir_entry(&mut rec, &e);
        append_or_insert(self, hkey, &rec)?;
        if !self.policy.knobs.hash_index_only {
            self.add_ino_record(dir, child, h, rec)?;
        }
        match plan.back_ref {
            BackRef::Inline => {
                let rkey = Key::new(child, ItemType::InodeRef, dir);
                append_or_insert(self, rkey, &encode_names(&[name.to_vec()]))?;
            }
            BackRef::Ext => {
                let mut rec = Vec::with_capacity(ext_ref_size(name.len()));
                encode_ext_ref(&mut rec, dir, name);
                append_or_insert(self, ext_ref_key(child, dir, name), &rec)?;
            }
        }
        let now = self.now();
        self.modify_inode(dir, |d| {
            d.size = (d.size.get() + 1).into();
            d.mtime = now;
            d.ctime = now;
        })?;
        Ok(())
    }

    /// Removes `name -> child` from `dir` (both indexes and the back reference).
    pub fn remove_entry(&mut self, dir: u64, name: &[u8], child: u64) -> Result<()> {
        self.op
            .names_removed
            .push(super::published::name_key(dir, name));
        let (hkey, h) = self.hash_key(dir, name);
        remove_record(self, hkey, |es| es.iter().position(|e| e.name == name))?;
        if !self.policy.knobs.hash_index_only {
            let ikey = self.find_ino_record(dir, child, name, h)?;
            remove_record(self, ikey, |es| es.iter().position(|e| e.name == name))?;
        }
        self.remove_back_ref(dir, name, child)?;
        let now = self.now();
        self.modify_inode(dir, |d| {
            d.size = d.size.get().saturating_sub(1).into();
            d.mtime = now;
            d.ctime = now;
        })?;
        Ok(())
    }

    /// Removes the back reference `name` of `child` in `dir`: from the InodeRef item if it is
    /// there, else from the extended reference it took.
    fn remove_back_ref(&mut self, dir: u64, name: &[u8], child: u64) -> Result<()> {
        self.inodes.parents.forget(child);
        let rkey = Key::new(child, ItemType::InodeRef, dir);
        // A back reference that does not decode is corruption: report it and leave the item
        // as it is (never rewrite what could not be read).
        let mut err = None;
        let mut removed = false;
        self.fs_tree.update(&mut self.store, &rkey, |v| {
            let names = match decode_names(v, "inode ref") {
                Ok(n) => n,
                Err(e) => {
                    err = Some(e);
                    return Change::Keep;
                }
            };
            let keep: Vec<Vec<u8>> = names
                .iter()
                .filter(|n| n.as_slice() != name)
                .cloned()
                .collect();
            if keep.len() == names.len() {
                return Change::Keep;
            }
            removed = true;
            if keep.is_empty() {
                return Change::Delete;
            }
            *v = encode_names(&keep);
            Change::Keep
        })?;
        if let Some(e) = err {
            return Err(e.into());
        }
        if removed {
            return Ok(());
        }
        let ekey = ext_ref_key(child, dir, name);
        let found = self.fs_tree.update(&mut self.store, &ekey, |v| {
            let refs = match decode_ext_refs(v, "inode ext ref") {
                Ok(r) => r,
                Err(e) => {
                    err = Some(e);
                    return Change::Keep;
                }
            };
            let Some(i) = refs.iter().position(|r| r.parent == dir && r.name == name) else {
                return Change::Keep;
            };
            removed = true;
            if refs.len() == 1 {
                return Change::Delete;
            }
            v.clear();
            for (j, r) in refs.iter().enumerate() {
                if j != i {
                    encode_ext_ref(v, r.parent, &r.name);
                }
            }
            Change::Keep
        })?;
        if let Some(e) = err {
            return Err(e.into());
        }
        if !removed {
            return Err(idxfs_format::Corrupt::new(
                format!("back references of {child} in directory {dir}"),
                if found { "no such name" } else { "missing" },
                format!(
                    "{:?} (the directory has the entry)",
                    String::from_utf8_lossy(name)
                ),
            )
            .into());
        }
        Ok(())
    }

    /// Files `rec` (the entry `child` under a name with hash `h`) in the inode-order index, at
    /// the first free slot from `h`'s low bits. Through `dir_ino_hint` no descent at all when
    /// the entry goes next to the previous one, as it does for every create but the first of
    /// each leaf (new inodes get ascending numbers); a scan of the run of taken slots after
    /// the first choice only when another name of `child` in `dir` holds it (hard links whose
    /// hashes agree in 16 bits).
    ///
    /// What it costs: with values packed per leaf (`btree::leaf_vals`), `idxfs bench dir-index`
    /// at 1,000,000 creates gave +8.6% and +5.3% in two runs, and round-by-round medians of
    /// +4.0% and +13.0% in two more, whose single rounds ranged from -26% to +57%. On this
    /// machine that is inside the noise, so the 10% goal is met in some runs and not shown to
    /// be met in general. Before the packing the same bench gave +14% to +17%.
    fn add_ino_record(&mut self, dir: u64, child: u64, h: u64, rec: Vec<u8>) -> Result<()> {
        let first = Key::new(dir, ItemType::DirIno, dir_ino_offset(child, h));
        let Some(rec) =
            self.fs_tree
                .insert_near(&mut self.store, first, rec, &mut self.dir_ino_hint)?
        else {
            return Ok(());
        };
        let slot = self.first_free_slot(dir, child, h)?;
        let key = Key::new(dir, ItemType::DirIno, dir_ino_offset(child, slot));
        self.fs_tree.insert(&mut self.store, key, rec)
    }

    /// The first slot of `child` in `dir` after `h`'s, counting up and wrapping, that no name
    /// holds: a scan of the run of taken slots after the first choice, which stays short
    /// unless nearly every slot is taken.
    fn first_free_slot(&mut self, dir: u64, child: u64, h: u64) -> Result<u64> {
        let start = (h + 1) & (SLOTS - 1);
        let tree = self.fs_tree;
        for (a, b) in [(start, SLOTS), (0, start)] {
            let mut expect = a;
            let mut gap = None;
            tree.scan(
                &mut self.store,
                Key::new(dir, ItemType::DirIno, dir_ino_offset(child, a)),
                slot_bound(dir, child, b),
                |k, _| {
                    if k.offset & (SLOTS - 1) != expect {
                        gap = Some(expect);
                        return Ok(false);
                    }
                    expect += 1;
                    Ok(true)
                },
            )?;
            if let Some(g) = gap.or((expect < b).then_some(expect)) {
                return Ok(g);
            }
        }
        // More names than slots: LINK_MAX is below SLOTS, so only a damaged image gets here.
        Err(Error::TooManyLinks)
    }

    /// The inode-order key holding `name -> child` in `dir`: its first-choice slot, else the
    /// one of `child`'s slots after it (wrapping) that has it. Missing means the two indexes
    /// disagree: corruption.
    fn find_ino_record(&mut self, dir: u64, child: u64, name: &[u8], h: u64) -> Result<Key> {
        let first = Key::new(dir, ItemType::DirIno, dir_ino_offset(child, h));
        let next = (h & (SLOTS - 1)) + 1;
        let mut found = None;
        let tree = self.fs_tree;
        for (from, to) in [
            (first, Key::new(dir, ItemType::DirIno, first.offset + 1)),
            (
                Key::new(
                    dir,
                    ItemType::DirIno,
                    dir_ino_offset(child, next.min(SLOTS - 1)),
                ),
                if next < SLOTS {
                    slot_bound(dir, child, SLOTS)
                } else {
                    first
                },
            ),
            (
                Key::new(dir, ItemType::DirIno, dir_ino_offset(child, 0)),
                first,
            ),
        ] {
            tree.scan(&mut self.store, from, to, |k, v| {
                let es = decode_dir_entries(v, "dir ino item")?;
                if es.iter().any(|e| e.name == name) {
                    found = Some(*k);
                    return Ok(false);
                }
                Ok(true)
            })?;
            if let Some(k) = found {
                return Ok(k);
            }
        }
        Err(idxfs_format::Corrupt::new(
            format!("inode-order entries of {child} in directory {dir}"),
            format!("no {:?}", String::from_utf8_lossy(name)),
            "the entry the name-hash index has",
        )
        .into())
    }

    /// The parent of directory `dir` (itself for the root).
    pub fn parent_of(&mut self, dir: u64) -> Result<u64> {
        if dir == idxfs_format::ROOT_INO {
            return Ok(dir);
        }
        if let Some(p) = self.inodes.parents.get(dir) {
            Counters::inc(&self.store.counters.parent_hits);
            return Ok(p);
        }
        let mut parent = None;
        let tree = self.fs_tree;
        tree.scan(
            &mut self.store,
            Key::new(dir, ItemType::InodeRef, 0),
            Key::new(dir, ItemType::InodeRef, u64::MAX),
            |k, _| {
                parent = Some(k.offset);
                Ok(false)
            },
        )?;
        let parent = parent.ok_or_else(|| {
            idxfs_format::Corrupt::new(
                format!("directory {dir} back reference"),
                "none",
                "one INODE_REF item",
            )
        })?;
        self.inodes.parents.insert(dir, parent);
        Ok(parent)
    }

    /// Writes a fresh inode item into the tree and the cache.
    pub fn insert_inode(&mut self, ino: u64, it: &idxfs_format::items::InodeItem) -> Result<()> {
        self.fs_tree.insert(
            &mut self.store,
            Key::new(ino, ItemType::Inode, 0),
            it.as_bytes().to_vec(),
        )?;
        self.inodes.insert_clean(ino, *it);
        Ok(())
    }
}

/// The extended back reference key of `name` of `child` in `parent`.
fn ext_ref_key(child: u64, parent: u64, name: &[u8]) -> Key {
    Key::new(
        child,
        ItemType::InodeExtRef,
        idxfs_format::hash::ext_ref_hash(parent, name),
    )
}

/// Appends an encoded record to a list item, or creates the item (one tree descent). The
/// caller planned the room (`plan_entry`); no room here is an engine bug, reported as such.
fn append_or_insert(fs: &mut Inner, key: Key, rec: &[u8]) -> Result<()> {
    let max = idxfs_format::node::max_item_size(fs.store.node_size);
    let mut too_big = false;
    fs.fs_tree.upsert(&mut fs.store, key, |v| match v {
        Some(v) => {
            if v.len() + rec.len() > max {
                too_big = true;
            } else {
                v.extend_from_slice(rec);
            }
            None
        }
        None => Some(rec.to_vec()),
    })?;
    if too_big {
        return Err(Error::Invalid(
            "engine bug: a planned entry found its item full",
        ));
    }
    Ok(())
}

/// Removes one record (chosen by `pick`) from a DirHash/DirIno list item; deletes the item when
/// it empties. A missing item or record means the two indexes disagree: corruption.
fn remove_record(
    fs: &mut Inner,
    key: Key,
    pick: impl Fn(&[DirEntry]) -> Option<usize>,
) -> Result<()> {
    let mut err = None;
    let found = fs.fs_tree.update(&mut fs.store, &key, |v| {
        let mut es = match decode_dir_entries(v, "dir item") {
            Ok(es) => es,
            Err(e) => {
                err = Some(e);
                return Change::Keep;
            }
        };
        let Some(i) = pick(&es) else {
            err = Some(idxfs_format::Corrupt::new(
                format!("dir item {key}"),
                "entry missing",
                "the entry the other index has",
            ));
            return Change::Keep;
        };
        es.remove(i);
        if es.is_empty() {
            return Change::Delete;
        }
        v.clear();
        for e in &es {
            encode_dir_entry(v, e);
        }
        Change::Keep
    })?;
    if let Some(e) = err {
        return Err(e.into());
    }
    if !found {
        return Err(idxfs_format::Corrupt::new(
            format!("dir item {key}"),
            "missing",
            "present (the other index has the entry)",
        )
        .into());
    }
    Ok(())
}
