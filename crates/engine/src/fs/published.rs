//! Inode attributes, directory entries, symlink targets, xattrs and statfs's counts published
//! for readers that take no lock (seed 000's lock-free read path on the engine's hottest
//! reads: getattr, lookup, readlink, getxattr, listxattr, statfs, readdir).
//!
//! What is published, and when:
//! - an *inode* when a getattr or lookup first finds it unpublished (and takes the lock to
//!   read it), so only inodes someone reads cost a copy here: a create does not publish the
//!   inode it makes;
//! - a *name* (directory, name -> inode) when a lookup under the lock found it. Only names:
//!   "." and "..", misses, and names in unpublished directories take the lock;
//! - a *symlink target* when a readlink under the lock read it, and an inode's *xattrs*,
//!   all of them, when a getxattr or listxattr under the lock read them (so a name the inode
//!   lacks is answered too). Both only up to `VALUE_BYTES_MAX` bytes, and xattrs only when
//!   every value is inline. Any change to the inode unpublishes both: every xattr change
//!   sets the inode's ctime, so no operation can change them unseen;
//! - *statfs's counts* when a statfs under the lock computed them, and again whenever an
//!   operation moves them while statfs keeps reading them (see `Published::space`);
//! - a *run of a directory's entries* (a [`Page`]) when a readdir under the lock returned it,
//!   with the directory's parent for "..": a directory's published listing is the runs read
//!   since it last changed, up to `LISTING_ENTRIES_MAX` entries. Every entry added or removed
//!   changes the directory's inode (size, times), and so does a rename that gives it a new
//!   parent or an rmdir, so any change to the directory's inode unpublishes its listing, as
//!   it does a symlink's target and xattrs. A readdir that finds its cookie in a run goes on
//!   from run to run, and takes the lock where the listing has none. Runs taken at different
//!   times may come from different states of the directory, as successive readdir calls
//!   under the lock may: each run is the directory's entries in its cookie range at one
//!   instant, and cookies are key offsets that never move (`readdir`), so an entry present
//!   for the whole listing is still returned exactly once.
//!
//! The inode cache and the directory indexes change only under the operation lock, and an
//! operation may change several inodes and names (a rename: up to four inodes, two names).
//! When the operation lets go of the lock (`Locked`'s drop), every published inode it changed
//! is published again (a new immutable copy stored in a [`BoxedMap`]: an XArray of boxes freed
//! through epochs), every inode it freed and every name it removed is unpublished. A sequence
//! count (`idxfs_index::SeqCount`, whose protocol loom checks) makes each publish one step for
//! readers: a reader whose reads no publish overlapped saw a state between two operations,
//! never one half-way through a publish. So a lookup cannot find a name a rename
//! removed together with the new link count of its inode, nor a getattr a new link count with
//! an old directory time. A reader that races a publish retries a few times, then takes the
//! lock.
//!
//! What is published is always what the cache and trees hold after a whole operation: the
//! lock holder publishes before releasing the lock, so a reader never sees an older state once
//! an operation that changed it has returned, and never a newer one before. Names are only
//! ever removed from the published set by writers, never changed: every path that takes a
//! name out of a directory goes through `Inner::remove_entry`, which records it, and a name
//! added by a create or rename is published only when a lookup reads it.
//!
//! Publication does not follow the inode cache's residency: when the cache drops a clean inode
//! its published copy stays, since it equals the tree's item, and every later change loads
//! the inode into the cache again (which records it). Only freeing an inode unpublishes it.
//! So a writer filling the cache with new inodes does not push readers back to the lock.
//! Each published set has its own bound, kept by the clock algorithm (second chance): a
//! reader sets its entry's `used` bit (one store, only when clear), and when a read's publish
//! takes a set past its bound, the lock holder sweeps from where its last sweep ended,
//! clearing set bits and unpublishing entries whose bit was clear, until an eighth of the
//! bound is free. Unpublishing changes nothing a reader could see but where it reads from.
//!
//! Allocation failure of an XArray node unpublishes the entry instead, so its readers take the
//! lock: nothing aborts, nothing is stale.
use super::DirEntryOut;
use idxfs_format::items::{InodeItem, S_IFDIR, S_IFMT};
use idxfs_index::{BoxedMap, SeqCount};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A directory entry as a lookup found it.
pub struct Name {
    pub dir: u64,
    pub name: Box<[u8]>,
    pub ino: u64,
}

