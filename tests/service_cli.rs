//! `lockprobe service` as an operator starts it: usage errors exit 64 naming the flag,
//! instances come up on the printed addresses, and SIGTERM shuts it down cleanly.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn lockprobe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lockprobe"))
}

#[test]
fn missing_key_is_a_usage_error_naming_the_variable() {
    let out = lockprobe().arg("service").env_remove("LOCKPROBE_LOCK_API_KEY").output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("LOCKPROBE_LOCK_API_KEY"));
}

#[test]
fn bad_flags_are_usage_errors_naming_the_flag() {
    for (args, named) in [
        (vec!["--cache-ttl", "5 parsecs"], "--cache-ttl"),
        (vec!["--instances", "0"], "--instances"),
        (vec!["--fault", "everything"], "--fault"),
        (vec!["--listen", "nowhere"], "--listen"),
    ] {
        let out = lockprobe().arg("service").args(&args).env("LOCKPROBE_LOCK_API_KEY", "k").output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(named), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn serves_every_instance_and_stops_on_sigterm() {
    let mut child = lockprobe()
        .args(["service", "--listen", "127.0.0.1:0", "--instances", "2", "--cache-ttl", "1s", "--cache-ttl", "3s"])
        .env("LOCKPROBE_LOCK_API_KEY", "k")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut urls = Vec::new();
    let mut declared = String::new();
    for line in lines.by_ref().take(3) {
        let line = line.unwrap();
        if let Some(url) = line.split("listening on ").nth(1) {
            urls.push(url.to_owned());
        } else {
            declared = line;
        }
    }
    assert_eq!(urls.len(), 2);
    assert!(declared.ends_with("4s"), "max TTL 3s + bound 1s: {declared}");
    for url in &urls {
        let body = reqwest::blocking_get(&format!("{url}/healthz"));
        assert_eq!(body, "ok");
    }
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(exit) = child.try_wait().unwrap() {
            assert!(exit.success(), "{exit:?}");
            break;
        }
        assert!(Instant::now() < deadline, "did not stop within 10 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

mod reqwest {
    /// A GET without pulling reqwest's blocking feature into the build.
    pub fn blocking_get(url: &str) -> String {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async { ::reqwest::get(url).await.unwrap().text().await.unwrap() })
    }
}

#[test]
fn cosmos_entra_settings_are_checked_before_anything_connects() {
    let cosmos = [
        "--store", "cosmos", "--cosmos-endpoint", "https://acct.documents.azure.com:443/", "--cosmos-database", "routing",
        "--cosmos-container", "locations", "--cosmos-write-region", "westeurope", "--cosmos-auth", "entra",
    ];
    let out = lockprobe()
        .arg("service")
        .args(cosmos)
        .args(["--cosmos-entra-credential", "workload-identity"])
        .env("LOCKPROBE_LOCK_API_KEY", "k")
        .env_remove("AZURE_FEDERATED_TOKEN_FILE")
        .env_remove("AZURE_TENANT_ID")
        .env_remove("AZURE_CLIENT_ID")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("--cosmos-entra-credential") && stderr.contains("AZURE_FEDERATED_TOKEN_FILE"), "{stderr}");
    let unknown = lockprobe()
        .arg("service")
        .args(cosmos)
        .args(["--cosmos-entra-credential", "password"])
        .env("LOCKPROBE_LOCK_API_KEY", "k")
        .output()
        .unwrap();
    assert_eq!(unknown.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("--cosmos-entra-credential"));
}
