//! The roots tree through a repair: which snapshots and writable subvolumes the rebuilt file
//! system keeps, and what they hold of the device.
//!
//! One tree is rebuilt from its items: the active one (the superblock's `fs_root`), or the
//! file system's own (below). A snapshot's
//! tree is never written after it is made, and a parked writable tree (`fs::clones`) is not
//! written while it is parked, so the repair keeps each as it is when its tree checks whole
//! as a file system of its own (every node and item, as fsck checks a snapshot), and deletes
//! it otherwise, saying so (its files are not salvaged: a tree is rebuilt only while it is
//! the active one). Besides those:
//! - one being deleted when the image was damaged is deleted (its drop finished by
//!   forgetting what is left);
//! - a parked clone whose origin snapshot goes goes too: the blocks it names of the origin's
//!   generation or older are the origin's, which it never frees, and nothing else would;
//! - a snapshot whose origin goes (a snapshot of a clone) is kept without it: what it names
//!   is held for it below;
//! - a writable snapshot's hidden origin that no kept tree uses any more goes;
//! - the file system's own tree, parked while a clone is active, is never deleted: when it
//!   is damaged, the repair rebuilds it instead of the active clone (`pick`), makes it the
//!   active tree, and weighs the clone as a parked one; when its item cannot be read (so
//!   neither can its tree), the active clone is rebuilt as the file system's own tree;
//! - a snapshot whose item's generation cannot be (not below the image's, or below its
//!   root's) is deleted; a parked writable tree's is set to the image's.
//!
//! What the kept ones hold is found anew, not read from the old roots tree (which may be
//! what was damaged): the parents of each of their nodes (the rebuilt tree shares none), the
//! blocks the snapshots' extents name, and the blocks each parked tree's extents
//! name, its own (younger than its origin) apart from its origin's. The rebuild keeps all of
//! it, gives a rebuilt extent whose blocks are a kept tree's node or a parked tree's own a
//! copy of its own, and holds for every kept snapshot what no writable tree owns
//! (`super::held_runs`).
use super::salvage;
use crate::btree::node::Node;
use crate::error::{Error, Result};
use crate::fs::{NameHash, Origin, Snap};
use crate::space::bitmap::Bitmap;
use idxfs_blockdev::BlockDevice;
use idxfs_format::items::{decode_extent, EXTENT_INLINE};
use idxfs_format::node::{Expect, KeyRange};
use idxfs_format::roots::{decode_origin, decode_subvolume, SubvolumeItem, SUBVOL_WRITABLE};
use idxfs_format::superblock::Superblock;
use idxfs_format::{ItemType, BLOCK_SIZE, FS_SUBVOL_ID, TREE_FS, TREE_ROOTS};
use std::collections::{BTreeMap, HashMap};

/// The snapshots and writable subvolumes a repair keeps, and what they hold.
#[derive(Default)]
pub(crate) struct Kept {
    /// Read-only snapshots (hidden origins among them).
    pub list: BTreeMap<u64, Snap>,
    /// Writable trees but the active one while it is the file system's own: each parked
    /// one with its root, the active clone's item without one (`fs::clones`).
    pub writable: BTreeMap<u64, Snap>,
    /// The origin of each kept clone, and of each kept snapshot of one, that is kept too.
    pub origins: BTreeMap<u64, Origin>,
    /// The active tree's origin's generation when it is a clone whose origin is kept: the
    /// rebuilt tree's extents this old are the origin's. 0 otherwise: all are its own.
    pub floor: u64,
    /// Pointers to each of their nodes (roots and internal nodes' children), each node
    /// entered once however many trees share it.
    pub parents: HashMap<u64, u32>,
    /// Runs of blocks the snapshots' extents name: (start, blocks). Preallocated ones too:
    /// they read as zeros in the snapshot, but a clone made of it later names them as its
    /// origin's, which must be in use (as the tree that let go of them held them).
    pub data: Vec<(u64, u64)>,
    /// Runs the parked trees own: their extents younger than their origins.
    pub owned: Vec<(u64, u64)>,
    /// Runs the parked trees name that are their origins'.
    pub borrowed: Vec<(u64, u64)>,
}

impl Kept {
    /// Every block their nodes take: (start, blocks).
    pub fn node_runs(&self, blocks_per_node: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.parents.keys().map(move |&b| (b, blocks_per_node))
    }

