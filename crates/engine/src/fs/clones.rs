//! Writable subvolumes made from snapshots (clones), as ZFS's clones: `Fs::make_clone`
//! makes one from a read-only snapshot (its origin) in constant time, a second root pointer
//! to the origin's root as a snapshot is to the fs tree's. An open file system has one
//! *active* writable tree (the superblock's `fs_root`, `subvolume`); the others are
//! *parked* (`Subvolume` items flagged `SUBVOL_WRITABLE` with their roots), the file
//! system's own tree among them (`FS_SUBVOL_ID`) while a clone is active. Parked trees may
//! be opened beside the active one (`trees`): each operation then has its handle's tree
//! in hand, and `Clones::active` names that tree, so every rule below about "the active
//! tree" is about the tree the operation acts on.
//! `OpenOptions::subvolume` picks which one an open makes active (`Inner::switch_to`, one
//! commit). `Fs::make_subvolume` makes an empty one (a root directory, no origin): every
//! block it comes to name is its own, as in the file system's own tree, so the rules below
//! about an origin's blocks never apply to it.
//!
//! `Fs::writable_snapshot` makes a clone of the active tree as it is now in one commit, as
//! `btrfs subvolume snapshot` does: its origin is a snapshot made for it alone, flagged
//! `SUBVOL_HIDDEN` (listed, cloned, rolled back to and deleted by no one), which the drop
//! that ends its last use deletes in the same transaction (`Inner::retire_hidden`): so no
//! commit leaves a hidden snapshot that no tree names blocks through (fsck checks it).
//!
//! **Whose data blocks.** Data is held, not counted (`snapshot`), so every release must know
//! which other trees may name a block. A clone names two kinds of blocks:
//! - blocks of extents as old as its origin (generation <= the origin's): the origin's. The
//!   origin names them and is not deleted while the clone exists (`Error::Busy`), so the
//!   clone never lets go of them: a release of one does nothing (`Inner::free_or_hold`),
//!   whatever other trees do with it. The tree the origin was taken of lets go of them as
//!   it always did: held while the origin's window holds them.
//! - younger blocks: its own, written while it was active. No other writable tree names
//!   them; its snapshots may, so they are freed or held as the fs tree's are. The held
//!   windows take every snapshot into account, of whichever tree, which may hold a block
//!   longer than needed, never too short.
//!
//! Three things keep the line between the two kinds where the generations draw it:
//! - an extent never merges across it (`insert_extent`): the older generation would make
//!   the clone's own blocks look like its origin's, and they would never be freed;
//! - a preallocated block as old as any clone's origin is not filled in place by any tree
//!   (`in_place::pieces`): two writable trees may name it preallocated, and each would take
//!   the other's bytes for its own. Such a write goes copy-on-write, so `fallocate`'s
//!   promise of space does not hold there (as on btrfs over a shared extent);
//! - nothing moves blocks into a tree from outside its lineage: while any other writable
//!   tree exists (a clone or one made empty: `Clones::any`), restores from snapshots
//!   (`restore`, `copy_tree_from`) and rollbacks are made only from a snapshot taken of the
//!   active tree (the item's `source`; `Clones::may_take_from`) or from the active clone's
//!   origin, since another snapshot's block may be another tree's own (a snapshot of an
//!   empty subvolume names that subvolume's blocks).
//!
//! **Restores and rollbacks into a clone.** A clone's snapshot names the clone's own blocks
//! and its origin's; its origin names only the latter, so a clone restores from and rolls
//! back to its origin too (a rollback to it: the clone as it was made). The clone's own are as any tree's: named by the clone or held for the
//! snapshot, so a restore or rollback counts or unholds them. The origin's the clone may
//! have let go of: then they are named or held for the tree the origin was taken of, and
//! nothing says whether the clone still names one (no back references). So they never
//! change hands: a rollback's tree names them again as the origin's, which it never lets
//! go of, while the origin still names them (it stays while the clone does). A restore of
//! a file shares one the clone's extent of the same file block still names (a count, as
//! any copy inside a tree: `Inner::named_prefix`) and copies the bytes of the others into
//! blocks of the clone's own (`Fs::share_blocks`), since a second name of a block no
//! extent of the clone names would be a count the clone does not have.
//!
//! **fsync in a clone logs** as in the file system's own tree, whether it is the active
//! tree or one opened beside it (`trees`): a log replay lets go of the
//! blocks the logged changes leave unnamed by the generations of the committed extents that
//! named them (`log::born_pieces`), so `free_or_hold` keeps the origin's as it did before
//! the crash.
//!
//! **Deleting a clone** (parked, on an open file system) makes it a deleted snapshot, whose
//! tree is dropped in the background (node counts only), and lets go of its own blocks in
//! the leaves it does not share with its origin (`Tree::own_leaves`, as a rollback walks two
//! trees): held for it by the generation that wrote each, as for any snapshot whose window
//! holds them, and freed with the runs no other snapshot holds when its drop ends. One
//! commit makes it all durable. Its origin may be deleted once the drop ends. The file
//! system's own tree is never deleted.
//!
//! **A snapshot of a clone** names its origin's blocks too, held for the origin's window
//! once the tree the origin was taken of lets go of them: it keeps the origin (its own
//! `SubvolumeOrigin` item, the clone's origin) until its drop ends, as the clone does.
//!
//! Several writable trees may be open at once (`trees`), and one mount serves them all
//! (`idxfs_fuse::snapdir`).
use super::snapshot::{root_ptr, tree_at, Snap};
use super::{Fs, Inner, Reserve};
use crate::error::{Error, Result};
use crate::inode_cache::InodeCache;
use idxfs_format::items::{decode_extent, EXTENT_INLINE, S_IFDIR};
use idxfs_format::roots::{
    SubvolumeItem, SUBVOL_DROPPING, SUBVOL_HIDDEN, SUBVOL_READ_ONLY, SUBVOL_WRITABLE,
};
use idxfs_format::superblock::RootPtr;
use idxfs_format::versions::{INCOMPAT_CLONES, INCOMPAT_HIDDEN_ORIGINS, INCOMPAT_SUBVOLUMES};
use idxfs_format::{ItemType, Key, FIRST_FREE_INO, FS_SUBVOL_ID, ROOT_INO, TREE_FS};
use std::collections::{BTreeMap, BTreeSet};
use zerocopy::IntoBytes;

