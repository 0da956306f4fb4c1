//! A line on a terminal's standard error that a long `idxfs cp` or `idxfs rm` rewrites as the
//! server answers each slice (`idxfs_fuse::cptree`, `rmtree`): nothing when standard error
//! is not a terminal, and cleared at the end.
use std::time::{Duration, Instant};

pub(crate) struct Line {
    tty: bool,
    start: Instant,
    last: Option<Instant>,
}

impl Line {
    const EVERY: Duration = Duration::from_millis(200);

    pub(crate) fn new() -> Line {
        Line {
            // SAFETY: isatty only inspects the descriptor.
            tty: unsafe { libc::isatty(2) } == 1,
            start: Instant::now(),
            last: None,
        }
    }

    /// Shows `n` entries done so far, `what` naming them ("copied", "removed").
    pub(crate) fn show(&mut self, what: &str, n: u64) {
        let due = self.last.is_none_or(|t| t.elapsed() >= Self::EVERY);
        if !self.tty || !due {
            return;
        }
        self.last = Some(Instant::now());
        let rate = n as f64 / self.start.elapsed().as_secs_f64().max(1e-9);
        eprint!("\r{what} {n} entries, {rate:.0}/s ");
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if self.tty && self.last.is_some() {
            eprint!("\r\x1b[K");
        }
    }
}
