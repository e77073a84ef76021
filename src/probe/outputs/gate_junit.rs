//! The release gate's JUnit report: one `<testsuite>` per fault profile, one
//! `<testcase>` per assertion of the probe's run under that profile; for the rollout
//! profiles ([`rollout_to_junit`]), one per judged answer.
//!
//! Test cases are named as `validate`'s are ([`super::junit`]), with the profile in the
//! class: `lockprobe.gate.<profile>.<check>[.instance<N>]` and
//! `phase/op expects <outcome>`, a repeat under one name numbered ` #2`, ` #3`, ... So
//! names stay the same across runs and machines (never a URL, which changes with every
//! port) and CI keeps their history.
//! A profile beyond the scheme's assumptions reports what broke as `<skipped>`, with the
//! reason, rather than failing the gate or passing silently.

use quick_xml::events::{BytesDecl, BytesEnd, BytesStart, Event};
use quick_xml::Writer;

use super::junit::junit_case_names;
use crate::probe::checks::report::{Assertion, CycleReport, CycleResult};

/// The probe's run under one fault profile, as the gate reports it.
pub struct ProfileRun<'a> {
    /// The profile's name (the suite's name).
    pub profile: &'a str,
    /// What the profile does to the service, for the reader.
    pub description: &'a str,
    /// Whether the profile breaks one of the scheme's assumptions: what breaks is
    /// reported, not failed.
    pub beyond_assumptions: bool,
    /// The instances' base URLs, to turn an assertion's instance into its index.
    pub instances: &'a [String],
    /// The run's report; `Err` when the run could not happen (the candidate did not
    /// start), with why.
    pub report: Result<&'a CycleReport, String>,
    /// Live locks found on the run's resources once the probe was done and caches had
    /// converged (none held by the probe any more: each is a lock nobody will release).
    pub left_behind: &'a [String],
    /// Why each earlier attempt at the profile was run again: it decided too little
    /// (a check over its cap of inconclusive operations, nothing else wrong).
    pub undecided: &'a [String],
}

impl ProfileRun<'_> {
    /// Whether this run fails the gate.
    pub fn fails_gate(&self) -> bool {
        match &self.report {
            Err(_) => true,
            Ok(_) if self.beyond_assumptions => false,
            Ok(r) => r.result != CycleResult::Passed || !self.left_behind.is_empty(),
        }
    }
}

/// The whole gate report.
pub fn to_junit(runs: &[ProfileRun<'_>]) -> String {
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    // Writing into a Vec cannot fail; the results are ignored for that reason only.
    let _ = w.write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)));
    let counts: Vec<Counts> = runs.iter().map(Counts::of).collect();
    let total = counts.iter().fold(Counts::default(), |a, b| a.plus(b));
    let mut root = BytesStart::new("testsuites");
    root.push_attribute(("name", "lockprobe gate"));
    total.push_attributes(&mut root);
    let _ = w.write_event(Event::Start(root));
    for (run, counts) in runs.iter().zip(&counts) {
        write_suite(&mut w, run, counts);
    }
    let _ = w.write_event(Event::End(BytesEnd::new("testsuites")));
    String::from_utf8(w.into_inner()).unwrap_or_default()
}

/// One judged answer of a rollout profile (or the profile's migration as a whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JunitCase {
    /// The test case's class, the same on every run.
    pub class: String,
    /// Its name, the same on every run.
    pub name: String,
    /// Why it failed, if it did.
    pub failure: Option<String>,
    /// Why it could not be judged, if it could not.
    pub error: Option<String>,
}

