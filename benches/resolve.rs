//! `RoutingClient::resolve` on its three paths, against a plain `HashMap` lookup
//! measured in the same run. Run with
//! `cargo bench --bench resolve -- --warm-up-time 1 --measurement-time 3`;
//! figures and ratios are in BENCHMARKS.md.
//!
//! `resolve` is async; against the in-memory store every path completes on its first
//! poll, so it is polled once with `now_or_never` (no runtime, no scheduler cost in the
//! figure). The `parts/*` benchmarks time the pieces of a cache hit, to show where the
//! time goes. `cache_hit_unlocked_lent` is the hit as the service takes it
//! (`resolve_with`: the document lent, not its `Arc` cloned).
//!
//! After the criterion groups, `threads` measures cache-hit throughput on one thread and
//! on two sharing one client (five rounds of half a second each, medians), and prints
//! the ratio: the hit path must not serialise threads on a lock. The same run measures
//! the machine's own ceiling for that ratio (two threads with nothing shared), since a
//! shared or busy machine cannot reach 2x for any workload.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use futures::FutureExt;

use lockprobe::clock::{Clock, SystemClock};
use lockprobe::routing::cache::{Lookup, TieredCache};
use lockprobe::routing::{ClientOptions, LocationDocument, LockPolicy, PreLockRequest, RoutingClient, Source};
use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
use lockprobe::store::{ETag, LocationStore, Versioned};

/// Resources in the store and in every map, so lookups are not into a tiny table.
const RESOURCES: usize = 1000;
const PROBE_ID: &str = "resource-000500";
/// Unlocked, for the miss path.
const MISS_ID: &str = "resource-000499";
/// Carries a started live lock, for the read-through path.
const LOCKED_ID: &str = "resource-000501";
const HOUR: Duration = Duration::from_secs(3600);

fn id(i: usize) -> String {
    format!("resource-{i:06}")
}

fn store() -> Arc<MemoryStore> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = Arc::new(MemoryStore::new(clock, MemoryStoreConfig::default()));
    for i in 0..RESOURCES {
        store.create(&LocationDocument::new(id(i), "westeurope")).now_or_never().unwrap().unwrap();
    }
    store
}

/// A client whose cache tiers have these TTLs; locks it grants start at once
/// (convergence delay zero), so the read-through path can be measured.
fn client(store: &Arc<MemoryStore>, ttls: &[Duration]) -> RoutingClient {
    RoutingClient::new(
        store.clone(),
        Arc::new(SystemClock),
        TieredCache::try_new(ttls).unwrap(),
        LockPolicy::new(Duration::ZERO, HOUR),
        ClientOptions::default(),
    )
}

fn resolve_once(c: &RoutingClient, id: &str) -> Source {
    c.resolve(id).now_or_never().expect("completes on first poll").expect("resolves").source
}

