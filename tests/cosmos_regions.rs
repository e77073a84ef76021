//! The two-region test account (`launcher.js --regions`, docs/cosmos-regions.md): what
//! it does, shown with plain HTTP against each region's endpoint, and what the SDK
//! (through `CosmosStore`) makes of it.
//!
//! The store discovers the account's write region and follows a failover (issue 18).
//! Tests named `legacy_*` run the store with `legacy_static_write_region` (the
//! behaviour before: the write region a static setting) and show the bug the
//! discovery fixes, so the assertions of the fixed tests are shown to fail without it.

#[path = "support/cosmos_server.rs"]
mod cosmos_server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockprobe::routing::LocationDocument;
use lockprobe::store::cosmos::{CosmosConfig, CosmosStore};
use lockprobe::store::{LocationStore, ReadFrom, StoreError};
use prometheus::Registry;
use reqwest::Method;
use serde_json::{json, Value};

use cosmos_server::{
    config_from, two_region_args, unique_database, CosmosRegions, CosmosServer, Failover, RawResponse, READ_REGION,
    WRITE_REGION,
};

const CONTAINER: &str = "locations";

/// A fresh database and container, created through the write region.
async fn container(regions: &CosmosRegions) -> String {
    let database = unique_database("regions");
    regions.create_container(WRITE_REGION, &database, CONTAINER).await;
    database
}

fn doc_path(database: &str, id: &str) -> String {
    format!("dbs/{database}/colls/{CONTAINER}/docs/{id}")
}

/// The fields that make a stored version: a replica must serve the same.
fn version(doc: &Value) -> (Value, Value, Value) {
    (doc["_etag"].clone(), doc["_ts"].clone(), doc["_rid"].clone())
}

fn assert_write_forbidden(what: &str, answer: &RawResponse) {
    assert_eq!((answer.status, answer.sub_status), (403, Some(3)), "{what}: {answer:?}");
    assert_eq!(answer.body["code"], "Forbidden", "{what}: {answer:?}");
    let message = answer.body["message"].as_str().unwrap_or_default();
    assert!(message.contains("cannot be performed at this region"), "{what}: {message}");
}

/// How long a test waits for replication at a lag of zero (or lowered to zero): only a
/// safety net, since it does come, after the server's next replication pass, which can
/// take seconds on a loaded machine.
const REPLICATION_DEADLINE: Duration = Duration::from_secs(30);

