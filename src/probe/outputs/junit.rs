//! A cycle's JUnit XML report (`validate --junit`): one suite per check, one test case per
//! assertion, names that stay the same from run to run. The release gate's report
//! ([`super::gate_junit`]) names its cases the same way.

use chrono::SecondsFormat;
use quick_xml::events::{BytesDecl, BytesEnd, BytesStart, BytesText, Event};
use quick_xml::Writer;

use crate::probe::checks::report::{Assertion, CheckDecisions, CycleReport};

impl CycleReport {
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
    use crate::probe::checks::report::fixtures::{assertion, report};
    use crate::probe::checks::report::CheckDecisions;
    use quick_xml::events::Event;

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
}
