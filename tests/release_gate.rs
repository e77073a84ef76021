//! The release gate, run as a release engineer runs it: `lockprobe gate` starts the
//! candidate (`lockprobe service`, this build) once per store-fault profile and probes it
//! with the eager checks. The shipped library must pass every profile within the
//! scheme's assumptions; the old decide-time `effectiveAt` and the old renewal rule,
//! switched back on with `--fault`, must make it fail, naming the profile, the check, the
//! phase, the operation and the instance.

use std::process::{Command, Output};

use quick_xml::events::Event;
use quick_xml::Reader;

fn gate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lockprobe")).arg("gate").args(args).output().expect("lockprobe gate runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One `<testsuite>` of the gate's JUnit: its name, counts and test case names.
#[derive(Debug, Default)]
struct Suite {
    name: String,
    tests: usize,
    failures: usize,
    errors: usize,
    skipped: usize,
    cases: Vec<String>,
    failed_cases: usize,
    skipped_cases: usize,
    /// The `message` of each `<skipped>`: why an assertion was inconclusive.
    skipped_messages: Vec<String>,
    /// The test case of each `<skipped>`, named as in `cases`.
    skipped_names: Vec<String>,
}

fn attr(e: &quick_xml::events::BytesStart<'_>, name: &str) -> Option<String> {
    e.attributes()
        .flatten()
        .find(|a| a.key.as_ref() == name.as_bytes())
        .map(|a| a.unescape_value().expect("attribute value").into_owned())
}

fn count(e: &quick_xml::events::BytesStart<'_>, name: &str) -> usize {
    attr(e, name).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no numeric {name} on a testsuite"))
}

/// The suites of a JUnit document, parsed as a CI server reads it.
fn suites(xml: &str) -> Vec<Suite> {
    let mut reader = Reader::from_str(xml);
    let mut suites: Vec<Suite> = Vec::new();
    loop {
        match reader.read_event().expect("well-formed XML") {
            Event::Start(e) | Event::Empty(e) => match e.name().as_ref() {
                b"testsuite" => suites.push(Suite {
                    name: attr(&e, "name").expect("a testsuite has a name"),
                    tests: count(&e, "tests"),
                    failures: count(&e, "failures"),
                    errors: count(&e, "errors"),
                    skipped: count(&e, "skipped"),
                    ..Suite::default()
                }),
                b"testcase" => {
                    let suite = suites.last_mut().expect("a testcase inside a testsuite");
                    let class = attr(&e, "classname").expect("a testcase has a classname");
                    suite.cases.push(format!("{class} :: {}", attr(&e, "name").expect("a testcase has a name")));
                }
                b"failure" | b"error" => suites.last_mut().expect("inside a testsuite").failed_cases += 1,
                b"skipped" => {
                    let suite = suites.last_mut().expect("inside a testsuite");
                    suite.skipped_cases += 1;
                    suite.skipped_messages.push(attr(&e, "message").unwrap_or_default());
                    suite.skipped_names.push(suite.cases.last().cloned().unwrap_or_default());
                }
                _ => {}
            },
            Event::Eof => return suites,
            _ => {}
        }
    }
}

