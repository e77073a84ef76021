//! Mutual exclusion under real concurrency: 50 tasks on a multi-threaded runtime race
//! to pre-lock one resource, over and over on fresh resources. Exactly one wins; every
//! other gets "lock held" (with the winner's lease), and the store holds the winner's
//! token after exactly one committed change.

use std::sync::Arc;
use std::time::Duration;

use lockprobe::clock::{Clock, SystemClock};
use lockprobe::routing::cache::TieredCache;
use lockprobe::routing::lifecycle;
use lockprobe::routing::{
    ClientOptions, Grant, LocationDocument, LockError, LockPolicy, PreLockRequest, RoutingClient, RoutingError,
};
use lockprobe::store::memory::{Fault, MemoryStore, MemoryStoreConfig, OpKind};
use lockprobe::store::{ChangeCursor, LocationStore, ReadFrom, StoreError, Versioned};

const TASKS: usize = 50;
const ROUNDS: usize = 40;

fn store() -> Arc<MemoryStore> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    Arc::new(MemoryStore::new(clock, MemoryStoreConfig::default()))
}

/// One orchestrator: its own client and cache over the shared store.
fn orchestrator(store: &Arc<MemoryStore>, retry_budget: u32) -> RoutingClient {
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
async fn race(store: &Arc<MemoryStore>, id: &str, retry_budget: u32) -> Vec<Result<Grant, RoutingError>> {
    let start = Arc::new(tokio::sync::Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let client = orchestrator(store, retry_budget);
            let (start, id) = (start.clone(), id.to_owned());
            tokio::spawn(async move {
                start.wait().await;
                client.pre_lock(&id, &request(i)).await
            })
        })
        .collect();
    let mut results = Vec::with_capacity(TASKS);
    for t in tasks {
        results.push(t.await.expect("task panicked"));
    }
    results
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
            Some(&RoutingError::Lock(LockError::LockHeld { expires_at: lease + margin() })),
            "{id}"
        );
    }
    let stored = settled(store, id).await;
    assert_eq!(stored, winner.record, "{id}: the store holds the winner's document");
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
        store.create(&LocationDocument::new(&id, "westeurope")).await.unwrap();
        let before = store.counts();
        // Every other round, hold each writer at its replace long enough for all 50 to
        // have read the unlocked document: the race is then certain, not a matter of
        // thread scheduling, and every loser has to go through a 412.
        let staged = round % 2 == 0;
        if staged {
            store.inject(OpKind::Replace, Fault::Delay(Duration::from_millis(20)), TASKS);
        }
        let results = race(&store, &id, 16).await;
        let calls = store.counts().since(&before);
        check_one_winner(&store, &id, &results).await;
        if staged {
            assert_eq!(calls.replace, TASKS as u64, "{id}: one replace each, 49 of them refused with 412");
            assert_eq!(calls.read_write_region, 2 * TASKS as u64 - 1, "{id}: losers re-read once after their 412");
        } else {
            assert!(calls.replace >= 1 && calls.replace <= TASKS as u64, "{id}: {} replaces", calls.replace);
        }
        store.clear_faults();
    }
}

/// With a budget of one attempt, a 412 ends the operation: `RetryExhausted`, and
/// nothing is written.
#[tokio::test]
async fn a_412_with_a_budget_of_one_is_retry_exhausted() {
    let store = store();
    store.create(&LocationDocument::new("r", "westeurope")).await.unwrap();
    let before = store.counts();
    store.inject(OpKind::Replace, Fault::Fail(StoreError::PreconditionFailed), 1);
    let r = orchestrator(&store, 1).pre_lock("r", &request(0)).await;
    assert_eq!(r.err(), Some(RoutingError::RetryExhausted { attempts: 1 }));
    assert_eq!(store.read("r", ReadFrom::WriteRegion).await.unwrap().doc, LocationDocument::new("r", "westeurope"));
    assert_eq!(store.counts().since(&before).replace, 1);

    // The same 412 with a budget of two: re-read, re-decide, one write.
    store.inject(OpKind::Replace, Fault::Fail(StoreError::PreconditionFailed), 1);
    let before = store.counts();
    let grant = orchestrator(&store, 2).pre_lock("r", &request(0)).await.unwrap();
    let calls = store.counts().since(&before);
    assert_eq!((calls.read_write_region, calls.replace), (2, 2));
    assert_eq!(settled(&store, "r").await, grant.record);
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
    store.create(&LocationDocument::new("r", "westeurope")).await.unwrap();
    store.inject(OpKind::Replace, Fault::Delay(Duration::from_millis(20)), TASKS);
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
        let before = store.counts();
        // Hold every create until all 50 have read "no document".
        store.inject(OpKind::Create, Fault::Delay(Duration::from_millis(20)), TASKS);
        let start = Arc::new(tokio::sync::Barrier::new(TASKS));
        let tasks: Vec<_> = (0..TASKS)
            .map(|i| {
                let (client, start, id) = (orchestrator(&store, 4), start.clone(), id.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    client.pre_lock_or_create(&id, "westeurope", &request(i)).await
                })
            })
            .collect();
        let mut results = Vec::with_capacity(TASKS);
        for t in tasks {
            results.push(t.await.expect("task panicked"));
        }
        let calls = store.counts().since(&before);
        store.clear_faults();
        let winners: Vec<&Grant> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(winners.len(), 1, "{id}: {} winners", winners.len());
        let lease = winners[0].record.doc.primary.lock.as_ref().unwrap().expires_at;
        for r in results.iter().filter(|r| r.is_err()) {
            assert_eq!(
                r.as_ref().err(),
                Some(&RoutingError::Lock(LockError::LockHeld { expires_at: lease + margin() })),
                "{id}"
            );
        }
        assert_eq!((calls.create, calls.replace), (TASKS as u64, 0), "{id}: one create each, no replace");
        assert_eq!(settled(&store, &id).await, winners[0].record);
        let changes = store.read_changes(&ChangeCursor::beginning(), usize::MAX).await.unwrap().changes;
        assert_eq!(changes.iter().filter(|c| c.doc.doc.id == id).count(), 1, "{id}: the pre-lock is the only write");
    }
}
