//! The routing path's cost and freshness, asserted from the store's own counters:
//! an unlocked cached resource costs no store read; a started lock costs exactly one
//! write-region read per resolve and never a replica read; a miss reads a replica; an
//! instance that cached the unlocked document sees a new lock within max TTL +
//! replication bound, and never before the store could have shown it.

#[path = "support/stores.rs"]
mod stores;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use lockprobe::clock::{to_chrono, Clock, ManualClock};
use lockprobe::routing::cache::TieredCache;
use lockprobe::routing::{ClientOptions, LocationDocument, LockPolicy, Phase, PreLockRequest, RoutingClient, Source};
use lockprobe::store::memory::MemoryStoreConfig;
use lockprobe::store::{LocationStore, ReadFrom};
use lockprobe::testing::OpCounts;

const FAST: Duration = Duration::from_secs(1);
const SLOW: Duration = Duration::from_secs(4);
const LAG: Duration = Duration::from_secs(3);
const SKEW: Duration = lockprobe::routing::lifecycle::DEFAULT_SKEW_MARGIN;

struct Env {
    clock: Arc<ManualClock>,
    store: stores::Instrumented,
    /// The service instance whose reads are counted.
    service: RoutingClient,
    /// The orchestrator: its own client and cache over the same store.
    orchestrator: RoutingClient,
}

fn client(clock: &Arc<ManualClock>, store: &stores::Instrumented) -> RoutingClient {
    RoutingClient::new(
        store.store(),
        clock.clone(),
        TieredCache::try_new(&[FAST, SLOW]).unwrap(),
        LockPolicy::declared(SLOW, LAG, Duration::from_secs(3600)),
        ClientOptions::default(),
    )
}

/// One resource `r`, created long enough ago that every replica has it.
async fn env() -> Env {
    let clock = Arc::new(ManualClock::at_epoch());
    let store = stores::Instrumented::new(clock.clone(), MemoryStoreConfig { replica_lag: LAG, ..Default::default() });
    store.memory.create(&LocationDocument::new("r", "westeurope")).await.unwrap();
    clock.advance(Duration::from_secs(60));
    Env { service: client(&clock, &store), orchestrator: client(&clock, &store), clock, store }
}

fn pre_lock_request() -> PreLockRequest {
    PreLockRequest { owner: "test".into(), duration: Duration::from_secs(600), target_location: None }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

impl Env {
    fn counts(&self) -> OpCounts {
        self.store.counts()
    }

    fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }
}

#[tokio::test]
async fn a_cache_miss_reads_one_replica_and_nothing_else() {
    let e = env().await;
    let before = e.counts();
    let r = e.service.resolve("r").await.unwrap();
    assert_eq!(r.source, Source::Store);
    assert_eq!(r.location(), "westeurope");
    assert_eq!(e.counts().since(&before), OpCounts { read_replica: 1, ..Default::default() });

    // A second resource is a miss of its own.
    e.store.memory.create(&LocationDocument::new("s", "northeurope")).await.unwrap();
    e.clock.advance(LAG);
    let before = e.counts();
    assert_eq!(e.service.resolve("s").await.unwrap().source, Source::Store);
    assert_eq!(e.counts().since(&before), OpCounts { read_replica: 1, ..Default::default() });
}

#[tokio::test]
async fn an_unlocked_cached_resource_costs_no_store_read() {
    let e = env().await;
    e.service.resolve("r").await.unwrap();
    let before = e.counts();
    // 390 resolves spread over just under the slow tier's TTL: the fast tier lapses
    // every second and is refilled from the slow one, still without a store read.
    for _ in 0..390 {
        let r = e.service.resolve("r").await.unwrap();
        assert_eq!(r.source, Source::Cache);
        assert_eq!(r.store_time, Duration::ZERO);
        e.clock.advance(ms(10));
    }
    assert_eq!(e.counts().since(&before), OpCounts::default());
    // Past the largest TTL the next resolve goes back to the store.
    e.clock.advance(ms(100));
    assert_eq!(e.service.resolve("r").await.unwrap().source, Source::Store);
    assert_eq!(e.counts().since(&before), OpCounts { read_replica: 1, ..Default::default() });
}

#[tokio::test]
async fn a_pre_lock_not_yet_started_is_still_served_from_cache() {
    let e = env().await;
    let grant = e.orchestrator.pre_lock("r", &pre_lock_request()).await.unwrap();
    let effective_at = grant.record.doc.primary.lock.as_ref().unwrap().effective_at;
    e.clock.advance(LAG);
    // The miss sees the pre-lock on the replica; it has not started, so it is cached.
    let r = e.service.resolve("r").await.unwrap();
    assert_eq!(r.source, Source::Store);
    assert!(r.lock().is_some());
    let before = e.counts();
    // Until effectiveAt minus the skew margin, cache hits cost nothing.
    while e.now() + to_chrono(SKEW) < effective_at - to_chrono(ms(100)) {
        let r = e.service.resolve("r").await.unwrap();
        if r.source != Source::Cache {
            // Only because the slow tier lapsed: a replica read, never the write region.
            assert_eq!(r.source, Source::Store);
        }
        e.clock.advance(ms(100));
    }
    assert_eq!(e.counts().since(&before).read_write_region, 0);
    // Within the skew margin of effectiveAt the lock already counts as started.
    e.clock.set(effective_at - to_chrono(ms(400)));
    assert_eq!(e.service.resolve("r").await.unwrap().source, Source::ReadThrough);
}

