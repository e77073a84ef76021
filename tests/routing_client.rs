//! The routing client's own paths, between the lifecycle's decisions and the store: the
//! decision age a store read may take, the wait before a swap's copy, the second write
//! of the lock-record design, a lock call whose write timed out and then landed void,
//! and what the client hands a service (route names, lent locks, the store's region).
//! Each test was written for a change cargo-mutants made to `src/routing/client.rs` that
//! no test noticed (RELIABILITY.md, "Mutation score of the routing core").
//!
//! Time is tokio's paused clock (`start_paused`), read by the client and the memory
//! store through [`TokioClock`]: the seconds below are virtual and exact.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{sleep, Instant};

use lockprobe::clock::{Clock, TokioClock};
use lockprobe::routing::cache::TieredCache;
use lockprobe::routing::lifecycle::settle;
use lockprobe::routing::{
    ClientOptions, LocationDocument, LockError, LockPolicy, Phase, PreLockRequest, RoutingClient, RoutingError, Source,
    SwapPlan,
};
use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
use lockprobe::store::{
    ChangeBatch, ChangeCursor, Committed, ETag, LocationStore, ReadFrom, ScanPage, StoreError, Versioned,
};
use lockprobe::testing::FaultyStore;

const TTL: Duration = Duration::from_secs(1);
const LAG: Duration = Duration::from_secs(1);
const MARGIN: Duration = Duration::from_secs(2);
const DECISION_AGE: Duration = Duration::from_secs(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn policy() -> LockPolicy {
    LockPolicy { skew_margin: MARGIN, ..LockPolicy::declared(TTL, LAG, Duration::from_secs(3600)) }
}

fn client(store: Arc<dyn LocationStore>, clock: Arc<dyn Clock>) -> RoutingClient {
    let options = ClientOptions { max_decision_age: DECISION_AGE, ..ClientOptions::default() };
    RoutingClient::new(store, clock, TieredCache::try_new(&[TTL]).unwrap(), policy(), options)
}

/// A memory store holding resource `r` at `westeurope`, behind a fault injector with no
/// rules yet, on a clock that follows tokio's.
async fn faulty_store() -> (Arc<FaultyStore>, Arc<dyn Clock>) {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::at_epoch());
    let memory = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    memory.create(&LocationDocument::new("r", "westeurope")).await.unwrap();
    (Arc::new(FaultyStore::new(memory, clock.clone(), 7)), clock)
}

fn pre_lock_request() -> PreLockRequest {
    PreLockRequest { owner: "test".into(), duration: Duration::from_secs(600), target_location: None }
}