    /// Every block they keep in use: nodes, and every block their extents name.
    pub fn runs(&self, blocks_per_node: u64) -> Vec<(u64, u64)> {
        self.node_runs(blocks_per_node)
            .chain(self.data.iter().copied())
            .chain(self.owned.iter().copied())
            .chain(self.borrowed.iter().copied())
            .collect()
    }
}

/// One subvolume item of the old roots tree, as a repair weighs it.
#[derive(Clone)]
struct Found {
    id: u64,
    snap: Snap,
    shown: String,
}

impl Found {
    fn writable(&self) -> bool {
        self.snap.item.flags.get() & SUBVOL_WRITABLE != 0
    }
    fn what(&self) -> String {
        match (self.id, self.writable()) {
            (FS_SUBVOL_ID, _) => "the file system's own tree".into(),
            (id, true) => format!("subvolume {id} ({})", self.shown),
            (id, false) => format!("snapshot {id} ({})", self.shown),
        }
    }
}

/// Which tree a repair rebuilds (`pick`).
pub(crate) enum Pick {
    /// The active one, as the superblock says.
    Active,
    /// The file system's own tree, parked and damaged while clone `.0.id` was active: the
    /// own tree is rebuilt and made active again, and the clone parked as `.0.item` says.
    Own(Parked),
    /// The item of the file system's own tree cannot be read while clone `.0` is active, so
    /// its tree cannot be found: the active tree is rebuilt as the file system's own.
    OwnLost(u64),
}

/// The active clone parked by a repair that rebuilds the file system's own tree instead.
pub(crate) struct Parked {
    pub id: u64,
    /// Its item, with the root and inode counters the superblock had for it (its name's
    /// length is its item's: `keep`).
    pub item: SubvolumeItem,
}

/// Which tree a repair rebuilds (`Pick`), and the superblock as the repair goes by it: with
/// the rebuilt tree as `fs_root`, its inode counters, and the clone active after the
/// repair as `subvolume` (0: the file system's own tree).
pub(crate) fn pick(dev: &dyn BlockDevice, sb: &Superblock, hash: NameHash) -> (Superblock, Pick) {
    let active = sb.subvolume.get();
    if active == 0 || sb.roots_root.block.get() == 0 {
        return (*sb, Pick::Active);
    }
    let mut own = None;
    let mut lost = salvage::Salvaged::default();
    salvage::walk(
        dev,
        sb,
        &sb.roots_root,
        TREE_ROOTS,
        &mut lost,
        &mut |k, v| {
            if k.item_type() == Some(ItemType::Subvolume)
                && k.offset == 0
                && k.objectid == FS_SUBVOL_ID
            {
                own = decode_subvolume(v, k.objectid).ok().map(|(it, _)| it);
            }
        },
    );
    let mut view = *sb;
    view.subvolume = 0.into();
    let Some(own) = own.filter(|it| it.flags.get() & SUBVOL_WRITABLE != 0) else {
        return (view, Pick::OwnLost(active));
    };
    if crate::fsck::snapshot_problems(dev, sb, hash, false, &own).is_empty() {
        return (*sb, Pick::Active);
    }
    view.fs_root = own.root;
    view.next_ino = own.next_ino;
    view.inode_count = own.inode_count;
    let item = SubvolumeItem {
        root: sb.fs_root,
        flags: SUBVOL_WRITABLE.into(),
        generation: sb.generation,
        next_ino: sb.next_ino,
        inode_count: sb.inode_count,
        ..own
    };
    (view, Pick::Own(Parked { id: active, item }))
}

