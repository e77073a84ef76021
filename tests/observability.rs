//! Observability, proven against the real tools an on-call engineer uses.
//!
//! - `promtool check rules` / `promtool test rules` on `alerts/`.
//! - Every PromQL expression of `dashboards/lockprobe.json` and of the alert rules parses in
//!   a real Prometheus (its query API), and the rules load there with their labels.
//! - `lockprobe demo` is scraped: `promtool check metrics` is clean; a real Prometheus on
//!   loopback scrapes it and a second probe (`lockprobe serve` over a `lockprobe service`
//!   that ignores write locks), finds data for every expression, fires the violation
//!   alert for the broken target only, and its `histogram_quantile` agrees with the
//!   `/api/v1/status` percentiles.
//! - The monitor over a Cosmos DB store (the local test server) is scraped by a real
//!   Prometheus, and the monitor dashboard's request-charge panel shows RU/s by operation.
//! - A headless Chromium renders the status page of the running demo.
//!
//! The tools are not optional: when `promtool`, `prometheus` or `chromium` is missing the
//! tests fail and say to run `scripts/install-test-deps.sh` (the test script does).
//! Every wait has a deadline and every child process is killed by a drop guard.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use probe_config::{ProbeConfig, TargetConfig};
use serde_json::Value;

#[path = "support/browser.rs"]
mod browser;
#[path = "support/cosmos_server.rs"]
mod cosmos_server;
#[path = "support/probe_config.rs"]
mod probe_config;

// ---------------------------------------------------------------------------------------
// Tools and child processes

fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The absolute path of a required external tool, or a failure that says how to get it.
fn tool(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|dir| dir.join(name)).find(|p| p.is_file()));
    found.unwrap_or_else(|| {
        panic!(
            "`{name}` is not installed: these tests need it; run `scripts/install-test-deps.sh` \
             as root (or `bash scripts/test.sh`, which does)"
        )
    })
}

/// Kills and reaps its child when dropped, so no test leaves a process behind, even when an
/// assertion fails half-way.
struct ChildGuard {
    name: String,
    child: Child,
}

impl ChildGuard {
    fn spawn(name: &str, cmd: &mut Command) -> ChildGuard {
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        ChildGuard { name: name.to_string(), child }
    }

    /// Fails the test if the child has already exited (it was meant to keep running).
    fn assert_running(&mut self, context: &str) {
        if let Some(status) = self.child.try_wait().expect("try_wait") {
            panic!("{} exited early ({status}) {context}", self.name);
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a bounded run of a command produced.
struct Output {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Output {
    fn describe(&self) -> String {
        format!("exit: {}\n--- stdout\n{}\n--- stderr\n{}", self.status, self.stdout, self.stderr)
    }
}

/// How long an external tool (promtool, Chromium) or Prometheus' start-up may take:
/// only a safety net against one that hangs, since each does finish. promtool's rule unit
/// tests alone take about 30 s of CPU here, and several times that of wall time on a
/// loaded 2-core machine (they timed out at 60 s under stress).
const TOOL_DEADLINE: Duration = Duration::from_secs(300);

/// Runs a command to completion with `stdin`, killing it (and failing) after `timeout`.
fn run(cmd: &mut Command, stdin: Option<&[u8]>, timeout: Duration) -> Output {
    let what = format!("{cmd:?}");
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut guard = ChildGuard::spawn(&what, cmd);
    if let Some(input) = stdin {
        let mut pipe = guard.child.stdin.take().expect("stdin");
        let input = input.to_vec();
        // A writer thread: a large input must not deadlock against a full stdout pipe.
        thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
    }
    let stdout = read_in_background(guard.child.stdout.take().expect("stdout"));
    let stderr = read_in_background(guard.child.stderr.take().expect("stderr"));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = guard.child.try_wait().expect("try_wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "{what} did not finish within {timeout:?}");
        thread::sleep(Duration::from_millis(20));
    };
    Output { status, stdout: stdout.join().expect("stdout reader"), stderr: stderr.join().expect("stderr reader") }
}

fn read_in_background(mut pipe: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

/// A loopback port that was free a moment ago. The tools take a port number rather than a
/// listening socket, so there is a small window in which another process could take it;
/// on a test machine that is an acceptable risk.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("bind 127.0.0.1:0").port()
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(10)).no_proxy().build().expect("http client")
}

// ---------------------------------------------------------------------------------------
// The rules and the dashboard as data

const RULES: &str = "alerts/lockprobe.rules.yml";
const DASHBOARD: &str = "dashboards/lockprobe.json";
const MONITOR_DASHBOARD: &str = "dashboards/lockprobe-monitor.json";

fn rule_test_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_path("alerts/tests"))
        .expect("alerts/tests")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no promtool tests in alerts/tests");
    files
}

/// Alert names declared in the rule file. A line scan is enough: the file is ours and
/// every rule starts with `- alert: Name` (the real Prometheus load below cross-checks it).
fn alert_names() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo_path(RULES)).expect(RULES);
    text.lines().filter_map(|l| l.trim().strip_prefix("- alert:")).map(|n| n.trim().to_string()).collect()
}

/// One PromQL expression of the dashboard, with where it comes from.
struct DashboardExpr {
    origin: String,
    expr: String,
}

/// Every expression of the probe's dashboard (see [`dashboard_exprs_of`]).
fn dashboard_exprs(window: &str) -> Vec<DashboardExpr> {
    dashboard_exprs_of(DASHBOARD, window)
}

/// Every expression of `file`: panel targets (rows included) and the query of each
/// query variable (`label_values(selector, label)` is Grafana's, so its selector is used).
fn dashboard_exprs_of(file: &str, window: &str) -> Vec<DashboardExpr> {
    let text = std::fs::read_to_string(repo_path(file)).expect(file);
    let dash: Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let mut out = Vec::new();
    fn walk(panels: &Value, out: &mut Vec<(String, String)>) {
        for panel in panels.as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("?").to_string();
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().expect("panel target without expr");
                let ref_id = target["refId"].as_str().unwrap_or("?");
                out.push((format!("panel {title:?} target {ref_id}"), expr.to_string()));
            }
            walk(&panel["panels"], out);
        }
    }
    let mut raw = Vec::new();
    walk(&dash["panels"], &mut raw);
    for var in dash["templating"]["list"].as_array().expect("templating") {
        if var["type"] == "query" {
            let q = var["query"]["query"].as_str().or(var["query"].as_str()).expect("query variable without query");
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|r| r.strip_suffix(')'))
                .and_then(|r| r.rsplit_once(','))
                .map(|(sel, _label)| sel.trim().to_string())
                .unwrap_or_else(|| q.to_string());
            raw.push((format!("variable {}", var["name"]), inner));
        }
    }
    // The variables a panel may use, with the values the tests give them: every job,
    // instance and target (the variables' allValue) and a window long enough to cover the
    // whole demo run (Grafana's own `$__rate_interval` too).
    for (origin, expr) in raw {
        let mut expr = expr;
        for (name, value) in [("job", ".*"), ("instance", ".*"), ("target", ".*"), ("window", window)] {
            expr = expr.replace(&format!("${{{name}}}"), value).replace(&format!("${name}"), value);
        }
        let expr = expr.replace("$__rate_interval", window);
        assert!(!expr.contains('$'), "{origin}: unknown template variable in {expr}");
        out.push(DashboardExpr { origin, expr });
    }
    assert!(out.len() > 10, "suspiciously few dashboard expressions");
    out
}

