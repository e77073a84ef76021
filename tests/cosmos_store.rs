//! Cosmos store behaviour beyond the shared conformance suite: metrics, and what
//! happens when the server goes away.
//!
//! "Nothing half-written" is shown with a proxy rather than by restarting the server,
//! because the local server keeps no data across a restart: the proxy takes the live
//! server off the network, the failed calls run, the proxy heals, and the document
//! is read back unchanged from the same server. Killing the server outright is
//! covered too, for the "fails fast" half.

#[path = "support/cosmos_server.rs"]
mod cosmos_server;
#[path = "support/tcp_proxy.rs"]
mod tcp_proxy;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockprobe::clock::SystemClock;
use lockprobe::routing::cache::TieredCache;
use lockprobe::routing::{ClientOptions, LocationDocument, LockPolicy, PreLockRequest, RoutingClient, RoutingError};
use lockprobe::store::cosmos::CosmosStore;
use lockprobe::store::{ChangeCursor, LocationStore, ReadFrom, StoreError};
use prometheus::{Encoder, Registry, TextEncoder};

use cosmos_server::{config_from, test_args, unique_database, CosmosServer};
use tcp_proxy::TcpProxy;

/// The deadline the outage tests configure; a failing call may take this plus slack.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
const SLACK: Duration = Duration::from_secs(2);

fn render(registry: &Registry) -> String {
    let mut out = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
}

async fn store_at(endpoint: &str) -> CosmosStore {
    let mut args = test_args(endpoint, &unique_database("outage"));
    args.request_timeout = REQUEST_TIMEOUT;
    CosmosStore::connect(config_from(&args), &Registry::new()).await.expect("connects")
}

fn routing_client(store: Arc<dyn LocationStore>) -> RoutingClient {
    RoutingClient::new(
        store,
        Arc::new(SystemClock),
        TieredCache::try_new(&[Duration::from_secs(1)]).unwrap(),
        LockPolicy::new(Duration::from_secs(1), Duration::from_secs(60)),
        ClientOptions::default(),
    )
}

fn pre_lock_request() -> PreLockRequest {
    PreLockRequest { owner: "outage-test".into(), duration: Duration::from_secs(30), target_location: None }
}

/// Runs `call`, requires `Unavailable`, and that it came back within the deadline.
async fn assert_unavailable_fast<T: std::fmt::Debug>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) {
    let started = Instant::now();
    let result = call.await;
    let took = started.elapsed();
    assert!(matches!(result, Err(StoreError::Unavailable(_))), "{what}: expected Unavailable, got {result:?}");
    assert!(took <= REQUEST_TIMEOUT + SLACK, "{what}: took {took:?}, the deadline is {REQUEST_TIMEOUT:?}");
    eprintln!("{what}: unavailable after {took:?}");
}

