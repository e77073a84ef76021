//! `lockprobe bench` in seconds: the load generator drives both lock designs through the
//! service's handlers, and the store's own counts show what each design costs. Counts
//! and document sizes are asserted, never timings (this machine is shared).

use std::sync::Arc;
use std::time::Duration;

use lockprobe::clock::SystemClock;
use lockprobe::document::LocationDocument;
use lockprobe::harness::load::{self, LoadResult, LoadSpec};
use lockprobe::harness::{MAX_BYTES, P99_BUDGET_BYTES};
use lockprobe::service::LockDesign;
use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
use lockprobe::store::LocationStore;
use lockprobe::testing::{LatencyModel, LatencyStore};

const MIGRATING: f64 = 0.1;

fn spec(design: LockDesign) -> LoadSpec {
    LoadSpec {
        design,
        migrating: MIGRATING,
        resources: 100,
        instances: 2,
        rate: 300.0,
        duration: Duration::from_secs(2),
        warmup: Duration::from_millis(500),
        cache_ttl: Duration::from_millis(300),
        replication_bound: Duration::from_millis(50),
        skew_margin: Duration::from_millis(50),
        max_decision_age: Duration::from_millis(250),
        phase_hold: Duration::from_millis(100),
        keys: 4,
        prefix: "smoke-".into(),
    }
}

async fn run(design: LockDesign) -> LoadResult {
    let spec = spec(design);
    let memory = MemoryStore::new(
        Arc::new(SystemClock),
        MemoryStoreConfig { replica_lag: spec.replication_bound, ..MemoryStoreConfig::default() },
    );
    let store: Arc<dyn LocationStore> = Arc::new(LatencyStore::new(Arc::new(memory), LatencyModel::none()));
    load::run(&spec, store).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_design_pays_for_the_lock_as_it_must() {
    let embedded = run(LockDesign::Embedded).await;
    let record = run(LockDesign::Record).await;
    for r in [&embedded, &record] {
        assert!(r.user_ops > 500, "{:?}: the generator ran ({} ops)", r.design, r.user_ops);
        assert!(r.migrations > 0, "{:?}: migrations went through the lifecycle", r.design);
        assert!(r.blocked > 0, "{:?}: some user writes met a write lock", r.design);
        assert_eq!(r.latency_us.len(), r.user_ops, "every counted operation was timed");
    }

    // The record design reads the lock record exactly once per user operation (over the
    // whole run, every operation finished), and its routing documents never make it read
    // the write region (the population is older than the replication bound).
    let per_op = |n: u64, r: &LoadResult| n as f64 / r.user_ops as f64;
    assert_eq!(record.all_user_calls.lock.reads(), record.all_user_ops, "one lock-record read per operation");
    assert_eq!(record.all_user_calls.lock.read_replica, 0, "lock records are read from the write region only");
    assert_eq!(record.all_user_calls.routing.read_write_region, 0);

    // The embedded design has no lock record; its lock reads are the read-throughs of
    // started locks, on the migrating resources only: fewer than f per operation.
    assert_eq!(embedded.user_calls.lock, Default::default());
    let embedded_lock = per_op(embedded.user_calls.routing.read_write_region, &embedded);
    assert!(embedded_lock > 0.0, "started locks were read through");
    assert!(embedded_lock < MIGRATING, "embedded: {embedded_lock} lock reads per operation at f = {MIGRATING}");

    // User operations never write the lock record; the orchestration writes it.
    assert_eq!(record.user_calls.lock.writes(), 0);
    assert!(record.orchestration_calls.lock.writes() > 0);
    assert_eq!(embedded.orchestration_calls.lock.writes(), 0);

    // Every version the lock calls wrote was measured, in every phase a migration goes
    // through, and within contract 1.3's budget.
    let bare = LocationDocument::new("smoke-0", "westeurope").serialized_len() as u64;
    for r in [&embedded, &record] {
        let sizes = &r.document_sizes;
        let shown = sizes.text("");
        for phase in ["preLock", "hardDelete", "write", "unlocked"] {
            let row = sizes.phase(phase).unwrap_or_else(|| panic!("{:?}: no {phase} row:\n{shown}", r.design));
            assert!(row.versions > 0, "{:?}: no {phase} version measured:\n{shown}", r.design);
            // No version is smaller than a bare routing document. The record design's
            // routing moves after a swap are exactly that, and they are half its unlocked
            // versions when no migration was abandoned (a swap writes the lock record and
            // the move, a release only the lock record): its unlocked p50 may be one.
            assert!(row.p50 >= bare && row.p50 <= row.p99 && row.p99 <= row.max, "{:?}: {row:?}", r.design);
            assert!(row.max > 200, "{:?}: no version carries a lock or its records: {row:?}", r.design);
            if !(r.design == LockDesign::Record && phase == "unlocked") {
                assert!(row.p50 > 200, "{:?}: {row:?}", r.design);
            }
            assert!(row.p99 < P99_BUDGET_BYTES && row.max < MAX_BYTES, "{:?}: {row:?}", r.design);
        }
        assert!(sizes.over_budget().is_empty(), "{:?}: {:?}", r.design, sizes.over_budget());
        // The sizes cover the whole run, the counts only its window.
        let measured: u64 = sizes.rows.iter().map(|p| p.versions).sum();
        let written = r.orchestration_calls.routing.writes() + r.orchestration_calls.lock.writes();
        assert!(measured >= written && written > 0, "{:?}: {measured} measured, {written} written", r.design);
        // A migration writes one version of each lock phase, then its swap's.
        let at = |phase: &str| sizes.phase(phase).map_or(0, |p| p.versions);
        assert!(at("preLock") >= r.migrations && at("write") >= r.migrations, "{:?}:\n{shown}", r.design);
    }
    // The embedded design's routing document carries the lock and its call records; the
    // record design's lock record does the same, so its lock phases are alike in size.
    let p50 = |r: &LoadResult, phase: &str| r.document_sizes.phase(phase).map_or(0, |p| p.p50);
    assert!(p50(&embedded, "write") > p50(&embedded, "preLock"));
    assert!(p50(&record, "write") > p50(&record, "preLock"));
}

fn lockprobe() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_lockprobe"))
}

