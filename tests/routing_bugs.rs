//! Defects found in the routing library and the memory store while writing the
//! routing tests, kept as regression tests. Each states the behaviour the lock protocol
//! asks for. All but the last were fixed on main in f82d69d; the last
//! (`a_lease_revived_by_a_clock_step_is_not_served_stale_from_cache`) in 4373345.

#[path = "support/stores.rs"]
mod stores;

use std::sync::Arc;
use std::time::Duration;

use lockprobe::clock::{to_chrono, Clock, ManualClock};
use lockprobe::routing::cache::TieredCache;
use lockprobe::routing::{
    enforce, ClientOptions, Decision, LocationDocument, LockPolicy, Operation, Phase, PreLockRequest, RoutingClient,
    Source,
};
use lockprobe::store::memory::MemoryStoreConfig;
use lockprobe::store::{LocationStore, ReadFrom};
use lockprobe::testing::OpCounts;

const TTL: Duration = Duration::from_secs(4);
const LAG: Duration = Duration::from_secs(3);

fn setup() -> (Arc<ManualClock>, stores::Instrumented) {
    let clock = Arc::new(ManualClock::at_epoch());
    let store = stores::Instrumented::new(clock.clone(), MemoryStoreConfig { replica_lag: LAG, ..Default::default() });
    (clock, store)
}

fn client(clock: &Arc<ManualClock>, store: &stores::Instrumented) -> RoutingClient {
    RoutingClient::new(
        store.store(),
        clock.clone(),
        TieredCache::try_new(&[TTL]).unwrap(),
        LockPolicy::declared(TTL, LAG, Duration::from_secs(7200)),
        ClientOptions::default(),
    )
}

fn request(secs: u64, target: Option<&str>) -> PreLockRequest {
    PreLockRequest {
        owner: "test".into(),
        duration: Duration::from_secs(secs),
        target_location: target.map(Into::into),
    }
}

/// After a swap the old location is guarded (secondary, write phase) until caches have
/// converged on the new one. A new pre-lock that declares a target overwrites
/// `secondary` (lifecycle.rs, `pre_lock`, `if let Some(target) = &req.target_location`),
/// so the guard vanishes at once and stale routers can write to the old location.
///
/// Fixed on main in f82d69d: `pre_lock` refuses a target elsewhere with `LockHeld`
/// until the guard lapses.
#[tokio::test]
async fn a_swap_guard_survives_a_new_pre_lock_that_declares_a_target() {
    let (clock, store) = setup();
    store.memory.create(&LocationDocument::new("r", "westeurope")).await.unwrap();
    let (a, b) = (client(&clock, &store), client(&clock, &store));
    let grant = a.pre_lock("r", &request(600, Some("northeurope"))).await.unwrap();
    clock.advance(TTL + LAG + lockprobe::routing::lifecycle::DEFAULT_SKEW_MARGIN);
    a.escalate("r", &grant.token, Phase::HardDelete, Duration::from_secs(60)).await.unwrap();
    a.escalate("r", &grant.token, Phase::Write, Duration::from_secs(60)).await.unwrap();
    let swapped = a.swap("r", &grant.token, "northeurope").await.unwrap();
    let guard_until = swapped.doc.secondary.as_ref().unwrap().lock.as_ref().unwrap().expires_at;

    clock.advance(Duration::from_secs(1));
    let new = b.pre_lock("r", &request(600, Some("eastus"))).await;
    let doc = store.memory.read("r", ReadFrom::WriteRegion).await.unwrap().doc;
    let still_guarded = doc.secondary.as_ref().is_some_and(|s| {
        s.location == "westeurope"
            && s.lock.as_ref().is_some_and(|l| l.phase == Phase::Write && l.expires_at >= guard_until)
    });
    assert!(
        new.is_err() || still_guarded,
        "a pre-lock 1 s after the swap removed the old location's guard (it should hold until {guard_until}): {:?}",
        doc.secondary
    );
}

