//! The long-running probe against the real reference service: readiness, overlapping
//! cycles on distinct pool resources, and enforcement violations on `/metrics`.

#[path = "support/service.rs"]
mod support;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use lockprobe::probe::CycleResult;
use lockprobe::probe::StateFile;
use lockprobe::probe::TargetSchedule;
use lockprobe::probe::TracingObserver;
use lockprobe::probe::{Probe, RunSummary};
use lockprobe::probe::{ProbeSettings, RESOURCES_PER_CYCLE};
use lockprobe::service::Fault;
use support::{start_service, TestService};
use tokio_util::sync::CancellationToken;

fn target(svc: &TestService, concurrency: usize) -> (ProbeSettings, TargetSchedule) {
    let settings = svc.probe_settings("serve-test", "serve-test");
    let schedule = TargetSchedule {
        name: "serve-test".into(),
        schedule: cron::Schedule::from_str("* * * * * *").unwrap(),
        jitter: Duration::ZERO,
        concurrency,
        timeout: Duration::from_secs(60),
        pool: (1..=RESOURCES_PER_CYCLE * concurrency).map(|i| format!("probe-s{i:03}")).collect(),
    };
    (settings, schedule)
}

async fn run(svc: &TestService, concurrency: usize, cycles: usize) -> (Probe, RunSummary, String) {
    run_with(svc, concurrency, cycles, false).await
}

