//! Several writable trees open at once through one file system (issue 25): the file system's
//! active tree, the *primary* (the superblock's `fs_root` and `subvolume`, `clones`), and any
//! number of parked writable trees opened beside it as *secondaries* (`Fs::open_subvolume`),
//! each served by an `Fs` handle of its own that shares the store, the allocator, the running
//! transaction, the commit and the operation lock with the rest.
//!
//! **One tree in hand.** The engine's operations act on `Inner`'s tree state: the fs tree,
//! its inode counters and runs, inode cache, orphans, pins, published reads, the leaf hint
//! of its inode-order index, and which tree the clone rules apply to (`Clones::active`).
//! The state of the open trees not in hand waits in `OpenTrees::out`; taking a handle's
//! lock swaps its tree's state into `Inner` (`Inner::hand`, a few moves, no I/O), so every
//! operation, the clone rules on whose blocks are whose included, runs unchanged on the
//! tree of the handle it came through. The lock is the one every operation takes, so two
//! trees' operations still serialize as two of one tree's do.
//!
//! **Commits.** A commit writes every open tree: each one's cached inode changes and new
//! orphans go into its own tree, and each secondary's root and inode counters into its
//! `Subvolume` item in the roots tree, as parking writes them (`Inner::settle_trees`); the
//! superblock takes the primary's. So a crash opens to the last commit of every tree, each
//! whole, fsck clean.
//!
//! **fsync.** Each open tree has its own log keys (`log::TreeKeys`, swapped in with the
//! tree): an fsync through a handle logs what its tree changed since its last batch, as
//! the primary's does, and a secondary's batch starts with a record naming it
//! (`LogRecord::Tree`), so the replay applies its items to its tree and writes the new root
//! and counters into its `Subvolume` item. Such a record needs incompat bit
//! `INCOMPAT_LOG_TREES`, which every commit made while a secondary is open sets: the first
//! fsync in a secondary after it opens commits instead. A commit takes every tree's keys.
//! Why one tree's batch needs nothing of another's: no operation changes two trees (rename
//! and link between them are refused, a copy between them copies bytes), and the replay's
//! space rules hold across trees because no block the committed state names is reused
//! before the next commit (a block freed after a commit stays pinned until then, whichever
//! tree freed it), nor is data freed by any tree once a batch was written (`Log::written`);
//! state outside the fs trees that a batch cannot carry (held runs let go of) makes the
//! next fsync in every tree commit (`ChangedKeys::commit_next`).
//!
//! **Who opens them.** A library caller, and the FUSE mount for each parked subvolume its
//! snapshots directory shows (`idxfs_fuse::snapdir`), which routes each request to the
//! handle of the tree its inode number names.
//!
//! **What an open secondary refuses.** While open it is not parked: its item's root is its
//! last commit's, not its current one, so it cannot be opened as a view, deleted, switched
//! to or opened a second time (`Error::Busy`), and rollbacks wait until only one tree is
//! open. Closing its handle frees its orphans, commits, and parks it.
use super::orphan::Orphans;
use super::pins::Pins;
use super::published::Published;
use super::{Fs, Inner, Ino};
use crate::btree::{LeafHint, Tree};
use crate::error::{Error, Result};
use crate::fs::ino_runs::InoRuns;
use crate::inode_cache::InodeCache;
use crate::log::TreeKeys;
use idxfs_format::FS_SUBVOL_ID;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One open tree's share of `Inner`: what `Inner::hand` swaps in and out.
pub(crate) struct TreeState {
    fs_tree: Tree,
    next_ino: u64,
    inode_count: u64,
    ino_runs: InoRuns,
    inodes: InodeCache,
    orphans: Orphans,
    release: Vec<Ino>,
    pins: Arc<Pins>,
    published: Arc<Published>,
    dir_ino_hint: LeafHint,
    /// What its next fsync logs (`log`).
    log_keys: TreeKeys,
    /// `Clones::active`'s value for this tree: 0 for the file system's own, else its id.
    active: u64,
}

