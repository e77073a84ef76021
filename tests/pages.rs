//! The two human pages in a real browser (headless Chromium): the probe's status page at
//! `/` and the monitor's page at `/monitor`.
//!
//! - A passing `lockprobe demo`: its status page draws the cycle as a timeline (a bar per
//!   step of the walk, the instances showing the lock) with no failed step; its monitor
//!   page shows the probe's own locks apart.
//! - The probe against the reference service with `--fault ignore-write-lock` (in process,
//!   the real probe cycle and the real server): the write step is labelled failed and
//!   opened, and each failure is named on the timeline by phase, operation and instance.
//!   Its refresh script, in a same-origin frame, replaces `<main>` in place and keeps the
//!   step a reader closed closed and the one they opened open.
//! - The monitor over a store where anomalies were injected through the routing library
//!   (an early escalation, an orphaned lock, a forged partial cutover) beside a clean
//!   migration and a probe lock: each is listed with its resource id and age.
//!
//! Every page is also loaded at phone width (390 px) in light and dark mode: it must not
//! overflow horizontally, and axe-core's WCAG 2.1 A/AA rules (contrast among them) must
//! find nothing. Screenshots (390 px light and dark, 1280 px light) are kept under the
//! cargo target directory (`target/tmp/pages/`), never in the repository.
//!
//! Needs `chromium` (`scripts/install-test-deps.sh`) and axe-core
//! (`scripts/setup-page-tools.sh`); a missing one fails the test with that command.

#[path = "support/browser.rs"]
mod browser;
#[path = "support/service.rs"]
mod service;

use std::net::TcpListener as StdListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockprobe::clock::{Clock, ManualClock};
use lockprobe::monitor::{http as monitor_http, Monitor, MonitorConfig};
use lockprobe::probe::CycleResult;
use lockprobe::probe::Metrics;
use lockprobe::probe::ProbeStatus;
use lockprobe::probe::Scenario;
use lockprobe::probe::StateFile;
use lockprobe::probe::TracingObserver;
use lockprobe::probe::RESOURCES_PER_CYCLE;
use lockprobe::probe::{router, AppState};
use lockprobe::routing::cache::TieredCache;
use lockprobe::routing::{ClientOptions, LockPolicy, Phase, PreLockRequest, RoutingClient};
use lockprobe::service::Fault;
use lockprobe::store::memory::{MemoryStore, MemoryStoreConfig};
use lockprobe::store::{LocationStore, ReadFrom};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

fn http() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(10)).no_proxy().build().expect("http client")
}

async fn get(url: &str) -> String {
    let r = http().get(url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert!(r.status().is_success(), "GET {url}: {}", r.status());
    r.text().await.expect("body")
}

/// Serves `app` on a loopback port until the returned token is cancelled.
async fn serve(app: axum::Router) -> (String, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        axum::serve(listener, app).with_graceful_shutdown(async move { s.cancelled().await }).await.unwrap();
    });
    (base, stop)
}

/// Screenshots of `url`: 390 px light and dark, 1280 px light.
fn screenshots(url: &str, name: &str) {
    std::thread::scope(|scope| {
        for (suffix, width, height, dark) in
            [("390-light", 390, 2400, false), ("390-dark", 390, 2400, true), ("1280-light", 1280, 1600, false)]
        {
            scope.spawn(move || browser::screenshot(url, &format!("{name}-{suffix}"), width, height, dark));
        }
    });
}

// ---------------------------------------------------------------------------------------
// A passing demo

