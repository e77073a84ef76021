//! Results of a probe cycle: assertions, the cycle report, and their JUnit XML and JSON
//! renderings for `validate`.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use quick_xml::events::{BytesDecl, BytesEnd, BytesStart, BytesText, Event};
use quick_xml::Writer;
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

    /// The JUnit XML report: one test suite per check, one test case per assertion, and a
    /// `cycle-error` suite with one erroring test case when the cycle could not complete.
    ///
    /// Names stay the same from run to run so CI keeps each test's history: a test case
    /// is named `phase/op expects <outcome>` and its class is `lockprobe.<target>.<check>`,
    /// followed by `.instance<N>` (the instance's index in `instances`) when it was made
    /// on one instance. URLs appear only in the suites' `instance.<N>` properties and in
    /// failure messages. The counts on the root and on each suite are those of the test
    /// cases below them.
    pub fn to_junit(&self, instances: &[String]) -> String {
        let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
        // Writing into a Vec cannot fail; the results are ignored for that reason only.
        let _ = w.write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)));
        let wall = (self.finished_at - self.started_at).to_std().unwrap_or_default().as_secs_f64();
        let errors = usize::from(self.error.is_some());
        let mut root = BytesStart::new("testsuites");
        root.push_attribute(("name", format!("lockprobe {}", self.target).as_str()));
        root.push_attribute(("tests", (self.assertions.len() + errors).to_string().as_str()));
        root.push_attribute(("failures", self.failed_assertions().to_string().as_str()));
        root.push_attribute(("errors", errors.to_string().as_str()));
        root.push_attribute(("skipped", self.inconclusive_assertions().to_string().as_str()));
        root.push_attribute(("time", format!("{wall:.3}").as_str()));
        let _ = w.write_event(Event::Start(root));
        let mut checks: Vec<&str> = Vec::new();
        for a in &self.assertions {
            if !checks.contains(&a.check.as_str()) {
                checks.push(&a.check);
            }
        }
        for check in checks {
            let cases: Vec<&Assertion> = self.assertions.iter().filter(|a| a.check == check).collect();
            self.junit_suite(&mut w, check, &cases, instances);
        }
        if let Some(err) = &self.error {
            self.junit_error(&mut w, err, instances);
        }
        let _ = w.write_event(Event::End(BytesEnd::new("testsuites")));
        String::from_utf8(w.into_inner()).unwrap_or_default()
    }

    fn junit_suite_start(&self, name: &str, counts: [usize; 4], time: f64) -> BytesStart<'static> {
        let [tests, failures, errors, skipped] = counts;
        let mut suite = BytesStart::new("testsuite");
        suite.push_attribute(("name", name));
        suite.push_attribute(("tests", tests.to_string().as_str()));
        suite.push_attribute(("failures", failures.to_string().as_str()));
        suite.push_attribute(("errors", errors.to_string().as_str()));
        suite.push_attribute(("skipped", skipped.to_string().as_str()));
        suite.push_attribute(("time", format!("{time:.3}").as_str()));
        suite.push_attribute(("timestamp", self.started_at.to_rfc3339_opts(SecondsFormat::Secs, true).as_str()));
        suite
    }

    /// One `<testsuite>`: the assertions of one check; an inconclusive one is a
    /// `<skipped>` case, and the suite's properties say how many of the check's
    /// operations were held to a lock and how many could not be.
    fn junit_suite(&self, w: &mut Writer<Vec<u8>>, check: &str, cases: &[&Assertion], instances: &[String]) {
        let failures = cases.iter().filter(|a| a.failed()).count();
        let skipped = cases.iter().filter(|a| a.inconclusive.is_some()).count();
        let time: f64 = cases.iter().map(|a| a.duration.as_secs_f64()).sum();
        let start = self.junit_suite_start(check, [cases.len(), failures, 0, skipped], time);
        let _ = w.write_event(Event::Start(start));
        let decisions = self.decisions.iter().find(|d| d.check == check);
        junit_properties(w, instances, decisions);
        let classname = format!("lockprobe.{}.{}", self.target, check.replace('/', "."));
        let names = junit_case_names(cases.iter().copied(), |_| classname.clone(), instances);
        for (a, (class, name)) in cases.iter().zip(&names) {
            junit_case(w, a, class, name);
        }
        let _ = w.write_event(Event::End(BytesEnd::new("testsuite")));
    }

    /// The `cycle-error` suite: why the cycle could not complete.
    fn junit_error(&self, w: &mut Writer<Vec<u8>>, err: &str, instances: &[String]) {
        let _ = w.write_event(Event::Start(self.junit_suite_start("cycle-error", [1, 0, 1, 0], 0.0)));
        junit_properties(w, instances, None);
        let mut case = BytesStart::new("testcase");
        case.push_attribute(("name", "cycle expects completed"));
        case.push_attribute(("classname", format!("lockprobe.{}", self.target).as_str()));
        case.push_attribute(("time", "0.000"));
        let _ = w.write_event(Event::Start(case));
        let mut e = BytesStart::new("error");
        e.push_attribute(("message", err));
        e.push_attribute(("type", "cycle-error"));
        let _ = w.write_event(Event::Empty(e));
        let _ = w.write_event(Event::End(BytesEnd::new("testcase")));
        let _ = w.write_event(Event::End(BytesEnd::new("testsuite")));
    }
}