/// The target declared at pre-lock is locked so it refuses writes before cutover. Its
/// lock is a copy taken at pre-lock time; `renew` extends only the primary lock, so
/// after a pre-lock renewal the target's lock lapses while the migration is still live.
///
/// Fixed on main in f82d69d: `renew` extends the target's lock with the parent lease.
#[tokio::test]
async fn the_declared_target_stays_locked_as_long_as_the_migration() {
    let (clock, store) = setup();
    store.memory.create(&LocationDocument::new("r", "westeurope")).await.unwrap();
    let a = client(&clock, &store);
    let grant = a.pre_lock("r", &request(100, Some("northeurope"))).await.unwrap();
    clock.advance(Duration::from_secs(50));
    a.renew("r", &grant.token, Duration::from_secs(1000)).await.unwrap();
    clock.advance(Duration::from_secs(200));
    let doc = store.memory.read("r", ReadFrom::WriteRegion).await.unwrap().doc;
    let now = clock.now();
    assert!(doc.live_lock(now).is_some(), "the migration's own lock is live");
    let target_lock = doc.secondary.as_ref().and_then(|s| s.lock.as_ref()).unwrap();
    assert!(
        target_lock.is_live(now),
        "the target's lock lapsed at {} while the migration holds its lock until {}",
        target_lock.expires_at,
        doc.live_lock(now).unwrap().expires_at
    );
}

/// A document left with an expired lock (an abandoned migration) must not cost two
/// store reads on every cache miss for ever. Within one convergence delay of the lapse
/// the replica may still lack a renewal made just before it, so a read-through is
/// right there (a_recently_lapsed_lock_is_still_read_through); after that the lapse
/// is final and the replica's view is served like an unlocked one.
///
/// Was: `resolve` treated any replica lock past `effective_at` as started and read
/// through. Fixed on main in f82d69d (`replica_may_lag_on`).
#[tokio::test]
async fn a_long_expired_lock_costs_no_write_region_read_on_a_miss() {
    let (clock, store) = setup();
    store.memory.create(&LocationDocument::new("r", "westeurope")).await.unwrap();
    let (orchestrator, service) = (client(&clock, &store), client(&clock, &store));
    let grant = orchestrator.pre_lock("r", &request(60, None)).await.unwrap();
    let lock = grant.record.doc.primary.lock.clone().unwrap();
    clock.set(lock.expires_at + lock.convergence_delay() + to_chrono(Duration::from_secs(1)));
    let before = store.counts();
    let r = service.resolve("r").await.unwrap();
    assert_eq!(
        (r.source, store.counts().since(&before)),
        (Source::Store, OpCounts { read_replica: 1, ..Default::default() }),
        "a miss on a document whose lock expired long ago"
    );
}

/// The other side of the same rule: a renewal just before the lease would have lapsed
/// may not have reached the replica, which then shows a lapsed lock that is in fact
/// live. The miss must read through and see the renewal.
#[tokio::test]
async fn a_recently_lapsed_lock_is_still_read_through() {
    let (clock, store) = setup();
    store.memory.create(&LocationDocument::new("r", "westeurope")).await.unwrap();
    let (orchestrator, service) = (client(&clock, &store), client(&clock, &store));
    let grant = orchestrator.pre_lock("r", &request(60, None)).await.unwrap();
    let lock = grant.record.doc.primary.lock.clone().unwrap();
    clock.set(lock.expires_at - to_chrono(Duration::from_secs(1)));
    orchestrator.renew("r", &grant.token, Duration::from_secs(600)).await.unwrap();
    clock.advance(Duration::from_secs(2));
    // The replica still shows the old lease, lapsed a second ago.
    let replica = store.memory.read("r", ReadFrom::Replica).await.unwrap();
    assert!(!replica.doc.primary.lock.as_ref().unwrap().is_live(clock.now()));
    let r = service.resolve("r").await.unwrap();
    assert_eq!(r.source, Source::ReadThrough);
    assert!(r.lock().unwrap().is_live(clock.now()), "resolve served the replica's stale lapse");
}

