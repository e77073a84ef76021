//! An in-process fleet for fault tests: instances of the reference service (their axum
//! routers called directly, no sockets) over one in-memory store behind a
//! [`FaultyStore`], on tokio's paused clock, so seconds of store trouble cost
//! microseconds and every run of a seed is the same.
//!
//! True time is the fleet's [`TokioClock`]: the memory store commits on it, instances
//! read it, each shifted by its own skew, and [`Recording`] (between the faults and the
//! store) keeps every committed write with the instant it was answered: the history an
//! oracle judges. The same fleet runs over a given store (the local Cosmos DB server) in
//! real time.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request};
use axum::Router;
use chrono::{DateTime, TimeDelta, Utc};
use lockprobe::clock::{Clock, SkewedClock, TokioClock};
use lockprobe::routing::LocationDocument;
use lockprobe::service::ItemStores;
use lockprobe::service::{self, Fault, LockDesign, ServiceConfig};
use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
use lockprobe::store::{
    ChangeBatch, ChangeCursor, Committed, ETag, LocationStore, ReadFrom, ScanPage, StoreError, Versioned,
};
use lockprobe::testing::FaultyStore;
use serde_json::Value;
use tower::ServiceExt;

/// The lock API key of every fleet.
pub const KEY: &str = "fleet-key";

/// The admin principals every fleet has (name, key): two, so a force-release can be
/// requested by one and approved by the other.
pub const ADMINS: [(&str, &str); 2] = [("alice", "fleet-admin-alice-key"), ("bob", "fleet-admin-bob-key-0")];

/// How a fleet is set up.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// One entry per instance: its clock's offset from true time.
    pub skews: Vec<TimeDelta>,
    /// The single cache tier's TTL.
    pub ttl: Duration,
    /// The declared replication bound.
    pub bound: Duration,
    /// How far the memory store's replicas really lag (at most `bound` inside the
    /// scheme's assumptions).
    pub replica_lag: Duration,
    /// The service's skew margin.
    pub skew_margin: Duration,
    /// The service's decision age.
    pub decision_age: Duration,
    /// Deliberate deviations (the legacy behaviours).
    pub faults: Vec<Fault>,
    /// Seed of the store faults.
    pub seed: u64,
    /// Where the instances keep locks.
    pub lock_design: LockDesign,
}

impl Default for FleetOptions {
    fn default() -> Self {
        Self {
            skews: vec![TimeDelta::zero(); 2],
            ttl: Duration::from_secs(2),
            bound: Duration::from_secs(1),
            replica_lag: Duration::from_secs(1),
            skew_margin: Duration::from_millis(500),
            decision_age: Duration::from_secs(1),
            faults: Vec::new(),
            seed: 0,
            lock_design: LockDesign::Embedded,
        }
    }
}

/// A committed version with the instants its write was sent and answered.
pub type SentAndAnswered = (DateTime<Utc>, DateTime<Utc>, Versioned);

/// Every write the store committed, as it answered it: the history an oracle judges.
#[derive(Debug)]
pub struct Recording {
    inner: Arc<dyn LocationStore>,
    clock: Arc<dyn Clock>,
    log: std::sync::Mutex<Vec<SentAndAnswered>>,
}

impl Recording {
    fn record(&self, doc: &LocationDocument, sent: DateTime<Utc>, written: &Result<Committed, StoreError>) {
        if let Ok(c) = written {
            let version = Versioned { doc: doc.clone(), etag: c.etag.clone(), committed_at: c.committed_at };
            self.log.lock().unwrap().push((sent, self.clock.now(), version));
        }
    }

