//! One load run: a population of resources served by several service instances over
//! one store, user operations at a set rate on every instance, and a fraction of the
//! resources migrating through the whole lifecycle, all through the service's real
//! handlers (`tower::ServiceExt::oneshot` on each instance's router: no sockets).
//!
//! Store calls are counted by the store itself ([`CountingStore`]), separately for the
//! user operations and the orchestration (each has its own instance and so its own
//! counting wrapper over the shared store), so the reads charged to user operations are
//! exactly the reads user operations made.
//!
//! The size of every version the orchestration writes is counted by lock phase
//! (`super::sizes`), in front of its counting wrapper: in the embedded design the
//! routing documents carrying the lock, in the record design the lock records and the
//! routing documents' moves after a swap (unlocked).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use futures::StreamExt;
use hdrhistogram::Histogram;
use rand::Rng;
use serde_json::{json, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use super::measure;
use super::sizes::{DocumentSizes, SizeTable};
use crate::clock::{Clock, SystemClock};
use crate::document::LocationDocument;
use crate::routing::CommitObserver;
use crate::service::ItemStores;
use crate::service::{instance, instance_observed, router, LockDesign, ServiceConfig};
use crate::store::counting::{CountingStore, StoreCounts};
use crate::store::LocationStore;

/// The two locations resources move between.
const LOCATIONS: [&str; 2] = ["westeurope", "northeurope"];
const KEY: &str = "bench-key";

/// What one run does.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Where locks live.
    pub design: LockDesign,
    /// Fraction of the resources migrating at any moment.
    pub migrating: f64,
    /// Number of resources.
    pub resources: usize,
    /// Service instances (each with its own routing client and cache).
    pub instances: usize,
    /// User operations per second on each instance.
    pub rate: f64,
    /// Measured time (after the warm-up).
    pub duration: Duration,
    /// Load before measuring starts (caches fill, migrations spread out).
    pub warmup: Duration,
    /// The routing cache's TTL (one tier).
    pub cache_ttl: Duration,
    /// The store's replication bound.
    pub replication_bound: Duration,
    /// The skew margin.
    pub skew_margin: Duration,
    /// The oldest decision acted on (the swap also waits this long).
    pub max_decision_age: Duration,
    /// How long a migration holds each of the hardDelete and write phases.
    pub phase_hold: Duration,
    /// Item keys per resource.
    pub keys: usize,
    /// Prefix of this run's resource ids (unique per run on a shared store).
    pub prefix: String,
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct LoadResult {
    /// The spec's design.
    pub design: LockDesign,
    /// The spec's fraction.
    pub migrating: f64,
    /// User operations answered in the measured window.
    pub user_ops: u64,
    /// Of those, refused with 423 (a write lock).
    pub blocked: u64,
    /// Of those, failed with 5xx.
    pub errors: u64,
    /// Store calls made by user operations in the window.
    pub user_calls: StoreCounts,
    /// Store calls made by the orchestration in the window.
    pub orchestration_calls: StoreCounts,
    /// User operations over the whole run, warm-up included, every one finished.
    pub all_user_ops: u64,
    /// Store calls made by those operations: exact per-operation counts, free of
    /// operations straddling the window's edges.
    pub all_user_calls: StoreCounts,
    /// Migrations that ended in a swap within the window.
    pub migrations: u64,
    /// Migrations abandoned (a refused or failed step; released).
    pub migrations_failed: u64,
    /// User-operation latency in microseconds, from the operation's scheduled start
    /// (so a generator falling behind shows as latency, not as a lower rate).
    pub latency_us: Histogram<u64>,
    /// The measured window's wall time.
    pub wall: Duration,
    /// CPU time the process used in the window (every thread).
    pub cpu: Duration,
    /// Sizes of the versions the orchestration's lock calls wrote over the whole run
    /// (warm-up included), by lock phase.
    pub document_sizes: SizeTable,
}

#[derive(Default)]
struct Tally {
    all_ops: AtomicU64,
    ops: AtomicU64,
    blocked: AtomicU64,
    errors: AtomicU64,
    migrations: AtomicU64,
    migrations_failed: AtomicU64,
}

/// Runs `spec` over `store` (shared by every instance; a fresh one per run, or ids
/// with a fresh prefix).
pub async fn run(spec: &LoadSpec, store: Arc<dyn LocationStore>) -> anyhow::Result<LoadResult> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let config = Arc::new(ServiceConfig {
        home_location: LOCATIONS[0].into(),
        cache_ttls: vec![spec.cache_ttl],
        replication_bound: spec.replication_bound,
        skew_margin: spec.skew_margin,
        max_decision_age: spec.max_decision_age,
        max_retry_after: Duration::from_secs(1),
        max_pre_lock: Duration::from_secs(3600),
        lock_design: spec.design,
        ..ServiceConfig::new(KEY)
    });
    config.validate()?;
    let items = Arc::new(ItemStores::default());
    let user_store = CountingStore::new(store.clone());
    let orchestration_store = CountingStore::new(store.clone());
    let users: Vec<Router> = (0..spec.instances)
        .map(|i| {
            let store: Arc<dyn LocationStore> = Arc::new(user_store.clone());
            Ok(router(instance(i, config.clone(), store, clock.clone(), items.clone())?))
        })
        .collect::<anyhow::Result<_>>()?;
    let sizes = Arc::new(DocumentSizes::new());
    let orchestrator = {
        let store: Arc<dyn LocationStore> = Arc::new(orchestration_store.clone());
        let sizes = sizes.clone();
        let observer: CommitObserver = Arc::new(move |doc| sizes.record(doc));
        router(instance_observed(spec.instances, config.clone(), store, clock.clone(), items.clone(), Some(observer))?)
    };

    // The population: every resource has its routing document, old enough for the
    // replicas to have it (a real population is not brand new).
    let ids: Arc<Vec<String>> = Arc::new((0..spec.resources).map(|i| format!("{}{i}", spec.prefix)).collect());
    let created: Vec<_> = futures::stream::iter(ids.iter())
        .map(|id| {
            let store = store.clone();
            async move { store.create(&LocationDocument::new(id.clone(), LOCATIONS[0])).await }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    for outcome in created {
        match outcome {
            Ok(_) | Err(crate::store::StoreError::Conflict) => {}
            Err(e) => anyhow::bail!("creating the population: {e}"),
        }
    }
    tokio::time::sleep(spec.replication_bound).await;

    let tally = Arc::new(Tally::default());
    let histogram = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?));
    let stop = CancellationToken::new();
    let in_flight = TaskTracker::new();
    let measure_from = Instant::now() + spec.warmup;
    let end = measure_from + spec.duration;

    let migrating = ((spec.resources as f64) * spec.migrating).round() as usize;
    // About how long one migration takes: convergence, both holds, the swap's wait.
    let period = config.declared_convergence() + 2 * spec.phase_hold + spec.max_decision_age + 3 * spec.skew_margin;
    let mut tasks = Vec::new();
    for worker in 0..migrating {
        // Worker w migrates resources w, w + M, w + 2M, ...: never two at once on one.
        let own: Vec<String> = ids.iter().skip(worker).step_by(migrating).cloned().collect();
        let app = orchestrator.clone();
        let (tally, stop, hold) = (tally.clone(), stop.clone(), spec.phase_hold);
        let clock = clock.clone();
        let skew = spec.skew_margin;
        tasks.push(tokio::spawn(async move {
            // Spread the migrations over one migration's time, not all in step.
            let stagger = Duration::from_secs_f64(rand::rng().random_range(0.0..=1.0) * period.as_secs_f64());
            tokio::select! {
                _ = tokio::time::sleep(stagger) => {}
                _ = stop.cancelled() => return,
            }
            let mut next = 0;
            while !stop.is_cancelled() {
                let id = &own[next % own.len()];
                next += 1;
                let swapped = migrate(&app, id, hold, skew, clock.as_ref(), &stop).await;
                if Instant::now() >= measure_from && Instant::now() < end {
                    let counter = if swapped { &tally.migrations } else { &tally.migrations_failed };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for app in &users {
        let interval = Duration::from_secs_f64(1.0 / spec.rate.max(1e-3));
        let (app, ids, tally, histogram, stop, in_flight) =
            (app.clone(), ids.clone(), tally.clone(), histogram.clone(), stop.clone(), in_flight.clone());
        let keys = spec.keys.max(1);
        tasks.push(tokio::spawn(async move {
            let mut scheduled = Instant::now();
            while !stop.is_cancelled() {
                let now = Instant::now();
                while scheduled <= now {
                    let (index, key, kind) = {
                        let mut rng = rand::rng();
                        (rng.random_range(0..ids.len()), rng.random_range(0..keys), rng.random_range(0..100u8))
                    };
                    let request = user_request(&ids[index], key, kind);
                    let (app, tally, histogram) = (app.clone(), tally.clone(), histogram.clone());
                    let at = scheduled;
                    in_flight.spawn(async move {
                        let status = match app.oneshot(request).await {
                            Ok(response) => response.status(),
                            Err(never) => match never {},
                        };
                        tally.all_ops.fetch_add(1, Ordering::Relaxed);
                        if at < measure_from || at >= end {
                            return;
                        }
                        let took = at.elapsed();
                        tally.ops.fetch_add(1, Ordering::Relaxed);
                        if status == StatusCode::LOCKED {
                            tally.blocked.fetch_add(1, Ordering::Relaxed);
                        } else if status.is_server_error() {
                            tally.errors.fetch_add(1, Ordering::Relaxed);
                        }
                        let us = took.as_micros().clamp(1, 60_000_000) as u64;
                        let _ = histogram.lock().unwrap_or_else(std::sync::PoisonError::into_inner).record(us);
                    });
                    scheduled += interval;
                }
                tokio::time::sleep_until(scheduled).await;
            }
        }));
    }

    tokio::time::sleep_until(measure_from).await;
    let (user_before, orchestration_before) = (user_store.counts(), orchestration_store.counts());
    let cpu_before = measure::process_cpu_time();
    let started = Instant::now();
    tokio::time::sleep_until(end).await;
    let (user_after, orchestration_after) = (user_store.counts(), orchestration_store.counts());
    let cpu = measure::process_cpu_time().saturating_sub(cpu_before);
    let wall = started.elapsed();
    stop.cancel();
    for task in tasks {
        let _ = task.await;
    }
    // Every operation started finishes before the totals are read.
    in_flight.close();
    in_flight.wait().await;
    let latency_us = histogram.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    Ok(LoadResult {
        design: spec.design,
        migrating: spec.migrating,
        user_ops: tally.ops.load(Ordering::Relaxed),
        blocked: tally.blocked.load(Ordering::Relaxed),
        errors: tally.errors.load(Ordering::Relaxed),
        user_calls: user_after.since(&user_before),
        all_user_ops: tally.all_ops.load(Ordering::Relaxed),
        all_user_calls: user_store.counts(),
        orchestration_calls: orchestration_after.since(&orchestration_before),
        migrations: tally.migrations.load(Ordering::Relaxed),
        migrations_failed: tally.migrations_failed.load(Ordering::Relaxed),
        latency_us,
        wall,
        cpu,
        document_sizes: sizes.table(),
    })
}

/// A user operation: 80 % reads, 15 % writes, 5 % deletes.
fn user_request(id: &str, key: usize, kind: u8) -> Request<Body> {
    let uri = format!("/v1/resources/{id}/items/k{key}");
    let builder = Request::builder().uri(uri);
    let built = match kind {
        0..80 => builder.method("GET").body(Body::empty()),
        80..95 => builder
            .method("PUT")
            .header("content-type", "application/json")
            .body(Body::from(json!({"value": kind}).to_string())),
        _ => builder.method("DELETE").body(Body::empty()),
    };
    built.expect("a well-formed request")
}

async fn lock_call(app: &Router, method: &str, path: String, body: Value, token: Option<&str>) -> (StatusCode, Value) {
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", "application/json");
    if let Some(token) = token {
        request = request.header("lock-token", token);
    }
    let request = request.body(Body::from(body.to_string())).expect("a well-formed request");
    let response = match app.clone().oneshot(request).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap_or_default();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// One migration of `id`: pre-lock, wait for `effectiveAt`, hardDelete, write, swap to
/// the other location. A refused step releases the lock. Whether it swapped.
async fn migrate(
    app: &Router,
    id: &str,
    hold: Duration,
    skew: Duration,
    clock: &dyn Clock,
    stop: &CancellationToken,
) -> bool {
    let lock = format!("/v1/resources/{id}/lock");
    let (status, view) =
        lock_call(app, "POST", lock.clone(), json!({"owner": "bench", "durationSeconds": 600}), None).await;
    if status != StatusCode::CREATED {
        tokio::time::sleep(Duration::from_millis(50)).await;
        return false;
    }
    let token = view["token"].as_str().unwrap_or_default().to_owned();
    let from = view["location"].as_str().unwrap_or(LOCATIONS[0]);
    let to = if from == LOCATIONS[0] { LOCATIONS[1] } else { LOCATIONS[0] };
    let effective = view["effectiveAt"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&chrono::Utc));
    let wait = effective.map_or(Duration::ZERO, |at| crate::clock::span(clock.now(), at)) + skew;
    tokio::select! {
        _ = tokio::time::sleep(wait) => {}
        _ = stop.cancelled() => {}
    }
    let mut swapped = false;
    let mut ok = true;
    for phase in ["hardDelete", "write"] {
        let body = json!({"token": token, "phase": phase, "durationSeconds": 60});
        let (status, _) = lock_call(app, "POST", format!("{lock}/escalate"), body, None).await;
        if status != StatusCode::OK {
            ok = false;
            break;
        }
        tokio::time::sleep(hold).await;
    }
    if ok {
        let body = json!({"token": token, "targetLocation": to});
        swapped = lock_call(app, "POST", format!("{lock}/swap"), body, None).await.0 == StatusCode::OK;
    }
    if !swapped {
        // The abandoned migration's way out: release what it holds.
        lock_call(app, "DELETE", lock, Value::Null, Some(&token)).await;
    }
    swapped
}
