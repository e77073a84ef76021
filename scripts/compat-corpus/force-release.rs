//! Writes one directory of the compatibility corpus (`tests/compat/`) with the routing
//! library of the revision it is built in: every document exactly as that revision
//! stores it, and a manifest of what that revision itself decides on each one.
//!
//! Not part of the crate: `scripts/compat-corpus.sh` copies it into a worktree of the
//! revision as `examples/compat_corpus.rs` and runs it once. This copy is `current.rs`
//! plus force-release (`RoutingClient::force_release`, from bda0220 on): the documents
//! `current.rs` writes, and three that hold `forceReleases` records (a request waiting
//! for its approval, a lock two principals removed, an approval made void by an
//! escalation).
//!
//! Usage: `cargo run --example compat_corpus -- <out dir> <revision>`

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use lockprobe::clock::{Clock, ManualClock};
use lockprobe::routing::cache::TieredCache;
use lockprobe::routing::force_release::{AdminCall, ForceReleaseRequest};
use lockprobe::routing::{
    enforce, ClientOptions, Decision, LocationDocument, LockPolicy, LockToken, Operation, Phase, PreLockRequest,
    RoutingClient, RoutingError,
};
use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
use lockprobe::store::{LocationStore, ReadFrom};
use serde_json::{json, Value};

/// The declaration every document of the corpus is written and judged under.
const TTL: Duration = Duration::from_secs(4);
const LAG: Duration = Duration::from_secs(3);
const MAX_PRE_LOCK: Duration = Duration::from_secs(7200);

fn policy() -> LockPolicy {
    LockPolicy::declared(TTL, LAG, MAX_PRE_LOCK)
}

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 0, 0, 0).single().expect("a valid instant")
}

fn client(clock: &Arc<ManualClock>, store: &Arc<MemoryStore>) -> RoutingClient {
    RoutingClient::new(
        store.clone(),
        clock.clone(),
        TieredCache::try_new(&[TTL]).expect("a valid TTL"),
        policy(),
        ClientOptions::default(),
    )
}

fn request(owner: &str, secs: u64, target: Option<&str>) -> PreLockRequest {
    PreLockRequest { owner: owner.into(), duration: Duration::from_secs(secs), target_location: target.map(Into::into) }
}

fn outcome<T>(result: Result<T, RoutingError>) -> Value {
    match result {
        Ok(_) => json!("ok"),
        Err(e) => json!(format!("refused: {e:?}")),
    }
}

fn decision(d: Decision) -> &'static str {
    match d {
        Decision::Allow => "allow",
        Decision::Block { .. } => "block",
        Decision::Tombstone => "tombstone",
    }
}

/// What this revision's library decides on `stored`, committed at `committed` and read
/// at `read_at`: the route, the user operations, and every lock call, each on a fresh
/// store holding only this document.
async fn judge(stored: &Value, committed: DateTime<Utc>, read_at: DateTime<Utc>) -> Value {
    let id = stored["id"].as_str().expect("an id").to_owned();
    let token = stored["primary"]["lock"]["token"].as_str().map(LockToken::from_presented);
    let located = stored["primary"]["location"].as_str().expect("a location").to_owned();
    let elsewhere = if located == "northeurope" { "westeurope" } else { "northeurope" };
    let seeded = || {
        let clock = Arc::new(ManualClock::new(committed));
        let store = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
        store.put_raw(&id, stored.clone());
        clock.set(read_at);
        let client = client(&clock, &store);
        (clock, store, client)
    };

    let (clock, _store, c) = seeded();
    let route = c.resolve(&id).await.expect("the writer reads its own document");
    let skew = c.policy().skew_margin;
    let lock = route.lock().filter(|l| clock.now() < l.expires_at);
    let mut calls = serde_json::Map::new();
    let any_token = token.clone().unwrap_or_else(LockToken::generate);
    let minute = Duration::from_secs(60);
    let (_, _, c) = seeded();
    calls.insert("preLock".into(), outcome(c.pre_lock(&id, &request("compat-newcomer", 600, None)).await));
    let (_, _, c) = seeded();
    calls.insert("escalateHardDelete".into(), outcome(c.escalate(&id, &any_token, Phase::HardDelete, minute).await));
    let (_, _, c) = seeded();
    calls.insert("escalateWrite".into(), outcome(c.escalate(&id, &any_token, Phase::Write, minute).await));
    let (_, _, c) = seeded();
    calls.insert("renew".into(), outcome(c.renew(&id, &any_token, minute).await));
    let (_, _, c) = seeded();
    calls.insert("swap".into(), outcome(c.swap(&id, &any_token, elsewhere).await));
    let (_, _, c) = seeded();
    calls.insert("release".into(), outcome(c.release(&id, &any_token).await));
    json!({
        "location": route.location(),
        "lockPhase": lock.map(|l| l.phase.as_str()),
        "read": decision(enforce(Operation::Read, route.lock(), clock.now(), skew)),
        "write": decision(enforce(Operation::Write, route.lock(), clock.now(), skew)),
        "delete": decision(enforce(Operation::Delete, route.lock(), clock.now(), skew)),
        "swapTarget": elsewhere,
        "calls": calls,
    })
}

