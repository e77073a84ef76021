//! `lockprobe serve` reloads its configuration (SIGHUP, and `POST /-/reload` only with
//! `--web.enable-lifecycle`) without losing
//! work, against the real reference service: a cycle in flight finishes with exactly one
//! pre-lock (counted in the service's own store), a removed target leaves no lock, no
//! state-file entry and no series, an added one cycles, and a bad file is refused while
//! the running configuration goes on passing; two replicas of one configuration keep
//! sharing their pool when one of them is reloaded.

#[path = "support/probe_config.rs"]
mod probe_config;
#[path = "support/service.rs"]
mod support;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use lockprobe::document::Phase;
use lockprobe::probe::CycleResult;
use lockprobe::probe::StateFile;
use lockprobe::probe::TargetSchedule;
use lockprobe::probe::TracingObserver;
use lockprobe::probe::{target_control, Probe, TargetChanges};
use lockprobe::probe::{CycleDocument, StatusDocument};
use lockprobe::probe::{ProbeSettings, RESOURCES_PER_CYCLE};
use lockprobe::store::memory::MemoryStore;
use lockprobe::store::{ChangeCursor, LocationStore};
use probe_config::{ProbeConfig, TargetConfig};
use support::{route, start_service_keeping_store, TestService};
use tokio_util::sync::CancellationToken;

const KEY_ENV: &str = "LOCKPROBE_TEST_SERVE_RELOAD_KEY";

/// A target of the test's configuration: its name and its test prefix.
#[derive(Clone, Copy)]
struct Target {
    name: &'static str,
    prefix: &'static str,
}

const A: Target = Target { name: "a", prefix: "probe-a-" };
const B: Target = Target { name: "b", prefix: "probe-b-" };
const C: Target = Target { name: "c", prefix: "probe-c-" };

/// The configuration text: every target fires every second, one cycle at a time, and a
/// cycle takes several seconds (it waits out the declared delay plus `buffer` twice). No
/// `listen`: the tests serve on `--listen`, and one adds a `listen` line of its own.
fn config_text(dir: &Path, svc: &TestService, targets: &[Target], buffer: &str) -> String {
    let mut config = ProbeConfig::new(dir.join("state.json"));
    for t in targets {
        config = config.target(
            TargetConfig::new(t.name, &svc.urls)
                .api_key_env(KEY_ENV)
                .test_prefix(t.prefix)
                .buffer(buffer)
                .schedule("* * * * * *")
                .timeout("2m"),
        );
    }
    config.to_toml()
}

/// A running `lockprobe serve` whose stderr is collected; killed when dropped.
struct Serve {
    child: Child,
    base: String,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    /// `serve` with `POST /-/reload` enabled (`--web.enable-lifecycle`).
    fn start(config: &Path, key: &str) -> Self {
        Self::start_with(config, key, &["--web.enable-lifecycle"])
    }

    fn start_with(config: &Path, key: &str, flags: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
            .arg("serve")
            .args(flags)
            .args(["--listen", &format!("127.0.0.1:{port}"), "--config"])
            .arg(config)
            .env(KEY_ENV, key)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (stderr, lines) = (child.stderr.take().unwrap(), logs.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        Self { child, base: format!("http://127.0.0.1:{port}"), logs }
    }

    fn logged(&self, needle: &str) -> usize {
        self.logs.lock().unwrap().iter().filter(|l| l.contains(needle)).count()
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("serve exited ({status}): {:#?}", self.logs.lock().unwrap());
        }
    }

