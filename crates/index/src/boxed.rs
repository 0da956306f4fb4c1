//! Values larger than a word, published for readers that take no lock: an [`XArray`] of
//! pointers to immutable boxes. A writer replaces a value whole (a new box, one slot store) and
//! the old box is freed only once every reader that could have loaded it has unpinned its epoch
//! (crossbeam-epoch plays RCU's part, as in the XArray itself). A reader copies the value out
//! while pinned, so it never sees a value torn or freed.
use crate::xarray::{AllocError, XArray};
use crossbeam_epoch as epoch;
use std::marker::PhantomData;

pub struct BoxedMap<V: Send + Sync + 'static> {
    /// Key -> `Box<V>` as a raw pointer (never u64::MAX: a heap address).
    xa: XArray<u64>,
    _v: PhantomData<V>,
}

impl<V: Send + Sync + 'static> Default for BoxedMap<V> {
    fn default() -> Self {
        BoxedMap {
            xa: XArray::new(),
            _v: PhantomData,
        }
    }
}

impl<V: Clone + Send + Sync + 'static> BoxedMap<V> {
    /// A copy of the value at `key`; takes no lock.
    #[inline]
    pub fn get(&self, key: u64) -> Option<V> {
        self.read(key, V::clone)
    }
}

impl<V: Send + Sync + 'static> BoxedMap<V> {
    /// `f` of the value at `key`, which it sees whole and alive; takes no lock. `f` may use
    /// the value's own atomics (a reference bit, say), never anything that outlives the call.
    #[inline]
    pub fn read<R>(&self, key: u64, f: impl FnOnce(&V) -> R) -> Option<R> {
        let guard = epoch::pin();
        let p = self.xa.get_in(key, &guard)?;
        // SAFETY: a pointer from `Box::into_raw` in `set`, published by the XArray's Release
        // store; it is retired (freed after the epoch advances past every pin that could see
        // it) only after it left the array, and we are pinned until `f` returns.
        Some(f(unsafe { &*(p as usize as *const V) }))
    }

    /// The first key holding a value at or after `from`; takes no lock.
    pub fn next_key(&self, from: u64) -> Option<u64> {
        self.xa.next_present(from).map(|(k, _)| k)
    }

    /// Publishes `v` at `key`, replacing what was there. On allocation failure nothing
    /// changed (the old value, if any, stays).
    pub fn set(&self, key: u64, v: V) -> Result<(), AllocError> {
        let p = Box::into_raw(Box::new(v));
        match self.xa.try_insert(key, p as usize as u64) {
            Ok(old) => {
                if let Some(o) = old {
                    retire::<V>(o);
                }
                Ok(())
            }
            Err(e) => {
                // SAFETY: never published; ours alone.
                drop(unsafe { Box::from_raw(p) });
                Err(e)
            }
        }
    }

    /// Whether `key` holds a value; takes no lock.
    pub fn contains(&self, key: u64) -> bool {
        self.xa.contains(key)
    }

    /// Unpublishes `key`.
    pub fn remove(&self, key: u64) {
        if let Some(o) = self.xa.remove(key) {
            retire::<V>(o);
        }
    }

    pub fn len(&self) -> usize {
        self.xa.len()
    }

    pub fn is_empty(&self) -> bool {
        self.xa.is_empty()
    }
}

/// Frees a box that left the array once no pinned reader can hold it.
fn retire<V: Send + 'static>(raw: u64) {
    let guard = epoch::pin();
    let p = raw as usize;
    // SAFETY: `p` came from `Box::into_raw` and is no longer reachable from the array; the
    // closure runs after every thread pinned now has unpinned, and exactly once.
    unsafe { guard.defer_unchecked(move || drop(Box::from_raw(p as *mut V))) };
}

impl<V: Send + Sync + 'static> Drop for BoxedMap<V> {
    fn drop(&mut self) {
        // Exclusively borrowed: no reader exists.
        for (_, p) in self.xa.iter() {
            // SAFETY: every pointer in the array came from `Box::into_raw` and is freed once.
            drop(unsafe { Box::from_raw(p as usize as *mut V) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn readers_see_whole_values_while_a_writer_replaces_them() {
        let m = Arc::new(BoxedMap::<[u64; 8]>::default());
        let n = if cfg!(miri) { 50 } else { 20_000 };
        for k in 0..16 {
            m.set(k, [0; 8]).expect("set");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (m, stop) = (m.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        for k in 0..16 {
                            if let Some(v) = m.get(k) {
                                assert!(v.iter().all(|x| *x == v[0]), "torn value {v:?}");
                            }
                        }
                    }
                })
            })
            .collect();
        for i in 1..=n {
            let k = i % 16;
            if i % 7 == 0 {
                m.remove(k);
            } else {
                m.set(k, [i; 8]).expect("set");
            }
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            r.join().expect("reader");
        }
        assert!(m.get(3).is_none_or(|v| v[0] % 16 == 3));
    }
}