#[test]
fn the_shipped_library_passes_every_profile_within_the_assumptions_and_the_report_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("gate.xml");
    let out = gate(&["--junit", junit.to_str().unwrap(), "--json-dir", dir.path().to_str().unwrap()]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("gate: PASSED"), "{text}");

    let xml = std::fs::read_to_string(&junit).unwrap();
    let suites = suites(&xml);
    let names: Vec<&str> = suites.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "baseline",
            "slow-commit",
            "late-ack",
            "ambiguous",
            "replica-lag",
            "clock-ahead",
            "clock-behind",
            "clock-beyond-margin"
        ]
    );
    for s in &suites {
        assert_eq!(s.tests, s.cases.len(), "{}: tests= matches its testcases", s.name);
        assert_eq!(s.failures + s.errors, s.failed_cases, "{}: failures+errors= match", s.name);
        assert_eq!(s.skipped, s.skipped_cases, "{}: skipped= matches", s.name);
        assert!(s.tests > 100, "{}: the whole cycle and the eager checks ran ({} cases)", s.name, s.tests);
        assert!(s.cases.iter().any(|c| c.contains(".eager.escalation ::")), "{}: eager checks ran", s.name);
        assert!(s.cases.iter().any(|c| c.contains(".eager.renewal ::")), "{}: eager checks ran", s.name);
        let force_release = s.cases.iter().filter(|c| c.contains(".negative.force-release")).count();
        assert!(force_release >= 15, "{}: the force-release check ran ({force_release} cases)", s.name);
        assert!(!s.cases.iter().any(|c| c.contains("http://")), "{}: names carry no URL", s.name);
        let mut unique = s.cases.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), s.cases.len(), "{}: test case names are unique", s.name);
        assert!(s.cases.iter().any(|c| c.ends_with(".gate :: no live lock left behind")), "{}: swept", s.name);
        if s.name != "clock-beyond-margin" {
            assert_eq!(s.failed_cases, 0, "{}: within the assumptions nothing fails", s.name);
            // An operation whose decision window straddled a lock's edge is inconclusive:
            // neither passed nor failed, shown with why, and capped by the gate itself (a
            // check over its share fails the profile, which the PASSED above rules out).
            // On a loaded machine a few occur (RELIABILITY.md: 19 of 8,309 in 20 rounds).
            for why in &s.skipped_messages {
                assert!(why.starts_with("inconclusive: "), "{}: a skipped case says why: {why:?}", s.name);
            }
            assert!(
                s.skipped_cases * 5 <= s.tests,
                "{}: {} of {} cases inconclusive, over the default share of 20%",
                s.name,
                s.skipped_cases,
                s.tests
            );
        }
        let report = dir.path().join(format!("{}.json", s.name));
        assert!(report.is_file(), "{} has its JSON cycle report", s.name);
    }
    // Beyond the skew margin the gate does not pass silently: what broke is reported,
    // never as a failure of the gate. The profile's skew (3 s) is past the eager
    // renewal's 2 s lease plus the margin, so instance 1, whose clock runs ahead, takes
    // that lease for lapsed from its grant and accepts the writes made before the
    // renewal lands: a violation is certain, and it is reported on that instance.
    assert!(text.contains("clock-beyond-margin"), "{text}");
    let beyond = text.lines().find(|l| l.trim_start().starts_with("clock-beyond-margin")).unwrap();
    assert!(beyond.contains("REPORTED (beyond the scheme's assumptions)"), "{beyond}\n{text}");
    assert!(
        text.lines().any(|l| l.contains("[clock-beyond-margin] FAIL [eager/renewal] write/write @ ")),
        "the write accepted by the instance ahead is named:\n{text}"
    );
    let beyond = suites.iter().find(|s| s.name == "clock-beyond-margin").unwrap();
    assert_eq!(beyond.failed_cases, 0, "beyond the assumptions nothing fails the gate: {beyond:?}");
    let reported = beyond.skipped_names.iter().zip(&beyond.skipped_messages).any(|(case, why)| {
        case == "lockprobe.gate.clock-beyond-margin.eager.renewal.instance1 :: write/write expects block"
            && why == "beyond the scheme's assumptions, reported: write/write: expected block, observed allow"
    });
    assert!(
        reported,
        "the JUnit marks the write accepted on instance 1 <skipped>, as reported: {:?}",
        beyond.skipped_names.iter().zip(&beyond.skipped_messages).collect::<Vec<_>>()
    );
}

#[test]
fn the_old_decide_time_effective_at_fails_the_gate_naming_profile_check_phase_operation_and_instance() {
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("gate.xml");
    let out =
        gate(&["--profile", "slow-commit", "--junit", junit.to_str().unwrap(), "--", "--fault", "legacy-effective-at"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("gate: FAILED (1 of 1 profiles)"), "{text}");
    let named = text.lines().find(|l| {
        l.contains("[slow-commit]")
            && l.contains("[eager/escalation]")
            && l.contains("hardDelete/delete @ http://127.0.0.1:")
            && l.contains("expected tombstone, observed allow")
    });
    assert!(named.is_some(), "a physical delete under hardDelete, on its instance:\n{text}");
    let suites = suites(&std::fs::read_to_string(&junit).unwrap());
    assert_eq!(suites.len(), 1);
    assert!(suites[0].failures > 0 && suites[0].failures == suites[0].failed_cases, "{:?}", suites[0]);
}

#[test]
fn the_old_renewal_rule_fails_the_gate_on_the_eager_renewal() {
    let out = gate(&["--profile", "slow-commit", "--", "--fault", "legacy-renewal"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let named = text.lines().find(|l| {
        l.contains("[slow-commit]")
            && l.contains("[eager/renewal]")
            && l.contains("write/write @ http://127.0.0.1:")
            && l.contains("expected block, observed allow")
            && l.contains("the renewal says renewed (200)")
    });
    assert!(named.is_some(), "a write accepted around a renewal the service said took:\n{text}");
}

#[test]
fn a_lock_nobody_can_release_any_more_fails_the_gate() {
    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("gate.xml");
    let out = gate(&[
        "--profile",
        "baseline",
        "--junit",
        junit.to_str().unwrap(),
        "--",
        "--fault",
        "ack-release-without-releasing",
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("[baseline] FAIL [gate] live lock left behind: gate-v"), "{text}");
    let xml = std::fs::read_to_string(&junit).unwrap();
    let suites = suites(&xml);
    let case = suites[0].cases.iter().find(|c| c.ends_with(".gate :: no live lock left behind"));
    assert!(case.is_some(), "{:?}", suites[0].cases);
    assert_eq!(suites[0].failures, suites[0].failed_cases, "{:?}", suites[0]);
    assert!(xml.contains("live locks after the run: "), "{xml}");
}

#[test]
fn bad_gate_flags_are_refused_with_exit_64_naming_the_flag() {
    for (args, names) in [
        (&["--candidate", "/nonexistent/lockprobe"][..], "--candidate"),
        (&["--profile", "meteor-strike"][..], "--profile"),
        (&["--instances", "1"][..], "--instances"),
        (&["--profile-timeout", "soon"][..], "--profile-timeout"),
        (&["--max-inconclusive", "1.5"][..], "--max-inconclusive"),
        (&["--max-inconclusive", "NaN"][..], "--max-inconclusive"),
        (&["--inconclusive-retries", "11"][..], "--inconclusive-retries"),
    ] {
        let out = gate(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(err.contains(names), "{args:?} must name {names}: {err}");
    }
}