    fn hangup(&self) {
        let status = Command::new("kill").args(["-HUP", &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
    }

    async fn reload(&self) -> (u16, String, serde_json::Value) {
        let r = reqwest::Client::new().post(format!("{}/-/reload", self.base)).send().await.unwrap();
        let status = r.status().as_u16();
        let ct = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        (status, ct, r.json().await.unwrap())
    }

    async fn status(&self) -> Option<StatusDocument> {
        reqwest::get(format!("{}/api/v1/status", self.base)).await.ok()?.json().await.ok()
    }

    /// Cycles of `target`, oldest first.
    async fn cycles(&self, target: &str) -> Vec<CycleDocument> {
        let Some(status) = self.status().await else { return vec![] };
        let mut cycles: Vec<CycleDocument> =
            status.targets.into_iter().find(|t| t.name == target).map(|t| t.last_cycles).unwrap_or_default();
        cycles.reverse();
        cycles
    }

    async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.base)).await.unwrap().text().await.unwrap()
    }
}

async fn wait_for(what: &str, timeout: Duration, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The state file's entries as (target, resource, has a token).
fn state_entries(dir: &Path) -> Vec<(String, String, bool)> {
    let Ok(text) = std::fs::read_to_string(dir.join("state.json")) else { return vec![] };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["target"].as_str().unwrap().to_owned(),
                l["resource"].as_str().unwrap().to_owned(),
                l["token"].is_string(),
            )
        })
        .collect()
}

/// Waits until `target`'s cycle holds the pre-lock of its main resource: mid-cycle.
async fn wait_mid_cycle(dir: &Path, target: Target) {
    let main = format!("{}0001", target.prefix);
    wait_for("a cycle holding its pre-lock", Duration::from_secs(20), async || {
        state_entries(dir).iter().any(|(t, r, token)| t == target.name && *r == main && *token)
    })
    .await;
}

/// Distinct pre-locks the service granted on `resource` between `from` and `to`, as its
/// store committed them (every version, from the change stream).
async fn pre_locks(store: &MemoryStore, resource: &str, from: DateTime<Utc>, to: DateTime<Utc>) -> usize {
    let mut tokens = HashSet::new();
    let mut cursor = ChangeCursor::beginning();
    loop {
        let batch = store.read_changes(&cursor, 1000).await.unwrap();
        if batch.changes.is_empty() {
            break;
        }
        for change in &batch.changes {
            let doc = &change.doc.doc;
            if doc.id != resource {
                continue;
            }
            for lock in std::iter::once(&doc.primary).chain(doc.secondary.as_ref()).filter_map(|s| s.lock.as_ref()) {
                if lock.phase == Phase::PreLock && (from..=to).contains(&lock.acquired_at) {
                    tokens.insert(lock.token.clone());
                }
            }
        }
        cursor = batch.next;
    }
    tokens.len()
}

/// The first cycle of `target`, which was in flight at `reloaded_at`, must pass; from its
/// start until a cycle passed, the service must have seen exactly one pre-lock of the
/// main resource (a reload that cancels and restarts the cycle shows a second one).
async fn assert_cycle_in_flight_kept(serve: &Serve, store: &MemoryStore, target: Target, reloaded_at: DateTime<Utc>) {
    let mut cycles = Vec::new();
    wait_for("a cycle to pass", Duration::from_secs(60), async || {
        cycles = serve.cycles(target.name).await;
        cycles.iter().any(|c| c.result == CycleResult::Passed)
    })
    .await;
    let first = &cycles[0];
    let passed = cycles.iter().find(|c| c.result == CycleResult::Passed).unwrap();
    let main = format!("{}0001", target.prefix);
    let seen = pre_locks(store, &main, first.started_at, passed.finished_at).await;
    assert_eq!(seen, 1, "pre-locks of {main} from the cycle in flight at the reload to the first pass: {cycles:#?}");
    assert!(first.started_at < reloaded_at, "the first cycle started after the reload: {first:?}");
    assert_eq!(first.result, CycleResult::Passed, "{first:#?}");
}

