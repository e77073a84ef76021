//! The one source of time. Leases, cache TTLs and replica lag read `now` through a
//! [`Clock`], so tests run the same code on a manual clock instead of sleeping.

use std::fmt::Debug;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// Wall-clock time as the routing library sees it.
pub trait Clock: Debug + Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> DateTime<Utc>;

    /// The current time as nanoseconds since the Unix epoch: the cache's hit path
    /// compares integers rather than building a calendar date on every request.
    fn now_unix_nanos(&self) -> i64 {
        unix_nanos(self.now())
    }
}

/// `t` as nanoseconds since the Unix epoch (saturating far outside 1677..2262).
pub fn unix_nanos(t: DateTime<Utc>) -> i64 {
    t.timestamp_nanos_opt().unwrap_or(if t.timestamp() < 0 { i64::MIN } else { i64::MAX })
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }

    /// The coarse real-time clock where the OS has one: a cache hit's freshness check
    /// needs milliseconds, not nanoseconds, and the precise clock costs more than the
    /// whole hash lookup. Its resolution ([`COARSE_RESOLUTION`] at most) is far inside
    /// the skew margin the cache already allows around a lock's start.
    fn now_unix_nanos(&self) -> i64 {
        coarse_unix_nanos().unwrap_or_else(|| {
            let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            i64::try_from(since.as_nanos()).unwrap_or(i64::MAX)
        })
    }
}

/// The worst resolution accepted from the coarse clock; a coarser one is not used.
pub const COARSE_RESOLUTION: std::time::Duration = std::time::Duration::from_millis(10);

#[cfg(target_os = "linux")]
fn coarse_unix_nanos() -> Option<i64> {
    use std::sync::OnceLock;
    static USABLE: OnceLock<bool> = OnceLock::new();
    let usable = *USABLE.get_or_init(|| {
        let mut res = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_getres writes one timespec through a valid pointer.
        let ok = unsafe { libc::clock_getres(libc::CLOCK_REALTIME_COARSE, &mut res) } == 0;
        ok && res.tv_sec == 0 && i128::from(res.tv_nsec) <= COARSE_RESOLUTION.as_nanos() as i128
    });
    if !usable {
        return None;
    }
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } != 0 {
        return None;
    }
    // time_t and c_long are 32 bits on some Linux targets; the conversion is a no-op here only.
    #[allow(clippy::useless_conversion)]
    let nanos = i64::from(ts.tv_sec).saturating_mul(1_000_000_000).saturating_add(i64::from(ts.tv_nsec));
    Some(nanos)
}

#[cfg(not(target_os = "linux"))]
fn coarse_unix_nanos() -> Option<i64> {
    None
}

/// A clock that moves only when told to: for tests and simulations.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<DateTime<Utc>>,
}

impl ManualClock {
    /// A manual clock standing at `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        Self { now: Mutex::new(start) }
    }

    /// A manual clock at a fixed, round instant (2026-01-01T00:00:00Z), so test output is stable.
    pub fn at_epoch() -> Self {
        Self::new(DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").expect("valid literal").to_utc())
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().expect("clock mutex poisoned");
        *now += to_chrono(by);
    }

    /// Sets the clock to `to` (may jump backwards, to test clock steps).
    pub fn set(&self, to: DateTime<Utc>) {
        *self.now.lock().expect("clock mutex poisoned") = to;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().expect("clock mutex poisoned")
    }
}

/// Converts a std duration to chrono's, saturating at chrono's maximum instead of panicking.
pub fn to_chrono(d: Duration) -> chrono::TimeDelta {
    chrono::TimeDelta::from_std(d).unwrap_or(chrono::TimeDelta::MAX)
}

/// The non-negative span from `from` to `to`; zero when `to` is not after `from`.
pub fn span(from: DateTime<Utc>, to: DateTime<Utc>) -> Duration {
    (to - from).to_std().unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::at_epoch();
        let t0 = clock.now();
        assert_eq!(clock.now(), t0);
        clock.advance(Duration::from_secs(90));
        assert_eq!(span(t0, clock.now()), Duration::from_secs(90));
        clock.set(t0);
        assert_eq!(clock.now(), t0);
    }

    #[test]
    fn unix_nanos_agree_between_the_fast_and_the_calendar_path() {
        let fast = SystemClock.now_unix_nanos();
        let calendar = unix_nanos(SystemClock.now());
        let allowed = i64::try_from(COARSE_RESOLUTION.as_nanos()).unwrap() + 50_000_000;
        assert!((calendar - fast).abs() < allowed, "{fast} vs {calendar}");
        let manual = ManualClock::at_epoch();
        assert_eq!(manual.now_unix_nanos(), 1_767_225_600 * 1_000_000_000);
    }

    #[test]
    fn span_never_negative() {
        let clock = ManualClock::at_epoch();
        let t0 = clock.now();
        clock.advance(Duration::from_secs(5));
        assert_eq!(span(clock.now(), t0), Duration::ZERO);
    }
}
