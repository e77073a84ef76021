//! The probe over real TLS: the reference service serves HTTPS with certificates made at
//! test time (`lockprobe service --tls-cert --tls-key`, and `--tls-client-ca` for mutual
//! TLS), and `validate` and `serve` reach it only with the right CA file, client
//! certificate and key file:
//!
//! - a private CA is trusted with `--ca-file` (a full cycle passes) and refused without it
//!   or with another CA, with the TLS reason in the report;
//! - a service that requires client certificates refuses a probe without one and passes
//!   one with `--client-cert`/`--client-key`;
//! - the lock API key from `--api-key-file` (trailing newline dropped) works, and a wrong
//!   one fails the cycle on the service's 403 (the contract's answer to a wrong key);
//! - `serve` with `api_key_file`, `ca_file`, `client_cert_file` and `client_key_file` in
//!   its config passes a cycle against the mutual-TLS service;
//! - unusable files are usage errors (exit 64) naming the flag.

#[path = "support/pki.rs"]
mod pki;
#[path = "support/probe_config.rs"]
mod probe_config;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use pki::Pki;
use probe_config::{ProbeConfig, TargetConfig};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const KEY: &str = "tls-test-key";

/// A `lockprobe service` over HTTPS with two instances; killed when dropped.
struct Service {
    urls: Vec<String>,
    _child: Child,
}

async fn service(pki: &Pki, require_client_certificate: bool) -> Service {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockprobe"));
    command
        .args(["service", "--listen", "127.0.0.1:0", "--instances", "2", "--test-prefix", "probe-"])
        .args(["--cache-ttl", "500ms", "--replication-bound", "500ms"])
        .arg("--tls-cert")
        .arg(&pki.server_cert)
        .arg("--tls-key")
        .arg(&pki.server_key);
    if require_client_certificate {
        command.arg("--tls-client-ca").arg(&pki.client_ca);
    }
    let mut child = command
        .env("LOCKPROBE_LOCK_API_KEY", KEY)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut urls = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), async {
        while urls.len() < 2 {
            let line = lines.next_line().await.unwrap().expect("the service listens before it exits");
            if let Some(url) = line.split(" listening on ").nth(1) {
                urls.push(url.trim().to_owned());
            }
        }
    })
    .await
    .expect("the service listens");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    assert!(urls.iter().all(|u| u.starts_with("https://127.0.0.1:")), "{urls:?}");
    Service { urls, _child: child }
}

/// What one `lockprobe validate` run gave.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// `lockprobe validate` against `urls` with `args`, the key in the environment unless
/// `args` names a key file.
async fn validate(urls: &[String], args: &[&str]) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockprobe"));
    command.arg("validate");
    for url in urls {
        command.args(["--endpoint", url]);
    }
    command.args(["--test-prefix", "probe-", "--buffer", "300ms", "--request-timeout", "3s"]).args(args);
    if !args.contains(&"--api-key-file") {
        command.env("LOCKPROBE_LOCK_API_KEY", KEY);
    }
    let out = tokio::time::timeout(
        Duration::from_secs(90),
        command.env("RUST_LOG", "warn").env_remove("LOCKPROBE_STATE_FILE").output(),
    )
    .await
    .expect("validate finishes")
    .unwrap();
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    eprintln!("--- validate {args:?}: exit {}\n{}{}", run.code, run.stdout, run.stderr);
    run
}

