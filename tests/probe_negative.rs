//! Probe logic against a small fake service that says yes to everything: every negative
//! check must fail (a check that cannot fail proves nothing), the probe must not crash,
//! and every lock it took must be released, including when the cycle is cancelled.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use lockprobe::probe::Metrics;
use lockprobe::probe::ProbeStatus;
use lockprobe::probe::Scenario;
use lockprobe::probe::StateFile;
use lockprobe::probe::TracingObserver;
use lockprobe::probe::{CycleReport, CycleResult};
use lockprobe::probe::{Leases, ProbeSettings, RESOURCES_PER_CYCLE};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Fake {
    items: Mutex<HashMap<String, Value>>,
    released: Mutex<Vec<String>>,
    /// `(resource, token)` of every pre-lock granted.
    issued: Mutex<Vec<(String, String)>>,
    /// Tokens presented to release.
    released_tokens: Mutex<Vec<String>>,
    declared: f64,
    /// Status of a granted pre-lock (201 per the contract).
    grant_status: u16,
    /// How long each item read, write and delete takes.
    item_delay: Duration,
    /// With a lock view in the pre-lock's answer: `effectiveAt` this long after
    /// `acquiredAt` (without, the answer has no timestamps).
    effective_after: Option<Duration>,
    /// How an escalation to the lease-lapse check's short write lease is answered.
    short_escalation: ShortEscalation,
    /// Idempotency keys of the short escalations seen.
    short_keys: Mutex<Vec<String>>,
}

/// How the fake answers an escalation to a write lease of [`SHORT_WRITE`].
#[derive(Default, Clone, Copy, PartialEq)]
enum ShortEscalation {
    /// 200, as every other call.
    #[default]
    Granted,
    /// `503 outcome-unknown` (Retry-After 1), then under the same key `410
    /// lock-expired`: the lease lapsed before the repeat, as under an ambiguous store.
    UnknownThenExpired,
    /// `410 lock-expired` at once: no repeat excuses it.
    Expired,
}

/// The fake probe's short write lease.
const SHORT_WRITE: Duration = Duration::from_millis(100);

async fn escalate(State(f): S, headers: axum::http::HeaderMap, Json(body): Json<Value>) -> axum::response::Response {
    let short = body["phase"] == "write" && body["durationSeconds"].as_f64() == Some(SHORT_WRITE.as_secs_f64());
    let problem = |status: u16, kind: &str| {
        let body = Json(json!({"type": format!("urn:lockprobe:error:{kind}"), "status": status}));
        (StatusCode::from_u16(status).unwrap(), [("retry-after", "1")], body).into_response()
    };
    match f.short_escalation {
        ShortEscalation::Granted => ok().await.into_response(),
        _ if !short => ok().await.into_response(),
        ShortEscalation::UnknownThenExpired => {
            let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
            let mut seen = f.short_keys.lock().unwrap();
            if seen.contains(&key) {
                problem(410, "lock-expired")
            } else {
                seen.push(key);
                problem(503, "outcome-unknown")
            }
        }
        ShortEscalation::Expired => problem(410, "lock-expired"),
    }
}

type S = State<Arc<Fake>>;

async fn pre_lock(State(f): S, Path(id): Path<String>) -> impl IntoResponse {
    let token = format!("tok-{id}-{}", rand_suffix());
    f.issued.lock().unwrap().push((id, token.clone()));
    let mut body =
        json!({"token": token, "phase": "preLock", "convergenceDelaySeconds": f.declared, "location": "westeurope"});
    if let Some(after) = f.effective_after {
        let now = chrono::Utc::now();
        let at = |d: Duration| (now + chrono::Duration::from_std(d).unwrap()).to_rfc3339();
        for (field, d) in [
            ("acquiredAt", Duration::ZERO),
            ("effectiveAt", after),
            ("expiresAt", Duration::from_secs(60)),
            ("preLockExpiresAt", Duration::from_secs(60)),
            ("maxExpiresAt", Duration::from_secs(120)),
        ] {
            body[field] = json!(at(d));
        }
    }
    (StatusCode::from_u16(f.grant_status).unwrap(), Json(body))
}

fn rand_suffix() -> u32 {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
}

async fn ok() -> Json<Value> {
    Json(json!({"phase": "write"}))
}

