//! readdir from the inode-order index (seed 002).
//!
//! Cookies: 0 starts a listing; 1 resumes after "."; 2 after ".."; any other value is the key
//! offset (child << 16 | slot) to resume from: an entry's cookie is its own key offset plus one.
//! Every entry has a key of its own (hard links of one inode take distinct slots, see `dir`),
//! and a key never changes while its entry exists, so an entry present for the whole listing is
//! returned exactly once, whatever else is created, removed or renamed meanwhile, and entries
//! come in inode-number order.
//!
//! Without the lock: a readdir whose cookie falls in a run of the directory's entries that an
//! earlier readdir under the lock published (`published::Page`) answers from it, run after
//! run, and takes the lock only where the published listing has no run. What a readdir under
//! the lock returns is published as a run (up to `published::LISTING_ENTRIES_MAX` entries
//! per directory).
//!
//! readdirplus the same way, with each entry's inode: a batch whose entries the published
//! runs hold, and whose inodes (and the directory's and its parent's, for "." and "..") are
//! all published, is read in one published state without the lock. A batch under the lock
//! publishes its run and its inodes, while the directory's listing has room (the first
//! `LISTING_ENTRIES_MAX` entries: a pass over a huge directory copies nothing past them).
//! The front end pins what it returns afterwards, without the operation lock (`pins`): an
//! entry whose last name went in between is refused its pin, and its inode answers ENOENT,
//! as for a lookup that raced the same unlink.
use super::dir::dir_ino_offset;
use super::{published, Attr, DirEntryOut, Fs, Inner, Ino};
use crate::counters::Counters;
use crate::error::Result;
use idxfs_format::items::{decode_dir_entries, decode_inode, InodeItem};
use idxfs_format::{ItemType, Key};

const DT_DIR: u8 = 4;

impl Fs {
    /// Calls `f` for each entry from `cookie` on, in inode order, until it returns false
    /// (the entry it refused is not consumed: resume with the previous entry's cookie).
    pub fn readdir(
        &self,
        dir: Ino,
        cookie: u64,
        mut f: impl FnMut(&DirEntryOut) -> bool,
    ) -> Result<()> {
        let mut cookie = cookie;
        let first = dir_ino_offset(1, 0);
        while let Some((parent, page)) = self.hand.published.readdir(dir, cookie.max(first)) {
            Counters::inc(&self.shared.counters.readdir_lock_free);
            if cookie == 0 && !f(&dot(dir)) {
                return Ok(());
            }
            if cookie <= 1 && !f(&dot_dot(parent)) {
                return Ok(());
            }
            let from = cookie.max(first);
            for e in page.entries.iter().filter(|e| e.cookie > from) {
                if !f(e) {
                    return Ok(());
                }
            }
            if page.end {
                return Ok(());
            }
            cookie = page.to;
        }
        let mut g = self.lock();
        if !self.hand.published.enabled() {
            return g.readdir_in(dir, cookie, f).map(drop);
        }
        // What `f` took, for the next readdir to find without the lock: the first
        // `LISTING_ENTRIES_MAX` entries, and whether it took more.
        let mut run: Vec<DirEntryOut> = Vec::new();
        let mut past = false;
        let scan = g.readdir_in(dir, cookie, |e| {
            if !f(e) {
                return false;
            }
            // "." and ".." (cookies 1 and 2) are not a run's: a reader makes them.
            if e.cookie > 2 {
                if run.len() < published::LISTING_ENTRIES_MAX {
                    run.push(e.clone());
                } else {
                    past = true;
                }
            }
            true
        })?;
        // A run holds every entry of its key range, each with its own cookie: only when
        // every key read held one entry (fsck checks it).
        if !scan.single {
            return Ok(());
        }
        let end = scan.ended && !past;
        let to = match (run.last(), end) {
            (_, true) => u64::MAX,
            (Some(e), false) => e.cookie,
            (None, false) => return Ok(()),
        };
        let parent = match scan.parent {
            Some(p) => p,
            None => g.parent_of(dir)?,
        };
        let page = published::Page {
            from: cookie.max(first),
            to,
            end,
            entries: run.into_boxed_slice(),
        };
        g.publish_read(published::Read {
            page: Some((dir, parent, page)),
            ..Default::default()
        });
        Ok(())
    }