/// A path as a flag's value (the temporary directory's paths are UTF-8).
fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_ca_is_trusted_with_ca_file_and_refused_without_it() {
    let pki = Pki::generate();
    let svc = service(&pki, false).await;
    // The key as a secret store writes it: one line and its newline.
    let key_file = pki.write("key", &format!("{KEY}\n"));

    let trusted = validate(&svc.urls, &["--ca-file", s(&pki.server_ca), "--api-key-file", s(&key_file)]).await;
    assert_eq!(trusted.code, 0, "with --ca-file the cycle passes");
    assert!(trusted.stdout.contains("validate: PASSED"), "{}", trusted.stdout);

    let untrusted = validate(&svc.urls, &[]).await;
    assert_eq!(untrusted.code, 1, "the system's roots do not know the test CA");
    assert!(untrusted.stdout.contains("UnknownIssuer"), "the TLS reason is in the report: {}", untrusted.stdout);

    let stranger = validate(&svc.urls, &["--ca-file", s(&pki.stranger_ca)]).await;
    assert_eq!(stranger.code, 1, "another CA does not vouch for the server");
    assert!(stranger.stdout.contains("UnknownIssuer"), "{}", stranger.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_a_probe_without_its_client_certificate() {
    let pki = Pki::generate();
    let svc = service(&pki, true).await;
    let ca = s(&pki.server_ca);

    let anonymous = validate(&svc.urls, &["--ca-file", ca]).await;
    assert_eq!(anonymous.code, 1, "the service requires a client certificate");
    assert!(
        anonymous.stdout.contains("CertificateRequired") || anonymous.stdout.contains("HandshakeFailure"),
        "the TLS alert is in the report: {}",
        anonymous.stdout
    );

    let (cert, key) = (s(&pki.client_cert), s(&pki.client_key));
    let identified = validate(&svc.urls, &["--ca-file", ca, "--client-cert", cert, "--client-key", key]).await;
    assert_eq!(identified.code, 0, "with the client certificate the cycle passes");
    assert!(identified.stdout.contains("validate: PASSED"), "{}", identified.stdout);
}

/// With TLS 1.3 the service refuses a probe without a client certificate only after the
/// handshake, by an alert the HTTP client may read before or after it has handed the
/// connection its request: after, it reports just "connection was not ready". Whichever
/// happens, the probe's error names the refusal's alert (read off a connection of its
/// own when the HTTP client lost it): asked many times, on fresh connections, it always
/// does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_refusal_of_a_probe_without_its_client_certificate_always_names_the_alert() {
    use lockprobe::probe::{TargetClient, TargetError};
    use lockprobe::probe::{TargetTls, TlsFiles};
    let pki = Pki::generate();
    let svc = service(&pki, true).await;
    let tls = TargetTls::load(&TlsFiles { ca_file: Some(pki.server_ca.clone()), ..TlsFiles::default() }).unwrap();
    let mut diagnosed = 0;
    for attempt in 0..50 {
        // A new client each time: a new connection, a new race.
        let client = TargetClient::with_tls(&svc.urls, KEY, "probe-", Duration::from_secs(3), &tls).unwrap();
        match client.route(attempt % 2, "probe-tls").await {
            Err(TargetError::Transport(why)) => {
                assert!(why.contains("CertificateRequired"), "attempt {attempt}: the alert is named: {why}");
                diagnosed += usize::from(why.contains("on a connection of the probe's own"));
            }
            other => panic!("attempt {attempt}: the service must refuse the connection, got {other:?}"),
        }
    }
    eprintln!(
        "{diagnosed} of 50 refusals lost their alert in the HTTP client and were read off the probe's own connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_file_fails_the_cycle_on_the_services_403() {
    let pki = Pki::generate();
    let svc = service(&pki, false).await;
    let wrong = pki.write("wrong-key", "not-the-key\n");
    let run = validate(&svc.urls, &["--ca-file", s(&pki.server_ca), "--api-key-file", s(&wrong)]).await;
    assert_eq!(run.code, 1, "a wrong key cannot lock anything");
    // The contract: no key is 401, a wrong one 403 `forbidden`.
    assert!(run.stdout.contains("observed 403 forbidden"), "the refusal is the service's 403: {}", run.stdout);
    assert!(!format!("{}{}", run.stdout, run.stderr).contains("not-the-key"), "the key is never printed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_files_are_usage_errors_naming_the_flag() {
    let pki = Pki::generate();
    let empty = pki.write("empty", "\n");
    let garbage = pki.write("garbage.pem", "-----BEGIN CERTIFICATE-----\n%%%\n-----END CERTIFICATE-----\n");
    let missing = pki.dir.join("missing.pem");
    let p = |path: &Path| s(path).to_owned();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--ca-file".into(), p(&missing)], "--ca-file"),
        (vec!["--ca-file".into(), p(&garbage)], "--ca-file"),
        (vec!["--ca-file".into(), p(&pki.server_key)], "--ca-file"),
        (vec!["--client-cert".into(), p(&pki.client_cert)], "--client-key"),
        (
            vec!["--client-cert".into(), p(&pki.client_cert), "--client-key".into(), p(&pki.stranger_key)],
            "--client-key",
        ),
        (vec!["--client-cert".into(), p(&pki.client_key), "--client-key".into(), p(&pki.client_key)], "--client-cert"),
        (vec!["--api-key-file".into(), p(&empty)], "--api-key-file"),
        (vec!["--api-key-file".into(), p(&missing)], "--api-key-file"),
    ];
    for (args, flag) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
            .args(["validate", "--endpoint", "https://127.0.0.1:9"])
            .args(&args)
            .env("LOCKPROBE_LOCK_API_KEY", KEY)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: expected {flag} in {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let service_cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--tls-cert".into(), p(&garbage), "--tls-key".into(), p(&pki.server_key)], "--tls-cert"),
        (vec!["--tls-cert".into(), p(&pki.server_cert), "--tls-key".into(), p(&pki.stranger_key)], "--tls-key"),
        (vec!["--tls-cert".into(), p(&pki.server_cert), "--tls-key".into(), p(&missing)], "--tls-key"),
        (
            vec![
                "--tls-cert".into(),
                p(&pki.server_cert),
                "--tls-key".into(),
                p(&pki.server_key),
                "--tls-client-ca".into(),
                p(&empty),
            ],
            "--tls-client-ca",
        ),
        (vec!["--tls-client-ca".into(), p(&pki.client_ca)], "--tls-cert"),
    ];
    for (args, flag) in service_cases {
        let out = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
            .args(["service", "--listen", "127.0.0.1:0"])
            .args(&args)
            .env("LOCKPROBE_LOCK_API_KEY", KEY)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: expected {flag} in {stderr}");
    }
}

/// `serve` reads the key file and the TLS files its config names, and its cycles pass
/// against a service that requires client certificates. A second target on the same
/// service trusts the same CA but presents no certificate: its cycles fail the handshake,
/// so targets with different TLS settings do not share an HTTP client (the process
/// shares one per distinct TLS configuration).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_passes_cycles_with_a_key_file_and_mutual_tls_from_its_config() {
    let pki = Pki::generate();
    let svc = service(&pki, true).await;
    let key_file = pki.write("orders.key-secret", &format!("{KEY}\r\n"));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // Both targets read the key file and trust the server's CA; only `tls` presents a
    // client certificate. No pool size and (for `anonymous`) no leases: the probe's own.
    let target = |name: &str, prefix: &str| {
        TargetConfig::new(name, &svc.urls)
            .api_key_file(&key_file)
            .ca_file(&pki.server_ca)
            .test_prefix(prefix)
            .remove("pool_size")
            .set("cache_ttl", "500ms")
            .buffer("300ms")
            .schedule("*/2 * * * * *")
            .set("request_timeout", "3s")
            .set("poll_interval", "50ms")
    };
    let path = ProbeConfig::new(pki.dir.join("state.json"))
        .listen(format!("127.0.0.1:{port}"))
        .target(
            target("tls", "probe-")
                .client_cert_file(&pki.client_cert)
                .client_key_file(&pki.client_key)
                .leases("2m", "1m", "1m", "1s"),
        )
        .target(target("anonymous", "probe-anonymous-").remove("leases"))
        .write(&pki.dir);
    let _serve = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
        .args(["serve", "--config"])
        .arg(&path)
        .env_remove("LOCKPROBE_LOCK_API_KEY")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let metrics = format!("http://127.0.0.1:{port}/metrics");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Ok(r) = reqwest::get(&metrics).await {
            last = r.text().await.unwrap_or_default();
            let anonymous_refused = runs(&last, "anonymous", "failed") + runs(&last, "anonymous", "error");
            if runs(&last, "tls", "passed") >= 1.0 && anonymous_refused >= 1.0 {
                assert_eq!(runs(&last, "tls", "failed"), 0.0, "{last}");
                assert_eq!(runs(&last, "anonymous", "passed"), 0.0, "no certificate, no pass: {last}");
                return;
            }
            let tls_not_passed = runs(&last, "tls", "failed") + runs(&last, "tls", "error");
            assert_eq!(tls_not_passed, 0.0, "a cycle did not pass: {last}");
            assert_eq!(runs(&last, "anonymous", "passed"), 0.0, "no certificate, no pass: {last}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("no passed cycle of tls and refused one of anonymous within 60 s: {last}");
}

/// `lockprobe_probe_runs_total{target,result}` in a scrape (0 when absent).
fn runs(scrape: &str, target: &str, result: &str) -> f64 {
    scrape
        .lines()
        .filter(|l| l.starts_with("lockprobe_probe_runs_total{") && l.contains(&format!("result=\"{result}\"")))
        .filter(|l| l.contains(&format!("target=\"{target}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The release gate's probe trusts `--ca-file` and presents `--client-cert` to a
/// candidate started with the service's TLS flags (after `--`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_probes_a_candidate_over_mutual_tls() {
    let pki = Pki::generate();
    let gate = |tls: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_lockprobe"));
        command.args(["gate", "--profile", "baseline"]).args(tls).args([
            "--",
            "--tls-cert",
            s(&pki.server_cert),
            "--tls-key",
            s(&pki.server_key),
            "--tls-client-ca",
            s(&pki.client_ca),
        ]);
        command.env("RUST_LOG", "error").output()
    };
    let ca = ["--ca-file", s(&pki.server_ca)];
    let out = gate(&[&ca[..], &["--client-cert", s(&pki.client_cert), "--client-key", s(&pki.client_key)]].concat())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("gate: PASSED"), "{stdout}");

    let out = gate(&ca).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "without its client certificate the gate's probe is refused: {stdout}");
    assert!(stdout.contains("CertificateRequired"), "{stdout}");
}