/// The suite's `<properties>`: `instance.<N>` = the URL of instance N; for a check that
/// held operations to a lock, `operations.held` and `operations.inconclusive`, and
/// `inconclusive.<N>` = why, for the first few.
fn junit_properties(w: &mut Writer<Vec<u8>>, instances: &[String], decisions: Option<&CheckDecisions>) {
    let mut properties: Vec<(String, String)> =
        instances.iter().enumerate().map(|(i, url)| (format!("instance.{i}"), url.clone())).collect();
    if let Some(d) = decisions {
        properties.push(("operations.held".into(), d.held.to_string()));
        properties.push(("operations.inconclusive".into(), d.inconclusive.to_string()));
        properties.extend(d.reasons.iter().enumerate().map(|(i, why)| (format!("inconclusive.{i}"), why.clone())));
    }
    if properties.is_empty() {
        return;
    }
    let _ = w.write_event(Event::Start(BytesStart::new("properties")));
    for (name, value) in &properties {
        let mut p = BytesStart::new("property");
        p.push_attribute(("name", name.as_str()));
        p.push_attribute(("value", value.as_str()));
        let _ = w.write_event(Event::Empty(p));
    }
    let _ = w.write_event(Event::End(BytesEnd::new("properties")));
}

/// The class and name of each assertion's test case, in order (see [`junit_names`]).
/// The same check repeated on one instance (one write per seeded item) would share a
/// name; the repeats are told apart by their ordinal among that name alone (` #2`, ...),
/// so adding or removing an assertion elsewhere renames nothing. `classname` gives an
/// assertion's class before its instance is added.
pub(super) fn junit_case_names<'a>(
    cases: impl IntoIterator<Item = &'a Assertion>,
    classname: impl Fn(&Assertion) -> String,
    instances: &[String],
) -> Vec<(String, String)> {
    let mut seen: Vec<(String, String)> = Vec::new();
    let mut names = Vec::new();
    for a in cases {
        let (class, name) = junit_names(a, &classname(a), instances);
        let repeat = seen.iter().filter(|(c, n)| *c == class && *n == name).count();
        let shown = if repeat == 0 { name.clone() } else { format!("{name} #{}", repeat + 1) };
        names.push((class.clone(), shown));
        seen.push((class, name));
    }
    names
}

/// The class and name of an assertion's test case: `<suite class>[.instance<N>]` and
/// `phase/op expects <outcome>`.
fn junit_names(a: &Assertion, classname: &str, instances: &[String]) -> (String, String) {
    let same = |i: &String, url: &str| i.trim_end_matches('/') == url.trim_end_matches('/');
    let class = match &a.instance {
        Some(url) => match instances.iter().position(|i| same(i, url)) {
            Some(index) => format!("{classname}.instance{index}"),
            None => format!("{classname}.instance-unlisted"),
        },
        None => classname.to_owned(),
    };
    (class, format!("{} expects {}", a.name(), a.expected))
}