async fn swap(Json(body): Json<Value>) -> Json<Value> {
    Json(json!({"location": body["targetLocation"], "lock": null, "source": "store"}))
}

async fn release(State(f): S, Path(id): Path<String>, headers: axum::http::HeaderMap) -> StatusCode {
    if let Some(t) = headers.get("lock-token").and_then(|v| v.to_str().ok()) {
        f.released_tokens.lock().unwrap().push(t.to_string());
    }
    f.released.lock().unwrap().push(id);
    StatusCode::NO_CONTENT
}

async fn route() -> Json<Value> {
    Json(json!({"location": "westeurope", "lock": {"phase": "preLock"}, "source": "store"}))
}

async fn read(State(f): S, Path((id, key)): Path<(String, String)>) -> axum::response::Response {
    tokio::time::sleep(f.item_delay).await;
    match f.items.lock().unwrap().get(&format!("{id}/{key}")) {
        Some(v) => Json(json!({"key": key, "value": v, "tombstone": false})).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn write(State(f): S, Path((id, key)): Path<(String, String)>, Json(body): Json<Value>) -> StatusCode {
    tokio::time::sleep(f.item_delay).await;
    f.items.lock().unwrap().insert(format!("{id}/{key}"), body["value"].clone());
    StatusCode::OK
}

async fn delete(State(f): S, Path((id, key)): Path<(String, String)>) -> StatusCode {
    tokio::time::sleep(f.item_delay).await;
    f.items.lock().unwrap().remove(&format!("{id}/{key}"));
    StatusCode::NO_CONTENT
}

async fn start_fake(declared: f64) -> (String, Arc<Fake>) {
    start_fake_with(Fake { declared, grant_status: 201, ..Fake::default() }).await
}

async fn start_fake_with(fake: Fake) -> (String, Arc<Fake>) {
    let fake = Arc::new(fake);
    let app = Router::new()
        .route("/v1/resources/{id}/lock", post(pre_lock).delete(release))
        .route("/v1/resources/{id}/lock/escalate", post(escalate))
        .route("/v1/resources/{id}/lock/renew", post(ok))
        .route("/v1/resources/{id}/lock/swap", post(swap))
        .route("/v1/resources/{id}/route", get(route))
        .route("/v1/resources/{id}/items/{key}", get(read).put(write).delete(delete))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), fake)
}

fn scenario(url: &str, state: Arc<StateFile>) -> Scenario {
    let settings = ProbeSettings {
        name: "fake".into(),
        instances: vec![url.to_string()],
        api_key: "k".into(),
        tls: Default::default(),
        test_prefix: "probe-".into(),
        locations: ["westeurope".into(), "northeurope".into()],
        expected_convergence: None,
        replication_bound: Duration::from_millis(50),
        buffer: Duration::from_millis(50),
        leases: Leases {
            pre_lock: Duration::from_secs(60),
            hard_delete: Duration::from_secs(60),
            write: Duration::from_secs(60),
            short_write: SHORT_WRITE,
        },
        request_timeout: Duration::from_secs(5),
        poll_interval: Duration::from_millis(20),
        concurrent_pre_locks: 4,
        owner: "test".into(),
        eager: false,
        force_release: None,
        max_inconclusive: lockprobe::probe::DEFAULT_MAX_INCONCLUSIVE,
        clock: std::sync::Arc::new(lockprobe::clock::SystemClock),
    };
    Scenario::new(settings, state, Arc::new(TracingObserver)).unwrap()
}

/// Tokens granted on `resource` that were never presented to release.
fn unreleased(fake: &Fake, resource: &str) -> Vec<String> {
    let released = fake.released_tokens.lock().unwrap().clone();
    fake.issued
        .lock()
        .unwrap()
        .iter()
        .filter(|(r, t)| r == resource && !released.contains(t))
        .map(|(_, t)| t.clone())
        .collect()
}

fn resources() -> Vec<String> {
    (1..=RESOURCES_PER_CYCLE).map(|i| format!("probe-{i:04}")).collect()
}

fn failed_ops(r: &CycleReport, check: &str) -> Vec<(String, String, String)> {
    r.assertions
        .iter()
        .filter(|a| a.check == check && a.failed())
        .map(|a| (a.op.to_string(), a.expected.to_string(), a.observed.to_string()))
        .collect()
}

