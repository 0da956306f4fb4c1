//! What a mount does when it meets damaged metadata at run time (ext4's `errors=`): a node
//! that cannot be read, or that fails its checks (checksum, identity, structure, place in its
//! parent's range).
//!
//! The operation that met it gets the error (EIO at the FUSE edge), as always. Then, as that
//! operation lets go of the lock (`after_damage`), on a mount that can write:
//! - the superblock's `errors` count grows and `first_error_time` is set; the next commit
//!   writes them, so `idxfs fsck` and every later mount see that the image wants a repair;
//! - one log line says what was met and what to do;
//! - with `errors=remount-ro` (the default) every later change is refused with EROFS, so
//!   nothing new is built on the damage. What finished operations did is whole (an operation
//!   that fails halfway stops the file system instead: see `fs`), so it is kept: fsync and the
//!   commits (timer, sync, unmount) go on and write it, with the error count. ext4 aborts its
//!   journal at this point and drops such changes; here a commit rewrites only nodes it read
//!   intact (copy-on-write), so it spreads no damage, while dropping would lose what calls
//!   said was written. A remount read-write is refused until `idxfs fsck --repair` has run;
//! - with `errors=continue` changes go on; only what touches the damage fails.
//!
//! A read-only mount records nothing (it writes nothing) but logs the same line once.
use super::Inner;
use crate::error::Error;

/// What a mount does after it meets damaged metadata (`-o errors=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnDamage {
    /// Refuse every later change (`errors=remount-ro`).
    #[default]
    ReadOnly,
    /// Go on; only operations that touch the damage fail (`errors=continue`).
    Continue,
}

/// Damaged metadata met since open (kept by `Store::load`, where every node is read) and
/// what the mount did about it.
#[derive(Debug, Default)]
pub struct Damage {
    /// Nodes that failed to read or to check.
    met: u64,
    /// The first of them, for the log line and `Fs::damage`.
    first: Option<String>,
    /// How many of `met` were acted on (`after_damage`).
    acted: u64,
    /// Changes are refused (`OnDamage::ReadOnly` after damage).
    refusing: bool,
}

impl Damage {
    /// Notes that the node at `block` could not be used: `e` says why.
    pub(crate) fn met(&mut self, block: u64, e: &Error) {
        self.met += 1;
        if self.first.is_none() {
            self.first = Some(format!("node {block}: {e}"));
        }
    }

    /// The first damage met, if any.
    pub fn first(&self) -> Option<&str> {
        self.first.as_deref()
    }

    /// True once changes are refused because of damage.
    pub fn refusing(&self) -> bool {
        self.refusing
    }
}

impl Inner {
    /// Acts on damage met since the last call (see the module notes). Cheap when there is
    /// none: called each time an operation lets go of the lock.
    pub(crate) fn after_damage(&mut self) {
        let d = &mut self.store.damage;
        if d.met == d.acted {
            return;
        }
        let first_time = d.acted == 0;
        let new = d.met - d.acted;
        d.acted = d.met;
        let what = d.first.clone().unwrap_or_default();
        if self.policy.read_only || self.failed.is_some() {
            if first_time {
                log::error!("metadata damage: {what}; run `idxfs fsck --repair` on the image");
            }
            return;
        }
        let sb = &mut self.txn.sb;
        sb.errors = (sb.errors.get() + new).into();
        if sb.first_error_time.get() == 0 {
            let (sec, _) = self.policy.clock.now();
            sb.first_error_time = (sec.max(1) as u64).into();
        }
        self.txn.changed = true;
        if !first_time {
            return;
        }
        match self.policy.on_damage {
            OnDamage::ReadOnly => {
                self.store.damage.refusing = true;
                log::error!(
                    "metadata damage: {what}; recorded in the superblock; changes are refused \
                     from now on (errors=remount-ro), what was done before is kept: unmount \
                     and run `idxfs fsck --repair` on the image"
                );
            }
            OnDamage::Continue => log::error!(
                "metadata damage: {what}; recorded in the superblock; going on \
                 (errors=continue): run `idxfs fsck --repair` on the image when you can"
            ),
        }
    }
}
