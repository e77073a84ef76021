//! What the status API shows: per target, the last cycles and schedule health. The
//! document `GET /api/v1/status` serves is [`StatusDocument`] (camelCase JSON, times in
//! whole seconds); the status page renders the same type.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::metrics::{Metrics, PercentilesDocument};
use crate::probe::checks::report::{CheckDecisions, CycleReport, CycleResult, WalkTimeline};
use crate::probe::checks::vocabulary::{Op, Outcome, Phase};

/// The body of `GET /api/v1/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusDocument {
    /// When the document was made; the status page counts "ago" from it.
    #[serde(with = "seconds")]
    pub generated_at: DateTime<Utc>,
    /// Config loaded, scheduler running and the state file taking writes.
    pub ready: bool,
    /// Every target, by name.
    pub targets: Vec<TargetDocument>,
}

/// One target in the status document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetDocument {
    /// Target name.
    pub name: String,
    /// Base URL of every instance.
    pub instances: Vec<String>,
    /// End of the last passed cycle.
    #[serde(with = "seconds::option")]
    pub last_success_at: Option<DateTime<Utc>>,
    /// The schedule, its last and next firing (absent before the scheduler first looked).
    #[serde(default)]
    pub schedule: Option<ScheduleDocument>,
    /// Scheduled cycles that did not start.
    pub missed_schedules: u64,
    /// Declared, expected and observed convergence.
    pub convergence: ConvergenceDocument,
    /// Exact percentiles of the last day.
    pub percentiles: PercentilesDocument,
    /// The last cycles, newest first.
    pub last_cycles: Vec<CycleDocument>,
}

/// A target's schedule, as the scheduler last saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleDocument {
    /// The cron expression, six fields (seconds first).
    pub expression: String,
    /// The interval that ends at the next firing.
    pub interval_seconds: Option<f64>,
    /// The last firing acted on (a cycle started or a firing missed).
    #[serde(with = "seconds::option")]
    pub last_firing_at: Option<DateTime<Utc>>,
    /// The next firing, jitter not included; absent when the schedule has no more.
    #[serde(with = "seconds::option")]
    pub next_firing_at: Option<DateTime<Utc>>,
}

/// Convergence of one target, in seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConvergenceDocument {
    /// What the service declared with the last pre-lock.
    pub declared_seconds: Option<f64>,
    /// What the operator configured.
    pub expected_seconds: Option<f64>,
    /// The slowest instance of the last cycle.
    pub observed_seconds: Option<f64>,
}

/// One cycle in the status document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CycleDocument {
    /// Start.
    #[serde(with = "seconds")]
    pub started_at: DateTime<Utc>,
    /// End.
    #[serde(with = "seconds")]
    pub finished_at: DateTime<Utc>,
    /// How it ended.
    pub result: CycleResult,
    /// Why it ended in error (target unreachable, cancelled, a pre-lock the state file
    /// could not journal); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Main resource.
    pub resource: String,
    /// Every assertion, in order.
    pub assertions: Vec<AssertionDocument>,
    /// How many assertions failed.
    pub failed_assertions: usize,
    /// How many assertions were inconclusive (neither passed nor failed).
    #[serde(default)]
    pub inconclusive_assertions: usize,
    /// Per check that held operations to a lock: how many were held and how many were
    /// inconclusive, with the first reasons.
    #[serde(default)]
    pub decisions: Vec<CheckDecisions>,
    /// What a reader must know that is not an assertion.
    pub notes: Vec<String>,
    /// When the main walk's steps happened and what the pre-lock declared, for the
    /// status page's timeline.
    #[serde(default)]
    pub timeline: TimelineDocument,
    /// How long the main walk held each lock phase (by the service's timestamps).
    #[serde(default)]
    pub phase_hold_seconds: PhaseHolds,
    /// The 99th percentile (nearest rank) of the write phase's read-through reads in
    /// this cycle, as the service reported them; `null` when none was made.
    #[serde(default)]
    pub read_through_p99_seconds: Option<f64>,
    /// How many read-through reads that percentile is of.
    #[serde(default)]
    pub read_through_reads: usize,
}

/// One cycle's timeline, in seconds from its start by the probe's clock.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct TimelineDocument {
    /// The cycle's length.
    pub duration_seconds: f64,
    /// The main walk's steps and when it ended.
    #[serde(flatten)]
    pub walk: WalkTimeline,
    /// The convergence delay the service declared with the pre-lock.
    pub declared_seconds: Option<f64>,
    /// When each instance's route view showed the pre-lock.
    pub convergence: Vec<InstanceSeen>,
}

/// When one instance showed the pre-lock, in seconds after the pre-lock's answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct InstanceSeen {
    /// Instance base URL.
    pub instance: String,
    /// After how long it showed the lock; `null` when it did not within the wait.
    pub visible_after_seconds: Option<f64>,
    /// How long the probe watched it.
    pub bound_seconds: f64,
}

