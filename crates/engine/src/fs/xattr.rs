//! Extended attributes: `(ino, Xattr, hash(name))` -> list of entries (names that collide on
//! the hash share the item).
//!
//! A value whose entry fits a quarter of an item lives in the entry. A longer one, up to
//! Linux's 65,536 bytes, lives in `(ino, XattrChunk, base + i)` items of up to one item's
//! worth each, and its entry holds the length and the base. A base has its low 8 bits clear
//! and is chosen from the name's hash, probing upwards past bases in use, so the chunks of
//! one value sit together and never meet another value's.
//!
//! Limits, as Linux's: names up to 255 bytes, values up to 65,536 bytes, and the names of one
//! inode (with a NUL each, as listxattr returns them) up to 65,536 bytes; past that a new name
//! gets ENOSPC, as a full xattr block does on ext4.
use super::published::{self, Xattrs};
use super::{acl, Durable, Fs, Inner, Ino, Reserve, XATTR_CREATE, XATTR_REPLACE};
use crate::btree::{Change, LeafHint};
use crate::counters::Counters;
use crate::error::{Error, Result};
use idxfs_format::items::{
    decode_xattrs, encode_xattrs, xattr_entry_size, XattrEntry, XattrValue, XATTR_CHUNKS_MAX,
    XATTR_VALUE_MAX,
};
use idxfs_format::node::{max_item_size, ITEM_HEADER_SIZE};
use idxfs_format::versions::INCOMPAT_XATTR_CHUNKS;
use idxfs_format::{Corrupt, ItemType, Key};

/// Linux's XATTR_LIST_MAX: the most a listxattr answer may hold.
const XATTR_LIST_MAX: usize = 65536;

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(Error::Invalid("empty xattr name"));
    }
    if name.len() > 255 {
        return Err(Error::NameTooLong);
    }
    Ok(())
}

/// The largest entry kept inline: a quarter of an item, so colliding names rarely fill one.
fn inline_limit(node_size: u32) -> usize {
    max_item_size(node_size) / 4
}

fn chunk_key(ino: Ino, at: u64) -> Key {
    Key::new(ino, ItemType::XattrChunk, at)
}

/// One xattr change, checked and worked out (`Inner::plan_xattr`), not yet made.
pub(crate) struct XattrPlan {
    ino: Ino,
    name: Vec<u8>,
    /// The item the name hashes to, and its entries after the change (a long value's entry
    /// with a placeholder base until its chunks are placed).
    key: Key,
    xs: Vec<XattrEntry>,
    /// The value the change replaces, whose chunks go.
    old: Option<XattrValue>,
    /// A value long enough for chunks.
    long: Option<Vec<u8>>,
    /// New nodes the change may allocate: the caller reserves them before the first change.
    pub nodes: u64,
}

impl Inner {
    /// The entries of the xattr item `name` hashes to (empty: none), and its key.
    fn xattr_item(&mut self, ino: Ino, name: &[u8]) -> Result<(Key, Vec<XattrEntry>)> {
        let key = Key::new(ino, ItemType::Xattr, (self.policy.hash)(name));
        let tree = self.fs_tree;
        let xs = match tree.get(&mut self.store, &key)? {
            Some(v) => decode_xattrs(&v, format_args!("xattr {key}"))?,
            None => Vec::new(),
        };
        Ok((key, xs))
    }

    /// The value of `ino`'s xattr `name`; NoData when it has none.
    pub(crate) fn xattr_value(&mut self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        let (_, xs) = self.xattr_item(ino, name)?;
        let x = xs
            .into_iter()
            .find(|x| x.name == name)
            .ok_or(Error::NoData)?;
        match x.value {
            XattrValue::Inline(v) => Ok(v),
            XattrValue::Chunked { len, base } => self.read_chunks(ino, len, base),
        }
    }

    /// Removes `ino`'s xattr `name` and sets the change time; NoData, changing nothing, when
    /// it has none. The caller reserved for it (the shrinking changes of 4 items).
    pub(crate) fn remove_xattr(&mut self, ino: Ino, name: &[u8]) -> Result<()> {
        let (key, mut xs) = self.xattr_item(ino, name)?;
        let i = xs
            .iter()
            .position(|x| x.name == name)
            .ok_or(Error::NoData)?;
        let gone = xs.remove(i);
        if let XattrValue::Chunked { base, .. } = gone.value {
            self.delete_chunks(ino, base)?;
        }
        self.fs_tree.update(&mut self.store, &key, |v| {
            if xs.is_empty() {
                return Change::Delete;
            }
            *v = encode_xattrs(&xs);
            Change::Keep
        })?;
        let now = self.now();
        self.modify_inode(ino, |i| i.ctime = now)?;
        Ok(())
    }