/// A hash of the name `name` of `dir`; its top bits pick where the name is published
/// (`Published::slot`).
pub fn name_key(dir: u64, name: &[u8]) -> u64 {
    let h = idxfs_format::hash::name_hash(name) ^ dir.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // SplitMix64's finalizer: every bit of both inputs reaches every bit of the key.
    let h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^ (h >> 31)
}

/// An inode's extended attributes, every one: (name, value).
pub type Xattrs = Box<[(Box<[u8]>, Box<[u8]>)]>;

/// Most bytes of names and values an inode's published xattrs hold, and of a published
/// symlink target: longer ones are read under the lock. The sets are bounded by entries (as
/// many as inodes, a quarter as many targets), so this bounds their memory; most files have
/// no xattrs, whose published set is empty.
pub const VALUE_BYTES_MAX: usize = 1024;

/// Most entries one directory's published listing holds: a listing past it takes the lock
/// for its later runs. With at most `limit / 256` listings this bounds their memory to about
/// as many entries as the published names.
pub const LISTING_ENTRIES_MAX: usize = 4096;

/// A run of a directory's entries, in readdir's order, as one readdir under the lock read
/// them: every entry whose key offset lies in `from..to`.
#[derive(Debug)]
pub struct Page {
    /// The first key offset the run covers (a cookie past "." and "..").
    pub from: u64,
    /// The cookie after the run's last entry; with `end`, the run reaches the directory's end.
    pub to: u64,
    pub end: bool,
    /// Each with its own cookie, strictly rising (one entry per key).
    pub entries: Box<[DirEntryOut]>,
}

impl Page {
    /// Whether a readdir resuming at key offset `at` (not before "..") reads from this run.
    fn covers(&self, at: u64) -> bool {
        self.from <= at && (self.end || at < self.to)
    }

    /// Where the key offsets the run covers end (exclusive; the largest for the last run).
    fn reach(&self) -> u64 {
        if self.end {
            u64::MAX
        } else {
            self.to
        }
    }
}

/// A directory's published runs, disjoint and sorted, and its parent (for "..").
struct Listing {
    parent: u64,
    pages: Box<[Arc<Page>]>,
}

/// What a readdirplus without the lock read (`Published::readdir_plus`).
pub struct PlusRun {
    /// The directory's item, for ".".
    pub dir: InodeItem,
    /// The parent and its item, for "..".
    pub parent: (u64, InodeItem),
    pub entries: Vec<(DirEntryOut, InodeItem)>,
    /// Stopped at `want`: entries may follow.
    pub more: bool,
}

/// What statfs reports that changes: the rest is fixed for a mount.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpaceCounts {
    pub blocks_free: u64,
    pub blocks_avail: u64,
    pub files: u64,
    pub files_free: u64,
}

/// What an operation changed, to be published as one step.
#[derive(Default)]
pub struct Changes {
    /// Inodes and their items now; None: freed (or dropped right after the change), so
    /// unpublished. Each one's symlink target and xattrs are unpublished too.
    pub inodes: Vec<(u64, Option<InodeItem>)>,
    /// Keys (`name_key`) of names the operation removed.
    pub names_removed: Vec<u64>,
    /// statfs's counts as the operation left them, while they are published
    /// (`Published::space_live`; computing them is not free).
    pub space: Option<SpaceCounts>,
}

/// Read: also publish inodes not published yet, and this name, symlink target or xattr set.
#[derive(Default)]
pub struct Read {
    pub inodes: Vec<(u64, InodeItem)>,
    pub name: Option<Name>,
    /// A symlink's target (at most `VALUE_BYTES_MAX`).
    pub link: Option<(u64, Box<[u8]>)>,
    /// Every xattr of an inode (at most `VALUE_BYTES_MAX` of names and values).
    pub xattrs: Option<(u64, Xattrs)>,
    /// statfs's counts, computed for a statfs.
    pub space: Option<SpaceCounts>,
    /// A run of directory `.0`'s entries, whose parent is `.1`.
    pub page: Option<(u64, u64, Page)>,
}

