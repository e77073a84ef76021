//! Decision windows: when the probe may hold an operation to a lock.
//!
//! A service decides an operation somewhere between the instant the probe sent it and
//! the instant its answer arrived, and a lock call took effect somewhere inside its own
//! such window. So the probe holds an operation to a lock only if the lock was certainly
//! in force over the operation's whole window (or certainly over, for a check that a
//! lapse is honoured); anything else is *inconclusive*: counted and shown, never a pass
//! or a failure (`docs/probe.md`, "Decision windows").
//!
//! The probe knows each instant on two clocks. The monotonic clock measures durations
//! and never steps. The wall clock is the kind leases are written in: a service counts
//! a lease on its wall clock, and where it shares the probe's machine (the release
//! gate, a test run) a step of that clock shortens or stretches the lease as the world
//! sees it. A lease's end is therefore certain only when both clocks agree on it; when
//! the wall clock stepped inside the window the two disagree, and the operation is
//! inconclusive with the step named. (A service on another machine whose own clock
//! steps is beyond the scheme's skew assumption; the probe reports what that broke.)
//!
//! The start of a lock needs no clock: a lock call took effect before its answer, so an
//! operation sent after that answer met the lock.

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};

use crate::clock::Clock;

/// One instant on both of the probe's clocks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Stamp {
    /// The monotonic clock.
    pub(crate) mono: Instant,
    /// The wall clock.
    pub(crate) wall: DateTime<Utc>,
}

impl Stamp {
    /// Now, on both clocks (`wall` is the probe's wall clock).
    pub(crate) fn now(wall: &dyn Clock) -> Self {
        Self { mono: Instant::now(), wall: wall.now() }
    }

    /// How far the wall clock moved against the monotonic clock from `earlier` to
    /// `self`: zero when the wall clock kept pace, positive when it stepped forward.
    pub(crate) fn wall_step_since(&self, earlier: &Stamp) -> TimeDelta {
        let wall = self.wall - earlier.wall;
        let mono = TimeDelta::from_std(self.mono.saturating_duration_since(earlier.mono)).unwrap_or(TimeDelta::MAX);
        wall - mono
    }
}

/// The window in which a service decided something: from the probe's send to the answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Window {
    /// When the request was sent.
    pub(crate) sent: Stamp,
    /// When its answer arrived.
    pub(crate) answered: Stamp,
}

/// A lease as the probe can know it: in force for every operation sent after the
/// answer of the lock call that granted it, and lasting `lease` from the decision of
/// the call it counts from (that grant, or a renewal that extended it without a gap),
/// on the service's clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Lease {
    /// The answer of the call that granted it: an operation sent later met the lock.
    pub(crate) since: Stamp,
    /// The call the lease counts from: decided inside this window.
    pub(crate) counted_from: Window,
    /// Its length from that decision.
    pub(crate) lease: Duration,
}

/// Whether a lease held over an operation's window.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Held {
    /// Certainly, over the whole window: sent after the grant was answered, answered
    /// before the lease's earliest end on both clocks.
    Certainly,
    /// Certainly over: sent after the lease's latest end on both clocks (plus however
    /// long past its end the service may still enforce it, where that was asked).
    Over,
    /// Neither: why, for the report.
    Uncertain(String),
}

impl Lease {
    /// A lease of `lease` granted by the lock call made in `by`.
    pub(crate) fn granted(by: Window, lease: Duration) -> Self {
        Self { since: by.answered, counted_from: by, lease }
    }

    /// This lease renewed by the call made in `by` to last `lease` from its decision:
    /// a renewal the service says took leaves no gap.
    pub(crate) fn renewed(self, by: Window, lease: Duration) -> Self {
        Self { counted_from: by, lease, ..self }
    }

    /// The earliest instant the lease can end, on each clock.
    fn earliest_end(&self) -> (Instant, DateTime<Utc>) {
        (self.counted_from.sent.mono + self.lease, plus(self.counted_from.sent.wall, self.lease))
    }

    /// The latest instant the lease can end, on each clock.
    fn latest_end(&self) -> (Instant, DateTime<Utc>) {
        (self.counted_from.answered.mono + self.lease, plus(self.counted_from.answered.wall, self.lease))
    }

    /// Whether the lease was in force over `op`'s whole window, certainly over before
    /// it was sent, or neither.
    pub(crate) fn held_over(&self, op: &Window) -> Held {
        if op.sent.mono < self.since.mono {
            return Held::Uncertain(format!(
                "sent {:.3}s before the lock call that grants the lease was answered",
                self.since.mono.saturating_duration_since(op.sent.mono).as_secs_f64()
            ));
        }
        let (end_mono, end_wall) = self.earliest_end();
        if op.answered.mono < end_mono && op.answered.wall < end_wall {
            return Held::Certainly;
        }
        match self.over_when_sent(op, Duration::ZERO) {
            Held::Over => Held::Over,
            _ => Held::Uncertain(self.why_uncertain(op, Duration::ZERO)),
        }
    }