    /// readdir with each entry's attributes ("readdirplus"). Up to `limit` names are read from
    /// the inode-order index, then their inode items, in the same order and under the same
    /// lock: a whole-directory pass walks the names and the inodes each in key order.
    pub fn readdir_plus(
        &self,
        dir: Ino,
        cookie: u64,
        limit: usize,
        mut f: impl FnMut(&DirEntryOut, &Attr) -> bool,
    ) -> Result<()> {
        for (e, a) in &self.readdir_plus_batch(dir, cookie, limit)?.entries {
            if !f(e, a) {
                break;
            }
        }
        Ok(())
    }

    /// Up to `limit` entries from `cookie` on with their attributes, as `readdir_plus` reads
    /// them, and the change sequence they were read at: while it stands, reading them again
    /// would give the same batch, so a front end may read ahead ([`Fs::pin_if_unchanged`]).
    pub fn readdir_plus_batch(&self, dir: Ino, cookie: u64, limit: usize) -> Result<PlusBatch> {
        let limit = limit.max(1);
        if let Some(b) = self.readdir_plus_published(dir, cookie, limit) {
            Counters::inc(&self.shared.counters.readdirplus_lock_free);
            return Ok(b);
        }
        let mut g = self.lock();
        let mut batch = Vec::with_capacity(limit.min(4096));
        let scan = g.readdir_in(dir, cookie, |e| {
            batch.push(e.clone());
            batch.len() < limit
        })?;
        let more = batch.len() >= limit;
        let inos: Vec<Ino> = batch.iter().map(|e| e.ino).collect();
        let items = g.inodes_in_order(&inos)?;
        // The run and its inodes, for the next readdirplus to read without the lock (see
        // the module notes), while the directory's listing has room. The batch took every
        // entry it was offered: the last one ends the run.
        let named = batch.iter().filter(|e| e.cookie > 2).count();
        if scan.single && self.hand.published.listing_room(dir, named) {
            let run: Vec<(DirEntryOut, InodeItem)> = batch
                .iter()
                .zip(&items)
                .filter(|(e, _)| e.cookie > 2)
                .map(|(e, it)| (e.clone(), *it))
                .collect();
            let end = scan.ended;
            let to = match (run.last(), end) {
                (_, true) => Some(u64::MAX),
                (Some((e, _)), false) => Some(e.cookie),
                (None, false) => None,
            };
            if let Some(to) = to {
                let parent = match scan.parent {
                    Some(p) => p,
                    None => g.parent_of(dir)?,
                };
                let mut inodes: Vec<(Ino, InodeItem)> =
                    run.iter().map(|(e, it)| (e.ino, *it)).collect();
                inodes.push((dir, g.inode(dir)?));
                inodes.push((parent, g.inode(parent)?));
                let page = published::Page {
                    from: cookie.max(dir_ino_offset(1, 0)),
                    to,
                    end,
                    entries: run.into_iter().map(|(e, _)| e).collect(),
                };
                g.publish_read(published::Read {
                    inodes,
                    page: Some((dir, parent, page)),
                    ..Default::default()
                });
            }
        }
        let entries = batch
            .into_iter()
            .zip(&items)
            .map(|(e, it)| {
                let a = Attr::from_item(e.ino, it);
                (e, a)
            })
            .collect();
        Ok(PlusBatch {
            seq: g.store.changes.mod_seq,
            entries,
            more,
        })
    }