/// Seconds each lock phase was held in one cycle (`null` when not reached).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PhaseHolds {
    /// `preLock`.
    pub pre_lock: Option<f64>,
    /// `hardDelete`.
    pub hard_delete: Option<f64>,
    /// `write`.
    pub write: Option<f64>,
}

/// One assertion in the status document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssertionDocument {
    /// `phase/op`.
    pub name: String,
    /// Lock phase in force.
    pub phase: Phase,
    /// Operation.
    pub op: Op,
    /// Instance base URL, when made on one instance.
    pub instance: Option<String>,
    /// Expected outcome.
    pub expected: Outcome,
    /// Observed outcome.
    pub observed: Outcome,
    /// Whether they matched (false for an inconclusive assertion, which neither passed
    /// nor failed).
    pub passed: bool,
    /// Why the operation could not be held to its lock, when it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inconclusive: Option<String>,
    /// How long the operation took.
    pub duration_seconds: f64,
    /// Context; never a token.
    pub detail: Option<String>,
    /// Which part of the cycle: `cycle` (the main walk) or a negative check's name.
    #[serde(default)]
    pub check: String,
    /// When it was made (its end), in seconds from the cycle's start.
    #[serde(default)]
    pub at_seconds: f64,
}

impl AssertionDocument {
    /// Whether it failed (an inconclusive assertion did not).
    pub fn failed(&self) -> bool {
        !self.passed && self.inconclusive.is_none()
    }
}

impl From<&CycleReport> for CycleDocument {
    fn from(r: &CycleReport) -> Self {
        let since_start = |t: DateTime<Utc>| (t - r.started_at).num_microseconds().unwrap_or(0) as f64 / 1e6;
        let held = |p: Phase| r.phase_durations.iter().find(|(q, _)| *q == p).map(|(_, s)| *s);
        Self {
            started_at: r.started_at,
            finished_at: r.finished_at,
            result: r.result,
            error: r.error.clone(),
            resource: r.resource.clone(),
            assertions: r
                .assertions
                .iter()
                .map(|a| AssertionDocument {
                    name: a.name(),
                    phase: a.phase,
                    op: a.op,
                    instance: a.instance.clone(),
                    expected: a.expected.clone(),
                    observed: a.observed.clone(),
                    passed: a.passed,
                    inconclusive: a.inconclusive.clone(),
                    duration_seconds: a.duration.as_secs_f64(),
                    detail: a.detail.clone(),
                    check: a.check.clone(),
                    at_seconds: since_start(a.at),
                })
                .collect(),
            failed_assertions: r.failed_assertions(),
            inconclusive_assertions: r.inconclusive_assertions(),
            decisions: r.decisions.clone(),
            notes: r.notes.clone(),
            timeline: TimelineDocument {
                duration_seconds: since_start(r.finished_at),
                walk: r.walk.clone(),
                declared_seconds: r.declared_convergence_seconds,
                convergence: r
                    .observed_convergence
                    .iter()
                    .map(|c| InstanceSeen {
                        instance: c.instance.clone(),
                        visible_after_seconds: c.observed_seconds,
                        bound_seconds: c.bound_seconds,
                    })
                    .collect(),
            },
            phase_hold_seconds: PhaseHolds {
                pre_lock: held(Phase::PreLock),
                hard_delete: held(Phase::HardDelete),
                write: held(Phase::Write),
            },
            read_through_p99_seconds: nearest_rank(&r.read_through_seconds, 0.99),
            read_through_reads: r.read_through_seconds.len(),
        }
    }
}

/// The `q` quantile of `values` by nearest rank (a recorded value, never interpolated).
fn nearest_rank(values: &[f64], q: f64) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// RFC 3339 times in whole seconds, UTC (`2026-11-29T22:40:00Z`).
mod seconds {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Secs, true))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&text).map(|t| t.to_utc()).map_err(serde::de::Error::custom)
    }

    pub mod option {
        use super::*;

        pub fn serialize<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
            match t {
                Some(t) => super::serialize(t, s),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
            Option::<String>::deserialize(d)?
                .map(|text| DateTime::parse_from_rfc3339(&text).map(|t| t.to_utc()).map_err(serde::de::Error::custom))
                .transpose()
        }
    }
}

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
    schedule: Option<ScheduleDocument>,
}

/// Shared status of every target, updated by the scheduler, read by the HTTP server.
#[derive(Debug, Default)]
pub struct ProbeStatus {
    targets: Mutex<BTreeMap<String, TargetStatus>>,
    config_loaded: AtomicBool,
    scheduler_running: AtomicBool,
    /// Why the state file refuses writes, while it does.
    state_file_failure: Mutex<Option<String>>,
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