    /// Whether the lease was certainly over when `op` was sent: after its latest end
    /// on both clocks, plus `enforced_beyond` (how long past its end the service said
    /// it may still enforce it).
    pub(crate) fn over_when_sent(&self, op: &Window, enforced_beyond: Duration) -> Held {
        let (end_mono, end_wall) = self.latest_end();
        if op.sent.mono >= end_mono + enforced_beyond && op.sent.wall >= plus(end_wall, enforced_beyond) {
            Held::Over
        } else {
            Held::Uncertain(self.why_uncertain(op, enforced_beyond))
        }
    }

    /// Why `op` is neither certainly under the lease nor certainly after it (and
    /// `enforced_beyond`): the wall clock stepped, or its window meets the span in
    /// which the lease ends.
    fn why_uncertain(&self, op: &Window, enforced_beyond: Duration) -> String {
        let step = op.answered.wall_step_since(&self.counted_from.sent);
        if step.abs() > TimeDelta::from_std(WALL_STEP_TOLERANCE).unwrap_or(TimeDelta::MAX) {
            return format!(
                "the wall clock moved {:+.3}s against the monotonic clock since the lease was granted: the two disagree on when it ends",
                step.num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6
            );
        }
        let (earliest, _) = self.earliest_end();
        let (latest, _) = self.latest_end();
        let beyond = if enforced_beyond.is_zero() {
            String::new()
        } else {
            format!(" (+{:.3}s the service may still enforce it)", enforced_beyond.as_secs_f64())
        };
        format!(
            "sent {:+.3}s and answered {:+.3}s from the lease's earliest end; it ends within {:.3}s of that{beyond}",
            signed_secs(op.sent.mono, earliest),
            signed_secs(op.answered.mono, earliest),
            latest.saturating_duration_since(earliest).as_secs_f64()
        )
    }
}

impl Window {
    /// Whether this was sent at least `d` after `since`, on both clocks.
    pub(crate) fn sent_at_least(&self, d: Duration, since: &Stamp) -> bool {
        self.sent.mono >= since.mono + d && self.sent.wall >= plus(since.wall, d)
    }
}

/// The largest move of the wall clock against the monotonic clock that is not named as
/// a step (the two are read one after the other, and clocks are slewed in small steps).
pub(crate) const WALL_STEP_TOLERANCE: Duration = Duration::from_millis(20);

/// `t + d`, saturating.
fn plus(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    TimeDelta::from_std(d).ok().and_then(|d| t.checked_add_signed(d)).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// `at - reference` in seconds, negative when `at` is earlier.
pub(crate) fn signed_secs(at: Instant, reference: Instant) -> f64 {
    match at.checked_duration_since(reference) {
        Some(after) => after.as_secs_f64(),
        None => -(reference - at).as_secs_f64(),
    }
}

/// The decisions of one check that held operations to a lock: how many were held, and
/// which could not be (with why).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Tally {
    /// Operations judged against the lock.
    pub(crate) held: u32,
    /// Operations whose window did not allow it, with why (the first few reasons).
    pub(crate) inconclusive: u32,
    /// Why, for the first [`REASONS_KEPT`] inconclusive operations.
    pub(crate) reasons: Vec<String>,
    /// Operations that could not be held to the lock and were made again (the check
    /// repeated its question rather than leave it undecided): shown, and not in the
    /// share, since the repeat decided in their place.
    pub(crate) retried: u32,
}

/// How many reasons a tally keeps (the count covers the rest).
pub(crate) const REASONS_KEPT: usize = 3;

impl Tally {
    /// Counts one operation held to the lock.
    pub(crate) fn count_held(&mut self) {
        self.held += 1;
    }

    /// Counts one inconclusive operation.
    pub(crate) fn count_inconclusive(&mut self, reason: String) {
        self.inconclusive += 1;
        if self.reasons.len() < REASONS_KEPT && !self.reasons.contains(&reason) {
            self.reasons.push(reason);
        }
    }

    /// Counts an operation that could not be held to the lock and will be made again.
    pub(crate) fn count_retried(&mut self) {
        self.retried += 1;
    }

    /// The inconclusive operations' share of all the operations the check meant to hold
    /// to a lock; zero when it meant to hold none.
    pub(crate) fn share(&self) -> f64 {
        let all = self.held + self.inconclusive;
        if all == 0 {
            0.0
        } else {
            f64::from(self.inconclusive) / f64::from(all)
        }
    }
}

#[cfg(test)]
#[path = "window_tests.rs"]
mod tests;
