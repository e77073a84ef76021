//! A simulated fleet: hundreds of concurrent migrations driven through the routing
//! library on the in-memory store with a manual clock, with a known number of
//! injected anomalies. The monitor must count each exactly, report nothing on a clean
//! fleet, and a restarted monitor must lose no orphan.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use lockprobe::clock::{Clock, ManualClock};
use lockprobe::monitor::{Monitor, MonitorConfig, Outcome};
use lockprobe::routing::cache::TieredCache;
use lockprobe::routing::LocationDocument;
use lockprobe::routing::{
    ClientOptions, LockError, LockPolicy, LockToken, Phase, PreLockRequest, RoutingClient, RoutingError,
};
use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
use lockprobe::store::{
    ChangeBatch, ChangeCursor, Committed, ETag, LocationStore, ReadFrom, ScanPage, StoreError, Versioned,
};
use prometheus::{Encoder, TextEncoder};

const S: Duration = Duration::from_secs(1);
const DELAY: u64 = 10;
const BUFFER: u64 = 5;
const HOME: &str = "westeurope";
const TARGET: &str = "northeurope";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Waits delay + buffer, escalates, swaps (or releases), maybe renews.
    Clean { release: bool, renewals: u32 },
    /// Escalates after effectiveAt but inside the buffer.
    EarlyInsideBuffer,
    /// A client that declares a shorter delay than the service: escalates "on time"
    /// by its own declaration.
    EarlyUnderDeclared,
    /// Takes a pre-lock and never comes back.
    Abandoned,
    /// Its write lease runs out before the swap; retries with a fresh lock.
    LeaseExpires,
    /// Forged: location moved to the target while the lock remains.
    ForgeMovedToTarget,
    /// Forged: location moved somewhere else while the lock remains.
    ForgeMovedElsewhere,
    /// Forged: lock present and `secondary` already names the current location.
    ForgeLockedAtTarget,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    PreLock,
    HardDelete,
    Renew(u32),
    Write,
    Swap,
    Release,
    Forge,
    Done,
}

#[derive(Debug)]
struct Mig {
    id: String,
    kind: Kind,
    i: u64,
    token: Option<LockToken>,
    step: Step,
    next: u64,
    retried: bool,
}

struct Fleet {
    clock: Arc<ManualClock>,
    store: Arc<MemoryStore>,
    clients: Vec<Arc<RoutingClient>>,
    short_client: Arc<RoutingClient>,
    migs: Vec<Mig>,
    tokens_seen: Vec<String>,
}

fn client(store: &Arc<MemoryStore>, clock: &Arc<ManualClock>, delay: u64) -> Arc<RoutingClient> {
    // No skew margin: the fleet escalates exactly at the declared delay.
    let policy = LockPolicy { skew_margin: Duration::ZERO, ..LockPolicy::new(S * delay as u32, S * 3600) };
    Arc::new(RoutingClient::new(
        store.clone(),
        clock.clone(),
        TieredCache::try_new(&[S]).unwrap(),
        policy,
        ClientOptions::default(),
    ))
}

fn monitor_config() -> MonitorConfig {
    MonitorConfig {
        escalation_buffer: S * BUFFER as u32,
        declared_delay: Some(S * DELAY as u32),
        lapse_grace: 2 * S,
        poll_batch: 64,
        scan_page: 50,
        ..MonitorConfig::default()
    }
}

/// The anomalies of a fleet, by kind, and how many clean migrations surround them.
#[derive(Debug, Clone, Copy, Default)]
struct Mix {
    clean: u64,
    early_inside_buffer: u64,
    early_under_declared: u64,
    abandoned: u64,
    lease_expires: u64,
    forged: bool,
}

