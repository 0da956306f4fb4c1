//! The file system: POSIX operations over the fs tree, so front ends only translate.
//!
//! Glossary:
//! - `Fs`: the handle a front end holds, one per open writable tree (`trees`); every
//!   operation but a published getattr or lookup locks `Inner` once, with its tree in hand.
//! - `Inner`: store, trees, inode cache and counters of one mounted image.
//! - *running transaction*: every change since the last commit; it becomes durable at the next
//!   commit (timer, `sync`, close, or when dirty state passes its bound), or earlier through
//!   the fsync log (`fsync`, see `crate::log`).
//!
//! Each mutating operation checks everything it can first (names, types, emptiness, room in
//! every item it grows, space), then changes the trees. An operation that works in bounded
//! steps (freeing a large file, a truncate of many extents) marks a *checkpoint* after each
//! step, where the state is whole. An error after the first change since the last checkpoint
//! means the in-memory state may be half-applied, so the file system stops writing and the
//! running transaction is never committed: the image keeps its last committed state, as after
//! a crash. Only a failing device or a damaged image gets there: nothing a user can ask for
//! does (a request that cannot be done is refused before its first change). A write the
//! device *refuses* does not stop it: a refused data write is refused before the operation's
//! first change (`Error::WriteRefused`), and a refused commit waits whole in memory to be
//! written again (`Error::Unwritten`; `crate::txn`, "A stalled commit"), including one an
//! operation makes at a checkpoint.
//!
//! What runs beside what:
//! - getattr, lookup, readlink, getxattr, listxattr, readdir and readdirplus take no lock
//!   once what they read was read before (`published`: the inode; for a lookup the directory
//!   and the name; the symlink target; the inode's xattrs when all are small and inline; the
//!   runs of a directory's entries read since it last changed, up to 4,096 entries, and for
//!   readdirplus their inodes), and so does statfs while it is asked between operations.
//!   Nor do the pins a front end takes for what it returns (`pins`, a lock of their own). They answer as the last finished
//!   operation left things, so they never wait for a writer or a commit, and any number of
//!   readers run in parallel. The first read of each takes the lock and publishes it.
//! - A commit freezes its transaction under the lock and writes its nodes and superblock
//!   without it (`crate::txn`): operations go on in the next transaction meanwhile. Only an
//!   fsync (whose log the frozen superblock names), a second commit, and an operation that
//!   needs the space the commit will release wait for it.
//! - An fsync (and an operation under `-o sync`/`dirsync`) builds its log batch under the
//!   lock, then writes and flushes it without the lock (`crate::log_io`): other operations
//!   go on, and concurrent fsyncs share a flush. It returns once its batch and every batch
//!   before it in the chain are durable.
//! - A read maps its range under the lock and reads the device without it; a write claims
//!   its blocks under the lock, writes them without it, and links them under it
//!   (`data_io`). Blocks a reader outside the lock may still read are not handed out again
//!   until it is done (`crate::space::read_fence`). A write into blocks the file already
//!   has (preallocated, NOCOW, or any on a full device) runs whole under the lock, device
//!   I/O included (`in_place`), but for a write inside its size into a NOCOW file's written
//!   blocks or whole preallocated blocks: that sets the times under the lock, writes the
//!   device after, inside the fence, as a reader reads, and converts preallocated blocks
//!   under the lock again; operations that keep part of those blocks wait for it.
//! - Everything else still serializes on the one lock, each operation whole: first reads,
//!   ".." and misses, long xattrs and symlink targets, and every tree change (a write's
//!   included). The trees change nodes in place within a transaction, so a reader of them
//!   beside a writer would need a published root per operation, and two writers in
//!   different leaves would need locks per node (btrfs's tree locking); neither is built
//!   (see the README's table), so the tree changes of two writers never overlap, though
//!   their data I/O does. That is most of a create (nearly all of it is the two directory
//!   indexes' and the inode's inserts; docs/benchmarks.md, "concurrency"), so a second
//!   creating thread adds no throughput. The lock is handed between threads taking it back
//!   to back about once per `op_lock::HANDOFF_AFTER`, not once per operation, so that the tree
//!   change's working set stays in one CPU's cache: a second creating thread costs less
//!   than with a plain mutex, but still adds nothing. Two writers creating in two directories do change
//!   mostly different leaves (each directory's inodes are numbered from runs of its own,
//!   `ino_runs`), which is what locks per node would let run side by side.
//! - An operation refused for space while an unlinked file is kept for its holder waits
//!   briefly for the holder to let go, and runs again (`write_op`, `Releases::wait`).
pub mod acl;
mod clone;
mod clones;
mod copy_file;
mod copy_tree;
mod create;
mod damage;
mod data_io;
pub(crate) mod data_sum;
mod dir;
mod file;
mod in_place;
pub(crate) mod ino_runs;
mod inode_flags;
mod layout;
mod op_lock;
mod orphan;
mod pins;
mod policy;
mod privs;
mod published;
mod readdir;
mod remove;
mod remove_tree;
mod rename;
mod reserve;
mod restore;
mod rollback;
mod setattr;
mod shared;
mod snapshot;
mod snapshot_view;
mod tmpfile;
pub(crate) mod trees;
pub mod types;
mod xattr;

pub use acl::{Acl, ACCESS as ACL_ACCESS, DEFAULT as ACL_DEFAULT};
pub(crate) use clones::Origin;
pub use clones::SubvolumeInfo;
pub use copy_tree::{Copied, CopyAs, CopyJob};
pub use create::LINK_MAX;
pub use damage::{Damage, OnDamage};
pub use inode_flags::NOCOW_FL;
pub use layout::SLICE_EXTENTS;
pub use op_lock::on_lock_wait;
pub use readdir::PlusBatch;
pub use remove_tree::{Permits, RemoveJob, Removed, Unchecked};
pub use rollback::RolledBack;
pub use snapshot::SnapshotInfo;
pub(crate) use snapshot::{root_ptr, Snap};
pub use types::*;

use crate::btree::{Store, Tree};
use crate::clock::{Clock, SystemClock};
use crate::counters::Counters;
use crate::error::{Error, Result};
use crate::inode_cache::InodeCache;
use crate::log_io::LogSync;
use crate::space::Allocator;
use crate::txn;
use idxfs_blockdev::BlockDevice;
use idxfs_format::items::{decode_inode, InodeItem, Timespec, S_IFDIR, S_IFMT};
use idxfs_format::superblock::{RootPtr, Superblock};
use idxfs_format::versions::{CURRENT_VERSION, MAGIC};
use idxfs_format::{
    ItemType, Key, BLOCK_SIZE, FIRST_FREE_INO, NAME_MAX, ROOT_INO, SUPER_COPIES, TREE_FS,
    TREE_SPACE,
};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use zerocopy::IntoBytes;

/// Dirty cached inodes past which their changes go into the tree after an operation (the
/// commit would write them anyway): bounds the commit's need for them.
const INODE_WRITEBACK: usize = 64;

/// Name hash function type: the format's `name_hash`, or a test hook that forces collisions.
pub type NameHash = fn(&[u8]) -> u64;

