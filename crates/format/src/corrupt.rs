//! One error shape for everything found wrong in on-disk bytes (after btrfs `tree-checker.c`).
use std::fmt;

/// A field read from disk is not what the format allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrupt {
    /// What was being checked, e.g. "node 1234 checksum".
    pub what: String,
    /// The value found.
    pub have: String,
    /// The value or range the format requires.
    pub expect: String,
}

impl Corrupt {
    pub fn new(
        what: impl Into<String>,
        have: impl fmt::Display,
        expect: impl fmt::Display,
    ) -> Self {
        Corrupt {
            what: what.into(),
            have: have.to_string(),
            expect: expect.to_string(),
        }
    }
}

impl fmt::Display for Corrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "corrupt {}: have {}, expect {}",
            self.what, self.have, self.expect
        )
    }
}

impl std::error::Error for Corrupt {}

/// Shorthand for returning `Err(Corrupt)` when a condition does not hold.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $what:expr, $have:expr, $expect:expr) => {
        if !$cond {
            return Err($crate::Corrupt::new($what, $have, $expect).into());
        }
    };
}
