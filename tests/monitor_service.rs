//! The monitor over the reference service's store: migrations driven through the HTTP
//! contract (in process, `oneshot`) appear in its timelines, and a service that
//! under-declares its convergence delay is caught by a monitor told the real one.
//! Also the `lockprobe monitor` command's flag handling.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use lockprobe::app::monitor::{run, run_on, MonitorCommand};
use lockprobe::app::usage::UsageError;
use lockprobe::clock::{Clock, ManualClock};
use lockprobe::monitor::{http, Monitor, MonitorConfig, Outcome};
use lockprobe::service::{self, Fault, ItemStores, ServiceConfig};
use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
use lockprobe::store::LocationStore;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

const KEY: &str = "test-key";
const S: Duration = Duration::from_secs(1);

struct Setup {
    clock: Arc<ManualClock>,
    app: Router,
    monitor: Arc<Monitor>,
}

/// One service instance (2 s cache + 1 s replication = 3 s declared) and a monitor told
/// the real 3 s delay and a 1 s buffer.
fn setup(faults: Vec<Fault>) -> Setup {
    let clock = Arc::new(ManualClock::at_epoch());
    let store: Arc<dyn LocationStore> = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    let config = ServiceConfig { cache_ttls: vec![2 * S], replication_bound: S, faults, ..ServiceConfig::new(KEY) };
    let dyn_clock: Arc<dyn Clock> = clock.clone();
    let instance =
        service::instance(0, Arc::new(config), store.clone(), dyn_clock.clone(), Arc::new(ItemStores::default()))
            .unwrap();
    let monitor_config =
        MonitorConfig { escalation_buffer: S, declared_delay: Some(3 * S), lapse_grace: S, ..MonitorConfig::default() };
    let monitor = Arc::new(Monitor::new(store, dyn_clock, monitor_config, &prometheus::Registry::new()).unwrap());
    Setup { clock, app: service::router(instance), monitor }
}