#[derive(Clone)]
pub struct MkfsOptions {
    pub node_size: u32,
    pub uuid: Option<[u8; 16]>,
    /// Owner of the root directory.
    pub root_owner: Owner,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            node_size: idxfs_format::DEFAULT_NODE_SIZE,
            uuid: None,
            root_owner: Owner::default(),
        }
    }
}

#[derive(Clone)]
pub struct OpenOptions {
    pub read_only: bool,
    /// Commit the running transaction this often (None: only on sync/fsync/close/bounds).
    pub commit_interval: Option<Duration>,
    /// Memory bound of the node cache, in bytes.
    pub cache_bytes: usize,
    /// Bound on cached inodes.
    pub inode_cache_entries: usize,
    /// Commit when this many nodes are dirty (bounds memory and commit latency). Kept at most
    /// half the cache: dirty nodes cannot be evicted. Random inserts (name hashes) dirty every
    /// leaf they touch, so a limit below the number of hash leaves turns into one commit per
    /// few thousand creates; this bound is the main knob of create throughput in huge
    /// directories.
    pub dirty_nodes_limit: usize,
    pub clock: Arc<dyn Clock>,
    /// When reads update the access time.
    pub atime: Atime,
    /// Which operations are durable when they return (`-o sync`, `-o dirsync`).
    pub sync: SyncMode,
    /// What to do after meeting damaged metadata (`-o errors=`, `damage`).
    pub on_damage: OnDamage,
    /// POSIX ACLs (`acl`): new inodes inherit their directory's default ACL, chmod and the
    /// access ACL keep each other current. Off (`-o noacl`): the ACL xattrs are refused
    /// with NotSupported and listed by no one, nothing is inherited (a chmod still keeps a
    /// stored access ACL in step).
    pub acl: bool,
    /// Tell the device about freed blocks once nothing can read them (`space::discard`):
    /// an image file gives their space back. Freed file data is then reused only after the
    /// next commit, not within its own transaction.
    pub discard: bool,
    /// Data checksums (`data_sum`): every block written copy-on-write gets a crc32c, checked
    /// on every read from the device. Off (`-o nodatasum`): no new sums are written (those
    /// of rewritten ranges still go); the ones there are still checked.
    pub datasum: bool,
    /// Testing only: a name hash other than the format's, to force collisions. An image written
    /// with it must be read and checked with it.
    pub name_hash: NameHash,
    /// Benchmark only: file new entries in the name-hash index alone, to measure what the
    /// inode-order index costs (`idxfs bench dir-index`). Such an image fails fsck and its
    /// directories list empty: never use it for data.
    #[doc(hidden)]
    pub bench_hash_index_only: bool,
    /// Benchmark only: getattr and lookup always take the operation lock (nothing is
    /// published), to measure what the lock-free path gains (`idxfs bench concurrency`).
    #[doc(hidden)]
    pub bench_locked_reads: bool,
    /// Benchmark only: an fsync writes and flushes its log batch holding the operation lock
    /// (as before `log_io`), to measure what writing it without the lock gains.
    #[doc(hidden)]
    pub bench_log_under_lock: bool,
    /// Every read and write runs whole under the operation lock, data I/O included, as
    /// before `data_io`: the same-run baseline for what moving it out gains
    /// (`idxfs bench concurrency`).
    #[doc(hidden)]
    pub bench_data_under_lock: bool,
    /// Testing only: commit after every freeing batch, as a device too full for the next
    /// batch's reservation makes it, so crash tests see the states between batches.
    #[doc(hidden)]
    pub test_commit_between_batches: bool,
    /// Opens this snapshot (`Fs::snapshot`'s id) instead of the file system, read-only.
    pub snapshot: Option<u64>,
    /// Makes this writable subvolume the active one (`Fs::make_clone`'s id, or
    /// `FS_SUBVOL_ID` for the file system's own tree; `clones`), with a commit, before
    /// anything else; a read-only open shows it instead without changing the image. None:
    /// whichever was active.
    pub subvolume: Option<u64>,
    /// Testing only: run between a sharing copy's plan and its first batch, without the lock
    /// (`clone`), so a test can change the files in that window.
    #[doc(hidden)]
    pub test_before_share: Option<policy::TestHook>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            read_only: false,
            commit_interval: Some(Duration::from_secs(5)),
            cache_bytes: 1 << 30,
            inode_cache_entries: 1 << 16,
            dirty_nodes_limit: 16384,
            clock: Arc::new(SystemClock),
            atime: Atime::default(),
            sync: SyncMode::default(),
            on_damage: OnDamage::default(),
            acl: true,
            discard: true,
            datasum: true,
            name_hash: idxfs_format::hash::name_hash,
            bench_hash_index_only: false,
            bench_locked_reads: false,
            bench_log_under_lock: false,
            bench_data_under_lock: false,
            test_commit_between_batches: false,
            test_before_share: None,
            snapshot: None,
            subvolume: None,
        }
    }
}

pub(crate) struct Inner {
    /// The mount's settings (`policy`).
    pub policy: policy::Policy,
    pub store: Store,
    pub fs_tree: Tree,
    pub space_tree: Tree,
    pub inodes: InodeCache,
    /// The last committed superblock, what the running transaction changes of it, and the
    /// commit in flight (`crate::txn`).
    pub txn: txn::TxnState,
    /// Set when the file system stopped writing after an error; the first cause.
    pub failed: Option<String>,
    /// Pins, orphans, and inodes waiting to be freed (see `orphan`).
    pub lives: orphan::Lives,
    /// What the running operation has done that its end acts on.
    pub op: OpScope,
    /// The leaf the last inode-order directory entry went into: creates number inodes in
    /// ascending order, so the next entry usually goes right after it (`dir::add_ino_record`).
    pub dir_ino_hint: crate::btree::LeafHint,
    /// The running transaction's fsync log chain (`crate::log`).
    pub log: crate::log::Log,
    /// In-place writes beside the lock: their sequence, and the blocks writes have in flight
    /// without it (`in_place::InPlace`).
    pub in_place: in_place::InPlace,
    /// Snapshots, held data blocks and the roots tree (`snapshot`).
    pub snapshots: snapshot::Snapshots,
    /// Where the tree in hand publishes for the reads that take no lock (`published`).
    pub published: Arc<published::Published>,
    /// The writable trees open beside the one in hand (`trees`).
    pub trees: trees::OpenTrees,
}

/// What the running operation has done that its end acts on (`write_op`, `Locked`).
#[derive(Default)]
pub(crate) struct OpScope {
    /// `store.changes.mod_seq` at the operation's last checkpoint (see the module notes).
    pub checkpoint: u64,
    /// Names it removed, as `published::name_key`s: unpublished when it lets go of the lock.
    pub names_removed: Vec<u64>,
    /// The most node slots it has reserved (`reserve_nodes`'s `nodes`): a reservation is
    /// the least the pools hold, not an addition, so a part of the operation that finds it
    /// needs more (`make_node`'s inherited ACLs) reserves on top of this.
    pub nodes: u64,
}