pub struct Published {
    inodes: ClockMap<InodeItem>,
    /// Names by slot: the top `name_bits` of their `name_key`. Slots are dense (an XArray
    /// keyed by hashes spread over 64 bits would be eleven levels deep, a node per level for
    /// each name), and twice as many as the bound. A slot holds the names that share it, up to
    /// `BUCKET` (past that, a publish drops the oldest: this is a cache); a reader compares
    /// the whole name.
    names: ClockMap<Box<[Name]>>,
    name_bits: u32,
    /// Symlink targets. A target never changes, but any change to its inode unpublishes it
    /// with the inode's xattrs, so the rule that keeps them true is one and simple.
    links: ClockMap<Box<[u8]>>,
    /// Each inode's xattrs, whole, so an absent name is answered without the lock too (the
    /// common case: `ls -l` asks every file for its ACL and security label). Every change
    /// to an xattr changes its inode's ctime, which unpublishes the set.
    xattrs: ClockMap<Xattrs>,
    /// Directories' listings (`Page`s), by directory.
    listings: ClockMap<Listing>,
    /// statfs's counts (`SpaceCounts`, in field order), valid while `space_set`. They move
    /// with almost every operation, and computing and storing them would cost each one as
    /// much as its other publishing, so they are kept published only while statfs is asked:
    /// a statfs under the lock publishes them, and every operation that moves them publishes
    /// them again if a statfs read them since the last publish (`space_used`), else
    /// unpublishes them. So a statfs between every two operations never takes the lock, and
    /// one now and then costs one operation the counts and takes the lock itself.
    space: [AtomicU64; 4],
    space_set: AtomicBool,
    space_used: AtomicBool,
    /// Makes each publish one step for readers.
    seq: SeqCount,
    /// False: nothing is published, every read takes the lock (`bench_locked_reads`).
    enabled: bool,
}

/// Nothing published, nothing kept: what an `Inner` has until a front end's handle gives it
/// its own (`Fs::launch`).
impl Default for Published {
    fn default() -> Published {
        Published::new(16, false)
    }
}

impl Published {
    /// `limit`: most inodes, and most name slots (of up to `BUCKET` names each), kept
    /// published after a sweep.
    pub fn new(limit: usize, enabled: bool) -> Published {
        let limit = limit.max(16);
        Published {
            inodes: ClockMap::new(limit),
            names: ClockMap::new(limit),
            name_bits: (2 * limit).next_power_of_two().trailing_zeros(),
            // Symlinks are few beside files; xattrs are asked of every file `ls -l` lists.
            links: ClockMap::new(limit / 4),
            xattrs: ClockMap::new(limit),
            listings: ClockMap::new(limit / 256),
            space: Default::default(),
            space_set: AtomicBool::new(false),
            space_used: AtomicBool::new(false),
            seq: SeqCount::new(),
            enabled,
        }
    }

    /// Whether anything is published (false: every read takes the lock, and what a read
    /// under the lock would publish need not be gathered).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The slot of a name with `name_key` `key`.
    fn slot(&self, key: u64) -> u64 {
        key >> (64 - self.name_bits)
    }

    /// Runs `f` as a reader of one published state (`SeqCount`); None when nothing is
    /// published or writes kept overlapping it: the caller takes the lock.
    fn read<R>(&self, f: impl Fn() -> Option<R>) -> Option<R> {
        if !self.enabled {
            return None;
        }
        self.seq.read(16, f).flatten()
    }

    /// The item of `ino` as the last finished operation left it; None when not published (or
    /// publishes kept racing this read): the caller takes the lock.
    pub fn getattr(&self, ino: u64) -> Option<InodeItem> {
        self.read(|| self.inodes.get(ino, |it| *it))
    }

    /// The inode `name` in directory `dir` names, and its item, as the last finished operation
    /// left them; None when the directory, the name or the inode is not published.
    pub fn lookup(&self, dir: u64, name: &[u8]) -> Option<(u64, InodeItem)> {
        self.read(|| {
            let d = self.inodes.get(dir, |it| *it)?;
            if d.mode.get() & S_IFMT != S_IFDIR {
                return None;
            }
            let ino = self.names.get(self.slot(name_key(dir, name)), |b| {
                b.iter()
                    .find(|n| n.dir == dir && *n.name == *name)
                    .map(|n| n.ino)
            })??;
            Some((ino, self.inodes.get(ino, |it| *it)?))
        })
    }

    /// The target of symlink `ino`; None when not published.
    pub fn readlink(&self, ino: u64) -> Option<Vec<u8>> {
        self.read(|| self.links.get(ino, |t| t.to_vec()))
    }

