//! Mutual exclusion under real concurrency: 50 tasks on a multi-threaded runtime race
//! to pre-lock one resource, over and over on fresh resources. Exactly one wins; every
//! other gets "lock held" (with the winner's lease), and the store holds the winner's
//! token after exactly one committed change.
//!
//! The staged races are ordered by synchronisation, not by timing: a gate in front of
//! the store holds every racer's write until all of them have arrived at it, so each has
//! read the document before any write lands, however loaded the machine.

#[path = "support/stores.rs"]
mod stores;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lockprobe::clock::{Clock, SystemClock};
use lockprobe::routing::cache::TieredCache;
use lockprobe::routing::lifecycle;
use lockprobe::routing::{
    ClientOptions, Grant, LocationDocument, LockCall, LockError, LockPolicy, LockToken, PreLockRequest, RoutingClient,
    RoutingError,
};
use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
use lockprobe::store::OpKind;
use lockprobe::store::{
    ChangeBatch, ChangeCursor, Committed, ETag, LocationStore, ReadFrom, ScanPage, StoreError, Versioned,
};
use lockprobe::testing::FaultAction;
use tokio::sync::Barrier;

const TASKS: usize = 50;
const ROUNDS: usize = 40;

/// How long a staged race may take before the test gives up: only a safety net, since a
/// racer that never reaches the gate would otherwise hold the others there for ever.
const RACE_DEADLINE: Duration = Duration::from_secs(120);

/// The shared memory store behind a gate that can hold the calls of one kind until a
/// given number of them have arrived, then let them all go at once.
#[derive(Debug)]
struct GatedStore {
    inner: stores::Instrumented,
    gate: Mutex<Option<Gate>>,
}

#[derive(Debug)]
struct Gate {
    kind: OpKind,
    /// How many more calls of `kind` the gate will hold.
    to_hold: usize,
    all_arrived: Arc<Barrier>,
}

impl GatedStore {
    /// Holds the next `racers` calls of `kind` until the last of them arrives.
    fn hold_until_all_arrive(&self, kind: OpKind, racers: usize) {
        let gate = Gate { kind, to_hold: racers, all_arrived: Arc::new(Barrier::new(racers)) };
        *self.gate.lock().unwrap() = Some(gate);
    }

    async fn pass(&self, kind: OpKind) {
        let held = match self.gate.lock().unwrap().as_mut() {
            Some(gate) if gate.kind == kind && gate.to_hold > 0 => {
                gate.to_hold -= 1;
                Some(gate.all_arrived.clone())
            }
            _ => None,
        };
        if let Some(all_arrived) = held {
            all_arrived.wait().await;
        }
    }
}

#[async_trait]
impl LocationStore for GatedStore {
    async fn read(&self, id: &str, from: ReadFrom) -> Result<Versioned, StoreError> {
        let kind = match from {
            ReadFrom::WriteRegion => OpKind::ReadWriteRegion,
            ReadFrom::Replica => OpKind::ReadReplica,
        };
        self.pass(kind).await;
        self.inner.store().read(id, from).await
    }

    async fn create(&self, doc: &LocationDocument) -> Result<Committed, StoreError> {
        self.pass(OpKind::Create).await;
        self.inner.store().create(doc).await
    }

    async fn replace(&self, doc: &LocationDocument, if_match: &ETag) -> Result<Committed, StoreError> {
        self.pass(OpKind::Replace).await;
        self.inner.store().replace(doc, if_match).await
    }

    async fn read_changes(&self, cursor: &ChangeCursor, limit: usize) -> Result<ChangeBatch, StoreError> {
        self.pass(OpKind::ReadChanges).await;
        self.inner.store().read_changes(cursor, limit).await
    }

    async fn scan(&self, after: Option<&str>, limit: usize) -> Result<ScanPage, StoreError> {
        self.pass(OpKind::Scan).await;
        self.inner.store().scan(after, limit).await
    }
}

fn store() -> Arc<GatedStore> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    Arc::new(GatedStore {
        inner: stores::Instrumented::new(clock, MemoryStoreConfig::default()),
        gate: Mutex::new(None),
    })
}