struct Shared {
    /// The operation lock (`op_lock`: a mutex handed between threads rarely).
    inner: op_lock::OpLock<Inner>,
    /// The same as the allocator's: waited on without the lock (`write_op`).
    fence: Arc<crate::space::read_fence::ReadFence>,
    /// What the last finished operation in the primary tree left (inodes, names, symlink
    /// targets, xattrs, statfs's counts), for the reads that take no lock; each handle has
    /// its tree's (`Fs::hand`).
    published: Arc<published::Published>,
    /// The same as `Inner::txn.flight`, for waiting without the lock.
    flight: Arc<txn::Flight>,
    /// The same as `Inner::log.io`: fsync batches are written and flushed without the lock.
    log_io: Arc<crate::log_io::LogIo>,
    /// The image, for the fsync log's I/O without the lock.
    dev: Arc<dyn BlockDevice>,
    /// The image's size in blocks (fixed for a mount).
    total_blocks: u64,
    /// `OpenOptions::acl`, for the checks that take no lock.
    acl: bool,
    /// `OpenOptions::inode_cache_entries`, for trees opened beside the primary (`trees`).
    cache_entries: usize,
    /// The commit thread's stop flag and wake-up.
    ticker: Ticker,
    counters: Arc<Counters>,
    /// The snapshots opened beside this file system, or the one it is (`snapshot_view`).
    views: snapshot_view::Views,
}

/// What stops and wakes the commit thread (`commit_loop`).
#[derive(Default)]
struct Ticker {
    stop: Mutex<bool>,
    wake: Condvar,
}

/// Times an operation refused for space waits for readers holding freed blocks and runs
/// again, and how long each wait may take (readers outside the lock are in device I/O).
const SPACE_HELD_TRIES: usize = 2;
const SPACE_HELD_WAIT: Duration = Duration::from_secs(2);
/// How long an operation refused for space waits for an unlinked inode's holder to let go
/// (`Releases::wait`): a FUSE FORGET after an unlink comes within milliseconds.
const KEPT_WAIT: Duration = Duration::from_millis(200);
/// How long an operation refused because blocks it keeps part of are being written without
/// the lock (`Error::InFlight`) waits before it runs again: about one device write.
const IN_FLIGHT_WAIT: Duration = Duration::from_micros(50);
/// How often a commit for the dirty-node bound alone writes a stalled commit again (`txn`).
const STALL_RETRY: Duration = Duration::from_secs(1);

/// A mounted idxfs image.
pub struct Fs {
    shared: Arc<Shared>,
    committer: Option<JoinHandle<()>>,
    /// The tree this handle serves (`trees`).
    hand: trees::Hand,
}

/// The newest valid superblock copy, and the problem with each copy (by number) that is not.
pub type SuperblockCopies = (Option<Superblock>, Vec<(u64, idxfs_format::Corrupt)>);

/// Reads every superblock copy.
pub fn superblock_copies(dev: &dyn BlockDevice) -> Result<SuperblockCopies> {
    let dev_blocks = dev.size() / BLOCK_SIZE;
    if dev_blocks < SUPER_COPIES {
        return Err(idxfs_format::Corrupt::new(
            "device size",
            format!("{} bytes", dev.size()),
            "at least two 4 KiB blocks",
        )
        .into());
    }
    let mut best: Option<Superblock> = None;
    let mut errors = Vec::new();
    for copy in 0..SUPER_COPIES {
        let mut buf = vec![0u8; BLOCK_SIZE as usize];
        dev.read_at(&mut buf, copy * BLOCK_SIZE)?;
        match Superblock::decode(&buf, copy, dev_blocks) {
            Ok(sb) => {
                if best.is_none_or(|b| sb.generation.get() > b.generation.get()) {
                    best = Some(sb);
                }
            }
            Err(e) => errors.push((copy, e)),
        }
    }
    Ok((best, errors))
}

fn read_superblocks(dev: &dyn BlockDevice) -> Result<Superblock> {
    read_superblock_and_damage(dev).map(|(sb, _)| sb)
}

/// The newest valid superblock copy, and whether another copy could not be used (then the
/// next commit reuses a generation it may have had: `TxnState::zero_log_head`).
pub(crate) fn read_superblock_and_damage(dev: &dyn BlockDevice) -> Result<(Superblock, bool)> {
    match superblock_copies(dev)? {
        (Some(sb), errors) => Ok((sb, !errors.is_empty())),
        // Report the first copy's problem: for a foreign image both say "magic".
        (None, errors) => Err(errors
            .into_iter()
            .next()
            .map(|(_, e)| Error::Corrupt(e))
            .unwrap_or(Error::NotFound)),
    }
}

/// Reads both superblock copies and returns the newest valid one.
pub fn read_superblock(dev: &dyn BlockDevice) -> Result<Superblock> {
    read_superblocks(dev)
}

impl Fs {
    /// Formats `dev` as an empty idxfs with a root directory.
    pub fn mkfs(dev: Arc<dyn BlockDevice>, opts: &MkfsOptions) -> Result<()> {
        let ns = opts.node_size;
        if !ns.is_power_of_two()
            || !(idxfs_format::MIN_NODE_SIZE..=idxfs_format::MAX_NODE_SIZE).contains(&ns)
        {
            return Err(Error::Invalid(
                "node size must be a power of two from 4096 to 65536",
            ));
        }
        let total_blocks = dev.size() / BLOCK_SIZE;
        // One bitmap item per group must fit a quarter of a leaf: node_size blocks per group
        // gives a bitmap of node_size / 8 bytes (64 MiB groups with 16 KiB nodes).
        let group_blocks = ns as u64;
        let min_blocks = 64 + ns as u64 / BLOCK_SIZE * 16;
        if total_blocks < min_blocks {
            return Err(Error::Invalid("device too small for idxfs"));
        }
        let uuid = opts.uuid.unwrap_or_else(random_uuid);
        let counters = Arc::new(Counters::default());
        let alloc = Allocator::new(total_blocks, group_blocks, counters.clone());
        let store = Store::new(
            dev.clone(),
            uuid,
            ns,
            total_blocks,
            1,
            1024,
            alloc,
            counters,
        );
        // Zero both superblock slots first so an image of another format (or an older idxfs)
        // cannot be half-recognised after a crash during mkfs.
        for copy in 0..SUPER_COPIES {
            dev.write_at(&[0u8; BLOCK_SIZE as usize], copy * BLOCK_SIZE)?;
        }
        let (sec, nsec) = SystemClock.now();
        let now = Timespec {
            sec: sec.into(),
            nsec: nsec.into(),
        };
        let root = new_inode_item(S_IFDIR | 0o755, opts.root_owner, 0, 1, now);
        let mut root = root;
        root.nlink = 2.into();
        let sb = Superblock {
            csum: 0.into(),
            version: CURRENT_VERSION.into(),
            magic: MAGIC,
            uuid,
            incompat: 0.into(),
            // Data sums from the start: the first fsync of a new image then logs, where an
            // older image's first sum takes a commit (`data_sum`).
            compat_ro: idxfs_format::versions::COMPAT_RO_DATA_SUMS.into(),
            compat: 0.into(),
            generation: 0.into(),
            copy_index: 0.into(),
            block_size: (BLOCK_SIZE as u32).into(),
            node_size: ns.into(),
            total_blocks: total_blocks.into(),
            group_blocks: group_blocks.into(),
            fs_root: RootPtr::default(),
            space_root: RootPtr::default(),
            log_root: RootPtr::default(),
            next_ino: FIRST_FREE_INO.into(),
            used_blocks: 0.into(),
            inode_count: 1.into(),
            errors: 0.into(),
            first_error_time: 0.into(),
            roots_root: RootPtr::default(),
            subvolume: 0.into(),
            reserved: Default::default(),
        };
        let mut inner = Inner::empty(store, sb, idxfs_format::hash::name_hash)?;
        inner.fs_tree.insert(
            &mut inner.store,
            Key::new(ROOT_INO, ItemType::Inode, 0),
            root.as_bytes().to_vec(),
        )?;
        inner.commit()?;
        // Write the second copy too, so a fresh image has both slots valid.
        inner.txn.changed = true;
        inner.commit()
    }