    /// Forgets a target that is no longer probed.
    pub fn remove_target(&self, name: &str) {
        self.with(|t| t.remove(name));
    }

    /// Marks the configuration as loaded (half of readiness).
    pub fn set_config_loaded(&self, v: bool) {
        self.config_loaded.store(v, Ordering::SeqCst);
    }

    /// Marks the scheduler as running (the other half of readiness).
    pub fn set_scheduler_running(&self, v: bool) {
        self.scheduler_running.store(v, Ordering::SeqCst);
    }

    /// Records why the state file refuses writes (`None` once it takes them again).
    pub fn set_state_file_failure(&self, failure: Option<String>) {
        *self.state_file_failure.lock().unwrap_or_else(|e| e.into_inner()) = failure;
    }

    /// Config loaded, scheduler running and the state file taking writes.
    pub fn ready(&self) -> bool {
        self.not_ready_because().is_none()
    }

    /// Why the probe is not ready, if it is not: what `/readyz` says.
    pub fn not_ready_because(&self) -> Option<String> {
        if !self.config_loaded.load(Ordering::SeqCst) {
            return Some("configuration not loaded".into());
        }
        if !self.scheduler_running.load(Ordering::SeqCst) {
            return Some("scheduler not running".into());
        }
        self.state_file_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|failure| format!("the state file refuses writes, so no pre-lock is sent: {failure}"))
    }

    /// Records where `target`'s schedule stands (before each wait for a firing).
    pub fn set_schedule(
        &self,
        target: &str,
        expression: &str,
        last: Option<DateTime<Utc>>,
        next: Option<DateTime<Utc>>,
        interval: Option<std::time::Duration>,
    ) {
        self.with(|t| {
            t.entry(target.to_string()).or_default().schedule = Some(ScheduleDocument {
                expression: expression.to_string(),
                interval_seconds: interval.map(|i| i.as_secs_f64()),
                last_firing_at: last,
                next_firing_at: next,
            })
        });
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
        self.with(|t| t.get(target).map(|s| s.cycles.iter().cloned().collect()).unwrap_or_default())
    }

    /// The `GET /api/v1/status` document, as of now.
    pub fn document(&self, metrics: &Metrics) -> StatusDocument {
        let now = Utc::now();
        let targets = self.with(|t| {
            t.iter()
                .map(|(name, s)| TargetDocument {
                    name: name.clone(),
                    instances: s.instances.clone(),
                    last_success_at: s.last_success,
                    schedule: s.schedule.clone(),
                    missed_schedules: s.missed,
                    convergence: ConvergenceDocument {
                        declared_seconds: s.declared_convergence,
                        expected_seconds: s.expected_convergence,
                        observed_seconds: s.observed_convergence,
                    },
                    percentiles: metrics.percentiles(name, now),
                    last_cycles: s.cycles.iter().map(CycleDocument::from).collect(),
                })
                .collect()
        });
        StatusDocument { generated_at: now, ready: self.ready(), targets }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::checks::report::Assertion;
    use crate::probe::checks::vocabulary::{Op, Outcome, Phase};
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
                inconclusive: None,
            }],
            phase_durations: vec![(Phase::PreLock, 3.1)],
            read_through_seconds: vec![],
            read_through_client_seconds: vec![],
            declared_convergence_seconds: Some(3.0),
            expected_convergence_seconds: Some(3.0),
            observed_convergence: vec![],
            notes: Vec::new(),
            store_region_changes: Vec::new(),
            declared_versions: Vec::new(),
            walk: Default::default(),
            decisions: Vec::new(),
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
        let doc = s.document(&m);
        let j = serde_json::to_value(&doc).unwrap();
        let read_back = serde_json::from_value::<StatusDocument>(j.clone()).unwrap();
        assert_eq!(serde_json::to_value(read_back).unwrap(), j, "the document reads back");
        assert_eq!(j["ready"], true);
        let t = &j["targets"][0];
        assert_eq!(t["name"], "demo");
        assert_eq!(t["missedSchedules"], 2);
        assert!(t["lastSuccessAt"].is_string());
        assert_eq!(t["convergence"]["declaredSeconds"], 3.0);
        assert!(t["convergence"]["observedSeconds"].is_null());
        assert_eq!(t["percentiles"]["lockPhaseDurationSeconds"]["preLock"]["count"], 1);
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
            let mut r = report(if i == 24 { CycleResult::Failed } else { CycleResult::Passed });
            r.resource = format!("probe-{i}");
            s.record_cycle(&r);
        }
        let c = s.cycles("demo");
        assert_eq!(c.len(), LAST_CYCLES);
        assert_eq!(c[0].resource, "probe-24");
    }
}
