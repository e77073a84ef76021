//! Idempotency keys are honoured for their whole window, whatever happens in between
//! (contract 1.3): the three sequences that broke contract 1.1's "at most 16 records",
//! through the reference service's handlers, on the in-memory store (paused clock) and
//! on the local Cosmos DB server (real time), in both lock designs. And the record
//! budget: a keyed call that would need one record too many is refused with
//! `idempotency-records-full`, never answered by forgetting a key.

#[path = "support/cosmos_server.rs"]
mod cosmos_server;
#[path = "support/fleet.rs"]
mod fleet;

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use fleet::{Answer, Fleet, FleetOptions};
use lockprobe::clock::TokioClock;
use lockprobe::routing::lifecycle::DEFAULT_KEYED_RECORDS;
use lockprobe::service::{Fault, LockDesign};
use reqwest::Method;
use serde_json::json;

/// Lock calls made between a key's first call and its repeat: more records than
/// contract 1.1 kept (16).
const IN_BETWEEN: usize = 20;

const DESIGNS: [LockDesign; 2] = [LockDesign::Embedded, LockDesign::Record];

fn options(design: LockDesign) -> FleetOptions {
    FleetOptions {
        ttl: Duration::from_millis(300),
        bound: Duration::from_millis(100),
        replica_lag: Duration::from_millis(100),
        skew_margin: Duration::from_millis(100),
        lock_design: design,
        ..FleetOptions::default()
    }
}

fn token(a: &Answer) -> String {
    assert_eq!(a.status, 201, "expected a granted pre-lock: {:?}", a.body);
    a.field("token").unwrap_or_else(|| panic!("no token in {:?}", a.body)).to_owned()
}

/// `pairs` pre-lock/release pairs on `id` under fresh keys, alternating instances.
async fn churn(f: &Fleet, id: &str, pairs: usize, tag: &str) {
    for i in 0..pairs {
        let t = token(&f.pre_lock(i % 2, id, &format!("{tag}-p{i}"), 30.0, None).await);
        let released = f.release((i + 1) % 2, id, &format!("{tag}-r{i}"), &t).await;
        assert_eq!(released.status, 204, "release {i}: {:?}", released.body);
    }
}

/// A keyless renewal (no `Idempotency-Key`).
async fn renew_without_key(f: &Fleet, i: usize, id: &str, token: &str) -> Answer {
    let body = json!({"token": token, "durationSeconds": 30.0});
    f.request(i, Method::POST, &format!("/v1/resources/{id}/lock/renew"), Some(body), &[]).await
}

/// The three sequences on one fleet, each on its own resource (named after `run`).
async fn three_sequences(f: &Fleet, run: &str) {
    // 1. Released, then IN_BETWEEN locks came and went: the repeat is 409, not a lock.
    let id = format!("{run}-released");
    let first = token(&f.pre_lock(0, &id, "K", 30.0, None).await);
    assert_eq!(f.release(1, &id, "R", &first).await.status, 204);
    churn(f, &id, IN_BETWEEN, "a").await;
    let again = f.pre_lock(1, &id, "K", 30.0, None).await;
    assert_eq!((again.status, again.problem()), (409, Some("token-mismatch")), "{run}: {:?}", again.body);
    assert_eq!(f.release(0, &id, "R", &first).await.status, 204, "{run}: a repeated release succeeds again");

    // 2. Lapsed, replaced by another lock, renewed IN_BETWEEN times: 410, not a lock.
    let id = format!("{run}-lapsed");
    let lapsing = f.pre_lock(0, &id, "K", 0.5, None).await;
    token(&lapsing);
    let ended = lapsing.time("expiresAt").expect("expiresAt") + TimeDelta::milliseconds(400);
    f.until(ended).await;
    let next = token(&f.pre_lock(1, &id, "N", 30.0, None).await);
    for i in 0..IN_BETWEEN {
        let renewed = f.renew(i % 2, &id, &format!("n{i}"), &next, 30.0).await;
        assert_eq!(renewed.status, 200, "{run}: renewal {i}: {:?}", renewed.body);
    }
    let again = f.pre_lock(1, &id, "K", 0.5, None).await;
    assert_eq!((again.status, again.problem()), (410, Some("lock-expired")), "{run}: {:?}", again.body);

    // 3. Still held, renewed IN_BETWEEN times with keys and as often without: the
    // repeat is granted again with the first token, not 423.
    let id = format!("{run}-held");
    let held = token(&f.pre_lock(0, &id, "K", 30.0, None).await);
    for i in 0..IN_BETWEEN {
        assert_eq!(f.renew(i % 2, &id, &format!("h{i}"), &held, 30.0).await.status, 200);
        assert_eq!(renew_without_key(f, (i + 1) % 2, &id, &held).await.status, 200);
    }
    let again = f.pre_lock(1, &id, "K", 30.0, None).await;
    assert_eq!(token(&again), held, "{run}: the repeat answers with the lock the key took");
}