/// The snapshots and subvolumes of the image `sb` describes (as `pick` returned it) that a
/// repair keeps (module notes); what it deletes goes into `actions`. `picked`: which tree
/// is rebuilt (`pick`). Err (nothing written yet): the active clone's item is lost, or a
/// parked writable tree names another's blocks (`settle`).
pub(crate) fn keep(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    hash: NameHash,
    picked: &Pick,
    actions: &mut Vec<String>,
) -> Result<Kept> {
    let active = sb.subvolume.get();
    if sb.roots_root.block.get() == 0 {
        return Ok(Kept::default());
    }
    let mut items = Vec::new();
    let mut origins: BTreeMap<u64, Origin> = BTreeMap::new();
    let mut lost = salvage::Salvaged::default();
    salvage::walk(
        dev,
        sb,
        &sb.roots_root,
        TREE_ROOTS,
        &mut lost,
        &mut |k, v| match k.item_type() {
            Some(ItemType::Subvolume) if k.offset == 0 => {
                items.push((
                    k.objectid,
                    decode_subvolume(v, k.objectid).map(|(it, n)| (it, n.to_vec())),
                ));
            }
            Some(ItemType::SubvolumeOrigin) if k.offset == 0 => {
                match decode_origin(v, k.objectid) {
                    Ok(o) => {
                        origins.insert(
                            k.objectid,
                            Origin {
                                id: o.origin.get(),
                                generation: o.generation.get(),
                            },
                        );
                    }
                    Err(e) => actions.push(format!("subvolume {}: {e}: dropped", k.objectid)),
                }
            }
            _ => {}
        },
    );
    for l in lost.lost {
        actions.push(format!(
            "snapshots and subvolumes: {l}; those it held are deleted"
        ));
    }
    if let Pick::OwnLost(a) = picked {
        // Rebuilt as the file system's own tree, it has no origin.
        origins.remove(a);
    }
    // Weighed one by one: whole, or deleted.
    let mut whole: Vec<Found> = Vec::new();
    for (id, decoded) in items {
        let (item, name) = match (decoded, picked) {
            // Rebuilt as the active tree (`pick`).
            (_, Pick::Own(_)) if id == FS_SUBVOL_ID => continue,
            (_, Pick::OwnLost(a)) if id == *a => continue,
            (Ok((it, name)), Pick::Own(p)) if id == p.id => {
                let item = SubvolumeItem {
                    name_len: it.name_len,
                    ..p.item
                };
                (item, name)
            }
            (decoded, _) => match decoded {
                Ok(x) => x,
                Err(e) => {
                    actions.push(format!("snapshot or subvolume {id}: {e}: deleted"));
                    continue;
                }
            },
        };
        let f = Found {
            id,
            shown: String::from_utf8_lossy(&name).into_owned(),
            snap: Snap { item, name },
        };
        if f.snap.dropping() {
            actions.push(format!(
                "{} was being deleted: its delete is finished",
                f.what()
            ));
            continue;
        }
        if f.writable() && id == FS_SUBVOL_ID && active == 0 {
            actions.push("an item of the file system's own tree beside it: dropped".into());
            continue;
        }
        let is_active = f.writable() && id == active;
        if f.writable() && (f.snap.item.root.block.get() == 0) != is_active {
            actions.push(format!(
                "{}: its root does not say whether it is active: deleted",
                f.what()
            ));
            continue;
        }
        let (g, root_g) = (f.snap.generation(), f.snap.item.root.generation.get());
        let now = sb.generation.get();
        if !f.writable() && (g >= now || root_g > g) {
            // Its generation draws its held window and its clones' line: not guessed.
            actions.push(format!(
                "{}: its generation {g} cannot be (its root's is {root_g}, the image's \
                 {now}): deleted",
                f.what()
            ));
            continue;
        }
        let mut f = f;
        if f.writable() && !is_active && (g > now || root_g > g) {
            // When it was parked says nothing else of it.
            actions.push(format!(
                "{}: its generation {g} cannot be: set to the image's, {now}",
                f.what()
            ));
            f.snap.item.generation = sb.generation;
        }
        if !is_active {
            let problems = crate::fsck::snapshot_problems(dev, sb, hash, false, &f.snap.item);
            if let Some(p) = problems.first() {
                actions.push(format!(
                    "{} is damaged ({p}{}): deleted",
                    f.what(),
                    match problems.len() {
                        1 => String::new(),
                        n => format!(", and {} more problems", n - 1),
                    }
                ));
                continue;
            }
        }
        whole.push(f);
    }
    // Settled, then walked; a snapshot whose blocks a kept tree's node or a writable tree's
    // own are goes, and the rest is settled again without it.
    loop {
        let mut said = Vec::new();
        match settle(dev, sb, whole.clone(), &origins, &mut said)? {
            Ok(kept) => {
                actions.append(&mut said);
                return Ok(kept);
            }
            Err((id, why)) => {
                if let Some(f) = whole.iter().find(|f| f.id == id) {
                    actions.push(format!("{}: {why}: deleted", f.what()));
                }
                whole.retain(|f| f.id != id);
            }
        }
    }
}

