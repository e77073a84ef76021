//! A probe killed mid-cycle leaves its lock recorded in the state file; the restarted
//! probe releases it before doing anything else, so no lock is left behind.

#[path = "support/probe_config.rs"]
mod probe_config;
#[path = "support/service.rs"]
mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lockprobe::store::OpKind;
use lockprobe::testing::FaultKind;
use probe_config::{ProbeConfig, TargetConfig};
use support::{route, start_service, start_service_with_store_faults};

const KEY_ENV: &str = "LOCKPROBE_TEST_KILL_RESTART_KEY";

fn config(dir: &Path, urls: &[String], schedule: &str) -> std::path::PathBuf {
    // A long buffer keeps the cycle waiting for convergence with its lock held.
    config_with(dir, urls, schedule, |t| t.buffer("60s"))
}

/// [`config`]'s probe with `more` settings on its one target.
fn config_with(
    dir: &Path,
    urls: &[String],
    schedule: &str,
    more: impl FnOnce(TargetConfig) -> TargetConfig,
) -> std::path::PathBuf {
    ProbeConfig::new(dir.join("state.json"))
        .listen("127.0.0.1:0")
        .target(more(TargetConfig::new("kill", urls).api_key_env(KEY_ENV).schedule(schedule).timeout("5m")))
        .write_as(dir, &format!("probe-{}.toml", schedule.len()))
}

/// A running `lockprobe serve`, killed when dropped so a failed assertion never leaves a
/// probe running on its every-second schedule after the test.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(config: &Path, key: &str) -> Serve {
    Serve(
        Command::new(env!("CARGO_BIN_EXE_lockprobe"))
            .args(["serve", "--config"])
            .arg(config)
            .env(KEY_ENV, key)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    )
}

/// [`serve`] on a free port given with `--listen`, its output discarded; returns the
/// process and its base URL.
fn serve_listening(config: &Path, key: &str) -> (Serve, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
        .args(["serve", "--web.enable-lifecycle", "--listen", &format!("127.0.0.1:{port}"), "--config"])
        .arg(config)
        .env(KEY_ENV, key)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (Serve(child), format!("http://127.0.0.1:{port}"))
}

/// The journaled idempotency key of `resource`'s pre-lock, while it has no token yet.
fn journaled_key_without_token(dir: &Path, resource: &str) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("state.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["locks"].as_array()?.iter().find_map(|l| {
        (l["resource"] == resource && l["token"].is_null())
            .then(|| l["preLock"]["key"].as_str().map(str::to_owned))
            .flatten()
    })
}

fn state_tokens(dir: &Path) -> Vec<(String, bool)> {
    let Ok(text) = std::fs::read_to_string(dir.join("state.json")) else {
        return vec![];
    };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["resource"].as_str().unwrap().to_string(), l["token"].is_string()))
        .collect()
}

/// Waits until the probe has recorded the token of its main resource's pre-lock.
async fn wait_for_main_token(dir: &Path) {
    wait_for("the token in the state file", Duration::from_secs(20), async || {
        state_tokens(dir).iter().any(|(r, has_token)| r == "probe-0001" && *has_token)
    })
    .await;
}

