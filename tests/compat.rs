//! The compatibility corpus (`tests/compat/README.md`): every document each earlier
//! format and revision stored, read, enforced and mutated by today's library.
//!
//! For each document its manifest says what the revision that wrote it decided at a
//! given instant: the route, the user operations, and the outcome of each lock call.
//! Today's library must decide the same (no later contract changed one of these answers
//! on purpose; one that does names its exception and contract section in `replay`),
//! write back a document in the format its content needs, and keep every field it does
//! not know. A copy of each
//! document with unknown fields at every level, and one in a format newer than this
//! library reads, are derived here; the newer ones are refused by the library and the
//! service, and skipped and counted by the monitor.

#[path = "support/service.rs"]
mod service;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lockprobe::clock::{Clock, ManualClock};
use lockprobe::document::{DocumentError, LocationDocument, FORMATS_READ};
use lockprobe::monitor::{Monitor, MonitorConfig};
use lockprobe::routing::cache::TieredCache;
use lockprobe::routing::{
    enforce, ClientOptions, Decision, LockPolicy, LockToken, Operation, Phase, PreLockRequest, RoutingClient,
    RoutingError,
};
use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
use lockprobe::store::{LocationStore, ReadFrom};
use serde_json::{json, Value};

fn corpus_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat")
}

/// Every directory of the corpus that holds a manifest, oldest format first.
fn formats() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(corpus_root())
        .expect("tests/compat exists")
        .map(|e| e.expect("a readable entry").path())
        .filter(|p| p.join("manifest.json").is_file())
        .collect();
    dirs.sort();
    dirs
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn instant(v: &Value) -> DateTime<Utc> {
    v.as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("not an instant: {v}"))
}

/// One document of the corpus and what its writer decided on it.
struct Case {
    name: String,
    stored: Value,
    committed: DateTime<Utc>,
    read_at: DateTime<Utc>,
    expected: Value,
    policy: LockPolicy,
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for dir in formats() {
        let manifest = read_json(&dir.join("manifest.json"));
        let declared = &manifest["declaration"];
        let secs = |field: &str| Duration::from_secs(declared[field].as_u64().expect("a declared duration"));
        let policy =
            LockPolicy::declared(secs("cacheTtlSeconds"), secs("replicationBoundSeconds"), secs("maxPreLockSeconds"));
        let format = dir.file_name().unwrap().to_string_lossy().into_owned();
        for entry in manifest["documents"].as_array().expect("a list of documents") {
            let file = entry["file"].as_str().expect("a file name");
            cases.push(Case {
                name: format!("{format}/{file}"),
                stored: read_json(&dir.join(file)),
                committed: instant(&entry["committedAt"]),
                read_at: instant(&entry["readAt"]),
                expected: entry["expected"].clone(),
                policy: policy.clone(),
            });
        }
    }
    assert!(cases.len() >= 12, "the corpus holds {} documents; is tests/compat/ complete?", cases.len());
    cases
}

/// A store holding only `stored`, committed at `committed`, and a client reading it at
/// `read_at`.
fn seeded(case: &Case, stored: &Value) -> (Arc<ManualClock>, Arc<MemoryStore>, RoutingClient) {
    let clock = Arc::new(ManualClock::new(case.committed));
    let store = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    store.put_raw(stored["id"].as_str().expect("an id"), stored.clone());
    clock.set(case.read_at);
    let ttl = case.policy.convergence_delay;
    let client = RoutingClient::new(
        store.clone(),
        clock.clone(),
        TieredCache::try_new(&[ttl]).expect("a valid TTL"),
        case.policy.clone(),
        ClientOptions::default(),
    );
    (clock, store, client)
}

fn decision(d: Decision) -> &'static str {
    match d {
        Decision::Allow => "allow",
        Decision::Block { .. } => "block",
        Decision::Tombstone => "tombstone",
    }
}