/// One orchestrator: its own client and cache over the shared store.
fn orchestrator(store: &Arc<GatedStore>, retry_budget: u32) -> RoutingClient {
    RoutingClient::new(
        store.clone(),
        Arc::new(SystemClock),
        TieredCache::try_new(&[Duration::from_secs(5)]).unwrap(),
        LockPolicy::declared(Duration::from_secs(5), Duration::from_secs(5), Duration::from_secs(3600)),
        ClientOptions { retry_budget, ..ClientOptions::default() },
    )
}

fn request(i: usize) -> PreLockRequest {
    PreLockRequest { owner: format!("orchestrator-{i}"), duration: Duration::from_secs(600), target_location: None }
}

/// Runs `TASKS` pre-locks of `id` at once, each task from its own orchestrator.
async fn race(store: &Arc<GatedStore>, id: &str, retry_budget: u32) -> Vec<Result<Grant, RoutingError>> {
    race_with(store, retry_budget, move |client, i| {
        let id = id.to_owned();
        async move { client.pre_lock(&id, &request(i)).await }
    })
    .await
}

/// Runs `call` from `TASKS` tasks at once, each with its own orchestrator.
async fn race_with<F, Fut>(store: &Arc<GatedStore>, retry_budget: u32, call: F) -> Vec<Result<Grant, RoutingError>>
where
    F: Fn(RoutingClient, usize) -> Fut,
    Fut: std::future::Future<Output = Result<Grant, RoutingError>> + Send + 'static,
{
    let start = Arc::new(Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let pre_lock = call(orchestrator(store, retry_budget), i);
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                pre_lock.await
            })
        })
        .collect();
    let results = async {
        let mut results = Vec::with_capacity(TASKS);
        for t in tasks {
            results.push(t.await.expect("task panicked"));
        }
        results
    };
    tokio::time::timeout(RACE_DEADLINE, results).await.expect("a racer never reached the gate")
}

/// Exactly one grant; every other result is `LockHeld` with the winner's lease; the
/// store holds the winner's token and committed exactly one change.
async fn check_one_winner(store: &MemoryStore, id: &str, results: &[Result<Grant, RoutingError>]) {
    let winners: Vec<&Grant> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1, "{id}: {} winners", winners.len());
    let winner = winners[0];
    let lease = winner.record.doc.primary.lock.as_ref().unwrap().expires_at;
    for r in results.iter().filter(|r| r.is_err()) {
        assert_eq!(
            r.as_ref().err(),
            Some(&RoutingError::Lock(LockError::LockHeld { expires_at: lease + margin() * 2 })),
            "{id}"
        );
    }
    let stored = settled(store, id).await;
    assert_eq!(stored, *winner.record, "{id}: the store holds the winner's document");
    assert!(stored.doc.primary.lock.as_ref().unwrap().token.matches(&winner.token));
    let changes = store.read_changes(&ChangeCursor::beginning(), usize::MAX).await.unwrap().changes;
    let for_id = changes.iter().filter(|c| c.doc.doc.id == id).count();
    assert_eq!(for_id, 2, "{id}: create and one pre-lock, nothing else");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_orchestrators_race_and_exactly_one_wins_every_time() {
    let store = store();
    for round in 0..ROUNDS {
        let id = format!("race-{round:02}");
        store.inner.memory.create(&LocationDocument::new(&id, "westeurope")).await.unwrap();
        let before = store.inner.counts();
        // Every other round, hold each writer at its replace until all 50 are there, so
        // all have read the unlocked document: the race is then certain, not a matter of
        // thread scheduling, and every loser has to go through a 412.
        let staged = round % 2 == 0;
        if staged {
            store.hold_until_all_arrive(OpKind::Replace, TASKS);
        }
        let results = race(&store, &id, 16).await;
        let calls = store.inner.counts().since(&before);
        check_one_winner(&store.inner.memory, &id, &results).await;
        if staged {
            assert_eq!(calls.replace, TASKS as u64, "{id}: one replace each, 49 of them refused with 412");
            assert_eq!(calls.read_write_region, 2 * TASKS as u64 - 1, "{id}: losers re-read once after their 412");
        } else {
            assert!(calls.replace >= 1 && calls.replace <= TASKS as u64, "{id}: {} replaces", calls.replace);
        }
    }
}

