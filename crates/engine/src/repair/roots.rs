//! The roots tree through a repair: which snapshots and writable subvolumes the rebuilt file
//! system keeps as they are, which it rebuilds, and what the kept ones hold of the device.
//!
//! The active tree (the superblock's `fs_root`) is always rebuilt from its items. A
//! snapshot's tree is never written after it is made, and a parked writable tree
//! (`fs::clones`) is not written while it is parked, so each is kept as it is when its tree
//! checks whole as a file system of its own (every node and item, as fsck checks a
//! snapshot). Otherwise:
//! - a damaged parked writable tree is rebuilt from its items as the active one is, and so
//!   is one whose extents name another tree's own blocks or nodes, or whose origin snapshot
//!   goes (its blocks then all its own); the file system's own tree among them;
//! - a damaged snapshot is deleted, and so is one whose extents name a node or a writable
//!   tree's own blocks: a snapshot rebuilt would not be what it was;
//! - one being deleted when the image was damaged is deleted (its drop finished by
//!   forgetting what is left);
//! - a snapshot whose origin goes (a snapshot of a clone) is kept without it: what it names
//!   is held for it below;
//! - a writable snapshot's hidden origin that no kept or rebuilt tree uses any more goes;
//! - the file system's own tree, parked while a clone is active, is never deleted: when its
//!   item cannot be read (so neither can its tree), the active clone is rebuilt as the file
//!   system's own tree (`pick`);
//! - a snapshot whose item's generation cannot be (not below the image's, or below its
//!   root's) is deleted; a parked writable tree's is set to the image's.
//!
//! What the kept ones hold is found anew, not read from the old roots tree (which may be
//! what was damaged): the parents of each of their nodes (rebuilt trees share none), the
//! blocks the snapshots' extents name, and the blocks each parked tree's extents name, its
//! own (younger than its origin) apart from its origin's. The rebuild keeps all of it, gives
//! a rebuilt extent whose blocks are a kept tree's node or a writable tree's own a copy of
//! its own, and holds for every kept snapshot what no writable tree owns
//! (`super::held_runs`).
use super::{salvage, set};
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
    /// Parked writable trees to rebuild as the active one is (damaged, naming another
    /// tree's blocks, or their origin gone): id, item, and their origin's generation (0:
    /// every block they name is their own).
    pub rebuild: Vec<(u64, Snap, u64)>,
    /// Writable trees whose origin went (the active one among them, by its id): every
    /// block they name is their own now, so where another tree owns one too, theirs is
    /// the extent that gets a copy.
    pub lone: Vec<u64>,
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
    /// A parked writable tree to rebuild from its items.
    rebuild: bool,
}

impl Found {
    fn writable(&self) -> bool {
        self.snap.item.flags.get() & SUBVOL_WRITABLE != 0
    }
    fn what(&self) -> String {
        match (self.id, self.writable()) {
            (FS_SUBVOL_ID, _) => "the file system's own tree".into(),
            (id, true) => format!("subvolume {id} ({})", self.shown),
            (id, false) if self.snap.hidden() => format!(
                "snapshot {id} (the hidden origin of writable snapshot {})",
                self.shown
            ),
            (id, false) => format!("snapshot {id} ({})", self.shown),
        }
    }
}

/// Whether a repair rebuilds the active tree as it is (`pick`).
pub(crate) enum Pick {
    /// The active one, as the superblock says.
    Active,
    /// The item of the file system's own tree cannot be read while clone `.0` is active, so
    /// its tree cannot be found: the active tree is rebuilt as the file system's own.
    OwnLost(u64),
}

/// A subvolume item and its name, or why it does not decode.
type Decoded = std::result::Result<(SubvolumeItem, Vec<u8>), idxfs_format::Corrupt>;

/// The subvolume and origin items of the old roots tree, as far as it can be read.
#[derive(Default)]
struct Read {
    /// Each subvolume item: decoded (with its name), or why not.
    items: Vec<(u64, Decoded)>,
    origins: BTreeMap<u64, Origin>,
    /// One line per origin item that does not decode, and per subtree that cannot be read.
    said: Vec<String>,
}

