//! The convergence monitor: every migration's lock timeline, read from the store.
//!
//! The monitor follows the store's change stream and keeps a compact timeline per
//! in-flight migration (see `timeline`); from those it measures phase holds and the
//! pre-lock -> hardDelete interval against the declared delay + buffer, counts
//! outcomes, and flags early escalations, orphaned locks and partial cutovers
//! (`tracker`). A periodic scan of the write region finds what the stream missed
//! (a restart, a change log that dropped entries), and a sweep ends timelines whose
//! lease ran out with no event. It reads the store, never the probe.
//!
//! - `config`: [`MonitorConfig`], the monitor's settings as flags and as `[monitor]`
//!   keys; [`http`]: the `/api/v1/monitor` route and the `/monitor` page (`page`).
//! - `tracker`: the pure inference from observed versions to events, over a
//!   `table` of `timeline`s packed for a million migrations in flight.
//! - `metrics`: `lockprobe_monitor_*` and the HDR percentiles of the status API.
//! - `status`: [`MonitorStatus`], the document of `/api/v1/monitor`.
//! - `unreadable`: the documents the monitor cannot read (a newer library's format, or
//!   no location document), skipped and counted so they blind it to nothing else.

// The parts are private and what callers need is re-exported below; `http` stays a
// module of its own, since its routes (`http::router`, `http::health_router`) read as
// what they are only under that name.
mod config;
pub mod http;
mod metrics;
mod page;
mod status;
mod table;
mod timeline;
mod tracker;
mod unreadable;

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

pub use config::{MonitorConfig, MonitorConfigError};
pub use metrics::{MetricsError, MonitorMetrics};
pub use status::{
    AnomalyDocument, MigrationCounts, MonitorStatus, OrphanDocument, PhaseCounts, ProbeLocks, UnreadableDocument,
};
pub use tracker::{Event, Outcome, Rules, Seen, Source, Tracker, PROBE_OWNER_PREFIX};

use crate::clock::Clock;
use crate::document::DocumentError;
use crate::document::LocationDocument;
use crate::routing::lifecycle;
use crate::store::{ChangeCursor, LocationStore, StoreError, Unreadable, Versioned};
use unreadable::UnreadableDocuments;

/// A stored version as readers take it: a write that landed too late is void, a
/// pre-lock starts from its commit (see [`lifecycle::settle`]). The commit time is
/// `committed_at`, capped by the caller at its own clock like every time the monitor
/// takes from the store, so a store clock far ahead cannot push every lock into the
/// future. Lent when settling changes nothing the monitor looks at.
fn settled(v: &Versioned, committed_at: DateTime<Utc>) -> Cow<'_, LocationDocument> {
    lifecycle::settle_view(&v.doc, committed_at)
}

/// How many orphan ids the status API lists.
const STATUS_ORPHAN_IDS: usize = 20;

/// How many unreadable documents the status API lists.
const STATUS_UNREADABLE_IDS: usize = 20;

/// Why the monitor could not start or a store call failed.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] MonitorConfigError),
    /// The metrics could not be registered.
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    /// A store call failed; the monitor retries on its next tick.
    #[error("store {op} failed: {source}")]
    Store {
        /// `read_changes` or `scan`.
        op: &'static str,
        /// The store's error.
        source: StoreError,
    },
}

/// What one full scan found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Documents read.
    pub documents: usize,
    /// Documents met that this library cannot read (skipped).
    pub unreadable: usize,
    /// Orphaned locks known after the scan.
    pub orphaned_locks: usize,
}

/// The monitor's own account of what it keeps ([`Monitor::retained`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retained {
    /// Timelines held: in flight, orphaned and recently ended.
    pub timelines: usize,
    /// Their heap in bytes, as the table counts it (within 0.2 % of the allocator's count).
    pub bytes: usize,
}

/// A recent anomaly, for operators reading the status API.
#[derive(Debug, Clone)]
struct Anomaly {
    kind: &'static str,
    id: String,
    at: DateTime<Utc>,
    source: Source,
}