/// Every `lockprobe_*` metric in `expr` with its label matchers (`""` when it has none).
fn metric_selectors(expr: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("lockprobe_") {
        let name: String = rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        rest = &rest[at + name.len()..];
        let matchers = match rest.strip_prefix('{').and_then(|r| r.split_once('}')) {
            Some((inside, after)) => {
                rest = after;
                inside.to_string()
            }
            None => String::new(),
        };
        out.push((name, matchers));
    }
    out
}

/// Asserts that every metric every panel of `file` reads is filtered by each of
/// `filters` (the dashboard's variables), and returns the panels' expressions.
fn assert_every_selector_filtered(file: &str, filters: &[&str]) -> Vec<String> {
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(repo_path(file)).expect(file)).expect("JSON");
    let vars = dash["templating"]["list"].as_array().expect("templating.list");
    for name in ["job", "instance"] {
        let var = vars.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("{file}: no ${name} variable"));
        assert_eq!(var["type"], "query", "{file}: ${name}");
        assert_eq!(var["multi"], true, "{file}: ${name} takes several values");
        assert_eq!(var["includeAll"], true, "{file}: ${name} has All");
        assert_eq!(var["allValue"], ".*", "{file}: ${name}'s All matches every value");
        let query = var["query"]["query"].as_str().or(var["query"].as_str()).expect("query");
        assert!(query.starts_with("label_values(lockprobe_") && query.ends_with(&format!(", {name})")), "{query}");
    }
    let mut exprs = Vec::new();
    let mut selectors = 0;
    // Collapsed rows keep their panels inside them.
    let mut panels: Vec<&Value> = dash["panels"].as_array().expect("panels").iter().collect();
    while let Some(panel) = panels.pop() {
        panels.extend(panel["panels"].as_array().into_iter().flatten());
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("expr");
            let found = metric_selectors(expr);
            assert!(!found.is_empty(), "{file}: {} reads no lockprobe metric: {expr}", panel["title"]);
            for (metric, matchers) in found {
                for filter in filters {
                    assert!(
                        matchers.contains(filter),
                        "{file}: {} reads {metric} without {filter}: {expr}",
                        panel["title"]
                    );
                }
                selectors += 1;
            }
            exprs.push(expr.to_string());
        }
    }
    assert!(selectors > 10, "{file}: suspiciously few selectors ({selectors})");
    exprs
}

// ---------------------------------------------------------------------------------------
// A real Prometheus on loopback

/// A Prometheus server in its own temporary directory, killed on drop.
struct Prometheus {
    base: String,
    child: ChildGuard,
    _dir: tempfile::TempDir,
}

/// One alerting rule as the running Prometheus loaded it.
struct LoadedRule {
    name: String,
    query: String,
    labels: Value,
    annotations: Value,
}

