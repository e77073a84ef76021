//! Prometheus metrics of the Cosmos store, registered on a registry the caller owns.
//!
//! Labels are bounded: `op` is one of the store's six calls (plus `setup`), `outcome`
//! one of the [`StoreError`](crate::store::StoreError) kinds or `ok`.

use std::time::Duration;

use prometheus::{CounterVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

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
        Ok(Self { request_charge, requests, duration })
    }

    /// Registers the metrics on `registry`.
    pub fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.request_charge.clone()))?;
        registry.register(Box::new(self.requests.clone()))?;
        registry.register(Box::new(self.duration.clone()))
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