/// The rollout profiles' report: a `<testsuite>` per profile (`rollout-<profile>`), a
/// `<testcase>` per judged answer.
pub fn rollout_to_junit(runs: &[(&str, Vec<JunitCase>)]) -> String {
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    // Writing into a Vec cannot fail; the results are ignored for that reason only.
    let _ = w.write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)));
    let counts = |cases: &[JunitCase]| Counts {
        tests: cases.len(),
        failures: cases.iter().filter(|c| c.failure.is_some()).count(),
        errors: cases.iter().filter(|c| c.error.is_some()).count(),
        ..Counts::default()
    };
    let total = runs.iter().fold(Counts::default(), |a, (_, cases)| a.plus(&counts(cases)));
    let mut root = BytesStart::new("testsuites");
    root.push_attribute(("name", "lockprobe gate (rollout)"));
    total.push_attributes(&mut root);
    let _ = w.write_event(Event::Start(root));
    for (profile, cases) in runs {
        let mut suite = BytesStart::new("testsuite");
        suite.push_attribute(("name", format!("rollout-{profile}").as_str()));
        counts(cases).push_attributes(&mut suite);
        let _ = w.write_event(Event::Start(suite));
        for case in cases {
            let mut start = BytesStart::new("testcase");
            start.push_attribute(("name", case.name.as_str()));
            start.push_attribute(("classname", case.class.as_str()));
            let outcome = match (&case.failure, &case.error) {
                (_, Some(why)) => Some(("error", why)),
                (Some(why), None) => Some(("failure", why)),
                (None, None) => None,
            };
            let Some((kind, why)) = outcome else {
                let _ = w.write_event(Event::Empty(start));
                continue;
            };
            let _ = w.write_event(Event::Start(start));
            let mut e = BytesStart::new(kind);
            e.push_attribute(("message", why.as_str()));
            let _ = w.write_event(Event::Empty(e));
            let _ = w.write_event(Event::End(BytesEnd::new("testcase")));
        }
        let _ = w.write_event(Event::End(BytesEnd::new("testsuite")));
    }
    let _ = w.write_event(Event::End(BytesEnd::new("testsuites")));
    String::from_utf8(w.into_inner()).unwrap_or_default()
}

/// Test, failure, error and skipped counts of one suite (or of all).
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    tests: usize,
    failures: usize,
    errors: usize,
    skipped: usize,
    time: f64,
}

impl Counts {
    fn of(run: &ProfileRun<'_>) -> Self {
        let Ok(report) = &run.report else {
            return Self { tests: 1, errors: 1, ..Self::default() };
        };
        let failed = report.failed_assertions() + usize::from(!run.left_behind.is_empty());
        let error = usize::from(report.error.is_some());
        let time = (report.finished_at - report.started_at).to_std().unwrap_or_default().as_secs_f64();
        let inconclusive = report.inconclusive_assertions();
        let (failures, skipped) =
            if run.beyond_assumptions { (0, failed + error + inconclusive) } else { (failed, inconclusive) };
        let errors = if run.beyond_assumptions { 0 } else { error };
        Self { tests: report.assertions.len() + 1 + error, failures, errors, skipped, time }
    }

    fn plus(self, o: &Counts) -> Self {
        Self {
            tests: self.tests + o.tests,
            failures: self.failures + o.failures,
            errors: self.errors + o.errors,
            skipped: self.skipped + o.skipped,
            time: self.time + o.time,
        }
    }

    fn push_attributes(&self, e: &mut BytesStart<'_>) {
        e.push_attribute(("tests", self.tests.to_string().as_str()));
        e.push_attribute(("failures", self.failures.to_string().as_str()));
        e.push_attribute(("errors", self.errors.to_string().as_str()));
        e.push_attribute(("skipped", self.skipped.to_string().as_str()));
        e.push_attribute(("time", format!("{:.3}", self.time).as_str()));
    }
}

