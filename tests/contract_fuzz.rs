//! The reference service against its own OpenAPI description, fuzzed by schemathesis
//! (pinned in scripts/contract-tools.txt, installed into .test-tools/contract-venv by
//! scripts/setup-contract-tools.sh): `lockprobe service` on a free port, the memory store,
//! no faults, every operation generated from `GET /openapi.json` (positive and negative
//! data, then the stateful phase along the description's links: pre-lock, escalate,
//! renew, swap, release). Checks: no 5xx; every status code, content type, header and
//! body conforms to the description; what it forbids is refused, and so is a lock call
//! without the key. A fixed seed keeps runs repeatable; the budget
//! is well under the suite's 2 minutes for schemathesis.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

const INSTALL_HINT: &str = "run scripts/setup-contract-tools.sh (scripts/test.sh does)";

/// The checks asked of every response: all that schemathesis 4 offers on conformance,
/// and that data the description forbids, a missing required header and a lock call
/// without the key are refused (4xx, 401).
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
response_schema_conformance,response_headers_conformance,negative_data_rejection,\
missing_required_header,ignored_auth";

fn schemathesis() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(".test-tools/contract-venv/bin/schemathesis");
    assert!(path.exists(), "{} is missing: {INSTALL_HINT}", path.display());
    path
}

/// `lockprobe service` on a free port; killed when dropped.
struct Service {
    child: Child,
    url: String,
}

impl Service {
    fn start() -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
            // Short cache and no replication lag, so the stateful phase's escalations
            // become possible within its run.
            .args(["service", "--listen", "127.0.0.1:0", "--cache-ttl", "100ms", "--replication-bound", "0s"])
            .args(["--skew-margin", "50ms"])
            .env("LOCKPROBE_LOCK_API_KEY", "fuzz-key")
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("lockprobe service starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines().map_while(Result::ok);
        let line = lines.by_ref().find(|l| l.contains("listening on "));
        let url = line.and_then(|l| l.split("listening on ").nth(1).map(str::to_owned)).expect("a listening line");
        // Keep draining: a service whose stdout is closed dies on its next line.
        std::thread::spawn(move || lines.for_each(drop));
        Self { child, url }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fuzz(schema: &str, url: &str, extra: &[&str]) -> Output {
    // Its example database and reports go to the working directory: not the repository.
    let scratch = tempfile::tempdir().unwrap();
    // One worker: with two threads, CPython 3.11's AST constructor now and then raises a
    // spurious "recursion depth mismatch" SystemError (python/cpython#106905) inside
    // schemathesis, reported as a runtime error of the run, not of the service.
    Command::new(schemathesis())
        .current_dir(scratch.path())
        .args(["run", schema, "--url", url, "--checks", CHECKS, "--seed", "20261201"])
        .args(["--header", "Authorization: Bearer fuzz-key", "--no-color", "--workers", "1"])
        .args(["--suppress-health-check", "all"])
        .args(extra)
        .output()
        .expect("schemathesis runs")
}

fn shown(out: &Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn the_reference_service_conforms_to_its_description() {
    let service = Service::start();
    let schema = format!("{}/openapi.json", service.url);
    let started = std::time::Instant::now();
    let out = fuzz(&schema, &service.url, &["--max-examples", "100"]);
    let text = shown(&out);
    assert!(out.status.success(), "schemathesis found non-conforming answers:\n{text}");
    // It really tested every operation and generated cases (not an empty run).
    assert!(text.contains("Tested: 14"), "{text}");
    assert!(text.contains("generated") && !text.contains(" 0 generated"), "{text}");
    eprintln!("schemathesis: {:.0?}\n{}", started.elapsed(), text.lines().rev().take(4).collect::<Vec<_>>().join("\n"));
}

/// The same run fails when the description and the answers disagree: a copy of the
/// description whose route view no longer allows `"source": "store"`, which a first read
/// of a fresh resource answers.
#[test]
fn a_description_the_answers_break_fails_the_run() {
    let service = Service::start();
    let mut document: serde_json::Value = serde_json::from_str(&reqwest::blocking_get(&service.url)).unwrap();
    document["components"]["schemas"]["RouteView"]["properties"]["source"] = serde_json::json!({"enum": ["cache"]});
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, document.to_string()).unwrap();
    let out = fuzz(
        file.to_str().unwrap(),
        &service.url,
        &[
            "--include-operation-id",
            "writeItem",
            "--include-operation-id",
            "route",
            "--phases",
            "coverage,fuzzing",
            "--max-examples",
            "20",
        ],
    );
    let text = shown(&out);
    assert!(!out.status.success(), "a broken description passed:\n{text}");
    assert!(text.to_lowercase().contains("response violates schema"), "{text}");
}

mod reqwest {
    /// A GET of `{base}/openapi.json`, without pulling reqwest's blocking feature in.
    pub fn blocking_get(base: &str) -> String {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async { ::reqwest::get(format!("{base}/openapi.json")).await.unwrap().text().await.unwrap() })
    }
}