/// Runs a write whose request may have left before the connection broke: the store
/// cannot tell whether it was applied, so `OutcomeUnknown` is as right as `Unavailable`
/// (the test then checks that nothing was applied). Within the deadline either way.
async fn assert_write_failed_fast<T: std::fmt::Debug>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) {
    let started = Instant::now();
    let result = call.await;
    let took = started.elapsed();
    assert!(
        matches!(result, Err(StoreError::Unavailable(_) | StoreError::OutcomeUnknown(_))),
        "{what}: expected a failure, got {result:?}"
    );
    assert!(took <= REQUEST_TIMEOUT + SLACK, "{what}: took {took:?}, the deadline is {REQUEST_TIMEOUT:?}");
    eprintln!("{what}: {result:?} after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_charge_and_outcomes_are_recorded_per_operation() {
    let server = CosmosServer::start();
    let registry = Registry::new();
    let store = cosmos_server::connect(&server.endpoint(), &registry).await;

    let doc = LocationDocument::new("m1", "westeurope");
    let etag = store.create(&doc).await.unwrap().etag;
    store.read("m1", ReadFrom::WriteRegion).await.unwrap();
    store.read("m1", ReadFrom::Replica).await.unwrap();
    store.replace(&doc, &etag).await.unwrap();
    assert_eq!(store.replace(&doc, &etag).await, Err(StoreError::PreconditionFailed));
    assert_eq!(store.read("missing", ReadFrom::WriteRegion).await, Err(StoreError::NotFound));
    store.scan(None, 10).await.unwrap();
    store.read_changes(&ChangeCursor::beginning(), 10).await.unwrap();

    let text = render(&registry);
    // The local server charges 1 RU per request; real Cosmos DB charges more.
    for op in ["create", "read_write_region", "read_replica", "scan", "read_changes"] {
        let charged = sample(&text, &format!("lockprobe_cosmos_request_charge_total{{op=\"{op}\"}}"));
        assert!(charged >= 1.0, "{op} charged {charged}");
    }
    // Two replaces (one refused) and two write-region reads (one missing) are each charged.
    assert!(sample(&text, "lockprobe_cosmos_request_charge_total{op=\"replace\"}") >= 2.0);
    assert!(sample(&text, "lockprobe_cosmos_request_charge_total{op=\"read_write_region\"}") >= 2.0);
    assert_eq!(sample(&text, "lockprobe_cosmos_requests_total{op=\"replace\",outcome=\"ok\"}"), 1.0);
    assert_eq!(sample(&text, "lockprobe_cosmos_requests_total{op=\"replace\",outcome=\"precondition_failed\"}"), 1.0);
    assert_eq!(sample(&text, "lockprobe_cosmos_requests_total{op=\"read_write_region\",outcome=\"not_found\"}"), 1.0);
    assert_eq!(sample(&text, "lockprobe_cosmos_request_duration_seconds_count{op=\"create\"}"), 1.0);
    // Creating the database and the container at connect time.
    assert!(sample(&text, "lockprobe_cosmos_request_charge_total{op=\"setup\"}") >= 2.0);
    assert!(!text.contains("m1"), "resource ids must not become label values");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_makes_every_call_unavailable_within_the_deadline() {
    let mut server = CosmosServer::start();
    let store = Arc::new(store_at(&server.endpoint()).await);
    let doc = LocationDocument::new("o1", "westeurope");
    let etag = store.create(&doc).await.unwrap().etag;
    assert_eq!(store.read("o1", ReadFrom::WriteRegion).await.unwrap().etag, etag);

    server.stop();

    assert_unavailable_fast("read from the write region", store.read("o1", ReadFrom::WriteRegion)).await;
    assert_unavailable_fast("read from a replica", store.read("o1", ReadFrom::Replica)).await;
    assert_unavailable_fast("create", store.create(&LocationDocument::new("o2", "westeurope"))).await;
    assert_unavailable_fast("replace", store.replace(&doc, &etag)).await;
    assert_unavailable_fast("scan", store.scan(None, 10)).await;
    assert_unavailable_fast("read_changes", store.read_changes(&ChangeCursor::beginning(), 10)).await;

    let started = Instant::now();
    let result = routing_client(store.clone()).pre_lock("o1", &pre_lock_request()).await;
    assert!(matches!(result, Err(RoutingError::Unavailable(_))), "pre-lock: {result:?}");
    assert!(started.elapsed() <= REQUEST_TIMEOUT + SLACK, "pre-lock took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_writes_during_a_partition_change_nothing_and_the_store_recovers() {
    let server = CosmosServer::start();
    let mut proxy = TcpProxy::start(([127, 0, 0, 1], server.port()).into()).await;
    let store = Arc::new(store_at(&format!("http://127.0.0.1:{}/", proxy.port())).await);

    let v1 = LocationDocument::new("p1", "westeurope");
    let e1 = store.create(&v1).await.unwrap().etag;
    let mut v2 = v1.clone();
    v2.primary.location = "northeurope".into();
    let e2 = store.replace(&v2, &e1).await.unwrap().etag;

    proxy.cut().await;
    let mut v3 = v2.clone();
    v3.primary.location = "eastus".into();
    assert_write_failed_fast("replace during the partition", store.replace(&v3, &e2)).await;
    assert_write_failed_fast("create during the partition", store.create(&LocationDocument::new("p2", "westeurope")))
        .await;
    let pre_lock = routing_client(store.clone()).pre_lock("p1", &pre_lock_request()).await;
    assert!(matches!(pre_lock, Err(RoutingError::Unavailable(_))), "pre-lock during the partition: {pre_lock:?}");

    proxy.heal().await;
    // Same server, same data: every failed write left no trace.
    let after = store.read("p1", ReadFrom::WriteRegion).await.expect("the store recovers without a restart");
    assert_eq!((&after.doc, &after.etag), (&v2, &e2), "a failed write must not change the document");
    assert!(after.doc.primary.lock.is_none(), "the failed pre-lock left no lock");
    assert_eq!(
        store.read("p2", ReadFrom::WriteRegion).await,
        Err(StoreError::NotFound),
        "the failed create left no document"
    );
    // And the ETag read before the partition is still the one that wins.
    store.replace(&v3, &e2).await.expect("the pre-partition etag still matches");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_is_cut_off_by_the_request_timeout() {
    let server = CosmosServer::start();
    let mut proxy = TcpProxy::start(([127, 0, 0, 1], server.port()).into()).await;
    let store = store_at(&format!("http://127.0.0.1:{}/", proxy.port())).await;
    let doc = LocationDocument::new("h1", "westeurope");
    let etag = store.create(&doc).await.unwrap().etag;

    proxy.stall().await;
    let started = Instant::now();
    let (read, replace) = tokio::join!(store.read("h1", ReadFrom::WriteRegion), store.replace(&doc, &etag));
    let took = started.elapsed();
    assert!(matches!(read, Err(StoreError::Unavailable(_))), "read from a hung server: {read:?}");
    // The replace was sent and never answered: it may have been applied.
    assert!(matches!(replace, Err(StoreError::OutcomeUnknown(_))), "replace to a hung server: {replace:?}");
    assert!(took >= REQUEST_TIMEOUT.mul_f64(0.9), "gave up after {took:?}, before the deadline");
    assert!(took <= REQUEST_TIMEOUT + SLACK, "took {took:?}, the deadline is {REQUEST_TIMEOUT:?}");
    eprintln!("hung server: unavailable after {took:?}: {read:?}");

    proxy.heal().await;
    assert_eq!(store.read("h1", ReadFrom::WriteRegion).await.unwrap().etag, etag, "the stalled replace wrote nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_an_unreachable_server_fails_and_can_be_retried_with_the_same_registry() {
    // A cut proxy rather than a stopped server: the port stays held by the test, so
    // nothing else can start listening there, and the retry reaches the same endpoint.
    let server = CosmosServer::start();
    let mut proxy = TcpProxy::start(([127, 0, 0, 1], server.port()).into()).await;
    let endpoint = format!("http://127.0.0.1:{}/", proxy.port());
    proxy.cut().await;
    let registry = Registry::new();
    let mut args = test_args(&endpoint, &unique_database("down"));
    args.request_timeout = Duration::from_secs(2);
    let started = Instant::now();
    let err = CosmosStore::connect(config_from(&args), &registry).await.expect_err("nothing answers there");
    assert!(started.elapsed() <= REQUEST_TIMEOUT + SLACK, "connect took {:?}", started.elapsed());
    eprintln!("connect to an unreachable server: {err}");
    assert!(render(&registry).is_empty(), "a failed connect registers nothing");

    proxy.heal().await;
    let store = CosmosStore::connect(config_from(&args), &registry).await;
    store.expect("the same registry can be used once the server is reachable");
    assert!(render(&registry).contains("lockprobe_cosmos_request_charge_total"));
}

/// A stand-in for an Entra ID credential: hands out a fixed token and counts requests
/// (the local server checks no signature, so this shows the plumbing, not Entra).
#[derive(Debug, Default)]
struct StaticToken {
    requests: std::sync::atomic::AtomicUsize,
    scopes: std::sync::Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl azure_core::credentials::TokenCredential for StaticToken {
    async fn get_token(
        &self,
        scopes: &[&str],
        _options: Option<azure_core::credentials::TokenRequestOptions<'_>>,
    ) -> azure_core::Result<azure_core::credentials::AccessToken> {
        self.requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.scopes.lock().unwrap().extend(scopes.iter().map(|s| s.to_string()));
        let expires = azure_core::time::OffsetDateTime::now_utc() + azure_core::time::Duration::hours(1);
        Ok(azure_core::credentials::AccessToken::new("static-test-token", expires))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_credential_can_stand_in_for_the_key() {
    let server = CosmosServer::start();
    let credential = Arc::new(StaticToken::default());
    let mut config = config_from(&test_args(&server.endpoint(), &unique_database("entra")));
    config.auth = lockprobe::store::cosmos::CosmosAuth::Entra(credential.clone());
    let store = CosmosStore::connect(config, &Registry::new()).await.expect("connects with a token credential");
    let etag = store.create(&LocationDocument::new("t1", "westeurope")).await.unwrap().etag;
    assert_eq!(store.read("t1", ReadFrom::Replica).await.unwrap().etag, etag);
    assert!(
        credential.requests.load(std::sync::atomic::Ordering::Relaxed) >= 1,
        "the SDK asked the credential for a token"
    );
    let scopes = credential.scopes.lock().unwrap().clone();
    assert!(scopes.iter().any(|s| s.ends_with("/.default")), "token scopes: {scopes:?}");
}