#[tokio::test]
async fn a_started_lock_costs_one_write_region_read_per_resolve_and_no_replica_read() {
    let e = env().await;
    let grant = e.orchestrator.pre_lock("r", &pre_lock_request()).await.unwrap();
    e.clock.advance(LockPolicy::declared(SLOW, LAG, Duration::ZERO).convergence_delay);

    // A cold cache cannot know the resource is locked: one replica read finds the
    // started lock, then the write region is read (never enforced on the replica's view).
    let before = e.counts();
    let r = e.service.resolve("r").await.unwrap();
    assert_eq!(r.source, Source::ReadThrough);
    assert_eq!(e.counts().since(&before), OpCounts { read_replica: 1, read_write_region: 1, ..Default::default() });

    // Warm: every resolve is exactly one write-region read, also well within every TTL.
    for i in 0..50u64 {
        let before = e.counts();
        let r = e.service.resolve("r").await.unwrap();
        assert_eq!(r.source, Source::ReadThrough, "resolve {i}");
        assert_eq!(e.counts().since(&before), OpCounts { read_write_region: 1, ..Default::default() }, "resolve {i}");
        e.clock.advance(ms(50));
    }

    // The read-through is what makes a change visible at once: an escalation by the
    // orchestrator shows on the very next resolve, though the cache TTL has not lapsed.
    e.orchestrator.escalate("r", &grant.token, Phase::HardDelete, Duration::from_secs(60)).await.unwrap();
    let r = e.service.resolve("r").await.unwrap();
    assert_eq!(r.source, Source::ReadThrough);
    assert_eq!(r.lock().unwrap().phase, Phase::HardDelete);
    assert_eq!(r.record.etag, e.store.memory.read("r", ReadFrom::WriteRegion).await.unwrap().etag);
}

#[tokio::test]
async fn after_the_lease_lapses_the_cache_serves_again() {
    let e = env().await;
    let grant = e.orchestrator.pre_lock("r", &pre_lock_request()).await.unwrap();
    let expires_at = grant.record.doc.primary.lock.as_ref().unwrap().expires_at;
    // A lease is final once it ended more than the skew margin ago (a clock step back
    // within the margin could revive it; routing_bugs.rs shows why).
    e.clock.set(expires_at + chrono::TimeDelta::from_std(SKEW).unwrap());
    // The first resolve learns the lease is over (how many reads that takes is
    // routing_bugs.rs' concern); from then on cache hits are free.
    e.service.resolve("r").await.unwrap();
    let before = e.counts();
    for _ in 0..20 {
        assert_eq!(e.service.resolve("r").await.unwrap().source, Source::Cache);
    }
    assert_eq!(e.counts().since(&before), OpCounts::default());
}

/// When does an instance that cached the unlocked document first see a new lock?
/// Returns that instant (the lock was taken at `locked_at`), checking on the way that
/// the instance only ever read replicas and never served the unlocked document once
/// the lock took effect.
async fn first_sight(cached_before_lock: Duration) -> (DateTime<Utc>, DateTime<Utc>, DateTime<Utc>) {
    let e = env().await;
    let cached_at = e.now();
    assert_eq!(e.service.resolve("r").await.unwrap().source, Source::Store);
    e.clock.advance(cached_before_lock);
    let locked_at = e.now();
    let grant = e.orchestrator.pre_lock("r", &pre_lock_request()).await.unwrap();
    let effective_at = grant.record.doc.primary.lock.as_ref().unwrap().effective_at;
    let step = ms(50);
    loop {
        let before = e.counts();
        let r = e.service.resolve("r").await.unwrap();
        let reads = e.counts().since(&before);
        if r.lock().is_some() {
            // A replica read, followed by a write-region read if the lock is within the
            // skew margin of starting.
            assert_ne!(r.source, Source::Cache, "first sight needs a store read");
            return (cached_at, locked_at, e.now());
        }
        assert!(e.now() < effective_at, "the lock is in force and the instance still serves the unlocked document");
        match r.source {
            Source::Cache => assert_eq!(reads, OpCounts::default()),
            Source::Store => assert_eq!(reads, OpCounts { read_replica: 1, ..Default::default() }),
            Source::ReadThrough => panic!("read-through of a document without a lock"),
        }
        e.clock.advance(step);
    }
}

