//! The reference service over the Cosmos DB store (local test server), through HTTP:
//! the whole lock lifecycle, 50 concurrent pre-locks, and 503 `store-unavailable`
//! once the server is stopped.
//!
//! Lock time runs on a manual clock (the routing library's clock); the store's own
//! `_ts` is server time and plays no part in lock decisions.

#[path = "support/cosmos_server.rs"]
mod cosmos_server;
#[path = "support/tcp_proxy.rs"]
mod tcp_proxy;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lockprobe::clock::ManualClock;
use lockprobe::service::{start, ServiceConfig};
use lockprobe::store::{LocationStore, ReadFrom};
use prometheus::Registry;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use cosmos_server::CosmosServer;
use tcp_proxy::TcpProxy;

const KEY: &str = "test-key";
const TTL: Duration = Duration::from_secs(2);
const BOUND: Duration = Duration::from_secs(1);

struct Harness {
    server: CosmosServer,
    proxy: Option<TcpProxy>,
    clock: Arc<ManualClock>,
    store: Arc<dyn LocationStore>,
    urls: Vec<String>,
    http: reqwest::Client,
    shutdown: CancellationToken,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn harness() -> Harness {
    harness_via(false).await
}

/// With `via_proxy`, the store reaches the server through a proxy the test can cut.
async fn harness_via(via_proxy: bool) -> Harness {
    let server = CosmosServer::start();
    let proxy = if via_proxy { Some(TcpProxy::start(([127, 0, 0, 1], server.port()).into()).await) } else { None };
    let endpoint = match &proxy {
        Some(p) => format!("http://127.0.0.1:{}/", p.port()),
        None => server.endpoint(),
    };
    let store: Arc<dyn LocationStore> = Arc::new(
        cosmos_server::connect_with(&endpoint, &Registry::new(), |args| {
            args.request_timeout = std::time::Duration::from_secs(2)
        })
        .await,
    );
    // The service's clock starts at the real time: Cosmos stamps commits (`_ts`) with its
    // own, and the routing library starts a pre-lock no earlier than its commit.
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let config = ServiceConfig {
        cache_ttls: vec![TTL],
        replication_bound: BOUND,
        test_prefix: Some("probe-".into()),
        max_pre_lock: Duration::from_secs(3600),
        ..ServiceConfig::new(KEY)
    };
    let shutdown = CancellationToken::new();
    let listen = vec!["127.0.0.1:0".parse::<SocketAddr>().unwrap(); 2];
    let running = start(config, store.clone(), clock.clone(), listen, shutdown.clone()).await.unwrap();
    let urls = running.addrs.iter().map(|a| format!("http://{a}")).collect();
    Harness { server, proxy, clock, store, urls, http: reqwest::Client::new(), shutdown }
}

#[derive(Debug)]
struct Answer {
    status: StatusCode,
    body: Value,
}

impl Answer {
    fn problem_type(&self) -> &str {
        self.body["type"].as_str().unwrap_or("<none>")
    }
}

impl Harness {
    async fn call(
        &self,
        i: usize,
        method: Method,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut req = self.http.request(method, format!("{}{path}", self.urls[i])).bearer_auth(KEY);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        let body =
            if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
        Answer { status, body }
    }

    async fn lock(&self, id: &str, suffix: &str, body: Value) -> Answer {
        self.call(0, Method::POST, &format!("/v1/resources/{id}/lock{suffix}"), Some(body), &[]).await
    }

