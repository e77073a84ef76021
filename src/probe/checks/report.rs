//! Results of a probe cycle: assertions, the cycle report, and their JUnit XML and JSON
//! renderings for `validate`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::vocabulary::{Op, Outcome, Phase};

/// One check: what was done, what was expected, what was seen.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Assertion {
    /// Which part of the cycle: `cycle` or `negative/<name>`.
    pub check: String,
    /// Lock phase in force (`seed`, `preLock`, `hardDelete`, `write`, `swap`, `cleanup`).
    pub phase: Phase,
    /// Operation (`read`, `write`, `delete`, `escalate`, `converge`, ...).
    pub op: Op,
    /// Instance base URL, when the check was made on one instance.
    pub instance: Option<String>,
    /// Expected outcome (a small, bounded vocabulary; used as a metrics label).
    pub expected: Outcome,
    /// Observed outcome.
    pub observed: Outcome,
    /// Whether observed matched expected (false too for an inconclusive assertion,
    /// which neither passed nor failed).
    pub passed: bool,
    /// Why the operation could not be held to the lock it was meant for (its decision
    /// window did not fall certainly inside the lock, or certainly after it): such an
    /// assertion is neither a pass nor a failure (`docs/probe.md`, "Decision windows").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inconclusive: Option<String>,
    /// When the check finished.
    pub at: DateTime<Utc>,
    /// How long the operation took.
    #[serde(serialize_with = "secs")]
    pub duration: Duration,
    /// Free-form context (timings, values); never a token.
    pub detail: Option<String>,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn pairs_as_map<S: serde::Serializer>(pairs: &[(Phase, f64)], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(Some(pairs.len()))?;
    for (k, v) in pairs {
        m.serialize_entry(k.as_str(), v)?;
    }
    m.end()
}

impl Assertion {
    /// Whether the assertion failed: observed differs from expected and the operation
    /// was decided.
    pub fn failed(&self) -> bool {
        !self.passed && self.inconclusive.is_none()
    }

    /// `passed`, `failed` or `inconclusive`: in reports and as a metrics label.
    pub fn verdict(&self) -> &'static str {
        match (self.passed, &self.inconclusive) {
            (_, Some(_)) => "inconclusive",
            (true, None) => "passed",
            (false, None) => "failed",
        }
    }

    /// `phase/op`, the assertion's short name.
    pub fn name(&self) -> String {
        format!("{}/{}", self.phase, self.op)
    }

    /// A wrong allow / block / tombstone decision on a user operation. A 423 without
    /// `Retry-After` is still a block: it fails its assertion either way, but it is an
    /// enforcement violation only where the phase demanded allow or tombstone.
    pub fn is_enforcement_violation(&self) -> bool {
        self.failed()
            && self.op.is_user_op()
            && match (self.expected.decision(), self.observed.decision()) {
                (Some(expected), Some(observed)) => expected != observed,
                _ => false,
            }
    }

    /// One line for people: `PASS preLock/write @ http://.. expected allow, observed allow (3ms)`.
    pub fn line(&self) -> String {
        let verdict = match self.verdict() {
            "passed" => "PASS",
            "failed" => "FAIL",
            _ => "INCONCLUSIVE",
        };
        let mut s = format!("{verdict} [{}] {}", self.check, self.name());
        if let Some(i) = &self.instance {
            s.push_str(&format!(" @ {i}"));
        }
        s.push_str(&format!(": expected {}, observed {} ({:.0?})", self.expected, self.observed, self.duration));
        if let Some(d) = &self.detail {
            s.push_str(&format!(" - {d}"));
        }
        if let Some(why) = &self.inconclusive {
            s.push_str(&format!(" - not judged: {why}"));
        }
        s
    }
}

/// How many of one check's operations were held to a lock and how many were
/// inconclusive (their decision window did not allow it), with the first reasons.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckDecisions {
    /// The check (`eager/renewal`, `negative/escalate-early`, ...).
    pub check: String,
    /// Operations judged against the lock.
    pub held: u32,
    /// Operations that could not be.
    pub inconclusive: u32,
    /// Why, for the first few inconclusive operations.
    pub reasons: Vec<String>,
    /// Operations that could not be held to the lock and were made again in a fresh
    /// attempt (not in the share: the attempt after them decided in their place).
    #[serde(default)]
    pub retried: u32,
}

