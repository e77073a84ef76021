//! The monitor's own loop: it follows the stream, sweeps, scans, survives store
//! failures and stops on shutdown. Lock time is a manual clock; the loop's own
//! intervals are tens of milliseconds of real time (tokio's paused clock needs the
//! `test-util` feature, which the manifest does not enable), so the test waits for
//! what it expects with a generous deadline instead of sleeping a fixed time that a
//! loaded machine may overrun.

#[path = "support/stores.rs"]
mod stores;

use std::sync::Arc;
use std::time::Duration;

use lockprobe::clock::{Clock, ManualClock};
use lockprobe::monitor::{Monitor, MonitorConfig, Outcome};
use lockprobe::routing::cache::TieredCache;
use lockprobe::routing::{
    ClientOptions, LocationDocument, LockPolicy, LockToken, Phase, PreLockRequest, RoutingClient,
};
use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
use lockprobe::store::OpKind;
use lockprobe::store::{
    ChangeBatch, ChangeCursor, Committed, ETag, LocationStore, ReadFrom, ScanPage, StoreError, Versioned,
};
use lockprobe::testing::FaultAction;
use prometheus::{Encoder, TextEncoder};
use tokio_util::sync::CancellationToken;

const S: Duration = Duration::from_secs(1);

fn metrics_text(registry: &prometheus::Registry) -> String {
    let mut buf = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut buf).unwrap();
    String::from_utf8(buf).unwrap()
}

/// Waits until `done` holds, checking every few milliseconds; fails after 10 s.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + 10 * S;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn the_loop_follows_the_stream_finds_a_lapse_and_stops_on_shutdown() {
    let clock = Arc::new(ManualClock::at_epoch());
    let store = stores::Instrumented::new(clock.clone(), MemoryStoreConfig::default());
    let client = RoutingClient::new(
        store.store(),
        clock.clone(),
        TieredCache::try_new(&[S]).unwrap(),
        // No skew margin: escalations come exactly at the declared delay.
        LockPolicy { skew_margin: Duration::ZERO, ..LockPolicy::new(2 * S, 60 * S) },
        ClientOptions::default(),
    );
    let registry = prometheus::Registry::new();
    let config = MonitorConfig {
        poll_interval: Duration::from_millis(10),
        sweep_interval: Duration::from_millis(30),
        // Only the scan at start runs, however slow the machine.
        scan_interval: 3600 * S,
        lapse_grace: S,
        escalation_buffer: S,
        ..MonitorConfig::default()
    };
    let dyn_store: Arc<dyn LocationStore> = store.store();
    let dyn_clock: Arc<dyn Clock> = clock.clone();
    let monitor = Arc::new(Monitor::new(dyn_store, dyn_clock, config, &registry).unwrap());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(monitor.clone().run(shutdown.clone()));

    client.resolve_or_create("r1", "westeurope").await.unwrap();
    let req = PreLockRequest { owner: "t".into(), duration: 5 * S, target_location: None };
    client.pre_lock("r1", &req).await.unwrap();
    // A failing poll is counted and retried on the next tick.
    store.inject(OpKind::ReadChanges, FaultAction::Fail, 1);
    let failed_poll = "lockprobe_monitor_store_errors_total{op=\"read_changes\"} 1";
    eventually("the failed poll is counted", || metrics_text(&registry).contains(failed_poll)).await;
    eventually("the pre-lock is seen", || monitor.in_flight() == 1).await;
    // The version is measured as the store holds it, its pending record included (the
    // settled view the monitor judges by drops it).
    let stored = store.store().read("r1", ReadFrom::WriteRegion).await.unwrap();
    assert!(stored.doc.pending.is_some(), "a pre-lock's version carries its pending record");
    let measured = format!(
        "lockprobe_monitor_document_bytes_sum{{phase=\"preLock\",source=\"fleet\"}} {}\n",
        stored.doc.serialized_len()
    );
    assert!(metrics_text(&registry).contains(&measured), "{measured}");

    // The lease (2 s delay + 5 s) runs out; no event follows; the sweep notices.
    clock.advance(10 * S);
    eventually("the sweep finds the lapse", || monitor.orphaned_locks() == 1).await;
    assert_eq!(monitor.outcomes(Outcome::Lapsed), 1);
    assert_eq!(monitor.in_flight(), 0);

    shutdown.cancel();
    tokio::time::timeout(10 * S, task).await.expect("run stops on shutdown").unwrap();

    let text = metrics_text(&registry);
    assert!(text.contains(failed_poll), "one injected failure, counted once: {text}");
    assert!(text.contains("lockprobe_monitor_scans_total 1"), "the first scan runs at start: {text}");
}