/// The snapshot a clone was made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Origin {
    pub id: u64,
    pub generation: u64,
}

/// The writable trees besides the active one, and every clone's origin (roots-tree state,
/// written by each commit with the rest of it: `persist_roots`).
#[derive(Default)]
pub(crate) struct Clones {
    /// Every writable tree's item but the file system's own while it is active: a parked
    /// one's with its root (one opened beside: its last commit's, `trees`), the
    /// superblock's clone's with root block 0 (the superblock has it).
    pub items: BTreeMap<u64, Snap>,
    /// Each clone's origin, parked or active; and each snapshot's that names a clone's
    /// origin's blocks (a snapshot of a clone, or a deleted clone until its drop ends), so
    /// that origin stays while anything names its blocks through it.
    pub origins: BTreeMap<u64, Origin>,
    /// The tree in hand (`trees`): the superblock's `subvolume` but while an operation acts
    /// on a tree opened beside it; 0 for the file system's own tree.
    pub active: u64,
    pub(super) changed_items: BTreeSet<u64>,
    pub(crate) changed_origins: BTreeSet<u64>,
}

impl Clones {
    /// The active tree's origin; None for the file system's own tree.
    pub fn active_origin(&self) -> Option<Origin> {
        self.origins.get(&self.active).copied()
    }

    /// Whether an extent of generation `born` in the active tree names its origin's blocks
    /// (module docs): never in a tree without an origin.
    pub fn of_origin(&self, born: u64) -> bool {
        self.active_origin().is_some_and(|o| born <= o.generation)
    }

    /// Extents of this generation or older may name blocks another writable tree names
    /// too: the newest origin of any clone (0 while there is none).
    pub fn shared_floor(&self) -> u64 {
        self.origins
            .values()
            .map(|o| o.generation)
            .max()
            .unwrap_or(0)
    }