impl Fleet {
    fn new(mix: Mix, log_capacity: usize) -> Self {
        let clock = Arc::new(ManualClock::at_epoch());
        let store = Arc::new(MemoryStore::new(
            clock.clone(),
            MemoryStoreConfig { replica_lag: Duration::ZERO, change_log_capacity: log_capacity },
        ));
        let clients = (0..3).map(|_| client(&store, &clock, DELAY)).collect();
        let short_client = client(&store, &clock, 4);
        let mut kinds = Vec::new();
        for i in 0..mix.clean {
            kinds.push(Kind::Clean { release: i % 10 == 0, renewals: (i % 3) as u32 });
        }
        kinds.extend(std::iter::repeat_n(Kind::EarlyInsideBuffer, mix.early_inside_buffer as usize));
        kinds.extend(std::iter::repeat_n(Kind::EarlyUnderDeclared, mix.early_under_declared as usize));
        kinds.extend(std::iter::repeat_n(Kind::Abandoned, mix.abandoned as usize));
        kinds.extend(std::iter::repeat_n(Kind::LeaseExpires, mix.lease_expires as usize));
        if mix.forged {
            kinds.extend([Kind::ForgeMovedToTarget, Kind::ForgeMovedElsewhere, Kind::ForgeLockedAtTarget]);
        }
        let migs = kinds
            .into_iter()
            .enumerate()
            .map(|(i, kind)| Mig {
                id: format!("res-{i:04}"),
                kind,
                i: i as u64,
                token: None,
                step: Step::PreLock,
                next: i as u64 % 20,
                retried: false,
            })
            .collect();
        Fleet { clock, store, clients, short_client, migs, tokens_seen: Vec::new() }
    }

    async fn seed(&self) {
        for m in &self.migs {
            self.clients[0].resolve_or_create(&m.id, HOME).await.unwrap();
        }
    }

    /// Runs every migration step due at `tick`, concurrently.
    async fn tick(&mut self, tick: u64) {
        let store = self.store.clone();
        let clients = self.clients.clone();
        let short = self.short_client.clone();
        let due = self.migs.iter_mut().filter(|m| m.step != Step::Done && m.next == tick);
        let tokens: Vec<Option<String>> = join_all(due.map(|m| {
            let client =
                if m.kind == Kind::EarlyUnderDeclared { short.clone() } else { clients[m.i as usize % 3].clone() };
            advance(m, tick, client, store.clone())
        }))
        .await;
        self.tokens_seen.extend(tokens.into_iter().flatten());
    }

    fn pending(&self) -> usize {
        self.migs.iter().filter(|m| m.step != Step::Done).count()
    }
}

