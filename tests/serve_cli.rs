//! `lockprobe serve --listen ADDR`: the flag overrides the config's `listen`, so a
//! container can bind 0.0.0.0 without editing its mounted config; a bad address is a
//! usage error (exit 64) naming the flag.

#[path = "support/probe_config.rs"]
mod probe_config;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use probe_config::{ProbeConfig, TargetConfig};

const KEY_ENV: &str = "LOCKPROBE_TEST_SERVE_CLI_KEY";

fn config(dir: &std::path::Path, listen: &str) -> std::path::PathBuf {
    ProbeConfig::new(dir.join("state.json"))
        .listen(listen)
        .target(
            TargetConfig::new("cli", ["http://127.0.0.1:9"])
                .api_key_env(KEY_ENV)
                // Once a year: the test only needs the server, not a cycle.
                .schedule("0 0 0 1 1 *")
                .timeout("5m")
                .remove("leases"),
        )
        .write(dir)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn listen_flag_overrides_the_config_and_a_bad_one_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    // The config's own address is taken, so serving at all proves the flag won.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let path = config(dir.path(), &taken.local_addr().unwrap().to_string());
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--config"])
        .arg(&path)
        .env(KEY_ENV, "k")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || BufReader::new(stderr).lines().map_while(Result::ok).collect::<Vec<_>>());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut healthy = false;
    while Instant::now() < deadline && !healthy {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("serve exited early ({status}): {:?}", log.join().unwrap());
        }
        healthy = rt
            .block_on(reqwest::get(format!("http://127.0.0.1:{port}/healthz")))
            .is_ok_and(|r| r.status() == reqwest::StatusCode::OK);
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(healthy, "no /healthz on --listen 127.0.0.1:{port}: {:?}", log.join().unwrap());

    let bad = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
        .args(["serve", "--listen", "nowhere", "--config"])
        .arg(&path)
        .env(KEY_ENV, "k")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--listen"), "{}", String::from_utf8_lossy(&bad.stderr));
}