    /// Whether a writable tree besides the active one exists (a clone, one made empty, or
    /// the file system's own while another is active), or a clone's origin is still named:
    /// then a snapshot's block may be another writable tree's own (module docs).
    pub fn any(&self) -> bool {
        !self.origins.is_empty() || !self.items.is_empty() || self.active != 0
    }

    /// Parked writable tree `id`'s item: one with a root (the superblock's has none) that
    /// is not being deleted.
    pub fn parked(&self, id: u64) -> Option<&Snap> {
        (self.items.get(&id)).filter(|s| s.item.root.block.get() != 0 && !s.dropping())
    }

    /// The active tree's id: `FS_SUBVOL_ID` for the file system's own.
    pub fn active_id(&self) -> u64 {
        match self.active {
            0 => FS_SUBVOL_ID,
            a => a,
        }
    }

    /// Whether blocks may move into the active tree from `snap` (its id and item; a
    /// restore or a rollback; None: a tree that is no snapshot, a parked writable one).
    /// Always while the active tree is the only writable one. Beside others, only from a
    /// snapshot taken of the active tree (its `source`), or from the active clone's origin:
    /// every block such a snapshot names is the active tree's own or, in a clone, its
    /// origin's (module docs; the origin names only the latter). The tree's own blocks no
    /// other writable tree frees (a clone of the snapshot never frees its origin's blocks),
    /// so a restore's count or unhold gives them back to their one owner. The origin's
    /// blocks the clone may no longer name, and another tree holds or names them: they
    /// never change hands (`Clones::of_origin`).
    pub fn may_take_from(&self, snap: Option<(u64, &Snap)>) -> bool {
        let of_active = |(id, s): (u64, &Snap)| {
            s.item.source() == self.active_id() || self.active_origin().is_some_and(|o| o.id == id)
        };
        !self.any() || snap.is_some_and(of_active)
    }

    /// Whether a clone was made from snapshot `id`.
    pub fn is_origin(&self, id: u64) -> bool {
        self.origins.values().any(|o| o.id == id)
    }

    /// Whether two extent generations lie on the same side of the active clone's origin
    /// (always, in the file system's own tree): only such extents may merge.
    pub fn same_side(&self, a: u64, b: u64) -> bool {
        self.active_origin()
            .is_none_or(|o| (a <= o.generation) == (b <= o.generation))
    }

    /// The state `load_roots` read, checked: `items` the writable trees' items (not
    /// dropping), `origins` their origins, `active` the superblock's `subvolume`, `list` the
    /// snapshots.
    pub(super) fn loaded(
        items: BTreeMap<u64, Snap>,
        origins: BTreeMap<u64, Origin>,
        active: u64,
        list: &BTreeMap<u64, Snap>,
    ) -> Result<Clones> {
        let bad = |what: String, have: String, expect: &str| -> Error {
            idxfs_format::Corrupt::new(what, have, expect).into()
        };
        for (&id, s) in &items {
            let is_active = id == active || (id == FS_SUBVOL_ID && active == 0);
            if is_active != (s.item.root.block.get() == 0) || (id == FS_SUBVOL_ID && active == 0) {
                return Err(bad(
                    format!("subvolume {id} root"),
                    s.item.root.block.get().to_string(),
                    "0 for the active clone, a root for a parked tree (the file system's own \
                     only while a clone is active)",
                ));
            }
        }
        if active != 0 && !(items.contains_key(&active) && items.contains_key(&FS_SUBVOL_ID)) {
            return Err(bad(
                "superblock subvolume".into(),
                active.to_string(),
                "a clone with an item, the file system's own tree parked",
            ));
        }
        for (&id, o) in &origins {
            let snap = list.get(&o.id).filter(|s| !s.dropping());
            let named = items.contains_key(&id) || list.contains_key(&id);
            if !named || snap.is_none_or(|s| s.generation() != o.generation) {
                return Err(bad(
                    format!("origin of subvolume {id}"),
                    format!("snapshot {} of generation {}", o.id, o.generation),
                    "a subvolume or snapshot made from a snapshot that exists, of that generation",
                ));
            }
        }
        Ok(Clones {
            items,
            origins,
            active,
            ..Default::default()
        })
    }

    pub(super) fn pending(&self) -> usize {
        self.changed_items.len() + self.changed_origins.len()
    }
}

