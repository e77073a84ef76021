//! The monitor's Prometheus metrics (`lockprobe_monitor_*`) and the HDR histograms
//! behind its status API. Registered on a registry passed in; no globals, no resource
//! ids or tokens in labels.

use std::time::Duration;

use chrono::{DateTime, Utc};
use prometheus::{
    Histogram as PromHistogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

use super::tracker::Outcome;
use crate::percentiles::{PhaseSummaries, Summary, WindowedPercentiles, DEFAULT_WINDOW};
use crate::routing::document::Phase;

/// Buckets from a second to three days: tests run seconds, production hours.
const BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 21600.0,
    43200.0, 86400.0, 172800.0, 259200.0,
];

const PHASES: [Phase; 3] = [Phase::PreLock, Phase::HardDelete, Phase::Write];

/// Why the metrics could not be registered (a name already taken on the registry).
#[derive(Debug, thiserror::Error)]
#[error("cannot register monitor metrics: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

/// Every metric the monitor exports.
#[derive(Debug, Clone)]
pub struct MonitorMetrics {
    pub(crate) phase_duration: HistogramVec,
    pub(crate) escalation_interval: PromHistogram,
    pub(crate) migrations: IntCounterVec,
    pub(crate) early_escalations: IntCounter,
    pub(crate) partial_cutovers: IntCounter,
    pub(crate) orphaned_locks: IntGauge,
    pub(crate) in_flight: IntGauge,
    pub(crate) renewals: IntCounter,
    pub(crate) changes: IntCounter,
    pub(crate) store_errors: IntCounterVec,
    pub(crate) scans: IntCounter,
    pub(crate) last_scan: IntGauge,
}

impl MonitorMetrics {
    /// Creates and registers the metrics on `registry`.
    pub fn register(registry: &Registry) -> Result<Self, MetricsError> {
        let m = Self {
            phase_duration: HistogramVec::new(
                HistogramOpts::new(
                    "lockprobe_monitor_phase_duration_seconds",
                    "How long each lock phase was held, from its start to the next phase or the migration's end.",
                )
                .buckets(BUCKETS.to_vec()),
                &["phase"],
            )?,
            escalation_interval: PromHistogram::with_opts(
                HistogramOpts::new(
                    "lockprobe_monitor_escalation_interval_seconds",
                    "Observed interval from pre-lock to the hardDelete escalation.",
                )
                .buckets(BUCKETS.to_vec()),
            )?,
            migrations: IntCounterVec::new(
                Opts::new("lockprobe_monitor_migrations_total", "Migrations that ended, by outcome."),
                &["outcome"],
            )?,
            early_escalations: IntCounter::new(
                "lockprobe_monitor_early_escalations_total",
                "Escalations to hardDelete before the declared convergence delay plus buffer had passed.",
            )?,
            partial_cutovers: IntCounter::new(
                "lockprobe_monitor_partial_cutovers_total",
                "Documents seen with location and lock disagreeing (moved under a lock, or locked at the target).",
            )?,
            orphaned_locks: IntGauge::new(
                "lockprobe_monitor_orphaned_locks",
                "Documents holding an expired lock that was never released or swapped.",
            )?,
            in_flight: IntGauge::new("lockprobe_monitor_in_flight_migrations", "Migrations holding a live lock.")?,
            renewals: IntCounter::new("lockprobe_monitor_renewals_total", "Lease renewals observed.")?,
            changes: IntCounter::new(
                "lockprobe_monitor_changes_total",
                "Document versions read from the change stream.",
            )?,
            store_errors: IntCounterVec::new(
                Opts::new("lockprobe_monitor_store_errors_total", "Failed store calls, by operation."),
                &["op"],
            )?,
            scans: IntCounter::new("lockprobe_monitor_scans_total", "Completed full scans of the store.")?,
            last_scan: IntGauge::new(
                "lockprobe_monitor_last_scan_timestamp_seconds",
                "When the last full scan completed (Unix time).",
            )?,
        };
        registry.register(Box::new(m.phase_duration.clone()))?;
        registry.register(Box::new(m.escalation_interval.clone()))?;
        registry.register(Box::new(m.migrations.clone()))?;
        registry.register(Box::new(m.early_escalations.clone()))?;
        registry.register(Box::new(m.partial_cutovers.clone()))?;
        registry.register(Box::new(m.orphaned_locks.clone()))?;
        registry.register(Box::new(m.in_flight.clone()))?;
        registry.register(Box::new(m.renewals.clone()))?;
        registry.register(Box::new(m.changes.clone()))?;
        registry.register(Box::new(m.store_errors.clone()))?;
        registry.register(Box::new(m.scans.clone()))?;
        registry.register(Box::new(m.last_scan.clone()))?;
        // Label values are a closed set: pre-register them so every series exists at 0,
        // which `increase()` in the alert rules needs.
        for p in PHASES {
            m.phase_duration.with_label_values(&[p.as_str()]);
        }
        for o in Outcome::ALL {
            m.migrations.with_label_values(&[o.as_str()]);
        }
        for op in ["read_changes", "scan"] {
            m.store_errors.with_label_values(&[op]);
        }
        Ok(m)
    }
}

/// Exact percentiles of the durations the monitor has seen lately (see
/// [`crate::percentiles`]), in steps of a millisecond: lock times come from settled
/// timestamps, finer steps would only add noise.
#[derive(Debug)]
pub(crate) struct Percentiles {
    phases: [WindowedPercentiles; 3],
    escalation: WindowedPercentiles,
}

fn window() -> WindowedPercentiles {
    WindowedPercentiles::new(Duration::from_millis(1), DEFAULT_WINDOW)
}

fn phase_index(p: Phase) -> usize {
    match p {
        Phase::PreLock => 0,
        Phase::HardDelete => 1,
        Phase::Write => 2,
    }
}

impl Percentiles {
    /// Empty windows.
    pub(crate) fn new() -> Self {
        Self { phases: [window(), window(), window()], escalation: window() }
    }

    /// Records one hold of phase `p`, ended at `at`.
    pub(crate) fn phase(&mut self, p: Phase, at: DateTime<Utc>, d: Duration) {
        self.phases[phase_index(p)].record(at, d);
    }

    /// Records one timed pre-lock -> hardDelete interval, ended at `at`.
    pub(crate) fn escalation(&mut self, at: DateTime<Utc>, d: Duration) {
        self.escalation.record(at, d);
    }

    /// The phase holds and the escalation interval, over the window ending at `now`.
    pub(crate) fn summaries(&self, now: DateTime<Utc>) -> (PhaseSummaries, Summary) {
        let phase = |p: Phase| self.phases[phase_index(p)].summary(now);
        let phases = PhaseSummaries {
            pre_lock: phase(Phase::PreLock),
            hard_delete: phase(Phase::HardDelete),
            write: phase(Phase::Write),
        };
        (phases, self.escalation.summary(now))
    }
}