    async fn item(&self, i: usize, method: Method, id: &str, key: &str, value: Option<Value>) -> Answer {
        let body = value.map(|v| json!({ "value": v }));
        self.call(i, method, &format!("/v1/resources/{id}/items/{key}"), body, &[]).await
    }
}

/// When a pre-lock's restrictions may start (its commit on the server's clock + the
/// declared delay + the skew margin), as its lock view says.
fn effective_at(pre: &Answer) -> chrono::DateTime<chrono::Utc> {
    let shown = pre.body["effectiveAt"].as_str().expect("a lock view shows effectiveAt");
    chrono::DateTime::parse_from_rfc3339(shown).unwrap().to_utc()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_full_lifecycle_runs_over_cosmos() {
    let h = harness().await;
    let id = "probe-cosmos-life";
    assert_eq!(h.item(0, Method::PUT, id, "keep", Some(json!("v1"))).await.status, StatusCode::CREATED);
    assert_eq!(h.item(0, Method::PUT, id, "doomed", Some(json!("v2"))).await.status, StatusCode::CREATED);
    let created = h.store.read(id, ReadFrom::WriteRegion).await.expect("the service created the document in cosmos");
    assert_eq!(created.doc.primary.location, "westeurope");

    let pre = h.lock(id, "", json!({"owner": "cosmos-test", "durationSeconds": 600})).await;
    assert_eq!(pre.status, StatusCode::CREATED, "{:?}", pre.body);
    let token = pre.body["token"].as_str().unwrap().to_owned();
    let stored = h.store.read(id, ReadFrom::WriteRegion).await.unwrap();
    assert!(stored.doc.primary.lock.as_ref().is_some_and(|l| l.token.expose() == token), "the lock is in cosmos");

    // Escalation before effectiveAt is refused; after the convergence delay it is granted.
    let early = h.lock(id, "/escalate", json!({"token": token, "phase": "hardDelete", "durationSeconds": 60})).await;
    assert_eq!((early.status, early.problem_type()), (StatusCode::CONFLICT, "urn:lockprobe:error:invalid-transition"));
    h.clock.set(effective_at(&pre));
    let hd = h.lock(id, "/escalate", json!({"token": token, "phase": "hardDelete", "durationSeconds": 60})).await;
    assert_eq!(hd.status, StatusCode::OK, "{:?}", hd.body);
    let tomb = h.item(1, Method::DELETE, id, "doomed", None).await;
    assert_eq!((tomb.status, tomb.body.clone()), (StatusCode::ACCEPTED, json!({"tombstone": true})));

    let write = h.lock(id, "/escalate", json!({"token": token, "phase": "write", "durationSeconds": 30})).await;
    assert_eq!(write.status, StatusCode::OK, "{:?}", write.body);
    for i in 0..2 {
        assert_eq!(h.item(i, Method::GET, id, "keep", None).await.status, StatusCode::OK);
        let blocked = h.item(i, Method::PUT, id, "keep", Some(json!("x"))).await;
        assert_eq!((blocked.status, blocked.problem_type()), (StatusCode::LOCKED, "urn:lockprobe:error:lock-held"));
    }

    let swapped = h.lock(id, "/swap", json!({"token": token, "targetLocation": "northeurope"})).await;
    assert_eq!(swapped.status, StatusCode::OK, "{:?}", swapped.body);
    assert_eq!(swapped.body["location"], "northeurope");
    let stored = h.store.read(id, ReadFrom::WriteRegion).await.unwrap();
    assert_eq!(stored.doc.primary.location, "northeurope");
    assert!(stored.doc.primary.lock.is_none(), "swap clears the lock in the same write");
    assert_eq!(stored.doc.secondary.as_ref().map(|s| s.location.as_str()), Some("westeurope"));
    assert_eq!(h.item(0, Method::GET, id, "keep", None).await.body["value"], "v1");
    assert_eq!(h.item(1, Method::PUT, id, "after", Some(json!(true))).await.status, StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_pre_locks_through_http_give_one_winner() {
    let h = Arc::new(harness().await);
    let id = "probe-cosmos-race";
    assert_eq!(h.item(0, Method::PUT, id, "k", Some(json!(1))).await.status, StatusCode::CREATED);
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let h = h.clone();
            tokio::spawn(async move {
                let path = format!("/v1/resources/{id}/lock");
                h.call(i % 2, Method::POST, &path, Some(json!({"owner": format!("o{i}"), "durationSeconds": 60})), &[])
                    .await
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        let answer = task.await.unwrap();
        if answer.status != StatusCode::CREATED {
            assert_eq!(answer.problem_type(), "urn:lockprobe:error:lock-held", "{answer:?}");
        }
        statuses.push(answer.status);
    }
    let winners = statuses.iter().filter(|s| **s == StatusCode::CREATED).count();
    let held = statuses.iter().filter(|s| **s == StatusCode::LOCKED).count();
    assert_eq!((winners, held), (1, 49));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_cosmos_server_is_503_store_unavailable() {
    let mut h = harness().await;
    let id = "probe-cosmos-down";
    assert_eq!(h.item(0, Method::PUT, id, "k", Some(json!(1))).await.status, StatusCode::CREATED);
    h.clock.advance(TTL * 2); // let the cached route lapse, so the next resolve must read the store

    h.server.stop();

    let lock = h.lock(id, "", json!({"owner": "down", "durationSeconds": 60})).await;
    assert_eq!(
        (lock.status, lock.problem_type()),
        (StatusCode::SERVICE_UNAVAILABLE, "urn:lockprobe:error:store-unavailable")
    );
    let route = h.call(1, Method::GET, &format!("/v1/resources/{id}/route"), None, &[]).await;
    assert_eq!(
        (route.status, route.problem_type()),
        (StatusCode::SERVICE_UNAVAILABLE, "urn:lockprobe:error:store-unavailable")
    );
    let write = h.item(1, Method::PUT, "probe-cosmos-new", "k", Some(json!(2))).await;
    assert_eq!(
        (write.status, write.problem_type()),
        (StatusCode::SERVICE_UNAVAILABLE, "urn:lockprobe:error:store-unavailable")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_cosmos_is_503_writes_nothing_and_the_service_recovers() {
    let mut h = harness_via(true).await;
    let id = "probe-cosmos-partition";
    assert_eq!(h.item(0, Method::PUT, id, "k", Some(json!(1))).await.status, StatusCode::CREATED);
    let pre = h.lock(id, "", json!({"owner": "first", "durationSeconds": 60})).await;
    assert_eq!(pre.status, StatusCode::CREATED);
    let token = pre.body["token"].as_str().unwrap().to_owned();
    let before = h.store.read(id, ReadFrom::WriteRegion).await.unwrap();
    h.clock.set(effective_at(&pre));

    h.proxy.as_mut().unwrap().cut().await;
    for (what, answer) in [
        (
            "escalate",
            h.lock(id, "/escalate", json!({"token": token, "phase": "hardDelete", "durationSeconds": 60})).await,
        ),
        ("swap", h.lock(id, "/swap", json!({"token": token, "targetLocation": "eastus"})).await),
        (
            "release",
            h.call(0, Method::DELETE, &format!("/v1/resources/{id}/lock"), None, &[("Lock-Token", token.as_str())])
                .await,
        ),
    ] {
        assert_eq!(
            (answer.status, answer.problem_type()),
            (StatusCode::SERVICE_UNAVAILABLE, "urn:lockprobe:error:store-unavailable"),
            "{what}: {answer:?}"
        );
    }

    h.proxy.as_mut().unwrap().heal().await;
    let after = h.store.read(id, ReadFrom::WriteRegion).await.unwrap();
    assert_eq!((&after.doc, &after.etag), (&before.doc, &before.etag), "no failed call changed the document");
    let hd = h.lock(id, "/escalate", json!({"token": token, "phase": "hardDelete", "durationSeconds": 60})).await;
    assert_eq!(hd.status, StatusCode::OK, "the service works again once the store is back: {:?}", hd.body);
}