    /// Checks that `ino` may get xattr `name` = `value` under `flags` and works out the
    /// change, changing nothing: the caller reserves `nodes` and then calls `put_xattr`.
    pub(crate) fn plan_xattr(
        &mut self,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> Result<XattrPlan> {
        let ns = self.store.node_size;
        let (key, mut xs) = self.xattr_item(ino, name)?;
        let pos = xs.iter().position(|x| x.name == name);
        match (pos, flags & (XATTR_CREATE | XATTR_REPLACE)) {
            (Some(_), XATTR_CREATE) => return Err(Error::Exists),
            (None, XATTR_REPLACE) => return Err(Error::NoData),
            _ => {}
        }
        if pos.is_none() && self.xattr_names_len(ino)? + name.len() + 1 > XATTR_LIST_MAX {
            return Err(Error::NoSpace);
        }
        let long = xattr_entry_size(name.len(), value.len()) > inline_limit(ns);
        // Everything checked before the first change: the item's room (a long entry's base
        // is a placeholder of the same size), the space for the new pieces as one run, and
        // the old ones' removal.
        let entry = XattrEntry {
            name: name.to_vec(),
            value: if long {
                XattrValue::Chunked {
                    len: value.len() as u32,
                    base: 0,
                }
            } else {
                XattrValue::Inline(value.to_vec())
            },
        };
        let old = match pos {
            Some(i) => Some(std::mem::replace(&mut xs[i], entry).value),
            None => {
                xs.push(entry);
                None
            }
        };
        if encode_xattrs(&xs).len() > max_item_size(ns) {
            return Err(Error::NoSpace);
        }
        Ok(XattrPlan {
            ino,
            name: name.to_vec(),
            key,
            xs,
            old,
            long: long.then(|| value.to_vec()),
            nodes: self.xattr_nodes(name.len(), value.len()),
        })
    }

    /// New nodes setting an xattr with a name and value of these lengths may allocate: its
    /// chunks as one run, and the changes of its item and of an old value's chunks.
    pub(crate) fn xattr_nodes(&self, name_len: usize, value_len: usize) -> u64 {
        let ns = self.store.node_size;
        let pieces = if xattr_entry_size(name_len, value_len) > inline_limit(ns) {
            value_len.div_ceil(max_item_size(ns)) as u64
        } else {
            0
        };
        let run = self.run_nodes(pieces, value_len as u64 + pieces * ITEM_HEADER_SIZE as u64);
        run + 4 * self.item_nodes()
    }

    /// Makes the change `plan_xattr` worked out (the caller reserved its nodes). Sets no
    /// time: the caller does, with its other changes.
    pub(crate) fn put_xattr(&mut self, plan: XattrPlan) -> Result<()> {
        let XattrPlan {
            ino,
            name,
            key,
            mut xs,
            old,
            long,
            ..
        } = plan;
        if long.is_some() {
            self.require_incompat(INCOMPAT_XATTR_CHUNKS);
        }
        if let Some(XattrValue::Chunked { base, .. }) = old {
            self.delete_chunks(ino, base)?;
        }
        if let Some(value) = long {
            let base = self.free_chunk_base(ino, key.offset)?;
            let mut hint = LeafHint::default();
            let chunk = max_item_size(self.store.node_size);
            for (i, piece) in value.chunks(chunk).enumerate() {
                let had = self.fs_tree.insert_near(
                    &mut self.store,
                    chunk_key(ino, base + i as u64),
                    piece.to_vec(),
                    &mut hint,
                )?;
                if had.is_some() {
                    return Err(Corrupt::new(
                        format!("xattr chunk {:#x} of inode {ino}", base + i as u64),
                        "present",
                        "absent (its range was free)",
                    )
                    .into());
                }
            }
            if let Some(x) = xs.iter_mut().find(|x| x.name == name) {
                x.value = XattrValue::Chunked {
                    len: value.len() as u32,
                    base,
                };
            }
        }
        self.fs_tree.put(&mut self.store, key, encode_xattrs(&xs))?;
        Ok(())
    }

    /// A long value's bytes, from its chunks.
    fn read_chunks(&mut self, ino: Ino, len: u32, base: u64) -> Result<Vec<u8>> {
        let tree = self.fs_tree;
        let mut out = Vec::with_capacity(len as usize);
        let mut next = base;
        let mut bad = false;
        tree.scan(
            &mut self.store,
            chunk_key(ino, base),
            chunk_key(ino, base + XATTR_CHUNKS_MAX),
            |k, v| {
                if k.offset != next || out.len() + v.len() > len as usize || v.is_empty() {
                    bad = true;
                    return Ok(false);
                }
                out.extend_from_slice(v);
                next += 1;
                Ok(out.len() < len as usize)
            },
        )?;
        if bad || out.len() != len as usize {
            return Err(Corrupt::new(
                format!("xattr chunks of inode {ino} at {base:#x}"),
                format!("{} bytes in {} pieces", out.len(), next - base),
                format!("{len} bytes in consecutive pieces"),
            )
            .into());
        }
        Ok(out)
    }

    /// Removes a long value's chunks (at most two leaves' worth: bounded).
    fn delete_chunks(&mut self, ino: Ino, base: u64) -> Result<()> {
        let (lo, hi) = (
            chunk_key(ino, base),
            chunk_key(ino, base + XATTR_CHUNKS_MAX),
        );
        while !self
            .fs_tree
            .delete_batch(&mut self.store, lo, hi, XATTR_CHUNKS_MAX as usize)?
            .is_empty()
        {}
        Ok(())
    }

    /// A chunk base for a new long value of `ino` from the name's hash `h`: the first, from
    /// there up, whose range holds no chunk.
    fn free_chunk_base(&mut self, ino: Ino, h: u64) -> Result<u64> {
        let tree = self.fs_tree;
        let mut base = h & !(XATTR_CHUNKS_MAX - 1);
        loop {
            let used = tree
                .last_at_or_before(
                    &mut self.store,
                    chunk_key(ino, base),
                    chunk_key(ino, base + (XATTR_CHUNKS_MAX - 1)),
                )?
                .is_some();
            if !used {
                return Ok(base);
            }
            // An inode has far fewer values than bases: this ends after a few steps.
            base = base.wrapping_add(XATTR_CHUNKS_MAX) & !(XATTR_CHUNKS_MAX - 1);
            if base > u64::MAX - XATTR_CHUNKS_MAX {
                base = 0;
            }
        }
    }

    /// Bytes listxattr returns for `ino`: every name with its NUL.
    fn xattr_names_len(&mut self, ino: Ino) -> Result<usize> {
        Ok(self.xattr_names(ino)?.iter().map(|n| n.len() + 1).sum())
    }

    /// Every xattr of `ino`, when each value is inline and names and values together fit
    /// `published::VALUE_BYTES_MAX`: the set getxattr and listxattr publish; else None.
    fn xattr_set(&mut self, ino: Ino) -> Result<Option<Xattrs>> {
        let mut out = Vec::new();
        let mut bytes = 0;
        let mut fits = true;
        self.each_xattr(ino, |x| {
            match x.value {
                XattrValue::Inline(v) => {
                    bytes += x.name.len() + v.len();
                    out.push((x.name.into_boxed_slice(), v.into_boxed_slice()));
                    fits = bytes <= published::VALUE_BYTES_MAX;
                }
                XattrValue::Chunked { .. } => fits = false,
            }
            fits
        })?;
        Ok(fits.then(|| out.into_boxed_slice()))
    }

    fn xattr_names(&mut self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        self.each_xattr(ino, |x| {
            out.push(x.name);
            true
        })?;
        Ok(out)
    }

    /// Whether `ino` has any xattr (one item read at most).
    pub(crate) fn has_xattrs(&mut self, ino: Ino) -> Result<bool> {
        let mut any = false;
        self.each_xattr(ino, |_| {
            any = true;
            false
        })?;
        Ok(any)
    }

    /// Calls `f` with each xattr entry of `ino`, in name-hash order, until it returns false.
    fn each_xattr(&mut self, ino: Ino, mut f: impl FnMut(XattrEntry) -> bool) -> Result<()> {
        let tree = self.fs_tree;
        let mut err = None;
        tree.scan(
            &mut self.store,
            Key::new(ino, ItemType::Xattr, 0),
            Key::new(ino, ItemType::Xattr, u64::MAX),
            |k, v| match decode_xattrs(v, format_args!("xattr {k}")) {
                Ok(xs) => Ok(xs.into_iter().all(&mut f)),
                Err(e) => {
                    err = Some(e);
                    Ok(false)
                }
            },
        )?;
        match err {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}

impl Fs {
    /// An xattr's value: without the lock when the inode's xattrs are published (read
    /// before, all inline and small), else under it, which publishes them if they may be.
    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        check_name(name)?;
        self.acl_allowed(name)?;
        if let Some(v) = self.hand.published.getxattr(ino, name) {
            Counters::inc(&self.shared.counters.xattr_lock_free);
            return v.ok_or(Error::NoData);
        }
        let mut g = self.lock();
        g.inode(ino)?;
        if let Some(set) = g.xattr_set(ino)? {
            let v = set
                .iter()
                .find(|(n, _)| **n == *name)
                .map(|(_, v)| v.to_vec());
            g.publish_read(published::Read {
                xattrs: Some((ino, set)),
                ..Default::default()
            });
            return v.ok_or(Error::NoData);
        }
        g.xattr_value(ino, name)
    }

    /// The names of an inode's xattrs, published as getxattr's are.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let mut names = self.listxattr_all(ino)?;
        if !self.shared.acl {
            names.retain(|n| !acl::is_acl(n));
        }
        Ok(names)
    }

    fn listxattr_all(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        if let Some(names) = self.hand.published.listxattr(ino) {
            Counters::inc(&self.shared.counters.xattr_lock_free);
            return Ok(names);
        }
        let mut g = self.lock();
        g.inode(ino)?;
        if let Some(set) = g.xattr_set(ino)? {
            let names = set.iter().map(|(n, _)| n.to_vec()).collect();
            g.publish_read(published::Read {
                xattrs: Some((ino, set)),
                ..Default::default()
            });
            return Ok(names);
        }
        g.xattr_names(ino)
    }

    /// Refuses the ACL names when ACLs are off (`OpenOptions::acl`), as a file system
    /// mounted `noacl` does; listxattr leaves them out then.
    fn acl_allowed(&self, name: &[u8]) -> Result<()> {
        if acl::is_acl(name) && !self.shared.acl {
            return Err(Error::NotSupported("ACLs are off (-o noacl)"));
        }
        Ok(())
    }

    pub fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        self.setxattr_with(ino, name, value, flags, false)
    }