#[tokio::test(start_paused = true)]
async fn a_store_read_slower_than_the_decision_age_is_not_acted_on() {
    // At the age itself the read is still used; past it, the answer may be older than
    // the lock state a decision needs, so the resolve fails as unavailable.
    for (delay, used) in [(ms(500), true), (DECISION_AGE, true), (DECISION_AGE + ms(1), false), (ms(1500), false)] {
        let (store, clock) = faulty_store().await;
        store.add_rule(format!("reads:delay={}ms", delay.as_millis()).parse().unwrap());
        let answer = client(store, clock).resolve("r").await;
        match answer {
            Ok(route) => assert!(used, "a read of {delay:?} was used: {:?}", route.source),
            Err(RoutingError::Unavailable(why)) => {
                assert!(!used, "a read of {delay:?} was refused: {why}");
                assert!(why.contains("later than the 1.000s a decision may take"), "{why}");
            }
            Err(other) => panic!("a read of {delay:?}: {other:?}"),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn prepare_swap_waits_until_no_write_decided_before_the_write_lock_can_land() {
    let (store, clock) = faulty_store().await;
    let client = client(store, clock);
    let grant = client.pre_lock("r", &pre_lock_request()).await.unwrap();
    sleep(policy().convergence_delay + MARGIN + ms(100)).await;
    client.escalate("r", &grant.token, Phase::HardDelete, Duration::from_secs(60)).await.unwrap();
    let write = client.escalate("r", &grant.token, Phase::Write, Duration::from_secs(60)).await.unwrap();
    let since = write.doc.primary.lock.as_ref().and_then(|l| l.phase_since).expect("the write phase's start");
    assert_eq!(since, client.clock().now(), "the write lock started just now");

    let started = Instant::now();
    let plan = client.prepare_swap("r", &grant.token, "northeurope", None).await.unwrap();
    assert!(matches!(plan, SwapPlan::Copy(_)));
    // The decision age plus the skew margin: a write decided on a view from before the
    // write lock may still be landing until then, and the copy must include it.
    assert_eq!(started.elapsed(), DECISION_AGE + MARGIN);
    // Asked again later, it does not wait.
    let started = Instant::now();
    client.prepare_swap("r", &grant.token, "northeurope", None).await.unwrap();
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn publishing_the_location_a_document_already_has_writes_nothing() {
    let (store, clock) = faulty_store().await;
    let client = client(store.clone(), clock);
    let before = store.read("r", ReadFrom::WriteRegion).await.unwrap();
    let same = client.publish_location("r", "westeurope").await.unwrap();
    assert_eq!(same.etag, before.etag, "no write when the location is there already");
    let moved = client.publish_location("r", "northeurope").await.unwrap();
    assert_ne!(moved.etag, before.etag);
    assert_eq!(store.read("r", ReadFrom::WriteRegion).await.unwrap().doc.primary.location, "northeurope");
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_timed_out_and_landed_after_its_lease_is_answered_as_expired() {
    let (store, clock) = faulty_store().await;
    let client = Arc::new(client(store.clone(), clock));
    let grant = client.pre_lock("r", &pre_lock_request()).await.unwrap();
    sleep(policy().convergence_delay + MARGIN + ms(100)).await;
    let lease = Duration::from_secs(5);
    let hd = client.escalate("r", &grant.token, Phase::HardDelete, lease).await.unwrap();
    let lease_end = hd.doc.primary.lock.as_ref().unwrap().expires_at;
    // The renewal is decided 0.5 s before the lease ends; the store gives up on it at
    // 1 s and commits it at 2 s, after the lease: void. The call's re-read is held back
    // until the commit has landed, so it finds the document moved on without the call's
    // record: the write can no longer be pending, and the call is decided again.
    sleep(lease - ms(500)).await;
    store.add_rule("replace:late-commit=2s,timeout=1s x1".parse().unwrap());
    let renewal = tokio::spawn({
        let (client, token) = (client.clone(), grant.token.clone());
        async move { client.renew("r", &token, Duration::from_secs(30)).await }
    });
    sleep(ms(500)).await;
    store.add_rule("read_write_region:delay=2s x1".parse().unwrap());
    let answer = renewal.await.unwrap();
    assert!(
        matches!(answer, Err(RoutingError::Lock(LockError::LeaseExpired { .. }))),
        "expected the lease's expiry, not an unknown outcome: {answer:?}"
    );
    let stored = store.read("r", ReadFrom::WriteRegion).await.unwrap();
    let settled = settle(stored.doc, stored.committed_at);
    assert_eq!(settled.primary.lock.as_ref().unwrap().expires_at, lease_end, "the late renewal took no effect");
}

#[tokio::test(start_paused = true)]
async fn what_a_service_reads_from_the_client_route_names_lent_locks_and_the_store_region() {
    // The names docs/contract.md gives the `source` of a route view and `Server-Timing`.
    let names = [Source::Cache, Source::ReadThrough, Source::Store].map(Source::as_str);
    assert_eq!(names, ["cache", "read-through", "store"]);

    let clock: Arc<dyn Clock> = Arc::new(TokioClock::at_epoch());
    let memory = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    memory.create(&LocationDocument::new("r", "westeurope")).await.unwrap();
    let client = client(Arc::new(Regional { inner: memory, region: "northeurope" }), clock);
    assert_eq!(client.store_region().as_deref(), Some("northeurope"));

    let grant = client.pre_lock("r", &pre_lock_request()).await.unwrap();
    let lent = client.resolve_with("r", |route| route.lock().map(|l| l.effective_at)).await.unwrap();
    assert_eq!(lent, grant.record.doc.primary.lock.as_ref().map(|l| l.effective_at), "a lent route shows its lock");

    assert!(format!("{client:?}").contains("observer: None"), "{client:?}");
    let observed = client.with_commit_observer(Arc::new(|_| {}));
    assert!(format!("{observed:?}").contains("observer: Some(CommitObserver)"), "{observed:?}");
}

/// The memory store, answering from a named region as a Cosmos DB account does.
#[derive(Debug)]
struct Regional {
    inner: Arc<MemoryStore>,
    region: &'static str,
}

#[async_trait]
impl LocationStore for Regional {
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
        self.inner.scan(after, limit).await
    }

    fn region(&self) -> Option<String> {
        Some(self.region.to_owned())
    }
}

/// A force-release through the client's one write loop: the request and the approval are
/// each answered outcome-unknown once (committed after the client gave up) and
/// recognised on the repeat, and then the old holder is refused by name on another
/// instance sharing the store, whatever its cache holds.
#[tokio::test(start_paused = true)]
async fn a_force_release_survives_ambiguous_writes_and_fences_the_token_on_every_instance() {
    use lockprobe::document::ForceOutcome;
    use lockprobe::routing::force_release::{AdminCall, ForceReleaseRequest};

    let (store, clock) = faulty_store().await;
    let holder = client(store.clone(), clock.clone());
    let other = client(store.clone(), clock.clone());
    let grant = holder.pre_lock("r", &pre_lock_request()).await.unwrap();
    sleep(policy().convergence_delay + MARGIN).await;
    // The other instance has the lock cached, as it would while serving the resource.
    other.resolve("r").await.unwrap();

    let request = AdminCall::Request(ForceReleaseRequest {
        id: "req-1".into(),
        lock: grant.token.digest(),
        phase: Phase::PreLock,
        requested_by: "alice".into(),
        reason: "orchestrator lost".into(),
    });
    let approval = AdminCall::Approve { id: "req-1".into(), principal: "bob".into() };
    for call in [&request, &approval] {
        // Committed two seconds late, after the client gave up at one: unknown to the
        // caller, who repeats it once the write landed and finds it there.
        store.add_rule("replace:late-commit=2s,timeout=1s x1".parse().unwrap());
        let first = other.force_release("r", call).await;
        assert!(matches!(first, Err(RoutingError::OutcomeUnknown(_))), "{call:?}: {first:?}");
        sleep(Duration::from_secs(2)).await;
        let before = other.read_uncached("r").await.unwrap().record.etag.clone();
        other.force_release("r", call).await.unwrap();
        assert_eq!(other.read_uncached("r").await.unwrap().record.etag, before, "{call:?}: the repeat wrote again");
    }
    // A third person finds it decided.
    let third = AdminCall::Approve { id: "req-1".into(), principal: "carol".into() };
    let decided = other.force_release("r", &third).await;
    assert!(matches!(decided, Err(RoutingError::Lock(LockError::ForceReleaseDecided { .. }))), "{decided:?}");
    let doc = other.read_uncached("r").await.unwrap().record.doc.clone();
    assert_eq!(doc.primary.lock, None);
    assert_eq!(doc.force_releases.len(), 1);
    assert_eq!(doc.force_releases[0].outcome, ForceOutcome::Released);

    // The old holder, on either instance: refused by name, nothing written.
    for (name, instance) in [("holder", &holder), ("other", &other)] {
        let escalate = instance.escalate("r", &grant.token, Phase::HardDelete, Duration::from_secs(60)).await;
        assert!(matches!(escalate, Err(RoutingError::Lock(LockError::ForceReleased { .. }))), "{name}: {escalate:?}");
        let renew = instance.renew("r", &grant.token, Duration::from_secs(60)).await;
        assert!(matches!(renew, Err(RoutingError::Lock(LockError::ForceReleased { .. }))), "{name}: {renew:?}");
        let swap = instance.prepare_swap("r", &grant.token, "northeurope", None).await;
        assert!(matches!(swap, Err(RoutingError::Lock(LockError::ForceReleased { .. }))), "{name}: {swap:?}");
        let release = instance.release("r", &grant.token).await;
        assert!(matches!(release, Err(RoutingError::Lock(LockError::ForceReleased { .. }))), "{name}: {release:?}");
    }
    assert_eq!(other.read_uncached("r").await.unwrap().record.doc, doc, "a refused call writes nothing");
    // A self-approval is refused before anything is written.
    let (store, clock) = faulty_store().await;
    let instance = client(store, clock);
    let grant = instance.pre_lock("r", &pre_lock_request()).await.unwrap();
    let AdminCall::Request(mut req) = request else { unreachable!() };
    req.lock = grant.token.digest();
    instance.force_release("r", &AdminCall::Request(req)).await.unwrap();
    let own = instance.force_release("r", &AdminCall::Approve { id: "req-1".into(), principal: "alice".into() }).await;
    assert!(matches!(own, Err(RoutingError::Lock(LockError::SelfApproval { .. }))), "{own:?}");
    assert!(instance.read_uncached("r").await.unwrap().record.doc.primary.lock.is_some());
}