fn bench_resolve(cr: &mut Criterion) {
    let store = store();

    // Baseline: the same documents in a plain map, looked up by id, Arc cloned out.
    let map: HashMap<String, Arc<Versioned>> = (0..RESOURCES)
        .map(|i| {
            let doc = LocationDocument::new(id(i), "westeurope");
            (
                id(i),
                Arc::new(Versioned { doc, etag: ETag(format!("e{i}")), committed_at: chrono::DateTime::UNIX_EPOCH }),
            )
        })
        .collect();

    // Cache hit: two tiers, an hour each, every resource resolved once.
    let hit = client(&store, &[HOUR, HOUR]);
    for i in 0..RESOURCES {
        resolve_once(&hit, &id(i));
    }
    assert_eq!(resolve_once(&hit, PROBE_ID), Source::Cache);

    // Read-through: a started live lock on its own resource.
    let through = client(&store, &[HOUR, HOUR]);
    let req = PreLockRequest { owner: "bench".into(), duration: HOUR, target_location: None };
    through.pre_lock(LOCKED_ID, &req).now_or_never().unwrap().unwrap();
    assert_eq!(resolve_once(&through, LOCKED_ID), Source::ReadThrough);

    // Miss: a zero TTL never serves, so every resolve reads a replica (and only that:
    // the resource is unlocked).
    let miss = client(&store, &[Duration::ZERO]);
    assert_eq!(resolve_once(&miss, MISS_ID), Source::Store);

    // The same map hashed as the cache hashes (ahash), to tell the hasher's share apart.
    let ahash_map: HashMap<String, Arc<Versioned>, ahash::RandomState> =
        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();

    let mut g = cr.benchmark_group("resolve");
    g.bench_function("hashmap_baseline", |b| b.iter(|| map.get(black_box(PROBE_ID)).cloned()));
    g.bench_function("hashmap_ahash_baseline", |b| b.iter(|| ahash_map.get(black_box(PROBE_ID)).cloned()));
    g.bench_function("cache_hit_unlocked", |b| b.iter(|| hit.resolve(black_box(PROBE_ID)).now_or_never()));
    // The hit as the service takes it: the document lent, its location read.
    g.bench_function("cache_hit_unlocked_lent", |b| {
        b.iter(|| hit.resolve_with(black_box(PROBE_ID), |lent| lent.location().len()).now_or_never())
    });
    g.bench_function("cache_miss", |b| b.iter(|| miss.resolve(black_box(MISS_ID)).now_or_never()));
    g.bench_function("read_through_live_lock", |b| b.iter(|| through.resolve(black_box(LOCKED_ID)).now_or_never()));
    g.finish();

    // The pieces of a cache hit.
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let one_tier = TieredCache::try_new(&[HOUR]).unwrap();
    let now = clock.now_unix_nanos();
    for (k, v) in &map {
        one_tier.put(k, v.clone(), now, i64::MAX);
    }
    let mut p = cr.benchmark_group("parts");
    p.bench_function("clock_now_calendar", |b| b.iter(|| black_box(&clock).now()));
    p.bench_function("clock_now_unix_nanos", |b| b.iter(|| black_box(&clock).now_unix_nanos()));
    p.bench_function("tiered_cache_lookup_one_tier", |b| {
        b.iter(|| one_tier.lookup(black_box(PROBE_ID), black_box(now)))
    });
    p.bench_function("tiered_cache_pinned_lookup_one_tier", |b| {
        b.iter(|| matches!(one_tier.pin().lookup(black_box(PROBE_ID), black_box(now)), Lookup::Serve(_)))
    });
    // The tier as it was before the sharded map (main at dad18b6): one RwLock over a
    // SipHash HashMap per tier, the entry checked under the read lock.
    let old_tier: OldTier = RwLock::new(map.iter().map(|(k, v)| (k.clone(), (v.clone(), now, i64::MAX))).collect());
    p.bench_function("rwlock_siphash_lookup_one_tier_before", |b| {
        b.iter(|| old_lookup(&old_tier, black_box(PROBE_ID), black_box(now)))
    });
    p.bench_function("arc_clone_drop", |b| {
        let a = map[PROBE_ID].clone();
        b.iter(|| black_box(&a).clone())
    });
    p.finish();
}

/// The tier before the sharded map: one lock over a SipHash map of (record, fetched,
/// serve-until).
type OldTier = RwLock<HashMap<String, (Arc<Versioned>, i64, i64)>>;

/// The old tier's hit path: read lock, SipHash lookup, freshness compares, Arc clone.
fn old_lookup(tier: &OldTier, id: &str, now: i64) -> Option<Arc<Versioned>> {
    let entries = tier.read().unwrap();
    let (record, fetched, serve_until) = entries.get(id)?;
    (now < fetched.saturating_add(3_600_000_000_000) && now < *serve_until).then(|| record.clone())
}

/// One timed operation: the thread's index and a resource id.
type Op<'a> = dyn Fn(usize, &str) + Sync + 'a;

