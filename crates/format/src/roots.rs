//! The roots tree's items (`TREE_ROOTS`): snapshots of the fs trees, writable subvolumes made
//! from snapshots (clones) with their origins, the counts of nodes their trees share, and the
//! data blocks held for snapshots. Incompat bits `INCOMPAT_SUBVOLUMES` and `INCOMPAT_CLONES`.
use crate::key::KEY_SIZE;
use crate::superblock::RootPtr;
use crate::{ensure, Corrupt, Key, NAME_MAX};
use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// A snapshot refuses every change.
pub const SUBVOL_READ_ONLY: u64 = 1;
/// Deleted: unreachable, its nodes being let go of from `drop_from` on.
pub const SUBVOL_DROPPING: u64 = 2;
/// A writable tree that is not the one the superblock's `fs_root` names (parked): a clone,
/// or the file system's own tree (id `FS_SUBVOL_ID`, no name) while a clone is the active
/// one. Its `generation` is the commit that parked it. Incompat bit `INCOMPAT_CLONES`.
pub const SUBVOL_WRITABLE: u64 = 4;
/// A read-only snapshot made only as the origin of a writable snapshot (a clone made of the
/// active tree in one step): listed and shown by no one, deleted by the drop that ends its
/// last use (the last tree naming its blocks through it). Incompat bit
/// `INCOMPAT_HIDDEN_ORIGINS`.
pub const SUBVOL_HIDDEN: u64 = 8;
const SUBVOL_FLAGS: u64 = SUBVOL_READ_ONLY | SUBVOL_DROPPING | SUBVOL_WRITABLE | SUBVOL_HIDDEN;

/// A snapshot or a parked writable tree: (id, Subvolume, 0) -> this, then `name_len` bytes
/// of name. The active writable tree has no such item while it is active: the superblock
/// names it (`fs_root`, `subvolume`).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct SubvolumeItem {
    /// Its fs tree's root.
    pub root: RootPtr,
    pub flags: U64,
    /// The generation whose state it holds: the commit that made it froze that generation,
    /// so every node and data block it names was written in it or before.
    pub generation: U64,
    /// The first fs tree's inode counters when it was made (what statfs reports for it).
    pub next_ino: U64,
    pub inode_count: U64,
    /// While `SUBVOL_DROPPING`: where the next drop step starts (an encoded key; every
    /// subtree whose keys sort below it is gone).
    pub drop_from: [u8; KEY_SIZE],
    pub name_len: u8,
    /// A snapshot's: the writable tree it was taken of, a 48-bit id (`FS_SUBVOL_ID`, or a
    /// writable subvolume's id, which is never reused while this item exists: ids grow and
    /// this one is larger); 0 when not recorded (snapshots made before it was, and every
    /// writable tree's). Only restores and rollbacks beside other writable trees read it.
    pub source: [u8; 6],
}
pub const SUBVOLUME_ITEM_SIZE: usize = 80;
const _: () = assert!(size_of::<SubvolumeItem>() == SUBVOLUME_ITEM_SIZE);

impl SubvolumeItem {
    pub fn drop_key(&self) -> Key {
        Key::decode(&self.drop_from)
    }

    /// `source` as a number (0: not recorded).
    pub fn source(&self) -> u64 {
        let mut b = [0u8; 8];
        b[..6].copy_from_slice(&self.source);
        u64::from_le_bytes(b)
    }

    /// `source` for tree `id` (at most `MAX_INO`, which is 48 bits).
    pub fn source_of(id: u64) -> [u8; 6] {
        debug_assert!(id <= crate::MAX_INO, "subvolume id {id} past 48 bits");
        let b = id.to_le_bytes();
        [b[0], b[1], b[2], b[3], b[4], b[5]]
    }
}

