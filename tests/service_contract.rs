//! The reference service over real HTTP on loopback: every row of the probe contract.
//!
//! Every test runs against both lock designs (`embedded`, the default, and `record`,
//! the lock-record baseline): the contract is the same, and where the designs differ
//! (how soon another instance sees a lock) the test says what each must do.
//!
//! Time is a manual clock shared by the store and every instance, so leases lapse and
//! caches expire when a test says so, without sleeping.

#[path = "support/stores.rs"]
mod stores;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lockprobe::clock::ManualClock;
use lockprobe::document::lock_record_id;
use lockprobe::routing::lifecycle::DEFAULT_SKEW_MARGIN;
use lockprobe::service::{start, Fault, LockDesign, ServiceConfig};
use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
use lockprobe::store::OpKind;
use lockprobe::store::{LocationStore, ReadFrom};
use lockprobe::testing::FaultAction;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const KEY: &str = "test-key";
const TTL: Duration = Duration::from_secs(2);
const BOUND: Duration = Duration::from_secs(1);
/// From a pre-lock to the instant it may be escalated: the declared delay and the skew margin.
const CONVERGED: Duration =
    Duration::from_millis(TTL.as_millis() as u64 + BOUND.as_millis() as u64 + DEFAULT_SKEW_MARGIN.as_millis() as u64);

struct Harness {
    design: LockDesign,
    clock: Arc<ManualClock>,
    store: stores::Instrumented,
    urls: Vec<String>,
    http: reqwest::Client,
    shutdown: CancellationToken,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn harness_with(design: LockDesign, faults: Vec<Fault>, instances: usize) -> Harness {
    let clock = Arc::new(ManualClock::at_epoch());
    let store =
        stores::Instrumented::new(clock.clone(), MemoryStoreConfig { replica_lag: BOUND, ..Default::default() });
    let config = ServiceConfig {
        cache_ttls: vec![Duration::from_millis(500), TTL],
        replication_bound: BOUND,
        test_prefix: Some("probe-".into()),
        max_pre_lock: Duration::from_secs(3600),
        max_body_bytes: 4096,
        faults,
        lock_design: design,
        ..ServiceConfig::new(KEY)
    };
    let shutdown = CancellationToken::new();
    let listen = vec!["127.0.0.1:0".parse::<SocketAddr>().unwrap(); instances];
    let running = start(config, store.store(), clock.clone(), listen, shutdown.clone()).await.unwrap();
    let urls = running.addrs.iter().map(|a| format!("http://{a}")).collect();
    Harness { design, clock, store, urls, http: reqwest::Client::new(), shutdown }
}

async fn harness(design: LockDesign) -> Harness {
    harness_with(design, Vec::new(), 2).await
}

struct Answer {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Answer {
    fn problem_type(&self) -> &str {
        self.body["type"].as_str().unwrap_or("<none>")
    }