    /// Opens a formatted device.
    pub fn open(dev: Arc<dyn BlockDevice>, opts: OpenOptions) -> Result<Fs> {
        let (sb, copy_damaged) = read_superblock_and_damage(dev.as_ref())?;
        if sb.errors.get() > 0 {
            log::warn!(
                "the image recorded {} metadata error(s) met at run time: run `idxfs fsck \
                 --repair` on it",
                sb.errors.get()
            );
        }
        let counters = Arc::new(Counters::default());
        let total = sb.total_blocks.get();
        let mut alloc = Allocator::new(total, sb.group_blocks.get(), counters.clone());
        alloc.set_discard(opts.discard);
        let cache_nodes = opts.cache_bytes / (sb.node_size.get() as usize * 2);
        let store = Store::new(
            dev,
            sb.uuid,
            sb.node_size.get(),
            total,
            sb.generation.get() + 1,
            cache_nodes,
            alloc,
            counters.clone(),
        );
        let tree = |r: &RootPtr, owner| Tree {
            owner,
            root: crate::btree::Ptr {
                block: r.block.get(),
                generation: r.generation.get(),
            },
            level: r.level.get() as u8,
        };
        let mut inner = Inner::from_parts(
            store,
            [tree(&sb.fs_root, TREE_FS), tree(&sb.space_root, TREE_SPACE)],
            InodeCache::new(opts.inode_cache_entries),
            txn::TxnState::new(sb),
            policy::Policy {
                read_only: opts.read_only || sb.unknown_compat_ro(),
                atime: opts.atime,
                sync: opts.sync,
                on_damage: opts.on_damage,
                acl: opts.acl,
                datasum: opts.datasum,
                hash: opts.name_hash,
                clock: opts.clock.clone(),
                dirty_nodes_limit: opts.dirty_nodes_limit.clamp(64, (cache_nodes / 2).max(64)),
                knobs: policy::Knobs {
                    hash_index_only: opts.bench_hash_index_only,
                    log_under_lock: opts.bench_log_under_lock,
                    data_under_lock: opts.bench_data_under_lock,
                    commit_between_batches: opts.test_commit_between_batches,
                },
                before_share: opts.test_before_share.clone(),
            },
        );
        let space_tree = inner.space_tree;
        txn::load_space(&mut inner.store, &space_tree)?;
        inner.load_roots(&sb.roots_root, sb.subvolume.get())?;
        inner.txn.space_nodes = space_tree.count_nodes(&mut inner.store)?;
        inner.txn.zero_log_head = copy_damaged;
        let used = inner.store.alloc.used_blocks();
        if used != sb.used_blocks.get() {
            return Err(idxfs_format::Corrupt::new(
                "superblock used blocks",
                sb.used_blocks.get(),
                format!("{used} (sum of block group bitmaps)"),
            )
            .into());
        }
        // What was fsynced after the last commit. A read-only open keeps the result in
        // memory; a read-write one commits it, which also starts this mount's own log. A
        // snapshot is opened read-only as it was committed: the log is the fs tree's.
        if let Some(id) = opts.snapshot {
            inner.policy.read_only = true;
            inner.enter_snapshot(id)?;
        } else {
            if crate::log::replay(&mut inner)? > 0 && !inner.policy.read_only {
                inner.commit()?;
            }
            // After the replay: the log is the active tree's.
            match opts.subvolume {
                Some(id) if inner.policy.read_only => inner.enter_parked(id)?,
                Some(id) => inner.switch_to(id, opts.inode_cache_entries)?,
                None => {}
            }
        }
        Fs::launch(inner, &opts, counters, None)
    }

    /// Starts a file system whose trees are loaded: checks the root, publishes, starts the
    /// commit thread (`opts.commit_interval`) and frees what orphans a crash left.
    /// `view_of`: set for a snapshot opened beside its file system (`snapshot_view`).
    fn launch(
        mut inner: Inner,
        opts: &OpenOptions,
        counters: Arc<Counters>,
        view_of: Option<snapshot_view::ViewOf>,
    ) -> Result<Fs> {
        inner.load_orphans()?;
        // The root must exist and be a directory.
        let root = inner.inode(ROOT_INO)?;
        if root.mode.get() & S_IFMT != S_IFDIR {
            return Err(idxfs_format::Corrupt::new(
                "root inode type",
                format!("{:#o}", root.mode.get() & S_IFMT),
                "directory",
            )
            .into());
        }
        let published = Arc::new(published::Published::new(
            opts.inode_cache_entries,
            !opts.bench_locked_reads,
        ));
        inner.published = published.clone();
        inner.trees.primary = inner.snapshots.clones.active;
        let hand = trees::Hand {
            active: inner.trees.primary,
            secondary: false,
            closed: false,
            pins: inner.lives.pins.clone(),
            published: published.clone(),
        };
        let shared = Arc::new(Shared {
            published,
            flight: inner.txn.flight.clone(),
            fence: inner.store.alloc.fence().clone(),
            log_io: inner.log.io.clone(),
            dev: inner.store.dev.clone(),
            total_blocks: inner.store.total_blocks,
            acl: opts.acl,
            cache_entries: opts.inode_cache_entries,
            inner: op_lock::OpLock::new(inner, counters.clone()),
            views: snapshot_view::Views {
                open: Default::default(),
                of: view_of,
            },
            ticker: Ticker::default(),
            counters,
        });
        // Also on a read-only mount: a remount may make it writable (`reconfigure`); the loop
        // commits nothing while it is read-only.
        let committer = match opts.commit_interval {
            Some(every) => {
                let weak = Arc::downgrade(&shared);
                Some(
                    std::thread::Builder::new()
                        .name("idxfs-commit".into())
                        .spawn(move || commit_loop(weak, every))?,
                )
            }
            None => None,
        };
        let fs = Fs {
            shared,
            committer,
            hand,
        };
        // Orphans left by a crash: nothing can hold them any more.
        fs.reclaim_orphans()?;
        Ok(fs)
    }

