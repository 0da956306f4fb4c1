//! Time comes through a trait so tests and simulations can replay exactly.
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

pub trait Clock: Send + Sync {
    /// (seconds, nanoseconds) since the Unix epoch.
    fn now(&self) -> (i64, u32);
}

pub struct SystemClock;
impl Clock for SystemClock {
    fn now(&self) -> (i64, u32) {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
            Err(e) => {
                let d = e.duration();
                (
                    -(d.as_secs() as i64) - 1,
                    1_000_000_000 - d.subsec_nanos().max(1),
                )
            }
        }
    }
}

/// A clock that advances one microsecond per reading: deterministic for tests.
pub struct StepClock(AtomicI64);
impl StepClock {
    pub fn new(start_us: i64) -> Self {
        StepClock(AtomicI64::new(start_us))
    }
}
impl Clock for StepClock {
    fn now(&self) -> (i64, u32) {
        let us = self.0.fetch_add(1, Ordering::Relaxed);
        (
            us.div_euclid(1_000_000),
            (us.rem_euclid(1_000_000) * 1000) as u32,
        )
    }
}
