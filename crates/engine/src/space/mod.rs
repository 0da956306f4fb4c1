//! Space: block groups with a free-space bitmap each.
pub mod alloc;
pub mod bitmap;
pub mod discard;
mod freed;
pub mod read_fence;
pub use alloc::{Allocator, Kind};