/// With a budget of one attempt, a 412 ends the operation: `RetryExhausted`, and
/// nothing is written.
#[tokio::test]
async fn a_412_with_a_budget_of_one_is_retry_exhausted() {
    let store = store();
    let instrumented = &store.inner;
    let memory = &instrumented.memory;
    memory.create(&LocationDocument::new("r", "westeurope")).await.unwrap();
    let before = instrumented.counts();
    instrumented.inject(OpKind::Replace, FaultAction::LostRace, 1);
    let r = orchestrator(&store, 1).pre_lock("r", &request(0)).await;
    assert_eq!(r.err(), Some(RoutingError::RetryExhausted { attempts: 1 }));
    assert_eq!(memory.read("r", ReadFrom::WriteRegion).await.unwrap().doc, LocationDocument::new("r", "westeurope"));
    assert_eq!(instrumented.counts().since(&before).replace, 1);

    // The same 412 with a budget of two: re-read, re-decide, one write.
    instrumented.inject(OpKind::Replace, FaultAction::LostRace, 1);
    let before = instrumented.counts();
    let grant = orchestrator(&store, 2).pre_lock("r", &request(0)).await.unwrap();
    let calls = instrumented.counts().since(&before);
    assert_eq!((calls.read_write_region, calls.replace), (2, 2));
    assert_eq!(settled(memory, "r").await, *grant.record);
}

/// The document as the routing library reads it: settled by its commit time.
async fn settled(store: &MemoryStore, id: &str) -> Versioned {
    let read = store.read(id, ReadFrom::WriteRegion).await.unwrap();
    Versioned { doc: lifecycle::settle(read.doc, read.committed_at), ..read }
}

/// A lease ends for everyone the skew margin after it ends for its holder.
fn margin() -> chrono::TimeDelta {
    lockprobe::clock::to_chrono(lifecycle::DEFAULT_SKEW_MARGIN)
}

/// A real race with a budget of one: the losers give up on their 412 instead of
/// learning the lock is held, and still only one wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_budget_of_one_turns_lost_races_into_retry_exhausted() {
    let store = store();
    store.inner.memory.create(&LocationDocument::new("r", "westeurope")).await.unwrap();
    // Every racer reads the unlocked document before any replace lands.
    store.hold_until_all_arrive(OpKind::Replace, TASKS);
    let results = race(&store, "r", 1).await;
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
    for r in results.iter().filter(|r| r.is_err()) {
        assert_eq!(r.as_ref().err(), Some(&RoutingError::RetryExhausted { attempts: 1 }));
    }
}

/// The same race on a resource that has no document yet, through
/// `pre_lock_or_create`: the creation is the pre-lock's one write, so exactly one
/// create commits, the 49 that lose the create (409) re-read and learn the lock is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_orchestrators_race_to_create_and_pre_lock_and_exactly_one_wins() {
    let store = store();
    for round in 0..ROUNDS / 4 {
        let id = format!("fresh-{round:02}");
        let before = store.inner.counts();
        // Hold every create until all 50 are there, so all have read "no document".
        store.hold_until_all_arrive(OpKind::Create, TASKS);
        let results = race_with(&store, 4, |client, i| {
            let id = id.clone();
            async move { client.pre_lock_or_create(&id, "westeurope", &request(i)).await }
        })
        .await;
        let calls = store.inner.counts().since(&before);
        let winners: Vec<&Grant> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(winners.len(), 1, "{id}: {} winners", winners.len());
        let lease = winners[0].record.doc.primary.lock.as_ref().unwrap().expires_at;
        for r in results.iter().filter(|r| r.is_err()) {
            assert_eq!(
                r.as_ref().err(),
                Some(&RoutingError::Lock(LockError::LockHeld { expires_at: lease + margin() * 2 })),
                "{id}"
            );
        }
        assert_eq!((calls.create, calls.replace), (TASKS as u64, 0), "{id}: one create each, no replace");
        assert_eq!(settled(&store.inner.memory, &id).await, *winners[0].record);
        let changes = store.inner.memory.read_changes(&ChangeCursor::beginning(), usize::MAX).await.unwrap().changes;
        assert_eq!(changes.iter().filter(|c| c.doc.doc.id == id).count(), 1, "{id}: the pre-lock is the only write");
    }
}