/// A yes-man accepts the early escalation. With 3 s to `effectiveAt` the probe's
/// escalation (answered within milliseconds) surely came before it: the check fails. With none (`effectiveAt` =
/// `acquiredAt`) the escalation may have come after it, as from an overloaded probe: it
/// is inconclusive, with why, and the check, which decided nothing, fails as
/// `inconclusive` rather than passing.
#[tokio::test]
async fn an_early_escalation_is_judged_only_when_it_surely_came_before_effective_at() {
    let escalate_early = |r: &CycleReport| {
        let failed =
            failed_ops(r, "negative/escalate-early").iter().any(|(op, _, obs)| op == "escalate-early" && obs == "200");
        let inconclusive = r.assertions.iter().any(|a| {
            a.check == "negative/escalate-early" && a.op.as_str() == "escalate-early" && a.inconclusive.is_some()
        }) && failed_ops(r, "negative/escalate-early").contains(&(
            "decided".into(),
            "decided".into(),
            "inconclusive".into(),
        ));
        (failed, inconclusive)
    };
    for (after, expected) in [(Duration::from_secs(3), (true, false)), (Duration::ZERO, (false, true))] {
        let fake = Fake { declared: 0.1, grant_status: 201, effective_after: Some(after), ..Fake::default() };
        let (url, _fake) = start_fake_with(fake).await;
        let state = Arc::new(StateFile::in_memory());
        let report = scenario(&url, state).run_cycle(&resources(), CancellationToken::new()).await;
        assert_eq!(escalate_early(&report), expected, "effectiveAt {after:?} after acquiredAt: {report:#?}");
    }
}

/// An escalation to the lease-lapse check's short write lease whose outcome was unknown
/// and whose repeat, a second later, finds the lease lapsed (`410 lock-expired`, the
/// honest answer under an ambiguous store) cannot say whether it took: inconclusive, so
/// the check fails as undecided, never as a refusal. The same 410 answered at once is a
/// failure.
#[tokio::test]
async fn a_short_lease_answered_only_after_it_lapsed_is_inconclusive_not_a_failure() {
    for (mode, judged) in [(ShortEscalation::UnknownThenExpired, false), (ShortEscalation::Expired, true)] {
        let fake = Fake { declared: 0.1, grant_status: 201, short_escalation: mode, ..Fake::default() };
        let (url, _fake) = start_fake_with(fake).await;
        let report =
            scenario(&url, Arc::new(StateFile::in_memory())).run_cycle(&resources(), CancellationToken::new()).await;
        let escalation: Vec<_> = report
            .assertions
            .iter()
            .filter(|a| {
                a.check == "negative/write-lease-lapse" && a.op.as_str() == "escalate" && a.phase.as_str() == "write"
            })
            .collect();
        assert_eq!(escalation.len(), 1, "{escalation:#?}");
        let a = escalation[0];
        assert_eq!(a.observed.as_str(), "410 lock-expired");
        if judged {
            assert!(a.failed() && a.inconclusive.is_none(), "{a:#?}");
        } else {
            assert!(!a.failed() && a.inconclusive.as_deref().unwrap().contains("past the 0.100s lease"), "{a:#?}");
            // The fake's lock views carry no timestamps (failed `lock-view`s); beyond
            // them, only the check's verdict: it decided nothing.
            let failed: Vec<_> = failed_ops(&report, "negative/write-lease-lapse")
                .into_iter()
                .filter(|(op, ..)| op != "lock-view")
                .collect();
            assert_eq!(failed, [("decided".to_owned(), "decided".to_owned(), "inconclusive".to_owned())]);
        }
        // Nothing after the escalation was asked.
        assert!(!report
            .assertions
            .iter()
            .any(|a| a.check == "negative/write-lease-lapse" && a.op.as_str() == "swap-after-lapse"));
    }
}