    fn source(&self) -> String {
        let timing = self.headers.get("server-timing").expect("Server-Timing on every routed answer").to_str().unwrap();
        timing.split("desc=\"").nth(1).and_then(|s| s.split('"').next()).unwrap().to_owned()
    }
}

impl Harness {
    async fn call(
        &self,
        instance: usize,
        method: Method,
        path: &str,
        body: Option<Value>,
        auth: Option<&str>,
    ) -> Answer {
        let mut req = self.http.request(method, format!("{}{path}", self.urls[instance]));
        if let Some(key) = auth {
            req = req.bearer_auth(key);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap();
        let body =
            if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
        if status.is_client_error() || status.is_server_error() {
            assert_eq!(headers.get("content-type").unwrap(), "application/problem+json", "{status} {body}");
        }
        // Contract 1.2: every answer, refusals and unknown routes included, names its versions.
        let named = |h: &str| headers.get(h).map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(
            named("lockprobe-contract").as_deref(),
            Some(lockprobe::versions::CONTRACT_VERSION),
            "{status} {path}"
        );
        assert_eq!(
            named("lockprobe-library").as_deref(),
            Some(lockprobe::versions::LIBRARY_VERSION),
            "{status} {path}"
        );
        Answer { status, headers, body }
    }

    async fn lock(&self, i: usize, id: &str, suffix: &str, body: Value) -> Answer {
        self.call(i, Method::POST, &format!("/v1/resources/{id}/lock{suffix}"), Some(body), Some(KEY)).await
    }

    async fn pre_lock(&self, id: &str, seconds: f64) -> Answer {
        self.lock(0, id, "", json!({"owner": "test", "durationSeconds": seconds})).await
    }

    async fn escalate(&self, id: &str, token: &str, phase: &str, seconds: f64) -> Answer {
        self.lock(0, id, "/escalate", json!({"token": token, "phase": phase, "durationSeconds": seconds})).await
    }

    async fn swap(&self, id: &str, token: &str, target: &str) -> Answer {
        self.lock(0, id, "/swap", json!({"token": token, "targetLocation": target})).await
    }

    async fn release(&self, id: &str, token: Option<&str>) -> Answer {
        let mut req = self.http.delete(format!("{}/v1/resources/{id}/lock", self.urls[0])).bearer_auth(KEY);
        if let Some(t) = token {
            req = req.header("Lock-Token", t);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap();
        Answer { status, headers, body: serde_json::from_str(&text).unwrap_or(Value::Null) }
    }

    async fn route(&self, i: usize, id: &str) -> Answer {
        self.call(i, Method::GET, &format!("/v1/resources/{id}/route"), None, None).await
    }

    async fn read(&self, i: usize, id: &str, key: &str) -> Answer {
        self.call(i, Method::GET, &format!("/v1/resources/{id}/items/{key}"), None, None).await
    }

    async fn write(&self, i: usize, id: &str, key: &str, value: Value) -> Answer {
        self.call(i, Method::PUT, &format!("/v1/resources/{id}/items/{key}"), Some(json!({"value": value})), None).await
    }

    async fn delete(&self, i: usize, id: &str, key: &str) -> Answer {
        self.call(i, Method::DELETE, &format!("/v1/resources/{id}/items/{key}"), None, None).await
    }

    /// Pre-lock, wait out convergence, escalate to hardDelete then write; returns the token.
    async fn to_write_lock(&self, id: &str, write_seconds: f64) -> String {
        let pre = self.pre_lock(id, 600.0).await;
        assert_eq!(pre.status, StatusCode::CREATED, "{}", pre.body);
        let token = pre.body["token"].as_str().unwrap().to_owned();
        self.clock.advance(CONVERGED);
        assert_eq!(self.escalate(id, &token, "hardDelete", 60.0).await.status, StatusCode::OK);
        assert_eq!(self.escalate(id, &token, "write", write_seconds).await.status, StatusCode::OK);
        token
    }

    /// The versions of the documents this design keeps for `id` (the routing document
    /// and, in the record design, its lock record); `None` when there are none.
    async fn etag(&self, id: &str) -> Option<String> {
        let mut ids = vec![id.to_owned()];
        if self.design == LockDesign::Record {
            ids.push(lock_record_id(id));
        }
        let mut etags = Vec::new();
        for doc in ids {
            if let Ok(v) = self.store.memory.read(&doc, ReadFrom::WriteRegion).await {
                etags.push(v.etag.0);
            }
        }
        (!etags.is_empty()).then(|| etags.join(" "))
    }
}

async fn pre_lock_returns_the_lock_view_with_the_declared_convergence(design: LockDesign) {
    let h = harness(design).await;
    let a = h.pre_lock("probe-a", 300.0).await;
    assert_eq!(a.status, StatusCode::CREATED);
    let v = &a.body;
    assert_eq!(v["phase"], "preLock");
    assert_eq!(v["owner"], "test");
    assert_eq!(v["location"], "westeurope");
    assert_eq!(v["convergenceDelaySeconds"], json!(3.0));
    assert_eq!(v["renewals"], 0);
    assert_eq!(v["token"].as_str().unwrap().len(), 32);
    for field in ["acquiredAt", "effectiveAt", "expiresAt", "preLockExpiresAt", "maxExpiresAt"] {
        assert!(chrono::DateTime::parse_from_rfc3339(v[field].as_str().unwrap()).is_ok(), "{field}");
    }
    assert!(v.as_object().unwrap().contains_key("targetLocation"));
    // The route view shows the lock but never the token.
    let route = h.route(0, "probe-a").await;
    assert_eq!(route.body["lock"]["phase"], "preLock");
    assert!(!route.body.to_string().contains(v["token"].as_str().unwrap()));
}

async fn lock_api_needs_credentials_and_a_test_resource(design: LockDesign) {
    let h = harness(design).await;
    let body = json!({"owner": "x", "durationSeconds": 10});
    let none = h.call(0, Method::POST, "/v1/resources/probe-a/lock", Some(body.clone()), None).await;
    assert_eq!((none.status, none.problem_type()), (StatusCode::UNAUTHORIZED, "urn:lockprobe:error:unauthorized"));
    let wrong = h.call(0, Method::POST, "/v1/resources/probe-a/lock", Some(body.clone()), Some("nope")).await;
    assert_eq!((wrong.status, wrong.problem_type()), (StatusCode::FORBIDDEN, "urn:lockprobe:error:forbidden"));
    let outside = h.call(0, Method::POST, "/v1/resources/user-42/lock", Some(body), Some(KEY)).await;
    assert_eq!(
        (outside.status, outside.problem_type()),
        (StatusCode::FORBIDDEN, "urn:lockprobe:error:not-test-resource")
    );
    assert_eq!(h.etag("probe-a").await, None, "refused calls create nothing");
    assert_eq!(h.etag("user-42").await, None);
}

async fn every_lock_refusal_has_its_type(design: LockDesign) {
    let h = harness(design).await;
    let token = h.pre_lock("probe-a", 300.0).await.body["token"].as_str().unwrap().to_owned();

    let held = h.pre_lock("probe-a", 300.0).await;
    assert_eq!((held.status, held.problem_type()), (StatusCode::LOCKED, "urn:lockprobe:error:lock-held"));
    assert!(held.headers.get("retry-after").is_some());

    let mismatch = h.escalate("probe-a", "0123456789abcdef0123456789abcdef", "hardDelete", 10.0).await;
    assert_eq!(
        (mismatch.status, mismatch.problem_type()),
        (StatusCode::CONFLICT, "urn:lockprobe:error:token-mismatch")
    );

    let early = h.escalate("probe-a", &token, "hardDelete", 10.0).await;
    assert_eq!((early.status, early.problem_type()), (StatusCode::CONFLICT, "urn:lockprobe:error:invalid-transition"));
    h.clock.advance(CONVERGED);
    let skip = h.escalate("probe-a", &token, "write", 10.0).await;
    assert_eq!((skip.status, skip.problem_type()), (StatusCode::CONFLICT, "urn:lockprobe:error:invalid-transition"));
    let swap_early = h.swap("probe-a", &token, "northeurope").await;
    assert_eq!(
        (swap_early.status, swap_early.problem_type()),
        (StatusCode::CONFLICT, "urn:lockprobe:error:invalid-transition")
    );

    let renew = h.lock(0, "probe-a", "/renew", json!({"token": token, "durationSeconds": 100})).await;
    assert_eq!(renew.status, StatusCode::OK);
    assert_eq!(renew.body["renewals"], 1);

    let hd = h.escalate("probe-a", &token, "hardDelete", 5.0).await;
    assert_eq!(hd.status, StatusCode::OK);
    h.clock.advance(Duration::from_secs(6));
    let expired = h.escalate("probe-a", &token, "write", 5.0).await;
    assert_eq!((expired.status, expired.problem_type()), (StatusCode::GONE, "urn:lockprobe:error:lock-expired"));
}

async fn renew_and_release_succeed_for_the_holder(design: LockDesign) {
    let h = harness(design).await;
    let token = h.pre_lock("probe-a", 60.0).await.body["token"].as_str().unwrap().to_owned();
    let renewed = h.lock(0, "probe-a", "/renew", json!({"token": token, "durationSeconds": 7200})).await;
    assert_eq!(renewed.status, StatusCode::OK);
    // Capped by the service maximum (3600 s past effectiveAt).
    assert_eq!(renewed.body["expiresAt"], renewed.body["maxExpiresAt"]);
    assert_eq!(h.release("probe-a", Some(&token)).await.status, StatusCode::NO_CONTENT);
    assert_eq!(h.route(0, "probe-a").await.body["lock"], Value::Null);
    assert_eq!(h.route(0, "probe-a").await.body["location"], "westeurope");
    let again = h.release("probe-a", Some(&token)).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
}

async fn store_failures_are_503_and_change_nothing(design: LockDesign) {
    let h = harness(design).await;
    let token = h.pre_lock("probe-a", 300.0).await.body["token"].as_str().unwrap().to_owned();
    h.clock.advance(CONVERGED);
    let before = h.etag("probe-a").await;

    h.store.inject(OpKind::Replace, FaultAction::LostRace, 100);
    let raced = h.escalate("probe-a", &token, "hardDelete", 10.0).await;
    assert_eq!(
        (raced.status, raced.problem_type()),
        (StatusCode::SERVICE_UNAVAILABLE, "urn:lockprobe:error:conflict-retry-exhausted")
    );
    h.store.clear_faults();

    h.store.inject(OpKind::ReadWriteRegion, FaultAction::Fail, 1);
    let down = h.escalate("probe-a", &token, "hardDelete", 10.0).await;
    assert_eq!(
        (down.status, down.problem_type()),
        (StatusCode::SERVICE_UNAVAILABLE, "urn:lockprobe:error:store-unavailable")
    );
    assert!(!down.body.to_string().contains("injected"), "5xx bodies stay generic");
    assert_eq!(h.etag("probe-a").await, before);

    h.store.inject(OpKind::Replace, FaultAction::Fail, 1);
    assert_eq!(h.escalate("probe-a", &token, "hardDelete", 10.0).await.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(h.etag("probe-a").await, before);
    assert_eq!(h.escalate("probe-a", &token, "hardDelete", 10.0).await.status, StatusCode::OK);
}

async fn full_lifecycle_enforces_each_phase_and_the_swap_carries_the_data(design: LockDesign) {
    let h = harness(design).await;
    let id = "probe-life";
    assert_eq!(h.write(0, id, "keep", json!("v1")).await.status, StatusCode::CREATED);
    assert_eq!(h.write(0, id, "doomed", json!("v2")).await.status, StatusCode::CREATED);
    assert_eq!(h.write(0, id, "keep", json!("v1b")).await.status, StatusCode::OK);

    // Pre-lock: nothing restricted, before or after effectiveAt.
    let token = h.pre_lock(id, 600.0).await.body["token"].as_str().unwrap().to_owned();
    assert_eq!(h.write(0, id, "k", json!(1)).await.status, StatusCode::CREATED);
    assert_eq!(h.delete(0, id, "k").await.status, StatusCode::NO_CONTENT);
    h.clock.advance(CONVERGED);
    assert_eq!(h.write(0, id, "k", json!(1)).await.status, StatusCode::CREATED);
    assert_eq!(h.delete(0, id, "k").await.status, StatusCode::NO_CONTENT);

    // hardDelete: reads and writes allowed, deletes tombstoned on every instance.
    assert_eq!(h.escalate(id, &token, "hardDelete", 60.0).await.status, StatusCode::OK);
    for i in 0..2 {
        assert_eq!(h.read(i, id, "keep").await.status, StatusCode::OK);
        assert_eq!(h.write(i, id, &format!("hd{i}"), json!(i)).await.status, StatusCode::CREATED);
    }
    let tomb = h.delete(1, id, "doomed").await;
    assert_eq!((tomb.status, tomb.body.clone()), (StatusCode::ACCEPTED, json!({"tombstone": true})));
    let read_back = h.read(0, id, "doomed").await;
    assert_eq!((read_back.status, read_back.body["tombstone"].clone()), (StatusCode::OK, json!(true)));

    // write: reads allowed; writes and deletes blocked with Retry-After.
    assert_eq!(h.escalate(id, &token, "write", 30.0).await.status, StatusCode::OK);
    for i in 0..2 {
        assert_eq!(h.read(i, id, "keep").await.status, StatusCode::OK);
        for blocked in [h.write(i, id, "keep", json!("x")).await, h.delete(i, id, "keep").await] {
            assert_eq!((blocked.status, blocked.problem_type()), (StatusCode::LOCKED, "urn:lockprobe:error:lock-held"));
            let after: u64 = blocked.headers["retry-after"].to_str().unwrap().parse().unwrap();
            assert!((1..=5).contains(&after), "Retry-After {after}");
        }
    }

    // swap: new location, no lock, everything allowed, data present, tombstone kept.
    let swapped = h.swap(id, &token, "northeurope").await;
    assert_eq!(swapped.status, StatusCode::OK, "{}", swapped.body);
    assert_eq!(swapped.body, json!({"location": "northeurope", "lock": null, "source": "store"}));
    let route = h.route(0, id).await;
    assert_eq!((route.body["location"].clone(), route.body["lock"].clone()), (json!("northeurope"), Value::Null));
    assert_eq!(h.read(0, id, "keep").await.body["value"], "v1b");
    assert_eq!(h.read(0, id, "hd1").await.body["value"], 1);
    assert_eq!(h.read(0, id, "doomed").await.body["tombstone"], true, "a tombstone is not resurrected");
    assert_eq!(h.write(0, id, "after", json!(true)).await.status, StatusCode::CREATED);
    assert_eq!(h.delete(0, id, "keep").await.status, StatusCode::NO_CONTENT);
    assert_eq!(h.read(0, id, "keep").await.status, StatusCode::NOT_FOUND);
}

async fn a_short_write_lock_lapses_by_itself_and_its_token_cannot_swap(design: LockDesign) {
    let h = harness(design).await;
    let id = "probe-lapse";
    h.write(0, id, "k", json!(1)).await;
    let token = h.to_write_lock(id, 1.0).await;
    assert_eq!(h.write(0, id, "k", json!(2)).await.status, StatusCode::LOCKED);
    h.clock.advance(Duration::from_secs(1));
    // At its end by this clock the lease may still be live by another within the skew
    // margin: the lock holds for that long too.
    assert_eq!(h.write(0, id, "k", json!(3)).await.status, StatusCode::LOCKED);
    h.clock.advance(DEFAULT_SKEW_MARGIN);
    assert_eq!(h.write(0, id, "k", json!(3)).await.status, StatusCode::OK, "writes resume without any release");
    let swap = h.swap(id, &token, "northeurope").await;
    assert_eq!((swap.status, swap.problem_type()), (StatusCode::GONE, "urn:lockprobe:error:lock-expired"));
    assert_eq!(h.route(0, id).await.body["location"], "westeurope");
}

async fn fifty_concurrent_pre_locks_give_one_winner(design: LockDesign) {
    let h = Arc::new(harness(design).await);
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let h = h.clone();
            tokio::spawn(async move {
                h.lock(i % 2, "probe-race", "", json!({"owner": format!("o{i}"), "durationSeconds": 60})).await.status
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::CREATED).count(), 1, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == StatusCode::LOCKED).count(), 49, "{statuses:?}");
}

async fn a_stale_cache_shows_the_lock_only_after_its_ttl(design: LockDesign) {
    let h = harness(design).await;
    let id = "probe-conv";
    h.write(0, id, "k", json!(1)).await;
    h.clock.advance(BOUND);
    // Instance 1 caches the unlocked document.
    assert_eq!(h.route(1, id).await.body["lock"], Value::Null);
    h.pre_lock(id, 600.0).await;
    assert_eq!(h.route(0, id).await.body["lock"]["phase"], "preLock", "the writing instance knows at once");
    h.clock.advance(TTL - Duration::from_millis(1));
    let stale = h.route(1, id).await;
    match design {
        LockDesign::Embedded => assert_eq!(stale.body["lock"], Value::Null, "stale until the TTL lapses"),
        // The lock record is read on every operation: no instance is ever stale.
        LockDesign::Record => assert_eq!(stale.body["lock"]["phase"], "preLock", "{}", stale.body),
    }
    h.clock.advance(Duration::from_millis(1));
    let converged = h.route(1, id).await;
    assert_eq!(converged.body["lock"]["phase"], "preLock", "converged within the TTL: {}", converged.body);
}

async fn under_declared_convergence_lets_a_stale_instance_delete_physically(design: LockDesign) {
    let h = harness_with(design, vec![Fault::UnderDeclareConvergence], 2).await;
    let id = "probe-under";
    h.write(0, id, "k", json!(1)).await;
    h.clock.advance(BOUND);
    assert_eq!(h.route(1, id).await.body["lock"], Value::Null);
    let pre = h.pre_lock(id, 600.0).await;
    assert_eq!(pre.body["convergenceDelaySeconds"], json!(1.0), "declares only the replication bound");
    let token = pre.body["token"].as_str().unwrap().to_owned();
    h.clock.advance(BOUND + DEFAULT_SKEW_MARGIN);
    assert_eq!(h.escalate(id, &token, "hardDelete", 60.0).await.status, StatusCode::OK);
    match design {
        LockDesign::Embedded => {
            // Instance 1 still serves its cached, unlocked document: the delete is physical.
            assert_eq!(h.delete(1, id, "k").await.status, StatusCode::NO_CONTENT);
            assert_eq!(h.read(0, id, "k").await.status, StatusCode::NOT_FOUND, "the item is lost, not tombstoned");
        }
        LockDesign::Record => {
            // Instance 1 reads the lock record itself: the under-declaration costs nothing.
            assert_eq!(h.delete(1, id, "k").await.status, StatusCode::ACCEPTED);
            assert_eq!(h.read(0, id, "k").await.body["tombstone"], true);
        }
    }
}

/// The lock-record design reads the lock record from the write region on every user
/// operation, reads, allowed writes and refused ones alike, and nothing else from the
/// write region while the routing document is cached.
#[tokio::test]
async fn record_design_reads_the_lock_record_on_every_operation() {
    let h = harness(LockDesign::Record).await;
    let id = "probe-every";
    h.write(0, id, "k", json!(1)).await;
    let before = h.store.counts();
    h.read(0, id, "k").await;
    h.write(0, id, "k", json!(2)).await;
    h.route(0, id).await;
    let reads = h.store.counts().since(&before);
    assert_eq!((reads.read_write_region, reads.read_replica), (3, 0), "one lock-record read per operation");
    let token = h.to_write_lock(id, 60.0).await;
    let before = h.store.counts();
    assert_eq!(h.write(0, id, "k", json!(3)).await.status, StatusCode::LOCKED);
    assert_eq!(h.store.counts().since(&before).read_write_region, 1);
    assert_eq!(h.swap(id, &token, "northeurope").await.status, StatusCode::OK);
}

/// After a swap, an instance whose cached routing document still names the old
/// location acts on the new one: the lock record, read on every operation, carries it.
#[tokio::test]
async fn record_design_never_acts_on_a_routing_document_that_missed_the_swap() {
    let h = harness(LockDesign::Record).await;
    let id = "probe-moved";
    h.write(0, id, "k", json!("before")).await;
    h.clock.advance(BOUND);
    assert_eq!(h.route(1, id).await.body["location"], "westeurope", "instance 1 caches the routing document");
    let token = h.to_write_lock(id, 60.0).await;
    assert_eq!(h.swap(id, &token, "northeurope").await.status, StatusCode::OK);
    let route = h.route(1, id).await;
    assert_eq!((route.body["location"].clone(), route.body["lock"].clone()), (json!("northeurope"), Value::Null));
    assert_eq!(h.write(1, id, "k", json!("after")).await.status, StatusCode::OK);
    assert_eq!(h.read(0, id, "k").await.body["value"], "after", "written where instance 0 reads: the new location");
}

/// In the record design an id that names a lock record is not a resource id.
#[tokio::test]
async fn record_design_refuses_ids_in_the_lock_record_namespace() {
    let h = harness(LockDesign::Record).await;
    let id = lock_record_id("probe-x");
    for a in [h.write(0, &id, "k", json!(1)).await, h.route(0, &id).await, h.pre_lock(&id, 10.0).await] {
        assert_eq!((a.status, a.problem_type()), (StatusCode::BAD_REQUEST, "urn:lockprobe:error:bad-request"));
    }
    assert_eq!(h.etag("probe-x").await, None);
}

async fn an_honest_declaration_refuses_that_early_escalation(design: LockDesign) {
    let h = harness(design).await;
    let id = "probe-honest";
    let pre = h.pre_lock(id, 600.0).await;
    let token = pre.body["token"].as_str().unwrap().to_owned();
    h.clock.advance(BOUND);
    assert_eq!(h.escalate(id, &token, "hardDelete", 60.0).await.status, StatusCode::CONFLICT);
}

async fn enforcement_faults_allow_what_should_be_refused(design: LockDesign) {
    let h = harness_with(design, vec![Fault::IgnoreWriteLock, Fault::IgnoreHardDeleteLock], 1).await;
    let id = "probe-faulty";
    h.write(0, id, "a", json!(1)).await;
    h.write(0, id, "b", json!(1)).await;
    let pre = h.pre_lock(id, 600.0).await;
    let token = pre.body["token"].as_str().unwrap().to_owned();
    h.clock.advance(CONVERGED);
    h.escalate(id, &token, "hardDelete", 60.0).await;
    assert_eq!(h.delete(0, id, "a").await.status, StatusCode::NO_CONTENT, "deleted physically under hardDelete");
    h.escalate(id, &token, "write", 60.0).await;
    assert_eq!(h.write(0, id, "b", json!(2)).await.status, StatusCode::OK, "written under a write lock");
}

async fn bad_input_is_400_and_changes_nothing(design: LockDesign) {
    let h = harness(design).await;
    let id = "probe-bad";
    let token = h.pre_lock(id, 600.0).await.body["token"].as_str().unwrap().to_owned();
    h.clock.advance(CONVERGED);
    let before = h.etag(id).await.unwrap();
    let raw = |path: &str, body: &'static str| {
        h.http
            .post(format!("{}{path}", h.urls[0]))
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let malformed = raw("/v1/resources/probe-bad/lock/escalate", "{\"token\": ").await.unwrap();
    assert_eq!(malformed.status(), StatusCode::BAD_REQUEST);
    let malformed: Value = malformed.json().await.unwrap();
    assert_eq!(malformed["type"], "urn:lockprobe:error:bad-request");

    let cases = [
        json!({"token": token, "phase": "frozen", "durationSeconds": 10}),
        json!({"token": token, "phase": "hardDelete", "durationSeconds": -5}),
        json!({"token": token, "phase": "hardDelete", "durationSeconds": 1e15}),
        json!({"token": token, "phase": "hardDelete", "durationSeconds": 0}),
        json!({"token": token, "phase": "hardDelete"}),
        json!({"token": "", "phase": "hardDelete", "durationSeconds": 10}),
    ];
    for body in cases {
        let a = h.lock(0, id, "/escalate", body.clone()).await;
        assert_eq!(
            (a.status, a.problem_type()),
            (StatusCode::BAD_REQUEST, "urn:lockprobe:error:bad-request"),
            "{body}"
        );
    }
    let too_long_pre = h.lock(0, "probe-other", "", json!({"owner": "x", "durationSeconds": 7200})).await;
    assert_eq!(too_long_pre.status, StatusCode::BAD_REQUEST, "over the service maximum");

    let slash = h.lock(0, "probe-a%2Fb", "", json!({"owner": "x", "durationSeconds": 10})).await;
    assert_eq!((slash.status, slash.problem_type()), (StatusCode::BAD_REQUEST, "urn:lockprobe:error:bad-request"));
    let long_id = format!("probe-{}", "x".repeat(250));
    let long = h.lock(0, &long_id, "", json!({"owner": "x", "durationSeconds": 10})).await;
    assert_eq!(long.status, StatusCode::BAD_REQUEST);
    assert_eq!(h.etag(&long_id).await, None);
    let long_key = h.write(0, id, &"k".repeat(256), json!(1)).await;
    assert_eq!(long_key.status, StatusCode::BAD_REQUEST);

    let no_token = h.release(id, None).await;
    assert_eq!(
        (no_token.status, no_token.body["type"].as_str()),
        (StatusCode::BAD_REQUEST, Some("urn:lockprobe:error:bad-request"))
    );
    let bad_write = h.call(0, Method::PUT, "/v1/resources/probe-bad/items/k", Some(json!({"nope": 1})), None).await;
    assert_eq!(bad_write.status, StatusCode::BAD_REQUEST);

    assert_eq!(h.etag(id).await.unwrap(), before, "no refused call wrote the document");
    assert_eq!(h.route(0, id).await.body["lock"]["phase"], "preLock");
}

async fn oversized_bodies_are_413(design: LockDesign) {
    let h = harness(design).await;
    let big = json!({"value": "x".repeat(10_000)});
    let a = h.call(0, Method::PUT, "/v1/resources/probe-big/items/k", Some(big), None).await;
    assert_eq!((a.status, a.problem_type()), (StatusCode::PAYLOAD_TOO_LARGE, "urn:lockprobe:error:payload-too-large"));
    assert_eq!(h.etag("probe-big").await, None);
}

async fn server_timing_tells_cache_from_read_through(design: LockDesign) {
    let h = harness(design).await;
    let id = "probe-timing";
    h.write(0, id, "k", json!(1)).await;
    assert_eq!(h.read(0, id, "k").await.source(), "cache");
    assert_eq!(h.route(0, id).await.source(), "cache");
    let token = h.pre_lock(id, 600.0).await.body["token"].as_str().unwrap().to_owned();
    assert_eq!(h.read(0, id, "k").await.source(), "cache", "a lock not yet effective is served from cache");
    h.clock.advance(CONVERGED);
    h.escalate(id, &token, "hardDelete", 60.0).await;
    let before = h.store.counts();
    for answer in [h.read(0, id, "k").await, h.route(0, id).await, h.write(0, id, "k", json!(2)).await] {
        assert_eq!(answer.source(), "read-through");
    }
    let reads = h.store.counts().since(&before);
    let expected = match design {
        LockDesign::Embedded => (3, 0),
        // Three lock-record reads, and one replica read: the routing document's cache
        // entry outlived its TTL while the lock converged (no lock in it to read through).
        LockDesign::Record => (3, 1),
    };
    assert_eq!((reads.read_write_region, reads.read_replica), expected);
    let missing = h.read(0, "probe-never", "k").await;
    assert_eq!((missing.status, missing.source()), (StatusCode::NOT_FOUND, "store".to_owned()));
}

async fn a_refused_pre_lock_of_a_new_resource_creates_no_document(design: LockDesign) {
    let h = harness(design).await;
    let over = h.lock(0, "probe-new", "", json!({"owner": "x", "durationSeconds": 7200})).await;
    assert_eq!((over.status, over.problem_type()), (StatusCode::BAD_REQUEST, "urn:lockprobe:error:bad-request"));
    let home =
        h.lock(0, "probe-new", "", json!({"owner": "x", "durationSeconds": 10, "targetLocation": "westeurope"})).await;
    assert_eq!((home.status, home.problem_type()), (StatusCode::BAD_REQUEST, "urn:lockprobe:error:bad-request"));
    assert_eq!(h.etag("probe-new").await, None, "bad input changes nothing, not even the document's existence");
    let before = h.store.counts();
    assert_eq!(h.pre_lock("probe-new", 10.0).await.status, StatusCode::CREATED);
    assert_eq!(h.store.counts().since(&before).writes(), 1, "a granted pre-lock is one write, creation included");
}

async fn lock_calls_check_credentials_before_the_body(design: LockDesign) {
    let h = harness(design).await;
    let send = |auth: Option<&'static str>| {
        let mut req = h
            .http
            .post(format!("{}/v1/resources/probe-a/lock", h.urls[0]))
            .header("content-type", "application/json")
            .body("{\"owner\": ");
        if let Some(key) = auth {
            req = req.bearer_auth(key);
        }
        req.send()
    };
    assert_eq!(send(None).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    assert_eq!(send(Some("nope")).await.unwrap().status(), StatusCode::FORBIDDEN);
    assert_eq!(send(Some(KEY)).await.unwrap().status(), StatusCode::BAD_REQUEST);
}

/// A swap refused for its target must not have copied anything there first: the copy
/// replaces the target's items, and at an old location those are the data it keeps.
async fn a_swap_to_an_undeclared_target_copies_nothing(design: LockDesign) {
    use axum::body::Body;
    use axum::http::Request;
    use lockprobe::service::ItemStores;
    use lockprobe::service::{instance, router};
    use tower::ServiceExt;

    let clock = Arc::new(ManualClock::at_epoch());
    let store: Arc<dyn LocationStore> = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    let items = Arc::new(ItemStores::default());
    let config = Arc::new(ServiceConfig {
        cache_ttls: vec![TTL],
        replication_bound: BOUND,
        lock_design: design,
        ..ServiceConfig::new(KEY)
    });
    let app = router(instance(0, config, store, clock.clone(), items.clone()).unwrap());
    let call = |method: &str, path: &str, body: Value| {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {KEY}"))
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        app.clone().oneshot(req)
    };
    let id = "probe-swap";
    items.put("eastus", id, "kept", json!("the old location's data"));
    assert_eq!(call("PUT", &format!("/v1/resources/{id}/items/k"), json!({"value": 1})).await.unwrap().status(), 201);
    let pre = call(
        "POST",
        &format!("/v1/resources/{id}/lock"),
        json!({"owner": "o", "durationSeconds": 600, "targetLocation": "northeurope"}),
    )
    .await
    .unwrap();
    assert_eq!(pre.status(), 201);
    let pre: Value = serde_json::from_slice(&axum::body::to_bytes(pre.into_body(), 1 << 16).await.unwrap()).unwrap();
    let token = pre["token"].as_str().unwrap();
    clock.advance(CONVERGED);
    for phase in ["hardDelete", "write"] {
        let up = call(
            "POST",
            &format!("/v1/resources/{id}/lock/escalate"),
            json!({"token": token, "phase": phase, "durationSeconds": 60}),
        );
        assert_eq!(up.await.unwrap().status(), 200);
    }
    let wrong =
        call("POST", &format!("/v1/resources/{id}/lock/swap"), json!({"token": token, "targetLocation": "eastus"}));
    assert_eq!(wrong.await.unwrap().status(), 400);
    assert_eq!(items.get("eastus", id, "kept").map(|i| i.value), Some(json!("the old location's data")));
    assert_eq!(items.get("eastus", id, "k"), None, "nothing was copied to a target the swap refused");
}

/// RFC 9110 §11.1: the authentication scheme is case-insensitive.
async fn the_bearer_scheme_is_case_insensitive(design: LockDesign) {
    let h = harness(design).await;
    for (i, scheme) in ["bearer", "BEARER"].iter().enumerate() {
        let resp = h
            .http
            .post(format!("{}/v1/resources/probe-case{i}/lock", h.urls[0]))
            .header("authorization", format!("{scheme} {KEY}"))
            .json(&json!({"owner": "x", "durationSeconds": 10}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED, "{scheme}");
    }
}

/// A replica that lags has not seen a new resource yet; its "not found" is not the
/// store's answer. An item written on one instance is readable on another at once.
async fn a_new_resource_is_found_on_every_instance_before_replicas_catch_up(design: LockDesign) {
    let h = harness(design).await;
    assert_eq!(h.write(0, "probe-fresh", "k", json!(1)).await.status, StatusCode::CREATED);
    let read = h.read(1, "probe-fresh", "k").await;
    // A store read on a miss, not a lock's read-through: it says `store`.
    assert_eq!(
        (read.status, read.body["value"].clone(), read.source()),
        (StatusCode::OK, json!(1), "store".to_owned())
    );
    let route = h.route(1, "probe-fresh").await;
    assert_eq!((route.status, route.body["location"].clone()), (StatusCode::OK, json!("westeurope")));
    let write = h.write(1, "probe-fresh", "k2", json!(2)).await;
    assert_eq!((write.status, write.source()), (StatusCode::CREATED, "cache".to_owned()));
    assert_eq!(h.read(1, "probe-never", "k").await.status, StatusCode::NOT_FOUND);
}

/// Cosmos DB forbids `/ \ ? #` in ids, so every store refuses them on every route (sent
/// percent-encoded: raw, `?` and `#` would end the path and `\` would become `/`).
async fn ids_and_keys_with_characters_cosmos_forbids_are_400_on_every_route(design: LockDesign) {
    let h = harness(design).await;
    let body = json!({"owner": "x", "durationSeconds": 10});
    let token = "0123456789abcdef0123456789abcdef";
    for encoded in ["%5C", "%3F", "%23"] {
        let id = format!("probe-a{encoded}b");
        let answers = [
            h.lock(0, &id, "", body.clone()).await,
            h.lock(0, &id, "/escalate", json!({"token": token, "phase": "write", "durationSeconds": 10})).await,
            h.lock(0, &id, "/renew", json!({"token": token, "durationSeconds": 10})).await,
            h.lock(0, &id, "/swap", json!({"token": token, "targetLocation": "northeurope"})).await,
            h.release(&id, Some(token)).await,
            h.route(0, &id).await,
            h.read(0, &id, "k").await,
            h.write(0, &id, "k", json!(1)).await,
            h.delete(0, &id, "k").await,
            h.read(0, "probe-ok", &format!("k{encoded}")).await,
            h.write(0, "probe-ok", &format!("k{encoded}"), json!(1)).await,
            h.delete(0, "probe-ok", &format!("k{encoded}")).await,
        ];
        for (i, a) in answers.iter().enumerate() {
            assert_eq!(
                (a.status, a.problem_type()),
                (StatusCode::BAD_REQUEST, "urn:lockprobe:error:bad-request"),
                "{encoded} call {i}: {}",
                a.body
            );
        }
        let decoded = id.replace("%5C", "\\").replace("%3F", "?").replace("%23", "#");
        assert_eq!(h.etag(&decoded).await, None, "{encoded}: a refused call creates nothing");
    }
    assert_eq!(h.etag("probe-ok").await, None, "a refused key creates nothing");
    let target =
        h.lock(0, "probe-t", "", json!({"owner": "x", "durationSeconds": 10, "targetLocation": "north\\europe"})).await;
    assert_eq!((target.status, target.problem_type()), (StatusCode::BAD_REQUEST, "urn:lockprobe:error:bad-request"));
    assert_eq!(h.etag("probe-t").await, None);
}

async fn an_owner_with_control_characters_is_400(design: LockDesign) {
    let h = harness(design).await;
    for owner in ["orchestrator\n", "a\u{0}b", "tab\there", "\u{1b}[31mred"] {
        let a = h.lock(0, "probe-owner", "", json!({"owner": owner, "durationSeconds": 10})).await;
        assert_eq!(
            (a.status, a.problem_type()),
            (StatusCode::BAD_REQUEST, "urn:lockprobe:error:bad-request"),
            "{owner:?}"
        );
    }
    assert_eq!(h.etag("probe-owner").await, None);
    assert_eq!(h.pre_lock("probe-owner", 10.0).await.status, StatusCode::CREATED, "a plain owner is still fine");
}

/// A path segment that is not UTF-8 once percent-decoded is refused as problem+json
/// by every handler, not with axum's text/plain rejection.
async fn undecodable_paths_are_400_problems_on_every_route(design: LockDesign) {
    let h = harness(design).await;
    let token = "0123456789abcdef0123456789abcdef";
    let bad = "probe-%FF";
    let answers = [
        h.route(0, bad).await,
        h.read(0, bad, "k").await,
        h.write(0, bad, "k", json!(1)).await,
        h.delete(0, bad, "k").await,
        h.read(0, "probe-ok", "%C3%28").await,
        h.write(0, "probe-ok", "%C3%28", json!(1)).await,
        h.delete(0, "probe-ok", "%C3%28").await,
        h.lock(0, bad, "", json!({"owner": "x", "durationSeconds": 10})).await,
        h.lock(0, bad, "/escalate", json!({"token": token, "phase": "write", "durationSeconds": 10})).await,
        h.lock(0, bad, "/renew", json!({"token": token, "durationSeconds": 10})).await,
        h.lock(0, bad, "/swap", json!({"token": token, "targetLocation": "northeurope"})).await,
        h.call(0, Method::DELETE, &format!("/v1/resources/{bad}/lock"), None, Some(KEY)).await,
    ];
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(
            (a.status, a.problem_type()),
            (StatusCode::BAD_REQUEST, "urn:lockprobe:error:bad-request"),
            "call {i}: {}",
            a.body
        );
    }
    assert_eq!(h.etag("probe-ok").await, None);
}

async fn unknown_routes_are_404_and_wrong_methods_405_problems(design: LockDesign) {
    let h = harness(design).await;
    for path in
        ["/", "/v1", "/v1/resources/probe-a", "/v1/resources/probe-a/lock/explode", "/v2/resources/probe-a/route"]
    {
        let a = h.call(0, Method::GET, path, None, None).await;
        assert_eq!((a.status, a.problem_type()), (StatusCode::NOT_FOUND, "urn:lockprobe:error:not-found"), "{path}");
        assert!(a.body["detail"].as_str().is_some_and(|d| !d.is_empty()), "{path}: {}", a.body);
    }
    for (method, path, allow) in [
        (Method::GET, "/v1/resources/probe-a/lock", "POST,DELETE"),
        (Method::PUT, "/v1/resources/probe-a/lock/escalate", "POST"),
        (Method::DELETE, "/v1/resources/probe-a/route", "GET,HEAD"),
        (Method::POST, "/v1/resources/probe-a/items/k", "GET,HEAD,PUT,DELETE"),
        (Method::POST, "/healthz", "GET,HEAD"),
    ] {
        let a = h.call(0, method.clone(), path, None, Some(KEY)).await;
        assert_eq!(
            (a.status, a.problem_type()),
            (StatusCode::METHOD_NOT_ALLOWED, "urn:lockprobe:error:method-not-allowed"),
            "{method} {path}"
        );
        let allowed = a.headers.get("allow").map(|v| v.to_str().unwrap().replace(' ', ""));
        assert_eq!(allowed.as_deref(), Some(allow), "{method} {path}");
    }
    assert_eq!(h.etag("probe-a").await, None);
}

/// The largest settings `validate` accepts, with the largest lease a request may ask
/// for, must not overflow any date: every lock call answers, none panics.
async fn settings_and_leases_at_the_ten_year_bound_do_not_panic(design: LockDesign) {
    use lockprobe::duration::MAX_DURATION;
    let clock = Arc::new(ManualClock::at_epoch());
    let store =
        stores::Instrumented::new(clock.clone(), MemoryStoreConfig { replica_lag: MAX_DURATION, ..Default::default() });
    let config = ServiceConfig {
        cache_ttls: vec![MAX_DURATION],
        replication_bound: MAX_DURATION,
        test_prefix: Some("probe-".into()),
        max_pre_lock: MAX_DURATION,
        max_retry_after: MAX_DURATION,
        lock_design: design,
        ..ServiceConfig::new(KEY)
    };
    let shutdown = CancellationToken::new();
    let dyn_store: Arc<dyn LocationStore> = store.store();
    let listen = vec!["127.0.0.1:0".parse::<SocketAddr>().unwrap()];
    let over = ServiceConfig { max_pre_lock: MAX_DURATION * 2, ..config.clone() };
    let refused = start(over, dyn_store.clone(), clock.clone(), listen.clone(), shutdown.clone()).await.unwrap_err();
    assert!(refused.to_string().contains("--max-prelock"), "a config built in code is bounded too: {refused}");
    let running = start(config, dyn_store, clock.clone(), listen, shutdown.clone()).await.unwrap();
    let h = Harness {
        design,
        clock,
        store,
        urls: vec![format!("http://{}", running.addrs[0])],
        http: reqwest::Client::new(),
        shutdown,
    };
    let most = MAX_DURATION.as_secs_f64();
    let pre = h.pre_lock("probe-huge", most).await;
    assert_eq!(pre.status, StatusCode::CREATED, "{}", pre.body);
    let token = pre.body["token"].as_str().unwrap().to_owned();
    assert_eq!(
        h.write(0, "probe-huge", "k", json!(1)).await.status,
        StatusCode::CREATED,
        "a pre-lock does not block writes"
    );
    let renewed = h.lock(0, "probe-huge", "/renew", json!({"token": token, "durationSeconds": most})).await;
    assert_eq!(renewed.status, StatusCode::OK, "{}", renewed.body);
    h.clock.advance(MAX_DURATION * 2 + DEFAULT_SKEW_MARGIN);
    for (phase, expected) in [("hardDelete", StatusCode::OK), ("write", StatusCode::OK)] {
        let a = h.escalate("probe-huge", &token, phase, most).await;
        assert_eq!(a.status, expected, "{phase}: {}", a.body);
    }
    let blocked = h.write(0, "probe-huge", "k", json!(2)).await;
    assert_eq!(blocked.status, StatusCode::LOCKED);
    assert!(blocked.headers.get("retry-after").is_some());
    assert_eq!(h.swap("probe-huge", &token, "northeurope").await.status, StatusCode::OK);
    assert_eq!(h.route(0, "probe-huge").await.status, StatusCode::OK);
}

/// Each test above, once per lock design.
macro_rules! for_both_designs {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::LockDesign::Embedded).await
            })*
        }
        mod record {
            $(#[tokio::test]
            async fn $name() {
                super::$name(super::LockDesign::Record).await
            })*
        }
    };
}