const CALLS: [&str; 6] = ["preLock", "escalateHardDelete", "escalateWrite", "renew", "swap", "release"];

async fn call(client: &RoutingClient, case: &Case, stored: &Value, which: &str) -> Result<(), RoutingError> {
    let id = stored["id"].as_str().expect("an id");
    let token = stored["primary"]["lock"]["token"].as_str().map(LockToken::from_presented);
    let token = token.unwrap_or_else(LockToken::generate);
    let minute = Duration::from_secs(60);
    let target = case.expected["swapTarget"].as_str().expect("a swap target");
    let request =
        PreLockRequest { owner: "compat-newcomer".into(), duration: Duration::from_secs(600), target_location: None };
    match which {
        "preLock" => client.pre_lock(id, &request).await.map(drop),
        "escalateHardDelete" => client.escalate(id, &token, Phase::HardDelete, minute).await.map(drop),
        "escalateWrite" => client.escalate(id, &token, Phase::Write, minute).await.map(drop),
        "renew" => client.renew(id, &token, minute).await.map(drop),
        "swap" => client.swap(id, &token, target).await.map(drop),
        "release" => client.release(id, &token).await.map(drop),
        other => panic!("no such call {other}"),
    }
}

/// Reads `case` (or its variant `stored`) with today's library and holds every
/// decision to what the writer decided. Returns what each successful call wrote.
async fn replay(case: &Case, stored: &Value) -> Vec<(String, Value)> {
    let (clock, _store, client) = seeded(case, stored);
    let id = stored["id"].as_str().expect("an id");
    let route =
        client.resolve(id).await.unwrap_or_else(|e| panic!("{}: today's library cannot read it: {e}", case.name));
    let expected = &case.expected;
    assert_eq!(route.location(), expected["location"], "{}: location", case.name);
    let live = route.lock().filter(|l| clock.now() < l.expires_at).map(|l| l.phase.as_str());
    assert_eq!(json!(live), expected["lockPhase"], "{}: the live lock's phase", case.name);
    let skew = case.policy.skew_margin;
    for (op, field) in [(Operation::Read, "read"), (Operation::Write, "write"), (Operation::Delete, "delete")] {
        let decided = decision(enforce(op, route.lock(), clock.now(), skew));
        assert_eq!(decided, expected[field], "{}: a user {field} at {}", case.name, case.read_at);
    }

    let mut written = Vec::new();
    for which in CALLS {
        let (_, store, client) = seeded(case, stored);
        let outcome = call(&client, case, stored, which).await;
        let then = expected["calls"][which].as_str().expect("an outcome per call");
        let writer_granted = then == "ok";
        // No contract since has changed one of these answers on purpose; one that does
        // must name the case and its section of docs/contract.md here.
        assert_eq!(
            outcome.is_ok(),
            writer_granted,
            "{}: {which} was {then} when written, today {outcome:?}",
            case.name
        );
        if outcome.is_ok() {
            let after = store.read(id, ReadFrom::WriteRegion).await.expect("the written document reads back");
            written.push((which.to_owned(), after.doc.to_json()));
        }
    }
    written
}

fn check_written_format(case: &Case, which: &str, json: &Value) {
    let doc = LocationDocument::from_json(json.clone())
        .unwrap_or_else(|e| panic!("{}: after {which}, today's library cannot read what it wrote: {e}", case.name));
    let format = json["schemaVersion"].as_u64().expect("a format");
    let pending = json.get("pending").is_some_and(|p| !p.is_null());
    assert_eq!(format, if pending { 2 } else { 1 }, "{}: after {which}, the format of {json}", case.name);
    assert_eq!(format, doc.format(), "{}: after {which}", case.name);
}

#[tokio::test]
async fn todays_library_reads_enforces_and_mutates_every_format_as_its_writer_did() {
    let mut checked = 0;
    for case in cases() {
        for (which, json) in replay(&case, &case.stored).await {
            check_written_format(&case, &which, &json);
            checked += 1;
        }
    }
    assert!(checked >= 12, "only {checked} lock calls succeeded over the whole corpus");
}