fn metric_line<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_mid_cycle_keeps_the_cycle_retires_a_removed_target_and_starts_an_added_one() {
    let (svc, store) =
        start_service_keeping_store(vec![], Duration::from_secs(1), Duration::from_millis(500), &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("probe.toml");
    std::fs::write(&path, config_text(dir.path(), &svc, &[A, B], "1s")).unwrap();
    let mut serve = Serve::start(&path, &svc.key);
    wait_mid_cycle(dir.path(), A).await;
    wait_mid_cycle(dir.path(), B).await;
    let reloaded_at = Utc::now();

    // SIGHUP with the file as it was: nothing changes, and the process lives on.
    serve.hangup();
    wait_for("the SIGHUP reload", Duration::from_secs(10), async || serve.logged("configuration reloaded") == 1).await;
    serve.assert_running();

    // b removed and c added while both cycles are in flight; a untouched.
    std::fs::write(&path, config_text(dir.path(), &svc, &[A, C], "1s")).unwrap();
    let (code, _, report) = serve.reload().await;
    assert_eq!(code, 200, "{report}");
    assert_eq!(report, serde_json::json!({"added": ["c"], "changed": [], "removed": ["b"], "unchanged": ["a"]}));

    assert_cycle_in_flight_kept(&serve, &store, A, reloaded_at).await;

    // b: its cycle in flight finished, then the target went, with its status and series.
    wait_for("b to stop", Duration::from_secs(60), async || {
        serve.status().await.is_some_and(|s| s.targets.iter().all(|t| t.name != "b"))
    })
    .await;
    // The line is logged before the target leaves the status, but reaches this test
    // through a pipe and a reader thread, which may lag behind on a loaded machine.
    let stopped = "removed target stopped after its cycles in flight";
    wait_for("b's stop to be logged", Duration::from_secs(10), async || serve.logged(stopped) > 0).await;
    assert_eq!(serve.logged(stopped), 1);
    let metrics = serve.metrics().await;
    assert!(!metrics.contains(r#"target="b""#), "series of the removed target remain:\n{metrics}");
    assert!(metrics.contains(r#"lockprobe_probe_runs_total{result="passed",target="a"}"#), "{metrics}");
    // No lock left on b's resources, on any instance, and nothing of b in the state file.
    for url in &svc.urls {
        for i in 1..=7 {
            for resource in [format!("probe-b-{i:04}"), format!("probe-b-{i:04}-claim")] {
                let view = route(url, &resource).await;
                assert!(view["lock"].is_null(), "{resource} on {url} is still locked: {view}");
            }
        }
    }
    assert!(state_entries(dir.path()).iter().all(|(t, _, _)| t != "b"), "{:?}", state_entries(dir.path()));

    // c: started, and passes.
    wait_for("c to pass a cycle", Duration::from_secs(60), async || {
        serve.cycles("c").await.iter().any(|c| c.result == CycleResult::Passed)
    })
    .await;
    let metrics = serve.metrics().await;
    assert_eq!(
        metric_line(&metrics, "lockprobe_config_last_reload_successful"),
        Some("lockprobe_config_last_reload_successful 1")
    );
    serve.assert_running();
}

/// Without `--web.enable-lifecycle` nobody who merely reaches the port can make the
/// process re-read its file (as in Prometheus); SIGHUP still does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_lifecycle_flag_there_is_no_reload_route_and_sighup_still_reloads() {
    let (svc, _store) =
        start_service_keeping_store(vec![], Duration::from_secs(1), Duration::from_millis(500), &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("probe.toml");
    std::fs::write(&path, config_text(dir.path(), &svc, &[A], "1s")).unwrap();
    let mut serve = Serve::start_with(&path, &svc.key, &[]);
    wait_for("the probe is ready", Duration::from_secs(60), async || {
        reqwest::get(format!("{}/readyz", serve.base)).await.is_ok_and(|r| r.status() == 200)
    })
    .await;
    let reload = reqwest::Client::new().post(format!("{}/-/reload", serve.base)).send().await.unwrap();
    assert_eq!(reload.status(), 404, "no reload route without --web.enable-lifecycle");
    std::fs::write(&path, config_text(dir.path(), &svc, &[A, B], "1s")).unwrap();
    serve.hangup();
    wait_for("the added target's first cycle", Duration::from_secs(60), async || {
        !serve.cycles(B.name).await.is_empty()
    })
    .await;
    serve.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_config_is_refused_naming_the_field_and_a_good_change_applies_from_the_next_cycle() {
    let (svc, store) =
        start_service_keeping_store(vec![], Duration::from_secs(1), Duration::from_millis(500), &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("probe.toml");
    let good = config_text(dir.path(), &svc, &[A], "1s");
    std::fs::write(&path, &good).unwrap();
    let mut serve = Serve::start(&path, &svc.key);
    wait_mid_cycle(dir.path(), A).await;
    let reloaded_at = Utc::now();

    let elsewhere = dir.path().join("elsewhere.json");
    let other_state = format!("state_file = {}", toml::Value::from(elsewhere.to_str().unwrap()));
    // The file's first line: without a `listen`, its only top-level key comes first.
    let state_line = good.lines().next().unwrap().to_owned();
    assert!(state_line.starts_with("state_file = "), "{good}");
    for (text, status, kind, field) in [
        ("state_file = = \"x\"".to_owned(), 400, "config-malformed", None),
        (good.replace("* * * * * *", "every second"), 422, "config-invalid", Some("targets[0].schedule")),
        (
            good.replace(KEY_ENV, "LOCKPROBE_TEST_SERVE_RELOAD_UNSET"),
            422,
            "config-invalid",
            Some("targets[0].api_key_env"),
        ),
        (good.replace(&state_line, &other_state), 422, "config-requires-restart", Some("state_file")),
        (format!("listen = \"127.0.0.1:1\"\n{good}"), 200, "", None),
    ] {
        std::fs::write(&path, &text).unwrap();
        let (code, content_type, body) = serve.reload().await;
        assert_eq!(code, status, "{body}");
        if code == 200 {
            // --listen overrides the file's listen, so a change of it needs no restart.
            assert_eq!(body["unchanged"], serde_json::json!(["a"]), "{body}");
            continue;
        }
        assert_eq!(content_type, "application/problem+json");
        assert_eq!(body["type"], format!("urn:lockprobe:error:{kind}"), "{body}");
        assert_eq!(body["status"], status);
        if let Some(field) = field {
            assert_eq!(body["field"], field, "{body}");
            assert!(body["detail"].as_str().unwrap().starts_with(field), "{body}");
        }
        let metrics = serve.metrics().await;
        assert_eq!(
            metric_line(&metrics, "lockprobe_config_last_reload_successful"),
            Some("lockprobe_config_last_reload_successful 0")
        );
    }

    // SIGHUP with a bad file: an error in the log, the process and its target live on.
    std::fs::write(&path, good.replace("* * * * * *", "every second")).unwrap();
    let refused = |serve: &Serve| {
        serve.logs.lock().unwrap().iter().filter(|l| l.contains("ERROR") && l.contains("targets[0].schedule")).count()
    };
    // The refused reload of the same schedule above logged one such line already; wait
    // until it is read from the pipe, or its late arrival would pass for the SIGHUP's.
    wait_for("the earlier refusal to be logged", Duration::from_secs(10), async || refused(&serve) == 1).await;
    let before = refused(&serve);
    serve.hangup();
    wait_for("the refused SIGHUP reload", Duration::from_secs(10), async || refused(&serve) > before).await;
    serve.assert_running();

    // A good change of a (its buffer) while its first cycle is still in flight.
    std::fs::write(&path, config_text(dir.path(), &svc, &[A], "1s 500ms")).unwrap();
    let (code, _, report) = serve.reload().await;
    assert_eq!(code, 200, "{report}");
    assert_eq!(report["changed"], serde_json::json!(["a"]), "{report}");
    assert_cycle_in_flight_kept(&serve, &store, A, reloaded_at).await;

    // Reloads sent at once run one after the other, each against what the last applied.
    let reloads: Vec<_> = (0..4).map(|_| serve.reload()).collect();
    for (code, _, report) in futures::future::join_all(reloads).await {
        assert_eq!(code, 200, "{report}");
        assert_eq!(report["unchanged"], serde_json::json!(["a"]), "{report}");
    }

    // Later cycles run on the new settings, and pass.
    wait_for("a cycle on the new settings", Duration::from_secs(60), async || serve.cycles("a").await.len() >= 2).await;
    let cycles = serve.cycles("a").await;
    assert!(cycles.iter().all(|c| c.result == CycleResult::Passed), "{cycles:#?}");
    let metrics = serve.metrics().await;
    assert_eq!(
        metric_line(&metrics, "lockprobe_config_last_reload_successful"),
        Some("lockprobe_config_last_reload_successful 1")
    );
    serve.assert_running();
}

/// The two-replica target of `tests/probe_serve.rs`: every second, `concurrency` cycles at
/// once, two groups of test resources shared by both replicas.
fn replica_target(svc: &TestService, concurrency: usize, buffer: Duration) -> (ProbeSettings, TargetSchedule) {
    let settings = ProbeSettings { buffer, ..svc.probe_settings("shared", "lockprobe/shared") };
    let schedule = TargetSchedule {
        name: "shared".into(),
        schedule: cron::Schedule::from_str("* * * * * *").unwrap(),
        jitter: Duration::ZERO,
        concurrency,
        timeout: Duration::from_secs(60),
        pool: (1..=RESOURCES_PER_CYCLE * 2).map(|i| format!("probe-r{i:03}")).collect(),
    };
    (settings, schedule)
}

fn claims(probe: &Probe, outcome: &str) -> u64 {
    let needle = format!("lockprobe_probe_claims_total{{outcome=\"{outcome}\",target=\"shared\"}} ");
    let text = probe.metrics.render();
    text.lines().find_map(|l| l.strip_prefix(&needle)).map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_keep_sharing_the_pool_across_a_reload_of_one_of_them() {
    let svc = support::start_service(vec![], Duration::from_secs(1), Duration::from_millis(500)).await;
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let probe = Probe::new().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (control, inbox) = target_control();
        let (p, stop) = (probe.clone(), CancellationToken::new());
        let (targets, shutdown) = (vec![replica_target(&svc, 2, Duration::from_millis(300))], stop.clone());
        let task = tokio::spawn(async move {
            let state = Arc::new(StateFile::in_memory());
            p.run_controlled(targets, state, Arc::new(TracingObserver), listener, None, shutdown, Some(inbox)).await
        });
        replicas.push((probe, control, stop, task));
    }
    let cycles = |i: usize| replicas[i].0.status.cycles("shared");
    wait_for("both replicas to pass a cycle", Duration::from_secs(60), async || {
        !cycles(0).is_empty() && !cycles(1).is_empty()
    })
    .await;
    // Replica 0 takes a change (another buffer, one cycle at a time) with cycles in flight.
    let before = (cycles(0).len(), cycles(1).len(), claims(&replicas[0].0, "busy") + claims(&replicas[1].0, "busy"));
    let change =
        TargetChanges { start_or_update: vec![replica_target(&svc, 1, Duration::from_millis(400))], remove: vec![] };
    replicas[0].1.apply(change).await.unwrap();
    wait_for("3 more cycles on each replica", Duration::from_secs(90), async || {
        cycles(0).len() >= before.0 + 3 && cycles(1).len() >= before.1 + 3
    })
    .await;
    for i in 0..2 {
        let bad: Vec<_> = cycles(i).into_iter().filter(|c| c.result != CycleResult::Passed).collect();
        assert!(bad.is_empty(), "replica {i}: a cycle failed: {bad:#?}");
    }
    let busy = claims(&replicas[0].0, "busy") + claims(&replicas[1].0, "busy");
    assert!(busy > before.2, "the replicas still meet and step aside after the reload");
    for (_, _, stop, task) in replicas {
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(60), task).await.expect("stops").unwrap().unwrap();
    }
}
