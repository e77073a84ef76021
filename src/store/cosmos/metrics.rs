//! Prometheus metrics of the Cosmos store, registered on a registry the caller owns.
//!
//! Labels are bounded: `op` is one of the store's six calls (plus `setup`), `outcome`
//! one of the [`StoreError`](crate::store::StoreError) kinds or `ok`; `region` one of the
//! regions the account or the configuration names; `reason` one of
//! [`Reason`](super::region::Reason)'s.

use std::time::Duration;

use azure_data_cosmos::options::Region;
use prometheus::{
    CounterVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::store::OpKind;

/// Which store call a measurement belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// One of the [`LocationStore`](crate::store::LocationStore) calls.
    Store(OpKind),
    /// Creating the database and container at start.
    Setup,
}

impl Op {
    /// Whether the call writes a document (container setup does not count: its
    /// failure is reported, never retried by a caller that needs the outcome).
    pub fn is_write(self) -> bool {
        matches!(self, Op::Store(kind) if kind.is_write())
    }

    /// The `op` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Store(kind) => kind.as_str(),
            Op::Setup => "setup",
        }
    }
}

/// The store's counters and histograms.
#[derive(Debug, Clone)]
pub struct CosmosMetrics {
    request_charge: CounterVec,
    requests: IntCounterVec,
    duration: HistogramVec,
    write_region: IntGaugeVec,
    failovers: IntCounter,
    region_refreshes: IntCounterVec,
    write_region_mismatch: IntGauge,
}

impl CosmosMetrics {
    /// Creates the metrics, not yet registered anywhere.
    pub fn new() -> Result<Self, prometheus::Error> {
        let request_charge = CounterVec::new(
            Opts::new(
                "lockprobe_cosmos_request_charge_total",
                "Request units charged by Cosmos DB for store calls, retries and query pages included.",
            ),
            &["op"],
        )?;
        let requests = IntCounterVec::new(
            Opts::new("lockprobe_cosmos_requests_total", "Cosmos store calls by operation and outcome."),
            &["op", "outcome"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new("lockprobe_cosmos_request_duration_seconds", "Wall time of Cosmos store calls.")
                .buckets(vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            &["op"],
        )?;
        let write_region = IntGaugeVec::new(
            Opts::new(
                "lockprobe_cosmos_write_region",
                "1 for the region the store reads lock decisions from and writes to (the account's write region as last discovered), 0 for the account's other regions.",
            ),
            &["region"],
        )?;
        let failovers = IntCounter::new(
            "lockprobe_cosmos_failovers_total",
            "Changes of the account's write region the store has seen and followed.",
        )?;
        let region_refreshes = IntCounterVec::new(
            Opts::new(
                "lockprobe_cosmos_write_region_refreshes_total",
                "Reads of the account document by reason (connect, timer, write_forbidden, write_elsewhere, precondition_failed) and outcome (ok, unchanged, changed, error).",
            ),
            &["reason", "outcome"],
        )?;
        let write_region_mismatch = IntGauge::new(
            "lockprobe_cosmos_write_region_mismatch",
            "1 while --cosmos-write-region is set and is not the account's write region.",
        )?;
        Ok(Self {
            request_charge,
            requests,
            duration,
            write_region,
            failovers,
            region_refreshes,
            write_region_mismatch,
        })
    }

    /// Registers the metrics on `registry`.
    pub fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.request_charge.clone()))?;
        registry.register(Box::new(self.requests.clone()))?;
        registry.register(Box::new(self.duration.clone()))?;
        registry.register(Box::new(self.write_region.clone()))?;
        registry.register(Box::new(self.failovers.clone()))?;
        registry.register(Box::new(self.region_refreshes.clone()))?;
        registry.register(Box::new(self.write_region_mismatch.clone()))
    }

    /// Marks `current` as the write region and every other known region as not.
    pub fn set_write_region(&self, current: &Region, known: &[Region]) {
        for region in known {
            self.write_region.with_label_values(&[region.as_str()]).set(i64::from(region == current));
        }
        self.write_region.with_label_values(&[current.as_str()]).set(1);
    }

    /// Counts a change of write region the store followed.
    pub fn failover_seen(&self) {
        self.failovers.inc();
    }

    /// Counts one read of the account document.
    pub fn region_refreshed(&self, reason: &'static str, outcome: &'static str) {
        self.region_refreshes.with_label_values(&[reason, outcome]).inc();
    }

    /// Sets the mismatch gauge; returns whether it changed.
    pub fn set_write_region_mismatch(&self, mismatch: bool) -> bool {
        let value = i64::from(mismatch);
        let changed = self.write_region_mismatch.get() != value;
        self.write_region_mismatch.set(value);
        changed
    }

    /// Records one finished call.
    pub fn observe(&self, op: Op, outcome: &'static str, request_charge: f64, elapsed: Duration) {
        let op = op.as_str();
        if request_charge > 0.0 && request_charge.is_finite() {
            self.request_charge.with_label_values(&[op]).inc_by(request_charge);
        } else {
            // Touch the series so an operation that costs nothing still shows up.
            self.request_charge.with_label_values(&[op]);
        }
        self.requests.with_label_values(&[op, outcome]).inc();
        self.duration.with_label_values(&[op]).observe(elapsed.as_secs_f64());
    }
}
