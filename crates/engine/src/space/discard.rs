//! Telling the device which blocks hold nothing any more (`BlockDevice::discard`): an image
//! file gives their space back, so it occupies about what the file system uses, as ext4's
//! `discard` does for a loop device's file.
//!
//! The allocator decides what may go (`Allocator::take_discards`: blocks no durable state,
//! fsync log or reader references, kept busy meanwhile) and this sends it, with adjacent
//! ranges merged into one request. A discard that fails changes nothing a reader can see:
//! it is counted (`discard_errors`) and the blocks are freed all the same.
use crate::counters::Counters;
use idxfs_blockdev::BlockDevice;
use idxfs_format::BLOCK_SIZE;

/// Discards `ranges` (start, length in blocks), merged where adjacent.
pub fn send(dev: &dyn BlockDevice, ranges: &[(u64, u64)], counters: &Counters) {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(sorted.len());
    for (start, n) in sorted {
        match merged.last_mut() {
            Some(last) if last.0 + last.1 == start => last.1 += n,
            _ => merged.push((start, n)),
        }
    }
    for (start, n) in merged {
        match dev.discard(start * BLOCK_SIZE, n * BLOCK_SIZE) {
            Ok(()) => Counters::add(&counters.blocks_discarded, n),
            Err(_) => Counters::inc(&counters.discard_errors),
        }
    }
}
