//! The probe and the monitor know each other: `lockprobe demo --no-fleet` runs both over
//! one store, so every migration the monitor sees is the probe's (owner `lockprobe/demo`).
//! They must land under `source="probe"`, the lease-lapse check's expired lock included,
//! and the fleet's series (what the fleet alerts read) must stay at zero: no orphan, no
//! lapse, no anomaly. With its simulated fleet (the default), the demo's monitor shows
//! each anomaly kind the fleet makes, and the probe's locks still apart.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[test]
fn the_probes_locks_are_reported_apart_and_its_lapse_is_no_fleet_anomaly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
        .args(["demo", "--cycles", "3", "--schedule", "*/2 * * * * *", "--no-fleet"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut url = None;
    let mut lines = Vec::new();
    let mut seen_while_running = None;
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        if let Some(u) = line.trim().strip_prefix("probe metrics:") {
            url = Some(u.trim().to_string());
        }
        let first_cycle = line.contains("[demo] cycle: passed") && seen_while_running.is_none();
        lines.push(line);
        if !first_cycle {
            continue;
        }
        let url = url.clone().expect("the demo prints its metrics URL first");
        // The lapse check's write lease ends during the cycle; the monitor's sweep (1 s,
        // grace 1 s) finds it shortly after.
        seen_while_running = Some(rt.block_on(async {
            // The last scrape and status read while the demo still answered.
            let mut last = (String::new(), serde_json::Value::Null);
            for _ in 0..100 {
                let Ok(resp) = reqwest::get(&url).await else { break };
                let text = resp.text().await.unwrap();
                let Ok(resp) = reqwest::get(url.replace("/metrics", "/api/v1/monitor")).await else { break };
                let monitor: serde_json::Value = resp.json().await.unwrap();
                let lapsed = metric(&text, r#"lockprobe_monitor_migrations_total{outcome="lapsed",source="probe"}"#);
                last = (text, monitor);
                if lapsed >= Some(1.0) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            last
        }));
    }
    let status = child.wait().unwrap();
    let out = lines.join("\n");
    let err = stderr.join().unwrap();
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    let (text, monitor) = seen_while_running.expect("no cycle passed");

    // The probe's locks, apart: its swaps and the lapse its check leaves by design.
    let probe = |s: &str| metric(&text, s).unwrap_or_else(|| panic!("no {s} in\n{text}"));
    assert!(probe(r#"lockprobe_monitor_migrations_total{outcome="swapped",source="probe"}"#) >= 1.0, "{text}");
    assert!(probe(r#"lockprobe_monitor_migrations_total{outcome="lapsed",source="probe"}"#) >= 1.0, "{text}");
    assert!(monitor["probe"]["migrations"]["lapsed"].as_u64() >= Some(1), "{monitor}");

    // Nothing of it reaches the fleet's series, which the fleet alerts read.
    for series in [
        r#"lockprobe_monitor_orphaned_locks{source="fleet"}"#,
        r#"lockprobe_monitor_migrations_total{outcome="lapsed",source="fleet"}"#,
        r#"lockprobe_monitor_migrations_total{outcome="swapped",source="fleet"}"#,
        r#"lockprobe_monitor_in_flight_migrations{source="fleet"}"#,
        r#"lockprobe_monitor_early_escalations_total{source="fleet"}"#,
        r#"lockprobe_monitor_partial_cutovers_total{source="fleet"}"#,
    ] {
        assert_eq!(metric(&text, series), Some(0.0), "{series} in\n{text}");
    }
    assert_eq!(monitor["orphanedLocks"], 0, "{monitor}");
    assert_eq!(monitor["migrations"]["lapsed"], 0, "{monitor}");
    assert_eq!(monitor["recentAnomalies"], serde_json::json!([]), "the expected lapse is no anomaly: {monitor}");
    assert!(!err.contains("orphaned lock"), "no orphan warning for the probe's lock:\n{err}");

    // The demo's closing summary says the same.
    assert!(out.contains("early escalations 0, partial cutovers 0, orphaned locks 0"), "{out}");
    assert!(out.contains("0 swapped, 0 released, 0 force-released, 0 lapsed;"), "{out}");
    assert!(out.contains("monitor, the probe's own locks"), "{out}");
}

/// The default demo runs a simulated fleet beside the probe: the monitor sees in-flight
/// and swapped migrations of its own, the one orphan and the one early escalation it
/// makes, and keeps the probe's locks apart from them.
#[test]
fn the_demos_fleet_shows_what_the_monitor_is_for() {
    let out = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
        .args(["demo", "--cycles", "2", "--schedule", "*/5 * * * * *"])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let fleet =
        stdout.lines().find(|l| l.starts_with("monitor: ")).unwrap_or_else(|| panic!("no monitor line: {stdout}"));
    // "monitor: N swapped, N released, N force-released, N lapsed; early escalations N,
    // partial cutovers N, orphaned locks N"
    let count = |after: &str| -> u64 {
        let rest = &fleet[fleet.find(after).unwrap_or_else(|| panic!("no {after:?} in {fleet}")) + after.len()..];
        rest.trim_start().split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    assert_eq!(count("early escalations"), 1, "{fleet}");
    assert_eq!(count("orphaned locks"), 1, "{fleet}");
    assert_eq!(count("partial cutovers"), 0, "{fleet}");
    let swapped: u64 = fleet["monitor: ".len()..].split(' ').next().unwrap().parse().unwrap();
    assert!(swapped >= 2, "the fleet's migrations get through: {fleet}");
    let probe = stdout.lines().find(|l| l.starts_with("monitor, the probe's own locks")).expect("the probe's line");
    assert!(probe.contains("swapped"), "{probe}");
    // The probe's force-release check ends one lock a cycle by two principals' approval,
    // which the monitor tells from a release (the last cycle's may not be read yet).
    let force_released = |line: &str| -> u64 {
        line.split(" force-released")
            .next()
            .and_then(|head| head.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no force-released count: {line}"))
    };
    assert!(force_released(probe) >= 1, "{probe}");
    assert_eq!(force_released(fleet), 0, "the fleet force-releases nothing: {fleet}");
}