    /// `setxattr`, for a caller whose privileges a front end knows: `kill_sgid` says that
    /// setting an access ACL drops set-group-ID (the caller is outside the file's group and
    /// lacks CAP_FSETID, FUSE's `FUSE_SETXATTR_ACL_KILL_SGID`). ACL names go through `acl`.
    pub fn setxattr_with(
        &self,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        flags: u32,
        kill_sgid: bool,
    ) -> Result<()> {
        check_name(name)?;
        if value.len() > XATTR_VALUE_MAX {
            return Err(Error::TooBig);
        }
        self.write_op(0, Reserve::Grow, Durable::Data, |g| {
            g.inode(ino)?;
            if acl::is_acl(name) {
                return g.set_acl(ino, name, value, kill_sgid);
            }
            let plan = g.plan_xattr(ino, name, value, flags)?;
            g.reserve_nodes(plan.nodes, 0, Reserve::Grow)?;
            g.put_xattr(plan)?;
            let now = g.now();
            g.modify_inode(ino, |i| i.ctime = now)?;
            Ok(())
        })
    }

    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()> {
        check_name(name)?;
        self.acl_allowed(name)?;
        self.write_op(4, Reserve::Shrink, Durable::Data, |g| {
            g.inode(ino)?;
            match g.remove_xattr(ino, name) {
                // Removing an ACL a file does not have succeeds, as the kernel's own file
                // systems answer (an ACL call, not an xattr one: `acl`).
                Err(Error::NoData) if acl::is_acl(name) => Ok(()),
                r => r,
            }
        })
    }
}
