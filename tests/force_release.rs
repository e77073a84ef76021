//! Force-release through the reference service's admin routes (contract 1.4), over real
//! HTTP on loopback, in both lock designs: two principals, each with its own key; one
//! requests, the other approves; the old holder is refused on every instance; what
//! cannot be approved is refused with a stable problem type; a restart of every
//! instance between request and approval loses nothing.
//!
//! Time is a manual clock shared by the store and every instance.

#[path = "support/stores.rs"]
mod stores;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lockprobe::clock::ManualClock;
use lockprobe::routing::lifecycle::DEFAULT_SKEW_MARGIN;
use lockprobe::service::AdminPrincipal;
use lockprobe::service::{start, LockDesign, ServiceConfig};
use lockprobe::store::memory::MemoryStoreConfig;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const KEY: &str = "lock-api-key";
/// The lock API key of the service binary the admin command is tried on.
const CLI_KEY: &str = "lock-api-key-for-the-cli";
const ALICE: &str = "alice-admin-key-0001";
const BOB: &str = "bob-admin-key-00002";
/// Scoped to `probe-a`: may not act on `probe-b`.
const CAROL: &str = "carol-admin-key-0003";
const TTL: Duration = Duration::from_secs(2);
const BOUND: Duration = Duration::from_secs(1);
const CONVERGED: Duration =
    Duration::from_millis(TTL.as_millis() as u64 + BOUND.as_millis() as u64 + DEFAULT_SKEW_MARGIN.as_millis() as u64);
const WINDOW: Duration = Duration::from_secs(600);

fn principal(name: &str, key: &str, prefixes: &[&str]) -> AdminPrincipal {
    AdminPrincipal { name: name.into(), key: key.into(), prefixes: prefixes.iter().map(|p| p.to_string()).collect() }
}

fn config(design: LockDesign) -> ServiceConfig {
    ServiceConfig {
        cache_ttls: vec![TTL],
        replication_bound: BOUND,
        test_prefix: Some("probe-".into()),
        max_pre_lock: Duration::from_secs(3600),
        lock_design: design,
        admin_principals: vec![
            principal("alice", ALICE, &[]),
            principal("bob", BOB, &[]),
            principal("carol", CAROL, &["probe-a"]),
        ],
        force_release_window: WINDOW,
        ..ServiceConfig::new(KEY)
    }
}

struct Harness {
    clock: Arc<ManualClock>,
    store: stores::Instrumented,
    design: LockDesign,
    urls: Vec<String>,
    http: reqwest::Client,
    shutdown: CancellationToken,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

struct Answer {
    status: StatusCode,
    body: Value,
}

impl Answer {
    fn problem(&self) -> &str {
        self.body["type"].as_str().map_or("<none>", |t| t.trim_start_matches("urn:lockprobe:error:"))
    }
}

impl Harness {
    async fn new(design: LockDesign) -> Self {
        let clock = Arc::new(ManualClock::at_epoch());
        let store =
            stores::Instrumented::new(clock.clone(), MemoryStoreConfig { replica_lag: BOUND, ..Default::default() });
        let mut h = Self {
            clock,
            store,
            design,
            urls: Vec::new(),
            http: reqwest::Client::new(),
            shutdown: CancellationToken::new(),
        };
        h.restart().await;
        h
    }

    /// Stops every instance and starts two new ones over the same store: nothing the
    /// instances held in memory survives.
    async fn restart(&mut self) {
        self.shutdown.cancel();
        self.shutdown = CancellationToken::new();
        let listen = vec!["127.0.0.1:0".parse::<SocketAddr>().unwrap(); 2];
        let running = start(config(self.design), self.store.store(), self.clock.clone(), listen, self.shutdown.clone())
            .await
            .unwrap();
        self.urls = running.addrs.iter().map(|a| format!("http://{a}")).collect();
    }