/// Polls region `region` until document `id` answers `status`; returns the answer and
/// how long it took.
async fn wait_for(
    regions: &CosmosRegions,
    region: &str,
    database: &str,
    id: &str,
    status: u16,
    timeout: Duration,
) -> (RawResponse, Duration) {
    let started = Instant::now();
    loop {
        let answer = regions.read_document(region, database, CONTAINER, id).await;
        if answer.status == status {
            return (answer, started.elapsed());
        }
        assert!(
            started.elapsed() < timeout,
            "{region} did not answer {status} for {id} within {timeout:?}: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A store on the two-region account, configured as a service in the read region
/// would be: write region West Europe (static), replica reads from North Europe.
async fn store(regions: &CosmosRegions, request_timeout: Duration) -> (CosmosStore, String) {
    let (store, database, _) = store_with(regions, request_timeout, |_| {}).await;
    (store, database)
}

/// Like [`store`], after `adjust` has changed the validated settings; returns the
/// registry its metrics are on.
async fn store_with(
    regions: &CosmosRegions,
    request_timeout: Duration,
    adjust: impl FnOnce(&mut CosmosConfig),
) -> (CosmosStore, String, Registry) {
    let database = unique_database("regions-sdk");
    let mut args = two_region_args(regions, &database);
    args.request_timeout = request_timeout;
    let mut config = config_from(&args);
    adjust(&mut config);
    let registry = Registry::new();
    let store = CosmosStore::connect(config, &registry).await.expect("connects to the two-region account");
    (store, database, registry)
}

fn metrics_text(registry: &Registry) -> String {
    prometheus::TextEncoder::new().encode_to_string(&registry.gather()).expect("metrics encode")
}

fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
}

// --- the launcher, over plain HTTP ---------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_account_document_lists_the_write_region_and_both_readable_regions_on_both_endpoints() {
    let regions = CosmosServer::start_two_regions(Duration::from_secs(1));
    let (west, north) = (regions.endpoint(WRITE_REGION), regions.endpoint(READ_REGION));
    assert_ne!(west, north, "each region has its own endpoint");
    for region in [WRITE_REGION, READ_REGION] {
        let account = regions.account_document(region).await;
        assert_eq!(
            account["writableLocations"],
            json!([{"name": WRITE_REGION, "databaseAccountEndpoint": west}]),
            "{region}"
        );
        assert_eq!(
            account["readableLocations"],
            json!([
                {"name": WRITE_REGION, "databaseAccountEndpoint": west},
                {"name": READ_REGION, "databaseAccountEndpoint": north}
            ]),
            "{region}"
        );
        assert_eq!(account["enableMultipleWriteLocations"], json!(false), "{region}");
    }
    assert_eq!(
        regions.account_document(WRITE_REGION).await["id"],
        regions.account_document(READ_REGION).await["id"],
        "one account"
    );
    let status = regions.status().await;
    assert_eq!(status.write_region, WRITE_REGION);
    assert_eq!(status.replication_lag_ms, 1000);
    assert!(status.region(WRITE_REGION).accepts_writes && !status.region(READ_REGION).accepts_writes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_reach_the_read_region_only_after_the_lag_as_the_same_version() {
    let lag = Duration::from_secs(2);
    let regions = CosmosServer::start_two_regions(lag);
    let database = container(&regions).await;
    // Database and container are in both regions at once (metadata is not lagged).
    let coll = regions.raw(READ_REGION, Method::GET, &format!("dbs/{database}/colls/{CONTAINER}"), None, None).await;
    assert_eq!(coll.status, 200, "the container is in the read region at once: {coll:?}");

    // Create.
    let created = regions.create_document(WRITE_REGION, &database, CONTAINER, &json!({"id": "a", "v": 1})).await;
    assert_eq!(created.status, 201, "{created:?}");
    let committed = Instant::now();
    assert_eq!(
        regions.read_document(READ_REGION, &database, CONTAINER, "a").await.status,
        404,
        "not in the read region yet"
    );
    let status = regions.status().await;
    assert_eq!(status.region(READ_REGION).pending, 1);
    assert_eq!((status.pending[0].op.as_str(), status.pending[0].id.as_str()), ("create", "a"));
    assert_eq!(status.pending[0].etag.as_deref(), created.body["_etag"].as_str());
    let (replica, _) = wait_for(&regions, READ_REGION, &database, "a", 200, lag + Duration::from_secs(3)).await;
    let took = committed.elapsed();
    assert!(took >= lag.mul_f64(0.9), "replicated after {took:?}, the lag is {lag:?}");
    assert_eq!(
        replica.body, created.body,
        "the replica serves the version the write region committed, _etag, _ts and _rid included"
    );

    // Replace: the read region keeps serving the old version until the lag has passed.
    let replaced = regions
        .raw(WRITE_REGION, Method::PUT, &doc_path(&database, "a"), Some("a"), Some(&json!({"id": "a", "v": 2})))
        .await;
    assert_eq!(replaced.status, 200, "{replaced:?}");
    assert_ne!(version(&replaced.body).0, version(&created.body).0);
    let stale = regions.read_document(READ_REGION, &database, CONTAINER, "a").await;
    assert_eq!(version(&stale.body), version(&created.body), "within the lag the replica serves the old version");
    let started = Instant::now();
    loop {
        let now = regions.read_document(READ_REGION, &database, CONTAINER, "a").await;
        if now.body["_etag"] == replaced.body["_etag"] {
            assert_eq!(now.body, replaced.body);
            break;
        }
        assert!(started.elapsed() < lag + Duration::from_secs(3), "the replace never reached the read region: {now:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Delete.
    let deleted = regions.raw(WRITE_REGION, Method::DELETE, &doc_path(&database, "a"), Some("a"), None).await;
    assert_eq!(deleted.status, 204, "{deleted:?}");
    assert_eq!(
        regions.read_document(READ_REGION, &database, CONTAINER, "a").await.status,
        200,
        "within the lag the replica still has it"
    );
    wait_for(&regions, READ_REGION, &database, "a", 404, lag + Duration::from_secs(3)).await;
    let status = regions.status().await;
    assert_eq!(status.region(READ_REGION).applied, 3);
    assert_eq!(status.committed_seq, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lag_can_be_changed_while_writes_are_pending() {
    let regions = CosmosServer::start_two_regions(Duration::from_secs(60));
    let database = container(&regions).await;
    let created = regions.create_document(WRITE_REGION, &database, CONTAINER, &json!({"id": "slow"})).await;
    assert_eq!(created.status, 201);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(regions.read_document(READ_REGION, &database, CONTAINER, "slow").await.status, 404, "60 s behind");
    assert_eq!(regions.status().await.region(READ_REGION).pending, 1);

    // Lowering the lag releases what has waited long enough, at once.
    let status = regions.set_lag(Duration::from_millis(500)).await;
    assert_eq!(status.replication_lag_ms, 500);
    assert_eq!(status.region(READ_REGION).pending, 0, "committed 1.5 s ago, due at once at a 500 ms lag");
    assert_eq!(regions.read_document(READ_REGION, &database, CONTAINER, "slow").await.body, created.body);

    // Raising it holds new writes back again.
    regions.set_lag(Duration::from_secs(3600)).await;
    regions.create_document(WRITE_REGION, &database, CONTAINER, &json!({"id": "held"})).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(regions.read_document(READ_REGION, &database, CONTAINER, "held").await.status, 404);
    regions.set_lag(Duration::ZERO).await;
    regions.wait_replicated(REPLICATION_DEADLINE).await;
    assert_eq!(regions.read_document(READ_REGION, &database, CONTAINER, "held").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_region_refuses_every_write_with_403_sub_status_3() {
    let regions = CosmosServer::start_two_regions(Duration::ZERO);
    let database = container(&regions).await;
    let created = regions.create_document(WRITE_REGION, &database, CONTAINER, &json!({"id": "w", "v": 1})).await;
    regions.wait_replicated(REPLICATION_DEADLINE).await;
    let path = doc_path(&database, "w");

    let create = regions.create_document(READ_REGION, &database, CONTAINER, &json!({"id": "n"})).await;
    assert_write_forbidden("create", &create);
    let upsert = regions.upsert_document(READ_REGION, &database, CONTAINER, &json!({"id": "w", "v": 9})).await;
    assert_write_forbidden("upsert", &upsert);
    let replace = regions.raw(READ_REGION, Method::PUT, &path, Some("w"), Some(&json!({"id": "w", "v": 9}))).await;
    assert_write_forbidden("replace", &replace);
    let patch = json!([{"op": "set", "path": "/v", "value": 9}]);
    assert_write_forbidden("patch", &regions.raw(READ_REGION, Method::PATCH, &path, Some("w"), Some(&patch)).await);
    assert_write_forbidden("delete", &regions.raw(READ_REGION, Method::DELETE, &path, Some("w"), None).await);
    assert_write_forbidden(
        "create database",
        &regions.raw(READ_REGION, Method::POST, "dbs", None, Some(&json!({"id": "x"}))).await,
    );

    // Reads and queries are served.
    let queried = regions.query_documents(READ_REGION, &database, CONTAINER, "SELECT * FROM c").await;
    assert_eq!(queried.status, 200, "{queried:?}");
    assert_eq!(queried.body["Documents"].as_array().map(Vec::len), Some(1));
    // Nothing changed anywhere.
    for region in [WRITE_REGION, READ_REGION] {
        assert_eq!(regions.read_document(region, &database, CONTAINER, "w").await.body, created.body, "{region}");
        assert_eq!(regions.read_document(region, &database, CONTAINER, "n").await.status, 404, "{region}");
    }
    assert_eq!(regions.status().await.committed_seq, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_failover_waits_for_replication_loses_nothing_and_reverses_it() {
    let lag = Duration::from_secs(3);
    let regions = Arc::new(CosmosServer::start_two_regions(lag));
    let database = container(&regions).await;
    let before = regions.account_document(READ_REGION).await;
    let mut committed = Vec::new();
    for i in 0..3 {
        let answer = regions.create_document(WRITE_REGION, &database, CONTAINER, &json!({"id": format!("p{i}")})).await;
        assert_eq!(answer.status, 201);
        committed.push(answer.body);
    }
    let started = Instant::now();
    let failover = tokio::spawn({
        let regions = regions.clone();
        async move { regions.failover(Failover::Planned).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    // While replication catches up, no region takes writes.
    let status = regions.status().await;
    assert!(status.switching.is_some(), "{status:?}");
    assert!(status.regions.iter().all(|r| !r.accepts_writes), "{status:?}");
    assert_eq!(status.write_region, WRITE_REGION, "the switch waits for replication");
    for region in [WRITE_REGION, READ_REGION] {
        let refused = regions.create_document(region, &database, CONTAINER, &json!({"id": "during"})).await;
        assert_write_forbidden(&format!("write to {region} during a planned failover"), &refused);
    }

    let record = failover.await.unwrap();
    let took = started.elapsed();
    assert_eq!(
        (record.mode.as_str(), record.from.as_str(), record.to.as_str()),
        ("planned", WRITE_REGION, READ_REGION)
    );
    assert_eq!(record.lost_writes, 0);
    assert!(took >= lag.mul_f64(0.5), "a planned failover waits for the pending writes, took {took:?}");
    for doc in &committed {
        let id = doc["id"].as_str().unwrap();
        assert_eq!(
            &regions.read_document(READ_REGION, &database, CONTAINER, id).await.body,
            doc,
            "{id} in the new write region"
        );
    }

    // The account document changes on both endpoints.
    let (west, north) = (regions.endpoint(WRITE_REGION), regions.endpoint(READ_REGION));
    for region in [WRITE_REGION, READ_REGION] {
        let account = regions.account_document(region).await;
        assert_eq!(
            account["writableLocations"],
            json!([{"name": READ_REGION, "databaseAccountEndpoint": north}]),
            "{region}"
        );
        assert_eq!(
            account["readableLocations"],
            json!([
                {"name": READ_REGION, "databaseAccountEndpoint": north},
                {"name": WRITE_REGION, "databaseAccountEndpoint": west}
            ]),
            "{region}"
        );
        assert_ne!(account["_etag"], before["_etag"], "the account document's etag changes with its topology");
    }

    // The old write region refuses writes; the new one takes them, and replication
    // now flows the other way, after the lag.
    let refused = regions.create_document(WRITE_REGION, &database, CONTAINER, &json!({"id": "after"})).await;
    assert_write_forbidden("write to the old write region", &refused);
    let accepted = regions.create_document(READ_REGION, &database, CONTAINER, &json!({"id": "after"})).await;
    assert_eq!(accepted.status, 201, "{accepted:?}");
    assert_eq!(regions.read_document(WRITE_REGION, &database, CONTAINER, "after").await.status, 404);
    let (replica, _) = wait_for(&regions, WRITE_REGION, &database, "after", 200, lag + Duration::from_secs(3)).await;
    assert_eq!(replica.body, accepted.body);
    let status = regions.status().await;
    assert_eq!(status.write_region, READ_REGION);
    assert_eq!(status.region(READ_REGION).role, "write");
    assert!(status.lost_writes.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_failover_loses_the_writes_not_yet_replicated() {
    let regions = CosmosServer::start_two_regions(Duration::ZERO);
    let database = container(&regions).await;
    let kept = regions.create_document(WRITE_REGION, &database, CONTAINER, &json!({"id": "kept", "v": 1})).await;
    regions.wait_replicated(REPLICATION_DEADLINE).await;

    // Beyond any bound: these two never reach the read region before the failover.
    regions.set_lag(Duration::from_secs(3600)).await;
    let lost = regions.create_document(WRITE_REGION, &database, CONTAINER, &json!({"id": "lost"})).await;
    assert_eq!(lost.status, 201, "acknowledged by the write region");
    let update = regions
        .raw(
            WRITE_REGION,
            Method::PUT,
            &doc_path(&database, "kept"),
            Some("kept"),
            Some(&json!({"id": "kept", "v": 2})),
        )
        .await;
    assert_eq!(update.status, 200, "acknowledged by the write region");

    let started = Instant::now();
    let record = regions.failover(Failover::Forced).await;
    // Waiting would take the hour of lag; a minute is only the loaded machine's slack.
    assert!(started.elapsed() < Duration::from_secs(60), "a forced failover does not wait");
    assert_eq!((record.mode.as_str(), record.to.as_str(), record.lost_writes), ("forced", READ_REGION, 2));
    let status = regions.status().await;
    let named: Vec<(&str, &str, Option<&str>)> =
        status.lost_writes.iter().map(|w| (w.op.as_str(), w.id.as_str(), w.etag.as_deref())).collect();
    assert_eq!(
        named,
        [("create", "lost", lost.body["_etag"].as_str()), ("replace", "kept", update.body["_etag"].as_str())],
        "the status names every lost write"
    );

    // Both regions now hold the new write region's history: the lost writes are gone
    // everywhere (the old write region is re-seeded, as a region coming back is).
    for region in [WRITE_REGION, READ_REGION] {
        assert_eq!(regions.read_document(region, &database, CONTAINER, "lost").await.status, 404, "{region}");
        assert_eq!(regions.read_document(region, &database, CONTAINER, "kept").await.body, kept.body, "{region}");
    }
    assert_write_forbidden(
        "write to the old write region",
        &regions.create_document(WRITE_REGION, &database, CONTAINER, &json!({"id": "x"})).await,
    );
    let accepted = regions.create_document(READ_REGION, &database, CONTAINER, &json!({"id": "x"})).await;
    assert_eq!(accepted.status, 201, "{accepted:?}");
}

// --- what the SDK makes of it --------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_routes_replica_reads_to_the_read_region_and_sees_the_lag() {
    let regions = CosmosServer::start_two_regions(Duration::from_secs(2));
    let (store, database) = store(&regions, Duration::from_secs(10)).await;
    let doc = LocationDocument::new("s1", "westeurope");
    let committed = store.create(&doc).await.expect("create through the write region");

    assert_eq!(store.read("s1", ReadFrom::Replica).await, Err(StoreError::NotFound), "North Europe has not got it yet");
    let fresh = store.read("s1", ReadFrom::WriteRegion).await.expect("the write region has it");
    assert_eq!(fresh.etag, committed.etag);

    regions.wait_replicated(REPLICATION_DEADLINE).await;
    let replica = store.read("s1", ReadFrom::Replica).await.expect("replicated");
    assert_eq!(
        (replica.etag, replica.committed_at, replica.doc),
        (committed.etag.clone(), committed.committed_at, doc)
    );
    let raw = regions.read_document(READ_REGION, &database, CONTAINER, "s1").await;
    assert_eq!(
        raw.body["_etag"].as_str(),
        Some(committed.etag.0.as_str()),
        "the SDK read it from North Europe's endpoint"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_follows_a_failover_for_writes_after_one_403_3() {
    let regions = CosmosServer::start_two_regions(Duration::ZERO);
    let (store, database) = store(&regions, Duration::from_secs(10)).await;
    store.create(&LocationDocument::new("f0", "westeurope")).await.unwrap();
    regions.failover(Failover::Planned).await;

    // The SDK still believes West Europe is the write region: its first attempt gets
    // 403/3, it re-reads the account document and retries in North Europe, although
    // the store's write client lists North Europe in its excluded regions.
    let started = Instant::now();
    let committed = store
        .create(&LocationDocument::new("f1", "westeurope"))
        .await
        .expect("the SDK retries in the new write region");
    eprintln!("first write after the failover took {:?}", started.elapsed());
    let raw = regions.read_document(READ_REGION, &database, CONTAINER, "f1").await;
    assert_eq!(raw.body["_etag"].as_str(), Some(committed.etag.0.as_str()), "committed in North Europe");
    regions.wait_replicated(REPLICATION_DEADLINE).await;
    let back = regions.read_document(WRITE_REGION, &database, CONTAINER, "f1").await;
    assert_eq!(back.body, raw.body, "and replicated back to West Europe");
}

/// The scenario of the bug issue 18 fixes: a failover, then a write that lands in the
/// new write region, then write-region reads. Returns (the read of `b1`, the read of
/// `b2`, the etags written, the etag of the first version).
async fn write_after_a_failover_then_read(
    regions: &CosmosRegions,
    store: &CosmosStore,
    database: &str,
) -> (Result<lockprobe::store::Versioned, StoreError>, Result<lockprobe::store::Versioned, StoreError>, (String, String))
{
    let v1 = LocationDocument::new("b1", "westeurope");
    let e1 = store.create(&v1).await.unwrap().etag;
    regions.failover(Failover::Planned).await;
    regions.set_lag(Duration::from_secs(3600)).await;
    let mut v2 = v1.clone();
    v2.primary.location = "northeurope".into();
    let e2 = store.replace(&v2, &e1).await.expect("the write follows the failover").etag;
    let created = store.create(&LocationDocument::new("b2", "westeurope")).await.expect("so does a create");
    assert_eq!(
        regions.read_document(READ_REGION, database, CONTAINER, "b1").await.body["_etag"].as_str(),
        Some(e2.0.as_str()),
        "committed in the new write region"
    );
    let b1 = store.read("b1", ReadFrom::WriteRegion).await;
    let b2 = store.read("b2", ReadFrom::WriteRegion).await;
    (b1, b2, (e2.0, created.etag.0))
}

/// Issue 18: after a failover, the first write the SDK commits in the new write region
/// tells the store the account moved; it looks the account up and its write-region
/// reads (lock decisions, read-through) go to the new write region from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_write_region_reads_follow_the_new_write_region() {
    let regions = CosmosServer::start_two_regions(Duration::ZERO);
    let (store, database, registry) = store_with(&regions, Duration::from_secs(10), |_| {}).await;
    assert_eq!(store.write_region(), "westeurope");
    let (b1, b2, (e2, created)) = write_after_a_failover_then_read(&regions, &store, &database).await;
    assert_eq!(store.write_region(), "northeurope", "the store found the new write region");
    assert_eq!(b1.expect("b1 in the new write region").etag.0, e2, "the read saw the write just made");
    assert_eq!(b2.expect("b2 in the new write region").etag.0, created);
    let text = metrics_text(&registry);
    assert_eq!(sample(&text, "lockprobe_cosmos_failovers_total"), 1.0);
    assert_eq!(sample(&text, "lockprobe_cosmos_write_region{region=\"northeurope\"}"), 1.0);
    assert_eq!(sample(&text, "lockprobe_cosmos_write_region{region=\"westeurope\"}"), 0.0);
    assert_eq!(
        sample(&text, "lockprobe_cosmos_write_region_mismatch"),
        1.0,
        "--cosmos-write-region said West Europe: reported, not followed"
    );
    assert!(
        sample(&text, "lockprobe_cosmos_write_region_refreshes_total{outcome=\"changed\",reason=\"write_elsewhere\"}")
            >= 1.0
    );
}

/// The same scenario with the write region a static setting (the behaviour before
/// issue 18): write-region reads keep going to the old region, now a lagging replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_static_write_region_reads_the_old_region_after_a_failover() {
    let regions = CosmosServer::start_two_regions(Duration::ZERO);
    let (store, database, _) =
        store_with(&regions, Duration::from_secs(10), |c| c.legacy_static_write_region = true).await;
    let (b1, b2, (e2, created)) = write_after_a_failover_then_read(&regions, &store, &database).await;
    assert_eq!(store.write_region(), "westeurope");
    let b1 = b1.unwrap();
    assert_ne!(b1.etag.0, e2, "the old version, from the old region");
    assert_eq!(b1.doc.primary.location, "westeurope");
    assert_eq!(b2, Err(StoreError::NotFound), "the new document is not found");
    // A lock mutation decided on that read is refused (412) for as long as the old
    // region lags; the replica client, preferring North Europe, sees the truth.
    assert_eq!(store.replace(&b1.doc, &b1.etag).await, Err(StoreError::PreconditionFailed));
    assert_eq!(store.read("b2", ReadFrom::Replica).await.unwrap().etag.0, created);
}

/// A store that only reads gets no write-path signal: its timer finds the new write
/// region. Until then it reads the old region, which keeps receiving the new write
/// region's writes at the replication lag (the safety argument in docs/cosmos.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_only_reads_finds_the_new_write_region_on_its_timer() {
    let regions = CosmosServer::start_two_regions(Duration::ZERO);
    let refresh = Duration::from_secs(1);
    let (store, database, registry) =
        store_with(&regions, Duration::from_secs(5), |c| c.region_refresh_interval = refresh).await;
    regions.failover(Failover::Planned).await;
    regions.set_lag(Duration::from_secs(3600)).await;
    let written = regions
        .create_document(
            READ_REGION,
            &database,
            CONTAINER,
            &json!({
                "id": "t1", "schemaVersion": 1, "migrating": false, "secondary": null,
                "primary": {"location": "northeurope", "lock": null}
            }),
        )
        .await;
    assert_eq!(written.status, 201, "{written:?}");
    let started = Instant::now();
    loop {
        let believed = store.write_region();
        match store.read("t1", ReadFrom::WriteRegion).await {
            Ok(found) => {
                assert_eq!(found.etag.0, written.body["_etag"].as_str().unwrap());
                break;
            }
            Err(StoreError::NotFound) => {
                assert_eq!(believed, "westeurope", "not found only while the old region is believed");
            }
            Err(other) => panic!("{other:?}"),
        }
        // Only a safety net: the timer fires every second, but its refresh (a call to
        // the local server) can take seconds on a loaded machine; the metric below shows
        // it was the timer that found the region.
        assert!(started.elapsed() < refresh * 30, "the timer did not find the new write region");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(store.write_region(), "northeurope");
    let text = metrics_text(&registry);
    assert_eq!(
        sample(&text, "lockprobe_cosmos_write_region_refreshes_total{outcome=\"changed\",reason=\"timer\"}"),
        1.0
    );
}

/// `--cosmos-write-region` is an expectation: a wrong one is reported, and the store
/// reads the account's real write region.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_write_region_expectation_is_reported_and_not_followed() {
    let regions = CosmosServer::start_two_regions(Duration::from_secs(3600));
    let (store, _, registry) =
        store_with(&regions, Duration::from_secs(5), |c| c.write_region = Some(READ_REGION.into())).await;
    assert_eq!(store.write_region(), "westeurope");
    assert_eq!(sample(&metrics_text(&registry), "lockprobe_cosmos_write_region_mismatch"), 1.0);
    let committed = store.create(&LocationDocument::new("x1", "westeurope")).await.unwrap();
    let read =
        store.read("x1", ReadFrom::WriteRegion).await.expect("read in West Europe, not the lagging North Europe");
    assert_eq!(read.etag, committed.etag);

    let (_, _, registry) = store_with(&regions, Duration::from_secs(5), |c| c.write_region = None).await;
    assert_eq!(
        sample(&metrics_text(&registry), "lockprobe_cosmos_write_region_mismatch"),
        0.0,
        "no expectation, no mismatch"
    );
}

/// What the SDK does with a write while a planned failover drains: every region
/// answers 403/3, the SDK re-reads the account (still West Europe) and retries with
/// backoff until the store's request timeout cuts it off. The store calls that an
/// unknown outcome (408/20008), though every attempt was refused and nothing was
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_during_a_planned_failover_times_out_as_an_unknown_outcome_and_writes_nothing() {
    let regions = Arc::new(CosmosServer::start_two_regions(Duration::from_secs(6)));
    let (store, database) = store(&regions, Duration::from_secs(2)).await;
    store.create(&LocationDocument::new("d0", "westeurope")).await.unwrap();
    let failover = tokio::spawn({
        let regions = regions.clone();
        async move { regions.failover(Failover::Planned).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(regions.status().await.switching.is_some());

    let started = Instant::now();
    let result = store.create(&LocationDocument::new("d1", "westeurope")).await;
    let took = started.elapsed();
    assert!(
        matches!(&result, Err(StoreError::OutcomeUnknown(reason)) if reason.contains("408")),
        "{result:?} after {took:?}"
    );
    assert!(took < Duration::from_secs(4), "cut off by the 2 s request timeout, took {took:?}");
    let record = failover.await.unwrap();
    assert_eq!(record.lost_writes, 0);
    for region in [WRITE_REGION, READ_REGION] {
        assert_eq!(
            regions.read_document(region, &database, CONTAINER, "d1").await.status,
            404,
            "{region}: nothing was written"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_failover_loses_a_write_the_store_saw_committed() {
    let regions = CosmosServer::start_two_regions(Duration::from_secs(3600));
    let (store, database) = store(&regions, Duration::from_secs(10)).await;
    let acknowledged = store.create(&LocationDocument::new("l1", "westeurope")).await.expect("acknowledged");
    regions.failover(Failover::Forced).await;

    assert_eq!(store.read("l1", ReadFrom::Replica).await, Err(StoreError::NotFound));
    assert_eq!(store.read("l1", ReadFrom::WriteRegion).await, Err(StoreError::NotFound));
    let status = regions.status().await;
    assert_eq!(status.lost_writes.len(), 1);
    assert_eq!((status.lost_writes[0].db.as_str(), status.lost_writes[0].id.as_str()), (database.as_str(), "l1"));
    assert_eq!(status.lost_writes[0].etag.as_deref(), Some(acknowledged.etag.0.as_str()));
}

/// The service shows its store's region in `Server-Timing`, and the probe's client
/// notes when an instance's region changes: a failover is reported as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_reports_its_store_region_and_the_probe_sees_it_change() {
    use lockprobe::clock::{Clock, SystemClock};
    use lockprobe::probe::TargetClient;
    use lockprobe::service::{start, ServiceConfig};
    use tokio_util::sync::CancellationToken;

    let regions = CosmosServer::start_two_regions(Duration::ZERO);
    let (store, _) = store(&regions, Duration::from_secs(10)).await;
    let store: Arc<dyn LocationStore> = Arc::new(store);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let shutdown = CancellationToken::new();
    let listen = vec!["127.0.0.1:0".parse().unwrap()];
    let running = start(ServiceConfig::new("k"), store, clock, listen, shutdown.clone()).await.unwrap();
    let base = format!("http://{}", running.addrs[0]);
    let probe = TargetClient::new(&[base], "k", "probe-", Duration::from_secs(10)).unwrap();

    let first = probe.write(0, "probe-r1", "a", &json!(1)).await.unwrap();
    assert_eq!(first.store_region.as_deref(), Some("westeurope"), "{first:?}");
    regions.failover(Failover::Planned).await;
    // Item writes only read the routing document; the pre-lock writes it, and that
    // write, committed in the new write region, makes the service's store look.
    let key = lockprobe::probe::CallKey::fresh();
    let second = probe.pre_lock(0, "probe-r1", "probe", Duration::from_secs(5), None, key).await.unwrap();
    let third = probe.read(0, "probe-r1", "a").await.unwrap();
    assert!(second.status == 201 && third.status == 200, "{second:?} {third:?}");
    assert_eq!(third.store_region.as_deref(), Some("northeurope"));
    assert_eq!(probe.store_region_changes(), 1, "{:?}", probe.store_regions());
    shutdown.cancel();
    running.wait().await;
}

/// `validate` against a service whose Cosmos account fails over in the middle of the
/// cycle: the cycle passes or fails, and its report names the failover it saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_during_a_failover_names_it_in_its_report() {
    use lockprobe::clock::{Clock, SystemClock};
    use lockprobe::probe::CycleResult;
    use lockprobe::probe::PrintObserver;
    use lockprobe::probe::{validate, ValidateOptions};
    use lockprobe::service::{start, ServiceConfig};
    use tokio_util::sync::CancellationToken;

    let regions = Arc::new(CosmosServer::start_two_regions(Duration::from_millis(200)));
    let (store, _) = store(&regions, Duration::from_secs(10)).await;
    let store: Arc<dyn LocationStore> = Arc::new(store);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let half = Duration::from_millis(500);
    let config = ServiceConfig { cache_ttls: vec![half], replication_bound: half, ..ServiceConfig::new("k") };
    let shutdown = CancellationToken::new();
    let listen = vec!["127.0.0.1:0".parse().unwrap()];
    let running = start(config, store, clock, listen, shutdown.clone()).await.unwrap();
    let options = ValidateOptions {
        endpoints: vec![format!("http://{}", running.addrs[0])],
        expect_convergence: None,
        buffer: Duration::from_millis(200),
        test_prefix: "probe-".into(),
        api_key: "k".into(),
        state_file: None,
        ..ValidateOptions::default()
    };
    let failover = tokio::spawn({
        let regions = regions.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            regions.failover(Failover::Planned).await
        }
    });
    let report = validate(&options, Arc::new(PrintObserver::default()), CancellationToken::new()).await.unwrap();
    failover.await.unwrap();
    println!(
        "validate during a failover: {} ({} assertions, {} failed); notes: {:?}",
        report.result.as_str(),
        report.assertions.len(),
        report.failed_assertions(),
        report.notes
    );
    let named =
        report.notes.iter().any(|n| n.contains("store region changed") && n.contains("westeurope -> northeurope"));
    assert!(named, "the report names the failover: {:?}", report.notes);
    assert_eq!(report.store_region_changes.len(), 1, "{:?}", report.store_region_changes);
    assert!(
        matches!(report.result, CycleResult::Passed | CycleResult::Failed),
        "{:?}: {:?}",
        report.result,
        report.error
    );
    shutdown.cancel();
    running.wait().await;
}
