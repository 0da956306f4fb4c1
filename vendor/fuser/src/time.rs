//! Time conversion utilities for FUSE operations.

use std::convert::TryFrom;
use std::time::Duration;
use std::time::SystemTime;
use std::time::UNIX_EPOCH;

/// Converts a `SystemTime` to a tuple of (seconds, nanoseconds) since the Unix epoch.
///
/// This handles times before the Unix epoch by returning negative seconds.
/// Values that overflow `i64` are saturated to `i64::MAX` or `i64::MIN`.
pub(crate) fn time_from_system_time(system_time: &SystemTime) -> (i64, u32) {
    // Convert to signed 64-bit time with epoch at 0
    match system_time.duration_since(UNIX_EPOCH) {
        Ok(duration) => match i64::try_from(duration.as_secs()) {
            Ok(secs) => (secs, duration.subsec_nanos()),
            Err(_) => (i64::MAX, 999_999_999),
        },
        Err(before_epoch_error) => {
            let d = before_epoch_error.duration();
            let secs = d.as_secs();
            let nanos = d.subsec_nanos();

            // Minus min representable value.
            if (secs, nanos) >= (i64::MAX as u64 + 1, 0) {
                // Saturate.
                (i64::MIN, 0)
            } else if nanos == 0 {
                (-(secs as i64), 0)
            } else {
                (-(secs as i64) - 1, 1_000_000_000 - nanos)
            }
        }
    }
}

/// Converts a tuple of (seconds, nanoseconds) since the Unix epoch to a `SystemTime`.
///
/// As in the kernel's `timespec`, the nanoseconds count forward from `secs` also when `secs`
/// is negative: (-2, 800_000_000) is 1.2 s before the epoch. (Upstream 0.18.0 took it as
/// 2.8 s before, so every time set before 1970 with a fraction of a second moved; patched
/// for idxfs.) `secs` covers all of `i64`, as a Linux `SystemTime` does; nanoseconds past a
/// second (which no kernel sends) that would carry past that range saturate at its end
/// rather than panic.
pub(crate) fn system_time_from_time(secs: i64, nsecs: u32) -> SystemTime {
    let frac = Duration::from_nanos(u64::from(nsecs));
    let whole = if secs >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64)
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    };
    whole
        .checked_add(frac)
        .unwrap_or(SystemTime::UNIX_EPOCH + Duration::new(i64::MAX as u64, 999_999_999))
}

#[cfg(test)]
mod test {
    use std::time::Duration;
    use std::time::UNIX_EPOCH;

    use crate::time::system_time_from_time;
    use crate::time::time_from_system_time;

    #[test]
    fn test_system_time_from_time_negative_counts_nanoseconds_forward() {
        assert_eq!(
            system_time_from_time(-2, 800_000_000),
            UNIX_EPOCH - Duration::new(1, 200_000_000)
        );
        assert_eq!(system_time_from_time(-1, 0), UNIX_EPOCH - Duration::new(1, 0));
        assert_eq!(
            time_from_system_time(&system_time_from_time(i64::MAX, u32::MAX)),
            (i64::MAX, 999_999_999)
        );
        for (secs, nanos) in [(-1_201_046_404, 407_143_571), (-1, 1), (i64::MIN, 5), (3, 9)] {
            assert_eq!(
                time_from_system_time(&system_time_from_time(secs, nanos)),
                (secs, nanos)
            );
        }
    }

    #[test]
    fn test_time_from_system_time_negative() {
        let before_epoch = UNIX_EPOCH - Duration::new(1, 200_000_000);
        let (secs, nanos) = time_from_system_time(&before_epoch);
        assert_eq!((-2, 800_000_000), (secs, nanos));
    }

    #[test]
    fn test_time_from_system_time_i64_min_boundary() {
        // timespec { tv_sec: i64::MIN, tv_nsec: 0 }
        let min_system_time = UNIX_EPOCH - Duration::new(i64::MAX as u64 + 1, 0);
        let (secs, nanos) = time_from_system_time(&min_system_time);
        assert_eq!((i64::MIN, 0), (secs, nanos));

        let min_system_time_plus_eps = UNIX_EPOCH - Duration::new(i64::MAX as u64, 800_000_000);
        let (secs, nanos) = time_from_system_time(&min_system_time_plus_eps);
        assert_eq!((i64::MIN, 200_000_000), (secs, nanos));

        let min_system_time_plus_one = UNIX_EPOCH - Duration::new(i64::MAX as u64, 0);
        let (secs, nanos) = time_from_system_time(&min_system_time_plus_one);
        assert_eq!((i64::MIN + 1, 0), (secs, nanos));
    }
}