/// One step of one migration; returns a newly issued token (so the test can check
/// it never leaks into the monitor's output).
async fn advance(m: &mut Mig, tick: u64, client: Arc<RoutingClient>, store: Arc<MemoryStore>) -> Option<String> {
    let token = m.token.clone();
    let tok = || token.clone().expect("a lock was taken");
    let mut issued = None;
    match m.step {
        Step::PreLock => {
            let duration = if m.kind == Kind::Abandoned { 20 * S } else { 300 * S };
            let target = if m.kind == Kind::ForgeLockedAtTarget { None } else { Some(TARGET.to_owned()) };
            let grant = client
                .pre_lock(&m.id, &PreLockRequest { owner: "fleet".into(), duration, target_location: target })
                .await
                .unwrap();
            issued = Some(grant.token.expose().to_owned());
            m.token = Some(grant.token);
            (m.step, m.next) = match m.kind {
                Kind::Abandoned => (Step::Done, 0),
                Kind::EarlyInsideBuffer => (Step::HardDelete, tick + DELAY + m.i % 4),
                Kind::EarlyUnderDeclared => (Step::HardDelete, tick + 9),
                Kind::Clean { .. } => (Step::HardDelete, tick + DELAY + BUFFER + m.i % 5),
                _ => (Step::HardDelete, tick + DELAY + BUFFER),
            };
        }
        Step::HardDelete => {
            client.escalate(&m.id, &tok(), Phase::HardDelete, 60 * S).await.unwrap();
            (m.step, m.next) = match m.kind {
                Kind::Clean { renewals, .. } if renewals > 0 => (Step::Renew(renewals), tick + 2),
                Kind::Clean { .. } => (Step::Write, tick + 5 + m.i % 7),
                _ => (Step::Write, tick + 5),
            };
        }
        Step::Renew(left) => {
            client.renew(&m.id, &tok(), 60 * S).await.unwrap();
            (m.step, m.next) = if left > 1 { (Step::Renew(left - 1), tick + 2) } else { (Step::Write, tick + 3) };
        }
        Step::Write => {
            let lease = if m.kind == Kind::LeaseExpires && !m.retried { 5 * S } else { 30 * S };
            client.escalate(&m.id, &tok(), Phase::Write, lease).await.unwrap();
            (m.step, m.next) = match m.kind {
                Kind::Clean { release: true, .. } => (Step::Release, tick + 1 + m.i % 9),
                Kind::Clean { .. } => (Step::Swap, tick + 1 + m.i % 9),
                Kind::LeaseExpires if !m.retried => (Step::Swap, tick + 10),
                Kind::ForgeMovedToTarget | Kind::ForgeMovedElsewhere | Kind::ForgeLockedAtTarget => {
                    (Step::Forge, tick + 2)
                }
                _ => (Step::Swap, tick + 3),
            };
        }
        Step::Swap => match client.swap(&m.id, &tok(), TARGET).await {
            Ok(_) => m.step = Step::Done,
            Err(RoutingError::Lock(LockError::LeaseExpired { .. })) if m.kind == Kind::LeaseExpires && !m.retried => {
                // The orchestrator's lease lapsed mid-migration: retry with a fresh lock.
                m.retried = true;
                (m.step, m.next) = (Step::PreLock, tick + 1);
            }
            Err(e) => panic!("{}: swap failed: {e}", m.id),
        },
        Step::Release => {
            client.release(&m.id, &tok()).await.unwrap();
            m.step = Step::Done;
        }
        Step::Forge => {
            // What this library never writes: location and lock disagreeing.
            let mut doc = store.read(&m.id, ReadFrom::WriteRegion).await.unwrap().doc;
            match m.kind {
                Kind::ForgeMovedToTarget => doc.primary.location = TARGET.into(),
                Kind::ForgeMovedElsewhere => doc.primary.location = "eastus".into(),
                _ => doc.secondary = Some(doc.primary.clone()),
            }
            store.put_raw(&m.id, doc.to_json());
            (m.step, m.next) = (Step::Release, tick + 4);
        }
        Step::Done => {}
    }
    issued
}

/// Runs the fleet to completion, the monitor following every tick (scan every 30).
async fn run(fleet: &mut Fleet, monitor: &Monitor, ticks: u64) {
    run_polling_every(fleet, monitor, ticks, 1).await;
}

/// Runs the fleet, the monitor polling every `every` ticks (scan every 30).
async fn run_polling_every(fleet: &mut Fleet, monitor: &Monitor, ticks: u64, every: u64) {
    for tick in 0..ticks {
        fleet.tick(tick).await;
        if tick % every == 0 {
            monitor.drain().await.unwrap();
            monitor.sweep();
        }
        if tick % 30 == 29 {
            monitor.scan_once().await.unwrap();
        }
        fleet.clock.advance(S);
    }
}

fn metrics_text(registry: &prometheus::Registry) -> String {
    let mut buf = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut buf).unwrap();
    String::from_utf8(buf).unwrap()
}

/// No lock token the fleet was issued appears in the metrics or the status document.
fn assert_no_token_in(fleet: &Fleet, metrics: &str, status: &lockprobe::monitor::MonitorStatus) {
    assert!(!fleet.tokens_seen.is_empty(), "the fleet took locks");
    let status = serde_json::to_string(status).unwrap();
    for token in &fleet.tokens_seen {
        assert!(!metrics.contains(token.as_str()) && !status.contains(token.as_str()), "a lock token leaked");
    }
}

fn new_monitor(fleet: &Fleet) -> (Monitor, prometheus::Registry) {
    monitor_over(fleet, fleet.store.clone(), monitor_config())
}

