//! The one source of time. Leases, cache TTLs and replica lag read `now` through a
//! [`Clock`], so tests run the same code on a manual clock instead of sleeping.
//! [`TokioClock`] follows tokio's pausable clock, so simulations run in virtual time;
//! [`SkewedClock`] gives one instance a clock that is off by a set amount.

use std::fmt::Debug;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// Wall-clock time as the routing library sees it.
pub trait Clock: Debug + Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> DateTime<Utc>;

    /// The current time as nanoseconds since the Unix epoch.
    fn now_unix_nanos(&self) -> i64 {
        unix_nanos(self.now())
    }

    /// An instant no earlier than now, as nanoseconds since the Unix epoch: what the
    /// cache's hit path compares freshness with. It may run a little ahead of
    /// [`Clock::now_unix_nanos`] (entries then expire a little early, never late) when
    /// that makes it cheaper.
    fn upper_unix_nanos(&self) -> i64 {
        self.now_unix_nanos()
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

    fn now_unix_nanos(&self) -> i64 {
        let precise = precise_unix_nanos();
        coarse::check_against(precise);
        precise
    }

    /// The coarse real-time clock plus [`COARSE_ALLOWANCE`], where the OS has one and
    /// it keeps within half the allowance of the precise clock: a cache hit's freshness
    /// check needs milliseconds, not nanoseconds, and the precise clock costs more than
    /// the whole hash lookup. The coarse clock lags the precise one by up to a timer
    /// tick and more (6.4 ms seen here against a stated 4 ms resolution), so it is
    /// only a lower bound; the allowance turns it into an upper bound, and every
    /// precise read checks that the lag stays well inside it, falling back to the
    /// precise clock for good the first time it does not.
    fn upper_unix_nanos(&self) -> i64 {
        match coarse::unix_nanos() {
            Some(c) => c.saturating_add(COARSE_ALLOWANCE_NANOS),
            None => precise_unix_nanos(),
        }
    }
}

fn precise_unix_nanos() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_nanos()).unwrap_or(i64::MAX)
}

/// How far the coarse clock may lag before it is no longer used (it is checked to lag
/// by at most half of this).
pub const COARSE_ALLOWANCE: std::time::Duration = std::time::Duration::from_millis(50);
const COARSE_ALLOWANCE_NANOS: i64 = 50_000_000;

/// The worst stated resolution accepted from the coarse clock; a coarser one is not used.
pub const COARSE_RESOLUTION: std::time::Duration = std::time::Duration::from_millis(10);

#[cfg(target_os = "linux")]
mod coarse {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::OnceLock;

    use super::{COARSE_ALLOWANCE_NANOS, COARSE_RESOLUTION};

    /// Set the first time the coarse clock was seen lagging by half the allowance.
    static UNHEALTHY: AtomicBool = AtomicBool::new(false);

    fn usable() -> bool {
        static USABLE: OnceLock<bool> = OnceLock::new();
        *USABLE.get_or_init(|| {
            let mut res = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: clock_getres writes one timespec through a valid pointer.
            let ok = unsafe { libc::clock_getres(libc::CLOCK_REALTIME_COARSE, &mut res) } == 0;
            ok && res.tv_sec == 0 && i128::from(res.tv_nsec) <= COARSE_RESOLUTION.as_nanos() as i128
        }) && !UNHEALTHY.load(Ordering::Relaxed)
    }