    /// `readdir_plus_batch` from what is published (`Published::readdir_plus`), as the last
    /// finished operation left the directory and its inodes; None: take the lock.
    fn readdir_plus_published(&self, dir: Ino, cookie: u64, limit: usize) -> Option<PlusBatch> {
        let dots = match cookie {
            0 => 2,
            1 => 1,
            _ => 0,
        };
        let want = limit.checked_sub(dots).filter(|&w| w > 0)?;
        // The handle's tree's: each open tree publishes its own (`trees.rs`).
        let run =
            (self.hand.published).readdir_plus(dir, cookie.max(dir_ino_offset(1, 0)), want)?;
        let mut entries = Vec::with_capacity(run.entries.len() + dots);
        if cookie == 0 {
            entries.push((dot(dir), Attr::from_item(dir, &run.dir)));
        }
        if cookie <= 1 {
            let (p, it) = run.parent;
            entries.push((dot_dot(p), Attr::from_item(p, &it)));
        }
        entries.extend(run.entries.into_iter().map(|(e, it)| {
            let a = Attr::from_item(e.ino, &it);
            (e, a)
        }));
        Some(PlusBatch {
            seq: PlusBatch::UNSEQUENCED,
            entries,
            more: run.more,
        })
    }

    /// Pins each of `inos` if nothing changed since `seq` (a [`PlusBatch`]'s), under one lock:
    /// a batch read ahead is then exactly what a fresh read would give, and its inodes are held
    /// before any change can come. False (nothing pinned) when something changed.
    pub fn pin_if_unchanged(&self, seq: u64, inos: &[Ino]) -> bool {
        let g = self.lock();
        if g.store.changes.mod_seq != seq {
            return false;
        }
        // Under the operation lock, so no operation comes between the check and the pins.
        self.pin_all(inos);
        drop(g);
        true
    }
}

/// A readdirplus batch and the change sequence (`Store::mod_seq`, which every change to the
/// tree or to a cached inode moves and a commit leaves as it was) it was read at.
#[derive(Debug, Clone)]
pub struct PlusBatch {
    /// `UNSEQUENCED` for a batch read without the lock: `pin_if_unchanged` never takes it.
    pub seq: u64,
    pub entries: Vec<(DirEntryOut, Attr)>,
    /// The batch stopped at its limit, not at the end of the directory: entries may follow.
    pub more: bool,
}

impl PlusBatch {
    /// The `seq` of a batch read without the lock.
    pub const UNSEQUENCED: u64 = u64::MAX;
}

impl Fs {
    /// All entries except "." and "..": convenient for tests and tools.
    pub fn list(&self, dir: Ino) -> Result<Vec<DirEntryOut>> {
        let mut out = Vec::new();
        self.readdir(dir, 2, |e| {
            out.push(e.clone());
            true
        })?;
        Ok(out)
    }
}

/// Inode numbers at most this far apart are read by one scan (the items between them
/// are stepped through); farther apart, the next scan descends from the root. A leaf holds
/// about 90 inodes with their back references: a gap of 32 numbers is at most half a leaf
/// of items stepped through, about what a descent through cached nodes costs.
const SCAN_GAP: u64 = 32;

impl Inner {
    /// The inode items of `inos` (in readdir's order: ascending, after "." and ".."): cached
    /// inodes (maybe changed since the last commit) as they are, the rest with ordered scans
    /// of the tree over their key range, so a directory pass reads inode leaves once each, in
    /// order. Wanted numbers more than `SCAN_GAP` apart start a new scan (one descent), so
    /// the runs of other directories' inodes between a directory's own runs
    /// (`super::ino_runs`) are stepped over, not read. Where the wanted inodes are sparse
    /// within a scan (other files' items between them), it gives up after a budget and the
    /// rest are looked up one by one.
    fn inodes_in_order(&mut self, inos: &[Ino]) -> Result<Vec<InodeItem>> {
        let mut out: Vec<Option<InodeItem>> =
            inos.iter().map(|i| self.inodes.get(*i).copied()).collect();
        let mut missing: Vec<usize> = (0..inos.len()).filter(|i| out[*i].is_none()).collect();
        // The scan wants them ascending: "." and ".." may sort after the first children.
        // Already sorted but for those, so this costs one pass.
        missing.sort_by_key(|&i| inos[i]);
        let tree = self.fs_tree;
        let mut rest = &missing[..];
        while let Some(&a) = rest.first() {
            // This scan's wanted numbers: up to the first gap wider than SCAN_GAP.
            let len = 1 + rest
                .windows(2)
                .take_while(|w| inos[w[1]] - inos[w[0]] <= SCAN_GAP)
                .count();
            let (part, after) = rest.split_at(len);
            rest = after;
            let b = part[len - 1];
            let budget = 16 * part.len() + 256;
            let (mut visited, mut j) = (0usize, 0usize);
            tree.scan(
                &mut self.store,
                Key::new(inos[a], ItemType::Inode, 0),
                Key::new(inos[b], ItemType::Inode, 1),
                |k, v| {
                    visited += 1;
                    if k.item_type() == Some(ItemType::Inode) {
                        while j < part.len() && inos[part[j]] < k.objectid {
                            j += 1;
                        }
                        while j < part.len() && inos[part[j]] == k.objectid {
                            out[part[j]] = Some(decode_inode(v, k.objectid)?);
                            j += 1;
                        }
                    }
                    Ok(j < part.len() && visited < budget)
                },
            )?;
        }
        let found = missing.iter().filter(|i| out[**i].is_some()).count() as u64;
        Counters::add(&self.store.counters.inode_scan_reads, found);
        out.into_iter()
            .zip(inos)
            .map(|(it, ino)| match it {
                Some(it) => Ok(it),
                None => {
                    Counters::inc(&self.store.counters.inode_scan_fallbacks);
                    self.inode(*ino)
                }
            })
            .collect()
    }