#[tokio::test]
async fn every_negative_check_fails_against_a_yes_man_and_locks_are_released() {
    let (url, fake) = start_fake(0.1).await;
    let state = Arc::new(StateFile::in_memory());
    let report = scenario(&url, state.clone()).run_cycle(&resources(), CancellationToken::new()).await;
    assert_eq!(report.result, CycleResult::Failed);
    let has = |check: &str, op: &str, observed: &str| {
        failed_ops(&report, check).iter().any(|(o, _, obs)| o == op && obs == observed)
    };
    assert!(has("negative/second-pre-lock", "pre-lock-again", "201"), "{report:#?}");
    assert!(has("negative/wrong-token", "renew", "200"));
    assert!(has("negative/wrong-token", "release", "204"));
    assert!(has("negative/escalate-early", "escalate-early", "200"));
    assert!(has("negative/write-before-hard-delete", "escalate-write", "200"));
    assert!(has("negative/write-lease-lapse", "swap-after-lapse", "200"));
    assert!(has("negative/concurrent-pre-locks", "pre-lock-race", "4 winner(s)"));
    // The main walk sees no enforcement at all.
    assert!(has("cycle", "write", "allow"));
    assert!(has("cycle", "delete", "allow"));
    assert!(report.enforcement_violations() >= 2);

    // Every lock still held at the end of a check was released, the race's extra winners too.
    let released = fake.released.lock().unwrap().clone();
    for r in ["probe-0002", "probe-0004", "probe-0005"] {
        assert!(released.iter().any(|x| x == r), "{r} not released: {released:?}");
    }
    assert_eq!(released.iter().filter(|x| *x == "probe-0007").count(), 4, "{released:?}");
    // The main resource swapped (the lock ended with it) and the lapsed lease swapped too;
    // the fresh lock a yes-man grants for the repeated pre-lock was released at once.
    assert!(has("cycle", "pre-lock-replay", "fresh-lock"), "a repeated pre-lock must not grant a second lock");
    assert_eq!(released.iter().filter(|x| *x == "probe-0001").count(), 1, "{released:?}");
    // Every other lock granted (the lapsed lease's swapped), the second pre-lock's
    // included, was released by its token.
    for r in &resources()[1..] {
        if r != "probe-0006" {
            assert_eq!(unreleased(&fake, r), Vec::<String>::new(), "{r}");
        }
    }
    assert!(state.entries().is_empty(), "{:?}", state.entries());

    // No token reaches the JSON or JUnit report, the metrics, the status API or its page.
    let metrics = Metrics::new().unwrap();
    let status = ProbeStatus::new();
    metrics.record_cycle(&report);
    status.record_cycle(&report);
    let document = status.document(&metrics);
    let outputs = [
        ("json report", report.to_json().to_string()),
        ("junit report", report.to_junit(&[])),
        ("metrics", metrics.render()),
        ("status api", serde_json::to_string(&document).unwrap()),
        ("status page", lockprobe::probe::render_status_page(&document)),
    ];
    let issued = fake.issued.lock().unwrap().clone();
    assert!(!issued.is_empty());
    for (_, token) in &issued {
        for (name, text) in &outputs {
            assert!(!text.contains(token.as_str()), "{name} shows token {token}");
        }
    }
}

#[tokio::test]
async fn a_lock_granted_under_an_unexpected_status_is_still_released() {
    // 200 instead of 201: every pre-lock assertion fails, but each token is a live lock.
    let (url, fake) = start_fake_with(Fake { declared: 0.1, grant_status: 200, ..Fake::default() }).await;
    let state = Arc::new(StateFile::in_memory());
    let report = scenario(&url, state.clone()).run_cycle(&resources(), CancellationToken::new()).await;
    assert_eq!(report.result, CycleResult::Failed);
    assert!(!fake.issued.lock().unwrap().is_empty());
    for r in resources() {
        assert_eq!(unreleased(&fake, &r), Vec::<String>::new(), "{r}");
    }
    assert!(state.entries().is_empty(), "{:?}", state.entries());
}

