//! Freed blocks that may not be handed out yet, by what each waits for (`super::alloc`):
//! the commit that frees them (pinned, then committing), or the readers outside the
//! operation lock that may still read them (held, `super::read_fence`). With the ranges
//! waiting for their discard, they are every block that is busy but neither used nor
//! claimed in its group (checked at each commit).
use super::read_fence::ReadFence;
use std::collections::VecDeque;
use std::sync::Arc;

pub(super) struct Freed {
    /// Freed by the running transaction, referenced by the last committed state: (start,
    /// length, file data).
    pub pinned: Vec<(u64, u64, bool)>,
    /// Freed by the transaction a commit is writing: reusable once that commit is durable.
    pub committing: Vec<(u64, u64, bool)>,
    /// Readers of data outside the operation lock.
    pub fence: Arc<ReadFence>,
    /// Freed data blocks a reader may still read: (fence stamp, start, length), stamps in
    /// ascending order.
    pub held: VecDeque<(u64, u64, u64)>,
}

impl Default for Freed {
    fn default() -> Self {
        Freed {
            pinned: Vec::new(),
            committing: Vec::new(),
            fence: Arc::new(ReadFence::default()),
            held: VecDeque::new(),
        }
    }
}