async fn call(
    app: &Router,
    method: Method,
    path: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(path).header(header::AUTHORIZATION, format!("Bearer {KEY}"));
    if let Some(t) = token {
        req = req.header("Lock-Token", t);
    }
    let req = match body {
        Some(b) => req.header(header::CONTENT_TYPE, "application/json").body(Body::from(b.to_string())).unwrap(),
        None => req.body(Body::empty()).unwrap(),
    };
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Pre-lock, wait `wait` seconds, hardDelete, write, swap: what an orchestrator does.
async fn migrate(s: &Setup, id: &str, wait: u64) -> String {
    let base = format!("/v1/resources/{id}/lock");
    let (st, lock) = call(
        &s.app,
        Method::POST,
        &base,
        Some(json!({"owner": "orch", "durationSeconds": 60, "targetLocation": "northeurope"})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{lock}");
    let token = lock["token"].as_str().unwrap().to_owned();
    s.monitor.drain().await.unwrap();
    s.clock.advance(S * wait as u32);
    let esc = format!("{base}/escalate");
    let (st, body) = call(
        &s.app,
        Method::POST,
        &esc,
        Some(json!({"token": token, "phase": "hardDelete", "durationSeconds": 30})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    s.monitor.drain().await.unwrap();
    s.clock.advance(5 * S);
    let (st, _) =
        call(&s.app, Method::POST, &esc, Some(json!({"token": token, "phase": "write", "durationSeconds": 30})), None)
            .await;
    assert_eq!(st, StatusCode::OK);
    s.monitor.drain().await.unwrap();
    s.clock.advance(2 * S);
    let (st, body) = call(
        &s.app,
        Method::POST,
        &format!("{base}/swap"),
        Some(json!({"token": token, "targetLocation": "northeurope"})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    s.monitor.drain().await.unwrap();
    token
}

#[tokio::test]
async fn a_migration_through_the_service_appears_in_the_monitor() {
    let s = setup(Vec::new());
    let token = migrate(&s, "res-1", 4).await;
    assert_eq!(s.monitor.outcomes(Outcome::Swapped), 1);
    assert_eq!(s.monitor.early_escalations(), 0);

    // An abandoned pre-lock through the same API lapses into an orphan.
    let (st, _) =
        call(&s.app, Method::POST, "/v1/resources/res-2/lock", Some(json!({"owner": "o", "durationSeconds": 5})), None)
            .await;
    assert_eq!(st, StatusCode::CREATED);
    s.monitor.drain().await.unwrap();
    s.clock.advance(20 * S);
    s.monitor.sweep();
    assert_eq!(s.monitor.orphan_ids(10), ["res-2"]);

    let resp = http::router(s.monitor.clone())
        .oneshot(Request::get(http::STATUS_PATH).body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    let status: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status["migrations"]["swapped"], 1);
    assert_eq!(status["migrations"]["lapsed"], 1);
    assert_eq!(status["orphanIds"], json!(["res-2"]));
    assert_eq!(status["phaseDurationSeconds"]["write"]["p50"], 2.0);
    assert_eq!(status["escalationIntervalSeconds"]["max"], 4.0);
    assert!(!String::from_utf8_lossy(&body).contains(&token), "no token in the status API");
}

#[tokio::test]
async fn a_service_that_under_declares_is_caught() {
    // The faulty service declares only its 1 s replication bound; the orchestrator waits
    // that + the 1 s buffer, which the service allows, but the real delay is 3 s.
    let s = setup(vec![Fault::UnderDeclareConvergence]);
    migrate(&s, "res-1", 2).await;
    assert_eq!(s.monitor.early_escalations(), 1);
    assert_eq!(s.monitor.outcomes(Outcome::Swapped), 1);
}

#[derive(Debug, clap::Parser)]
struct Cli {
    #[command(flatten)]
    cmd: MonitorCommand,
}

fn parse(args: &[&str]) -> MonitorCommand {
    <Cli as clap::Parser>::try_parse_from(std::iter::once("lockprobe").chain(args.iter().copied())).unwrap().cmd
}

#[tokio::test]
async fn the_command_refuses_bad_flags_as_usage_errors() {
    let err = run(parse(&["--store", "cosmos"]), CancellationToken::new()).await.unwrap_err();
    assert!(err.downcast_ref::<UsageError>().is_some_and(|e| e.0.contains("--cosmos-endpoint")), "{err}");
    let err = run(parse(&["--store", "cosmos", "--monitor-scan-interval", "0s"]), CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(
        err.downcast_ref::<UsageError>().map(|e| e.0.as_str()),
        Some("--monitor-scan-interval: must be positive")
    );
    // The command never watches an empty store of its own.
    let err = run(parse(&[]), CancellationToken::new()).await.unwrap_err();
    assert!(err.downcast_ref::<UsageError>().is_some_and(|e| e.0.starts_with("--store: ")), "{err}");
}

#[tokio::test]
async fn the_command_serves_status_and_metrics_on_memory_and_stops_on_shutdown() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run_on(parse(&["--monitor-poll-interval", "10ms"]), listener, shutdown.clone()));

    // The listener is bound already, so the first request waits for the server
    // instead of racing its start.
    let http = reqwest::Client::new();
    let status: Value = http.get(format!("{base}{}", http::STATUS_PATH)).send().await.unwrap().json().await.unwrap();
    assert_eq!((status["inFlight"].as_u64(), status["orphanedLocks"].as_u64()), (Some(0), Some(0)), "{status}");
    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("lockprobe_monitor_orphaned_locks{source=\"fleet\"} 0"), "{metrics}");

    shutdown.cancel();
    tokio::time::timeout(10 * S, task).await.expect("stops").unwrap().unwrap();
}

/// `lockprobe monitor` alone answers `/healthz` at once and `/readyz` once it has read the
/// store in full: 503 before its first scan, 200 after.
#[tokio::test]
async fn the_monitor_alone_has_health_and_readiness() {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::at_epoch());
    let store: Arc<dyn LocationStore> = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    let registry = prometheus::Registry::new();
    let monitor = Arc::new(Monitor::new(store, clock, MonitorConfig::default(), &registry).unwrap());
    let app = http::health_router(monitor.clone());
    let get = |path: &'static str| {
        let app = app.clone();
        async move { app.oneshot(Request::builder().uri(path).body(Body::empty()).unwrap()).await.unwrap().status() }
    };
    assert_eq!(get("/healthz").await, StatusCode::OK);
    assert_eq!(get("/readyz").await, StatusCode::SERVICE_UNAVAILABLE, "no scan yet");
    monitor.scan_once().await.unwrap();
    assert_eq!(get("/readyz").await, StatusCode::OK);

    // And the command serves them.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run_on(parse(&["--monitor-poll-interval", "10ms"]), listener, shutdown.clone()));
    let http = reqwest::Client::new();
    assert_eq!(http.get(format!("{base}/healthz")).send().await.unwrap().status(), reqwest::StatusCode::OK);
    let mut ready = false;
    for _ in 0..100 {
        if http.get(format!("{base}/readyz")).send().await.unwrap().status() == reqwest::StatusCode::OK {
            ready = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(ready, "the first scan runs at start, so the monitor becomes ready");
    shutdown.cancel();
    tokio::time::timeout(10 * S, task).await.expect("stops").unwrap().unwrap();
}

/// A force-release through the service's admin routes (contract 1.4) is counted apart
/// from releases and lapses, on the metric the alert watches, in the status document and
/// among the recent anomalies.
#[tokio::test]
async fn a_force_release_through_the_service_is_counted_apart() {
    use lockprobe::service::AdminPrincipal;

    let clock = Arc::new(ManualClock::at_epoch());
    let store: Arc<dyn LocationStore> = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    let admins = [("alice", "alice-admin-key-00001"), ("bob", "bob-admin-key-000002")];
    let config = ServiceConfig {
        cache_ttls: vec![2 * S],
        replication_bound: S,
        admin_principals: admins
            .iter()
            .map(|(name, key)| AdminPrincipal { name: (*name).into(), key: (*key).into(), prefixes: vec![] })
            .collect(),
        ..ServiceConfig::new(KEY)
    };
    let dyn_clock: Arc<dyn Clock> = clock.clone();
    let instance =
        service::instance(0, Arc::new(config), store.clone(), dyn_clock.clone(), Arc::new(ItemStores::default()))
            .unwrap();
    let app = service::router(instance);
    let registry = prometheus::Registry::new();
    let monitor = Arc::new(Monitor::new(store, dyn_clock, MonitorConfig::default(), &registry).unwrap());
    let admin = |method: Method, path: String, key: &str| {
        let req = Request::builder().method(method).uri(path).header(header::AUTHORIZATION, format!("Bearer {key}"));
        let req = req.header(header::CONTENT_TYPE, "application/json");
        (app.clone(), req)
    };
    let send = |(app, req): (Router, axum::http::request::Builder), body: Value| async move {
        let resp = app.oneshot(req.body(Body::from(body.to_string())).unwrap()).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
        (status, serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null))
    };

    let (st, _) = call(
        &app,
        Method::POST,
        "/v1/resources/res-9/lock",
        Some(json!({"owner": "lost", "durationSeconds": 600})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    monitor.drain().await.unwrap();
    clock.advance(5 * S);
    let path = "/v1/resources/res-9/lock/force-release".to_owned();
    let (_, view) = send(admin(Method::GET, path.clone(), admins[0].1), Value::Null).await;
    let body = json!({"lockFingerprint": view["lock"]["fingerprint"], "phase": "preLock", "reason": "journal lost"});
    let (st, requested) = send(admin(Method::POST, path.clone(), admins[0].1), body).await;
    assert_eq!(st, StatusCode::CREATED, "{requested}");
    let request = requested["request"]["id"].as_str().unwrap();
    let (st, approved) = send(admin(Method::POST, format!("{path}/{request}/approve"), admins[1].1), Value::Null).await;
    assert_eq!(st, StatusCode::OK, "{approved}");
    monitor.drain().await.unwrap();

    assert_eq!(monitor.outcomes(Outcome::ForceReleased), 1);
    assert_eq!(monitor.outcomes(Outcome::Released), 0);
    let status = monitor.status();
    assert_eq!((status.force_releases, status.migrations.force_released), (1, 1));
    assert!(status.recent_anomalies.iter().any(|a| a.kind == "force_release" && a.resource == "res-9"));
    let text = prometheus::TextEncoder::new().encode_to_string(&registry.gather()).unwrap();
    assert!(text.contains("lockprobe_monitor_force_releases_total{source=\"fleet\"} 1"), "{text}");
}