fn monitor_over(
    fleet: &Fleet,
    store: Arc<dyn LocationStore>,
    config: MonitorConfig,
) -> (Monitor, prometheus::Registry) {
    let registry = prometheus::Registry::new();
    let clock: Arc<dyn Clock> = fleet.clock.clone();
    (Monitor::new(store, clock, config, &registry).unwrap(), registry)
}

/// The in-memory store behind a change stream like Cosmos DB's: optionally each batch
/// carries only the latest version of each document it touches (change-feed
/// semantics), and commit times may come from a clock far from the lock's (`_ts` is
/// server time).
#[derive(Debug)]
struct CosmosLike {
    inner: Arc<MemoryStore>,
    latest_only: bool,
    commit_skew: chrono::TimeDelta,
}

#[async_trait::async_trait]
impl LocationStore for CosmosLike {
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
        let mut batch = self.inner.read_changes(cursor, limit).await?;
        if self.latest_only {
            let mut newest = std::collections::HashMap::new();
            for (i, c) in batch.changes.iter().enumerate() {
                newest.insert(c.doc.doc.id.clone(), i);
            }
            let mut i = 0;
            batch.changes.retain(|c| {
                i += 1;
                newest[&c.doc.doc.id] == i - 1
            });
        }
        for c in &mut batch.changes {
            Arc::make_mut(&mut c.doc).committed_at += self.commit_skew;
        }
        Ok(batch)
    }
    async fn scan(&self, after: Option<&str>, limit: usize) -> Result<ScanPage, StoreError> {
        self.inner.scan(after, limit).await
    }
}

#[tokio::test]
async fn a_clean_fleet_reports_no_anomaly() {
    let mut fleet = Fleet::new(Mix { clean: 300, ..Mix::default() }, 100_000);
    fleet.seed().await;
    let (monitor, registry) = new_monitor(&fleet);
    run(&mut fleet, &monitor, 120).await;
    assert_eq!(fleet.pending(), 0);
    monitor.scan_once().await.unwrap();

    assert_eq!(monitor.early_escalations(), 0);
    assert_eq!(monitor.partial_cutovers(), 0);
    assert_eq!(monitor.orphaned_locks(), 0);
    assert_eq!(monitor.outcomes(Outcome::Lapsed), 0);
    assert_eq!(monitor.outcomes(Outcome::Released), 30);
    assert_eq!(monitor.outcomes(Outcome::Swapped), 270);
    assert_eq!(monitor.in_flight(), 0);

    let status = monitor.status();
    let renewals: u64 = (0..300u64).map(|i| i % 3).sum();
    assert_eq!(status.renewals, renewals);
    // Every migration's hold was timed; write holds were planned at 1..=9 s.
    let write = &status.phase_duration_seconds.write;
    assert_eq!(write.count, 300);
    assert!(write.max.unwrap() <= 9.0, "{status:?}");
    assert!(write.p50.unwrap() >= 1.0);
    // Clean escalations came at delay + buffer (15 s) plus 0..4 s of jitter.
    let interval = &status.escalation_interval_seconds;
    assert_eq!(interval.count, 300);
    assert!(interval.p50.unwrap() >= 15.0 && interval.max.unwrap() <= 19.0, "{status:?}");

    let text = metrics_text(&registry);
    assert!(text.contains("lockprobe_monitor_early_escalations_total{source=\"fleet\"} 0"));
    assert!(text.contains("lockprobe_monitor_migrations_total{outcome=\"swapped\",source=\"fleet\"} 270"));
    // Every version written was measured once, by the phase it is in, and a clean
    // migration's documents stay well inside the contract's 4 KiB budget.
    for phase in ["preLock", "hardDelete", "write", "unlocked"] {
        let labels = format!("{{phase=\"{phase}\",source=\"fleet\"}}");
        let count = series(&text, &format!("lockprobe_monitor_document_bytes_count{labels}"));
        let sum = series(&text, &format!("lockprobe_monitor_document_bytes_sum{labels}"));
        assert!(count >= 300.0, "{phase}: {count} versions measured");
        let mean = sum / count;
        println!("document bytes, {phase}: {count} versions, mean {mean:.0}");
        assert!((150.0..4096.0).contains(&mean), "{phase}: mean {mean} bytes");
        let within =
            format!("lockprobe_monitor_document_bytes_bucket{{phase=\"{phase}\",source=\"fleet\",le=\"4096\"}}");
        assert_eq!(series(&text, &within), count, "{phase}: every version within 4 KiB");
    }
    assert_no_token_in(&fleet, &text, &status);
}