impl CheckDecisions {
    /// The inconclusive operations' share of all the operations the check meant to hold
    /// to a lock (zero when there were none).
    pub fn inconclusive_share(&self) -> f64 {
        let all = self.held + self.inconclusive;
        if all == 0 {
            0.0
        } else {
            f64::from(self.inconclusive) / f64::from(all)
        }
    }
}

/// How a cycle ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CycleResult {
    /// Every assertion passed.
    Passed,
    /// At least one assertion failed.
    Failed,
    /// The cycle could not complete (unreachable target, timeout, cancellation).
    Error,
}

impl CycleResult {
    /// Lowercase label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Passed => "passed",
            Self::Failed => "failed",
            Self::Error => "error",
        }
    }
}

/// Convergence seen on one instance.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceConvergence {
    /// Instance base URL.
    pub instance: String,
    /// Seconds from the pre-lock until the route view showed it; `None` if it never did.
    pub observed_seconds: Option<f64>,
    /// How long the probe watched (declared delay + buffer): the least an instance that
    /// never showed the lock took.
    pub bound_seconds: f64,
    /// The measurement tolerance on top of the declared delay: a read sent later than
    /// declared + this after the pre-lock's answer must show the lock (`docs/probe.md`).
    pub tolerance_seconds: f64,
}

/// The versions one instance named in its answers (contract 1.2; both absent from a
/// service of contract 1.1 or earlier).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceVersions {
    /// The instance's origin, `http://host:port`.
    pub instance: String,
    /// The contract version it declared, e.g. `1.2`.
    pub contract: Option<String>,
    /// Its routing library's version.
    pub library: Option<String>,
}

/// Everything one cycle found.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CycleReport {
    /// Target name.
    pub target: String,
    /// Main resource of the cycle.
    pub resource: String,
    /// Start time.
    pub started_at: DateTime<Utc>,
    /// End time.
    pub finished_at: DateTime<Utc>,
    /// Outcome.
    pub result: CycleResult,
    /// Why the cycle errored, if it did.
    pub error: Option<String>,
    /// Every assertion, in order.
    pub assertions: Vec<Assertion>,
    /// Time spent in each lock phase of the main cycle, e.g. `(PreLock, 3.1)`; in JSON
    /// an object `{"preLock": 3.1, ...}`.
    #[serde(serialize_with = "pairs_as_map")]
    pub phase_durations: Vec<(Phase, f64)>,
    /// Store time the service reported in `Server-Timing` for the write phase's reads
    /// (which must all read through), seconds.
    pub read_through_seconds: Vec<f64>,
    /// The same reads as the probe measured them (request to answer), seconds.
    pub read_through_client_seconds: Vec<f64>,
    /// Convergence delay the service declared with the pre-lock.
    pub declared_convergence_seconds: Option<f64>,
    /// Convergence delay the operator expects.
    pub expected_convergence_seconds: Option<f64>,
    /// Per instance observed convergence.
    pub observed_convergence: Vec<InstanceConvergence>,
    /// What a reader must know that is not an assertion (for example, that the service
    /// ignores idempotency keys, so the probe fell back to contract 1.0 behaviour).
    pub notes: Vec<String>,
    /// Store-region changes the instances reported during the cycle (a failover of the
    /// service's store), as `http://host:port: westeurope -> northeurope`.
    pub store_region_changes: Vec<String>,
    /// The versions each instance named in its last answer of the cycle (contract 1.2's
    /// `Lockprobe-Contract` and `Lockprobe-Library`), by instance.
    pub declared_versions: Vec<InstanceVersions>,
    /// When the main walk's steps happened, for the status page's timeline.
    pub walk: WalkTimeline,
    /// Per check that held operations to a lock: how many were held and how many were
    /// inconclusive.
    pub decisions: Vec<CheckDecisions>,
}

/// When each step of the main walk began, in seconds from the cycle's start by the
/// probe's clock (the status page draws the cycle from these).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WalkTimeline {
    /// The steps in the order they began: `seed` when the walk started, `preLock` when
    /// the pre-lock was answered, `hardDelete` and `write` when their escalations were
    /// answered, `swap` when the swap was, `cleanup` when a lock the walk still held was
    /// released.
    pub steps: Vec<StepStart>,
    /// When the main walk ended (the negative checks run after it).
    pub ended_seconds: Option<f64>,
    /// How long the probe waited after the pre-lock's answer before escalating: the
    /// declared delay (or a later `effectiveAt`) plus the buffer.
    pub escalation_wait_seconds: Option<f64>,
}

/// A step of the main walk and when it began.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepStart {
    /// The step.
    pub phase: Phase,
    /// Seconds from the cycle's start.
    pub at_seconds: f64,
}