/// The open trees (module docs).
#[derive(Default)]
pub(crate) struct OpenTrees {
    /// The superblock's tree, as `Clones::active` names it: 0 for the file system's own.
    pub primary: u64,
    /// Every open tree but the one in hand, by `Clones::active` value.
    out: BTreeMap<u64, TreeState>,
    /// The open secondaries, in hand or not.
    secondaries: std::collections::BTreeSet<u64>,
    /// Parked trees (subvolume ids) a log replay changed on a read-only open: their new
    /// nodes are in this store's cache only, where a view (a store of its own, reading the
    /// device) would not find them, so `Fs::open_snapshot` opens them beside, read-only.
    pub unwritten: std::collections::BTreeSet<u64>,
}

impl OpenTrees {
    /// Whether tree `active` (a `Clones::active` value) is open, primary or not.
    pub fn is_open(&self, active: u64) -> bool {
        active == self.primary || self.secondaries.contains(&active)
    }

    /// Whether only the primary is open.
    pub fn alone(&self) -> bool {
        self.secondaries.is_empty()
    }
}

/// `Clones::active`'s value for writable tree `id`.
pub(crate) fn active_of(id: u64) -> u64 {
    if id == FS_SUBVOL_ID {
        0
    } else {
        id
    }
}

impl TreeState {
    /// Swaps this state with the one in `g`'s hand.
    fn swap(&mut self, g: &mut Inner) {
        std::mem::swap(&mut self.fs_tree, &mut g.fs_tree);
        std::mem::swap(&mut self.next_ino, &mut g.txn.next_ino);
        std::mem::swap(&mut self.inode_count, &mut g.txn.inode_count);
        std::mem::swap(&mut self.ino_runs, &mut g.txn.ino_runs);
        std::mem::swap(&mut self.inodes, &mut g.inodes);
        std::mem::swap(&mut self.orphans, &mut g.lives.orphans);
        std::mem::swap(&mut self.release, &mut g.lives.release);
        std::mem::swap(&mut self.pins, &mut g.lives.pins);
        std::mem::swap(&mut self.published, &mut g.published);
        std::mem::swap(&mut self.dir_ino_hint, &mut g.dir_ino_hint);
        std::mem::swap(&mut self.log_keys, &mut g.store.changes.log.tree);
        std::mem::swap(&mut self.active, &mut g.snapshots.clones.active);
    }
}

impl Inner {
    /// Which open tree is in hand, as `Clones::active` names it.
    pub(crate) fn in_hand(&self) -> u64 {
        self.snapshots.clones.active
    }

    /// Puts open tree `active` in hand (module docs). A tree that is not open is an engine
    /// bug, refused before anything moves.
    pub(crate) fn hand(&mut self, active: u64) -> Result<()> {
        let held = self.in_hand();
        if held == active {
            return Ok(());
        }
        let Some(mut s) = self.trees.out.remove(&active) else {
            return Err(Error::Invalid(
                "engine bug: a tree that is not open was handed",
            ));
        };
        s.swap(self);
        debug_assert_eq!(s.active, held);
        self.trees.out.insert(held, s);
        // Cursors and leaf hints of the other tree must not be trusted in this one.
        self.store.changes.shape_seq += 1;
        Ok(())
    }

    /// Writes every open tree's cached inode changes and new orphans into its tree, and each
    /// secondary's root and counters into its item (a commit's first step, `txn`), and
    /// leaves the primary in hand. `generation`: the commit's.
    pub(crate) fn settle_trees(&mut self, generation: u64) -> Result<()> {
        let mut open: Vec<u64> = self.trees.secondaries.iter().copied().collect();
        open.push(self.trees.primary);
        for t in open {
            self.hand(t)?;
            self.write_new_orphans()?;
            self.write_back_inodes()?;
            self.txn.ino_runs.expire();
            if t != self.trees.primary {
                // The commit makes all of it durable (the primary's: `Inner::log_start`).
                self.store.changes.log.tree.clear();
                let (tree, next_ino, count) =
                    (self.fs_tree, self.txn.next_ino, self.txn.inode_count);
                self.write_parked(t, &tree, generation, next_ino, count)?;
            }
        }
        Ok(())
    }

