//! Who is calling: the one fact about the caller the engine uses, whether it is privileged.
//!
//! Like the kernel's current credentials, it belongs to the calling thread rather than to
//! each call: a front end sets it around each request it serves (`as_caller`), and a library
//! user who sets nothing is privileged. It decides one thing: growing operations of an
//! unprivileged caller must leave the root reserve free (`fs::reserve`), as ext4 keeps blocks
//! for root, so a user who fills the device does not stop root (or a root daemon) from
//! writing.
use std::cell::Cell;

thread_local! {
    static PRIVILEGED: Cell<bool> = const { Cell::new(true) };
}

/// Runs `f` as a caller that is (or is not) privileged, then restores what was set before.
pub fn as_caller<R>(privileged: bool, f: impl FnOnce() -> R) -> R {
    let _restore = enter(privileged);
    f()
}

/// Makes the calling thread's caller privileged or not until the guard drops (a front end's
/// per-request form of `as_caller`).
#[must_use]
pub fn enter(privileged: bool) -> Guard {
    Guard(PRIVILEGED.with(|p| p.replace(privileged)))
}

/// Restores the caller that was set before `enter`.
pub struct Guard(bool);

impl Drop for Guard {
    fn drop(&mut self) {
        PRIVILEGED.with(|p| p.set(self.0));
    }
}

/// Whether the calling thread's caller is privileged.
pub fn privileged() -> bool {
    PRIVILEGED.with(|p| p.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_for_the_call_and_restored_after() {
        assert!(privileged(), "a library user is privileged");
        as_caller(false, || {
            assert!(!privileged());
            as_caller(true, || assert!(privileged()));
            assert!(!privileged());
        });
        assert!(privileged());
        let r = std::panic::catch_unwind(|| as_caller(false, || panic!("inside")));
        assert!(r.is_err());
        assert!(privileged(), "restored after a panic too");
    }
}