    /// The coarse clock, when usable and healthy.
    pub(super) fn unix_nanos() -> Option<i64> {
        if !usable() {
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

    /// Retires the coarse clock if it lags `precise` by half the allowance or more.
    pub(super) fn check_against(precise: i64) {
        if let Some(c) = unix_nanos() {
            if precise.saturating_sub(c) >= COARSE_ALLOWANCE_NANOS / 2 {
                UNHEALTHY.store(true, Ordering::Relaxed);
                tracing::warn!(
                    lag_ns = precise - c,
                    "coarse clock lags too far; using the precise clock for cache checks"
                );
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod coarse {
    pub(super) fn unix_nanos() -> Option<i64> {
        None
    }

    pub(super) fn check_against(_precise: i64) {}
}

/// A clock that moves only when told to: for tests and simulations.
///
/// Read without a lock: the time is kept as nanoseconds since the Unix epoch in an
/// atomic, so threads driving one simulation together (the paper-scale replay) read it
/// without taking turns. A time outside what that holds (before 1677 or after 2262,
/// such as a clock advanced to the end of time) is kept under the writers' lock.
#[derive(Debug)]
pub struct ManualClock {
    /// The time in nanoseconds, or [`ManualClock::FAR`] when it is in `far`.
    nanos: AtomicI64,
    /// Serialises writers; holds the time when `nanos` cannot.
    far: Mutex<DateTime<Utc>>,
}

impl ManualClock {
    /// Says that the time is kept in `far` (no representable time is this nanosecond).
    const FAR: i64 = i64::MIN;

    /// A manual clock standing at `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        let clock = Self { nanos: AtomicI64::new(Self::FAR), far: Mutex::new(start) };
        clock.set(start);
        clock
    }

    /// A manual clock at a fixed, round instant (2026-01-01T00:00:00Z), so test output is stable.
    pub fn at_epoch() -> Self {
        Self::new(DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").expect("valid literal").to_utc())
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut far = self.lock();
        let now = self.read(&far);
        self.store(&mut far, now.checked_add_signed(to_chrono(by)).unwrap_or(DateTime::<Utc>::MAX_UTC));
    }

    /// Sets the clock to `to` (may jump backwards, to test clock steps).
    pub fn set(&self, to: DateTime<Utc>) {
        let mut far = self.lock();
        self.store(&mut far, to);
    }

    fn read(&self, far: &DateTime<Utc>) -> DateTime<Utc> {
        match self.nanos.load(Ordering::Acquire) {
            Self::FAR => *far,
            nanos => DateTime::from_timestamp_nanos(nanos),
        }
    }

    fn store(&self, far: &mut DateTime<Utc>, to: DateTime<Utc>) {
        match to.timestamp_nanos_opt().filter(|n| *n != Self::FAR) {
            Some(nanos) => self.nanos.store(nanos, Ordering::Release),
            None => {
                *far = to;
                self.nanos.store(Self::FAR, Ordering::Release);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DateTime<Utc>> {
        // A plain value: a panic elsewhere cannot leave it half-written.
        self.far.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        match self.nanos.load(Ordering::Acquire) {
            Self::FAR => *self.lock(),
            nanos => DateTime::from_timestamp_nanos(nanos),
        }
    }
}

/// Wall-clock time driven by tokio's clock: a fixed start plus the
/// [`tokio::time::Instant`] elapsed since the clock was made.
///
/// Under `tokio::time::pause()` (tests with `start_paused = true`) tokio's clock moves
/// only when told to or, once every task waits, straight to the next timer, so the
/// store's commit times, leases and timeouts of a seeded campaign all run in virtual
/// time. Read it on the runtime it was made on: elsewhere tokio's clock is the real one.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    start: DateTime<Utc>,
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock that reads `start` now and moves with tokio's clock from here on.
    pub fn new(start: DateTime<Utc>) -> Self {
        Self { start, origin: tokio::time::Instant::now() }
    }

    /// A clock starting at the same round instant as [`ManualClock::at_epoch`].
    pub fn at_epoch() -> Self {
        Self::new(ManualClock::at_epoch().now())
    }
}

impl Clock for TokioClock {
    fn now(&self) -> DateTime<Utc> {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.origin);
        self.start.checked_add_signed(to_chrono(elapsed)).unwrap_or(DateTime::<Utc>::MAX_UTC)
    }
}

/// Another clock shifted by a signed offset: one service instance whose clock is off
/// (the coordination survey's ±2 s), while the store and the oracle keep true time.
/// Saturates at chrono's range rather than panicking.
#[derive(Debug, Clone)]
pub struct SkewedClock {
    inner: Arc<dyn Clock>,
    offset: chrono::TimeDelta,
}

impl SkewedClock {
    /// `inner` shifted by `offset` (positive: ahead of it, negative: behind).
    pub fn new(inner: Arc<dyn Clock>, offset: chrono::TimeDelta) -> Self {
        Self { inner, offset }
    }

    /// How far this clock is ahead of its inner clock (negative: behind).
    pub fn offset(&self) -> chrono::TimeDelta {
        self.offset
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> DateTime<Utc> {
        match self.inner.now().checked_add_signed(self.offset) {
            Some(t) => t,
            None if self.offset < chrono::TimeDelta::zero() => DateTime::<Utc>::MIN_UTC,
            None => DateTime::<Utc>::MAX_UTC,
        }
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
    fn a_manual_clock_keeps_times_past_the_nanosecond_range() {
        let clock = ManualClock::at_epoch();
        let start = clock.now();
        clock.advance(Duration::from_secs(u64::MAX / 4));
        assert_eq!(clock.now(), DateTime::<Utc>::MAX_UTC, "advancing saturates at the end of time");
        clock.set(DateTime::<Utc>::MIN_UTC);
        assert_eq!(clock.now(), DateTime::<Utc>::MIN_UTC);
        clock.set(start);
        clock.advance(Duration::from_nanos(1));
        assert_eq!(clock.now(), start + chrono::TimeDelta::nanoseconds(1));
        // The one nanosecond count kept as the marker is a time like any other.
        let marker = DateTime::from_timestamp_nanos(i64::MIN);
        clock.set(marker);
        assert_eq!(clock.now(), marker);
    }

    #[test]
    fn the_cache_clock_is_never_behind_the_precise_one() {
        for _ in 0..10_000 {
            let before = SystemClock.now_unix_nanos();
            let upper = SystemClock.upper_unix_nanos();
            assert!(upper >= before, "upper bound {upper} behind the precise clock {before}");
        }
        let calendar = unix_nanos(SystemClock.now());
        let upper = SystemClock.upper_unix_nanos();
        assert!(upper - calendar < 2 * COARSE_ALLOWANCE_NANOS, "{upper} vs {calendar}: not far ahead either");
        let manual = ManualClock::at_epoch();
        assert_eq!(manual.now_unix_nanos(), 1_767_225_600 * 1_000_000_000);
        assert_eq!(manual.upper_unix_nanos(), manual.now_unix_nanos());
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_moves_only_with_tokio_time() {
        let clock = TokioClock::at_epoch();
        let t0 = clock.now();
        assert_eq!(t0, ManualClock::at_epoch().now());
        assert_eq!(clock.now(), t0, "paused time stands still until a task waits");
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(span(t0, clock.now()), Duration::from_secs(3600), "auto-advanced to the timer, not beyond");
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert_eq!(clock.now_unix_nanos() - unix_nanos(t0), 3_601_500_000_000);
        assert_eq!(clock.upper_unix_nanos(), clock.now_unix_nanos());
    }

    #[test]
    fn skewed_clock_keeps_its_offset_and_saturates() {
        let base = Arc::new(ManualClock::at_epoch());
        let ahead = SkewedClock::new(base.clone(), chrono::TimeDelta::seconds(2));
        let behind = SkewedClock::new(base.clone(), chrono::TimeDelta::seconds(-2));
        for _ in 0..2 {
            assert_eq!(ahead.now() - base.now(), chrono::TimeDelta::seconds(2));
            assert_eq!(behind.now() - base.now(), chrono::TimeDelta::seconds(-2));
            base.advance(Duration::from_secs(5));
        }
        assert_eq!(ahead.offset(), chrono::TimeDelta::seconds(2));
        assert_eq!(behind.upper_unix_nanos(), behind.now_unix_nanos());
        base.set(DateTime::<Utc>::MAX_UTC);
        assert_eq!(ahead.now(), DateTime::<Utc>::MAX_UTC);
        base.set(DateTime::<Utc>::MIN_UTC);
        assert_eq!(behind.now(), DateTime::<Utc>::MIN_UTC);
    }

    #[test]
    fn span_never_negative() {
        let clock = ManualClock::at_epoch();
        let t0 = clock.now();
        clock.advance(Duration::from_secs(5));
        assert_eq!(span(clock.now(), t0), Duration::ZERO);
    }
}