/// Decodes snapshot `id`'s item: the fixed part and the name.
pub fn decode_subvolume(v: &[u8], id: u64) -> Result<(SubvolumeItem, &[u8]), Corrupt> {
    let what = format!("snapshot {id}");
    let (it, name) = SubvolumeItem::read_from_prefix(v).map_err(|_| {
        Corrupt::new(
            format!("{what} item size"),
            v.len(),
            format!(">= {SUBVOLUME_ITEM_SIZE}"),
        )
    })?;
    let own = id == crate::FS_SUBVOL_ID;
    ensure!(
        own || (crate::FIRST_SNAPSHOT_ID..=crate::MAX_INO).contains(&id),
        format!("{what} id"),
        id,
        format!(
            "{} or in {}..={}",
            crate::FS_SUBVOL_ID,
            crate::FIRST_SNAPSHOT_ID,
            crate::MAX_INO
        )
    );
    let f = it.flags.get();
    let kind_ok = match (f & SUBVOL_READ_ONLY != 0, f & SUBVOL_WRITABLE != 0) {
        (true, false) => !own,
        // The file system's own tree is never deleted; only snapshots are hidden.
        (false, true) => (!own || f & SUBVOL_DROPPING == 0) && f & SUBVOL_HIDDEN == 0,
        _ => false,
    };
    ensure!(
        f & !SUBVOL_FLAGS == 0 && kind_ok,
        format!("{what} flags"),
        format!("{f:#x}"),
        "read-only (maybe hidden) or writable, maybe dropping"
    );
    // Taken of the file system's own tree or of a writable tree made before it.
    let src = it.source();
    let source_ok = match f & SUBVOL_WRITABLE != 0 {
        true => src == 0,
        false => {
            src == 0 || src == crate::FS_SUBVOL_ID || (crate::FIRST_SNAPSHOT_ID..id).contains(&src)
        }
    };
    ensure!(
        source_ok,
        format!("{what} source"),
        src,
        match f & SUBVOL_WRITABLE != 0 {
            true => "0 (a writable tree)".to_string(),
            false => format!(
                "0, {} or in {}..{id}",
                crate::FS_SUBVOL_ID,
                crate::FIRST_SNAPSHOT_ID
            ),
        }
    );
    let n = it.name_len as usize;
    let name_ok = match own {
        true => n == 0 && name.is_empty(),
        false => (1..=NAME_MAX).contains(&n) && name.len() == n,
    };
    ensure!(
        name_ok && !name.contains(&0) && !name.contains(&b'/'),
        format!("{what} name"),
        format!("{} bytes after a length of {n}", name.len()),
        match own {
            true => "none (the file system's own tree)",
            false => "1..=255 bytes, no NUL or '/'",
        }
    );
    Ok((it, name))
}

/// The snapshot a writable subvolume was made from: (clone id, SubvolumeOrigin, 0) -> this.
/// Every data block the clone names that is as old as `generation` is the origin's (the
/// clone never lets go of it); the origin is not deleted while the clone exists. A snapshot
/// of a clone has the clone's origin's item too, as has a deleted clone until its tree is
/// dropped: both name the origin's blocks.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct OriginItem {
    /// The origin snapshot's id.
    pub origin: U64,
    /// Its generation, as its item has it.
    pub generation: U64,
}
pub const ORIGIN_ITEM_SIZE: usize = 16;
const _: () = assert!(size_of::<OriginItem>() == ORIGIN_ITEM_SIZE);

pub fn decode_origin(v: &[u8], id: u64) -> Result<OriginItem, Corrupt> {
    let what = format!("origin of subvolume {id}");
    let it = OriginItem::read_from_bytes(v)
        .map_err(|_| Corrupt::new(format!("{what} item size"), v.len(), ORIGIN_ITEM_SIZE))?;
    ensure!(
        (crate::FIRST_SNAPSHOT_ID..=crate::MAX_INO).contains(&id)
            && (crate::FIRST_SNAPSHOT_ID..=crate::MAX_INO).contains(&it.origin.get())
            && it.origin.get() != id,
        format!("{what} ids"),
        format!("{id} from {}", it.origin.get()),
        "a subvolume made from another snapshot"
    );
    Ok(it)
}