/// `stored` with a field this library does not know at every level, each tagged with
/// what holds it, so that a later write can be checked to keep it where it belongs.
fn with_unknown_fields(stored: &Value) -> Value {
    let mut doc = stored.clone();
    doc["futureTop"] = json!({"kept": "top", "nested": [1, {"deep": true}]});
    for section in ["primary", "secondary"] {
        let Some(s) = doc.get_mut(section).filter(|s| s.is_object()) else { continue };
        let location = s["location"].as_str().expect("a location").to_owned();
        s["futureSection"] = json!(format!("section:{location}"));
        if let Some(lock) = s.get_mut("lock").filter(|l| l.is_object()) {
            let token = lock["token"].as_str().expect("a token").to_owned();
            lock["futureLock"] = json!(format!("lock:{token}"));
        }
    }
    if let Some(records) = doc.get_mut("operations").and_then(Value::as_array_mut) {
        for record in records {
            let key = record["key"].as_str().expect("a key").to_owned();
            record["futureRecord"] = json!(format!("record:{key}"));
        }
    }
    if let Some(requests) = doc.get_mut("forceReleases").and_then(Value::as_array_mut) {
        for request in requests {
            let id = request["id"].as_str().expect("an id").to_owned();
            request["futureForceRelease"] = json!(format!("force-release:{id}"));
        }
    }
    doc
}

/// Every unknown field of `before` that still has its holder in `after` is there,
/// unchanged.
fn check_unknown_fields_kept(name: &str, which: &str, before: &Value, after: &Value) {
    assert_eq!(after["futureTop"], before["futureTop"], "{name}: after {which}, the top-level unknown field");
    let sections = |doc: &Value| -> Vec<Value> {
        ["primary", "secondary"].iter().map(|s| doc[*s].clone()).filter(Value::is_object).collect()
    };
    let locks = |doc: &Value| -> Vec<Value> {
        sections(doc).into_iter().map(|s| s["lock"].clone()).filter(Value::is_object).collect()
    };
    for section in sections(before) {
        for kept in sections(after).iter().filter(|s| s["location"] == section["location"]) {
            assert_eq!(kept["futureSection"], section["futureSection"], "{name}: after {which}, {kept}");
        }
    }
    for lock in locks(before) {
        for kept in locks(after).iter().filter(|l| l["token"] == lock["token"]) {
            assert_eq!(kept["futureLock"], lock["futureLock"], "{name}: after {which}, {kept}");
        }
    }
    let records = |doc: &Value| doc["operations"].as_array().cloned().unwrap_or_default();
    for record in records(before) {
        for kept in records(after).iter().filter(|r| r["key"] == record["key"]) {
            assert_eq!(kept["futureRecord"], record["futureRecord"], "{name}: after {which}, {kept}");
        }
    }
    // A lock call keeps every force-release record as it was, unknown fields included.
    let requests = |doc: &Value| doc["forceReleases"].as_array().cloned().unwrap_or_default();
    assert_eq!(requests(after).len(), requests(before).len(), "{name}: after {which}, the force-release records");
    for request in requests(before) {
        for kept in requests(after).iter().filter(|r| r["id"] == request["id"]) {
            assert_eq!(*kept, request, "{name}: after {which}, {kept}");
        }
    }
}

#[tokio::test]
async fn fields_a_newer_writer_added_at_any_level_change_no_decision_and_survive_every_write() {
    let mut checked = 0;
    for case in cases() {
        let variant = with_unknown_fields(&case.stored);
        for (which, json) in replay(&case, &variant).await {
            check_written_format(&case, &which, &json);
            check_unknown_fields_kept(&case.name, &which, &variant, &json);
            checked += 1;
        }
    }
    assert!(checked >= 12, "only {checked} lock calls succeeded over the whole corpus");
}