/// A writable subvolume, as `Fs::subvolumes` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubvolumeInfo {
    /// `FS_SUBVOL_ID` for the file system's own tree.
    pub id: u64,
    /// Empty for the file system's own tree.
    pub name: Vec<u8>,
    /// The snapshot it was made from; None for the file system's own tree and for one made
    /// empty (`Fs::make_subvolume`).
    pub origin: Option<u64>,
    /// A writable snapshot (`Fs::writable_snapshot`): the tree it was taken of, whose
    /// snapshot (`origin`) is hidden; None for a clone of a listed snapshot, or when the
    /// tree was not recorded.
    pub snapshot_of: Option<u64>,
    /// Whether it is the tree of the handle asked (the active one, or one opened beside
    /// it: `Fs::open_subvolume`).
    pub active: bool,
}

fn writable_item(
    root: RootPtr,
    generation: u64,
    next_ino: u64,
    inode_count: u64,
    name: &[u8],
) -> SubvolumeItem {
    SubvolumeItem {
        root,
        flags: SUBVOL_WRITABLE.into(),
        generation: generation.into(),
        next_ino: next_ino.into(),
        inode_count: inode_count.into(),
        drop_from: Key::MIN.encode(),
        name_len: name.len() as u8,
        source: [0; 6],
    }
}

impl Inner {
    /// Makes writable tree `id` (`FS_SUBVOL_ID` or a clone's) the active one: the active
    /// one is parked with its root and counters, `id`'s become the file system's, and one
    /// commit makes the change durable. Called at open, before anything is cached or
    /// published (`Fs::open`); the fsync log was replayed into the tree it belongs to and
    /// committed first.
    pub(crate) fn switch_to(&mut self, id: u64, cache_entries: usize) -> Result<()> {
        let target = if id == FS_SUBVOL_ID { 0 } else { id };
        if target == self.snapshots.clones.active {
            return Ok(());
        }
        self.writable()?;
        let parked = (self.snapshots.clones.parked(id).cloned()).ok_or(Error::NotFound)?;
        self.commit()?;
        let generation = self.store.generation - 1;
        let root = root_ptr(&self.fs_tree);
        let (next_ino, inode_count) = (self.txn.next_ino, self.txn.inode_count);
        let clones = &mut self.snapshots.clones;
        let current = match clones.active {
            0 => FS_SUBVOL_ID,
            c => c,
        };
        let name = clones
            .items
            .get(&current)
            .map(|s| s.name.clone())
            .unwrap_or_default();
        clones.items.insert(
            current,
            Snap {
                item: writable_item(root, generation, next_ino, inode_count, &name),
                name,
            },
        );
        clones.changed_items.insert(current);
        if target == 0 {
            clones.items.remove(&FS_SUBVOL_ID);
        } else if let Some(s) = clones.items.get_mut(&target) {
            s.item = writable_item(RootPtr::default(), generation, 0, 0, &parked.name);
        }
        clones.changed_items.insert(id);
        clones.active = target;
        self.trees.primary = target;
        self.fs_tree = tree_at(&parked.item.root, TREE_FS);
        self.txn.next_ino = parked.item.next_ino.get();
        self.txn.inode_count = parked.item.inode_count.get();
        // Everything cached was the other tree's (and clean: committed above), its orphans
        // too: their items are in its tree, for when it is active again.
        self.inodes = InodeCache::new(cache_entries);
        self.lives.orphans = Default::default();
        self.lives.release.clear();
        self.txn.ino_runs = Default::default();
        self.dir_ino_hint = Default::default();
        self.store.changes.shape_seq += 1;
        self.require_incompat(INCOMPAT_CLONES);
        self.require_incompat(INCOMPAT_SUBVOLUMES);
        self.txn.changed = true;
        self.commit()
    }

    /// Opens parked writable tree `id` in place of the fs tree, read-only (as
    /// `enter_snapshot` opens a snapshot).
    pub(crate) fn enter_parked(&mut self, id: u64) -> Result<()> {
        let target = if id == FS_SUBVOL_ID { 0 } else { id };
        if target == self.snapshots.clones.active {
            return Ok(());
        }
        let s = self.snapshots.clones.parked(id).ok_or(Error::NotFound)?;
        self.fs_tree = s.tree();
        self.txn.next_ino = s.item.next_ino.get();
        self.txn.inode_count = s.item.inode_count.get();
        self.snapshots.opened = Some(id);
        Ok(())
    }