#[tokio::test]
async fn a_cancelled_cycle_releases_its_lock_and_reports_an_error() {
    // A long declared delay keeps the cycle waiting with its lock held.
    let (url, fake) = start_fake(30.0).await;
    let state = Arc::new(StateFile::in_memory());
    let cancel = CancellationToken::new();
    let cycle = tokio::spawn({
        let (scenario, cancel) = (scenario(&url, state.clone()), cancel.clone());
        async move { scenario.run_cycle(&resources(), cancel).await }
    });
    // Cancelled once it waits with its lock held: both pre-locks granted and the fresh
    // one released by the replay check (a fixed sleep could cancel it, on a loaded
    // machine, before it ever locked).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while fake.issued.lock().unwrap().len() < 2 || fake.released.lock().unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the cycle never reached its convergence wait");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cancel.cancel();
    let report = tokio::time::timeout(Duration::from_secs(10), cycle)
        .await
        .expect("cancellation stops the cycle promptly")
        .expect("the cycle does not panic");
    assert_eq!(report.result, CycleResult::Error);
    assert!(report.error.as_deref().unwrap().contains("cancelled"));
    // The fresh lock the yes-man granted for the repeated pre-lock, and the cycle's own.
    assert_eq!(fake.released.lock().unwrap().as_slice(), ["probe-0001", "probe-0001"]);
    assert_eq!(unreleased(&fake, "probe-0001"), Vec::<String>::new());
    assert!(state.entries().is_empty());
}

#[tokio::test]
async fn an_unreachable_target_is_an_error_not_a_crash() {
    // Bind and drop a listener to get a port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let report = scenario(&format!("http://127.0.0.1:{port}"), Arc::new(StateFile::in_memory()))
        .run_cycle(&resources(), CancellationToken::new())
        .await;
    assert_eq!(report.result, CycleResult::Error);
    assert!(report.error.as_deref().unwrap().contains("unreachable"), "{:?}", report.error);
    assert_eq!(report.assertions.len(), 1);
    assert_eq!(report.assertions[0].observed.as_str(), "unreachable");
}

#[tokio::test]
async fn a_release_that_failed_earlier_is_retried_before_the_resource_is_reused() {
    let (url, fake) = start_fake(0.1).await;
    let state = Arc::new(StateFile::in_memory());
    state.record_token("fake", "probe-0001", "tok-left-over").unwrap();
    // Another target's entry, and one outside this cycle's resources, stay untouched.
    state.record_token("other", "probe-0001", "tok-other").unwrap();
    state.record_token("fake", "probe-0099", "tok-busy").unwrap();
    scenario(&url, state.clone()).run_cycle(&resources(), CancellationToken::new()).await;
    let released = fake.released.lock().unwrap().clone();
    assert_eq!(released.first().map(String::as_str), Some("probe-0001"));
    // Entries come by target, then resource.
    let left: Vec<(String, String)> = state.entries().into_iter().map(|e| (e.target, e.resource)).collect();
    assert_eq!(
        left,
        vec![("fake".to_string(), "probe-0099".to_string()), ("other".to_string(), "probe-0001".to_string())]
    );
}

#[tokio::test]
async fn convergence_is_timed_from_the_pre_lock_not_after_the_user_checks() {
    // The route view shows the lock at once; each item operation takes 60ms, so the
    // three pre-lock user checks take 180ms. Observed convergence must not include them.
    let (url, _fake) = start_fake_with(Fake {
        declared: 0.5,
        grant_status: 201,
        item_delay: Duration::from_millis(60),
        ..Fake::default()
    })
    .await;
    let report =
        scenario(&url, Arc::new(StateFile::in_memory())).run_cycle(&resources(), CancellationToken::new()).await;
    let observed = report.observed_convergence[0].observed_seconds.expect("the fake shows the lock at once");
    assert!(observed < 0.1, "observed {observed}s includes the user checks");
}

#[tokio::test]
async fn a_pre_lock_without_a_declared_delay_stops_the_walk_before_escalating() {
    // NaN serialises as null: the lock view carries no usable convergence delay.
    let (url, fake) = start_fake(f64::NAN).await;
    let report =
        scenario(&url, Arc::new(StateFile::in_memory())).run_cycle(&resources(), CancellationToken::new()).await;
    let main: Vec<_> = report.assertions.iter().filter(|a| a.check == "cycle").collect();
    assert!(
        main.iter().any(|a| a.op.as_str() == "convergence-delay" && a.observed.as_str() == "missing" && !a.passed),
        "{main:#?}"
    );
    assert!(!main.iter().any(|a| a.op.as_str() == "escalate"), "{main:#?}");
    assert_eq!(unreleased(&fake, "probe-0001"), Vec::<String>::new());
}
