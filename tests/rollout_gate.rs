//! The release gate's rollout profiles, run as a release engineer runs them: a real old
//! build of this repository (034c7cc, the last that reads document format 1 only, built
//! by `scripts/build-baseline.sh` into `target/rollout/`) and today's build, each
//! instance its own process, over one local Cosmos DB server.
//!
//! Today's library writes format 2 while a lock call's effect depends on its commit, and
//! the old build refuses format 2 (fail closed): mixing them is caught, every failure
//! naming the old instance that could not read the document. The order a rollout needs
//! passes: today's build writing format 1 only beside the old one (expand), then
//! writing format 2 beside copies of itself that still write format 1 (contract). A
//! candidate that lets writes through a write lock is caught on its own instances.

#[path = "support/cosmos_server.rs"]
mod cosmos_server;
#[path = "support/pki.rs"]
mod pki;

use std::path::PathBuf;
use std::process::{Command, Output};

use cosmos_server::{cli_args, unique_database, CosmosServer};
use lockprobe::versions::CONTRACT_VERSION;

const KEY_ENV: &str = "LOCKPROBE_TEST_COSMOS_KEY";

fn lockprobe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_lockprobe"))
}

/// The old build, next to the suite's target directory's `debug/`.
fn baseline() -> PathBuf {
    let path = std::env::var_os("LOCKPROBE_ROLLOUT_BASELINE").map(PathBuf::from).unwrap_or_else(|| {
        let target = lockprobe().parent().and_then(|d| d.parent()).expect("target/debug/lockprobe").to_owned();
        target.join("rollout").join("lockprobe-034c7cc")
    });
    assert!(path.is_file(), "the rollout baseline {} is missing: run scripts/build-baseline.sh", path.display());
    path
}