#[derive(Debug)]
struct Inner {
    tracker: Tracker,
    percentiles: metrics::Percentiles,
    anomalies: VecDeque<Anomaly>,
    last_scan_at: Option<DateTime<Utc>>,
    events: Vec<Event>,
    unreadable: UnreadableDocuments,
}

/// The convergence monitor over one store.
#[derive(Debug)]
pub struct Monitor {
    store: Arc<dyn LocationStore>,
    clock: Arc<dyn Clock>,
    config: MonitorConfig,
    metrics: MonitorMetrics,
    inner: Mutex<Inner>,
    /// Serialises polls so the cursor advances exactly once per batch.
    cursor: tokio::sync::Mutex<ChangeCursor>,
}

impl Monitor {
    /// A monitor over `store`, registering its metrics on `registry`. It starts reading
    /// the change stream from the beginning of what the store retains.
    pub fn new(
        store: Arc<dyn LocationStore>,
        clock: Arc<dyn Clock>,
        config: MonitorConfig,
        registry: &prometheus::Registry,
    ) -> Result<Self, MonitorError> {
        config.validate()?;
        let metrics = MonitorMetrics::register(registry)?;
        let rules = Rules {
            escalation_buffer: config.escalation_buffer,
            declared_delay: config.declared_delay,
            lapse_grace: config.lapse_grace,
        };
        Ok(Self {
            store,
            clock,
            metrics,
            inner: Mutex::new(Inner {
                tracker: Tracker::new(rules),
                percentiles: metrics::Percentiles::new(),
                anomalies: VecDeque::with_capacity(config.recent_anomalies),
                last_scan_at: None,
                events: Vec::new(),
                unreadable: UnreadableDocuments::default(),
            }),
            cursor: tokio::sync::Mutex::new(ChangeCursor::beginning()),
            config,
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &MonitorConfig {
        &self.config
    }

    /// Reads one batch of the change stream and applies it; returns how many versions
    /// were read (those that cannot be read included: they are skipped and counted).
    pub async fn poll_once(&self) -> Result<usize, MonitorError> {
        let mut cursor = self.cursor.lock().await;
        let batch = match self.store.read_changes(&cursor, self.config.poll_batch).await {
            Ok(b) => b,
            Err(source) => {
                self.metrics.store_errors.with_label_values(&["read_changes"]).inc();
                return Err(MonitorError::Store { op: "read_changes", source });
            }
        };
        let n = batch.changes.len() + batch.unreadable.len();
        {
            // A commit time comes from the store's clock (Cosmos DB: `_ts`, whole
            // seconds, server time); lock times come from the service's. A commit time
            // ahead of the monitor's own clock would make live locks look lapsed, so it
            // is capped at now: replays keep their real times, a skewed store cannot.
            let now = self.clock.now();
            let mut inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for change in &batch.changes {
                if !inner.unreadable.readable(&change.doc.doc.id, Some(change.doc.committed_at)) {
                    continue; // older than the unreadable version already met
                }
                let at = change.doc.committed_at.min(now);
                let stored = Some(&change.doc.doc);
                self.apply(&mut inner, &settled(&change.doc, at), stored, at, Seen::Stream);
            }
            for met in &batch.unreadable {
                self.skip_unreadable(&mut inner, met, "change stream");
            }
            // Once per batch: the gauges are read by scrapes, not per change.
            self.refresh_gauges(&inner);
        }
        self.metrics.changes.inc_by(n as u64);
        *cursor = batch.next;
        Ok(n)
    }

    /// Polls until the stream has nothing more; returns how many versions were applied.
    pub async fn drain(&self) -> Result<usize, MonitorError> {
        let mut total = 0;
        loop {
            let n = self.poll_once().await?;
            total += n;
            if n < self.config.poll_batch {
                return Ok(total);
            }
        }
    }

    /// Reads every document from the write region and applies it as of now: orphaned
    /// locks and partial cutovers the stream missed are found here.
    pub async fn scan_once(&self) -> Result<ScanReport, MonitorError> {
        let mut after: Option<String> = None;
        let (mut documents, mut unreadable) = (0, 0);
        loop {
            // The page is stamped with a time taken before it is read: it shows every
            // commit up to then. A time taken after the read would mark a change
            // committed while the page was in flight (a swap, say) as already seen, and
            // the stream would then drop it as stale.
            let read_at = self.clock.now();
            let page = match self.store.scan(after.as_deref(), self.config.scan_page).await {
                Ok(p) => p,
                Err(source) => {
                    self.metrics.store_errors.with_label_values(&["scan"]).inc();
                    return Err(MonitorError::Store { op: "scan", source });
                }
            };
            {
                let mut inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                for v in &page.documents {
                    inner.unreadable.readable(&v.doc.id, None);
                    self.apply(&mut inner, &settled(v, v.committed_at.min(read_at)), None, read_at, Seen::Scan);
                }
                for met in &page.unreadable {
                    self.skip_unreadable(&mut inner, met, "scan");
                }
                self.refresh_gauges(&inner);
            }
            documents += page.documents.len();
            unreadable += page.unreadable.len();
            match page.last_id() {
                Some(last) if page.len() == self.config.scan_page => after = Some(last.to_owned()),
                _ => break,
            }
        }
        let now = self.clock.now();
        let mut inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.last_scan_at = Some(now);
        self.metrics.scans.inc();
        self.metrics.last_scan.set(now.timestamp());
        let report = ScanReport { documents, unreadable, orphaned_locks: inner.tracker.orphans() };
        debug!(documents, unreadable, orphaned_locks = report.orphaned_locks, "scan complete");
        Ok(report)
    }

    /// Ends timelines whose lease ran out more than `lapse_grace` ago with no event.
    /// Drain the stream first, or a late change may be mistaken for a lapse.
    pub fn sweep(&self) {
        let now = self.clock.now();
        let mut inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut found = Vec::new();
        inner.tracker.sweep(now, &mut found);
        for (id, event) in found {
            let source = inner.tracker.source_of(&id);
            self.record(&mut inner, &id, source, event, now);
        }
        self.refresh_gauges(&inner);
    }

    /// Applies one observed version of a document, as the stream or a scan would. Public
    /// so benches and embedders can feed observations directly.
    pub fn observe(&self, doc: &LocationDocument, at: DateTime<Utc>, seen: Seen) {
        let mut inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.apply(&mut inner, doc, (seen == Seen::Stream).then_some(doc), at, seen);
        self.refresh_gauges(&inner);
    }

    /// Reserves room for `n` more in-flight timelines (bulk loads, benches).
    pub fn reserve(&self, n: usize) {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).tracker.reserve(n);
    }

    /// Whether a full scan of the store has completed (readiness of `lockprobe monitor`).
    pub fn has_scanned(&self) -> bool {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).last_scan_at.is_some()
    }

    /// What the monitor holds now: its timelines (in flight, orphaned, recently ended)
    /// and their heap (the table's slots and index, spare capacity included, and the
    /// ids' chunks).
    pub fn retained(&self) -> Retained {
        let inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Retained { timelines: inner.tracker.retained(), bytes: inner.tracker.retained_bytes() }
    }

    /// Migrations currently holding a live lock.
    pub fn in_flight(&self) -> usize {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).tracker.in_flight()
    }