for_both_designs!(
    pre_lock_returns_the_lock_view_with_the_declared_convergence,
    lock_api_needs_credentials_and_a_test_resource,
    every_lock_refusal_has_its_type,
    renew_and_release_succeed_for_the_holder,
    store_failures_are_503_and_change_nothing,
    full_lifecycle_enforces_each_phase_and_the_swap_carries_the_data,
    a_short_write_lock_lapses_by_itself_and_its_token_cannot_swap,
    fifty_concurrent_pre_locks_give_one_winner,
    a_stale_cache_shows_the_lock_only_after_its_ttl,
    under_declared_convergence_lets_a_stale_instance_delete_physically,
    an_honest_declaration_refuses_that_early_escalation,
    enforcement_faults_allow_what_should_be_refused,
    bad_input_is_400_and_changes_nothing,
    oversized_bodies_are_413,
    server_timing_tells_cache_from_read_through,
    a_refused_pre_lock_of_a_new_resource_creates_no_document,
    lock_calls_check_credentials_before_the_body,
    a_swap_to_an_undeclared_target_copies_nothing,
    the_bearer_scheme_is_case_insensitive,
    a_new_resource_is_found_on_every_instance_before_replicas_catch_up,
    ids_and_keys_with_characters_cosmos_forbids_are_400_on_every_route,
    an_owner_with_control_characters_is_400,
    undecodable_paths_are_400_problems_on_every_route,
    unknown_routes_are_404_and_wrong_methods_405_problems,
    settings_and_leases_at_the_ten_year_bound_do_not_panic,
);