/// One `<testcase>`, with its `<failure>` if it failed.
fn junit_case(w: &mut Writer<Vec<u8>>, a: &Assertion, classname: &str, name: &str) {
    let mut case = BytesStart::new("testcase");
    case.push_attribute(("name", name));
    case.push_attribute(("classname", classname));
    case.push_attribute(("time", format!("{:.3}", a.duration.as_secs_f64()).as_str()));
    let _ = w.write_event(Event::Start(case));
    if let Some(why) = &a.inconclusive {
        let mut skipped = BytesStart::new("skipped");
        skipped.push_attribute(("message", format!("inconclusive: {why}").as_str()));
        let _ = w.write_event(Event::Empty(skipped));
    } else if !a.passed {
        let msg = format!("{}: expected {}, observed {}", a.name(), a.expected, a.observed);
        let mut failure = BytesStart::new("failure");
        failure.push_attribute(("message", msg.as_str()));
        failure.push_attribute(("type", a.op.as_str()));
        let _ = w.write_event(Event::Start(failure));
        let _ = w.write_event(Event::Text(BytesText::new(&a.line())));
        let _ = w.write_event(Event::End(BytesEnd::new("failure")));
    }
    let _ = w.write_event(Event::End(BytesEnd::new("testcase")));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assertion(check: &str, op: &str, expected: &str, observed: &str) -> Assertion {
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

    fn report(assertions: Vec<Assertion>) -> CycleReport {
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
            walk: WalkTimeline::default(),
            decisions: Vec::new(),
        }
    }

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
    fn an_inconclusive_assertion_is_neither_passed_nor_failed_and_junit_skips_it_with_why() {
        let mut undecided = assertion("eager/renewal", "write", "block", "allow");
        undecided.inconclusive = Some("the wall clock moved +1.500s against the monotonic clock".into());
        undecided.passed = false;
        assert!(!undecided.failed() && !undecided.is_enforcement_violation());
        assert_eq!(undecided.verdict(), "inconclusive");
        assert!(undecided.line().starts_with("INCONCLUSIVE [eager/renewal] write/write"), "{}", undecided.line());
        let mut r = report(vec![assertion("eager/renewal", "write", "block", "block"), undecided]);
        r.decisions = vec![CheckDecisions {
            check: "eager/renewal".into(),
            held: 9,
            inconclusive: 1,
            reasons: vec!["the wall clock moved +1.500s against the monotonic clock".into()],
            retried: 0,
        }];
        assert_eq!((r.failed_assertions(), r.inconclusive_assertions()), (0, 1));
        let xml = r.to_junit(&["http://127.0.0.1:1".into()]);
        assert!(xml.contains(r#"failures="0" errors="0" skipped="1""#), "{xml}");
        assert!(
            xml.contains(
                r#"<skipped message="inconclusive: the wall clock moved +1.500s against the monotonic clock"/>"#
            ),
            "{xml}"
        );
        assert!(xml.contains(r#"<property name="operations.held" value="9"/>"#), "{xml}");
        assert!(xml.contains(r#"<property name="operations.inconclusive" value="1"/>"#), "{xml}");
        assert!(xml.contains(r#"<property name="inconclusive.0" value="the wall clock moved"#), "{xml}");
        let j = r.to_json();
        assert_eq!(j["assertions"][1]["verdict"], "inconclusive");
        assert_eq!(j["assertions"][0]["verdict"], "passed");
        assert_eq!(j["inconclusiveAssertions"], 1);
        assert_eq!(j["decisions"][0]["inconclusive"], 1);
        assert!((r.decisions[0].inconclusive_share() - 0.1).abs() < 1e-9);
    }

    #[test]
    fn junit_has_one_testcase_per_assertion_and_names_the_failure() {
        let r = report(vec![
            assertion("cycle", "read", "allow", "allow"),
            assertion("cycle", "write", "block", "allow"),
            assertion("negative/wrong-token", "renew", "409 token-mismatch", "409 token-mismatch"),
        ]);
        let xml = r.to_junit(&["http://127.0.0.1:1".into()]);
        assert_eq!(xml.matches("<testcase ").count(), 3, "{xml}");
        assert_eq!(xml.matches("<testsuite ").count(), 2, "{xml}");
        assert!(xml.contains(r#"failures="1""#), "{xml}");
        assert!(xml.contains("write/write: expected block, observed allow"), "{xml}");
        // Parses back as XML.
        let mut reader = quick_xml::Reader::from_str(&xml);
        loop {
            match reader.read_event().unwrap() {
                Event::Eof => break,
                _ => continue,
            }
        }
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