async fn wait_for(what: &str, timeout: Duration, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_probe_leaves_no_lock_after_restart() {
    let svc = start_service(vec![], Duration::from_secs(1), Duration::from_millis(500)).await;
    let dir = tempfile::tempdir().unwrap();

    // First run: every second; it pre-locks probe-0001 and sits in the convergence wait.
    let first = serve(&config(dir.path(), &svc.urls, "* * * * * *"), &svc.key);
    wait_for_main_token(dir.path()).await;
    drop(first);

    // The kill left the lock behind.
    let view = route(&svc.urls[0], "probe-0001").await;
    assert_eq!(view["lock"]["phase"], "preLock", "{view}");
    assert!(view["lock"].get("token").is_none(), "route views never show tokens: {view}");

    // Second run never fires a cycle (year 2099), so only recovery can touch the lock.
    let second = serve(&config(dir.path(), &svc.urls, "0 0 0 1 1 * 2099"), &svc.key);
    wait_for("the left-over lock to be released", Duration::from_secs(15), async || {
        route(&svc.urls[0], "probe-0001").await["lock"].is_null()
    })
    .await;
    wait_for("the state file to be emptied", Duration::from_secs(5), async || state_tokens(dir.path()).is_empty())
        .await;
    // Every instance agrees.
    for url in &svc.urls {
        wait_for("every instance to show no lock", Duration::from_secs(5), async || {
            route(url, "probe-0001").await["lock"].is_null()
        })
        .await;
    }
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_cycle_releases_the_lock_before_exit() {
    let svc = start_service(vec![], Duration::from_secs(1), Duration::from_millis(500)).await;
    let dir = tempfile::tempdir().unwrap();
    let mut probe = serve(&config(dir.path(), &svc.urls, "* * * * * *"), &svc.key);
    wait_for_main_token(dir.path()).await;
    let status = Command::new("kill").args(["-TERM", &probe.0.id().to_string()]).status().unwrap();
    assert!(status.success());
    let mut exit = None;
    wait_for("the probe to exit on SIGTERM", Duration::from_secs(10), async || {
        exit = probe.0.try_wait().unwrap();
        exit.is_some()
    })
    .await;
    assert!(exit.is_some_and(|e| e.success()), "{exit:?}");
    // Released on the way out: nothing held, nothing left in the state file.
    assert!(route(&svc.urls[0], "probe-0001").await["lock"].is_null());
    assert!(state_tokens(dir.path()).is_empty());
}

/// The probe is killed while its pre-lock is in flight: the store commits the lock four
/// seconds later, after nobody is left to hear the answer. Only the journal knows: the
/// restarted probe repeats the pre-lock under its journaled key, learns the token the
/// lost answer carried, and releases the lock, instead of leaving it for its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_killed_mid_pre_lock_recovers_the_token_and_releases() {
    // The first replace is the main resource's pre-lock (seeding only creates).
    let (svc, store) = start_service_with_store_faults(
        vec![],
        Duration::from_secs(1),
        Duration::from_millis(500),
        &["replace:late-commit=4s,timeout=30s x1"],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let first = serve(&config(dir.path(), &svc.urls, "* * * * * *"), &svc.key);
    // Killed only once the store holds the late write: the key is journaled before the
    // request is sent, so a kill on the journal alone can beat the request to the
    // service (it did in CI, on a loaded machine) and then nothing ever lands.
    wait_for("the pre-lock to reach the store, its key journaled with no token", Duration::from_secs(20), async || {
        store.stats().injected(OpKind::Replace, FaultKind::LateCommit) == 1
            && journaled_key_without_token(dir.path(), "probe-0001").is_some()
    })
    .await;
    drop(first);

    // The lock lands with nobody to hear of it.
    wait_for("the in-flight pre-lock to land", Duration::from_secs(20), async || {
        route(&svc.urls[0], "probe-0001").await["lock"]["phase"] == "preLock"
    })
    .await;
    assert!(journaled_key_without_token(dir.path(), "probe-0001").is_some(), "the journal still has only the key");

    let second = serve(&config(dir.path(), &svc.urls, "0 0 0 1 1 * 2099"), &svc.key);
    wait_for("the orphaned lock to be released", Duration::from_secs(15), async || {
        route(&svc.urls[0], "probe-0001").await["lock"].is_null()
    })
    .await;
    wait_for("the state file to be emptied", Duration::from_secs(5), async || state_tokens(dir.path()).is_empty())
        .await;
    drop(second);
}

/// Journal first, or no lock (issue 29): a probe whose state file cannot be written
/// would lock without the journal that releases its locks after a kill. A place the
/// state file cannot be written is refused before anything runs (`check-config`,
/// `serve`: exit 64 naming `state_file`); a state file that turns unwritable under a
/// running probe (here a directory where each write puts its temporary copy) stops
/// every pre-lock: cycles end in error with the reason, `lockprobe_state_file_writable`
/// drops to 0, `/readyz` says why, and the service sees no more lock writes. Once the
/// file takes writes again, so does the probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_file_that_refuses_writes_stops_every_pre_lock() {
    let (svc, store) = support::start_service_keeping_store(vec![], Duration::from_secs(1), Duration::ZERO, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let in_the_way = dir.path().join("state.json.tmp");
    let config = ProbeConfig::new(dir.path().join("state.json"))
        .target(
            TargetConfig::new("journal", &svc.urls)
                .api_key_env(KEY_ENV)
                .buffer("100ms")
                .schedule("* * * * * *")
                .timeout("1m"),
        )
        .write_as(dir.path(), "probe.toml");

    std::fs::create_dir(&in_the_way).unwrap();
    let logged = store.changes_logged();
    for command in [vec!["check-config"], vec!["serve", "--config"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
            .args(&command)
            .arg(&config)
            .env(KEY_ENV, &svc.key)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{command:?}: {stderr}");
        assert!(stderr.contains("state_file") && stderr.contains("state.json.tmp"), "{command:?}: {stderr}");
    }
    assert_eq!(store.changes_logged(), logged, "a refused start wrote nothing");
    std::fs::remove_dir(&in_the_way).unwrap();

    let (_probe, base) = serve_listening(&config, &svc.key);
    wait_for_main_token(dir.path()).await;
    std::fs::create_dir(&in_the_way).unwrap();

    let get = |path: &'static str| {
        let url = format!("{base}{path}");
        async move {
            match reqwest::get(&url).await {
                Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
                Err(_) => (0, String::new()),
            }
        }
    };
    wait_for("/readyz to say the state file refuses writes", Duration::from_secs(30), async || {
        let (status, body) = get("/readyz").await;
        status == 503 && body.contains("state file refuses writes")
    })
    .await;
    assert!(get("/metrics").await.1.lines().any(|l| l == "lockprobe_state_file_writable 0"));
    // The cycle under way when the file turned unwritable still releases what it took.
    wait_for("the probe's locks to be gone", Duration::from_secs(30), async || {
        let mut free = true;
        for n in 1..=5 {
            free &= route(&svc.urls[0], &format!("probe-{n:04}")).await["lock"].is_null();
        }
        free
    })
    .await;
    let settled = store.changes_logged();
    tokio::time::sleep(Duration::from_secs(3)).await; // three firings
    assert_eq!(store.changes_logged(), settled, "a pre-lock was sent that the state file could not journal");
    let status: serde_json::Value = serde_json::from_str(&get("/api/v1/status").await.1).unwrap();
    let cycles = status["targets"][0]["lastCycles"].as_array().cloned().unwrap_or_default();
    let last = cycles.first().unwrap_or_else(|| panic!("no cycle in {status}"));
    assert_eq!(last["result"], "error", "{last}");
    assert!(last["error"].as_str().unwrap_or_default().contains("was not sent"), "{last}");

    std::fs::remove_dir(&in_the_way).unwrap();
    wait_for("the probe to lock and be ready again", Duration::from_secs(30), async || {
        get("/readyz").await.0 == 200 && store.changes_logged() > settled
    })
    .await;
    assert!(get("/metrics").await.1.lines().any(|l| l == "lockprobe_state_file_writable 1"));
}

/// Recovery runs per target, in parallel, within a deadline (issue 29): a previous run
/// left five locks on a target whose instance accepts connections and never answers.
/// Releasing them cannot finish, yet the probe is ready and takes a reload at once, the
/// healthy target's first cycle locks while the stuck recovery is still under way, that
/// recovery ends at its deadline (5 locks x 4 request timeouts of 1 s), and the firings
/// it cost its own target are counted as missed. (Before: `serve` released target by
/// target before anything else, so readiness, reloads and every target waited.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_never_answers_delays_only_its_own_recovery() {
    const DEADLINE: Duration = Duration::from_secs(20);
    let svc = start_service(vec![], Duration::from_secs(1), Duration::from_millis(500)).await;
    // An instance that takes connections and never answers them.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let left: Vec<serde_json::Value> = (1..=5)
        .map(|n| {
            serde_json::json!({"target": "silent", "resource": format!("probe-s-{n:04}"), "token": format!("left-{n}"),
                               "recordedAt": "2026-12-01T00:00:00Z"})
        })
        .collect();
    std::fs::write(dir.path().join("state.json"), serde_json::json!({ "locks": left }).to_string()).unwrap();
    let config = ProbeConfig::new(dir.path().join("state.json"))
        .target(
            TargetConfig::new("healthy", &svc.urls)
                .api_key_env(KEY_ENV)
                .buffer("100ms")
                .schedule("* * * * * *")
                .timeout("1m"),
        )
        .target(
            TargetConfig::new("silent", [silent_url.as_str()])
                .api_key_env(KEY_ENV)
                .test_prefix("probe-s-")
                .buffer("100ms")
                .set("request_timeout", "1s")
                .schedule("* * * * * *")
                .timeout("1m"),
        )
        .write_as(dir.path(), "probe.toml");
    let started = Instant::now();
    let (_probe, base) = serve_listening(&config, &svc.key);
    let http = reqwest::Client::new();
    wait_for("/readyz", DEADLINE, async || {
        http.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status() == 200)
    })
    .await;
    let reload = http.post(format!("{base}/-/reload")).send().await.unwrap();
    assert_eq!(reload.status(), 200, "{:?}", reload.text().await);
    wait_for("the healthy target's first pre-lock", DEADLINE, async || {
        !route(&svc.urls[0], "probe-0001").await["lock"].is_null()
    })
    .await;
    let healthy_locked = started.elapsed();
    assert!(
        healthy_locked < DEADLINE * 3 / 4,
        "ready, reloaded and the healthy target locked only after {healthy_locked:?}: it waited for the stuck recovery"
    );

    let missed = |http: reqwest::Client| {
        let url = format!("{base}/api/v1/status");
        async move {
            let doc = http.get(url).send().await.unwrap().json::<serde_json::Value>().await.unwrap();
            let silent = doc["targets"].as_array().unwrap().iter().find(|t| t["name"] == "silent").cloned();
            silent.and_then(|t| t["missedSchedules"].as_u64()).unwrap_or(0)
        }
    };
    // The recovery gives up at its deadline; the firings of its wait are then counted.
    wait_for("the silent target's lost firings to be counted", DEADLINE * 2, async || missed(http.clone()).await >= 10)
        .await;
}