/// Operations per second on `threads` threads, each walking every resource from its own
/// starting point for `run` of wall time; `op` gets the thread's index and an id.
fn per_second(ids: &[String], threads: usize, run: Duration, op: &Op) -> f64 {
    let total: u64 = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let start = Instant::now();
                    let mut done = 0u64;
                    let mut i = t * ids.len() / threads;
                    while start.elapsed() < run {
                        // Checking the clock every 1024 operations keeps its cost out of the figure.
                        for _ in 0..1024 {
                            op(t, &ids[i]);
                            i = (i + 1) % ids.len();
                        }
                        done += 1024;
                    }
                    done
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("worker")).sum()
    });
    total as f64 / run.as_secs_f64()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// One document per id, as the baselines hold them.
fn records(ids: &[String]) -> Vec<(String, Arc<Versioned>)> {
    ids.iter()
        .map(|i| {
            let doc = LocationDocument::new(i.clone(), "westeurope");
            (i.clone(), Arc::new(Versioned { doc, etag: ETag("e".into()), committed_at: chrono::DateTime::UNIX_EPOCH }))
        })
        .collect()
}

/// One thread against two, alternating, five rounds: the ratio of the medians. The
/// first line is the machine's own ceiling in this run: each thread looks ids up in
/// a private map of its own (nothing shared, nothing to contend on), so its ratio is
/// what two threads can gain here at all; the others are also given as a fraction of it.
fn bench_threads() {
    let store = store();
    let client = client(&store, &[HOUR, HOUR]);
    let ids: Vec<String> = (0..RESOURCES).map(id).collect();
    for i in &ids {
        assert_eq!(resolve_once(&client, i), Source::Store);
    }
    let private: Vec<HashMap<String, Arc<Versioned>, ahash::RandomState>> =
        (0..2).map(|_| records(&ids).into_iter().collect()).collect();
    let now = SystemClock.now_unix_nanos();
    let old_tier: OldTier = RwLock::new(records(&ids).into_iter().map(|(i, r)| (i, (r, now, i64::MAX))).collect());
    let lines: [(&str, &Op); 4] = [
        ("ceiling: private ahash HashMap per thread (get + Arc clone)", &|t, id| {
            black_box(private[t].get(id).cloned());
        }),
        ("cache_hit_unlocked (resolve)", &|_, id| {
            black_box(client.resolve(id).now_or_never());
        }),
        ("cache_hit_unlocked_lent (resolve_with)", &|_, id| {
            black_box(client.resolve_with(id, |lent| lent.location().len()).now_or_never());
        }),
        ("rwlock_siphash_tier_before (lookup only)", &|_, id| {
            black_box(old_lookup(&old_tier, id, now));
        }),
    ];
    let run = Duration::from_millis(500);
    let mut rates = vec![(Vec::new(), Vec::new()); lines.len()];
    for _ in 0..5 {
        for ((_, op), (one, two)) in lines.iter().zip(&mut rates) {
            one.push(per_second(&ids, 1, run, *op));
            two.push(per_second(&ids, 2, run, *op));
        }
    }
    let mut ceiling = None;
    for ((name, _), (one, two)) in lines.iter().zip(rates) {
        let (one, two) = (median(one), median(two));
        let ratio = two / one;
        let of_ceiling = ceiling.map_or(String::new(), |c: f64| format!(", {:.0}% of the ceiling", 100.0 * ratio / c));
        ceiling.get_or_insert(ratio);
        println!(
            "threads/{name}: 1 thread {:.2} M/s, 2 threads {:.2} M/s, ratio {ratio:.2}x{of_ceiling} (medians of 5)",
            one / 1e6,
            two / 1e6,
        );
    }
}

criterion_group!(benches, bench_resolve);

fn main() {
    benches();
    // `cargo test --all-targets` runs this binary without `--bench`: skip the timed part.
    if std::env::args().any(|a| a == "--bench") {
        bench_threads();
    }
    Criterion::default().configure_from_args().final_summary();
}