#[tokio::test]
async fn a_format_newer_than_the_library_reads_is_refused_and_never_written() {
    let newer = FORMATS_READ.end() + 1;
    for case in cases() {
        let mut stored = with_unknown_fields(&case.stored);
        stored["schemaVersion"] = json!(newer);
        let id = stored["id"].as_str().expect("an id").to_owned();
        let (_, store, client) = seeded(&case, &stored);
        let logged = store.changes_logged();
        let refused = |r: &Result<(), RoutingError>| matches!(r, Err(RoutingError::Document(DocumentError::UnsupportedSchema { found, .. })) if *found == newer);
        let read = client.resolve(&id).await.map(drop);
        assert!(refused(&read), "{}: a route read of format {newer}: {read:?}", case.name);
        for which in CALLS {
            let outcome = call(&client, &case, &stored, which).await;
            assert!(refused(&outcome), "{}: {which} on format {newer}: {outcome:?}", case.name);
        }
        assert_eq!(store.changes_logged(), logged, "{}: a document of format {newer} was written", case.name);
    }
}

/// The service's side of the same policy (docs/contract.md, "Versions"): a document in
/// a format this build does not read is refused on every route, user operation and lock
/// call with the contract's `unsupported-document`, on every instance, and never
/// written. Reads are refused too: a newer format may have changed where the data lives.
#[tokio::test]
async fn the_service_refuses_a_newer_format_on_every_call_and_writes_nothing() {
    let ttl = Duration::from_millis(200);
    let (running, store) = service::start_service_keeping_store(Vec::new(), ttl, ttl, &[]).await;
    let id = "probe-compat-newer-format";
    let token = LockToken::generate();
    let newer = json!({
        "id": id, "schemaVersion": FORMATS_READ.end() + 1, "migrating": true, "secondary": null,
        "primary": {"location": "westeurope", "lock": {"token": token.expose(), "phase": "write"}},
        "movedTo": {"region": "northeurope"}
    });
    store.put_raw(id, newer);
    let logged = store.changes_logged();
    let http = reqwest::Client::new();
    let bearer = format!("Bearer {}", running.key);
    let lease = json!({"token": token.expose(), "durationSeconds": 60});
    for url in &running.urls {
        let base = format!("{url}/v1/resources/{id}");
        let calls = [
            ("route", http.get(format!("{base}/route"))),
            ("read", http.get(format!("{base}/items/k"))),
            ("write", http.put(format!("{base}/items/k")).json(&json!({"value": 1}))),
            ("delete", http.delete(format!("{base}/items/k"))),
            (
                "pre-lock",
                http.post(format!("{base}/lock"))
                    .header("authorization", &bearer)
                    .json(&json!({"owner": "compat", "durationSeconds": 60})),
            ),
            (
                "escalate",
                http.post(format!("{base}/lock/escalate"))
                    .header("authorization", &bearer)
                    .json(&json!({"token": token.expose(), "phase": "hardDelete", "durationSeconds": 60})),
            ),
            ("renew", http.post(format!("{base}/lock/renew")).header("authorization", &bearer).json(&lease)),
            (
                "swap",
                http.post(format!("{base}/lock/swap"))
                    .header("authorization", &bearer)
                    .json(&json!({"token": token.expose(), "targetLocation": "northeurope"})),
            ),
            (
                "release",
                http.delete(format!("{base}/lock"))
                    .header("authorization", &bearer)
                    .header("lock-token", token.expose()),
            ),
        ];
        for (what, request) in calls {
            let answer = request.send().await.unwrap_or_else(|e| panic!("{what} on {url}: {e}"));
            let status = answer.status().as_u16();
            let problem: Value = answer.json().await.unwrap_or_else(|e| panic!("{what} on {url}: {e}"));
            assert_eq!(
                (status, problem["type"].as_str()),
                (500, Some("urn:lockprobe:error:unsupported-document")),
                "{what} on {url}: {problem}"
            );
        }
    }
    assert_eq!(store.changes_logged(), logged, "the service wrote over a document in a newer format");
}

