//! Extended attributes: (ino, Xattr, hash(name)) -> list of (name, value).
use super::{Fs, Ino, Reserve, XATTR_CREATE, XATTR_REPLACE};
use crate::btree::Change;
use crate::error::{Error, Result};
use idxfs_format::items::{decode_xattrs, encode_xattrs, xattr_entry_size, XattrEntry};
use idxfs_format::node::max_item_size;
use idxfs_format::{ItemType, Key};

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(Error::Invalid("empty xattr name"));
    }
    if name.len() > 255 {
        return Err(Error::NameTooLong);
    }
    Ok(())
}

impl Fs {
    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        check_name(name)?;
        let mut g = self.lock();
        g.inode(ino)?;
        let key = Key::new(ino, ItemType::Xattr, (g.hash)(name));
        let tree = g.fs_tree;
        let v = tree.get(&mut g.store, &key)?.ok_or(Error::NoData)?;
        let xs = decode_xattrs(&v, format_args!("xattr {key}"))?;
        xs.into_iter()
            .find(|x| x.name == name)
            .map(|x| x.value)
            .ok_or(Error::NoData)
    }

    pub fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let mut g = self.lock();
        g.inode(ino)?;
        let tree = g.fs_tree;
        let mut out = Vec::new();
        let mut err = None;
        tree.scan(
            &mut g.store,
            Key::new(ino, ItemType::Xattr, 0),
            Key::new(ino, ItemType::Xattr, u64::MAX),
            |k, v| {
                match decode_xattrs(v, format_args!("xattr {k}")) {
                    Ok(xs) => out.extend(xs.into_iter().map(|x| x.name)),
                    Err(e) => err = Some(e),
                }
                Ok(err.is_none())
            },
        )?;
        if let Some(e) = err {
            return Err(e.into());
        }
        Ok(out)
    }

    pub fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        check_name(name)?;
        let ns = self.node_size();
        if xattr_entry_size(name.len(), value.len()) > max_item_size(ns) {
            return Err(Error::TooBig);
        }
        self.write_op(2, Reserve::Grow, |g| {
            g.inode(ino)?;
            let key = Key::new(ino, ItemType::Xattr, (g.hash)(name));
            let tree = g.fs_tree;
            let mut xs = match tree.get(&mut g.store, &key)? {
                Some(v) => decode_xattrs(&v, format_args!("xattr {key}"))?,
                None => Vec::new(),
            };
            let pos = xs.iter().position(|x| x.name == name);
            match (pos, flags & (XATTR_CREATE | XATTR_REPLACE)) {
                (Some(_), XATTR_CREATE) => return Err(Error::Exists),
                (None, XATTR_REPLACE) => return Err(Error::NoData),
                _ => {}
            }
            match pos {
                Some(i) => xs[i].value = value.to_vec(),
                None => xs.push(XattrEntry {
                    name: name.to_vec(),
                    value: value.to_vec(),
                }),
            }
            let enc = encode_xattrs(&xs);
            if enc.len() > max_item_size(g.store.node_size) {
                return Err(Error::NoSpace);
            }
            g.fs_tree.put(&mut g.store, key, enc)?;
            let now = g.now();
            g.modify_inode(ino, |i| i.ctime = now)?;
            Ok(())
        })
    }

    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> Result<()> {
        check_name(name)?;
        self.write_op(2, Reserve::Shrink, |g| {
            g.inode(ino)?;
            let key = Key::new(ino, ItemType::Xattr, (g.hash)(name));
            let tree = g.fs_tree;
            let v = tree.get(&mut g.store, &key)?.ok_or(Error::NoData)?;
            let mut xs = decode_xattrs(&v, format_args!("xattr {key}"))?;
            let i = xs
                .iter()
                .position(|x| x.name == name)
                .ok_or(Error::NoData)?;
            xs.remove(i);
            g.fs_tree.update(&mut g.store, &key, |v| {
                if xs.is_empty() {
                    return Change::Delete;
                }
                *v = encode_xattrs(&xs);
                Change::Keep
            })?;
            let now = g.now();
            g.modify_inode(ino, |i| i.ctime = now)?;
            Ok(())
        })
    }
}