    /// A new parked clone named `name` of snapshot `origin` (`snap`), written by the next
    /// commit: one count on the snapshot's root, its item and its origin's.
    fn add_clone(&mut self, origin: u64, snap: &Snap, name: &[u8]) -> Result<u64> {
        let id = self.snapshots.next_id()?;
        let tree = snap.tree().share(&mut self.store);
        let generation = self.store.generation - 1;
        let item = writable_item(
            root_ptr(&tree),
            generation,
            snap.item.next_ino.get(),
            snap.item.inode_count.get(),
            name,
        );
        self.add_parked(id, item, name);
        let clones = &mut self.snapshots.clones;
        clones.origins.insert(
            id,
            Origin {
                id: origin,
                generation: snap.generation(),
            },
        );
        clones.changed_origins.insert(id);
        Ok(id)
    }

    /// Takes the writable trees and origins a repair found (`repair::roots`), with `active`
    /// the superblock's `subvolume`: all written by the next commit.
    pub(crate) fn adopt_clones(
        &mut self,
        items: BTreeMap<u64, Snap>,
        origins: BTreeMap<u64, Origin>,
        active: u64,
    ) {
        for s in items.values() {
            self.store.refs.note_newest(s.generation());
        }
        let clones = &mut self.snapshots.clones;
        clones.changed_items.extend(items.keys().copied());
        clones.changed_origins.extend(origins.keys().copied());
        clones.items = items;
        clones.origins = origins;
        clones.active = active;
        self.trees.primary = active;
    }

    /// Deletes hidden snapshot `id` (a writable snapshot's origin) once nothing names its
    /// blocks through it any more: called where an origin item goes (the end of a drop),
    /// in the same transaction, so no commit leaves a hidden snapshot no tree uses.
    pub(crate) fn retire_hidden(&mut self, id: u64) {
        if self.snapshots.clones.is_origin(id) {
            return;
        }
        if let Some(s) = (self.snapshots.list.get_mut(&id)).filter(|s| s.hidden() && !s.dropping())
        {
            s.item.flags = (s.item.flags.get() | SUBVOL_DROPPING).into();
            s.item.drop_from = Key::MIN.encode();
            self.snapshots.mark_changed(id);
            self.txn.changed = true;
        }
    }

    /// A new parked writable subvolume `id` (a clone or one made empty), written by the
    /// next commit with the feature bits it needs.
    fn add_parked(&mut self, id: u64, item: SubvolumeItem, name: &[u8]) {
        let clones = &mut self.snapshots.clones;
        clones.items.insert(
            id,
            Snap {
                item,
                name: name.to_vec(),
            },
        );
        clones.changed_items.insert(id);
        self.require_incompat(INCOMPAT_CLONES);
        self.require_incompat(INCOMPAT_SUBVOLUMES);
        self.txn.changed = true;
    }

