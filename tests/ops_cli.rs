//! What an operator gets from every process: `--log-format json` (one JSON object per log
//! line on stderr; a bad value is a usage error) and `lockprobe_build_info` plus the
//! process metrics on `/metrics`, here from `lockprobe monitor` alone; and a SIGHUP to
//! `service` or `monitor`, which have nothing to reload, is logged and survived. The
//! monitor watches the local Cosmos DB-compatible server: it refuses the in-memory store.

#[path = "support/cosmos_server.rs"]
mod cosmos_server;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The variable the monitor's Cosmos key is read from (the local server checks none).
const COSMOS_KEY_ENV: &str = "OPS_CLI_COSMOS_KEY";

/// `lockprobe monitor` flags for a fresh database on `server`, after `first`.
fn monitor_args(server: &cosmos_server::CosmosServer, first: &[&str]) -> Vec<String> {
    let database = cosmos_server::unique_database("ops-cli");
    let mut args: Vec<String> = std::iter::once("monitor").chain(first.iter().copied()).map(str::to_owned).collect();
    args.extend(cosmos_server::cli_args(&server.endpoint(), &database, COSMOS_KEY_ENV));
    args
}

/// `lockprobe monitor` without `--store` (or with `--store memory`) would watch an empty
/// store of its own and report an idle fleet: it refuses, naming `--store`, exit 64.
#[test]
fn the_monitor_refuses_to_watch_an_empty_store_of_its_own() {
    for args in [vec!["monitor", "--listen", "127.0.0.1:0"], vec!["monitor", "--store", "memory"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_lockprobe")).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains("--store") && stderr.contains("--store cosmos"), "{args:?}: {stderr}");
    }
}

#[test]
fn json_logs_build_info_and_process_metrics_from_the_monitor_alone() {
    let server = cosmos_server::CosmosServer::start();
    let mut child = Kill(
        Command::new(env!("CARGO_BIN_EXE_lockprobe"))
            .args(monitor_args(&server, &["--log-format", "json", "--listen", "127.0.0.1:0"]))
            .env(COSMOS_KEY_ENV, "bG9ja3Byb2Jl")
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = BufReader::new(child.0.stdout.take().unwrap());
    let stderr = child.0.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let listening = stdout
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("lockprobe monitor: listening on ").map(str::to_owned));
    let base = listening.expect("the monitor prints its address");

    // Every log line is one JSON object with a level and the message in `fields`.
    let line = rx.recv_timeout(Duration::from_secs(20)).expect("a log line");
    let log: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    assert_eq!(log["level"], "INFO", "{log}");
    assert!(log["fields"]["message"].is_string(), "{log}");

    let text = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async { reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap() });
    assert!(
        text.contains(&format!(
            "lockprobe_build_info{{contract=\"{}\",formats_read=\"{}\",newest_format=\"{}\",version=\"{}\"}} 1",
            lockprobe::versions::CONTRACT_VERSION,
            lockprobe::versions::formats_read(),
            lockprobe::versions::NEWEST_FORMAT,
            env!("CARGO_PKG_VERSION")
        )),
        "{text}"
    );
    #[cfg(target_os = "linux")]
    for name in ["process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"] {
        assert!(text.contains(&format!("\n{name} ")), "no {name} in\n{text}");
    }

    let bad = Command::new(env!("CARGO_BIN_EXE_lockprobe")).args(["monitor", "--log-format", "xml"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--log-format"), "{}", String::from_utf8_lossy(&bad.stderr));
}

/// `systemctl reload` (or any stray SIGHUP) must not take down the processes that have
/// nothing to reload: `service` and `monitor` log it and keep serving, and still stop
/// cleanly on SIGTERM. Without the handler, SIGHUP's default action ends them (exit 129).
/// A release engineer reads off one line what a build speaks and stores.
#[test]
fn the_version_names_the_contract_and_the_document_formats() {
    let out = Command::new(env!("CARGO_BIN_EXE_lockprobe")).arg("--version").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let line = String::from_utf8_lossy(&out.stdout);
    let expected = format!(
        "lockprobe {} (contract {}; document formats read {}, newest written {})",
        env!("CARGO_PKG_VERSION"),
        lockprobe::versions::CONTRACT_VERSION,
        lockprobe::versions::formats_read(),
        lockprobe::versions::NEWEST_FORMAT
    );
    assert_eq!(line.trim(), expected);
}

#[test]
fn service_and_monitor_log_and_survive_a_sighup() {
    let server = cosmos_server::CosmosServer::start();
    let service: Vec<String> =
        ["service", "--listen", "127.0.0.1:0", "--instances", "1"].iter().map(|a| a.to_string()).collect();
    for (args, key) in [
        (service, ("LOCKPROBE_LOCK_API_KEY", "k")),
        (monitor_args(&server, &["--listen", "127.0.0.1:0"]), (COSMOS_KEY_ENV, "bG9ja3Byb2Jl")),
    ] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_lockprobe"));
        command.args(&args).env("RUST_LOG", "warn").stdout(Stdio::piped()).stderr(Stdio::piped());
        command.env(key.0, key.1);
        let mut child = Kill(command.spawn().unwrap());
        // Both pipes are drained for the process's whole life: a closed stdout would make
        // its later lines fail, which is not what this test is about.
        let stdout = drain(child.0.stdout.take().unwrap());
        let rx = drain(child.0.stderr.take().unwrap());
        let base = std::iter::from_fn(|| stdout.recv_timeout(Duration::from_secs(20)).ok())
            .find_map(|l| l.split("listening on ").nth(1).map(str::to_owned))
            .unwrap_or_else(|| panic!("{args:?} prints its address"));

        let pid = child.0.id().to_string();
        assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
        let logged = std::iter::from_fn(|| rx.recv_timeout(Duration::from_secs(20)).ok())
            .find(|l| l.contains("SIGHUP ignored"))
            .unwrap_or_else(|| panic!("{args:?}: no `SIGHUP ignored` log line; exit {:?}", child.0.try_wait()));
        assert!(logged.contains(args[0].as_str()), "{logged}");
        let health = tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(async { reqwest::get(format!("{base}/healthz")).await.map(|r| r.status().as_u16()) });
        assert_eq!(health.ok(), Some(200), "{args:?} still serves after the SIGHUP");

        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let exit = loop {
            if let Some(exit) = child.0.try_wait().unwrap() {
                break exit;
            }
            assert!(std::time::Instant::now() < deadline, "{args:?} did not stop within 20 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(exit.success(), "{args:?}: {exit:?}");
    }
}

/// The lines of `pipe`, read on a thread of their own until it closes.
fn drain(pipe: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The listener's bounds are flags of every command that listens, refused alike.
#[test]
fn listener_bounds_are_usage_errors_naming_the_flag_on_serve_and_monitor() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("none.toml");
    for command in [vec!["monitor"], vec!["serve", "--config", config.to_str().unwrap()]] {
        for (flag, value) in [("--header-read-timeout", "10ms"), ("--max-connections", "0")] {
            let out =
                Command::new(env!("CARGO_BIN_EXE_lockprobe")).args(&command).args([flag, value]).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(64), "{command:?} {flag}: {stderr}");
            assert!(stderr.contains(flag), "{command:?} {flag}: {stderr}");
        }
    }
}
