//! `lockprobe demo --cycles 2` on a fresh machine: store, service and probe in one
//! process; exits 0 when every assertion passed, and its metrics endpoint shows the
//! cycle's figures while it runs.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn demo_two_cycles_pass_and_export_metrics() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
        .args(["demo", "--cycles", "2", "--schedule", "*/3 * * * * *"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut metrics_url = None;
    let mut lines = Vec::new();
    let mut checked_metrics = false;
    let rt = tokio::runtime::Runtime::new().unwrap();
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        if let Some(url) = line.trim().strip_prefix("probe metrics:") {
            metrics_url = Some(url.trim().to_string());
        }
        let first_cycle_done = line.contains("[demo] cycle: passed");
        lines.push(line);
        if first_cycle_done && !checked_metrics {
            checked_metrics = true;
            let url = metrics_url.clone().expect("demo prints its metrics URL first");
            let text = rt.block_on(async {
                // The cycle is recorded right after its last line is printed.
                for _ in 0..50 {
                    let t = reqwest::get(&url).await.unwrap().text().await.unwrap();
                    if metric(&t, r#"lockprobe_probe_runs_total{result="passed",target="demo"}"#) >= Some(1.0) {
                        return t;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                panic!("metrics never showed the first cycle");
            });
            assert_eq!(metric(&text, r#"lockprobe_convergence_declared_seconds{target="demo"}"#), Some(1.5), "{text}");
            assert!(
                metric(&text, r#"lockprobe_convergence_observed_seconds{target="demo"}"#).unwrap() <= 2.0,
                "{text}"
            );
            assert_eq!(
                metric(&text, r#"lockprobe_lock_phase_duration_seconds_count{phase="write",target="demo"}"#),
                Some(1.0),
                "{text}"
            );
            assert!(
                metric(&text, r#"lockprobe_read_through_latency_seconds_count{target="demo"}"#).unwrap() > 0.0,
                "{text}"
            );
            assert!(
                metric(&text, r#"lockprobe_last_success_timestamp_seconds{target="demo"}"#).unwrap() > 1.7e9,
                "{text}"
            );
            assert!(!text.contains("lockprobe_enforcement_violations_total{"), "{text}");
            let status: serde_json::Value = rt.block_on(async {
                reqwest::get(url.replace("/metrics", "/api/v1/status")).await.unwrap().json().await.unwrap()
            });
            assert_eq!(status["ready"], true);
            assert_eq!(status["targets"][0]["lastCycles"][0]["result"], "passed", "{status}");
            assert_eq!(
                status["targets"][0]["percentiles"]["lockPhaseDurationSeconds"]["write"]["count"], 1,
                "{status}"
            );
        }
    }
    let status = child.wait().unwrap();
    let out = lines.join("\n");
    assert!(checked_metrics, "no cycle passed:\n{out}");
    assert_eq!(status.code(), Some(0), "{out}");
    assert_eq!(out.matches("[demo] cycle: passed").count(), 2, "{out}");
    assert!(out.contains("lockprobe demo: 2 cycle(s), 0 not passed"), "{out}");
    assert!(!out.contains("FAIL"), "{out}");
    // A line at once, before anything starts; a summary after each cycle.
    assert!(lines[0].starts_with("lockprobe demo: starting"), "{out}");
    assert!(lines[0].contains("first cycle at"), "{out}");
    let summaries: Vec<&String> = lines.iter().filter(|l| l.starts_with("[demo] summary: held preLock")).collect();
    assert_eq!(summaries.len(), 2, "{out}");
    for s in summaries {
        assert!(s.contains("hardDelete") && s.contains("write"), "{s}");
        assert!(s.contains("read-through store p50") && s.contains("/ p99") && s.contains("(measured p50"), "{s}");
        assert!(s.contains("convergence #0") && s.contains("#1"), "{s}");
    }
    // The negative checks run side by side, but each one's lines come as one block.
    let check_of = |l: &str| l.split("negative/").nth(1).and_then(|r| r.split([']', ':']).next()).map(str::to_owned);
    let blocks: Vec<String> = lines.iter().filter_map(|l| check_of(l)).collect();
    let mut seen_blocks = 0;
    for (i, c) in blocks.iter().enumerate() {
        if i == 0 || blocks[i - 1] != *c {
            seen_blocks += 1;
        }
    }
    assert_eq!(seen_blocks, 2 * 7, "each of the 7 negative checks prints one block per cycle:\n{out}");
}

#[test]
fn a_demo_stopped_mid_cycle_counts_that_cycle_as_interrupted_not_as_failed() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
        .args(["demo", "--schedule", "*/2 * * * * *"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let lines: Vec<String> = BufReader::new(child.stdout.take().unwrap()).lines().map_while(Result::ok).fold(
        Vec::new(),
        |mut lines, line| {
            // SIGINT once the first cycle has begun its walk (seeding its items).
            if line.starts_with("[demo] cycle: seed:")
                && !lines.iter().any(|l: &String| l.starts_with("[demo] cycle: seed:"))
            {
                let _ = Command::new("kill").args(["-INT", &child.id().to_string()]).status();
            }
            lines.push(line);
            lines
        },
    );
    let status = child.wait().unwrap();
    let out = lines.join("\n");
    let last = lines.last().map(String::as_str).unwrap_or_default();
    assert_eq!(
        last, "lockprobe demo: 0 cycle(s), 0 not passed, 1 interrupted by the stop (neither passed nor failed)",
        "{out}"
    );
    // Nothing was decided: not a success.
    assert_eq!(status.code(), Some(1), "{out}");
}
