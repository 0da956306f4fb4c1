//! Snapshots shown inside the mount: `MOUNT/.snapshots/NAME` is snapshot NAME, read-only,
//! while the file system goes on beside it (as ZFS's `.zfs/snapshot`). The directory's name
//! is `-o snapdir=NAME` (`-o nosnapdir`: none).
//!
//! - **Where it is.** A name of the root that the file system does not have: a real entry of
//!   that name wins, so an image that has one loses nothing (the mount option then picks
//!   another name). It is not listed by the root's readdir, as ZFS's default `snapdir=hidden`,
//!   so `find`, `du`, `cp -a` and backup tools that walk the mount do not walk every snapshot.
//! - **What serves it.** Each snapshot looked up is opened beside the file system
//!   (`Fs::open_snapshot`: a read-only engine on the same device with its own caches) once,
//!   and stays open until the unmount or its delete. Every change in a snapshot is refused (EROFS),
//!   a rename or link between it and the file system is EXDEV, and a copy out of it
//!   (copy_file_range, as `cp` sends) shares the snapshot's blocks as a copy inside the file
//!   system does (`Fs::copy_from_snapshot`): restoring a file moves no data.
//! - **Inode numbers.** The kernel sees one file system, so a snapshot's inodes get numbers
//!   of their own: `slot << 48 | ino` (engine inode numbers stay below 2^48), where a slot is
//!   given to a snapshot the first time this mount shows it and never to another during the
//!   mount. So a deleted snapshot's numbers answer ESTALE, even when a later snapshot reuses
//!   its id, and `st_ino` differs between a file and its snapshots' copies (tools that find
//!   hard links by it see none). Generations carry the snapshot's id (`View::attr`), so a
//!   file handle kept across a remount, whose slot may then name another snapshot, is
//!   stale rather than that snapshot's file. `1 << 48` is the directory itself. Slots run
//!   out after 65,533 snapshots shown in one mount (ENOSPC for more until the next mount).
//! - **Caching.** The directory's entry in the root and its entries go out with the mount's
//!   TTL, so a path walk through `.snapshots/NAME` asks the server nothing, as one through
//!   any directory; when one is made or deleted other than by mkdir or rmdir there (which
//!   the kernel accounts itself), the server tells the kernel to forget the directory's
//!   attributes (its link count) and the deleted one's entry (`IdxFuse::snapdir_changed`).
//!   A name not there is an error the kernel does not keep, so a snapshot made shows at the
//!   next walk. Looked up by number (".", "..") the directory goes out with a zero TTL.
//! - **Making and deleting by name**, as ZFS's `.zfs/snapshot` allows: `mkdir
//!   MOUNT/.snapshots/NAME` makes snapshot NAME and `rmdir` deletes it, from root or the
//!   mount's owner only (what `idxfs snapshot MOUNT` allows); mkdir is refused on a
//!   `-o writeback` mount, whose written pages the kernel may still hold.
//! - **Parked writable subvolumes** (`idxfs subvolume`, `--clone`) are shown beside the
//!   snapshots, by name, and served writable: the first lookup opens the tree beside the
//!   mount's own (`Fs::open_subvolume`: the same store, transaction and commits, a handle
//!   of its own), and every request inside it goes to that handle, with the kernel's
//!   numbers made as for a snapshot. A rename, link or `idxfs cp`/`rm` between it and
//!   another tree is EXDEV, as between two btrfs subvolumes; a copy_file_range out of it
//!   into another tree is EXDEV too (the kernel then copies the bytes). Unlike a snapshot's,
//!   its inodes hold engine pins for the kernel's lookups, as the file system's own do, so
//!   a file unlinked while open keeps its data until the kernel forgets it. An fsync inside
//!   it is a batch of the fsync log that names its tree, as cheap as in the mount's own. On
//!   a read-only mount it is opened read-only, as a snapshot (or, when the open's log
//!   replay changed it, beside the mount's own tree, whose cache alone holds what the
//!   replay made of it: `Fs::open_snapshot`), and stays so until the next mount (a
//!   remount read-write does not reopen it). Its delete (rmdir of its empty root, or
//!   `idxfs subvolume delete`) closes it first, as a snapshot's does, and closing commits
//!   what it holds. This mount's own tree is not shown, nor the file system's own when a
//!   subvolume is active (it has no name).
//! - **Deleting** through the mount (`idxfs snapshot MOUNT --delete ID`, or rmdir) retires the slot,
//!   waits for requests inside the snapshot to end, closes it and then deletes it (the
//!   engine refuses the delete of a snapshot it has open). A file of it still open answers
//!   ESTALE from then on, as over NFS, for whatever the kernel asks (what it has cached of
//!   the file it may still return). A delete the engine refuses (the origin of a subvolume)
//!   gives the slot back: the kernel's numbers for it, and its cached entry, work again.
use idxfs_engine::fs::Attr;
use idxfs_engine::{Error, Fs};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

