//! What the status API shows: per target, the last cycles and schedule health, rendered in
//! the JSON shape agreed with the status page (`status-shape.md`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};

use super::report::{CycleReport, CycleResult};
use super::metrics::Metrics;

/// How many cycles per target the status keeps.
pub const LAST_CYCLES: usize = 20;

#[derive(Debug, Default)]
struct TargetStatus {
    instances: Vec<String>,
    expected_convergence: Option<f64>,
    declared_convergence: Option<f64>,
    observed_convergence: Option<f64>,
    last_success: Option<DateTime<Utc>>,
    missed: u64,
    cycles: VecDeque<CycleReport>,
}

/// Shared status of every target, updated by the scheduler, read by the HTTP server.
#[derive(Debug, Default)]
pub struct ProbeStatus {
    targets: Mutex<BTreeMap<String, TargetStatus>>,
    config_loaded: AtomicBool,
    scheduler_running: AtomicBool,
}

fn ts(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

impl ProbeStatus {
    /// An empty status (not ready).
    pub fn new() -> Self {
        Self::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut BTreeMap<String, TargetStatus>) -> R) -> R {
        f(&mut self.targets.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Adds a target before its first cycle.
    pub fn add_target(&self, name: &str, instances: &[String], expected_convergence: Option<f64>) {
        self.with(|t| {
            let e = t.entry(name.to_string()).or_default();
            e.instances = instances.to_vec();
            e.expected_convergence = expected_convergence;
        });
    }

    /// Marks the configuration as loaded (half of readiness).
    pub fn set_config_loaded(&self, v: bool) {
        self.config_loaded.store(v, Ordering::SeqCst);
    }

    /// Marks the scheduler as running (the other half of readiness).
    pub fn set_scheduler_running(&self, v: bool) {
        self.scheduler_running.store(v, Ordering::SeqCst);
    }

    /// Config loaded and scheduler running.
    pub fn ready(&self) -> bool {
        self.config_loaded.load(Ordering::SeqCst) && self.scheduler_running.load(Ordering::SeqCst)
    }

    /// Counts missed schedules of `target`.
    pub fn add_missed(&self, target: &str, n: u64) {
        self.with(|t| t.entry(target.to_string()).or_default().missed += n);
    }

    /// Missed schedules of `target` so far.
    pub fn missed(&self, target: &str) -> u64 {
        self.with(|t| t.get(target).map_or(0, |s| s.missed))
    }

    /// Records a finished cycle.
    pub fn record_cycle(&self, r: &CycleReport) {
        self.with(|t| {
            let s = t.entry(r.target.clone()).or_default();
            if r.result == CycleResult::Passed {
                s.last_success = Some(r.finished_at);
            }
            if r.declared_convergence_seconds.is_some() {
                s.declared_convergence = r.declared_convergence_seconds;
            }
            if let Some(o) = r.max_observed_convergence() {
                s.observed_convergence = Some(o);
            }
            if r.expected_convergence_seconds.is_some() {
                s.expected_convergence = r.expected_convergence_seconds;
            }
            s.cycles.push_front(r.clone());
            s.cycles.truncate(LAST_CYCLES);
        });
    }

    /// Cycles recorded for `target`, newest first.
    pub fn cycles(&self, target: &str) -> Vec<CycleReport> {
        self.with(|t| {
            t.get(target)
                .map(|s| s.cycles.iter().cloned().collect())
                .unwrap_or_default()
        })
    }

    /// The `GET /api/v1/status` document.
    pub fn to_json(&self, metrics: &Metrics) -> Value {
        let targets: Vec<Value> = self.with(|t| {
            t.iter()
                .map(|(name, s)| {
                    json!({
                        "name": name,
                        "instances": s.instances,
                        "lastSuccessAt": s.last_success.map(ts),
                        "missedSchedules": s.missed,
                        "convergence": {
                            "declaredSeconds": s.declared_convergence,
                            "expectedSeconds": s.expected_convergence,
                            "observedSeconds": s.observed_convergence,
                        },
                        "percentiles": metrics.percentiles(name),
                        "lastCycles": s.cycles.iter().map(cycle_json).collect::<Vec<_>>(),
                    })
                })
                .collect()
        });
        json!({
            "generatedAt": ts(Utc::now()),
            "ready": self.ready(),
            "targets": targets,
        })
    }
}

fn cycle_json(r: &CycleReport) -> Value {
    json!({
        "startedAt": ts(r.started_at),
        "finishedAt": ts(r.finished_at),
        "result": r.result.as_str(),
        "resource": r.resource,
        "assertions": r.assertions.iter().map(|a| json!({
            "name": a.name(),
            "phase": a.phase,
            "op": a.op,
            "instance": a.instance,
            "expected": a.expected,
            "observed": a.observed,
            "passed": a.passed,
            "durationSeconds": a.duration.as_secs_f64(),
            "detail": a.detail,
        })).collect::<Vec<_>>(),
        "failedAssertions": r.failed_assertions(),
        "notes": r.notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::report::Assertion;
    use crate::probe::vocabulary::{Op, Outcome, Phase};
    use std::time::Duration;

    fn report(result: CycleResult) -> CycleReport {
        CycleReport {
            target: "demo".into(),
            resource: "probe-0003".into(),
            started_at: Utc::now(),
            finished_at: Utc::now(),
            result,
            error: None,
            assertions: vec![Assertion {
                check: "cycle".into(),
                phase: Phase::HardDelete,
                op: Op::Delete,
                instance: Some("http://127.0.0.1:8080".into()),
                expected: Outcome::Tombstone,
                observed: Outcome::Tombstone,
                passed: true,
                at: Utc::now(),
                duration: Duration::from_millis(4),
                detail: None,
            }],
            phase_durations: vec![(Phase::PreLock, 3.1)],
            read_through_seconds: vec![],
            declared_convergence_seconds: Some(3.0),
            expected_convergence_seconds: Some(3.0),
            observed_convergence: vec![],
            notes: Vec::new(),
        }
    }

    #[test]
    fn shape_matches_the_agreed_document() {
        let m = Metrics::new().unwrap();
        let s = ProbeStatus::new();
        s.add_target("demo", &["http://127.0.0.1:8080".into()], Some(3.0));
        assert!(!s.ready());
        s.set_config_loaded(true);
        s.set_scheduler_running(true);
        let r = report(CycleResult::Passed);
        m.record_cycle(&r);
        s.record_cycle(&r);
        s.add_missed("demo", 2);
        let j = s.to_json(&m);
        assert_eq!(j["ready"], true);
        let t = &j["targets"][0];
        assert_eq!(t["name"], "demo");
        assert_eq!(t["missedSchedules"], 2);
        assert!(t["lastSuccessAt"].is_string());
        assert_eq!(t["convergence"]["declaredSeconds"], 3.0);
        assert!(t["convergence"]["observedSeconds"].is_null());
        assert_eq!(
            t["percentiles"]["lockPhaseDurationSeconds"]["preLock"]["count"],
            1
        );
        let c = &t["lastCycles"][0];
        assert_eq!(c["result"], "passed");
        assert_eq!(c["resource"], "probe-0003");
        assert_eq!(c["failedAssertions"], 0);
        assert_eq!(c["assertions"][0]["name"], "hardDelete/delete");
        assert_eq!(c["assertions"][0]["durationSeconds"], 0.004);
        assert!(c["assertions"][0]["detail"].is_null());
    }

    #[test]
    fn keeps_at_most_twenty_cycles_newest_first() {
        let s = ProbeStatus::new();
        for i in 0..25 {
            let mut r = report(if i == 24 {
                CycleResult::Failed
            } else {
                CycleResult::Passed
            });
            r.resource = format!("probe-{i}");
            s.record_cycle(&r);
        }
        let c = s.cycles("demo");
        assert_eq!(c.len(), LAST_CYCLES);
        assert_eq!(c[0].resource, "probe-24");
    }
}