/// Killed after its force-release check's approval, while the old token is still in the
/// journal (the check keeps it until every instance has refused it, after the caches'
/// convergence): the restarted probe's release of that token is refused `410
/// lock-force-released`, which recovery counts as cleared. The journal empties and no
/// lock is left on either resource, with no lease to wait out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_killed_after_a_force_release_approval_clears_its_journal() {
    const FORCED: &str = "probe-0001-force-release";
    let svc = start_service(vec![], Duration::from_secs(1), Duration::from_millis(500)).await;
    let dir = tempfile::tempdir().unwrap();
    let admin_key_files: Vec<String> = svc.admin_key_files.iter().map(|f| f.display().to_string()).collect();
    let config = |schedule: &str| {
        config_with(dir.path(), &svc.urls, schedule, |t| {
            // The wait after the approval, before the last refusals: the window the kill
            // must fall in.
            t.set("admin_key_files", admin_key_files.clone()).buffer("8s")
        })
    };
    let journaled = |dir: &Path| state_tokens(dir).iter().any(|(r, has_token)| r == FORCED && *has_token);
    let first = serve(&config("* * * * * *"), &svc.key);
    wait_for("the force-release approved, its old token still journaled", Duration::from_secs(90), async || {
        let approved = svc.admin_view(FORCED).await["requests"]
            .as_array()
            .is_some_and(|requests| requests.iter().any(|r| r["status"] == "released"));
        approved && journaled(dir.path())
    })
    .await;
    drop(first);
    assert!(journaled(dir.path()), "killed with the old token in the journal");

    // Only recovery runs (year 2099): its release of the old token is refused 410, and
    // that clears the entry.
    let second = serve(&config("0 0 0 1 1 * 2099"), &svc.key);
    wait_for("the state file to be emptied", Duration::from_secs(20), async || state_tokens(dir.path()).is_empty())
        .await;
    for url in &svc.urls {
        for resource in ["probe-0001", FORCED] {
            wait_for("every instance to show no lock", Duration::from_secs(5), async || {
                route(url, resource).await["lock"].is_null()
            })
            .await;
        }
    }
    drop(second);
}