pub const SHIFT: u32 = 48;
/// The directory's own inode number.
pub const DIR_INO: u64 = 1 << SHIFT;
const FIRST_SLOT: u64 = 2;
/// The engine's number inside its tree of the kernel's `ino` (its slot cut off).
pub fn local(ino: u64) -> u64 {
    ino & (DIR_INO - 1)
}

/// A snapshot's root, in the engine's numbering: the kernel's root id is the engine's root.
const ROOT: u64 = fuser::INodeNo::ROOT.0;
const LAST_SLOT: u64 = (1 << (64 - SHIFT)) - 1;
/// Node cache per open snapshot: its directories and files are read, not written.
const VIEW_CACHE_BYTES: usize = 64 << 20;
/// How long a delete waits for requests inside the snapshot to end.
const DRAIN_WAIT: Duration = Duration::from_secs(10);

impl Drop for Snapdir {
    /// At the unmount: each writable subvolume open here is closed, which commits it, before
    /// the file system's own handle closes (`serve`); a failure is said, as the file
    /// system's own close failing is.
    fn drop(&mut self) {
        let slots = std::mem::take(&mut self.write().slots);
        for slot in slots.into_values() {
            if let Slot::Shown {
                id,
                fs: Some((fs, true)),
            } = slot
            {
                if let Ok(fs) = Arc::try_unwrap(fs) {
                    if let Err(e) = fs.close() {
                        log::error!("subvolume {id} could not be closed: {e}");
                    }
                }
            }
        }
    }
}

/// What a slot holds.
enum Slot {
    /// Given to snapshot or subvolume `id`, open once looked up (with whether it was
    /// opened writable).
    Shown {
        id: u64,
        fs: Option<(Arc<Fs>, bool)>,
    },
    /// Its snapshot was deleted: its numbers are stale for the rest of the mount.
    Retired,
}

#[derive(Default)]
struct Slots {
    by_id: HashMap<u64, u64>,
    slots: BTreeMap<u64, Slot>,
    next: u64,
}

/// The snapshots directory of one mount.
pub struct Snapdir {
    name: Vec<u8>,
    slots: RwLock<Slots>,
}

/// Where an inode number the kernel sent belongs.
pub enum Place {
    /// The file system itself: the number is the engine's.
    Live,
    /// The snapshots directory.
    Dir,
    /// An inode of an open snapshot, by its engine number there.
    View(View),
    /// A number of a deleted snapshot, or one this mount never gave.
    Stale,
}

/// An open snapshot or subvolume and the number of one of its inodes.
pub struct View {
    pub fs: Arc<Fs>,
    pub slot: u64,
    /// The snapshot's id.
    pub id: u64,
    /// The engine's number inside the snapshot.
    pub ino: u64,
    /// A parked writable subvolume opened writable (module docs): changes go to `fs`, and
    /// the kernel's lookups of its inodes hold pins there.
    pub writable: bool,
}

impl View {
    /// The kernel's number for the snapshot's inode `ino`.
    pub fn out(&self, ino: u64) -> u64 {
        self.slot << SHIFT | ino
    }

    /// `a` with the kernel's number, and a generation of this snapshot's own: the inode's
    /// (its creating commit, the same in every snapshot that has it) xor the snapshot's id.
    /// A file handle (`FUSE_EXPORT_SUPPORT`) kept across a remount, where the slot may name
    /// another snapshot, then finds a generation that differs, and is stale. The kernel
    /// keeps 32 bits of it, which tell apart any two snapshot ids below 2^32.
    pub fn attr(&self, a: Attr) -> Attr {
        attr_in(self.slot, self.id, a)
    }
}

/// `View::attr` of a view in `slot` of snapshot `id`.
pub fn attr_in(slot: u64, id: u64, mut a: Attr) -> Attr {
    a.ino |= slot << SHIFT;
    a.generation ^= id;
    a
}

/// A snapshot as the directory lists it.
pub struct Entry {
    pub name: Vec<u8>,
    /// The snapshot's id: also the entry's readdir cookie (ids start at 256, after "." and
    /// "..", and a listing goes in id order).
    pub id: u64,
    /// The kernel's number for its root; None when slots ran out.
    pub ino: Option<u64>,
}

