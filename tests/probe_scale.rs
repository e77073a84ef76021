//! A small run of the probe engine at scale (`harness::probe_scale`): 50 targets' cycles at
//! once in one probe process against in-process reference services. Every target runs,
//! every judged cycle passes, and the scheduler reports every wake-up. Counts, not
//! timings (the figures at 1,000 targets are in BENCHMARKS.md).

use std::time::Duration;

use lockprobe::harness::probe_scale::{self, ScaleConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_targets_run_their_cycles_side_by_side_and_pass() {
    let targets = 50;
    let config = ScaleConfig {
        targets,
        services: 2,
        rounds: 1,
        schedule: "*/2 * * * * *".into(),
        jitter: Duration::from_millis(500),
        ..ScaleConfig::default()
    };
    let r = probe_scale::run(config).await.unwrap();
    assert_eq!(r.targets_run, targets);
    assert_eq!(r.cycles, targets);
    assert_eq!(r.passed, targets, "{:?}", r.not_passed);
    assert!(r.peak_concurrent > 1, "cycles of different targets overlap: {}", r.peak_concurrent);
    // At least one wake-up per judged cycle is measured.
    assert!(r.lateness.count >= targets as u64, "{:?}", r.lateness);
}
