//! A snapshot opened beside the file system it belongs to (`Fs::open_snapshot`): a second,
//! read-only `Fs` on the same device whose tree is the snapshot's, with caches of its own,
//! while the first goes on changing its fs tree and committing. The mount shows snapshots
//! this way, as directories (the FUSE front end's `snapdir`).
//!
//! The two share no lock, and need none, because nothing a snapshot names changes while the
//! snapshot exists (`snapshot` module docs):
//! - its nodes are shared with the fs tree from the snapshot on (counted twice or more), so
//!   the fs tree copies any it changes; only the snapshot's drop frees them;
//! - its data blocks are named by the fs tree or held while a snapshot's window holds them,
//!   and no in-place write goes into a block a snapshot may name.
//!
//! So the one thing that could pull blocks from under an open view is the snapshot's delete,
//! and `Fs::delete_snapshot` refuses it (EBUSY) while a view of it is open. Opening a view
//! and that check both run under the file system's operation lock, so neither slips between
//! the other's check and its act.
//!
//! A view refuses every change (EROFS), has no space map (it never allocates), answers
//! statfs with its file system's counts (a snapshot has no space of its own), and keeps that
//! file system's state alive while it is open (it holds its `Shared`).
use super::{policy, Fs, Inner, OpenOptions, Shared};
use crate::btree::Store;
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::inode_cache::InodeCache;
use crate::space::Allocator;
use crate::txn;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Inodes a view caches: enough for a directory listing's attributes.
const VIEW_INODES: usize = 4096;

/// What ties a file system and the snapshots opened beside it.
#[derive(Default)]
pub(crate) struct Views {
    /// Snapshots opened beside this file system: none may be deleted.
    pub open: OpenViews,
    /// Set when this is a snapshot opened beside its file system, which it keeps alive.
    pub of: Option<ViewOf>,
}

/// How many views of each snapshot are open, by snapshot id.
#[derive(Default)]
pub(crate) struct OpenViews(Mutex<BTreeMap<u64, usize>>);

impl OpenViews {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, usize>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_open(&self, id: u64) -> bool {
        self.map().contains_key(&id)
    }

    fn add(&self, id: u64) {
        *self.map().entry(id).or_default() += 1;
    }

    fn remove(&self, id: u64) {
        let mut m = self.map();
        if let Some(n) = m.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                m.remove(&id);
            }
        }
    }
}

/// What a view holds of the file system it was opened beside: that file system's state, and
/// its place in that file system's `OpenViews` (given back when the view goes).
pub(crate) struct ViewOf {
    pub parent: Arc<Shared>,
    id: u64,
}

impl ViewOf {
    /// The snapshot (or parked writable tree) this view shows.
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for ViewOf {
    fn drop(&mut self) {
        self.parent.views.open.remove(self.id);
    }
}

impl Fs {
    /// Opens snapshot `id` read-only beside this file system, with a node cache of at most
    /// `cache_bytes`: reads answer as the snapshot was made while this file system goes on.
    /// The snapshot cannot be deleted (EBUSY) until the returned `Fs` is dropped. `id` may
    /// also be a parked writable subvolume (`clones`), shown read-only as it was parked; one
    /// that a log replay changed on this read-only open is opened beside instead (a handle
    /// as `open_subvolume`'s, refusing every change as this file system does), since only
    /// this file system's cache holds what the replay made of it.
    pub fn open_snapshot(&self, id: u64, cache_bytes: usize) -> Result<Fs> {
        let (mut inner, view_of, opts) = {
            let g = self.lock();
            // A snapshot, or a parked writable subvolume: neither changes while it is open
            // (a parked tree changes only when an open makes it active, and its delete waits
            // for its views as a snapshot's does).
            let parked = g.snapshots.clones.parked(id);
            // One open beside the primary is not parked: it changes (`trees`).
            if parked.is_some() && g.trees.is_open(super::trees::active_of(id)) {
                return Err(Error::Busy("the subvolume is open, writable"));
            }
            // Changed by a replay on this read-only open: only this store has its nodes.
            if parked.is_some() && g.trees.unwritten.contains(&id) {
                drop(g);
                return self.open_beside(id, false);
            }
            let Some(snap) = (g.snapshots.list.get(&id))
                .filter(|s| !s.dropping())
                .or(parked)
            else {
                return Err(Error::NotFound);
            };
            let snap = snap.clone();
            // Under the lock, as `delete_snapshot`'s check: from here the snapshot stays.
            self.shared.views.open.add(id);
            let view_of = ViewOf {
                parent: self.shared.clone(),
                id,
            };
            let sb = g.txn.sb;
            let counters = Arc::new(Counters::default());
            let node_size = g.store.node_size;
            let store = Store::new(
                g.store.dev.clone(),
                g.store.fsid,
                node_size,
                g.store.total_blocks,
                g.store.generation,
                cache_bytes / (node_size as usize * 2),
                // The first group alone (the superblocks' place): a view never allocates,
                // and its statfs is its file system's.
                Allocator::new(
                    sb.group_blocks.get().min(sb.total_blocks.get()),
                    sb.group_blocks.get(),
                    counters.clone(),
                ),
                counters,
            );
            let p = &g.policy;
            let policy = policy::Policy {
                read_only: true,
                atime: p.atime,
                sync: p.sync,
                on_damage: p.on_damage,
                acl: p.acl,
                datasum: p.datasum,
                hash: p.hash,
                clock: p.clock.clone(),
                dirty_nodes_limit: p.dirty_nodes_limit,
                knobs: policy::Knobs::default(),
                before_share: None,
            };
            let mut inner = Inner::from_parts(
                store,
                [snap.tree(), g.space_tree],
                InodeCache::new(VIEW_INODES),
                txn::TxnState::new(sb),
                policy,
            );
            inner.snapshots.list.insert(id, snap);
            let opts = OpenOptions {
                read_only: true,
                commit_interval: None,
                inode_cache_entries: VIEW_INODES,
                acl: p.acl,
                snapshot: Some(id),
                ..OpenOptions::default()
            };
            (inner, view_of, opts)
        };
        inner.enter_snapshot(id)?;
        let counters = inner.store.counters.clone();
        Fs::launch(inner, &opts, counters, Some(view_of))
    }

    /// The snapshot this `Fs` shows, when it is one (opened beside its file system or alone).
    pub fn snapshot_id(&self) -> Option<u64> {
        self.lock().snapshots.opened
    }
}