    fn readdir_in(
        &mut self,
        dir: Ino,
        cookie: u64,
        mut f: impl FnMut(&DirEntryOut) -> bool,
    ) -> Result<Scan> {
        let g = self;
        let mut scan = Scan {
            ended: false,
            single: true,
            parent: None,
        };
        if g.dir_inode(dir)?.nlink.get() == 0 {
            return Err(crate::error::Error::NotFound); // removed while open, like a dead dir
        }
        if cookie == 0 && !f(&dot(dir)) {
            return Ok(scan);
        }
        if cookie <= 1 {
            let parent = g.parent_of(dir)?;
            scan.parent = Some(parent);
            if !f(&dot_dot(parent)) {
                return Ok(scan);
            }
        }
        let start = cookie.max(dir_ino_offset(1, 0));
        let tree = g.fs_tree;
        let mut err = None;
        let mut refused = false;
        tree.scan(
            &mut g.store,
            Key::new(dir, ItemType::DirIno, start),
            Key::new(dir, ItemType::DirIno, u64::MAX),
            |k, v| {
                let es = match decode_dir_entries(v, format_args!("dir item {k}")) {
                    Ok(es) => es,
                    Err(e) => {
                        err = Some(e);
                        return Ok(false);
                    }
                };
                let n = es.len();
                scan.single &= n == 1;
                for (i, e) in es.into_iter().enumerate() {
                    // One entry per key (fsck checks it). Were there more, they would share the
                    // key's cookie until the last: a resume inside the item repeats earlier names
                    // rather than losing later ones.
                    let cookie = if i + 1 == n { k.offset + 1 } else { k.offset };
                    if !f(&DirEntryOut {
                        ino: e.ino,
                        dtype: e.dtype,
                        name: e.name,
                        cookie,
                    }) {
                        refused = true;
                        return Ok(false);
                    }
                }
                Ok(true)
            },
        )?;
        if let Some(e) = err {
            return Err(e.into());
        }
        scan.ended = !refused;
        Ok(scan)
    }
}

/// How a readdir under the lock went, for publishing what it read.
struct Scan {
    /// Every entry from the cookie on was offered and taken: the directory ends here.
    ended: bool,
    /// Every key read held one entry (fsck checks it), so each entry has its own cookie.
    single: bool,
    /// The parent, when ".." was read.
    parent: Option<Ino>,
}

fn dot(dir: Ino) -> DirEntryOut {
    DirEntryOut {
        ino: dir,
        dtype: DT_DIR,
        name: b".".to_vec(),
        cookie: 1,
    }
}

fn dot_dot(parent: Ino) -> DirEntryOut {
    DirEntryOut {
        ino: parent,
        dtype: DT_DIR,
        name: b"..".to_vec(),
        cookie: 2,
    }
}