fn read(dev: &dyn BlockDevice, sb: &Superblock) -> Read {
    let mut out = Read::default();
    if sb.roots_root.block.get() == 0 {
        return out;
    }
    let mut lost = salvage::Salvaged::default();
    let mut item = |k: idxfs_format::Key, v: &[u8]| match k.item_type() {
        Some(ItemType::Subvolume) if k.offset == 0 => {
            let it = decode_subvolume(v, k.objectid).map(|(it, n)| (it, n.to_vec()));
            out.items.push((k.objectid, it));
        }
        Some(ItemType::SubvolumeOrigin) if k.offset == 0 => match decode_origin(v, k.objectid) {
            Ok(o) => {
                let o = Origin {
                    id: o.origin.get(),
                    generation: o.generation.get(),
                };
                out.origins.insert(k.objectid, o);
            }
            Err(e) => out
                .said
                .push(format!("subvolume {}: {e}: dropped", k.objectid)),
        },
        _ => {}
    };
    salvage::walk(dev, sb, &sb.roots_root, TREE_ROOTS, &mut lost, &mut item);
    out.said.extend(
        (lost.lost.iter())
            .map(|l| format!("snapshots and subvolumes: {l}; those it held are deleted")),
    );
    out
}

/// Whether the active tree is rebuilt as it is (`Pick`), and the superblock as the repair
/// goes by it (with no clone active after `Pick::OwnLost`).
pub(crate) fn pick(dev: &dyn BlockDevice, sb: &Superblock) -> (Superblock, Pick) {
    let active = sb.subvolume.get();
    if active == 0 || sb.roots_root.block.get() == 0 {
        return (*sb, Pick::Active);
    }
    let own = (read(dev, sb).items.into_iter())
        .find(|(id, _)| *id == FS_SUBVOL_ID)
        .and_then(|(_, it)| it.ok());
    if own.is_some_and(|(it, _)| it.flags.get() & SUBVOL_WRITABLE != 0 && it.root.block.get() != 0)
    {
        return (*sb, Pick::Active);
    }
    let mut view = *sb;
    view.subvolume = 0.into();
    (view, Pick::OwnLost(active))
}

/// The snapshots and subvolumes of the image `sb` describes (as `pick` returned it) that a
/// repair keeps as they are or rebuilds (module notes); what it does goes into `actions`.
/// `picked`: whether the active tree is rebuilt as the file system's own (`pick`). Err
/// (nothing written yet): a node of a kept tree no longer reads.
pub(crate) fn keep(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    hash: NameHash,
    picked: &Pick,
    actions: &mut Vec<String>,
) -> Result<Kept> {
    let active = sb.subvolume.get();
    let Read {
        items,
        mut origins,
        mut said,
    } = read(dev, sb);
    actions.append(&mut said);
    if let Pick::OwnLost(a) = picked {
        // Rebuilt as the file system's own tree, it has no origin.
        origins.remove(a);
    }
    // Weighed one by one: kept whole, rebuilt (a writable tree), or deleted.
    let mut whole: Vec<Found> = Vec::new();
    for (id, decoded) in items {
        let (item, name) = match (decoded, picked) {
            // Rebuilt as the file system's own tree (`pick`).
            (_, Pick::OwnLost(a)) if id == *a => continue,
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
            rebuild: false,
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
                // A snapshot is never written, so it cannot be rebuilt: its files would not
                // be what they were.
                actions.push(format!(
                    "{} is damaged ({p}{}): {}",
                    f.what(),
                    match problems.len() {
                        1 => String::new(),
                        n => format!(", and {} more problems", n - 1),
                    },
                    if f.writable() { "rebuilt" } else { "deleted" }
                ));
                if !f.writable() {
                    continue;
                }
                f.rebuild = true;
            }
        }
        whole.push(f);
    }
    if active != 0 && !whole.iter().any(|f| f.id == active) {
        // Rebuilt all the same, under a name of its own.
        let name = format!("lost-{active}").into_bytes();
        actions.push(format!(
            "subvolume {active} (active): its item is lost: named {}",
            String::from_utf8_lossy(&name)
        ));
        let item = SubvolumeItem {
            root: Default::default(),
            flags: SUBVOL_WRITABLE.into(),
            generation: sb.generation,
            next_ino: 0.into(),
            inode_count: 0.into(),
            drop_from: idxfs_format::Key::MIN.encode(),
            name_len: name.len() as u8,
            source: [0; 6],
        };
        whole.push(Found {
            id: active,
            shown: String::from_utf8_lossy(&name).into_owned(),
            snap: Snap { item, name },
            rebuild: false,
        });
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
                let Some(f) = whole.iter_mut().find(|f| f.id == id) else {
                    continue;
                };
                if f.writable() {
                    actions.push(format!("{}: {why}: rebuilt", f.what()));
                    f.rebuild = true;
                } else {
                    actions.push(format!("{}: {why}: deleted", f.what()));
                    whole.retain(|f| f.id != id);
                }
            }
        }
    }
}