/// A node that `refs` (>= 2) parents point at: (NODE_REFS_OBJECTID, NodeRefs, block).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct NodeRefsItem {
    pub refs: U64,
}
pub const NODE_REFS_ITEM_SIZE: usize = 8;
const _: () = assert!(size_of::<NodeRefsItem>() == NODE_REFS_ITEM_SIZE);

pub fn decode_node_refs(v: &[u8], block: u64) -> Result<u64, Corrupt> {
    let it = NodeRefsItem::read_from_bytes(v).map_err(|_| {
        Corrupt::new(
            format!("node count of {block} item size"),
            v.len(),
            NODE_REFS_ITEM_SIZE,
        )
    })?;
    ensure!(
        (2..=u32::MAX as u64).contains(&it.refs.get()),
        format!("node count of {block}"),
        it.refs.get(),
        ">= 2 (one parent has no item)"
    );
    Ok(it.refs.get())
}

/// Data blocks the first fs tree let go of while a snapshot may still name them:
/// (HELD_OBJECTID, HeldBlocks, first block) -> this. A snapshot of generation `g` may name
/// them when `born <= g < released`; they are freed once no snapshot's does.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct HeldItem {
    pub blocks: U64,
    /// No block of the run was written before this generation (the extent's generation,
    /// or 0 when not known).
    pub born: U64,
    /// The generation in which the first fs tree let go of them.
    pub released: U64,
}
pub const HELD_ITEM_SIZE: usize = 24;
const _: () = assert!(size_of::<HeldItem>() == HELD_ITEM_SIZE);

pub fn decode_held(v: &[u8], start: u64, total_blocks: u64) -> Result<HeldItem, Corrupt> {
    let what = format!("held blocks at {start}");
    let it = HeldItem::read_from_bytes(v)
        .map_err(|_| Corrupt::new(format!("{what} item size"), v.len(), HELD_ITEM_SIZE))?;
    crate::items::check_run(&what, start, it.blocks.get(), total_blocks)?;
    ensure!(
        it.born.get() <= it.released.get(),
        format!("{what} generations"),
        format!("born {} released {}", it.born.get(), it.released.get()),
        "born <= released"
    );
    Ok(it)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FIRST_SNAPSHOT_ID, FS_SUBVOL_ID, MAX_INO};
    use zerocopy::FromZeros;

    fn item(flags: u64, source: u64) -> Vec<u8> {
        let mut it = SubvolumeItem::new_zeroed();
        it.flags = flags.into();
        it.name_len = 1;
        it.source = SubvolumeItem::source_of(source);
        let mut v = it.as_bytes().to_vec();
        v.push(b's');
        v
    }

    #[test]
    fn a_snapshot_s_source_round_trips_and_is_checked() {
        let id = FIRST_SNAPSHOT_ID + 10;
        for ok in [0, FS_SUBVOL_ID, FIRST_SNAPSHOT_ID, id - 1] {
            let (it, _) = decode_subvolume(&item(SUBVOL_READ_ONLY, ok), id).expect("valid");
            assert_eq!(it.source(), ok);
        }
        // Not a tree that can exist, or one made after the snapshot (ids only grow).
        for bad in [1, FS_SUBVOL_ID + 1, id, id + 1, MAX_INO] {
            let e = decode_subvolume(&item(SUBVOL_READ_ONLY, bad), id).expect_err("source");
            assert!(e.to_string().contains("source"), "{e}");
        }
        // A writable tree records none, and is never hidden.
        assert!(decode_subvolume(&item(SUBVOL_WRITABLE, 0), id).is_ok());
        assert!(decode_subvolume(&item(SUBVOL_WRITABLE | SUBVOL_HIDDEN, 0), id).is_err());
        assert!(decode_subvolume(&item(SUBVOL_READ_ONLY | SUBVOL_HIDDEN, 5), id).is_ok());
        assert!(decode_subvolume(&item(SUBVOL_READ_ONLY | 16, 5), id).is_err());
        assert!(decode_subvolume(&item(SUBVOL_WRITABLE, FS_SUBVOL_ID), id).is_err());
        assert_eq!(SubvolumeItem::source_of(MAX_INO), [0xff; 6]);
    }
}
