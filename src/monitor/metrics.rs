//! The monitor's Prometheus metrics (`lockprobe_monitor_*`) and the HDR histograms
//! behind its status API. Registered on a registry passed in; no globals, no resource
//! ids or tokens in labels.

use std::time::Duration;

use chrono::{DateTime, Utc};
use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use super::tracker::{Outcome, Source};
use crate::document::{DocumentError, Phase};
use crate::exposition::{DOCUMENT_BYTES_BUCKETS, PHASE_BUCKETS};
use crate::percentiles::{PhaseSummaries, Summary, WindowedPercentiles, DEFAULT_WINDOW};

const PHASES: [Phase; 3] = [Phase::PreLock, Phase::HardDelete, Phase::Write];

/// The lock phase a document is in, as the size histogram labels it.
const DOCUMENT_STATES: [&str; 4] = ["unlocked", "preLock", "hardDelete", "write"];

/// Why the metrics could not be registered (a name already taken on the registry).
#[derive(Debug, thiserror::Error)]
#[error("cannot register monitor metrics: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

/// Every metric the monitor exports. Per-migration metrics carry `source`
/// (`fleet` | `probe`, see [`Source`]) so the probe's own locks are reported apart and
/// the fleet alerts select `source="fleet"`.
#[derive(Debug, Clone)]
pub struct MonitorMetrics {
    pub(crate) phase_duration: HistogramVec,
    pub(crate) escalation_interval: HistogramVec,
    pub(crate) migrations: IntCounterVec,
    pub(crate) early_escalations: IntCounterVec,
    pub(crate) partial_cutovers: IntCounterVec,
    pub(crate) force_releases: IntCounterVec,
    pub(crate) orphaned_locks: IntGaugeVec,
    pub(crate) in_flight: IntGaugeVec,
    pub(crate) renewals: IntCounterVec,
    pub(crate) changes: IntCounter,
    pub(crate) store_errors: IntCounterVec,
    pub(crate) scans: IntCounter,
    pub(crate) last_scan: IntGauge,
    pub(crate) unreadable_met: IntCounterVec,
    pub(crate) unreadable: IntGaugeVec,
    pub(crate) document_bytes: HistogramVec,
    pub(crate) untracked: IntCounter,
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
                .buckets(PHASE_BUCKETS.to_vec()),
                &["source", "phase"],
            )?,
            escalation_interval: HistogramVec::new(
                HistogramOpts::new(
                    "lockprobe_monitor_escalation_interval_seconds",
                    "Observed interval from pre-lock to the hardDelete escalation.",
                )
                .buckets(PHASE_BUCKETS.to_vec()),
                &["source"],
            )?,
            migrations: IntCounterVec::new(
                Opts::new("lockprobe_monitor_migrations_total", "Migrations that ended, by outcome."),
                &["source", "outcome"],
            )?,
            early_escalations: IntCounterVec::new(
                Opts::new(
                    "lockprobe_monitor_early_escalations_total",
                    "Escalations to hardDelete before the declared convergence delay plus buffer had passed.",
                ),
                &["source"],
            )?,
            partial_cutovers: IntCounterVec::new(
                Opts::new(
                    "lockprobe_monitor_partial_cutovers_total",
                    "Documents seen with location and lock disagreeing (moved under a lock, or locked at the target).",
                ),
                &["source"],
            )?,
            force_releases: IntCounterVec::new(
                Opts::new(
                    "lockprobe_monitor_force_releases_total",
                    "Locks removed by an approved force-release (requested by one admin principal, approved by another).",
                ),
                &["source"],
            )?,
            orphaned_locks: IntGaugeVec::new(
                Opts::new(
                    "lockprobe_monitor_orphaned_locks",
                    "Documents holding an expired lock that was never released or swapped (the probe's lease-lapse check leaves one by design).",
                ),
                &["source"],
            )?,
            in_flight: IntGaugeVec::new(
                Opts::new("lockprobe_monitor_in_flight_migrations", "Migrations holding a live lock."),
                &["source"],
            )?,
            renewals: IntCounterVec::new(
                Opts::new("lockprobe_monitor_renewals_total", "Lease renewals observed."),
                &["source"],
            )?,
            changes: IntCounter::new(
                "lockprobe_monitor_changes_total",
                "Document versions read from the change stream.",
            )?,
            store_errors: IntCounterVec::new(
                Opts::new("lockprobe_monitor_store_errors_total", "Failed store calls, by operation."),
                &["op"],
            )?,
            scans: IntCounter::new("lockprobe_monitor_scans_total", "Completed full scans of the store.")?,
            untracked: IntCounter::new(
                "lockprobe_monitor_untracked_versions_total",
                "Lock versions of migrations the monitor could not follow: its table of timelines was full.",
            )?,
            last_scan: IntGauge::new(
                "lockprobe_monitor_last_scan_timestamp_seconds",
                "When the last full scan completed (Unix time).",
            )?,
            unreadable_met: IntCounterVec::new(
                Opts::new(
                    "lockprobe_monitor_unreadable_documents_total",
                    "Documents that became unreadable to the monitor (skipped, not followed), by reason: unsupported-format or malformed.",
                ),
                &["reason"],
            )?,
            unreadable: IntGaugeVec::new(
                Opts::new(
                    "lockprobe_monitor_unreadable_documents",
                    "Documents the monitor cannot read now (skipped, not followed), by reason: unsupported-format or malformed.",
                ),
                &["reason"],
            )?,
            document_bytes: HistogramVec::new(
                HistogramOpts::new(
                    "lockprobe_monitor_document_bytes",
                    "Serialized size of each routing document version read from the change stream, by the lock phase it is in (contract budget: 4 KiB at p99).",
                )
                .buckets(DOCUMENT_BYTES_BUCKETS.to_vec()),
                &["source", "phase"],
            )?,
        };
        registry.register(Box::new(m.phase_duration.clone()))?;
        registry.register(Box::new(m.document_bytes.clone()))?;
        registry.register(Box::new(m.escalation_interval.clone()))?;
        registry.register(Box::new(m.migrations.clone()))?;
        registry.register(Box::new(m.early_escalations.clone()))?;
        registry.register(Box::new(m.partial_cutovers.clone()))?;
        registry.register(Box::new(m.force_releases.clone()))?;
        registry.register(Box::new(m.orphaned_locks.clone()))?;
        registry.register(Box::new(m.in_flight.clone()))?;
        registry.register(Box::new(m.renewals.clone()))?;
        registry.register(Box::new(m.changes.clone()))?;
        registry.register(Box::new(m.store_errors.clone()))?;
        registry.register(Box::new(m.scans.clone()))?;
        registry.register(Box::new(m.untracked.clone()))?;
        registry.register(Box::new(m.last_scan.clone()))?;
        registry.register(Box::new(m.unreadable_met.clone()))?;
        registry.register(Box::new(m.unreadable.clone()))?;
        // Label values are a closed set: pre-register them so every series exists at 0,
        // which `increase()` in the alert rules needs.
        for source in Source::ALL.map(Source::as_str) {
            for p in PHASES {
                m.phase_duration.with_label_values(&[source, p.as_str()]);
            }
            for o in Outcome::ALL {
                m.migrations.with_label_values(&[source, o.as_str()]);
            }
            m.escalation_interval.with_label_values(&[source]);
            m.early_escalations.with_label_values(&[source]);
            m.partial_cutovers.with_label_values(&[source]);
            m.force_releases.with_label_values(&[source]);
            m.orphaned_locks.with_label_values(&[source]);
            m.in_flight.with_label_values(&[source]);
            m.renewals.with_label_values(&[source]);
            for state in DOCUMENT_STATES {
                m.document_bytes.with_label_values(&[source, state]);
            }
        }
        for op in ["read_changes", "scan"] {
            m.store_errors.with_label_values(&[op]);
        }
        for reason in DocumentError::REASONS {
            m.unreadable_met.with_label_values(&[reason]);
            m.unreadable.with_label_values(&[reason]);
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
