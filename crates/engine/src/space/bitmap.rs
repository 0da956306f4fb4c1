//! A fixed-length bitmap with word-at-a-time search.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bitmap {
    words: Vec<u64>,
    len: u64,
}

impl Bitmap {
    pub fn new(len: u64) -> Bitmap {
        Bitmap {
            words: vec![0; len.div_ceil(64) as usize],
            len,
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub fn get(&self, i: u64) -> bool {
        debug_assert!(i < self.len);
        self.words
            .get((i / 64) as usize)
            .is_some_and(|w| w >> (i % 64) & 1 == 1)
    }

    #[inline]
    pub fn set(&mut self, i: u64, on: bool) {
        assert!(i < self.len, "bit {i} past bitmap length {}", self.len);
        if let Some(w) = self.words.get_mut((i / 64) as usize) {
            if on {
                *w |= 1 << (i % 64);
            } else {
                *w &= !(1 << (i % 64));
            }
        }
    }

    pub fn set_range(&mut self, start: u64, n: u64, on: bool) {
        for i in start..start + n {
            self.set(i, on);
        }
    }

    pub fn count_ones(&self) -> u64 {
        self.words.iter().map(|w| w.count_ones() as u64).sum()
    }

    /// First clear bit at or after `from`.
    pub fn next_zero(&self, from: u64) -> Option<u64> {
        let mut i = from;
        while i < self.len {
            let wi = (i / 64) as usize;
            let w = self.words.get(wi).copied().unwrap_or(u64::MAX) | ((1u64 << (i % 64)) - 1);
            if w != u64::MAX {
                let bit = wi as u64 * 64 + (!w).trailing_zeros() as u64;
                return (bit < self.len).then_some(bit);
            }
            i = (wi as u64 + 1) * 64;
        }
        None
    }

    /// Length of the run of clear bits starting at `start`, up to `max`.
    pub fn zero_run(&self, start: u64, max: u64) -> u64 {
        let mut n = 0;
        while n < max && start + n < self.len && !self.get(start + n) {
            n += 1;
        }
        n
    }

    /// Little-endian bytes, one bit per block (the on-disk free-space bitmap).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out: Vec<u8> = self.words.iter().flat_map(|w| w.to_le_bytes()).collect();
        out.truncate(self.len.div_ceil(8) as usize);
        out
    }

    pub fn from_bytes(bytes: &[u8], len: u64) -> Option<Bitmap> {
        if bytes.len() as u64 != len.div_ceil(8) {
            return None;
        }
        let mut b = Bitmap::new(len);
        for (i, byte) in bytes.iter().enumerate() {
            if let Some(w) = b.words.get_mut(i / 8) {
                *w |= (*byte as u64) << ((i % 8) * 8);
            }
        }
        // Bits past `len` must be clear.
        let tail = len % 64;
        let last = b.words.last().copied().unwrap_or(0);
        (tail == 0 || last >> tail == 0).then_some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn search_and_bytes() {
        let mut b = Bitmap::new(200);
        b.set_range(0, 70, true);
        assert_eq!(b.next_zero(0), Some(70));
        assert_eq!(b.zero_run(70, 500), 130);
        b.set(199, true);
        assert_eq!(b.zero_run(70, 500), 129);
        let bytes = b.to_bytes();
        assert_eq!(bytes.len(), 25);
        assert_eq!(Bitmap::from_bytes(&bytes, 200), Some(b.clone()));
        assert_eq!(b.count_ones(), 71);
        let mut full = Bitmap::new(128);
        full.set_range(0, 128, true);
        assert_eq!(full.next_zero(0), None);
    }
}