/// [`run`], with the force-release check when `force_release` (the service's two admin
/// principals' keys).
async fn run_with(
    svc: &TestService,
    concurrency: usize,
    cycles: usize,
    force_release: bool,
) -> (Probe, RunSummary, String) {
    let probe = Probe::new().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let p = probe.clone();
    let (mut settings, schedule) = target(svc, concurrency);
    if force_release {
        settings.force_release = Some(svc.admin_keys());
    }
    let targets = vec![(settings, schedule)];
    let task = tokio::spawn(async move {
        p.run(
            targets,
            Arc::new(StateFile::in_memory()),
            Arc::new(TracingObserver),
            listener,
            Some(cycles),
            CancellationToken::new(),
        )
        .await
        .unwrap()
    });
    // Ready while the scheduler runs.
    let mut ready = false;
    for _ in 0..50 {
        if let Ok(r) = reqwest::get(format!("{base}/readyz")).await {
            if r.status() == 200 {
                ready = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "/readyz never became ready");
    let summary =
        tokio::time::timeout(Duration::from_secs(60), task).await.expect("run stops after its cycles").unwrap();
    (probe, summary, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_cycles_pass_on_distinct_resources() {
    let svc = start_service(vec![], Duration::from_secs(1), Duration::from_millis(500)).await;
    let (probe, summary, _) = run_with(&svc, 2, 2, true).await;
    assert!(summary.cycles >= 2, "{summary:?}");
    let cycles = probe.status.cycles("serve-test");
    let passed: Vec<_> = cycles.iter().filter(|c| c.result == CycleResult::Passed).collect();
    assert!(passed.len() >= 2, "{cycles:#?}");
    // The two cycles overlapped in time and used different resources.
    let (a, b) = (passed[0], passed[1]);
    assert!(a.started_at < b.finished_at && b.started_at < a.finished_at, "no overlap");
    assert_ne!(a.resource, b.resource);
    // Each made the force-release check on a resource of its own, and it held.
    for c in [a, b] {
        let forced: Vec<_> = c.assertions.iter().filter(|x| x.check == "negative/force-release").collect();
        assert!(forced.len() >= 15 && forced.iter().all(|x| x.passed), "{forced:#?}");
    }
    // With both slots busy, schedules every second were missed and counted.
    assert!(probe.status.missed("serve-test") >= 1);
    assert!(probe.metrics.render().contains("lockprobe_probe_missed_schedules_total{target=\"serve-test\"}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enforcement_violations_reach_metrics_and_status() {
    let svc = start_service(vec![Fault::IgnoreWriteLock], Duration::from_secs(1), Duration::from_millis(500)).await;
    let (probe, summary, base) = run(&svc, 1, 1).await;
    assert_eq!(summary, RunSummary { cycles: 1, unsuccessful: 1, interrupted: 0 });
    let text = probe.metrics.render();
    for needle in [
        r#"lockprobe_enforcement_violations_total{expected="block",observed="allow",op="write",phase="write",target="serve-test"} 2"#,
        r#"lockprobe_enforcement_violations_total{expected="block",observed="allow",op="delete",phase="write",target="serve-test"} 2"#,
        r#"lockprobe_probe_runs_total{result="failed",target="serve-test"} 1"#,
        r#"lockprobe_assertions_total{expected="block",op="write",phase="write",result="failed",target="serve-test"} 2"#,
    ] {
        assert!(text.contains(needle), "missing {needle}:\n{text}");
    }
    let status = probe.status.document(&probe.metrics);
    let cycle = &status.targets[0].last_cycles[0];
    assert_eq!(cycle.result, CycleResult::Failed);
    assert_eq!(cycle.failed_assertions, 4);
    // The server has stopped with the run; its state is what the status API served.
    assert!(reqwest::get(format!("{base}/healthz")).await.is_err());
}

/// Starts one `serve` replica of the shared configuration (its own state file, as a
/// second pod would have); returns its parts and its task.
async fn replica(
    svc: &TestService,
    stop_after: Option<usize>,
) -> (Probe, tokio::task::JoinHandle<RunSummary>, CancellationToken) {
    let probe = Probe::new().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (p, stop) = (probe.clone(), CancellationToken::new());
    let targets = vec![target(svc, 2)];
    let shutdown = stop.clone();
    let task = tokio::spawn(async move {
        p.run(targets, Arc::new(StateFile::in_memory()), Arc::new(TracingObserver), listener, stop_after, shutdown)
            .await
            .unwrap()
    });
    (probe, task, stop)
}

fn claims(probe: &Probe, outcome: &str) -> u64 {
    let needle = format!("lockprobe_probe_claims_total{{outcome=\"{outcome}\",target=\"serve-test\"}} ");
    let text = probe.metrics.render();
    let line = text.lines().find(|l| l.starts_with(&needle)).unwrap_or_else(|| panic!("no {needle} in\n{text}"));
    line[needle.len()..].trim().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_with_one_config_share_the_pool_and_the_survivor_carries_on() {
    let svc = start_service(vec![], Duration::from_secs(1), Duration::from_millis(500)).await;
    // Two replicas, the same target and pool (two groups of resources), each allowed two
    // cycles at once, firing every second: they always want more than there is.
    let (a, a_task, _a_stop) = replica(&svc, None).await;
    let (b, b_task, b_stop) = replica(&svc, None).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while a.status.cycles("serve-test").len() < 3 || b.status.cycles("serve-test").len() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "both replicas should run 3 cycles");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (name, replica) in [("a", &a), ("b", &b)] {
        let cycles = replica.status.cycles("serve-test");
        let bad: Vec<_> = cycles.iter().filter(|c| c.result != CycleResult::Passed).collect();
        assert!(bad.is_empty(), "replica {name}: a cycle failed because of the other: {bad:#?}");
        assert!(claims(replica, "held") >= cycles.len() as u64, "replica {name} claimed every cycle's resources");
    }
    assert!(claims(&a, "busy") + claims(&b, "busy") >= 1, "the replicas met and stepped aside");

    // Kill replica a without any cleanup (its claim and its locks stay until their leases
    // end); b keeps probing the target on the other group, and passes.
    a_task.abort();
    let _ = a_task.await;
    let before = b.status.cycles("serve-test").len();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while b.status.cycles("serve-test").len() < before + 2 {
        assert!(tokio::time::Instant::now() < deadline, "the surviving replica should carry on");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cycles = b.status.cycles("serve-test");
    assert!(cycles.iter().all(|c| c.result == CycleResult::Passed), "{cycles:#?}");
    b_stop.cancel();
    tokio::time::timeout(Duration::from_secs(60), b_task).await.expect("b stops").unwrap();
}