    /// The fleet's orphaned locks currently known (the probe's are apart, see
    /// [`Monitor::status`]).
    pub fn orphaned_locks(&self) -> usize {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).tracker.orphans()
    }

    /// Ids of orphaned locks (at most `limit`), sorted.
    pub fn orphan_ids(&self, limit: usize) -> Vec<String> {
        let mut ids = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).tracker.orphan_ids(limit);
        ids.sort();
        ids
    }

    /// The fleet's migrations ended with `outcome` so far.
    pub fn outcomes(&self, outcome: Outcome) -> u64 {
        self.outcomes_of(Source::Fleet, outcome)
    }

    /// Migrations of `source` ended with `outcome` so far.
    pub fn outcomes_of(&self, source: Source, outcome: Outcome) -> u64 {
        self.metrics.migrations.with_label_values(&[source.as_str(), outcome.as_str()]).get()
    }

    fn migration_counts(&self, source: Source) -> MigrationCounts {
        MigrationCounts {
            swapped: self.outcomes_of(source, Outcome::Swapped),
            released: self.outcomes_of(source, Outcome::Released),
            lapsed: self.outcomes_of(source, Outcome::Lapsed),
            force_released: self.outcomes_of(source, Outcome::ForceReleased),
        }
    }

    /// The fleet's early escalations counted so far.
    pub fn early_escalations(&self) -> u64 {
        self.metrics.early_escalations.with_label_values(&[Source::Fleet.as_str()]).get()
    }

    /// The fleet's partial cutovers counted so far.
    pub fn partial_cutovers(&self) -> u64 {
        self.metrics.partial_cutovers.with_label_values(&[Source::Fleet.as_str()]).get()
    }

    /// The status document for `/api/v1/monitor`: counts, exact percentiles (p50, p75,
    /// p99, max) of the last day and recent anomalies.
    pub fn status(&self) -> MonitorStatus {
        let inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let m = &self.metrics;
        // One walk of the timelines for the orphans, one for the phases.
        let orphans: Vec<OrphanDocument> = inner
            .tracker
            .orphans_with_lease_end(STATUS_ORPHAN_IDS)
            .into_iter()
            .map(|(resource, lease_ended_at)| OrphanDocument { resource, lease_ended_at })
            .collect();
        let mut orphan_ids: Vec<String> = orphans.iter().map(|o| o.resource.clone()).collect();
        orphan_ids.sort();
        let (fleet_by_phase, probe_by_phase) = inner.tracker.in_flight_by_phase();
        let now = self.clock.now();
        let (phase_duration_seconds, escalation_interval_seconds) = inner.percentiles.summaries(now);
        let fleet = Source::Fleet.as_str();
        MonitorStatus {
            generated_at: now,
            in_flight: inner.tracker.in_flight_of(Source::Fleet),
            in_flight_by_phase: fleet_by_phase.into(),
            orphaned_locks: inner.tracker.orphans(),
            orphan_ids,
            orphans,
            migrations: self.migration_counts(Source::Fleet),
            early_escalations: self.early_escalations(),
            partial_cutovers: self.partial_cutovers(),
            force_releases: m.force_releases.with_label_values(&[fleet]).get(),
            renewals: m.renewals.with_label_values(&[fleet]).get(),
            probe: ProbeLocks {
                in_flight: inner.tracker.in_flight_of(Source::Probe),
                in_flight_by_phase: probe_by_phase.into(),
                orphaned_locks: inner.tracker.orphans_of(Source::Probe),
                migrations: self.migration_counts(Source::Probe),
                early_escalations: m.early_escalations.with_label_values(&[Source::Probe.as_str()]).get(),
                partial_cutovers: m.partial_cutovers.with_label_values(&[Source::Probe.as_str()]).get(),
                renewals: m.renewals.with_label_values(&[Source::Probe.as_str()]).get(),
            },
            changes: m.changes.get(),
            scans: m.scans.get(),
            last_scan_at: inner.last_scan_at,
            escalation_buffer_seconds: self.config.escalation_buffer.as_secs_f64(),
            declared_delay_seconds: self.config.declared_delay.map(|d| d.as_secs_f64()),
            recent_anomalies: inner
                .anomalies
                .iter()
                .rev()
                .map(|a| AnomalyDocument {
                    kind: a.kind.to_owned(),
                    resource: a.id.clone(),
                    at: a.at,
                    source: a.source.as_str().to_owned(),
                })
                .collect(),
            phase_duration_seconds,
            escalation_interval_seconds,
            window_seconds: Some(crate::percentiles::DEFAULT_WINDOW.as_secs_f64()),
            store_region: self.store.region(),
            unreadable_documents: inner.unreadable.len(),
            unreadable: inner
                .unreadable
                .listing(STATUS_UNREADABLE_IDS)
                .into_iter()
                .map(|(resource, entry)| UnreadableDocument {
                    resource,
                    reason: entry.reason.to_owned(),
                    committed_at: entry.committed_at,
                })
                .collect(),
        }
    }

    /// Follows the stream, sweeps and scans until `shutdown` is cancelled. The first
    /// scan runs at once, so a restarted monitor finds existing orphans immediately.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut scan = tokio::time::interval(self.config.scan_interval);
        scan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sweep = tokio::time::interval(self.config.sweep_interval);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        info!(scan_interval = ?self.config.scan_interval, "monitor started");
        loop {
            let full = match self.poll_once().await {
                Ok(n) => n == self.config.poll_batch,
                Err(e) => {
                    warn!(error = %e, "change stream poll failed");
                    false
                }
            };
            let pause = if full { std::time::Duration::ZERO } else { self.config.poll_interval };
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = scan.tick() => {
                    // Catch up first so the scan's view is not older than the stream's.
                    if let Err(e) = self.drain().await {
                        warn!(error = %e, "change stream poll failed");
                    }
                    if let Err(e) = self.scan_once().await {
                        warn!(error = %e, "scan failed");
                    }
                    self.sweep();
                }
                _ = sweep.tick() => {
                    if let Err(e) = self.drain().await {
                        warn!(error = %e, "change stream poll failed");
                    }
                    self.sweep();
                }
                _ = tokio::time::sleep(pause) => {}
            }
        }
        info!("monitor stopped");
    }

    /// Applies `doc` (settled, as readers take it) to the timelines; `stored`, the same
    /// version as the store holds it, is measured for the size histogram.
    fn apply(
        &self,
        inner: &mut Inner,
        doc: &LocationDocument,
        stored: Option<&LocationDocument>,
        at: DateTime<Utc>,
        seen: Seen,
    ) {
        let mut events = std::mem::take(&mut inner.events);
        let source = inner.tracker.observe(doc, at, seen, &mut events);
        // Every version written is measured once, as it comes from the stream (a scan
        // sees the same documents again and again), at its stored size: settling drops
        // a write's pending record, which the store, every read and every cache still
        // carry. Labelled by the phase readers see.
        if let Some(stored) = stored {
            let phase = doc.primary.lock.as_ref().map_or("unlocked", |l| l.phase.as_str());
            self.metrics
                .document_bytes
                .with_label_values(&[source.as_str(), phase])
                .observe(stored.serialized_len() as f64);
        }
        for event in events.drain(..) {
            self.record(inner, &doc.id, source, event, at);
        }
        inner.events = events;
    }

    /// A document this library cannot read: skipped, and its migration no longer
    /// followed (a lapse or a swap would go unseen, so none is guessed). Counted and
    /// logged once, when its id becomes unreadable; shown until a readable version
    /// replaces it.
    fn skip_unreadable(&self, inner: &mut Inner, met: &Unreadable, found_by: &'static str) {
        if !inner.unreadable.met(met) {
            return;
        }
        let reason = met.reason.reason();
        self.metrics.unreadable_met.with_label_values(&[reason]).inc();
        let followed = inner.tracker.forget(&met.id);
        warn!(resource = %met.id, reason, found_by, followed, error = %met.reason, "skipping a document this monitor cannot read");
    }

    fn refresh_gauges(&self, inner: &Inner) {
        for reason in DocumentError::REASONS {
            let known = i64::try_from(inner.unreadable.count(reason)).unwrap_or(i64::MAX);
            self.metrics.unreadable.with_label_values(&[reason]).set(known);
        }
        for source in Source::ALL {
            let (in_flight, orphans) = (inner.tracker.in_flight_of(source), inner.tracker.orphans_of(source));
            let label = [source.as_str()];
            self.metrics.in_flight.with_label_values(&label).set(i64::try_from(in_flight).unwrap_or(i64::MAX));
            self.metrics.orphaned_locks.with_label_values(&label).set(i64::try_from(orphans).unwrap_or(i64::MAX));
        }
    }

    /// Turns one event into metrics, logs and the status document. The probe's
    /// migrations are counted under `source="probe"` only: their timings stay out of the
    /// status percentiles (the probe reports its own), and the lapse its lease-lapse
    /// check leaves by design is not an anomaly, nor is the force-release its
    /// force-release check makes. An early escalation or a partial
    /// cutover is still one, whoever's lock it is.
    fn record(&self, inner: &mut Inner, id: &str, source: Source, event: Event, at: DateTime<Utc>) {
        let m = &self.metrics;
        let label = source.as_str();
        let fleet = source == Source::Fleet;
        match event {
            Event::Started | Event::OrphanCleared => {}
            Event::PhaseHeld { phase, held } => {
                m.phase_duration.with_label_values(&[label, phase.as_str()]).observe(held.as_secs_f64());
                if fleet {
                    inner.percentiles.phase(phase, at, held);
                }
            }
            Event::Escalation { interval, required, early } => {
                if let Some(i) = interval {
                    m.escalation_interval.with_label_values(&[label]).observe(i.as_secs_f64());
                    if fleet {
                        inner.percentiles.escalation(at, i);
                    }
                }
                if early {
                    m.early_escalations.with_label_values(&[label]).inc();
                    warn!(resource = id, source = label, interval = ?interval, required = ?required, "early escalation to hardDelete");
                    self.anomaly(inner, "early_escalation", id, source, at);
                }
            }
            Event::Renewed(n) => m.renewals.with_label_values(&[label]).inc_by(u64::from(n)),
            Event::Ended(outcome) => {
                m.migrations.with_label_values(&[label, outcome.as_str()]).inc();
                debug!(resource = id, source = label, outcome = outcome.as_str(), "migration ended");
            }
            Event::ForceReleased { request, requested_by, approved_by, reason } if fleet => {
                m.force_releases.with_label_values(&[label]).inc();
                warn!(
                    resource = id,
                    source = label,
                    request,
                    requested_by,
                    approved_by,
                    reason,
                    "lock force-released by two admin principals"
                );
                self.anomaly(inner, "force_release", id, source, at);
            }
            Event::ForceReleased { request, requested_by, approved_by, .. } => {
                m.force_releases.with_label_values(&[label]).inc();
                debug!(
                    resource = id,
                    request,
                    requested_by,
                    approved_by,
                    "the probe's force-release check ended its own lock, as designed"
                );
            }
            Event::PartialCutover => {
                m.partial_cutovers.with_label_values(&[label]).inc();
                error!(resource = id, source = label, "partial cutover: location and lock disagree");
                self.anomaly(inner, "partial_cutover", id, source, at);
            }
            Event::OrphanFound if fleet => {
                warn!(resource = id, "orphaned lock: lease expired, never released or swapped");
                self.anomaly(inner, "orphaned_lock", id, source, at);
            }
            Event::OrphanFound => {
                debug!(resource = id, "the probe's lease-lapse check left its expired lock, as designed");
            }
            Event::Untracked => {
                m.untracked.inc();
                // Once per process, not per version: a full table refuses every new
                // migration, and the counter says how many.
                if m.untracked.get() == 1 {
                    error!(resource = id, "the monitor's table of timelines is full: new migrations are not followed");
                }
            }
        }
    }

    fn anomaly(&self, inner: &mut Inner, kind: &'static str, id: &str, source: Source, at: DateTime<Utc>) {
        if self.config.recent_anomalies == 0 {
            return;
        }
        if inner.anomalies.len() == self.config.recent_anomalies {
            inner.anomalies.pop_front();
        }
        inner.anomalies.push_back(Anomaly { kind, id: id.to_owned(), at, source });
    }
}