    /// Every committed version with the instants its write was sent and answered (the
    /// commit lies between; the same instant for the memory store on the fleet's clock).
    pub fn versions(&self) -> Vec<SentAndAnswered> {
        self.log.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl LocationStore for Recording {
    fn region(&self) -> Option<String> {
        self.inner.region()
    }
    async fn read(&self, id: &str, from: ReadFrom) -> Result<Versioned, StoreError> {
        self.inner.read(id, from).await
    }
    async fn create(&self, doc: &LocationDocument) -> Result<Committed, StoreError> {
        let sent = self.clock.now();
        let written = self.inner.create(doc).await;
        self.record(doc, sent, &written);
        written
    }
    async fn replace(&self, doc: &LocationDocument, if_match: &ETag) -> Result<Committed, StoreError> {
        let sent = self.clock.now();
        let written = self.inner.replace(doc, if_match).await;
        self.record(doc, sent, &written);
        written
    }
    async fn read_changes(&self, cursor: &ChangeCursor, limit: usize) -> Result<ChangeBatch, StoreError> {
        self.inner.read_changes(cursor, limit).await
    }
    async fn scan(&self, after: Option<&str>, limit: usize) -> Result<ScanPage, StoreError> {
        self.inner.scan(after, limit).await
    }
}

tokio::task_local! {
    static INSTANCE: usize;
}

/// One store per instance behind one [`LocationStore`]: each call goes to the store of
/// the instance whose request made it (work outside a request goes to the first), so
/// instances over one account each discover its write region on their own, as separate
/// processes would.
#[derive(Debug)]
pub struct PerInstance(pub Vec<Arc<dyn LocationStore>>);

impl PerInstance {
    fn store(&self) -> &Arc<dyn LocationStore> {
        let i = INSTANCE.try_with(|i| *i).unwrap_or(0);
        &self.0[i.min(self.0.len() - 1)]
    }
}

#[async_trait::async_trait]
impl LocationStore for PerInstance {
    fn region(&self) -> Option<String> {
        self.store().region()
    }
    async fn read(&self, id: &str, from: ReadFrom) -> Result<Versioned, StoreError> {
        self.store().read(id, from).await
    }
    async fn create(&self, doc: &LocationDocument) -> Result<Committed, StoreError> {
        self.store().create(doc).await
    }
    async fn replace(&self, doc: &LocationDocument, if_match: &ETag) -> Result<Committed, StoreError> {
        self.store().replace(doc, if_match).await
    }
    async fn read_changes(&self, cursor: &ChangeCursor, limit: usize) -> Result<ChangeBatch, StoreError> {
        self.store().read_changes(cursor, limit).await
    }
    async fn scan(&self, after: Option<&str>, limit: usize) -> Result<ScanPage, StoreError> {
        self.store().scan(after, limit).await
    }
}

/// A running fleet. Create it inside a tokio runtime (paused, for the memory store).
pub struct Fleet {
    /// True time.
    pub clock: Arc<TokioClock>,
    /// Every committed write, between the faults and the store.
    pub recording: Arc<Recording>,
    /// The store the instances use.
    pub store: Arc<FaultyStore>,
    /// User data, shared by the instances.
    pub items: Arc<ItemStores>,
    /// The service's settings.
    pub config: Arc<ServiceConfig>,
    routers: Vec<Router>,
}

/// One answer of an instance.
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// JSON body (`Null` when empty).
    pub body: Value,
    /// `Retry-After`, seconds.
    pub retry_after: Option<u64>,
    /// The `desc` of `Server-Timing: route;desc="..."` (cache, read-through, store).
    pub route: Option<String>,
}

impl Answer {
    /// The problem type without its prefix, for error answers.
    pub fn problem(&self) -> Option<&str> {
        self.body["type"].as_str().map(|t| t.trim_start_matches("urn:lockprobe:error:"))
    }

    /// A string field of the body.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.body[name].as_str()
    }

    /// A timestamp field of the body.
    pub fn time(&self, name: &str) -> Option<DateTime<Utc>> {
        self.field(name).and_then(|t| DateTime::parse_from_rfc3339(t).ok()).map(|t| t.to_utc())
    }
}

impl Fleet {
    /// Starts the fleet's instances over a fresh in-memory store on the fleet's clock
    /// (at a round instant).
    pub fn new(opts: FleetOptions) -> Self {
        let clock = Arc::new(TokioClock::at_epoch());
        let memory = Arc::new(MemoryStore::new(
            clock.clone(),
            MemoryStoreConfig { replica_lag: opts.replica_lag, change_log_capacity: 1_000_000 },
        ));
        Self::over(opts, memory, clock)
    }