#[tokio::test(start_paused = true)]
async fn a_repeat_after_many_calls_is_never_a_fresh_lock_on_the_memory_store() {
    for design in DESIGNS {
        let f = Fleet::new(options(design));
        three_sequences(&f, &format!("mem-{}", design.as_str())).await;
    }
}

/// Contract 1.1's eviction (`--fault legacy-record-eviction`) fails the first sequence:
/// the repeat gets a fresh lock whose token nobody learned. The test above can fail.
#[tokio::test(start_paused = true)]
async fn the_legacy_eviction_grants_the_repeat_a_fresh_lock() {
    for design in DESIGNS {
        let f = Fleet::new(FleetOptions { faults: vec![Fault::LegacyRecordEviction], ..options(design) });
        let first = token(&f.pre_lock(0, "r", "K", 30.0, None).await);
        assert_eq!(f.release(1, "r", "R", &first).await.status, 204);
        churn(&f, "r", IN_BETWEEN, "a").await;
        let again = f.pre_lock(1, "r", "K", 30.0, None).await;
        assert_ne!(token(&again), first, "{}: a fresh lock", design.as_str());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_after_many_calls_is_never_a_fresh_lock_on_cosmos() {
    let server = cosmos_server::CosmosServer::start();
    for design in DESIGNS {
        let database = cosmos_server::unique_database(&format!("keys-{}", design.as_str()));
        let store = cosmos_server::connect_with(&server.endpoint(), &prometheus::Registry::new(), |a| {
            a.database = Some(database)
        })
        .await;
        let f = Fleet::over(options(design), Arc::new(store), Arc::new(TokioClock::new(Utc::now())));
        three_sequences(&f, &format!("cosmos-{}", design.as_str())).await;
    }
}

/// A resource whose keyed records fill the budget refuses the next keyed call with
/// 429 `idempotency-records-full` and a `Retry-After` until the oldest record's window
/// ends; every recorded key still answers as before, and a call without a key goes on.
#[tokio::test(start_paused = true)]
async fn a_full_record_budget_refuses_a_keyed_call_and_forgets_nothing() {
    for design in DESIGNS {
        let f = Fleet::new(options(design));
        churn(&f, "r", DEFAULT_KEYED_RECORDS / 2, "a").await;
        let refused = f.pre_lock(0, "r", "one-more", 30.0, None).await;
        assert_eq!((refused.status, refused.problem()), (429, Some("idempotency-records-full")), "{:?}", refused.body);
        // The window of the oldest record: the first lock's ceiling (the service's
        // 48-hour maximum pre-lock) plus the convergence delay and the margin.
        let retry = refused.retry_after.expect("Retry-After");
        assert!((48 * 3600..48 * 3600 + 60).contains(&retry), "Retry-After {retry}");
        let first_key = f.pre_lock(1, "r", "a-p0", 30.0, None).await;
        assert_eq!(first_key.status, 409, "the oldest key is still honoured: {:?}", first_key.body);
        let keyless = f
            .request(1, Method::POST, "/v1/resources/r/lock", Some(json!({"owner": "o", "durationSeconds": 30.0})), &[])
            .await;
        assert_eq!(keyless.status, 201, "{:?}", keyless.body);
    }
}
