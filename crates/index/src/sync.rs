//! The atomics and locks the XArray uses: std's, or loom's under `--cfg loom` (with
//! `--cfg crossbeam_loom`, which turns crossbeam-epoch's onto loom's too), so that
//! `tests/xarray_loom.rs` can try every interleaving of its readers, its writer and the
//! epoch's reclamation.
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicI64, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicI64, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