    /// Deletes parked clone `id` (module docs): its own blocks let go of (held for it until
    /// its drop ends), its tree dropped in the background from the next commit on, its
    /// origin free to be deleted once that drop ends.
    pub(crate) fn delete_clone(&mut self, id: u64) -> Result<()> {
        let clones = &self.snapshots.clones;
        if id == FS_SUBVOL_ID {
            return Err(Error::Invalid("the file system's own tree is not deleted"));
        }
        if self.trees.is_open(super::trees::active_of(id)) {
            return Err(Error::Busy("the subvolume is open"));
        }
        let Some(s) = clones.items.get(&id).cloned() else {
            return Err(Error::NotFound);
        };
        // One made empty has no origin: every block it names is its own (an empty tree
        // shares no leaf).
        let o = clones.origins.get(&id).copied();
        let theirs = match o {
            Some(o) => (self.snapshots.list.get(&o.id))
                .ok_or_else(|| {
                    idxfs_format::Corrupt::new(
                        format!("origin of subvolume {id}"),
                        o.id,
                        "a snapshot",
                    )
                })?
                .tree(),
            None => tree_at(&RootPtr::default(), TREE_FS),
        };
        let floor = o.map_or(0, |o| o.generation);
        let mine = s.tree();
        let total = self.store.total_blocks;
        // (start, blocks, the extent's generation).
        let mut runs: Vec<(u64, u64, u64)> = Vec::new();
        mine.own_leaves(&theirs, &mut self.store, |in_mine, leaf| {
            if !in_mine {
                return Ok(());
            }
            let vals = leaf.leaf_vals();
            for (i, k) in leaf.keys.iter().enumerate() {
                if k.item_type() != Some(ItemType::Extent) {
                    continue;
                }
                let (e, _) = decode_extent(vals.get(i), k, total)?;
                let born = e.generation.get();
                if e.kind != EXTENT_INLINE && born > floor {
                    runs.push((e.disk_block.get(), e.blocks.get(), born));
                }
            }
            Ok(())
        })?;
        // Extents sharing blocks (`SharedBlocks`) name them more than once: each is let go
        // of once, by the oldest generation that names it (copies keep their source's, so
        // they agree); neighbours join when of one generation.
        runs.sort_unstable();
        let mut union: Vec<(u64, u64, u64)> = Vec::new();
        for (s, n, g) in runs {
            match union.last_mut() {
                Some((ls, ln, lg)) if s < *ls + *ln || (s == *ls + *ln && g == *lg) => {
                    *ln = (*ln).max(s + n - *ls);
                    *lg = (*lg).min(g);
                }
                _ => union.push((s, n, g)),
            }
        }
        let held_items = 2 * union.len() as u64;
        self.reserve_nodes(self.roots_growth(held_items), 0, Reserve::Grow)?;
        // From here on every change is the delete's; an error stops the file system.
        let r = (|| {
            // A deleted snapshot from now on, whose drop lets go of its nodes. Its leaves
            // name its own blocks until the drop passes them, so they are held for it (its
            // generation, when it was parked, is in their window) and freed when the drop
            // ends, with every run no other snapshot holds.
            // Its origin stays until the drop ends: its leaves name the origin's blocks.
            let clones = &mut self.snapshots.clones;
            clones.items.remove(&id);
            clones.changed_items.insert(id);
            let mut item = s.item;
            item.flags = (SUBVOL_READ_ONLY | SUBVOL_DROPPING).into();
            item.drop_from = Key::MIN.encode();
            self.snapshots.list.insert(
                id,
                Snap {
                    item,
                    name: s.name.clone(),
                },
            );
            self.snapshots.mark_changed(id);
            // Held by the window of the generation that wrote them: the snapshots that may
            // name them were taken since (this one among them), not every snapshot there is
            // (a snapshot of another tree taken before they were written cannot).
            for &(start, n, born) in &union {
                self.let_go(start, n, false, born)?;
            }
            self.txn.changed = true;
            self.commit()
        })();
        if let Err(e) = &r {
            self.fail(format!("deleting subvolume {id}: {e}"));
        }
        r
    }
}

impl Fs {
    /// Makes a writable subvolume named `name` from read-only snapshot `origin` and returns
    /// its id (module docs). Constant time: one count, two items and a commit. It is used by
    /// opening the image with `OpenOptions::subvolume`.
    pub fn make_clone(&self, origin: u64, name: &[u8]) -> Result<u64> {
        super::snapshot::check_name(name)?;
        let mut g = self.lock();
        g.writable()?;
        if g.snapshots.name_taken(name) {
            return Err(Error::Exists);
        }
        // A hidden one is a writable snapshot's alone (`writable_snapshot`).
        let snap = (g.snapshots.list.get(&origin))
            .filter(|s| !s.dropping() && !s.hidden())
            .cloned()
            .ok_or(Error::NotFound)?;
        let id = g.add_clone(origin, &snap, name)?;
        g.commit()?;
        Ok(id)
    }