#[tokio::test]
async fn every_injected_anomaly_is_counted_exactly() {
    let mix = Mix {
        clean: 300,
        early_inside_buffer: 7,
        early_under_declared: 3,
        abandoned: 5,
        lease_expires: 4,
        forged: true,
    };
    let mut fleet = Fleet::new(mix, 100_000);
    fleet.seed().await;
    let (monitor, registry) = new_monitor(&fleet);
    run(&mut fleet, &monitor, 120).await;
    assert_eq!(fleet.pending(), 0, "every migration ran its plan");
    monitor.scan_once().await.unwrap();

    assert_eq!(monitor.early_escalations(), 7 + 3);
    assert_eq!(monitor.partial_cutovers(), 3);
    assert_eq!(monitor.outcomes(Outcome::Lapsed), 5 + 4, "abandoned + expired mid-migration");
    assert_eq!(monitor.orphaned_locks(), 5, "the retried ones are no longer orphans");
    assert_eq!(monitor.outcomes(Outcome::Swapped), 270 + 7 + 3 + 4);
    assert_eq!(monitor.outcomes(Outcome::Released), 30 + 3);
    assert_eq!(monitor.in_flight(), 0);

    let abandoned: Vec<String> =
        fleet.migs.iter().filter(|m| m.kind == Kind::Abandoned).map(|m| m.id.clone()).collect();
    assert_eq!(monitor.orphan_ids(100), abandoned);

    let text = metrics_text(&registry);
    assert!(text.contains("lockprobe_monitor_early_escalations_total{source=\"fleet\"} 10"), "{text}");
    assert!(text.contains("lockprobe_monitor_partial_cutovers_total{source=\"fleet\"} 3"));
    assert!(text.contains("lockprobe_monitor_orphaned_locks{source=\"fleet\"} 5"));
    assert!(text.contains("lockprobe_monitor_migrations_total{outcome=\"lapsed\",source=\"fleet\"} 9"));
    let status = monitor.status();
    let kinds: BTreeSet<&str> = status.recent_anomalies.iter().map(|a| a.kind.as_str()).collect();
    assert!(kinds.contains("partial_cutover") && kinds.contains("orphaned_lock"), "{status:?}");
    assert_no_token_in(&fleet, &text, &status);
}

#[tokio::test]
async fn a_restarted_monitor_loses_no_orphan() {
    let mix = Mix { clean: 200, abandoned: 6, ..Mix::default() };
    // The change log keeps only the newest 64 changes: a monitor started later cannot
    // replay the abandoned pre-locks from the stream.
    let mut fleet = Fleet::new(mix, 64);
    fleet.seed().await;
    let (first, _) = new_monitor(&fleet);
    run(&mut fleet, &first, 60).await;
    let abandoned: Vec<String> =
        fleet.migs.iter().filter(|m| m.kind == Kind::Abandoned).map(|m| m.id.clone()).collect();
    assert_eq!(first.orphan_ids(100), abandoned, "the first monitor saw them on the stream");
    drop(first);

    for tick in 60..90 {
        fleet.tick(tick).await;
        fleet.clock.advance(S);
    }
    let (second, _) = new_monitor(&fleet);
    second.drain().await.unwrap();
    second.sweep();
    assert!(second.orphaned_locks() < abandoned.len(), "the stream alone must miss some, or this test proves nothing");
    second.scan_once().await.unwrap();
    assert_eq!(second.orphan_ids(100), abandoned, "the scan finds what the stream missed");
    assert_eq!(second.early_escalations(), 0);
    assert_eq!(second.partial_cutovers(), 0);
}

