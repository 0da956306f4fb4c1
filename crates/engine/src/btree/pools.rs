//! Node slots taken ahead of need (`nodes_per_slot` contiguous blocks each).
//!
//! Free blocks alone do not promise a node: free space cut into single blocks holds none. So a
//! reservation takes the slots its operation and the next commit may allocate (`fill`), and
//! node allocations draw from here first (`take`). The slots are marked used in the
//! allocator and referenced by nothing: the commit gives them back (`release`) before the
//! space tree records the bitmaps.
//!
//! A second pool holds the slots growth leaves aside for deletes (the node side of the global
//! reserve): a growing operation sets them aside before it takes its own, and only a
//! shrinking one may take from them.
use crate::error::{Error, Result};
use crate::space::{Allocator, Kind};

#[derive(Debug, Default)]
pub struct NodePools {
    /// Slots for the running operations and the next commit.
    pub nodes: Vec<u64>,
    /// Slots kept for deletes.
    pub reserve: Vec<u64>,
}

impl NodePools {
    /// A slot for a new node: a reserved one, else one from the allocator, else (never
    /// when the reservations are right) one of the slots kept for deletes: better than
    /// failing an operation half done.
    pub fn take(&mut self, alloc: &mut Allocator, bpn: u64) -> Result<u64> {
        if let Some(b) = self.nodes.pop() {
            return Ok(b);
        }
        if let Some((start, _)) = alloc.alloc(bpn, bpn, Kind::Meta) {
            return Ok(start);
        }
        self.reserve.pop().ok_or(Error::NoSpace)
    }

    /// Takes slots until `target` wait in the pool. A growing operation (`use_reserve`
    /// false) first sets `reserve` slots aside for deletes and never takes them; a shrinking
    /// one takes them when the allocator has no more. False when the slots cannot be had
    /// (those taken so far stay, for the next try).
    pub fn fill(
        &mut self,
        alloc: &mut Allocator,
        bpn: u64,
        target: usize,
        reserve: usize,
        use_reserve: bool,
    ) -> bool {
        if !use_reserve {
            while self.reserve.len() < reserve {
                match alloc.alloc(bpn, bpn, Kind::Meta) {
                    Some((b, _)) => self.reserve.push(b),
                    None => return false,
                }
            }
        }
        while self.nodes.len() < target {
            match alloc.alloc(bpn, bpn, Kind::Meta) {
                Some((b, _)) => self.nodes.push(b),
                None if use_reserve => match self.reserve.pop() {
                    Some(b) => self.nodes.push(b),
                    None => return false,
                },
                None => return false,
            }
        }
        true
    }

    /// Blocks both pools hold.
    pub fn blocks(&self, bpn: u64) -> u64 {
        (self.nodes.len() + self.reserve.len()) as u64 * bpn
    }

    /// Gives every slot of both pools back to the allocator (commit, before the space tree
    /// records the bitmaps; the next growing operation sets the reserve aside again).
    pub fn release(&mut self, alloc: &mut Allocator, bpn: u64) -> Result<()> {
        let mut all = std::mem::take(&mut self.nodes);
        all.append(&mut self.reserve);
        for b in all {
            // Taken by `fill` and referenced by nothing: reusable at once.
            alloc.free(b, bpn, true)?;
        }
        Ok(())
    }
}