    /// The value of xattr `name` of `ino` (None inside: the inode has no such xattr); None
    /// when the inode's xattrs are not published.
    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Option<Option<Vec<u8>>> {
        self.read(|| {
            self.xattrs.get(ino, |xs| {
                xs.iter()
                    .find(|(n, _)| **n == *name)
                    .map(|(_, v)| v.to_vec())
            })
        })
    }

    /// The names of every xattr of `ino`; None when not published.
    pub fn listxattr(&self, ino: u64) -> Option<Vec<Vec<u8>>> {
        self.read(|| {
            self.xattrs
                .get(ino, |xs| xs.iter().map(|(n, _)| n.to_vec()).collect())
        })
    }

    /// The parent of directory `dir` and its published run that a readdir resuming at key
    /// offset `at` reads from; None when there is none.
    pub fn readdir(&self, dir: u64, at: u64) -> Option<(u64, Arc<Page>)> {
        self.read(|| {
            self.listings.get(dir, |l| {
                let i = l.pages.partition_point(|p| p.from <= at);
                let p = l.pages.get(i.checked_sub(1)?)?;
                p.covers(at).then(|| (l.parent, p.clone()))
            })?
        })
    }

    /// For a readdirplus without the lock: up to `want` entries of `dir` from key offset
    /// `at` on, each with its inode's item, with the directory's own item and its parent's,
    /// all from one published state. None unless published runs reach `want` entries or the
    /// directory's end from `at`, and every inode among them is published: the caller takes
    /// the lock.
    pub fn readdir_plus(&self, dir: u64, at: u64, want: usize) -> Option<PlusRun> {
        self.read(|| {
            let dir_item = self.inodes.get(dir, |it| *it)?;
            self.listings.get(dir, |l| {
                let parent = (l.parent, self.inodes.get(l.parent, |it| *it)?);
                let mut entries = Vec::with_capacity(want.min(LISTING_ENTRIES_MAX));
                let mut at = at;
                loop {
                    let i = l.pages.partition_point(|p| p.from <= at);
                    let page = l.pages.get(i.checked_sub(1)?)?;
                    if !page.covers(at) {
                        return None;
                    }
                    for e in page.entries.iter().filter(|e| e.cookie > at) {
                        if entries.len() >= want {
                            return Some(PlusRun {
                                dir: dir_item,
                                parent,
                                entries,
                                more: true,
                            });
                        }
                        entries.push((e.clone(), self.inodes.get(e.ino, |it| *it)?));
                    }
                    if page.end {
                        return Some(PlusRun {
                            dir: dir_item,
                            parent,
                            entries,
                            more: false,
                        });
                    }
                    at = page.to;
                }
            })?
        })
    }

    /// Whether `dir`'s published listing has room for `n` more entries: a readdirplus
    /// under the lock publishes its run (and the run's inodes) only then, so a pass over a
    /// huge directory copies nothing past its first `LISTING_ENTRIES_MAX` entries.
    pub fn listing_room(&self, dir: u64, n: usize) -> bool {
        let have = self
            .listings
            .peek(dir, |l| {
                l.pages.iter().map(|p| p.entries.len()).sum::<usize>()
            })
            .unwrap_or(0);
        self.enabled && have + n <= LISTING_ENTRIES_MAX
    }

    /// statfs's counts as the last finished operation left them; None when they are not
    /// published (no statfs read them lately: see `Published::space`).
    pub fn statfs(&self) -> Option<SpaceCounts> {
        self.read(|| {
            if !self.space_set.load(Ordering::Relaxed) {
                return None;
            }
            if !self.space_used.load(Ordering::Relaxed) {
                self.space_used.store(true, Ordering::Relaxed);
            }
            let [a, b, c, d] = &self.space;
            Some(SpaceCounts {
                blocks_free: a.load(Ordering::Relaxed),
                blocks_avail: b.load(Ordering::Relaxed),
                files: c.load(Ordering::Relaxed),
                files_free: d.load(Ordering::Relaxed),
            })
        })
    }

    /// Whether statfs's counts are published: an operation that ends computes them for
    /// `Changes::space` only then.
    pub fn space_live(&self) -> bool {
        self.enabled && self.space_set.load(Ordering::Relaxed)
    }