    /// Parked writable tree `id` as a log replay finds it (`log::replay`, at open, before any
    /// tree is opened beside): its committed root, `Clones::active` value and counters. A
    /// tree that is not a parked writable one is damage: no batch names any other.
    pub(crate) fn parked_for_replay(&self, id: u64) -> Result<(Tree, u64, (u64, u64))> {
        let s = self.snapshots.clones.parked(id).ok_or_else(|| {
            idxfs_format::Corrupt::new(
                format!("fsync log records of tree {id}"),
                "not a parked writable subvolume",
                "one",
            )
        })?;
        let counters = (s.item.next_ino.get(), s.item.inode_count.get());
        Ok((s.tree(), active_of(id), counters))
    }

    /// Writes writable tree `id`'s root `tree` and its counters into its item, for the
    /// commit of `generation` to write (`settle_trees`, and a log replay's).
    fn write_parked(
        &mut self,
        id: u64,
        tree: &Tree,
        generation: u64,
        next_ino: u64,
        inode_count: u64,
    ) -> Result<()> {
        let clones = &mut self.snapshots.clones;
        let Some(s) = clones.items.get_mut(&id) else {
            return Err(Error::Invalid("engine bug: a writable tree lost its item"));
        };
        s.item.root = super::snapshot::root_ptr(tree);
        s.item.generation = generation.into();
        s.item.next_ino = next_ino.into();
        s.item.inode_count = inode_count.into();
        clones.changed_items.insert(id);
        Ok(())
    }

    /// Writes parked tree `id`'s root and counters, as a log replay left them, into its
    /// item, as a commit of it open beside would (`settle_trees`).
    pub(crate) fn park_replayed(
        &mut self,
        id: u64,
        tree: &Tree,
        next_ino: u64,
        inode_count: u64,
    ) -> Result<()> {
        self.write_parked(id, tree, self.store.generation, next_ino, inode_count)?;
        if self.policy.read_only {
            self.trees.unwritten.insert(id);
        }
        Ok(())
    }

    /// Blocks the next commit needs for the open trees not in hand: their cached inode
    /// changes and new orphans, as `commit_need` counts the tree in hand's.
    pub(crate) fn others_commit_need(&self) -> u64 {
        let bpn = self.bpn();
        let ns = self.store.node_size;
        let item = idxfs_format::node::ITEM_HEADER_SIZE as u64 + 1;
        (self.trees.out.values())
            .map(|t| {
                let level = t.fs_tree.level;
                let inodes = t.inodes.dirty_count() as u64 * (level as u64 + 1);
                let n = t.orphans.pending_len() as u64;
                (inodes + super::reserve::run_nodes_at(level, ns, n, n * item)) * bpn
            })
            .sum()
    }

    /// Opens parked writable tree `id` beside the others, and puts it in hand: its state
    /// from its item, its orphans loaded. `published`: the new handle's.
    /// `writable`: refused on a file system that is not (else opened read-only there).
    fn open_secondary(
        &mut self,
        id: u64,
        cache: usize,
        published: Arc<Published>,
        writable: bool,
    ) -> Result<()> {
        if writable {
            self.writable()?;
        }
        let active = active_of(id);
        if self.trees.is_open(active) {
            return Err(Error::Busy("the subvolume is open already"));
        }
        let s = self.snapshots.clones.parked(id).ok_or(Error::NotFound)?;
        let state = TreeState {
            fs_tree: s.tree(),
            next_ino: s.item.next_ino.get(),
            inode_count: s.item.inode_count.get(),
            ino_runs: Default::default(),
            inodes: InodeCache::new(cache),
            orphans: Default::default(),
            release: Vec::new(),
            pins: Default::default(),
            published,
            dir_ino_hint: Default::default(),
            log_keys: Default::default(),
            active,
        };
        self.trees.out.insert(active, state);
        self.trees.secondaries.insert(active);
        let r = self.hand(active).and_then(|()| self.load_orphans());
        if r.is_err() {
            self.close_secondary(active)?;
        }
        r
    }