#[tokio::test]
async fn latest_only_delivery_counts_the_same_anomalies() {
    let mix = Mix {
        clean: 300,
        early_inside_buffer: 7,
        early_under_declared: 3,
        abandoned: 5,
        lease_expires: 4,
        forged: true,
    };
    let mut fleet = Fleet::new(mix, 100_000);
    fleet.seed().await;
    // Polling every third second, a whole poll in one batch: versions of one document
    // written within a poll arrive as one (renewals, write + swap, ...).
    let config = MonitorConfig { poll_batch: 100_000, ..monitor_config() };
    let store = CosmosLike { inner: fleet.store.clone(), latest_only: true, commit_skew: chrono::TimeDelta::zero() };
    let (monitor, _) = monitor_over(&fleet, Arc::new(store), config);
    run_polling_every(&mut fleet, &monitor, 120, 3).await;
    assert_eq!(fleet.pending(), 0);
    monitor.drain().await.unwrap();
    monitor.sweep();
    monitor.scan_once().await.unwrap();
    let delivered = monitor.status().changes;
    let written = fleet.store.changes_logged();
    assert!(delivered + 100 < written, "versions must really collapse: {delivered} of {written}");

    assert_eq!(monitor.early_escalations(), 10);
    assert_eq!(monitor.partial_cutovers(), 3);
    assert_eq!(monitor.outcomes(Outcome::Lapsed), 9);
    assert_eq!(monitor.orphaned_locks(), 5);
    assert_eq!(monitor.outcomes(Outcome::Swapped), 270 + 7 + 3 + 4);
    assert_eq!(monitor.outcomes(Outcome::Released), 30 + 3);
    assert_eq!(monitor.in_flight(), 0);
}

#[tokio::test]
async fn commit_times_from_a_clock_far_ahead_change_nothing() {
    // Cosmos `_ts` is the server's real time; tests run locks on a manual clock at
    // 2026-01-01. A monitor that trusted those commit times would see every lock lapsed.
    let mix =
        Mix { clean: 100, early_inside_buffer: 3, abandoned: 2, lease_expires: 2, forged: true, ..Mix::default() };
    let mut fleet = Fleet::new(mix, 100_000);
    fleet.seed().await;
    let store =
        CosmosLike { inner: fleet.store.clone(), latest_only: false, commit_skew: chrono::TimeDelta::days(300) };
    let (monitor, _) = monitor_over(&fleet, Arc::new(store), monitor_config());
    run(&mut fleet, &monitor, 120).await;
    assert_eq!(fleet.pending(), 0);
    monitor.scan_once().await.unwrap();
    assert_eq!(monitor.early_escalations(), 3);
    assert_eq!(monitor.partial_cutovers(), 3);
    assert_eq!(monitor.outcomes(Outcome::Lapsed), 2 + 2);
    assert_eq!(monitor.orphaned_locks(), 2);
    assert_eq!(monitor.outcomes(Outcome::Swapped), 90 + 3 + 2);
    assert_eq!(monitor.outcomes(Outcome::Released), 10 + 3);
}

/// A pre-lock of `id` by the fleet, written through the routing library.
async fn fleet_pre_lock(client: &RoutingClient, id: &str) -> LockToken {
    let req = PreLockRequest { owner: "fleet".into(), duration: 600 * S, target_location: Some(TARGET.into()) };
    client.pre_lock_or_create(id, HOME, &req).await.unwrap().token
}