    /// The counts published now (the lock holder's read: only it stores them).
    fn space_now(&self) -> Option<SpaceCounts> {
        let [a, b, c, d] = &self.space;
        self.space_set.load(Ordering::Relaxed).then(|| SpaceCounts {
            blocks_free: a.load(Ordering::Relaxed),
            blocks_avail: b.load(Ordering::Relaxed),
            files: c.load(Ordering::Relaxed),
            files_free: d.load(Ordering::Relaxed),
        })
    }

    /// Replaces the bucket of the names with `name_key` `key`: without the names of that key,
    /// plus `add` (whose key it is). Two different names with one 64-bit key both go: what is
    /// unpublished is only looked up under the lock again.
    fn rebucket(&self, key: u64, add: Option<Name>) {
        let slot = self.slot(key);
        let mut b: Vec<Name> = self
            .names
            .peek(slot, |b| {
                b.iter()
                    .filter(|n| name_key(n.dir, &n.name) != key)
                    .map(|n| Name {
                        dir: n.dir,
                        name: n.name.clone(),
                        ino: n.ino,
                    })
                    .collect()
            })
            .unwrap_or_default();
        if let Some(n) = add {
            if b.len() >= BUCKET {
                b.remove(0);
            }
            b.push(n);
        }
        if b.is_empty() {
            self.names.remove(slot);
        } else {
            self.names.set(slot, b.into_boxed_slice());
        }
    }

    /// Publishes what an operation changed, and what a read found (`read`), as one step.
    /// Called by the lock holder only.
    pub fn publish(&self, changed: Changes, read: Read) {
        if !self.enabled {
            return;
        }
        let dropped: Vec<u64> =
            if self.links.is_empty() && self.xattrs.is_empty() && self.listings.is_empty() {
                Vec::new()
            } else {
                changed
                    .inodes
                    .iter()
                    .map(|&(ino, _)| ino)
                    .filter(|&ino| {
                        self.links.contains(ino)
                            || self.xattrs.contains(ino)
                            || self.listings.contains(ino)
                    })
                    .collect()
            };
        let inodes: Vec<_> = changed
            .inodes
            .into_iter()
            .filter(|(ino, _)| self.inodes.contains(*ino))
            .collect();
        let names: Vec<u64> = changed
            .names_removed
            .into_iter()
            .filter(|&k| self.names.contains(self.slot(k)))
            .collect();
        // New counts: those a statfs read (it publishes them), else the operation's when
        // they moved: stored if a statfs read the last ones, else unpublished (`space`).
        let space = match (read.space, changed.space) {
            (Some(c), _) => {
                // Read just now: the next operation that moves them publishes them again.
                self.space_used.store(true, Ordering::Relaxed);
                Some(Some(c))
            }
            (None, Some(c)) if self.space_now() != Some(c) => {
                Some(self.space_used.swap(false, Ordering::Relaxed).then_some(c))
            }
            _ => None,
        };
        let read_nothing = read.inodes.is_empty()
            && read.name.is_none()
            && read.link.is_none()
            && read.xattrs.is_none()
            && read.page.is_none();
        if inodes.is_empty()
            && names.is_empty()
            && dropped.is_empty()
            && space.is_none()
            && read_nothing
        {
            return;
        }
        self.seq.write(|| {
            for &ino in &dropped {
                self.links.remove(ino);
                self.xattrs.remove(ino);
                self.listings.remove(ino);
            }
            match space {
                Some(Some(c)) => {
                    let [a, b, x, d] = &self.space;
                    a.store(c.blocks_free, Ordering::Relaxed);
                    b.store(c.blocks_avail, Ordering::Relaxed);
                    x.store(c.files, Ordering::Relaxed);
                    d.store(c.files_free, Ordering::Relaxed);
                    self.space_set.store(true, Ordering::Relaxed);
                }
                Some(None) => self.space_set.store(false, Ordering::Relaxed),
                None => {}
            }
            self.apply(inodes, names, read)
        });
        self.inodes.sweep();
        self.names.sweep();
        self.links.sweep();
        self.xattrs.sweep();
        self.listings.sweep();
    }

