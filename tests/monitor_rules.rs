//! The monitor's alert rules are valid and behave as their promtool unit tests say.
//! Needs `promtool` (Debian package `prometheus`) on PATH.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn promtool(subcommand: &[&str], file: &Path) {
    let out = Command::new("promtool")
        .args(subcommand)
        .arg(file)
        .output().unwrap_or_else(|e| {
        panic!("promtool is required for this test and could not be run ({e}); install it with `apt-get install -y prometheus`")
    });
    assert!(
        out.status.success(),
        "promtool {} {} failed:\n{}\n{}",
        subcommand.join(" "),
        file.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn monitor_rules_pass_promtool_check() {
    promtool(&["check", "rules"], &root().join("alerts/lockprobe-monitor.rules.yml"));
}

#[test]
fn monitor_rules_pass_their_unit_tests() {
    promtool(&["test", "rules"], &root().join("alerts/tests/monitor_test.yml"));
}

/// The monitor's exposition, fresh (every labelled series pre-registered at zero).
fn exposition() -> String {
    use std::sync::Arc;

    use lockprobe::clock::{Clock, ManualClock};
    use lockprobe::monitor::{Monitor, MonitorConfig};
    use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
    use lockprobe::store::LocationStore;
    use prometheus::Encoder;

    let clock: Arc<dyn Clock> = Arc::new(ManualClock::at_epoch());
    let store: Arc<dyn LocationStore> = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    let registry = prometheus::Registry::new();
    let _monitor = Monitor::new(store, clock, MonitorConfig::default(), &registry).unwrap();
    let mut buf = Vec::new();
    prometheus::TextEncoder::new().encode(&registry.gather(), &mut buf).unwrap();
    String::from_utf8(buf).unwrap()
}

#[test]
fn monitor_metrics_pass_promtool_lint() {
    use std::io::Write;
    use std::process::Stdio;

    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("promtool is required ({e}); install it with `apt-get install -y prometheus`"));
    child.stdin.take().unwrap().write_all(exposition().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics found problems:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The monitor's phase histograms have the probe's buckets (one table, in
/// `exposition`), so the two views of a write lock compare bucket for bucket.
#[test]
fn monitor_phase_buckets_are_the_probes() {
    let text = exposition();
    let les: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("lockprobe_monitor_phase_duration_seconds_bucket{") && l.contains("phase=\"write\""))
        .filter(|l| l.contains("source=\"fleet\""))
        .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next()?.parse().ok())
        .filter(|le: &f64| le.is_finite())
        .collect();
    assert_eq!(les, lockprobe::exposition::PHASE_BUCKETS, "{text}");
}

#[test]
fn every_metric_the_rules_and_dashboard_use_is_exported() {
    let exported = exposition();
    for file in ["alerts/lockprobe-monitor.rules.yml", "dashboards/lockprobe-monitor.json"] {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        if file.ends_with(".json") {
            let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is valid JSON");
            assert!(dashboard["panels"].as_array().is_some_and(|p| p.len() > 1), "the dashboard has panels");
        }
        let mut rest = text.as_str();
        let mut seen = 0;
        while let Some(at) = rest.find("lockprobe_monitor_") {
            let name: String = rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            rest = &rest[at + name.len()..];
            if name.ends_with('_') {
                continue; // the prefix itself, in a comment
            }
            let base = name.trim_end_matches("_bucket").trim_end_matches("_count").trim_end_matches("_sum");
            assert!(
                exported.contains(&format!("# TYPE {base} ")),
                "{file} uses {name}, which the monitor does not export"
            );
            seen += 1;
        }
        assert!(seen > 0, "{file} uses no monitor metric");
    }
}