    /// Takes secondary `active` out of the open trees (its handle closes): in hand or not,
    /// its state goes, and the primary is in hand if it was.
    fn close_secondary(&mut self, active: u64) -> Result<()> {
        if self.in_hand() == active {
            self.hand(self.trees.primary)?;
        }
        self.trees.secondaries.remove(&active);
        self.trees.out.remove(&active);
        Ok(())
    }
}

/// Which tree an `Fs` handle serves, and its share of what is read without the lock.
pub(crate) struct Hand {
    /// `Clones::active`'s value for its tree.
    pub active: u64,
    /// Opened beside the primary (`Fs::open_subvolume`).
    pub secondary: bool,
    /// A secondary's handle was closed: its tree is parked, and dropping it does nothing.
    pub closed: bool,
    pub pins: Arc<Pins>,
    pub published: Arc<Published>,
}

impl Fs {
    /// Opens parked writable subvolume `id` (`Fs::subvolumes`; `FS_SUBVOL_ID` for the file
    /// system's own tree while a clone is the active one) beside this file system, writable:
    /// a handle of its own, whose operations act on that tree, with inode numbers of its own,
    /// committed with everything else (module docs). Busy while it is open already; NotFound
    /// for no such subvolume; ReadOnly on a read-only file system or a snapshot. Its orphans
    /// (files a crash left unlinked) are freed before it returns.
    pub fn open_subvolume(&self, id: u64) -> Result<Fs> {
        self.open_beside(id, true)
    }

    /// `open_subvolume`; `writable` false: on a read-only file system too, whose refusals
    /// of every change then hold for the new handle (`Fs::open_snapshot` of a tree in
    /// `OpenTrees::unwritten`).
    pub(super) fn open_beside(&self, id: u64, writable: bool) -> Result<Fs> {
        if self.shared.views.of.is_some() {
            return Err(Error::ReadOnly);
        }
        let published = Arc::new(Published::new(
            self.shared.cache_entries,
            self.shared.published.enabled(),
        ));
        let (active, pins) = {
            let mut g = self.shared.lock();
            g.open_secondary(id, self.shared.cache_entries, published.clone(), writable)?;
            let pins = g.lives.pins.clone();
            if self.hand.pins.holds_made() {
                pins.hold_made();
            }
            (active_of(id), pins)
        };
        let fs = Fs {
            shared: self.shared.clone(),
            committer: None,
            hand: Hand {
                active,
                secondary: true,
                closed: false,
                pins,
                published,
            },
        };
        // Orphans a crash left in it: nothing can hold them any more.
        fs.reclaim_orphans()?;
        Ok(fs)
    }

    /// Whether `other` is another handle of this file system: another of its open trees.
    pub(super) fn is_open_beside(&self, other: &Fs) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared) && self.hand.active != other.hand.active
    }

    /// Ends a secondary handle (`close` and drop): nothing holds its inodes any more, so its
    /// orphans are freed, then a commit writes its tree and it is parked again.
    pub(super) fn close_secondary(&self) -> Result<()> {
        let r = self.release_all();
        let mut g = self.lock();
        let r = r.and_then(|()| match g.policy.read_only || g.failed.is_some() {
            true => Ok(()),
            false => g.commit(),
        });
        g.close_secondary(self.hand.active)?;
        r
    }
}
