//! What a mount was asked to do: settings fixed at open (`OpenOptions`), a few of which a
//! remount changes (`Fs::reconfigure`). Nothing here is state of the file system itself.
use super::{Atime, NameHash, SyncMode};
use crate::clock::Clock;
use std::sync::Arc;

pub(crate) struct Policy {
    /// Refuse every change (mounted so, remounted so, or an image with read-only features
    /// this code does not know).
    pub read_only: bool,
    /// When reads update the access time.
    pub atime: Atime,
    /// Which operations are durable when they return.
    pub sync: SyncMode,
    /// What to do after meeting damaged metadata (`super::damage`).
    pub on_damage: super::OnDamage,
    /// POSIX ACLs kept and inherited (`OpenOptions::acl`).
    pub acl: bool,
    /// New copy-on-write blocks get data checksums (`OpenOptions::datasum`).
    pub datasum: bool,
    /// The name hash: the format's, or a test's that forces collisions.
    pub hash: NameHash,
    pub clock: Arc<dyn Clock>,
    /// Commit when this many nodes are dirty (`OpenOptions::dirty_nodes_limit`).
    pub dirty_nodes_limit: usize,
    /// What benchmarks and tests turn on: all off in a real mount.
    pub knobs: Knobs,
    /// `OpenOptions::test_before_share`: None in a real mount.
    pub before_share: Option<TestHook>,
}

/// A test's code run at a point between two holds of the operation lock, without it.
pub type TestHook = Arc<dyn Fn() + Send + Sync>;

/// The benchmarks' same-run baselines and the tests' hooks (`OpenOptions::bench_*`, `test_*`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Knobs {
    /// `OpenOptions::bench_hash_index_only`.
    pub hash_index_only: bool,
    /// `OpenOptions::bench_log_under_lock`.
    pub log_under_lock: bool,
    /// `OpenOptions::bench_data_under_lock`.
    pub data_under_lock: bool,
    /// `OpenOptions::test_commit_between_batches`.
    pub commit_between_batches: bool,
}
