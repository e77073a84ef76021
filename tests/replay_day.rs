//! A small day of the paper-scale replay (`harness::replay`): every migration goes through
//! the routing client's full lifecycle and the monitor, reading the memory store's own
//! change stream, sees each one end as it did, with no anomaly; the documents it wrote keep
//! to contract 1.3's size budget. Counts and sizes, not timings.

use std::time::Duration;

use lockprobe::harness::replay::{self, ReplayConfig};
use lockprobe::harness::{MAX_BYTES, P99_BUDGET_BYTES};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_migration_of_a_day_is_seen_ending_as_it_did() {
    replay_a_day(ReplayConfig::default().drivers).await;
}

/// One driver makes every step in order; three share the migrations out and meet at
/// every tick (more drivers than cores, so they are also preempted mid-tick).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_day_ends_the_same_with_one_driver_or_three() {
    replay_a_day(1).await;
    replay_a_day(3).await;
}

async fn replay_a_day(drivers: usize) {
    let migrations = 5_000;
    let config = ReplayConfig {
        migrations,
        drivers,
        // The real day's spacing is ~8.6 ms; a shorter virtual day keeps more in flight.
        day: Duration::from_secs(3_600),
        release_every: 100,
        // Small, so the driver really waits for the monitor and the log wraps.
        max_monitor_lag: 2_000,
        ..ReplayConfig::default()
    };
    let r = replay::run(config).await.unwrap();
    assert_eq!(r.failures, 0, "{:?}", r.first_failures);
    assert_eq!(r.released, migrations / 100);
    assert_eq!(r.swapped, migrations - migrations / 100);
    assert_eq!((r.lapsed, r.early_escalations, r.partial_cutovers), (0, 0, 0));
    assert_eq!((r.orphaned_locks, r.in_flight_at_end), (0, 0));
    // Every committed write reached the monitor through the change stream: pre-lock,
    // hardDelete, write and the swap or release.
    assert_eq!(r.store.writes(), 4 * migrations);
    assert_eq!(r.changes, r.store.writes());
    // Five lock calls per swapped migration (prepare_swap included), four per release.
    assert_eq!(r.lock_calls, 5 * migrations - migrations / 100);
    assert_eq!(r.resolves, 2 * migrations);
    // Retirement keeps the store and the monitor at the migrations in flight, far
    // below the day's total (a migration lasts ~2 virtual minutes; one starts every
    // 720 ms here, so about 180 are in flight).
    assert!(r.peak_in_flight > 100, "the replay overlaps migrations: {}", r.peak_in_flight);
    assert!(r.peak_documents < 1_000, "{}", r.peak_documents);
    assert!(r.peak_timelines < 1_000, "{}", r.peak_timelines);

    // Every version written was measured once, under the phase it stores: a pre-lock,
    // a hardDelete and a write per migration, and its swap or release unlocked.
    let sizes = &r.document_sizes;
    let versions = |phase: &str| sizes.phase(phase).map_or(0, |p| p.versions);
    for phase in ["preLock", "hardDelete", "write", "unlocked"] {
        assert_eq!(versions(phase), migrations, "{phase}: {sizes:?}");
    }
    assert_eq!(sizes.rows.iter().map(|p| p.versions).sum::<u64>(), r.store.writes());
    // Within the budget, and plausible: a document carries a location, a lock and a
    // few call records (the records of each call, so later phases are larger), never
    // under a few hundred bytes nor near the budget.
    assert!(sizes.over_budget().is_empty(), "{:?}\n{}", sizes.over_budget(), sizes.text(""));
    for p in &sizes.rows {
        assert!(p.p50 > 200 && p.p50 <= p.p99 && p.p99 <= p.max, "{p:?}");
        assert!(p.p99 < P99_BUDGET_BYTES && p.max < MAX_BYTES, "{p:?}");
    }
    let p50 = |phase: &str| sizes.phase(phase).map_or(0, |p| p.p50);
    assert!(p50("preLock") < p50("hardDelete") && p50("hardDelete") < p50("write"), "{}", sizes.text(""));
}