struct Corpus {
    dir: PathBuf,
    entries: Vec<Value>,
}

impl Corpus {
    /// Saves what `store` holds for `id` now as `<name>.json`, to be judged at `read_at`.
    async fn save(&mut self, name: &str, clock: &ManualClock, store: &MemoryStore, id: &str, read_at: DateTime<Utc>) {
        let committed = clock.now();
        let stored = store.read(id, ReadFrom::WriteRegion).await.expect("just written").doc.to_json();
        let file = format!("{name}.json");
        let text = serde_json::to_string_pretty(&stored).expect("JSON") + "\n";
        std::fs::write(self.dir.join(&file), text).expect("write the document");
        let expected = judge(&stored, committed, read_at).await;
        self.entries.push(json!({
            "file": file,
            "committedAt": committed,
            "readAt": read_at,
            "expected": expected,
        }));
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(out), Some(revision)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: compat_corpus <out dir> <revision>");
        std::process::exit(64);
    };
    let dir = Path::new(out).to_path_buf();
    std::fs::create_dir_all(&dir).expect("create the output directory");
    let mut corpus = Corpus { dir: dir.clone(), entries: Vec::new() };
    let clock = Arc::new(ManualClock::new(start()));
    let store = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    let c = client(&clock, &store);
    let later = |by: u64| clock.now() + chrono::TimeDelta::seconds(by as i64);

    // A whole migration of one resource, saved at every phase.
    let id = "compat-migration";
    store.create(&LocationDocument::new(id, "westeurope")).await.expect("create");
    corpus.save("unlocked", &clock, &store, id, later(1)).await;
    clock.advance(secs(10));
    let grant = c.pre_lock(id, &request("compat-orchestrator", 600, Some("northeurope"))).await.expect("pre-lock");
    corpus.save("prelock", &clock, &store, id, later(10)).await;
    clock.advance(secs(10));
    c.escalate(id, &grant.token, Phase::HardDelete, secs(120)).await.expect("hardDelete");
    corpus.save("harddelete", &clock, &store, id, later(1)).await;
    clock.advance(secs(1));
    c.escalate(id, &grant.token, Phase::Write, secs(60)).await.expect("write");
    corpus.save("write", &clock, &store, id, later(1)).await;
    clock.advance(secs(1));
    c.swap(id, &grant.token, "northeurope").await.expect("swap");
    corpus.save("swapped", &clock, &store, id, later(1)).await;

    // A pre-lock released by its holder.
    let id = "compat-released";
    clock.advance(secs(100));
    store.create(&LocationDocument::new(id, "westeurope")).await.expect("create");
    let grant = c.pre_lock(id, &request("compat-orchestrator", 600, None)).await.expect("pre-lock");
    clock.advance(secs(1));
    c.release(id, &grant.token).await.expect("release");
    corpus.save("released", &clock, &store, id, later(1)).await;

