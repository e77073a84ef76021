//! `--web.config.file` on real connections: the monitor's and `serve`'s endpoints behind
//! TLS (certificates made at test time), client certificates and bcrypt basic
//! authentication, in the Prometheus exporter toolkit's format.
//!
//! - the right password is admitted, a wrong one, an unknown user and none get 401
//!   problem+json with `WWW-Authenticate: Basic`; `/healthz` and `/readyz` need none;
//! - plain HTTP, a client that does not trust the CA, and (when the file requires one) a
//!   client without a certificate or with one from another CA are refused in the
//!   handshake;
//! - a changed file (a new user, a rotated certificate) applies within seconds; a broken
//!   one keeps the configuration in force and says so in
//!   `lockprobe_web_config_last_reload_successful`;
//! - `serve` and `check-config` refuse a bad file with exit 64 naming the field, and agree
//!   with `promtool check web-config` on which files are good, except where lockprobe is
//!   stricter on purpose (listed);
//! - a real Prometheus scrapes through TLS and basic authentication, and its scrape with a
//!   wrong password or without TLS fails.

#[path = "support/pki.rs"]
mod pki;
#[path = "support/probe_config.rs"]
mod probe_config;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lockprobe::app::monitor::{run_on, MonitorCommand};
use pki::Pki;
use probe_config::{ProbeConfig, TargetConfig};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// Cost 4, bcrypt's least: the tests check who is admitted, not bcrypt's speed.
fn hash(password: &str) -> String {
    bcrypt::hash(password, 4).unwrap()
}

#[derive(Debug, clap::Parser)]
struct Cli {
    #[command(flatten)]
    cmd: MonitorCommand,
}

