//! Where a mount's messages go: one line each, with the time, the level, the image and the
//! mount point, through the `log` facade (the engine, the FUSE crate and fuser all log
//! there). A foreground mount writes to stderr; a background one, whose stderr is gone, to a
//! file: `IMAGE.log` beside an image file, `/var/log/idxfs-NAME.log` for a block device. A
//! panic is logged the same way before the process unwinds, so a background server that dies
//! leaves its reason behind.
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

struct Logger {
    /// "IMAGE on MOUNTPOINT", in every line.
    place: String,
    out: Mutex<Box<dyn Write + Send>>,
    level: log::LevelFilter,
}

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= self.level
    }

    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let line = format!(
            "{} idxfs[{}] {} {}: {}\n",
            timestamp(SystemTime::now()),
            std::process::id(),
            r.level(),
            self.place,
            r.args()
        );
        // A poisoned lock still holds a usable writer; a failed write has nowhere to go.
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
    }

    fn flush(&self) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let _ = out.flush();
    }
}

/// The log file of a background mount of `image`. An image that does not exist yet is the
/// file `--create` is about to make (a mount of a missing image without it is refused
/// before it logs), so its log sits beside it too, where the next mount's goes.
pub fn log_path(image: &Path) -> PathBuf {
    let is_file = match std::fs::metadata(image) {
        Ok(m) => m.is_file(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    };
    if is_file {
        let mut p = image.as_os_str().to_owned();
        p.push(".log");
        PathBuf::from(p)
    } else {
        let name = image
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "device".into());
        PathBuf::from(format!("/var/log/idxfs-{name}.log"))
    }
}

/// Sends every message of this process to `file` (appended) or, when None, stderr, each
/// line naming `image` on `mountpoint`. The level is `IDXFS_LOG` (error, warn, info, debug,
/// trace; default info). Call once, before anything logs.
pub fn init(image: &Path, mountpoint: &Path, file: Option<&Path>) -> Result<(), String> {
    let out: Box<dyn Write + Send> = match file {
        Some(p) => Box::new(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| format!("log file {}: {e}", p.display()))?,
        ),
        None => Box::new(std::io::stderr()),
    };
    let level = std::env::var("IDXFS_LOG")
        .ok()
        .and_then(|l| l.parse().ok())
        .unwrap_or(log::LevelFilter::Info);
    let abs = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let logger = Logger {
        place: format!("{} on {}", abs(image).display(), abs(mountpoint).display()),
        out: Mutex::new(out),
        level,
    };
    // Only the first call installs a logger; later ones (none expected) keep it.
    if log::set_boxed_logger(Box::new(logger)).is_ok() {
        log::set_max_level(level);
    }
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        log::error!(
            "panic: {info}; backtrace:\n{}",
            std::backtrace::Backtrace::force_capture()
        );
        default_hook(info);
    }));
    Ok(())
}

/// `2026-11-24T13:05:09.123Z`: UTC, from the civil-from-days algorithm (no time zone data
/// needed, and the same on every machine).
fn timestamp(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_utc_dates() {
        let at = |s: u64| timestamp(UNIX_EPOCH + Duration::from_millis(s));
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(at(1_795_523_109_123), "2026-11-24T12:25:09.123Z");
    }

    #[test]
    fn a_background_log_sits_beside_an_image_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let img = dir.path().join("data.img");
        std::fs::write(&img, b"").expect("write");
        assert_eq!(log_path(&img), dir.path().join("data.img.log"));
        let made = dir.path().join("made.img");
        assert_eq!(
            log_path(&made),
            dir.path().join("made.img.log"),
            "an image --create is about to make"
        );
        assert_eq!(
            log_path(Path::new("/dev/loop7")),
            PathBuf::from("/var/log/idxfs-loop7.log")
        );
    }
}