    // A pre-lock whose lease lapsed before it was read.
    let id = "compat-lapsed";
    clock.advance(secs(100));
    store.create(&LocationDocument::new(id, "westeurope")).await.expect("create");
    c.pre_lock(id, &request("compat-orchestrator", 30, None)).await.expect("pre-lock");
    corpus.save("lapsed", &clock, &store, id, later(60)).await;

    // A pre-lock under an idempotency key: its operation record is kept in the document.
    let id = "compat-keyed";
    clock.advance(secs(100));
    c.pre_lock_with_key(id, "westeurope", &request("compat-orchestrator", 600, None), Some("compat-key-1"))
        .await
        .expect("keyed pre-lock");
    corpus.save("keyed-prelock", &clock, &store, id, later(10)).await;

    // Force-release: a request waiting for its approval, a lock two principals removed,
    // and an approval made void by an escalation in between.
    let ask = |id: &str, token: &LockToken, phase: Phase| {
        AdminCall::Request(ForceReleaseRequest {
            id: format!("{id}-request"),
            lock: token.digest(),
            phase,
            requested_by: "compat-alice".into(),
            reason: "compat: the holder's journal is lost".into(),
        })
    };
    let approve = |id: &str| AdminCall::Approve { id: format!("{id}-request"), principal: "compat-bob".into() };

    let id = "compat-force-requested";
    clock.advance(secs(100));
    store.create(&LocationDocument::new(id, "westeurope")).await.expect("create");
    let grant = c.pre_lock(id, &request("compat-orchestrator", 600, None)).await.expect("pre-lock");
    clock.advance(secs(10));
    c.force_release(id, &ask(id, &grant.token, Phase::PreLock)).await.expect("request");
    corpus.save("force-release-requested", &clock, &store, id, later(10)).await;

    let id = "compat-force-released";
    clock.advance(secs(100));
    store.create(&LocationDocument::new(id, "westeurope")).await.expect("create");
    let grant = c.pre_lock(id, &request("compat-orchestrator", 600, Some("northeurope"))).await.expect("pre-lock");
    clock.advance(secs(10));
    c.escalate(id, &grant.token, Phase::HardDelete, secs(120)).await.expect("hardDelete");
    clock.advance(secs(1));
    c.force_release(id, &ask(id, &grant.token, Phase::HardDelete)).await.expect("request");
    clock.advance(secs(1));
    c.force_release(id, &approve(id)).await.expect("approval");
    corpus.save("force-released", &clock, &store, id, later(10)).await;

    let id = "compat-force-void";
    clock.advance(secs(100));
    store.create(&LocationDocument::new(id, "westeurope")).await.expect("create");
    let grant = c.pre_lock(id, &request("compat-orchestrator", 600, None)).await.expect("pre-lock");
    clock.advance(secs(10));
    c.force_release(id, &ask(id, &grant.token, Phase::PreLock)).await.expect("request");
    clock.advance(secs(1));
    c.escalate(id, &grant.token, Phase::HardDelete, secs(120)).await.expect("hardDelete");
    clock.advance(secs(1));
    c.force_release(id, &approve(id)).await.expect("a void approval is written");
    corpus.save("force-release-void", &clock, &store, id, later(1)).await;

    let manifest = json!({
        "writtenBy": revision,
        "library": env!("CARGO_PKG_VERSION"),
        "declaration": { "cacheTtlSeconds": TTL.as_secs(), "replicationBoundSeconds": LAG.as_secs(),
                         "maxPreLockSeconds": MAX_PRE_LOCK.as_secs() },
        "documents": corpus.entries,
    });
    let text = serde_json::to_string_pretty(&manifest).expect("JSON") + "\n";
    std::fs::write(dir.join("manifest.json"), text).expect("write the manifest");
    println!("compat_corpus: wrote {} documents to {}", manifest["documents"].as_array().map_or(0, Vec::len), out);
}