/// A metric's value in the text exposition, by its full series name.
fn series(text: &str, name: &str) -> f64 {
    let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in:\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// One document the library cannot read (a newer library's format, or none at all) must
/// not blind the monitor: the change stream and every scan page go on past it, it is
/// counted by reason and listed, a migration whose document turned unreadable is no
/// longer followed (so it is never counted lapsed on a guess), and a readable version
/// brings the document back.
#[tokio::test]
async fn documents_it_cannot_read_are_skipped_counted_and_hide_nothing_else() {
    let clock = Arc::new(ManualClock::at_epoch());
    let store = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    let fleet = client(&store, &clock, DELAY);
    let registry = prometheus::Registry::new();
    // Pages of one: a scan page that holds only an unreadable document must still move on.
    let config = MonitorConfig { scan_page: 1, poll_batch: 2, ..monitor_config() };
    let monitor = Monitor::new(store.clone(), clock.clone(), config, &registry).unwrap();

    // Readable ids around the unreadable ones, in both id order and commit order.
    fleet_pre_lock(&fleet, "a-res").await;
    store.put_raw("b-newer", serde_json::json!({"id": "b-newer", "schemaVersion": 99, "somethingNew": {}}));
    store.put_raw("c-malformed", serde_json::json!({"id": "c-malformed", "schemaVersion": 1, "primary": "x"}));
    fleet_pre_lock(&fleet, "d-res").await;
    fleet_pre_lock(&fleet, "e-res").await;
    assert_eq!(monitor.drain().await.unwrap(), 5, "every version read, the unreadable ones included");
    assert_eq!(monitor.in_flight(), 3, "the pre-locks after the unreadable documents were seen");
    let status = monitor.status();
    assert_eq!(status.unreadable_documents, 2);
    let listed: Vec<(&str, &str)> =
        status.unreadable.iter().map(|u| (u.resource.as_str(), u.reason.as_str())).collect();
    assert_eq!(listed, [("b-newer", "unsupported-format"), ("c-malformed", "malformed")]);

    let report = monitor.scan_once().await.unwrap();
    assert_eq!((report.documents, report.unreadable), (3, 2), "the scan went on past them");
    let text = metrics_text(&registry);
    assert_eq!(series(&text, "lockprobe_monitor_unreadable_documents{reason=\"unsupported-format\"}"), 1.0);
    assert_eq!(series(&text, "lockprobe_monitor_unreadable_documents{reason=\"malformed\"}"), 1.0);
    assert_eq!(
        series(&text, "lockprobe_monitor_unreadable_documents_total{reason=\"unsupported-format\"}"),
        1.0,
        "counted once, not once per scan and stream"
    );
    assert_eq!(series(&text, "lockprobe_monitor_store_errors_total{op=\"scan\"}"), 0.0);
    assert_eq!(series(&text, "lockprobe_monitor_store_errors_total{op=\"read_changes\"}"), 0.0);

    // A newer library takes over e-res: its document turns unreadable mid-migration.
    // The monitor stops following it rather than count a lapse it cannot know of.
    let mut newer = store.read("e-res", ReadFrom::WriteRegion).await.unwrap().doc.to_json();
    newer["schemaVersion"] = serde_json::json!(99);
    store.put_raw("e-res", newer);
    monitor.drain().await.unwrap();
    assert_eq!((monitor.in_flight(), monitor.status().unreadable_documents), (2, 3));
    clock.advance(3600 * S);
    monitor.sweep();
    assert_eq!(monitor.outcomes(Outcome::Lapsed), 2, "a-res and d-res lapsed; e-res is not judged");
    assert!(!monitor.orphan_ids(10).contains(&"e-res".to_owned()));

    // A readable version of b-newer (an operator restored it): listed no more, followed again.
    store.put_raw("b-newer", LocationDocument::new("b-newer", HOME).to_json());
    monitor.drain().await.unwrap();
    assert_eq!(monitor.status().unreadable_documents, 2);
    monitor.scan_once().await.unwrap();
    let text = metrics_text(&registry);
    assert_eq!(series(&text, "lockprobe_monitor_unreadable_documents{reason=\"unsupported-format\"}"), 1.0, "e-res");
    assert_eq!(series(&text, "lockprobe_monitor_unreadable_documents_total{reason=\"unsupported-format\"}"), 2.0);
}