/// A replica never forgets a document it has served. After the clock steps back (the
/// manual clock allows it; NTP does it), the memory store's replica read returns
/// `NotFound` for an existing document: `prune` dropped the version the earlier
/// horizon would serve, and nothing at or before the new horizon is left.
///
/// Fixed on main in f82d69d: a pruned history falls back to its oldest kept version.
#[tokio::test]
async fn a_replica_never_unsees_a_document_after_a_clock_step_back() {
    let (clock, store) = setup();
    let first = store.memory.create(&LocationDocument::new("r", "westeurope")).await.unwrap().etag;
    clock.advance(Duration::from_secs(50));
    let mut moved = LocationDocument::new("r", "northeurope");
    moved.extra.insert("note".into(), "second version".into());
    store.memory.replace(&moved, &first).await.unwrap();
    clock.advance(Duration::from_secs(10));
    assert_eq!(store.memory.read("r", ReadFrom::Replica).await.unwrap().doc.primary.location, "northeurope");
    clock.set(clock.now() - to_chrono(Duration::from_secs(8)));
    let after_step = store.memory.read("r", ReadFrom::Replica).await;
    assert!(after_step.is_ok(), "replica read after a clock step back: {after_step:?}");
}

/// A cached entry whose lock had lapsed when it was fetched is served from cache until
/// its TTL (was `cache_may_serve`: `lock.expires_at <= entry.fetched_at`). If the clock then
/// steps back by less than the skew margin, the lapsed lease is live again by the clock
/// and its holder can renew it; the cache keeps serving the old, lapsed lease, so the
/// service allows writes under a live write lock for up to a TTL. The skew margin the
/// client applied to `effectiveAt` was not applied to `expiresAt`.
///
/// Fixed in 4373345 (client.rs `remember`): a lock counts as lapsed at fetch only when
/// `lock.expires_at + skew_margin <= fetched`; within the margin, it is read through.
#[tokio::test]
async fn a_lease_revived_by_a_clock_step_is_not_served_stale_from_cache() {
    let (clock, store) = setup();
    store.memory.create(&LocationDocument::new("r", "westeurope")).await.unwrap();
    let (orchestrator, service) = (client(&clock, &store), client(&clock, &store));
    let skew = lockprobe::routing::lifecycle::DEFAULT_SKEW_MARGIN;
    let grant = orchestrator.pre_lock("r", &request(600, None)).await.unwrap();
    clock.advance(TTL + LAG + lockprobe::routing::lifecycle::DEFAULT_SKEW_MARGIN);
    orchestrator.escalate("r", &grant.token, Phase::HardDelete, Duration::from_secs(60)).await.unwrap();
    let write = orchestrator.escalate("r", &grant.token, Phase::Write, Duration::from_secs(10)).await.unwrap();
    let lapse = write.doc.primary.lock.as_ref().unwrap().expires_at;

    // The service fetches the document at the instant the write lease lapses.
    clock.set(lapse);
    service.resolve("r").await.unwrap();
    // The clock steps back by less than the skew margin: the lease is live again, and
    // its holder renews it.
    clock.set(lapse - to_chrono(skew - Duration::from_millis(100)));
    let renewed = orchestrator.renew("r", &grant.token, Duration::from_secs(60)).await.unwrap();
    assert!(renewed.doc.primary.lock.as_ref().unwrap().expires_at > lapse + to_chrono(Duration::from_secs(30)));

    clock.set(lapse + to_chrono(Duration::from_secs(1)));
    let now = clock.now();
    let r = service.resolve("r").await.unwrap();
    assert_eq!(
        enforce(Operation::Write, r.lock(), now, skew),
        enforce(Operation::Write, renewed.doc.primary.lock.as_ref(), now, skew),
        "the service decides a write on a stale lease ({:?} from {:?}) while the write lock is renewed",
        r.lock().map(|l| l.expires_at),
        r.source
    );
    assert!(matches!(enforce(Operation::Write, r.lock(), now, skew), Decision::Block { .. }));
}
