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
        (vec!["--store-fault", "replace:explode"], "--store-fault"),
        (vec!["--store-fault", "replace:delay=1000000years"], "--store-fault"),
        (vec!["--skew-margin", "500000years"], "--skew-margin"),
        (vec!["--max-decision-age", "soon"], "--max-decision-age"),
        (vec!["--lock-design", "table"], "--lock-design"),
        (vec!["--header-read-timeout", "0s"], "--header-read-timeout"),
        (vec!["--header-read-timeout", "1h"], "--header-read-timeout"),
        (vec!["--header-read-timeout", "soon"], "--header-read-timeout"),
        (vec!["--max-connections", "0"], "--max-connections"),
        (vec!["--max-connections=-3"], "--max-connections"),
    ] {
        let out = lockprobe().arg("service").args(&args).env("LOCKPROBE_LOCK_API_KEY", "k").output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(named),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
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

/// An operator rehearses the ambiguous timeout: with `--store-fault`, the pre-lock's
/// write times out at 300 ms and lands at 1 s. The caller hears `outcome-unknown` (not
/// `store-unavailable`: something may have been done), repeats with the same key once it
/// landed and gets the lock that was granted, token and all; any other caller is refused.
#[test]
fn a_store_fault_rehearses_an_ambiguous_pre_lock_that_a_repeat_recovers() {
    let mut child = lockprobe()
        .args([
            "service",
            "--listen",
            "127.0.0.1:0",
            "--store-fault",
            "create:late-commit=1s,timeout=300ms x1",
            "--store-fault-seed",
            "7",
        ])
        .env("LOCKPROBE_LOCK_API_KEY", "k")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = lines.next().unwrap().unwrap().split("listening on ").nth(1).unwrap().to_owned();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (first, again, other) = rt.block_on(async {
        let http = ::reqwest::Client::new();
        let call = |key: &'static str| {
            http.post(format!("{url}/v1/resources/r-ambiguous/lock"))
                .bearer_auth("k")
                .header("Idempotency-Key", key)
                .json(&serde_json::json!({"owner": "rehearsal", "durationSeconds": 60}))
                .send()
        };
        let first = call("rehearsal-1").await.unwrap();
        let first =
            (first.status().as_u16(), first.headers().get("retry-after").is_some(), first.text().await.unwrap());
        tokio::time::sleep(Duration::from_secs(1)).await;
        let again = call("rehearsal-1").await.unwrap();
        let again = (again.status().as_u16(), again.json::<serde_json::Value>().await.unwrap());
        let other = call("rehearsal-2").await.unwrap().status().as_u16();
        (first, again, other)
    });
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let stderr = {
        let _ = child.wait();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut text).unwrap();
        text
    };
    assert_eq!((first.0, first.1), (503, true), "{}", first.2);
    assert!(first.2.contains("urn:lockprobe:error:outcome-unknown"), "{}", first.2);
    assert_eq!(again.0, 201, "the repeat learns the outcome: {}", again.1);
    assert!(again.1["token"].as_str().is_some_and(|t| t.len() == 32));
    assert_eq!(other, 423, "the lock granted by the lost answer is held");
    assert!(stderr.contains("STORE FAULT INJECTION ON"), "{stderr}");
}