/// Which of the trees that checked whole (`whole`) are kept, and what they hold (module
/// notes); Ok(Err((snapshot, why))) when a snapshot's extents name blocks that are a node or
/// a writable tree's own. Err when the file system's own tree is not among them while a
/// clone is active, or a parked writable tree's extent names such blocks: the repair is
/// refused, nothing written, and the message says how to rebuild that tree.
fn settle(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    mut whole: Vec<Found>,
    origins: &BTreeMap<u64, Origin>,
    actions: &mut Vec<String>,
) -> Result<std::result::Result<Kept, (u64, String)>> {
    let active = sb.subvolume.get();
    let mut out = Kept::default();
    // The writable trees go with their origins, the hidden origins with their last use.
    let snapshot_kept = |whole: &[Found], o: &Origin| {
        whole
            .iter()
            .any(|f| f.id == o.id && !f.writable() && f.snap.generation() == o.generation)
    };
    let mut gone = Vec::new();
    for f in whole.iter().filter(|f| f.writable() && f.id != active) {
        if let Some(o) = origins.get(&f.id).filter(|o| !snapshot_kept(&whole, o)) {
            gone.push(f.id);
            actions.push(format!(
                "{}: its origin, snapshot {}, is gone: deleted",
                f.what(),
                o.id
            ));
        }
    }
    whole.retain(|f| !gone.contains(&f.id));
    if active != 0 {
        if !whole.iter().any(|f| f.id == FS_SUBVOL_ID && f.writable()) {
            return Err(Error::NotSupported(
                "the file system's own tree, parked while a subvolume is active, is damaged: \
                 mount the image with -o subvol=5 to make it the active tree, then repair",
            ));
        }
        if !whole.iter().any(|f| f.id == active && f.writable()) {
            return Err(Error::NotSupported(
                "the active subvolume's item is lost: mount the image with -o subvol=5, then \
                 repair",
            ));
        }
    }
    for (&id, o) in origins {
        let user = whole.iter().any(|f| f.id == id);
        if user && snapshot_kept(&whole, o) {
            out.origins.insert(id, *o);
        }
    }
    if let Some(o) = out.origins.get(&active) {
        out.floor = o.generation;
    } else if let Some(o) = origins.get(&active) {
        actions.push(format!(
            "subvolume {active} (active): its origin, snapshot {}, is gone: the blocks it \
             shared are its own now",
            o.id
        ));
    }
    whole.retain(|f| {
        let used = out.origins.values().any(|o| o.id == f.id);
        if f.snap.hidden() && !used {
            actions.push(format!(
                "snapshot {}: the origin of a writable snapshot that is gone: deleted",
                f.id
            ));
        }
        !f.snap.hidden() || used
    });
    // What the kept ones hold, the writable trees walked first (as fsck walks them): a node
    // they share with a snapshot is entered once, and only their walk records the
    // preallocated blocks of their origins' they name, which must stay in use.
    whole.sort_by_key(|f| !f.writable());
    let mut walked = Vec::new();
    for f in whole {
        let floor = out.origins.get(&f.id).map_or(0, |o| o.generation);
        let w = match (f.writable(), f.id == active) {
            (true, true) => Ok(Walked::default()),
            (true, false) => walk(dev, sb, &f.snap.item, Some(floor), &mut out.parents),
            (false, _) => walk(dev, sb, &f.snap.item, None, &mut out.parents),
        }
        .map_err(|why| unread(&f, why))?;
        walked.push((f, w));
    }
    // No extent names a node, nor a block another writable tree owns.
    let total = sb.total_blocks.get();
    let bpn = sb.blocks_per_node();
    let mut nodes = Bitmap::new(total);
    for (s, n) in out.node_runs(bpn) {
        set(&mut nodes, s, n);
    }
    let mut owned = Bitmap::new(total);
    let mut owner: Vec<(u64, u64, u64)> = Vec::new();
    for (f, w) in &walked {
        let all = w.data.iter().chain(&w.owned).chain(&w.borrowed);
        let on_node = all
            .flat_map(|&(s, n)| s..(s + n).min(total))
            .find(|&b| nodes.get(b));
        let mine = union(&w.owned);
        let twice = (mine.iter())
            .flat_map(|&(s, n)| s..(s + n).min(total))
            .find(|&b| owned.get(b));
        let why = match (on_node, twice) {
            (Some(b), _) => format!("its extent names block {b}, a node"),
            (None, Some(b)) => {
                let other = (owner.iter())
                    .find(|(s, n, _)| (*s..s + n).contains(&b))
                    .map_or(0, |o| o.2);
                format!("block {b} is its own and subvolume {other}'s")
            }
            (None, None) => {
                for &(s, n) in &mine {
                    set(&mut owned, s, n);
                    owner.push((s, n, f.id));
                }
                continue;
            }
        };
        if !f.writable() {
            return Ok(Err((f.id, why)));
        }
        return Err(idxfs_format::Corrupt::new(
            f.what(),
            why,
            format!(
                "no extent naming another tree's: make it the active tree (mount with -o \
                 subvol={}) and repair again, which gives its extent a copy of its own",
                f.id
            ),
        )
        .into());
    }
    for (f, w) in walked {
        out.data.extend(w.data);
        out.owned.extend(w.owned);
        out.borrowed.extend(w.borrowed);
        match f.writable() {
            true => out.writable.insert(f.id, f.snap),
            false => out.list.insert(f.id, f.snap),
        };
    }
    for v in [&mut out.data, &mut out.owned, &mut out.borrowed] {
        v.sort_unstable();
        v.dedup();
    }
    Ok(Ok(out))
}