/// `lockprobe gate --baseline ... <extra> -- <the shared Cosmos store's flags>`.
fn gate(server: &CosmosServer, baseline: &PathBuf, extra: &[&str]) -> Output {
    let store = cli_args(&server.endpoint(), &unique_database("rollout"), KEY_ENV);
    Command::new(lockprobe())
        .arg("gate")
        .arg("--baseline")
        .arg(baseline)
        .args(extra)
        .arg("--")
        .args(store)
        .env(KEY_ENV, "bG9ja3Byb2Jl")
        .output()
        .expect("lockprobe gate runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fail_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.contains("] FAIL [")).collect()
}

#[test]
fn a_format_2_writer_beside_a_format_1_reader_is_caught_in_every_profile_naming_the_old_instance() {
    let server = CosmosServer::start();
    let junit = std::env::temp_dir().join(format!("rollout-gate-{}.xml", std::process::id()));
    let out = gate(&server, &baseline(), &["--junit", junit.to_str().expect("a UTF-8 temp path")]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    // The JUnit report has a suite per profile and a failure per failed answer.
    let xml = std::fs::read_to_string(&junit).expect("the gate wrote its JUnit report");
    let _ = std::fs::remove_file(&junit);
    for profile in ["mixed", "rolling", "rollback"] {
        assert!(xml.contains(&format!("<testsuite name=\"rollout-{profile}\"")), "{xml}");
    }
    assert_eq!(xml.matches("<failure ").count(), fail_lines(&text).len(), "{xml}");
    for profile in ["mixed", "rolling", "rollback"] {
        assert!(text.contains(&format!("  {profile:<20} FAILED")), "{profile} must fail:\n{text}");
    }
    let fails = fail_lines(&text);
    assert!(!fails.is_empty(), "{text}");
    // Each failure is an old instance refusing a document it cannot read (it fails
    // closed): named by role and by the versions it declares (none: contract 1.1).
    for line in &fails {
        assert!(line.contains("(baseline, no contract version (1.1 or earlier))"), "{line}\n{text}");
        assert!(line.ends_with("observed 500 unsupported-document"), "{line}\n{text}");
    }
    // Mixed and rolling: the old instance cannot serve users on a resource the new one
    // locked; rollback: the old instance cannot go on with a migration the new one began.
    assert!(fails.iter().any(|l| l.starts_with("    [mixed] FAIL [hardDelete] write @ instance 0")), "{text}");
    assert!(fails.iter().any(|l| l.starts_with("    [rolling] FAIL [hardDelete] route @ instance 0")), "{text}");
    assert!(fails.iter().any(|l| l.starts_with("    [rollback] FAIL [hardDelete] escalate @ instance 1")), "{text}");
    // The migrations that stopped leave no lock in the shared store.
    for profile in ["mixed", "rollback"] {
        let note = format!("    [{profile}] note: released the stopped migration's lock through instance ");
        assert!(text.lines().any(|l| l.starts_with(&note) && l.ends_with("(204)")), "{text}");
    }
}

/// Every profile passed, each with every step's answers judged: the lock calls and, on
/// both instances in each of the four phases, the route view, a write, a delete and a read.
fn assert_every_profile_passed(out: &Output) {
    let text = stdout(out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    for profile in ["mixed", "rolling", "rollback"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("  {profile:<20} passed: ")))
            .unwrap_or_else(|| panic!("{profile} must pass:\n{text}"));
        let judged: usize = line.split_whitespace().nth(2).and_then(|n| n.parse().ok()).unwrap_or(0);
        assert!(judged >= 40, "{line}");
    }
    assert!(text.contains("gate: PASSED"), "{text}");
}

#[test]
fn expand_the_candidate_writing_format_1_beside_the_old_build_passes_every_profile() {
    let server = CosmosServer::start();
    let out = gate(&server, &baseline(), &["--candidate-arg=--write-format=1"]);
    assert_every_profile_passed(&out);
    // The pre-lock repeated under its key through the other instance is held only to
    // instances that declare a contract that keeps keys: 034c7cc declares none.
    let text = stdout(&out);
    for profile in ["mixed", "rolling"] {
        assert!(text.contains(&format!("    [{profile}] note: not checked: the pre-lock repeated")), "{text}");
    }
    assert!(
        !text.contains("    [rollback] note: not checked"),
        "both rollback instances start on today's build:\n{text}"
    );
}

#[test]
fn contract_the_candidate_writing_format_2_beside_format_1_writers_that_read_it_passes_every_profile() {
    // Once every instance reads format 2, writers switch to it: the fleet then mixes
    // today's build writing format 1 (the baseline now) and writing format 2.
    let server = CosmosServer::start();
    let out = gate(&server, &lockprobe(), &["--baseline-arg=--write-format=1"]);
    assert_every_profile_passed(&out);
    // Every instance declares contract 1.3 or later: the repeated pre-lock is judged
    // everywhere.
    let text = stdout(&out);
    assert!(!text.contains("not checked"), "{text}");
}

#[test]
fn a_candidate_that_lets_writes_through_a_write_lock_is_caught_on_its_own_instances() {
    let server = CosmosServer::start();
    let out = gate(
        &server,
        &baseline(),
        &["--rollout", "mixed", "--candidate-arg=--write-format=1", "--candidate-arg=--fault=ignore-write-lock"],
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let fails = fail_lines(&text);
    assert!(
        fails.iter().any(|l| l.starts_with(&format!(
            "    [mixed] FAIL [write] write @ instance 1 (candidate, contract {CONTRACT_VERSION}"
        )) && l.ends_with("expected 423 lock-held, observed 201")),
        "{text}"
    );
    // The old instance enforced the same lock: nothing of it failed.
    assert!(fails.iter().all(|l| l.contains("(candidate, ")), "{text}");
}

#[test]
fn faults_reach_only_the_version_that_takes_them_and_a_rolling_expand_passes_under_ambiguous_writes() {
    // Every lock write of the candidate times out at 250 ms and commits at 600 ms anyway
    // (`outcome-unknown`): the gate repeats each call under its key. The baseline has no
    // --store-fault flag (034c7cc predates it), so it runs without.
    let server = CosmosServer::start();
    let out = gate(
        &server,
        &baseline(),
        &[
            "--rollout",
            "rolling",
            "--candidate-arg=--write-format=1",
            "--candidate-arg=--store-fault=replace:late-commit=600ms,timeout=250ms",
        ],
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    // Rolling: the pre-lock goes through the baseline, the three later calls through
    // the candidate, each of them ambiguous at first.
    let repeated: Vec<_> = text.lines().filter(|l| l.contains("its outcome was unknown")).collect();
    assert_eq!(repeated.len(), 3, "{text}");
    assert!(repeated.iter().all(|l| l.contains(&format!("(candidate, contract {CONTRACT_VERSION}"))), "{text}");
}

#[test]
fn an_instance_behind_tls_is_reached_with_the_gates_ca_file() {
    // The candidate serves HTTPS with a private CA's certificate (034c7cc has no TLS
    // flags, so the baseline stays on HTTP): the gate's client trusts it through
    // --ca-file, as it does for the fault profiles.
    let server = CosmosServer::start();
    let pki = pki::Pki::generate();
    let path = |p: &PathBuf| p.to_str().expect("a UTF-8 temp path").to_owned();
    let out = gate(
        &server,
        &baseline(),
        &[
            "--rollout",
            "mixed",
            "--candidate-arg=--write-format=1",
            &format!("--candidate-arg=--tls-cert={}", path(&pki.server_cert)),
            &format!("--candidate-arg=--tls-key={}", path(&pki.server_key)),
            "--ca-file",
            &path(&pki.server_ca),
            // The shared store's bound, declared by every instance (the default is 500 ms).
            "--replication-bound=1s",
        ],
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("every instance with cache TTL 1s and replication bound 1s"), "{text}");
    assert!(text.contains("  mixed                passed: "), "{text}");
    // Without the CA the candidate's answers cannot be trusted: the profile fails.
    let untrusted = gate(
        &server,
        &baseline(),
        &[
            "--rollout",
            "mixed",
            &format!("--candidate-arg=--tls-cert={}", path(&pki.server_cert)),
            &format!("--candidate-arg=--tls-key={}", path(&pki.server_key)),
        ],
    );
    let text = stdout(&untrusted);
    assert_eq!(untrusted.status.code(), Some(1), "{text}");
    assert!(text.contains("  mixed                FAILED"), "{text}");
}

#[test]
fn a_rollout_over_a_store_only_one_process_sees_is_refused_naming_the_flag() {
    let out =
        Command::new(lockprobe()).args(["gate", "--baseline"]).arg(lockprobe()).output().expect("lockprobe gate runs");
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--baseline") && err.contains("--store cosmos"), "{err}");
    let out = Command::new(lockprobe()).args(["gate", "--rollout", "mixed"]).output().expect("lockprobe gate runs");
    assert_eq!(out.status.code(), Some(64), "{}", String::from_utf8_lossy(&out.stderr));
    // The rollout's replication bound means nothing without a rollout, and must be a
    // duration.
    let out = Command::new(lockprobe()).args(["gate", "--replication-bound", "2s"]).output().expect("gate runs");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--baseline"));
    let out = Command::new(lockprobe())
        .args(["gate", "--baseline"])
        .arg(lockprobe())
        .args(["--replication-bound", "forever", "--", "--store", "cosmos"])
        .output()
        .expect("lockprobe gate runs");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--replication-bound"));
}