impl CycleReport {
    /// Number of failed assertions.
    pub fn failed_assertions(&self) -> usize {
        self.assertions.iter().filter(|a| a.failed()).count()
    }

    /// Number of inconclusive assertions.
    pub fn inconclusive_assertions(&self) -> usize {
        self.assertions.iter().filter(|a| a.inconclusive.is_some()).count()
    }

    /// Number of enforcement violations.
    pub fn enforcement_violations(&self) -> usize {
        self.assertions.iter().filter(|a| a.is_enforcement_violation()).count()
    }

    /// Slowest instance's observed convergence (what alerts compare with the declared
    /// value). An instance that never showed the lock counts with the whole bound it was
    /// watched for: leaving it out would report the fast instances and hide the violation.
    pub fn max_observed_convergence(&self) -> Option<f64> {
        self.observed_convergence.iter().map(|c| c.observed_seconds.unwrap_or(c.bound_seconds)).reduce(f64::max)
    }

    /// The JSON report written by `validate --json`.
    pub fn to_json(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Some(list) = v.get_mut("assertions").and_then(Value::as_array_mut) {
            for (json, a) in list.iter_mut().zip(&self.assertions) {
                json["verdict"] = json!(a.verdict());
            }
        }
        v["failedAssertions"] = json!(self.failed_assertions());
        v["inconclusiveAssertions"] = json!(self.inconclusive_assertions());
        v["enforcementViolations"] = json!(self.enforcement_violations());
        v
    }
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Assertions and reports for the unit tests of the outputs that render them.

    use super::*;

    pub(crate) fn assertion(check: &str, op: &str, expected: &str, observed: &str) -> Assertion {
        let (expected, observed) = (Outcome::from_label(expected).unwrap(), Outcome::from_label(observed).unwrap());
        Assertion {
            check: check.into(),
            phase: Phase::Write,
            op: Op::from_label(op).unwrap(),
            instance: Some("http://127.0.0.1:1".into()),
            passed: expected == observed,
            expected,
            observed,
            at: Utc::now(),
            duration: Duration::from_millis(3),
            detail: None,
            inconclusive: None,
        }
    }

    pub(crate) fn report(assertions: Vec<Assertion>) -> CycleReport {
        let failed = assertions.iter().any(|a| !a.passed);
        CycleReport {
            target: "demo".into(),
            resource: "probe-0001".into(),
            started_at: Utc::now(),
            finished_at: Utc::now(),
            result: if failed { CycleResult::Failed } else { CycleResult::Passed },
            error: None,
            assertions,
            phase_durations: vec![(Phase::PreLock, 2.0)],
            read_through_seconds: vec![],
            read_through_client_seconds: vec![],
            declared_convergence_seconds: Some(1.5),
            expected_convergence_seconds: None,
            observed_convergence: vec![],
            notes: Vec::new(),
            store_region_changes: Vec::new(),
            declared_versions: Vec::new(),
            walk: WalkTimeline::default(),
            decisions: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{assertion, report};

    #[test]
    fn enforcement_violation_only_for_wrong_allow_block_tombstone() {
        assert!(assertion("cycle", "write", "block", "allow").is_enforcement_violation());
        assert!(assertion("cycle", "delete", "tombstone", "allow").is_enforcement_violation());
        assert!(!assertion("cycle", "write", "block", "block").is_enforcement_violation());
        assert!(!assertion("cycle", "write", "block", "500 internal").is_enforcement_violation());
        // A block without Retry-After is a block: wrong where allow was due, and only a
        // missing header (a failed assertion, not a violation) where block was due.
        assert!(assertion("cycle", "write", "allow", "423 without Retry-After").is_enforcement_violation());
        assert!(!assertion("cycle", "write", "block", "423 without Retry-After").is_enforcement_violation());
        assert!(!assertion("cycle", "escalate", "200", "409 invalid-transition").is_enforcement_violation());
    }

    #[test]
    fn json_counts_failures_and_violations() {
        let r = report(vec![
            assertion("cycle", "write", "block", "allow"),
            assertion("cycle", "converge", "lock-visible", "not-visible"),
        ]);
        let j = r.to_json();
        assert_eq!(j["failedAssertions"], 2);
        assert_eq!(j["enforcementViolations"], 1);
        assert_eq!(j["result"], "failed");
        assert_eq!(j["assertions"][0]["expected"], "block");
        assert_eq!(j["phaseDurations"]["preLock"], 2.0);
    }
}