impl Prometheus {
    /// Starts Prometheus with the alert rules loaded, scraping every `scrape` (host:port)
    /// every second as job `lockprobe`, and waits until it is ready.
    async fn start(scrape: &[&str]) -> Prometheus {
        let bin = tool("prometheus");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n",
            serde_json::to_string(&repo_path(RULES)).unwrap()
        );
        if !scrape.is_empty() {
            config.push_str(&format!(
                "scrape_configs:\n  - job_name: lockprobe\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    static_configs:\n      - targets: {}\n",
                serde_json::to_string(scrape).unwrap()
            ));
        }
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus.yml");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let mut child = ChildGuard::spawn(
            "prometheus",
            Command::new(bin)
                .arg(format!("--config.file={}", config_path.display()))
                .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log),
        );
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + TOOL_DEADLINE;
        loop {
            if Instant::now() > deadline {
                panic!(
                    "prometheus not ready within {TOOL_DEADLINE:?}; log:\n{}",
                    std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
                );
            }
            if let Some(status) = child.child.try_wait().expect("try_wait") {
                panic!(
                    "prometheus exited ({status}); log:\n{}",
                    std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
                );
            }
            if let Ok(resp) = http().get(format!("{base}/-/ready")).send().await {
                if resp.status().is_success() {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        child.assert_running("after becoming ready");
        Prometheus { base, child, _dir: dir }
    }

    /// Runs an instant query and returns Prometheus' answer as it is.
    async fn query_raw(&self, expr: &str) -> Value {
        let mut url = reqwest::Url::parse(&format!("{}/api/v1/query", self.base)).unwrap();
        url.query_pairs_mut().append_pair("query", expr);
        let resp = http().get(url).send().await.expect("query request");
        resp.json().await.expect("query response is JSON")
    }

    /// Runs an instant query; a parse or execution error fails with Prometheus' message.
    async fn query(&self, expr: &str) -> Vec<Value> {
        let body = self.query_raw(expr).await;
        assert_eq!(body["status"], "success", "Prometheus rejected `{expr}`: {} {}", body["errorType"], body["error"]);
        match body["data"]["resultType"].as_str() {
            Some("vector") => body["data"]["result"].as_array().cloned().unwrap_or_default(),
            // A scalar result (e.g. from `time()` arithmetic) counts as one series.
            Some("scalar") => vec![body["data"]["result"].clone()],
            other => panic!("`{expr}`: unexpected result type {other:?}"),
        }
    }

    /// The alerting rules as loaded.
    async fn rules(&self) -> Vec<LoadedRule> {
        let body: Value = http()
            .get(format!("{}/api/v1/rules", self.base))
            .send()
            .await
            .expect("rules request")
            .json()
            .await
            .expect("rules JSON");
        let mut out = Vec::new();
        for group in body["data"]["groups"].as_array().expect("rule groups") {
            for rule in group["rules"].as_array().expect("rules") {
                assert_eq!(rule["type"], "alerting", "only alerting rules expected");
                out.push(LoadedRule {
                    name: rule["name"].as_str().expect("name").to_string(),
                    query: rule["query"].as_str().expect("query").to_string(),
                    labels: rule["labels"].clone(),
                    annotations: rule["annotations"].clone(),
                });
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------------------
// 1. promtool: rule syntax and rule unit tests

#[test]
fn alert_rules_pass_promtool_check_rules() {
    let out = run(Command::new(tool("promtool")).args(["check", "rules"]).arg(repo_path(RULES)), None, TOOL_DEADLINE);
    assert!(out.status.success(), "promtool check rules failed\n{}", out.describe());
    let expected = format!("SUCCESS: {} rules found", alert_names().len());
    assert!(out.stdout.contains(&expected), "expected `{expected}`\n{}", out.describe());
}

#[test]
fn alert_rule_unit_tests_pass_promtool_test_rules() {
    let out = run(
        Command::new(tool("promtool")).args(["test", "rules"]).args(rule_test_files()).current_dir(repo_path("")),
        None,
        TOOL_DEADLINE,
    );
    assert!(out.status.success(), "promtool test rules failed\n{}", out.describe());
}

/// Each alert of both rule files has at least one case where it fires and one where it
/// stays silent. The promtool files are ours and list `alertname:` followed by
/// `exp_alerts:` (`[]` = silent).
#[test]
fn every_alert_has_a_firing_and_a_silent_unit_test() {
    let mut fires = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for file in rule_test_files() {
        let text = std::fs::read_to_string(&file).expect("read test file");
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for (i, line) in lines.iter().enumerate() {
            if let Some(name) = line.strip_prefix("alertname:") {
                let next = lines.get(i + 1).copied().unwrap_or("");
                let name = name.trim().to_string();
                match next {
                    "exp_alerts: []" => silent.insert(name),
                    "exp_alerts:" => fires.insert(name),
                    other => panic!("{}: unexpected line after alertname: {other}", file.display()),
                };
            }
        }
    }
    // Both rule files: the probe's and the monitor's.
    let monitor_rules =
        std::fs::read_to_string(repo_path("alerts/lockprobe-monitor.rules.yml")).expect("monitor rules");
    let monitor_alerts =
        monitor_rules.lines().filter_map(|l| l.trim().strip_prefix("- alert:")).map(|n| n.trim().to_string());
    let all: BTreeSet<String> = alert_names().into_iter().chain(monitor_alerts).collect();
    assert!(all.len() > alert_names().len(), "no monitor alert found");
    for alert in all {
        assert!(fires.contains(&alert), "no unit test where {alert} fires");
        assert!(silent.contains(&alert), "no unit test where {alert} stays silent");
    }
}

/// The probe alerts judged by a target's schedule each fire and stay silent at a
/// 10-second, a 1-minute and a 6-hourly schedule: one promtool file per schedule. (The
/// others are judged per process or per hour of wall time, whatever the schedule.)
#[test]
fn every_schedule_judged_alert_fires_and_stays_silent_at_every_schedule() {
    const JUDGED_BY_SCHEDULE: [&str; 5] = [
        "LockprobeEnforcementViolation",
        "LockprobeConvergenceAboveDeclared",
        "LockprobeProbeFailing",
        "LockprobeNoRecentSuccess",
        "LockprobeNeverSucceeded",
    ];
    let names = alert_names();
    for alert in JUDGED_BY_SCHEDULE {
        assert!(names.contains(alert), "{alert} is not in the rule files");
    }
    for file in ["schedules_10s_test.yml", "schedules_1m_test.yml", "schedules_6h_test.yml"] {
        let text = std::fs::read_to_string(repo_path(&format!("alerts/tests/{file}"))).expect(file);
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for alert in JUDGED_BY_SCHEDULE {
            let after = |next: &str| lines.windows(2).any(|w| w[0] == format!("alertname: {alert}") && w[1] == next);
            assert!(after("exp_alerts:"), "{file}: no case where {alert} fires");
            assert!(after("exp_alerts: []"), "{file}: no case where {alert} stays silent");
        }
    }
}

/// One unit per axis: a panel's queries are all of one kind (quantiles or ages in
/// seconds, rates, counts, or plain values), so no rate shares an axis with seconds.
#[test]
fn every_panel_plots_one_kind_of_quantity() {
    fn kind(expr: &str) -> &'static str {
        if expr.contains("histogram_quantile(") {
            "quantile"
        } else if expr.contains("time() -") {
            "age"
        } else if expr.contains("rate(") {
            "rate"
        } else if expr.contains("increase(") {
            "count"
        } else {
            "value"
        }
    }
    for file in [DASHBOARD, MONITOR_DASHBOARD] {
        let dash: Value =
            serde_json::from_str(&std::fs::read_to_string(repo_path(file)).expect(file)).expect("dashboard is JSON");
        for panel in dash["panels"].as_array().expect("panels") {
            let kinds: BTreeSet<&str> = panel["targets"]
                .as_array()
                .map(|ts| ts.iter().filter_map(|t| t["expr"].as_str()).map(kind).collect())
                .unwrap_or_default();
            assert!(kinds.len() <= 1, "{file}: panel {:?} mixes {kinds:?} on one axis", panel["title"]);
        }
    }
}

/// The success-ratio panel's expression is the one `alerts/tests/schedules_6h_test.yml`
/// evaluates at a 6-hourly schedule (not NaN when no cycle ran in the window), with the
/// dashboard's default window.
#[test]
fn the_success_ratio_tested_at_a_6_hourly_schedule_is_the_dashboards() {
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(repo_path(DASHBOARD)).expect(DASHBOARD))
        .expect("dashboard is JSON");
    let window = dash["templating"]["list"]
        .as_array()
        .and_then(|vars| vars.iter().find(|v| v["name"] == "window"))
        .and_then(|v| v["current"]["value"].as_str())
        .expect("a default $window")
        .to_owned();
    let ratio = dashboard_exprs(&window)
        .into_iter()
        .find(|e| e.origin.starts_with("panel \"Probe success ratio\""))
        .expect("a Probe success ratio panel");
    let tests =
        std::fs::read_to_string(repo_path("alerts/tests/schedules_6h_test.yml")).expect("schedules_6h_test.yml");
    assert!(
        tests.contains(&format!("- expr: '{}'", ratio.expr)),
        "schedules_6h_test.yml does not test the dashboard's success ratio `{}`",
        ratio.expr
    );
}

/// The dashboard has what the issue asks of it: data source, job, instance and target as
/// template variables that every panel uses (every metric of every query is filtered by
/// job, instance and target), and a panel for each signal; panels do not overlap.
#[test]
fn dashboard_has_its_variables_and_a_panel_for_each_signal() {
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(repo_path(DASHBOARD)).expect(DASHBOARD))
        .expect("dashboard is JSON");
    let vars = dash["templating"]["list"].as_array().expect("templating.list");
    let var = |name: &str| vars.iter().find(|v| v["name"] == name);
    assert_eq!(var("datasource").expect("datasource variable")["type"], "datasource");
    assert_eq!(var("datasource").unwrap()["query"], "prometheus");
    assert_eq!(var("target").expect("target variable")["type"], "query");

    let panels: Vec<&Value> = dash["panels"].as_array().expect("panels").iter().collect();
    let mut cells = std::collections::HashMap::new();
    let mut ids = BTreeSet::new();
    let mut exprs = Vec::new();
    for p in &panels {
        assert!(ids.insert(p["id"].as_u64().expect("panel id")), "duplicate id {}", p["id"]);
        let g = &p["gridPos"];
        let (x, y, w, h) =
            (g["x"].as_u64().unwrap(), g["y"].as_u64().unwrap(), g["w"].as_u64().unwrap(), g["h"].as_u64().unwrap());
        assert!(x + w <= 24, "{} is wider than the grid", p["title"]);
        for cx in x..x + w {
            for cy in y..y + h {
                if let Some(other) = cells.insert((cx, cy), p["title"].clone()) {
                    panic!("{} overlaps {other}", p["title"]);
                }
            }
        }
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{} ignores the datasource variable", p["title"]);
        for t in p["targets"].as_array().expect("targets") {
            let e = t["expr"].as_str().expect("expr");
            assert!(e.contains(r#"target=~"$target""#), "{}: not filtered by $target: {e}", p["title"]);
            exprs.push(e.to_string());
        }
    }
    let filtered = assert_every_selector_filtered(
        DASHBOARD,
        &[r#"job=~"$job""#, r#"instance=~"$instance""#, r#"target=~"$target""#],
    );
    assert_eq!(filtered.len(), exprs.len(), "every panel's queries were checked");
    let has = |needle: &str| exprs.iter().any(|e| e.contains(needle));
    for needle in [
        r#"lockprobe_probe_runs_total{job=~"$job",instance=~"$instance",target=~"$target",result="passed"}"#,
        r#"lockprobe_assertions_total{job=~"$job",instance=~"$instance",target=~"$target",result="failed"}"#,
        "lockprobe_enforcement_violations_total",
        "histogram_quantile(0.5, sum by (target, phase, le) (rate(lockprobe_lock_phase_duration_seconds_bucket",
        "histogram_quantile(0.99, sum by (target, phase, le) (rate(lockprobe_lock_phase_duration_seconds_bucket",
        "histogram_quantile(0.99, sum by (target, le) (rate(lockprobe_read_through_latency_seconds_bucket",
        "lockprobe_convergence_declared_seconds",
        "lockprobe_convergence_observed_seconds",
        "time() - max by (target) (lockprobe_last_success_timestamp_seconds",
        // Judged by cycles: never NaN at a 6-hourly schedule, failures in a row.
        r#"or max by (target) (lockprobe_probe_last_cycle_passed{job=~"$job",instance=~"$instance",target=~"$target"})"#,
        r#"max by (target) (lockprobe_probe_consecutive_failures{job=~"$job",instance=~"$instance",target=~"$target"})"#,
    ] {
        assert!(has(needle), "no dashboard panel queries {needle}");
    }
}

/// The monitor over a Cosmos DB store is scraped by a real Prometheus, and the monitor
/// dashboard's request-charge query (RU/s by operation) returns data from that scrape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_charge_panel_shows_a_scraped_cosmos_monitors_charges() {
    let server = cosmos_server::CosmosServer::start();
    let database = cosmos_server::unique_database("observability");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut monitor = ChildGuard::spawn(
        "lockprobe monitor",
        Command::new(env!("CARGO_BIN_EXE_lockprobe"))
            .args(["monitor", "--listen", &listen, "--store", "cosmos", "--cosmos-endpoint", &server.endpoint()])
            .args(["--cosmos-key-env", "OBSERVABILITY_COSMOS_KEY", "--cosmos-database", &database])
            .args(["--cosmos-container", "locations", "--cosmos-create-if-missing", "--cosmos-poll-interval", "200ms"])
            .args(["--cosmos-write-region", "South Central US", "--cosmos-preferred-region", "South Central US"])
            // The local server checks no key; the flag wants one.
            .env("OBSERVABILITY_COSMOS_KEY", "bG9ja3Byb2Jl")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let prom = Prometheus::start(&[&listen]).await;
    let charge = dashboard_exprs_of(MONITOR_DASHBOARD, "30s")
        .into_iter()
        .find(|e| e.expr.contains("lockprobe_cosmos_request_charge_total"))
        .expect("a request-charge panel");
    let deadline = Instant::now() + Duration::from_secs(60);
    let ops = loop {
        monitor.assert_running("while Prometheus scrapes it");
        let series = prom.query(&charge.expr).await;
        let ops: BTreeSet<String> = series
            .iter()
            .filter(|s| sample_value(s).is_some_and(|v| v > 0.0))
            .filter_map(|s| s["metric"]["op"].as_str().map(str::to_owned))
            .collect();
        if !ops.is_empty() {
            break ops;
        }
        assert!(Instant::now() < deadline, "{}: no request charge within 60 s: `{}`", charge.origin, charge.expr);
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // One series per operation, as the panel's legend shows them.
    assert!(series_are_by_op(&prom.query(&charge.expr).await), "{ops:?}");
    drop(server);
}

/// Every series of a request-charge answer is labelled by `op` and nothing else.
fn series_are_by_op(series: &[Value]) -> bool {
    series.iter().all(|s| s["metric"].as_object().is_some_and(|m| m.keys().eq(["op"])))
}

/// The monitor's dashboard filters every metric by job and instance, and shows what the
/// Cosmos DB store costs: request units per second by operation.
#[test]
fn monitor_dashboard_filters_by_job_and_instance_and_shows_the_request_charge() {
    let exprs = assert_every_selector_filtered(MONITOR_DASHBOARD, &[r#"job=~"$job""#, r#"instance=~"$instance""#]);
    assert!(
        exprs.iter().any(|e| e.starts_with(
            r#"sum by (op) (rate(lockprobe_cosmos_request_charge_total{job=~"$job",instance=~"$instance"}[$__rate_interval]))"#
        )),
        "no request-charge panel (RU/s by op): {exprs:#?}"
    );
}

// ---------------------------------------------------------------------------------------
// 2. Every expression parses in a real Prometheus; the rules load with their metadata

#[tokio::test]
async fn every_promql_expression_parses_in_a_real_prometheus() {
    let mut prom = Prometheus::start(&[]).await;

    let rules = prom.rules().await;
    let loaded: BTreeSet<String> = rules.iter().map(|r| r.name.clone()).collect();
    assert_eq!(loaded, alert_names(), "Prometheus loaded other rules than the file lists");
    for rule in &rules {
        let severity = rule.labels["severity"].as_str().unwrap_or("");
        assert!(
            ["critical", "warning"].contains(&severity),
            "{}: severity label must be critical or warning, got {:?}",
            rule.name,
            rule.labels["severity"]
        );
        assert_eq!(
            rule.annotations["runbook_url"].as_str(),
            Some(format!("docs/runbook.md#{}", rule.name.to_lowercase()).as_str()),
            "{}: runbook_url must point at its section of docs/runbook.md",
            rule.name
        );
        for key in ["summary", "runbook"] {
            assert!(
                rule.annotations[key].as_str().is_some_and(|s| !s.trim().is_empty()),
                "{}: missing {key} annotation",
                rule.name
            );
        }
        prom.query(&rule.query).await;
    }

    for e in dashboard_exprs("5m").into_iter().chain(dashboard_exprs_of(MONITOR_DASHBOARD, "5m")) {
        let body = prom.query_raw(&e.expr).await;
        assert_eq!(body["status"], "success", "{}: Prometheus rejected `{}`: {}", e.origin, e.expr, body["error"]);
    }
    prom.child.assert_running("after the queries");
}

// ---------------------------------------------------------------------------------------
// What an alert condition measures

/// The series an alert condition is computed from: its expression split at the top-level
/// `or`, `and`, `unless` and comparison operators, scalar thresholds dropped, `absent(x)`
/// replaced by `x`, vector-matching modifiers (`on`, `ignoring`, `group_*`, `bool`) removed.
///
/// Why this and not "the expression without its threshold": a healthy probe must leave the
/// alerts silent, so the full conditions return nothing by design; what must not be empty
/// is the data each side of each condition reads. Checking every operand (not just one
/// alternative of an `or`) also catches a metric name in any branch that the probe does
/// not export.
fn measured_operands(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    collect_operands(expr, &mut out);
    out
}

fn collect_operands(expr: &str, out: &mut Vec<String>) {
    let expr = strip_modifiers(expr.trim());
    if let Some(inner) = strip_outer_parens(expr) {
        return collect_operands(inner, out);
    }
    if let Some(inner) = expr.strip_prefix("absent").and_then(|rest| strip_outer_parens(rest.trim_start())) {
        return collect_operands(inner, out);
    }
    // Lowest precedence first, as PromQL binds them.
    const LEVELS: [&[&str]; 3] = [&["or"], &["and", "unless"], &["==", "!=", ">=", "<=", ">", "<"]];
    for ops in LEVELS {
        let parts = split_top_level(expr, ops);
        if parts.len() > 1 {
            for part in parts {
                collect_operands(part, out);
            }
            return;
        }
    }
    let scalar = expr.chars().all(|c| c.is_ascii_digit() || " .+-*/%()eE".contains(c));
    if !scalar {
        out.push(expr.to_string());
    }
}

/// Removes the modifiers that may open the right-hand side of a binary operator.
fn strip_modifiers(mut s: &str) -> &str {
    loop {
        s = s.trim_start();
        let mut changed = false;
        for word in ["bool", "on", "ignoring", "group_left", "group_right"] {
            let Some(rest) = s.strip_prefix(word) else {
                continue;
            };
            if rest.starts_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                continue; // a longer identifier, e.g. a metric called `only_...`
            }
            let rest = rest.trim_start();
            s = match (rest.starts_with('('), matching_paren(rest)) {
                (true, Some(end)) => &rest[end + 1..],
                _ => rest,
            };
            changed = true;
        }
        if !changed {
            return s.trim();
        }
    }
}

/// Index of the `)` matching the `(` at the start of `s`.
fn matching_paren(s: &str) -> Option<usize> {
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' | '`' => quote = Some(c),
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

fn strip_outer_parens(s: &str) -> Option<&str> {
    let s = s.trim();
    (s.starts_with('(') && matching_paren(s) == Some(s.len() - 1)).then(|| &s[1..s.len() - 1])
}

/// Splits `s` at every occurrence of one of `ops` outside brackets and quotes.
fn split_top_level<'a>(s: &'a str, ops: &[&str]) -> Vec<&'a str> {
    let bytes = s.as_bytes();
    let mut parts = Vec::new();
    let (mut depth, mut start, mut i) = (0i32, 0usize, 0usize);
    let mut quote: Option<u8> = None;
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    while i < bytes.len() {
        let c = bytes[i];
        if let Some(q) = quote {
            if c == b'\\' {
                i += 2;
                continue;
            }
            if c == q {
                quote = None;
            }
            i += 1;
            continue;
        }
        match c {
            b'"' | b'\'' | b'`' => quote = Some(c),
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            _ if depth == 0 => {
                let hit = ops.iter().find(|op| {
                    let op = op.as_bytes();
                    if !bytes[i..].starts_with(op) {
                        return false;
                    }
                    if op[0].is_ascii_alphabetic() {
                        // A keyword needs a boundary on both sides.
                        let before = i == 0 || !ident(bytes[i - 1]);
                        let after = bytes.get(i + op.len()).is_none_or(|b| !ident(*b));
                        before && after
                    } else {
                        // `>` must not be the start of `>=`, nor `=`/`!` of `=~`/`!~`.
                        !matches!(bytes.get(i + op.len()), Some(b'=') | Some(b'~'))
                    }
                });
                if let Some(op) = hit {
                    parts.push(&s[start..i]);
                    i += op.len();
                    start = i;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    parts.push(&s[start..]);
    parts
}

#[test]
fn measured_operands_drop_thresholds_and_keep_every_data_side() {
    assert_eq!(measured_operands(r#"up{job="lockprobe"} == 0"#), vec![r#"up{job="lockprobe"}"#]);
    assert_eq!(measured_operands("absent(lockprobe_probe_runs_total)"), vec!["lockprobe_probe_runs_total"]);
    assert_eq!(
        measured_operands("max by (target) (a) > max by (target) (b) or sum by (target) (increase(c[30m])) > 0"),
        vec!["max by (target) (a)", "max by (target) (b)", "sum by (target) (increase(c[30m]))"]
    );
    assert_eq!(
        measured_operands("count by (target) (r) unless on (target) (s > 0)"),
        vec!["count by (target) (r)", "s"]
    );
    assert_eq!(
        measured_operands("time() - max by (target) (s > 0) > 6 * 3600"),
        vec!["time() - max by (target) (s > 0)"]
    );
    assert_eq!(measured_operands(r#"(x{a=~"p|q"} or y * 0) / z >= 0.5"#), vec![r#"(x{a=~"p|q"} or y * 0) / z"#]);
    assert_eq!(measured_operands(r#"m{l!="a>b"} > bool 1"#), vec![r#"m{l!="a>b"}"#]);
}

// ---------------------------------------------------------------------------------------
// A running `lockprobe demo`

/// The demo the tests start: its defaults (a cycle every 10 s, about 5 s long), running
/// until it is killed.
const DEMO_ARGS: &[&str] = &["demo"];

/// How long a demo may take to print its address and to finish its first cycles.
const DEMO_DEADLINE: Duration = Duration::from_secs(90);

/// A running probe (`lockprobe demo`, or `lockprobe serve` in front of a separate
/// `lockprobe service`) in its own directory; every process is killed on drop.
struct Demo {
    /// Base URL of the probe's HTTP server (`/metrics`, `/api/v1/status`, `/`).
    base: String,
    /// Host and port, for a scrape config.
    host_port: String,
    /// The probe process.
    child: ChildGuard,
    /// The service it probes, when that runs in its own process.
    service: Option<ChildGuard>,
    _lines: Vec<mpsc::Receiver<String>>,
    dir: tempfile::TempDir,
}

/// Forwards `pipe` line by line for the child's whole life, so its output never fills
/// the pipe and blocks it.
fn line_reader(pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Collects lines until one satisfies `done`; fails after `DEMO_DEADLINE` or when the
/// child closes its output, showing what it printed and `stderr_file`.
fn lines_until(
    rx: &mpsc::Receiver<String>,
    what: &str,
    stderr_file: &Path,
    done: impl Fn(&str) -> bool,
) -> Vec<String> {
    let deadline = Instant::now() + DEMO_DEADLINE;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let finished = done(&line);
                seen.push(line);
                if finished {
                    return seen;
                }
            }
            Err(e) => panic!(
                "{what} ({}); stdout so far:\n{}\nstderr:\n{}",
                match e {
                    mpsc::RecvTimeoutError::Timeout => format!("waited {DEMO_DEADLINE:?}"),
                    mpsc::RecvTimeoutError::Disconnected => "it closed its stdout".to_string(),
                },
                seen.join("\n"),
                std::fs::read_to_string(stderr_file).unwrap_or_default()
            ),
        }
    }
}

fn first_url(line: &str) -> Option<String> {
    line.split_whitespace()
        .find(|w| w.starts_with("http://"))
        .map(|u| u.trim_end_matches(['.', ',', ';', ')']).to_string())
}

impl Demo {
    /// Starts the demo and waits for the line that names its metrics URL (the demo prints
    /// one containing "metrics" and an `http://` URL).
    fn start(extra: &[&str]) -> Demo {
        let dir = tempfile::tempdir().expect("tempdir");
        let stderr_file = dir.path().join("demo.stderr");
        let mut child = ChildGuard::spawn(
            "lockprobe demo",
            Command::new(env!("CARGO_BIN_EXE_lockprobe"))
                .args(DEMO_ARGS)
                .args(extra)
                .current_dir(dir.path())
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(&stderr_file).expect("log file")),
        );
        let rx = line_reader(child.child.stdout.take().expect("stdout"));
        let lines = lines_until(&rx, "lockprobe demo printed no line with its metrics URL", &stderr_file, |l| {
            l.to_lowercase().contains("metrics") && first_url(l).is_some()
        });
        let url = first_url(lines.last().unwrap()).unwrap();
        let host_port = url["http://".len()..].split('/').next().expect("host:port").to_string();
        Demo { base: format!("http://{host_port}"), host_port, child, service: None, _lines: vec![rx], dir }
    }

    /// `lockprobe serve` probing a two-instance `lockprobe service` that ignores write
    /// locks (its `--fault ignore-write-lock`): the probe finds enforcement violations.
    /// The target is named `faulty`, so its alerts are told apart from the demo's.
    async fn start_faulty() -> Demo {
        let bin = env!("CARGO_BIN_EXE_lockprobe");
        let dir = tempfile::tempdir().expect("tempdir");
        // A throwaway key for a loopback-only service that lives as long as the test.
        let key = format!("obs-test-key-{}", std::process::id());
        let service_err = dir.path().join("service.stderr");
        let mut service = ChildGuard::spawn(
            "lockprobe service",
            Command::new(bin)
                .args(["service", "--instances", "2", "--listen", "127.0.0.1:0"])
                .args(["--cache-ttl", "1s", "--replication-bound", "500ms"])
                .args(["--test-prefix", "probe-", "--fault", "ignore-write-lock"])
                .env("LOCKPROBE_LOCK_API_KEY", &key)
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(&service_err).expect("log file")),
        );
        let service_rx = line_reader(service.child.stdout.take().expect("stdout"));
        let lines = lines_until(
            &service_rx,
            "lockprobe service did not print its instances and declared delay",
            &service_err,
            |l| l.contains("declared convergence delay"),
        );
        let instances: Vec<String> =
            lines.iter().filter(|l| l.contains("listening on")).filter_map(|l| first_url(l)).collect();
        assert_eq!(instances.len(), 2, "service instances in {lines:?}");

        let port = free_port();
        let config_path = ProbeConfig::new(dir.path().join("state.json"))
            .listen(format!("127.0.0.1:{port}"))
            .target(
                TargetConfig::new("faulty", &instances)
                    .api_key_env("LOCKPROBE_OBS_TEST_KEY")
                    .set("pool_size", 14)
                    .buffer("500ms")
                    .schedule("*/5 * * * * *")
                    .set("poll_interval", "100ms"),
            )
            .write_as(dir.path(), "lockprobe.toml");
        let stderr_file = dir.path().join("demo.stderr");
        // A web configuration without TLS or users (Prometheus scrapes it as before), so
        // its reload gauges, which LockprobeWebConfigReloadFailed reads, are exported.
        let web_config = dir.path().join("web.yml");
        std::fs::write(&web_config, "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n")
            .expect("web config");
        let mut child = ChildGuard::spawn(
            "lockprobe serve",
            Command::new(bin)
                .arg("serve")
                .arg("--web.config.file")
                .arg(&web_config)
                .arg("--config")
                .arg(&config_path)
                .env("LOCKPROBE_OBS_TEST_KEY", &key)
                .env("RUST_LOG", "warn")
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&stderr_file).expect("log file")),
        );
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + DEMO_DEADLINE;
        loop {
            child.assert_running("before becoming ready");
            service.assert_running("while the probe starts");
            if let Ok(r) = http().get(format!("{base}/readyz")).send().await {
                if r.status().is_success() {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "lockprobe serve not ready within {DEMO_DEADLINE:?}; stderr:\n{}",
                std::fs::read_to_string(&stderr_file).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Demo {
            base,
            host_port: format!("127.0.0.1:{port}"),
            child,
            service: Some(service),
            _lines: vec![service_rx],
            dir,
        }
    }

    /// Fails the test if any of its processes has exited.
    fn assert_running(&mut self, context: &str) {
        self.child.assert_running(context);
        if let Some(service) = &mut self.service {
            service.assert_running(context);
        }
    }

    fn stderr(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
        format!("{}{}", read("demo.stderr"), read("service.stderr"))
    }

    async fn get_text(&self, path: &str) -> String {
        let resp = http()
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path} on the demo: {e}\ndemo stderr:\n{}", self.stderr()));
        assert!(resp.status().is_success(), "GET {path}: {}", resp.status());
        resp.text().await.expect("body")
    }

    async fn status(&self) -> Value {
        serde_json::from_str(&self.get_text("/api/v1/status").await).expect("status is JSON")
    }

    /// Waits until every target has finished `cycles` cycles, one of them passed when
    /// `passed` is set.
    async fn wait_for_cycles(&mut self, cycles: usize, passed: bool) -> Value {
        let deadline = Instant::now() + DEMO_DEADLINE;
        loop {
            self.assert_running("while waiting for cycles");
            let status = self.status().await;
            let targets = status["targets"].as_array().cloned().unwrap_or_default();
            let done = !targets.is_empty()
                && targets.iter().all(|t| {
                    t["lastCycles"].as_array().is_some_and(|c| c.len() >= cycles)
                        && (!passed || !t["lastSuccessAt"].is_null())
                });
            if done {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the demo did not finish {cycles} cycles (passed: {passed}) within {DEMO_DEADLINE:?}; \
                 status: {status:#}\nstderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

// ---------------------------------------------------------------------------------------
// 3. The running demo in the Prometheus ecosystem

// Prometheus scrapes two probes: the demo (healthy) and `lockprobe serve` probing a service
// that breaks enforcement on purpose (`Demo::start_faulty`). Together they give every
// expression of the dashboard and the rules its data (the violation counter only has
// series once a violation happened), and show the critical alert firing on real data.

#[tokio::test]
async fn demo_metrics_lint_clean_and_a_real_prometheus_finds_every_expression() {
    let promtool = tool("promtool");
    // Fail before the slow part when Prometheus is missing.
    tool("prometheus");
    let mut healthy = Demo::start(&[]);
    let mut faulty = Demo::start_faulty().await;
    healthy.wait_for_cycles(1, true).await;
    faulty.wait_for_cycles(1, false).await;

    // `promtool check metrics` on a real scrape: exit 0 and nothing reported.
    let scrape = healthy.get_text("/metrics").await;
    assert!(scrape.contains("lockprobe_"), "no lockprobe metrics in:\n{scrape}");
    for (which, text) in [("healthy", scrape.clone()), ("faulty", faulty.get_text("/metrics").await)] {
        let lint = run(Command::new(&promtool).args(["check", "metrics"]), Some(text.as_bytes()), TOOL_DEADLINE);
        assert!(
            lint.status.success() && lint.stdout.trim().is_empty() && lint.stderr.trim().is_empty(),
            "promtool check metrics reported problems on the {which} demo\n{}",
            lint.describe()
        );
    }

    // A real Prometheus scrapes both demos every second, with the alert rules loaded.
    let mut prom = Prometheus::start(&[&healthy.host_port, &faulty.host_port]).await;
    let deadline = Instant::now() + DEMO_DEADLINE;
    // Rates and histogram quantiles need a counter increase between two scrapes: wait for
    // a cycle of each demo that finished after Prometheus' first scrape of it.
    let mut first_runs: [Option<f64>; 2] = [None, None];
    let mut increased = [false, false];
    while increased != [true, true] {
        for (i, demo) in [&mut healthy, &mut faulty].into_iter().enumerate() {
            demo.assert_running("while Prometheus scrapes it");
            let runs = prom
                .query(&format!(r#"sum(lockprobe_probe_runs_total{{job="lockprobe",instance="{}"}})"#, demo.host_port))
                .await;
            if let Some(v) = runs.first().and_then(sample_value) {
                match first_runs[i] {
                    None => first_runs[i] = Some(v),
                    Some(first) => increased[i] |= v > first,
                }
            }
        }
        prom.child.assert_running("while scraping");
        assert!(
            Instant::now() < deadline,
            "Prometheus saw no finished cycle of each demo within {DEMO_DEADLINE:?} (first values {first_runs:?})"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Some expressions need a scrape after the increase too. Prometheus scrapes late on
    // a loaded machine, so instead of sleeping a fixed time, every expression is asked
    // again until all return data, or the deadline passes and the empty ones are named.
    let rules = prom.rules().await;
    assert_eq!(rules.len(), alert_names().len());
    let deadline = Instant::now() + Duration::from_secs(30);
    let empty = loop {
        let mut empty = Vec::new();
        // The dashboard: every expression, with `$target` = all targets and a window that
        // covers the whole run, returns at least one series.
        for e in dashboard_exprs("10m") {
            if prom.query(&e.expr).await.is_empty() {
                empty.push(format!("dashboard {}: `{}`", e.origin, e.expr));
            }
        }
        // The rules: every series an alert condition reads returns data (see
        // `measured_operands` for why the thresholds are dropped).
        for rule in &rules {
            let operands = measured_operands(&rule.query);
            assert!(!operands.is_empty(), "{}: no operands in {}", rule.name, rule.query);
            for operand in operands {
                if prom.query(&operand).await.is_empty() {
                    empty.push(format!("alert {}: `{operand}`", rule.name));
                }
            }
        }
        if empty.is_empty() || Instant::now() >= deadline {
            break empty;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        empty.is_empty(),
        "these expressions return no series from a real scrape of the demos:\n{}\n\nscrape of the healthy demo:\n{scrape}",
        empty.join("\n")
    );

    // The broken service pages: the violation alert fires in Prometheus itself.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let firing = prom.query(r#"ALERTS{alertname="LockprobeEnforcementViolation",alertstate="firing"}"#).await;
        if let Some(alert) = firing.first() {
            let m = &alert["metric"];
            assert_eq!(m["target"], "faulty", "{alert}");
            assert_eq!(m["severity"], "critical");
            assert_ne!(m["expected"], m["observed"], "{alert}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "LockprobeEnforcementViolation did not fire for the faulty demo; violations: {:?}",
            prom.query("lockprobe_enforcement_violations_total").await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The violation panel's own query counts every violation from the first: the faulty
    // demo's series were born non-zero (its first cycle ran before Prometheus' first
    // scrape), which increase() alone would not count.
    let panel = dashboard_exprs("10m")
        .into_iter()
        .find(|e| e.origin.starts_with("panel \"Enforcement violations\""))
        .expect("an Enforcement violations panel");
    let counted = format!("sum({}) - sum(lockprobe_enforcement_violations_total)", panel.expr);
    let total = prom.query("sum(lockprobe_enforcement_violations_total)").await;
    let total = total.first().and_then(sample_value).expect("the faulty demo's violations are scraped");
    assert!(total > 0.0, "the faulty demo has violations");
    let missed = prom.query(&counted).await;
    assert_eq!(
        missed.first().and_then(sample_value),
        Some(0.0),
        "the violation panel misses some of the {total} violations: `{counted}` gave {missed:?}"
    );

    // And the healthy demo pages nobody: no alert about it fires, nor is even pending,
    // but LockprobeMissedSchedules (a warning, 5 m before it fires). On a loaded machine
    // a demo cycle can outlast its schedule's interval, and that alert then rightly
    // reports the host's lack of capacity, not a fault of the service.
    let demo_alerts = prom.query(r#"ALERTS{target="demo",alertname!="LockprobeMissedSchedules"}"#).await;
    assert!(demo_alerts.is_empty(), "alerts for the healthy demo: {demo_alerts:?}");
    let firing = prom.query(r#"ALERTS{target="demo",alertstate="firing"}"#).await;
    assert!(firing.is_empty(), "alerts firing for the healthy demo: {firing:?}");

    for demo in [&healthy, &faulty] {
        check_percentiles_agree(demo, &prom).await;
    }
    prom.child.assert_running("at the end");
    healthy.assert_running("at the end");
    faulty.assert_running("at the end");
}

fn sample_value(series: &Value) -> Option<f64> {
    series["value"][1].as_str().and_then(|v| v.parse().ok())
}

/// `/api/v1/status` percentiles (exact, from the HDR histograms) against Prometheus'
/// `histogram_quantile` over the same observations.
///
/// Same data: the status API and the Prometheus histogram count the same observations
/// since the demo started, so the comparison is made at a moment when Prometheus' `_count`
/// equals the status `count` (no cycle finished in between), and on the cumulative bucket
/// counters (not a rate window), which cover the same population.
///
/// Tolerance: Prometheus knows only bucket counts. For quantile q it takes rank q·n, finds
/// the first bucket whose cumulative count reaches it (the same observation HDR returns)
/// and interpolates linearly inside that bucket. So the two agree exactly on the bucket and
/// not inside it: the check is that Prometheus' estimate lies in the bucket (lo, hi] that
/// holds the HDR value, widened by 0.1% because HDR keeps 3 significant digits. A value
/// above the last finite bucket is reported by Prometheus as that bucket's bound.
async fn check_percentiles_agree(demo: &Demo, prom: &Prometheus) {
    let deadline = Instant::now() + Duration::from_secs(30);
    'retry: loop {
        assert!(Instant::now() < deadline, "Prometheus' histogram counts never matched the status API's counts");
        let status = demo.status().await;
        let mut compared = 0;
        for target in status["targets"].as_array().expect("targets") {
            let name = target["name"].as_str().expect("target name");
            let pct = &target["percentiles"];
            let inst = &demo.host_port;
            let mut series: Vec<(String, &Value)> = vec![(
                format!(r#"lockprobe_read_through_latency_seconds_bucket{{instance="{inst}",target="{name}"}}"#),
                &pct["readThroughLatencySeconds"],
            )];
            for (phase, summary) in pct["lockPhaseDurationSeconds"].as_object().expect("phases") {
                series.push((
                    format!(
                        r#"lockprobe_lock_phase_duration_seconds_bucket{{instance="{inst}",target="{name}",phase="{phase}"}}"#
                    ),
                    summary,
                ));
            }
            for (selector, summary) in series {
                let count = summary["count"].as_u64().expect("count");
                if count == 0 {
                    continue;
                }
                let count_selector = selector.replace("_bucket{", "_count{");
                let prom_count = prom.query(&format!("sum({count_selector})")).await;
                let prom_count = prom_count.first().and_then(sample_value);
                if prom_count != Some(count as f64) {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    continue 'retry;
                }
                let buckets = bucket_bounds(&prom.query(&selector).await);
                for (key, q) in [("p50", 0.5), ("p75", 0.75), ("p99", 0.99)] {
                    let exact = summary[key].as_f64().expect("percentile");
                    let estimate = prom
                        .query(&format!("histogram_quantile({q}, sum by (le) ({selector}))"))
                        .await
                        .first()
                        .and_then(sample_value)
                        .unwrap_or_else(|| panic!("no histogram_quantile for {selector}"));
                    // HDR keeps 3 significant digits: an exact value within 0.1% of a
                    // bucket bound may belong to either bucket beside it.
                    let (lo, _) = bucket_of(&buckets, exact * 0.999);
                    let (_, hi) = bucket_of(&buckets, exact * 1.001);
                    assert!(
                        estimate >= lo * 0.999 && estimate <= hi * 1.001,
                        "{selector} {key}: status API says {exact}, Prometheus {estimate}, \
                         outside the bucket ({lo}, {hi}] that holds the exact value"
                    );
                    compared += 1;
                }
            }
        }
        assert!(compared >= 6, "too few percentiles compared ({compared})");
        return;
    }
}

/// The finite upper bounds of a histogram's buckets, sorted.
fn bucket_bounds(series: &[Value]) -> Vec<f64> {
    let mut les: Vec<f64> = series
        .iter()
        .filter_map(|s| s["metric"]["le"].as_str())
        .filter_map(|le| le.parse::<f64>().ok())
        .filter(|le| le.is_finite())
        .collect();
    les.sort_by(f64::total_cmp);
    les.dedup();
    assert!(!les.is_empty(), "no buckets");
    les
}

/// The bucket (lo, hi] holding `v`; above the last finite bound, Prometheus answers with
/// that bound, so the "bucket" is the bound itself.
fn bucket_of(bounds: &[f64], v: f64) -> (f64, f64) {
    let mut lo = 0.0;
    for &hi in bounds {
        if v <= hi {
            return (lo, hi);
        }
        lo = hi;
    }
    (lo, lo)
}

// ---------------------------------------------------------------------------------------
// 4. The status page in a real browser

#[tokio::test]
async fn headless_chromium_shows_the_target_and_its_last_cycle() {
    let mut demo = Demo::start(&[]);
    let status = demo.wait_for_cycles(1, true).await;
    let target = &status["targets"][0];
    let name = target["name"].as_str().expect("target name").to_string();
    let last = &target["lastCycles"][0];
    let started = last["startedAt"].as_str().expect("startedAt").to_string();
    let resource = last["resource"].as_str().expect("resource").to_string();

    // The same browser flags as the page tests: one list, in the support module.
    let dom = browser::dump_dom(&format!("{}/", demo.base));
    // Text as the browser parsed it: the page's own escaping is undone by the parser, so
    // plain names and timestamps appear as they are.
    assert!(dom.contains(&format!("<h2>{name}</h2>")), "target {name} not on the page:\n{dom}");
    assert!(dom.contains(&started), "last cycle {started} not on the page:\n{dom}");
    assert!(dom.contains(&resource), "last cycle's resource {resource} not on the page:\n{dom}");
    demo.assert_running("after the browser visit");
}