    /// The operation lock, with this handle's tree in hand (`trees`).
    pub(crate) fn lock(&self) -> Locked<'_> {
        self.shared.lock_hand(Some(self.hand.active))
    }

    /// Runs a mutating operation: refuses on a read-only or failed file system, reserves space
    /// for `items` item changes, turns an error after a change since the last checkpoint
    /// into a stopped file system, and makes the operation durable before it returns when the
    /// mount's sync mode covers `durable`. An operation refused for space before any change
    /// waits without the lock and runs again: while freed blocks wait for readers outside
    /// the lock (`crate::space::read_fence`), for those readers; while an unlinked inode is
    /// kept for a holder, briefly for its release (`Releases::wait`).
    pub(crate) fn write_op<R>(
        &self,
        items: u64,
        kind: Reserve,
        durable: Durable,
        mut f: impl FnMut(&mut Inner) -> Result<R>,
    ) -> Result<R> {
        let mut space_tries = 0;
        // While it waits for writes in flight, none other leaves the lock (`in_place`).
        let mut waiting = None;
        loop {
            let mut held = None;
            let releases = self.hand.pins.releases.count();
            let r = self.write_op_once(items, kind, durable, &mut f, &mut held);
            if let Err(Error::InFlight) = r {
                // Blocks it keeps part of are being written without the lock: that write is
                // one device write from leaving (`in_place`).
                if waiting.is_none() {
                    waiting = Some(self.lock().in_place.wait());
                }
                std::thread::sleep(IN_FLIGHT_WAIT);
                continue;
            }
            if space_tries == SPACE_HELD_TRIES {
                return r;
            }
            space_tries += 1;
            match held {
                Some(Some(stamp)) if self.shared.fence.wait_passed(stamp, SPACE_HELD_WAIT) => {}
                Some(_) if self.hand.pins.releases.wait(releases, KEPT_WAIT) => {
                    Counters::inc(&self.shared.counters.space_waits_for_release);
                }
                _ => return r,
            }
        }
    }

    /// One run of `write_op`. `held`: set when it was refused for space before any change,
    /// to the fence stamp that frees the blocks held for readers if any are.
    pub(crate) fn write_op_once<R>(
        &self,
        items: u64,
        kind: Reserve,
        durable: Durable,
        f: &mut impl FnMut(&mut Inner) -> Result<R>,
        held: &mut Option<Option<u64>>,
    ) -> Result<R> {
        let mut g = self.lock();
        g.writable()?;
        // While a commit is stalled (`txn`), changes pile up in memory, and the cache cannot
        // drop dirty nodes: past twice their bound, an operation is refused before its first
        // change unless the stalled commit can be written now (once per `STALL_RETRY`).
        if g.store.changes.dirty_nodes > g.policy.dirty_nodes_limit.saturating_mul(2) {
            if let Some(tried) = self.shared.flight.stalled_since() {
                match tried.elapsed() < STALL_RETRY {
                    true => g.reap_wait()?,
                    false => g.commit()?,
                }
            }
        }
        let refused = |g: &Inner, e: &Error| match e {
            Error::NoSpace => Some(g.store.alloc.held_until()),
            _ => None,
        };
        g.op.nodes = 0;
        if let Err(e) = g.reserve(items, kind) {
            *held = refused(&g, &e);
            return Err(e);
        }
        let seq = g.store.changes.mod_seq;
        g.op.checkpoint = seq;
        let r = f(&mut g);
        let changed = g.store.changes.mod_seq != seq;
        debug_assert!(
            !(changed && matches!(r, Err(Error::InFlight))),
            "refused for a write in flight after changing something"
        );
        if changed {
            g.txn.changed = true;
        }
        let mut over_bound = false;
        let mut log = LogSync::Commit;
        match &r {
            // A commit inside the operation stalled: what it froze is whole (an operation
            // commits only where it is), and no more was changed after.
            Err(Error::Unwritten(_)) => {}
            Err(e) if g.store.changes.mod_seq != g.op.checkpoint || e.is_fatal() => {
                let why = format!("{e}");
                g.fail(why);
            }
            Ok(_) => {
                if changed && g.policy.sync.covers(durable) {
                    log = g.make_durable()?;
                }
                over_bound = g.after_op()?;
            }
            Err(e) if !changed => *held = refused(&g, e),
            Err(_) => {}
        }
        drop(g);
        self.shared.finish_log(log, None)?;
        if over_bound {
            match self.shared.commit_beside(true) {
                // The operation is done; its commit waits (`txn`, "A stalled commit").
                Err(Error::Unwritten(_)) => {}
                other => other?,
            }
        }
        r
    }

    /// Commits the running transaction now; operations go on while its nodes are written.
    pub fn sync(&self) -> Result<()> {
        {
            let g = self.lock();
            if g.policy.read_only {
                return Ok(());
            }
            g.durable_ok()?;
        }
        self.shared.commit_beside(false)
    }

    /// Makes `ino`'s data and metadata durable, with everything else changed before it: one
    /// batch of the fsync log, whose cost follows what changed in the handle's tree since its
    /// last fsync (`log`; a tree opened beside the active one logs as that one does, `trees`),
    /// or a commit when there is no log to append to. On a file system stopped by an error
    /// the answer is that error (EIO), as the kernel's file systems give: what was asked
    /// cannot be made durable.
    pub fn fsync(&self, ino: Ino) -> Result<()> {
        self.getattr(ino)?;
        // The log this appends to is named by the superblock of a commit in flight: wait for
        // it without the lock (others go on), so the wait under the lock below is short.
        self.shared.flight.wait_written();
        let log = {
            let mut g = self.lock();
            if g.policy.read_only {
                return Ok(());
            }
            g.durable_ok()?;
            let log = g.make_durable()?;
            if g.policy.knobs.log_under_lock {
                return self.shared.finish_log(log, Some(g));
            }
            log
        };
        self.shared.finish_log(log, None)
    }

    /// Changes what a remount may change: read-only or writable, the atime policy and the
    /// sync mode. Going read-only commits first (an error then leaves the mount as it was);
    /// going writable is refused on a device opened read-only, on an image with read-only
    /// features this code does not know, and on a file system stopped by an error, and then
    /// finishes the orphans a read-only mount had to leave.
    pub fn reconfigure(&self, read_only: bool, atime: Atime, sync: SyncMode) -> Result<()> {
        {
            let mut g = self.lock();
            if read_only && !g.policy.read_only {
                g.durable_ok()?;
                g.commit()?;
            }
            if !read_only && g.policy.read_only {
                if !g.store.dev.writable() {
                    return Err(Error::Invalid("the image was opened read-only"));
                }
                if g.txn.sb.unknown_compat_ro() {
                    return Err(Error::NotSupported(
                        "writing: the image has read-only features this version does not know",
                    ));
                }
                if let Some(why) = &g.failed {
                    return Err(Error::Io(std::io::Error::other(format!(
                        "file system stopped after an error: {why}"
                    ))));
                }
            }
            // Also when it is writable in name: changes stay refused until a repair.
            if !read_only && g.store.damage.refusing() {
                return Err(Error::Invalid(
                    "metadata damage was met (errors=remount-ro): unmount and run `idxfs \
                     fsck --repair` first",
                ));
            }
            g.policy.read_only = read_only;
            g.policy.atime = atime;
            g.policy.sync = sync;
        }
        if !read_only {
            self.reclaim_orphans()?;
        }
        Ok(())
    }

    /// What a remount may change, as it stands: read-only, atime policy, sync mode.
    pub fn settings(&self) -> (bool, Atime, SyncMode) {
        let g = self.lock();
        (g.policy.read_only, g.policy.atime, g.policy.sync)
    }

    /// Commits and stops the commit thread. Dropping an `Fs` does the same, ignoring errors.
    pub fn close(mut self) -> Result<()> {
        if self.hand.secondary {
            self.hand.closed = true;
            return self.close_secondary();
        }
        self.stop_committer();
        let r = self.release_all().and_then(|()| {
            let mut g = self.lock();
            if g.policy.read_only || g.failed.is_some() {
                return Ok(());
            }
            g.commit()
        });
        match r {
            // No commit comes after this one to write them (`txn`, "A stalled commit").
            Err(Error::Unwritten(e)) => Err(Error::Io(std::io::Error::new(
                e.kind(),
                format!(
                    "the device refused the last commit's writes ({e}): the changes since \
                     the last successful commit or fsync are lost"
                ),
            ))),
            r => r,
        }
    }

    /// Nothing holds an inode of a closing file system: drop all pins and free the orphans.
    fn release_all(&self) -> Result<()> {
        {
            // Under the operation lock: no operation is between a pin check and its change.
            let _g = self.lock();
            self.hand.pins.clear();
        }
        self.reclaim_orphans().map(|_| ())
    }

    fn stop_committer(&mut self) {
        if let Ok(mut s) = self.shared.ticker.stop.lock() {
            *s = true;
        }
        self.shared.ticker.wake.notify_all();
        if let Some(h) = self.committer.take() {
            let _ = h.join();
        }
    }

    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// Why the file system stopped writing, if it did.
    pub fn failure(&self) -> Option<String> {
        self.lock().failed.clone()
    }

    /// The first damaged metadata this mount met, if any, and whether changes are refused
    /// because of it (`errors=remount-ro`, see `damage`).
    pub fn damage(&self) -> Option<(String, bool)> {
        let g = self.lock();
        let d = &g.store.damage;
        d.first().map(|w| (w.to_string(), d.refusing()))
    }

    /// An inode's attributes: without the lock when the inode is published (the common case:
    /// it is cached), else under it (which publishes it).
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        if let Some(it) = self.hand.published.getattr(ino) {
            Counters::inc(&self.shared.counters.getattr_lock_free);
            return Ok(Attr::from_item(ino, &it));
        }
        let mut g = self.lock();
        let it = g.inode(ino)?;
        // Read under the lock, so current: the next getattr of it takes no lock.
        g.publish_read(published::Read {
            inodes: vec![(ino, it)],
            ..Default::default()
        });
        Ok(Attr::from_item(ino, &it))
    }

    /// The file system's size and what is free, as the last finished operation left them:
    /// without the lock while statfs is asked between operations (`published`). A snapshot
    /// opened beside its file system answers with that file system's.
    pub fn statfs(&self) -> Result<StatFs> {
        Ok(match &self.shared.views.of {
            Some(v) => v.parent.statfs(&v.parent.published, None),
            None => self
                .shared
                .statfs(&self.hand.published, Some(self.hand.active)),
        })
    }

    /// Testing only: statfs computed under the lock, never the published counts, to check
    /// those against.
    #[doc(hidden)]
    pub fn statfs_under_lock(&self) -> StatFs {
        let c = self.lock().space_counts();
        self.shared.statfs_of(c)
    }
}

