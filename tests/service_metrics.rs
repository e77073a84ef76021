//! The service's own view of contract 1.3's document-size budget, over real HTTP:
//! `lockprobe_service_document_bytes{phase}` on `GET /metrics` counts each version a lock
//! call wrote, once, at the size the store holds, in the phase it stores.
//!
//! Time is a manual clock shared by the store and the instances.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lockprobe::clock::ManualClock;
use lockprobe::document::lock_record_id;
use lockprobe::routing::lifecycle::DEFAULT_SKEW_MARGIN;
use lockprobe::service::{start, LockDesign, ServiceConfig};
use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
use lockprobe::store::{LocationStore, ReadFrom};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const KEY: &str = "test-key";
const TTL: Duration = Duration::from_secs(2);
const BOUND: Duration = Duration::from_secs(1);

struct Service {
    clock: Arc<ManualClock>,
    store: Arc<MemoryStore>,
    urls: Vec<String>,
    http: reqwest::Client,
    shutdown: CancellationToken,
}

impl Drop for Service {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn service(design: LockDesign, metrics: Option<prometheus::Registry>) -> Service {
    let clock = Arc::new(ManualClock::at_epoch());
    let store =
        Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig { replica_lag: BOUND, ..Default::default() }));
    let config = ServiceConfig {
        cache_ttls: vec![TTL],
        replication_bound: BOUND,
        max_pre_lock: Duration::from_secs(3600),
        lock_design: design,
        metrics,
        ..ServiceConfig::new(KEY)
    };
    let shutdown = CancellationToken::new();
    let listen = vec!["127.0.0.1:0".parse::<SocketAddr>().unwrap(); 2];
    let dyn_store: Arc<dyn LocationStore> = store.clone();
    let running = start(config, dyn_store, clock.clone(), listen, shutdown.clone()).await.unwrap();
    let urls = running.addrs.iter().map(|a| format!("http://{a}")).collect();
    Service { clock, store, urls, http: reqwest::Client::new(), shutdown }
}

impl Service {
    async fn lock_call(&self, path: &str, body: Value, idempotency_key: &str) -> (StatusCode, Value) {
        let response = self
            .http
            .post(format!("{}/v1/resources/{path}", self.urls[0]))
            .bearer_auth(KEY)
            .header("idempotency-key", idempotency_key)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn scrape(&self, instance: usize) -> String {
        let response = self.http.get(format!("{}/metrics", self.urls[instance])).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.text().await.unwrap()
    }

    /// The stored size of the document lock calls on `id` write, as the store holds it now.
    async fn stored_bytes(&self, design: LockDesign, id: &str) -> f64 {
        let lock_id = match design {
            LockDesign::Embedded => id.to_owned(),
            LockDesign::Record => lock_record_id(id),
        };
        self.store.read(&lock_id, ReadFrom::WriteRegion).await.unwrap().doc.serialized_len() as f64
    }
}

/// `(count, sum)` of the histogram's series for `phase`.
fn histogram(text: &str, phase: &str) -> (f64, f64) {
    let value = |series: &str| {
        let name = format!("lockprobe_service_document_bytes_{series}{{phase=\"{phase}\"}} ");
        let line = text.lines().find_map(|l| l.strip_prefix(&name)).unwrap_or_else(|| panic!("no {name}in:\n{text}"));
        line.trim().parse::<f64>().unwrap()
    };
    (value("count"), value("sum"))
}

#[tokio::test]
async fn every_phase_is_exported_at_zero_without_a_registry_of_the_callers() {
    let s = service(LockDesign::Embedded, None).await;
    let text = s.scrape(0).await;
    for phase in ["preLock", "hardDelete", "write", "unlocked"] {
        assert_eq!(histogram(&text, phase), (0.0, 0.0), "{phase}");
    }
    // The same buckets as the monitor's view, the contract's 4 KiB among them.
    assert!(text.contains("lockprobe_service_document_bytes_bucket{phase=\"preLock\",le=\"4096\"} 0"), "{text}");
}

#[tokio::test]
async fn each_version_a_lock_call_writes_is_counted_once_at_its_stored_size() {
    for design in [LockDesign::Embedded, LockDesign::Record] {
        // A registry of the caller's, already holding a metric of its own: both are served.
        let registry = prometheus::Registry::new();
        let own = prometheus::IntCounter::new("caller_own_total", "A metric the caller registered.").unwrap();
        registry.register(Box::new(own)).unwrap();
        let s = service(design, Some(registry.clone())).await;
        let id = "res-1";

        let pre_lock = json!({"owner": "size-test", "durationSeconds": 600, "targetLocation": "northeurope"});
        let (status, view) = s.lock_call(&format!("{id}/lock"), pre_lock.clone(), "pre-1").await;
        assert_eq!(status, StatusCode::CREATED, "{design}: {view}");
        let stored = s.stored_bytes(design, id).await;
        let text = s.scrape(0).await;
        assert!(text.contains("caller_own_total 0"), "{design}: {text}");
        let (count, sum) = histogram(&text, "preLock");
        assert_eq!(count, 1.0, "{design}: {text}");
        // The version as the store holds it, pending record included: a locked document
        // of a few hundred bytes to about a kilobyte, well under the budget.
        assert_eq!(sum, stored, "{design}");
        assert!((300.0..4096.0).contains(&sum), "{design}: {sum} bytes");
        assert_eq!(histogram(&text, "hardDelete").0 + histogram(&text, "unlocked").0, 0.0, "{design}");

        // Repeated under its idempotency key, the pre-lock writes nothing: no new version.
        let (status, again) = s.lock_call(&format!("{id}/lock"), pre_lock, "pre-1").await;
        assert_eq!((status, &again["token"]), (StatusCode::CREATED, &view["token"]), "{design}");
        // The other instance serves the same registry and counts.
        assert_eq!(histogram(&s.scrape(1).await, "preLock").0, 1.0, "{design}");

        // Past the convergence delay: hardDelete, then the release, each its own phase.
        s.clock.advance(TTL + BOUND + DEFAULT_SKEW_MARGIN);
        let token = view["token"].as_str().unwrap();
        let escalate = json!({"token": token, "phase": "hardDelete", "durationSeconds": 60});
        let (status, body) = s.lock_call(&format!("{id}/lock/escalate"), escalate, "esc-1").await;
        assert_eq!(status, StatusCode::OK, "{design}: {body}");
        let hard_delete = s.stored_bytes(design, id).await;
        let released = s
            .http
            .delete(format!("{}/v1/resources/{id}/lock", s.urls[1]))
            .bearer_auth(KEY)
            .header("lock-token", token)
            .send()
            .await
            .unwrap();
        assert_eq!(released.status(), StatusCode::NO_CONTENT, "{design}");
        let unlocked = s.stored_bytes(design, id).await;

        let text = s.scrape(0).await;
        assert_eq!(histogram(&text, "preLock"), (1.0, stored), "{design}");
        assert_eq!(histogram(&text, "hardDelete"), (1.0, hard_delete), "{design}");
        assert_eq!(histogram(&text, "unlocked"), (1.0, unlocked), "{design}");
        assert_eq!(histogram(&text, "write").0, 0.0, "{design}");
        // Each call adds its record: the document grows through the lifecycle.
        assert!(stored < hard_delete, "{design}: {stored} then {hard_delete}");
        // The registry the caller passed in holds the service's metrics.
        assert!(lockprobe::exposition::render(&registry).contains("lockprobe_service_document_bytes_count"));
    }
}