struct Demo {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Demo {
    fn start() -> Demo {
        let dir = tempfile::tempdir().unwrap();
        let port = StdListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
            .args(["demo", "--listen", &format!("127.0.0.1:{port}"), "--schedule", "*/2 * * * * *"])
            .current_dir(dir.path())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.path().join("demo.stdout")).unwrap())
            .stderr(std::fs::File::create(dir.path().join("demo.stderr")).unwrap())
            .spawn()
            .expect("start lockprobe demo");
        Demo { child, base: format!("http://127.0.0.1:{port}"), _dir: dir }
    }

    /// Waits for a passed cycle; returns the status document.
    async fn wait_for_a_passed_cycle(&mut self) -> Value {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            assert!(self.child.try_wait().unwrap().is_none(), "lockprobe demo exited early");
            if let Ok(r) = http().get(format!("{}/api/v1/status", self.base)).send().await {
                if let Ok(status) = r.json::<Value>().await {
                    if !status["targets"][0]["lastSuccessAt"].is_null() {
                        return status;
                    }
                }
            }
            assert!(Instant::now() < deadline, "the demo passed no cycle within 90 s");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passing_demo_draws_its_cycle_and_fits_a_phone_in_light_and_dark() {
    let mut demo = Demo::start();
    demo.wait_for_a_passed_cycle().await;
    let url = format!("{}/", demo.base);
    let dom = browser::dump_dom(&url);
    // The timeline of the newest cycle: a bar per step of the walk that ran.
    assert!(dom.contains("<svg class=\"chart timeline\""), "no timeline:\n{dom}");
    for (class, step) in [("s0", "seed"), ("s1", "preLock"), ("s2", "hardDelete"), ("s3", "write"), ("s4", "swap")] {
        assert!(dom.contains(&format!("<rect class=\"{class}\"")), "no {step} bar on the timeline:\n{dom}");
    }
    assert!(dom.contains("showed the lock after"), "no instance marked as showing the lock:\n{dom}");
    assert!(dom.contains("class=\"tick-pass\""), "no assertion ticks:\n{dom}");
    assert!(dom.contains("<svg class=\"chart strip\""), "no history strip:\n{dom}");
    // The newest cycle passed: no step of it is labelled failed.
    let newest = &dom[dom.find("<details class=\"cycle").unwrap()..];
    let newest = &newest[..newest.find("</details>\n<details class=\"cycle").unwrap_or(newest.len())];
    if newest.starts_with("<details class=\"cycle ok\"") {
        assert!(!newest.contains("class=\"step fail\""), "a passed cycle with a failed step:\n{newest}");
    }
    assert!(dom.contains("a restart empties them"), "the percentiles do not name their window:\n{dom}");
    screenshots(&url, "demo-status");
    browser::assert_fits_and_accessible(&get(&url).await, "demo-status");

    // The demo's monitor: its simulated fleet's anomalies (the early escalation of
    // fleet-0001 comes first, within a second of the start), the probe's locks apart.
    let monitor = format!("{}/monitor", demo.base);
    let dom = browser::dump_dom(&monitor);
    assert!(dom.contains("<h2>The probe's test locks</h2>"), "{dom}");
    assert!(dom.contains("<h2>Anomalies <span class=\"badge fail\">"), "{dom}");
    assert!(dom.contains("<td><code>fleet-0001</code></td>"), "the early escalation is listed: {dom}");
    assert!(!dom.contains("<td><code>probe-"), "no probe lock among the anomalies: {dom}");
    screenshots(&monitor, "demo-monitor");
    browser::assert_fits_and_accessible(&get(&monitor).await, "demo-monitor");
}

// ---------------------------------------------------------------------------------------
// A failing service

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_service_labels_the_failed_step_on_the_timeline() {
    let svc =
        service::start_service(vec![Fault::IgnoreWriteLock], Duration::from_secs(1), Duration::from_millis(500)).await;
    let settings = svc.probe_settings("faulty", "lockprobe/faulty");
    let metrics = Arc::new(Metrics::new().unwrap());
    let status = Arc::new(ProbeStatus::new());
    metrics.register_target("faulty", Some(1.5));
    status.add_target("faulty", &svc.urls, Some(1.5));
    status.set_config_loaded(true);
    status.set_scheduler_running(true);
    let scenario = Scenario::new(settings, Arc::new(StateFile::in_memory()), Arc::new(TracingObserver)).unwrap();
    let resources: Vec<String> = (1..=RESOURCES_PER_CYCLE).map(|i| format!("probe-f{i:03}")).collect();
    let report = scenario.run_cycle(&resources, CancellationToken::new()).await;
    assert_eq!(
        report.result,
        CycleResult::Failed,
        "{:#?}",
        report.assertions.iter().filter(|a| !a.passed).collect::<Vec<_>>()
    );
    metrics.record_cycle(&report);
    status.record_cycle(&report);
    let frame =
        axum::Router::new().route("/frame", axum::routing::get(|| async { axum::response::Html(REFRESH_FRAME) }));
    let (base, stop) = serve(router(AppState { metrics, status, reload: None }).merge(frame)).await;

    let url = format!("{base}/");
    let dom = browser::dump_dom(&url);
    // The write step is labelled failed and open, in the newest cycle.
    let write_step = dom
        .find("<details class=\"step fail\" id=\"cycle-faulty-")
        .map(|i| &dom[i..])
        .filter(|s| s[..s.find('>').unwrap()].ends_with("-write\" open=\"\""))
        .unwrap_or_else(|| panic!("no failed write step, open, on the page:\n{dom}"));
    assert!(write_step.contains("step <strong>write</strong> <span class=\"badge fail\">"), "{write_step}");
    // Each failure is named on the timeline by phase, operation and instance.
    for instance in ["i1", "i2"] {
        let label = format!("write · write @ {instance}: expected block, observed allow");
        assert!(dom.contains(&label), "no timeline label {label:?}:\n{dom}");
    }
    assert!(dom.contains("<polygon class=\"failed\""), "no failure crosses on the timeline:\n{dom}");
    assert!(dom.contains("<rect class=\"s3\""), "no write bar on the timeline:\n{dom}");
    screenshots(&url, "failing-status");
    browser::assert_fits_and_accessible(&get(&url).await, "failing-status");

    // The script refreshes the page in place and keeps what the reader opened or closed.
    let dom = browser::dump_dom_after(&format!("{base}/frame"), 40_000);
    let result = dom
        .split("<pre id=\"result\">")
        .nth(1)
        .and_then(|r| r.split("</pre>").next())
        .unwrap_or_else(|| panic!("no result from the frame:\n{dom}"));
    let v: Value = serde_json::from_str(&result.replace("&quot;", "\"")).unwrap_or_else(|e| panic!("{e}: {result}"));
    assert_eq!(v["replaced"], true, "the page was not refreshed in place: {v}");
    assert_eq!(v["writeOpen"], false, "a step the reader closed was opened again: {v}");
    assert_eq!(v["seedOpen"], true, "a step the reader opened was closed again: {v}");
    assert!(v["note"].as_str().is_some_and(|n| n.starts_with("updated")), "{v}");
    stop.cancel();
}

/// Opens the status page in a same-origin frame, closes the failed write step and opens
/// the seed step as a reader would, then waits for the page's own refresh to replace
/// `<main>` and reports the two steps' state after it.
const REFRESH_FRAME: &str = r#"<!DOCTYPE html><html><body><iframe id="f" src="/" style="width:390px;height:600px"></iframe>
<pre id="result"></pre><script>
var f = document.getElementById("f");
f.addEventListener("load", function () {
  var doc = f.contentDocument;
  var write = doc.querySelector("details.step.fail[id$='-write']"), seed = doc.querySelector("details.step[id$='-seed']");
  var ids = [write.id, seed.id];
  write.open = false; seed.open = true;
  doc.querySelector("main").setAttribute("data-before-refresh", "1");
  var poll = setInterval(function () {
    var main = doc.querySelector("main");
    if (main.hasAttribute("data-before-refresh")) { return; }
    clearInterval(poll);
    document.getElementById("result").textContent = JSON.stringify({
      replaced: true, writeOpen: doc.getElementById(ids[0]).open, seedOpen: doc.getElementById(ids[1]).open,
      note: doc.getElementById("refreshed").textContent
    });
  }, 500);
});
</script></body></html>"#;

// ---------------------------------------------------------------------------------------
// The monitor with injected anomalies

const S: Duration = Duration::from_secs(1);

fn client(store: &Arc<MemoryStore>, clock: &Arc<ManualClock>, delay: u32) -> RoutingClient {
    let policy = LockPolicy { skew_margin: Duration::ZERO, ..LockPolicy::new(S * delay, S * 3600) };
    RoutingClient::new(
        store.clone(),
        clock.clone(),
        TieredCache::try_new(&[S]).unwrap(),
        policy,
        ClientOptions::default(),
    )
}

fn pre_lock(owner: &str, secs: u32) -> PreLockRequest {
    PreLockRequest { owner: owner.into(), duration: S * secs, target_location: Some("northeurope".into()) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_page_lists_injected_anomalies_with_resource_and_age() {
    let start = chrono::DateTime::parse_from_rfc3339("2026-12-01T09:00:00Z").unwrap().to_utc();
    let clock = Arc::new(ManualClock::new(start));
    let store = Arc::new(MemoryStore::new(
        clock.clone(),
        MemoryStoreConfig { replica_lag: Duration::ZERO, change_log_capacity: 10_000 },
    ));
    let honest = client(&store, &clock, 10);
    let hasty = client(&store, &clock, 4);
    let config = MonitorConfig {
        escalation_buffer: 5 * S,
        declared_delay: Some(10 * S),
        lapse_grace: 2 * S,
        ..MonitorConfig::default()
    };
    let registry = prometheus::Registry::new();
    let dyn_clock: Arc<dyn Clock> = clock.clone();
    let monitor = Arc::new(Monitor::new(store.clone(), dyn_clock, config, &registry).unwrap());
    for id in ["res-clean", "res-early", "res-orphan", "res-partial", "res-moving", "probe-0001"] {
        honest.resolve_or_create(id, "westeurope").await.unwrap();
    }
    let clean = honest.pre_lock("res-clean", &pre_lock("orchestrator", 300)).await.unwrap().token;
    let early = hasty.pre_lock("res-early", &pre_lock("orchestrator", 300)).await.unwrap().token;
    honest.pre_lock("res-orphan", &pre_lock("orchestrator", 20)).await.unwrap();
    let partial = honest.pre_lock("res-partial", &pre_lock("orchestrator", 300)).await.unwrap().token;
    honest.pre_lock("probe-0001", &pre_lock("lockprobe/demo", 300)).await.unwrap();
    monitor.drain().await.unwrap();
    // 5 s in: the hasty orchestrator escalates by its own 4 s declaration, before the
    // 10 s + 5 s the service's declaration demands.
    clock.advance(5 * S);
    hasty.escalate("res-early", &early, Phase::HardDelete, 60 * S).await.unwrap();
    monitor.drain().await.unwrap();
    // 16 s in: the honest ones escalate; one migration starts.
    clock.advance(11 * S);
    for (id, token) in [("res-clean", &clean), ("res-partial", &partial)] {
        honest.escalate(id, token, Phase::HardDelete, 60 * S).await.unwrap();
        honest.escalate(id, token, Phase::Write, 60 * S).await.unwrap();
    }
    honest.pre_lock("res-moving", &pre_lock("orchestrator", 300)).await.unwrap();
    monitor.drain().await.unwrap();
    // 29 s in: a clean swap after a 13 s write lock; a forged document whose location
    // moved under its lock.
    clock.advance(13 * S);
    honest.swap("res-clean", &clean, "northeurope").await.unwrap();
    let mut doc = store.read("res-partial", ReadFrom::WriteRegion).await.unwrap().doc;
    doc.primary.location = "northeurope".into();
    store.put_raw("res-partial", doc.to_json());
    monitor.drain().await.unwrap();
    // 60 s in: res-orphan's 20 s lease (from its effectiveAt, 10 s in) ended 30 s ago.
    clock.advance(31 * S);
    monitor.drain().await.unwrap();
    monitor.sweep();
    monitor.scan_once().await.unwrap();

    let status = monitor.status();
    assert_eq!((status.early_escalations, status.partial_cutovers, status.orphaned_locks), (1, 1, 1), "{status:#?}");
    assert_eq!(status.probe.in_flight, 1, "{status:#?}");
    let (base, stop) = serve(monitor_http::router(monitor.clone())).await;
    let url = format!("{base}/monitor");
    let dom = browser::dump_dom(&url);
    assert!(dom.contains("<h2>Anomalies <span class=\"badge fail\">3</span></h2>"), "{dom}");
    // Each anomaly with its resource and its age, counted from the monitor's clock.
    assert!(
        dom.contains("<td><code>res-early</code></td><td><time>2026-12-01T09:00:05Z</time></td><td>55.00 s</td>"),
        "{dom}"
    );
    assert!(
        dom.contains("<td><code>res-partial</code></td><td><time>2026-12-01T09:00:29Z</time></td><td>31.00 s</td>"),
        "{dom}"
    );
    assert!(
        dom.contains("<td><code>res-orphan</code></td><td><time>2026-12-01T09:00:30Z</time></td><td>30.00 s</td>"),
        "{dom}"
    );
    // In flight by phase: res-early (hardDelete), res-moving (preLock); res-partial's
    // lock (write) is still in its document.
    assert!(dom.contains("<desc id=\"in-flight-desc\">preLock 1, hardDelete 1, write 1</desc>"), "{dom}");
    // The probe's lock is apart, not among the fleet's.
    let probe = &dom[dom.find("id=\"probe-locks\"").expect("probe section")..];
    assert!(probe.contains("<dt>In flight</dt><dd>1 (preLock 1, hardDelete 0, write 0)</dd>"), "{probe}");
    // The clean swap's 13 s write lock, against the paper's figures.
    assert!(dom.contains("write hold: 1 values; p50 13.00 s"), "{dom}");
    assert!(dom.contains("within the paper's p50 13.00 s / p99 19.00 s"), "{dom}");
    screenshots(&url, "monitor-anomalies");
    browser::assert_fits_and_accessible(&get(&url).await, "monitor-anomalies");
    stop.cancel();
}

// ---------------------------------------------------------------------------------------
// The checks themselves can fail

#[test]
fn the_phone_check_catches_overflow_and_low_contrast() {
    // A page wider than a phone, with grey text on white at 2.3:1.
    let page = "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>bad</title>\
                <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"></head>\
                <body><main><div style=\"width:600px\">wide</div><p style=\"color:#aaaaaa;background:#ffffff\">faint</p>\
                </main></body></html>";
    let found = browser::inspect(page, "canary", false);
    assert_eq!(found.client_width, 390.0, "{found:?}");
    assert!(found.scroll_width > 390.0, "{found:?}");
    assert!(found.too_wide.iter().any(|w| w.starts_with("div")), "{found:?}");
    assert!(found.violations.iter().any(|v| v.starts_with("color-contrast")), "{found:?}");
}