impl Shared {
    /// statfs as tree `active` (None: the primary) publishes it in `published`.
    fn statfs(&self, published: &published::Published, active: Option<u64>) -> StatFs {
        let c = match published.statfs() {
            Some(c) => {
                Counters::inc(&self.counters.statfs_lock_free);
                c
            }
            None => {
                let mut g = self.lock_hand(active);
                let c = g.space_counts();
                g.publish_read(published::Read {
                    space: Some(c),
                    ..Default::default()
                });
                c
            }
        };
        self.statfs_of(c)
    }

    fn statfs_of(&self, c: published::SpaceCounts) -> StatFs {
        StatFs {
            block_size: BLOCK_SIZE as u32,
            blocks: self.total_blocks,
            blocks_free: c.blocks_free,
            blocks_avail: c.blocks_avail,
            files: c.files,
            files_free: c.files_free,
            name_max: NAME_MAX as u32,
        }
    }
}

impl Fs {
    /// Test and tool access to the whole engine state under the lock.
    /// Discards every free block (`idxfs trim`): what a mount with `nodiscard`, or an
    /// older idxfs, left allocated in an image file goes back. Commits first, so what is
    /// pinned is free; the device I/O runs under the lock (an explicit, whole pass).
    /// Returns the blocks discarded.
    pub fn trim(&self) -> Result<u64> {
        let mut g = self.lock();
        if g.policy.read_only {
            return Err(Error::ReadOnly);
        }
        g.commit()?;
        let ranges = g.store.alloc.free_ranges();
        crate::space::discard::send(g.store.dev.as_ref(), &ranges, &g.store.counters);
        Ok(ranges.iter().map(|r| r.1).sum())
    }

    pub fn with_store<R>(&self, f: impl FnOnce(&mut Store, &Tree, &Tree) -> R) -> R {
        let mut g = self.lock();
        let (fs, sp) = (g.fs_tree, g.space_tree);
        f(&mut g.store, &fs, &sp)
    }
}

impl Drop for Fs {
    fn drop(&mut self) {
        if self.hand.secondary {
            if !std::mem::replace(&mut self.hand.closed, true) {
                let _ = self.close_secondary();
            }
            return;
        }
        self.stop_committer();
        let _ = self.release_all();
        let mut g = self.lock();
        if !g.policy.read_only && g.failed.is_none() {
            let _ = g.commit();
        }
    }
}

fn commit_loop(weak: std::sync::Weak<Shared>, every: Duration) {
    loop {
        let Some(shared) = weak.upgrade() else { return };
        {
            let Ok(stop) = shared.ticker.stop.lock() else {
                return;
            };
            if *stop {
                return;
            }
            let Ok((stop, _)) = shared.ticker.wake.wait_timeout(stop, every) else {
                return;
            };
            if *stop {
                return;
            }
        }
        // Deleted snapshots give their nodes back a step at a time, each under the lock.
        while shared.drop_step().unwrap_or(false) {
            if shared.ticker.stop.lock().map_or(true, |s| *s) {
                return;
            }
        }
        // An error here has already stopped the file system, or left a stalled commit for
        // the next tick to write again (`txn`).
        let _ = shared.commit_beside(false);
    }
}

/// The operation lock held: the engine state, and on release the inodes the holder changed
/// published for lock-free readers (`published`).
pub(crate) struct Locked<'a> {
    g: op_lock::OpGuard<'a, Inner>,
    /// What the holder read and wants published with its changes (`publish_read`).
    read: published::Read,
}

impl Locked<'_> {
    /// Publishes inodes (and a name) read under this lock when it is let go, for the next
    /// reader to find without the lock.
    pub(crate) fn publish_read(&mut self, read: published::Read) {
        self.read = read;
    }
}

impl std::ops::Deref for Locked<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.g
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.g
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.g.after_damage();
        // Into the tree in hand's: its operation changed those inodes and names.
        let changed = published::Changes {
            inodes: self.g.inodes.take_changed(),
            names_removed: std::mem::take(&mut self.g.op.names_removed),
            space: self.g.published.space_live().then(|| self.g.space_counts()),
        };
        self.g
            .published
            .publish(changed, std::mem::take(&mut self.read));
    }
}