/// Which of the trees weighed (`whole`) are kept as they are or rebuilt, and what the kept
/// ones hold (module notes); Ok(Err((id, why))) when a kept tree's extents name blocks that
/// are a node or another writable tree's own (the snapshot then goes, the writable tree is
/// rebuilt). Err when the file system's own tree is not among them while a clone is active:
/// the repair is refused, nothing written.
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
    let mut lone = Vec::new();
    for f in whole.iter().filter(|f| f.writable() && f.id != active) {
        if let Some(o) = origins.get(&f.id).filter(|o| !snapshot_kept(&whole, o)) {
            lone.push(f.id);
            actions.push(format!(
                "{}: its origin, snapshot {}, is gone: rebuilt, the blocks it shared its own",
                f.what(),
                o.id
            ));
        }
    }
    for f in whole.iter_mut().filter(|f| lone.contains(&f.id)) {
        f.rebuild = true;
    }
    // `pick` and `keep` saw to both; an item that reads differently twice is a device
    // that cannot be trusted.
    let has = |id: u64| whole.iter().any(|f| f.id == id && f.writable());
    if active != 0 && !(has(FS_SUBVOL_ID) && has(active)) {
        return Err(idxfs_format::Corrupt::new(
            "roots tree",
            "items that read differently each time",
            "the file system's own tree parked while a subvolume is active",
        )
        .into());
    }
    for (&id, o) in origins {
        let user = whole.iter().any(|f| f.id == id);
        if user && snapshot_kept(&whole, o) && !lone.contains(&id) {
            out.origins.insert(id, *o);
        }
    }
    out.lone = (origins.keys().copied())
        .filter(|id| {
            !out.origins.contains_key(id) && whole.iter().any(|f| f.id == *id && f.writable())
        })
        .collect();
    if let Some(o) = out.origins.get(&active) {
        out.floor = o.generation;
    } else if let Some(o) = origins.get(&active) {
        actions.push(format!(
            "subvolume {active} (active): its origin, snapshot {}, is gone: the blocks it \
             shared are its own now",
            o.id
        ));
    }
    // A hidden origin that goes takes its own origin item with it, which may leave the
    // hidden origin it named unused in turn (a writable snapshot of a writable snapshot).
    loop {
        let before = whole.len();
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
        out.origins
            .retain(|id, _| whole.iter().any(|f| f.id == *id));
        if whole.len() == before {
            break;
        }
    }
    // What the kept ones hold, the writable trees walked first (as fsck walks them): a node
    // they share with a snapshot is entered once, and only their walk records the
    // preallocated blocks of their origins' they name, which must stay in use.
    whole.sort_by_key(|f| !f.writable());
    let mut walked = Vec::new();
    for f in whole {
        let floor = out.origins.get(&f.id).map_or(0, |o| o.generation);
        let w = match (f.writable(), f.id == active || f.rebuild) {
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
        return Ok(Err((f.id, why)));
    }
    for (f, w) in walked {
        out.data.extend(w.data);
        out.owned.extend(w.owned);
        out.borrowed.extend(w.borrowed);
        if f.rebuild {
            let floor = out.origins.get(&f.id).map_or(0, |o| o.generation);
            out.rebuild.push((f.id, f.snap, floor));
            continue;
        }
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
        // A pointer from damaged metadata may name a block past any device.
        let at = (block.checked_mul(BLOCK_SIZE))
            .ok_or_else(|| format!("node {block}: past the device"))?;
        dev.read_at(&mut buf, at)
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