/// A client whose commit observer logs what it is handed, over an instrumented store
/// holding `r1` (written by the test, not the client).
async fn observed_client() -> (stores::Instrumented, RoutingClient, Arc<Mutex<Vec<LocationDocument>>>) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = stores::Instrumented::new(clock.clone(), MemoryStoreConfig::default());
    store.memory.create(&LocationDocument::new("r1", "westeurope")).await.unwrap();
    let seen: Arc<Mutex<Vec<LocationDocument>>> = Arc::default();
    let log = seen.clone();
    let client = RoutingClient::new(
        store.store(),
        clock,
        TieredCache::try_new(&[Duration::from_secs(5)]).unwrap(),
        LockPolicy::new(Duration::from_secs(1), Duration::from_secs(600)),
        ClientOptions::default(),
    )
    .with_commit_observer(Arc::new(move |doc| log.lock().unwrap().push(doc.clone())));
    (store, client, seen)
}

/// The commit observer (how the service's document-size metric and the harnesses see
/// what a client writes) is handed exactly the versions the store holds: a write that
/// lost its race is refused by the store and not seen, the retry that landed is seen
/// once, pending record included.
#[tokio::test]
async fn the_commit_observer_sees_each_committed_version_once_and_no_refused_one() {
    let (store, client, seen) = observed_client().await;
    store.inject(OpKind::Replace, FaultAction::LostRace, 1);
    let req = PreLockRequest { owner: "o".into(), duration: Duration::from_secs(60), target_location: None };
    client.pre_lock("r1", &req).await.unwrap();
    assert_eq!(store.counts().replace, 2, "the first replace lost its race, the retry landed");

    let changes = store.memory.read_changes(&ChangeCursor::beginning(), 100).await.unwrap().changes;
    let written: Vec<&LocationDocument> = changes.iter().skip(1).map(|c| &c.doc.doc).collect();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.iter().collect::<Vec<_>>(), written, "the seed is not the client's; the pre-lock is seen once");
    assert!(seen[0].pending.is_some(), "seen as stored, pending record included");
}

/// A write whose outcome the store left unknown is seen once the call's own re-read
/// finds it landed, and not before; a later call answered from that record is not seen.
#[tokio::test]
async fn the_commit_observer_sees_a_write_of_unknown_outcome_once_it_is_found_landed() {
    let (store, client, seen) = observed_client().await;
    // The replace lands, and its answer is lost.
    store.inject(OpKind::Replace, FaultAction::Ambiguous, 1);
    let req = PreLockRequest { owner: "o".into(), duration: Duration::from_secs(60), target_location: None };
    let call = LockCall::PreLock { request: req, token: LockToken::generate() };
    client.call("r1", None, &call, Some("key-1")).await.unwrap();
    assert_eq!(store.counts().replace, 1, "one write, found landed by the re-read");
    let changes = store.memory.read_changes(&ChangeCursor::beginning(), 100).await.unwrap().changes;
    let written: Vec<&LocationDocument> = changes.iter().skip(1).map(|c| &c.doc.doc).collect();
    assert_eq!(seen.lock().unwrap().iter().collect::<Vec<_>>(), written, "seen once, as stored");
    // The same key again: answered from its record, nothing written, nothing seen.
    client.call("r1", None, &call, Some("key-1")).await.unwrap();
    assert_eq!(seen.lock().unwrap().len(), 1);
}