impl Shared {
    fn lock(&self) -> Locked<'_> {
        // A panic inside an operation poisons the lock; the state it left may be half-applied,
        // so the guard's `failed` check (set below) keeps it from being committed.
        let mut g = match self.inner.lock() {
            Ok(g) => g,
            Err(p) => {
                let mut g = p.into_inner();
                if g.failed.is_none() {
                    g.failed = Some("an operation panicked".into());
                }
                g
            }
        };
        g.reap();
        g.store.alloc.release_held();
        Locked {
            g,
            read: Default::default(),
        }
    }

    /// The operation lock with open tree `active` in hand (None: the primary; `trees`).
    fn lock_hand(&self, active: Option<u64>) -> Locked<'_> {
        let mut g = self.lock();
        let active = active.unwrap_or(g.trees.primary);
        if let Err(e) = g.hand(active) {
            // Only an engine bug gets here (a handle outlives its tree's state): stop
            // writing rather than act on another tree.
            g.fail(format!("{e}"));
        }
        g
    }
}

impl Fs {
    /// Pins each of `inos` (`pins`: no operation lock needed); how many it could not.
    fn pin_all(&self, inos: &[Ino]) -> usize {
        let refused = self.hand.pins.add_all(inos);
        for (_, why) in &refused {
            match why {
                pins::Pin::Gone => Counters::inc(&self.shared.counters.pins_refused_gone),
                _ => Counters::inc(&self.shared.counters.pin_alloc_failures),
            }
        }
        refused.len()
    }
}

impl Shared {
    /// The part of an fsync after the lock (`log_io`): the batch's write and the flush that
    /// makes it durable, with every batch before it. A failure stops the file system.
    /// `held`: the lock, still held (`OpenOptions::bench_log_under_lock` only).
    fn finish_log(&self, log: LogSync, held: Option<Locked<'_>>) -> Result<()> {
        match log.finish(self.dev.as_ref(), &self.log_io, &self.counters) {
            // A batch of the chain was refused: the running transaction holds every change
            // it carried, so a commit makes them durable and starts a new chain (`log_io`).
            Err(Error::Unwritten(_)) => {
                let mut g = held.unwrap_or_else(|| self.lock());
                Counters::inc(&self.counters.log_fallback_commits);
                g.commit()
            }
            Err(e) => {
                held.unwrap_or_else(|| self.lock())
                    .fail(format!("fsync log write failed: {e}"));
                Err(e)
            }
            Ok(()) => Ok(()),
        }
    }

    /// Commits with the frozen transaction written outside the lock (see `txn`), and returns
    /// once it is durable. `bound_only`: only if dirty nodes are still past their bound (another
    /// thread may have committed them meanwhile).
    ///
    /// A stalled commit is written first (`txn`); for the bound alone, at most once per
    /// `STALL_RETRY`, so operations past the bound do not each write it again.
    fn commit_beside(&self, bound_only: bool) -> Result<()> {
        loop {
            // Wait for a commit in flight without the lock, so that freezing does not wait
            // under it.
            self.flight.wait_written();
            let frozen = {
                let mut g = self.lock();
                if g.policy.read_only
                    || (bound_only && g.store.changes.dirty_nodes <= g.policy.dirty_nodes_limit)
                {
                    return Ok(());
                }
                if bound_only
                    && (self.flight.stalled_since()).is_some_and(|t| t.elapsed() < STALL_RETRY)
                {
                    return Ok(());
                }
                g.commit_begin()?
            };
            let Some(frozen) = frozen else {
                break;
            };
            let resumed = frozen.resumed();
            frozen.write_to(&self.flight);
            let mut g = self.lock();
            g.reap_wait()?;
            g.durable_ok()?;
            if !resumed {
                break;
            }
        }
        self.discard_beside();
        Ok(())
    }

    /// Sends the discards the allocator has waiting without the lock; their blocks stay busy
    /// until it is done (`space::discard`).
    fn discard_beside(&self) {
        let ranges = self.lock().store.alloc.take_discards();
        if ranges.is_empty() {
            return;
        }
        crate::space::discard::send(self.dev.as_ref(), &ranges, &self.counters);
        self.lock().store.alloc.discarded(&ranges);
    }
}

fn random_uuid() -> [u8; 16] {
    // Not security-relevant: a uuid only has to differ between file systems. Time and address
    // entropy mixed through SplitMix64.
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut r =
        crate::testutil::Rng::new(t ^ (&t as *const u64 as u64) ^ std::process::id() as u64);
    let mut u = [0u8; 16];
    u[..8].copy_from_slice(&r.next_u64().to_le_bytes());
    u[8..].copy_from_slice(&r.next_u64().to_le_bytes());
    u
}

pub(crate) fn new_inode_item(
    mode: u32,
    owner: Owner,
    rdev: u64,
    generation: u64,
    now: Timespec,
) -> InodeItem {
    InodeItem {
        mode: mode.into(),
        nlink: 1.into(),
        uid: owner.uid.into(),
        gid: owner.gid.into(),
        size: 0.into(),
        alloc_bytes: 0.into(),
        rdev: rdev.into(),
        flags: 0.into(),
        generation: generation.into(),
        atime: now,
        mtime: now,
        ctime: now,
        btime: now,
        reserved: Default::default(),
    }
}

/// What kind of space a mutating operation may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reserve {
    /// Creates and writes: must leave the global reserve untouched.
    Grow,
    /// Deletes, truncates and renames: may use the global reserve, so a full file system can
    /// be emptied.
    Shrink,
}

/// Which operations the mount's sync mode makes durable before they return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durable {
    /// Directory changes: create, mknod, mkdir, symlink, link, unlink, rmdir, rename.
    Dir,
    /// Everything else a user asks for: writes, truncates, attributes, xattrs.
    Data,
    /// Housekeeping that changes nothing a user sees (freeing released orphans).
    Never,
}

/// When operations are durable on return, as the `sync` and `dirsync` mount options say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// At the next commit, fsync, or sync (the default).
    #[default]
    Async,
    /// Directory changes on return (`-o dirsync`).
    Dirs,
    /// Every change on return (`-o sync`).
    All,
}

impl SyncMode {
    fn covers(self, d: Durable) -> bool {
        matches!(
            (self, d),
            (SyncMode::All, Durable::Dir | Durable::Data) | (SyncMode::Dirs, Durable::Dir)
        )
    }
}

impl Inner {
    /// A writable file system over `store` with empty trees and `sb` as the last commit's
    /// superblock, nothing committed yet (mkfs, and `repair`'s rebuild): the caller inserts
    /// items and commits.
    pub(crate) fn empty(mut store: Store, sb: Superblock, hash: NameHash) -> Result<Inner> {
        let fs_tree = Tree::create(&mut store, TREE_FS)?;
        let space_tree = Tree::create(&mut store, TREE_SPACE)?;
        let mut txn = txn::TxnState::new(sb);
        txn.changed = true;
        Ok(Inner::from_parts(
            store,
            [fs_tree, space_tree],
            InodeCache::new(1024),
            txn,
            policy::Policy {
                read_only: false,
                atime: Atime::NoAtime,
                sync: SyncMode::default(),
                on_damage: OnDamage::default(),
                acl: true,
                datasum: true,
                hash,
                clock: Arc::new(SystemClock),
                dirty_nodes_limit: usize::MAX,
                knobs: policy::Knobs::default(),
                before_share: None,
            },
        ))
    }