    /// Makes a writable snapshot of the active tree as it is now, named `name`, and returns
    /// its id: a clone (parked, as `make_clone`'s) whose origin is a snapshot made for it
    /// alone, hidden (`SUBVOL_HIDDEN`: listed by no one, and deleted by the drop that ends
    /// its last use, `Inner::retire_hidden`), as `btrfs subvolume snapshot` makes one.
    /// Constant time: a commit, two counts, three items (four of a clone: its origin's
    /// snapshot names the clone's origin's blocks too) and a commit that makes them durable
    /// together.
    pub fn writable_snapshot(&self, name: &[u8]) -> Result<u64> {
        super::snapshot::check_name(name)?;
        let mut g = self.quiet()?;
        if g.snapshots.name_taken(name) {
            return Err(Error::Exists);
        }
        // Two ids, the origin's and the clone's, both known free before the first change.
        if g.snapshots.next_id()? >= idxfs_format::MAX_INO {
            return Err(Error::NoSpace);
        }
        g.commit()?;
        let origin = g.add_snapshot(name, SUBVOL_READ_ONLY | SUBVOL_HIDDEN)?;
        g.require_incompat(INCOMPAT_HIDDEN_ORIGINS);
        let snap = (g.snapshots.list.get(&origin).cloned()).ok_or(Error::NotFound)?;
        let id = g.add_clone(origin, &snap, name)?;
        g.commit()?;
        Ok(id)
    }

    /// Makes an empty writable subvolume named `name`, its root directory (mode 0755) owned
    /// by `owner`, and returns its id: a tree of one leaf, parked, used by opening the image
    /// with `OpenOptions::subvolume` (as btrfs's `subvolume create`). It has no origin: every
    /// block it comes to name is its own, as in the file system's own tree. Constant time:
    /// one node, one item and a commit.
    pub fn make_subvolume(&self, name: &[u8], owner: super::Owner) -> Result<u64> {
        super::snapshot::check_name(name)?;
        let mut g = self.lock();
        g.writable()?;
        if g.snapshots.name_taken(name) {
            return Err(Error::Exists);
        }
        let id = g.snapshots.next_id()?;
        g.op.nodes = 0;
        let need = 1 + g.roots_growth(1);
        g.reserve_nodes(need, 0, Reserve::Grow)?;
        // From here on every change is the subvolume's; an error stops the file system.
        let r = (|| {
            let mut root =
                super::new_inode_item(S_IFDIR | 0o755, owner, 0, g.store.generation, g.now());
            root.nlink = 2.into();
            let mut tree = crate::btree::Tree::create(&mut g.store, TREE_FS)?;
            tree.insert(
                &mut g.store,
                Key::new(ROOT_INO, ItemType::Inode, 0),
                root.as_bytes().to_vec(),
            )?;
            // Parked by the commit below, which writes its root.
            let generation = g.store.generation;
            let item = writable_item(root_ptr(&tree), generation, FIRST_FREE_INO, 1, name);
            g.add_parked(id, item, name);
            g.commit()
        })();
        if let Err(e) = &r {
            g.fail(format!("making subvolume {id}: {e}"));
        }
        r.map(|()| id)
    }

    /// Every writable subvolume: the file system's own tree first, then the clones by id.
    pub fn subvolumes(&self) -> Vec<SubvolumeInfo> {
        let g = self.lock();
        let c = &g.snapshots.clones;
        let mut out = vec![SubvolumeInfo {
            id: FS_SUBVOL_ID,
            name: Vec::new(),
            origin: None,
            snapshot_of: None,
            active: c.active == 0,
        }];
        for (&id, s) in c.items.iter().filter(|(&id, _)| id != FS_SUBVOL_ID) {
            let origin = c.origins.get(&id).map(|o| o.id);
            let hidden = origin
                .and_then(|o| g.snapshots.list.get(&o))
                .filter(|s| s.hidden());
            out.push(SubvolumeInfo {
                id,
                name: s.name.clone(),
                origin,
                snapshot_of: hidden.map(|o| o.item.source()).filter(|&t| t != 0),
                active: c.active == id,
            });
        }
        out
    }

    /// The id of the writable tree this handle acts on (`FS_SUBVOL_ID` for the file
    /// system's own): the active one, or one opened beside it (`Fs::open_subvolume`).
    pub fn active_subvolume(&self) -> u64 {
        match self.lock().snapshots.clones.active {
            0 => FS_SUBVOL_ID,
            c => c,
        }
    }
}