    async fn call(
        &self,
        instance: usize,
        method: Method,
        path: &str,
        body: Option<Value>,
        key: Option<&str>,
    ) -> Answer {
        let mut req = self.http.request(method, format!("{}{path}", self.urls[instance]));
        if let Some(key) = key {
            req = req.bearer_auth(key);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        let body = if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap() };
        Answer { status, body }
    }

    async fn lock_call(&self, i: usize, id: &str, suffix: &str, body: Value) -> Answer {
        self.call(i, Method::POST, &format!("/v1/resources/{id}/lock{suffix}"), Some(body), Some(KEY)).await
    }

    async fn admin_view(&self, i: usize, id: &str, key: &str) -> Answer {
        self.call(i, Method::GET, &format!("/v1/resources/{id}/lock/force-release"), None, Some(key)).await
    }

    async fn request(&self, i: usize, id: &str, key: &str, fingerprint: &str, phase: &str) -> Answer {
        let body = json!({"lockFingerprint": fingerprint, "phase": phase, "reason": "orchestrator lost its journal"});
        self.call(i, Method::POST, &format!("/v1/resources/{id}/lock/force-release"), Some(body), Some(key)).await
    }

    async fn approve(&self, i: usize, id: &str, request: &str, key: &str) -> Answer {
        let path = format!("/v1/resources/{id}/lock/force-release/{request}/approve");
        self.call(i, Method::POST, &path, None, Some(key)).await
    }

    /// A pre-lock to `northeurope`, converged and escalated to `phase`; its token.
    async fn locked(&self, id: &str, phase: &str) -> String {
        let body = json!({"owner": "migration-7", "durationSeconds": 1800, "targetLocation": "northeurope"});
        let granted = self.lock_call(0, id, "", body).await;
        assert_eq!(granted.status, StatusCode::CREATED, "{}", granted.body);
        let token = granted.body["token"].as_str().unwrap().to_owned();
        self.clock.advance(CONVERGED);
        for next in ["hardDelete", "write"] {
            if phase == "preLock" || (phase == "hardDelete" && next == "write") {
                break;
            }
            let body = json!({"token": token, "phase": next, "durationSeconds": 600});
            let answer = self.lock_call(0, id, "/escalate", body).await;
            assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
        }
        token
    }