fn write_suite(w: &mut Writer<Vec<u8>>, run: &ProfileRun<'_>, counts: &Counts) {
    let mut suite = BytesStart::new("testsuite");
    suite.push_attribute(("name", run.profile));
    counts.push_attributes(&mut suite);
    if let Ok(r) = &run.report {
        suite.push_attribute(("timestamp", r.started_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true).as_str()));
    }
    let _ = w.write_event(Event::Start(suite));
    let _ = w.write_event(Event::Start(BytesStart::new("properties")));
    let attempts = [("attempts".to_owned(), (run.undecided.len() + 1).to_string())];
    // Per check that held operations to a lock: how many it held and could not.
    let decisions = run.report.iter().flat_map(|r| &r.decisions).flat_map(|d| {
        [
            (format!("operations.{}.held", d.check), d.held.to_string()),
            (format!("operations.{}.inconclusive", d.check), d.inconclusive.to_string()),
        ]
    });
    let undecided =
        run.undecided.iter().enumerate().map(|(i, why)| (format!("undecidedAttempt.{}", i + 1), why.clone()));
    for (name, value) in [
        ("description".to_owned(), run.description.to_owned()),
        ("beyondAssumptions".to_owned(), run.beyond_assumptions.to_string()),
        ("instances".to_owned(), run.instances.len().to_string()),
    ]
    .into_iter()
    .chain(attempts)
    .chain(decisions)
    .chain(undecided)
    {
        let mut p = BytesStart::new("property");
        p.push_attribute(("name", name.as_str()));
        p.push_attribute(("value", value.as_str()));
        let _ = w.write_event(Event::Empty(p));
    }
    let _ = w.write_event(Event::End(BytesEnd::new("properties")));
    let classname = |check: &str| format!("lockprobe.gate.{}.{}", run.profile, check.replace('/', "."));
    match &run.report {
        Err(why) => error_case(w, &classname("run"), "service started and probed", why, false),
        Ok(report) => {
            let names = junit_case_names(&report.assertions, |a| classname(&a.check), run.instances);
            for (a, (class, name)) in report.assertions.iter().zip(&names) {
                assertion_case(w, class, name, a, run.beyond_assumptions);
            }
            left_behind_case(w, &classname("gate"), run.left_behind, run.beyond_assumptions);
            if let Some(err) = &report.error {
                error_case(w, &classname("cycle"), "cycle completed", err, run.beyond_assumptions);
            }
        }
    }
    let _ = w.write_event(Event::End(BytesEnd::new("testsuite")));
}

fn assertion_case(w: &mut Writer<Vec<u8>>, classname: &str, name: &str, a: &Assertion, beyond: bool) {
    let mut case = BytesStart::new("testcase");
    case.push_attribute(("name", name));
    case.push_attribute(("classname", classname));
    case.push_attribute(("time", format!("{:.3}", a.duration.as_secs_f64()).as_str()));
    if a.passed {
        let _ = w.write_event(Event::Empty(case));
        return;
    }
    let _ = w.write_event(Event::Start(case));
    let message = format!("{}: expected {}, observed {}", a.name(), a.expected, a.observed);
    let mut outcome = if let Some(why) = &a.inconclusive {
        let mut s = BytesStart::new("skipped");
        s.push_attribute(("message", format!("inconclusive: {why}").as_str()));
        s
    } else if beyond {
        let mut s = BytesStart::new("skipped");
        s.push_attribute(("message", format!("beyond the scheme's assumptions, reported: {message}").as_str()));
        s
    } else {
        let mut f = BytesStart::new("failure");
        f.push_attribute(("message", message.as_str()));
        f.push_attribute(("type", a.op.as_str()));
        f
    };
    if let Some(d) = &a.detail {
        outcome.push_attribute(("detail", d.as_str()));
    }
    let _ = w.write_event(Event::Empty(outcome));
    let _ = w.write_event(Event::End(BytesEnd::new("testcase")));
}

/// `no live lock left behind`: passes when `left_behind` is empty.
fn left_behind_case(w: &mut Writer<Vec<u8>>, classname: &str, left_behind: &[String], beyond: bool) {
    let mut case = BytesStart::new("testcase");
    case.push_attribute(("name", "no live lock left behind"));
    case.push_attribute(("classname", classname));
    if left_behind.is_empty() {
        let _ = w.write_event(Event::Empty(case));
        return;
    }
    let _ = w.write_event(Event::Start(case));
    let message = format!("live locks after the run: {}", left_behind.join("; "));
    let mut e = BytesStart::new(if beyond { "skipped" } else { "failure" });
    e.push_attribute(("message", message.as_str()));
    let _ = w.write_event(Event::Empty(e));
    let _ = w.write_event(Event::End(BytesEnd::new("testcase")));
}

fn error_case(w: &mut Writer<Vec<u8>>, classname: &str, name: &str, why: &str, beyond: bool) {
    let mut case = BytesStart::new("testcase");
    case.push_attribute(("name", name));
    case.push_attribute(("classname", classname));
    let _ = w.write_event(Event::Start(case));
    let mut e = BytesStart::new(if beyond { "skipped" } else { "error" });
    e.push_attribute(("message", why));
    let _ = w.write_event(Event::Empty(e));
    let _ = w.write_event(Event::End(BytesEnd::new("testcase")));
}