fn set(b: &mut Bitmap, s: u64, n: u64) {
    let end = (s + n).min(b.len());
    if s < end {
        b.set_range(s, end - s, true);
    }
}

/// `runs` sorted and joined where they overlap or touch: one tree's extents may share
/// blocks (`SharedBlocks`), which is not two owners.
fn union(runs: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut v = runs.to_vec();
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (s, n) in v {
        match out.last_mut() {
            Some((ls, ln)) if s <= *ls + *ln => *ln = (*ln).max(s + n - *ls),
            _ => out.push((s, n)),
        }
    }
    out
}

/// A kept tree whose nodes no longer read as they did when its check kept it.
fn unread(f: &Found, why: String) -> Error {
    idxfs_format::Corrupt::new(format!("{}'s tree", f.what()), why, "as its check read it").into()
}

/// The runs one kept tree's extents name: a snapshot's in `data`, a parked writable tree's
/// in `owned` or `borrowed`.
#[derive(Default)]
struct Walked {
    data: Vec<(u64, u64)>,
    owned: Vec<(u64, u64)>,
    borrowed: Vec<(u64, u64)>,
}

/// Walks one kept tree: its pointers into `parents`, and the runs its extents name (`own`:
/// a parked writable tree's origin's generation, None for a snapshot). A node a tree walked
/// before holds gains a parent and is not entered again. Its nodes were read whole by the
/// check that kept it, so an error here is a device that no longer reads them.
fn walk(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    item: &idxfs_format::roots::SubvolumeItem,
    own: Option<u64>,
    parents: &mut HashMap<u64, u32>,
) -> std::result::Result<Walked, String> {
    let mut out = Walked::default();
    let root = &item.root;
    let mut buf = vec![0u8; sb.node_size.get() as usize];
    let c = parents.entry(root.block.get()).or_insert(0);
    *c += 1;
    if *c > 1 {
        return Ok(out);
    }
    let mut stack = vec![(
        root.block.get(),
        root.generation.get(),
        root.level.get() as u8,
    )];
    while let Some((block, generation, level)) = stack.pop() {
        dev.read_at(&mut buf, block * BLOCK_SIZE)
            .map_err(|e| format!("node {block}: {e}"))?;
        let exp = Expect {
            block,
            generation,
            owner: TREE_FS,
            level: Some(level),
            fsid: sb.uuid,
            total_blocks: sb.total_blocks.get(),
            range: KeyRange::ANY,
        };
        let node = Node::decode(&buf, &exp).map_err(|e| e.to_string())?;
        if node.is_leaf() {
            for (k, v) in node.keys.iter().zip(node.leaf_vals().iter()) {
                if k.item_type() != Some(ItemType::Extent) {
                    continue;
                }
                let (e, _) = decode_extent(v, format_args!("extent {k}"), sb.total_blocks.get())
                    .map_err(|e| e.to_string())?;
                let run = (e.disk_block.get(), e.blocks.get());
                match own {
                    _ if e.kind == EXTENT_INLINE => {}
                    None => out.data.push(run),
                    Some(floor) if e.generation.get() <= floor => out.borrowed.push(run),
                    Some(_) => out.owned.push(run),
                }
            }
            continue;
        }
        for p in node.ptrs() {
            let c = parents.entry(p.block).or_insert(0);
            *c += 1;
            if *c == 1 {
                stack.push((p.block, p.generation, level - 1));
            }
        }
    }
    Ok(out)
}