    async fn fingerprint(&self, id: &str) -> String {
        let view = self.admin_view(1, id, BOB).await;
        assert_eq!(view.status, StatusCode::OK, "{}", view.body);
        view.body["lock"]["fingerprint"].as_str().unwrap().to_owned()
    }
}

#[tokio::test]
async fn two_principals_release_a_stuck_lock_and_its_holder_is_refused_on_every_instance() {
    for design in [LockDesign::Embedded, LockDesign::Record] {
        let h = Harness::new(design).await;
        let id = "probe-a1";
        let token = h.locked(id, "write").await;
        // What an operator sees before asking: the lock, never its token.
        let view = h.admin_view(0, id, ALICE).await;
        assert_eq!(view.status, StatusCode::OK, "{design:?}: {}", view.body);
        assert_eq!(view.body["lock"]["phase"], "write", "{design:?}");
        assert_eq!(view.body["lock"]["owner"], "migration-7", "{design:?}");
        assert!(!view.body.to_string().contains(&token), "{design:?}: the admin view shows a token");
        let fingerprint = h.fingerprint(id).await;

        let requested = h.request(0, id, ALICE, &fingerprint, "write").await;
        assert_eq!(requested.status, StatusCode::CREATED, "{design:?}: {}", requested.body);
        assert_eq!(requested.body["request"]["status"], "requested");
        assert_eq!(requested.body["request"]["requestedBy"], "alice");
        let request = requested.body["request"]["id"].as_str().unwrap().to_owned();

        // One principal never approves its own request.
        let own = h.approve(1, id, &request, ALICE).await;
        assert_eq!((own.status, own.problem()), (StatusCode::FORBIDDEN, "self-approval"), "{design:?}: {}", own.body);

        let approved = h.approve(1, id, &request, BOB).await;
        assert_eq!(approved.status, StatusCode::OK, "{design:?}: {}", approved.body);
        assert_eq!(approved.body["request"]["status"], "released");
        assert_eq!(approved.body["request"]["approvedBy"], "bob");
        // Repeated, the same approval answers the same; a third person finds it decided.
        assert_eq!(h.approve(0, id, &request, BOB).await.status, StatusCode::OK, "{design:?}");
        let third = h.approve(0, id, &request, CAROL).await;
        assert_eq!((third.status, third.problem()), (StatusCode::CONFLICT, "force-release-decided"), "{design:?}");

        // The old holder: escalate, renew, swap and release refused on both instances.
        for i in 0..2 {
            let renew = h.lock_call(i, id, "/renew", json!({"token": token, "durationSeconds": 60})).await;
            assert_eq!((renew.status, renew.problem()), (StatusCode::GONE, "lock-force-released"), "{design:?} {i}");
            let swap = h.lock_call(i, id, "/swap", json!({"token": token, "targetLocation": "northeurope"})).await;
            assert_eq!((swap.status, swap.problem()), (StatusCode::GONE, "lock-force-released"), "{design:?} {i}");
            let escalate =
                h.lock_call(i, id, "/escalate", json!({"token": token, "phase": "write", "durationSeconds": 60})).await;
            assert_eq!(escalate.status, StatusCode::GONE, "{design:?} {i}: {}", escalate.body);
            let release = h
                .http
                .delete(format!("{}/v1/resources/{id}/lock", h.urls[i]))
                .bearer_auth(KEY)
                .header("lock-token", &token)
                .send()
                .await
                .unwrap();
            assert_eq!(release.status(), StatusCode::GONE, "{design:?} {i}");
        }
        // The location stayed; once caches converge, users write again on every instance.
        h.clock.advance(CONVERGED);
        for i in 0..2 {
            let path = format!("/v1/resources/{id}/items/k{i}");
            let write = h.call(i, Method::PUT, &path, Some(json!({"value": i})), None).await;
            assert!(write.status.is_success(), "{design:?} {i}: {} {}", write.status, write.body);
            let route = h.call(i, Method::GET, &format!("/v1/resources/{id}/route"), None, None).await;
            assert_eq!(route.body["location"], "westeurope", "{design:?} {i}");
            assert_eq!(route.body["lock"], Value::Null, "{design:?} {i}");
        }
        // The audit trail.
        let view = h.admin_view(0, id, CAROL).await;
        assert_eq!(view.body["lock"], Value::Null);
        assert_eq!(view.body["requests"][0]["status"], "released");
        assert_eq!(view.body["requests"][0]["reason"], "orchestrator lost its journal");
    }
}

#[tokio::test]
async fn an_approval_after_the_lock_changed_is_void() {
    let h = Harness::new(LockDesign::Embedded).await;
    let id = "probe-a2";
    let token = h.locked(id, "preLock").await;
    let fingerprint = h.fingerprint(id).await;
    let request =
        h.request(0, id, ALICE, &fingerprint, "preLock").await.body["request"]["id"].as_str().unwrap().to_owned();
    // A renewal keeps the request; an escalation voids it.
    let renew = h.lock_call(0, id, "/renew", json!({"token": token, "durationSeconds": 60})).await;
    assert_eq!(renew.status, StatusCode::OK, "{}", renew.body);
    let escalate =
        h.lock_call(0, id, "/escalate", json!({"token": token, "phase": "hardDelete", "durationSeconds": 60})).await;
    assert_eq!(escalate.status, StatusCode::OK, "{}", escalate.body);
    let void = h.approve(1, id, &request, BOB).await;
    assert_eq!((void.status, void.problem()), (StatusCode::CONFLICT, "force-release-void"), "{}", void.body);
    let view = h.admin_view(0, id, ALICE).await;
    assert_eq!(view.body["lock"]["phase"], "hardDelete", "a void approval removes nothing");
    assert_eq!(view.body["requests"][0]["status"], "void");
    // The holder goes on.
    let renew = h.lock_call(1, id, "/renew", json!({"token": token, "durationSeconds": 60})).await;
    assert_eq!(renew.status, StatusCode::OK, "{}", renew.body);
    // A request naming the lock as it no longer is: refused, nothing recorded.
    let stale = h.request(0, id, ALICE, &fingerprint, "preLock").await;
    assert_eq!((stale.status, stale.problem()), (StatusCode::CONFLICT, "force-release-target-changed"));
}

#[tokio::test]
async fn a_restart_of_every_instance_between_request_and_approval_loses_nothing() {
    for design in [LockDesign::Embedded, LockDesign::Record] {
        let mut h = Harness::new(design).await;
        let id = "probe-a3";
        let token = h.locked(id, "hardDelete").await;
        let fingerprint = h.fingerprint(id).await;
        let request = h.request(0, id, ALICE, &fingerprint, "hardDelete").await.body["request"]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        h.restart().await;
        let view = h.admin_view(1, id, BOB).await;
        assert_eq!(view.body["requests"][0]["status"], "requested", "{design:?}: {}", view.body);
        let approved = h.approve(1, id, &request, BOB).await;
        assert_eq!(approved.status, StatusCode::OK, "{design:?}: {}", approved.body);
        h.restart().await;
        let renew = h.lock_call(0, id, "/renew", json!({"token": token, "durationSeconds": 60})).await;
        assert_eq!((renew.status, renew.problem()), (StatusCode::GONE, "lock-force-released"), "{design:?}");
    }
}

#[tokio::test]
async fn admin_routes_need_an_admin_key_in_scope_and_refuse_what_cannot_be_decided() {
    let h = Harness::new(LockDesign::Embedded).await;
    let id = "probe-b1";
    h.locked(id, "preLock").await;
    let path = format!("/v1/resources/{id}/lock/force-release");
    let none = h.call(0, Method::GET, &path, None, None).await;
    assert_eq!((none.status, none.problem()), (StatusCode::UNAUTHORIZED, "unauthorized"));
    // The lock API's key is not an admin key, and an admin key is not the lock API's.
    let lock_key = h.call(0, Method::GET, &path, None, Some(KEY)).await;
    assert_eq!((lock_key.status, lock_key.problem()), (StatusCode::FORBIDDEN, "forbidden"));
    let admin_on_lock_api = h.lock_call(0, id, "", json!({"owner": "x", "durationSeconds": 60})).await;
    assert_eq!(admin_on_lock_api.status, StatusCode::LOCKED, "the lock API still answers its own key");
    let as_admin = h
        .http
        .post(format!("{}/v1/resources/{id}/lock", h.urls[0]))
        .bearer_auth(ALICE)
        .json(&json!({"owner": "x", "durationSeconds": 60}))
        .send()
        .await
        .unwrap();
    assert_eq!(as_admin.status(), StatusCode::FORBIDDEN);
    // Carol is scoped to probe-a; nobody acts outside the service's test prefix.
    let out = h.admin_view(0, id, CAROL).await;
    assert_eq!((out.status, out.problem()), (StatusCode::FORBIDDEN, "admin-out-of-scope"));
    let prod = h.admin_view(0, "prod-1", ALICE).await;
    assert_eq!((prod.status, prod.problem()), (StatusCode::FORBIDDEN, "admin-out-of-scope"));

    let fingerprint = h.fingerprint(id).await;
    let bad = h.request(0, id, ALICE, "not-a-fingerprint", "preLock").await;
    assert_eq!((bad.status, bad.problem()), (StatusCode::BAD_REQUEST, "bad-request"));
    let bad_phase = h.request(0, id, ALICE, &fingerprint, "swap").await;
    assert_eq!((bad_phase.status, bad_phase.problem()), (StatusCode::BAD_REQUEST, "bad-request"));
    let unknown = h.approve(0, id, "nosuchrequest", BOB).await;
    assert_eq!((unknown.status, unknown.problem()), (StatusCode::NOT_FOUND, "force-release-not-found"));
    let request =
        h.request(0, id, ALICE, &fingerprint, "preLock").await.body["request"]["id"].as_str().unwrap().to_owned();
    h.clock.advance(WINDOW + Duration::from_secs(1));
    let late = h.approve(0, id, &request, BOB).await;
    assert_eq!((late.status, late.problem()), (StatusCode::GONE, "force-release-expired"), "{}", late.body);
    assert_eq!(h.admin_view(0, id, BOB).await.body["requests"][0]["status"], "expired");
}

/// A swap whose copy is prepared (`prepare_swap` is waiting out the decision age) when
/// the lock is force-released copies nothing to the target and is refused.
#[tokio::test]
async fn a_swap_prepared_before_the_force_release_copies_nothing() {
    use axum::body::Body;
    use axum::http::Request;
    use lockprobe::service::ItemStores;
    use lockprobe::service::{instance, router};
    use lockprobe::store::memory::MemoryStore;
    use lockprobe::store::LocationStore;
    use tower::ServiceExt;

    let clock = Arc::new(ManualClock::at_epoch());
    let store: Arc<dyn LocationStore> = Arc::new(MemoryStore::new(clock.clone(), MemoryStoreConfig::default()));
    let items = Arc::new(ItemStores::default());
    // A decision age of 2 s: the swap's copy waits that long (real time) after the write
    // lock began, which is when the operators act.
    let config = Arc::new(ServiceConfig { max_decision_age: Duration::from_secs(2), ..config(LockDesign::Embedded) });
    let app = router(instance(0, config, store, clock.clone(), items.clone()).unwrap());
    let call = |method: &str, path: String, key: &str, body: Value| {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let app = app.clone();
        async move {
            let answer = app.oneshot(req).await.unwrap();
            let status = answer.status().as_u16();
            let bytes = axum::body::to_bytes(answer.into_body(), 1 << 16).await.unwrap();
            (status, serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null))
        }
    };
    let id = "probe-a4";
    let (status, _) = call("PUT", format!("/v1/resources/{id}/items/k"), KEY, json!({"value": 1})).await;
    assert_eq!(status, 201);
    let body = json!({"owner": "o", "durationSeconds": 600, "targetLocation": "northeurope"});
    let (status, pre) = call("POST", format!("/v1/resources/{id}/lock"), KEY, body).await;
    assert_eq!(status, 201, "{pre}");
    let token = pre["token"].as_str().unwrap().to_owned();
    clock.advance(CONVERGED);
    for phase in ["hardDelete", "write"] {
        let body = json!({"token": token, "phase": phase, "durationSeconds": 600});
        assert_eq!(call("POST", format!("/v1/resources/{id}/lock/escalate"), KEY, body).await.0, 200);
    }
    let swap = tokio::spawn(call(
        "POST",
        format!("/v1/resources/{id}/lock/swap"),
        KEY,
        json!({"token": token, "targetLocation": "northeurope"}),
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!swap.is_finished(), "the swap's copy waits out the decision age");
    let (_, view) = call("GET", format!("/v1/resources/{id}/lock/force-release"), ALICE, Value::Null).await;
    let fingerprint = view["lock"]["fingerprint"].as_str().unwrap().to_owned();
    let body = json!({"lockFingerprint": fingerprint, "phase": "write", "reason": "stuck swap"});
    let (status, requested) = call("POST", format!("/v1/resources/{id}/lock/force-release"), ALICE, body).await;
    assert_eq!(status, 201, "{requested}");
    let request = requested["request"]["id"].as_str().unwrap();
    let approve = format!("/v1/resources/{id}/lock/force-release/{request}/approve");
    let (status, approved) = call("POST", approve, BOB, Value::Null).await;
    assert_eq!(status, 200, "{approved}");
    assert!(!swap.is_finished(), "the force-release landed while the swap waited");
    let (status, refused) = swap.await.unwrap();
    assert_eq!((status, refused["type"].as_str()), (410, Some("urn:lockprobe:error:lock-force-released")), "{refused}");
    assert_eq!(items.get("northeurope", id, "k"), None, "a fenced swap copied to the target");
    assert_eq!(items.get("westeurope", id, "k").map(|i| i.value), Some(json!(1)));
}

/// `lockprobe service` with two admin principals and `lockprobe admin force-release`
/// against it, as an operator runs them: the lock shown before asking, a request by one
/// principal, the approval by the other (the requester's own refused, exit 1), the audit
/// record printed; bad flags exit 64 naming them, on both commands.
#[tokio::test]
async fn the_admin_command_releases_a_lock_through_the_service_binary() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().unwrap();
    let key_file = |name: &str, key: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{key}\n")).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let (alice, bob) = (key_file("alice.key", ALICE), key_file("bob.key", BOB));
    let bin = env!("CARGO_BIN_EXE_lockprobe");
    let service_args = |extra: &[&str]| {
        let mut args: Vec<String> = ["service", "--listen", "127.0.0.1:0", "--cache-ttl", "100ms"]
            .into_iter()
            .chain(["--replication-bound", "0s", "--skew-margin", "50ms", "--test-prefix", "probe-"])
            .map(str::to_owned)
            .collect();
        args.extend([
            "--admin-key-file".into(),
            format!("alice={alice}"),
            "--admin-key-file".into(),
            format!("bob={bob}"),
        ]);
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    // Refused at start, naming the flag: a principal without a readable file, two
    // principals with one key, a prefix for nobody, the lock API's key as an admin key.
    // Long enough to pass for an admin key: only its being the lock API's refuses it.
    let lock_key_file = key_file("lock.key", CLI_KEY);
    for (extra, named) in [
        (vec!["--admin-key-file", "carol=/nonexistent/carol.key"], "--admin-key-file carol"),
        (vec!["--admin-key-file", &*format!("carol={alice}")], "the same key as alice"),
        (vec!["--admin-prefix", "dave=probe-"], "--admin-prefix"),
        (vec!["--admin-key-file", &*format!("lockkey={lock_key_file}")], "the lock API's key"),
        (vec!["--admin-key-file", "no good=x"], "--admin-key-file"),
    ] {
        let out = Command::new(bin).args(service_args(&extra)).env("LOCKPROBE_LOCK_API_KEY", CLI_KEY).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{extra:?}: {stderr}");
        assert!(stderr.contains(named), "{extra:?}: {stderr}");
    }

    let mut child = Command::new(bin)
        .args(service_args(&[]))
        .env("LOCKPROBE_LOCK_API_KEY", CLI_KEY)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines().map_while(Result::ok);
    let url = lines.by_ref().find_map(|l| l.split("listening on ").nth(1).map(str::to_owned)).expect("listening");
    std::thread::spawn(move || lines.for_each(drop));
    let _service = Kill(child);

    let http = reqwest::Client::new();
    let id = "probe-cli";
    let granted: Value = http
        .post(format!("{url}/v1/resources/{id}/lock"))
        .bearer_auth(CLI_KEY)
        .json(&json!({"owner": "migration-9", "durationSeconds": 600}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = granted["token"].as_str().unwrap().to_owned();

    let admin = |action: &str, key: &str, extra: &[&str]| {
        let out = Command::new(bin)
            .args(["admin", "force-release", action, "--endpoint", &url, "--resource", id, "--admin-key-file", key])
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, listed, _) = admin("list", &alice, &[]);
    assert_eq!(code, Some(0), "{listed}");
    assert!(listed.contains("phase preLock owner migration-9"), "{listed}");
    assert!(!listed.contains(&token), "the command shows a token: {listed}");

    let (code, requested, _) = admin("request", &alice, &["--reason", "orchestrator crashed"]);
    assert_eq!(code, Some(0), "{requested}");
    assert!(requested.contains("requested by alice"), "{requested}");
    let request = requested
        .lines()
        .find_map(|l| l.split("approve --request ").nth(1))
        .expect("the command names the request")
        .trim()
        .to_owned();

    let (code, own, _) = admin("approve", &alice, &["--request", &request]);
    assert_eq!(code, Some(1), "{own}");
    assert!(own.contains("refused: 403 self-approval"), "{own}");

    let (code, released, _) = admin("approve", &bob, &["--request", &request]);
    assert_eq!(code, Some(0), "{released}");
    assert!(released.contains("released:") && released.contains("approved by bob"), "{released}");
    assert!(released.contains("reason \"orchestrator crashed\""), "{released}");

    let renew = http
        .post(format!("{url}/v1/resources/{id}/lock/renew"))
        .bearer_auth(CLI_KEY)
        .json(&json!({"token": token, "durationSeconds": 60}))
        .send()
        .await
        .unwrap();
    assert_eq!(renew.status(), StatusCode::GONE);

    // Usage errors exit 64 naming the flag.
    let (code, _, err) = admin("list", "/nonexistent/key", &[]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("--admin-key-file"), "{err}");
    let out = Command::new(bin)
        .args(["admin", "force-release", "list", "--endpoint", "ftp://x", "--resource", id, "--admin-key-file", &alice])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--endpoint"));
}

/// Store faults on the approval's write: one that commits after the service gave up
/// (503 `outcome-unknown`, then found by the repeat), and one whose answer is lost after
/// it landed (resolved inside the service's own loop). Neither releases twice, neither
/// loses the release, and the old token is refused after both.
#[tokio::test]
async fn an_approval_whose_write_is_late_or_ambiguous_releases_once() {
    use lockprobe::store::OpKind;
    use lockprobe::testing::FaultAction;

    let h = Harness::new(LockDesign::Embedded).await;
    for (n, action) in [
        FaultAction::LateCommit { commit_after: Duration::from_millis(600), timeout: Duration::from_millis(200) },
        FaultAction::Ambiguous,
    ]
    .into_iter()
    .enumerate()
    {
        let id = format!("probe-f{n}");
        let token = h.locked(&id, "write").await;
        let fingerprint = h.fingerprint(&id).await;
        let request =
            h.request(0, &id, ALICE, &fingerprint, "write").await.body["request"]["id"].as_str().unwrap().to_owned();
        h.store.inject(OpKind::Replace, action.clone(), 1);
        let first = h.approve(1, &id, &request, BOB).await;
        if matches!(action, FaultAction::LateCommit { .. }) {
            assert_eq!(
                (first.status, first.problem()),
                (StatusCode::SERVICE_UNAVAILABLE, "outcome-unknown"),
                "{}",
                first.body
            );
            tokio::time::sleep(Duration::from_millis(800)).await;
            let again = h.approve(0, &id, &request, BOB).await;
            assert_eq!(again.status, StatusCode::OK, "{action:?}: {}", again.body);
        } else {
            assert_eq!(first.status, StatusCode::OK, "{action:?}: {}", first.body);
        }
        let view = h.admin_view(0, &id, ALICE).await;
        assert_eq!(view.body["lock"], Value::Null, "{action:?}");
        assert_eq!(view.body["requests"].as_array().unwrap().len(), 1, "{action:?}: {}", view.body);
        assert_eq!(view.body["requests"][0]["status"], "released", "{action:?}");
        let renew = h.lock_call(1, &id, "/renew", json!({"token": token, "durationSeconds": 60})).await;
        assert_eq!((renew.status, renew.problem()), (StatusCode::GONE, "lock-force-released"), "{action:?}");
    }
}