    /// Starts the fleet's instances over `inner` (Cosmos DB, say), with true time on
    /// `clock` (which must agree with the store's commit times: the real time, for a real
    /// server).
    pub fn over(opts: FleetOptions, inner: Arc<dyn LocationStore>, clock: Arc<TokioClock>) -> Self {
        let recording = Arc::new(Recording { inner, clock: clock.clone(), log: Default::default() });
        let recorded: Arc<dyn LocationStore> = recording.clone();
        let store = Arc::new(FaultyStore::new(recorded, clock.clone(), opts.seed));
        let config = Arc::new(ServiceConfig {
            cache_ttls: vec![opts.ttl],
            replication_bound: opts.bound,
            test_prefix: None,
            skew_margin: opts.skew_margin,
            max_decision_age: opts.decision_age,
            faults: opts.faults.clone(),
            lock_design: opts.lock_design,
            admin_principals: ADMINS
                .iter()
                .map(|(name, key)| service::AdminPrincipal {
                    name: (*name).into(),
                    key: (*key).into(),
                    prefixes: Vec::new(),
                })
                .collect(),
            ..ServiceConfig::new(KEY)
        });
        config.validate().expect("fleet settings are valid");
        let items = Arc::new(ItemStores::default());
        let routers = opts
            .skews
            .iter()
            .enumerate()
            .map(|(i, skew)| {
                let instance_clock: Arc<dyn Clock> = Arc::new(SkewedClock::new(clock.clone(), *skew));
                let dyn_store: Arc<dyn LocationStore> = store.clone();
                let instance = service::instance(i, config.clone(), dyn_store, instance_clock, items.clone()).unwrap();
                service::router(instance)
            })
            .collect();
        Self { clock, recording, store, items, config, routers }
    }

    /// How many instances the fleet has.
    pub fn instances(&self) -> usize {
        self.routers.len()
    }

    /// True time now.
    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// Sleeps (in paused time) until `at`, true time.
    pub async fn until(&self, at: DateTime<Utc>) {
        let wait = (at - self.now()).to_std().unwrap_or_default();
        tokio::time::sleep(wait).await;
    }