impl Snapdir {
    pub fn new(name: Vec<u8>) -> Snapdir {
        Snapdir {
            name,
            slots: RwLock::new(Slots {
                next: FIRST_SLOT,
                ..Slots::default()
            }),
        }
    }

    pub fn name(&self) -> &[u8] {
        &self.name
    }

    fn read(&self) -> RwLockReadGuard<'_, Slots> {
        self.slots.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Slots> {
        self.slots.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Where `ino` belongs; a snapshot given a slot but not open yet is opened here.
    pub fn place(&self, live: &Fs, ino: u64) -> Place {
        let slot = ino >> SHIFT;
        let local = local(ino);
        match slot {
            0 => return Place::Live,
            1 if local == 0 => return Place::Dir,
            _ => {}
        }
        match self.open(live, slot) {
            Some((fs, id, writable)) => Place::View(View {
                fs,
                slot,
                id,
                ino: local,
                writable,
            }),
            None => Place::Stale,
        }
    }

    /// The open writable subvolume `ino` belongs to, and its number there: None for the
    /// file system's own numbers, a snapshot's, or a slot not open (nothing of it is
    /// pinned). Opens nothing: what a forget needs.
    pub fn pinned(&self, ino: u64) -> Option<(Arc<Fs>, u64)> {
        match self.read().slots.get(&(ino >> SHIFT))? {
            Slot::Shown {
                fs: Some((fs, true)),
                ..
            } => Some((fs.clone(), local(ino))),
            _ => None,
        }
    }

    /// The open snapshot or subvolume in `slot` (with whether it is writable), opened now
    /// if it was only listed; None for a retired or unknown slot, or one that went
    /// meanwhile.
    fn open(&self, live: &Fs, slot: u64) -> Option<(Arc<Fs>, u64, bool)> {
        match self.read().slots.get(&slot)? {
            Slot::Shown {
                fs: Some((fs, w)),
                id,
            } => return Some((fs.clone(), *id, *w)),
            Slot::Shown { fs: None, .. } => {}
            Slot::Retired => return None,
        }
        let mut s = self.write();
        match s.slots.get_mut(&slot)? {
            Slot::Shown {
                fs: Some((fs, w)),
                id,
            } => Some((fs.clone(), *id, *w)),
            Slot::Shown { id, fs } => {
                let opened = match live.subvolumes().iter().any(|s| s.id == *id) {
                    // A parked writable subvolume: writable beside the mount's own tree,
                    // read-only as a snapshot on a read-only mount.
                    true => match live.open_subvolume(*id) {
                        Err(Error::ReadOnly) => live
                            .open_snapshot(*id, VIEW_CACHE_BYTES)
                            .map(|v| (v, false)),
                        r => r.map(|v| (v, true)),
                    },
                    false => live
                        .open_snapshot(*id, VIEW_CACHE_BYTES)
                        .map(|v| (v, false)),
                };
                let (view, writable) = match opened {
                    Ok((v, w)) => (Arc::new(v), w),
                    // Deleted meanwhile (its numbers are stale), or unreadable: said once
                    // per request, as the damage a read meets is.
                    Err(crate::Error::NotFound) => return None,
                    Err(e) => {
                        log::warn!("snapshot {id} cannot be opened: {e}");
                        return None;
                    }
                };
                *fs = Some((view.clone(), writable));
                Some((view, *id, writable))
            }
            Slot::Retired => None,
        }
    }

    /// The slot of snapshot `id`, given now if it has none; None when slots ran out.
    fn slot_of(&self, id: u64) -> Option<u64> {
        if let Some(&slot) = self.read().by_id.get(&id) {
            return Some(slot);
        }
        let mut s = self.write();
        if let Some(&slot) = s.by_id.get(&id) {
            return Some(slot);
        }
        if s.next > LAST_SLOT {
            return None;
        }
        let slot = s.next;
        s.next += 1;
        s.by_id.insert(id, slot);
        s.slots.insert(slot, Slot::Shown { id, fs: None });
        Some(slot)
    }

    /// What the directory shows, in id order: (id, name) of every snapshot not being
    /// deleted and every parked writable subvolume with a name (module docs).
    fn shown(live: &Fs) -> Result<Vec<(u64, Vec<u8>)>, Error> {
        let snaps = (live.snapshots()?.into_iter())
            .filter(|s| !s.dropping)
            .map(|s| (s.id, s.name));
        let parked = (live.subvolumes().into_iter())
            .filter(|s| !s.active && !s.name.is_empty())
            .map(|s| (s.id, s.name));
        let mut all: Vec<(u64, Vec<u8>)> = snaps.chain(parked).collect();
        all.sort_unstable_by_key(|s| s.0);
        Ok(all)
    }

    /// The id of the snapshot or parked subvolume named `name`.
    pub fn id_of(live: &Fs, name: &[u8]) -> Result<u64, Error> {
        (Snapdir::shown(live)?.into_iter())
            .find(|s| s.1 == name)
            .map(|s| s.0)
            .ok_or(Error::NotFound)
    }

    /// The name snapshot or parked subvolume `id` is shown by, if it is.
    pub fn name_of(live: &Fs, id: u64) -> Option<Vec<u8>> {
        (Snapdir::shown(live).ok()?.into_iter())
            .find(|s| s.0 == id)
            .map(|s| s.1)
    }

    /// The snapshot named `name`, open, with its root's number.
    pub fn lookup(&self, live: &Fs, name: &[u8]) -> Result<View, Error> {
        let id = Snapdir::id_of(live, name)?;
        let slot = self.slot_of(id).ok_or(Error::NoSpace)?;
        let (fs, id, writable) = self.open(live, slot).ok_or(Error::NotFound)?;
        Ok(View {
            fs,
            slot,
            id,
            ino: ROOT,
            writable,
        })
    }

    /// What the directory lists after `cookie` (see `Entry::id`), in id order.
    pub fn list(&self, live: &Fs, cookie: u64) -> Result<Vec<Entry>, Error> {
        Ok((Snapdir::shown(live)?.into_iter())
            .filter(|s| s.0 > cookie)
            .map(|(id, name)| Entry {
                ino: self.slot_of(id).map(|slot| slot << SHIFT | ROOT),
                id,
                name,
            })
            .collect())
    }

    /// The directory's attributes: owned as the root is, with its times; writable by its
    /// owner, for a mkdir or rmdir of a snapshot (`IdxFuse::snapshot_by_mkdir`).
    pub fn attr(&self, live: &Fs) -> Result<Attr, Error> {
        let mut a = live.getattr(ROOT)?;
        let shown = Snapdir::shown(live)?.len() as u32;
        a.ino = DIR_INO;
        a.mode = libc::S_IFDIR | 0o755;
        a.nlink = 2 + shown;
        a.size = 0;
        a.blocks = 0;
        a.generation = 0;
        Ok(a)
    }

    /// Deletes snapshot `id` (module docs): its slot goes stale, requests inside it end, it
    /// is closed, and then the engine deletes it. A delete the engine refuses (an origin
    /// still in use) leaves it shown under the numbers it had, opened again at the next
    /// request in it.
    pub fn delete(&self, live: &Fs, id: u64) -> Result<(), Error> {
        let deadline = Instant::now() + DRAIN_WAIT;
        let mut first = None;
        loop {
            let (slot, open) = {
                let mut s = self.write();
                match s.by_id.remove(&id) {
                    Some(slot) => match s.slots.insert(slot, Slot::Retired) {
                        Some(Slot::Shown { fs, .. }) => (Some(slot), fs.map(|(fs, _)| fs)),
                        _ => (Some(slot), None),
                    },
                    None => (None, None),
                }
            };
            first = first.or(slot);
            let r = match open {
                Some(fs) => Snapdir::close(fs, deadline),
                None => Ok(()),
            };
            match r.and_then(|()| live.delete_snapshot(id)) {
                Ok(()) => return Ok(()),
                // A lookup gave it a slot again between the two: that one goes too.
                Err(Error::Busy(_))
                    if self.read().by_id.contains_key(&id) && Instant::now() < deadline =>
                {
                    continue
                }
                Err(e) => {
                    self.restore(id, first);
                    return Err(e);
                }
            }
        }
    }

    /// Closes an open snapshot or subvolume once the requests that took it before its slot
    /// went have let go of it. Closing a writable one commits what it holds; a failure there
    /// is the file system's (read-only from then on), and the delete then fails too.
    fn close(mut fs: Arc<Fs>, deadline: Instant) -> Result<(), Error> {
        loop {
            match Arc::try_unwrap(fs) {
                Ok(fs) => return fs.close(),
                Err(still) if Instant::now() < deadline => {
                    fs = still;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => return Err(Error::Busy("the snapshot is being read in the mount")),
            }
        }
    }

    /// Snapshot `id`, whose delete was refused, shown in `slot` again (the one it had), unless
    /// a lookup gave it another meanwhile.
    fn restore(&self, id: u64, slot: Option<u64>) {
        let Some(slot) = slot else { return };
        let mut s = self.write();
        if let std::collections::hash_map::Entry::Vacant(e) = s.by_id.entry(id) {
            e.insert(slot);
            s.slots.insert(slot, Slot::Shown { id, fs: None });
        }
    }
}