/// The monitor's side of the same policy (docs/contract.md, "Versions"): it reads every
/// document of the corpus, and the same documents in a format newer than this build
/// reads are skipped and counted as `unsupported-format`, hiding none of the others,
/// through the change stream and through the scan.
#[tokio::test]
async fn the_monitor_reads_every_format_and_skips_a_newer_one_without_losing_the_rest() {
    let cases = cases();
    let clock = Arc::new(ManualClock::new(cases.iter().map(|c| c.committed).max().expect("a corpus")));
    let store = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    let mut newer_ids = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        // Ids made unique across formats (two formats' files may share one).
        let id = format!("{i:03}-{}", case.stored["id"].as_str().expect("an id"));
        let mut readable = case.stored.clone();
        readable["id"] = json!(id);
        let mut newer = with_unknown_fields(&readable);
        let newer_id = format!("{id}-newer");
        newer["id"] = json!(newer_id);
        newer["schemaVersion"] = json!(FORMATS_READ.end() + 1);
        store.put_raw(&id, readable);
        store.put_raw(&newer_id, newer);
        newer_ids.push(newer_id);
    }
    let config = MonitorConfig { scan_page: 3, poll_batch: 3, ..MonitorConfig::default() };
    let monitor = Monitor::new(store.clone(), clock, config, &prometheus::Registry::new()).unwrap();
    assert_eq!(monitor.drain().await.unwrap(), 2 * cases.len(), "every version read from the stream");
    let report = monitor.scan_once().await.unwrap();
    assert_eq!((report.documents, report.unreadable), (cases.len(), cases.len()), "the scan read past each one");
    let status = monitor.status();
    assert_eq!(status.unreadable_documents, cases.len());
    let listed: Vec<&str> = status.unreadable.iter().map(|u| u.resource.as_str()).collect();
    newer_ids.sort();
    assert_eq!(listed, newer_ids.iter().take(listed.len()).map(String::as_str).collect::<Vec<_>>());
    assert!(status.unreadable.iter().all(|u| u.reason == "unsupported-format"), "{:?}", status.unreadable);
    assert_eq!(store.changes_logged(), 2 * cases.len() as u64, "the monitor wrote nothing");
}

/// A format's files record what a revision wrote; editing one would make the corpus
/// test what today's library writes instead. New formats add directories.
#[test]
fn committed_corpus_files_are_never_edited() {
    let root = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| Command::new("git").arg("-C").arg(root).args(args).output();
    let Ok(inside) = git(&["rev-parse", "--is-inside-work-tree"]) else {
        panic!("git is needed to check the corpus's history");
    };
    if !inside.status.success() {
        eprintln!("not a git checkout (a packaged source): the corpus's history cannot be checked here");
        return;
    }
    let history = git(&["log", "--format=%h %s", "--name-status", "--diff-filter=MDRT", "--", "tests/compat/"])
        .expect("git log runs");
    let history = String::from_utf8_lossy(&history.stdout);
    let diff =
        git(&["diff", "--name-only", "--diff-filter=MDRT", "HEAD", "--", "tests/compat/"]).expect("git diff runs");
    let changed: Vec<String> = String::from_utf8_lossy(&diff.stdout).lines().map(str::to_owned).collect();
    // The README describes the corpus; it may be edited.
    let edits: Vec<&str> = history.lines().filter(|l| !l.trim().is_empty() && !l.ends_with("README.md")).collect();
    let only_commit_lines = edits.iter().all(|l| !l.contains('\t'));
    assert!(only_commit_lines, "committed corpus files were edited, renamed or removed:\n{history}");
    assert!(changed.iter().all(|l| l.ends_with("README.md")), "corpus files edited in this checkout: {changed:?}");
}