    /// A file system of these parts with nothing running: no error, pin, orphan or log yet.
    fn from_parts(
        store: Store,
        [fs_tree, space_tree]: [Tree; 2],
        inodes: InodeCache,
        txn: txn::TxnState,
        policy: policy::Policy,
    ) -> Inner {
        Inner {
            store,
            fs_tree,
            space_tree,
            inodes,
            txn,
            policy,
            failed: None,
            lives: Default::default(),
            op: OpScope::default(),
            dir_ino_hint: Default::default(),
            log: Default::default(),
            in_place: Default::default(),
            snapshots: Default::default(),
            published: Default::default(),
            trees: Default::default(),
        }
    }

    pub fn writable(&self) -> Result<()> {
        if self.policy.read_only
            || self.failed.is_some()
            || self.store.damage.refusing()
            || self.snapshots.opened.is_some()
        {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }

    pub fn fail(&mut self, why: String) {
        if self.failed.is_none() {
            log::error!(
                "stopped writing after an error (the image keeps its last commit and fsync): {why}"
            );
            self.failed = Some(why);
        }
    }

    /// Refuses durability requests (fsync, sync) on a file system that stopped after an error:
    /// EIO, with the first cause, since what the caller wants durable cannot be.
    fn durable_ok(&self) -> Result<()> {
        match &self.failed {
            Some(why) => Err(Error::Io(std::io::Error::other(format!(
                "file system stopped after an error: {why}"
            )))),
            // Not `writable`: after damage with errors=remount-ro, what was done before it
            // is still made durable (`damage`).
            None if self.policy.read_only => Err(Error::ReadOnly),
            None => Ok(()),
        }
    }

    /// Makes every change of the running transaction durable: an fsync log batch, built here
    /// and written by the caller once it lets go of the lock (`Shared::finish_log`), or a
    /// commit, done here, when there is no log to append to (or the batch would be too
    /// large).
    fn make_durable(&mut self) -> Result<LogSync> {
        // The log is named by the superblock of the last commit, which may still be in flight:
        // a batch may not return before that superblock is durable. A stalled one never
        // will on its own: commit, writing it first.
        match self.reap_wait() {
            Err(Error::Unwritten(_)) => {
                self.commit()?;
                return Ok(LogSync::Commit);
            }
            r => r?,
        }
        match self.log_build()? {
            LogSync::Commit => {
                Counters::inc(&self.store.counters.log_fallback_commits);
                self.commit()?;
                Ok(LogSync::Commit)
            }
            log => Ok(log),
        }
    }

    /// Marks the running operation's state whole: an error after this point and before any
    /// further change leaves the file system writable (see the module notes).
    pub fn checkpoint(&mut self) {
        self.op.checkpoint = self.store.changes.mod_seq;
    }

    /// Notes that the running transaction holds an item that needs incompat feature `bit`:
    /// the next commit sets it in the superblock, and until then fsync commits instead of
    /// logging (`log_sync`), so no durable state ever holds such an item without the bit
    /// that keeps older readers away.
    pub fn require_incompat(&mut self, bit: u64) {
        if self.txn.sb.incompat.get() & bit == 0 {
            self.txn.incompat_wanted |= bit;
        }
    }

    pub fn now(&self) -> Timespec {
        let (sec, nsec) = self.policy.clock.now();
        Timespec {
            sec: sec.into(),
            nsec: nsec.into(),
        }
    }

    /// Housekeeping after a successful change: move cached inode changes into the tree once
    /// more than `INODE_WRITEBACK` wait, so what the next commit must still allocate for them
    /// (and reservations take ahead for it) stays bounded. True when dirty nodes passed their
    /// bound: the caller commits once it has let go of the lock.
    fn after_op(&mut self) -> Result<bool> {
        if self.inodes.dirty_count() > INODE_WRITEBACK {
            self.write_back_inodes()?;
        }
        Ok(self.store.changes.dirty_nodes > self.policy.dirty_nodes_limit)
    }

    /// What statfs reports that operations change.
    pub(crate) fn space_counts(&self) -> published::SpaceCounts {
        let space = self.space_report();
        // f_bavail is what an unprivileged caller may use, whoever asks (as on ext4: root
        // may go on into the root reserve).
        let avail = space.avail;
        // An inode takes about 1/16 of a block of items (inode item, entries, back reference).
        let files_free = (idxfs_format::MAX_INO - self.txn.next_ino).min(avail * 16);
        published::SpaceCounts {
            blocks_free: space.free,
            blocks_avail: avail,
            files: self.txn.inode_count + files_free,
            files_free,
        }
    }

    /// Reads an inode (cache first).
    pub fn inode(&mut self, ino: Ino) -> Result<InodeItem> {
        if let Some(it) = self.inodes.get(ino) {
            Counters::inc(&self.store.counters.inode_cache_hits);
            return Ok(*it);
        }
        Counters::inc(&self.store.counters.inode_cache_misses);
        if ino == 0 || ino >= self.txn.next_ino {
            return Err(Error::NotFound);
        }
        let tree = self.fs_tree;
        let it = tree
            .with(&mut self.store, &Key::new(ino, ItemType::Inode, 0), |v| {
                decode_inode(v, ino)
            })?
            .ok_or(Error::NotFound)??;
        self.inodes.insert_clean(ino, it);
        Ok(it)
    }

    /// Changes a cached inode; written back at commit.
    pub fn modify_inode(&mut self, ino: Ino, f: impl FnOnce(&mut InodeItem)) -> Result<InodeItem> {
        self.inode(ino)?;
        self.inodes.modify(ino, f);
        self.store.changes.mod_seq += 1;
        self.inode(ino)
    }

    pub fn dir_inode(&mut self, ino: Ino) -> Result<InodeItem> {
        let it = self.inode(ino)?;
        if it.mode.get() & S_IFMT != S_IFDIR {
            return Err(Error::NotDir);
        }
        Ok(it)
    }

    /// Cached inode changes into the fs tree (commit, and fsync's log batch).
    pub(crate) fn write_back_inodes(&mut self) -> Result<()> {
        let dirty = self.inodes.take_dirty();
        self.store
            .counters
            .commit_dirty_inodes
            .add(dirty.len() as u64);
        for (ino, it) in dirty {
            let key = Key::new(ino, ItemType::Inode, 0);
            let found = self.fs_tree.update(&mut self.store, &key, |v| {
                v.clear();
                v.extend_from_slice(it.as_bytes());
                crate::btree::Change::Keep
            })?;
            assert!(found, "dirty inode {ino} has no inode item");
        }
        Ok(())
    }

    /// Validates a name for a new entry.
    pub fn check_name(name: &[u8]) -> Result<()> {
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        if name.is_empty()
            || name == b"."
            || name == b".."
            || name.contains(&b'/')
            || name.contains(&0)
        {
            return Err(Error::InvalidName);
        }
        Ok(())
    }
}