    /// The listing of `dir` with `page` in it: the runs it overlaps give way (they were read
    /// from the same state of the directory, or the listing would have been unpublished);
    /// None when that would take it past `LISTING_ENTRIES_MAX`.
    fn with_page(&self, dir: u64, parent: u64, page: Page) -> Option<Listing> {
        let overlaps = |p: &Page| p.from < page.reach() && page.from < p.reach();
        let mut pages: Vec<Arc<Page>> = self
            .listings
            .peek(dir, |l| {
                l.pages
                    .iter()
                    .filter(|p| l.parent == parent && !overlaps(p))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let entries: usize = pages.iter().map(|p| p.entries.len()).sum();
        if entries + page.entries.len() > LISTING_ENTRIES_MAX {
            return None;
        }
        let at = pages.partition_point(|p| p.from < page.from);
        pages.insert(at, Arc::new(page));
        Some(Listing {
            parent,
            pages: pages.into_boxed_slice(),
        })
    }

    /// The stores of one publish (inside the sequence count's write).
    fn apply(&self, inodes: Vec<(u64, Option<InodeItem>)>, names: Vec<u64>, read: Read) {
        for (ino, item) in inodes {
            match item {
                Some(it) => self.inodes.set(ino, it),
                None => self.inodes.remove(ino),
            }
        }
        for k in names {
            self.rebucket(k, None);
        }
        // A published inode is current already (the invariant): not copied again.
        for &(ino, it) in &read.inodes {
            if !self.inodes.contains(ino) {
                self.inodes.set(ino, it);
            }
        }
        if let Some(n) = read.name {
            self.rebucket(name_key(n.dir, &n.name), Some(n));
        }
        // Read under the lock after every change this publish carries: current.
        if let Some((ino, t)) = read.link {
            debug_assert!(t.len() <= VALUE_BYTES_MAX);
            self.links.set(ino, t);
        }
        if let Some((ino, xs)) = read.xattrs {
            debug_assert!(
                xs.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>() <= VALUE_BYTES_MAX
            );
            self.xattrs.set(ino, xs);
        }
        if let Some((dir, parent, page)) = read.page {
            debug_assert!(page.entries.windows(2).all(|w| w[0].cookie < w[1].cookie));
            if let Some(l) = self.with_page(dir, parent, page) {
                self.listings.set(dir, l);
            }
        }
    }
}

/// Most names one slot of `Published::names` holds.
const BUCKET: usize = 4;

/// One published value.
struct Entry<T> {
    val: T,
    /// Read since the last sweep passed it (the clock's reference bit).
    used: AtomicBool,
}

/// A [`BoxedMap`] bounded by the clock algorithm.
struct ClockMap<T: Send + Sync + 'static> {
    map: BoxedMap<Entry<T>>,
    /// Most entries kept after a sweep ends.
    limit: usize,
    /// Where the next sweep starts (changed by the lock holder only).
    hand: AtomicU64,
}

impl<T: Send + Sync + 'static> ClockMap<T> {
    fn new(limit: usize) -> Self {
        ClockMap {
            map: BoxedMap::default(),
            limit: limit.max(16),
            hand: AtomicU64::new(0),
        }
    }

    /// `f` of the value at `key`, marking it used; takes no lock.
    fn get<R>(&self, key: u64, f: impl FnOnce(&T) -> R) -> Option<R> {
        self.map.read(key, |e| {
            if !e.used.load(Ordering::Relaxed) {
                e.used.store(true, Ordering::Relaxed);
            }
            f(&e.val)
        })
    }

    /// `f` of the value at `key`, leaving its reference bit alone (the writer's read).
    fn peek<R>(&self, key: u64, f: impl FnOnce(&T) -> R) -> Option<R> {
        self.map.read(key, |e| f(&e.val))
    }

    fn contains(&self, key: u64) -> bool {
        self.map.contains(key)
    }

    fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Publishes `val` at `key`, its reference bit kept from the value it replaces (clear
    /// for a new entry: a second read makes it count, so one pass over many inodes, a
    /// writer's or a `find`'s, does not push out what readers keep using); if the XArray
    /// cannot grow, unpublishes `key` instead.
    fn set(&self, key: u64, val: T) {
        let used = self
            .map
            .read(key, |e| e.used.load(Ordering::Relaxed))
            .unwrap_or(false);
        let e = Entry {
            val,
            used: AtomicBool::new(used),
        };
        if self.map.set(key, e).is_err() {
            self.map.remove(key);
        }
    }

    fn remove(&self, key: u64) {
        self.map.remove(key);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }

    /// When past the bound, the clock's sweep: unpublish entries not read since the hand last
    /// passed them until an eighth of the bound is free.
    fn sweep(&self) {
        if self.map.len() <= self.limit {
            return;
        }
        let target = self.limit - self.limit / 8;
        let mut hand = self.hand.load(Ordering::Relaxed);
        // Two passes at most: the first clears every bit it finds set.
        let mut steps = 2 * self.map.len();
        while self.map.len() > target && steps > 0 {
            steps -= 1;
            let Some(key) = self.map.next_key(hand).or_else(|| self.map.next_key(0)) else {
                break;
            };
            hand = key.wrapping_add(1);
            let used = self
                .map
                .read(key, |e| e.used.swap(false, Ordering::Relaxed));
            if used == Some(false) {
                self.map.remove(key);
            }
        }
        self.hand.store(hand, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(mode: u32, nlink: u32) -> InodeItem {
        let mut it = crate::fs::new_inode_item(mode, Default::default(), 0, 1, Default::default());
        it.nlink = nlink.into();
        it
    }

    #[test]
    fn the_clock_keeps_what_readers_use_within_the_bound() {
        let p = Published::new(64, true);
        let read = |ino: u64| Read {
            inodes: vec![(ino, item(0o100644, 1))],
            ..Default::default()
        };
        for ino in 1..=64 {
            p.publish(Changes::default(), read(ino));
        }
        // Inodes 1..=8 are read between publishes, the others once: sweeps take only those.
        for ino in 65..=200 {
            for hot in 1..=8 {
                assert!(p.getattr(hot).is_some(), "hot inode {hot} was unpublished");
            }
            p.publish(Changes::default(), read(ino));
            assert!(p.inodes.len() <= 64, "past the bound: {}", p.inodes.len());
        }
        assert!(
            (65..=120).any(|i| p.getattr(i).is_none()),
            "nothing cold went"
        );
    }

    #[test]
    fn statfs_counts_stay_published_while_statfs_reads_them() {
        let p = Published::new(64, true);
        let counts = |free| SpaceCounts {
            blocks_free: free,
            blocks_avail: free / 2,
            files: 10,
            files_free: 5,
        };
        let op = |free| Changes {
            space: p.space_live().then(|| counts(free)),
            ..Default::default()
        };
        assert_eq!(p.statfs(), None, "nothing published yet");
        assert!(!p.space_live());
        p.publish(
            Changes::default(),
            Read {
                space: Some(counts(100)),
                ..Default::default()
            },
        );
        // Read under the lock just now: the next operation that moves them republishes.
        p.publish(op(90), Read::default());
        assert_eq!(p.statfs(), Some(counts(90)));
        p.publish(op(80), Read::default());
        assert_eq!(
            p.statfs(),
            Some(counts(80)),
            "read between operations: kept"
        );
        p.publish(op(80), Read::default());
        assert_eq!(p.statfs(), Some(counts(80)), "unchanged: kept");
        p.publish(op(70), Read::default());
        p.publish(op(60), Read::default());
        assert_eq!(
            p.statfs(),
            None,
            "moved twice unread: unpublished, not stale"
        );
        assert!(!p.space_live(), "operations no longer compute them");
    }

    #[test]
    fn a_lookup_needs_the_directory_the_name_and_the_inode() {
        let p = Published::new(64, true);
        let name = |ino| Name {
            dir: 1,
            name: b"a".to_vec().into(),
            ino,
        };
        p.publish(
            Changes::default(),
            Read {
                inodes: vec![(1, item(0o040755, 2)), (5, item(0o100644, 1))],
                name: Some(name(5)),
                ..Default::default()
            },
        );
        assert_eq!(p.lookup(1, b"a").map(|(i, _)| i), Some(5));
        assert_eq!(p.lookup(1, b"b"), None, "another name");
        assert_eq!(p.lookup(5, b"a"), None, "not a directory");
        // Removing the name unpublishes it; freeing the inode too.
        p.publish(
            Changes {
                names_removed: vec![name_key(1, b"a")],
                ..Default::default()
            },
            Read::default(),
        );
        assert_eq!(p.lookup(1, b"a"), None);
        p.publish(
            Changes::default(),
            Read {
                name: Some(name(5)),
                ..Default::default()
            },
        );
        p.publish(
            Changes {
                inodes: vec![(5, None)],
                ..Default::default()
            },
            Read::default(),
        );
        assert_eq!(p.lookup(1, b"a"), None, "the name's inode is gone");
        assert!(p.getattr(5).is_none());
    }
}