#[test]
fn registering_twice_on_one_registry_is_an_error_not_a_panic() {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::at_epoch());
    let store: Arc<dyn LocationStore> = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    let registry = prometheus::Registry::new();
    Monitor::new(store.clone(), clock.clone(), MonitorConfig::default(), &registry).unwrap();
    let err = Monitor::new(store, clock, MonitorConfig::default(), &registry).unwrap_err();
    assert!(err.to_string().contains("cannot register monitor metrics"), "{err}");
}

/// The memory store, except that the next scan page is read, then a swap commits
/// while the page is still on its way back (the manual clock moving on meanwhile).
#[derive(Debug)]
struct SwapDuringScan {
    inner: Arc<MemoryStore>,
    clock: Arc<ManualClock>,
    swap: std::sync::Mutex<Option<(Arc<RoutingClient>, LockToken)>>,
}

#[async_trait::async_trait]
impl LocationStore for SwapDuringScan {
    async fn read(&self, id: &str, from: ReadFrom) -> Result<Versioned, StoreError> {
        self.inner.read(id, from).await
    }
    async fn create(&self, doc: &LocationDocument) -> Result<Committed, StoreError> {
        self.inner.create(doc).await
    }
    async fn replace(&self, doc: &LocationDocument, if_match: &ETag) -> Result<Committed, StoreError> {
        self.inner.replace(doc, if_match).await
    }
    async fn read_changes(&self, cursor: &ChangeCursor, limit: usize) -> Result<ChangeBatch, StoreError> {
        self.inner.read_changes(cursor, limit).await
    }
    async fn scan(&self, after: Option<&str>, limit: usize) -> Result<ScanPage, StoreError> {
        let page = self.inner.scan(after, limit).await?;
        let armed = self.swap.lock().unwrap().take();
        if let Some((client, token)) = armed {
            self.clock.advance(Duration::from_millis(500));
            client.swap("r1", &token, "northeurope").await.unwrap();
            self.clock.advance(Duration::from_millis(500));
        }
        Ok(page)
    }
}

#[tokio::test]
async fn a_swap_committed_while_a_scan_page_is_in_flight_is_not_mistaken_for_a_lapse() {
    let clock = Arc::new(ManualClock::at_epoch());
    let store = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    let client = Arc::new(RoutingClient::new(
        store.clone(),
        clock.clone(),
        TieredCache::try_new(&[S]).unwrap(),
        LockPolicy { skew_margin: Duration::ZERO, ..LockPolicy::new(2 * S, 300 * S) },
        ClientOptions::default(),
    ));
    client.resolve_or_create("r1", "westeurope").await.unwrap();
    let req = PreLockRequest { owner: "t".into(), duration: 100 * S, target_location: Some("northeurope".into()) };
    let token = client.pre_lock("r1", &req).await.unwrap().token;
    clock.advance(5 * S);
    client.escalate("r1", &token, Phase::HardDelete, 60 * S).await.unwrap();
    client.escalate("r1", &token, Phase::Write, 30 * S).await.unwrap();

    let watched = Arc::new(SwapDuringScan { inner: store.clone(), clock: clock.clone(), swap: Default::default() });
    let config = MonitorConfig { lapse_grace: S, escalation_buffer: S, ..MonitorConfig::default() };
    let dyn_clock: Arc<dyn Clock> = clock.clone();
    let monitor = Monitor::new(watched.clone(), dyn_clock, config, &prometheus::Registry::new()).unwrap();
    monitor.drain().await.unwrap();
    assert_eq!(monitor.in_flight(), 1);

    *watched.swap.lock().unwrap() = Some((client.clone(), token));
    monitor.scan_once().await.unwrap();
    monitor.drain().await.unwrap();
    assert_eq!(monitor.outcomes(Outcome::Swapped), 1, "the stream's swap counts");

    // Long after every lease: nothing lapsed, nothing is orphaned.
    clock.advance(600 * S);
    monitor.sweep();
    monitor.scan_once().await.unwrap();
    assert_eq!((monitor.outcomes(Outcome::Lapsed), monitor.orphaned_locks(), monitor.in_flight()), (0, 0, 0));
}