/// `--lock-design record` runs the lock-record baseline, and `/metrics` shows the
/// store's own counts by document kind: one lock-record read per user operation there,
/// none in the embedded design.
#[test]
fn the_lock_design_is_chosen_by_flag_and_its_store_reads_are_on_metrics() {
    for (design, lock_reads) in [("record", 2), ("embedded", 0)] {
        let mut child = lockprobe()
            .args(["service", "--listen", "127.0.0.1:0", "--lock-design", design])
            .env("LOCKPROBE_LOCK_API_KEY", "k")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let lines: Vec<String> =
            BufReader::new(child.stdout.take().unwrap()).lines().take(3).map(Result::unwrap).collect();
        let url = lines[0].split("listening on ").nth(1).unwrap().to_owned();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let metrics = rt.block_on(async {
            let http = ::reqwest::Client::new();
            let item = format!("{url}/v1/resources/r1/items/k");
            let put = http.put(&item).json(&serde_json::json!({"value": 1})).send().await.unwrap();
            assert_eq!(put.status().as_u16(), 201);
            assert_eq!(http.get(&item).send().await.unwrap().status().as_u16(), 200);
            http.get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap()
        });
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let _ = child.wait();
        assert_eq!(lines[2], format!("lockprobe service: lock design {design}"));
        let counted =
            format!(r#"lockprobe_store_document_calls_total{{doc="lock",op="read_write_region"}} {lock_reads}"#);
        assert!(metrics.contains(&counted), "{design}: {counted} missing in\n{metrics}");
        assert!(metrics.contains(r#"lockprobe_store_document_calls_total{doc="routing",op="create"} 1"#), "{metrics}");
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
        "--store",
        "cosmos",
        "--cosmos-endpoint",
        "https://acct.documents.azure.com:443/",
        "--cosmos-database",
        "routing",
        "--cosmos-container",
        "locations",
        "--cosmos-write-region",
        "westeurope",
        "--cosmos-auth",
        "entra",
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

/// Runs lockprobe; a run still going after 10 s took the value it was given, and is
/// killed (exit code `None`).
fn run_briefly(args: &[&str], envs: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut child = lockprobe()
        .args(args)
        .envs(envs.iter().copied())
        .env("LOCKPROBE_LOCK_API_KEY", "k")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(exit) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
            return (exit.code(), stderr);
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            return (None, "still running after 10 s: the value was accepted".to_owned());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `500000years` once made every pre-lock panic (date overflow), the last one while
/// holding the memory store's mutex. Every duration flag is bounded at ten years.
#[test]
fn durations_over_ten_years_are_usage_errors_naming_the_flag() {
    let service = ["service", "--listen", "127.0.0.1:0"];
    let demo = ["demo", "--listen", "127.0.0.1:0", "--cycles", "1"];
    let validate = ["validate", "--endpoint", "http://127.0.0.1:9"];
    let monitor = ["monitor", "--store", "memory", "--listen", "127.0.0.1:0"];
    let cases: [(&[&str], &str); 14] = [
        (&service, "--max-prelock"),
        (&service, "--cache-ttl"),
        (&service, "--replication-bound"),
        (&demo, "--cache-ttl"),
        (&demo, "--replication-bound"),
        (&demo, "--buffer"),
        (&validate, "--expect-convergence"),
        (&validate, "--buffer"),
        (&monitor, "--monitor-poll-interval"),
        (&monitor, "--monitor-scan-interval"),
        (&monitor, "--monitor-sweep-interval"),
        (&monitor, "--monitor-lapse-grace"),
        (&monitor, "--monitor-escalation-buffer"),
        (&monitor, "--monitor-declared-delay"),
    ];
    for (command, flag) in cases {
        let mut args = command.to_vec();
        args.extend([flag, "500000years"]);
        let (code, stderr) = run_briefly(&args, &[]);
        assert_eq!(code, Some(64), "{args:?}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains("500000years") && stderr.contains("10years"),
            "{args:?}: {stderr}"
        );
    }
    let (code, stderr) = run_briefly(&monitor, &[("LOCKPROBE_MONITOR_SCAN_INTERVAL", "500000years")]);
    assert_eq!(code, Some(64), "from the environment too: {stderr}");
    assert!(stderr.contains("--monitor-scan-interval") && stderr.contains("10years"), "{stderr}");
}

#[test]
fn check_config_refuses_durations_over_ten_years_naming_the_field() {
    let target = r#"
[[targets]]
name = "demo"
instances = ["http://127.0.0.1:8080"]
test_prefix = "probe-"
cache_ttl = "1s"
replication_bound = "1s"
schedule = "*/10 * * * * *"
timeout = "2h"
"#;
    let monitor = r#"
[monitor]
store = "cosmos"
cosmos_endpoint = "https://routing.documents.azure.com:443/"
cosmos_key_env = "CHECK_CONFIG_COSMOS_KEY"
cosmos_database = "routing"
cosmos_container = "locations"
cosmos_write_region = "westeurope"
"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("probe.toml");
    let path = path.to_str().unwrap();
    let good = format!("{target}{monitor}");
    std::fs::write(path, &good).unwrap();
    let cosmos_key = [("CHECK_CONFIG_COSMOS_KEY", "bG9ja3Byb2Jl")];
    let (code, stderr) = run_briefly(&["check-config", path], &cosmos_key);
    assert_eq!(code, Some(0), "the base file is good: {stderr}");
    for (from, to, named) in [
        ("cache_ttl = \"1s\"", "cache_ttl = \"500000years\"", "cache_ttl"),
        ("timeout = \"2h\"", "timeout = \"500000years\"", "timeout"),
        ("timeout = \"2h\"", "timeout = \"2h\"\njitter = \"500000years\"", "jitter"),
        (
            "cosmos_write_region = \"westeurope\"",
            "cosmos_write_region = \"westeurope\"\nmonitor_lapse_grace = \"500000years\"",
            "monitor_lapse_grace",
        ),
    ] {
        std::fs::write(path, good.replace(from, to)).unwrap();
        let (code, stderr) = run_briefly(&["check-config", path], &cosmos_key);
        assert_eq!(code, Some(64), "{to}: {stderr}");
        assert!(stderr.contains(named) && stderr.contains("10years"), "{to}: {stderr}");
    }
}
