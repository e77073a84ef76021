//! Exact percentiles of recent durations, for the status documents of the probe and the
//! monitor: HDR histograms (three significant digits) over a sliding window.
//!
//! The window is kept as [`SLOTS`] histograms of a quarter window each, filled by the
//! time a value was recorded and cleared when that quarter comes round again, so a
//! summary covers between three quarters of the window and all of it. Prometheus keeps
//! the cumulative view (its histograms); this one answers "how slow lately?".

use std::time::Duration;

use chrono::{DateTime, Utc};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// How many parts the window is kept in.
pub const SLOTS: usize = 4;

/// The window of the status documents: a day, so a probe that runs every six hours
/// still shows a few cycles, and a bad hour stays visible until the next morning.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// Count and exact percentiles of one series, in seconds; `null` percentiles when
/// nothing was recorded in the window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Summary {
    /// Values recorded in the window.
    pub count: u64,
    /// Median.
    pub p50: Option<f64>,
    /// 75th percentile.
    pub p75: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Largest value.
    pub max: Option<f64>,
}

/// One summary per lock phase, in lifecycle order (`preLock`, `hardDelete`, `write`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PhaseSummaries {
    /// `preLock`.
    pub pre_lock: Summary,
    /// `hardDelete`.
    pub hard_delete: Summary,
    /// `write`.
    pub write: Summary,
}

#[derive(Debug, Clone)]
struct Slot {
    /// Which quarter (counted from the Unix epoch) the histogram holds.
    epoch: i64,
    hist: Histogram<u64>,
}

/// Durations recorded over the last `window`, with exact percentiles.
#[derive(Debug, Clone)]
pub struct WindowedPercentiles {
    resolution: Duration,
    slot_millis: i64,
    slots: Vec<Slot>,
}

fn histogram() -> Histogram<u64> {
    // Three significant digits, auto-resizing: sub-millisecond reads to multi-day leases.
    Histogram::new(3).expect("3 significant figures is a valid HDR precision")
}

impl WindowedPercentiles {
    /// An empty window of `window`, recording values in steps of `resolution` (a
    /// microsecond for read latencies, a millisecond for lock holds).
    pub fn new(resolution: Duration, window: Duration) -> Self {
        let slot_millis = i64::try_from(window.as_millis() / SLOTS as u128).unwrap_or(i64::MAX).max(1);
        Self {
            resolution: resolution.max(Duration::from_nanos(1)),
            slot_millis,
            slots: (0..SLOTS).map(|_| Slot { epoch: i64::MIN, hist: histogram() }).collect(),
        }
    }

    fn epoch(&self, at: DateTime<Utc>) -> i64 {
        at.timestamp_millis().div_euclid(self.slot_millis)
    }

    /// Records `value`, observed at `at`. A value older than the window is dropped.
    pub fn record(&mut self, at: DateTime<Utc>, value: Duration) {
        let epoch = self.epoch(at);
        let steps = u64::try_from(value.as_nanos() / self.resolution.as_nanos()).unwrap_or(u64::MAX);
        let slot = &mut self.slots[epoch.rem_euclid(SLOTS as i64) as usize];
        if slot.epoch > epoch {
            return;
        }
        if slot.epoch < epoch {
            slot.hist.reset();
            slot.epoch = epoch;
        }
        // `record` grows the auto-resizing histogram; `saturating_record` clamps to its
        // largest trackable value when growing fails.
        if slot.hist.record(steps).is_err() {
            slot.hist.saturating_record(steps);
        }
    }

    /// Records `seconds` (negative or not finite counts as zero).
    pub fn record_seconds(&mut self, at: DateTime<Utc>, seconds: f64) {
        self.record(at, Duration::try_from_secs_f64(seconds).unwrap_or_default());
    }

    /// Count and percentiles of what was recorded in the window ending at `now`. Each
    /// percentile is the lowest value of its HDR bucket, so a recorded 9.000 s reads 9 s.
    pub fn summary(&self, now: DateTime<Utc>) -> Summary {
        let current = self.epoch(now);
        let mut merged = histogram();
        for slot in self.slots.iter().filter(|s| s.epoch > current - SLOTS as i64) {
            // Adding auto-resizing histograms of the same precision cannot fail.
            let _ = merged.add(&slot.hist);
        }
        if merged.is_empty() {
            return Summary::default();
        }
        let step_nanos = self.resolution.as_nanos() as f64;
        let secs = |steps: u64| merged.lowest_equivalent(steps) as f64 * step_nanos / 1e9;
        Summary {
            count: merged.len(),
            p50: Some(secs(merged.value_at_quantile(0.50))),
            p75: Some(secs(merged.value_at_quantile(0.75))),
            p99: Some(secs(merged.value_at_quantile(0.99))),
            max: Some(secs(merged.max())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn exact_percentiles_in_seconds_and_empty_is_null() {
        let mut p = WindowedPercentiles::new(Duration::from_micros(1), DEFAULT_WINDOW);
        assert_eq!(p.summary(t(0)), Summary::default());
        assert_eq!(serde_json::to_value(Summary::default()).unwrap()["p50"], serde_json::Value::Null);
        for ms in [1.0, 1.5, 2.0] {
            p.record_seconds(t(0), ms / 1000.0);
        }
        let s = p.summary(t(1));
        assert_eq!((s.count, s.p50, s.max), (3, Some(0.0015), Some(0.002)));
        let mut holds = WindowedPercentiles::new(Duration::from_millis(1), DEFAULT_WINDOW);
        holds.record(t(0), Duration::from_secs(9));
        assert_eq!(holds.summary(t(0)).p50, Some(9.0));
    }

    #[test]
    fn values_leave_the_summary_once_their_quarter_is_out_of_the_window() {
        let window = Duration::from_secs(400);
        let mut p = WindowedPercentiles::new(Duration::from_millis(1), window);
        p.record(t(0), Duration::from_secs(5));
        p.record(t(150), Duration::from_secs(1));
        assert_eq!(p.summary(t(150)).count, 2);
        // Quarter 0 (0..100 s) is still in the window ending in quarter 3 ...
        assert_eq!(p.summary(t(399)).count, 2);
        // ... and out of the one ending in quarter 4.
        let s = p.summary(t(400));
        assert_eq!((s.count, s.max), (1, Some(1.0)));
        // A late value for a quarter already reused is dropped, not mixed in.
        p.record(t(450), Duration::from_secs(2));
        p.record(t(10), Duration::from_secs(7));
        assert_eq!(p.summary(t(450)).max, Some(2.0));
        assert_eq!(p.summary(t(10_000)).count, 0);
    }
}
