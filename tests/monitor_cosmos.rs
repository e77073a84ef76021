//! The monitor over the Cosmos DB store (local test server), watching migrations the
//! reference service drives over HTTP: through the `_ts` poll and through the
//! latest-version change feed.
//!
//! Everything runs on the real clock: Cosmos stamps commits (`_ts`) with the server's
//! real time, and a pre-lock starts no earlier than its commit, so a manual clock
//! could not be kept in step with it. The durations are seconds.

#[path = "support/cosmos_server.rs"]
mod cosmos_server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lockprobe::clock::{Clock, SystemClock};
use lockprobe::monitor::{Monitor, MonitorConfig, Outcome};
use lockprobe::service::{start, ServiceConfig};
use lockprobe::store::LocationStore;
use prometheus::{Encoder, Registry};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use cosmos_server::CosmosServer;

const KEY: &str = "test-key";
const S: Duration = Duration::from_secs(1);

async fn post(http: &reqwest::Client, url: &str, body: Value) -> (StatusCode, Value) {
    let resp = http.post(url).bearer_auth(KEY).json(&body).send().await.unwrap();
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Sleeps until the instant a lock view shows as `effectiveAt` (real time).
async fn until_effective(view: &Value) {
    let at = chrono::DateTime::parse_from_rfc3339(view["effectiveAt"].as_str().unwrap()).unwrap().to_utc();
    let wait = (at - SystemClock.now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(50)).await;
}

async fn watch_a_service_driven_migration(change_stream: &str) {
    let server = CosmosServer::start();
    let store: Arc<dyn LocationStore> = Arc::new(
        cosmos_server::connect_with(&server.endpoint(), &Registry::new(), |a| {
            a.change_stream = clap::ValueEnum::from_str(change_stream, false).unwrap()
        })
        .await,
    );
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    // 500 ms cache + 500 ms replication: declared 1 s.
    let config = ServiceConfig { cache_ttls: vec![S / 2], replication_bound: S / 2, ..ServiceConfig::new(KEY) };
    let shutdown = CancellationToken::new();
    let listen = vec!["127.0.0.1:0".parse::<SocketAddr>().unwrap()];
    let running = start(config, store.clone(), clock.clone(), listen, shutdown.clone()).await.unwrap();
    let base = format!("http://{}", running.addrs[0]);
    let http = reqwest::Client::new();

    let monitor_config = MonitorConfig {
        escalation_buffer: Duration::ZERO,
        declared_delay: Some(S),
        lapse_grace: S,
        ..MonitorConfig::default()
    };
    let monitor = Monitor::new(store, clock, monitor_config, &Registry::new()).unwrap();

    // One migration: pre-lock, wait until it is effective, hardDelete, write, swap.
    let lock = format!("{base}/v1/resources/res-1/lock");
    let (st, pre) =
        post(&http, &lock, json!({"owner": "orch", "durationSeconds": 60, "targetLocation": "northeurope"})).await;
    assert_eq!(st, StatusCode::CREATED, "{pre}");
    let token = pre["token"].as_str().unwrap().to_owned();
    monitor.drain().await.unwrap();
    assert_eq!(monitor.in_flight(), 1, "{change_stream}: the pre-lock arrived");
    until_effective(&pre).await;
    let esc = format!("{lock}/escalate");
    assert_eq!(
        post(&http, &esc, json!({"token": token, "phase": "hardDelete", "durationSeconds": 30})).await.0,
        StatusCode::OK
    );
    monitor.drain().await.unwrap();
    tokio::time::sleep(S).await;
    assert_eq!(
        post(&http, &esc, json!({"token": token, "phase": "write", "durationSeconds": 30})).await.0,
        StatusCode::OK
    );
    monitor.drain().await.unwrap();
    let (st, body) =
        post(&http, &format!("{lock}/swap"), json!({"token": token, "targetLocation": "northeurope"})).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    monitor.drain().await.unwrap();

    // A second resource: a pre-lock nobody comes back to.
    let (st, gone) =
        post(&http, &format!("{base}/v1/resources/res-2/lock"), json!({"owner": "gone", "durationSeconds": 1})).await;
    assert_eq!(st, StatusCode::CREATED);
    let lapses = chrono::DateTime::parse_from_rfc3339(gone["expiresAt"].as_str().unwrap()).unwrap().to_utc();
    let wait = (lapses - SystemClock.now()).to_std().unwrap_or_default() + 2 * S;
    tokio::time::sleep(wait).await;
    monitor.scan_once().await.unwrap();

    assert_eq!(monitor.outcomes(Outcome::Swapped), 1, "{change_stream}");
    assert_eq!(monitor.early_escalations(), 0, "{change_stream}");
    assert_eq!(monitor.partial_cutovers(), 0, "{change_stream}");
    assert_eq!(monitor.orphan_ids(10), ["res-2"], "{change_stream}: found by the scan");
    let status = monitor.status();
    let interval = status.escalation_interval_seconds.max.unwrap();
    assert!(interval >= 1.0, "the escalation waited at least the declared delay: {status:?}");
    assert!(status.phase_duration_seconds.write.max.is_some(), "{status:?}");
    assert!(!serde_json::to_string(&status).unwrap().contains(&token));
    shutdown.cancel();
    running.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_follows_cosmos_through_the_ts_poll() {
    watch_a_service_driven_migration("poll").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_follows_cosmos_through_the_change_feed() {
    watch_a_service_driven_migration("change-feed").await;
}

/// A document the library cannot read (a newer library's format, or none at all) must
/// not blind the monitor on Cosmos DB: the stream (poll or change feed) and every scan
/// page go on past it, it is counted and listed, and a readable version brings it back.
async fn see_past_documents_it_cannot_read(change_stream: &str) {
    let server = CosmosServer::start();
    let database = cosmos_server::unique_database("monitor-unreadable");
    let mut args = cosmos_server::test_args(&server.endpoint(), &database);
    args.change_stream = clap::ValueEnum::from_str(change_stream, false).unwrap();
    let store: Arc<dyn LocationStore> = Arc::new(
        lockprobe::store::cosmos::CosmosStore::connect(cosmos_server::config_from(&args), &Registry::new())
            .await
            .expect("connects to the local cosmos server"),
    );
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let config = ServiceConfig { cache_ttls: vec![S / 2], replication_bound: S / 2, ..ServiceConfig::new(KEY) };
    let shutdown = CancellationToken::new();
    let listen = vec!["127.0.0.1:0".parse::<SocketAddr>().unwrap()];
    let running = start(config, store.clone(), clock.clone(), listen, shutdown.clone()).await.unwrap();
    let base = format!("http://{}", running.addrs[0]);
    let http = reqwest::Client::new();
    let registry = Registry::new();
    // Scan pages of one: a page that holds only an unreadable document must move on too.
    let monitor_config = MonitorConfig { scan_page: 1, ..MonitorConfig::default() };
    let monitor = Monitor::new(store, clock, monitor_config, &registry).unwrap();
    let pre_lock = |id: &'static str| {
        let (http, url) = (http.clone(), format!("{base}/v1/resources/{id}/lock"));
        async move {
            let (st, body) = post(&http, &url, json!({"owner": "orch", "durationSeconds": 60})).await;
            assert_eq!(st, StatusCode::CREATED, "pre-lock of {id}: {body}");
        }
    };

    pre_lock("a-res").await;
    server.upsert_raw(&database, "locations", &json!({"id": "b-newer", "schemaVersion": 99, "new": {}})).await;
    server.upsert_raw(&database, "locations", &json!({"id": "c-malformed", "schemaVersion": 1, "primary": 7})).await;
    pre_lock("d-res").await;
    drain_until(&monitor, "the pre-locks past the unreadable documents", |m| {
        m.in_flight() == 2 && m.status().unreadable_documents == 2
    })
    .await;
    let report = monitor.scan_once().await.unwrap();
    assert_eq!((report.documents, report.unreadable), (2, 2), "{change_stream}: the scan went on past them");
    let status = monitor.status();
    let listed: Vec<(&str, &str)> =
        status.unreadable.iter().map(|u| (u.resource.as_str(), u.reason.as_str())).collect();
    assert_eq!(listed, [("b-newer", "unsupported-format"), ("c-malformed", "malformed")], "{change_stream}");

    let restored = lockprobe::routing::LocationDocument::new("b-newer", "westeurope").to_json();
    server.upsert_raw(&database, "locations", &restored).await;
    drain_until(&monitor, "b-newer readable again", |m| m.status().unreadable_documents == 1).await;
    let mut text = Vec::new();
    prometheus::TextEncoder::new().encode(&registry.gather(), &mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    for line in [
        "lockprobe_monitor_store_errors_total{op=\"read_changes\"} 0",
        "lockprobe_monitor_store_errors_total{op=\"scan\"} 0",
        "lockprobe_monitor_unreadable_documents{reason=\"malformed\"} 1",
        "lockprobe_monitor_unreadable_documents{reason=\"unsupported-format\"} 0",
        "lockprobe_monitor_unreadable_documents_total{reason=\"unsupported-format\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{change_stream}: no `{line}` in\n{text}");
    }
    shutdown.cancel();
    running.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ts_poll_and_the_scan_see_past_documents_the_library_cannot_read() {
    see_past_documents_it_cannot_read("poll").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_change_feed_and_the_scan_see_past_documents_the_library_cannot_read() {
    see_past_documents_it_cannot_read("change-feed").await;
}

/// Drains the monitor until `done` holds (events reach a lagging region late).
async fn drain_until(monitor: &Monitor, what: &str, done: impl Fn(&Monitor) -> bool) {
    for _ in 0..100 {
        monitor.drain().await.unwrap();
        if done(monitor) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the monitor did not see {what}: {:?}", monitor.status());
}

/// A migration driven through the service on the two-region account, with a planned
/// failover after the pre-lock and another (back) after the hardDelete escalation. The
/// service and the monitor each hold a store of their own, as separate processes do;
/// the monitor's only reads the change stream, so its timer (1 s here) finds the moves.
async fn follow_a_migration_across_failovers(change_stream: &str) {
    let regions = CosmosServer::start_two_regions(Duration::from_millis(200));
    let database = cosmos_server::unique_database("monitor-failover");
    let connect = |refresh: Duration| {
        let mut args = cosmos_server::two_region_args(&regions, &database);
        args.change_stream = clap::ValueEnum::from_str(change_stream, false).unwrap();
        args.region_refresh_interval = refresh;
        async move {
            lockprobe::store::cosmos::CosmosStore::connect(cosmos_server::config_from(&args), &Registry::new())
                .await
                .expect("connects to the two-region account")
        }
    };
    let service_store: Arc<dyn LocationStore> = Arc::new(connect(Duration::from_secs(30)).await);
    let monitor_store = Arc::new(connect(S).await);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let config = ServiceConfig { cache_ttls: vec![S / 2], replication_bound: S / 2, ..ServiceConfig::new(KEY) };
    let shutdown = CancellationToken::new();
    let listen = vec!["127.0.0.1:0".parse::<SocketAddr>().unwrap()];
    let running = start(config, service_store, clock.clone(), listen, shutdown.clone()).await.unwrap();
    let base = format!("http://{}", running.addrs[0]);
    let http = reqwest::Client::new();
    let monitor_config = MonitorConfig {
        escalation_buffer: Duration::ZERO,
        declared_delay: Some(S),
        lapse_grace: S,
        ..MonitorConfig::default()
    };
    let watched: Arc<dyn LocationStore> = monitor_store.clone();
    let monitor = Monitor::new(watched, clock, monitor_config, &Registry::new()).unwrap();

    let lock = format!("{base}/v1/resources/res-f/lock");
    let (st, pre) =
        post(&http, &lock, json!({"owner": "orch", "durationSeconds": 60, "targetLocation": "northeurope"})).await;
    assert_eq!(st, StatusCode::CREATED, "{pre}");
    let token = pre["token"].as_str().unwrap().to_owned();
    drain_until(&monitor, "the pre-lock", |m| m.in_flight() == 1).await;

    regions.failover(cosmos_server::Failover::Planned).await;
    until_effective(&pre).await;
    let esc = format!("{lock}/escalate");
    let (st, body) = post(&http, &esc, json!({"token": token, "phase": "hardDelete", "durationSeconds": 30})).await;
    assert_eq!(st, StatusCode::OK, "{change_stream}: hardDelete after the failover: {body}");
    drain_until(&monitor, "the hardDelete escalation", |m| m.status().phase_duration_seconds.pre_lock.max.is_some())
        .await;
    assert_eq!(monitor_store.write_region(), "northeurope", "{change_stream}: the monitor's store followed");
    assert_eq!(monitor.status().store_region.as_deref(), Some("northeurope"), "and its status says so");

    regions.failover(cosmos_server::Failover::Planned).await;
    tokio::time::sleep(S).await;
    let (st, body) = post(&http, &esc, json!({"token": token, "phase": "write", "durationSeconds": 30})).await;
    assert_eq!(st, StatusCode::OK, "{change_stream}: write escalation after the failover back: {body}");
    // The change stream gives each document's latest version: seen before the swap
    // overwrites it.
    drain_until(&monitor, "the write escalation", |m| m.status().phase_duration_seconds.hard_delete.max.is_some())
        .await;
    let (st, body) =
        post(&http, &format!("{lock}/swap"), json!({"token": token, "targetLocation": "northeurope"})).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    drain_until(&monitor, "the swap", |m| m.outcomes(Outcome::Swapped) == 1).await;

    assert_eq!(monitor.early_escalations(), 0, "{change_stream}");
    assert_eq!(monitor.partial_cutovers(), 0, "{change_stream}");
    let status = monitor.status();
    assert!(status.phase_duration_seconds.write.max.is_some(), "{change_stream}: every phase seen: {status:?}");
    assert_eq!(monitor_store.write_region(), "westeurope", "{change_stream}: and followed it back");
    assert_eq!(regions.status().await.failovers.len(), 2);
    shutdown.cancel();
    running.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_follows_the_ts_poll_across_failovers() {
    follow_a_migration_across_failovers("poll").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_follows_the_change_feed_across_failovers() {
    follow_a_migration_across_failovers("change-feed").await;
}

#[derive(Debug, clap::Parser)]
struct Cli {
    #[command(flatten)]
    cmd: lockprobe::app::monitor::MonitorCommand,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockprobe_monitor_store_cosmos_watches_a_database() {
    use lockprobe::routing::lifecycle::{self, LockPolicy, PreLockRequest};
    use lockprobe::routing::{LocationDocument, LockToken};

    let server = CosmosServer::start();
    let database = cosmos_server::unique_database("monitor-cli");
    // The writer: a store on the same database, as a service would hold.
    let writer =
        cosmos_server::connect_with(&server.endpoint(), &Registry::new(), |a| a.database = Some(database.clone()))
            .await;
    // Bound here and handed over, so no other test can take the port in between.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listen = listener.local_addr().unwrap().to_string();
    std::env::set_var("LOCKPROBE_TEST_MONITOR_COSMOS_KEY", "bG9ja3Byb2Jl");
    let endpoint = server.endpoint();
    let args = [
        "lockprobe",
        "--store",
        "cosmos",
        "--monitor-poll-interval",
        "50ms",
        "--cosmos-endpoint",
        &endpoint,
        "--cosmos-key-env",
        "LOCKPROBE_TEST_MONITOR_COSMOS_KEY",
        "--cosmos-database",
        &database,
        "--cosmos-container",
        "locations",
        "--cosmos-preferred-region",
        "South Central US",
        "--cosmos-write-region",
        "South Central US",
        "--cosmos-poll-interval",
        "100ms",
    ];
    let cmd = <Cli as clap::Parser>::try_parse_from(args).unwrap().cmd;
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(lockprobe::app::monitor::run_on(cmd, listener, shutdown.clone()));

    let now = SystemClock.now();
    let policy = LockPolicy::new(60 * S, 3600 * S);
    let req = PreLockRequest { owner: "cli".into(), duration: 600 * S, target_location: None };
    let doc =
        lifecycle::pre_lock(&LocationDocument::new("res-cli", "westeurope"), &req, LockToken::generate(), &policy, now)
            .unwrap();
    writer.create(&doc).await.unwrap();

    let url = format!("http://{listen}/api/v1/monitor");
    let http = reqwest::Client::new();
    let mut seen = Value::Null;
    for _ in 0..100 {
        if let Ok(resp) = http.get(&url).send().await {
            seen = resp.json().await.unwrap_or(Value::Null);
            if seen["inFlight"] == 1 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen["inFlight"], 1, "the monitor saw the pre-lock in cosmos: {seen}");
    let metrics = http.get(format!("http://{listen}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("lockprobe_monitor_in_flight_migrations{source=\"fleet\"} 1"), "{metrics}");
    shutdown.cancel();
    tokio::time::timeout(10 * S, task).await.expect("stops").unwrap().unwrap();
}
