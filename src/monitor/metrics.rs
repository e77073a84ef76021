//! The monitor's Prometheus metrics (`lockprobe_monitor_*`) and the HDR histograms
//! behind its status API. Registered on a registry passed in; no globals, no resource
//! ids or tokens in labels.

use std::time::Duration;

use hdrhistogram::Histogram;
use prometheus::{
    Histogram as PromHistogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    Opts, Registry,
};
use serde_json::{json, Value};

use super::tracker::Outcome;
use crate::routing::document::Phase;

/// Buckets from a second to three days: tests run seconds, production hours.
const BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
    14400.0, 21600.0, 43200.0, 86400.0, 172800.0, 259200.0,
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
            changes: IntCounter::new("lockprobe_monitor_changes_total", "Document versions read from the change stream.")?,
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

/// Exact percentiles of the durations the monitor has seen, in milliseconds.
#[derive(Debug)]
pub(crate) struct Percentiles {
    phases: [Histogram<u64>; 3],
    escalation: Histogram<u64>,
}

fn hdr() -> Histogram<u64> {
    // Up to 30 days in milliseconds, three significant digits; auto-resize beyond.
    let mut h =
        Histogram::new_with_bounds(1, 30 * 24 * 3600 * 1000, 3).expect("valid static bounds");
    h.auto(true);
    h
}

fn phase_index(p: Phase) -> usize {
    match p {
        Phase::PreLock => 0,
        Phase::HardDelete => 1,
        Phase::Write => 2,
    }
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
    // Auto-resizing histograms only fail on values beyond u64 range, which saturate above.
    let _ = h.record(ms);
}

fn summary(h: &Histogram<u64>) -> Value {
    // HDR buckets hold values equal to three significant digits; report each bucket's
    // lowest value, so a recorded 9.000 s reads 9.000 s rather than 9.007 s.
    let secs = |v: u64| h.lowest_equivalent(v) as f64 / 1000.0;
    if h.is_empty() {
        return json!({ "count": 0 });
    }
    json!({
        "count": h.len(),
        "p50_seconds": secs(h.value_at_quantile(0.50)),
        "p75_seconds": secs(h.value_at_quantile(0.75)),
        "p99_seconds": secs(h.value_at_quantile(0.99)),
        "max_seconds": secs(h.max()),
    })
}

impl Percentiles {
    /// Empty histograms.
    pub(crate) fn new() -> Self {
        Self {
            phases: [hdr(), hdr(), hdr()],
            escalation: hdr(),
        }
    }

    /// Records one hold of phase `p`.
    pub(crate) fn phase(&mut self, p: Phase, d: Duration) {
        record(&mut self.phases[phase_index(p)], d);
    }

    /// Records one timed pre-lock -> hardDelete interval.
    pub(crate) fn escalation(&mut self, d: Duration) {
        record(&mut self.escalation, d);
    }

    /// `phase_durations` and `escalation_interval` for the status document.
    pub(crate) fn to_json(&self) -> Value {
        let mut phases = serde_json::Map::new();
        for p in PHASES {
            phases.insert(p.as_str().to_owned(), summary(&self.phases[phase_index(p)]));
        }
        json!({ "phase_durations": phases, "escalation_interval": summary(&self.escalation) })
    }
}