/// A `lockprobe monitor` (on an in-memory store) behind `web`, stopped when dropped.
struct Monitor {
    host_port: String,
    stop: CancellationToken,
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn monitor(web: &Path) -> Monitor {
    let cmd = <Cli as clap::Parser>::try_parse_from([
        "lockprobe".as_ref(),
        "--monitor-poll-interval".as_ref(),
        "50ms".as_ref(),
        "--web.config.file".as_ref(),
        web.as_os_str(),
    ])
    .unwrap()
    .cmd;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host_port = listener.local_addr().unwrap().to_string();
    let stop = CancellationToken::new();
    tokio::spawn(run_on(cmd, listener, stop.clone()));
    Monitor { host_port, stop }
}

fn pem_certificate(path: &Path) -> reqwest::Certificate {
    reqwest::Certificate::from_pem(&std::fs::read(path).unwrap()).unwrap()
}

/// A client that trusts only `ca`, presenting `identity` (certificate, key) when given.
fn client(ca: &Path, identity: Option<(&Path, &Path)>) -> reqwest::Client {
    let mut builder =
        reqwest::Client::builder().tls_certs_only([pem_certificate(ca)]).timeout(Duration::from_secs(10)).no_proxy();
    if let Some((cert, key)) = identity {
        let mut pem = std::fs::read(cert).unwrap();
        pem.extend(std::fs::read(key).unwrap());
        builder = builder.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    builder.build().unwrap()
}

/// The status of a GET, or the error's chain when there was no answer.
async fn status(request: reqwest::RequestBuilder) -> Result<u16, String> {
    match request.send().await {
        Ok(response) => Ok(response.status().as_u16()),
        Err(e) => {
            let mut chain = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                chain.push_str(&format!(": {s}"));
                source = s.source();
            }
            Err(chain)
        }
    }
}

/// Waits (up to a minute: a loaded machine) until `check` holds.
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn write(path: &Path, text: &str) {
    // Written beside and renamed, as a config-map update or `mv` does: the watcher
    // never reads half a file.
    let temp = path.with_extension("tmp");
    std::fs::write(&temp, text).unwrap();
    std::fs::rename(&temp, path).unwrap();
}

fn tls_and_users(pki: &Pki, users: &[(&str, &str)]) -> String {
    let mut text = format!(
        "tls_server_config:\n  cert_file: {}\n  key_file: {}\nhttp_server_config:\n  headers:\n    Strict-Transport-Security: max-age=31536000\nbasic_auth_users:\n",
        pki.server_cert.display(),
        pki.server_key.display()
    );
    for (user, password) in users {
        text.push_str(&format!("  {user}: '{}'\n", hash(password)));
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_basic_auth_guard_every_endpoint_but_health() {
    let pki = Pki::generate();
    let web = pki.dir.join("web.yml");
    write(&web, &tls_and_users(&pki, &[("prometheus", "s3cret")]));
    let m = monitor(&web).await;
    let https = client(&pki.server_ca, None);
    let url = |path: &str| format!("https://{}{path}", m.host_port);
    eventually("the monitor answers", async || status(https.get(url("/healthz"))).await == Ok(200)).await;

    // Health needs no credentials (TLS still applies).
    assert_eq!(status(https.get(url("/readyz"))).await, Ok(200));
    // Everything else does.
    for path in ["/metrics", "/api/v1/monitor"] {
        let refused = https.get(url(path)).send().await.unwrap();
        assert_eq!(refused.status(), 401, "{path}");
        assert_eq!(refused.headers()["www-authenticate"], "Basic realm=\"lockprobe\", charset=\"UTF-8\"");
        assert_eq!(refused.headers()["content-type"], "application/problem+json");
        assert_eq!(refused.headers()["strict-transport-security"], "max-age=31536000");
        let problem: Value = refused.json().await.unwrap();
        assert_eq!(problem["type"], "urn:lockprobe:error:unauthorized", "{problem}");
        for (user, password) in [("prometheus", "wrong"), ("nobody", "s3cret"), ("prometheus", "")] {
            assert_eq!(
                status(https.get(url(path)).basic_auth(user, Some(password))).await,
                Ok(401),
                "{user}:{password}"
            );
        }
        assert_eq!(status(https.get(url(path)).basic_auth("prometheus", Some("s3cret"))).await, Ok(200), "{path}");
    }
    let metrics =
        https.get(url("/metrics")).basic_auth("prometheus", Some("s3cret")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("lockprobe_web_config_last_reload_successful 1"), "{metrics}");

    // Plain HTTP on the TLS port, and a client that trusts another CA: no answer at all.
    let plain = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().unwrap();
    let err = status(plain.get(format!("http://{}/healthz", m.host_port))).await;
    assert!(err.is_err(), "plain HTTP answered: {err:?}");
    let stranger = client(&pki.stranger_ca, None);
    let err = status(stranger.get(url("/healthz"))).await.unwrap_err();
    assert!(err.to_lowercase().contains("certificate"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_client_certificate_is_verified_against_the_client_ca() {
    let pki = Pki::generate();
    let web = pki.dir.join("web.yml");
    write(
        &web,
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client-ca.pem\n  min_version: TLS13\n",
    );
    let m = monitor(&web).await;
    let url = format!("https://{}/metrics", m.host_port);
    let with_certificate = client(&pki.server_ca, Some((&pki.client_cert, &pki.client_key)));
    eventually("the monitor answers a client with a certificate", async || {
        status(with_certificate.get(&url)).await == Ok(200)
    })
    .await;
    // No certificate: refused in the handshake (TLS 1.3 reports it on the first read).
    let without = status(client(&pki.server_ca, None).get(&url)).await;
    assert!(without.is_err(), "answered without a client certificate: {without:?}");
    // A certificate from another CA (the server's own: not a client CA's, not for clients).
    let other = status(client(&pki.server_ca, Some((&pki.server_cert, &pki.server_key))).get(&url)).await;
    assert!(other.is_err(), "answered a certificate of another CA: {other:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_applies_within_seconds_and_a_broken_one_keeps_the_one_in_force() {
    let pki = Pki::generate();
    let web = pki.dir.join("web.yml");
    write(&web, &tls_and_users(&pki, &[("alice", "a-pass")]));
    let m = monitor(&web).await;
    let https = client(&pki.server_ca, None);
    let url = format!("https://{}/metrics", m.host_port);
    let as_user = |user: &'static str, password: &'static str| {
        let (https, url) = (https.clone(), url.clone());
        async move { status(https.get(&url).basic_auth(user, Some(password))).await }
    };
    eventually("alice is admitted", async || as_user("alice", "a-pass").await == Ok(200)).await;

    // A user replaced: the old one is refused on the connection already open too.
    write(&web, &tls_and_users(&pki, &[("bob", "b-pass")]));
    eventually("bob is admitted", async || as_user("bob", "b-pass").await == Ok(200)).await;
    assert_eq!(as_user("alice", "a-pass").await, Ok(401));

    // A broken file: bob stays in, and the gauge says the change did not load.
    write(&web, "basic_auth_users:\n  mallory: not-a-hash\n");
    let gauge = async || {
        let text = https.get(&url).basic_auth("bob", Some("b-pass")).send().await.ok()?.text().await.ok()?;
        text.lines().find_map(|l| l.strip_prefix("lockprobe_web_config_last_reload_successful ").map(str::to_owned))
    };
    eventually("the broken file is reported", async || gauge().await.as_deref() == Some("0")).await;
    assert_eq!(as_user("bob", "b-pass").await, Ok(200));

    // A rotated certificate (another CA's, as cert-manager would renew onto): new
    // connections get it.
    let renewed = Pki::generate();
    write(&web, &tls_and_users(&pki, &[("bob", "b-pass")]));
    eventually("the fixed file is reported", async || gauge().await.as_deref() == Some("1")).await;
    std::fs::copy(&renewed.server_cert, &pki.server_cert).unwrap();
    std::fs::copy(&renewed.server_key, &pki.server_key).unwrap();
    let trusting_renewed = client(&renewed.server_ca, None);
    eventually("the renewed certificate is served", async || {
        status(trusting_renewed.get(&url).basic_auth("bob", Some("b-pass"))).await == Ok(200)
    })
    .await;
}

/// `lockprobe serve` with `--web.config.file`: a bad file refuses the start (exit 64,
/// the field named, nothing served); a good one guards its endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_bad_web_config_and_guards_its_endpoints_with_a_good_one() {
    let pki = Pki::generate();
    // A target nobody serves, on a yearly schedule: the test is about the endpoints.
    let target = TargetConfig::new("absent", ["http://127.0.0.1:9"])
        .api_key_env("WEB_CONFIG_TEST_KEY")
        .set("buffer", "1s")
        .set("schedule", "0 0 0 1 1 *");
    let config = ProbeConfig::new(pki.dir.join("state.json")).target(target).write(&pki.dir);
    let bad = pki.dir.join("bad.yml");
    write(
        &bad,
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  client_auth_type: RequireAnyClientCert\n  client_ca_file: client-ca.pem\n",
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let serve = |web: &Path| {
        Command::new(env!("CARGO_BIN_EXE_lockprobe"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--config"])
            .arg(&config)
            .arg("--web.config.file")
            .arg(web)
            .env("WEB_CONFIG_TEST_KEY", "unused")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let refused = serve(&bad).wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("--web.config.file") && stderr.contains("tls_server_config.client_auth_type"), "{stderr}");

    let good = pki.dir.join("web.yml");
    write(&good, &tls_and_users(&pki, &[("prometheus", "s3cret")]));
    let mut child = serve(&good);
    let https = client(&pki.server_ca, None);
    let url = format!("https://127.0.0.1:{port}/api/v1/status");
    eventually("serve answers over TLS", async || {
        status(https.get(&url).basic_auth("prometheus", Some("s3cret"))).await == Ok(200)
    })
    .await;
    assert_eq!(status(https.get(&url)).await, Ok(401));
    assert_eq!(status(https.get(&url).basic_auth("prometheus", Some("nope"))).await, Ok(401));
    assert!(child.try_wait().unwrap().is_none(), "serve exited");
    let _ = child.kill();
    let _ = child.wait();
}

fn promtool() -> Option<PathBuf> {
    std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|dir| dir.join("promtool")).find(|p| p.is_file()))
}

/// Files `promtool check web-config` (Prometheus's own reading of the format) and
/// `lockprobe check-config --web.config.file` both accept or both refuse, but for the
/// settings lockprobe refuses on purpose (docs/security.md says why).
#[test]
fn check_config_agrees_with_promtool_on_web_configs() {
    let promtool = promtool().expect("promtool is not installed: run scripts/install-test-deps.sh");
    let pki = Pki::generate();
    let tls = "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n";
    let good_hash = hash("x");
    let cases: Vec<(&str, String, bool, Option<&str>)> = vec![
        // (name, file, lockprobe accepts, why promtool differs)
        ("empty", String::new(), true, None),
        ("users", format!("basic_auth_users:\n  prometheus: '{good_hash}'\n"), true, None),
        ("tls", tls.to_owned(), true, None),
        ("tls and users", format!("{tls}basic_auth_users:\n  a: '{good_hash}'\n"), true, None),
        (
            "client certificates",
            format!("{tls}  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client-ca.pem\n"),
            true,
            None,
        ),
        (
            "optional client certificates",
            format!("{tls}  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: client-ca.pem\n"),
            true,
            None,
        ),
        ("tls 1.3 only", format!("{tls}  min_version: TLS13\n"), true, None),
        ("headers", "http_server_config:\n  headers:\n    X-Frame-Options: deny\n".to_owned(), true, None),
        ("http2 off", "http_server_config:\n  http2: false\n".to_owned(), true, None),
        ("plaintext password", "basic_auth_users:\n  a: plaintext\n".to_owned(), false, None),
        ("unknown field", "tls_server_config:\n  cert_fle: server.pem\n".to_owned(), false, None),
        ("unknown top-level field", "bogus: 1\n".to_owned(), false, None),
        ("a header that cannot be set", "http_server_config:\n  headers:\n    X-Foo: bar\n".to_owned(), false, None),
        ("missing certificate file", tls.replace("server.pem", "absent.pem"), false, None),
        ("key without certificate", "tls_server_config:\n  key_file: server.key\n".to_owned(), false, None),
        ("the wrong key", tls.replace("server.key", "stranger.key"), false, None),
        (
            "certificates asked without a CA",
            format!("{tls}  client_auth_type: RequireAndVerifyClientCert\n"),
            false,
            Some("Go verifies them against the system's roots: any publicly issued certificate would pass"),
        ),
        ("a CA without asking for certificates", format!("{tls}  client_ca_file: client-ca.pem\n"), false, None),
        ("an unknown client auth type", format!("{tls}  client_auth_type: Sometimes\n"), false, None),
        ("not YAML", "basic_auth_users: [\n".to_owned(), false, None),
        (
            "unverified client certificates",
            format!("{tls}  client_auth_type: RequireAnyClientCert\n  client_ca_file: client-ca.pem\n"),
            false,
            Some("a certificate nobody verified authenticates nobody"),
        ),
        (
            "cipher suites",
            format!("{tls}  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n"),
            false,
            Some("rustls's safe defaults apply; a list it cannot honour is refused, not ignored"),
        ),
        ("TLS 1.0", format!("{tls}  min_version: TLS10\n"), false, Some("rustls offers no TLS below 1.2")),
    ];
    let mut disagreements = Vec::new();
    for (name, text, lockprobe_accepts, differs) in &cases {
        let path = pki.write("case.yml", text);
        let ours = Command::new(env!("CARGO_BIN_EXE_lockprobe"))
            .args(["check-config", "--web.config.file"])
            .arg(&path)
            .output()
            .unwrap();
        let theirs = Command::new(&promtool).args(["check", "web-config"]).arg(&path).output().unwrap();
        let ours_ok = ours.status.success();
        if !ours_ok {
            assert_eq!(ours.status.code(), Some(64), "{name}: {}", String::from_utf8_lossy(&ours.stderr));
        }
        if ours_ok != *lockprobe_accepts {
            disagreements.push(format!(
                "{name}: lockprobe {} it, expected {}: {}",
                if ours_ok { "accepted" } else { "refused" },
                if *lockprobe_accepts { "accepted" } else { "refused" },
                String::from_utf8_lossy(&ours.stderr)
            ));
        }
        let promtool_expected = differs.is_some() != *lockprobe_accepts;
        if theirs.status.success() != promtool_expected {
            disagreements.push(format!(
                "{name}: promtool {} it (expected {}): {}{}",
                if theirs.status.success() { "accepted" } else { "refused" },
                if promtool_expected { "accepted" } else { "refused" },
                String::from_utf8_lossy(&theirs.stdout),
                String::from_utf8_lossy(&theirs.stderr)
            ));
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
}

/// A real Prometheus scrapes the monitor through TLS and basic authentication with the
/// scrape configuration docs/security.md gives; the same job with a wrong password, or
/// over plain HTTP, is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_through_tls_and_basic_auth() {
    let prometheus = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|dir| dir.join("prometheus")).find(|p| p.is_file()))
        .expect("prometheus is not installed: run scripts/install-test-deps.sh");
    let pki = Pki::generate();
    let web = pki.dir.join("web.yml");
    write(&web, &tls_and_users(&pki, &[("prometheus", "s3cret")]));
    let m = monitor(&web).await;
    let password_file = pki.write("prometheus-password", "s3cret\n");
    let job = |name: &str, scheme: &str, password: &str| {
        format!(
            "  - job_name: {name}\n    scheme: {scheme}\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    tls_config:\n      ca_file: {ca}\n    basic_auth:\n      username: prometheus\n      {password}\n    static_configs:\n      - targets: ['{target}']\n",
            ca = pki.server_ca.display(),
            target = m.host_port,
        )
    };
    let config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n{}{}{}",
        job("good", "https", &format!("password_file: {}", password_file.display())),
        job("wrong", "https", "password: guessed"),
        job("plain", "http", &format!("password_file: {}", password_file.display())),
    );
    let config_path = pki.write("prometheus.yml", &config);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let log = std::fs::File::create(pki.dir.join("prometheus.log")).unwrap();
    let mut child = Command::new(prometheus)
        .arg(format!("--config.file={}", config_path.display()))
        .arg(format!("--storage.tsdb.path={}", pki.dir.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().unwrap();
    let query = async |expr: &str| -> Option<f64> {
        let mut url = reqwest::Url::parse(&format!("http://127.0.0.1:{port}/api/v1/query")).unwrap();
        url.query_pairs_mut().append_pair("query", expr);
        let body: Value = http.get(url).send().await.ok()?.json().await.ok()?;
        body["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let seen = loop {
        let seen = (
            query("up{job=\"good\"}").await,
            query("up{job=\"wrong\"}").await,
            query("up{job=\"plain\"}").await,
            query("lockprobe_web_config_last_reload_successful{job=\"good\"}").await,
        );
        if seen == (Some(1.0), Some(0.0), Some(0.0), Some(1.0)) {
            break seen;
        }
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        seen,
        (Some(1.0), Some(0.0), Some(0.0), Some(1.0)),
        "(up good, up wrong, up plain, reload gauge); Prometheus log:\n{}",
        std::fs::read_to_string(pki.dir.join("prometheus.log")).unwrap_or_default()
    );
}