#[tokio::test]
async fn a_cached_instance_converges_within_max_ttl_plus_replication_bound() {
    let bound = to_chrono(SLOW + LAG);
    let mut worst = chrono::TimeDelta::zero();
    // Lock taken at every phase of the instance's cache entry, 0 to 4 s after caching.
    for offset_ms in (0..=4000).step_by(250) {
        let (cached_at, locked_at, seen_at) = first_sight(ms(offset_ms)).await;
        let delay = seen_at - locked_at;
        assert!(delay <= bound, "offset {offset_ms} ms: seen after {delay}, bound {bound}");
        // Never before the replica could show the lock, nor before the entry lapsed.
        assert!(delay >= to_chrono(LAG), "offset {offset_ms} ms: seen after {delay}, before the replica lag");
        assert!(seen_at >= cached_at + to_chrono(SLOW), "offset {offset_ms} ms: seen before the cached entry lapsed");
        worst = worst.max(delay);
    }
    // The bound is not slack: some phase comes within one resolve step of it.
    assert!(worst > bound - to_chrono(ms(300)), "worst case {worst} is far below the bound {bound}");
}

#[tokio::test]
async fn resolve_with_answers_as_resolve_and_a_hit_lends_the_cached_document() {
    let e = env().await;
    let seen = |lent: lockprobe::routing::Lent<'_>| (lent.source, lent.record.etag.clone(), lent.location().to_owned());
    // A miss, then hits: the same reads and the same answer as `resolve`.
    let before = e.counts();
    let (source, etag, location) = e.service.resolve_with("r", seen).await.unwrap();
    assert_eq!((source, location.as_str()), (Source::Store, "westeurope"));
    assert_eq!(e.counts().since(&before), OpCounts { read_replica: 1, ..Default::default() });
    let held = e.service.resolve("r").await.unwrap();
    assert_eq!((held.source, &held.record.etag), (Source::Cache, &etag));
    let before = e.counts();
    // The hit lends the very document the cache holds and takes no reference on it
    // (a reference is a write to memory every thread serving that resource shares).
    let references = Arc::strong_count(&held.record);
    let lent = e.service.resolve_with("r", |lent| {
        (lent.source, Arc::ptr_eq(lent.record, &held.record), Arc::strong_count(lent.record))
    });
    assert_eq!(lent.await.unwrap(), (Source::Cache, true, references));
    assert_eq!(e.counts().since(&before), OpCounts::default());

    // A started lock: read through the write region, once per resolve, as `resolve`.
    e.orchestrator.pre_lock("r", &pre_lock_request()).await.unwrap();
    e.clock.advance(LockPolicy::declared(SLOW, LAG, Duration::ZERO).convergence_delay);
    e.service.resolve("r").await.unwrap();
    let before = e.counts();
    let (source, etag, _) = e.service.resolve_with("r", seen).await.unwrap();
    assert_eq!(source, Source::ReadThrough);
    assert_eq!(e.counts().since(&before), OpCounts { read_write_region: 1, ..Default::default() });
    assert_eq!(etag, e.store.memory.read("r", ReadFrom::WriteRegion).await.unwrap().etag);

    // Resolving a resource with no document: the same error as `resolve`; creating it
    // answers from the store, then from the cache.
    let missing = e.service.resolve_with("new", seen).await.unwrap_err();
    assert_eq!(missing, e.service.resolve("new").await.unwrap_err());
    let created = e.service.resolve_or_create_with("new", "northeurope", seen).await.unwrap();
    assert_eq!((created.0, created.2.as_str()), (Source::Store, "northeurope"));
    let again = e.service.resolve_or_create_with("new", "westeurope", seen).await.unwrap();
    assert_eq!((again.0, again.1, again.2), (Source::Cache, created.1, created.2));
}

/// A lock call reads back the version this instance wrote last: that version is taken
/// as cached (one write-region read, nothing settled again), and it is exactly what
/// settling the stored version gives, as another instance's read finds.
#[tokio::test]
async fn a_version_this_instance_wrote_is_read_back_as_cached_and_as_any_reader_settles_it() {
    let e = env().await;
    let grant = e.orchestrator.pre_lock("r", &pre_lock_request()).await.unwrap();
    let effective = grant.record.doc.primary.lock.as_ref().unwrap().effective_at;
    e.clock.set(effective);
    let escalated =
        e.orchestrator.escalate("r", &grant.token, Phase::HardDelete, Duration::from_secs(60)).await.unwrap();
    assert!(escalated.doc.primary.lock.as_ref().unwrap().phase_since.is_some(), "settled: the phase has begun");
    let stored = e.store.memory.read("r", ReadFrom::WriteRegion).await.unwrap();
    assert!(stored.doc.pending.is_some(), "the stored version still carries its pending record");

    let before = e.counts();
    let own = e.orchestrator.read_uncached("r").await.unwrap();
    assert_eq!(e.counts().since(&before), OpCounts { read_write_region: 1, ..Default::default() });
    assert!(Arc::ptr_eq(&own.record, &escalated), "the cached version, not settled again");
    let other = e.service.read_uncached("r").await.unwrap();
    assert!(!Arc::ptr_eq(&other.record, &escalated));
    assert_eq!(other.record, escalated, "settled alike by an instance that never cached it");

    // Once the entry is evicted, the version is settled anew, to the same document.
    e.clock.advance(SLOW + FAST);
    e.orchestrator.evict_expired();
    let again = e.orchestrator.read_uncached("r").await.unwrap();
    assert!(!Arc::ptr_eq(&again.record, &escalated));
    assert_eq!(again.record, escalated);
}
