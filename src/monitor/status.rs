//! The monitor's status document, served at `/api/v1/monitor` (camelCase JSON, like the
//! probe's `/api/v1/status`) and rendered at `/monitor`: counts, exact percentiles of the
//! last day and recent anomalies. Resource ids appear; lock tokens never do.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::percentiles::{PhaseSummaries, Summary};

/// The body of `GET /api/v1/monitor`. Counts, ids and percentiles are the fleet's; the
/// probe's own migrations (owner `lockprobe/<target>`) are counted apart in `probe`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MonitorStatus {
    /// When the document was made, by the monitor's clock (ages count from it).
    #[serde(default)]
    pub generated_at: DateTime<Utc>,
    /// Migrations holding a live lock.
    pub in_flight: usize,
    /// The same, by the phase their lock is in.
    #[serde(default)]
    pub in_flight_by_phase: PhaseCounts,
    /// Orphaned locks known now.
    pub orphaned_locks: usize,
    /// Some of their resource ids, sorted.
    pub orphan_ids: Vec<String>,
    /// The longest lapsed of them, with the end of their lease, oldest first.
    #[serde(default)]
    pub orphans: Vec<OrphanDocument>,
    /// Migrations ended so far, by outcome.
    pub migrations: MigrationCounts,
    /// Escalations to hardDelete before the declared delay plus buffer.
    pub early_escalations: u64,
    /// Documents seen with location and lock disagreeing.
    pub partial_cutovers: u64,
    /// Locks removed by an approved force-release (two admin principals).
    #[serde(default)]
    pub force_releases: u64,
    /// Lease renewals observed.
    pub renewals: u64,
    /// Document versions read from the change stream.
    pub changes: u64,
    /// Completed full scans.
    pub scans: u64,
    /// When the last full scan completed.
    pub last_scan_at: Option<DateTime<Utc>>,
    /// The escalation buffer the monitor judges by.
    pub escalation_buffer_seconds: f64,
    /// The declared convergence delay the monitor was told, if any.
    pub declared_delay_seconds: Option<f64>,
    /// The probe's own migrations, apart from the fleet's.
    pub probe: ProbeLocks,
    /// Recent anomalies, newest first.
    pub recent_anomalies: Vec<AnomalyDocument>,
    /// How long each lock phase was held.
    pub phase_duration_seconds: PhaseSummaries,
    /// From pre-lock to the hardDelete escalation.
    pub escalation_interval_seconds: Summary,
    /// The window the percentiles cover, seconds (since the monitor started, at most
    /// this long ago).
    #[serde(default)]
    pub window_seconds: Option<f64>,
    /// The region the monitor's store reads now, for stores with regions (Cosmos DB: the
    /// write region it discovered, so a failover it followed shows here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_region: Option<String>,
    /// Documents the monitor cannot read now (a newer library's format, or no location
    /// document): skipped, their migrations not followed.
    #[serde(default)]
    pub unreadable_documents: usize,
    /// Some of them, by id.
    #[serde(default)]
    pub unreadable: Vec<UnreadableDocument>,
}

/// A document the monitor cannot read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnreadableDocument {
    /// The resource id.
    pub resource: String,
    /// `unsupported-format` (a format this build does not read, usually a newer
    /// library's: upgrade the monitor) or `malformed`.
    pub reason: String,
    /// When the unreadable version was committed (store clock).
    pub committed_at: DateTime<Utc>,
}

/// What the monitor saw of the probe's own locks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeLocks {
    /// The probe's migrations holding a live lock.
    pub in_flight: usize,
    /// The same, by the phase their lock is in.
    #[serde(default)]
    pub in_flight_by_phase: PhaseCounts,
    /// Expired probe locks still in their documents: the lease-lapse check leaves one
    /// until the next cycle on that resource, by design.
    pub orphaned_locks: usize,
    /// The probe's migrations ended so far, by outcome.
    pub migrations: MigrationCounts,
    /// Escalations of probe locks before the declared delay plus buffer.
    pub early_escalations: u64,
    /// Probe documents seen with location and lock disagreeing.
    pub partial_cutovers: u64,
    /// Renewals of probe locks observed.
    #[serde(default)]
    pub renewals: u64,
}

/// Live migrations by the phase their lock is in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseCounts {
    /// `preLock`.
    pub pre_lock: usize,
    /// `hardDelete`.
    pub hard_delete: usize,
    /// `write`.
    pub write: usize,
}

impl From<[usize; 3]> for PhaseCounts {
    fn from([pre_lock, hard_delete, write]: [usize; 3]) -> Self {
        Self { pre_lock, hard_delete, write }
    }
}

/// An orphaned lock: its resource and when its lease ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrphanDocument {
    /// The resource id.
    pub resource: String,
    /// When the lease ended (the lock has been useless since).
    pub lease_ended_at: DateTime<Utc>,
}

/// Migrations ended so far, by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationCounts {
    /// Location switched and lock cleared in one write.
    pub swapped: u64,
    /// Released by the holder.
    pub released: u64,
    /// The lease ran out first.
    pub lapsed: u64,
    /// Removed by an approved force-release (contract 1.4).
    #[serde(default)]
    pub force_released: u64,
}

/// One recent anomaly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AnomalyDocument {
    /// `early_escalation`, `partial_cutover`, `orphaned_lock` or `force_release`.
    pub kind: String,
    /// The resource id.
    pub resource: String,
    /// When it was seen.
    pub at: DateTime<Utc>,
    /// Whose lock: `fleet` or `probe` (lockprobe's own test lock).
    #[serde(default = "fleet")]
    pub source: String,
}

fn fleet() -> String {
    "fleet".into()
}