#[test]
fn bad_flags_exit_64_naming_the_flag() {
    for (args, named) in [
        (vec!["--fractions", "0"], "--fractions"),
        (vec!["--fractions", "150%"], "--fractions"),
        (vec!["--designs", "table"], "--designs"),
        (vec!["--rate=-3"], "--rate"),
        (vec!["--runs", "0"], "--runs"),
        (vec!["--write-latency", "9ms..2ms"], "--write-latency"),
        (vec!["--duration", "500000years"], "--duration"),
        (vec!["--resources", "40", "--fractions", "1%"], "--resources"),
    ] {
        let out = lockprobe().arg("bench").args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
    }
}

/// The command end to end, JSON out: both designs at one fraction and their ratio.
#[test]
fn the_command_reports_both_designs_and_their_ratio_as_json() {
    let out = lockprobe()
        .args(["bench", "--json", "--fractions", "10%", "--resources", "50", "--rate", "200"])
        .args(["--duration", "1s", "--warmup", "300ms", "--cache-ttl", "200ms", "--replication-bound", "50ms"])
        .args(["--phase-hold", "50ms"])
        .args(["--replica-read-latency", "0s", "--write-region-read-latency", "0s", "--write-latency", "0s"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{report}");
    let lock_reads = |design: &str| {
        results.iter().find(|r| r["design"] == design).unwrap()["median"]["lockReadsPerOp"].as_f64().unwrap()
    };
    assert!((0.9..=1.1).contains(&lock_reads("record")), "{report}");
    assert!(lock_reads("embedded") < 0.3, "{report}");
    for row in results {
        let sizes = row["documentSizes"].as_array().unwrap();
        assert_eq!(sizes.len(), 4, "{report}");
        for phase in sizes {
            assert!(phase["versions"].as_u64().unwrap() > 0, "{report}");
            assert!(phase["p99"].as_u64().unwrap() < 4096, "{report}");
        }
    }
    let ratio = &report["ratios"][0]["median"];
    assert!(ratio["lockReads"].as_f64().unwrap() > 3.0, "{report}");
}