    /// One request to instance `i`, with the lock API's key unless `headers` name an
    /// `authorization` of their own.
    pub async fn request(
        &self,
        i: usize,
        method: Method,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut req = Request::builder().method(method).uri(path);
        if !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("authorization")) {
            req = req.header(header::AUTHORIZATION, format!("Bearer {KEY}"));
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let req = match body {
            Some(b) => req.header(header::CONTENT_TYPE, "application/json").body(Body::from(b.to_string())).unwrap(),
            None => req.body(Body::empty()).unwrap(),
        };
        let resp = INSTANCE.scope(i, self.routers[i].clone().oneshot(req)).await.unwrap();
        let status = resp.status().as_u16();
        let retry_after =
            resp.headers().get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
        let route = resp
            .headers()
            .get("server-timing")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(',').find_map(|m| m.trim().strip_prefix("route;desc=\"")))
            .and_then(|rest| rest.split('"').next())
            .map(str::to_owned);
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
        Answer { status, body: serde_json::from_slice(&bytes).unwrap_or(Value::Null), retry_after, route }
    }

    /// `POST /lock` on instance `i` under idempotency key `key`.
    pub async fn pre_lock(&self, i: usize, id: &str, key: &str, lease_secs: f64, target: Option<&str>) -> Answer {
        let mut body = serde_json::json!({"owner": "fleet", "durationSeconds": lease_secs});
        if let Some(t) = target {
            body["targetLocation"] = Value::from(t);
        }
        self.request(i, Method::POST, &format!("/v1/resources/{id}/lock"), Some(body), &[("Idempotency-Key", key)])
            .await
    }

    /// `POST /lock/escalate`.
    pub async fn escalate(&self, i: usize, id: &str, key: &str, token: &str, phase: &str, lease_secs: f64) -> Answer {
        let body = serde_json::json!({"token": token, "phase": phase, "durationSeconds": lease_secs});
        self.request(
            i,
            Method::POST,
            &format!("/v1/resources/{id}/lock/escalate"),
            Some(body),
            &[("Idempotency-Key", key)],
        )
        .await
    }

    /// `POST /lock/renew`.
    pub async fn renew(&self, i: usize, id: &str, key: &str, token: &str, lease_secs: f64) -> Answer {
        let body = serde_json::json!({"token": token, "durationSeconds": lease_secs});
        self.request(
            i,
            Method::POST,
            &format!("/v1/resources/{id}/lock/renew"),
            Some(body),
            &[("Idempotency-Key", key)],
        )
        .await
    }

    /// `POST /lock/swap`.
    pub async fn swap(&self, i: usize, id: &str, key: &str, token: &str, target: &str) -> Answer {
        let body = serde_json::json!({"token": token, "targetLocation": target});
        self.request(i, Method::POST, &format!("/v1/resources/{id}/lock/swap"), Some(body), &[("Idempotency-Key", key)])
            .await
    }

    /// `GET /lock/force-release` as admin principal `admin` (an index of [`ADMINS`]).
    pub async fn admin_view(&self, i: usize, id: &str, admin: usize) -> Answer {
        let auth = format!("Bearer {}", ADMINS[admin].1);
        let path = format!("/v1/resources/{id}/lock/force-release");
        self.request(i, Method::GET, &path, None, &[("authorization", &auth)]).await
    }

    /// `POST /lock/force-release` as admin principal `admin`, under idempotency key `key`.
    pub async fn force_request(
        &self,
        i: usize,
        id: &str,
        admin: usize,
        key: &str,
        fingerprint: &str,
        phase: &str,
    ) -> Answer {
        let auth = format!("Bearer {}", ADMINS[admin].1);
        let body = serde_json::json!({"lockFingerprint": fingerprint, "phase": phase, "reason": "campaign"});
        let path = format!("/v1/resources/{id}/lock/force-release");
        self.request(i, Method::POST, &path, Some(body), &[("authorization", &auth), ("Idempotency-Key", key)]).await
    }

    /// `POST /lock/force-release/{request}/approve` as admin principal `admin`.
    pub async fn force_approve(&self, i: usize, id: &str, admin: usize, request: &str) -> Answer {
        let auth = format!("Bearer {}", ADMINS[admin].1);
        let path = format!("/v1/resources/{id}/lock/force-release/{request}/approve");
        self.request(i, Method::POST, &path, None, &[("authorization", &auth)]).await
    }

    /// `DELETE /lock`.
    pub async fn release(&self, i: usize, id: &str, key: &str, token: &str) -> Answer {
        let path = format!("/v1/resources/{id}/lock");
        self.request(i, Method::DELETE, &path, None, &[("Idempotency-Key", key), ("Lock-Token", token)]).await
    }

    /// `PUT /items/{key}`.
    pub async fn write(&self, i: usize, id: &str, key: &str, value: Value) -> Answer {
        let body = serde_json::json!({ "value": value });
        self.request(i, Method::PUT, &format!("/v1/resources/{id}/items/{key}"), Some(body), &[]).await
    }

    /// `DELETE /items/{key}`.
    pub async fn delete(&self, i: usize, id: &str, key: &str) -> Answer {
        self.request(i, Method::DELETE, &format!("/v1/resources/{id}/items/{key}"), None, &[]).await
    }

    /// `GET /items/{key}`.
    pub async fn read(&self, i: usize, id: &str, key: &str) -> Answer {
        self.request(i, Method::GET, &format!("/v1/resources/{id}/items/{key}"), None, &[]).await
    }

    /// `GET /route`.
    pub async fn route(&self, i: usize, id: &str) -> Answer {
        self.request(i, Method::GET, &format!("/v1/resources/{id}/route"), None, &[]).await
    }
}
