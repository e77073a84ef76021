//! The processes an operator runs, on the Cosmos store (local test server):
//! `lockprobe serve` with a `[monitor]` table, where the probe drives migrations through
//! the reference service on Cosmos and the monitor in the same process watches that
//! store; and `lockprobe demo --store cosmos`.

#[path = "support/cosmos_server.rs"]
mod cosmos_server;
#[path = "support/probe_config.rs"]
mod probe_config;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use cosmos_server::CosmosServer;
use lockprobe::clock::{Clock, SystemClock};
use lockprobe::service::{start, ServiceConfig};
use lockprobe::store::LocationStore;
use probe_config::{table, ProbeConfig, TargetConfig};
use prometheus::Registry;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads the address `serve` logged for its HTTP server (it binds port 0 itself, so no
/// other process can take the port between a test choosing it and `serve` binding it).
fn bound_address(stderr: std::process::ChildStderr) -> String {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("probe http server listening") {
                if let Some(addr) = line.split("addr=").nth(1).and_then(|rest| rest.split_whitespace().next()) {
                    let _ = tx.send(addr.to_owned());
                }
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30)).expect("serve logs its listening address")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_the_monitor_over_the_store_the_config_names() {
    let server = CosmosServer::start();
    let database = cosmos_server::unique_database("serve-monitor");
    let store: Arc<dyn LocationStore> = Arc::new(
        cosmos_server::connect_with(&server.endpoint(), &Registry::new(), |a| a.database = Some(database.clone()))
            .await,
    );
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let key = "serve-monitor-key";
    let config = ServiceConfig {
        cache_ttls: vec![Duration::from_millis(500)],
        replication_bound: Duration::from_millis(200),
        test_prefix: Some("probe-".into()),
        ..ServiceConfig::new(key)
    };
    let stop = CancellationToken::new();
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let running = start(config, store, clock, vec![any, any], stop.clone()).await.unwrap();
    let instances: Vec<String> = running.addrs.iter().map(|a| format!("http://{a}")).collect();

    let dir = tempfile::tempdir().unwrap();
    let config_path = ProbeConfig::new(dir.path().join("state.json"))
        .listen("127.0.0.1:0")
        .target(
            TargetConfig::new("cosmos-backed", &instances)
                .api_key_env("SERVE_MONITOR_LOCK_KEY")
                .set("cache_ttl", "500ms")
                .set("replication_bound", "200ms")
                .buffer("300ms")
                .schedule("*/2 * * * * *")
                .set("concurrency", 1)
                .set("poll_interval", "50ms"),
        )
        .monitor(table([
            ("store", "cosmos".into()),
            ("cosmos_endpoint", server.endpoint().into()),
            ("cosmos_key_env", "SERVE_MONITOR_COSMOS_KEY".into()),
            ("cosmos_database", database.as_str().into()),
            ("cosmos_container", "locations".into()),
            ("cosmos_write_region", "South Central US".into()),
            ("cosmos_preferred_region", vec!["South Central US"].into()),
            ("cosmos_poll_interval", "100ms".into()),
            ("monitor_poll_interval", "50ms".into()),
            ("monitor_escalation_buffer", "300ms".into()),
        ]))
        .write_as(dir.path(), "lockprobe.toml");

    let check = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
        .arg("check-config")
        .arg(&config_path)
        .env("SERVE_MONITOR_COSMOS_KEY", "bG9ja3Byb2Jl")
        .env("SERVE_MONITOR_LOCK_KEY", "k")
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    let no_key = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
        .arg("check-config")
        .arg(&config_path)
        .env_remove("SERVE_MONITOR_COSMOS_KEY")
        .env("SERVE_MONITOR_LOCK_KEY", "k")
        .output()
        .unwrap();
    assert_eq!(no_key.status.code(), Some(64), "the [monitor] key variable is checked too");
    assert!(String::from_utf8_lossy(&no_key.stderr).contains("SERVE_MONITOR_COSMOS_KEY"));

    let mut serve = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_lockprobe"))
            .args(["serve", "--config"])
            .arg(&config_path)
            .env("SERVE_MONITOR_LOCK_KEY", key)
            .env("SERVE_MONITOR_COSMOS_KEY", "bG9ja3Byb2Jl")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let listen = bound_address(serve.0.stderr.take().unwrap());

    let http = reqwest::Client::new();
    let mut monitor = Value::Null;
    let mut status = Value::Null;
    for _ in 0..400 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Ok(resp) = http.get(format!("http://{listen}/api/v1/monitor")).send().await else { continue };
        monitor = resp.json().await.unwrap_or(Value::Null);
        status = http.get(format!("http://{listen}/api/v1/status")).send().await.unwrap().json().await.unwrap();
        let cycle_done = !status["targets"][0]["lastCycles"][0].is_null();
        if cycle_done && monitor["probe"]["migrations"]["swapped"].as_u64().unwrap_or(0) >= 1 {
            break;
        }
    }
    assert!(
        monitor["probe"]["migrations"]["swapped"].as_u64().unwrap_or(0) >= 1,
        "the monitor saw the probe's swap: {monitor}"
    );
    assert_eq!(monitor["probe"]["partialCutovers"], 0);
    assert_eq!(monitor["probe"]["earlyEscalations"], 0, "the probe waited out the declared delay: {monitor}");
    let cycle = &status["targets"][0]["lastCycles"][0];
    assert_eq!(cycle["result"], "passed", "{cycle}");
    let metrics = http.get(format!("http://{listen}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(
        metrics.contains("lockprobe_monitor_migrations_total{outcome=\"swapped\",source=\"probe\"}"),
        "one /metrics for both"
    );
    assert!(metrics.contains("lockprobe_probe_runs_total"));
    stop.cancel();
}

#[test]
fn the_demo_runs_a_passing_cycle_on_the_cosmos_store() {
    let server = CosmosServer::start();
    let database = cosmos_server::unique_database("demo");
    let out = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
        // Without the simulated fleet: its early escalation and orphan are anomalies by
        // design, and the monitor must find none of its own making here.
        .args(["demo", "--cycles", "1", "--schedule", "* * * * * *", "--store", "cosmos", "--no-fleet"])
        // The local server on a loaded 2-core machine can take seconds per call; the
        // default 1 s would have the service refuse its own seeding (503), which is the
        // service doing its job, not what this test is about.
        .args(["--max-decision-age", "5s"])
        .args(["--cosmos-endpoint", &server.endpoint(), "--cosmos-key-env", "DEMO_COSMOS_KEY"])
        .args(["--cosmos-database", &database, "--cosmos-container", "locations", "--cosmos-create-if-missing"])
        .args(["--cosmos-write-region", "South Central US", "--cosmos-preferred-region", "South Central US"])
        .env("DEMO_COSMOS_KEY", "bG9ja3Byb2Jl")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("1 cycle(s), 0 not passed"), "{stdout}");
    assert!(stdout.contains("early escalations 0, partial cutovers 0"), "the monitor watched cosmos: {stdout}");
}
